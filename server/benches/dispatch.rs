//! Time from a task's submission to its process starting on an idle agent (simulated GPUs,
//! process runtime), measured from the server's own timestamps: the task's creation and the
//! `running` event recorded when the agent reports the process started.
//!
//!   cargo bench -p autodl-server --bench dispatch     (AUTODL_BENCH_TASKS, default 50)

use std::time::Duration;

use autodl_agent::CancellationToken;
use serde_json::{json, Value};

mod support;
use support::env_num;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n = env_num("AUTODL_BENCH_TASKS", 50) as usize;
    let server = support::start().await?;
    let (base, state) = (server.base.clone(), server.state.clone());
    let shutdown = CancellationToken::new();
    let agents = autodl_server::demo::start_agents(
        &state,
        &server.dir.path().join("agents"),
        shutdown.clone(),
    )
    .await?;
    let http = reqwest::Client::new();
    let user: Value = http
        .post(format!("{base}/api/v1/auth/signup"))
        .json(&json!({"email": "ada@example.com", "password": "Bench-passw0rd", "tenant_name": "Lab"}))
        .send()
        .await?
        .json()
        .await?;
    let token = user["token"].as_str().unwrap_or_default().to_owned();
    // Wait for both agents to register and settle into their long polls.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let mut delays = Vec::with_capacity(n);
    for i in 0..n {
        let t: Value = http
            .post(format!("{base}/api/v1/tasks"))
            .bearer_auth(&token)
            .json(&json!({"name": format!("d{i}"), "image": "none", "command": "true", "resources": {"gpu": {"count": 1}}}))
            .send()
            .await?
            .json()
            .await?;
        let id = t["id"].as_str().unwrap_or_default().to_owned();
        let task = loop {
            let rec = state
                .store
                .task(None, &id)
                .await?
                .ok_or_else(|| anyhow::anyhow!("task vanished"))?;
            if rec.task.state.is_finished() {
                break rec;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let events = state.store.task_events(&id).await?;
        let started = events
            .iter()
            .find(|e| e.kind == "running")
            .map(|e| e.at)
            .unwrap_or(task.task.created_at);
        delays.push((started - task.task.created_at) as f64);
        // Let the agents return to an idle long poll, as a fresh submission would find them.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    delays.sort_by(f64::total_cmp);
    let pct = |p: f64| delays[((delays.len() as f64 - 1.0) * p).round() as usize];
    println!(
        "submission -> process started on an idle agent, {n} tasks: p50 {:.0} ms, p95 {:.0} ms, max {:.0} ms",
        pct(0.5),
        pct(0.95),
        delays[delays.len() - 1]
    );
    shutdown.cancel();
    drop(agents);
    Ok(())
}
