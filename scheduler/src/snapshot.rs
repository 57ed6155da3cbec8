//! The policy's input, built one way for the live server and for the simulator.
//!
//! Both hand a [`Snapshot`] the same facts: nodes, quotas, the usage ledger, pending requests
//! and the runs that hold GPUs, each with its attempt's own start and checkpoint and what it has
//! been charged so far. [`Snapshot::charge`] brings accounting up to `now` (the one place GPU
//! time turns into usage), and [`Snapshot::state`] is what [`crate::Scheduler::schedule`] reads.
//! The server rebuilds a snapshot from its store every cycle; the simulator keeps one and moves
//! tasks with [`Snapshot::place`] and [`Snapshot::end_run`]. What one does, the other does, so
//! what the simulator shows is what the server will do.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::config::PolicyConfig;
use crate::types::{
    ClusterState, Node, Quotas, RunningTask, TaskId, TaskRequest, Time, UsageLedger,
    WorkerPlacement,
};

/// A run's accounting: what it has been charged for, so nothing is charged twice (after a
/// restart, or on another server) and nothing is missed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RunAccount {
    /// Which run of its task this is, as the caller numbers them (the simulator: 0).
    pub attempt: u32,
    /// Charged up to here (the run's start when nothing was charged yet).
    pub charged_until: Time,
    /// GPU-seconds charged to this run so far.
    pub gpu_seconds: f64,
}

impl RunAccount {
    pub fn starting(at: Time) -> RunAccount {
        RunAccount {
            attempt: 0,
            charged_until: at,
            gpu_seconds: 0.0,
        }
    }
}

/// One charge made by [`Snapshot::charge`], for the caller to keep: the run's new account,
/// and the GPU-seconds added.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Charge {
    pub task: TaskId,
    pub user: String,
    pub tenant: String,
    pub gpu_seconds: f64,
    /// Charged up to here before this charge (the run's account now says how far after it).
    pub from: Time,
    pub account: RunAccount,
    /// The run had already ended: this was its last charge.
    pub ended: bool,
}

/// A run that ended (finished, failed, requeued) after it was last charged: its tail is still
/// owed.
#[derive(Debug, Clone, PartialEq)]
pub struct EndedRun {
    pub task: TaskId,
    pub user: String,
    pub tenant: String,
    /// GPUs held, with a shared GPU counting by its memory share.
    pub held_gpus: f64,
    pub ended_at: Time,
    pub account: RunAccount,
}

#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    state: ClusterState,
    /// Parallel to `state.running`.
    accounts: Vec<RunAccount>,
    held: Vec<f64>,
    running_at: HashMap<TaskId, usize>,
    ended: Vec<EndedRun>,
    /// Node id -> position in `state.nodes`.
    node_at: HashMap<String, usize>,
}

impl Snapshot {
    /// Nodes are kept in order of id, whatever order they come in: where the policy breaks
    /// ties by position, every caller then breaks them alike.
    pub fn new(mut nodes: Vec<Node>, quotas: Quotas, usage: UsageLedger) -> Snapshot {
        nodes.sort_by(|a, b| a.id.cmp(&b.id));
        let node_at = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.id.clone(), i))
            .collect();
        Snapshot {
            node_at,
            state: ClusterState {
                nodes,
                quotas,
                usage,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// What the policy reads.
    pub fn state(&self) -> &ClusterState {
        &self.state
    }

    pub fn usage(&self) -> &UsageLedger {
        &self.state.usage
    }

    /// Takes back one of the charges [`Snapshot::charge`] just made at `now` (with the same
    /// measured utilisation `busy`): the store did not keep it, so the policy must not count it.
    /// The run's own account stays as charged: a snapshot taken for one cycle only.
    pub fn take_back(&mut self, charge: &Charge, busy: Option<f64>, now: Time) {
        self.state
            .usage
            .uncharge(&charge.user, &charge.tenant, charge.gpu_seconds, busy, now);
    }

    /// A task waiting to be placed. Its `attained_gpu_seconds` is the service of its ended
    /// runs only: a running task's current run is counted by the policy from its start.
    pub fn add_pending(&mut self, request: TaskRequest) {
        self.state.pending.push(request);
    }

    /// A run that holds GPUs now. `task.started_at` and `task.last_checkpoint_at` are this
    /// run's (a checkpoint of an earlier run does not make this one cheap to stop), and
    /// `task.preempting` says it was already told to stop.
    pub fn add_running(&mut self, mut task: RunningTask, account: RunAccount) {
        if task.last_checkpoint_at.is_some_and(|c| c < task.started_at) {
            task.last_checkpoint_at = None;
        }
        let held = self.held_gpus(&task.request, &task.placements);
        self.running_at
            .insert(task.request.id.clone(), self.state.running.len());
        self.state.running.push(task);
        self.accounts.push(account);
        self.held.push(held);
    }

    /// A run that ended but was not charged up to its end.
    pub fn add_ended(&mut self, run: EndedRun) {
        self.ended.push(run);
    }

    /// GPUs a placement holds for accounting: whole cards count 1, a shared card by the
    /// share of its memory the task declared.
    pub fn held_gpus(&self, request: &TaskRequest, placements: &[WorkerPlacement]) -> f64 {
        placements
            .iter()
            .flat_map(|p| p.gpu_indices.iter().map(move |i| (p.node.as_str(), *i)))
            .map(|(node, index)| {
                let card = self
                    .node_at
                    .get(node)
                    .and_then(|&n| self.state.nodes[n].gpus.iter().find(|g| g.index == index))
                    .map(|g| g.mem_bytes);
                match (request.gpu_mem_bytes, card) {
                    (Some(m), Some(card)) if card > 0 => (m as f64 / card as f64).min(1.0),
                    _ => 1.0,
                }
            })
            .sum()
    }

    /// Charges every run for the GPUs it held since it was last charged, up to `now` (an ended
    /// run up to its end). A running run is charged only once `charge_every_s` has passed
    /// since its last charge. `busy` gives a task's measured GPU utilisation over that span, if
    /// any was measured.
    pub fn charge(
        &mut self,
        now: Time,
        mut busy: impl FnMut(&str) -> Option<f64>,
        cfg: &PolicyConfig,
    ) -> Vec<Charge> {
        let (hl, window) = (cfg.usage_half_life_s, cfg.util_window_s);
        let mut out = Vec::new();
        let ClusterState { running, usage, .. } = &mut self.state;
        for (i, r) in running.iter().enumerate() {
            let a = &mut self.accounts[i];
            let dt = now.saturating_sub(a.charged_until);
            if dt < cfg.charge_every_s.max(1) {
                continue;
            }
            let gpu_s = self.held[i] * dt as f64;
            let from = a.charged_until;
            let req = &r.request;
            usage.charge(
                &req.user,
                &req.tenant,
                gpu_s,
                busy(&req.id),
                now,
                hl,
                window,
            );
            a.charged_until = now;
            a.gpu_seconds += gpu_s;
            out.push(Charge {
                task: req.id.clone(),
                user: req.user.clone(),
                tenant: req.tenant.clone(),
                gpu_seconds: gpu_s,
                from,
                account: *a,
                ended: false,
            });
        }
        for e in std::mem::take(&mut self.ended) {
            let until = e.ended_at.min(now);
            let dt = until.saturating_sub(e.account.charged_until);
            let gpu_s = e.held_gpus * dt as f64;
            // The tail is service the task received: its request counts it from now on, as
            // the simulator's `end_run` does.
            if let Some(r) = self
                .running_at
                .get(&e.task)
                .map(|&i| &mut self.state.running[i].request)
                .or_else(|| self.state.pending.iter_mut().find(|r| r.id == e.task))
            {
                r.attained_gpu_seconds += gpu_s;
            }
            if dt > 0 {
                self.state.usage.charge(
                    &e.user,
                    &e.tenant,
                    gpu_s,
                    busy(&e.task),
                    until,
                    hl,
                    window,
                );
            }
            out.push(Charge {
                task: e.task,
                user: e.user,
                tenant: e.tenant,
                gpu_seconds: gpu_s,
                from: e.account.charged_until,
                account: RunAccount {
                    attempt: e.account.attempt,
                    charged_until: until.max(e.account.charged_until),
                    gpu_seconds: e.account.gpu_seconds + gpu_s,
                },
                ended: true,
            });
        }
        out
    }

    /// Starts runs of pending tasks at `now` (the simulator's side of a `Place` decision).
    pub fn place(&mut self, placed: Vec<(TaskId, Vec<WorkerPlacement>)>, now: Time) {
        let mut wanted: HashMap<TaskId, Vec<WorkerPlacement>> = placed.into_iter().collect();
        let mut starting = Vec::new();
        self.state
            .pending
            .retain_mut(|r| match wanted.remove(&r.id) {
                Some(placements) => {
                    starting.push((std::mem::replace(r, placeholder()), placements));
                    false
                }
                None => true,
            });
        for (request, placements) in starting {
            self.add_running(
                RunningTask {
                    request,
                    placements,
                    started_at: now,
                    last_checkpoint_at: None,
                    preempting: false,
                },
                RunAccount::starting(now),
            );
        }
    }

    /// Ends a run at `now`: charges what it still owes, adds its service to the task's, and
    /// returns the task's request (to queue again, or to drop when it completed).
    pub fn end_run(
        &mut self,
        task: &str,
        now: Time,
        busy: Option<f64>,
        cfg: &PolicyConfig,
    ) -> Option<TaskRequest> {
        let i = self.running_at.remove(task)?;
        let last = self.state.running.len() - 1;
        self.state.running.swap(i, last);
        self.accounts.swap(i, last);
        self.held.swap(i, last);
        if i != last {
            let moved = self.state.running[i].request.id.clone();
            self.running_at.insert(moved, i);
        }
        let run = self.state.running.pop().expect("indexed run");
        let mut account = self.accounts.pop().expect("parallel");
        let held = self.held.pop().expect("parallel");
        let dt = now.saturating_sub(account.charged_until);
        if dt > 0 {
            let gpu_s = held * dt as f64;
            let r = &run.request;
            self.state.usage.charge(
                &r.user,
                &r.tenant,
                gpu_s,
                busy,
                now,
                cfg.usage_half_life_s,
                cfg.util_window_s,
            );
            account.gpu_seconds += gpu_s;
        }
        let mut request = run.request;
        request.attained_gpu_seconds += account.gpu_seconds;
        Some(request)
    }

    /// The running tasks, for the caller to note checkpoints and stop requests on.
    pub fn running_mut(&mut self) -> impl Iterator<Item = &mut RunningTask> {
        self.state.running.iter_mut()
    }

    pub fn is_running(&self, task: &str) -> bool {
        self.running_at.contains_key(task)
    }
}

fn placeholder() -> TaskRequest {
    TaskRequest {
        id: String::new(),
        user: String::new(),
        tenant: String::new(),
        gpu_types: Vec::new(),
        gpus_per_worker: 0,
        workers: 0,
        min_workers: None,
        gpu_mem_bytes: None,
        cpu_millis: 0,
        mem_bytes: 0,
        priority: 0.0,
        deadline: None,
        submitted_at: 0,
        estimated_runtime: None,
        preemptible: false,
        zone_affinity: false,
        attained_gpu_seconds: 0.0,
        tolerations: Vec::new(),
        requires: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Gpu;

    fn node(id: &str) -> Node {
        Node {
            id: id.into(),
            zone: String::new(),
            labels: Default::default(),
            cpu_millis: 64_000,
            mem_bytes: 1 << 40,
            gpus: (0..4)
                .map(|i| Gpu {
                    index: i,
                    gpu_type: "A100".into(),
                    mem_bytes: 40 << 30,
                    util: 0.0,
                })
                .collect(),
            schedulable: true,
            taints: vec![],
            features: vec![],
            own_network: false,
        }
    }

    fn req(id: &str, mem: Option<u64>) -> TaskRequest {
        TaskRequest {
            id: id.into(),
            user: "u".into(),
            tenant: "t".into(),
            gpus_per_worker: 1,
            workers: 1,
            min_workers: None,
            gpu_mem_bytes: mem,
            ..placeholder()
        }
    }

    fn on(gpu: u32) -> Vec<WorkerPlacement> {
        vec![WorkerPlacement {
            node: "n".into(),
            gpu_indices: vec![gpu],
        }]
    }

    #[test]
    fn runs_are_charged_once_from_their_own_start() {
        let cfg = PolicyConfig::default();
        let mut s = Snapshot::new(vec![node("n")], Quotas::default(), UsageLedger::default());
        s.add_pending(req("a", None));
        s.add_pending(req("b", Some(10 << 30)));
        s.place(vec![("a".into(), on(0)), ("b".into(), on(1))], 100);
        assert!(s.state().pending.is_empty());
        let c = s.charge(160, |_| None, &cfg);
        // A whole card for 60 s, and a quarter of one.
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].gpu_seconds, 60.0);
        assert_eq!(c[1].gpu_seconds, 15.0);
        assert!(s.charge(160, |_| None, &cfg).is_empty(), "nothing twice");
        let hl = cfg.usage_half_life_s;
        assert!((s.usage().user_usage("u", 160, hl) - 75.0).abs() < 1e-9);
        // Ending a run charges its tail and adds its service to the task's.
        let again = s.end_run("a", 200, None, &cfg).unwrap();
        assert_eq!(again.attained_gpu_seconds, 100.0);
        assert!(!s.is_running("a") && s.is_running("b"));
        // The policy counts a running task's current run itself: its request carries only
        // the service of earlier runs.
        s.add_pending(again);
        s.place(vec![("a".into(), on(2))], 300);
        let r = s
            .state()
            .running
            .iter()
            .find(|r| r.request.id == "a")
            .unwrap();
        assert_eq!((r.started_at, r.request.attained_gpu_seconds), (300, 100.0));
    }

    #[test]
    fn a_checkpoint_of_an_earlier_run_does_not_count() {
        let mut s = Snapshot::new(vec![node("n")], Quotas::default(), UsageLedger::default());
        s.add_running(
            RunningTask {
                request: req("a", None),
                placements: on(0),
                started_at: 1_000,
                last_checkpoint_at: Some(900),
                preempting: false,
            },
            RunAccount::starting(1_000),
        );
        assert_eq!(s.state().running[0].last_checkpoint_at, None);
    }

    #[test]
    fn running_runs_are_charged_every_charge_every_s() {
        let cfg = PolicyConfig::default();
        let mut s = Snapshot::new(vec![node("n")], Quotas::default(), UsageLedger::default());
        s.add_running(
            RunningTask {
                request: req("a", None),
                placements: on(0),
                started_at: 100,
                last_checkpoint_at: None,
                preempting: false,
            },
            RunAccount::starting(100),
        );
        let every = cfg.charge_every_s;
        assert!(every > 1);
        assert!(s.charge(100 + every - 1, |_| None, &cfg).is_empty());
        let c = s.charge(100 + every, |_| None, &cfg);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].gpu_seconds, every as f64);
        // Ending it between charges charges the whole tail at once.
        let ended = s.end_run("a", 100 + every + 3, None, &cfg).unwrap();
        assert_eq!(ended.attained_gpu_seconds, (every + 3) as f64);
    }

    #[test]
    fn ended_runs_pay_their_tail() {
        let cfg = PolicyConfig::default();
        let mut s = Snapshot::new(vec![node("n")], Quotas::default(), UsageLedger::default());
        s.add_ended(EndedRun {
            task: "a".into(),
            user: "u".into(),
            tenant: "t".into(),
            held_gpus: 2.0,
            ended_at: 130,
            account: RunAccount {
                attempt: 1,
                charged_until: 100,
                gpu_seconds: 50.0,
            },
        });
        let mut again = req("a", None);
        again.attained_gpu_seconds = 50.0;
        s.add_pending(again);
        let c = s.charge(500, |_| Some(0.5), &cfg);
        assert_eq!(c.len(), 1);
        assert_eq!(s.state().pending[0].attained_gpu_seconds, 110.0);
        assert!(c[0].ended);
        assert_eq!(c[0].gpu_seconds, 60.0);
        assert_eq!(
            c[0].account,
            RunAccount {
                attempt: 1,
                charged_until: 130,
                gpu_seconds: 110.0
            }
        );
        let u = &s.usage().users["u"];
        assert!((u.window_busy_gpu_seconds / u.window_alloc_gpu_seconds - 0.5).abs() < 1e-9);
    }
}
