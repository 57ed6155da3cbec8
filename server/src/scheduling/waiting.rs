//! Why tasks wait, kept in the store so that every server answers with it. The leader
//! explains a short queue every cycle; a long one every [`EXPLAIN_EVERY`], beside the
//! cycles (on a copy of the cycle's input, like the start-time forecast), so that placing
//! tasks never waits for a pass over tens of thousands of waiting ones, their explanations
//! in words and the writing of what changed.

use std::collections::HashMap;

use autodl_common::tasks::Waiting;
use autodl_scheduler::{PendingTask, Scheduler, Snapshot, TaskId};
use tokio::task::JoinHandle;

use super::explain::ClosedNodes;
use super::handle::SchedulerHandle;
use crate::store::{Store, StoreError, Tasks, Term};

/// Queues up to this long are explained every cycle, within it.
const EXPLAIN_ALWAYS_UP_TO: usize = 1_000;
/// Longer queues are explained this often (clock milliseconds), beside the cycles; the cycles
/// themselves decide without explaining (`Scheduler::decide`), which decides the same.
const EXPLAIN_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Explanations whose reason, message and position stay the same are rewritten this often
/// (their priority factors drift with age and usage), not every time.
const REFRESH_MS: i64 = 30_000;

/// Unchanged explanations refreshed in one write at most.
const REFRESHES_PER_WRITE: usize = 500;

/// Changed explanations beyond the queue's head rewritten in one write at most.
const REWRITES_PER_WRITE: usize = 5_000;

/// Whether a task is at the queue's head, where its explanation is always kept current.
fn at_the_head(w: &Waiting) -> bool {
    w.position.is_none_or(super::explain::at_the_head)
}

/// How a cycle explains its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Within the cycle: a short queue.
    Now,
    /// Beside the cycle, from a copy of its input: a long queue, due for it.
    Beside,
    /// Not this time: a long queue explained a moment ago, or still being explained.
    Not,
}

/// The long queue's explanation in progress, and when the last began.
#[derive(Default)]
pub struct Explanations {
    job: Option<JoinHandle<()>>,
    last: Option<i64>,
}

impl Explanations {
    pub fn plan(&mut self, pending: usize, now_ms: i64) -> Plan {
        if pending <= EXPLAIN_ALWAYS_UP_TO {
            return Plan::Now;
        }
        let busy = self.job.as_ref().is_some_and(|j| !j.is_finished());
        if crate::clock::due(self.last, now_ms, EXPLAIN_EVERY) && !busy {
            Plan::Beside
        } else {
            Plan::Not
        }
    }

    /// Waits for an explanation in progress: one written within a cycle must come after it.
    pub async fn settle(&mut self) {
        if let Some(job) = self.job.take() {
            if let Err(e) = job.await {
                tracing::error!(error = %e, "explaining the queue failed");
            }
        }
    }

    /// A new leader explains at its first cycle.
    pub fn forget(&mut self) {
        self.last = None;
    }

    /// Explains the queue of `snapshot` (this cycle's input) beside the cycles and stores it.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        &mut self,
        store: std::sync::Arc<dyn Store>,
        handle: std::sync::Arc<SchedulerHandle>,
        scheduler: Scheduler,
        snapshot: Snapshot,
        starts: HashMap<TaskId, i64>,
        held: HashMap<String, Waiting>,
        term: Term,
        now_ms: i64,
    ) {
        self.last = Some(now_ms);
        let now = super::snapshot::secs(now_ms);
        self.job = Some(tokio::spawn(async move {
            let explained = super::beside::spawn(move || {
                let state = snapshot.state();
                let pending = scheduler.schedule(state, now).pending;
                explain_all(pending, ClosedNodes::new(state), &starts)
            })
            .await;
            let mut waiting = match explained {
                Ok(w) => w,
                Err(e) => {
                    tracing::error!(error = %e, "explaining the queue failed");
                    return;
                }
            };
            waiting.extend(held);
            match write(store.as_ref(), &handle, term, waiting, now_ms).await {
                Ok(written) => tracing::debug!(written, "the queue explained"),
                Err(e) if matches!(e.downcast_ref::<StoreError>(), Some(StoreError::Fenced)) => {
                    tracing::debug!("no longer the leader: the queue's explanations are left")
                }
                Err(e) => tracing::warn!(error = ?e, "storing the queue's explanations failed"),
            }
        }));
    }
}

/// Every waiting task in words, with its estimated start.
pub fn explain_all(
    pending: Vec<PendingTask>,
    mut closed: ClosedNodes<'_>,
    starts: &HashMap<TaskId, i64>,
) -> HashMap<String, Waiting> {
    pending
        .into_iter()
        .map(|p| {
            let id = p.task.clone();
            let closed = closed.for_task(&p);
            let mut w = super::explain(p, &closed);
            w.estimated_start = starts.get(&id).map(|&ms| crate::domain::rfc3339(ms));
            (id, w)
        })
        .collect()
}

/// Stores why tasks wait: what is new or at the queue's head at once, other changes a bounded
/// number a write (the longest unwritten first), what did not change every [`REFRESH_MS`].
/// Returns how many rows it wrote.
pub async fn write(
    store: &dyn Tasks,
    handle: &SchedulerHandle,
    term: Term,
    waiting: HashMap<String, Waiting>,
    now_ms: i64,
) -> anyhow::Result<usize> {
    // What is stored for each task and when it was written, after this cycle.
    let mut next: HashMap<String, (Waiting, i64)> = HashMap::with_capacity(waiting.len());
    let mut changes: Vec<(String, Option<String>)> = Vec::new();
    {
        let mut written = handle.written.lock().unwrap_or_else(|p| p.into_inner());
        // Beyond the queue's head, changed explanations and unchanged ones due for a refresh
        // wait their turn, the longest unwritten first, a bounded number a write: on a long
        // queue the order moves as usage accrues (every task of a person moves together) and
        // free capacity comes and goes (many reasons change at once), and writing all of it
        // each time would cost the database more than the scheduling.
        let mut changed: Vec<(i64, String, Waiting, Waiting)> = Vec::new();
        let mut due: Vec<(i64, String, Waiting, Waiting)> = Vec::new();
        // What changed: new or at the head, reworded, moved, re-estimated; and refreshed.
        let mut why = [0usize; 5];
        for (id, w) in waiting {
            let old = written.remove(&id);
            let change = old
                .as_ref()
                .map(|(old, _)| super::explain::change(old, &w, now_ms));
            match (old, change) {
                (Some((old, at)), Some(None)) if now_ms - at < REFRESH_MS => {
                    next.insert(id, (old, at));
                }
                (Some((old, at)), Some(None)) => due.push((at, id, old, w)),
                (Some((old, at)), Some(Some(c))) if !at_the_head(&old) && !at_the_head(&w) => {
                    why[c as usize + 1] += 1;
                    changed.push((at, id, old, w));
                }
                _ => {
                    why[0] += 1;
                    changes.push((id.clone(), Some(serde_json::to_string(&w)?)));
                    next.insert(id, (w, now_ms));
                }
            }
        }
        why[4] = due.len().min(REFRESHES_PER_WRITE);
        for (mut waiting, limit) in [(changed, REWRITES_PER_WRITE), (due, REFRESHES_PER_WRITE)] {
            waiting.sort_unstable_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
            for (i, (at, id, old, w)) in waiting.into_iter().enumerate() {
                if i < limit {
                    changes.push((id.clone(), Some(serde_json::to_string(&w)?)));
                    next.insert(id, (w, now_ms));
                } else {
                    next.insert(id, (old, at));
                }
            }
        }
        tracing::debug!(
            new_or_head = why[0],
            reworded = why[1],
            moved = why[2],
            re_estimated = why[3],
            refreshed = why[4],
            "explanations changed"
        );
        // Those left no longer wait.
        changes.extend(written.drain().map(|(id, _)| (id, None)));
    }
    store.set_waiting(term, &changes).await?;
    *handle.written.lock().unwrap_or_else(|p| p.into_inner()) = next;
    Ok(changes.len())
}
