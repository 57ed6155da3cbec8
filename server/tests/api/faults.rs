//! Faults an operator will meet, each caused for real: an agent killed mid-task, a server
//! killed and down longer than the node timeout. After each, nothing is lost or stuck.

use std::sync::Arc;
use std::time::{Duration, Instant};

use autodl_agent::{IsolationConfig, ProcessRuntime};
use serde_json::json;

use crate::e2e::{agent_binary, log_text, start_agent_configured, submit, wait_for};
use crate::helpers::{spawn_app_with, Backend};

crate::on_both_backends!(
    an_agent_killed_mid_task_leaves_nothing_running,
    a_server_killed_mid_run_loses_nothing,
);

/// Alive and not a zombie.
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next().map(|r| r.trim_start().to_owned()))
        .is_some_and(|rest| !rest.starts_with('Z'))
}

async fn read_pid(path: &std::path::Path) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if let Ok(p) = s.trim().parse() {
                return p;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A child process killed when the test ends, however it ends.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn an_agent_killed_mid_task_leaves_nothing_running(b: Backend) {
    let app = spawn_app_with(b, |_| {}).await;
    let op = app.operator().await;
    let token = app.registration_token(&op, "sim-1").await;
    let state = tempfile::tempdir().unwrap();
    let pids = tempfile::tempdir().unwrap();
    // Unisolated tasks (the agent's own user) are the ones only a record of their process
    // group can find again: isolated ones are found by their uid.
    let agent = |token: Option<&str>| {
        let mut cmd = std::process::Command::new(agent_binary());
        cmd.args(["--server", &app.address, "--node-id", "sim-1"])
            .args(["--simulate", "1xA100-40G", "--runtime", "process"])
            .args([
                "--isolation",
                "off",
                "--metrics-listen",
                "off",
                "--poll-wait",
                "2s",
            ])
            .arg("--state-dir")
            .arg(state.path())
            .env("RUST_LOG", "warn");
        if let Some(t) = token {
            cmd.args(["--token", t]);
        }
        Child(cmd.spawn().unwrap())
    };
    let mut first = agent(Some(&token));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !op
        .get(&app, "/api/v1/nodes")
        .await
        .to_string()
        .contains("sim-1")
    {
        assert!(Instant::now() < deadline, "the agent never joined");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Such a node takes only trusted organizations' tasks unless an administrator opens it.
    let res = op
        .send(
            &app,
            reqwest::Method::POST,
            "/api/v1/admin/nodes/sim-1/open-to-all",
            None,
        )
        .await;
    assert_eq!(res.status(), reqwest::StatusCode::NO_CONTENT);
    let s = app.signup("l@example.com", "Lab").await;
    let command = format!(
        "echo $$ > {}/pid-$AUTODL_ATTEMPT; echo on attempt $AUTODL_ATTEMPT; sleep 120",
        pids.path().display()
    );
    let id = submit(
        &app,
        &s,
        json!({"name": "long", "image": "none", "command": command,
        "resources": {"gpu": {"type": "A100", "count": 1}}}),
    )
    .await;
    wait_for(&app, &s, &id, &["running"], 30).await;
    let old = read_pid(&pids.path().join("pid-1")).await;
    // The agent dies without a word; its task does not.
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    assert!(alive(old), "the task outlives its agent");
    let started = Instant::now();
    let _second = agent(None);
    // The restarted agent stops what it left behind, and its first poll tells the server it
    // no longer runs attempt 1: the task runs again, from the queue, at once.
    let new = read_pid(&pids.path().join("pid-2")).await;
    let took = started.elapsed();
    assert!(!alive(old), "the old attempt was stopped");
    assert!(alive(new));
    assert!(took < Duration::from_secs(20), "back in {took:?}");
    let attempts = s.get(&app, &format!("/api/v1/tasks/{id}/attempts")).await;
    assert_eq!(attempts[0]["reason"], "lost", "{attempts}");
    assert_eq!(attempts[1]["node"], "sim-1");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !log_text(&app, &s, &id).await.contains("on attempt 2") {
        assert!(
            Instant::now() < deadline,
            "attempt 2's output never arrived"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = std::process::Command::new("kill")
        .args(["-9", &new.to_string()])
        .status();
}

async fn a_server_killed_mid_run_loses_nothing(b: Backend) {
    // Nodes are judged lost after 4 s of silence; the server stays down for 6 and cycles
    // every 100 ms once back, before the agent (retrying every 1 to 2.5 s) reaches it.
    let app = spawn_app_with(b, |s| {
        s.node_lost_timeout_secs = 4;
        s.schedule_interval_ms = 100;
    })
    .await;
    let op = app.operator().await;
    let runtime = Arc::new(ProcessRuntime::detect(&IsolationConfig::default()).unwrap());
    let agent = start_agent_configured(&app, &op, "sim-1", "1xA100-40G", runtime, |c| {
        // Polls are short here: a server stopped in-process may leave a held poll hanging
        // where a killed process would have reset the connection.
        c.backoff_initial(Duration::from_secs(2))
            .backoff_max(Duration::from_millis(2500))
            .poll_wait(Duration::from_secs(1))
    })
    .await;
    let s = app.signup("l@example.com", "Lab").await;
    let id = submit(
        &app,
        &s,
        json!({"name": "steady", "image": "none",
        "command": "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo line $i; sleep 1; done",
        "resources": {"gpu": {"type": "A100", "count": 1}}}),
    )
    .await;
    wait_for(&app, &s, &id, &["running"], 30).await;
    app.kill().await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let app = app.restart().await;
    // The agent kept its task running and delivers what it held back: the run completes on
    // its first attempt, with every line, and the node was never judged lost.
    let t = wait_for(&app, &s, &id, &["completed", "failed", "pending"], 60).await;
    let events = s.get(&app, &format!("/api/v1/tasks/{id}/events")).await;
    assert_eq!(t["state"], "completed", "{events}");
    assert_eq!(t["attempts"], 1, "{t}");
    let log = log_text(&app, &s, &id).await;
    for i in 1..=12 {
        assert!(
            log.contains(&format!("line {i}")),
            "line {i} missing: {log}"
        );
    }
    let events = s.get(&app, &format!("/api/v1/tasks/{id}/events")).await;
    assert!(
        !events.to_string().contains("node_lost"),
        "the restarted server judged the node lost: {events}"
    );
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}
