//! The agent API, driven over HTTP the way an agent drives it: registration, long polls,
//! reports, metrics, node loss, drain and cancel.

use std::time::{Duration, Instant};

use reqwest::{Client, Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{
    assert_error, live_until, spawn_app_on_clock, spawn_app_with, Backend, Session, TestApp,
};

crate::on_both_backends!(
    registration_and_credentials,
    tasks_flow_through_an_agent,
    metrics_batches_are_checked,
    metric_lines_keep_a_long_run_s_shape,
    lost_nodes_requeue_their_tasks,
    drain_and_cancel_reach_the_agent,
    polls_are_recorded_in_batches_before_nodes_are_judged,
    a_node_heard_by_its_reports_is_not_judged_lost,
    reports_in_a_burst_are_stored_once_each,
    a_restarted_agent_s_poll_is_woken_beside_its_old_one,
    a_server_s_own_pause_is_not_its_nodes_silence,
);

pub struct FakeAgent {
    pub base: String,
    pub credential: String,
    pub http: Client,
}

impl FakeAgent {
    /// Joins as a node that runs tasks in containers.
    pub async fn join(
        app: &TestApp,
        op: &Session,
        id: &str,
        gpu_type: &str,
        zone: &str,
    ) -> FakeAgent {
        let host = json!({"runtime": "docker", "isolation": "container", "data_roots": []});
        Self::join_with(app, op, id, gpu_type, zone, host).await
    }

    /// Joins saying `host` about how it runs tasks.
    pub async fn join_with(
        app: &TestApp,
        op: &Session,
        id: &str,
        gpu_type: &str,
        zone: &str,
        host: Value,
    ) -> FakeAgent {
        let token = app.registration_token(op, id).await;
        let gpus: Vec<Value> = (0..4)
            .map(|i| json!({"index": i, "type": gpu_type, "memory": 42949672960u64}))
            .collect();
        let res = Client::new()
            .post(app.url("/api/v1/agent/register"))
            .json(&json!({"token": token, "node": {"id": id, "zone": zone, "cpu": 32, "memory": 274877906944u64, "gpus": gpus,
                "host": host}}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::CREATED);
        let body: Value = res.json().await.unwrap();
        FakeAgent {
            base: app.address.clone(),
            credential: body["credential"].as_str().unwrap().to_owned(),
            http: Client::new(),
        }
    }

    pub async fn call(&self, path: &str, body: Value) -> reqwest::Response {
        self.http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.credential)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    pub async fn poll(&self, running: &[(String, u64)], wait: u64) -> Value {
        let running: Vec<Value> = running
            .iter()
            .map(|(t, a)| json!({"task_id": t, "attempt": a}))
            .collect();
        let res = self
            .call(
                &format!("/api/v1/agent/poll?wait={wait}"),
                json!({"running": running}),
            )
            .await;
        assert_eq!(res.status(), StatusCode::OK);
        res.json().await.unwrap()
    }

    /// Submits `spec` as `s` and polls until this agent is given it:
    /// (task id, attempt, the assignment).
    pub async fn placed(&self, app: &TestApp, s: &Session, spec: Value) -> (String, u64, Value) {
        let res = s.send(app, Method::POST, "/api/v1/tasks", Some(spec)).await;
        assert_eq!(res.status(), StatusCode::CREATED);
        let id = res.json::<Value>().await.unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let work = self.poll(&[], 1).await;
            if let Some(a) = work["assignments"]
                .as_array()
                .unwrap()
                .iter()
                .find(|a| a["task_id"] == id.as_str())
            {
                return (id, a["attempt"].as_u64().unwrap(), a.clone());
            }
            assert!(Instant::now() < deadline, "task {id} was not placed");
        }
    }
}

fn spec(name: &str, gpu_type: &str) -> Value {
    json!({"name": name, "image": "busybox", "command": "echo hi", "batch_size": 64,
           "retry_policy": {"max_retries": 2, "oom_recovery": true},
           "resources": {"gpu": {"type": gpu_type, "count": 1}}, "env": {"GREETING": "hello"}})
}

async fn registration_and_credentials(b: Backend) {
    let app = spawn_app_with(b, |_| {}).await;
    let op = app.operator().await;
    let member = app.signup("m@example.com", "Lab").await;
    let res = member
        .send(
            &app,
            Method::POST,
            "/api/v1/admin/registration-tokens",
            Some(json!({})),
        )
        .await;
    assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
    let agent = FakeAgent::join(&app, &op, "gpu-1", "A100-40G", "z1").await;
    assert!(agent.credential.starts_with("adln_"));
    let nodes = member.get(&app, "/api/v1/nodes").await;
    assert_eq!(nodes[0]["id"], "gpu-1");
    assert_eq!(nodes[0]["gpus"].as_array().unwrap().len(), 4);
    // Tokens are listed without their secret; a revoked token admits nobody.
    let tokens = op.get(&app, "/api/v1/admin/registration-tokens").await;
    assert!(tokens[0].get("token").is_none());
    let tok: Value = op
        .send(
            &app,
            Method::POST,
            "/api/v1/admin/registration-tokens",
            Some(json!({"expires_in_hours": 1})),
        )
        .await
        .json()
        .await
        .unwrap();
    op.send(
        &app,
        Method::DELETE,
        &format!(
            "/api/v1/admin/registration-tokens/{}",
            tok["id"].as_str().unwrap()
        ),
        None,
    )
    .await;
    let node = json!({"id": "gpu-2", "cpu": 8, "memory": 1000, "gpus": []});
    for token in [tok["token"].clone(), json!("adlreg_bogus")] {
        let res = Client::new()
            .post(app.url("/api/v1/agent/register"))
            .json(&json!({"token": token, "node": node}))
            .send()
            .await
            .unwrap();
        assert_error(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
    }
    // Bad credentials, and user keys on the agent API, are refused.
    let user_key: Value = member
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
    for bearer in [
        "adln_bogus",
        user_key["key"].as_str().unwrap(),
        member.token.as_str(),
    ] {
        let res = Client::new()
            .post(app.url("/api/v1/agent/poll"))
            .bearer_auth(bearer)
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_error(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
    }
    // And the node credential does not open the user API.
    let res = Client::new()
        .get(app.url("/api/v1/me"))
        .bearer_auth(&agent.credential)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    // Removing the node revokes its credential; the host can join again with a token.
    assert_eq!(
        agent.call("/api/v1/agent/poll", json!({})).await.status(),
        StatusCode::OK
    );
    op.send(&app, Method::DELETE, "/api/v1/admin/nodes/gpu-1", None)
        .await;
    let res = agent.call("/api/v1/agent/poll", json!({})).await;
    assert_error(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
    let again = FakeAgent::join(&app, &op, "gpu-1", "A100-40G", "z1").await;
    assert_eq!(
        again.call("/api/v1/agent/poll", json!({})).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        member
            .get(&app, "/api/v1/nodes")
            .await
            .as_array()
            .unwrap()
            .len(),
        1,
        "only gpu-1 is registered"
    );
}

async fn tasks_flow_through_an_agent(b: Backend) {
    let app = spawn_app_with(b, |_| {}).await;
    let op = app.operator().await;
    let agent = FakeAgent::join(&app, &op, "gpu-1", "A100-40G", "z1").await;
    let s = app.signup("ada@example.com", "Lab").await;
    // An idle agent waiting in a long poll gets the task well within a second of submission.
    let waiting = {
        let agent_base = agent.base.clone();
        let cred = agent.credential.clone();
        tokio::spawn(async move {
            let r = Client::new()
                .post(format!("{agent_base}/api/v1/agent/poll?wait=20"))
                .bearer_auth(cred)
                .json(&json!({}))
                .send()
                .await
                .unwrap();
            (Instant::now(), r.json::<Value>().await.unwrap())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let submitted = Instant::now();
    let t: Value = s
        .send(
            &app,
            Method::POST,
            "/api/v1/tasks",
            Some(spec("train", "A100")),
        )
        .await
        .json()
        .await
        .unwrap();
    let id = t["id"].as_str().unwrap().to_owned();
    let (got_at, work) = waiting.await.unwrap();
    assert!(
        got_at - submitted < Duration::from_secs(1),
        "dispatch took {:?}",
        got_at - submitted
    );
    let a = &work["assignments"][0];
    assert_eq!(a["task_id"], id.as_str());
    assert_eq!(a["attempt"], 1);
    assert_eq!(a["image"], "busybox");
    assert_eq!(a["env"]["GREETING"], "hello");
    assert_eq!(a["env"]["AUTODL_TASK_ID"], id.as_str());
    assert_eq!(a["env"]["AUTODL_BATCH_SIZE"], "64");
    assert_eq!(a["env"]["WORLD_SIZE"], "1");
    assert_eq!(a["gpu_indices"].as_array().unwrap().len(), 1);
    // Polling again while it is not yet running hands the same work out again (idempotent).
    assert_eq!(
        agent.poll(&[], 0).await["assignments"][0]["task_id"],
        id.as_str()
    );

    assert_eq!(
        agent
            .call(
                &format!("/api/v1/agent/tasks/{id}/started"),
                json!({"attempt": 1})
            )
            .await
            .status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        s.get(&app, &format!("/api/v1/tasks/{id}")).await["state"],
        "running"
    );
    assert!(agent.poll(&[(id.clone(), 1)], 0).await["assignments"]
        .as_array()
        .unwrap()
        .is_empty());
    let lines = json!({"attempt": 1, "lines": [{"at": "2026-01-01T00:00:00Z", "stream": "stdout", "line": "epoch 1"},
                                                {"at": "2026-01-01T00:00:01Z", "stream": "stderr", "line": "CUDA out of memory"}]});
    assert_eq!(
        agent
            .call(&format!("/api/v1/agent/tasks/{id}/logs"), lines)
            .await
            .status(),
        StatusCode::NO_CONTENT
    );
    let bad = json!({"attempt": 1, "lines": [{"at": "x", "stream": "stdin", "line": "?"}]});
    assert_eq!(
        agent
            .call(&format!("/api/v1/agent/tasks/{id}/logs"), bad)
            .await
            .status(),
        StatusCode::BAD_REQUEST
    );
    let logs = s.get(&app, &format!("/api/v1/tasks/{id}/logs")).await;
    assert_eq!(logs["lines"].as_array().unwrap().len(), 2);

    // The task's own token reports metrics for it alone.
    let token = a["env"]["AUTODL_TASK_TOKEN"].as_str().unwrap();
    let res = Client::new()
        .post(app.url(&format!("/api/v1/tasks/{id}/metrics")))
        .bearer_auth(token)
        .json(&json!({"epoch": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    // Each reported number's latest value is the task's summary, in the list and on its own.
    for report in [
        json!({"loss": 2.5, "step": 1}),
        json!({"val_loss": 1.75}),
        json!({"loss": 1.25, "step": 2}),
    ] {
        let res = Client::new()
            .post(app.url(&format!("/api/v1/tasks/{id}/metrics")))
            .bearer_auth(token)
            .json(&report)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::NO_CONTENT);
    }
    let summary = json!({"epoch": 1.0, "loss": 1.25, "step": 2.0, "val_loss": 1.75});
    assert_eq!(
        s.get(&app, &format!("/api/v1/tasks/{id}")).await["summary"],
        summary
    );
    let listed = s.get(&app, "/api/v1/tasks").await;
    assert_eq!(listed["items"][0]["summary"], summary, "{listed}");

    // An OOM: retried with the batch halved, as a new attempt.
    let res = agent
        .call(
            &format!("/api/v1/agent/tasks/{id}/finished"),
            json!({"attempt": 1, "exit_code": 1, "reason": "oom"}),
        )
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let res = agent
        .call(
            &format!("/api/v1/agent/tasks/{id}/finished"),
            json!({"attempt": 1, "exit_code": 1, "reason": "oom"}),
        )
        .await;
    assert_error(res, StatusCode::CONFLICT, "conflict").await;
    let work = agent.poll(&[], 5).await;
    let a2 = &work["assignments"][0];
    assert_eq!(a2["attempt"], 2);
    assert_eq!(a2["env"]["AUTODL_BATCH_SIZE"], "32");
    agent
        .call(
            &format!("/api/v1/agent/tasks/{id}/started"),
            json!({"attempt": 2}),
        )
        .await;
    let res = agent
        .call(
            &format!("/api/v1/agent/tasks/{id}/finished"),
            json!({"attempt": 2, "exit_code": 0, "reason": "success"}),
        )
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let t = s.get(&app, &format!("/api/v1/tasks/{id}")).await;
    assert_eq!(t["state"], "completed");
    let attempts = s.get(&app, &format!("/api/v1/tasks/{id}/attempts")).await;
    assert_eq!(attempts[0]["reason"], "oom");
    assert_eq!(attempts[1]["exit_code"], 0);
    let metrics = op.prometheus(&app).await;
    assert!(
        metrics.contains("autodl_dispatch_latency_seconds_count 2"),
        "{metrics}"
    );
    assert!(metrics.contains("autodl_scheduling_cycle_seconds"));
}

async fn metrics_batches_are_checked(b: Backend) {
    let app = spawn_app_with(b, |_| {}).await;
    let op = app.operator().await;
    let agent = FakeAgent::join(&app, &op, "gpu-1", "A100-40G", "z1").await;
    let s = app.signup("m@example.com", "Lab").await;
    let t: Value = s
        .send(&app, Method::POST, "/api/v1/tasks", Some(spec("m", "A100")))
        .await
        .json()
        .await
        .unwrap();
    let id = t["id"].as_str().unwrap().to_owned();
    let work = agent.poll(&[], 5).await;
    let gpu = work["assignments"][0]["gpu_indices"][0].as_u64().unwrap();
    let now = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let sample = |index: u64, util: f64| json!({"at": now, "gpu_index": index, "util": util, "mem_used": 1000, "mem_total": 42949672960u64, "task_id": id});
    let res = agent
        .call(
            "/api/v1/agent/metrics",
            json!({"samples": [sample(gpu, 0.9), sample(9, 0.5)]}),
        )
        .await;
    let e = assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
    assert!(e["error"]["message"].as_str().unwrap().contains("no GPU 9"));
    for bad in [
        json!({"samples": [sample(gpu, 1.5)]}),
        json!({"samples": [{"gpu_index": 0}]}),
        json!({"rows": []}),
    ] {
        assert_eq!(
            agent.call("/api/v1/agent/metrics", bad).await.status(),
            StatusCode::BAD_REQUEST
        );
    }
    assert!(
        s.get(&app, &format!("/api/v1/tasks/{id}/metrics")).await["samples"]
            .as_array()
            .unwrap()
            .is_empty(),
        "nothing stored"
    );
    let res = agent
        .call(
            "/api/v1/agent/metrics",
            json!({"samples": [sample(gpu, 0.9)]}),
        )
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let m = s.get(&app, &format!("/api/v1/tasks/{id}/metrics")).await;
    assert_eq!(m["samples"][0]["gpu_util"], 0.9);
    assert_eq!(m["samples"][0]["mem_total"], 42949672960u64);
    // The cluster view shows how busy each GPU is from its latest sample.
    let nodes = s.get(&app, "/api/v1/nodes").await;
    let busy: Vec<(u64, Value)> = nodes[0]["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (g["index"].as_u64().unwrap(), g["utilization"].clone()))
        .collect();
    assert!(busy.contains(&(gpu, json!(0.9))), "{busy:?}");
    assert!(
        busy.iter()
            .filter(|(i, _)| *i != gpu)
            .all(|(_, u)| u.is_null()),
        "{busy:?}"
    );
    let prom = op.prometheus(&app).await;
    assert!(
        prom.contains("autodl_gpu_utilization_ratio{gpu=\"0\",node=\"gpu-1\"}")
            || prom.contains("autodl_gpu_utilization_ratio{gpu="),
        "{prom}"
    );
    assert!(prom.contains("autodl_gpu_samples_ingested_total 1"));
}

/// A long run's chart: the whole history comes back thinned to the asked budget, a spike kept,
/// every GPU its own line, a window narrows it, and bad windows are refused.
async fn metric_lines_keep_a_long_run_s_shape(b: Backend) {
    let app = spawn_app_with(b, |_| {}).await;
    let op = app.operator().await;
    let agent = FakeAgent::join(&app, &op, "gpu-1", "A100-40G", "z1").await;
    let s = app.signup("lines@example.com", "Lab").await;
    let mut two = spec("long", "A100");
    two["resources"]["gpu"]["count"] = json!(2);
    let t: Value = s
        .send(&app, Method::POST, "/api/v1/tasks", Some(two))
        .await
        .json()
        .await
        .unwrap();
    let id = t["id"].as_str().unwrap().to_owned();
    let work = agent.poll(&[], 5).await;
    let gpus: Vec<u64> = work["assignments"][0]["gpu_indices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_u64().unwrap())
        .collect();
    assert_eq!(gpus.len(), 2, "{work}");
    let start = time::OffsetDateTime::now_utc() - time::Duration::seconds(4000);
    let at = |i: i64| {
        (start + time::Duration::seconds(i))
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    };
    // 3,000 instants on two GPUs; the second GPU spikes to full once.
    let mut samples: Vec<Value> = Vec::new();
    for i in 0..3000 {
        for (k, g) in gpus.iter().enumerate() {
            let util = if k == 1 && i == 1777 { 1.0 } else { 0.25 };
            samples.push(json!({"at": at(i), "gpu_index": g, "util": util, "mem_used": 1 << 30, "mem_total": 42949672960u64, "task_id": id}));
        }
    }
    let res = agent
        .call("/api/v1/agent/metrics", json!({ "samples": samples }))
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    for i in 0..30 {
        let res = s
            .send(
                &app,
                Method::POST,
                &format!("/api/v1/tasks/{id}/metrics"),
                Some(json!({"loss": 1.0 / f64::from(i + 1), "step": i})),
            )
            .await;
        assert_eq!(res.status(), StatusCode::NO_CONTENT);
    }

    let lines = s
        .get(
            &app,
            &format!("/api/v1/tasks/{id}/metrics/lines?points=100"),
        )
        .await;
    assert_eq!(lines["raw_points"], 3030, "{}", lines["raw_points"]);
    assert_eq!(lines["truncated"], false);
    let line = |name: &str| -> Vec<Value> {
        lines["lines"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == name)
            .unwrap_or_else(|| panic!("no line {name}: {lines}"))["points"]
            .as_array()
            .unwrap()
            .clone()
    };
    let mean = line("gpu_util");
    assert_eq!(mean.len(), 100, "thinned to the budget");
    let second = line(&format!("gpu{}_util", gpus[1]));
    assert_eq!(second.len(), 100);
    assert!(
        second.iter().any(|p| p[1] == 1.0),
        "the spike survives thinning"
    );
    assert!(line(&format!("gpu{}_util", gpus[0]))
        .iter()
        .all(|p| p[1] == 0.25));
    assert_eq!(line("gpu_mem_used")[0][1], f64::from(2u32 << 30));
    let first_ms = mean[0][0].as_f64().unwrap();
    let last_ms = mean[99][0].as_f64().unwrap();
    assert!(
        last_ms - first_ms >= 2_999_000.0,
        "the whole history: {first_ms}..{last_ms}"
    );
    let loss = line("loss");
    assert_eq!(loss.len(), 30, "a short line is kept whole");
    assert_eq!(loss[0][1], 1.0);
    assert_eq!(line("step").len(), 30);

    // A window of ten minutes in the middle holds only its own samples.
    let (from, to) = (at(1000), at(1599));
    let url = format!(
        "/api/v1/tasks/{id}/metrics/lines?points=5000&from={}&to={}",
        urlencoding(&from),
        urlencoding(&to)
    );
    let window = s.get(&app, &url).await;
    assert_eq!(window["raw_points"], 600, "{}", window["raw_points"]);
    let w = window["lines"].as_array().unwrap();
    assert!(
        w.iter().all(|l| l["name"] != "loss"),
        "reported later than the window"
    );
    // A window that ends before it starts is empty.
    let url = format!(
        "/api/v1/tasks/{id}/metrics/lines?from={}&to={}",
        urlencoding(&to),
        urlencoding(&from)
    );
    assert_eq!(s.get(&app, &url).await["raw_points"], 0);

    for (query, field) in [
        ("points=5", "points"),
        ("points=5001", "points"),
        ("from=yesterday", "from"),
        ("to=1", "to"),
    ] {
        let res = s
            .send(
                &app,
                Method::GET,
                &format!("/api/v1/tasks/{id}/metrics/lines?{query}"),
                None,
            )
            .await;
        let e = assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
        assert_eq!(e["error"]["field"], field, "{query}");
    }
    let other = app.signup("peek@example.com", "Other").await;
    let res = other
        .send(
            &app,
            Method::GET,
            &format!("/api/v1/tasks/{id}/metrics/lines"),
            None,
        )
        .await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
}

fn urlencoding(s: &str) -> String {
    s.replace('+', "%2B").replace(':', "%3A")
}

async fn lost_nodes_requeue_their_tasks(b: Backend) {
    let app = spawn_app_with(b, |s| s.node_lost_timeout_secs = 2).await;
    let op = app.operator().await;
    let first = FakeAgent::join(&app, &op, "gpu-1", "A100-40G", "z1").await;
    let s = app.signup("l@example.com", "Lab").await;
    let t: Value = s
        .send(&app, Method::POST, "/api/v1/tasks", Some(spec("l", "A100")))
        .await
        .json()
        .await
        .unwrap();
    let id = t["id"].as_str().unwrap().to_owned();
    assert_eq!(
        first.poll(&[], 5).await["assignments"][0]["task_id"],
        id.as_str()
    );
    first
        .call(
            &format!("/api/v1/agent/tasks/{id}/started"),
            json!({"attempt": 1}),
        )
        .await;
    // A second node joins and keeps polling; the first goes silent.
    let second = FakeAgent::join(&app, &op, "gpu-2", "A100-40G", "z1").await;
    let deadline = Instant::now() + Duration::from_secs(15);
    let work = loop {
        let w = second.poll(&[], 1).await;
        if !w["assignments"].as_array().unwrap().is_empty() {
            break w;
        }
        assert!(
            Instant::now() < deadline,
            "the task never moved to the second node"
        );
    };
    assert_eq!(work["assignments"][0]["task_id"], id.as_str());
    assert_eq!(work["assignments"][0]["attempt"], 2);
    let attempts = s.get(&app, &format!("/api/v1/tasks/{id}/attempts")).await;
    assert_eq!(attempts[0]["reason"], "node_lost");
    let nodes = op.get(&app, "/api/v1/nodes").await;
    assert_eq!(
        nodes
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["id"] == "gpu-1")
            .unwrap()["schedulable"],
        false
    );
    // The first agent comes back: it is told to stop its stale attempt, and the node is ready again.
    let w = first.poll(&[(id.clone(), 1)], 0).await;
    assert_eq!(w["stop"][0]["task_id"], id.as_str());
    assert_eq!(w["stop"][0]["reason"], "moved");
    let res = first
        .call(
            &format!("/api/v1/agent/tasks/{id}/finished"),
            json!({"attempt": 1, "exit_code": 0, "reason": "success"}),
        )
        .await;
    assert_error(res, StatusCode::CONFLICT, "conflict").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let nodes = op.get(&app, "/api/v1/nodes").await;
    assert_eq!(
        nodes
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["id"] == "gpu-1")
            .unwrap()["schedulable"],
        true
    );
}

async fn drain_and_cancel_reach_the_agent(b: Backend) {
    let app = spawn_app_with(b, |_| {}).await;
    let op = app.operator().await;
    let first = FakeAgent::join(&app, &op, "gpu-1", "A100-40G", "z1").await;
    let s = app.signup("d@example.com", "Lab").await;
    let t: Value = s
        .send(&app, Method::POST, "/api/v1/tasks", Some(spec("d", "A100")))
        .await
        .json()
        .await
        .unwrap();
    let id = t["id"].as_str().unwrap().to_owned();
    first.poll(&[], 5).await;
    first
        .call(
            &format!("/api/v1/agent/tasks/{id}/started"),
            json!({"attempt": 1}),
        )
        .await;
    let second = FakeAgent::join(&app, &op, "gpu-2", "A100-40G", "z1").await;
    // Drain: the agent is told to stop (with a grace period to checkpoint); its report requeues
    // the task, which lands on the other node.
    let res = op
        .send(&app, Method::POST, "/api/v1/admin/nodes/gpu-1/drain", None)
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let w = first.poll(&[(id.clone(), 1)], 5).await;
    assert_eq!(w["stop"][0]["reason"], "drained");
    assert!(w["stop"][0]["grace_s"].as_u64().unwrap() > 0);
    first
        .call(
            &format!("/api/v1/agent/tasks/{id}/finished"),
            json!({"attempt": 1, "exit_code": 143, "reason": "stopped"}),
        )
        .await;
    let w = second.poll(&[], 5).await;
    assert_eq!(w["assignments"][0]["task_id"], id.as_str());
    assert_eq!(w["assignments"][0]["attempt"], 2);
    assert_eq!(
        s.get(&app, &format!("/api/v1/tasks/{id}/attempts")).await[0]["reason"],
        "drained"
    );
    second
        .call(
            &format!("/api/v1/agent/tasks/{id}/started"),
            json!({"attempt": 2}),
        )
        .await;
    // Cancel: the running agent is told to stop it.
    s.send(
        &app,
        Method::POST,
        &format!("/api/v1/tasks/{id}/cancel"),
        None,
    )
    .await;
    let w = second.poll(&[(id.clone(), 2)], 5).await;
    assert_eq!(w["stop"][0]["reason"], "cancelled");
    let res = op
        .send(
            &app,
            Method::POST,
            "/api/v1/admin/nodes/gpu-1/explode",
            None,
        )
        .await;
    assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
    let res = op
        .send(&app, Method::POST, "/api/v1/admin/nodes/gpu-9/cordon", None)
        .await;
    assert_error(res, StatusCode::NOT_FOUND, "not_found").await;
}

/// A poll only notes when its node was heard from; the note is written in a batch, and the
/// leader writes what its server heard before it judges any node silent.
async fn polls_are_recorded_in_batches_before_nodes_are_judged(b: Backend) {
    use autodl_server::clock::Clock;
    let (app, clock) = spawn_app_on_clock(b, |s| s.node_lost_timeout_secs = 30).await;
    let op = app.operator().await;
    let agent = FakeAgent::join(&app, &op, "n1", "A100-40G", "z1").await;
    let t0 = clock.now_ms();
    // The leader has listened since the node joined.
    let mut runner = app.runner();
    runner.cycle(t0).await.unwrap();
    live_until(&mut runner, &clock, t0 + 20_000).await;
    agent.poll(&[], 0).await;
    // 45 s after joining but 25 s after that poll: not silent for the timeout.
    live_until(&mut runner, &clock, t0 + 45_000).await;
    let nodes = op.get(&app, "/api/v1/nodes").await;
    assert_eq!(nodes[0]["schedulable"], true, "{nodes}");
    let stored = app.state.store.list_nodes().await.unwrap();
    assert_eq!(stored[0].last_seen, Some(t0 + 20_000));
    // Silent from then on: judged lost once the timeout has passed since that poll.
    live_until(&mut runner, &clock, t0 + 51_000).await;
    let nodes = op.get(&app, "/api/v1/nodes").await;
    assert_eq!(nodes[0]["schedulable"], false, "lost: {nodes}");
    // Its next poll brings it back at once.
    agent.poll(&[], 0).await;
    let nodes = op.get(&app, "/api/v1/nodes").await;
    assert_eq!(nodes[0]["schedulable"], true, "{nodes}");
}

/// Any request of a node proves it alive, not only its polls: an agent busy reporting between
/// two slow polls (a burst of starts and ends) is not judged lost for it.
async fn a_node_heard_by_its_reports_is_not_judged_lost(b: Backend) {
    use autodl_server::clock::Clock;
    let (app, clock) = spawn_app_on_clock(b, |s| s.node_lost_timeout_secs = 30).await;
    let op = app.operator().await;
    let agent = FakeAgent::join(&app, &op, "n1", "A100-40G", "z1").await;
    let t0 = clock.now_ms();
    let mut runner = app.runner();
    runner.cycle(t0).await.unwrap();
    live_until(&mut runner, &clock, t0 + 20_000).await;
    // A report about a run it does not have is refused, and still heard.
    let res = agent
        .call(
            "/api/v1/agent/tasks/not-a-task/started",
            json!({"attempt": 1}),
        )
        .await;
    assert!(res.status().is_client_error(), "{}", res.status());
    // 45 s without a poll, 25 s after the report: not silent for the timeout.
    live_until(&mut runner, &clock, t0 + 45_000).await;
    let nodes = op.get(&app, "/api/v1/nodes").await;
    assert_eq!(nodes[0]["schedulable"], true, "{nodes}");
    // Silent from then on: lost once the timeout has passed since the report.
    live_until(&mut runner, &clock, t0 + 51_000).await;
    let nodes = op.get(&app, "/api/v1/nodes").await;
    assert_eq!(nodes[0]["schedulable"], false, "lost: {nodes}");
}

/// Starts and ends reported at once by a node's runs are group-committed: each run is marked
/// once, a report repeated within the burst changes nothing, and every answer comes after its
/// commit (what was answered is there).
async fn reports_in_a_burst_are_stored_once_each(b: Backend) {
    let app = spawn_app_with(b, |_| {}).await;
    let op = app.operator().await;
    let s = app.signup("burst@example.com", "Lab").await;
    let agent = FakeAgent::join(&app, &op, "burst-node", "A100", "z1").await;
    let mut runs = Vec::new();
    for i in 0..4 {
        let (id, attempt, _) = agent.placed(&app, &s, spec(&format!("t{i}"), "A100")).await;
        runs.push((id, attempt));
    }
    let agent = std::sync::Arc::new(agent);
    // Every report twice, all at once.
    let burst = |route: &'static str, body: fn(u64) -> Value| {
        let calls: Vec<_> = runs
            .iter()
            .chain(runs.iter())
            .map(|(id, attempt)| {
                let (agent, id, attempt) = (agent.clone(), id.clone(), *attempt);
                tokio::spawn(async move {
                    agent
                        .call(&format!("/api/v1/agent/tasks/{id}/{route}"), body(attempt))
                        .await
                        .status()
                })
            })
            .collect();
        async move {
            let mut statuses = Vec::new();
            for c in calls {
                statuses.push(c.await.unwrap());
            }
            statuses
        }
    };
    let started = burst("started", |attempt| json!({"attempt": attempt})).await;
    assert!(
        started.iter().all(|st| *st == StatusCode::NO_CONTENT),
        "{started:?}"
    );
    // Each task is in `state`, and its events say so once.
    let each_once_in = |state: &'static str| {
        let (s, app, runs) = (&s, &app, &runs);
        async move {
            for (id, _) in runs {
                let t = s.get(app, &format!("/api/v1/tasks/{id}")).await;
                assert_eq!(t["state"], state, "{t}");
                let events = s.get(app, &format!("/api/v1/tasks/{id}/events")).await;
                let told = events
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|e| e["kind"] == state)
                    .count();
                assert_eq!(told, 1, "{events}");
            }
        }
    };
    each_once_in("running").await;
    let ended = burst(
        "finished",
        |attempt| json!({"attempt": attempt, "exit_code": 0, "reason": "success"}),
    )
    .await;
    // The second report of a run is answered as the first (same batch) or as a conflict.
    assert!(
        ended
            .iter()
            .all(|st| *st == StatusCode::NO_CONTENT || *st == StatusCode::CONFLICT),
        "{ended:?}"
    );
    let accepted = ended
        .iter()
        .filter(|st| **st == StatusCode::NO_CONTENT)
        .count();
    assert!(accepted >= runs.len(), "{ended:?}");
    each_once_in("completed").await;
    // The node's GPUs are free again: nothing of the runs is left in the poll's index.
    let work = agent.poll(&[], 0).await;
    assert!(work["assignments"].as_array().unwrap().is_empty(), "{work}");
}

/// An agent killed mid-poll leaves its long poll parked on the server until its wait ends;
/// the restarted agent polls beside it. Work for the node must wake the live poll at once,
/// not whichever poll came first (which would leave the live agent asleep for its whole
/// wait: 19 s from submission to start after every agent restart). Default waits (30 s).
async fn a_restarted_agent_s_poll_is_woken_beside_its_old_one(b: Backend) {
    let app = spawn_app_with(b, |_| {}).await;
    let op = app.operator().await;
    let s = app.signup("restart@example.com", "Lab").await;
    let agent = std::sync::Arc::new(FakeAgent::join(&app, &op, "restarted", "A100", "z").await);
    // The old agent's poll, parked.
    let old = {
        let agent = agent.clone();
        tokio::spawn(async move { agent.poll(&[], 30).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The restarted agent's.
    let live = {
        let agent = agent.clone();
        tokio::spawn(async move { agent.poll(&[], 30).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let res = s
        .send(
            &app,
            Method::POST,
            "/api/v1/tasks",
            Some(spec("wake", "A100")),
        )
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let id = res.json::<Value>().await.unwrap()["id"].clone();
    let submitted = Instant::now();
    let work = tokio::time::timeout(Duration::from_secs(5), live)
        .await
        .expect("the live poll slept through the work")
        .unwrap();
    assert!(
        work["assignments"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["task_id"] == id),
        "{work}"
    );
    eprintln!(
        "submission to the live poll's answer: {:.2} s",
        submitted.elapsed().as_secs_f64()
    );
    old.abort();
}

/// A server that stopped running for 45 s (SIGSTOP, a frozen VM) heard nothing meanwhile: on
/// waking, its nodes are not judged by that silence, but get a whole timeout to be heard, as
/// after a restart. Time here is the clock's: the pause is 45 s of it without a cycle.
async fn a_server_s_own_pause_is_not_its_nodes_silence(b: Backend) {
    use autodl_server::clock::Clock;
    let (app, clock) = spawn_app_on_clock(b, |s| s.node_lost_timeout_secs = 30).await;
    let op = app.operator().await;
    let agent = FakeAgent::join(&app, &op, "n1", "A100-40G", "z1").await;
    let t0 = clock.now_ms();
    let mut runner = app.runner();
    runner.cycle(t0).await.unwrap();
    live_until(&mut runner, &clock, t0 + 10_000).await;
    agent.poll(&[], 0).await;
    // Paused from t0 + 10 s to t0 + 55 s: no cycle, no poll heard.
    clock.set(t0 + 55_000);
    runner.cycle(clock.now_ms()).await.unwrap();
    let nodes = op.get(&app, "/api/v1/nodes").await;
    assert_eq!(
        nodes[0]["schedulable"], true,
        "judged by the server's own pause: {nodes}"
    );
    // The agent is heard again soon after the wake-up: never lost.
    clock.set(t0 + 57_000);
    agent.poll(&[], 0).await;
    live_until(&mut runner, &clock, t0 + 80_000).await;
    let nodes = op.get(&app, "/api/v1/nodes").await;
    assert_eq!(nodes[0]["schedulable"], true, "{nodes}");
    // One that stays silent after the wake-up is lost a timeout after it.
    live_until(&mut runner, &clock, t0 + 120_000).await;
    let nodes = op.get(&app, "/api/v1/nodes").await;
    assert_eq!(nodes[0]["schedulable"], false, "lost: {nodes}");
}
