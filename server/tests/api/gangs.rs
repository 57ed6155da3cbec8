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
pub(crate) fn torch_python() -> Option<&'static str> {
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
    let files = result_files(&app, &s, &id).await;
    let want = files_saying(&[
        ("rank.txt", "0"),
        ("rank-1/rank.txt", "1"),
        ("rank-2/rank.txt", "2"),
        ("rank-3/rank.txt", "3"),
    ]);
    assert_eq!(files, want);
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}

/// The task's results archive as it is downloaded: each file's path and text.
pub async fn result_files(app: &TestApp, s: &Session, id: &str) -> BTreeMap<String, String> {
    let archive = s
        .send(
            app,
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
    files
}

fn files_saying(list: &[(&str, &str)]) -> BTreeMap<String, String> {
    list.iter()
        .map(|(p, t)| (p.to_string(), t.to_string()))
        .collect()
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
    // Every worker's results are kept, the second node's too, and are there as it completes.
    let files = result_files(&app, &s, &id).await;
    let want = files_saying(&[
        ("rank.txt", "0"),
        ("rank-1/rank.txt", "1"),
        ("rank-2/rank.txt", "2"),
        ("rank-3/rank.txt", "3"),
    ]);
    assert_eq!(files, want, "{placement}");
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

crate::on_both_backends!(a_gang_across_nodes_ends_when_its_last_node_does);

/// A gang across two nodes ends when every node's workers have, as torchrun's agents wait
/// for one another: here the second node's process ends first and rank 0's node 4 s later.
/// The attempt completes once, after both (the second node's silence about it meanwhile is
/// not its loss, and rank 0's node is not stopped before it has saved), with what each node's
/// process left (`launcher: none`, one process per node: the second's in `node-1/`).
async fn a_gang_across_nodes_ends_when_its_last_node_does(b: Backend) {
    let app = spawn_app(b).await;
    let op = app.operator().await;
    let trusted = || Arc::new(ProcessRuntime::trusted()) as Arc<dyn autodl_agent::Runtime>;
    let agents = two_nodes(&app, &op, ["part-a", "part-b"], 20, trusted).await;
    for node in ["part-a", "part-b"] {
        crate::isolation::share(&app, &op, node).await;
    }
    let s = app.signup("parts@example.com", "Lab").await;
    let id = submit(
        &app,
        &s,
        json!({"name": "parts", "image": "none", "num_workers": 4, "gpu_per_worker": 1,
               "launcher": "none",
               "command": "if [ \"$NODE_RANK\" = 0 ]; then sleep 4; fi; \
                           echo \"node $NODE_RANK\" > \"$AUTODL_RESULTS_DIR/who.txt\"; echo \"done $NODE_RANK\""}),
    )
    .await;
    let t = wait_for(&app, &s, &id, &["completed", "failed"], 60).await;
    let logs = crate::e2e::log_text(&app, &s, &id).await;
    assert_eq!(t["state"], "completed", "{t}\n{logs}");
    assert_eq!(t["attempts"], 1, "{t}");
    assert!(logs.contains("done 0") && logs.contains("done 1"), "{logs}");
    let events = s.get(&app, &format!("/api/v1/tasks/{id}/events")).await;
    let text = events.to_string();
    assert!(
        text.matches("all succeeded; attempt 1 ends when those on")
            .count()
            == 1,
        "{text}"
    );
    assert!(!text.contains("no longer runs"), "{text}");
    let files = result_files(&app, &s, &id).await;
    assert_eq!(
        files,
        files_saying(&[("who.txt", "node 0\n"), ("node-1/who.txt", "node 1\n")])
    );
    for a in agents {
        a.shutdown.cancel();
        let _ = a.handle.await;
    }
}

/// Seed 004's example, as the article prints it (only its placeholder key replaced, and the
/// `import time` it leaves out added).
const SEED_EXAMPLE: &str = r#"import time
import aotodl

# 初始化 aotodl 客户端
client = aotodl.Client(api_key="your_api_key")

# 定义训练任务配置
task_config = {
    "task_name": "distributed_mnist",
    "num_workers": 4,  # 使用 4 个 Worker 节点
    "gpu_per_worker": 1,  # 每个 Worker 分配 1 块 GPU
    "image": "pytorch/pytorch:latest",  # 使用 PyTorch 官方镜像
    "entry_point": "train.py",  # 训练脚本入口
    "data_path": "/data/mnist",  # 数据集路径
    "checkpoint_path": "/checkpoints",  # 检查点保存路径
}

# 提交任务
task = client.submit_task(task_config)

# 监控任务状态
while True:
    status = task.get_status()
    print(f"Task status: {status}")
    if status in ["COMPLETED", "FAILED"]:
        break
    time.sleep(60)

# 下载训练结果
if status == "COMPLETED":
    task.download_results("./output")
"#;

/// The researcher's `train.py` beside it: DDP over the dataset at `data_path`, each rank on
/// its shard, rank 0 saving a checkpoint where the task asked.
const SEED_TRAIN: &str = r#"
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
data = os.environ.get("AUTODL_DATA_PATH", "/data/mnist")
rows = [list(map(float, l.split())) for l in open(os.path.join(data, "points.txt"))]
mine = torch.tensor(rows[rank::world])
x, y = mine[:, :10], mine[:, 10:]
torch.manual_seed(0)
net = torch.nn.Linear(10, 1)
model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=0.2)
first = None
for step in range(200):
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    first = loss.item() if first is None else first
if rank == 0:
    torch.save(net.state_dict(), os.path.join(os.environ["AUTODL_CHECKPOINT_DIR"], "model.pt"))
weights = sum(p.sum().item() for p in model.parameters())
with open(os.path.join(os.environ["AUTODL_RESULTS_DIR"], "rank.txt"), "w") as f:
    f.write(str(rank))
print(f"RESULT rank={rank} world={world} local={os.environ['LOCAL_RANK']} "
      f"gpus={os.environ.get('CUDA_VISIBLE_DEVICES')} port={os.environ['MASTER_PORT']} "
      f"first={first:.4f} last={loss.item():.4f} weights={weights:.6f}", flush=True)
dist.destroy_process_group()
"#;

/// A dataset folder this test made at a fixed host path, removed with what it made.
struct MadeFolder(Vec<std::path::PathBuf>);

impl Drop for MadeFolder {
    fn drop(&mut self) {
        for p in self.0.iter().rev() {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

/// `/data/mnist` as the article names it, made for this test (root only), or `None` (after
/// saying so) where it cannot be made or the host has one of its own.
fn seed_dataset() -> Option<MadeFolder> {
    use std::os::unix::fs::PermissionsExt;
    let (root, mnist) = (
        std::path::Path::new("/data"),
        std::path::Path::new("/data/mnist"),
    );
    if mnist.exists() {
        crate::helpers::skip("this host has a /data/mnist of its own");
        return None;
    }
    let mut made = MadeFolder(Vec::new());
    for dir in [root, mnist] {
        if !dir.exists() {
            if std::fs::create_dir(dir).is_err() {
                crate::helpers::skip("/data/mnist cannot be made here (not root)");
                return None;
            }
            made.0.push(dir.to_owned());
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    // y = x · (0, 1, ..., 9) over 256 points, readable by every task user.
    let mut text = String::new();
    for i in 0..256u32 {
        let x: Vec<f64> = (0..10u32)
            .map(|j| (((i * 37 + j * 11) % 97) as f64 / 48.5) - 1.0)
            .collect();
        let y: f64 = x.iter().enumerate().map(|(j, v)| j as f64 * v).sum();
        let cols: Vec<String> = x
            .iter()
            .chain([y].iter())
            .map(|v| format!("{v:.6}"))
            .collect();
        text.push_str(&cols.join(" "));
        text.push('\n');
    }
    let file = mnist.join("points.txt");
    std::fs::write(&file, text).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    Some(made)
}

/// Seed 004's example runs as written: from a folder holding `train.py` (shipped with the task
/// because the entry point is there), four workers on a node whose dataset root is `/data`
/// train as one group on `/data/mnist`, the loop sees COMPLETED, and `./output` holds every
/// worker's results.
#[tokio::test]
async fn the_articles_distributed_example_runs_as_written() {
    let Some(_) = torch_python() else { return };
    let Ok(sdk) = std::env::var("AUTODL_TEST_PYTHON") else {
        crate::helpers::skip("AUTODL_TEST_PYTHON (a Python with the SDK) is not set");
        return;
    };
    let Some(_dataset) = seed_dataset() else {
        return;
    };
    let app = spawn_app(Backend::Sqlite).await;
    let op = app.operator().await;
    let runtime = autodl_agent::ProcessRuntime::detect(&Default::default()).unwrap();
    let agent = crate::e2e::start_agent_with(
        &app,
        &op,
        "mnist-host",
        "4xA100-40G",
        Arc::new(runtime),
        &[std::path::PathBuf::from("/data")],
    )
    .await;
    let s = app.signup("seed@example.com", "Lab").await;
    let created = s
        .send(
            &app,
            reqwest::Method::POST,
            "/api/v1/api-keys",
            Some(json!({"name": "article"})),
        )
        .await;
    assert_eq!(created.status(), reqwest::StatusCode::CREATED);
    let key = created.json::<Value>().await.unwrap()["key"]
        .as_str()
        .unwrap()
        .to_owned();
    let folder = tempfile::tempdir().unwrap();
    std::fs::write(folder.path().join("train.py"), SEED_TRAIN).unwrap();
    std::fs::write(
        folder.path().join("submit.py"),
        SEED_EXAMPLE.replace("your_api_key", &key),
    )
    .unwrap();
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(300),
        tokio::process::Command::new(&sdk)
            .arg("submit.py")
            .current_dir(folder.path())
            .env("AUTODL_API_URL", &app.address)
            .output(),
    )
    .await
    .expect("the example did not end within 300 s")
    .unwrap();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{printed}");
    assert!(printed.contains("Task status: COMPLETED"), "{printed}");
    let tasks = s.get(&app, "/api/v1/tasks").await;
    let id = tasks["items"][0]["id"].as_str().unwrap().to_owned();
    let results = results(&app, &s, &id, 1).await;
    assert_trained_as_one_group(&results, 4, "the article's example");
    let mut got = BTreeMap::new();
    for rank in 0..4 {
        let path = match rank {
            0 => folder.path().join("output/rank.txt"),
            r => folder.path().join(format!("output/rank-{r}/rank.txt")),
        };
        got.insert(rank, std::fs::read_to_string(&path).unwrap_or_default());
    }
    assert_eq!(
        got,
        (0..4)
            .map(|r| (r, r.to_string()))
            .collect::<BTreeMap<_, _>>(),
        "{printed}"
    );
    let checkpoints = s
        .get(&app, &format!("/api/v1/tasks/{id}/checkpoints"))
        .await;
    assert!(
        checkpoints.as_array().is_some_and(|c| !c.is_empty()),
        "rank 0's checkpoint is saved: {checkpoints}"
    );
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}

crate::on_both_backends!(a_gang_s_results_are_in_once_every_node_s_are);

/// Results a gang's nodes keep settle node by node: the completed task says "uploading" until
/// every node that kept its workers' results has stored them (the first node's upload does not
/// settle the others'), and no node can touch another's upload.
async fn a_gang_s_results_are_in_once_every_node_s_are(b: Backend) {
    use crate::agents::FakeAgent;
    let app = spawn_app(b).await;
    let op = app.operator().await;
    let host = json!({"runtime": "process", "isolation": "none", "data_roots": []});
    let mut agents = BTreeMap::new();
    for node in ["keep-a", "keep-b"] {
        let agent = FakeAgent::join_with(&app, &op, node, "A100-40G", "z1", host.clone()).await;
        crate::isolation::share(&app, &op, node).await;
        agents.insert(node, agent);
    }
    let s = app.signup("keep@example.com", "Lab").await;
    // Eight workers of one GPU: all four GPUs of both nodes.
    let (id, attempt, _) = agents["keep-a"]
        .placed(
            &app,
            &s,
            json!({"name": "gang", "image": "none", "num_workers": 8, "gpu_per_worker": 1,
                   "command": "true"}),
        )
        .await;
    for agent in agents.values() {
        let r = agent
            .call(
                &format!("/api/v1/agent/tasks/{id}/started"),
                json!({"attempt": attempt}),
            )
            .await;
        assert_eq!(r.status(), reqwest::StatusCode::NO_CONTENT);
    }
    let upload = |node: &'static str, path: &'static str| {
        let agent = &agents[node];
        let id = id.clone();
        async move {
            let r = agent
                .call(
                    &format!("/api/v1/agent/tasks/{id}/artifacts"),
                    json!({"attempt": attempt, "kind": "results"}),
                )
                .await;
            assert_eq!(r.status(), reqwest::StatusCode::CREATED);
            let up = r.json::<Value>().await.unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned();
            let r = agent
                .http
                .put(format!(
                    "{}/api/v1/agent/artifacts/{up}/files/{path}",
                    agent.base
                ))
                .bearer_auth(&agent.credential)
                .body(node)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), reqwest::StatusCode::NO_CONTENT);
            up
        }
    };
    let commit = |node: &'static str, up: String, path: &'static str| {
        let agent = &agents[node];
        async move {
            agent
                .call(
                    &format!("/api/v1/agent/artifacts/{up}/commit"),
                    json!({"files": [{"path": path, "size": node.len()}]}),
                )
                .await
        }
    };
    let finished = |node: &'static str, uploading: Value| {
        let agent = &agents[node];
        let id = id.clone();
        async move {
            let r = agent
                .call(
                    &format!("/api/v1/agent/tasks/{id}/finished"),
                    json!({"attempt": attempt, "exit_code": 0, "reason": "success",
                           "uploading": uploading}),
                )
                .await;
            assert_eq!(r.status(), reqwest::StatusCode::NO_CONTENT);
        }
    };
    // keep-b's workers end first; its results could not be stored yet.
    let late = upload("keep-b", "rank-4/out.txt").await;
    finished("keep-b", json!(["results"])).await;
    let t = s.get(&app, &format!("/api/v1/tasks/{id}")).await;
    assert_eq!(t["state"], "running", "{t}");
    // keep-a's workers end too, its results also still uploading: the attempt ends with it.
    let own = upload("keep-a", "out.txt").await;
    finished("keep-a", json!(["results"])).await;
    let still_uploading = || async {
        let t = s.get(&app, &format!("/api/v1/tasks/{id}")).await;
        assert_eq!(
            (t["state"].as_str(), t["results"].as_str()),
            (Some("completed"), Some("uploading")),
            "{t}"
        );
        let r = s
            .send(
                &app,
                reqwest::Method::GET,
                &format!("/api/v1/tasks/{id}/results"),
                None,
            )
            .await;
        assert_eq!(r.status(), reqwest::StatusCode::CONFLICT);
    };
    still_uploading().await;
    // keep-a's are in; keep-b's are not yet: still uploading.
    let r = commit("keep-a", own, "out.txt").await;
    assert_eq!(r.status(), reqwest::StatusCode::OK);
    still_uploading().await;
    // No node touches another's upload.
    let r = commit("keep-a", late.clone(), "rank-4/out.txt").await;
    assert_eq!(r.status(), reqwest::StatusCode::CONFLICT);
    // keep-b's upload goes through: every node's results are in, in one tree.
    let r = commit("keep-b", late, "rank-4/out.txt").await;
    assert_eq!(r.status(), reqwest::StatusCode::OK);
    let t = s.get(&app, &format!("/api/v1/tasks/{id}")).await;
    assert!(t["results"].is_null(), "{t}");
    assert_eq!(
        result_files(&app, &s, &id).await,
        files_saying(&[("out.txt", "keep-a"), ("rank-4/out.txt", "keep-b")])
    );
    let events = s
        .get(&app, &format!("/api/v1/tasks/{id}/events"))
        .await
        .to_string();
    assert!(
        events.contains("results saved from node keep-b"),
        "{events}"
    );
}
