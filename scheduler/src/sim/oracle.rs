//! A reference no real scheduler can reach: shortest remaining time first with preemption,
//! remaining time counted in GPU-seconds, by a decider that knows every job's true run time. It lives in the same world as the policies
//! (checkpoints, the grace period a victim keeps its GPUs for, restart costs), so the distance
//! between its average JCT and autodl's is what better guesses of run time could still win.

use crate::sim::jobs::{Decider, Job, JobsConfig, Round};
use crate::types::{TaskId, TaskRequest, Time, WorkerPlacement};
use std::collections::BTreeSet;

#[derive(Debug, Clone)]
struct Task {
    runtime: u64,
    gpus_per_worker: u32,
    workers: u32,
    /// Work kept by the last checkpoint of a stopped run.
    kept: u64,
    attempts: u32,
    run: Option<Run>,
}

#[derive(Debug, Clone)]
struct Run {
    start: Time,
    /// The restart cost this run pays before it does work.
    overhead: u64,
    /// (node, GPU) pairs it holds.
    gpus: Vec<(usize, u32)>,
    stopping: bool,
}

/// Shortest remaining time first, knowing run times. See the module docs.
pub struct Clairvoyant {
    tasks: Vec<Option<Task>>,
    truth: Vec<u64>,
    /// Who holds each GPU, per node.
    owner: Vec<Vec<Option<usize>>>,
    waiting: BTreeSet<usize>,
    checkpoint_s: u64,
    restart_s: u64,
}

impl Clairvoyant {
    /// `order` is the world's admission order: task id `k` is job `order[k]`.
    pub fn new(jobs: &[Job], order: &[usize], cfg: &JobsConfig) -> Clairvoyant {
        Clairvoyant {
            tasks: vec![None; order.len()],
            truth: order.iter().map(|&i| jobs[i].runtime).collect(),
            owner: vec![vec![None; cfg.gpus_per_node as usize]; cfg.nodes as usize],
            waiting: BTreeSet::new(),
            checkpoint_s: cfg.checkpoint_s.max(1),
            restart_s: cfg.restart_s,
        }
    }

    fn seq(task: &str) -> usize {
        task.parse().expect("a task id the world gave")
    }

    fn id(&self, s: usize) -> TaskId {
        let width = self.tasks.len().to_string().len();
        format!("{s:0width$}")
    }

    /// Work done by the current run up to `now`, past the restart cost.
    fn progress(&self, t: &Task, now: Time) -> u64 {
        t.run.as_ref().map_or(t.kept, |r| {
            t.kept + (now.saturating_sub(r.start)).saturating_sub(r.overhead)
        })
    }

    /// Seconds until the task would be done if left alone (or, waiting, once started).
    fn remaining(&self, t: &Task, now: Time) -> u64 {
        match &t.run {
            Some(r) => {
                let restart_left = r.overhead.saturating_sub(now.saturating_sub(r.start));
                t.runtime.saturating_sub(self.progress(t, now)) + restart_left
            }
            None => {
                let restart = if t.attempts > 0 { self.restart_s } else { 0 };
                t.runtime.saturating_sub(t.kept) + restart
            }
        }
    }

    /// What it would still need if stopped now: back to its last checkpoint, plus a restart.
    fn remaining_if_stopped(&self, t: &Task, now: Time) -> u64 {
        let p = self.progress(t, now);
        let kept = t.kept.max(p / self.checkpoint_s * self.checkpoint_s);
        t.runtime.saturating_sub(kept) + self.restart_s
    }

    fn free_on(&self, n: usize) -> u32 {
        self.owner[n].iter().filter(|o| o.is_none()).count() as u32
    }

    fn release(&mut self, s: usize) {
        for node in &mut self.owner {
            for o in node.iter_mut() {
                if *o == Some(s) {
                    *o = None;
                }
            }
        }
    }

    /// GPUs a running task holds on each node.
    fn held(&self, s: usize) -> Vec<(usize, u32)> {
        let mut v: Vec<(usize, u32)> = Vec::new();
        if let Some(Some(Task { run: Some(r), .. })) = self.tasks.get(s) {
            for &(n, _) in &r.gpus {
                match v.iter_mut().find(|x| x.0 == n) {
                    Some(x) => x.1 += 1,
                    None => v.push((n, 1)),
                }
            }
        }
        v
    }

    /// Nodes for the task's workers within `plan` (GPUs per node it may count on), best fit
    /// first; `None` when it does not fit.
    fn fit(plan: &[u32], gpw: u32, workers: u32) -> Option<Vec<usize>> {
        let mut cands: Vec<usize> = (0..plan.len()).filter(|&n| plan[n] >= gpw).collect();
        cands.sort_by_key(|&n| (plan[n], n));
        (cands.len() >= workers as usize).then(|| cands[..workers as usize].to_vec())
    }
}

/// Remaining time is weighed by the GPUs it holds them on: a wide job that is nearly done can
/// still block more work than a narrow one further from its end. (By time alone the oracle
/// scored worse than autodl on Helios 80×8: 15,466 s average JCT.)
fn gpus_of(t: &Task) -> u64 {
    u64::from(t.gpus_per_worker * t.workers)
}

impl Decider for Clairvoyant {
    fn submit(&mut self, request: TaskRequest, _now: Time) {
        let s = Self::seq(&request.id);
        self.tasks[s] = Some(Task {
            runtime: self.truth[s],
            gpus_per_worker: request.gpus_per_worker,
            workers: request.workers,
            kept: 0,
            attempts: 0,
            run: None,
        });
        self.waiting.insert(s);
    }

    fn checkpoint(&mut self, _task: &str, _at: Time) {
        // Checkpoint times follow from the run's start; `remaining_if_stopped` derives them.
    }

    fn finish(&mut self, task: &str, _now: Time) {
        let s = Self::seq(task);
        self.release(s);
        self.tasks[s] = None;
    }

    fn cycle(&mut self, now: Time) -> Round {
        let mut round = Round::default();
        let nodes = self.owner.len();
        let actual: Vec<u32> = (0..nodes).map(|n| self.free_on(n)).collect();
        let mut actual = actual;
        // What each node will have once the runs told to stop have stopped, less what waiting
        // tasks ahead in the order have claimed.
        let mut plan = actual.clone();
        let mut running: Vec<(u64, usize)> = Vec::new();
        for (s, t) in self.tasks.iter().enumerate() {
            let Some(t) = t else { continue };
            let Some(r) = &t.run else { continue };
            if r.stopping {
                for &(n, _) in &r.gpus {
                    plan[n] += 1;
                }
            } else {
                running.push((self.remaining_if_stopped(t, now) * gpus_of(t), s));
            }
        }
        // Victims worth the most first: the most GPU-seconds left even after losing the work
        // past their last checkpoint and paying a restart.
        running.sort_by(|a, b| b.cmp(a));
        let mut order: Vec<(u64, usize)> = self
            .waiting
            .iter()
            .map(|&s| {
                let t = self.tasks[s].as_ref().expect("waiting");
                (self.remaining(t, now) * gpus_of(t), s)
            })
            .collect();
        order.sort_unstable();
        // The smallest single-node GPU count whose preemption attempt failed: a later (longer)
        // task asking at least as much cannot succeed either.
        let mut failed_at: Option<u32> = None;
        let mut preempted: Vec<usize> = Vec::new();
        for (rem, s) in order {
            let (gpw, workers) = {
                let t = self.tasks[s].as_ref().expect("waiting");
                (t.gpus_per_worker, t.workers)
            };
            if let Some(nodes) = Self::fit(&plan, gpw, workers) {
                if nodes.iter().all(|&n| actual[n] >= gpw) {
                    let mut gpus = Vec::new();
                    let mut placements = Vec::new();
                    for &n in &nodes {
                        let mut idx = Vec::new();
                        for (g, o) in self.owner[n].iter_mut().enumerate() {
                            if idx.len() as u32 == gpw {
                                break;
                            }
                            if o.is_none() {
                                *o = Some(s);
                                idx.push(g as u32);
                                gpus.push((n, g as u32));
                            }
                        }
                        actual[n] -= gpw;
                        plan[n] -= gpw;
                        placements.push(WorkerPlacement {
                            node: crate::sim::jobs::node_name(n as u32),
                            gpu_indices: idx,
                        });
                    }
                    let t = self.tasks[s].as_mut().expect("waiting");
                    let overhead = if t.attempts > 0 { self.restart_s } else { 0 };
                    t.attempts += 1;
                    t.run = Some(Run {
                        start: now,
                        overhead,
                        gpus,
                        stopping: false,
                    });
                    self.waiting.remove(&s);
                    round.placed.push((self.id(s), placements));
                } else {
                    // It waits for GPUs being freed: claim them so nothing longer takes them.
                    for &n in &nodes {
                        plan[n] -= gpw;
                    }
                }
                continue;
            }
            if workers == 1 && failed_at.is_some_and(|g| gpw >= g) {
                continue;
            }
            // Preempt runs that would still need more than this task even after losing their
            // work since the last checkpoint and paying a restart.
            let mut trial = plan.clone();
            let mut victims: Vec<usize> = Vec::new();
            let mut placed_on = None;
            for &(vrem, v) in &running {
                if vrem <= rem {
                    break;
                }
                if preempted.contains(&v) {
                    continue;
                }
                for (n, k) in self.held(v) {
                    trial[n] += k;
                }
                victims.push(v);
                if let Some(nodes) = Self::fit(&trial, gpw, workers) {
                    placed_on = Some(nodes);
                    break;
                }
            }
            let Some(nodes) = placed_on else {
                if workers == 1 {
                    failed_at = Some(failed_at.map_or(gpw, |g| g.min(gpw)));
                }
                continue;
            };
            // Only the victims on the chosen nodes are needed.
            victims.retain(|&v| self.held(v).iter().any(|(n, _)| nodes.contains(n)));
            for &v in &victims {
                for (n, k) in self.held(v) {
                    plan[n] += k;
                }
                preempted.push(v);
                if let Some(Some(Task { run: Some(r), .. })) = self.tasks.get_mut(v) {
                    r.stopping = true;
                }
                round.preempted.push(self.id(v));
            }
            // Every victim on the chosen nodes is stopping: claim what they free.
            for &n in &nodes {
                plan[n] = plan[n].saturating_sub(gpw);
            }
        }
        round
    }

    fn stopped(&mut self, task: &str, at: Time) {
        let s = Self::seq(task);
        self.release(s);
        let cs = self.checkpoint_s;
        if let Some(t) = self.tasks[s].as_mut() {
            if let Some(r) = t.run.take() {
                let p = t.kept + (at.saturating_sub(r.start)).saturating_sub(r.overhead);
                t.kept = t.kept.max(p / cs * cs);
            }
        }
        self.waiting.insert(s);
    }
}
