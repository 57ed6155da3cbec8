//! Checkpoint numbers against a local S3 server (s3s-fs in process, signatures checked):
//!
//! 1. upload throughput of a 1 GB checkpoint folder (4 files of 256 MB) the way an agent sends
//!    it: the agent library's `upload_folder` → the server's agent API → aws-sdk-s3 multipart
//!    uploads; and, for comparison, the same gigabyte written straight to S3 by the server's
//!    storage layer;
//! 2. the time from a preemption (the node is drained) to the task running again from its
//!    checkpoint on the demo agents (simulated GPUs, tasks as processes), with a 64 MB
//!    checkpoint.
//!
//!   cargo bench -p autodl-server --bench checkpoint
//!   (AUTODL_BENCH_CKPT_MB, default 1024; AUTODL_BENCH_ROUNDS, default 5)

use std::time::{Duration, Instant};

use autodl_agent::artifacts::{upload_folder, UploadRequest};
use autodl_agent::backoff::Backoff;
use autodl_agent::client::ServerClient;
use autodl_agent::CancellationToken;
use autodl_common::tasks::TaskState;
use serde_json::{json, Value};

mod support;
use support::env_num;

#[path = "../tests/support/s3_server.rs"]
#[allow(dead_code)]
mod s3_server;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mb = env_num("AUTODL_BENCH_CKPT_MB", 1024);
    let rounds = env_num("AUTODL_BENCH_ROUNDS", 5) as usize;
    let s3 = s3_server::start(&["autodl"]).await;
    let endpoint = s3.endpoint.clone();
    let server = support::start_with(|s| s3_server::configure(s, &endpoint, "autodl")).await?;
    let (base, state) = (server.base.clone(), server.state.clone());
    let http = reqwest::Client::new();

    // An operator, a node registered over the agent API, a researcher's task placed on it.
    let op_token = support::operator(&server, &http).await?;
    let reg: Value = http
        .post(format!("{base}/api/v1/admin/registration-tokens"))
        .bearer_auth(&op_token)
        .json(&json!({"name": "bench"}))
        .send()
        .await?
        .json()
        .await?;
    let gpus = json!([{"index": 0, "type": "A100-40G", "memory": 42949672960u64}]);
    let node: Value = http
        .post(format!("{base}/api/v1/agent/register"))
        .json(&json!({"token": reg["token"], "node": {"id": "bench-node", "cpu": 32, "memory": 274877906944u64, "gpus": gpus}}))
        .send()
        .await?
        .json()
        .await?;
    let cred = node["credential"].as_str().unwrap_or_default().to_owned();
    let user = support::signup(&http, &base, "ada@example.com", "Lab").await?;
    let token = user["token"].as_str().unwrap_or_default().to_owned();
    let task: Value = http
        .post(format!("{base}/api/v1/tasks"))
        .bearer_auth(&token)
        .json(&json!({"name": "big", "image": "none", "command": "train", "resources": {"gpu": {"count": 1}},
                      "checkpoint": {"interval": 600, "keep": 1}}))
        .send()
        .await?
        .json()
        .await?;
    let task_id = task["id"].as_str().unwrap_or_default().to_owned();
    let attempt = loop {
        let work: Value = http
            .post(format!("{base}/api/v1/agent/poll?wait=2"))
            .bearer_auth(&cred)
            .json(&json!({}))
            .send()
            .await?
            .json()
            .await?;
        if let Some(a) = work["assignments"].as_array().and_then(|a| a.first()) {
            break a["attempt"].as_u64().unwrap_or(1) as u32;
        }
    };
    http.post(format!("{base}/api/v1/agent/tasks/{task_id}/started"))
        .bearer_auth(&cred)
        .json(&json!({"attempt": attempt}))
        .send()
        .await?
        .error_for_status()?;

    // The checkpoint folder: 4 files of mb/4 MB each.
    let dir = tempfile::tempdir()?;
    let ckpt = dir.path().join("ckpt");
    std::fs::create_dir_all(&ckpt)?;
    let per_file = (mb << 20) / 4;
    for i in 0..4u8 {
        let block: Vec<u8> = (0..1u32 << 20)
            .map(|j| (j as u8) ^ i.wrapping_mul(37))
            .collect();
        let mut f = std::fs::File::create(ckpt.join(format!("shard-{i}.pt")))?;
        for _ in 0..per_file >> 20 {
            std::io::Write::write_all(&mut f, &block)?;
        }
    }
    let total = per_file * 4;
    let client = ServerClient::new(&base)?;
    client.set_credential(Some(cred.clone()));
    let mut throughputs = Vec::new();
    for round in 0..rounds.clamp(1, 3) {
        let mut backoff = Backoff::new(
            Duration::from_millis(200),
            Duration::from_secs(5),
            round as u64,
        );
        let t = Instant::now();
        let up = upload_folder(
            &client,
            UploadRequest {
                task_id: &task_id,
                attempt,
                kind: "checkpoint",
                dir: &ckpt,
                staging: &dir.path().join("staging"),
                step: Some(round as i64),
                epoch: None,
                owner: None,
            },
            &mut backoff,
            &CancellationToken::new(),
        )
        .await?
        .ok_or_else(|| anyhow::anyhow!("nothing uploaded"))?;
        let secs = t.elapsed().as_secs_f64();
        anyhow::ensure!(up.bytes == total, "uploaded {} of {total} bytes", up.bytes);
        throughputs.push(total as f64 / 1e6 / secs);
        println!(
            "checkpoint upload {round}: {:.0} MB in {secs:.1} s = {:.0} MB/s (agent → server → S3 multipart)",
            total as f64 / 1e6,
            total as f64 / 1e6 / secs
        );
    }
    // The storage layer alone, from memory.
    let block = actix_web::web::Bytes::from(vec![7u8; 1 << 20]);
    let t = Instant::now();
    let mut up = state
        .storage
        .backend
        .start_upload("autodl", "bench/direct.bin")
        .await?;
    for _ in 0..total >> 20 {
        up.write(block.clone()).await?;
    }
    up.finish().await?;
    let direct = total as f64 / 1e6 / t.elapsed().as_secs_f64();
    throughputs.sort_by(f64::total_cmp);
    println!(
        "=> {:.0} MB checkpoint: median {:.0} MB/s through the server; {direct:.0} MB/s straight from the storage layer to S3",
        total as f64 / 1e6,
        throughputs[throughputs.len() / 2]
    );

    // 2. Preemption → running again from the checkpoint, on the demo agents.
    let shutdown = CancellationToken::new();
    let agents = autodl_server::demo::start_agents(
        &state,
        &server.dir.path().join("agents"),
        shutdown.clone(),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let script = r#"
if [ "$AUTODL_IS_RESTORED" = 1 ]; then echo "resumed at $(cat "$AUTODL_RESTORE_PATH/step")"; fi
trap 'echo 7 > "$AUTODL_CHECKPOINT_DIR/step"; exit 0' TERM
head -c 67108864 /dev/zero > "$AUTODL_CHECKPOINT_DIR/weights.bin"
echo 1 > "$AUTODL_CHECKPOINT_DIR/step"
echo '{"step": 1}' > "$AUTODL_CHECKPOINT_DIR/.autodl-save"
while true; do sleep 0.1; done
"#;
    let task: Value = http
        .post(format!("{base}/api/v1/tasks"))
        .bearer_auth(&token)
        .json(&json!({"name": "preempt-me", "image": "none", "command": script, "resources": {"gpu": {"count": 1}},
                      "checkpoint": {"interval": 600, "keep": 2}}))
        .send()
        .await?
        .json()
        .await?;
    let id = task["id"].as_str().unwrap_or_default().to_owned();
    let mut delays = Vec::new();
    for round in 0..rounds {
        // Running, with a checkpoint saved.
        let node = loop {
            let t = state
                .store
                .task(None, &id)
                .await?
                .ok_or_else(|| anyhow::anyhow!("gone"))?;
            let saved = !state
                .store
                .task_artifacts(&id, autodl_server::domain::ArtifactKind::Checkpoint)
                .await?
                .is_empty();
            if t.task.state == TaskState::Running && saved {
                break t
                    .task
                    .placement
                    .0
                    .clone()
                    .and_then(|p| p.first().map(|w| w.node.clone()))
                    .unwrap_or_default();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let before = state.store.task_attempts(&id).await?.len();
        let t0 = autodl_server::clock::Clock::now_ms(&autodl_server::clock::SystemClock);
        http.post(format!("{base}/api/v1/admin/nodes/{node}/drain"))
            .bearer_auth(&op_token)
            .send()
            .await?
            .error_for_status()?;
        // Running again: the next attempt's `running` event (after its restore).
        let started = loop {
            let attempts = state.store.task_attempts(&id).await?;
            if attempts.len() > before {
                let events = state.store.task_events(&id).await?;
                if let Some(e) = events
                    .iter()
                    .rev()
                    .find(|e| e.kind == "running" && e.at > t0)
                {
                    break e.at;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        delays.push((started - t0) as f64 / 1000.0);
        println!(
            "preemption {round}: running again from the checkpoint after {:.2} s",
            (started - t0) as f64 / 1000.0
        );
        http.post(format!("{base}/api/v1/admin/nodes/{node}/uncordon"))
            .bearer_auth(&op_token)
            .send()
            .await?
            .error_for_status()?;
        // Let the new attempt save its first checkpoint before the next round.
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    let logs: Value = http
        .get(format!("{base}/api/v1/tasks/{id}/logs"))
        .bearer_auth(&token)
        .send()
        .await?
        .json()
        .await?;
    let resumed = logs["lines"].as_array().map_or(0, |l| {
        l.iter()
            .filter(|l| {
                l["line"]
                    .as_str()
                    .is_some_and(|s| s.starts_with("resumed at 7"))
            })
            .count()
    });
    anyhow::ensure!(
        resumed >= rounds,
        "only {resumed} of {rounds} attempts resumed from the checkpoint"
    );
    delays.sort_by(f64::total_cmp);
    println!(
        "=> preemption → running from a 64 MB checkpoint on the demo agents ({rounds} rounds, grace as configured): median {:.2} s, max {:.2} s",
        delays[delays.len() / 2],
        delays[delays.len() - 1]
    );
    shutdown.cancel();
    drop(agents);
    Ok(())
}
