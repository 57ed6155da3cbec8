//! The findings of the attacker's review that the API answers for: each test makes the attack
//! and checks that it fails and that nothing of another organization changed. The attacks
//! from inside a task on a host are in `isolation.rs`.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use reqwest::{Client, Method, StatusCode};
use serde_json::{json, Value};

use crate::agents::FakeAgent;
use crate::helpers::{
    assert_error, spawn_app, spawn_app_with, Backend, Session, TestApp, PASSWORD,
};

crate::on_both_backends!(
    registration_tokens_are_single_use_and_nodes_cannot_be_taken_over,
    samples_only_for_tasks_that_ran_on_the_nodes_gpus,
    task_tokens_end_with_their_attempt,
    password_checks_are_throttled_without_locking_the_owner_out,
    revoked_access_ends_open_streams,
    members_store_and_delete_objects_by_one_rule,
    nodes_hide_other_organizations_tasks,
    pages_and_answers_carry_security_headers,
    the_bundle_is_served_gzipped_ahead_of_time,
    metrics_need_an_administrator_or_the_scrape_token,
    sign_up_refuses_weak_passwords_lookalike_emails_and_floods,
    deadlines_in_the_past_are_refused,
    storage_quota_holds_uploads,
    storage_quota_holds_concurrent_uploads_and_checkpoints,
    a_file_and_a_folder_of_the_same_name_conflict,
    data_paths_are_storage_or_a_dataset_root,
    trusted_only_nodes_take_only_trusted_organizations,
);

async fn register(app: &TestApp, token: &str, id: &str) -> reqwest::Response {
    Client::new()
        .post(app.url("/api/v1/agent/register"))
        .json(
            &json!({"token": token, "node": {"id": id, "cpu": 8, "memory": 1 << 30, "gpus": [],
            "host": {"runtime": "docker", "isolation": "container"}}}),
        )
        .send()
        .await
        .unwrap()
}

async fn new_token(app: &TestApp, op: &Session, body: Value) -> reqwest::Response {
    op.send(
        app,
        Method::POST,
        "/api/v1/admin/registration-tokens",
        Some(body),
    )
    .await
}

async fn registration_tokens_are_single_use_and_nodes_cannot_be_taken_over(b: Backend) {
    let app = spawn_app(b).await;
    let op = app.operator().await;
    // Single use by default.
    let t: Value = new_token(&app, &op, json!({})).await.json().await.unwrap();
    assert_eq!(
        (t["max_uses"].as_u64(), t["uses"].as_u64()),
        (Some(1), Some(0))
    );
    let token = t["token"].as_str().unwrap();
    assert_eq!(
        register(&app, token, "n1").await.status(),
        StatusCode::CREATED
    );
    let res = register(&app, token, "n2").await;
    assert_error(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
    // An explicit count admits exactly that many nodes.
    let t: Value = new_token(&app, &op, json!({"max_uses": 2}))
        .await
        .json()
        .await
        .unwrap();
    let token = t["token"].as_str().unwrap();
    for n in ["n2", "n3"] {
        assert_eq!(register(&app, token, n).await.status(), StatusCode::CREATED);
    }
    assert_eq!(
        register(&app, token, "n4").await.status(),
        StatusCode::UNAUTHORIZED
    );
    for bad in [
        json!({"max_uses": 0}),
        json!({"node_id": "n1", "max_uses": 2}),
        json!({"node_id": "a b"}),
    ] {
        let res = new_token(&app, &op, bad).await;
        assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
    }
    // A holder of a fresh token cannot take over an existing node's id (and its tasks).
    let first: Value = {
        let t: Value = new_token(&app, &op, json!({})).await.json().await.unwrap();
        register(&app, t["token"].as_str().unwrap(), "gpu-7")
            .await
            .json()
            .await
            .unwrap()
    };
    let t: Value = new_token(&app, &op, json!({})).await.json().await.unwrap();
    let res = register(&app, t["token"].as_str().unwrap(), "gpu-7").await;
    let e = assert_error(res, StatusCode::CONFLICT, "conflict").await;
    assert!(e["error"]["message"]
        .as_str()
        .unwrap()
        .contains("already registered"));
    // ... the unused token is still good for a new node.
    assert_eq!(
        register(&app, t["token"].as_str().unwrap(), "gpu-8")
            .await
            .status(),
        StatusCode::CREATED
    );
    // An administrator's token for that node replaces its credential, and only for it.
    let bound: Value = new_token(&app, &op, json!({"node_id": "gpu-7"}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(bound["node_id"], "gpu-7");
    let token = bound["token"].as_str().unwrap();
    assert_eq!(
        register(&app, token, "gpu-9").await.status(),
        StatusCode::FORBIDDEN
    );
    let again: Value = register(&app, token, "gpu-7").await.json().await.unwrap();
    assert_ne!(again["credential"], first["credential"]);
    let old = Client::new()
        .post(app.url("/api/v1/agent/poll"))
        .bearer_auth(first["credential"].as_str().unwrap())
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        old.status(),
        StatusCode::UNAUTHORIZED,
        "the old credential is void"
    );
    let list = op.get(&app, "/api/v1/admin/registration-tokens").await;
    assert!(
        list.as_array()
            .unwrap()
            .iter()
            .all(|t| t["uses"].as_u64() < t["max_uses"].as_u64()),
        "used-up tokens are not offered: {list}"
    );
}

fn task_spec(name: &str, gpu_type: &str) -> Value {
    json!({"name": name, "image": "busybox", "command": "sleep 1",
           "resources": {"gpu": {"type": gpu_type, "count": 1}}})
}

/// Submits a task and waits until `agent` is told to run it: (id, attempt, assignment).
fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

async fn samples_only_for_tasks_that_ran_on_the_nodes_gpus(b: Backend) {
    let app = spawn_app(b).await;
    let op = app.operator().await;
    let a100 = FakeAgent::join(&app, &op, "a100", "A100-40G", "z1").await;
    let a40 = FakeAgent::join(&app, &op, "a40", "A40", "z1").await;
    let s = app.signup("ada@example.com", "Lab").await;
    let (id, _, assignment) = a100.placed(&app, &s, task_spec("t", "A100")).await;
    let gpu = assignment["gpu_indices"][0].as_u64().unwrap();
    let sample = |index: u64| json!({"at": now_rfc3339(), "gpu_index": index, "util": 0.1, "mem_used": 1, "mem_total": 42949672960u64, "task_id": id});
    // Another node writing into the task's metrics.
    let res = a40
        .call("/api/v1/agent/metrics", json!({"samples": [sample(gpu)]}))
        .await;
    let e = assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("did not run"),
        "{e}"
    );
    // Its own node, but a GPU the task does not hold.
    let other = (gpu + 1) % 4;
    let res = a100
        .call("/api/v1/agent/metrics", json!({"samples": [sample(other)]}))
        .await;
    assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
    let stored = s.get(&app, &format!("/api/v1/tasks/{id}/metrics")).await;
    assert!(
        stored["samples"].as_array().unwrap().is_empty(),
        "nothing stored: {stored}"
    );
    let res = a100
        .call("/api/v1/agent/metrics", json!({"samples": [sample(gpu)]}))
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let stored = s.get(&app, &format!("/api/v1/tasks/{id}/metrics")).await;
    assert_eq!(stored["samples"].as_array().unwrap().len(), 1);
}

async fn report_with(app: &TestApp, id: &str, token: &str) -> reqwest::Response {
    Client::new()
        .post(app.url(&format!("/api/v1/tasks/{id}/metrics")))
        .bearer_auth(token)
        .json(&json!({"loss": 0.5}))
        .send()
        .await
        .unwrap()
}

async fn task_tokens_end_with_their_attempt(b: Backend) {
    let app = spawn_app(b).await;
    let op = app.operator().await;
    let agent = FakeAgent::join(&app, &op, "gpu-1", "A100-40G", "z1").await;
    let s = app.signup("ada@example.com", "Lab").await;
    let mut spec = task_spec("t", "A100");
    spec["retry_policy"] = json!({"max_retries": 1});
    let (id, attempt, a) = agent.placed(&app, &s, spec).await;
    let token = a["env"]["AUTODL_TASK_TOKEN"].as_str().unwrap().to_owned();
    agent
        .call(
            &format!("/api/v1/agent/tasks/{id}/started"),
            json!({"attempt": attempt}),
        )
        .await;
    assert_eq!(
        report_with(&app, &id, &token).await.status(),
        StatusCode::NO_CONTENT
    );
    // The attempt fails and the task is retried: attempt 1's token is void.
    let res = agent
        .call(
            &format!("/api/v1/agent/tasks/{id}/finished"),
            json!({"attempt": attempt, "exit_code": 1, "reason": "error"}),
        )
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let res = report_with(&app, &id, &token).await;
    assert_error(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
    let (_, attempt2, a2) = {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let work = agent.poll(&[], 1).await;
            if let Some(a) = work["assignments"].as_array().unwrap().first() {
                break (id.clone(), a["attempt"].as_u64().unwrap(), a.clone());
            }
            assert!(Instant::now() < deadline, "no second attempt");
        }
    };
    assert_eq!(attempt2, attempt + 1);
    let token2 = a2["env"]["AUTODL_TASK_TOKEN"].as_str().unwrap().to_owned();
    assert_eq!(
        report_with(&app, &id, &token2).await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        report_with(&app, &id, &token).await.status(),
        StatusCode::UNAUTHORIZED
    );
    // Once the task has ended no token of it works.
    agent
        .call(
            &format!("/api/v1/agent/tasks/{id}/finished"),
            json!({"attempt": attempt2, "exit_code": 0, "reason": "success"}),
        )
        .await;
    let res = report_with(&app, &id, &token2).await;
    assert_error(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
    let m = s.get(&app, &format!("/api/v1/tasks/{id}/metrics")).await;
    assert_eq!(
        m["samples"].as_array().unwrap().len(),
        2,
        "only the live attempts' reports: {m}"
    );
}

/// A client whose requests come from `ip` (any 127.x address is this host).
fn client_from(ip: Ipv4Addr) -> Client {
    Client::builder()
        .cookie_store(true)
        .local_address(IpAddr::V4(ip))
        .build()
        .unwrap()
}

async fn login_from(app: &TestApp, ip: Ipv4Addr, email: &str, password: &str) -> StatusCode {
    client_from(ip)
        .post(app.url("/api/v1/auth/login"))
        .json(&json!({"email": email, "password": password}))
        .send()
        .await
        .unwrap()
        .status()
}

async fn password_checks_are_throttled_without_locking_the_owner_out(b: Backend) {
    let app = spawn_app_with(b, |s| {
        s.login_attempts_per_minute_per_account = 5;
        s.login_attempts_per_minute_per_address = 50;
    })
    .await;
    let s = app.signup("ada@example.com", "Lab").await;
    // Someone holding Ada's session guesses her password on the password-change form.
    let mut last = StatusCode::OK;
    for i in 0..8 {
        let res = s
            .send(&app, Method::POST, "/api/v1/auth/password",
                Some(json!({"current_password": format!("guess-{i}"), "new_password": "Another-pass-42!"})))
            .await;
        last = res.status();
        if last == StatusCode::TOO_MANY_REQUESTS {
            break;
        }
        assert_eq!(last, StatusCode::FORBIDDEN);
    }
    assert_eq!(last, StatusCode::TOO_MANY_REQUESTS, "guesses are throttled");
    // A flood of wrong logins from one address...
    let attacker = Ipv4Addr::new(127, 0, 0, 2);
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(login_from(&app, attacker, "ada@example.com", "wrong-Password-1").await);
    }
    assert!(
        statuses.contains(&StatusCode::TOO_MANY_REQUESTS),
        "{statuses:?}"
    );
    assert_eq!(
        login_from(&app, attacker, "ada@example.com", PASSWORD).await,
        StatusCode::TOO_MANY_REQUESTS,
        "the flooding address is slowed down"
    );
    // ... does not lock Ada out from her own address.
    assert_eq!(
        login_from(
            &app,
            Ipv4Addr::new(127, 0, 0, 3),
            "ada@example.com",
            PASSWORD
        )
        .await,
        StatusCode::OK
    );
}

/// Opens an SSE stream and returns what it delivered until it ended (or `within` passed).
async fn read_stream(
    req: reqwest::RequestBuilder,
    within: Duration,
    after_open: impl std::future::Future<Output = ()>,
) -> (String, Duration) {
    let res = req.send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let mut body = res.bytes_stream();
    after_open.await;
    let started = Instant::now();
    let mut text = String::new();
    loop {
        match tokio::time::timeout(within.saturating_sub(started.elapsed()), body.next()).await {
            Ok(Some(Ok(chunk))) => text.push_str(&String::from_utf8_lossy(&chunk)),
            Ok(Some(Err(_))) | Ok(None) | Err(_) => return (text, started.elapsed()),
        }
    }
}

async fn revoked_access_ends_open_streams(b: Backend) {
    let app = spawn_app(b).await;
    let owner = app.signup("owner@example.com", "Lab").await;
    let member = app.invite_and_join(&owner, "m@example.com", "member").await;
    // A pending task never ends by itself: only losing access ends its streams.
    let res = owner
        .send(
            &app,
            Method::POST,
            "/api/v1/tasks",
            Some(json!({"name": "t", "image": "i", "command": "true"})),
        )
        .await;
    let id = res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let key: Value = member
        .send(
            &app,
            Method::POST,
            "/api/v1/api-keys",
            Some(json!({"name": "k"})),
        )
        .await
        .json()
        .await
        .unwrap();
    let key_id = key["info"]["id"].as_str().unwrap().to_owned();
    let key = key["key"].as_str().unwrap().to_owned();
    // A revoked API key ends its metrics stream.
    let req = Client::new()
        .get(app.url(&format!("/api/v1/tasks/{id}/metrics/stream")))
        .bearer_auth(&key);
    let (text, took) = read_stream(req, Duration::from_secs(15), async {
        let res = member
            .send(
                &app,
                Method::DELETE,
                &format!("/api/v1/api-keys/{key_id}"),
                None,
            )
            .await;
        assert_eq!(res.status(), StatusCode::NO_CONTENT);
    })
    .await;
    assert!(text.contains("access revoked"), "{text:?}");
    assert!(took < Duration::from_secs(6), "ended after {took:?}");
    // A removed member's log stream (browser session) ends too.
    let req = member.request(
        &app,
        Method::GET,
        &format!("/api/v1/tasks/{id}/logs/stream"),
    );
    let (text, took) = read_stream(req, Duration::from_secs(15), async {
        let res = owner
            .send(
                &app,
                Method::DELETE,
                &format!("/api/v1/tenant/members/{}", member.id()),
                None,
            )
            .await;
        assert_eq!(res.status(), StatusCode::NO_CONTENT);
    })
    .await;
    assert!(text.contains("access revoked"), "{text:?}");
    assert!(took < Duration::from_secs(6), "ended after {took:?}");
    // The owner's own stream is unaffected.
    let req = owner.request(
        &app,
        Method::GET,
        &format!("/api/v1/tasks/{id}/logs/stream"),
    );
    let (text, _) = read_stream(req, Duration::from_secs(3), async {}).await;
    assert!(!text.contains("access revoked"), "{text:?}");
}

async fn members_store_and_delete_objects_by_one_rule(b: Backend) {
    let app = spawn_app(b).await;
    let owner = app.signup("owner@example.com", "Lab").await;
    let member = app.invite_and_join(&owner, "m@example.com", "member").await;
    let put = |s: &Session, path: &str| {
        s.request(&app, Method::PUT, path)
            .header("Content-Type", "application/octet-stream")
            .body("data")
    };
    for (path, write, delete) in [
        (
            "/api/v1/objects/autodl/datasets/x.bin",
            StatusCode::CREATED,
            StatusCode::NO_CONTENT,
        ),
        (
            "/api/v1/objects/autodl/checkpoints/x.bin",
            StatusCode::FORBIDDEN,
            StatusCode::FORBIDDEN,
        ),
    ] {
        assert_eq!(
            put(&member, path).send().await.unwrap().status(),
            write,
            "PUT {path}"
        );
        assert_eq!(
            put(&member, path).send().await.unwrap().status(),
            write,
            "PUT again {path}"
        );
        assert_eq!(
            member.send(&app, Method::DELETE, path, None).await.status(),
            delete,
            "DELETE {path}"
        );
    }
}

async fn nodes_hide_other_organizations_tasks(b: Backend) {
    let app = spawn_app(b).await;
    let op = app.operator_with_nodes().await;
    let a = app.signup("a@example.com", "Org A").await;
    let bee = app.signup("b@example.com", "Org B").await;
    let res = a
        .send(
            &app,
            Method::POST,
            "/api/v1/tasks",
            Some(task_spec("secret-run", "A100")),
        )
        .await;
    let id = res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.get(&app, &format!("/api/v1/tasks/{id}")).await["state"] == "pending" {
        assert!(Instant::now() < deadline, "not placed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let gpus = |nodes: Value| -> Vec<Value> {
        nodes
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|n| n["gpus"].as_array().unwrap().clone())
            .collect()
    };
    let theirs = gpus(bee.get(&app, "/api/v1/nodes").await);
    assert!(!theirs.iter().any(|g| g["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t == &json!(id))));
    assert_eq!(
        theirs
            .iter()
            .map(|g| g["other_tasks"].as_u64().unwrap())
            .sum::<u64>(),
        1
    );
    assert!(
        theirs
            .iter()
            .any(|g| g["allocated_memory"].as_u64().unwrap() > 0),
        "allocation still shown"
    );
    for (who, admin) in [(&a, false), (&op, true)] {
        let seen = gpus(who.get(&app, "/api/v1/nodes").await);
        assert!(seen
            .iter()
            .any(|g| g["tasks"].as_array().unwrap().contains(&json!(id))));
        // The platform admin is told the task is another organization's (its page is theirs).
        let foreign = seen.iter().any(|g| {
            g["other_org_tasks"]
                .as_array()
                .unwrap()
                .contains(&json!(id))
        });
        assert_eq!(foreign, admin, "other_org_tasks");
    }
}

async fn pages_and_answers_carry_security_headers(b: Backend) {
    let app = spawn_app(b).await;
    let res = Client::new().get(app.url("/login")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let h = res.headers().clone();
    let csp = h["content-security-policy"].to_str().unwrap().to_owned();
    let nonce = csp
        .split("'nonce-")
        .nth(1)
        .and_then(|r| r.split('\'').next())
        .unwrap_or_else(|| panic!("no nonce in {csp}"))
        .to_owned();
    assert!(
        csp.contains("frame-ancestors 'none'") && csp.contains("object-src 'none'"),
        "{csp}"
    );
    assert!(
        !csp.contains("unsafe-eval'") || csp.contains("wasm-unsafe-eval"),
        "{csp}"
    );
    let html = res.text().await.unwrap();
    assert!(
        html.contains(&format!("nonce=\"{nonce}\"")),
        "the hydration script carries the nonce"
    );
    let again = Client::new().get(app.url("/login")).send().await.unwrap();
    assert!(
        !again.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .contains(&nonce),
        "a nonce per response"
    );
    let api = Client::new()
        .get(app.url("/api/v1/me"))
        .send()
        .await
        .unwrap();
    for headers in [&h, api.headers()] {
        assert_eq!(headers["x-frame-options"], "DENY");
        assert_eq!(headers["x-content-type-options"], "nosniff");
        assert_eq!(headers["referrer-policy"], "no-referrer");
    }
    assert!(api.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .starts_with("default-src 'none'"));
}

async fn metrics_need_an_administrator_or_the_scrape_token(b: Backend) {
    let app = spawn_app_with(b, |s| s.metrics_token = Some("scrape-me-0123456789".into())).await;
    let op = app.operator().await;
    let member = app.signup("m@example.com", "Lab").await;
    let get = |bearer: Option<&str>| {
        let mut r = Client::new().get(app.url("/metrics"));
        if let Some(t) = bearer {
            r = r.bearer_auth(t);
        }
        r
    };
    assert_eq!(
        get(None).send().await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        get(Some("wrong")).send().await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        get(Some(&member.token)).send().await.unwrap().status(),
        StatusCode::FORBIDDEN
    );
    let ok = get(Some("scrape-me-0123456789")).send().await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert!(ok.text().await.unwrap().contains("autodl_"));
    assert!(op.prometheus(&app).await.contains("autodl_"));
}

async fn sign_up_refuses_weak_passwords_lookalike_emails_and_floods(b: Backend) {
    let app = spawn_app_with(b, |s| s.signups_per_minute_per_address = 6).await;
    let signup = |email: &str, password: &str| {
        Client::new()
            .post(app.url("/api/v1/auth/signup"))
            .json(&json!({"email": email, "password": password, "tenant_name": format!("Org {email}")}))
            .send()
    };
    for weak in ["Password12", "Summer2024"] {
        let res = signup("weak@example.com", weak).await.unwrap();
        let e = assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
        assert_eq!(e["error"]["field"], "password");
    }
    assert_eq!(
        signup("ada@example.com", PASSWORD).await.unwrap().status(),
        StatusCode::CREATED
    );
    // Look-alikes of a known address never make a second account: full-width letters and
    // quoted local parts are not addresses the API takes.
    for lookalike in [
        "ａｄａ@example.com",
        "\"ada\"@example.com",
        "ADA@EXAMPLE.COM",
    ] {
        let res = signup(lookalike, PASSWORD).await.unwrap();
        assert!(
            matches!(res.status(), StatusCode::BAD_REQUEST | StatusCode::CONFLICT),
            "{lookalike}: {}",
            res.status()
        );
    }
    // Probing which addresses have accounts is throttled per address: of the six sign-ups
    // this address may make a minute, some went above, so fewer than six more get through.
    let mut throttled = None;
    for i in 0..6 {
        let res = signup(&format!("late{i}@example.com"), PASSWORD)
            .await
            .unwrap();
        if res.status() == StatusCode::TOO_MANY_REQUESTS {
            throttled =
                Some(assert_error(res, StatusCode::TOO_MANY_REQUESTS, "rate_limited").await);
            break;
        }
        assert_eq!(res.status(), StatusCode::CREATED);
    }
    assert!(
        throttled.is_some(),
        "sign-ups from one address are throttled"
    );
}

async fn deadlines_in_the_past_are_refused(b: Backend) {
    let app = spawn_app(b).await;
    let s = app.signup("ada@example.com", "Lab").await;
    let res = s
        .send(&app, Method::POST, "/api/v1/tasks",
            Some(json!({"name": "t", "image": "i", "command": "true", "deadline": "2020-01-01T00:00:00Z"})))
        .await;
    let e = assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
    assert_eq!(e["error"]["field"], "deadline");
    assert!(e["error"]["message"]
        .as_str()
        .unwrap()
        .contains("in the past"));
    assert!(s.get(&app, "/api/v1/tasks").await["items"]
        .as_array()
        .unwrap()
        .is_empty());
}

async fn put_bytes(s: &Session, app: &TestApp, path: &str, n: usize) -> reqwest::Response {
    s.request(app, Method::PUT, &format!("/api/v1/objects/autodl/{path}"))
        .header("Content-Type", "application/octet-stream")
        .body(vec![7u8; n])
        .send()
        .await
        .unwrap()
}

async fn storage_quota_holds_uploads(b: Backend) {
    let app = spawn_app(b).await;
    let op = app.operator().await;
    let s = app.signup("ada@example.com", "Lab").await;
    let tenant = s.user["tenant_id"].as_str().unwrap().to_owned();
    let res = op
        .send(
            &app,
            Method::PUT,
            &format!("/api/v1/admin/tenants/{tenant}/quota"),
            Some(json!({"max_storage_bytes": 1000})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        put_bytes(&s, &app, "a.bin", 800).await.status(),
        StatusCode::CREATED
    );
    assert_eq!(s.get(&app, "/api/v1/tenant").await["storage_bytes"], 800);
    // Over the quota: refused before a byte is stored, and nothing appears.
    let res = put_bytes(&s, &app, "b.bin", 300).await;
    let e = assert_error(res, StatusCode::FORBIDDEN, "quota").await;
    assert!(e["error"]["message"]
        .as_str()
        .unwrap()
        .contains("storage quota"));
    let res = s
        .send(&app, Method::GET, "/api/v1/objects/autodl/b.bin", None)
        .await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    // A body that does not say its length is cut off at the quota.
    let chunks =
        futures_util::stream::iter((0..4).map(|_| Ok::<_, std::io::Error>(vec![1u8; 100])));
    let res = s
        .request(&app, Method::PUT, "/api/v1/objects/autodl/c.bin")
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_error(res, StatusCode::FORBIDDEN, "quota").await;
    // Replacing an object counts only the difference; deleting frees it.
    assert_eq!(
        put_bytes(&s, &app, "a.bin", 950).await.status(),
        StatusCode::CREATED
    );
    assert_eq!(s.get(&app, "/api/v1/tenant").await["storage_bytes"], 950);
    let res = s
        .send(&app, Method::DELETE, "/api/v1/objects/autodl/a.bin", None)
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(s.get(&app, "/api/v1/tenant").await["storage_bytes"], 0);
    let tenants = op.get(&app, "/api/v1/admin/tenants").await;
    let t = tenants
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == json!(tenant))
        .unwrap()
        .clone();
    assert_eq!(t["quota"]["max_storage_bytes"], 1000);
    // A member's quota has no storage cap of its own.
    let res = s
        .send(
            &app,
            Method::PUT,
            &format!("/api/v1/tenant/members/{}/quota", s.id()),
            Some(json!({"max_storage_bytes": 10})),
        )
        .await;
    assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
}

async fn a_file_and_a_folder_of_the_same_name_conflict(b: Backend) {
    let app = spawn_app(b).await;
    let s = app.signup("ada@example.com", "Lab").await;
    assert_eq!(
        put_bytes(&s, &app, "conf", 10).await.status(),
        StatusCode::CREATED
    );
    let res = put_bytes(&s, &app, "conf/child", 10).await;
    assert_error(res, StatusCode::CONFLICT, "conflict").await;
    assert_eq!(
        put_bytes(&s, &app, "dir/x", 10).await.status(),
        StatusCode::CREATED
    );
    let res = put_bytes(&s, &app, "dir", 10).await;
    assert_error(res, StatusCode::CONFLICT, "conflict").await;
    // Nothing was lost.
    for path in ["conf", "dir/x"] {
        let res = s
            .send(
                &app,
                Method::GET,
                &format!("/api/v1/objects/autodl/{path}"),
                None,
            )
            .await;
        assert_eq!(res.status(), StatusCode::OK);
    }
}

async fn submit(s: &Session, app: &TestApp, body: Value) -> reqwest::Response {
    s.send(app, Method::POST, "/api/v1/tasks", Some(body)).await
}

async fn data_paths_are_storage_or_a_dataset_root(b: Backend) {
    let app = spawn_app(b).await;
    let op = app.operator().await;
    let s = app.signup("ada@example.com", "Lab").await;
    let with_data = |p: &str| json!({"name": "t", "image": "i", "command": "true", "data_path": p});
    // No node shares a folder: host paths are refused, whatever they name.
    for p in [
        "/var/run/docker.sock",
        "/",
        "/var/lib/autodl-agent/tasks/x",
        "datasets/x",
        "/datasets/../etc",
    ] {
        let res = submit(&s, &app, with_data(p)).await;
        let e = assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
        assert_eq!(e["error"]["field"], "data_path", "{p}");
    }
    // A node with a dataset root: paths inside it are accepted, and go to that node only.
    let plain = FakeAgent::join(&app, &op, "plain", "A100-40G", "z1").await;
    let shared = FakeAgent::join_with(
        &app,
        &op,
        "with-data",
        "A100-40G",
        "z1",
        json!({"runtime": "docker", "isolation": "container", "data_roots": ["/datasets"]}),
    )
    .await;
    let nodes = s.get(&app, "/api/v1/nodes").await;
    assert!(nodes
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n["data_roots"] == json!(["/datasets"])));
    for p in ["/datasets-other/x", "/var/run/docker.sock"] {
        let res = submit(&s, &app, with_data(p)).await;
        assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
    }
    let mut spec = with_data("/datasets/imagenet");
    spec["resources"] = json!({"gpu": {"count": 1}});
    let (_, _, a) = shared.placed(&app, &s, spec).await;
    assert_eq!(a["data_path"], "/datasets/imagenet");
    assert!(plain.poll(&[], 0).await["assignments"]
        .as_array()
        .unwrap()
        .is_empty());
    // An agent cannot declare the whole host a dataset root.
    let t = app.registration_token(&op, "x").await;
    let res = Client::new()
        .post(app.url("/api/v1/agent/register"))
        .json(&json!({"token": t, "node": {"id": "root-share", "cpu": 8, "memory": 1 << 30, "gpus": [],
            "host": {"runtime": "process", "isolation": "sandbox", "data_roots": ["/"]}}}))
        .send()
        .await
        .unwrap();
    let e = assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
    assert_eq!(e["error"]["field"], "node.host.data_roots");
}

async fn trusted_only_nodes_take_only_trusted_organizations(b: Backend) {
    let app = spawn_app(b).await;
    let op = app.operator().await;
    let shared = FakeAgent::join_with(
        &app,
        &op,
        "shared-host",
        "A100-40G",
        "z1",
        json!({"runtime": "process", "isolation": "none"}),
    )
    .await;
    let nodes = op.get(&app, "/api/v1/nodes").await;
    assert_eq!(nodes[0]["trusted_only"], true);
    assert_eq!(nodes[0]["isolation"], "none");
    let a = app.signup("a@example.com", "Org A").await;
    let bee = app.signup("b@example.com", "Org B").await;
    // Nobody is trusted yet: the only node is closed to every organization.
    let res = submit(&a, &app, task_spec("t", "A100")).await;
    let e = assert_error(res, StatusCode::BAD_REQUEST, "unschedulable").await;
    assert!(
        e["error"]["message"].as_str().unwrap().contains("trust"),
        "{e}"
    );
    // An administrator trusts A: A's tasks run there, B's still may not.
    let tenant_a = a.user["tenant_id"].as_str().unwrap().to_owned();
    let res = a
        .send(
            &app,
            Method::PATCH,
            &format!("/api/v1/admin/tenants/{tenant_a}"),
            Some(json!({"trusted": true})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN, "only platform admins");
    let t: Value = op
        .send(
            &app,
            Method::PATCH,
            &format!("/api/v1/admin/tenants/{tenant_a}"),
            Some(json!({"trusted": true})),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(t["trusted"], true);
    shared.placed(&app, &a, task_spec("t", "A100")).await;
    assert_eq!(
        submit(&bee, &app, task_spec("t", "A100")).await.status(),
        StatusCode::BAD_REQUEST
    );
    // Opened to all by an administrator (their risk), B's tasks run there too.
    let res = op
        .send(
            &app,
            Method::POST,
            "/api/v1/admin/nodes/shared-host/open-to-all",
            None,
        )
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        op.get(&app, "/api/v1/nodes").await[0]["trusted_only"],
        false
    );
    shared.placed(&app, &bee, task_spec("t", "A100")).await;
    // An agent that later reports it isolates tasks is no longer trusted-only.
    let res = shared
        .call(
            "/api/v1/agent/poll",
            json!({"host": {"runtime": "docker", "isolation": "container"}}),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        op.get(&app, "/api/v1/nodes").await[0]["isolation"],
        "container"
    );
}

/// The build leaves `file.gz` beside each bundle file; the server hands it to browsers that
/// take gzip, the file itself to the rest, and nothing outside the bundle's folder.
async fn the_bundle_is_served_gzipped_ahead_of_time(b: Backend) {
    let app = spawn_app(b).await;
    let pkg = app.dir.path().join("site/pkg");
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::write(pkg.join("autodl.js"), "plain script").unwrap();
    std::fs::write(pkg.join("autodl.css"), "body{}").unwrap();
    std::fs::write(app.dir.path().join("site/secret.txt"), "not yours").unwrap();
    // Stands for the gzip of autodl.js: the server must pass it through, not compress again.
    std::fs::write(pkg.join("autodl.js.gz"), "packed script").unwrap();
    let get = |path: &str, encoding: &str| {
        let mut req = Client::new().get(app.url(path));
        if !encoding.is_empty() {
            req = req.header("accept-encoding", encoding);
        }
        async move {
            let res = req.send().await.unwrap();
            let status = res.status();
            let enc = res
                .headers()
                .get("content-encoding")
                .map(|v| v.to_str().unwrap().to_owned());
            let ty = res
                .headers()
                .get("content-type")
                .map(|v| v.to_str().unwrap().to_owned());
            (status, enc, ty, res.bytes().await.unwrap())
        }
    };
    let (status, enc, ty, body) = get("/pkg/autodl.js", "gzip, deflate, br, zstd").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(enc.as_deref(), Some("gzip"));
    assert!(ty.unwrap().contains("javascript"));
    assert_eq!(&body[..], b"packed script");
    // Without gzip (or with gzip refused), the file itself.
    for enc in ["", "identity", "gzip;q=0, identity"] {
        let (status, got, _, body) = get("/pkg/autodl.js", enc).await;
        assert_eq!(status, StatusCode::OK, "{enc}");
        assert_ne!(got.as_deref(), Some("gzip"), "{enc}");
        assert_eq!(&body[..], b"plain script", "{enc}");
    }
    // A file with no .gz beside it is served as it is.
    let (status, _, _, body) = get("/pkg/autodl.css", "identity").await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"body{}"[..]));
    // A .gz older than its file is stale: the file wins (compressed as any answer is).
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(pkg.join("autodl.js"), "rebuilt script").unwrap();
    let (_, _, _, body) = get("/pkg/autodl.js", "gzip").await;
    assert_ne!(&body[..], b"packed script");
    let (_, _, _, body) = get("/pkg/autodl.js", "identity").await;
    assert_eq!(&body[..], b"rebuilt script");
    for path in [
        "/pkg/..%2Fsecret.txt",
        "/pkg/%2E%2E/secret.txt",
        "/pkg/.hidden",
        "/pkg/nothing-here.js",
    ] {
        let (status, _, _, body) = get(path, "gzip").await;
        assert!(status.is_client_error(), "{path}: {status}");
        assert!(!String::from_utf8_lossy(&body).contains("not yours"));
    }
    // A page the app does not know says so in its layout, with a 404.
    let (status, _, ty, body) = get("/no/such/page", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(ty.unwrap().starts_with("text/html"));
    assert!(String::from_utf8_lossy(&body).contains("Page not found"));
}

/// The storage cap holds when an organization's uploads arrive together (each checked only
/// at its start, five of eight 300-byte uploads passed a 1,000-byte cap), and for a
/// checkpoint, whose bytes count as they arrive (a 30 MB checkpoint was stored under a
/// 100,000-byte cap).
async fn storage_quota_holds_concurrent_uploads_and_checkpoints(b: Backend) {
    let app = spawn_app(b).await;
    let op = app.operator().await;
    let s = app.signup("ada@example.com", "Lab").await;
    let tenant = s.user["tenant_id"].as_str().unwrap().to_owned();
    let cap = |bytes: u64| {
        let (op, app, tenant) = (&op, &app, &tenant);
        async move {
            let res = op
                .send(
                    app,
                    Method::PUT,
                    &format!("/api/v1/admin/tenants/{tenant}/quota"),
                    Some(json!({ "max_storage_bytes": bytes })),
                )
                .await;
            assert_eq!(res.status(), StatusCode::OK);
        }
    };
    cap(1000).await;
    // Bodies that do not say their length, all at once.
    let uploads = (0..8).map(|i| {
        let chunks =
            futures_util::stream::iter((0..3).map(|_| Ok::<_, std::io::Error>(vec![1u8; 100])));
        s.request(
            &app,
            Method::PUT,
            &format!("/api/v1/objects/autodl/p{i}.bin"),
        )
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
    });
    let answers = futures_util::future::join_all(uploads).await;
    let stored = answers
        .iter()
        .filter(|r| r.as_ref().unwrap().status() == StatusCode::CREATED)
        .count();
    assert!(
        stored <= 3,
        "{stored} uploads of 300 bytes under a 1,000-byte cap"
    );
    let used = s.get(&app, "/api/v1/tenant").await["storage_bytes"]
        .as_u64()
        .unwrap();
    assert_eq!(used, 300 * stored as u64, "the count is what is stored");

    // A checkpoint larger than what is left: refused as it arrives.
    for i in 0..8 {
        let _ = s
            .send(
                &app,
                Method::DELETE,
                &format!("/api/v1/objects/autodl/p{i}.bin"),
                None,
            )
            .await;
    }
    cap(100_000).await;
    let agent = crate::e2e::start_agent(&app, &op, "quota-node", "1xA100-40G").await;
    let id = crate::e2e::submit(&app, &s, json!({"name": "big", "image": "none",
        "command": "head -c 30000000 /dev/zero > \"$AUTODL_CHECKPOINT_DIR/model.pt\" && echo '{}' > \"$AUTODL_CHECKPOINT_DIR/.autodl-save\" && sleep 3",
        "resources": {"gpu": {"count": 1}}})).await;
    let t = crate::e2e::wait_for(&app, &s, &id, &["completed", "failed"], 90).await;
    let log = crate::e2e::log_text(&app, &s, &id).await;
    assert_eq!(t["state"], "completed", "{t}\n{log}");
    assert!(log.contains("checkpoint upload failed"), "{log}");
    assert!(log.contains("storage quota"), "{log}");
    let saves = s
        .get(&app, &format!("/api/v1/tasks/{id}/checkpoints"))
        .await;
    assert_eq!(saves, json!([]), "{saves}");
    // What was received and given up no longer counts.
    let mut used = u64::MAX;
    for _ in 0..50 {
        used = s.get(&app, "/api/v1/tenant").await["storage_bytes"]
            .as_u64()
            .unwrap();
        if used == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(used, 0);
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}
