//! End to end with real agents (simulated GPUs, process runtime) running real shell commands.

use std::sync::Arc;
use std::time::{Duration, Instant};

use autodl_agent::{
    Agent, AgentConfig, CancellationToken, IsolationConfig, ProcessRuntime, SimulatedBackend,
};
use reqwest::Method;
use serde_json::{json, Value};

use crate::helpers::{spawn_app_with, Backend, Session, TestApp};

crate::on_both_backends!(
    each_line_of_a_gang_names_its_worker,
    docker_runtime_runs_tasks_with_limits,
    commands_run_to_completion_with_logs_metrics_and_retries,
    lost_agent_tasks_finish_elsewhere,
    cancel_and_drain_deliver_sigterm
);

pub struct RunningAgent {
    pub handle: tokio::task::JoinHandle<()>,
    pub shutdown: CancellationToken,
    /// The agent's state folder (credential, task folders).
    pub state_dir: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

pub async fn start_agent(app: &TestApp, op: &Session, node: &str, gpus: &str) -> RunningAgent {
    // As root (CI) each task runs sandboxed as its own uid, as on a production host.
    let runtime = ProcessRuntime::detect(&IsolationConfig::default()).unwrap();
    start_agent_with(app, op, node, gpus, Arc::new(runtime), &[]).await
}

/// An agent with this runtime and these dataset roots, registered and polling.
pub async fn start_agent_with(
    app: &TestApp,
    op: &Session,
    node: &str,
    gpus: &str,
    runtime: Arc<dyn autodl_agent::Runtime>,
    data_roots: &[std::path::PathBuf],
) -> RunningAgent {
    start_agent_configured(app, op, node, gpus, runtime, |mut c| {
        for r in data_roots {
            c = c.data_root(r);
        }
        c
    })
    .await
}

/// An agent whose configuration `tweak` adjusts, registered and polling.
pub async fn start_agent_configured(
    app: &TestApp,
    op: &Session,
    node: &str,
    gpus: &str,
    runtime: Arc<dyn autodl_agent::Runtime>,
    tweak: impl FnOnce(AgentConfig) -> AgentConfig,
) -> RunningAgent {
    let token = app.registration_token(op, node).await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = AgentConfig::new(app.address.clone())
        .node_id(node)
        .zone("z1")
        .registration_token(&token)
        .state_dir(dir.path().to_path_buf())
        .cpu(16)
        .memory(64 << 30)
        .sample_interval(Duration::from_millis(300))
        .shutdown_grace(Duration::from_secs(2));
    config = tweak(config);
    let agent = Agent::new(
        config,
        Arc::new(SimulatedBackend::from_spec(gpus, 7).unwrap()),
        runtime,
    )
    .unwrap();
    let shutdown = CancellationToken::new();
    let t = shutdown.clone();
    let handle = tokio::spawn(async move {
        let _ = agent.run(t).await;
    });
    // Registered once the node shows up.
    for _ in 0..100 {
        let nodes = op.get(app, "/api/v1/nodes").await;
        if nodes
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["id"] == node && n["schedulable"] == true)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    RunningAgent {
        handle,
        shutdown,
        state_dir: dir.path().to_path_buf(),
        _dir: dir,
    }
}

pub async fn submit(app: &TestApp, s: &Session, body: Value) -> String {
    let res = s.send(app, Method::POST, "/api/v1/tasks", Some(body)).await;
    let status = res.status();
    let answer = res.json::<Value>().await.unwrap();
    assert_eq!(status, reqwest::StatusCode::CREATED, "{answer}");
    answer["id"].as_str().unwrap().to_owned()
}

pub async fn wait_for(app: &TestApp, s: &Session, id: &str, states: &[&str], secs: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let t = s.get(app, &format!("/api/v1/tasks/{id}")).await;
        if states.iter().any(|st| t["state"] == *st) {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "task never reached {states:?}: {t}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn log_text(app: &TestApp, s: &Session, id: &str) -> String {
    let logs = s.get(app, &format!("/api/v1/tasks/{id}/logs")).await;
    logs["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["line"].as_str().unwrap().to_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

async fn commands_run_to_completion_with_logs_metrics_and_retries(b: Backend) {
    let app = spawn_app_with(b, |_| {}).await;
    let op = app.operator().await;
    let agent = start_agent(&app, &op, "sim-a100", "4xA100-40G").await;
    let s = app.signup("ada@example.com", "Lab").await;

    // A real command: its output, exit code and GPU metrics arrive.
    let id = submit(&app, &s, json!({"name": "hello", "image": "none",
        "command": "echo task=$AUTODL_TASK_ID attempt=$AUTODL_ATTEMPT gpus=$CUDA_VISIBLE_DEVICES; sleep 1.5; echo done >&2",
        "resources": {"gpu": {"type": "A100", "count": 2, "memory": "10GiB"}}})).await;
    let t = wait_for(&app, &s, &id, &["completed", "failed"], 30).await;
    assert_eq!(t["state"], "completed", "{t}");
    assert!(
        !agent.state_dir.join("tasks").join(&id).exists(),
        "a finished task's folder stays on the node"
    );
    let text = log_text(&app, &s, &id).await;
    assert!(text.contains(&format!("task={id} attempt=1")), "{text}");
    assert!(text.contains("done"), "{text}");
    let attempts = s.get(&app, &format!("/api/v1/tasks/{id}/attempts")).await;
    assert_eq!(attempts[0]["exit_code"], 0);
    let m = s.get(&app, &format!("/api/v1/tasks/{id}/metrics")).await;
    let gpu_samples: Vec<&Value> = m["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["gpu_util"].is_number())
        .collect();
    assert!(!gpu_samples.is_empty(), "no GPU samples for the task: {m}");
    assert_eq!(
        gpu_samples[0]["mem_used"],
        2 * (10u64 << 30),
        "simulated memory follows the declared memory"
    );

    // A failing command is retried per policy, then fails.
    let id = submit(
        &app,
        &s,
        json!({"name": "fails", "image": "none", "command": "echo try $AUTODL_ATTEMPT; exit 3",
        "retry_policy": {"max_retries": 1}, "resources": {"gpu": {"count": 1}}}),
    )
    .await;
    let t = wait_for(&app, &s, &id, &["failed"], 30).await;
    assert_eq!(t["attempts"], 2);
    let attempts = s.get(&app, &format!("/api/v1/tasks/{id}/attempts")).await;
    assert_eq!(attempts[1]["exit_code"], 3);
    assert_eq!(attempts[1]["reason"], "error");

    // A CUDA out-of-memory signature: retried with AUTODL_BATCH_SIZE halved until it fits.
    let id = submit(&app, &s, json!({"name": "oom", "image": "none", "batch_size": 128,
        "command": "echo batch=$AUTODL_BATCH_SIZE; if [ \"$AUTODL_BATCH_SIZE\" -gt 32 ]; then echo 'RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB' >&2; exit 1; fi",
        "retry_policy": {"max_retries": 3, "oom_recovery": true}, "resources": {"gpu": {"count": 1}}})).await;
    let t = wait_for(&app, &s, &id, &["completed", "failed"], 40).await;
    assert_eq!(t["state"], "completed", "{t}");
    let attempts = s.get(&app, &format!("/api/v1/tasks/{id}/attempts")).await;
    let batches: Vec<Value> = attempts
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["batch_size"].clone())
        .collect();
    assert_eq!(batches, [json!(128), json!(64), json!(32)]);
    assert_eq!(attempts[0]["reason"], "oom");
    let text = log_text(&app, &s, &id).await;
    assert!(text.contains("batch=32"), "{text}");
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}

async fn each_line_of_a_gang_names_its_worker(b: Backend) {
    let app = spawn_app_with(b, |_| {}).await;
    let op = app.operator().await;
    // A gang spans nodes whose tasks share their host's network (isolated nodes keep a gang
    // on one node): trusted nodes, opened to every organization.
    let mut agents = Vec::new();
    for node in ["sim-1", "sim-2"] {
        let runtime = Arc::new(ProcessRuntime::trusted());
        agents.push(start_agent_configured(&app, &op, node, "1xA100-40G", runtime, |c| c).await);
        crate::isolation::share(&app, &op, node).await;
    }
    let s = app.signup("ada@example.com", "Lab").await;
    let id = submit(
        &app,
        &s,
        json!({"name": "gang", "image": "none", "num_workers": 2,
        "command": "echo I am rank $RANK; echo warning from $RANK >&2",
        "resources": {"gpu": {"count": 1}}}),
    )
    .await;
    let t = wait_for(&app, &s, &id, &["completed", "failed"], 30).await;
    assert_eq!(t["state"], "completed", "{t}");
    // Each worker's agent ships its lines on its own: the last may land after the task ended.
    let mut logs = Value::Null;
    for _ in 0..100 {
        logs = s.get(&app, &format!("/api/v1/tasks/{id}/logs")).await;
        if logs["lines"].as_array().is_some_and(|l| l.len() >= 4) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lines = logs["lines"].as_array().unwrap();
    for rank in [0, 1] {
        let mine: Vec<&Value> = lines
            .iter()
            .filter(|l| l["line"].as_str().unwrap().ends_with(&format!(" {rank}")))
            .collect();
        assert_eq!(mine.len(), 2, "{logs}");
        assert!(
            mine.iter().all(|l| l["rank"] == rank && l["attempt"] == 1),
            "{logs}"
        );
    }
    // A task of one worker has no rank.
    let single = submit(
        &app,
        &s,
        json!({"name": "one", "image": "none", "command": "echo alone",
        "resources": {"gpu": {"count": 1}}}),
    )
    .await;
    wait_for(&app, &s, &single, &["completed"], 30).await;
    let logs = s.get(&app, &format!("/api/v1/tasks/{single}/logs")).await;
    assert!(
        logs["lines"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l.get("rank").is_none()),
        "{logs}"
    );
    for a in agents {
        a.shutdown.cancel();
        let _ = a.handle.await;
    }
}

/// A node with simulated GPUs shows its tasks an `nvidia-smi` of the GPUs they hold (the
/// agent's own program under that name), in the sandbox as root does in CI: numbered from 0
/// as the task sees them, with their type and memory, and saying they are simulated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simulated_node_shows_its_tasks_an_nvidia_smi() {
    let app = spawn_app_with(Backend::Sqlite, |_| {}).await;
    let op = app.operator().await;
    let runtime = ProcessRuntime::detect(&IsolationConfig::default())
        .unwrap()
        .with_simulated_smi(agent_binary());
    let agent = start_agent_with(&app, &op, "sim-1", "4xA40", Arc::new(runtime), &[]).await;
    let s = app.signup("ada@example.com", "Lab").await;
    let script = "nvidia-smi -L && nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader && nvidia-smi && nvidia-smi -i 7; echo \"code $?\"";
    let id = submit(
        &app,
        &s,
        json!({"name": "smi", "image": "none", "command": script,
        "resources": {"gpu": {"count": 2}}}),
    )
    .await;
    let t = wait_for(&app, &s, &id, &["completed", "failed"], 60).await;
    let logs = log_text(&app, &s, &id).await;
    assert_eq!(t["state"], "completed", "{t}\n{logs}");
    assert!(
        logs.contains("GPU 0: NVIDIA A40 (UUID: GPU-")
            && logs.contains("GPU 1: NVIDIA A40")
            && !logs.contains("GPU 2:"),
        "only the task's two GPUs, numbered from 0: {logs}"
    );
    assert!(logs.contains("0, NVIDIA A40, 49152 MiB"), "{logs}");
    assert!(logs.contains("simulated by autodl"), "{logs}");
    assert!(
        logs.contains("No devices were found with the ID \"7\"") && logs.contains("code 6"),
        "{logs}"
    );
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}

/// The `autodl-agent` binary next to this test's executable (scripts/test.sh builds it).
pub fn agent_binary() -> std::path::PathBuf {
    if let Ok(p) = std::env::var("AUTODL_AGENT_BIN") {
        return p.into();
    }
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let bin = dir.join("autodl-agent");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p autodl-agent` (scripts/test.sh does)",
        bin.display()
    );
    bin
}

async fn lost_agent_tasks_finish_elsewhere(b: Backend) {
    let app = spawn_app_with(b, |s| s.node_lost_timeout_secs = 12).await;
    let op = app.operator().await;
    // The first agent is a separate process, so it can die the hard way.
    let token = app.registration_token(&op, "sim-1").await;
    let dir = tempfile::tempdir().unwrap();
    let mut first = std::process::Command::new(agent_binary())
        .args([
            "--server",
            &app.address,
            "--token",
            &token,
            "--node-id",
            "sim-1",
        ])
        .args([
            "--simulate",
            "1xA100-40G",
            "--runtime",
            "process",
            "--metrics-listen",
            "off",
            "--poll-wait",
            "2s",
        ])
        .arg("--state-dir")
        .arg(dir.path())
        .env("RUST_LOG", "warn")
        .spawn()
        .unwrap();
    let s = app.signup("l@example.com", "Lab").await;
    let id = submit(&app, &s, json!({"name": "long", "image": "none", "command": "echo on attempt $AUTODL_ATTEMPT; sleep 3; echo finished",
        "resources": {"gpu": {"type": "A100", "count": 1}}})).await;
    wait_for(&app, &s, &id, &["running"], 30).await;
    // A second node is there to take over; the first agent is killed without a word.
    let second = start_agent(&app, &op, "sim-2", "1xA100-40G").await;
    first.kill().unwrap();
    first.wait().unwrap();
    let t = wait_for(&app, &s, &id, &["completed"], 60).await;
    assert_eq!(t["attempts"], 2, "{t}");
    let attempts = s.get(&app, &format!("/api/v1/tasks/{id}/attempts")).await;
    assert_eq!(attempts[0]["reason"], "node_lost");
    assert_eq!(attempts[0]["node"], "sim-1");
    assert_eq!(attempts[1]["node"], "sim-2");
    assert!(log_text(&app, &s, &id).await.contains("on attempt 2"));
    let nodes = op.get(&app, "/api/v1/nodes").await;
    assert_eq!(
        nodes
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["id"] == "sim-1")
            .unwrap()["schedulable"],
        false
    );
    second.shutdown.cancel();
    let _ = second.handle.await;
}

async fn cancel_and_drain_deliver_sigterm(b: Backend) {
    let app = spawn_app_with(b, |_| {}).await;
    let op = app.operator().await;
    let a = start_agent(&app, &op, "sim-1", "1xA40").await;
    let s = app.signup("c@example.com", "Lab").await;
    let trap = "trap 'echo caught TERM, saving checkpoint; exit 0' TERM; echo started $AUTODL_ATTEMPT; i=0; while [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done";
    let id = submit(&app, &s, json!({"name": "cancel-me", "image": "none", "command": trap, "resources": {"gpu": {"count": 1}}})).await;
    wait_for(&app, &s, &id, &["running"], 20).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    s.send(
        &app,
        Method::POST,
        &format!("/api/v1/tasks/{id}/cancel"),
        None,
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !log_text(&app, &s, &id).await.contains("caught TERM") {
        assert!(Instant::now() < deadline, "the task never saw SIGTERM");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        s.get(&app, &format!("/api/v1/tasks/{id}/attempts")).await[0]["reason"],
        "cancelled"
    );

    // A time limit: SIGTERM at the limit, the task saves what it can and ends timed_out.
    let id = submit(&app, &s, json!({"name": "limited", "image": "none", "command": trap,
        "time_limit": "2s", "retry_policy": {"max_retries": 2}, "resources": {"gpu": {"count": 1}}})).await;
    let t = wait_for(&app, &s, &id, &["timed_out", "completed", "failed"], 30).await;
    assert_eq!(t["state"], "timed_out", "{t}");
    assert!(log_text(&app, &s, &id).await.contains("caught TERM"));
    let attempts = s.get(&app, &format!("/api/v1/tasks/{id}/attempts")).await;
    assert_eq!(attempts.as_array().unwrap().len(), 1, "{attempts}");
    assert_eq!(attempts[0]["reason"], "timed_out");

    // Drain: the running task gets SIGTERM and a grace period, then runs again on another node.
    let id = submit(&app, &s, json!({"name": "drain-me", "image": "none", "command": trap, "resources": {"gpu": {"count": 1}}})).await;
    wait_for(&app, &s, &id, &["running"], 20).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let b2 = start_agent(&app, &op, "sim-2", "1xA40").await;
    op.send(&app, Method::POST, "/api/v1/admin/nodes/sim-1/drain", None)
        .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let attempts = s.get(&app, &format!("/api/v1/tasks/{id}/attempts")).await;
        if attempts.as_array().unwrap().len() == 2 {
            assert_eq!(attempts[0]["reason"], "drained");
            assert_eq!(attempts[1]["node"], "sim-2");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the drained task never moved: {attempts}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(log_text(&app, &s, &id).await.contains("caught TERM"));
    for agent in [a, b2] {
        agent.shutdown.cancel();
        let _ = agent.handle.await;
    }
}

/// The agent running a task in a real Docker engine (scripts/test.sh starts one and imports a
/// busybox image as `AUTODL_TEST_DOCKER_IMAGE`), with the CPU and memory limits applied.
async fn docker_runtime_runs_tasks_with_limits(b: Backend) {
    let Ok(image) = std::env::var("AUTODL_TEST_DOCKER_IMAGE") else {
        crate::helpers::skip(
            "AUTODL_TEST_DOCKER_IMAGE is not set (scripts/test.sh starts Docker and sets it)",
        );
        return;
    };
    let app = spawn_app_with(b, |_| {}).await;
    let op = app.operator().await;
    let token = app.registration_token(&op, "docker").await;
    let dir = tempfile::tempdir().unwrap();
    let config = AgentConfig::new(app.address.clone())
        // Per backend: both share one Docker engine, and an agent removes its node's leftovers.
        .node_id(format!("docker-{b:?}").to_lowercase())
        .registration_token(&token)
        .state_dir(dir.path().to_path_buf())
        .cpu(4)
        .memory(8 << 30);
    let runtime = autodl_agent::DockerRuntime::connect()
        .await
        .expect("Docker engine");
    let agent = Agent::new(
        config,
        Arc::new(SimulatedBackend::from_spec("1xA40", 3).unwrap()),
        Arc::new(runtime),
    )
    .unwrap();
    let shutdown = CancellationToken::new();
    let t = shutdown.clone();
    let handle = tokio::spawn(async move {
        let _ = agent.run(t).await;
    });
    let s = app.signup("d@example.com", "Lab").await;
    let cmd = "echo in container $AUTODL_TASK_ID; cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes; \
               cat /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us; echo results > $AUTODL_RESULTS_DIR/out.txt; exit 0";
    let id = submit(
        &app,
        &s,
        json!({"name": "docker", "image": image, "command": cmd,
        "resources": {"gpu": {"count": 1}, "cpu": 0.5, "memory": "256MiB"}}),
    )
    .await;
    let t = wait_for(&app, &s, &id, &["completed", "failed"], 60).await;
    let text = log_text(&app, &s, &id).await;
    assert_eq!(t["state"], "completed", "{t}\n{text}");
    assert!(text.contains(&format!("in container {id}")), "{text}");
    assert!(
        text.contains("268435456"),
        "memory limit not applied: {text}"
    );
    assert!(text.contains("50000"), "CPU limit not applied: {text}");

    // A session in a container: commands and a shell through `docker exec`, as the task's
    // user in its working directory, and its declared port at the container's address.
    use crate::tunnels::{connect, exec_path, read_to_end, read_until, stdin};
    use futures_util::SinkExt;
    let id = submit(
        &app,
        &s,
        json!({"name": "web", "image": image, "kind": "session", "ports": [8080],
        "command": "echo hello-from-docker > /autodl/home/index.html && exec httpd -f -p 8080 -h /autodl/home",
        "resources": {"gpu": {"count": 1}}}),
    )
    .await;
    wait_for(&app, &s, &id, &["running"], 60).await;
    let mut ws = connect(
        &app,
        &s,
        &exec_path(&id, &["sh", "-c", "pwd; echo err >&2; exit 7"]),
    )
    .await
    .unwrap();
    let ended = read_to_end(&mut ws, 30).await;
    assert_eq!(
        (ended.stdout.as_str(), ended.stderr.as_str(), ended.exit),
        ("/autodl/home\n", "err\n", Some(7)),
        "{ended:?}"
    );
    let mut ws = connect(
        &app,
        &s,
        &format!("/api/v1/tasks/{id}/shell?cols=90&rows=20"),
    )
    .await
    .unwrap();
    ws.send(stdin("stty size; echo $((6*7))\n")).await.unwrap();
    let seen = read_until(&mut ws, "42", 20).await;
    assert!(seen.contains("20 90"), "{seen}");
    ws.send(stdin("exit 3\n")).await.unwrap();
    assert_eq!(read_to_end(&mut ws, 20).await.exit, Some(3));
    let mut page = String::new();
    for _ in 0..50 {
        let mut ws = connect(&app, &s, &format!("/api/v1/tasks/{id}/ports/8080"))
            .await
            .unwrap();
        ws.send(tokio_tungstenite::tungstenite::Message::binary(
            b"GET /index.html HTTP/1.0\r\n\r\n".to_vec(),
        ))
        .await
        .unwrap();
        page.clear();
        while let Ok(Some(Ok(m))) = tokio::time::timeout(
            Duration::from_secs(10),
            futures_util::StreamExt::next(&mut ws),
        )
        .await
        {
            match m {
                tokio_tungstenite::tungstenite::Message::Binary(b) => {
                    page.push_str(&String::from_utf8_lossy(&b))
                }
                tokio_tungstenite::tungstenite::Message::Close(_) => break,
                _ => {}
            }
        }
        if page.contains("hello-from-docker") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(page.contains("hello-from-docker"), "{page}");
    shutdown.cancel();
    let _ = handle.await;
}
