//! The active tasks as the leader last read them, kept between cycles: each cycle applies
//! only the rows whose scheduling columns changed since the last one (the store's change
//! feed), so a cycle's read costs what changed, not what is queued. The kept state is not a
//! second source of truth: it is read in full when this server becomes the leader, after a
//! failed cycle, and every few minutes (`scheduler_state_check_secs`) as a check, which counts
//! and reports any task the changes missed (`autodl_scheduler_state_drift_total`) and repairs
//! the kept state from a full read. Over `scheduler_state_check_beside_over` kept tasks the
//! check's read runs beside the cycles (a full read of 50,000 tasks took a cycle 1.3 s), and a
//! later cycle compares; a drift found then is repaired by a full read in the next cycle.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use autodl_common::tasks::TaskState;

use tokio::task::JoinHandle;

use super::snapshot::ActiveTask;
use crate::prometheus_metrics::Metrics;
use crate::store::{RunChargeRecord, SchedulingTaskRecord, Store, Tasks};

/// A full read of the active tasks, and the change cursor from before it.
struct FullRead {
    cursor: i64,
    rows: Vec<SchedulingTaskRecord>,
}

pub struct ActiveTasks {
    /// In the order the policy is given them: by submission, then id.
    tasks: BTreeMap<(i64, String), Arc<ActiveTask>>,
    submitted_at: HashMap<String, i64>,
    /// Where the next read of the change feed starts.
    cursor: i64,
    /// When (the runner's clock, ms) everything was last read; `None`: the next refresh reads
    /// everything.
    read_in_full: Option<i64>,
    /// Charges kept by the last cycle, applied before the next (the cycle holds the tasks).
    charged: Vec<RunChargeRecord>,
    /// How often the kept state is compared with a full read.
    check_every: Duration,
    /// Over this many kept tasks the check's full read runs beside the cycles.
    check_beside_over: usize,
    /// The check's full read under way beside the cycles.
    reading: Option<JoinHandle<anyhow::Result<FullRead>>>,
    /// That read, once done, until a cycle compares it.
    read: Option<anyhow::Result<FullRead>>,
    /// Tasks whose charges cycles stored while that read was under way: the read may hold
    /// either side of the charge, so they are left out of the comparison.
    charged_while_reading: HashSet<String>,
}

/// Tasks whose scheduling columns differ between what the changes built and a full read,
/// leaving out those `changed` says may differ rightly; each one is logged.
fn count_drift(
    kept: &HashMap<&str, &SchedulingTaskRecord>,
    read: &HashMap<&str, &SchedulingTaskRecord>,
    changed: impl Fn(&str) -> bool,
) -> usize {
    let mut drift = 0;
    for id in kept
        .keys()
        .chain(read.keys().filter(|id| !kept.contains_key(*id)))
    {
        let (k, r) = (kept.get(id), read.get(id));
        let same = match (k, r) {
            (Some(k), Some(r)) => scheduling_view(k) == scheduling_view(r),
            _ => false,
        };
        if !same && !changed(id) {
            tracing::warn!(
                task = id,
                kept = ?k.map(|t| scheduling_view(t)),
                read = ?r.map(|t| scheduling_view(t)),
                "the scheduler's kept state missed a change"
            );
            drift += 1;
        }
    }
    drift
}

fn is_active(state: TaskState) -> bool {
    matches!(
        state,
        TaskState::Pending | TaskState::Scheduled | TaskState::Running
    )
}

/// The columns the scheduler reads, which the change feed follows.
fn scheduling_view(r: &SchedulingTaskRecord) -> impl PartialEq + std::fmt::Debug + '_ {
    let t = &r.task;
    (
        (
            &t.id,
            &t.tenant_id,
            &t.user_id,
            t.state,
            &t.spec,
            t.attempts,
        ),
        (t.batch_size, &t.placement, t.attained_gpu_seconds.to_bits()),
        (t.last_checkpoint_at, &t.stop_reason, t.created_at),
        (
            r.run_started_at,
            r.run_charged_until,
            r.run_gpu_seconds.map(f64::to_bits),
        ),
    )
}

impl ActiveTasks {
    pub fn new(check_every: Duration, check_beside_over: usize) -> ActiveTasks {
        ActiveTasks {
            tasks: BTreeMap::new(),
            submitted_at: HashMap::new(),
            cursor: 0,
            read_in_full: None,
            charged: Vec::new(),
            check_every,
            check_beside_over,
            reading: None,
            read: None,
            charged_while_reading: HashSet::new(),
        }
    }

    /// Reads everything at the next refresh (a new leader, a failed cycle).
    pub fn forget(&mut self) {
        self.read_in_full = None;
        self.charged.clear();
        self.reading = None;
        self.read = None;
        self.charged_while_reading.clear();
    }

    /// Waits for the check's read under way beside the cycles, if any; the next cycle compares
    /// it. For tests, which drive cycles by hand.
    pub async fn settle(&mut self) {
        if let Some(job) = self.reading.take() {
            self.read = Some(job.await.map_err(anyhow::Error::from).and_then(|r| r));
        }
    }

    /// The runs' charges the last cycle stored.
    pub fn charged(&mut self, rows: Vec<RunChargeRecord>) {
        if self.reading.is_some() {
            self.charged_while_reading
                .extend(rows.iter().map(|c| c.task_id.clone()));
        }
        self.charged.extend(rows.into_iter().filter(|c| !c.settles));
    }

    /// Brings the kept tasks up to date with the store at `now_ms` (the runner's clock).
    pub async fn refresh(
        &mut self,
        store: &Arc<dyn Store>,
        metrics: &Metrics,
        now_ms: i64,
    ) -> anyhow::Result<()> {
        self.apply_charges();
        let every = self.check_every.as_millis() as i64;
        match self.read_in_full {
            None => self.read_all(store.as_ref(), now_ms).await,
            // A clock stepped back checks at once rather than after the step.
            Some(at) if now_ms < at || now_ms - at >= every => {
                let beside = self.reading.is_some() || self.read.is_some();
                if beside || self.tasks.len() > self.check_beside_over {
                    self.check_beside(store, metrics, now_ms).await
                } else {
                    self.check(store.as_ref(), metrics, now_ms).await
                }
            }
            Some(_) => self.apply_changes(store.as_ref()).await,
        }
    }

    /// Compares what the changes built with a full read, and keeps the full read.
    async fn check(
        &mut self,
        store: &dyn Tasks,
        metrics: &Metrics,
        now_ms: i64,
    ) -> anyhow::Result<()> {
        self.apply_changes(store).await?;
        let since = self.cursor;
        let kept = std::mem::take(&mut self.tasks);
        self.read_all(store, now_ms).await?;
        // Tasks that changed after the changes were read may differ rightly.
        let (moved, _) = store.scheduling_task_changes(since).await?;
        let moved: HashSet<&str> = moved.iter().map(|r| r.task.id.as_str()).collect();
        let kept: HashMap<&str, &SchedulingTaskRecord> =
            kept.values().map(|t| (t.id(), &t.rec)).collect();
        let read: HashMap<&str, &SchedulingTaskRecord> =
            self.tasks.values().map(|t| (t.id(), &t.rec)).collect();
        let drift = count_drift(&kept, &read, |id| moved.contains(id));
        if drift > 0 {
            metrics.state_drift.inc_by(drift as u64);
        }
        Ok(())
    }

    /// The same check with the full read beside the cycles: this cycle starts it, and the
    /// first cycle after it is done compares it with the kept state, leaving out the tasks that
    /// changed since it began (their rows may hold either side of the change) and those whose
    /// charges were stored meanwhile. A drift is counted, and the next cycle reads everything.
    async fn check_beside(
        &mut self,
        store: &Arc<dyn Store>,
        metrics: &Metrics,
        now_ms: i64,
    ) -> anyhow::Result<()> {
        if self.reading.as_ref().is_some_and(|job| job.is_finished()) {
            self.settle().await;
        }
        if self.reading.is_none() && self.read.is_none() {
            let reader = store.clone();
            self.charged_while_reading.clear();
            self.reading = Some(tokio::spawn(async move {
                let cursor = reader.task_change_cursor().await?;
                let rows = reader.scheduling_tasks().await?;
                Ok(FullRead { cursor, rows })
            }));
        }
        self.apply_changes(store.as_ref()).await?;
        let Some(read) = self.read.take() else {
            return Ok(());
        };
        let read = read?;
        let (moved, _) = store.scheduling_task_changes(read.cursor).await?;
        let moved: HashSet<&str> = moved.iter().map(|r| r.task.id.as_str()).collect();
        let charged = std::mem::take(&mut self.charged_while_reading);
        let kept: HashMap<&str, &SchedulingTaskRecord> =
            self.tasks.values().map(|t| (t.id(), &t.rec)).collect();
        let rows: HashMap<&str, &SchedulingTaskRecord> = read
            .rows
            .iter()
            .filter(|r| is_active(r.task.state))
            .map(|r| (r.task.id.as_str(), r))
            .collect();
        let drift = count_drift(&kept, &rows, |id| {
            moved.contains(id) || charged.contains(id)
        });
        self.read_in_full = Some(now_ms);
        if drift > 0 {
            metrics.state_drift.inc_by(drift as u64);
            self.forget();
        }
        Ok(())
    }

    /// Every active task, in the policy's order.
    pub fn tasks(&self) -> Vec<Arc<ActiveTask>> {
        self.tasks.values().cloned().collect()
    }

    async fn read_all(&mut self, store: &dyn Tasks, now_ms: i64) -> anyhow::Result<()> {
        self.cursor = store.task_change_cursor().await?;
        self.tasks.clear();
        self.submitted_at.clear();
        for row in store.scheduling_tasks().await? {
            self.put(row);
        }
        self.read_in_full = Some(now_ms);
        Ok(())
    }

    async fn apply_changes(&mut self, store: &dyn Tasks) -> anyhow::Result<()> {
        let (rows, next) = store.scheduling_task_changes(self.cursor).await?;
        for row in rows {
            if let Some(at) = self.submitted_at.remove(&row.task.id) {
                self.tasks.remove(&(at, row.task.id.clone()));
            }
            if is_active(row.task.state) {
                self.put(row);
            }
        }
        self.cursor = next;
        Ok(())
    }

    fn put(&mut self, row: SchedulingTaskRecord) {
        let (id, at) = (row.task.id.clone(), row.task.created_at);
        self.submitted_at.insert(id.clone(), at);
        self.tasks.insert((at, id), Arc::new(ActiveTask::new(row)));
    }

    fn apply_charges(&mut self) {
        for c in std::mem::take(&mut self.charged) {
            let Some(&at) = self.submitted_at.get(&c.task_id) else {
                continue;
            };
            if let Some(t) = self.tasks.get_mut(&(at, c.task_id.clone())) {
                if t.rec.task.attempts == c.number && t.rec.run_started_at.is_some() {
                    let t = Arc::make_mut(t);
                    t.rec.run_charged_until = Some(c.charged_until);
                    t.rec.run_gpu_seconds = Some(c.gpu_seconds);
                }
            }
        }
    }
}
