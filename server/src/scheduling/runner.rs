//! Runs the policy on the leader: every cycle loads the input from the store, charges usage
//! up to the clock's `now`, asks the policy, and applies each decision by a conditional
//! update, so a task that changed meanwhile (cancelled, placed by another cycle) is left
//! alone: none is placed twice and none is lost.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use autodl_common::tasks::{Waiting, WorkerPlacement as ApiPlacement};
use autodl_scheduler::{Decision, PolicyConfig, Scheduler};

use super::handle::SchedulerHandle;
use super::snapshot::{self, secs};
use crate::agents::AgentHub;
use crate::clock::Clock;
use crate::config::Settings;
use crate::metrics::Metrics;
use crate::state::AppState;
use crate::store::{LeaderGuard, NodeRecord, SchedulingTaskRecord, Store};
use crate::tasks::placement_of;

pub struct Runner {
    store: Arc<dyn Store>,
    handle: Arc<SchedulerHandle>,
    agents: Arc<AgentHub>,
    metrics: Arc<Metrics>,
    settings: Settings,
    storage: crate::storage::Storage,
    clock: Arc<dyn Clock>,
    scheduler: Scheduler,
    config: PolicyConfig,
    /// When this server became the leader: nodes are judged silent only over time it has
    /// been listening for them (not while it was down, or another server led).
    leader_since: Option<i64>,
    last_housekeeping: Option<Instant>,
    interval: Duration,
}

/// Shortest time between the starts of two scheduling cycles.
const MIN_CYCLE_GAP: Duration = Duration::from_millis(100);

/// Samples are compacted and abandoned uploads swept this often.
const HOUSEKEEPING_EVERY: Duration = Duration::from_secs(3600);

impl Runner {
    pub fn new(state: &AppState, interval: Duration) -> Runner {
        let handle = state.scheduler.clone();
        Runner {
            store: state.store.clone(),
            scheduler: Scheduler::new(handle.config.clone()),
            config: handle.config.clone(),
            handle,
            agents: state.agents.clone(),
            metrics: state.metrics.clone(),
            settings: state.settings.clone(),
            storage: state.storage.clone(),
            clock: state.clock.clone(),
            leader_since: None,
            last_housekeeping: None,
            interval,
        }
    }

    /// Nodes whose agent stopped polling are lost: their tasks go back to the queue (and resume
    /// from their last checkpoint when they start again).
    async fn detect_lost_nodes(
        &self,
        records: &[NodeRecord],
        tasks: &[SchedulingTaskRecord],
        now_ms: i64,
    ) -> anyhow::Result<bool> {
        let timeout = (self.settings.node_lost_timeout_secs as i64) * 1000;
        let listening_since = self.leader_since.unwrap_or(now_ms);
        let mut any = false;
        for n in records {
            let silent = n.credential_hash.is_some()
                && n.status != "lost"
                && n.last_seen
                    .is_some_and(|t| now_ms - t.max(listening_since) > timeout);
            if !silent {
                continue;
            }
            tracing::warn!(node = %n.id, "no heartbeat: node lost, requeueing its tasks");
            self.store.set_node_status(&n.id, "lost").await?;
            let on_node = |t: &&SchedulingTaskRecord| {
                placement_of(&t.task).is_some_and(|p| p.iter().any(|w| w.node == n.id))
            };
            for t in tasks.iter().filter(on_node) {
                let msg = format!("node {} stopped answering", n.id);
                self.store
                    .requeue_task(&t.task.id, "node_lost", &msg, now_ms)
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
        tasks: &[SchedulingTaskRecord],
        now_ms: i64,
    ) -> anyhow::Result<()> {
        let nodes: Vec<String> = tasks
            .iter()
            .find(|t| t.task.id == task)
            .and_then(|t| placement_of(&t.task))
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
                        self.leader_since = Some(self.clock.now_ms());
                    }
                    Ok(None) => {
                        tokio::time::sleep(self.interval).await;
                        continue;
                    }
                    Err(e) => {
                        tracing::error!(error = ?e, "leader election failed");
                        tokio::time::sleep(self.interval).await;
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
            match self.cycle(self.clock.now_ms()).await {
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
                    self.leader_since = None;
                }
            }
        }
    }

    /// One cycle at `now_ms`; returns how many tasks it placed. Public for tests and replays,
    /// which drive cycles on a manual clock instead of waiting for the timer.
    pub async fn cycle(&mut self, now_ms: i64) -> anyhow::Result<usize> {
        let cycle_started = Instant::now();
        if self.leader_since.is_none() {
            self.leader_since = Some(now_ms);
        }
        let now = secs(now_ms);
        let records = self.store.list_nodes().await?;
        let listed = self.store.scheduling_tasks().await?;
        if self.detect_lost_nodes(&records, &listed, now_ms).await? {
            self.handle.invalidate_nodes();
        }
        let nodes = self.handle.nodes(self.store.as_ref()).await?;
        let mut loaded = snapshot::load(self.store.as_ref(), nodes.as_ref().clone()).await?;
        if !snapshot::charge(self.store.as_ref(), &mut loaded, now_ms, &self.config).await? {
            tracing::debug!("a run changed while it was charged; charging again next cycle");
        }
        let agent_nodes: HashMap<String, bool> = records
            .iter()
            .map(|n| (n.id.clone(), n.credential_hash.is_some()))
            .collect();
        for st in ["pending", "scheduled", "running"] {
            self.metrics
                .tasks
                .with_label_values(&[st])
                .set(loaded.tasks.iter().filter(|t| t.task.state == st).count() as i64);
        }

        let decisions = self.scheduler.schedule(loaded.snapshot.state(), now);
        let tasks = &loaded.tasks;
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
                    self.stop_task(&task, "preempted", &msg, &agent_nodes, tasks, now_ms)
                        .await?;
                }
                Decision::Migrate { task, for_task, .. } => {
                    let msg = format!("moved to make room for task {for_task}");
                    self.stop_task(&task, "migrated", &msg, &agent_nodes, tasks, now_ms)
                        .await?;
                }
            }
        }
        let waiting: HashMap<String, Waiting> = decisions
            .pending
            .into_iter()
            .map(|p| (p.task.clone(), super::explain(p)))
            .collect();
        self.handle.set_waiting(waiting);
        if self
            .last_housekeeping
            .is_none_or(|t| t.elapsed() >= HOUSEKEEPING_EVERY)
        {
            super::housekeeping::run(&self.store, &self.storage, &self.settings, now_ms).await?;
            self.last_housekeeping = Some(Instant::now());
        }
        self.metrics
            .cycle_seconds
            .observe(cycle_started.elapsed().as_secs_f64());
        Ok(placed)
    }
}
