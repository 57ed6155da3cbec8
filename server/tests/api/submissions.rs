//! Submissions under load: concurrent requests are stored many to a transaction (group commit)
//! and each is answered only after its commit, so a crash loses nothing acknowledged; what is
//! kept of callers' keys, roles and quotas never outlives a change to them.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use autodl_common::tasks::TaskState;
use autodl_server::store::{NewTask, TaskCreated, TaskRecord};
use reqwest::{Client, Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{
    assert_error, spawn_app, spawn_app_with, Backend, ServerProcess, Session, TestApp,
};

crate::on_both_backends!(
    a_burst_is_stored_once_each,
    a_repeated_key_in_one_batch_makes_one_task,
    a_server_killed_mid_burst_keeps_every_acknowledged_task,
    account_changes_apply_to_the_next_request,
    caps_hold_under_concurrent_submissions,
);

async fn api_key(app: &TestApp, s: &Session) -> String {
    let res = s
        .send(
            app,
            Method::POST,
            "/api/v1/api-keys",
            Some(json!({"name": "load"})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    res.json::<Value>().await.unwrap()["key"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn task(name: &str) -> Value {
    json!({"name": name, "image": "pytorch:2", "command": "python train.py",
           "labels": {"run": name},
           "resources": {"gpu": {"type": "A100", "count": 1}}})
}

async fn a_burst_is_stored_once_each(b: Backend) {
    let app = spawn_app(b).await;
    let s = app.signup("burst@example.com", "Lab").await;
    let key = api_key(&app, &s).await;
    // 120 different tasks, and 20 idempotency keys each sent twice, all at once.
    let http = Client::new();
    let calls = (0..160).map(|i| {
        let (http, url, key) = (http.clone(), app.url("/api/v1/tasks"), key.clone());
        tokio::spawn(async move {
            let (name, idem) = if i < 120 {
                (format!("t{i}"), None)
            } else {
                let k = (i - 120) / 2;
                (format!("k{k}"), Some(format!("retry-{k}")))
            };
            let mut req = http.post(url).bearer_auth(key).json(&task(&name));
            if let Some(idem) = idem {
                req = req.header("Idempotency-Key", idem);
            }
            let res = req.send().await.unwrap();
            let status = res.status();
            let body: Value = res.json().await.unwrap();
            (
                name,
                status,
                body["id"].as_str().unwrap_or_default().to_owned(),
            )
        })
    });
    let mut answers = Vec::new();
    for c in calls.collect::<Vec<_>>() {
        answers.push(c.await.unwrap());
    }
    let created: Vec<&(String, StatusCode, String)> = answers
        .iter()
        .filter(|a| a.1 == StatusCode::CREATED)
        .collect();
    assert_eq!(created.len(), 140, "{answers:?}");
    for (name, status, id) in &answers {
        assert!(!id.is_empty(), "{name}: {status}");
        if name.starts_with('k') {
            // Both requests with one key name the same task, one of them created it.
            let same: Vec<_> = answers.iter().filter(|a| &a.0 == name).collect();
            assert_eq!(same.len(), 2);
            assert_eq!(same[0].2, same[1].2, "{same:?}");
            assert_eq!(
                same.iter().filter(|a| a.1 == StatusCode::OK).count(),
                1,
                "{same:?}"
            );
        }
    }
    // Each stored task is whole: its row, its label, its first event.
    let active = app.state.store.active_tasks().await.unwrap();
    assert_eq!(active.len(), 140);
    for (name, _, id) in created {
        let t = s.get(&app, &format!("/api/v1/tasks/{id}")).await;
        assert_eq!(t["name"], name.as_str());
        assert_eq!(t["spec"]["labels"]["run"], name.as_str(), "{t}");
        let events = s.get(&app, &format!("/api/v1/tasks/{id}/events")).await;
        assert_eq!(events[0]["kind"], "submitted", "{events}");
        assert_eq!(events.as_array().unwrap().len(), 1, "{events}");
    }
    let labelled = s.get(&app, "/api/v1/tasks?label=run%3Dt7").await;
    assert_eq!(labelled["items"].as_array().unwrap().len(), 1, "{labelled}");
}

/// The store's side of group commit, where two requests of one batch repeat a key: exactly one
/// task is stored and both are answered with it.
async fn a_repeated_key_in_one_batch_makes_one_task(b: Backend) {
    let app = spawn_app(b).await;
    let s = app.signup("batch@example.com", "Lab").await;
    let spec = autodl_server::tasks::spec::normalise(
        autodl_common::tasks::TaskSpecInput {
            name: "x".into(),
            image: "busybox".into(),
            command: Some(autodl_common::tasks::Command::Shell("true".into())),
            ..Default::default()
        },
        0,
    )
    .unwrap();
    let record = |id: &str, key: Option<&str>| TaskRecord {
        id: id.to_owned(),
        number: 0,
        tenant_id: s.user["tenant_id"].as_str().unwrap().to_owned(),
        user_id: s.id(),
        name: id.to_owned(),
        state: TaskState::Pending,
        spec: autodl_server::store::JsonText(spec.clone()),
        gpus_total: 1,
        idempotency_key: key.map(str::to_owned),
        attempts: 0,
        batch_size: None,
        placement: autodl_server::store::JsonText(None),
        attained_gpu_seconds: 0.0,
        last_checkpoint_at: None,
        created_at: 1,
        updated_at: 1,
        started_at: None,
        finished_at: None,
        stop_reason: None,
        waiting: None,
        results: None,
    };
    let batch: Vec<NewTask> = [("a", Some("same")), ("b", None), ("c", Some("same"))]
        .into_iter()
        .map(|(id, key)| NewTask {
            task: record(id, key),
            labels: vec![("who".into(), id.into())],
            kind: Default::default(),
            caps: Default::default(),
        })
        .collect();
    let out = app.state.store.create_tasks(&batch).await.unwrap();
    // Numbered in the batch's order; the repeat's number stays unused.
    assert!(matches!(out[0], Ok(TaskCreated::Created(1))));
    assert!(matches!(out[1], Ok(TaskCreated::Created(2))));
    match &out[2] {
        Ok(TaskCreated::Existing(t)) => assert_eq!(t.task.id, "a"),
        _ => panic!("the repeated key should name task a"),
    }
    let stored = app.state.store.active_tasks().await.unwrap();
    let ids: Vec<&str> = stored.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["a", "b"]);
    // The task not stored left no label and no event behind.
    assert!(app.state.store.task_events("c").await.unwrap().is_empty());
    assert_eq!(app.state.store.task_events("a").await.unwrap().len(), 1);
}

async fn a_server_killed_mid_burst_keeps_every_acknowledged_task(b: Backend) {
    // This server only reads the database afterwards; a real process takes the burst.
    let app = spawn_app_with(b, |s| s.run_scheduler = false).await;
    let s = app.signup("crash@example.com", "Lab").await;
    let key = api_key(&app, &s).await;
    let mut server = ServerProcess::start(&app);
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.role().await.is_none() {
        assert!(
            Instant::now() < deadline,
            "the server process did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let acknowledged = Arc::new(Mutex::new(Vec::<String>::new()));
    let clients: Vec<_> = (0..32)
        .map(|c| {
            let (url, key, acknowledged) = (
                format!("{}/api/v1/tasks", server.address),
                key.clone(),
                acknowledged.clone(),
            );
            tokio::spawn(async move {
                let http = Client::new();
                for i in 0.. {
                    let Ok(res) = http
                        .post(&url)
                        .bearer_auth(&key)
                        .json(&task(&format!("c{c}-{i}")))
                        .send()
                        .await
                    else {
                        return;
                    };
                    if res.status() != StatusCode::CREATED {
                        return;
                    }
                    let Ok(body) = res.json::<Value>().await else {
                        return;
                    };
                    let id = body["id"].as_str().unwrap().to_owned();
                    acknowledged.lock().unwrap().push(id);
                }
            })
        })
        .collect();
    // Killed mid-burst: once the burst is well under way (a busy machine is slow to start
    // it), not after a fixed time.
    let deadline = Instant::now() + Duration::from_secs(30);
    while acknowledged.lock().unwrap().len() < 100 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.kill();
    for c in clients {
        c.await.unwrap();
    }
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert!(
        acknowledged.len() > 50,
        "only {} submitted",
        acknowledged.len()
    );
    let stored: std::collections::HashSet<String> = app
        .state
        .store
        .active_tasks()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.id)
        .collect();
    let lost: Vec<&String> = acknowledged
        .iter()
        .filter(|id| !stored.contains(*id))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged tasks were lost: {lost:?}",
        lost.len(),
        acknowledged.len()
    );
}

async fn account_changes_apply_to_the_next_request(b: Backend) {
    let app = spawn_app(b).await;
    let owner = app.signup("owner@example.com", "Lab").await;
    let member = app.invite_and_join(&owner, "m@example.com", "member").await;
    let key = api_key(&app, &member).await;
    let spare = api_key(&app, &member).await;
    let http = Client::new();
    let submit = |name: &str| {
        http.post(app.url("/api/v1/tasks"))
            .bearer_auth(&key)
            .json(&task(name))
            .send()
    };
    let me = |key: &str| http.get(app.url("/api/v1/me")).bearer_auth(key).send();
    // Every request below comes right after one that put the caller in the cache.
    assert_eq!(submit("first").await.unwrap().status(), StatusCode::CREATED);
    assert_eq!(me(&spare).await.unwrap().status(), StatusCode::OK);

    // A quota that no longer allows the type.
    let res = owner
        .send(
            &app,
            Method::PUT,
            &format!("/api/v1/tenant/members/{}/quota", member.id()),
            Some(json!({"allowed_gpu_types": ["A40"]})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let res = submit("refused").await.unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);

    // A role granted is a role held.
    let invitations = || {
        http.get(app.url("/api/v1/tenant/invitations"))
            .bearer_auth(&key)
            .send()
    };
    assert_eq!(invitations().await.unwrap().status(), StatusCode::FORBIDDEN);
    let res = owner
        .send(
            &app,
            Method::PATCH,
            &format!("/api/v1/tenant/members/{}", member.id()),
            Some(json!({"role": "admin"})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(invitations().await.unwrap().status(), StatusCode::OK);

    // A revoked key.
    let listed = member.get(&app, "/api/v1/api-keys").await;
    let spare_id = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|k| spare.starts_with(k["prefix"].as_str().unwrap()))
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let res = member
        .send(
            &app,
            Method::DELETE,
            &format!("/api/v1/api-keys/{spare_id}"),
            None,
        )
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_error(
        me(&spare).await.unwrap(),
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    )
    .await;

    // A removed member.
    assert_eq!(me(&key).await.unwrap().status(), StatusCode::OK);
    let res = owner
        .send(
            &app,
            Method::DELETE,
            &format!("/api/v1/tenant/members/{}", member.id()),
            None,
        )
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_error(
        me(&key).await.unwrap(),
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    )
    .await;
}

/// Caps counted as tasks are stored, not only before: 40 submissions at once under a cap of 5
/// queued tasks store 5 (7 were stored when each was counted only ahead of the write), and 10
/// sessions at once under one session per member store 1.
async fn caps_hold_under_concurrent_submissions(b: Backend) {
    let app = spawn_app(b).await;
    let op = app.operator().await;
    let owner = app.signup("q@example.com", "Lab").await;
    let tenant = owner.user["tenant_id"].as_str().unwrap().to_owned();
    let res = op
        .send(
            &app,
            Method::PUT,
            &format!("/api/v1/admin/tenants/{tenant}/quota"),
            Some(json!({"max_queued_tasks": 5})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let key = api_key(&app, &owner).await;
    let http = Client::new();
    let burst = |body: Value, n: usize| {
        let (http, app, key) = (&http, &app, &key);
        futures_util::future::join_all((0..n).map(move |i| {
            let mut body = body.clone();
            body["name"] = json!(format!("t{i}"));
            async move {
                http.post(app.url("/api/v1/tasks"))
                    .bearer_auth(key)
                    .json(&body)
                    .send()
                    .await
                    .unwrap()
                    .status()
            }
        }))
    };
    let answers = burst(json!({"image": "i", "command": "true"}), 40).await;
    let created = answers
        .iter()
        .filter(|s| **s == StatusCode::CREATED)
        .count();
    assert_eq!(created, 5, "{answers:?}");
    assert!(answers
        .iter()
        .all(|s| *s == StatusCode::CREATED || *s == StatusCode::FORBIDDEN));
    let listed = owner.get(&app, "/api/v1/tasks?state=pending").await;
    assert_eq!(listed["total"], 5, "{listed}");

    // One session per member, ten asked for at once.
    let res = op
        .send(
            &app,
            Method::PUT,
            &format!("/api/v1/admin/tenants/{tenant}/quota"),
            Some(json!({"max_queued_tasks": null})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let res = owner
        .send(
            &app,
            Method::PUT,
            "/api/v1/tenant/session-policy",
            Some(json!({"max_sessions_per_user": 1})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let answers = burst(
        json!({"image": "jupyter", "kind": "session", "resources": {"gpu": {"count": 1}}}),
        10,
    )
    .await;
    let created = answers
        .iter()
        .filter(|s| **s == StatusCode::CREATED)
        .count();
    assert_eq!(created, 1, "{answers:?}");
}
