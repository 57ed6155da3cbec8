//! End-to-end submission throughput: 64 concurrent HTTP clients submit tasks with an API key
//! for a fixed time; every task is stored and the live scheduler considers it.
//!
//!   cargo bench -p autodl-server --bench submit                 # SQLite
//!   AUTODL_BENCH_PG_URL=postgres://... cargo bench -p autodl-server --bench submit
//!
//! Options (environment): AUTODL_BENCH_CLIENTS (64), AUTODL_BENCH_SECS (10).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use autodl_common::tasks::TaskState;
use serde_json::{json, Value};

mod support;
use support::{env_num, percentile};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let clients = env_num("AUTODL_BENCH_CLIENTS", 64);
    let secs = env_num("AUTODL_BENCH_SECS", 10);
    let server = support::start().await?;
    let (base, backend, state) = (server.base.clone(), server.backend, server.state.clone());

    // An operator with two nodes, and a researcher with an API key.
    let http = reqwest::Client::new();
    let op_token = support::operator(&server, &http).await?;
    for (id, t) in [("node-a", "A100-40G"), ("node-b", "A40")] {
        http.post(format!("{base}/api/v1/admin/nodes"))
            .bearer_auth(&op_token)
            .json(&json!({"id": id, "cpu": 64, "memory": "512GiB", "gpus": {"type": t, "count": 8, "memory": "40GiB"}}))
            .send()
            .await?
            .error_for_status()?;
    }
    let user = support::signup(&http, &base, "ada@example.com", "Lab").await?;
    let key: Value = http
        .post(format!("{base}/api/v1/api-keys"))
        .bearer_auth(user["token"].as_str().unwrap_or_default())
        .json(&json!({"name": "bench"}))
        .send()
        .await?
        .json()
        .await?;
    let key = key["key"].as_str().unwrap_or_default().to_owned();

    let failed = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let mut workers = Vec::new();
    for c in 0..clients {
        let (http, base, key, failed) = (
            reqwest::Client::new(),
            base.clone(),
            key.clone(),
            failed.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut i = 0u64;
            let mut latencies = Vec::new();
            // The load generator shares the server's two cores: it formats each body from a
            // template instead of building a JSON value, as a load tool would.
            let url = format!("{base}/api/v1/tasks");
            let auth = format!("Bearer {key}");
            while Instant::now() < deadline {
                let body = format!(
                    r#"{{"name":"bench-{c}-{i}","image":"pytorch:2","command":"python train.py","resources":{{"gpu":{{"type":"A100","count":1,"memory":"10GiB"}}}}}}"#
                );
                let sent_at = Instant::now();
                let sent = http
                    .post(&url)
                    .header("authorization", &auth)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await;
                match sent {
                    Ok(r) if r.status().as_u16() == 201 => {
                        latencies.push(sent_at.elapsed().as_secs_f64())
                    }
                    _ => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                i += 1;
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for w in workers {
        latencies.extend(w.await?);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let n = latencies.len();

    // Considered by the scheduler: every stored task is placed or has an explanation.
    let considered_by = Instant::now();
    loop {
        let active = state.store.active_tasks().await?;
        let unexplained = active
            .iter()
            .filter(|t| t.state == TaskState::Pending && t.waiting.is_none())
            .count();
        if unexplained == 0 || considered_by.elapsed() > Duration::from_secs(60) {
            println!(
                "backend={backend} clients={clients} submitted={n} failed={} elapsed={elapsed:.1}s rate={:.0}/s \
                 latency p50={:.1}ms p99={:.1}ms p99.9={:.1}ms max={:.1}ms; \
                 scheduler caught up {:.2}s after the last submission ({} unexplained)",
                failed.load(Ordering::Relaxed),
                n as f64 / elapsed,
                percentile(&mut latencies, 50.0) * 1000.0,
                percentile(&mut latencies, 99.0) * 1000.0,
                percentile(&mut latencies, 99.9) * 1000.0,
                latencies.iter().copied().fold(0.0, f64::max) * 1000.0,
                considered_by.elapsed().as_secs_f64(),
                unexplained
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
