//! A run that ends while the server or object storage is away keeps its results: the agent
//! holds them (with the last checkpoint and the end report) on the node's disk until the
//! server has them, across its own restarts, for a configured time. They used to be lost
//! after ~15 s of retries: the task ended COMPLETED and its results answered 404.

use std::sync::Arc;
use std::time::{Duration, Instant};

use autodl_agent::{
    Agent, AgentConfig, CancellationToken, IsolationConfig, ProcessRuntime, SimulatedBackend,
};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::e2e::{start_agent_configured, submit, wait_for};
use crate::helpers::{spawn_app_with, Backend, Session, SmallDisk, TestApp};

crate::on_both_backends!(results_made_while_the_server_is_away_reach_it_later);

/// A run that saves a checkpoint and results and ends a few seconds after it starts.
fn saving_task(name: &str, gpu: &str) -> Value {
    json!({"name": name, "image": "none",
           "command": "echo step-7 > \"$AUTODL_CHECKPOINT_DIR/ckpt.txt\"; sleep 3; echo the-answer > \"$AUTODL_RESULTS_DIR/answer.txt\"; echo work-done",
           "checkpoint": {"interval": "10m"},
           "resources": {"gpu": {"type": gpu, "count": 1}}})
}

/// The ended attempts an agent keeps in its outbox.
fn kept(state_dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(state_dir.join("outbox"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().join("kept.json").exists())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The task's timeline, as one text.
async fn timeline(app: &TestApp, s: &Session, id: &str) -> String {
    s.get(app, &format!("/api/v1/tasks/{id}/events"))
        .await
        .to_string()
}

/// Asserts the timeline says `what`.
async fn assert_said(app: &TestApp, s: &Session, id: &str, what: &str) {
    let events = timeline(app, s, id).await;
    assert!(events.contains(what), "not said: {what:?} in {events}");
}

/// Waits until the task's `results` is `want` (`None`: simply there); returns the task.
async fn wait_for_results(app: &TestApp, s: &Session, id: &str, want: Option<&str>) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let t = s.get(app, &format!("/api/v1/tasks/{id}")).await;
        if t["results"].as_str() == want {
            return t;
        }
        assert!(Instant::now() < deadline, "results never {want:?}: {t}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Waits until the agent keeps nothing more (the server has it all).
async fn wait_until_nothing_kept(state_dir: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !kept(state_dir).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the node still keeps what the server has"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The results' refusal: its status and message.
async fn results_refusal(app: &TestApp, s: &Session, id: &str) -> (StatusCode, String) {
    let (code, body) = results_status(app, s, id).await;
    let body: Value = serde_json::from_slice(&body).unwrap();
    (
        code,
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

async fn results_status(app: &TestApp, s: &Session, id: &str) -> (StatusCode, Vec<u8>) {
    let r = s
        .send(
            app,
            Method::GET,
            &format!("/api/v1/tasks/{id}/results"),
            None,
        )
        .await;
    (r.status(), r.bytes().await.unwrap().to_vec())
}

/// The task's results hold `answer.txt` as the run wrote it.
async fn assert_results(app: &TestApp, s: &Session, id: &str) {
    let (code, body) = results_status(app, s, id).await;
    assert_eq!(code, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let mut archive = tar::Archive::new(body.as_slice());
    let mut found = false;
    for e in archive.entries().unwrap() {
        let mut e = e.unwrap();
        if e.path().unwrap().display().to_string() == "answer.txt" {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut e, &mut text).unwrap();
            assert_eq!(text, "the-answer\n");
            found = true;
        }
    }
    assert!(found, "answer.txt is not among the results");
}

/// The server is killed while the task runs and stays down 40 s: the run ends meanwhile, the
/// agent's uploads give up their retries, and the agent itself is restarted while the server
/// is still away. When the server is back, the task completes on its first attempt with its
/// results and last checkpoint, and the node keeps nothing more.
async fn results_made_while_the_server_is_away_reach_it_later(b: Backend) {
    let app = spawn_app_with(b, |_| {}).await;
    let op = app.operator().await;
    let runtime = Arc::new(ProcessRuntime::detect(&IsolationConfig::default()).unwrap());
    let mut agent =
        start_agent_configured(&app, &op, "sim-1", "1xA100-40G", runtime.clone(), |c| {
            // Polls are short here: a server stopped in-process may leave a held poll hanging
            // where a killed process would have reset the connection.
            c.poll_wait(Duration::from_secs(1))
        })
        .await;
    let s = app.signup("keep@example.com", "Lab").await;
    let id = submit(&app, &s, saving_task("ends-while-away", "A100")).await;
    wait_for(&app, &s, &id, &["running"], 30).await;
    app.kill().await;
    let down = Instant::now();

    // The run ends and is kept on the node.
    while kept(&agent.state_dir).is_empty() {
        assert!(
            down.elapsed() < Duration::from_secs(30),
            "the ended run was never kept"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Past the agent's retries (about 15 s with the default backoff), then the agent restarts.
    tokio::time::sleep(Duration::from_secs(25)).await;
    agent.shutdown.cancel();
    (&mut agent.handle).await.unwrap();
    assert_eq!(
        kept(&agent.state_dir).len(),
        1,
        "the restart lost what was kept"
    );
    let config = AgentConfig::new(app.address.clone())
        .node_id("sim-1")
        .zone("z1")
        .state_dir(agent.state_dir.clone())
        .cpu(16)
        .memory(64 << 30)
        .sample_interval(Duration::from_millis(300))
        .shutdown_grace(Duration::from_secs(2))
        .poll_wait(Duration::from_secs(1));
    let again = Agent::new(
        config,
        Arc::new(SimulatedBackend::from_spec("1xA100-40G", 7).unwrap()),
        runtime,
    )
    .unwrap();
    let stop = CancellationToken::new();
    let handle = tokio::spawn({
        let stop = stop.clone();
        async move {
            let _ = again.run(stop).await;
        }
    });
    let wait = Duration::from_secs(40).saturating_sub(down.elapsed());
    tokio::time::sleep(wait).await;
    let app = app.restart().await;

    let t = wait_for(&app, &s, &id, &["completed", "failed", "pending"], 60).await;
    let events = timeline(&app, &s, &id).await;
    assert_eq!(t["state"], "completed", "{events}");
    assert_eq!(t["attempts"], 1, "ran twice: {events}");
    // Its results arrive (at once, or after "uploading" while the node sends them).
    wait_for_results(&app, &s, &id, None).await;
    assert_results(&app, &s, &id).await;
    let checkpoints = s
        .get(&app, &format!("/api/v1/tasks/{id}/checkpoints"))
        .await;
    assert_eq!(
        checkpoints.as_array().map(Vec::len),
        Some(1),
        "the last checkpoint was lost: {checkpoints}"
    );
    wait_until_nothing_kept(&agent.state_dir).await;
    let events = timeline(&app, &s, &id).await;
    assert!(
        !events.contains("node_lost") && !events.contains("retrying"),
        "{events}"
    );
    stop.cancel();
    let _ = handle.await;
}

/// Object storage is full for 45 s when runs end. The first run's task completes at once (its
/// GPU is free for the next), says its results are uploading, and answers a clear 409 for
/// them meanwhile; once storage has room they are stored and the timeline says so. On a
/// second node that keeps results only 5 s, a run's results are given up instead, and its
/// task says plainly that they could not be kept (404 with why), never a silent 404.
#[tokio::test]
async fn results_wait_out_full_storage_or_are_said_lost() {
    let Some(disk) = SmallDisk::mount("8m") else {
        crate::helpers::skip("mounting a small filesystem needs root (CI runs as root)");
        return;
    };
    let url = format!("file://{}/objects", disk.path.display());
    let app = spawn_app_with(Backend::Sqlite, |s| s.storage_url = url).await;
    let op = app.operator().await;
    let runtime = Arc::new(ProcessRuntime::detect(&IsolationConfig::default()).unwrap());
    let patient =
        start_agent_configured(&app, &op, "sim-1", "1xA100-40G", runtime.clone(), |c| c).await;
    let s = app.signup("full@example.com", "Lab").await;
    let filler = disk.fill();
    let full = Instant::now();
    let id = submit(&app, &s, saving_task("ends-on-full-storage", "A100")).await;

    let t = wait_for(&app, &s, &id, &["completed", "failed"], 90).await;
    assert_eq!(t["state"], "completed", "{t}");
    assert_eq!(t["results"], "uploading", "{t}");
    assert_said(
        &app,
        &s,
        &id,
        "its results are uploading: node sim-1 keeps them",
    )
    .await;
    let (code, message) = results_refusal(&app, &s, &id).await;
    assert_eq!(code, StatusCode::CONFLICT);
    assert!(message.contains("still uploading"), "{message}");
    assert_eq!(kept(&patient.state_dir).len(), 1);

    // Room again after 45 s: the node uploads what it kept.
    tokio::time::sleep(Duration::from_secs(45).saturating_sub(full.elapsed())).await;
    std::fs::remove_file(&filler).unwrap();
    let t = wait_for_results(&app, &s, &id, None).await;
    assert_results(&app, &s, &id).await;
    assert_said(
        &app,
        &s,
        &id,
        "results saved from node sim-1 after the run ended",
    )
    .await;
    assert_eq!(t["attempts"], 1);
    wait_until_nothing_kept(&patient.state_dir).await;
    patient.shutdown.cancel();
    let _ = patient.handle.await;

    // A node that keeps results 5 s: full storage outlasts that, and the task says so.
    let brief = start_agent_configured(&app, &op, "sim-2", "1xA40", runtime, |c| {
        c.keep_results_for(Duration::from_secs(5))
    })
    .await;
    let filler = disk.fill();
    let lost = submit(&app, &s, saving_task("outlasted", "A40")).await;
    wait_for(&app, &s, &lost, &["completed", "failed"], 90).await;
    let t = wait_for_results(&app, &s, &lost, Some("lost")).await;
    assert_eq!(t["state"], "completed");
    let (code, message) = results_refusal(&app, &s, &lost).await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    assert!(message.contains("could not be kept"), "{message}");
    assert_said(
        &app,
        &s,
        &lost,
        "kept them for 5s without the server and storage taking them",
    )
    .await;
    assert!(
        kept(&brief.state_dir).is_empty(),
        "given-up results still on the node"
    );
    std::fs::remove_file(filler).unwrap();
    brief.shutdown.cancel();
    let _ = brief.handle.await;
    app.kill().await;
}

/// The server bounds "uploading" by itself: results a node said it kept, and never sent nor
/// gave up (the node was wiped, or removed), are given up a week after the run's end, and the
/// task says why. Only a node that ran the attempt may say they are lost.
#[tokio::test]
async fn results_a_node_never_sends_are_given_up_after_a_week() {
    use crate::agents::FakeAgent;
    let app = spawn_app_with(Backend::Sqlite, |s| s.run_scheduler = true).await;
    let op = app.operator().await;
    let agent = FakeAgent::join(&app, &op, "wiped-1", "A100-40G", "z1").await;
    let other = FakeAgent::join(&app, &op, "other-1", "A40", "z1").await;
    let s = app.signup("week@example.com", "Lab").await;
    let id = submit(&app, &s, saving_task("never-sent", "A100")).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let attempt = loop {
        let work = agent.poll(&[], 2).await;
        if let Some(a) = work["assignments"].as_array().and_then(|a| a.first()) {
            break a["attempt"].as_u64().unwrap();
        }
        assert!(Instant::now() < deadline, "never assigned");
    };
    for (what, body) in [
        ("started", json!({"attempt": attempt})),
        (
            "finished",
            json!({"attempt": attempt, "exit_code": 0, "reason": "success", "uploading": ["results"]}),
        ),
    ] {
        let r = agent
            .call(&format!("/api/v1/agent/tasks/{id}/{what}"), body)
            .await;
        assert!(r.status().is_success(), "{what}: {}", r.status());
    }
    let t = s.get(&app, &format!("/api/v1/tasks/{id}")).await;
    assert_eq!(
        (t["state"].as_str(), t["results"].as_str()),
        (Some("completed"), Some("uploading"))
    );
    // A node that did not run it cannot say they are lost.
    let r = other
        .call(
            &format!("/api/v1/agent/tasks/{id}/not-kept"),
            json!({"attempt": attempt, "kind": "results", "reason": "x"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let r = agent
        .call(
            &format!("/api/v1/agent/tasks/{id}/not-kept"),
            json!({"attempt": attempt, "kind": "everything", "reason": "x"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);

    // Six days on: still waiting. Eight: given up, and said.
    let now = app.state.clock.now_ms();
    let sweep = |at: i64| {
        autodl_server::scheduling::housekeeping::run(
            &app.state.store,
            &app.state.storage,
            &app.state.settings,
            at,
        )
    };
    sweep(now + 6 * 86_400_000).await.unwrap();
    let t = s.get(&app, &format!("/api/v1/tasks/{id}")).await;
    assert_eq!(t["results"], "uploading", "{t}");
    sweep(now + 8 * 86_400_000).await.unwrap();
    let t = s.get(&app, &format!("/api/v1/tasks/{id}")).await;
    assert_eq!(t["results"], "lost", "{t}");
    assert_said(&app, &s, &id, "did not upload them within 7 days").await;
    let (code, _) = results_refusal(&app, &s, &id).await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    app.kill().await;
}
