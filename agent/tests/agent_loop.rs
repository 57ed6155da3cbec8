//! The agent loop against a small in-test stand-in for the server's agent API. The real
//! server's end-to-end test exercises the same protocol against the real implementation; this
//! one pins the agent's side: order of reports, retries while the server is away, credentials.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use autodl_agent::protocol::{FinishedReport, LogBatch, MetricBatch, PollRequest, RegisterRequest};
use autodl_agent::{
    Agent, AgentConfig, CancellationToken, IsolationConfig, ProcessRuntime, SimulatedBackend,
};

fn nix_is_root() -> bool {
    autodl_agent::isolation::is_root()
}
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
struct State {
    /// When false every call answers 503, as a restarting server behind a proxy would.
    down: bool,
    /// Answer polls with 401 once (a revoked credential).
    reject_next_poll: bool,
    /// Log bodies over this many bytes get 413, as a server with a tight body limit answers.
    log_body_limit: Option<usize>,
    /// Log batches refused as too large.
    refused_logs: usize,
    /// Every log and metric batch carried the agent's clock at sending.
    unstamped: usize,
    registrations: Vec<RegisterRequest>,
    polls: Vec<(Option<String>, PollRequest)>,
    queued: VecDeque<Value>,
    started: Vec<(String, u32)>,
    logs: Vec<(String, LogBatch)>,
    finished: Vec<(String, FinishedReport)>,
    samples: Vec<Value>,
    /// Order of calls, e.g. "started:t1", "logs:t1", "finished:t1".
    events: Vec<String>,
}

#[derive(Clone)]
struct Fake {
    url: String,
    state: Arc<Mutex<State>>,
}

impl Fake {
    async fn start() -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State::default()));
        let s = state.clone();
        tokio::spawn(async move {
            loop {
                let (conn, _) = listener.accept().await.unwrap();
                tokio::spawn(handle(conn, s.clone()));
            }
        });
        Fake { url, state }
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.state.lock().unwrap())
    }

    async fn until<R>(&self, what: &str, f: impl Fn(&State) -> Option<R>) -> R {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(r) = f(&self.state.lock().unwrap()) {
                return r;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn handle(mut conn: TcpStream, state: Arc<Mutex<State>>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let (head, body) = loop {
        let n = conn.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..pos]).to_string();
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            while buf.len() < pos + 4 + len {
                let n = conn.read(&mut chunk).await.unwrap_or(0);
                if n == 0 {
                    return;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            break (head, buf[pos + 4..pos + 4 + len].to_vec());
        }
    };
    let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
    let auth = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("authorization")
            .then(|| v.trim().trim_start_matches("Bearer ").to_string())
    });
    let (status, answer) = route(&path, auth, &body, &state).await;
    let text = answer.to_string();
    let resp = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
    let _ = conn.write_all(resp.as_bytes()).await;
}

async fn route(
    path: &str,
    auth: Option<String>,
    body: &[u8],
    state: &Mutex<State>,
) -> (u16, Value) {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    if state.lock().unwrap().down {
        return (
            503,
            json!({"error": {"code": "unavailable", "message": "down"}}),
        );
    }
    if path == "/api/v1/agent/register" {
        let req: RegisterRequest = serde_json::from_value(v).unwrap();
        if req.token != "adlreg_good" {
            return (
                401,
                json!({"error": {"code": "unauthorized", "message": "bad token"}}),
            );
        }
        let id = req.node.id.clone();
        let mut s = state.lock().unwrap();
        s.registrations.push(req);
        let cred = format!("adln_{}", s.registrations.len());
        return (201, json!({"node_id": id, "credential": cred}));
    }
    let Some(cred) = auth.filter(|a| a.starts_with("adln_")) else {
        return (
            401,
            json!({"error": {"code": "unauthorized", "message": "no credential"}}),
        );
    };
    if path.starts_with("/api/v1/agent/poll") {
        let req: PollRequest = serde_json::from_value(v).unwrap();
        {
            let mut s = state.lock().unwrap();
            if std::mem::take(&mut s.reject_next_poll) {
                return (
                    401,
                    json!({"error": {"code": "unauthorized", "message": "revoked"}}),
                );
            }
            s.polls.push((Some(cred), req));
        }
        // Long poll: answer when work is queued, else after a short hold.
        let deadline = Instant::now() + Duration::from_millis(300);
        loop {
            if let Some(work) = state.lock().unwrap().queued.pop_front() {
                return (200, work);
            }
            if Instant::now() >= deadline {
                return (
                    200,
                    json!({"assignments": [], "stop": [], "heartbeat_s": 5}),
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    if path == "/api/v1/agent/metrics" {
        let b: MetricBatch = serde_json::from_value(v.clone()).unwrap();
        assert!(!b.samples.is_empty());
        let mut s = state.lock().unwrap();
        if v["sent_at"].as_str().is_none() {
            s.unstamped += 1;
        }
        s.samples
            .extend(v["samples"].as_array().unwrap().iter().cloned());
        return (200, json!({}));
    }
    let rest = path.strip_prefix("/api/v1/agent/tasks/").unwrap_or("");
    let (task, what) = rest.split_once('/').unwrap_or(("", ""));
    let mut s = state.lock().unwrap();
    if what == "logs" && s.log_body_limit.is_some_and(|l| body.len() > l) {
        s.refused_logs += 1;
        return (
            413,
            json!({"error": {"code": "payload_too_large", "message": "too large"}}),
        );
    }
    if (what == "logs" || path == "/api/v1/agent/metrics") && v["sent_at"].as_str().is_none() {
        s.unstamped += 1;
    }
    s.events.push(format!("{what}:{task}"));
    match what {
        "started" => s
            .started
            .push((task.into(), v["attempt"].as_u64().unwrap() as u32)),
        "logs" => {
            let b: LogBatch = serde_json::from_value(v).unwrap();
            assert!(b.lines.len() <= 1000);
            s.logs.push((task.into(), b));
        }
        "finished" => s
            .finished
            .push((task.into(), serde_json::from_value(v).unwrap())),
        _ => return (404, json!({})),
    }
    (200, json!({}))
}

fn config(fake: &Fake, state_dir: &std::path::Path, node: &str) -> AgentConfig {
    AgentConfig::new(&fake.url)
        .node_id(node)
        .zone("z1")
        .label("rack", "3")
        .cpu(64)
        .memory(512 << 30)
        .state_dir(state_dir)
        .sample_interval(Duration::from_millis(100))
        .poll_wait(Duration::from_secs(1))
        .backoff_initial(Duration::from_millis(50))
        .backoff_max(Duration::from_millis(300))
        .log_flush_interval(Duration::from_millis(50))
        .shutdown_grace(Duration::from_secs(2))
}

fn start(
    agent: &Agent,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<Result<(), autodl_agent::AgentError>>,
) {
    let token = CancellationToken::new();
    let (a, t) = (agent.clone(), token.clone());
    (token, tokio::spawn(async move { a.run(t).await }))
}

fn assignment(task: &str, script: &str, gpus: &[u32]) -> Value {
    json!({"assignments": [{
        "task_id": task, "attempt": 1, "image": "ignored", "command": ["sh", "-c", script],
        "env": {"AUTODL_BATCH_SIZE": "32", "RANK": "0", "WORLD_SIZE": "1"},
        "gpu_indices": gpus, "gpu_memory": null, "cpu": 2.0, "memory": 1073741824u64,
        "data_path": null, "checkpoint": null}],
        "stop": [], "heartbeat_s": 5})
}

fn log_text(s: &State, task: &str) -> Vec<String> {
    s.logs
        .iter()
        .filter(|(t, _)| t == task)
        .flat_map(|(_, b)| b.lines.iter().map(|l| l.line.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_runs_reports_and_samples() {
    let fake = Fake::start().await;
    let dir = tempfile::tempdir().unwrap();
    // As root (CI) the task runs sandboxed as its own uid: the protocol is the same.
    let runtime = if nix_is_root() {
        ProcessRuntime::detect(&IsolationConfig::default()).expect("isolation detected")
    } else {
        ProcessRuntime::trusted()
    };
    let agent = Agent::new(
        config(&fake, dir.path(), "node-a").registration_token("adlreg_good"),
        Arc::new(SimulatedBackend::from_spec("2xA100-40G", 7).unwrap()),
        Arc::new(runtime),
    )
    .unwrap();
    let (stop, handle) = start(&agent);

    // Registration carries the node's facts; the credential lands in the state dir, 0600.
    let reg = fake
        .until("registration", |s| s.registrations.first().cloned())
        .await;
    assert_eq!(reg.node.id, "node-a");
    assert_eq!(reg.node.zone, "z1");
    assert_eq!(reg.node.labels["rack"], "3");
    assert_eq!((reg.node.cpu, reg.node.memory), (64.0, 512 << 30));
    assert_eq!(reg.node.gpus.len(), 2);
    assert_eq!(reg.node.gpus[1].gpu_type, "A100-40G");
    let host = reg.node.host.as_ref().expect("the agent reports its host");
    assert_eq!(host.runtime, "process");
    let expected = if nix_is_root() { "sandbox" } else { "none" };
    assert_eq!(host.isolation, expected);
    fake.until("a poll", |s| (!s.polls.is_empty()).then_some(()))
        .await;
    let cred_file = dir.path().join("credential.json");
    let meta = std::fs::metadata(&cred_file).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert!(std::fs::read_to_string(&cred_file)
        .unwrap()
        .contains("adln_1"));
    fake.with(|s| assert_eq!(s.polls[0].0.as_deref(), Some("adln_1")));

    fake.with(|s| {
        s.queued.push_back(assignment(
            "t1",
            "echo hello; echo \"id=$AUTODL_TASK_ID bs=$AUTODL_BATCH_SIZE gpus=$CUDA_VISIBLE_DEVICES\"; echo oops >&2; sleep 1; exit 0",
            &[1],
        ))
    });
    // While it runs, polls list it and GPU 1's samples carry its id and memory.
    fake.until("task listed as running", |s| {
        s.polls
            .iter()
            .any(|(_, p)| p.running.iter().any(|r| r.task_id == "t1"))
            .then_some(())
    })
    .await;
    let sample = fake
        .until("a sample tagged with the task", |s| {
            s.samples.iter().find(|x| x["task_id"] == "t1").cloned()
        })
        .await;
    assert_eq!(sample["gpu_index"], 1);
    assert_eq!(
        sample["mem_used"].as_u64().unwrap(),
        (40.0 * (1u64 << 30) as f64 * 0.8) as u64
    );
    let finished = fake
        .until("finished", |s| s.finished.first().cloned())
        .await;
    assert_eq!(finished.0, "t1");
    assert_eq!(finished.1.exit_code, Some(0));
    assert_eq!(finished.1.reason.as_str(), "success");
    fake.with(|s| {
        assert_eq!(s.started, vec![("t1".to_string(), 1)]);
        let lines = log_text(s, "t1");
        assert!(lines.contains(&"hello".to_string()), "{lines:?}");
        assert!(
            lines.contains(&"id=t1 bs=32 gpus=1".to_string()),
            "{lines:?}"
        );
        assert!(lines.contains(&"oops".to_string()));
        // started, then logs, then finished.
        let ev: Vec<&str> = s.events.iter().map(String::as_str).collect();
        assert_eq!(ev.first(), Some(&"started:t1"));
        assert_eq!(ev.last(), Some(&"finished:t1"));
        // Idle GPU 0 samples carry no task.
        assert!(s
            .samples
            .iter()
            .any(|x| x["gpu_index"] == 0 && x["task_id"].is_null() && x["util"] == 0.0));
    });
    // Once reported, it leaves the running list.
    fake.with(|s| s.polls.clear());
    fake.until("poll without the task", |s| {
        s.polls
            .iter()
            .any(|(_, p)| p.running.is_empty())
            .then_some(())
    })
    .await;
    let text = agent.metrics_text();
    assert!(
        text.contains("autodl_agent_server_reachable{node=\"node-a\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("autodl_agent_tasks_finished_total{reason=\"success\",node=\"node-a\"} 1"),
        "{text}"
    );

    stop.cancel();
    handle.await.unwrap().unwrap();

    // A restart reuses the saved credential: no second registration, no token needed.
    let agent2 = Agent::new(
        config(&fake, dir.path(), "node-a"),
        Arc::new(SimulatedBackend::from_spec("2xA100-40G", 7).unwrap()),
        Arc::new(ProcessRuntime::trusted()),
    )
    .unwrap();
    fake.with(|s| s.polls.clear());
    let (stop, handle) = start(&agent2);
    fake.until("poll after restart", |s| {
        s.polls.first().map(|p| p.0.clone())
    })
    .await;
    fake.with(|s| {
        assert_eq!(s.registrations.len(), 1);
        assert_eq!(s.polls[0].0.as_deref(), Some("adln_1"));
    });
    // A revoked credential without a token to re-register ends the agent with an error.
    fake.with(|s| s.reject_next_poll = true);
    let err = tokio::time::timeout(Duration::from_secs(10), handle)
        .await
        .expect("agent gives up")
        .unwrap()
        .unwrap_err();
    assert!(err.to_string().contains("no registration token"), "{err}");
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_order_and_oom_reasons() {
    let fake = Fake::start().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::new(
        config(&fake, dir.path(), "node-b").registration_token("adlreg_good"),
        Arc::new(SimulatedBackend::from_spec("1xA40", 1).unwrap()),
        Arc::new(ProcessRuntime::trusted()),
    )
    .unwrap();
    let (stop, handle) = start(&agent);
    fake.with(|s| {
        s.queued.push_back(assignment(
            "long",
            "trap 'echo checkpointing; exit 0' TERM; echo ready; while true; do sleep 0.1; done",
            &[0],
        ));
        s.queued.push_back(assignment(
            "oom",
            "echo 'RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB' >&2; exit 1",
            &[],
        ));
    });
    fake.until("long task output", |s| {
        log_text(s, "long")
            .contains(&"ready".to_string())
            .then_some(())
    })
    .await;
    fake.with(|s| {
        s.queued.push_back(json!({"assignments": [], "stop": [
            {"task_id": "long", "attempt": 1, "grace_s": 10, "reason": "preempted"}]}))
    });
    let reasons = fake
        .until("both finished", |s| {
            (s.finished.len() == 2).then(|| {
                let mut v: Vec<_> = s
                    .finished
                    .iter()
                    .map(|(t, f)| (t.clone(), f.reason.as_str(), f.exit_code))
                    .collect();
                v.sort();
                v
            })
        })
        .await;
    assert_eq!(
        reasons,
        vec![
            ("long".to_string(), "stopped", Some(0)),
            ("oom".to_string(), "oom", Some(1))
        ]
    );
    fake.with(|s| assert!(log_text(s, "long").contains(&"checkpointing".to_string())));
    stop.cancel();
    handle.await.unwrap().unwrap();
}

/// A server whose body limit is far below the agent's batches refuses them with 413: the
/// agent sends less at a time and loses no line (it used to drop the refused batch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_refused_as_too_large_are_split_not_dropped() {
    let fake = Fake::start().await;
    fake.with(|s| s.log_body_limit = Some(24 * 1024));
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::new(
        config(&fake, dir.path(), "node-l").registration_token("adlreg_good"),
        Arc::new(SimulatedBackend::from_spec("1xA40", 1).unwrap()),
        Arc::new(ProcessRuntime::trusted()),
    )
    .unwrap();
    let (stop, handle) = start(&agent);
    // 2,000 lines of 300 characters, then one line longer than the whole limit.
    fake.with(|s| {
        s.queued.push_back(assignment(
            "chatty",
            "i=0; while [ $i -lt 2000 ]; do printf 'line %05d %0290d\n' $i 0; i=$((i+1)); done; \
             head -c 40000 /dev/zero | tr '\\0' x; echo",
            &[],
        ))
    });
    fake.until("the task finished", |s| {
        (!s.finished.is_empty()).then_some(())
    })
    .await;
    fake.with(|s| {
        let lines = log_text(s, "chatty");
        assert!(s.refused_logs > 0, "the limit was never hit");
        for (i, l) in lines.iter().take(2000).enumerate() {
            assert!(
                l.starts_with(&format!("line {i:05} ")),
                "line {i} is {l:.20}"
            );
        }
        // The runtime reads a line longer than 16 KiB in pieces; each piece that alone is
        // over the limit is cut, never dropped.
        let rest = &lines[2000..];
        assert!(!rest.is_empty(), "the long line arrives");
        assert!(
            rest.iter()
                .all(|l| l.len() >= 4096 && l.bytes().all(|b| b == b'x')),
            "the long line is cut, not lost: {:?}",
            rest.iter().map(String::len).collect::<Vec<_>>()
        );
        assert_eq!(s.unstamped, 0, "batches carry the agent's clock");
    });
    stop.cancel();
    handle.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keeps_running_while_the_server_is_away() {
    let fake = Fake::start().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::new(
        config(&fake, dir.path(), "node-c").registration_token("adlreg_good"),
        Arc::new(SimulatedBackend::from_spec("1xT4", 1).unwrap()),
        Arc::new(ProcessRuntime::trusted()),
    )
    .unwrap();
    let (stop, handle) = start(&agent);
    fake.with(|s| {
        s.queued.push_back(assignment(
            "t",
            "echo first; sleep 0.6; for i in $(seq 1 1200); do echo line $i; done; echo last; exit 2",
            &[0],
        ))
    });
    fake.until("first line", |s| {
        log_text(s, "t")
            .contains(&"first".to_string())
            .then_some(())
    })
    .await;
    // The server goes away while the task keeps writing and then exits.
    fake.with(|s| s.down = true);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let text = agent.metrics_text();
    assert!(
        text.contains("autodl_agent_tasks_running{node=\"node-c\"} 0"),
        "task ended meanwhile: {text}"
    );
    fake.with(|s| {
        assert!(s.finished.is_empty());
        s.samples.clear();
        s.down = false;
    });
    // Back: everything buffered arrives, in order, then finished.
    let f = fake
        .until("finished after outage", |s| s.finished.first().cloned())
        .await;
    assert_eq!((f.1.exit_code, f.1.reason.as_str()), (Some(2), "error"));
    fake.with(|s| {
        let lines = log_text(s, "t");
        assert_eq!(
            lines.len(),
            1202,
            "first, 1200 lines, last and nothing dropped"
        );
        assert_eq!(lines.last().unwrap(), "last");
        assert!(s.logs.iter().all(|(_, b)| b.lines.len() <= 1000));
        assert_eq!(s.events.last().unwrap(), "finished:t");
    });
    // Samples taken during the outage were kept and sent afterwards.
    fake.until("buffered samples", |s| {
        (s.samples.len() >= 10).then_some(())
    })
    .await;
    stop.cancel();
    handle.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_token_is_fatal_and_revoked_credential_re_registers() {
    let fake = Fake::start().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::new(
        config(&fake, dir.path(), "node-d").registration_token("adlreg_bad"),
        Arc::new(SimulatedBackend::from_spec("1xT4", 1).unwrap()),
        Arc::new(ProcessRuntime::trusted()),
    )
    .unwrap();
    let err = agent.run(CancellationToken::new()).await.unwrap_err();
    assert!(err.to_string().contains("registration refused"), "{err}");

    let agent = Agent::new(
        config(&fake, dir.path(), "node-d").registration_token("adlreg_good"),
        Arc::new(SimulatedBackend::from_spec("1xT4", 1).unwrap()),
        Arc::new(ProcessRuntime::trusted()),
    )
    .unwrap();
    let (stop, handle) = start(&agent);
    fake.until("first poll", |s| (!s.polls.is_empty()).then_some(()))
        .await;
    fake.with(|s| s.reject_next_poll = true);
    fake.until("second registration", |s| {
        (s.registrations.len() == 2).then_some(())
    })
    .await;
    fake.until("poll with new credential", |s| {
        s.polls
            .iter()
            .any(|p| p.0.as_deref() == Some("adln_2"))
            .then_some(())
    })
    .await;
    stop.cancel();
    handle.await.unwrap().unwrap();
}

#[tokio::test]
async fn unreachable_server_at_start_retries_until_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = AgentConfig::new("http://127.0.0.1:9")
        .node_id("node-e")
        .state_dir(dir.path())
        .registration_token("adlreg_good")
        .backoff_initial(Duration::from_millis(20))
        .backoff_max(Duration::from_millis(100));
    let agent = Agent::new(
        cfg,
        Arc::new(SimulatedBackend::from_spec("1xT4", 1).unwrap()),
        Arc::new(ProcessRuntime::trusted()),
    )
    .unwrap();
    let (stop, handle) = start(&agent);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!handle.is_finished(), "still retrying");
    assert!(agent
        .metrics_text()
        .contains("autodl_agent_server_reachable{node=\"node-e\"} 0"));
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(5), handle)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
