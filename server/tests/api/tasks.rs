//! Tasks end to end: submission, validation, the live scheduler, quotas, lifecycle and what a
//! task leaves behind.

use std::time::Duration;

use autodl_server::tasks::lifecycle::{after_attempt, ExitKind};
use reqwest::{Client, Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{assert_error, spawn_app, Backend, Session, TestApp};

crate::on_both_backends!(
    submitted_tasks_are_scheduled_onto_matching_nodes,
    task_input_is_validated,
    idempotency_key_creates_one_task,
    a_task_is_submitted_again_from_its_handed_out_spec,
    tasks_are_reached_by_number_name_or_id_prefix,
    listing_filters_and_pages,
    quotas_hold_or_refuse_tasks,
    tasks_of_other_tenants_are_out_of_reach,
    cancel_frees_the_gpus,
    lifecycle_retries_and_oom_recovery,
    logs_and_metrics,
    nodes_are_admin_managed,
    a_task_that_only_closed_nodes_could_hold_says_so,
);

fn spec(name: &str, gpu_type: &str, count: u32) -> Value {
    json!({"name": name, "image": "pytorch/pytorch:2.1", "command": ["python", "train.py"],
           "resources": {"gpu": {"type": gpu_type, "count": count}, "cpu": 4, "memory": "16GiB"}})
}

async fn submit(app: &TestApp, s: &Session, body: Value) -> Value {
    let res = s.send(app, Method::POST, "/api/v1/tasks", Some(body)).await;
    let status = res.status();
    let v: Value = res.json().await.unwrap();
    assert_eq!(status, StatusCode::CREATED, "{v}");
    v
}

/// Polls until the task reaches `state` (the scheduler runs asynchronously).
async fn wait_state(app: &TestApp, s: &Session, id: &str, state: &str) -> Value {
    for _ in 0..100 {
        let t = s.get(app, &format!("/api/v1/tasks/{id}")).await;
        if t["state"] == state {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "task {id} never became {state}: {}",
        s.get(app, &format!("/api/v1/tasks/{id}")).await
    );
}

async fn submitted_tasks_are_scheduled_onto_matching_nodes(b: Backend) {
    let app = spawn_app(b).await;
    app.operator_with_nodes().await;
    let s = app.signup("ada@example.com", "Lab").await;
    let t = submit(&app, &s, spec("resnet", "A100", 2)).await;
    assert_eq!(t["state"], "pending");
    assert_eq!(t["spec"]["gpus_per_worker"], 2);
    assert_eq!(t["spec"]["memory"], 16u64 << 30);
    let t = wait_state(&app, &s, t["id"].as_str().unwrap(), "scheduled").await;
    assert_eq!(t["placement"][0]["node"], "node-a");
    assert_eq!(
        t["placement"][0]["gpu_indices"].as_array().unwrap().len(),
        2
    );
    assert!(t["waiting"].is_null());

    let t2 = submit(&app, &s, spec("clip", "A40", 4)).await;
    let t2 = wait_state(&app, &s, t2["id"].as_str().unwrap(), "scheduled").await;
    assert_eq!(t2["placement"][0]["node"], "node-b");

    // Gang task over two workers: all or nothing, in one zone.
    let mut gang = spec("gang", "A100", 1);
    gang["num_workers"] = json!(2);
    gang["affinity"] = json!({"zone": "same"});
    let g = submit(&app, &s, gang).await;
    let g = wait_state(&app, &s, g["id"].as_str().unwrap(), "scheduled").await;
    assert_eq!(g["placement"].as_array().unwrap().len(), 2);

    // No room left for 4 more A100s: it waits, and says why.
    let big = submit(&app, &s, spec("big", "A100", 4)).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let big = s
        .get(
            &app,
            &format!("/api/v1/tasks/{}", big["id"].as_str().unwrap()),
        )
        .await;
    assert_eq!(big["state"], "pending");
    assert!(
        big["waiting"]["message"].as_str().unwrap().len() > 5,
        "{big}"
    );
    assert!(big["waiting"]["priority"]["total"].is_number(), "{big}");

    let events = s
        .get(
            &app,
            &format!("/api/v1/tasks/{}/events", t["id"].as_str().unwrap()),
        )
        .await;
    let kinds: Vec<&str> = events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["submitted", "scheduled"]);
    let attempts = s
        .get(
            &app,
            &format!("/api/v1/tasks/{}/attempts", t["id"].as_str().unwrap()),
        )
        .await;
    assert_eq!(attempts[0]["number"], 1);
    assert_eq!(attempts[0]["node"], "node-a");

    // The cluster view shows which tasks hold which GPU.
    let nodes = s.get(&app, "/api/v1/nodes").await;
    let a = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == "node-a")
        .unwrap();
    let busy = a["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| !g["tasks"].as_array().unwrap().is_empty())
        .count();
    assert_eq!(busy, 4);
}

async fn task_input_is_validated(b: Backend) {
    let app = spawn_app(b).await;
    app.operator_with_nodes().await;
    let s = app.signup("v@example.com", "Lab").await;
    let base = spec("v", "A100", 1);
    let with = |k: &str, v: Value| {
        let mut b = base.clone();
        b[k] = v;
        b
    };
    let cases = [
        (with("name", json!("")), "validation", Some("name")),
        (with("priority", json!(2.0)), "validation", Some("priority")),
        (
            with("priority", json!(-0.1)),
            "validation",
            Some("priority"),
        ),
        (
            with("num_workers", json!(0)),
            "validation",
            Some("num_workers"),
        ),
        (
            with("deadline", json!("next tuesday")),
            "validation",
            Some("deadline"),
        ),
        (
            with("env", json!({"AUTODL_TASK_ID": "x"})),
            "validation",
            Some("env"),
        ),
        (
            with("labels", json!({"bad key!": "x"})),
            "validation",
            Some("labels"),
        ),
        (
            with("affinity", json!({"zone": "moon"})),
            "validation",
            Some("affinity.zone"),
        ),
        (
            with("retry_policy", json!({"max_retries": 1000})),
            "validation",
            Some("retry_policy.max_retries"),
        ),
        (
            with("checkpoint", json!({"interval": 1})),
            "validation",
            Some("checkpoint.interval"),
        ),
        (
            with("data_path", json!("s3://bucket/../x")),
            "validation",
            Some("data_path"),
        ),
        (
            with("entry_point", json!("train.py")),
            "validation",
            Some("command"),
        ),
        (
            json!({"name": "x", "image": "i"}),
            "validation",
            Some("command"),
        ),
        (
            with(
                "resources",
                json!({"gpu": {"type": "A100", "memory": "lots"}}),
            ),
            "validation",
            Some("resources.gpu.memory"),
        ),
        (
            with("resources", json!({"cpu": -1})),
            "validation",
            Some("resources.cpu"),
        ),
        (
            with("resources", json!({"cpu": 0})),
            "validation",
            Some("resources.cpu"),
        ),
        (
            with("resources", json!({"memory": -1})),
            "validation",
            Some("resources.memory"),
        ),
        (
            with("checkpoint", json!({"interval": "soon"})),
            "validation",
            Some("checkpoint.interval"),
        ),
        (
            with("checkpoint", json!({"interval": "5s"})),
            "validation",
            Some("checkpoint.interval"),
        ),
        (with("colour", json!("blue")), "validation", Some("colour")),
        (
            with("priority", json!("high")),
            "validation",
            Some("priority"),
        ),
        (
            json!({"image": "i", "command": "x"}),
            "validation",
            Some("name"),
        ),
    ];
    for (body, code, field) in cases {
        let res = s
            .send(&app, Method::POST, "/api/v1/tasks", Some(body.clone()))
            .await;
        let e = assert_error(res, StatusCode::BAD_REQUEST, code).await;
        if let Some(f) = field {
            assert_eq!(e["error"]["field"], f, "for {body}");
        }
    }
    // Requests that can never fit are refused at submission (OOM prevention).
    for body in [
        with(
            "resources",
            json!({"gpu": {"type": "A100", "count": 1, "memory": "80GiB"}}),
        ),
        with("resources", json!({"gpu": {"type": "H100", "count": 1}})),
        with("resources", json!({"gpu": {"count": 9}})),
    ] {
        let res = s
            .send(&app, Method::POST, "/api/v1/tasks", Some(body))
            .await;
        assert_error(res, StatusCode::BAD_REQUEST, "unschedulable").await;
    }
    let page = s.get(&app, "/api/v1/tasks").await;
    assert!(
        page["items"].as_array().unwrap().is_empty(),
        "nothing was stored"
    );
    // Lengths of time are taken as text wherever a task has one.
    let t = submit(
        &app,
        &s,
        with(
            "checkpoint",
            json!({"interval": "1h30m", "save_to": "/ckpt"}),
        ),
    )
    .await;
    assert_eq!(t["spec"]["checkpoint"]["interval"], 5400, "{t}");
    s.send(
        &app,
        Method::POST,
        &format!("/api/v1/tasks/{}/cancel", t["id"].as_str().unwrap()),
        None,
    )
    .await;
    // Query parameters are checked too.
    for q in [
        "state=sleeping",
        "limit=0",
        "limit=1000",
        "cursor=garbage",
        "label=novalue",
        "colour=red",
    ] {
        let res = s
            .send(&app, Method::GET, &format!("/api/v1/tasks?{q}"), None)
            .await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{q}");
    }
}

async fn idempotency_key_creates_one_task(b: Backend) {
    let app = spawn_app(b).await;
    app.operator_with_nodes().await;
    let s = app.signup("i@example.com", "Lab").await;
    let send = || {
        s.request(&app, Method::POST, "/api/v1/tasks")
            .header("Idempotency-Key", "abc-123")
            .json(&spec("once", "A40", 1))
            .send()
    };
    let first = send().await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Value = first.json().await.unwrap();
    let again = send().await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    let again: Value = again.json().await.unwrap();
    assert_eq!(first["id"], again["id"]);
    assert_eq!(
        s.get(&app, "/api/v1/tasks").await["items"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    // Another user's identical key is theirs alone.
    let other = app.signup("j@example.com", "Other").await;
    let res = other
        .request(&app, Method::POST, "/api/v1/tasks")
        .header("Idempotency-Key", "abc-123")
        .json(&spec("once", "A40", 1))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    // The same key with a different request is refused, and makes nothing.
    let res = s
        .request(&app, Method::POST, "/api/v1/tasks")
        .header("Idempotency-Key", "abc-123")
        .json(&spec("twice", "A40", 2))
        .send()
        .await
        .unwrap();
    assert_error(res, StatusCode::UNPROCESSABLE_ENTITY, "unprocessable").await;
    assert_eq!(
        s.get(&app, "/api/v1/tasks").await["items"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let res = s
        .request(&app, Method::POST, "/api/v1/tasks")
        .header("Idempotency-Key", "x".repeat(200))
        .json(&spec("once", "A40", 1))
        .send()
        .await
        .unwrap();
    assert_error(res, StatusCode::BAD_REQUEST, "bad_request").await;
}

async fn listing_filters_and_pages(b: Backend) {
    let app = spawn_app(b).await;
    let s = app.signup("l@example.com", "Lab").await;
    let m = app.invite_and_join(&s, "m@example.com", "member").await;
    for i in 0..5 {
        let mut t = spec(&format!("t{i}"), "A100", 1);
        t["labels"] = json!({"project": if i % 2 == 0 { "vision" } else { "nlp" }});
        submit(&app, &s, t).await;
    }
    submit(&app, &m, spec("theirs", "A100", 1)).await;
    let all = s.get(&app, "/api/v1/tasks").await;
    assert_eq!(all["items"].as_array().unwrap().len(), 6);
    assert_eq!(all["items"][0]["name"], "theirs", "newest first");
    assert_eq!(all["total"], 6);
    let mine = s.get(&app, "/api/v1/tasks?user=me").await;
    assert_eq!(mine["items"].as_array().unwrap().len(), 5);
    assert_eq!(mine["total"], 5);
    let vision = s.get(&app, "/api/v1/tasks?label=project=vision").await;
    assert_eq!(vision["items"].as_array().unwrap().len(), 3);
    assert_eq!(vision["total"], 3);
    let pending = s.get(&app, "/api/v1/tasks?state=pending").await;
    assert_eq!(
        pending["items"].as_array().unwrap().len(),
        6,
        "no nodes: everything waits"
    );
    assert_eq!(
        s.get(&app, "/api/v1/tasks?state=running").await["items"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
    // Pages of two cover everything once.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/api/v1/tasks?limit=2&cursor={c}"),
            None => "/api/v1/tasks?limit=2".into(),
        };
        let page = s.get(&app, &path).await;
        assert_eq!(page["total"], 6, "the total counts every page");
        seen.extend(
            page["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["id"].as_str().unwrap().to_owned()),
        );
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen.len(), 6);
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 6);
    // Without nodes, a waiting task explains itself after a cycle.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t = s
        .get(
            &app,
            &format!("/api/v1/tasks/{}", all["items"][0]["id"].as_str().unwrap()),
        )
        .await;
    assert_eq!(t["waiting"]["reason"], "resources", "{t}");
}

async fn quotas_hold_or_refuse_tasks(b: Backend) {
    let app = spawn_app(b).await;
    let op = app.operator_with_nodes().await;
    let owner = app.signup("q@example.com", "Lab").await;
    let tenant = owner.user["tenant_id"].as_str().unwrap().to_owned();
    let quota_path = format!("/api/v1/admin/tenants/{tenant}/quota");
    let set = |body: Value| op.send(&app, Method::PUT, &quota_path, Some(body));
    assert_eq!(
        set(json!({"max_gpus": 2, "max_queued_tasks": 3, "allowed_gpu_types": ["A100"]}))
            .await
            .status(),
        StatusCode::OK
    );
    // A type outside the quota is refused outright.
    let res = owner
        .send(
            &app,
            Method::POST,
            "/api/v1/tasks",
            Some(spec("a40", "A40", 1)),
        )
        .await;
    let e = assert_error(res, StatusCode::FORBIDDEN, "quota").await;
    assert!(e["error"]["message"].as_str().unwrap().contains("A40"));
    // GPUs at once: the first fits, the second waits with the quota reason.
    let first = submit(&app, &owner, spec("one", "A100", 2)).await;
    wait_state(&app, &owner, first["id"].as_str().unwrap(), "scheduled").await;
    let second = submit(&app, &owner, spec("two", "A100", 1)).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let second = owner
        .get(
            &app,
            &format!("/api/v1/tasks/{}", second["id"].as_str().unwrap()),
        )
        .await;
    assert_eq!(second["state"], "pending");
    assert_eq!(second["waiting"]["reason"], "quota", "{second}");
    assert!(
        second["waiting"]["message"]
            .as_str()
            .unwrap()
            .contains("GPU quota"),
        "{second}"
    );
    // Queued tasks: at most three pending.
    submit(&app, &owner, spec("three", "A100", 1)).await;
    submit(&app, &owner, spec("four", "A100", 1)).await;
    let res = owner
        .send(
            &app,
            Method::POST,
            "/api/v1/tasks",
            Some(spec("five", "A100", 1)),
        )
        .await;
    assert_error(res, StatusCode::FORBIDDEN, "quota").await;
    // Raising the cap lets waiting tasks run: the two A100s left on node-a fill up.
    set(json!({"max_gpus": 8})).await;
    for _ in 0..100 {
        let scheduled = owner.get(&app, "/api/v1/tasks?state=scheduled").await;
        if scheduled["items"].as_array().unwrap().len() == 3 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("waiting tasks were not scheduled after the quota was raised");
}

async fn tasks_of_other_tenants_are_out_of_reach(b: Backend) {
    let app = spawn_app(b).await;
    let a = app.signup("a@example.com", "A").await;
    let bob = app.signup("b@example.com", "B").await;
    let t = submit(&app, &bob, spec("secret", "A100", 1)).await;
    let id = t["id"].as_str().unwrap();
    for (method, path) in [
        (Method::GET, format!("/api/v1/tasks/{id}")),
        (Method::POST, format!("/api/v1/tasks/{id}/cancel")),
        (Method::GET, format!("/api/v1/tasks/{id}/spec")),
        (Method::GET, format!("/api/v1/tasks/{id}/events")),
        (Method::GET, format!("/api/v1/tasks/{id}/attempts")),
        (Method::GET, format!("/api/v1/tasks/{id}/logs")),
        (Method::GET, format!("/api/v1/tasks/{id}/logs/stream")),
        (Method::GET, format!("/api/v1/tasks/{id}/metrics")),
        (Method::GET, format!("/api/v1/tasks/{id}/results")),
    ] {
        let res = a.send(&app, method.clone(), &path, None).await;
        assert_error(res, StatusCode::NOT_FOUND, "not_found").await;
    }
    let res = a
        .send(
            &app,
            Method::POST,
            &format!("/api/v1/tasks/{id}/metrics"),
            Some(json!({"epoch": 1})),
        )
        .await;
    assert_error(res, StatusCode::NOT_FOUND, "not_found").await;
    assert!(a.get(&app, "/api/v1/tasks").await["items"]
        .as_array()
        .unwrap()
        .is_empty());
    let t = bob.get(&app, &format!("/api/v1/tasks/{id}")).await;
    assert_eq!(t["state"], "pending", "untouched");
    assert!(
        bob.get(&app, &format!("/api/v1/tasks/{id}/metrics")).await["samples"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    // A key revoked mid-session stops working at once.
    let key: Value = bob
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
    let k = key["key"].as_str().unwrap();
    let res = Client::new()
        .get(app.url("/api/v1/tasks"))
        .bearer_auth(k)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    bob.send(
        &app,
        Method::DELETE,
        &format!("/api/v1/api-keys/{}", key["info"]["id"].as_str().unwrap()),
        None,
    )
    .await;
    let res = Client::new()
        .post(app.url("/api/v1/tasks"))
        .bearer_auth(k)
        .json(&spec("x", "A100", 1))
        .send()
        .await
        .unwrap();
    assert_error(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
}

/// What `GET /tasks/{id}/spec` hands out, `POST /tasks` takes: the new task asks for what
/// the first one did.
async fn a_task_is_submitted_again_from_its_handed_out_spec(b: Backend) {
    let app = spawn_app(b).await;
    let s = app.signup("again@example.com", "Lab").await;
    let first = submit(
        &app,
        &s,
        json!({"name": "again", "image": "pytorch:2", "entry_point": "train.py --lr 3e-4",
               "num_workers": {"min": 2, "max": 4}, "batch_size": 64, "global_batch": true,
               "resources": {"gpu": {"type": "A100", "count": 1, "memory": "20GiB"},
                             "memory": "16GiB"},
               "time_limit": "2h", "checkpoint": {"interval": "10m", "keep": 2},
               "labels": {"team": "vision"}, "env": {"LR": "3e-4"}}),
    )
    .await;
    let id = first["id"].as_str().unwrap();
    let handed = s.get(&app, &format!("/api/v1/tasks/{id}/spec")).await;
    let again = submit(&app, &s, handed).await;
    assert_ne!(again["id"], first["id"]);
    assert_eq!(again["spec"], first["spec"]);
}

/// Each organization numbers its tasks from 1 (`#N`); a number, a unique name or a prefix of
/// an id reaches a task wherever its id does, within the caller's organization only, and one
/// that several tasks answer to is refused naming them.
async fn tasks_are_reached_by_number_name_or_id_prefix(b: Backend) {
    let app = spawn_app(b).await;
    let s = app.signup("numbers@example.com", "Numbers").await;
    let other = app.signup("other@example.com", "Elsewhere").await;
    let a = submit(&app, &s, spec("prep", "A100", 1)).await;
    let b2 = submit(&app, &s, spec("train", "A100", 1)).await;
    let twin = submit(&app, &s, spec("train", "A100", 1)).await;
    let theirs = submit(&app, &other, spec("prep", "A100", 1)).await;
    assert_eq!(
        (a["number"].as_u64(), b2["number"].as_u64()),
        (Some(1), Some(2))
    );
    assert_eq!(twin["number"], 3);
    assert_eq!(theirs["number"], 1, "each organization counts from 1");
    let a_id = a["id"].as_str().unwrap();
    assert_eq!(
        s.get(&app, &format!("/api/v1/tasks/{a_id}")).await["number"],
        1
    );
    for what in [
        "1",
        "%231",
        "prep",
        &a_id[..13],
        &a_id[..20],
        &a_id.to_uppercase(),
    ] {
        let t = s.get(&app, &format!("/api/v1/tasks/{what}")).await;
        assert_eq!(t["id"], a["id"], "{what}");
        let events = s.get(&app, &format!("/api/v1/tasks/{what}/events")).await;
        assert!(!events.as_array().unwrap().is_empty(), "{what}");
    }
    // Another organization's number 1 and name are theirs.
    let t = other.get(&app, "/api/v1/tasks/1").await;
    assert_eq!(t["id"], theirs["id"]);
    let res = other
        .send(
            &app,
            Method::GET,
            &format!("/api/v1/tasks/{}", &a_id[..13]),
            None,
        )
        .await;
    assert_error(res, StatusCode::NOT_FOUND, "not_found").await;
    let res = s.send(&app, Method::GET, "/api/v1/tasks/%2399", None).await;
    let body = assert_error(res, StatusCode::NOT_FOUND, "not_found").await;
    assert!(
        body["error"]["message"].as_str().unwrap().contains("#99"),
        "{body}"
    );
    // Two tasks called "train": refused, naming both by number.
    let res = s.send(&app, Method::GET, "/api/v1/tasks/train", None).await;
    let body = assert_error(res, StatusCode::CONFLICT, "conflict").await;
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("#2 train") && message.contains("#3 train"),
        "{message}"
    );
    // Cancelling and waiting on a task take the same names.
    let res = s
        .send(&app, Method::POST, "/api/v1/tasks/%233/cancel", None)
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let after = submit(
        &app,
        &s,
        json!({"name": "eval", "image": "pytorch:2", "command": ["true"], "after": ["#2", "prep"],
               "resources": {"gpu": {"type": "A100", "count": 1}}}),
    )
    .await;
    assert_eq!(after["spec"]["after"], json!([b2["id"], a["id"]]));
    assert_eq!(after["number"], 4);
    let res = s
        .send(
            &app,
            Method::POST,
            "/api/v1/tasks",
            Some(
                json!({"name": "x", "image": "i", "command": ["true"], "after": ["#77"],
                        "resources": {"gpu": {"type": "A100", "count": 1}}}),
            ),
        )
        .await;
    let body = assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
    assert!(
        body["error"]["message"].as_str().unwrap().contains("#77"),
        "{body}"
    );
}

async fn cancel_frees_the_gpus(b: Backend) {
    let app = spawn_app(b).await;
    app.operator_with_nodes().await;
    let s = app.signup("c@example.com", "Lab").await;
    let big = submit(&app, &s, spec("big", "A40", 4)).await;
    let id = big["id"].as_str().unwrap().to_owned();
    wait_state(&app, &s, &id, "scheduled").await;
    let next = submit(&app, &s, spec("next", "A40", 4)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        s.get(
            &app,
            &format!("/api/v1/tasks/{}", next["id"].as_str().unwrap())
        )
        .await["state"],
        "pending"
    );
    let res = s
        .send(
            &app,
            Method::POST,
            &format!("/api/v1/tasks/{id}/cancel"),
            None,
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let t: Value = res.json().await.unwrap();
    assert_eq!(t["state"], "cancelled");
    assert!(t["placement"].is_null());
    wait_state(&app, &s, next["id"].as_str().unwrap(), "scheduled").await;
    let res = s
        .send(
            &app,
            Method::POST,
            &format!("/api/v1/tasks/{id}/cancel"),
            None,
        )
        .await;
    assert_error(res, StatusCode::CONFLICT, "conflict").await;
    let attempts = s.get(&app, &format!("/api/v1/tasks/{id}/attempts")).await;
    assert_eq!(attempts[0]["reason"], "cancelled");
    let res = s
        .send(
            &app,
            Method::POST,
            "/api/v1/tasks/no-such-task/cancel",
            None,
        )
        .await;
    assert_error(res, StatusCode::NOT_FOUND, "not_found").await;
}

/// Drives attempts through the store the way the agent dispatch does.
async fn end_attempt(app: &TestApp, id: &str, exit: ExitKind, code: i64) {
    let store = &app.state.store;
    let t = store.task(None, id).await.unwrap().unwrap().task;
    assert!(store.mark_running(id, t.attempts, 1).await.unwrap());
    let spec = &t.spec;
    let earlier_failures = store
        .task_attempts(id)
        .await
        .unwrap()
        .iter()
        .filter(|a| matches!(a.reason.as_deref(), Some("error" | "oom")))
        .count() as u32;
    let end = after_attempt(
        spec,
        t.attempts as u32,
        earlier_failures,
        t.batch_size.map(|b| b as u32),
        Some(code),
        exit,
        None,
    );
    assert!(store
        .finish_attempt(
            id,
            t.attempts,
            &end,
            autodl_server::clock::Clock::now_ms(&autodl_server::clock::SystemClock)
        )
        .await
        .unwrap());
    // The same report twice changes nothing.
    assert!(!store
        .finish_attempt(
            id,
            t.attempts,
            &end,
            autodl_server::clock::Clock::now_ms(&autodl_server::clock::SystemClock)
        )
        .await
        .unwrap());
    app.state.scheduler.wake();
}

async fn lifecycle_retries_and_oom_recovery(b: Backend) {
    let app = spawn_app(b).await;
    app.operator_with_nodes().await;
    let s = app.signup("r@example.com", "Lab").await;
    let mut body = spec("retry", "A100", 1);
    body["batch_size"] = json!(64);
    body["retry_policy"] = json!({"max_retries": 2, "oom_recovery": true});
    let t = submit(&app, &s, body).await;
    let id = t["id"].as_str().unwrap().to_owned();
    wait_state(&app, &s, &id, "scheduled").await;
    end_attempt(&app, &id, ExitKind::Oom, 137).await;
    let t = wait_state(&app, &s, &id, "scheduled").await;
    assert_eq!(t["batch_size"], 32, "OOM recovery halved the batch");
    assert_eq!(t["attempts"], 2);
    end_attempt(&app, &id, ExitKind::Error, 1).await;
    wait_state(&app, &s, &id, "scheduled").await;
    end_attempt(&app, &id, ExitKind::Success, 0).await;
    let t = s.get(&app, &format!("/api/v1/tasks/{id}")).await;
    assert_eq!(t["state"], "completed");
    let attempts = s.get(&app, &format!("/api/v1/tasks/{id}/attempts")).await;
    let reasons: Vec<Value> = attempts
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["reason"].clone())
        .collect();
    assert_eq!(reasons, [json!("oom"), json!("error"), Value::Null]);
    assert_eq!(attempts[0]["batch_size"], 64);
    assert_eq!(attempts[1]["batch_size"], 32);
    assert_eq!(attempts[0]["exit_code"], 137);
    let kinds: Vec<String> = s
        .get(&app, &format!("/api/v1/tasks/{id}/events"))
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        kinds,
        [
            "submitted",
            "scheduled",
            "running",
            "retrying",
            "scheduled",
            "running",
            "retrying",
            "scheduled",
            "running",
            "completed"
        ]
    );

    // Out of retries: failed.
    let mut body = spec("fails", "A100", 1);
    body["retry_policy"] = json!({"max_retries": 0});
    let f = submit(&app, &s, body).await;
    let fid = f["id"].as_str().unwrap().to_owned();
    wait_state(&app, &s, &fid, "scheduled").await;
    end_attempt(&app, &fid, ExitKind::Error, 2).await;
    assert_eq!(
        s.get(&app, &format!("/api/v1/tasks/{fid}")).await["state"],
        "failed"
    );
    assert_eq!(
        s.get(&app, "/api/v1/tasks?state=failed").await["items"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

async fn logs_and_metrics(b: Backend) {
    let app = spawn_app(b).await;
    app.operator_with_nodes().await;
    let s = app.signup("log@example.com", "Lab").await;
    let t = submit(&app, &s, spec("logs", "A100", 1)).await;
    let id = t["id"].as_str().unwrap().to_owned();
    wait_state(&app, &s, &id, "scheduled").await;
    let line = |at: i64, stream: &str, text: String| autodl_server::store::NewLogLine {
        at,
        stream: stream.to_owned(),
        line: text,
        rank: None,
    };
    let lines: Vec<_> = (0..5)
        .map(|i| line(i, "stdout", format!("step {i}")))
        .collect();
    app.state.store.append_logs(&id, 1, &lines).await.unwrap();
    let page = s.get(&app, &format!("/api/v1/tasks/{id}/logs")).await;
    assert_eq!(page["lines"].as_array().unwrap().len(), 5);
    assert_eq!(page["lines"][4]["line"], "step 4");
    let after = page["lines"][2]["seq"].as_i64().unwrap();
    let rest = s
        .get(&app, &format!("/api/v1/tasks/{id}/logs?after={after}"))
        .await;
    assert_eq!(rest["lines"].as_array().unwrap().len(), 2);
    assert_eq!(rest["next_after"], page["lines"][4]["seq"]);
    assert_eq!(page["lines"][0]["attempt"], 1);
    // A second run's lines say so; the download holds both runs, each line with its time,
    // attempt and stream.
    let second = vec![line(9, "stderr", "retrying".into())];
    app.state.store.append_logs(&id, 2, &second).await.unwrap();
    let res = s
        .send(
            &app,
            Method::GET,
            &format!("/api/v1/tasks/{id}/logs/download"),
            None,
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let disposition = res.headers()["content-disposition"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        disposition,
        format!("attachment; filename=\"{id}-log.txt\"")
    );
    let text = res.text().await.unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 6, "{text}");
    assert!(lines[0].ends_with(" attempt 1 stdout: step 0"), "{text}");
    assert!(lines[5].ends_with(" attempt 2 stderr: retrying"), "{text}");
    let other = app.signup("nosy@example.com", "Elsewhere").await;
    let res = other
        .send(
            &app,
            Method::GET,
            &format!("/api/v1/tasks/{id}/logs/download"),
            None,
        )
        .await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);

    // The training code reports its numbers; the monitor reads them back.
    for (epoch, loss) in [(1, 0.9), (2, 0.5)] {
        let res = s
            .send(
                &app,
                Method::POST,
                &format!("/api/v1/tasks/{id}/metrics"),
                Some(json!({"epoch": epoch, "loss": loss, "accuracy": 0.7})),
            )
            .await;
        assert_eq!(res.status(), StatusCode::NO_CONTENT);
    }
    for bad in [
        json!({}),
        json!({"epoch": "three"}),
        json!({"gpu_util": 1.0}),
        json!({"bad name": 1}),
    ] {
        let res = s
            .send(
                &app,
                Method::POST,
                &format!("/api/v1/tasks/{id}/metrics"),
                Some(bad),
            )
            .await;
        assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
    }
    let m = s.get(&app, &format!("/api/v1/tasks/{id}/metrics")).await;
    let samples = m["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 2);
    assert_eq!(samples[1]["epoch"], 2.0);
    assert_eq!(samples[1]["loss"], 0.5);
    assert_eq!(samples[1]["values"]["accuracy"], 0.7);

    // The live stream sends the stored lines, then ends once the task is done.
    end_attempt(&app, &id, ExitKind::Success, 0).await;
    let body = s
        .send(
            &app,
            Method::GET,
            &format!("/api/v1/tasks/{id}/logs/stream"),
            None,
        )
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(body.matches("data: {\"seq\"").count(), 6, "{body}");
    assert!(body.ends_with("event: end\ndata: {}\n\n"));
    let res = s
        .send(
            &app,
            Method::GET,
            &format!("/api/v1/tasks/{id}/results"),
            None,
        )
        .await;
    assert_error(res, StatusCode::NOT_FOUND, "no_results").await;
}

async fn nodes_are_admin_managed(b: Backend) {
    let app = spawn_app(b).await;
    let op = app.operator_with_nodes().await;
    let s = app.signup("n@example.com", "Lab").await;
    let nodes = s.get(&app, "/api/v1/nodes").await;
    assert_eq!(nodes.as_array().unwrap().len(), 2);
    assert_eq!(nodes[0]["gpus"][0]["type"], "A100-40G");
    assert_eq!(nodes[0]["gpus"][0]["memory"], 40u64 << 30);
    let node = json!({"id": "x", "cpu": 8, "memory": "64GiB", "gpus": {"type": "T4", "count": 1, "memory": "16GiB"}});
    let res = s
        .send(&app, Method::POST, "/api/v1/admin/nodes", Some(node))
        .await;
    assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
    for bad in [
        json!({"id": "bad id!", "cpu": 8, "memory": "64GiB", "gpus": []}),
        json!({"id": "x", "cpu": 0, "memory": "64GiB", "gpus": []}),
        json!({"id": "x", "cpu": 8, "memory": "much", "gpus": []}),
        json!({"id": "x", "cpu": 8, "memory": "64GiB", "gpus": [{"type": "", "memory": "1GiB"}]}),
    ] {
        let res = op
            .send(&app, Method::POST, "/api/v1/admin/nodes", Some(bad))
            .await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    }
    let res = op
        .send(&app, Method::DELETE, "/api/v1/admin/nodes/node-b", None)
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        s.get(&app, "/api/v1/nodes").await.as_array().unwrap().len(),
        1
    );
    let res = op
        .send(&app, Method::DELETE, "/api/v1/admin/nodes/node-b", None)
        .await;
    assert_error(res, StatusCode::NOT_FOUND, "not_found").await;
}

/// Waiting for GPUs that only a cordoned node has never ends by itself: the task says which
/// node and why, and starts once the node is opened again.
async fn a_task_that_only_closed_nodes_could_hold_says_so(b: Backend) {
    let app = spawn_app(b).await;
    let op = app.operator_with_nodes().await;
    let res = op
        .send(
            &app,
            Method::POST,
            "/api/v1/admin/nodes/node-b/cordon",
            None,
        )
        .await;
    assert!(res.status().is_success(), "{}", res.status());
    let s = app.signup("closed@example.com", "Lab").await;
    let t = submit(&app, &s, spec("clip", "A40", 1)).await;
    let id = t["id"].as_str().unwrap().to_owned();
    let mut message = String::new();
    for _ in 0..100 {
        let t = s.get(&app, &format!("/api/v1/tasks/{id}")).await;
        message = t["waiting"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if message.contains("cordoned") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        message.contains("node-b is cordoned or draining"),
        "{message}"
    );
    // Waiting for an open node that is busy: the node will free up, nothing closed is named.
    let full = submit(&app, &s, spec("full", "A100", 4)).await;
    wait_state(&app, &s, full["id"].as_str().unwrap(), "scheduled").await;
    let next = submit(&app, &s, spec("next", "A100", 1)).await;
    let next_id = next["id"].as_str().unwrap().to_owned();
    // Until the scheduler's first cycle has explained it.
    let mut next = Value::Null;
    for _ in 0..100 {
        next = s.get(&app, &format!("/api/v1/tasks/{next_id}")).await;
        if next["waiting"]["reason"].is_string() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let said = next["waiting"]["message"].as_str().unwrap();
    assert!(!said.is_empty() && !said.contains("cordoned"), "{said}");
    let res = op
        .send(
            &app,
            Method::POST,
            "/api/v1/admin/nodes/node-b/uncordon",
            None,
        )
        .await;
    assert!(res.status().is_success());
    let t = wait_state(&app, &s, &id, "scheduled").await;
    assert_eq!(t["placement"][0]["node"], "node-b");
}
