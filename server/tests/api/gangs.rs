//! Distributed training for real: gangs of workers that run PyTorch's DDP (Debian's
//! `python3-torch`, CPU, gloo) through the real server and agents (the process runtime,
//! sandboxed when the suite runs as root, as in CI), and check what the collective computed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use autodl_agent::ProcessRuntime;

use serde_json::{json, Value};

use crate::e2e::{start_agent, start_agent_configured, submit, wait_for};
use crate::helpers::{spawn_app, Backend, Session, TestApp};

/// The Python that has torch (Debian's, which the sandbox shows; the suite's own virtualenv
/// has none). `None` (after saying so) where it is missing outside CI.
fn torch_python() -> Option<&'static str> {
    const PYTHON: &str = "/usr/bin/python3";
    let ok = std::process::Command::new(PYTHON)
        .args([
            "-c",
            "import torch.distributed as d; assert d.is_gloo_available()",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some(PYTHON);
    }
    crate::helpers::skip("Debian's python3-torch is not installed (scripts/test.sh installs it)");
    None
}

/// The most ordinary DDP script: `env://`, a small model in DistributedDataParallel, 50 steps
/// on data of its own rank's. Each rank prints what it saw and ended with.
const TRAIN: &str = r#"
import os, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]), (rank, os.environ["RANK"])
fail_at = int(os.environ.get("FAIL_RANK_AT", "-1"))
torch.manual_seed(0)
net = torch.nn.Linear(10, 1)
start = 0
restore = os.environ.get("AUTODL_RESTORE_PATH")
if restore and os.path.exists(os.path.join(restore, "model.pt")):
    saved = torch.load(os.path.join(restore, "model.pt"))
    net.load_state_dict(saved["model"])
    start = saved["step"]
    print(f"rank {rank} resumed from step {start}", flush=True)
model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(1 + rank)
x = torch.randn(256, 10, generator=g)
y = x @ torch.arange(10.0).unsqueeze(1)
first = None
for step in range(start, 50):
    if rank == 1 and step == fail_at and os.environ["AUTODL_ATTEMPT"] == "1":
        print("rank 1 fails", flush=True)
        os._exit(3)
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    if first is None:
        first = loss.item()
    if rank == 0 and step + 1 == 20 and os.environ.get("CHECKPOINT_AT_20"):
        # Written aside and renamed: the agent never saves half a file.
        folder = os.environ["AUTODL_CHECKPOINT_DIR"]
        torch.save({"model": net.state_dict(), "step": 20}, os.path.join(folder, "model.tmp"))
        os.replace(os.path.join(folder, "model.tmp"), os.path.join(folder, "model.pt"))
weights = sum(p.sum().item() for p in model.parameters())
with open(os.path.join(os.environ["AUTODL_RESULTS_DIR"], "rank.txt"), "w") as f:
    f.write(str(rank))
print(f"RESULT rank={rank} world={world} local={os.environ['LOCAL_RANK']} "
      f"gpus={os.environ.get('CUDA_VISIBLE_DEVICES')} port={os.environ['MASTER_PORT']} "
      f"first={first:.4f} last={loss.item():.4f} weights={weights:.6f}", flush=True)
dist.destroy_process_group()
"#;

/// One `RESULT` line of a rank, as printed by [`TRAIN`].
#[derive(Debug)]
struct RankResult {
    rank: u32,
    /// The rank the log line is filed under.
    filed_as: Value,
    fields: BTreeMap<String, String>,
}

async fn results(app: &TestApp, s: &Session, id: &str, attempt: i64) -> Vec<RankResult> {
    // Lines may land just after the task ended.
    let mut out = Vec::new();
    for _ in 0..50 {
        let logs = s.get(app, &format!("/api/v1/tasks/{id}/logs")).await;
        out = logs["lines"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l["attempt"] == attempt)
            .filter_map(|l| {
                let text = l["line"].as_str()?.strip_prefix("RESULT ")?;
                let fields: BTreeMap<String, String> = text
                    .split_whitespace()
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect();
                Some(RankResult {
                    rank: fields["rank"].parse().unwrap(),
                    filed_as: l["rank"].clone(),
                    fields,
                })
            })
            .collect();
        if !out.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    out.sort_by_key(|r| r.rank);
    out
}

/// All `world` ranks reported, each under its own rank, one group of that size, the same
/// weights everywhere (the collective averaged the gradients), and the loss went down.
fn assert_trained_as_one_group(results: &[RankResult], world: u32, context: &str) {
    let ranks: Vec<u32> = results.iter().map(|r| r.rank).collect();
    assert_eq!(
        ranks,
        (0..world).collect::<Vec<_>>(),
        "{context}: {results:?}"
    );
    for r in results {
        assert_eq!(r.fields["world"], world.to_string(), "{context}: {r:?}");
        assert_eq!(
            r.filed_as,
            json!(r.rank),
            "{context}: log line filed under {r:?}"
        );
        let first: f64 = r.fields["first"].parse().unwrap();
        let last: f64 = r.fields["last"].parse().unwrap();
        assert!(
            last < first / 10.0,
            "{context}: the loss did not go down: {r:?}"
        );
    }
    let weights: BTreeSet<&str> = results
        .iter()
        .map(|r| r.fields["weights"].as_str())
        .collect();
    assert_eq!(
        weights.len(),
        1,
        "{context}: ranks ended with different weights: {results:?}"
    );
}

/// `num_workers: 4` on one node of four GPUs: four processes, a GPU each, one group of four.
#[tokio::test]
async fn four_workers_on_one_node_train_as_one_group() {
    let Some(python) = torch_python() else { return };
    let app = spawn_app(Backend::Sqlite).await;
    let op = app.operator().await;
    let agent = start_agent(&app, &op, "gang-4", "4xA100-40G").await;
    let s = app.signup("ddp@example.com", "Lab").await;
    let submitted = std::time::Instant::now();
    let id = submit(
        &app,
        &s,
        json!({"name": "ddp", "image": "none", "num_workers": 4, "gpu_per_worker": 1,
               "command": [python, "-c", TRAIN]}),
    )
    .await;
    let t = wait_for(&app, &s, &id, &["completed", "failed"], 180).await;
    let results = results(&app, &s, &id, 1).await;
    assert_eq!(t["state"], "completed", "{t}\n{results:?}");
    eprintln!(
        "a 4-worker gang trained and ended {:.1} s after its submission",
        submitted.elapsed().as_secs_f64()
    );
    assert_trained_as_one_group(&results, 4, "one node");
    let gpus: BTreeSet<&str> = results.iter().map(|r| r.fields["gpus"].as_str()).collect();
    assert_eq!(
        gpus.len(),
        4,
        "each worker has a GPU of its own: {results:?}"
    );
    assert!(
        results.iter().all(|r| !r.fields["gpus"].contains(',')),
        "{results:?}"
    );
    for r in &results {
        assert_eq!(r.fields["local"], r.rank.to_string(), "{r:?}");
    }
    // What every worker left is kept: rank 0's at the top, the others' in a folder each.
    let archive = s
        .send(
            &app,
            reqwest::Method::GET,
            &format!("/api/v1/tasks/{id}/results"),
            None,
        )
        .await;
    assert_eq!(archive.status(), reqwest::StatusCode::OK);
    let bytes = archive.bytes().await.unwrap();
    let mut files = BTreeMap::new();
    for e in tar::Archive::new(bytes.as_ref()).entries().unwrap() {
        let mut e = e.unwrap();
        if e.header().entry_type().is_file() {
            let path = e.path().unwrap().display().to_string();
            let mut text = String::new();
            std::io::Read::read_to_string(&mut e, &mut text).unwrap();
            files.insert(path, text);
        }
    }
    let want: BTreeMap<String, String> = [
        ("rank.txt", "0"),
        ("rank-1/rank.txt", "1"),
        ("rank-2/rank.txt", "2"),
        ("rank-3/rank.txt", "3"),
    ]
    .into_iter()
    .map(|(p, t)| (p.to_owned(), t.to_owned()))
    .collect();
    assert_eq!(files, want);
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}

/// Two agents of two GPUs on this machine, each advertising an address of its own in
/// 127.0.0.0/8 (from `127.0.0.<first>` on), running tasks with what `runtime` makes.
async fn two_nodes(
    app: &TestApp,
    op: &Session,
    nodes: [&str; 2],
    first: u8,
    runtime: impl Fn() -> Arc<dyn autodl_agent::Runtime>,
) -> Vec<crate::e2e::RunningAgent> {
    let mut agents = Vec::new();
    for (node, last) in nodes.into_iter().zip(first..) {
        let addr = std::net::Ipv4Addr::new(127, 0, 0, last);
        agents.push(
            start_agent_configured(app, op, node, "2xA100-40G", runtime(), |c| {
                c.advertise_addr(addr.into())
            })
            .await,
        );
    }
    agents
}

/// A gang spanning two nodes: two agents on this machine, each advertising an address of its
/// own in 127.0.0.0/8, two workers each; the ranks of the second node meet rank 0 at the
/// first node's address and the port the placement leased there. Tasks here share the host's
/// network (trusted nodes): a gang never spans isolated nodes (see below).
#[tokio::test]
async fn a_gang_across_two_nodes_trains_as_one_group() {
    let Some(python) = torch_python() else { return };
    let app = spawn_app(Backend::Sqlite).await;
    let op = app.operator().await;
    let trusted = || Arc::new(ProcessRuntime::trusted()) as Arc<dyn autodl_agent::Runtime>;
    let agents = two_nodes(&app, &op, ["span-a", "span-b"], 2, trusted).await;
    for node in ["span-a", "span-b"] {
        crate::isolation::share(&app, &op, node).await;
    }
    let s = app.signup("span@example.com", "Lab").await;
    let id = submit(
        &app,
        &s,
        json!({"name": "span", "image": "none", "num_workers": 4, "gpu_per_worker": 1,
               "command": [python, "-c", TRAIN]}),
    )
    .await;
    let t = wait_for(&app, &s, &id, &["completed", "failed"], 180).await;
    let results = results(&app, &s, &id, 1).await;
    assert_eq!(t["state"], "completed", "{t}\n{results:?}");
    let placement = t["placement"].clone();
    assert_trained_as_one_group(&results, 4, "two nodes");
    let port = results[0].fields["port"].clone();
    assert!(
        results.iter().all(|r| r.fields["port"] == port),
        "{results:?}"
    );
    let port: u16 = port.parse().unwrap();
    assert!((29500..=30499).contains(&port), "{port} {placement}");
    for a in agents {
        a.shutdown.cancel();
        let _ = a.handle.await;
    }
}

/// `launcher: torchrun`: one process on the node, torchrun's options in its `PET_*`
/// variables, torchrun's own workers form the group.
#[tokio::test]
async fn torchrun_finds_its_options_in_the_environment() {
    let Some(python) = torch_python() else { return };
    let app = spawn_app(Backend::Sqlite).await;
    let op = app.operator().await;
    let agent = start_agent(&app, &op, "torchrun-2", "2xA100-40G").await;
    let s = app.signup("torchrun@example.com", "Lab").await;
    // Debian's torch 1.13 on Python 3.11 cannot read torchrun's default --redirects/--tee.
    let script = format!(
        "cat > train.py <<'PY'\n{TRAIN}\nPY\n\
         exec {python} -m torch.distributed.run --redirects 9:0 --tee 9:0 train.py"
    );
    let id = submit(
        &app,
        &s,
        json!({"name": "torchrun", "image": "none", "num_workers": 2, "gpu_per_worker": 1,
               "launcher": "torchrun", "command": script}),
    )
    .await;
    let t = wait_for(&app, &s, &id, &["completed", "failed"], 180).await;
    let logs = crate::e2e::log_text(&app, &s, &id).await;
    assert_eq!(t["state"], "completed", "{t}\n{logs}");
    // One process on the node: torchrun's workers print through its output, which they share
    // (so one's line may run into the other's).
    let results: Vec<&str> = logs.split("RESULT ").skip(1).collect();
    assert_eq!(results.len(), 2, "{logs}");
    assert!(results.iter().all(|r| r.contains("world=2")), "{logs}");
    let weights: BTreeSet<&str> = results
        .iter()
        .filter_map(|r| r.split_whitespace().find(|f| f.starts_with("weights=")))
        .map(|w| &w[..w.len().min("weights=".len() + 9)])
        .collect();
    assert_eq!(weights.len(), 1, "{logs}");
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}

/// Two gangs at once on one node each meet at their own rendezvous: both train.
#[tokio::test]
async fn two_gangs_on_one_node_do_not_meet() {
    let Some(python) = torch_python() else { return };
    let app = spawn_app(Backend::Sqlite).await;
    let op = app.operator().await;
    let agent = start_agent(&app, &op, "gangs-2", "4xA100-40G").await;
    let s = app.signup("two@example.com", "Lab").await;
    let mut ids = Vec::new();
    for name in ["first", "second"] {
        ids.push(
            submit(
                &app,
                &s,
                json!({"name": name, "image": "none", "num_workers": 2, "gpu_per_worker": 1,
                       "command": [python, "-c", TRAIN]}),
            )
            .await,
        );
    }
    // Both hold their GPUs at once (the node has room for both).
    for id in &ids {
        wait_for(&app, &s, id, &["running", "completed", "failed"], 60).await;
    }
    let mut ports = BTreeSet::new();
    for id in &ids {
        let t = wait_for(&app, &s, id, &["completed", "failed"], 180).await;
        let results = results(&app, &s, id, 1).await;
        assert_eq!(t["state"], "completed", "{t}\n{results:?}");
        assert_trained_as_one_group(&results, 2, id);
        ports.insert(results[0].fields["port"].clone());
    }
    assert_eq!(ports.len(), 2, "two live gangs were given one port");
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}

/// A worker that dies mid-training takes its gang with it: the others are stopped (they would
/// wait in the collective forever), the attempt fails, and the retry runs the whole gang again
/// from rank 0's checkpoint, restored to every worker.
#[tokio::test]
async fn a_gang_that_loses_a_worker_is_retried_as_a_whole() {
    let Some(python) = torch_python() else { return };
    let app = spawn_app(Backend::Sqlite).await;
    let op = app.operator().await;
    let agent = start_agent(&app, &op, "gang-fail", "2xA100-40G").await;
    let s = app.signup("fail@example.com", "Lab").await;
    let id = submit(
        &app,
        &s,
        json!({"name": "fragile", "image": "none", "num_workers": 2, "gpu_per_worker": 1,
               "env": {"FAIL_RANK_AT": "25", "CHECKPOINT_AT_20": "1"},
               "checkpoint": {"interval": "10m"},
               "retry_policy": {"max_retries": 1},
               "command": [python, "-c", TRAIN]}),
    )
    .await;
    let t = wait_for(&app, &s, &id, &["completed", "failed"], 240).await;
    let second = results(&app, &s, &id, 2).await;
    assert_eq!(t["state"], "completed", "{t}\n{second:?}");
    assert_eq!(t["attempts"], 2, "{t}");
    assert_trained_as_one_group(&second, 2, "the retried attempt");
    let logs = s.get(&app, &format!("/api/v1/tasks/{id}/logs")).await;
    let first: Vec<&str> = logs["lines"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["attempt"] == 1)
        .filter_map(|l| l["line"].as_str())
        .collect();
    assert!(first.contains(&"rank 1 fails"), "{first:?}");
    let resumed: Vec<&str> = logs["lines"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["attempt"] == 2)
        .filter_map(|l| l["line"].as_str())
        .filter(|l| l.contains("resumed from step 20"))
        .collect();
    assert_eq!(
        resumed.len(),
        2,
        "both ranks resume from rank 0's checkpoint: {logs}"
    );
    // Rank 0 may see its peer gone and fail too: whichever the agent saw first stops the rest.
    assert!(
        first
            .iter()
            .any(|l| l.contains("exited with code") && l.contains("stopping the other workers")),
        "{first:?}"
    );
    assert!(
        !first.iter().any(|l| l.starts_with("RESULT")),
        "rank 0 went on alone: {first:?}"
    );
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}

/// The articles' `entry_point: "train.py"` without the code: the task fails saying where the
/// script was looked for and how code travels with a task (not Python's "can't open file").
#[tokio::test]
async fn a_missing_entry_point_says_how_code_gets_there() {
    let app = spawn_app(Backend::Sqlite).await;
    let op = app.operator().await;
    let agent = start_agent(&app, &op, "entry", "1xA100-40G").await;
    let s = app.signup("entry@example.com", "Lab").await;
    let id = submit(
        &app,
        &s,
        json!({"name": "entry", "image": "none", "entry_point": "train.py --epochs 3"}),
    )
    .await;
    let t = wait_for(&app, &s, &id, &["completed", "failed"], 60).await;
    let logs = crate::e2e::log_text(&app, &s, &id).await;
    assert_eq!(t["state"], "failed", "{t}\n{logs}");
    assert!(
        logs.contains("autodl: the entry point train.py is not in ")
            && logs.contains("\"workdir\": \".\""),
        "{logs}"
    );
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}

/// A gang whose workers never all meet (here rank 1 never reaches `init_process_group`) is
/// ended at its `rendezvous_timeout`, saying so, instead of holding its GPUs until torch's
/// own half-hour limit.
#[tokio::test]
async fn a_gang_that_cannot_form_ends_within_its_limit() {
    let Some(python) = torch_python() else { return };
    let app = spawn_app(Backend::Sqlite).await;
    let op = app.operator().await;
    let agent = start_agent(&app, &op, "gang-unformed", "2xA100-40G").await;
    let s = app.signup("unformed@example.com", "Lab").await;
    let script = "import os, time\n\
                  if os.environ['RANK'] == '1':\n    time.sleep(3600)\n\
                  import torch.distributed as dist\n\
                  dist.init_process_group('gloo', init_method='env://')\n\
                  print('formed', flush=True)\n";
    let submitted = std::time::Instant::now();
    let id = submit(
        &app,
        &s,
        json!({"name": "unformed", "image": "none", "num_workers": 2, "gpu_per_worker": 1,
               "rendezvous_timeout": "20s", "retry_policy": {"max_retries": 0},
               "command": [python, "-c", script]}),
    )
    .await;
    let t = wait_for(&app, &s, &id, &["completed", "failed"], 120).await;
    let took = submitted.elapsed();
    let events = s.get(&app, &format!("/api/v1/tasks/{id}/events")).await;
    assert_eq!(t["state"], "failed", "{t}\n{events}");
    // The limit, then at most the peers' grace period (and the start and the reports).
    assert!(
        took >= std::time::Duration::from_secs(20) && took < std::time::Duration::from_secs(50),
        "ended {took:?} after its submission"
    );
    assert!(
        events.to_string().contains(
            "the gang did not form within 20 s: 1 of its 2 workers reached the rendezvous"
        ),
        "{events}"
    );
    let logs = crate::e2e::log_text(&app, &s, &id).await;
    assert!(
        logs.contains("did not form") && !logs.contains("formed\n"),
        "{logs}"
    );
    // Its GPUs are free again: a one-GPU task starts at once.
    let next = submit(
        &app,
        &s,
        json!({"name": "after", "image": "none", "gpu_per_worker": 2, "command": "true"}),
    )
    .await;
    let t = wait_for(&app, &s, &next, &["completed", "failed"], 60).await;
    assert_eq!(t["state"], "completed", "{t}");
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}

/// Two nodes whose tasks each have a network of their own (isolated nodes): a gang's workers
/// on different nodes could not reach each other, so a gang never spans them. One too wide for
/// either node is refused at once, saying why; one that fits a node runs there, whole.
#[tokio::test]
async fn a_gang_never_spans_isolated_nodes() {
    let Some(python) = torch_python() else { return };
    let app = spawn_app(Backend::Sqlite).await;
    let op = app.operator().await;
    if !autodl_agent::isolation::is_root() {
        crate::helpers::skip("per-task networks need root (CI runs the suite as root)");
        return;
    }
    let sandboxed = || {
        let runtime = ProcessRuntime::detect(&autodl_agent::IsolationConfig::default()).unwrap();
        assert_eq!(
            autodl_agent::Runtime::isolation(&runtime),
            autodl_agent::IsolationLevel::Sandbox
        );
        Arc::new(runtime) as Arc<dyn autodl_agent::Runtime>
    };
    let agents = two_nodes(&app, &op, ["iso-a", "iso-b"], 4, sandboxed).await;
    let s = app.signup("iso@example.com", "Lab").await;
    let res = s
        .send(
            &app,
            reqwest::Method::POST,
            "/api/v1/tasks",
            Some(
                json!({"name": "wide", "image": "none", "num_workers": 4, "gpu_per_worker": 1,
                        "command": [python, "-c", TRAIN]}),
            ),
        )
        .await;
    assert_eq!(res.status(), reqwest::StatusCode::BAD_REQUEST);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unschedulable", "{body}");
    assert!(
        body.to_string().contains("does not span isolated nodes"),
        "{body}"
    );
    let id = submit(
        &app,
        &s,
        json!({"name": "narrow", "image": "none", "num_workers": 2, "gpu_per_worker": 1,
               "command": [python, "-c", TRAIN]}),
    )
    .await;
    let placed = wait_for(&app, &s, &id, &["scheduled", "running"], 60).await;
    let nodes: BTreeSet<&str> = placed["placement"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["node"].as_str())
        .collect();
    assert_eq!(nodes.len(), 1, "{placed}");
    let t = wait_for(&app, &s, &id, &["completed", "failed"], 180).await;
    let results = results(&app, &s, &id, 1).await;
    assert_eq!(t["state"], "completed", "{t}\n{results:?}");
    assert_trained_as_one_group(&results, 2, "one isolated node");
    for a in agents {
        a.shutdown.cancel();
        let _ = a.handle.await;
    }
}
