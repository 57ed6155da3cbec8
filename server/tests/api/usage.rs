//! The administrators' monthly usage report (GPU-hours from attempts, utilization from GPU
//! samples, JSON and CSV, platform administrators only), and the live metric stream that feeds
//! the web app's charts.

use std::time::Duration;

use autodl_server::store::GpuSampleRecord;
use autodl_server::tasks::lifecycle::{after_attempt, ExitKind};
use autodl_server::usecases::usage::month_range;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{assert_error, spawn_app, Backend, Session, TestApp};

crate::on_both_backends!(
    usage_report_counts_gpu_hours_per_tenant_and_user,
    usage_over_time_per_person_with_idle_hours_and_caps,
    metric_stream_sends_samples_and_ends_with_the_task,
);

fn spec(name: &str, count: u32) -> Value {
    json!({"name": name, "image": "pytorch/pytorch:2.1", "command": ["python", "train.py"],
           "resources": {"gpu": {"type": "A100", "count": count}}})
}

/// Submits a task and waits until the scheduler placed it; returns its id.
async fn placed(app: &TestApp, s: &Session, name: &str, count: u32) -> String {
    let res = s
        .send(app, Method::POST, "/api/v1/tasks", Some(spec(name, count)))
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let id = res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    for _ in 0..100 {
        if s.get(app, &format!("/api/v1/tasks/{id}")).await["state"] == "scheduled" {
            return id;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("task {id} was never scheduled");
}

/// A sample of GPU 0 of node-a, running `task`.
fn sample(task: &str, at: i64, util: f64) -> GpuSampleRecord {
    GpuSampleRecord {
        node_id: "node-a".into(),
        gpu_index: 0,
        at,
        util,
        mem_used: 1 << 30,
        mem_total: 40 << 30,
        temperature: None,
        power_w: None,
        task_id: Some(task.to_owned()),
    }
}

/// A 2-GPU task of `s` that ran for 30 minutes (its end set by hand), with one GPU sample of
/// each of `utils` a second apart: its id and when it started.
async fn ran_half_an_hour(app: &TestApp, s: &Session, name: &str, utils: &[f64]) -> (String, i64) {
    let store = &app.state.store;
    let id = placed(app, s, name, 2).await;
    let t = store.task(None, &id).await.unwrap().unwrap().task;
    assert!(store.mark_running(&id, t.attempts, 1).await.unwrap());
    let started = store.task_attempts(&id).await.unwrap()[0].started_at;
    let end = after_attempt(
        &t.spec,
        t.attempts as u32,
        0,
        None,
        Some(0),
        ExitKind::Success,
        None,
    );
    assert!(store
        .finish_attempt(&id, t.attempts, &end, started + 1_800_000)
        .await
        .unwrap());
    let samples: Vec<GpuSampleRecord> = utils
        .iter()
        .enumerate()
        .map(|(i, util)| sample(&id, started + 1000 * (i as i64 + 1), *util))
        .collect();
    store.insert_gpu_samples(&samples).await.unwrap();
    (id, started)
}

fn month_of(ms: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp(ms / 1000).unwrap();
    format!("{:04}-{:02}", t.year(), u8::from(t.month()))
}

async fn usage_report_counts_gpu_hours_per_tenant_and_user(b: Backend) {
    let app = spawn_app(b).await;
    let op = app.operator_with_nodes().await;
    let ada = app.signup("ada@example.com", "Vision").await;
    let bob = app.signup("bob@example.com", "Speech").await;
    let store = &app.state.store;

    // Ada: a 2-GPU task that ran for 30 minutes, sampled at 50% and 70% (mean 0.6).
    let (done, started) = ran_half_an_hour(&app, &ada, "done", &[0.5, 0.7]).await;
    // Bob: a 1-GPU task still running; it counts up to now.
    placed(&app, &bob, "running", 1).await;

    let month = month_of(started);
    let (_, month_end) = month_range(&month).unwrap();
    let expected_ada = 2.0 * ((started + 1_800_000).min(month_end) - started) as f64 / 3.6e6;

    let r = op
        .get(&app, &format!("/api/v1/admin/usage?month={month}"))
        .await;
    assert_eq!(r["month"], month.as_str());
    let users = r["users"].as_array().unwrap();
    assert_eq!(users.len(), 2, "{r}");
    let row = |email: &str| {
        users
            .iter()
            .find(|u| u["user_email"] == email)
            .unwrap_or_else(|| panic!("no row for {email}: {r}"))
            .clone()
    };
    let a = row("ada@example.com");
    assert_eq!(a["tenant_name"], "Vision");
    assert_eq!(a["attempts"], 1);
    assert!(
        (a["gpu_hours"].as_f64().unwrap() - expected_ada).abs() < 1e-3,
        "{a}"
    );
    assert!(
        (a["avg_utilization"].as_f64().unwrap() - 0.6).abs() < 1e-6,
        "{a}"
    );
    let bo = row("bob@example.com");
    assert_eq!(bo["tenant_name"], "Speech");
    assert!(bo["gpu_hours"].as_f64().unwrap() >= 0.0);
    assert!(bo["avg_utilization"].is_null());
    let tenants = r["tenants"].as_array().unwrap();
    assert_eq!(tenants.len(), 2);
    let total = r["total_gpu_hours"].as_f64().unwrap();
    assert!(total >= expected_ada - 1e-3, "{r}");

    // A month without usage is empty.
    let empty = op.get(&app, "/api/v1/admin/usage?month=2001-01").await;
    assert_eq!(empty["users"], json!([]));
    assert_eq!(empty["total_gpu_hours"].to_string(), "0.0");

    // CSV download.
    let res = op
        .send(
            &app,
            Method::GET,
            &format!("/api/v1/admin/usage?month={month}&format=csv"),
            None,
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/csv"));
    assert!(res.headers()["content-disposition"]
        .to_str()
        .unwrap()
        .contains(&format!("autodl-usage-{month}.csv")));
    let csv = res.text().await.unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next().unwrap(),
        "month,tenant_id,tenant,user_id,user,attempts,gpu_hours,avg_utilization"
    );
    assert_eq!(lines.count(), 2);
    assert!(csv.contains("\"ada@example.com\",1,"));

    // Bad input and other callers.
    let res = op
        .send(&app, Method::GET, "/api/v1/admin/usage?month=2024-13", None)
        .await;
    let body = assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
    assert_eq!(body["error"]["field"], "month");
    let res = op
        .send(&app, Method::GET, "/api/v1/admin/usage?format=xml", None)
        .await;
    assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
    let res = ada
        .send(&app, Method::GET, "/api/v1/admin/usage", None)
        .await;
    assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
    let res = reqwest::Client::new()
        .get(app.url("/api/v1/admin/usage"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);

    // Raw samples are folded into hourly rollups after a while; the month's utilization is
    // still known, and merges with raw samples that arrive later.
    let folded = store
        .compact_gpu_samples(started + 10_000, 0)
        .await
        .unwrap();
    assert_eq!(folded, 2);
    store
        .insert_gpu_samples(&[sample(&done, started + 20_000, 0.9)])
        .await
        .unwrap();
    let r = op
        .get(&app, &format!("/api/v1/admin/usage?month={month}"))
        .await;
    let a = r["users"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["user_email"] == "ada@example.com")
        .unwrap()
        .clone();
    assert!(
        (a["avg_utilization"].as_f64().unwrap() - 0.7).abs() < 1e-6,
        "{a}"
    );
}

/// The `data:` payloads and event names of a complete SSE body.
fn sse_events(body: &str) -> (Vec<Value>, Vec<String>) {
    let mut data = Vec::new();
    let mut events = Vec::new();
    for block in body.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let mut event = None;
        for line in block.lines() {
            if let Some(e) = line.strip_prefix("event: ") {
                event = Some(e.to_owned());
            } else if let Some(d) = line.strip_prefix("data: ") {
                if event.is_none() {
                    data.push(serde_json::from_str(d).unwrap());
                }
            }
        }
        events.extend(event);
    }
    (data, events)
}

async fn metric_stream_sends_samples_and_ends_with_the_task(b: Backend) {
    let app = spawn_app(b).await;
    app.operator_with_nodes().await;
    let ada = app.signup("ada@example.com", "Vision").await;
    let bob = app.signup("bob@example.com", "Speech").await;
    let store = &app.state.store;
    let id = placed(&app, &ada, "stream", 2).await;
    let t = store.task(None, &id).await.unwrap().unwrap().task;
    assert!(store.mark_running(&id, t.attempts, 1).await.unwrap());
    let now = autodl_server::clock::Clock::now_ms(&autodl_server::clock::SystemClock);
    let gpu = |index: i64, at: i64, util: f64| GpuSampleRecord {
        node_id: "node-a".into(),
        gpu_index: index,
        at,
        util,
        mem_used: 10 << 30,
        mem_total: 40 << 30,
        temperature: None,
        power_w: None,
        task_id: Some(id.clone()),
    };
    store
        .insert_gpu_samples(&[gpu(0, now - 2000, 0.2), gpu(1, now - 2000, 0.4)])
        .await
        .unwrap();
    let res = ada
        .send(
            &app,
            Method::POST,
            &format!("/api/v1/tasks/{id}/metrics"),
            Some(json!({"epoch": 1, "loss": 0.5})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);

    // Another tenant cannot watch it.
    let res = bob
        .send(
            &app,
            Method::GET,
            &format!("/api/v1/tasks/{id}/metrics/stream"),
            None,
        )
        .await;
    assert_error(res, StatusCode::NOT_FOUND, "not_found").await;
    let res = ada
        .send(
            &app,
            Method::GET,
            &format!("/api/v1/tasks/{id}/metrics/stream?after=yesterday"),
            None,
        )
        .await;
    assert_error(res, StatusCode::BAD_REQUEST, "validation").await;

    // While it runs the stream stays open; finishing the task ends it after the last samples.
    let res = ada
        .send(
            &app,
            Method::GET,
            &format!("/api/v1/tasks/{id}/metrics/stream"),
            None,
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let reader = tokio::spawn(async move { res.text().await.unwrap() });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !reader.is_finished(),
        "the stream stays open while the task runs"
    );
    store
        .insert_gpu_samples(&[gpu(0, now + 1000, 0.6), gpu(1, now + 1000, 0.8)])
        .await
        .unwrap();
    let end = after_attempt(
        &t.spec,
        t.attempts as u32,
        0,
        None,
        Some(0),
        ExitKind::Success,
        None,
    );
    assert!(store
        .finish_attempt(&id, t.attempts, &end, now + 2000)
        .await
        .unwrap());
    let body = tokio::time::timeout(Duration::from_secs(10), reader)
        .await
        .expect("the stream ends with the task")
        .unwrap();
    let (data, events) = sse_events(&body);
    assert_eq!(events, ["end"]);
    let utils: Vec<f64> = data.iter().filter_map(|s| s["gpu_util"].as_f64()).collect();
    assert_eq!(utils.len(), 2, "{body}");
    assert!(
        (utils[0] - 0.3).abs() < 1e-9 && (utils[1] - 0.7).abs() < 1e-9,
        "{body}"
    );
    assert_eq!(data[0]["mem_used"], 20u64 << 30);
    assert_eq!(data[0]["values"]["gpu1_util"], 0.4);
    let reported: Vec<&Value> = data.iter().filter(|s| s["loss"].is_number()).collect();
    assert_eq!(reported.len(), 1);
    assert_eq!(reported[0]["epoch"], 1.0);

    // Resuming after the last sample sends nothing more, only the end.
    let last = data
        .iter()
        .map(|s| s["at"].as_str().unwrap().to_owned())
        .max()
        .unwrap();
    let res = ada
        .send(
            &app,
            Method::GET,
            &format!(
                "/api/v1/tasks/{id}/metrics/stream?after={}",
                urlencode(&last)
            ),
            None,
        )
        .await;
    let (data, events) = sse_events(&res.text().await.unwrap());
    assert!(data.is_empty(), "{data:?}");
    assert_eq!(events, ["end"]);
}

fn urlencode(s: &str) -> String {
    s.replace('+', "%2B").replace(':', "%3A")
}

async fn usage_over_time_per_person_with_idle_hours_and_caps(b: Backend) {
    let app = spawn_app(b).await;
    let op = app.operator_with_nodes().await;
    let ada = app.signup("ada@example.com", "Vision").await;
    let carl = app
        .invite_and_join(&ada, "carl@example.com", "member")
        .await;
    let bob = app.signup("bob@example.com", "Speech").await;
    let vision = ada.user["tenant_id"].as_str().unwrap().to_owned();
    let res = op
        .send(
            &app,
            Method::PUT,
            &format!("/api/v1/admin/tenants/{vision}/quota"),
            Some(json!({"gpu_hours_per_month": 10})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);

    // Ada: two GPUs for 30 minutes, measured half the time under 5% (idle).
    let (_, started) = ran_half_an_hour(&app, &ada, "done", &[0.02, 0.5]).await;
    placed(&app, &bob, "running", 1).await;
    // The half hour ends in the future; the default range ends with today (UTC), so a run
    // started just before midnight counts only up to it.
    let day_ms = 86_400_000;
    let today_end = (started / day_ms + 1) * day_ms;
    let expected = 2.0 * ((started + 1_800_000).min(today_end) - started) as f64 / 3.6e6;

    let all = op.get(&app, "/api/v1/usage/series").await;
    assert_eq!(all["bucket"], "day");
    assert_eq!(all["periods"].as_array().unwrap().len(), 30, "{all}");
    let points = all["points"].as_array().unwrap();
    let of = |email: &str| -> Vec<Value> {
        points
            .iter()
            .filter(|p| p["user_email"] == email)
            .cloned()
            .collect()
    };
    let ada_points = of("ada@example.com");
    let hours: f64 = ada_points
        .iter()
        .map(|p| p["gpu_hours"].as_f64().unwrap())
        .sum();
    assert!((hours - expected).abs() < 1e-3, "{all}");
    let measured = ada_points
        .iter()
        .find(|p| !p["avg_utilization"].is_null())
        .unwrap();
    assert!((measured["avg_utilization"].as_f64().unwrap() - 0.26).abs() < 1e-6);
    let idle = measured["idle_gpu_hours"].as_f64().unwrap();
    assert!(
        (idle - measured["gpu_hours"].as_f64().unwrap() / 2.0).abs() < 1e-3,
        "{measured}"
    );
    assert!(
        !of("bob@example.com").is_empty(),
        "a running task counts up to now"
    );

    // Ada, an owner, sees her organization's; its cap and this month's use of it come along.
    let hers = ada.get(&app, "/api/v1/usage/series?bucket=week").await;
    assert!(hers["points"]
        .as_array()
        .unwrap()
        .iter()
        .all(|p| p["tenant_id"] == vision.as_str()));
    let cap = hers["quotas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["scope"] == "tenant")
        .unwrap()
        .clone();
    assert_eq!(cap["name"], "Vision");
    assert_eq!(cap["gpu_hours_per_month"].as_f64(), Some(10.0));
    let res = ada
        .send(
            &app,
            Method::GET,
            &format!(
                "/api/v1/usage/series?tenant={}",
                bob.user["tenant_id"].as_str().unwrap()
            ),
            None,
        )
        .await;
    assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;

    // Carl, a member, sees his own (nothing yet), never Ada's.
    let his = carl.get(&app, "/api/v1/usage/series").await;
    assert_eq!(his["points"], json!([]));
    let res = carl
        .send(
            &app,
            Method::GET,
            &format!("/api/v1/usage/series?user={}", ada.id()),
            None,
        )
        .await;
    assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;

    // Months over years are fine; bad input says which.
    let months = op
        .get(&app, "/api/v1/usage/series?bucket=month&from=2020-01-01")
        .await;
    assert!(months["periods"].as_array().unwrap().len() > 60);
    // Days over years: the latest 400 of them, and the answer says where they start.
    let days = op.get(&app, "/api/v1/usage/series?from=2020-01-01").await;
    assert_eq!(days["periods"].as_array().unwrap().len(), 400);
    assert_ne!(days["from"], "2020-01-01");
    // Before 1970 nothing ran: the range starts there.
    let old = op.get(&app, "/api/v1/usage/series?to=0000-01-01").await;
    assert_eq!(old["from"], "1970-01-01");
    assert_eq!(old["points"], json!([]));
    // Two days in either order are the same range.
    let a = op
        .get(&app, "/api/v1/usage/series?from=2026-11-01&to=2026-11-07")
        .await;
    let b = op
        .get(&app, "/api/v1/usage/series?from=2026-11-07&to=2026-11-01")
        .await;
    assert_eq!(a["periods"], b["periods"]);
    assert_eq!(a["periods"].as_array().unwrap().len(), 7);
    for (query, field) in [
        ("bucket=hour", "bucket"),
        ("to=yesterday", "to"),
        ("from=2026-13-01", "from"),
    ] {
        let res = op
            .send(
                &app,
                Method::GET,
                &format!("/api/v1/usage/series?{query}"),
                None,
            )
            .await;
        let body = assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
        assert_eq!(body["error"]["field"], field, "{query}: {body}");
    }

    // Each person's standing as the scheduler ranked them, kept from the first cycle with
    // work waiting (then every 10 minutes): Ada's first task found her with no use yet.
    let standing = op.get(&app, "/api/v1/usage/series").await["standing"].clone();
    let first = standing
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["user_email"] == "ada@example.com")
        .unwrap_or_else(|| panic!("ada's standing: {standing}"))
        .clone();
    assert_eq!(first["fair_share"].as_f64(), Some(1.0), "{first}");
    assert!((0.0..=1.0).contains(&first["utilization"].as_f64().unwrap()));
    let hers = ada.get(&app, "/api/v1/usage/series").await;
    assert!(hers["standing"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["tenant_id"] == vision.as_str()));

    // The same figures as CSV.
    let res = op
        .send(&app, Method::GET, "/api/v1/usage/series?format=csv", None)
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let csv = res.text().await.unwrap();
    assert!(csv.starts_with("bucket,start,tenant_id,tenant,user_id,user,gpu_hours,"));
    assert_eq!(csv.lines().count(), 1 + points.len());
}
