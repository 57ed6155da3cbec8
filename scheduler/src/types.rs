//! Domain types shared by the live server and the simulators.
//!
//! Everything here is plain data: the scheduler never reads a clock or the network, so the caller
//! snapshots the cluster into these types, passes `now`, and applies the returned decisions.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Seconds on whatever clock the caller uses (Unix time live, virtual time in the simulator).
/// The policy only ever subtracts two of them, so the epoch does not matter.
pub type Time = u64;

/// Identifier of a task; opaque to the policy.
pub type TaskId = String;

/// GPU models are matched by family so that a user asking for "A100" accepts every A100 variant
/// the operator has, while "A100-80G" pins the memory size.
///
/// A request matches a GPU type when it is equal to it (ignoring case) or is a prefix of it that
/// ends at a `-` or `_` separator.
pub fn gpu_type_matches(request: &str, gpu_type: &str) -> bool {
    let (r, g) = (request.as_bytes(), gpu_type.as_bytes());
    if r.len() > g.len() || !r.eq_ignore_ascii_case(&g[..r.len()]) {
        return false;
    }
    r.len() == g.len() || matches!(g[r.len()], b'-' | b'_')
}

/// True when a request that accepts `types` (empty means "any") may use a GPU of `gpu_type`.
pub fn accepts_type(types: &[String], gpu_type: &str) -> bool {
    types.is_empty() || types.iter().any(|t| gpu_type_matches(t, gpu_type))
}

/// One physical GPU as the node agent reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    /// Device index on the node (what `CUDA_VISIBLE_DEVICES` will carry).
    pub index: u32,
    pub gpu_type: String,
    pub mem_bytes: u64,
    /// Measured utilisation in [0, 1] over the last sample window; informational for placement.
    #[serde(default)]
    pub util: f64,
}

/// A worker machine. Allocations are not stored here: they are derived from the running tasks,
/// so there is a single source of truth and the node agent only reports capacity and health.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub id: String,
    #[serde(default)]
    pub zone: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub cpu_millis: u64,
    pub mem_bytes: u64,
    pub gpus: Vec<Gpu>,
    /// Cordoned or unhealthy nodes keep their running tasks but receive no new ones.
    #[serde(default = "yes")]
    pub schedulable: bool,
    /// A task lands here only if it tolerates every taint (e.g. `trusted-only` on a node that
    /// cannot isolate tasks from each other).
    #[serde(default)]
    pub taints: Vec<String>,
    /// What the node offers that a task may require (e.g. a dataset root).
    #[serde(default)]
    pub features: Vec<String>,
    /// Each task here has a network of its own (an isolated node), which the tasks of other
    /// nodes do not reach: the workers of a gang meet over the network, so a gang placed here
    /// keeps all of its workers on this one node.
    #[serde(default)]
    pub own_network: bool,
}

impl Node {
    /// Whether one worker of `t` would fit here were the node empty and open: the GPUs of an
    /// acceptable type, CPU and memory it asks, and no taint it does not tolerate. What a
    /// waiting task is told when the only such nodes are closed to new tasks.
    pub fn could_hold(&self, t: &TaskRequest) -> bool {
        let gpus = self
            .gpus
            .iter()
            .filter(|g| accepts_type(&t.gpu_types, &g.gpu_type))
            .filter(|g| t.gpu_mem_bytes.is_none_or(|m| g.mem_bytes >= m))
            .count();
        gpus >= t.gpus_per_worker as usize
            && self.cpu_millis >= t.cpu_millis
            && self.mem_bytes >= t.mem_bytes
            && self.admits(&t.tolerations, &t.requires)
    }

    /// A task with these tolerations and requirements may run here.
    pub fn admits(&self, tolerations: &[String], requires: &[String]) -> bool {
        self.taints.iter().all(|t| tolerations.contains(t))
            && requires.iter().all(|r| self.features.contains(r))
    }
}

fn yes() -> bool {
    true
}

fn half() -> f64 {
    0.5
}

fn one() -> u32 {
    1
}

/// What a user asks for. `workers x gpus_per_worker` GPUs are gang-placed: all workers start
/// together or none does, because a distributed job with a missing rank only burns GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRequest {
    pub id: TaskId,
    pub user: String,
    #[serde(default)]
    pub tenant: String,
    /// Acceptable GPU types (family names allowed); empty accepts any type.
    #[serde(default)]
    pub gpu_types: Vec<String>,
    pub gpus_per_worker: u32,
    /// Workers wanted: all of them for a rigid task, at most this many for an elastic one.
    #[serde(default = "one")]
    pub workers: u32,
    /// The fewest workers an elastic task runs with; `None` for a rigid task (all `workers`
    /// or none). An elastic task starts with as many workers as fit, from `workers` down to
    /// this many, and makes room by preemption for this many only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_workers: Option<u32>,
    /// Declared GPU memory per GPU. Below a whole card the task may share the card with others;
    /// `None` means it wants whole cards.
    #[serde(default)]
    pub gpu_mem_bytes: Option<u64>,
    /// Per worker.
    #[serde(default)]
    pub cpu_millis: u64,
    /// Per worker.
    #[serde(default)]
    pub mem_bytes: u64,
    /// Declared priority in [0, 1].
    #[serde(default = "half")]
    pub priority: f64,
    #[serde(default)]
    pub deadline: Option<Time>,
    pub submitted_at: Time,
    /// The user's (or a predictor's) estimate of the total run time, seconds.
    #[serde(default)]
    pub estimated_runtime: Option<u64>,
    #[serde(default = "yes")]
    pub preemptible: bool,
    /// All workers in one zone (fast interconnect); they may still span several nodes.
    #[serde(default)]
    pub zone_affinity: bool,
    /// GPU-seconds of service the task already received in earlier runs (it was preempted);
    /// lets the policy keep demoting long jobs across restarts.
    #[serde(default)]
    pub attained_gpu_seconds: f64,
    /// Node taints this task accepts.
    #[serde(default)]
    pub tolerations: Vec<String>,
    /// Node features this task needs.
    #[serde(default)]
    pub requires: Vec<String>,
}

impl TaskRequest {
    pub fn total_gpus(&self) -> u32 {
        self.gpus_per_worker * self.workers
    }

    /// The fewest workers it starts with: `workers` unless it is elastic.
    pub fn narrowest(&self) -> u32 {
        let most = self.workers.max(1);
        self.min_workers.map_or(most, |m| m.clamp(1, most))
    }

    /// Whether it may run with fewer workers than it asks for.
    pub fn is_elastic(&self) -> bool {
        self.narrowest() < self.workers
    }

    /// The same request at a width of `workers` (an elastic task's narrower start).
    pub fn at_width(&self, workers: u32) -> TaskRequest {
        TaskRequest {
            workers,
            ..self.clone()
        }
    }
}

/// Where one worker of a task runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerPlacement {
    pub node: String,
    pub gpu_indices: Vec<u32>,
}

/// A task that holds resources now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunningTask {
    pub request: TaskRequest,
    pub placements: Vec<WorkerPlacement>,
    pub started_at: Time,
    /// Last time the task saved a checkpoint it can resume from; preempting it loses the work
    /// done since then, so victims with a recent checkpoint are cheaper.
    #[serde(default)]
    pub last_checkpoint_at: Option<Time>,
    /// Already asked to stop; its resources will come back but must not be counted twice.
    #[serde(default)]
    pub preempting: bool,
}

impl RunningTask {
    /// When its work was last saved: its latest checkpoint of this run, or its start.
    pub fn saved_at(&self) -> Time {
        self.last_checkpoint_at
            .unwrap_or(self.started_at)
            .max(self.started_at)
    }

    /// GPUs its run holds: an elastic task may run with fewer workers than it asked for, and
    /// is charged (and loses work) for those it holds.
    pub fn held_gpus(&self) -> u32 {
        self.placements
            .iter()
            .map(|p| p.gpu_indices.len() as u32)
            .sum()
    }
}

/// Usage history of one user (or tenant), passed back in every cycle. Every sum is brought up
/// to date lazily from `updated_at`, so the ledger can be stored as is and read by any server.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UserUsage {
    /// Decayed GPU-seconds as of `updated_at`.
    pub decayed_gpu_seconds: f64,
    pub updated_at: Time,
    /// GPU-seconds allocated while utilisation was measured, and the part of them that was
    /// busy, both fading over the utilisation window as of `updated_at`. Time without a
    /// measurement counts in neither, so an unmeasured task neither helps nor hurts.
    pub window_alloc_gpu_seconds: f64,
    pub window_busy_gpu_seconds: f64,
    /// Undecayed GPU-seconds used in `month`, for the monthly quota.
    pub month_gpu_seconds: f64,
    /// [`month_of`] the time `month_gpu_seconds` counts in.
    #[serde(default)]
    pub month: u32,
}

impl UserUsage {
    /// GPU-seconds used in the calendar month of `now`.
    pub fn month_used(&self, now: Time) -> f64 {
        if self.month == month_of(now) {
            self.month_gpu_seconds
        } else {
            0.0
        }
    }

    /// Busy share of the allocation in the utilisation window at `now`, with `prior_gpu_s`
    /// GPU-seconds of assumed full use so that a new user starts neutral.
    pub fn utilization(&self, now: Time, window_s: u64, prior_gpu_s: f64) -> f64 {
        let fade = fade(self.updated_at, now, window_s);
        let (busy, alloc) = (
            self.window_busy_gpu_seconds * fade,
            self.window_alloc_gpu_seconds * fade,
        );
        ((busy + prior_gpu_s) / (alloc + prior_gpu_s).max(1e-9)).clamp(0.0, 1.0)
    }

    fn charge(
        &mut self,
        gpu_s: f64,
        busy: Option<f64>,
        now: Time,
        half_life_s: f64,
        window_s: u64,
    ) {
        let f = fade(self.updated_at, now, window_s);
        self.window_alloc_gpu_seconds *= f;
        self.window_busy_gpu_seconds *= f;
        if let Some(b) = busy {
            self.window_alloc_gpu_seconds += gpu_s;
            self.window_busy_gpu_seconds += gpu_s * b.clamp(0.0, 1.0);
        }
        self.decayed_gpu_seconds =
            decay(self.decayed_gpu_seconds, self.updated_at, now, half_life_s) + gpu_s;
        let month = month_of(now);
        if month != self.month {
            self.month = month;
            self.month_gpu_seconds = 0.0;
        }
        self.month_gpu_seconds += gpu_s;
        self.updated_at = self.updated_at.max(now);
    }

    fn uncharge(&mut self, gpu_s: f64, busy: Option<f64>, now: Time) {
        if let Some(b) = busy {
            self.window_alloc_gpu_seconds = (self.window_alloc_gpu_seconds - gpu_s).max(0.0);
            self.window_busy_gpu_seconds =
                (self.window_busy_gpu_seconds - gpu_s * b.clamp(0.0, 1.0)).max(0.0);
        }
        self.decayed_gpu_seconds = (self.decayed_gpu_seconds - gpu_s).max(0.0);
        if self.month == month_of(now) {
            self.month_gpu_seconds = (self.month_gpu_seconds - gpu_s).max(0.0);
        }
    }
}

/// The calendar month (UTC) of a Unix time, as `year * 12 + month - 1`.
pub fn month_of(t: Time) -> u32 {
    let d = time::OffsetDateTime::from_unix_timestamp(t.min(253_402_300_799) as i64)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    (d.year().max(0) as u32) * 12 + u32::from(u8::from(d.month())) - 1
}

/// How much of what was in the utilisation window at `from` is still in it at `to`.
fn fade(from: Time, to: Time, window_s: u64) -> f64 {
    if to <= from {
        1.0
    } else {
        (-((to - from) as f64) / window_s.max(1) as f64).exp()
    }
}

/// Accounting per user and per tenant.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageLedger {
    pub users: BTreeMap<String, UserUsage>,
    pub tenants: BTreeMap<String, UserUsage>,
}

impl UsageLedger {
    /// Records `gpu_seconds` of allocation ending at `now` for the user and the tenant, of
    /// which `busy` was measured busy (`None`: not measured).
    #[allow(clippy::too_many_arguments)]
    pub fn charge(
        &mut self,
        user: &str,
        tenant: &str,
        gpu_seconds: f64,
        busy: Option<f64>,
        now: Time,
        half_life_s: f64,
        window_s: u64,
    ) {
        for entry in [
            self.users.entry(user.to_string()).or_default(),
            self.tenants.entry(tenant.to_string()).or_default(),
        ] {
            entry.charge(gpu_seconds, busy, now, half_life_s, window_s);
        }
    }

    /// Takes back a charge made at `now` by [`UsageLedger::charge`], after that user's and
    /// tenant's entries were brought to `now`: what the charge added then is subtracted, and
    /// the entries stay at `now`. For a charge the store refused (its run changed meanwhile),
    /// so that what the policy sees is what was kept.
    pub fn uncharge(
        &mut self,
        user: &str,
        tenant: &str,
        gpu_seconds: f64,
        busy: Option<f64>,
        now: Time,
    ) {
        // Never made here: a ledger of only some subjects (the rows a save writes) must not
        // gain an empty entry, which would be written over the subject's usage.
        for entry in [self.users.get_mut(user), self.tenants.get_mut(tenant)]
            .into_iter()
            .flatten()
        {
            entry.uncharge(gpu_seconds, busy, now);
        }
    }

    /// Decayed usage of a user at `now`.
    pub fn user_usage(&self, user: &str, now: Time, half_life_s: f64) -> f64 {
        self.users.get(user).map_or(0.0, |u| {
            decay(u.decayed_gpu_seconds, u.updated_at, now, half_life_s)
        })
    }

    /// Decayed usage of a tenant at `now`.
    pub fn tenant_usage(&self, tenant: &str, now: Time, half_life_s: f64) -> f64 {
        self.tenants.get(tenant).map_or(0.0, |u| {
            decay(u.decayed_gpu_seconds, u.updated_at, now, half_life_s)
        })
    }
}

/// Exponential decay: the value halves every `half_life_s` seconds.
pub fn decay(value: f64, from: Time, to: Time, half_life_s: f64) -> f64 {
    if to <= from || half_life_s <= 0.0 {
        return value;
    }
    value * 0.5f64.powf((to - from) as f64 / half_life_s)
}

/// Caps for one tenant or user. `None` means unlimited.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Quota {
    pub max_gpus: Option<u32>,
    pub max_gpu_hours_per_month: Option<f64>,
    /// Allowed GPU types (family names); empty allows all.
    #[serde(default)]
    pub allowed_gpu_types: Vec<String>,
    /// Relative share for fair-share; 1.0 when absent.
    #[serde(default)]
    pub share: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Quotas {
    pub tenants: BTreeMap<String, Quota>,
    pub users: BTreeMap<String, Quota>,
}

/// Everything the policy looks at in one cycle.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterState {
    pub nodes: Vec<Node>,
    pub running: Vec<RunningTask>,
    pub pending: Vec<TaskRequest>,
    pub usage: UsageLedger,
    pub quotas: Quotas,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Taking a charge back restores what was there, and makes no entry for a subject the
    /// ledger does not hold (a partial ledger's rows are written whole).
    #[test]
    fn uncharge_undoes_a_charge_and_makes_no_entry() {
        let mut l = UsageLedger::default();
        l.charge("u", "t", 100.0, Some(0.5), 1_000, 3_600.0, 86_400);
        let before = l.clone();
        l.charge("u", "t", 40.0, Some(0.25), 1_000, 3_600.0, 86_400);
        l.uncharge("u", "t", 40.0, Some(0.25), 1_000);
        let (a, b) = (&l.users["u"], &before.users["u"]);
        assert!((a.decayed_gpu_seconds - b.decayed_gpu_seconds).abs() < 1e-9);
        assert!((a.window_busy_gpu_seconds - b.window_busy_gpu_seconds).abs() < 1e-9);
        assert!((a.month_gpu_seconds - b.month_gpu_seconds).abs() < 1e-9);
        l.uncharge("other", "other-lab", 40.0, None, 1_000);
        assert!(!l.users.contains_key("other") && !l.tenants.contains_key("other-lab"));
    }

    #[test]
    fn family_matching() {
        assert!(gpu_type_matches("A100", "A100-40G"));
        assert!(gpu_type_matches("a100", "A100-80G"));
        assert!(gpu_type_matches("A100-80G", "A100-80G"));
        assert!(!gpu_type_matches("A100-80G", "A100-40G"));
        assert!(!gpu_type_matches("A10", "A100"));
        assert!(gpu_type_matches("A10", "A10"));
        assert!(accepts_type(&[], "T4"));
        assert!(accepts_type(
            &["V100M16".into(), "V100M32".into()],
            "V100M32"
        ));
        assert!(!accepts_type(&["V100M16".into()], "V100M32"));
    }

    #[test]
    fn decay_halves_after_half_life() {
        let hl = 7.0 * 86_400.0;
        assert!((decay(100.0, 0, 7 * 86_400, hl) - 50.0).abs() < 1e-9);
        assert!((decay(100.0, 0, 14 * 86_400, hl) - 25.0).abs() < 1e-9);
        let mut l = UsageLedger::default();
        l.charge("u", "t", 100.0, Some(1.0), 0, hl, 86_400);
        assert!((l.user_usage("u", 7 * 86_400, hl) - 50.0).abs() < 1e-9);
        assert!((l.tenant_usage("t", 7 * 86_400, hl) - 50.0).abs() < 1e-9);
    }

    #[test]
    fn months_and_windows() {
        // 2024-01-31T23:59:59Z and a second later.
        assert_eq!(month_of(1_706_745_599) + 1, month_of(1_706_745_600));
        assert_eq!(month_of(0), 1970 * 12);
        let mut l = UsageLedger::default();
        l.charge("u", "t", 3_600.0, Some(0.25), 1_706_745_000, 1e9, 86_400);
        let u = &l.users["u"];
        assert_eq!(u.month_used(1_706_745_000), 3_600.0);
        assert_eq!(
            u.month_used(1_706_745_600),
            0.0,
            "a new month starts at zero"
        );
        // Unmeasured time leaves the utilisation where measured time put it.
        let before = u.utilization(1_706_745_000, 86_400, 0.0);
        assert!((before - 0.25).abs() < 1e-9);
        l.charge("u", "t", 3_600.0, None, 1_706_745_000, 1e9, 86_400);
        assert!((l.users["u"].utilization(1_706_745_000, 86_400, 0.0) - 0.25).abs() < 1e-9);
        assert_eq!(l.users["u"].month_gpu_seconds, 7_200.0);
    }

    #[test]
    fn a_node_could_hold_a_worker_by_type_count_size_and_taints() {
        let node = Node {
            id: "a40".into(),
            zone: String::new(),
            labels: Default::default(),
            cpu_millis: 16_000,
            mem_bytes: 64 << 30,
            gpus: (0..4)
                .map(|i| Gpu {
                    index: i,
                    gpu_type: "A40".into(),
                    mem_bytes: 48 << 30,
                    util: 0.0,
                })
                .collect(),
            schedulable: false,
            taints: vec!["trusted-only".into()],
            features: vec![],
            own_network: false,
        };
        let mut t = TaskRequest {
            id: "t".into(),
            user: "u".into(),
            tenant: "o".into(),
            gpu_types: vec!["A40".into()],
            gpus_per_worker: 4,
            workers: 1,
            min_workers: None,
            gpu_mem_bytes: None,
            cpu_millis: 0,
            mem_bytes: 0,
            priority: 0.5,
            deadline: None,
            submitted_at: 0,
            estimated_runtime: None,
            preemptible: true,
            zone_affinity: false,
            attained_gpu_seconds: 0.0,
            tolerations: vec!["trusted-only".into()],
            requires: vec![],
        };
        assert!(
            node.could_hold(&t),
            "closed or not, it has what the task asks"
        );
        t.gpus_per_worker = 5;
        assert!(!node.could_hold(&t));
        t.gpus_per_worker = 1;
        t.gpu_types = vec!["A100".into()];
        assert!(!node.could_hold(&t));
        t.gpu_types = vec![];
        t.gpu_mem_bytes = Some(80 << 30);
        assert!(!node.could_hold(&t));
        t.gpu_mem_bytes = None;
        t.cpu_millis = 32_000;
        assert!(!node.could_hold(&t));
        t.cpu_millis = 0;
        t.tolerations = vec![];
        assert!(!node.could_hold(&t), "a taint it does not tolerate");
    }
}
