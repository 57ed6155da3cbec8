//! When will a waiting task start? The policy itself is run forward on a copy of the cluster,
//! with every run assumed to last its estimate, so the answer follows the same order, packing,
//! quotas and fair-share the real cycles will use. What it cannot know (run times, new arrivals,
//! preemptions by tasks not yet submitted) makes it an estimate; `autodl-sim jobs --forecast`
//! measures how good.

use crate::config::PolicyConfig;
use crate::scheduler::{Decision, Scheduler};
use crate::snapshot::Snapshot;
use crate::types::{TaskId, TaskRequest, Time};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};

/// Run times a user's tasks took lately, for tasks that give no estimate of their own.
#[derive(Debug, Clone, Default)]
pub struct RuntimeHistory {
    by_user: HashMap<String, VecDeque<u64>>,
    /// Used for a user without history.
    pub default_s: u64,
}

/// How many recent run times per user the estimate looks at.
const HISTORY_LEN: usize = 20;

impl RuntimeHistory {
    pub fn new(default_s: u64) -> RuntimeHistory {
        RuntimeHistory {
            by_user: HashMap::new(),
            default_s,
        }
    }

    /// A task of `user` completed after running `secs` in all.
    pub fn record(&mut self, user: &str, secs: u64) {
        let h = self.by_user.entry(user.to_owned()).or_default();
        if h.len() == HISTORY_LEN {
            h.pop_front();
        }
        h.push_back(secs);
    }

    /// The task's own estimate, else the median of its user's recent run times, else the
    /// default. The median, because run times are heavy-tailed: one week-long job should not
    /// make every later estimate of that user a week.
    pub fn estimate(&self, task: &TaskRequest) -> u64 {
        if let Some(e) = task.estimated_runtime {
            return e.max(1);
        }
        match self.by_user.get(&task.user) {
            Some(h) if !h.is_empty() => {
                let mut v: Vec<u64> = h.iter().copied().collect();
                v.sort_unstable();
                v[v.len() / 2].max(1)
            }
            _ => self.default_s.max(1),
        }
    }
}

/// Estimated start of each pending task that the forward run placed within `max_steps` steps
/// (each step is the moment one or more runs end), while `go_on` says so (the caller's budget:
/// on a long queue each step is a full cycle). Tasks left out would start later than the
/// forward run looked, or never on this cluster.
///
/// The forward run differs from the live policy in two ways, both to keep it stable: it does
/// not preempt or migrate (a preemption needs a preemptor that is not there yet), and a run
/// already past its estimate is assumed to end after a tenth of its estimate more (at least a
/// minute) rather than at once.
pub fn estimate_starts(
    snapshot: &Snapshot,
    now: Time,
    cfg: &PolicyConfig,
    runtime: &dyn Fn(&TaskRequest) -> u64,
    max_steps: usize,
    go_on: &mut dyn FnMut() -> bool,
) -> BTreeMap<TaskId, Time> {
    let mut starts = BTreeMap::new();
    if snapshot.state().pending.is_empty() {
        return starts;
    }
    let mut cfg = cfg.clone();
    cfg.preemption = false;
    cfg.migration = false;
    cfg.explain_pending = false;
    let mut snap = snapshot.clone();
    let mut ends: BinaryHeap<Reverse<(Time, TaskId)>> = BinaryHeap::new();
    let mut requeue: HashMap<TaskId, bool> = HashMap::new();
    for r in &snap.state().running {
        let end = if r.preempting {
            now + cfg.grace_s
        } else {
            let est = runtime(&r.request);
            let planned = r.started_at.saturating_add(est);
            if planned > now {
                planned
            } else {
                now + (est / 10).max(60)
            }
        };
        requeue.insert(r.request.id.clone(), r.preempting);
        ends.push(Reverse((end, r.request.id.clone())));
    }
    let sched = Scheduler::new(cfg.clone());
    for _ in 0..max_steps {
        if !go_on() {
            break;
        }
        let Some(&Reverse((t, _))) = ends.peek() else {
            break;
        };
        while let Some(Reverse((at, _))) = ends.peek() {
            if *at > t {
                break;
            }
            let Reverse((_, id)) = ends.pop().expect("peeked");
            if let Some(req) = snap.end_run(&id, t, None, &cfg) {
                if requeue.remove(&id).unwrap_or(false) {
                    snap.add_pending(req);
                }
            }
        }
        snap.charge(t, |_| None, &cfg);
        let placed: Vec<_> = sched
            .schedule(snap.state(), t)
            .decisions
            .into_iter()
            .filter_map(|d| match d {
                Decision::Place {
                    task, placements, ..
                } => Some((task, placements)),
                _ => None,
            })
            .collect();
        for (task, _) in &placed {
            starts.entry(task.clone()).or_insert(t);
        }
        let by_id: HashMap<&str, &TaskRequest> = snap
            .state()
            .pending
            .iter()
            .map(|r| (r.id.as_str(), r))
            .collect();
        for (task, _) in &placed {
            if let Some(r) = by_id.get(task.as_str()) {
                ends.push(Reverse((t + runtime(r), task.clone())));
            }
        }
        snap.place(placed, t);
        if snap.state().pending.is_empty() {
            break;
        }
    }
    starts
}
