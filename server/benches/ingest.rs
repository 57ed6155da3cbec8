//! GPU metric ingestion throughput: agents post batches of samples (one sample = one GPU's
//! values at one instant) over HTTP; every sample is validated and stored.
//!
//!   cargo bench -p autodl-server --bench ingest                 # SQLite
//!   AUTODL_BENCH_PG_URL=postgres://... cargo bench -p autodl-server --bench ingest
//!
//! Options (environment): AUTODL_BENCH_CLIENTS (8 agents), AUTODL_BENCH_SECS (10),
//! AUTODL_BENCH_BATCH (2000 samples a request).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod support;
use support::env_num;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let clients = env_num("AUTODL_BENCH_CLIENTS", 8);
    let secs = env_num("AUTODL_BENCH_SECS", 10);
    let batch = env_num("AUTODL_BENCH_BATCH", 2000) as usize;
    let server = support::start().await?;
    let (base, backend) = (server.base.clone(), server.backend);

    let http = reqwest::Client::new();
    let op_token = support::operator(&server, &http).await?;
    let token: Value = http
        .post(format!("{base}/api/v1/admin/registration-tokens"))
        .bearer_auth(&op_token)
        .json(&json!({}))
        .send()
        .await?
        .json()
        .await?;

    let sent = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let mut workers = Vec::new();
    for c in 0..clients {
        let gpus: Vec<Value> = (0..8)
            .map(|i| json!({"index": i, "type": "A100-40G", "memory": 42949672960u64}))
            .collect();
        let reg: Value = http
            .post(format!("{base}/api/v1/agent/register"))
            .json(&json!({"token": token["token"], "node": {"id": format!("node-{c}"), "cpu": 64, "memory": 1u64 << 39, "gpus": gpus}}))
            .send()
            .await?
            .json()
            .await?;
        let credential = reg["credential"].as_str().unwrap_or_default().to_owned();
        let (base, sent) = (base.clone(), sent.clone());
        workers.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            while Instant::now() < deadline {
                let now = time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339).unwrap_or_default();
                let samples: Vec<Value> = (0..batch)
                    .map(|i| json!({"at": now, "gpu_index": i % 8, "util": 0.9, "mem_used": 1u64 << 30, "mem_total": 42949672960u64,
                                    "temperature": 60.0, "power_w": 250.0}))
                    .collect();
                let r = http.post(format!("{base}/api/v1/agent/metrics")).bearer_auth(&credential).json(&json!({"samples": samples})).send().await;
                if matches!(r, Ok(ref r) if r.status().as_u16() == 204) {
                    sent.fetch_add(batch as u64, Ordering::Relaxed);
                }
            }
        }));
    }
    for w in workers {
        w.await?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let n = sent.load(Ordering::Relaxed);
    println!("backend={backend} agents={clients} batch={batch} samples={n} elapsed={elapsed:.1}s rate={:.0} samples/s", n as f64 / elapsed);
    Ok(())
}
