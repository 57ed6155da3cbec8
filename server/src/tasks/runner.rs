//! The live scheduler: loads the cluster from the store, asks the pure policy for decisions at
//! `now`, and applies them. Each decision is applied by a conditional update, so a task that
//! changed meanwhile (cancelled, placed by another cycle) is left alone: none is placed twice
//! and none is lost. Runs only on the leader (PostgreSQL advisory lock; SQLite has one server).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use autodl_common::tasks::{PriorityFactors, Waiting, WorkerPlacement as ApiPlacement};
use autodl_scheduler::{
    ClusterState, Decision, Gpu, Node, PendingReason, PendingTask, PolicyConfig, Quota, QuotaCap,
    Quotas, RunningTask, Scheduler, UsageLedger, UserUsage, WorkerPlacement,
};
use tokio::sync::Notify;

use super::{placement_of, spec_of, to_request};
use crate::agents::AgentHub;
use crate::config::Settings;
use crate::metrics::Metrics;
use crate::state::{now_ms, AppState};
use crate::store::{LeaderGuard, NodeRecord, QuotaRecord, Store, TaskRecord, UsageRecord};

/// Shared between handlers and the runner: wake-ups, the last explanations, cached nodes.
pub struct SchedulerHandle {
    notify: Notify,
    waiting: RwLock<HashMap<String, Waiting>>,
    nodes: RwLock<(Option<Instant>, Arc<Vec<Node>>)>,
    /// Bumped by every invalidation, so a read that raced with a node change does not put a
    /// stale list back into the cache.
    nodes_generation: std::sync::atomic::AtomicU64,
    pub config: PolicyConfig,
}

/// Nodes are re-read at most this often for admission checks.
const NODE_CACHE_TTL: Duration = Duration::from_secs(2);

impl SchedulerHandle {
    pub fn new(config: PolicyConfig) -> Arc<Self> {
        Arc::new(SchedulerHandle {
            notify: Notify::new(),
            waiting: RwLock::new(HashMap::new()),
            nodes: RwLock::new((None, Arc::new(Vec::new()))),
            config,
            nodes_generation: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Asks for a cycle soon; many wake-ups before it runs make one cycle.
    pub fn wake(&self) {
        self.notify.notify_one();
    }

    pub fn waiting(&self, task: &str) -> Option<Waiting> {
        self.waiting.read().ok()?.get(task).cloned()
    }

    pub fn invalidate_nodes(&self) {
        self.nodes_generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if let Ok(mut n) = self.nodes.write() {
            n.0 = None;
        }
    }

    pub async fn nodes(&self, store: &dyn Store) -> anyhow::Result<Arc<Vec<Node>>> {
        if let Ok(n) = self.nodes.read() {
            if n.0.is_some_and(|t| t.elapsed() < NODE_CACHE_TTL) {
                return Ok(n.1.clone());
            }
        }
        let generation = self
            .nodes_generation
            .load(std::sync::atomic::Ordering::SeqCst);
        let nodes = Arc::new(
            store
                .list_nodes()
                .await?
                .iter()
                .map(to_node)
                .collect::<anyhow::Result<Vec<_>>>()?,
        );
        if let Ok(mut n) = self.nodes.write() {
            if self
                .nodes_generation
                .load(std::sync::atomic::Ordering::SeqCst)
                == generation
            {
                *n = (Some(Instant::now()), nodes.clone());
            }
        }
        Ok(nodes)
    }
}

pub fn to_node(r: &NodeRecord) -> anyhow::Result<Node> {
    Ok(Node {
        id: r.id.clone(),
        zone: r.zone.clone(),
        labels: serde_json::from_str(&r.labels)?,
        cpu_millis: r.cpu_millis.max(0) as u64,
        mem_bytes: r.mem_bytes.max(0) as u64,
        gpus: serde_json::from_str::<Vec<Gpu>>(&r.gpus)?,
        // Cordoned, draining and lost nodes keep their tasks but get no new ones.
        schedulable: r.schedulable && r.status == "ready",
        taints: super::access::node_taints(r),
        features: super::access::node_features(r),
    })
}

pub fn to_quota(q: &QuotaRecord) -> Quota {
    Quota {
        max_gpus: q.max_gpus.map(|n| n.clamp(0, u32::MAX as i64) as u32),
        max_gpu_hours_per_month: q.gpu_hours_per_month,
        allowed_gpu_types: q
            .allowed_gpu_types
            .as_deref()
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or_default(),
        share: None,
    }
}

pub async fn load_quotas(store: &dyn Store) -> anyhow::Result<Quotas> {
    let mut quotas = Quotas::default();
    for row in store.all_quotas().await? {
        let q = to_quota(&row.quota);
        match row.scope.as_str() {
            "tenant" => quotas.tenants.insert(row.subject_id, q),
            _ => quotas.users.insert(row.subject_id, q),
        };
    }
    Ok(quotas)
}

fn month_of(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(ms / 1000)
        .map(|t| format!("{:04}-{:02}", t.year(), u8::from(t.month())))
        .unwrap_or_default()
}

pub struct Runner {
    store: Arc<dyn Store>,
    handle: Arc<SchedulerHandle>,
    agents: Arc<AgentHub>,
    metrics: Arc<Metrics>,
    settings: Settings,
    storage: crate::storage::Storage,
    scheduler: Scheduler,
    ledger: UsageLedger,
    month: String,
    last_cycle_s: Option<u64>,
    last_compaction: Option<Instant>,
    interval: Duration,
}

/// Shortest time between the starts of two scheduling cycles.
const MIN_CYCLE_GAP: Duration = Duration::from_millis(100);

/// Raw GPU samples are folded into rollups this often.
const COMPACTION_EVERY: Duration = Duration::from_secs(3600);

impl Runner {
    pub fn new(state: &AppState, interval: Duration) -> Runner {
        let handle = state.scheduler.clone();
        Runner {
            store: state.store.clone(),
            scheduler: Scheduler::new(handle.config.clone()),
            handle,
            agents: state.agents.clone(),
            metrics: state.metrics.clone(),
            settings: state.settings.clone(),
            storage: state.storage.clone(),
            ledger: UsageLedger::default(),
            month: String::new(),
            last_cycle_s: None,
            last_compaction: None,
            interval,
        }
    }

    /// Nodes whose agent stopped polling are lost: their tasks go back to the queue (and resume
    /// from their last checkpoint when they start again).
    async fn detect_lost_nodes(
        &self,
        records: &[NodeRecord],
        tasks: &[TaskRecord],
        now_ms: i64,
    ) -> anyhow::Result<bool> {
        let cutoff = now_ms - (self.settings.node_lost_timeout_secs as i64) * 1000;
        let mut any = false;
        for n in records {
            let silent = n.credential_hash.is_some()
                && n.status != "lost"
                && n.last_seen.is_some_and(|t| t < cutoff);
            if !silent {
                continue;
            }
            tracing::warn!(node = %n.id, "no heartbeat: node lost, requeueing its tasks");
            self.store.set_node_status(&n.id, "lost").await?;
            let on_node =
                |t: &&TaskRecord| placement_of(t).is_some_and(|p| p.iter().any(|w| w.node == n.id));
            for t in tasks.iter().filter(on_node) {
                let msg = format!("node {} stopped answering", n.id);
                self.store
                    .requeue_task(&t.id, "node_lost", &msg, now_ms)
                    .await?;
            }
            any = true;
        }
        if any {
            self.handle.invalidate_nodes();
        }
        Ok(any)
    }

    /// Stops a placed task: through its agent (which lets it checkpoint) when it has one,
    /// otherwise by putting it back in the queue at once.
    async fn stop_task(
        &self,
        task: &str,
        reason: &str,
        message: &str,
        agent_nodes: &HashMap<String, bool>,
        tasks: &[TaskRecord],
        now_ms: i64,
    ) -> anyhow::Result<()> {
        let nodes: Vec<String> = tasks
            .iter()
            .find(|t| t.id == task)
            .and_then(placement_of)
            .map(|p| p.into_iter().map(|w| w.node).collect())
            .unwrap_or_default();
        if nodes
            .iter()
            .any(|n| agent_nodes.get(n).copied().unwrap_or(false))
        {
            if self.store.set_stop_reason(task, reason).await? {
                for n in &nodes {
                    self.agents.notify(n);
                }
            }
        } else {
            self.store
                .requeue_task(task, reason, message, now_ms)
                .await?;
        }
        Ok(())
    }

    /// Runs forever: waits for leadership, then cycles on every wake-up and on the timer.
    pub async fn run(mut self) {
        let mut guard: Option<LeaderGuard> = None;
        let mut last_started: Option<Instant> = None;
        loop {
            if guard.is_none() {
                match self.store.try_lead().await {
                    Ok(Some(g)) => {
                        tracing::info!("this server is now the scheduler leader");
                        guard = Some(g);
                        if let Err(e) = self.load_ledger().await {
                            tracing::error!(error = ?e, "could not load the usage ledger");
                        }
                    }
                    Ok(None) => {
                        tokio::time::sleep(self.interval * 5).await;
                        continue;
                    }
                    Err(e) => {
                        tracing::error!(error = ?e, "leader election failed");
                        tokio::time::sleep(self.interval * 5).await;
                        continue;
                    }
                }
            }
            tokio::select! {
                _ = self.handle.notify.notified() => {}
                _ = tokio::time::sleep(self.interval) => {}
            }
            // Under a burst of submissions, wake-ups coalesce into at most one cycle per
            // MIN_CYCLE_GAP, so the server keeps its CPU for the submissions themselves. An idle
            // scheduler still reacts at once.
            if let Some(last) = last_started {
                let since = last.elapsed();
                if since < MIN_CYCLE_GAP {
                    tokio::time::sleep(MIN_CYCLE_GAP - since).await;
                }
            }
            let started = Instant::now();
            last_started = Some(started);
            match self.cycle(now_ms()).await {
                Ok(placed) => {
                    tracing::debug!(
                        placed,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "scheduling cycle"
                    );
                    if placed > 0 {
                        // Freed or newly placed resources may let more tasks in.
                        self.handle.wake();
                    }
                }
                Err(e) => {
                    tracing::error!(error = ?e, "scheduling cycle failed");
                    // A broken connection may have taken the advisory lock with it.
                    guard = None;
                }
            }
        }
    }

    async fn load_ledger(&mut self) -> anyhow::Result<()> {
        self.month = month_of(now_ms());
        let mut ledger = UsageLedger::default();
        for r in self.store.load_usage().await? {
            let u = UserUsage {
                decayed_gpu_seconds: r.decayed_gpu_seconds,
                updated_at: (r.updated_at / 1000).max(0) as u64,
                window_alloc_gpu_seconds: r.window_alloc_gpu_seconds,
                window_busy_gpu_seconds: r.window_busy_gpu_seconds,
                month_gpu_seconds: if r.month == self.month {
                    r.month_gpu_seconds
                } else {
                    0.0
                },
            };
            match r.scope.as_str() {
                "tenant" => ledger.tenants.insert(r.subject_id, u),
                _ => ledger.users.insert(r.subject_id, u),
            };
        }
        self.ledger = ledger;
        Ok(())
    }

    /// One cycle at `now_ms`; returns how many tasks it placed. Public for tests, which drive
    /// cycles directly instead of waiting for the timer.
    pub async fn cycle(&mut self, now_ms: i64) -> anyhow::Result<usize> {
        let cycle_started = Instant::now();
        let now = (now_ms / 1000).max(0) as u64;
        let records = self.store.list_nodes().await?;
        let mut tasks = self.store.active_tasks().await?;
        if self.detect_lost_nodes(&records, &tasks, now_ms).await? {
            tasks = self.store.active_tasks().await?;
        }
        let nodes = self.handle.nodes(self.store.as_ref()).await?;
        let agent_nodes: HashMap<String, bool> = records
            .iter()
            .map(|n| (n.id.clone(), n.credential_hash.is_some()))
            .collect();
        let quotas = load_quotas(self.store.as_ref()).await?;
        let trusted: std::collections::HashSet<String> =
            self.store.trusted_tenants().await?.into_iter().collect();
        for st in ["pending", "scheduled", "running"] {
            self.metrics
                .tasks
                .with_label_values(&[st])
                .set(tasks.iter().filter(|t| t.state == st).count() as i64);
        }

        let mut state = ClusterState {
            nodes: nodes.as_ref().clone(),
            quotas,
            ..Default::default()
        };
        let gpu_mem: HashMap<(&str, u32), u64> = nodes
            .iter()
            .flat_map(|n| {
                n.gpus
                    .iter()
                    .map(move |g| ((n.id.as_str(), g.index), g.mem_bytes))
            })
            .collect();
        let dt = self
            .last_cycle_s
            .map(|t| now.saturating_sub(t) as f64)
            .unwrap_or(0.0);
        let month = month_of(now_ms);
        if month != self.month {
            for u in self
                .ledger
                .users
                .values_mut()
                .chain(self.ledger.tenants.values_mut())
            {
                u.month_gpu_seconds = 0.0;
            }
            self.month = month;
        }
        // Exponential window for utilisation: old allocation fades over the configured window.
        let fade = if dt > 0.0 {
            (-dt / self.handle.config.util_window_s.max(1) as f64).exp()
        } else {
            1.0
        };
        for u in self
            .ledger
            .users
            .values_mut()
            .chain(self.ledger.tenants.values_mut())
        {
            u.window_alloc_gpu_seconds *= fade;
            u.window_busy_gpu_seconds *= fade;
        }
        let mut attained = Vec::new();
        for rec in &tasks {
            let spec = match spec_of(rec) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(task = %rec.id, error = %e, "skipping a task with an unreadable spec");
                    continue;
                }
            };
            let access =
                super::access::task_access(trusted.contains(&rec.tenant_id), &spec, &nodes);
            let request = to_request(rec, &spec, access);
            if rec.state == "pending" {
                state.pending.push(request);
                continue;
            }
            let placements: Vec<WorkerPlacement> = placement_of(rec)
                .unwrap_or_default()
                .into_iter()
                .map(|p| WorkerPlacement {
                    node: p.node,
                    gpu_indices: p.gpu_indices,
                })
                .collect();
            // GPU-seconds held since the last cycle; a shared GPU counts by its memory share.
            let held: f64 = placements
                .iter()
                .flat_map(|p| p.gpu_indices.iter().map(move |i| (p.node.as_str(), *i)))
                .map(|key| match (spec.gpu_memory, gpu_mem.get(&key)) {
                    (Some(m), Some(card)) if *card > 0 => (m as f64 / *card as f64).min(1.0),
                    _ => 1.0,
                })
                .sum();
            if dt > 0.0 && held > 0.0 {
                let gpu_s = held * dt;
                // Measured utilisation from the agent's samples; unmeasured counts as busy.
                let busy = self.agents.task_util(&rec.id).unwrap_or(1.0);
                self.ledger.charge(
                    &rec.user_id,
                    &rec.tenant_id,
                    gpu_s,
                    busy,
                    now,
                    self.handle.config.usage_half_life_s,
                );
                attained.push((rec.id.clone(), gpu_s));
            }
            let started_at = rec.started_at.unwrap_or(rec.updated_at);
            state.running.push(RunningTask {
                request,
                placements,
                started_at: (started_at / 1000).max(0) as u64,
                last_checkpoint_at: rec.last_checkpoint_at.map(|t| (t / 1000).max(0) as u64),
                preempting: false,
            });
        }
        state.usage = self.ledger.clone();
        self.last_cycle_s = Some(now);

        let decisions = self.scheduler.schedule(&state, now);
        let mut placed = 0;
        for d in decisions.decisions {
            match d {
                Decision::Place {
                    task, placements, ..
                } => {
                    let api: Vec<ApiPlacement> = placements
                        .iter()
                        .map(|p| ApiPlacement {
                            node: p.node.clone(),
                            gpu_indices: p.gpu_indices.clone(),
                        })
                        .collect();
                    let gpus: usize = placements.iter().map(|p| p.gpu_indices.len()).sum();
                    let node = placements
                        .first()
                        .map(|p| p.node.clone())
                        .unwrap_or_default();
                    if self
                        .store
                        .place_task(
                            &task,
                            &serde_json::to_string(&api)?,
                            &node,
                            gpus as i64,
                            now_ms,
                        )
                        .await?
                    {
                        placed += 1;
                        for p in &placements {
                            self.agents.notify(&p.node);
                        }
                    }
                }
                Decision::Preempt { task, reason, .. } => {
                    let msg = format!(
                        "preempted for task {} (priority {:.2} over {:.2})",
                        reason.for_task, reason.preemptor_priority, reason.victim_priority
                    );
                    self.stop_task(&task, "preempted", &msg, &agent_nodes, &tasks, now_ms)
                        .await?;
                }
                Decision::Migrate { task, for_task, .. } => {
                    let msg = format!("moved to make room for task {for_task}");
                    self.stop_task(&task, "migrated", &msg, &agent_nodes, &tasks, now_ms)
                        .await?;
                }
            }
        }
        let waiting: HashMap<String, Waiting> = decisions
            .pending
            .into_iter()
            .map(|p| (p.task.clone(), explain(p)))
            .collect();
        if let Ok(mut w) = self.handle.waiting.write() {
            *w = waiting;
        }
        if !attained.is_empty() {
            self.store.add_attained(&attained).await?;
            self.store.save_usage(&self.usage_rows(now_ms)).await?;
        }
        if self
            .last_compaction
            .is_none_or(|t| t.elapsed() >= COMPACTION_EVERY)
        {
            let day = 86_400_000i64;
            let raw_before = now_ms - self.settings.raw_sample_retention_days as i64 * day;
            let rollups_before = now_ms - self.settings.rollup_retention_days as i64 * day;
            let folded = self
                .store
                .compact_gpu_samples(raw_before, rollups_before)
                .await?;
            tracing::debug!(folded, "GPU samples compacted");
            self.last_compaction = Some(Instant::now());
            // Uploads an agent began and never committed (it died, or its node was lost): their
            // objects are garbage. A day is far longer than any upload.
            match self
                .storage
                .backend
                .sweep_abandoned(Duration::from_secs(86_400))
                .await
            {
                Ok(0) => {}
                Ok(n) => tracing::info!(n, "removed abandoned upload files"),
                Err(e) => tracing::warn!(error = %e, "could not sweep abandoned uploads"),
            }
            let stale = self.store.stale_uploads(now_ms - day).await?;
            if !stale.is_empty() {
                let (store, storage) = (self.store.clone(), self.storage.clone());
                tokio::spawn(async move {
                    for a in stale {
                        // Claim it first, so a commit arriving now cannot complete it.
                        if a.state == "uploading"
                            && !store
                                .set_artifact_state(&a.id, "uploading", "deleting")
                                .await
                                .unwrap_or(false)
                        {
                            continue;
                        }
                        let gone = crate::storage::delete_prefix(
                            storage.backend.as_ref(),
                            &a.bucket,
                            &a.prefix,
                        )
                        .await;
                        match gone {
                            Ok(_) => {
                                let _ =
                                    store.set_artifact_state(&a.id, "deleting", "deleted").await;
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, artifact = a.id, "could not delete an abandoned upload")
                            }
                        }
                    }
                });
            }
        }
        self.metrics
            .cycle_seconds
            .observe(cycle_started.elapsed().as_secs_f64());
        Ok(placed)
    }

    fn usage_rows(&self, now_ms: i64) -> Vec<UsageRecord> {
        let rows = |scope: &str, map: &BTreeMap<String, UserUsage>| -> Vec<UsageRecord> {
            map.iter()
                .map(|(id, u)| UsageRecord {
                    scope: scope.to_owned(),
                    subject_id: id.clone(),
                    decayed_gpu_seconds: u.decayed_gpu_seconds,
                    updated_at: (u.updated_at as i64) * 1000,
                    window_alloc_gpu_seconds: u.window_alloc_gpu_seconds,
                    window_busy_gpu_seconds: u.window_busy_gpu_seconds,
                    month: month_of(now_ms),
                    month_gpu_seconds: u.month_gpu_seconds,
                })
                .collect()
        };
        let mut out = rows("user", &self.ledger.users);
        out.extend(rows("tenant", &self.ledger.tenants));
        out
    }
}

/// Puts the policy's reason into words a researcher can act on.
pub fn explain(p: PendingTask) -> Waiting {
    let (reason, message) = match &p.reason {
        PendingReason::Quota { scope, cap, .. } => {
            let whose = match scope {
                autodl_scheduler::QuotaScope::Tenant => "your organization's",
                autodl_scheduler::QuotaScope::User => "your",
            };
            let msg = match cap {
                QuotaCap::Gpus {
                    limit,
                    in_use,
                    requested,
                } => {
                    format!("over {whose} GPU quota: {in_use} of {limit} GPUs in use, this task needs {requested}")
                }
                QuotaCap::GpuHoursPerMonth { limit, used } => {
                    format!("{whose} monthly GPU-hours are spent: {used:.1} of {limit:.1} used")
                }
                QuotaCap::GpuTypes { allowed } => {
                    format!(
                        "{whose} quota allows only these GPU types: {}",
                        allowed.join(", ")
                    )
                }
            };
            ("quota", msg)
        }
        PendingReason::NoFit { waiting_for } => (
            "resources",
            format!("waiting for free resources: {waiting_for}"),
        ),
        PendingReason::Reserved { waiting_for, nodes } => (
            "resources",
            format!(
                "next in line: {} reserved while they drain, for {waiting_for}",
                nodes.join(", ")
            ),
        ),
        PendingReason::WaitingForPreemption { victims } => (
            "preemption",
            format!(
                "lower-priority tasks are being preempted to make room ({})",
                victims.len()
            ),
        ),
        PendingReason::WaitingForMigration { tasks } => (
            "preemption",
            format!(
                "shared tasks are being moved to make room ({})",
                tasks.len()
            ),
        ),
        PendingReason::BehindHigherPriority { position, .. } => (
            "priority",
            format!(
                "behind higher-priority tasks (position {} in the queue)",
                position + 1
            ),
        ),
    };
    let b = &p.priority;
    Waiting {
        reason: Some(reason.to_owned()),
        message,
        position: Some(p.position),
        priority: Some(PriorityFactors {
            fair_share: b.fair_share,
            utilization: b.utilization,
            deadline: b.deadline,
            declared: b.declared,
            age: b.age,
            gpu_fit: b.gpu_fit,
            total: b.total,
        }),
    }
}
