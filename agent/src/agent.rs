//! The agent loop: join, long-poll for work, run it, report it, sample GPUs.
//!
//! Tasks never depend on the server being reachable: their output and the GPU samples wait in
//! bounded buffers, and reports are retried with backoff until the server answers.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::artifacts;
use crate::backoff::{entropy_seed, Backoff};
use crate::client::ServerClient;
use crate::config::AgentConfig;
use crate::error::{AgentError, ClientError, RuntimeError};
use crate::gpu::{AgentGpu, GpuAllocation, GpuBackend};
use crate::hostinfo;
use crate::isolation::{UidLease, UidPool};
use crate::logs::LogBuffer;
use crate::metrics::AgentMetrics;
use crate::outbox::{Kept, Outbox, Part};
use crate::protocol::{
    now_rfc3339, AgentHost, AgentNode, Assignment, ExitReason, FinishedReport, GpuSample, LogBatch,
    MetricBatch, NotKeptReport, PollRequest, PollResponse, RegisterRequest, RestoreRef, RunningRef,
    Stream,
};
use crate::runtime::DataMount;
use crate::runtime::{classify_exit, RunOutcome, Runtime, TaskIo, TaskLaunch};
use crate::state::{load_credential, save_credential, SavedCredential};

/// Protocol limits per call.
const MAX_LOG_LINES_PER_CALL: usize = 1000;
/// JSON bytes of log lines per call: well inside the server's default 256 KiB body limit. A
/// server configured tighter answers 413, and the agent halves this until batches fit.
const LOG_BATCH_BYTES: usize = 192 * 1024;
/// Below this a refused batch is a single line, which is cut instead.
const MIN_LOG_BATCH_BYTES: usize = 4 * 1024;
const MAX_SAMPLES_PER_CALL: usize = 10_000;

type TaskKey = (String, u32);

struct TaskEntry {
    stop: watch::Sender<Option<Duration>>,
    allocation: GpuAllocation,
    /// The attempt ended but the server has not acknowledged `finished` yet; it is still
    /// listed as running in polls so the server does not take it for lost meanwhile.
    finished: bool,
    /// The attempt as the runtime started it, for commands and ports people open into it.
    launch: Option<TaskLaunch>,
}

struct Inner {
    config: AgentConfig,
    backend: Arc<dyn GpuBackend>,
    runtime: Arc<dyn Runtime>,
    client: ServerClient,
    metrics: AgentMetrics,
    tasks: Mutex<HashMap<TaskKey, TaskEntry>>,
    samples: Mutex<VecDeque<GpuSample>>,
    inventory: Mutex<Vec<AgentGpu>>,
    tracker: TaskTracker,
    /// Serialises dataset downloads, so two tasks on one node do not fetch the same data twice.
    data_lock: tokio::sync::Mutex<()>,
    /// Task uids, when the runtime runs each task as its own user.
    uids: Option<UidPool>,
    /// Ports of the rendezvous of gangs meeting on this node.
    ports: crate::ports::PortLeases,
    /// Current byte budget of one log batch (see `LOG_BATCH_BYTES`).
    log_batch_bytes: std::sync::atomic::AtomicUsize,
    /// Current number of GPU samples per call, halved when the server finds a batch too large.
    samples_per_call: std::sync::atomic::AtomicUsize,
    /// When the server last answered, and its node timeout as it last said (see [`fence`]).
    last_heard: Mutex<Instant>,
    node_lost_s: std::sync::atomic::AtomicU64,
    /// Ended attempts kept on disk until the server has their report and folders.
    outbox: Outbox,
    /// Kept attempts whose end the server has not heard yet (from an earlier agent run):
    /// listed as running in polls, so the server does not take them for lost meanwhile.
    unreported: Mutex<std::collections::BTreeSet<TaskKey>>,
}

/// The agent's fence: after `node_lost / 2` without an answer from the server, it stops its
/// tasks with a grace of `node_lost / 3`, so that they have ended (checkpointed, then killed)
/// before the server, hearing nothing for `node_lost`, runs them elsewhere: a task never runs
/// twice at once. With the server's default 30 s: tasks stop from 15 s of silence, gone by 25 s.
pub fn fence(node_lost: Duration) -> (Duration, Duration) {
    (node_lost / 2, node_lost / 3)
}

/// The server's node timeout assumed until it says its own.
const DEFAULT_NODE_LOST: Duration = Duration::from_secs(30);

/// One node agent. Cheap to clone (all clones share the same state); run it once.
///
/// ```no_run
/// # async fn demo() -> Result<(), autodl_agent::AgentError> {
/// use std::sync::Arc;
/// use autodl_agent::{Agent, AgentConfig, CancellationToken, ProcessRuntime, SimulatedBackend};
///
/// let config = AgentConfig::new("http://127.0.0.1:8080")
///     .node_id("demo-a100")
///     .registration_token("adlreg_...")
///     .state_dir("/tmp/autodl-demo/demo-a100");
/// let backend = Arc::new(SimulatedBackend::from_spec("4xA100-40G", 1)?);
/// // Isolated when this runs as root (a sandbox per task), trusted-only otherwise.
/// let runtime = ProcessRuntime::detect(&config.isolation).expect("isolation");
/// let agent = Agent::new(config, backend, Arc::new(runtime))?;
/// let shutdown = CancellationToken::new();
/// let handle = tokio::spawn({
///     let (agent, shutdown) = (agent.clone(), shutdown.clone());
///     async move { agent.run(shutdown).await }
/// });
/// // ... later:
/// shutdown.cancel();
/// handle.await.expect("agent task")?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Agent {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("node_id", &self.inner.config.node_id)
            .field("server", &self.inner.config.server_url)
            .field("runtime", &self.inner.runtime.name())
            .finish_non_exhaustive()
    }
}

enum Delivery {
    Delivered,
    /// The server will never take it (409 stale attempt, 400); do not retry.
    Rejected {
        stale: bool,
    },
    /// Given up because the agent is shutting down.
    Abandoned,
    /// 413: the body is over the server's limit; the caller splits it and sends it again.
    TooLarge,
}

impl Agent {
    /// Fails only when the HTTP client cannot be built (TLS setup).
    pub fn new(
        config: AgentConfig,
        backend: Arc<dyn GpuBackend>,
        runtime: Arc<dyn Runtime>,
    ) -> Result<Agent, AgentError> {
        let client =
            ServerClient::new(&config.server_url).map_err(|e| AgentError::Http(e.to_string()))?;
        let metrics = AgentMetrics::new(&config.node_id);
        let uids = if runtime.task_users() {
            let iso = &config.isolation;
            Some(
                UidPool::new(iso.task_uids.clone(), &iso.lock_dir).map_err(|e| {
                    AgentError::Config(format!("task uid locks in {}: {e}", iso.lock_dir.display()))
                })?,
            )
        } else {
            None
        };
        let outbox = Outbox::open(&config.state_dir).map_err(|source| AgentError::State {
            path: config.state_dir.clone(),
            source,
        })?;
        Ok(Agent {
            inner: Arc::new(Inner {
                config,
                backend,
                runtime,
                client,
                metrics,
                tasks: Mutex::new(HashMap::new()),
                samples: Mutex::new(VecDeque::new()),
                inventory: Mutex::new(Vec::new()),
                tracker: TaskTracker::new(),
                data_lock: tokio::sync::Mutex::new(()),
                uids,
                ports: Default::default(),
                last_heard: Mutex::new(Instant::now()),
                node_lost_s: std::sync::atomic::AtomicU64::new(0),
                outbox,
                unreported: Mutex::new(Default::default()),
                log_batch_bytes: std::sync::atomic::AtomicUsize::new(LOG_BATCH_BYTES),
                samples_per_call: std::sync::atomic::AtomicUsize::new(MAX_SAMPLES_PER_CALL),
            }),
        })
    }

    pub fn node_id(&self) -> &str {
        &self.inner.config.node_id
    }

    pub fn config(&self) -> &AgentConfig {
        &self.inner.config
    }

    /// The Prometheus text the `/metrics` endpoint serves.
    pub fn metrics_text(&self) -> String {
        self.inner.metrics.render()
    }

    /// Attempts this agent runs (or has finished but not yet reported), sorted.
    pub fn running_tasks(&self) -> Vec<RunningRef> {
        self.inner.running_list()
    }

    /// Runs until `shutdown` is cancelled, then stops the tasks it runs (SIGTERM, then SIGKILL
    /// after `shutdown_grace`), reports them as stopped if the server is there, and returns.
    ///
    /// Returns early with an error only when the node cannot work without a person: the
    /// server refused the registration token (or the credential, with no token to register
    /// again), the state directory is unusable, the GPU backend fails at start, or the metrics
    /// address cannot be bound.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), AgentError> {
        let inner = &self.inner;
        let backend = inner.backend.clone();
        let inventory = tokio::task::spawn_blocking(move || backend.inventory())
            .await
            .map_err(|e| AgentError::Config(format!("GPU inventory task failed: {e}")))??;
        let isolation = inner.runtime.isolation();
        tracing::info!(
            node = %inner.config.node_id,
            gpus = inventory.len(),
            runtime = inner.runtime.name(),
            isolation = isolation.as_str(),
            "agent starting"
        );
        if isolation.trusted_only() {
            tracing::warn!(
                node = %inner.config.node_id,
                "tasks on this node run as the agent's own user and are not isolated from each other or from the host: the node is trusted-only (the server places only tasks of organizations an administrator allowed there)"
            );
        }
        *lock(&inner.inventory) = inventory;
        let state_err = |source| AgentError::State {
            path: inner.config.state_dir.clone(),
            source,
        };
        std::fs::create_dir_all(inner.config.state_dir.join("tasks")).map_err(state_err)?;
        if inner.runtime.tasks_see_host_paths() {
            // Without a sandbox a task reaches its folders by their host paths.
            crate::isolation::check_reachable_by_task_users(&inner.config.state_dir)
                .map_err(AgentError::Config)?;
        }
        if let Some(pool) = &inner.uids {
            crate::isolation::lock_down_state_dir(&inner.config.state_dir).map_err(state_err)?;
            let reaped = pool.reap_orphans();
            if reaped > 0 {
                tracing::warn!(
                    reaped,
                    "stopped task processes an earlier agent run left behind"
                );
            }
        }
        if let Err(e) = inner
            .runtime
            .cleanup(&inner.config.node_id, &inner.config.state_dir, &[])
            .await
        {
            tracing::warn!(error = %e, "could not clean up leftovers of earlier runs");
        }

        let background = CancellationToken::new();
        let mut loops = tokio::task::JoinSet::new();
        if let Some(addr) = inner.config.metrics_listen {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| AgentError::MetricsListen { addr, source })?;
            tracing::info!(addr = %listener.local_addr().unwrap_or(addr), "serving /metrics");
            loops.spawn(crate::metrics::serve(
                listener,
                inner.metrics.clone(),
                background.clone(),
            ));
        }
        loops.spawn(sample_loop(inner.clone(), background.clone()));
        loops.spawn(fence_loop(inner.clone(), background.clone()));
        // Attempts an earlier run kept but could not report are still this node's to end.
        lock(&inner.unreported).extend(
            inner
                .outbox
                .all()
                .into_iter()
                .filter(|k| !k.reported)
                .map(|k| (k.task_id.clone(), k.attempt())),
        );
        loops.spawn(outbox_loop(inner.clone(), background.clone()));

        // Our own token below the caller's: an early error return must wind down the task
        // reporters too, not only a cancellation by the caller.
        let stopping = shutdown.child_token();
        let result = inner.control_loop(&stopping).await;
        if let Err(e) = &result {
            tracing::error!(error = %e, "agent stopping");
        }

        // Stop what still runs; supervisors then report it (one try each, we are leaving).
        stopping.cancel();
        let grace = inner.config.shutdown_grace;
        inner.stop_all(grace);
        inner.tracker.close();
        if tokio::time::timeout(grace + Duration::from_secs(15), inner.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("tasks did not wind down in time");
        }
        background.cancel();
        while loops.join_next().await.is_some() {}
        result
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

async fn sleep_or_cancel(d: Duration, token: &CancellationToken) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = token.cancelled() => {}
    }
}

impl Inner {
    fn new_backoff(&self, salt: &str) -> Backoff {
        Backoff::new(
            self.config.backoff_initial,
            self.config.backoff_max,
            entropy_seed(&format!("{}/{salt}", self.config.node_id)),
        )
    }

    fn host_report(&self) -> AgentHost {
        AgentHost {
            runtime: self.runtime.name().to_string(),
            isolation: self.runtime.isolation().as_str().to_string(),
            data_roots: self
                .config
                .data_roots
                .iter()
                .map(|r| r.display().to_string())
                .collect(),
            limits: self.runtime.limits(),
            network: self.runtime.network(),
            address: Some(self.config.advertise_addr.to_string()),
        }
    }

    fn set_reachable(&self, up: bool) {
        self.metrics.server_reachable.set(i64::from(up));
        if up {
            *lock(&self.last_heard) = Instant::now();
        }
    }

    /// The server's node timeout, as it last said.
    fn node_lost(&self) -> Duration {
        match self.node_lost_s.load(std::sync::atomic::Ordering::Relaxed) {
            0 => DEFAULT_NODE_LOST,
            s => Duration::from_secs(s),
        }
    }

    fn running_list(&self) -> Vec<RunningRef> {
        let mut keys: std::collections::BTreeSet<TaskKey> =
            lock(&self.tasks).keys().cloned().collect();
        keys.extend(lock(&self.unreported).iter().cloned());
        keys.into_iter()
            .map(|(task_id, attempt)| RunningRef { task_id, attempt })
            .collect()
    }

    fn push_allocations(&self) {
        let (allocations, running): (Vec<GpuAllocation>, usize) = {
            let tasks = lock(&self.tasks);
            let a: Vec<_> = tasks
                .values()
                .filter(|e| !e.finished)
                .map(|e| e.allocation.clone())
                .collect();
            let n = a.len();
            (a, n)
        };
        self.metrics.tasks_running.set(running as i64);
        self.backend.set_allocations(&allocations);
    }

    fn stop_all(&self, grace: Duration) {
        for entry in lock(&self.tasks).values() {
            if !entry.finished {
                entry.stop.send_if_modified(|s| {
                    if s.is_none() {
                        *s = Some(grace);
                        true
                    } else {
                        false
                    }
                });
            }
        }
    }

    async fn control_loop(
        self: &Arc<Self>,
        shutdown: &CancellationToken,
    ) -> Result<(), AgentError> {
        let cfg = &self.config;
        if let Some(c) = &cfg.credential {
            self.client.set_credential(Some(c.clone()));
        } else if let Some(saved) = load_credential(&cfg.state_dir) {
            if saved.node_id == cfg.node_id && saved.server == cfg.server_url {
                self.client.set_credential(Some(saved.credential));
            } else {
                tracing::info!(
                    saved_node = saved.node_id,
                    saved_server = saved.server,
                    "saved credential is for another node or server; registering again"
                );
            }
        }
        let mut backoff = self.new_backoff("poll");
        let mut wait = cfg.poll_wait;
        loop {
            if shutdown.is_cancelled() {
                return Ok(());
            }
            if !self.client.has_credential() {
                let Some(token) = cfg.registration_token.clone() else {
                    return Err(AgentError::Rejected(format!(
                        "no node credential in {} and no registration token to join with",
                        cfg.state_dir.display()
                    )));
                };
                let registered = tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    r = self.register(token) => r,
                };
                match registered {
                    Ok(()) => {
                        self.set_reachable(true);
                        backoff.reset();
                    }
                    Err(e) if e.is_transient() => {
                        self.away(&e, &backoff, "register");
                        sleep_or_cancel(backoff.next_delay(), shutdown).await;
                        continue;
                    }
                    Err(e) => {
                        return Err(AgentError::Rejected(format!("registration refused: {e}")))
                    }
                }
            }

            let req = PollRequest {
                running: self.running_list(),
                gpus: Some(lock(&self.inventory).clone()),
                host: Some(self.host_report()),
            };
            let answer = tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                r = self.client.poll(wait, &req) => r,
            };
            match answer {
                Ok(resp) => {
                    if backoff.failures() > 0 {
                        tracing::info!("server reachable again");
                    }
                    self.set_reachable(true);
                    backoff.reset();
                    self.node_lost_s
                        .store(resp.node_lost_s, std::sync::atomic::Ordering::Relaxed);
                    wait = match resp.heartbeat_s {
                        0 => cfg.poll_wait,
                        h => Duration::from_secs(h).min(cfg.poll_wait),
                    };
                    self.apply(resp, shutdown);
                }
                Err(e) if e.is_unauthorized() => {
                    if cfg.registration_token.is_none() {
                        return Err(AgentError::Rejected(format!(
                            "the server no longer accepts this node's credential ({e}) and there is no registration token"
                        )));
                    }
                    tracing::warn!(error = %e, "node credential refused; registering again");
                    self.client.set_credential(None);
                    sleep_or_cancel(backoff.next_delay(), shutdown).await;
                }
                Err(e) => {
                    self.away(&e, &backoff, "poll");
                    sleep_or_cancel(backoff.next_delay(), shutdown).await;
                }
            }
        }
    }

    /// Logs the first failure of a streak loudly and the rest quietly.
    fn away(&self, e: &ClientError, backoff: &Backoff, what: &str) {
        if matches!(e, ClientError::Transport(_)) {
            self.set_reachable(false);
        }
        if backoff.failures() == 0 {
            tracing::warn!(error = %e, what, "server call failed; retrying with backoff");
        } else {
            tracing::debug!(error = %e, what, failures = backoff.failures(), "server call failed");
        }
    }

    async fn register(&self, token: String) -> Result<(), ClientError> {
        let cfg = &self.config;
        let node = AgentNode {
            id: cfg.node_id.clone(),
            zone: cfg.zone.clone(),
            labels: cfg.labels.clone(),
            cpu: f64::from(cfg.cpu.unwrap_or_else(hostinfo::cpu_count)),
            memory: cfg.memory.unwrap_or_else(hostinfo::memory_bytes),
            gpus: lock(&self.inventory).clone(),
            host: Some(self.host_report()),
        };
        let resp = self
            .client
            .register(&RegisterRequest { token, node })
            .await?;
        if resp.node_id != cfg.node_id {
            tracing::warn!(
                ours = cfg.node_id,
                theirs = resp.node_id,
                "server registered this node under another id"
            );
        }
        self.client.set_credential(Some(resp.credential.clone()));
        tracing::info!(node = %cfg.node_id, "registered with the server");
        let saved = SavedCredential {
            server: cfg.server_url.clone(),
            node_id: cfg.node_id.clone(),
            credential: resp.credential,
        };
        if let Err(e) = save_credential(&cfg.state_dir, &saved) {
            // The credential works for this run; the next start registers again if it can.
            tracing::error!(error = %e, "could not save the node credential");
        }
        Ok(())
    }

    fn apply(self: &Arc<Self>, resp: PollResponse, shutdown: &CancellationToken) {
        for s in resp.stop {
            let tasks = lock(&self.tasks);
            match tasks.get(&(s.task_id.clone(), s.attempt)) {
                Some(e) if !e.finished => {
                    tracing::info!(
                        task = s.task_id,
                        attempt = s.attempt,
                        reason = s.reason,
                        grace_s = s.grace_s,
                        "stopping task"
                    );
                    e.stop.send_replace(Some(Duration::from_secs(s.grace_s)));
                }
                _ => tracing::debug!(
                    task = s.task_id,
                    attempt = s.attempt,
                    "stop for an attempt not running here"
                ),
            }
        }
        for t in resp.tunnels {
            let launch = lock(&self.tasks)
                .get(&(t.task_id.clone(), t.attempt))
                .filter(|e| !e.finished)
                .and_then(|e| e.launch.clone());
            let inner = self.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = crate::tunnel::serve(&inner.client, inner.runtime.clone(), launch, t) => {}
                    _ = shutdown.cancelled() => {}
                }
            });
        }
        for a in resp.assignments {
            let key = (a.task_id.clone(), a.attempt);
            if lock(&self.tasks).contains_key(&key) {
                continue;
            }
            self.start_task(a, shutdown);
        }
    }

    fn start_task(self: &Arc<Self>, a: Assignment, shutdown: &CancellationToken) {
        let mut launch = TaskLaunch::from_assignment(
            &a,
            &self.config.node_id,
            &self.config.state_dir,
            !self.backend.is_simulated(),
        );
        // Held until the attempt's supervision ends.
        let port = self.ports.lease_rendezvous(&mut launch.env);
        let (stop_tx, stop_rx) = watch::channel(None);
        let key = (a.task_id.clone(), a.attempt);
        tracing::info!(task = a.task_id, attempt = a.attempt, gpus = ?a.gpu_indices, "starting task");
        lock(&self.tasks).insert(
            key.clone(),
            TaskEntry {
                stop: stop_tx,
                allocation: GpuAllocation {
                    task_id: a.task_id.clone(),
                    gpu_indices: a.gpu_indices.clone(),
                    gpu_memory: a.gpu_memory,
                    since: Instant::now(),
                    pid: None,
                },
                finished: false,
                launch: None,
            },
        );
        self.push_allocations();
        // In a multi-node task the first node (rank 0's) saves the checkpoints, as torchrun's
        // rank 0 does, so ranks do not overwrite one another's; every node saves the results
        // of its own workers (each in a folder of its rank's, rank 0's at the top).
        let rank_zero = a
            .env
            .get("NODE_RANK")
            .or(a.env.get("RANK"))
            .is_none_or(|r| r == "0");
        let job = StorageJob {
            restore: a.restore.clone(),
            checkpoint_interval: a
                .checkpoint
                .as_ref()
                .and_then(|c| c.interval)
                .filter(|i| *i > 0 && rank_zero)
                .map(Duration::from_secs),
            checkpointing: a.checkpoint.is_some() && rank_zero,
            saves_checkpoints: rank_zero,
            data_from_storage: a
                .data_path
                .as_deref()
                .is_some_and(|p| p.starts_with("s3://")),
            code: a.code.clone(),
        };
        let supervised = supervise(self.clone(), key, launch, job, stop_rx, shutdown.clone());
        self.tracker.spawn(async move {
            supervised.await;
            drop(port);
        });
    }

    async fn deliver<F, Fut>(
        &self,
        what: &str,
        shutdown: &CancellationToken,
        mut call: F,
    ) -> Delivery
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(), ClientError>>,
    {
        let mut backoff = self.new_backoff(what);
        loop {
            match call().await {
                Ok(()) => {
                    self.set_reachable(true);
                    return Delivery::Delivered;
                }
                Err(e) if e.is_too_large() => {
                    tracing::info!(what, "server refused a report as too large; splitting it");
                    return Delivery::TooLarge;
                }
                Err(e) if e.is_conflict() => {
                    self.set_reachable(true);
                    tracing::info!(what, "server says the attempt is no longer current");
                    return Delivery::Rejected { stale: true };
                }
                Err(e) if e.is_transient() || e.is_unauthorized() => {
                    if shutdown.is_cancelled() {
                        tracing::warn!(what, error = %e, "giving up on a report while shutting down");
                        return Delivery::Abandoned;
                    }
                    self.away(&e, &backoff, what);
                    sleep_or_cancel(backoff.next_delay(), shutdown).await;
                }
                Err(e) => {
                    tracing::warn!(what, error = %e, "server rejected a report");
                    return Delivery::Rejected { stale: false };
                }
            }
        }
    }

    /// Tells the server an attempt ended, with what of it is still uploading, and records
    /// that it knows; the kept attempt goes once nothing of it is left to upload or tell.
    /// False when given up because the agent is leaving (the next start reports it).
    async fn report_end(&self, kept: &mut Kept, shutdown: &CancellationToken) -> bool {
        kept.report.uploading = kept.pending();
        let mut delivery = {
            let (task_id, report) = (&kept.task_id, &kept.report);
            self.deliver("finished", shutdown, || {
                self.client.finished(task_id, report)
            })
            .await
        };
        let extras = !kept.report.uploading.is_empty() || kept.report.not_kept.is_some();
        if let (Delivery::Rejected { stale: false }, true) = (&delivery, extras) {
            // A server older than these fields refuses them: its end report without them (it
            // does not say the results are uploading, but the run ends once, here).
            let plain = FinishedReport {
                uploading: vec![],
                not_kept: None,
                ..kept.report.clone()
            };
            delivery = self
                .deliver("finished", shutdown, || {
                    self.client.finished(&kept.task_id, &plain)
                })
                .await;
        }
        if let Delivery::Abandoned = delivery {
            return false;
        }
        // Refused too (it had the report already, or the attempt is no longer current): what
        // is left to upload is tried still, and dropped when the server refuses it as stale.
        kept.reported = true;
        lock(&self.unreported).remove(&(kept.task_id.clone(), kept.attempt()));
        self.settle_kept(kept);
        true
    }

    /// Writes a kept attempt back, or removes it when nothing of it is left.
    fn settle_kept(&self, kept: &Kept) {
        if kept.reported && kept.parts.is_empty() && kept.lost.is_empty() {
            self.outbox.remove(&kept.task_id, kept.attempt());
        } else if let Err(e) = self.outbox.save(kept) {
            tracing::warn!(task = kept.task_id, error = %e, "could not update a kept attempt");
        }
    }

    /// Gives up what is kept of an attempt (kept too long, or the room for it is full): the
    /// server is told (with the end report if it has not had it, else in
    /// a report of its own), so the task says plainly that they are lost.
    fn give_up(&self, kept: &mut Kept, why: &str) {
        tracing::warn!(
            task = kept.task_id,
            attempt = kept.attempt(),
            why,
            "giving up what an ended attempt left"
        );
        // (Their copies were removed by the caller, off the async threads.)
        for part in std::mem::take(&mut kept.parts) {
            if !kept.reported && part.kind == RESULTS {
                kept.report.not_kept = Some(why.to_owned());
            } else if kept.reported {
                kept.lost.push((part.kind, why.to_owned()));
            }
        }
        self.settle_kept(kept);
    }

    /// Tells the server of parts given up; false while it cannot be reached.
    async fn tell_lost(&self, kept: &mut Kept) -> bool {
        while let Some((kind, reason)) = kept.lost.first().cloned() {
            let report = NotKeptReport {
                attempt: kept.attempt(),
                kind,
                reason,
            };
            match self.client.not_kept(&kept.task_id, &report).await {
                Ok(()) => {}
                // 404: a server without this report, or the task is gone; 401/403: this node
                // is no longer let in. Neither will take it later.
                Err(e) if e.is_transient() && e.status() != Some(404) => {
                    tracing::info!(task = kept.task_id, error = %e, "could not tell the server of lost results yet");
                    return false;
                }
                Err(e) => {
                    tracing::warn!(task = kept.task_id, error = %e, "the server refused a lost-results report")
                }
            }
            kept.lost.remove(0);
            self.settle_kept(kept);
        }
        true
    }

    /// Sends one batch; returns false when the attempt turned out stale.
    async fn ship_logs(
        &self,
        task_id: &str,
        attempt: u32,
        log: &LogBuffer,
        shutdown: &CancellationToken,
    ) -> bool {
        use std::sync::atomic::Ordering;
        let budget = self.log_batch_bytes.load(Ordering::Relaxed);
        let lines = log.take_within(MAX_LOG_LINES_PER_CALL, budget);
        if lines.is_empty() {
            return true;
        }
        let n = lines.len() as u64;
        let batch = LogBatch {
            attempt,
            lines,
            sent_at: None,
        };
        match self
            .deliver("logs", shutdown, || self.client.logs(task_id, &batch))
            .await
        {
            Delivery::Delivered => {
                self.metrics.log_lines_sent.inc_by(n);
                true
            }
            Delivery::TooLarge => {
                // Never lose output to a body limit: put the lines back and send less at a time.
                let mut lines = batch.lines;
                if lines.len() > 1 || budget > MIN_LOG_BATCH_BYTES {
                    self.log_batch_bytes
                        .store((budget / 2).max(MIN_LOG_BATCH_BYTES), Ordering::Relaxed);
                } else if let Some(only) = lines.first_mut() {
                    let mut cut = only.line.len() / 2;
                    while !only.line.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    only.line.truncate(cut);
                }
                log.requeue_front(lines);
                true
            }
            Delivery::Rejected { stale } => !stale,
            Delivery::Abandoned => true,
        }
    }

    fn gpu_holders(&self) -> HashMap<u32, String> {
        let mut m = HashMap::new();
        for e in lock(&self.tasks).values().filter(|e| !e.finished) {
            for g in &e.allocation.gpu_indices {
                m.entry(*g).or_insert_with(|| e.allocation.task_id.clone());
            }
        }
        m
    }

    async fn flush_samples(&self) {
        loop {
            let batch: Vec<GpuSample> = {
                let mut q = lock(&self.samples);
                let per_call = self
                    .samples_per_call
                    .load(std::sync::atomic::Ordering::Relaxed);
                let n = q.len().min(per_call);
                q.drain(..n).collect()
            };
            if batch.is_empty() {
                return;
            }
            let body = MetricBatch {
                samples: batch,
                sent_at: None,
            };
            match self.client.metrics(&body).await {
                Ok(()) => {
                    self.set_reachable(true);
                    self.metrics.samples_sent.inc_by(body.samples.len() as u64);
                }
                Err(e) if e.is_too_large() && body.samples.len() > 1 => {
                    // Send fewer at a time; the samples go back where they were.
                    self.samples_per_call.store(
                        (body.samples.len() / 2).max(1),
                        std::sync::atomic::Ordering::Relaxed,
                    );
                    let mut q = lock(&self.samples);
                    for s in body.samples.into_iter().rev() {
                        q.push_front(s);
                    }
                }
                Err(e) if e.is_transient() || e.is_unauthorized() => {
                    if matches!(e, ClientError::Transport(_)) {
                        self.set_reachable(false);
                    }
                    tracing::debug!(error = %e, "metrics not delivered; keeping them");
                    let mut q = lock(&self.samples);
                    for s in body.samples.into_iter().rev() {
                        q.push_front(s);
                    }
                    self.trim_samples(&mut q);
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, samples = body.samples.len(), "server rejected GPU samples; dropping them");
                    self.metrics
                        .samples_dropped
                        .inc_by(body.samples.len() as u64);
                }
            }
        }
    }

    fn trim_samples(&self, q: &mut VecDeque<GpuSample>) {
        let cap = self.config.metrics_buffer_samples.max(1);
        let excess = q.len().saturating_sub(cap);
        if excess > 0 {
            q.drain(..excess);
            self.metrics.samples_dropped.inc_by(excess as u64);
        }
    }
}

/// Why an attempt could not start. A transient one (storage or server unreachable, or the
/// agent leaving) hands the task back to the queue instead of counting as a failure.
struct PrepareError {
    message: String,
    transient: bool,
}

impl PrepareError {
    fn from_transfer(what: String, e: artifacts::TransferError) -> Self {
        let transient = match &e {
            artifacts::TransferError::Client(c) => c.is_transient(),
            artifacts::TransferError::Cancelled | artifacts::TransferError::Stale => true,
            artifacts::TransferError::Io(_) => false,
        };
        PrepareError {
            message: format!("{what}: {e}"),
            transient,
        }
    }
}

/// What an attempt needs from object storage around its run.
struct StorageJob {
    restore: Option<RestoreRef>,
    checkpoint_interval: Option<Duration>,
    /// The task asked for checkpoints: the folder is also saved when the attempt ends.
    checkpointing: bool,
    /// Rank 0's node: the only one whose checkpoint folder is saved.
    saves_checkpoints: bool,
    data_from_storage: bool,
    /// The code bundle to unpack as the working directory.
    code: Option<String>,
}

/// Downloads what the task needs before it starts: the latest checkpoint and an `s3://`
/// dataset. An error keeps the task from starting (starting from zero instead would let its
/// next checkpoint replace the saved progress).
async fn prepare_storage(
    inner: &Inner,
    key: &TaskKey,
    launch: &mut TaskLaunch,
    job: &StorageJob,
    log: &LogBuffer,
    shutdown: &CancellationToken,
) -> Result<(), PrepareError> {
    // A fresh start begins with empty folders: leftovers of an earlier attempt on this node
    // (an upload that never completed) must neither be resumed from nor saved as newer.
    let tmp = launch.tmp_dir();
    for dir in [&launch.checkpoint_dir, &launch.results_dir, &tmp] {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).map_err(|e| PrepareError {
            message: format!("could not prepare {}: {e}", dir.display()),
            transient: false,
        })?;
    }
    std::fs::create_dir_all(launch.home_dir()).map_err(|e| PrepareError {
        message: format!("could not prepare the task's home folder: {e}"),
        transient: false,
    })?;
    // The results folder of each process (made while the task folder is still the agent's own).
    for w in launch.worker_launches() {
        let dir = w.launch.results_dir;
        std::fs::create_dir_all(&dir).map_err(|e| PrepareError {
            message: format!("could not prepare {}: {e}", dir.display()),
            transient: false,
        })?;
    }
    let mut backoff = inner.new_backoff(&format!("{}/prepare", key.0));
    if let Some(id) = &job.code {
        let t = Instant::now();
        let cache = inner.config.state_dir.join("cache").join("code");
        let done = artifacts::fetch_code(
            &inner.client,
            &key.0,
            id,
            &cache,
            &launch.code_dir(),
            &mut backoff,
            shutdown,
        )
        .await
        .map_err(|e| PrepareError::from_transfer("could not fetch the task's code".into(), e))?;
        launch.has_code = true;
        log.push(
            Stream::Stdout,
            format!(
                "[autodl-agent] code {} {}: {} files, {:.1} MB, in {:.1} s",
                &id[..id.len().min(19)],
                if done.cached { "cached" } else { "downloaded" },
                done.files,
                done.bytes as f64 / 1e6,
                t.elapsed().as_secs_f64()
            ),
        );
    }
    if let Some(r) = &job.restore {
        let t = Instant::now();
        let bytes = artifacts::restore(
            &inner.client,
            r,
            &launch.checkpoint_dir,
            &mut backoff,
            shutdown,
        )
        .await
        .map_err(|e| {
            PrepareError::from_transfer(
                format!("could not restore checkpoint {}", r.checkpoint_id),
                e,
            )
        })?;
        launch.mark_restored();
        let step = r.step.map(|s| format!(", step {s}")).unwrap_or_default();
        log.push(
            Stream::Stdout,
            format!(
                "[autodl-agent] restored the checkpoint of attempt {}{step}: {} files, {bytes} bytes in {:.1} s",
                r.attempt,
                r.files.len(),
                t.elapsed().as_secs_f64()
            ),
        );
    }
    if job.data_from_storage {
        let t = Instant::now();
        let cache = inner.config.state_dir.join("cache").join("data");
        let (dir, cached) = {
            // One download per dataset at a time on this node.
            let _guard = inner.data_lock.lock().await;
            artifacts::fetch_data(&inner.client, &key.0, &cache, &mut backoff, shutdown)
                .await
                .map_err(|e| {
                    PrepareError::from_transfer("could not fetch the data path".into(), e)
                })?
        };
        let dir = std::path::absolute(&dir).unwrap_or(dir);
        launch.data = Some(DataMount {
            host: dir,
            requested_path: None,
        });
        log.push(
            Stream::Stdout,
            format!(
                "[autodl-agent] data of {} {} in {:.1} s",
                launch.data_path.as_deref().unwrap_or_default(),
                if cached { "cached" } else { "downloaded" },
                t.elapsed().as_secs_f64()
            ),
        );
    } else if let Some(p) = launch.data_path.clone() {
        // A host path: only inside a dataset root the operator named, links resolved, so a
        // task cannot have the Docker socket or another task's folder mounted.
        let roots = &inner.config.data_roots;
        let Some(real) = crate::isolation::resolve_data_path(&p, roots) else {
            let named: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
            return Err(PrepareError {
                message: format!(
                    "data_path {p:?} is not an existing folder inside a dataset root of this node ({})",
                    if named.is_empty() { "none configured".to_string() } else { named.join(", ") }
                ),
                transient: false,
            });
        };
        launch.data = Some(DataMount {
            host: real,
            requested_path: Some(p),
        });
    }
    Ok(())
}

/// Runs the attempt as its own task user: leases a uid and gives it the task's folders (and,
/// where no mount namespace can show cached data read-only, hard links to it).
fn take_task_user(
    inner: &Inner,
    launch: &mut TaskLaunch,
) -> Result<Option<UidLease>, PrepareError> {
    let Some(pool) = &inner.uids else {
        return Ok(None);
    };
    let fail = |what: &str, e: std::io::Error| PrepareError {
        message: format!("{what}: {e}"),
        // Out of uids or a folder that cannot be handed over: another node may do better.
        transient: true,
    };
    let lease = pool.lease().map_err(|e| fail("no task user", e))?;
    let user = lease.user();
    crate::isolation::hand_over_task_dir(&launch.task_dir, user)
        .map_err(|e| fail("could not prepare the task folder", e))?;
    let link = launch.data_link_dir();
    let _ = std::fs::remove_dir_all(&link);
    if inner.runtime.tasks_see_host_paths() {
        if let Some(d) = launch.data.as_ref().filter(|d| d.requested_path.is_none()) {
            crate::isolation::link_tree(&d.host, &link, user.gid)
                .map_err(|e| fail("could not show the data to the task", e))?;
        }
    }
    launch.user = Some(user);
    Ok(Some(lease))
}

/// Uploads one folder and says so in the task's log; returns what was uploaded. `folder`:
/// the folder and, on an isolated node, the task uid whose files it holds.
async fn upload_and_log(
    inner: &Inner,
    key: &TaskKey,
    kind: &str,
    (dir, owner): (&std::path::Path, Option<u32>),
    mark: Option<(Option<i64>, Option<f64>)>,
    log: Option<&LogBuffer>,
    cancel: &CancellationToken,
) -> Result<Option<artifacts::Uploaded>, artifacts::TransferError> {
    let (step, epoch) = mark.unwrap_or((None, None));
    let staging = inner.config.state_dir.join("staging");
    let mut backoff = inner.new_backoff(&format!("{}/{kind}", key.0));
    let req = artifacts::UploadRequest {
        task_id: &key.0,
        attempt: key.1,
        kind,
        dir,
        staging: &staging,
        step,
        epoch,
        owner,
    };
    let r = artifacts::upload_folder(&inner.client, req, &mut backoff, cancel).await;
    let said = match &r {
        Ok(Some(u)) => Some((
            Stream::Stdout,
            format!(
                "[autodl-agent] {kind} uploaded: {} files, {} bytes in {:.1} s",
                u.files,
                u.bytes,
                u.took.as_secs_f64()
            ),
        )),
        Ok(None) | Err(artifacts::TransferError::Stale) => None,
        Err(e) => Some((
            Stream::Stderr,
            format!("[autodl-agent] {kind} upload failed: {e}"),
        )),
    };
    match (said, log) {
        (Some((stream, line)), Some(log)) => log.push(stream, line),
        (Some((_, line)), None) => tracing::info!(task = key.0, attempt = key.1, "{line}"),
        (None, _) => {}
    }
    r
}

/// Saves the checkpoint folder every interval (when it changed) and whenever the task leaves
/// the save marker, until `stop`. Returns the fingerprint of the last upload.
async fn checkpoint_loop(
    inner: Arc<Inner>,
    key: TaskKey,
    (dir, owner): (std::path::PathBuf, Option<u32>),
    interval: Option<Duration>,
    log: Arc<LogBuffer>,
    stop: CancellationToken,
    shutdown: CancellationToken,
) -> Option<artifacts::Fingerprint> {
    let mut last: Option<artifacts::Fingerprint> = None;
    let mut last_at = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => return last,
            _ = tick.tick() => {}
        }
        let mark = artifacts::take_marker(&dir);
        let due = interval.is_some_and(|i| last_at.elapsed() >= i);
        if mark.is_none() && !due {
            continue;
        }
        last_at = Instant::now();
        let Ok(fp) = artifacts::scan(&dir, owner) else {
            continue;
        };
        if mark.is_none() && last.as_ref() == Some(&fp) {
            continue;
        }
        match upload_and_log(
            &inner,
            &key,
            "checkpoint",
            (&dir, owner),
            mark,
            Some(&log),
            &shutdown,
        )
        .await
        {
            Ok(Some(_)) => last = Some(fp),
            Ok(None) => {}
            Err(artifacts::TransferError::Stale) => return last,
            // Logged; the next interval or marker tries again.
            Err(_) => {}
        }
    }
}

async fn supervise(
    inner: Arc<Inner>,
    key: TaskKey,
    mut launch: TaskLaunch,
    job: StorageJob,
    stop_rx: watch::Receiver<Option<Duration>>,
    shutdown: CancellationToken,
) {
    let log = Arc::new(LogBuffer::new(inner.config.log_buffer_lines));
    let (started_tx, started_rx) = oneshot::channel();
    let (done_tx, done_rx) = oneshot::channel();
    let reporter = tokio::spawn(report(
        inner.clone(),
        key.clone(),
        log.clone(),
        started_rx,
        done_rx,
        shutdown.clone(),
    ));
    let io = TaskIo {
        output: log.clone(),
        started: started_tx,
        stop: stop_rx.clone(),
    };
    let mut prepared = prepare_storage(&inner, &key, &mut launch, &job, &log, &shutdown).await;
    let mut lease = None;
    if prepared.is_ok() {
        match take_task_user(&inner, &mut launch) {
            Ok(l) => lease = l,
            Err(e) => prepared = Err(e),
        }
    }
    let prepare_failed = prepared.as_ref().err().map(|e| e.transient);
    let task_dir = launch.task_dir.clone();
    let checkpoint_dir = launch.checkpoint_dir.clone();
    let results_dir = launch.results_dir.clone();
    let owner = launch.user.map(|u| u.uid);
    let loop_stop = CancellationToken::new();
    // Only the first node of a task saves checkpoints (see `rank_zero`).
    if !job.saves_checkpoints {
        loop_stop.cancel();
    }
    let saver = tokio::spawn(checkpoint_loop(
        inner.clone(),
        key.clone(),
        (checkpoint_dir.clone(), owner),
        job.checkpoint_interval,
        log.clone(),
        loop_stop.clone(),
        shutdown.clone(),
    ));
    let outcome = match prepared {
        Ok(()) => {
            if let Some(e) = lock(&inner.tasks).get_mut(&key) {
                e.launch = Some(launch.clone());
            }
            inner.runtime.run(launch, io).await
        }
        Err(e) => {
            drop(io);
            Err(RuntimeError::Io(std::io::Error::other(e.message)))
        }
    };
    loop_stop.cancel();
    let last_saved = saver.await.unwrap_or_default();
    // Nothing of the task may outlive the attempt: stop what still runs as its uid, and close
    // the folder to every task uid (the next attempt may run as another one).
    if let Some(lease) = lease.take() {
        let _ = tokio::task::spawn_blocking(move || drop(lease)).await;
        if let Err(e) = crate::isolation::seal_task_dir(&task_dir) {
            tracing::warn!(task = key.0, error = %e, "could not close the task folder");
        }
    }
    let mut detail = None;
    let (exit_code, reason) = match outcome {
        // Ended by the agent because its gang never formed: a failure of the attempt, whatever
        // its workers' codes after the SIGTERM.
        Ok(RunOutcome {
            exit_code,
            unformed: Some(why),
            ..
        }) => {
            detail = Some(why);
            (Some(exit_code), ExitReason::Error)
        }
        Ok(o) => (
            Some(o.exit_code),
            classify_exit(
                Some(o.exit_code),
                o.oom_killed,
                log.oom_detected(),
                o.stopped,
            ),
        ),
        Err(e) => {
            tracing::warn!(task = key.0, attempt = key.1, error = %e, "task could not start");
            log.push(
                Stream::Stderr,
                format!("[autodl-agent] could not start the task: {e}"),
            );
            // Storage or the server being away before the start is no fault of the task.
            let stopped = stop_rx.borrow().is_some() || prepare_failed == Some(true);
            (None, classify_exit(None, false, false, stopped))
        }
    };
    tracing::info!(
        task = key.0,
        attempt = key.1,
        ?exit_code,
        reason = reason.as_str(),
        "task ended"
    );
    // The task has stopped (ended, or stopped for preemption or cancel within its grace
    // period): keep what it left and save it, before `finished` lets the server requeue it.
    let mark = artifacts::take_marker(&checkpoint_dir);
    let mut parts = Vec::new();
    if prepare_failed.is_none() {
        if job.saves_checkpoints && (job.checkpointing || last_saved.is_some() || mark.is_some()) {
            let changed = artifacts::scan(&checkpoint_dir, owner).ok() != last_saved;
            if changed || mark.is_some() {
                let (step, epoch) = mark.unwrap_or((None, None));
                parts.push(Part {
                    kind: CHECKPOINT.into(),
                    step,
                    epoch,
                });
            }
        }
        if reason == ExitReason::Success {
            parts.push(Part {
                kind: RESULTS.into(),
                step: None,
                epoch: None,
            });
        }
    }
    let kept = Kept {
        task_id: key.0.clone(),
        report: FinishedReport {
            attempt: key.1,
            exit_code: exit_code.map(i64::from),
            reason,
            detail,
            uploading: vec![],
            not_kept: None,
        },
        reported: false,
        parts,
        kept_at: crate::outbox::unix_now(),
        lost: vec![],
    };
    let kept = save_at_end(
        &inner,
        kept,
        (&checkpoint_dir, &results_dir, owner),
        &log,
        &shutdown,
    )
    .await;
    if let Some(e) = lock(&inner.tasks).get_mut(&key) {
        e.finished = true;
    }
    inner.push_allocations();
    inner
        .metrics
        .tasks_finished
        .with_label_values(&[reason.as_str()])
        .inc();
    log.close();
    let _ = done_tx.send(kept);
    let _ = reporter.await;
    lock(&inner.tasks).remove(&key);
}

/// Delivers `started`, the output, then `finished`, in that order, for one attempt.
async fn report(
    inner: Arc<Inner>,
    key: TaskKey,
    log: Arc<LogBuffer>,
    started_rx: oneshot::Receiver<crate::runtime::Started>,
    done_rx: oneshot::Receiver<Kept>,
    shutdown: CancellationToken,
) {
    let (task_id, attempt) = key.clone();
    let mut current = true;
    if let Ok(started) = started_rx.await {
        if let Some(e) = lock(&inner.tasks).get_mut(&key) {
            e.allocation.pid = started.pid;
        }
        inner.push_allocations();
        if let Delivery::Rejected { stale: true } = inner
            .deliver("started", &shutdown, || {
                inner.client.started(&task_id, attempt)
            })
            .await
        {
            current = false;
        }
    }
    let flush_lines = inner.config.log_flush_lines;
    let flush_interval = inner.config.log_flush_interval;
    tokio::pin!(done_rx);
    let done = loop {
        tokio::select! {
            d = &mut done_rx => break d.ok(),
            () = log.wait_ready(flush_lines, flush_interval) => {
                if log.is_closed() {
                    break (&mut done_rx).await.ok();
                }
                if current {
                    current = inner.ship_logs(&task_id, attempt, &log, &shutdown).await;
                } else {
                    log.take_batch(usize::MAX);
                }
            }
        }
    };
    while current && !log.is_empty() {
        current = inner.ship_logs(&task_id, attempt, &log, &shutdown).await;
        if shutdown.is_cancelled() && !log.is_empty() {
            // One batch per call while leaving; do not hold the shutdown for megabytes.
            break;
        }
    }
    let mut kept = done.unwrap_or_else(|| Kept {
        task_id: task_id.clone(),
        report: FinishedReport {
            attempt,
            exit_code: None,
            reason: ExitReason::Error,
            detail: None,
            uploading: vec![],
            not_kept: None,
        },
        reported: false,
        parts: vec![],
        kept_at: crate::outbox::unix_now(),
        lost: vec![],
    });
    inner.report_end(&mut kept, &shutdown).await;
}

/// An upload that will never go through (a bad request, an unreadable file), as opposed to one to try again
/// later: the server or storage away, the organization's storage quota full (its people may
/// free some), the attempt superseded (handled as stale).
fn refused_for_good(e: &artifacts::TransferError) -> bool {
    matches!(e, artifacts::TransferError::Client(c) if !c.is_transient() && !c.is_unauthorized())
}

/// The kinds of folder an attempt saves.
const CHECKPOINT: &str = "checkpoint";
const RESULTS: &str = "results";

/// Keeps the ended attempt in the outbox ([`crate::outbox`]), then uploads its folders from
/// there; returns it with what is left to upload. Where the node's disk refuses to keep it,
/// the folders are uploaded from the task's own, and results that fail are said lost.
async fn save_at_end(
    inner: &Inner,
    mut kept: Kept,
    (checkpoint_dir, results_dir, owner): (&std::path::Path, &std::path::Path, Option<u32>),
    log: &LogBuffer,
    shutdown: &CancellationToken,
) -> Kept {
    let source = |kind: &str| {
        if kind == CHECKPOINT {
            checkpoint_dir
        } else {
            results_dir
        }
    };
    let folders: Vec<(&str, &std::path::Path, Option<u32>)> = kept
        .parts
        .iter()
        .map(|p| (p.kind.as_str(), source(&p.kind), owner))
        .collect();
    let durable = {
        let (outbox, record) = (inner.outbox.clone(), kept.clone());
        let owned: Vec<(String, std::path::PathBuf, Option<u32>)> = folders
            .iter()
            .map(|(k, p, o)| (k.to_string(), p.to_path_buf(), *o))
            .collect();
        // Hard links, or copies across file systems, and an fsync: off the async threads.
        tokio::task::spawn_blocking(move || {
            let folders: Vec<(&str, &std::path::Path, Option<u32>)> = owned
                .iter()
                .map(|(k, p, o)| (k.as_str(), p.as_path(), *o))
                .collect();
            outbox.keep(&record, &folders)
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
    };
    let durable = match durable {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(task = kept.task_id, error = %e, "could not keep an ended attempt on this node");
            log.push(
                Stream::Stderr,
                format!("[autodl-agent] this node could not keep what the run saved ({e}); uploading it from the task's folder"),
            );
            false
        }
    };
    let key = (kept.task_id.clone(), kept.attempt());
    for part in kept.parts.clone() {
        let (dir, from) = if durable {
            (inner.outbox.folder(&kept, &part.kind), None)
        } else {
            (source(&part.kind).to_path_buf(), owner)
        };
        let r = upload_and_log(
            inner,
            &key,
            &part.kind,
            (&dir, from),
            Some((part.step, part.epoch)),
            Some(log),
            shutdown,
        )
        .await;
        let done = match &r {
            Ok(_) | Err(artifacts::TransferError::Stale) => true,
            Err(e) if refused_for_good(e) => {
                if part.kind == RESULTS {
                    kept.report.not_kept = Some(format!("the server refused them ({e})"));
                }
                true
            }
            Err(e) if !durable => {
                if part.kind == RESULTS {
                    kept.report.not_kept = Some(format!(
                        "the node's disk could not keep them and their upload failed ({e})"
                    ));
                }
                true
            }
            Err(_) => {
                log.push(
                    Stream::Stderr,
                    format!("[autodl-agent] the {} is kept on this node and uploaded when the server and storage take it", part.kind),
                );
                false
            }
        };
        if done {
            if durable {
                kept = drop_kept_part(inner, kept, &part.kind).await;
            } else {
                kept.parts.retain(|p| p.kind != part.kind);
            }
        }
    }
    kept
}

/// The server has one part of a kept attempt (or will never take it): its copy goes, off the
/// async threads (a results folder may be large), and the record says so.
async fn drop_kept_part(inner: &Inner, kept: Kept, kind: &str) -> Kept {
    let (outbox, mut k, kind) = (inner.outbox.clone(), kept.clone(), kind.to_owned());
    tokio::task::spawn_blocking(move || {
        if let Err(e) = outbox.drop_part(&mut k, &kind) {
            tracing::warn!(task = k.task_id, error = %e, "could not update a kept attempt");
        }
        k
    })
    .await
    .unwrap_or(kept)
}

/// How often the outbox is looked at when nothing failed, and the longest wait after failures.
const OUTBOX_PERIOD: Duration = Duration::from_secs(5);
const OUTBOX_MAX_WAIT: Duration = Duration::from_secs(30);

/// Keeps trying what ended attempts left ([`crate::outbox`]): end reports an earlier agent
/// run could not deliver, and folders the server or storage could not take when the run
/// ended. What is kept longer than `keep_results_for` (and tried at least once since this
/// agent started, so a long downtime alone gives nothing up), or beyond `keep_results_bytes`
/// (the largest first, so one huge folder does not push out everyone else's), is given up and
/// said lost.
async fn outbox_loop(inner: Arc<Inner>, stop: CancellationToken) {
    let mut wait = Duration::ZERO;
    let mut tried: std::collections::HashSet<TaskKey> = Default::default();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        let mut failed = false;
        // Reading the folders walks them: off the async threads, which poll and fence.
        let outbox = inner.outbox.clone();
        let listed = tokio::task::spawn_blocking(move || {
            outbox
                .all()
                .into_iter()
                .map(|k| {
                    let bytes = outbox.bytes_of(&k);
                    (k, bytes)
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        let limit = &inner.config;
        let mut total: u64 = listed.iter().map(|(_, b)| b).sum();
        let mut over: Vec<(u64, TaskKey)> = Vec::new();
        if total > limit.keep_results_bytes {
            over = listed
                .iter()
                .filter(|(k, _)| !k.parts.is_empty())
                .map(|(k, b)| (*b, (k.task_id.clone(), k.attempt())))
                .collect();
            over.sort_by(|a, b| b.cmp(a));
        }
        let mut evict: std::collections::HashSet<TaskKey> = Default::default();
        for (b, key) in over {
            if total <= limit.keep_results_bytes {
                break;
            }
            total = total.saturating_sub(b);
            evict.insert(key);
        }
        for (listed, _) in listed {
            let key = (listed.task_id.clone(), listed.attempt());
            // An attempt still ending is its supervisor's; read it afresh, it may have moved on.
            if lock(&inner.tasks).contains_key(&key) {
                continue;
            }
            let Some(mut kept) = inner.outbox.load(&key.0, key.1) else {
                continue;
            };
            let age = crate::outbox::unix_now().saturating_sub(kept.kept_at);
            let expired = age >= limit.keep_results_for.as_secs() && tried.contains(&key);
            if !kept.parts.is_empty() && (expired || evict.contains(&key)) {
                let why = if expired {
                    format!(
                        "node {} kept them for {} without the server and storage taking them",
                        limit.node_id,
                        humanize(limit.keep_results_for)
                    )
                } else {
                    format!(
                        "node {}'s room for results waiting to upload ({} bytes) is full",
                        limit.node_id, limit.keep_results_bytes
                    )
                };
                let folders: Vec<_> = kept
                    .parts
                    .iter()
                    .map(|p| inner.outbox.folder(&kept, &p.kind))
                    .collect();
                let _ = tokio::task::spawn_blocking(move || {
                    for f in folders {
                        let _ = std::fs::remove_dir_all(f);
                    }
                })
                .await;
                inner.give_up(&mut kept, &why);
            }
            if !kept.parts.is_empty() {
                tried.insert(key.clone());
            }
            for part in kept.parts.clone() {
                let dir = inner.outbox.folder(&kept, &part.kind);
                let r = upload_and_log(
                    &inner,
                    &key,
                    &part.kind,
                    (&dir, None),
                    Some((part.step, part.epoch)),
                    None,
                    &stop,
                )
                .await;
                // Why results the server was told are uploading will not come after all.
                let lost = match &r {
                    Ok(Some(_)) => None,
                    Ok(None) => Some("their kept copy on the node is gone".to_owned()),
                    Err(artifacts::TransferError::Stale) => {
                        Some("the server no longer takes them for this run".to_owned())
                    }
                    Err(e) if refused_for_good(e) => Some(format!("the server refused them ({e})")),
                    Err(_) => {
                        failed = true;
                        break;
                    }
                };
                if let (Some(why), true) = (lost, part.kind == RESULTS) {
                    if kept.reported {
                        kept.lost.push((part.kind.clone(), why));
                    } else {
                        kept.report.not_kept = Some(why);
                    }
                }
                kept = drop_kept_part(&inner, kept, &part.kind).await;
            }
            if !kept.reported && !inner.report_end(&mut kept, &stop).await {
                return;
            }
            if !inner.tell_lost(&mut kept).await {
                failed = true;
            }
            inner.settle_kept(&kept);
            if kept.parts.is_empty() {
                tried.remove(&key);
            }
            if stop.is_cancelled() {
                return;
            }
        }
        wait = if failed {
            (wait * 2).clamp(OUTBOX_PERIOD, OUTBOX_MAX_WAIT)
        } else {
            OUTBOX_PERIOD
        };
    }
}

/// "3d", "12h", "90s": a keep time as an operator wrote it.
fn humanize(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        s if s >= 86_400 && s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s >= 3600 && s % 3600 == 0 => format!("{}h", s / 3600),
        s => format!("{s}s"),
    }
}

/// Stops every task once the server has not answered for the fence time ([`fence`]): past
/// its node timeout the server runs them elsewhere, and two runs of a task must never overlap.
async fn fence_loop(inner: Arc<Inner>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut fenced = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let (after, grace) = fence(inner.node_lost());
        let silent = lock(&inner.last_heard).elapsed();
        if silent < after {
            if fenced {
                tracing::info!("the server answers again: new tasks may start");
            }
            fenced = false;
            continue;
        }
        let running = lock(&inner.tasks).values().any(|e| !e.finished);
        if fenced || !running {
            continue;
        }
        fenced = true;
        tracing::warn!(
            silent_s = silent.as_secs(),
            grace_s = grace.as_secs(),
            "the server has not answered for half its node timeout: stopping every task (they checkpoint within the grace period), so that none runs here while the server starts it elsewhere"
        );
        inner.stop_all(grace);
    }
}

async fn sample_loop(inner: Arc<Inner>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(inner.config.sample_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let backend = inner.backend.clone();
        let samples = match tokio::task::spawn_blocking(move || backend.sample()).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "GPU sampling failed");
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "GPU sampling task failed");
                continue;
            }
        };
        inner.metrics.observe(&lock(&inner.inventory), &samples);
        let at = now_rfc3339();
        let holders = inner.gpu_holders();
        {
            let mut q = lock(&inner.samples);
            for s in samples {
                q.push_back(GpuSample {
                    at: at.clone(),
                    gpu_index: s.gpu_index,
                    util: s.util,
                    mem_used: s.mem_used,
                    mem_total: s.mem_total,
                    temperature: s.temperature.map(f64::from),
                    power_w: s.power_w,
                    processes: s.processes,
                    task_id: holders.get(&s.gpu_index).cloned(),
                });
            }
            inner.trim_samples(&mut q);
        }
        if inner.client.has_credential() {
            tokio::select! {
                _ = stop.cancelled() => return,
                () = inner.flush_samples() => {}
            }
        }
    }
}
