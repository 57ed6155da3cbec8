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

mod attempt;
mod background;
mod control;
mod ended;
mod telemetry;

use attempt::*;
use background::*;
use ended::*;

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
    /// The server stopped the attempt for good (its time limit, idle GPUs): its results are
    /// kept as at an end of its own.
    ends_task: bool,
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
    /// Task environments built on this node (`setup`, `requirements`).
    environments: Arc<crate::environments::Environments>,
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
        let environments = crate::environments::Environments::new(&config.state_dir);
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
                environments,
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
}
