//! The scale harness: a real `autodl-server` process drives a large simulated cluster.
//!
//!   cargo bench -p autodl-server --bench scale                 # SQLite
//!   AUTODL_BENCH_PG_URL=postgres://... cargo bench -p autodl-server --bench scale
//!
//! It starts the server binary on a fresh database, registers `AUTODL_SCALE_NODES` (200)
//! simulated agents of 8 GPUs over the real agent protocol (all in this process, one task
//! each), signs up `AUTODL_SCALE_USERS` (20) researchers, and submits `AUTODL_SCALE_TASKS`
//! (3,000) tasks through the API from `AUTODL_SCALE_CLIENTS` (64) concurrent clients. Tasks are
//! the jobs of the Helios CSV named by `AUTODL_SCALE_TRACE` (GPU counts capped at one node,
//! run times divided by `AUTODL_SCALE_COMPRESS`, 2,000) or a synthetic mix. Each asks for its
//! own CPU, memory and (for shared GPUs) GPU memory, drawn with a fixed seed, as real users'
//! tasks differ. Agents start what they are assigned, run it for its (compressed) run time and
//! report it finished; they stop what they are told to stop.
//!
//! It reports submissions per second and their latency, the server's scheduling cycle time and
//! placement-to-start latency (from its own Prometheus histograms), the server process's CPU
//! and peak RSS, and the database size; the cycle and start quantiles also over the time after
//! the submissions alone (a steady queue). It ends when every task finished, or after
//! `AUTODL_SCALE_SECS` (600).

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use autodl_agent::client::ServerClient;
use autodl_common::agent::{
    AgentGpu, AgentHost, AgentNode, ExitReason, FinishedReport, PollRequest, RegisterRequest,
    RunningRef,
};
use futures_util::stream::{self, StreamExt};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

mod support;
use support::{env_num, percentile};

const GIB: u64 = 1 << 30;
const PASSWORD: &str = "Scale-passw0rd";
const METRICS_TOKEN: &str = "scale-harness";

/// One task to submit: who, what it asks for, how long it runs once started.
struct Work {
    user: usize,
    gpus: u32,
    gpu_memory: Option<u64>,
    cpu: f64,
    memory: u64,
    run: Duration,
}

fn workload(n: usize, users: usize, compress: u64) -> anyhow::Result<Vec<Work>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let shapes: Vec<(u32, u64)> = match std::env::var("AUTODL_SCALE_TRACE") {
        Ok(path) => {
            let f = std::fs::File::open(&path).with_context(|| format!("reading {path}"))?;
            let mut jobs = autodl_scheduler::sim::jobs::read_helios(f)?;
            jobs.sort_by_key(|j| j.submit);
            jobs.iter()
                .take(n)
                .map(|j| (j.gpus.min(8), j.runtime))
                .collect()
        }
        Err(_) => (0..n)
            .map(|_| {
                let g = [1, 1, 1, 1, 2, 2, 4, 8][rng.gen_range(0..8)];
                (g, rng.gen_range(60..20_000))
            })
            .collect(),
    };
    Ok(shapes
        .into_iter()
        .map(|(gpus, runtime)| {
            let shared = gpus == 1 && rng.gen_bool(0.25);
            Work {
                user: rng.gen_range(0..users),
                gpus,
                gpu_memory: shared.then(|| rng.gen_range(4..40) * GIB),
                cpu: f64::from(gpus) * rng.gen_range(1.0..8.0),
                memory: u64::from(gpus) * rng.gen_range(4 * GIB..64 * GIB),
                run: Duration::from_millis((runtime * 1000 / compress.max(1)).max(50)),
            }
        })
        .collect())
}

/// The server process, stopped when dropped.
struct ServerProcess {
    child: std::process::Child,
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn server_command(env: &[(String, String)]) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_autodl-server"));
    cmd.envs(env.iter().map(|(k, v)| (k, v))).env(
        "RUST_LOG",
        std::env::var("RUST_LOG").unwrap_or("warn".into()),
    );
    cmd
}

/// CPU seconds (user + system) the process used so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the name and state.
    (ticks(11) + ticks(12)) / 100.0
}

/// Peak resident memory of the process, in MiB.
fn peak_rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// A Prometheus histogram's cumulative buckets: (upper bound, count), in order.
fn histogram(metrics: &str, name: &str) -> Vec<(f64, f64)> {
    let mut buckets: Vec<(f64, f64)> = metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}_bucket{{")))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            let count: f64 = l.rsplit(' ').next()?.parse().ok()?;
            Some((le, count))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    buckets
}

/// What a histogram gained between two reads (the same buckets).
fn since(now: &[(f64, f64)], before: &[(f64, f64)]) -> Vec<(f64, f64)> {
    now.iter()
        .map(|&(le, c)| {
            let b = before.iter().find(|x| x.0 == le).map_or(0.0, |x| x.1);
            (le, c - b)
        })
        .collect()
}

/// The `q` quantile of a histogram, as the upper bound of its bucket.
fn quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total == 0.0 {
        return None;
    }
    buckets
        .iter()
        .find(|(_, c)| *c >= q * total)
        .map(|(le, _)| *le)
}

fn count(buckets: &[(f64, f64)]) -> f64 {
    buckets.last().map_or(0.0, |b| b.1)
}

/// A histogram's count, p50 and p99, over the whole run and after the submissions.
fn quantiles(whole: &[(f64, f64)], after: &[(f64, f64)]) -> String {
    format!(
        "{:.0}, p50 {}, p99 {}; after the submissions: {:.0}, p50 {}, p99 {}",
        count(whole),
        fmt_le(quantile(whole, 0.5)),
        fmt_le(quantile(whole, 0.99)),
        count(after),
        fmt_le(quantile(after, 0.5)),
        fmt_le(quantile(after, 0.99)),
    )
}

fn fmt_le(v: Option<f64>) -> String {
    match v {
        Some(x) if x.is_finite() => format!("<= {:.0} ms", x * 1000.0),
        Some(_) => "above the largest bucket".into(),
        None => "-".into(),
    }
}

async fn post(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    body: Value,
) -> anyhow::Result<Value> {
    let res = http.post(url).bearer_auth(token).json(&body).send().await?;
    let status = res.status();
    let text = res.text().await?;
    anyhow::ensure!(status.is_success(), "{url}: {status}: {text}");
    Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// One simulated node: polls, starts what it is given, ends it after its run time.
async fn agent_loop(
    client: ServerClient,
    runtimes: Arc<Mutex<HashMap<String, Duration>>>,
    done: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
) {
    let mut running: Vec<(RunningRef, Instant)> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        // Runs whose time is up end first.
        let mut i = 0;
        while i < running.len() {
            if running[i].1 <= now {
                let (r, _) = running.swap_remove(i);
                let report = FinishedReport {
                    attempt: r.attempt,
                    exit_code: Some(0),
                    reason: ExitReason::Success,
                    detail: None,
                    uploading: vec![],
                    not_kept: None,
                };
                if client.finished(&r.task_id, &report).await.is_ok() {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            } else {
                i += 1;
            }
        }
        let next_end = running.iter().map(|r| r.1).min();
        let wait = next_end.map_or(Duration::from_secs(5), |t| {
            t.saturating_duration_since(now).min(Duration::from_secs(5))
        });
        let req = PollRequest {
            running: running.iter().map(|r| r.0.clone()).collect(),
            ..Default::default()
        };
        // The poll's wait is in whole seconds; shorter waits sleep instead.
        let work = if wait >= Duration::from_secs(1) {
            client.poll(Duration::from_secs(wait.as_secs()), &req).await
        } else {
            tokio::time::sleep(wait).await;
            client.poll(Duration::ZERO, &req).await
        };
        let Ok(work) = work else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        for s in work.stop {
            running.retain(|r| r.0.task_id != s.task_id);
            let report = FinishedReport {
                attempt: s.attempt,
                exit_code: None,
                reason: ExitReason::Stopped,
                detail: None,
                uploading: vec![],
                not_kept: None,
            };
            let _ = client.finished(&s.task_id, &report).await;
        }
        for a in work.assignments {
            if client.started(&a.task_id, a.attempt).await.is_err() {
                continue;
            }
            let run = runtimes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&a.task_id)
                .copied()
                .unwrap_or(Duration::from_secs(1));
            running.push((
                RunningRef {
                    task_id: a.task_id,
                    attempt: a.attempt,
                },
                Instant::now() + run,
            ));
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let nodes = env_num("AUTODL_SCALE_NODES", 200) as usize;
    let n_tasks = env_num("AUTODL_SCALE_TASKS", 3_000) as usize;
    let clients = env_num("AUTODL_SCALE_CLIENTS", 64) as usize;
    let n_users = env_num("AUTODL_SCALE_USERS", 20).max(1) as usize;
    let compress = env_num("AUTODL_SCALE_COMPRESS", 2_000);
    let limit = Duration::from_secs(env_num("AUTODL_SCALE_SECS", 600));
    let work = workload(n_tasks, n_users, compress)?;

    let dir = tempfile::tempdir()?;
    // No web app is served here; an empty one keeps the server from complaining.
    std::fs::create_dir_all(dir.path().join("pkg"))?;
    let (backend, db) = support::database(dir.path()).await?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let base = format!("http://127.0.0.1:{port}");
    let env: Vec<(String, String)> = [
        ("AUTODL_LISTEN", format!("127.0.0.1:{port}")),
        ("AUTODL_DATABASE_URL", db.clone()),
        ("AUTODL_JWT_SECRET", "scale-harness-secret".into()),
        ("AUTODL_SITE_ROOT", dir.path().display().to_string()),
        (
            "AUTODL_STORAGE_URL",
            format!("file://{}/objects", dir.path().display()),
        ),
        ("AUTODL_METRICS_TOKEN", METRICS_TOKEN.into()),
        ("AUTODL_SIGNUPS_PER_MINUTE_PER_ADDRESS", "1000000".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let status = server_command(&env)
        .args([
            "admin",
            "create-admin",
            "--email",
            "ops@scale.example",
            "--password",
            PASSWORD,
        ])
        .stdout(Stdio::null())
        .status()?;
    anyhow::ensure!(status.success(), "creating the administrator failed");
    let child = server_command(&env).arg("serve").spawn()?;
    let pid = child.id();
    let _server = ServerProcess { child };
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(clients * 2)
        .build()?;
    let up = Instant::now();
    while http.get(format!("{base}/healthz")).send().await.is_err() {
        anyhow::ensure!(
            up.elapsed() < Duration::from_secs(60),
            "the server did not start"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Nodes, each registered by its own agent.
    let login: Value = http
        .post(format!("{base}/api/v1/auth/login"))
        .json(&json!({"email": "ops@scale.example", "password": PASSWORD}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let op = login["token"]
        .as_str()
        .context("login without a token")?
        .to_owned();
    let mut agents = Vec::with_capacity(nodes);
    let mut left = nodes;
    while left > 0 {
        let uses = left.min(10_000);
        let t = post(
            &http,
            &format!("{base}/api/v1/admin/registration-tokens"),
            &op,
            json!({"name": "scale", "max_uses": uses}),
        )
        .await?;
        let token = t["token"]
            .as_str()
            .context("no registration token")?
            .to_owned();
        let registered: Vec<anyhow::Result<ServerClient>> =
            stream::iter((nodes - left)..(nodes - left + uses))
                .map(|i| {
                    let (base, token) = (base.clone(), token.clone());
                    async move {
                        let client = ServerClient::new(&base)?;
                        let gpus = (0..8)
                            .map(|g| AgentGpu {
                                index: g,
                                gpu_type: "A100-80G".into(),
                                uuid: Some(format!("GPU-scale-{i}-{g}")),
                                memory: 80 * GIB,
                            })
                            .collect();
                        let reg = client
                            .register(&RegisterRequest {
                                token,
                                node: AgentNode {
                                    id: format!("scale-{i:05}"),
                                    zone: format!("zone-{}", i % 4),
                                    labels: Default::default(),
                                    cpu: 128.0,
                                    memory: 1024 * GIB,
                                    gpus,
                                    host: Some(AgentHost {
                                        runtime: "docker".into(),
                                        isolation: "container".into(),
                                        data_roots: Vec::new(),
                                        ..Default::default()
                                    }),
                                },
                            })
                            .await?;
                        client.set_credential(Some(reg.credential));
                        Ok(client)
                    }
                })
                .buffer_unordered(16)
                .collect()
                .await;
        for r in registered {
            agents.push(r?);
        }
        left -= uses;
    }
    let runtimes: Arc<Mutex<HashMap<String, Duration>>> = Default::default();
    let done = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let loops: Vec<_> = agents
        .into_iter()
        .map(|c| tokio::spawn(agent_loop(c, runtimes.clone(), done.clone(), stop.clone())))
        .collect();

    // Researchers, each in an organization of their own.
    let mut tokens = Vec::with_capacity(n_users);
    for u in 0..n_users {
        let s = support::signup(
            &http,
            &base,
            &format!("r{u}@scale.example"),
            &format!("Lab {u}"),
        )
        .await?;
        tokens.push(s["token"].as_str().unwrap_or_default().to_owned());
    }

    // Submissions from concurrent clients, as fast as the server takes them.
    let cpu_before = cpu_seconds(pid);
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let work = Arc::new(work);
    let tokens = Arc::new(tokens);
    let submitters: Vec<_> = (0..clients)
        .map(|_| {
            let (http, base, next, work, tokens, runtimes) = (
                http.clone(),
                base.clone(),
                next.clone(),
                work.clone(),
                tokens.clone(),
                runtimes.clone(),
            );
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut errors = 0usize;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(w) = work.get(i) else { break };
                    let mut body = json!({
                        "name": format!("scale-{i}"), "image": "none", "command": "true",
                        "resources": {"gpu": {"count": w.gpus}, "cpu": w.cpu,
                                      "memory": format!("{}MiB", w.memory >> 20)},
                    });
                    if let Some(m) = w.gpu_memory {
                        body["resources"]["gpu"]["memory"] = json!(format!("{}MiB", m >> 20));
                    }
                    let t = Instant::now();
                    match post(
                        &http,
                        &format!("{base}/api/v1/tasks"),
                        &tokens[w.user],
                        body,
                    )
                    .await
                    {
                        Ok(task) => {
                            latencies.push(t.elapsed().as_secs_f64());
                            if let Some(id) = task["id"].as_str() {
                                runtimes
                                    .lock()
                                    .unwrap_or_else(|p| p.into_inner())
                                    .insert(id.to_owned(), w.run);
                            }
                        }
                        Err(e) => {
                            if errors == 0 {
                                eprintln!("submission failed: {e}");
                            }
                            errors += 1;
                        }
                    }
                }
                (latencies, errors)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let mut errors = 0;
    for s in submitters {
        let (l, e) = s.await?;
        latencies.extend(l);
        errors += e;
    }
    let submit_secs = started.elapsed().as_secs_f64();
    let cpu_submit = cpu_seconds(pid) - cpu_before;
    let accepted = latencies.len();

    let read_metrics = || async {
        anyhow::Ok(
            http.get(format!("{base}/metrics"))
                .bearer_auth(METRICS_TOKEN)
                .send()
                .await?
                .text()
                .await?,
        )
    };
    let submitted_metrics = read_metrics().await?;

    // Run until every task has finished.
    let steady_from = Instant::now();
    let cpu_steady_from = cpu_seconds(pid);
    while done.load(Ordering::Relaxed) < accepted && started.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let steady_secs = steady_from.elapsed().as_secs_f64();
    let cpu_steady = cpu_seconds(pid) - cpu_steady_from;
    let metrics = read_metrics().await?;
    let db_mib = match backend {
        "sqlite" => {
            let path = db.trim_start_matches("sqlite://");
            ["", "-wal", "-shm"]
                .iter()
                .filter_map(|s| std::fs::metadata(format!("{path}{s}")).ok())
                .map(|m| m.len())
                .sum::<u64>() as f64
                / (1 << 20) as f64
        }
        _ => {
            let pool = sqlx::PgPool::connect(&db).await?;
            let (size,): (i64,) = sqlx::query_as("SELECT pg_database_size(current_database())")
                .fetch_one(&pool)
                .await?;
            size as f64 / (1 << 20) as f64
        }
    };
    stop.store(true, Ordering::Relaxed);
    for l in loops {
        l.abort();
    }

    let cycle = "autodl_scheduling_cycle_seconds";
    let dispatch = "autodl_dispatch_latency_seconds";
    println!(
        "scale: {nodes} nodes x 8 GPUs, {accepted} of {n_tasks} tasks accepted ({errors} refused), \
         {n_users} users, {clients} clients, {backend} backend"
    );
    println!(
        "submissions: {:.0}/s over {submit_secs:.1} s; latency p50 {:.1} ms, p99 {:.1} ms",
        accepted as f64 / submit_secs,
        percentile(&mut latencies.clone(), 50.0) * 1000.0,
        percentile(&mut latencies, 99.0) * 1000.0
    );
    let of = |name: &str| {
        let whole = histogram(&metrics, name);
        let after = since(&whole, &histogram(&submitted_metrics, name));
        quantiles(&whole, &after)
    };
    println!("scheduling cycles: {}", of(cycle));
    println!("placement -> process start: {}", of(dispatch));
    println!(
        "finished: {} of {accepted} in {:.1} s",
        done.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );
    println!(
        "server CPU: {:.2} cores while submitting, {:.2} cores after (agents polling, tasks \
         starting and ending); peak RSS {:.0} MiB; database {db_mib:.1} MiB",
        cpu_submit / submit_secs,
        cpu_steady / steady_secs.max(1e-9),
        peak_rss_mib(pid)
    );
    Ok(())
}
