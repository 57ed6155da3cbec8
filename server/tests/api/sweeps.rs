//! Sweeps: one request makes every trial (or none), one cancels them all; trials wait for a
//! free slot of their sweep; the table shows each trial's parameters and newest metrics.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::e2e::{log_text, start_agent};
use crate::helpers::{assert_error, spawn_app, spawn_app_with, Backend, Session, TestApp};

crate::on_both_backends!(
    a_220_trial_sweep_is_one_request_to_submit_and_one_to_cancel,
    trials_run_at_most_max_concurrency_at_once_and_report_metrics,
    bad_sweeps_are_refused_whole_and_stay_in_their_organization,
    asha_stops_the_trials_behind_at_each_rung
);

fn template(command: &str) -> Value {
    json!({"name": "t", "image": "i", "command": command, "resources": {"gpu": {"count": 1}}})
}

async fn post_sweep(app: &TestApp, s: &Session, body: Value) -> reqwest::Response {
    s.send(app, Method::POST, "/api/v1/sweeps", Some(body))
        .await
}

async fn a_220_trial_sweep_is_one_request_to_submit_and_one_to_cancel(b: Backend) {
    let app = spawn_app(b).await;
    let _op = app.operator_with_nodes().await;
    let s = app.signup("ada@example.com", "Lab").await;
    let lrs: Vec<f64> = (0..22)
        .map(|i| 10f64.powi(-(i % 6)) * (1 + i) as f64)
        .collect();
    let res = post_sweep(
        &app,
        &s,
        json!({
            "name": "big",
            "template": template("python train.py --lr ${lr} --seed ${seed}"),
            "parameters": {"lr": lrs, "seed": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]},
            "max_concurrency": 8
        }),
    )
    .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let sweep: Value = res.json().await.unwrap();
    let id = sweep["id"].as_str().unwrap().to_owned();
    assert_eq!(sweep["trials"], 220);
    assert_eq!(sweep["parameters"], json!(["lr", "seed"]));
    let items = sweep["items"].as_array().unwrap();
    assert_eq!(items.len(), 220);
    assert_eq!(items[1]["params"]["lr"].as_f64(), Some(lrs[0]));
    assert_eq!(items[1]["params"]["seed"], 1);
    // Each trial is an ordinary task with the values in its command and the sweep's label.
    let t = s
        .get(
            &app,
            &format!("/api/v1/tasks/{}", items[1]["task_id"].as_str().unwrap()),
        )
        .await;
    assert_eq!(
        t["spec"]["command"],
        json!([
            "/bin/sh",
            "-c",
            format!("python train.py --lr {} --seed 1", lrs[0])
        ])
    );
    assert_eq!(t["spec"]["labels"]["sweep"], json!(id));
    assert_eq!(t["name"], "big-1");
    let page = s
        .get(&app, &format!("/api/v1/tasks?label=sweep={id}&limit=1"))
        .await;
    assert_eq!(page["total"], 220);
    let listed = s.get(&app, "/api/v1/sweeps").await;
    assert_eq!(listed[0]["id"], json!(id));
    assert_eq!(listed[0]["items"], json!([]));
    let counted: u64 = listed[0]["states"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(counted, 220);

    let res = s
        .send(
            &app,
            Method::POST,
            &format!("/api/v1/sweeps/{id}/cancel"),
            None,
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let done: Value = res.json().await.unwrap();
    assert_eq!(done["cancelled"], 220);
    let after = s.get(&app, &format!("/api/v1/sweeps/{id}")).await;
    assert_eq!(after["states"], json!({"cancelled": 220}));
    // Again: nothing left to cancel.
    let again: Value = s
        .send(
            &app,
            Method::POST,
            &format!("/api/v1/sweeps/{id}/cancel"),
            None,
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(again["cancelled"], 0);
}

async fn trials_run_at_most_max_concurrency_at_once_and_report_metrics(b: Backend) {
    let app = spawn_app_with(b, |_| {}).await;
    let op = app.operator().await;
    let agent = start_agent(&app, &op, "sim-a100", "4xA100-40G").await;
    let s = app.signup("ada@example.com", "Lab").await;
    let res = post_sweep(&app, &s, json!({
        "name": "small",
        "template": {"name": "lr-${lr}", "image": "none", "command": "echo trying $LR; sleep 1.5",
                      "env": {"LR": "${lr}"}, "resources": {"gpu": {"count": 1}}},
        "parameters": {"lr": [0.1, 0.01, 0.001, 0.0001, 0.00001]},
        "max_concurrency": 2
    }))
    .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let sweep: Value = res.json().await.unwrap();
    let id = sweep["id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut saw_sweep_wait = false;
    loop {
        let now = s.get(&app, &format!("/api/v1/sweeps/{id}")).await;
        let states = &now["states"];
        let placed =
            states["running"].as_u64().unwrap_or(0) + states["scheduled"].as_u64().unwrap_or(0);
        assert!(
            placed <= 2,
            "more than max_concurrency trials placed: {states}"
        );
        for item in now["items"].as_array().unwrap() {
            if item["state"] == "pending" {
                let t = s
                    .get(
                        &app,
                        &format!("/api/v1/tasks/{}", item["task_id"].as_str().unwrap()),
                    )
                    .await;
                saw_sweep_wait |= t["waiting"]["reason"] == "sweep";
            }
        }
        if states["completed"] == 5 {
            break;
        }
        assert!(Instant::now() < deadline, "the sweep never finished: {now}");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(
        saw_sweep_wait,
        "a waiting trial said it waits for its sweep"
    );
    let done = s.get(&app, &format!("/api/v1/sweeps/{id}")).await;
    let first = &done["items"][0];
    let task = first["task_id"].as_str().unwrap();
    assert!(log_text(&app, &s, task).await.contains("trying 0.1"));
    assert_eq!(
        s.get(&app, &format!("/api/v1/tasks/{task}")).await["name"],
        "lr-0.1"
    );
    // The newest value of each metric reported becomes the trial's row.
    for body in [
        json!({"loss": 0.9, "epoch": 1}),
        json!({"loss": 0.25, "epoch": 2}),
        json!({"accuracy": 0.91}),
    ] {
        let res = s
            .send(
                &app,
                Method::POST,
                &format!("/api/v1/tasks/{task}/metrics"),
                Some(body),
            )
            .await;
        assert!(res.status().is_success());
    }
    let row = &s.get(&app, &format!("/api/v1/sweeps/{id}")).await["items"][0];
    assert_eq!(
        row["metrics"],
        json!({"accuracy": 0.91, "epoch": 2, "loss": 0.25}),
        "{row}"
    );
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}

async fn bad_sweeps_are_refused_whole_and_stay_in_their_organization(b: Backend) {
    let app = spawn_app(b).await;
    let op = app.operator_with_nodes().await;
    let s = app.signup("ada@example.com", "Lab").await;
    let other = app.signup("eve@example.com", "Other").await;
    let refused = |body: Value, field: &'static str| {
        let (app, s) = (&app, &s);
        async move {
            let e = assert_error(
                post_sweep(app, s, body).await,
                StatusCode::BAD_REQUEST,
                "validation",
            )
            .await;
            assert_eq!(e["error"]["field"], field, "{e}");
            e
        }
    };
    let e = refused(
        json!({"name": "x", "template": template("train"), "parameters": {"lr": [1, 2]}}),
        "parameters",
    )
    .await;
    assert!(
        e["error"]["message"].as_str().unwrap().contains("${lr}"),
        "{e}"
    );
    refused(json!({"name": "x", "template": template("t ${lr}"), "parameters": {"lr": {"min": 0.1, "max": 1}}}), "parameters").await;
    refused(json!({"name": "x", "template": template("t ${lr}"), "parameters": {"lr": {"min": 0.1, "max": 1}}, "method": "random"}), "samples").await;
    refused(json!({"name": "x", "template": template("t ${lr}"), "parameters": {"lr": [1]}, "max_concurrency": 0}), "max_concurrency").await;
    refused(
        json!({"name": "", "template": template("t ${lr}"), "parameters": {"lr": [1]}}),
        "name",
    )
    .await;
    let e = refused(json!({"name": "x", "template": {"name": "t", "command": "t ${lr}"}, "parameters": {"lr": [1]}}), "template.image").await;
    assert!(
        e["error"]["message"].as_str().unwrap().contains("image"),
        "{e}"
    );
    // Over the queue cap: refused as a whole, nothing stored.
    let tenant = s.user["tenant_id"].as_str().unwrap();
    let res = op
        .send(
            &app,
            Method::PUT,
            &format!("/api/v1/admin/tenants/{tenant}/quota"),
            Some(json!({"max_queued_tasks": 10})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let e = assert_error(
        post_sweep(&app, &s, json!({"name": "x", "template": template("t ${i}"), "parameters": {"i": (0..20).collect::<Vec<_>>()}})).await,
        StatusCode::FORBIDDEN,
        "quota",
    )
    .await;
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("this adds 20"),
        "{e}"
    );
    assert_eq!(s.get(&app, "/api/v1/sweeps").await, json!([]));
    assert_eq!(s.get(&app, "/api/v1/tasks?limit=1").await["total"], 0);
    let res = op
        .send(
            &app,
            Method::PUT,
            &format!("/api/v1/admin/tenants/{tenant}/quota"),
            Some(json!({"max_queued_tasks": null})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    // A random sweep draws its samples, repeatably by seed.
    let body = json!({"name": "r", "template": template("t ${lr} ${opt}"), "method": "random", "samples": 6, "seed": 7,
        "parameters": {"lr": {"min": 1e-5, "max": 1e-1, "log": true}, "opt": ["adam", "sgd"]}});
    let a: Value = post_sweep(&app, &s, body.clone())
        .await
        .json()
        .await
        .unwrap();
    let b2: Value = post_sweep(&app, &s, body).await.json().await.unwrap();
    let params = |v: &Value| {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["params"].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(params(&a).len(), 6);
    assert_eq!(params(&a), params(&b2));
    // Another organization neither sees nor cancels it.
    let id = a["id"].as_str().unwrap();
    let res = other
        .request(&app, Method::GET, &format!("/api/v1/sweeps/{id}"))
        .send()
        .await
        .unwrap();
    assert_error(res, StatusCode::NOT_FOUND, "not_found").await;
    let res = other
        .send(
            &app,
            Method::POST,
            &format!("/api/v1/sweeps/{id}/cancel"),
            None,
        )
        .await;
    assert_error(res, StatusCode::NOT_FOUND, "not_found").await;
    assert_eq!(other.get(&app, "/api/v1/sweeps").await, json!([]));
}

/// An ASHA sweep: six trials report learning curves step by step, in turns (the best first);
/// at each rung (steps 1, 3, 9 of 27) a trial behind the best third of those that got there
/// before it is stopped, with the sweep and its timeline saying why; the best one runs its
/// whole budget.
async fn asha_stops_the_trials_behind_at_each_rung(b: Backend) {
    let app = spawn_app(b).await;
    let _op = app.operator_with_nodes().await;
    let s = app.signup("ada@example.com", "Lab").await;
    let res = post_sweep(
        &app,
        &s,
        json!({
            "name": "asha",
            "method": "asha",
            "template": template("python train.py --q ${q}"),
            "parameters": {"q": [1, 2, 3, 4, 5, 6]},
            "metric": "val_loss", "mode": "min",
            "max_resource": 27, "reduction_factor": 3
        }),
    )
    .await;
    let sweep: Value = res.json().await.unwrap();
    assert_eq!(sweep["method"], "asha", "{sweep}");
    assert_eq!(
        sweep["early_stopping"],
        json!({"resource": "step", "rungs": [1.0, 3.0, 9.0, 27.0], "reduction_factor": 3})
    );
    let id = sweep["id"].as_str().unwrap().to_owned();
    let trials: Vec<String> = sweep["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["task_id"].as_str().unwrap().to_owned())
        .collect();
    // Trial q's loss: 1/q falls with steps at a rate set by q (q = 4 learns best).
    let loss = |q: usize, step: u32| 1.0 + ((q as f64) - 4.0).abs() / 2.0 + 5.0 / f64::from(step);
    let mut running = [true; 6];
    for step in 1..=27u32 {
        for i in [3, 2, 4, 1, 5, 0] {
            let task = &trials[i];
            if !running[i] {
                continue;
            }
            let res = s
                .send(
                    &app,
                    Method::POST,
                    &format!("/api/v1/tasks/{task}/metrics"),
                    Some(json!({"step": step, "val_loss": loss(i + 1, step)})),
                )
                .await;
            assert_eq!(res.status(), StatusCode::NO_CONTENT);
            let t = s.get(&app, &format!("/api/v1/tasks/{task}")).await;
            running[i] = t["state"] != "cancelled";
        }
    }
    let shown = s.get(&app, &format!("/api/v1/sweeps/{id}")).await;
    let items = shown["items"].as_array().unwrap();
    let mut stopped: Vec<u64> = items
        .iter()
        .filter(|t| !t["stopped_early"].is_null())
        .map(|t| t["params"]["q"].as_u64().unwrap())
        .collect();
    stopped.sort();
    // At step 1, q=4 (6.0) is first; each later one is behind it, and behind the best third.
    assert_eq!(stopped, vec![1, 2, 3, 5, 6], "{shown}");
    assert_eq!(
        items[3]["metrics"]["step"], 27,
        "the best trial ran its budget"
    );
    assert_eq!(items[3]["stopped_early"], Value::Null);
    let why = items[4]["stopped_early"].as_str().unwrap();
    assert!(why.contains("val_loss") && why.contains("step 1"), "{why}");
    let t = s
        .get(
            &app,
            &format!("/api/v1/tasks/{}", items[4]["task_id"].as_str().unwrap()),
        )
        .await;
    assert_eq!(t["state"], "cancelled");
    let events = s
        .get(
            &app,
            &format!(
                "/api/v1/tasks/{}/events",
                items[4]["task_id"].as_str().unwrap()
            ),
        )
        .await;
    assert!(
        events
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "stopped_early"),
        "{events}"
    );
    // Another member cannot report numbers for the owner's trial (nor stop it so); a manager
    // of the organization can.
    let bob = app.invite_and_join(&s, "bob@example.com", "member").await;
    let res = bob
        .send(
            &app,
            Method::POST,
            &format!("/api/v1/tasks/{}/metrics", trials[3]),
            Some(json!({"step": 27, "val_loss": 99.0})),
        )
        .await;
    assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
    // An ASHA sweep without its budget or metric is refused, naming the field.
    for (body, field) in [
        (json!({"max_resource": 27}), "metric"),
        (json!({"metric": "loss"}), "max_resource"),
        (
            json!({"metric": "loss", "max_resource": 27, "reduction_factor": 1}),
            "reduction_factor",
        ),
    ] {
        let mut sweep = json!({"name": "bad", "method": "asha", "template": template("x ${q}"),
                               "parameters": {"q": [1, 2]}});
        for (k, v) in body.as_object().unwrap() {
            sweep[k] = v.clone();
        }
        let res = post_sweep(&app, &s, sweep).await;
        let body = assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
        assert_eq!(body["error"]["field"], field, "{body}");
    }
}
