//! Runs the policy on the leader: every cycle loads the input from the store, charges usage
//! up to the clock's `now`, asks the policy, and applies each decision by a conditional
//! update, so a task that changed meanwhile (cancelled, placed by another cycle) is left
//! alone: none is placed twice and none is lost.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use autodl_common::tasks::TaskState;
use autodl_scheduler::{Decision, PolicyConfig, Scheduler};

use super::active::ActiveTasks;
use super::handle::SchedulerHandle;
use super::snapshot::{self, secs, ActiveTask};
use super::waiting::Plan;
use crate::agents::AgentHub;
use crate::clock::Clock;
use crate::config::Settings;
use crate::domain::NodeStatus;
use crate::prometheus_metrics::Metrics;
use crate::state::AppState;
use crate::store::{LeaderGuard, NodeRecord, Store, StoreError, Term};
use crate::tasks::lifecycle::TIMED_OUT;

mod placing;
mod upkeep;

use placing::Placings;

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
    /// The clock at this server's last cycle, and when it last woke from a stretch without
    /// cycles too long for a working server (see [`Runner::heard_since`]).
    last_cycle_at: Option<i64>,
    awake_since: Option<i64>,
    /// Held while this server leads; its term fences every scheduling write.
    guard: Option<LeaderGuard>,
    /// This server, as the leader table names it (host and process).
    holder: String,
    /// When (by the clock) each cadence last ran.
    last_housekeeping: Option<i64>,
    last_quota_check: Option<i64>,
    last_standings: Option<i64>,
    /// Why tasks wait: a long queue is explained beside the cycles.
    explanations: super::waiting::Explanations,
    /// Idle GPUs: warned, and stopped where the organization says so.
    idle: super::idle::IdleWatch,
    tunnels: Arc<crate::tunnels::Tunnels>,
    /// How the tasks that others wait for ended.
    dependencies: super::dependencies::Dependencies,
    interval: Duration,
    forecaster: super::forecast::Forecaster,
    /// The active tasks, kept between cycles and updated by what changed.
    active: ActiveTasks,
    /// The nodes as last read, parsed, and the node generation then: read again when nodes
    /// change (every change bumps the generation, here or on another server) and at least
    /// every [`NODES_REREAD`].
    nodes: Option<KeptNodes>,
}

struct KeptNodes {
    generation: u64,
    /// By the clock.
    read_at: i64,
    records: Vec<NodeRecord>,
    nodes: Vec<autodl_scheduler::Node>,
}

/// The longest the runner trusts its copy of the nodes without a change being announced.
const NODES_REREAD: Duration = Duration::from_secs(10);

/// A follower asks for the leadership this often, so a dead leader is replaced within it (plus
/// the time PostgreSQL takes to see the leader's connection gone).
const FOLLOWER_RETRY: Duration = Duration::from_secs(1);

/// Shortest time between the starts of two scheduling cycles.
const MIN_CYCLE_GAP: Duration = Duration::from_millis(100);

/// How long a wake-up waits after the last cycle started. A cycle over a long queue costs
/// hundreds of milliseconds even when it places nothing; run back to back under a burst of
/// submissions, such cycles would take a whole core from the submissions that wake them.
/// Resting after a cycle twice as long as it ran keeps wake-ups to a third of one core (the
/// submission figures in docs/benchmarks.md), while a cheap cycle still follows a wake-up within
/// [`MIN_CYCLE_GAP`]. The timer's cycles wait the same.
fn wake_gap(last_cycle: Duration) -> Duration {
    MIN_CYCLE_GAP.max(last_cycle * 3)
}

/// Samples are compacted and abandoned uploads swept this often.
const HOUSEKEEPING_EVERY: Duration = Duration::from_secs(3600);
/// How often the leader keeps each competing person's standing (fair-share, utilization).
const STANDINGS_EVERY: Duration = Duration::from_secs(600);
/// How often the leader looks for monthly GPU-hour caps nearly used.
const QUOTA_CHECK_EVERY: Duration = Duration::from_secs(60);

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
            last_cycle_at: None,
            awake_since: None,
            guard: None,
            holder: format!(
                "{}:{}",
                std::env::var("HOSTNAME").unwrap_or_else(|_| "server".into()),
                std::process::id()
            ),
            last_housekeeping: None,
            last_quota_check: None,
            last_standings: None,
            explanations: Default::default(),
            idle: Default::default(),
            tunnels: state.tunnels.clone(),
            dependencies: Default::default(),
            interval,
            forecaster: Default::default(),
            active: ActiveTasks::new(
                Duration::from_secs(state.settings.scheduler_state_check_secs),
                state.settings.scheduler_state_check_beside_over,
            ),
            nodes: None,
        }
    }

    fn take_lead(&mut self, guard: LeaderGuard, now_ms: i64) -> Term {
        let term = guard.term;
        tracing::info!(term = term.0, "this server is now the scheduler leader");
        self.guard = Some(guard);
        self.leader_since = Some(now_ms);
        self.handle.set_leader(Some(term));
        // What another leader did meanwhile is not in any change this one has seen.
        self.active.forget();
        self.nodes = None;
        // A new term writes every explanation afresh.
        self.handle
            .written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        term
    }

    fn step_down(&mut self, why: &str) {
        if self.guard.take().is_some() {
            tracing::warn!(why, "this server no longer leads the scheduler");
        }
        self.leader_since = None;
        self.explanations.forget();
        self.handle.set_leader(None);
    }

    /// Hands the leadership over now (another server, or a test's next runner, takes it at
    /// once).
    pub async fn resign(&mut self) -> anyhow::Result<()> {
        if let Some(g) = self.guard.take() {
            self.store.resign(g).await?;
        }
        self.step_down("resigned");
        Ok(())
    }

    /// The current term, becoming the leader first if nobody is; `None` while another server
    /// leads.
    async fn term(&mut self, now_ms: i64) -> anyhow::Result<Option<Term>> {
        if let Some(g) = &self.guard {
            return Ok(Some(g.term));
        }
        let guard = self.store.try_lead(&self.holder, now_ms).await?;
        Ok(guard.map(|g| self.take_lead(g, now_ms)))
    }

    /// Brings the kept nodes up to date when they may have changed.
    async fn read_nodes(&mut self, now_ms: i64) -> anyhow::Result<()> {
        let generation = self.handle.nodes_generation();
        if self.nodes.as_ref().is_some_and(|k| {
            k.generation == generation && !crate::clock::due(Some(k.read_at), now_ms, NODES_REREAD)
        }) {
            return Ok(());
        }
        let records = self.store.list_nodes().await?;
        let nodes = records
            .iter()
            .map(snapshot::to_node)
            .collect::<anyhow::Result<Vec<_>>>()?;
        self.nodes = Some(KeptNodes {
            generation,
            read_at: now_ms,
            records,
            nodes,
        });
        Ok(())
    }

    /// Waits for the start-time forecast under way; the next cycle publishes it. For tests and
    /// replays, which drive cycles by hand and must not wait on a timer.
    pub async fn settle_forecast(&mut self) {
        self.forecaster.settle().await;
    }

    /// Waits for the kept tasks' check read under way beside the cycles (tests).
    pub async fn settle_state_check(&mut self) {
        self.active.settle().await;
    }

    /// Waits for a long queue's explanation under way (tests and replays).
    pub async fn settle_explanations(&mut self) {
        self.explanations.settle().await;
    }

    /// Runs forever: waits for leadership, then cycles on every wake-up and on the timer.
    pub async fn run(mut self) {
        // When the last cycle began (by the clock) and how long it took.
        let mut last: Option<(i64, Duration)> = None;
        loop {
            if self.guard.is_none() {
                match self.term(self.clock.now_ms()).await {
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        self.clock.sleep(self.interval.min(FOLLOWER_RETRY)).await;
                        continue;
                    }
                    Err(e) => {
                        tracing::error!(error = ?e, "leader election failed");
                        self.clock.sleep(self.interval.min(FOLLOWER_RETRY)).await;
                        continue;
                    }
                }
            }
            tokio::select! {
                _ = self.handle.notify.notified() => {}
                _ = self.clock.sleep(self.interval) => {}
            }
            // Under a burst of submissions, wake-ups coalesce (see `wake_gap`), so the server
            // keeps its CPU for the submissions themselves. An idle scheduler still reacts at
            // once. (How long a cycle took is the server's own work, measured as such.)
            if let Some((started_ms, took)) = last {
                self.clock
                    .sleep_until(started_ms.saturating_add(wake_gap(took).as_millis() as i64))
                    .await;
            }
            // The lock may have gone with its connection (cut, or the database restarted)
            // while this server was not looking: ask before acting on the cluster.
            let leads = match self.guard.as_mut() {
                Some(g) => self.store.still_leads(g).await.unwrap_or(false),
                None => false,
            };
            if !leads {
                self.step_down("the leader lock is gone");
                continue;
            }
            let started = Instant::now();
            let started_ms = self.clock.now_ms();
            let done = self.cycle(started_ms).await;
            last = Some((started_ms, started.elapsed()));
            match done {
                Ok(placed) => {
                    // The heartbeat every server reads (`/healthz`: has scheduling stalled?).
                    if let Some(g) = &self.guard {
                        if let Err(e) = self.store.cycled(g.term, self.clock.now_ms()).await {
                            tracing::warn!(error = %e, "could not record the cycle");
                        }
                    }
                    tracing::debug!(
                        placed,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "scheduling cycle"
                    );
                    if placed > 0 {
                        // Freed or newly placed resources may let more tasks in.
                        self.handle.wake_here();
                    }
                }
                Err(e) => {
                    if matches!(e.downcast_ref::<StoreError>(), Some(StoreError::Fenced)) {
                        self.step_down("another server started a newer term");
                    } else {
                        tracing::error!(error = ?e, "scheduling cycle failed");
                        // A broken connection may have taken the advisory lock with it.
                        self.step_down("a cycle failed");
                    }
                }
            }
        }
    }

    /// One cycle at `now_ms`; returns how many tasks it placed. Public for tests and replays,
    /// which drive cycles on a manual clock instead of waiting for the timer.
    pub async fn cycle(&mut self, now_ms: i64) -> anyhow::Result<usize> {
        let done = self.cycle_once(now_ms).await;
        if done.is_err() {
            // What the failed cycle read or wrote is unknown: read everything next time.
            self.active.forget();
            self.nodes = None;
        }
        done
    }

    async fn cycle_once(&mut self, now_ms: i64) -> anyhow::Result<usize> {
        let cycle_started = Instant::now();
        let Some(term) = self.term(now_ms).await? else {
            return Ok(0);
        };
        let now = secs(now_ms);
        // Nodes are judged by when they were last heard from: what this server heard is
        // written first.
        self.agents.presence.flush(self.store.as_ref()).await?;
        let flushed_at = cycle_started.elapsed();
        self.read_nodes(now_ms).await?;
        let nodes_at = cycle_started.elapsed();
        self.active
            .refresh(&self.store, &self.metrics, now_ms)
            .await?;
        let mut listed = self.active.tasks();
        let tasks_at = cycle_started.elapsed();
        if self.detect_lost_nodes(term, &listed, now_ms).await? {
            // Nodes went lost (which bumped the node generation) and their tasks back to the
            // queue: read what changed.
            self.read_nodes(now_ms).await?;
            self.active
                .refresh(&self.store, &self.metrics, now_ms)
                .await?;
            listed = self.active.tasks();
        }
        // Tasks waiting for others to end are not the policy's to place yet.
        let mut gated = self.dependencies.gate(self.store.as_ref(), listed).await?;
        // Trials beyond their sweep's concurrency wait the same way.
        let over = super::sweeps::over_concurrency(
            gated
                .ready
                .iter()
                .map(|t| (t.id(), t.rec.task.state, t.spec().sweep.as_ref())),
        );
        if !over.is_empty() {
            gated.ready.retain(|t| !over.contains_key(t.id()));
            gated.held.extend(over);
        }
        for (task, end, why) in &gated.doomed {
            if self.store.end_unstarted(task, *end, why, now_ms).await? {
                tracing::info!(task, why, "a task's dependency failed; it will not start");
            }
        }
        let kept = self.nodes.as_ref().expect("read above");
        let (records, nodes) = (&kept.records, kept.nodes.clone());
        let mut loaded = snapshot::load(self.store.as_ref(), nodes, gated.ready).await?;
        let loaded_at = cycle_started.elapsed();
        match snapshot::charge(self.store.as_ref(), &mut loaded, now_ms, &self.config).await? {
            Some(kept) => self.active.charged(kept),
            None => {
                tracing::debug!(
                    "a run was charged or settled elsewhere meanwhile; charging again next cycle"
                )
            }
        }
        let accounted_at = cycle_started.elapsed();
        let agent_nodes: HashMap<String, bool> = records
            .iter()
            .map(|n| (n.id.clone(), n.credential_hash.is_some()))
            .collect();
        for st in [TaskState::Pending, TaskState::Scheduled, TaskState::Running] {
            self.metrics.tasks.with_label_values(&[st.as_str()]).set(
                loaded
                    .tasks
                    .iter()
                    .filter(|t| t.rec.task.state == st)
                    .count() as i64,
            );
        }

        self.stop_overdue(term, &loaded.tasks, &agent_nodes, now_ms)
            .await?;
        self.idle
            .check(
                self.store.as_ref(),
                &self.tunnels,
                &self.agents,
                term,
                &loaded.tasks,
                &agent_nodes,
                now_ms,
            )
            .await?;
        let charged_at = cycle_started.elapsed();
        let plan = self
            .explanations
            .plan(loaded.snapshot.state().pending.len(), now_ms);
        let decisions = if plan == Plan::Now {
            // What a long queue's explanation still writes comes before this one.
            self.explanations.settle().await;
            self.scheduler.schedule(loaded.snapshot.state(), now)
        } else {
            self.scheduler.decide(loaded.snapshot.state(), now)
        };
        if crate::clock::due(self.last_standings, now_ms, STANDINGS_EVERY) {
            // Nobody competing: nothing to keep, and the next cycle looks again.
            if self
                .record_standings(loaded.snapshot.state(), now, now_ms)
                .await?
            {
                self.last_standings = Some(now_ms);
            }
        }
        let decided_at = cycle_started.elapsed();
        let tasks = &loaded.tasks;
        let mut placing = Placings::new(self.nodes.as_ref().map(|k| k.records.as_slice()));
        for d in decisions.decisions {
            match d {
                Decision::Place {
                    task, placements, ..
                } => placing.add(task, placements, tasks)?,
                Decision::Preempt { task, reason, .. } => {
                    let msg = format!(
                        "preempted for task {} (priority {:.2} over {:.2})",
                        reason.for_task, reason.preemptor_priority, reason.victim_priority
                    );
                    self.stop_task(term, &task, "preempted", &msg, &agent_nodes, tasks, now_ms)
                        .await?;
                }
                // A change of width is a stop through the grace period, like a preemption:
                // the task goes back to the queue with its checkpoint and the next cycle
                // starts it at the width that fits then.
                Decision::Resize { task, reason, .. } => {
                    let msg = reason.describe();
                    self.stop_task(term, &task, "resized", &msg, &agent_nodes, tasks, now_ms)
                        .await?;
                }
                Decision::Migrate { task, for_task, .. } => {
                    let msg = format!("moved to make room for task {for_task}");
                    self.stop_task(term, &task, "migrated", &msg, &agent_nodes, tasks, now_ms)
                        .await?;
                }
            }
        }
        let acted_at = cycle_started.elapsed();
        let started = self.place(term, placing, now_ms).await?;
        let placed = started.len();
        let placed_at = cycle_started.elapsed();
        self.forecaster.collect().await;
        let starts = &self.forecaster.starts;
        let mut waiting = if plan == Plan::Now {
            super::waiting::explain_all(
                decisions.pending,
                super::explain::ClosedNodes::new(loaded.snapshot.state()),
                starts,
            )
        } else {
            HashMap::new()
        };
        if plan == Plan::Beside {
            self.explanations.start(
                self.store.clone(),
                self.handle.clone(),
                self.scheduler.clone(),
                loaded.snapshot.clone(),
                starts.clone(),
                std::mem::take(&mut gated.held),
                term,
                now_ms,
            );
        }
        waiting.extend(gated.held);
        // A long queue waits, explained or not in this cycle.
        if (plan != Plan::Now || !waiting.is_empty()) && self.forecaster.due(now_ms) {
            let runs = self
                .store
                .recent_run_times(super::forecast::HISTORY_TASKS)
                .await?;
            self.forecaster
                .start(loaded.snapshot.clone(), started, now_ms, &self.config, runs);
        }
        let explained_at = cycle_started.elapsed();
        let explanations = if plan == Plan::Now {
            super::waiting::write(self.store.as_ref(), &self.handle, term, waiting, now_ms).await?
        } else {
            0
        };
        let waiting_at = cycle_started.elapsed();
        if crate::clock::due(self.last_housekeeping, now_ms, HOUSEKEEPING_EVERY) {
            super::housekeeping::run(&self.store, &self.storage, &self.settings, now_ms).await?;
            self.last_housekeeping = Some(now_ms);
        }
        if crate::clock::due(self.last_quota_check, now_ms, QUOTA_CHECK_EVERY) {
            crate::notify::quota::check(self.store.as_ref(), now_ms).await?;
            self.last_quota_check = Some(now_ms);
        }
        let total = cycle_started.elapsed();
        self.metrics.cycle_seconds.observe(total.as_secs_f64());
        // Where a cycle's time goes: reading the state, charging usage, the policy, writing.
        tracing::debug!(
            load_ms = loaded_at.as_millis() as u64,
            flush_ms = flushed_at.as_millis() as u64,
            nodes_ms = (nodes_at - flushed_at).as_millis() as u64,
            tasks_ms = (tasks_at - nodes_at).as_millis() as u64,
            charge_ms = (accounted_at - loaded_at).as_millis() as u64,
            overdue_ms = (charged_at - accounted_at).as_millis() as u64,
            policy_ms = (decided_at - charged_at).as_millis() as u64,
            stop_ms = (acted_at - decided_at).as_millis() as u64,
            place_ms = (placed_at - acted_at).as_millis() as u64,
            explain_ms = (explained_at - placed_at).as_millis() as u64,
            waiting_ms = (waiting_at - explained_at).as_millis() as u64,
            write_ms = (total - decided_at).as_millis() as u64,
            placed,
            explain = ?plan,
            explanations,
            pending = loaded.snapshot.state().pending.len(),
            running = loaded.snapshot.state().running.len(),
            "cycle phases"
        );
        Ok(placed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wake_up_rests_twice_as_long_as_the_last_cycle_ran() {
        assert_eq!(wake_gap(Duration::from_millis(5)), MIN_CYCLE_GAP);
        assert_eq!(
            wake_gap(Duration::from_millis(300)),
            Duration::from_millis(900)
        );
    }
}
