//! Organizations' webhooks: managed by owners and admins, signed, kept until delivered,
//! never sent to an internal address unless the operator allows it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::Duration;

use autodl_server::notify::webhooks::{deliver_due, queue, signature, Event};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::helpers::{spawn_app_on_clock, spawn_app_with, Backend, TestApp};

crate::on_both_backends!(webhooks_are_signed_kept_and_retried);
crate::on_both_backends!(webhooks_refuse_internal_addresses_and_bad_input);

/// One request a receiver got: its headers (lower-case names) and body.
pub struct Received {
    pub headers: HashMap<String, String>,
    pub body: String,
}

/// A webhook receiver on this machine that answers `status` (changeable while it runs).
pub struct Receiver {
    pub url: String,
    pub status: Arc<AtomicU16>,
    pub got: mpsc::UnboundedReceiver<Received>,
}

pub async fn receiver() -> Receiver {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let status = Arc::new(AtomicU16::new(200));
    let (tx, got) = mpsc::unbounded_channel();
    let answer = status.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            let (head, body_start) = loop {
                let n = conn.read(&mut chunk).await.unwrap_or(0);
                if n == 0 {
                    break (String::new(), 0);
                }
                buf.extend_from_slice(&chunk[..n]);
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break (String::from_utf8_lossy(&buf[..i]).into_owned(), i + 4);
                }
            };
            let headers: HashMap<String, String> = head
                .lines()
                .skip(1)
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
                .collect();
            let len: usize = headers
                .get("content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            while buf.len() < body_start + len {
                let n = conn.read(&mut chunk).await.unwrap_or(0);
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            let body = String::from_utf8_lossy(&buf[body_start..]).into_owned();
            let code = answer.load(Ordering::SeqCst);
            let _ = conn
                .write_all(
                    format!("HTTP/1.1 {code} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                        .as_bytes(),
                )
                .await;
            if code == 200 {
                let _ = tx.send(Received { headers, body });
            }
        }
    });
    Receiver { url, status, got }
}

/// Checks what a receiver must: the signature over the time and body, with the secret.
pub fn verify(secret: &str, r: &Received) -> Value {
    let sig = &r.headers["x-autodl-signature"];
    let t: i64 = sig
        .strip_prefix("t=")
        .and_then(|s| s.split(',').next())
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(*sig, signature(secret, t, &r.body), "a valid signature");
    assert_ne!(*sig, signature("another secret", t, &r.body));
    serde_json::from_str(&r.body).unwrap()
}

/// The next `want` webhook bodies the receiver gets, each signature checked.
pub async fn told(app: &TestApp, hooked: &mut Receiver, secret: &str, want: usize) -> Vec<Value> {
    let mut bodies = Vec::new();
    for _ in 0..100 {
        if bodies.len() == want {
            return bodies;
        }
        deliver_due(&app.state).await.unwrap();
        let next = tokio::time::timeout(Duration::from_millis(200), hooked.got.recv());
        if let Ok(Some(r)) = next.await {
            bodies.push(verify(secret, &r));
        }
    }
    panic!("{want} webhook deliveries expected, got {bodies:?}");
}

async fn add_hook(app: &TestApp, s: &crate::helpers::Session, url: &str) -> Value {
    let res = s
        .send(
            app,
            Method::POST,
            "/api/v1/tenant/webhooks",
            Some(json!({"url": url, "events": ["task.idle", "task.idle_stopped"]})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    res.json().await.unwrap()
}

async fn webhooks_are_signed_kept_and_retried(b: Backend) {
    use autodl_server::clock::Clock;
    let (app, clock) = spawn_app_on_clock(b, |s| s.webhook_allow_internal = true).await;
    let ada = app.signup("ada@example.com", "Lab").await;
    let mut rx = receiver().await;
    let hook = add_hook(&app, &ada, &rx.url).await;
    let secret = hook["secret"].as_str().unwrap().to_owned();
    assert_eq!(secret.len(), 64);
    let listed = ada.get(&app, "/api/v1/tenant/webhooks").await;
    assert_eq!(listed[0]["id"], hook["id"]);
    assert!(
        listed[0].get("secret").is_none(),
        "the secret is shown once"
    );

    // The receiver is down: the delivery is kept and tried again later.
    let tenant = ada.user["tenant_id"].as_str().unwrap().to_owned();
    rx.status.store(503, Ordering::SeqCst);
    let store = app.state.store.as_ref();
    queue(
        store,
        &tenant,
        Event::TaskIdle,
        json!({"task": {"id": "t1"}}),
        clock.now_ms(),
    )
    .await;
    assert_eq!(deliver_due(&app.state).await.unwrap(), 0);
    let path = format!(
        "/api/v1/tenant/webhooks/{}/deliveries",
        hook["id"].as_str().unwrap()
    );
    let d = ada.get(&app, &path).await;
    assert_eq!(d[0]["status"], "pending", "{d}");
    assert_eq!(d[0]["attempts"], 1);
    assert!(d[0]["last_error"].as_str().unwrap().contains("503"), "{d}");
    // A restart loses nothing; the receiver is back; the retry's time comes.
    app.kill().await;
    let app = app.restart().await;
    rx.status.store(200, Ordering::SeqCst);
    clock.set(clock.now_ms() + 31_000);
    let mut sent = 0;
    for _ in 0..20 {
        sent += deliver_due(&app.state).await.unwrap();
        if ada.get(&app, &path).await[0]["status"] == "delivered" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let got = tokio::time::timeout(Duration::from_secs(10), rx.got.recv())
        .await
        .unwrap()
        .unwrap();
    let body = verify(&secret, &got);
    assert_eq!(body["event"], "task.idle");
    assert_eq!(body["data"]["task"]["id"], "t1");
    assert_eq!(got.headers["x-autodl-event"], "task.idle");
    let d = ada.get(&app, &path).await;
    assert_eq!(d[0]["status"], "delivered", "{d} ({sent} sent here)");
    assert_eq!(d[0]["attempts"], 2);

    // Only the events asked for, only the organization's own.
    let eve = app.signup("eve@example.com", "Other").await;
    let res = eve
        .send(
            &app,
            Method::DELETE,
            &format!("/api/v1/tenant/webhooks/{}", hook["id"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        eve.send(&app, Method::GET, &path, None).await.status(),
        StatusCode::NOT_FOUND
    );
    let bob = app.invite_and_join(&ada, "bob@example.com", "member").await;
    assert_eq!(
        bob.send(&app, Method::GET, "/api/v1/tenant/webhooks", None)
            .await
            .status(),
        StatusCode::FORBIDDEN
    );
    let res = ada
        .send(
            &app,
            Method::DELETE,
            &format!("/api/v1/tenant/webhooks/{}", hook["id"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    queue(
        app.state.store.as_ref(),
        &tenant,
        Event::TaskIdle,
        json!({}),
        clock.now_ms(),
    )
    .await;
    assert_eq!(
        deliver_due(&app.state).await.unwrap(),
        0,
        "nobody to send to"
    );
}

async fn webhooks_refuse_internal_addresses_and_bad_input(b: Backend) {
    let app = spawn_app_with(b, |_| {}).await;
    let ada = app.signup("ada@example.com", "Lab").await;
    for (body, field) in [
        (
            json!({"url": "ftp://example.com", "events": ["task.idle"]}),
            "url",
        ),
        (
            json!({"url": "https://u:p@example.com", "events": ["task.idle"]}),
            "url",
        ),
        (
            json!({"url": "https://example.com", "events": []}),
            "events",
        ),
        (
            json!({"url": "https://example.com", "events": ["task.exploded"]}),
            "events",
        ),
    ] {
        let res = ada
            .send(
                &app,
                Method::POST,
                "/api/v1/tenant/webhooks",
                Some(body.clone()),
            )
            .await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{body}");
        let e: Value = res.json().await.unwrap();
        assert_eq!(e["error"]["field"], field, "{body}");
    }
    // A webhook at this machine (the platform's database, a metadata service): kept, but
    // never sent there; the delivery says why.
    let mut rx = receiver().await;
    let hook = add_hook(&app, &ada, &rx.url).await;
    let tenant = ada.user["tenant_id"].as_str().unwrap().to_owned();
    let now = app.state.clock.now_ms();
    queue(
        app.state.store.as_ref(),
        &tenant,
        Event::TaskIdleStopped,
        json!({}),
        now,
    )
    .await;
    assert_eq!(deliver_due(&app.state).await.unwrap(), 0);
    let d = ada
        .get(
            &app,
            &format!(
                "/api/v1/tenant/webhooks/{}/deliveries",
                hook["id"].as_str().unwrap()
            ),
        )
        .await;
    assert!(
        d[0]["last_error"]
            .as_str()
            .unwrap()
            .contains("internal address"),
        "{d}"
    );
    assert!(
        rx.got.try_recv().is_err(),
        "nothing reached the internal address"
    );
}

crate::on_both_backends!(tasks_that_end_are_told);

async fn tasks_that_end_are_told(b: Backend) {
    use autodl_server::clock::Clock;
    let (app, clock) = spawn_app_on_clock(b, |s| {
        s.webhook_allow_internal = true;
        s.node_lost_timeout_secs = 3600;
    })
    .await;
    let op = app.operator().await;
    let agent = crate::agents::FakeAgent::join(&app, &op, "n1", "A100-40G", "z1").await;
    let ada = app.signup("ada@example.com", "Lab").await;
    let mut rx = receiver().await;
    let res = ada
        .send(
            &app,
            Method::POST,
            "/api/v1/tenant/webhooks",
            Some(json!({"url": rx.url, "events": ["task.finished", "task.failed"]})),
        )
        .await;
    let secret = res.json::<Value>().await.unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut ids = Vec::new();
    for name in ["ok", "broken"] {
        let res = ada
            .send(
                &app,
                Method::POST,
                "/api/v1/tasks",
                Some(json!({"name": name, "image": "busybox", "command": "true",
                    "resources": {"gpu": {"count": 1}}})),
            )
            .await;
        assert_eq!(res.status(), StatusCode::CREATED);
        ids.push(
            res.json::<Value>().await.unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    app.runner().cycle(clock.now_ms()).await.unwrap();
    agent.poll(&[], 0).await;
    for (id, (code, reason)) in ids.iter().zip([(0, "success"), (1, "error")]) {
        let res = agent
            .call(
                &format!("/api/v1/agent/tasks/{id}/started"),
                json!({"attempt": 1}),
            )
            .await;
        assert!(res.status().is_success());
        let res = agent
            .call(
                &format!("/api/v1/agent/tasks/{id}/finished"),
                json!({"attempt": 1, "exit_code": code, "reason": reason}),
            )
            .await;
        assert!(res.status().is_success(), "{}", res.text().await.unwrap());
    }
    let ended: std::collections::HashMap<String, Value> = told(&app, &mut rx, &secret, 2)
        .await
        .into_iter()
        .map(|b| (b["data"]["task"]["id"].as_str().unwrap().to_owned(), b))
        .collect();
    assert_eq!(ended[&ids[0]]["event"], "task.finished", "{ended:?}");
    assert_eq!(ended[&ids[0]]["data"]["state"], "completed");
    assert_eq!(ended[&ids[1]]["event"], "task.failed", "{ended:?}");
    assert_eq!(ended[&ids[1]]["data"]["exit_code"], 1);
}

crate::on_both_backends!(a_lost_node_is_told_to_the_organizations_it_ran_for);

async fn a_lost_node_is_told_to_the_organizations_it_ran_for(b: Backend) {
    use autodl_server::clock::Clock;
    let (app, clock) = spawn_app_on_clock(b, |s| {
        s.webhook_allow_internal = true;
        s.node_lost_timeout_secs = 30;
    })
    .await;
    let op = app.operator().await;
    let agent = crate::agents::FakeAgent::join(&app, &op, "n1", "A100-40G", "z1").await;
    let mut hooks = Vec::new();
    for (email, org) in [("ada@example.com", "Lab"), ("eve@example.com", "Other")] {
        let s = app.signup(email, org).await;
        let rx = receiver().await;
        let res = s
            .send(
                &app,
                Method::POST,
                "/api/v1/tenant/webhooks",
                Some(json!({"url": rx.url, "events": ["node.lost"]})),
            )
            .await;
        let secret = res.json::<Value>().await.unwrap()["secret"]
            .as_str()
            .unwrap()
            .to_owned();
        let res = s
            .send(
                &app,
                Method::POST,
                "/api/v1/tasks",
                Some(json!({"name": "t", "image": "busybox", "command": "true",
                    "resources": {"gpu": {"count": 1}}})),
            )
            .await;
        let id = res.json::<Value>().await.unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned();
        hooks.push((rx, secret, id));
    }
    let t0 = clock.now_ms();
    let mut runner = app.runner();
    runner.cycle(t0).await.unwrap();
    agent.poll(&[], 0).await;
    for (_, _, id) in &hooks {
        let res = agent
            .call(
                &format!("/api/v1/agent/tasks/{id}/started"),
                json!({"attempt": 1}),
            )
            .await;
        assert!(res.status().is_success());
    }
    // The agent falls silent past the timeout.
    crate::helpers::live_until(&mut runner, &clock, t0 + 62_000).await;
    for (rx, secret, id) in &mut hooks {
        let body = told(&app, rx, secret, 1).await.remove(0);
        assert_eq!(body["event"], "node.lost");
        assert_eq!(body["data"]["node"], "n1");
        assert_eq!(
            body["data"]["requeued_tasks"],
            json!([id.as_str()]),
            "only its own tasks"
        );
    }
}
