//! Sessions under their organization's rules: length, count, and idle GPUs stopped on a
//! manual clock.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::agents::FakeAgent;
use crate::helpers::{assert_error, spawn_app_on_clock, spawn_app_with, Backend, Session, TestApp};

crate::on_both_backends!(
    idle_sessions_are_warned_then_stopped,
    organizations_cap_session_length_and_count,
    a_batch_task_held_by_a_shell_is_under_the_session_rules,
);

fn rfc3339(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

async fn put_policy(app: &TestApp, s: &Session, body: Value) -> reqwest::Response {
    s.send(
        app,
        Method::PUT,
        "/api/v1/tenant/session-policy",
        Some(body),
    )
    .await
}

async fn kinds(app: &TestApp, s: &Session, id: &str) -> Vec<(String, String)> {
    let events = s.get(app, &format!("/api/v1/tasks/{id}/events")).await;
    events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["kind"].as_str().unwrap().to_owned(),
                e["message"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

async fn idle_sessions_are_warned_then_stopped(b: Backend) {
    use autodl_server::clock::Clock;
    // The fake agent polls only when the test says: it must not be judged lost meanwhile.
    let (app, clock) = spawn_app_on_clock(b, |s| {
        s.node_lost_timeout_secs = 3600;
        s.webhook_allow_internal = true;
    })
    .await;
    let op = app.operator().await;
    let agent = FakeAgent::join(&app, &op, "n1", "A100-40G", "z1").await;
    let ada = app.signup("ada@example.com", "Lab").await;
    let res = put_policy(&app, &ada, json!({"idle_minutes": 10, "idle_util_pct": 5})).await;
    assert_eq!(res.status(), StatusCode::OK);
    // The organization is told by webhook too.
    let mut hooked = crate::webhooks::receiver().await;
    let res = ada
        .send(
            &app,
            Method::POST,
            "/api/v1/tenant/webhooks",
            Some(json!({"url": hooked.url, "events": ["task.idle", "task.idle_stopped"]})),
        )
        .await;
    let secret = res.json::<Value>().await.unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_owned();
    let t0 = clock.now_ms();
    let mut runner = app.runner();
    let mut ids = Vec::new();
    // A third task keeps its GPU busy: each running task is judged from its own samples.
    for (name, kind) in [
        ("notebook", "session"),
        ("train", "batch"),
        ("steady", "batch"),
    ] {
        let res = ada
            .send(
                &app,
                Method::POST,
                "/api/v1/tasks",
                Some(
                    json!({"name": name, "image": "busybox", "kind": kind, "command": "sleep 1d",
                    "resources": {"gpu": {"count": 1}}}),
                ),
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
    runner.cycle(t0).await.unwrap();
    let work = agent.poll(&[], 0).await;
    let mut gpu_of = std::collections::HashMap::new();
    for a in work["assignments"].as_array().unwrap() {
        gpu_of.insert(
            a["task_id"].as_str().unwrap().to_owned(),
            a["gpu_indices"][0].as_u64().unwrap(),
        );
    }
    for id in &ids {
        let res = agent
            .call(
                &format!("/api/v1/agent/tasks/{id}/started"),
                json!({"attempt": 1}),
            )
            .await;
        assert!(res.status().is_success());
    }
    let running: Vec<(String, u64)> = ids.iter().map(|i| (i.clone(), 1)).collect();
    let steady = ids.pop().unwrap();
    // Busy for its first minute, then under the threshold.
    let report = |at: i64, util: f64| {
        let samples: Vec<Value> = ids
            .iter()
            .map(|id| (id, util))
            .chain([(&steady, 0.9)])
            .map(|(id, util)| {
                json!({"at": rfc3339(at), "gpu_index": gpu_of[id], "util": util,
                "mem_used": 1 << 30, "mem_total": 42949672960u64, "task_id": id})
            })
            .collect();
        json!({ "samples": samples })
    };
    for (minute, util) in [(1, 0.9), (2, 0.01), (4, 0.02), (6, 0.0)] {
        clock.set(t0 + minute * 60_000);
        let res = agent
            .call("/api/v1/agent/metrics", report(clock.now_ms(), util))
            .await;
        assert!(res.status().is_success(), "{}", res.text().await.unwrap());
    }
    // Idle for 5 of its 10 minutes: both are warned, once.
    clock.set(t0 + 6 * 60_000);
    agent.poll(&running, 0).await;
    runner.cycle(clock.now_ms()).await.unwrap();
    clock.set(t0 + 6 * 60_000 + 61_000);
    runner.cycle(clock.now_ms()).await.unwrap();
    for id in &ids {
        let warned: Vec<_> = kinds(&app, &ada, id)
            .await
            .into_iter()
            .filter(|(k, _)| k == "idle")
            .collect();
        assert_eq!(warned.len(), 1, "{warned:?}");
        assert!(warned[0].1.contains("under 5%"), "{warned:?}");
    }
    let said = kinds(&app, &ada, &steady).await;
    assert!(!said.iter().any(|(k, _)| k == "idle"), "{said:?}");
    let mut warned: Vec<String> = crate::webhooks::told(&app, &mut hooked, &secret, 2)
        .await
        .iter()
        .map(|b| {
            assert_eq!(b["event"], "task.idle", "{b}");
            assert!(b["data"]["idle_gpu_hours"].as_f64().unwrap() > 0.0, "{b}");
            b["data"]["task"]["id"].as_str().unwrap().to_owned()
        })
        .collect();
    warned.sort();
    let mut all = ids.clone();
    all.sort();
    assert_eq!(warned, all);
    // Ten minutes idle: the session is stopped through its grace period, the batch task is
    // only warned (the organization did not ask to stop those).
    clock.set(t0 + 12 * 60_000);
    agent
        .call("/api/v1/agent/metrics", report(clock.now_ms(), 0.0))
        .await;
    agent.poll(&running, 0).await;
    runner.cycle(clock.now_ms()).await.unwrap();
    let work = agent.poll(&running, 0).await;
    let stops: Vec<&str> = work["stop"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["task_id"].as_str().unwrap())
        .collect();
    assert_eq!(stops, [ids[0].as_str()], "{work}");
    assert_eq!(work["stop"][0]["reason"], "idle");
    let res = agent
        .call(
            &format!("/api/v1/agent/tasks/{}/finished", ids[0]),
            json!({"attempt": 1, "exit_code": 143, "reason": "stopped"}),
        )
        .await;
    assert!(res.status().is_success());
    let t = ada.get(&app, &format!("/api/v1/tasks/{}", ids[0])).await;
    assert_eq!(t["state"], "cancelled", "{t}");
    let attempts = ada
        .get(&app, &format!("/api/v1/tasks/{}/attempts", ids[0]))
        .await;
    assert_eq!(attempts[0]["reason"], "idle");
    let said = kinds(&app, &ada, &ids[0]).await;
    let stop = said
        .iter()
        .find(|(k, _)| k == "idle_stop")
        .expect("a stop event");
    assert!(stop.1.contains("GPU-hours idle"), "{stop:?}");
    let stopped = crate::webhooks::told(&app, &mut hooked, &secret, 1).await;
    assert_eq!(stopped[0]["event"], "task.idle_stopped");
    assert_eq!(stopped[0]["data"]["task"]["id"], ids[0].as_str());
    let t = ada.get(&app, &format!("/api/v1/tasks/{}", ids[1])).await;
    assert_eq!(t["state"], "running", "batch tasks are only warned: {t}");
    // Its GPU is free again for others.
    runner.cycle(clock.now_ms()).await.unwrap();

    // An organization that asks for it has idle batch tasks stopped as well.
    let res = put_policy(
        &app,
        &ada,
        json!({"idle_minutes": 10, "idle_util_pct": 5, "stop_idle_batch": true}),
    )
    .await;
    assert_eq!(res.status(), StatusCode::OK);
    let running = [(ids[1].clone(), 1), (steady.clone(), 1)];
    clock.set(t0 + 13 * 60_000);
    let sample = json!({"samples": [{"at": rfc3339(clock.now_ms()), "gpu_index": gpu_of[&ids[1]],
        "util": 0.0, "mem_used": 1 << 30, "mem_total": 42949672960u64, "task_id": ids[1]}]});
    let res = agent.call("/api/v1/agent/metrics", sample).await;
    assert!(res.status().is_success(), "{}", res.text().await.unwrap());
    agent.poll(&running, 0).await;
    runner.cycle(clock.now_ms()).await.unwrap();
    let work = agent.poll(&running, 0).await;
    assert_eq!(work["stop"][0]["task_id"], ids[1].as_str(), "{work}");
    assert_eq!(work["stop"][0]["reason"], "idle", "{work}");
    let said = kinds(&app, &ada, &ids[1]).await;
    assert!(said.iter().any(|(k, _)| k == "idle_stop"), "{said:?}");
    assert_eq!(work["stop"].as_array().unwrap().len(), 1, "{work}");
    let said = kinds(&app, &ada, &steady).await;
    assert!(!said.iter().any(|(k, _)| k.starts_with("idle")), "{said:?}");
}

async fn organizations_cap_session_length_and_count(b: Backend) {
    let app = spawn_app_with(b, |_| {}).await;
    let op = app.operator().await;
    let _agent = FakeAgent::join(&app, &op, "n1", "A100-40G", "z1").await;
    let ada = app.signup("ada@example.com", "Lab").await;
    let bob = app.invite_and_join(&ada, "bob@example.com", "member").await;
    let defaults = bob.get(&app, "/api/v1/tenant/session-policy").await;
    assert_eq!(defaults["idle_minutes"], 30);
    assert_eq!(defaults["idle_util_pct"], 5.0);
    let res = put_policy(&app, &bob, json!({"idle_minutes": 1})).await;
    assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
    for (body, field) in [
        (json!({"idle_util_pct": 120}), "idle_util_pct"),
        (json!({"max_session_hours": 0}), "max_session_hours"),
        (json!({"idle_minutes": 99999}), "idle_minutes"),
    ] {
        let res = put_policy(&app, &ada, body).await;
        let e = assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
        assert_eq!(e["error"]["field"], field);
    }
    let res = put_policy(
        &app,
        &ada,
        json!({"max_session_hours": 2, "max_sessions_per_user": 1}),
    )
    .await;
    assert_eq!(res.status(), StatusCode::OK);
    let session = json!({"name": "nb", "image": "jupyter", "kind": "session", "time_limit": "5h",
        "resources": {"gpu": {"count": 1}}});
    let res = bob
        .send(&app, Method::POST, "/api/v1/tasks", Some(session.clone()))
        .await;
    let status = res.status();
    let t: Value = res.json().await.unwrap();
    assert_eq!(status, StatusCode::CREATED, "{t}");
    assert_eq!(
        t["spec"]["time_limit"], 7200,
        "capped to the organization's 2 h: {t}"
    );
    assert_eq!(t["spec"]["command"], json!(["sleep", "infinity"]));
    let res = bob
        .send(&app, Method::POST, "/api/v1/tasks", Some(session.clone()))
        .await;
    let e = assert_error(res, StatusCode::FORBIDDEN, "quota").await;
    assert!(
        e["error"]["message"].as_str().unwrap().contains("allows 1"),
        "{e}"
    );
    // Batch tasks and other members are not held by it.
    let res = bob
        .send(
            &app,
            Method::POST,
            "/api/v1/tasks",
            Some(json!({"name": "b", "image": "x", "command": "true"})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let res = ada
        .send(&app, Method::POST, "/api/v1/tasks", Some(session))
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
}

/// A batch task that sleeps with `ports` is a session by another name: once a shell or an
/// app holds it, the member's session cap counts it and the organization's session length
/// ends it.
async fn a_batch_task_held_by_a_shell_is_under_the_session_rules(b: Backend) {
    use autodl_server::clock::Clock;
    let (app, clock) = spawn_app_on_clock(b, |s| s.node_lost_timeout_secs = 3600).await;
    let op = app.operator().await;
    let agent = FakeAgent::join(&app, &op, "n1", "A100-40G", "z1").await;
    let ada = app.signup("ada@example.com", "Lab").await;
    let res = put_policy(
        &app,
        &ada,
        json!({"max_sessions_per_user": 1, "max_session_hours": 1, "idle_minutes": 0}),
    )
    .await;
    assert_eq!(res.status(), StatusCode::OK);
    let t0 = clock.now_ms();
    let mut runner = app.runner();
    let mut ids = Vec::new();
    for name in ["hideout", "other"] {
        let res = ada
            .send(
                &app,
                Method::POST,
                "/api/v1/tasks",
                Some(
                    json!({"name": name, "image": "busybox", "command": "sleep 100000",
                    "time_limit": "30d", "ports": [8888], "resources": {"gpu": {"count": 1}}}),
                ),
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
    runner.cycle(t0).await.unwrap();
    agent.poll(&[], 0).await;
    for id in &ids {
        let res = agent
            .call(
                &format!("/api/v1/agent/tasks/{id}/started"),
                json!({"attempt": 1}),
            )
            .await;
        assert!(res.status().is_success());
    }
    let running: Vec<(String, u64)> = ids.iter().map(|i| (i.clone(), 1)).collect();
    // The first shell holds `hideout` like a session (its one allowed).
    let held =
        crate::tunnels::connect(&app, &ada, &format!("/api/v1/tasks/{}/shell", ids[0])).await;
    assert!(held.is_ok(), "{:?}", held.err());
    // A port into the second is one session too many; a one-shot command is no hold.
    let second =
        crate::tunnels::connect(&app, &ada, &format!("/api/v1/tasks/{}/ports/8888", ids[1])).await;
    assert_eq!(second.err(), Some(403));
    let exec = crate::tunnels::exec_path(&ids[1], &["nvidia-smi"]);
    assert!(crate::tunnels::connect(&app, &ada, &exec).await.is_ok());
    // Opening `hideout` again is the same hold.
    assert!(
        crate::tunnels::connect(&app, &ada, &format!("/api/v1/tasks/{}/shell", ids[0]))
            .await
            .is_ok()
    );
    // Past the organization's session length (an hour), the held one is stopped; the other
    // runs on to its own 30 days.
    clock.set(t0 + 61 * 60_000);
    agent.poll(&running, 0).await;
    runner.cycle(clock.now_ms()).await.unwrap();
    let work = agent.poll(&running, 0).await;
    let stops: Vec<&str> = work["stop"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["task_id"].as_str().unwrap())
        .collect();
    assert_eq!(stops, [ids[0].as_str()], "{work}");
    let said = kinds(&app, &ada, &ids[0]).await;
    assert!(said.iter().any(|(k, _)| k == "session_length"), "{said:?}");
    drop(held);
}
