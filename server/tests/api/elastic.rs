//! An elastic gang for real: PyTorch DDP workers (Debian's `python3-torch`, CPU, gloo) whose
//! task asks for 2 to 4 workers on a node of four GPUs. It starts with the two GPUs another
//! task leaves, grows to four when that task ends, shrinks back to two when a task of higher
//! priority arrives, and its loss curve goes on across both changes from rank 0's checkpoint.
//!
//! The policy's guards against thrashing are shortened here (a resize is allowed 5 s after a
//! start, a restart counts as costing nothing beyond the work since the checkpoint, a run may
//! be shrunk at once) so that the whole story fits in a minute, and the declared priority
//! alone (1.0 against 0.3, worth 0.0625 of the total) is made enough to take GPUs; the
//! decisions under the production values are the scheduler's tests and the replay's.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::e2e::{start_agent, submit, wait_for};
use crate::gangs::torch_python;
use crate::helpers::{spawn_app_with, Backend, Session, TestApp};

/// DDP on data of each rank's own, `AUTODL_BATCH_SIZE` samples a step (its share of the
/// global batch). Rank 0 saves a checkpoint every 10 steps (model, optimiser, step) and tells
/// the agent to upload it; every rank resumes from it. Rank 0 prints each step's loss,
/// averaged over the group.
const TRAIN: &str = r#"
import json, os, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
assert world == int(os.environ["AUTODL_NUM_WORKERS"]), (world, os.environ["AUTODL_NUM_WORKERS"])
batch = int(os.environ["AUTODL_BATCH_SIZE"])
torch.manual_seed(0)
net = torch.nn.Linear(10, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.02)
start = 0
restore = os.environ.get("AUTODL_RESTORE_PATH")
if restore and os.path.exists(os.path.join(restore, "model.pt")):
    saved = torch.load(os.path.join(restore, "model.pt"))
    net.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    start = saved["step"]
    if rank == 0:
        print(f"resumed from step {start}", flush=True)
model = DDP(net)
folder = os.environ["AUTODL_CHECKPOINT_DIR"]
target = torch.arange(10.0).unsqueeze(1)
steps = int(os.environ["STEPS"])
for step in range(start, steps):
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(batch, 10, generator=g)
    opt.zero_grad()
    loss = ((model(x) - x @ target) ** 2).mean()
    loss.backward()
    opt.step()
    mean = torch.tensor([loss.item()])
    dist.all_reduce(mean)
    if rank == 0:
        print(f"STEP {step + 1} world={world} batch={batch} loss={mean.item() / world:.5f}", flush=True)
        if (step + 1) % 10 == 0:
            state = {"model": net.state_dict(), "opt": opt.state_dict(), "step": step + 1}
            torch.save(state, os.path.join(folder, "model.tmp"))
            os.replace(os.path.join(folder, "model.tmp"), os.path.join(folder, "model.pt"))
            with open(os.path.join(folder, ".autodl-save"), "w") as f:
                json.dump({"step": step + 1}, f)
    time.sleep(0.2)
dist.destroy_process_group()
"#;

/// One `STEP` line: (attempt, step, world, batch, loss).
type Step = (i64, u32, u32, u32, f64);

async fn steps(app: &TestApp, s: &Session, id: &str) -> (Vec<Step>, Vec<(i64, u32)>) {
    let logs = s
        .get(app, &format!("/api/v1/tasks/{id}/logs?limit=5000"))
        .await;
    let mut steps = Vec::new();
    let mut resumed = Vec::new();
    for l in logs["lines"].as_array().unwrap() {
        let attempt = l["attempt"].as_i64().unwrap();
        let line = l["line"].as_str().unwrap_or_default();
        if let Some(rest) = line.strip_prefix("resumed from step ") {
            resumed.push((attempt, rest.trim().parse().unwrap()));
        }
        let Some(rest) = line.strip_prefix("STEP ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let step: u32 = parts.next().unwrap().parse().unwrap();
        let kv: BTreeMap<&str, &str> = parts.filter_map(|p| p.split_once('=')).collect();
        steps.push((
            attempt,
            step,
            kv["world"].parse().unwrap(),
            kv["batch"].parse().unwrap(),
            kv["loss"].parse().unwrap(),
        ));
    }
    (steps, resumed)
}

/// Waits until the task runs attempt `attempt` and rank 0 has printed a step of it.
async fn wait_for_attempt(app: &TestApp, s: &Session, id: &str, attempt: i64, secs: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        let (steps, _) = steps(app, s, id).await;
        if steps.iter().any(|st| st.0 == attempt) {
            return;
        }
        let t = s.get(app, &format!("/api/v1/tasks/{id}")).await;
        assert!(
            std::time::Instant::now() < deadline && t["state"] != "completed",
            "attempt {attempt} never trained: {t}\n{steps:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn an_elastic_gang_grows_and_shrinks_and_its_training_goes_on() {
    let Some(python) = torch_python() else { return };
    let app = spawn_app_with(Backend::Sqlite, |s| {
        s.policy.resize_interval_s = 5;
        s.policy.resize_cost_s = 0;
        s.policy.min_runtime_s = 0;
        s.policy.preempt_margin = 0.05;
    })
    .await;
    let op = app.operator().await;
    let agent = start_agent(&app, &op, "elastic-4", "4xA100-40G").await;
    let other = app.signup("other@example.com", "Other lab").await;
    let blocker = submit(
        &app,
        &other,
        json!({"name": "blocker", "image": "none", "num_workers": 2, "gpu_per_worker": 1,
               "command": "sleep 15"}),
    )
    .await;
    wait_for(&app, &other, &blocker, &["running"], 60).await;

    let s = app.signup("elastic@example.com", "Lab").await;
    let id = submit(
        &app,
        &s,
        json!({"name": "elastic", "image": "none", "num_workers": {"min": 2, "max": 4},
               "gpu_per_worker": 1, "batch_size": 64, "global_batch": true,
               "priority": 0.3, "env": {"STEPS": "200"},
               "checkpoint": {"interval": "10m"},
               "command": [python, "-c", TRAIN]}),
    )
    .await;
    let t = s.get(&app, &format!("/api/v1/tasks/{id}")).await;
    assert_eq!(t["spec"]["num_workers"], 4, "{t}");
    assert_eq!(t["spec"]["min_workers"], 2, "{t}");
    // It starts with the two GPUs the blocker leaves; when the blocker ends it grows to four.
    wait_for_attempt(&app, &s, &id, 1, 120).await;
    wait_for(&app, &other, &blocker, &["completed"], 60).await;
    wait_for_attempt(&app, &s, &id, 2, 180).await;
    // A task of higher priority needs two GPUs: the gang gives them up and goes on with two.
    let urgent = app.signup("urgent@example.com", "Urgent lab").await;
    let high = submit(
        &app,
        &urgent,
        json!({"name": "urgent", "image": "none", "num_workers": 2, "gpu_per_worker": 1,
               "priority": 1.0, "command": "sleep 5"}),
    )
    .await;
    wait_for_attempt(&app, &s, &id, 3, 180).await;
    let t = wait_for(&app, &s, &id, &["completed", "failed"], 300).await;
    assert_eq!(t["state"], "completed", "{t}");
    assert_eq!(
        wait_for(&app, &urgent, &high, &["completed", "failed"], 60).await["state"],
        "completed"
    );

    let (steps, resumed) = steps(&app, &s, &id).await;
    let width = |attempt: i64| -> Vec<(u32, u32)> {
        let mut w: Vec<(u32, u32)> = steps
            .iter()
            .filter(|st| st.0 == attempt)
            .map(|st| (st.2, st.3))
            .collect();
        w.dedup();
        w
    };
    // Each attempt ran at one width, its batch the global 64 shared among its workers.
    assert_eq!(width(1), [(2, 32)], "{steps:?}");
    assert_eq!(width(2), [(4, 16)], "{steps:?}");
    assert_eq!(width(3), [(2, 32)], "{steps:?}");
    // Each restart resumed from the checkpoint it left, and the loss went on from there
    // instead of starting over.
    let first_loss = steps.first().expect("steps").4;
    for attempt in 2..=3 {
        let from = resumed
            .iter()
            .find(|r| r.0 == attempt)
            .unwrap_or_else(|| panic!("attempt {attempt} did not resume: {resumed:?}"))
            .1;
        assert!(from > 0 && from % 10 == 0, "{resumed:?}");
        let next = steps
            .iter()
            .find(|st| st.0 == attempt)
            .expect("a step of the attempt");
        assert_eq!(next.1, from + 1, "{steps:?}");
        // The checkpoint is the newest any earlier attempt saved (one stopped soon after its
        // start may have saved none).
        let before = steps
            .iter()
            .rev()
            .find(|st| st.0 < attempt && st.1 == from)
            .unwrap_or_else(|| panic!("no step {from} before attempt {attempt}: {steps:?}"));
        assert!(
            next.4 < first_loss / 4.0 && next.4 < before.4 * 2.0,
            "attempt {attempt} started over: loss {} after {} at its checkpoint, {} at first",
            next.4,
            before.4,
            first_loss
        );
    }
    let last = steps.iter().map(|st| st.1).max().unwrap();
    assert_eq!(last, 200);
    assert!(steps.last().unwrap().4 < first_loss / 100.0, "{steps:?}");
    // The timeline says why each change was made.
    let events: Value = s.get(&app, &format!("/api/v1/tasks/{id}/events")).await;
    let said = |needle: &str| {
        events
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["message"].as_str().unwrap_or_default().contains(needle))
    };
    assert!(said("growing from 2 to 4 workers"), "{events}");
    assert!(
        said("shrinking from 4 workers") && said(&format!("for task {high}")),
        "{events}"
    );
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}
