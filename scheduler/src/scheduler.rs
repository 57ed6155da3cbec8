//! One scheduling cycle: order the queue, place what fits, preempt or defragment for what does
//! not, hold room for the top blocked tasks, and say why everything else waits.

mod elastic;
mod walk;

use crate::config::PolicyConfig;
use crate::fasthash::{FastMap, FastSet};
use crate::placement::{
    demand_for, Alloc, CapNode, Capacity, FragModel, GpuDemand, Placer, RoomIndex, TypeMask,
    WorkerNeed,
};
use crate::priority::{PriorityBreakdown, PriorityContext};
use crate::types::{ClusterState, Quota, RunningTask, TaskId, TaskRequest, Time, WorkerPlacement};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// What the caller must do after a cycle. Apply preemptions and migrations before placements
/// that reuse their resources; the scheduler never double-books within a cycle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Decision {
    /// Start the task on these nodes and GPUs (one entry per worker).
    Place {
        task: TaskId,
        placements: Vec<WorkerPlacement>,
        priority: PriorityBreakdown,
    },
    /// Ask the task to checkpoint within `grace_s` and stop.
    Preempt {
        task: TaskId,
        grace_s: u64,
        reason: PreemptReason,
    },
    /// Stop an elastic task through its grace period (it checkpoints) so that it starts again
    /// at another width: wider, into GPUs no waiting task can use, or narrower, giving up
    /// workers to `for_task` (it is then a preemption that leaves the task its minimum).
    Resize {
        task: TaskId,
        grace_s: u64,
        reason: ResizeReason,
    },
    /// Checkpoint the task and restart it on `to`; frees room for `for_task`.
    Migrate {
        task: TaskId,
        from: Vec<WorkerPlacement>,
        to: Vec<WorkerPlacement>,
        for_task: TaskId,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreemptReason {
    pub for_task: TaskId,
    pub preemptor_priority: f64,
    pub victim_priority: f64,
    /// GPU-seconds of work since the victim's last checkpoint.
    pub lost_gpu_seconds: f64,
}

/// Why an elastic task changes width.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ResizeReason {
    /// GPUs it can use are idle and no waiting task could use them; `seconds_saved` is what
    /// the policy expects the wider run to save, against `cost_s` (the restart and the work
    /// since its last checkpoint).
    Grow {
        from_workers: u32,
        to_workers: u32,
        seconds_saved: f64,
        cost_s: f64,
    },
    /// A task of higher priority needs some of its GPUs; it starts again with what is left
    /// (at least its minimum) instead of losing its place.
    Shrink {
        from_workers: u32,
        min_workers: u32,
        preempt: PreemptReason,
    },
}

impl ResizeReason {
    /// The decision in a user's words, for the task's events.
    pub fn describe(&self) -> String {
        match self {
            ResizeReason::Grow {
                from_workers,
                to_workers,
                ..
            } => format!(
                "growing from {from_workers} to {to_workers} workers into idle GPUs \
                 (it restarts from its checkpoint)"
            ),
            ResizeReason::Shrink {
                from_workers,
                min_workers,
                preempt,
            } => format!(
                "shrinking from {from_workers} workers (to no fewer than {min_workers}) for \
                 task {} (priority {:.2} over {:.2}; it restarts from its checkpoint)",
                preempt.for_task, preempt.preemptor_priority, preempt.victim_priority
            ),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuotaScope {
    Tenant,
    User,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum QuotaCap {
    Gpus {
        limit: u32,
        in_use: u32,
        requested: u32,
    },
    GpuHoursPerMonth {
        limit: f64,
        used: f64,
    },
    GpuTypes {
        allowed: Vec<String>,
    },
}

/// Why a task is still pending, in terms a user can act on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PendingReason {
    Quota {
        scope: QuotaScope,
        name: String,
        cap: QuotaCap,
    },
    /// Nothing free matches; `waiting_for` describes the resources it needs.
    NoFit {
        waiting_for: String,
    },
    /// It is the top blocked task: these nodes are held for it while they drain.
    Reserved {
        nodes: Vec<String>,
        waiting_for: String,
    },
    WaitingForPreemption {
        victims: Vec<TaskId>,
    },
    WaitingForMigration {
        tasks: Vec<TaskId>,
    },
    /// It would fit, but the room is held for a higher-priority task (or the policy is strict
    /// FIFO). `position` is its rank in the queue, 0 being first.
    BehindHigherPriority {
        position: usize,
        blocked_by: TaskId,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingTask {
    pub task: TaskId,
    pub position: usize,
    pub reason: PendingReason,
    pub priority: PriorityBreakdown,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Decisions {
    pub decisions: Vec<Decision>,
    /// Every task left pending, in queue order (empty when `explain_pending` is off).
    pub pending: Vec<PendingTask>,
}

/// The policy. Stateless between cycles: everything it knows comes in with the state.
#[derive(Debug, Clone, Default)]
pub struct Scheduler {
    pub config: PolicyConfig,
}

/// A request shape within one cycle: need index, workers, zone affinity.
type ShapeKey = (usize, u32, bool);

struct Cycle<'a> {
    cfg: &'a PolicyConfig,
    state: &'a ClusterState,
    now: Time,
    cap: Capacity,
    placer: Placer,
    rng: ChaCha8Rng,
    ctx: PriorityContext,
    running_prio: Vec<Option<PriorityBreakdown>>,
    victims_on_node: Option<Vec<Vec<usize>>>,
    /// Shared running tasks that migration may move, by node position, with what they hold.
    movable_on: Option<Vec<MovableOnNode>>,
    /// Running tasks already chosen as victims or migrated this cycle.
    taken: FastSet<usize>,
    descriptions: FastMap<ShapeKey, String>,
    /// Largest card of each GPU type, for requests that declare GPU memory.
    largest_card: Vec<u64>,
    /// Nodes of each node class, counted on the first explanation that needs it.
    nodes_per_class: Vec<usize>,
    /// Skip attempts that a failed attempt of an easier request proves futile (see
    /// [`Futile`]); off only to check that skipping changes no decision.
    prune: bool,
    /// Whether every task left pending is explained (see [`Scheduler::decide`]).
    explain: bool,
    /// Per GPU shape (a worker's need without its CPU and memory), the nodes that could hold
    /// its GPUs, listed at the given [`Capacity::releases`]; see [`Cycle::any_node_fits`].
    gpu_holders: FastMap<WorkerNeed, Holders>,
    /// Each node's largest room on one GPU, for proofs that a moved task fits nowhere.
    rooms: RoomIndex,
    /// The narrower requests of each elastic pending task (by its index in the queue), widest
    /// first: what it starts with when all of its workers do not fit.
    narrower: &'a FastMap<usize, Vec<TaskRequest>>,
}

/// Each elastic pending task at every width from one below its widest to its narrowest.
fn narrower_requests(state: &ClusterState) -> FastMap<usize, Vec<TaskRequest>> {
    state
        .pending
        .iter()
        .enumerate()
        .filter(|(_, t)| t.is_elastic())
        .map(|(i, t)| {
            let widths = (t.narrowest()..t.workers).rev();
            (i, widths.map(|w| t.at_width(w)).collect())
        })
        .collect()
}

/// The nodes that could hold the GPUs of one shape: a superset of those that can now, so that
/// an exact check runs over a short list. Capacity only shrinks within a cycle until an
/// allocation is given back (a preemption, a migration, a gang rolled back); then the nodes
/// changed since the list was made are looked at again, and those that grew room join it.
struct Holders {
    nodes: Vec<usize>,
    member: Vec<bool>,
    releases: u64,
    cursor: usize,
}

impl Holders {
    fn list(cap: &Capacity, gpus: &WorkerNeed) -> Holders {
        let member: Vec<bool> = cap.nodes.iter().map(|n| n.fits(gpus)).collect();
        Holders {
            nodes: (0..member.len()).filter(|&p| member[p]).collect(),
            member,
            releases: cap.releases(),
            cursor: cap.changed_since(0).1,
        }
    }

    fn follow(&mut self, cap: &Capacity, gpus: &WorkerNeed) {
        let (changed, now) = cap.changed_since(self.cursor);
        if self.releases != cap.releases() {
            for &p in changed {
                if !self.member[p] && cap.nodes[p].fits(gpus) {
                    self.member[p] = true;
                    self.nodes.push(p);
                }
            }
            self.releases = cap.releases();
        }
        self.cursor = now;
    }
}

impl Scheduler {
    pub fn new(config: PolicyConfig) -> Self {
        Scheduler { config }
    }

    /// Runs one cycle on a snapshot taken at `now`.
    pub fn schedule(&self, state: &ClusterState, now: Time) -> Decisions {
        self.cycle(state, now, true, self.config.explain_pending)
    }

    /// The same decisions as [`Scheduler::schedule`], without explaining the tasks left
    /// pending, whatever the configuration says. Explanations cost a pass over the whole
    /// queue that can stop early otherwise; a server with a long queue explains it every
    /// little while rather than every cycle. A property test checks that it decides the same.
    pub fn decide(&self, state: &ClusterState, now: Time) -> Decisions {
        self.cycle(state, now, true, false)
    }

    /// The same cycle, trying every blocked request shape however hopeless: what
    /// [`Scheduler::schedule`] must decide identically (a property test checks it).
    #[doc(hidden)]
    pub fn schedule_exhaustively(&self, state: &ClusterState, now: Time) -> Decisions {
        self.cycle(state, now, false, self.config.explain_pending)
    }

    fn cycle(&self, state: &ClusterState, now: Time, prune: bool, explain: bool) -> Decisions {
        let cfg = &self.config;
        let cap = Capacity::new(&state.nodes, &state.running, cfg.share_margin_bytes);
        let largest_card = largest_card_by_type(&cap);
        let model = workload_model(&cap, state, cfg.share_margin_bytes, &largest_card);
        let narrower = narrower_requests(state);
        let mut cy = Cycle {
            cfg,
            state,
            now,
            placer: Placer::new(cfg.placement, model),
            cap,
            rng: ChaCha8Rng::seed_from_u64(now),
            ctx: PriorityContext::new(state, now, cfg),
            running_prio: vec![None; state.running.len()],
            victims_on_node: None,
            movable_on: None,
            taken: FastSet::default(),
            descriptions: FastMap::default(),
            largest_card,
            nodes_per_class: Vec::new(),
            prune,
            explain,
            gpu_holders: FastMap::default(),
            rooms: RoomIndex::default(),
            narrower: &narrower,
        };
        cy.run()
    }
}

/// The typical-task model for fragmentation: the shapes of what is queued and running now.
fn workload_model(
    cap: &Capacity,
    state: &ClusterState,
    margin: u64,
    largest_card: &[u64],
) -> FragModel {
    // Group identical requests first: the need of each distinct request is computed once.
    type Sig<'a> = (&'a [String], Option<u64>, u32, u64, u64);
    let mut sigs: FastMap<Sig<'_>, (&TaskRequest, f64)> = FastMap::with_capacity_and_hasher(
        state.pending.len() + state.running.len(),
        Default::default(),
    );
    let all = state
        .pending
        .iter()
        .chain(state.running.iter().map(|r| &r.request));
    for t in all {
        let key = (
            t.gpu_types.as_slice(),
            t.gpu_mem_bytes,
            t.gpus_per_worker,
            t.cpu_millis,
            t.mem_bytes,
        );
        sigs.entry(key).or_insert((t, 0.0)).1 += f64::from(t.workers.max(1));
    }
    let mut counts: FastMap<WorkerNeed, f64> = FastMap::default();
    let everywhere = cap.class_mask_all();
    let mut masks = Masks::default();
    for (t, n) in sigs.into_values() {
        // The model describes shapes; which nodes admit them is the placement's concern.
        let mut need = worker_need(cap, t, None, margin, largest_card, &mut masks);
        need.classes = everywhere.clone();
        *counts.entry(need).or_default() += n;
    }
    let mut v: Vec<(WorkerNeed, f64)> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let card = cap
        .nodes
        .iter()
        .flat_map(|n| n.gpus.iter())
        .map(|g| g.capacity)
        .max()
        .unwrap_or(1);
    FragModel::from_counts(v, 0.95, 16, card)
}

/// The largest card of each GPU type in the cluster, whatever its state: computed once per
/// cycle, so a request shape that declares GPU memory costs a pass over the types, not over
/// every GPU of the cluster.
fn largest_card_by_type(cap: &Capacity) -> Vec<u64> {
    let mut largest = vec![0; cap.types.len()];
    for g in cap.nodes.iter().flat_map(|n| n.gpus.iter()) {
        let l = &mut largest[g.type_id as usize];
        *l = (*l).max(g.capacity);
    }
    largest
}

/// The GPU-type and node-class masks of the lists requests name, each worked out once per
/// cycle: with every task a shape of its own (each asks for its own CPU, memory and GPU
/// memory), matching each one's lists against the cluster's types again was a tenth of a
/// steady cycle.
#[derive(Default)]
struct Masks<'s> {
    types: FastMap<(&'s [String], Option<&'s [String]>), TypeMask>,
    classes: FastMap<(&'s [String], &'s [String]), TypeMask>,
}

/// One worker's need in this cluster's coordinates. A shared request is expressed against the
/// smallest card it accepts; on a bigger card it still takes only its declared memory.
fn worker_need<'s>(
    cap: &Capacity,
    t: &'s TaskRequest,
    allowed_types: Option<&'s [String]>,
    margin: u64,
    largest_card: &[u64],
    masks: &mut Masks<'s>,
) -> WorkerNeed {
    let allowed_types = allowed_types.filter(|a| !a.is_empty());
    let mut types = masks
        .types
        .entry((t.gpu_types.as_slice(), allowed_types))
        .or_insert_with(|| {
            let types = cap.type_mask(&t.gpu_types);
            match allowed_types {
                Some(allowed) => intersect(&types, &cap.type_mask(allowed), cap.types.len()),
                None => types,
            }
        })
        .clone();
    if let Some(m) = t.gpu_mem_bytes {
        // Cards smaller than the declared memory cannot run the task at all.
        let big_enough: Vec<u16> = (0..cap.types.len() as u16)
            .filter(|&ty| largest_card[ty as usize] >= m)
            .collect();
        types = intersect(&types, &TypeMask::from_ids(&big_enough), cap.types.len());
    }
    let demand = demand_for(t.gpu_mem_bytes, margin);
    WorkerNeed {
        gpus: t.gpus_per_worker,
        demand,
        cpu_millis: t.cpu_millis,
        mem_bytes: t.mem_bytes,
        types,
        classes: masks
            .classes
            .entry((t.tolerations.as_slice(), t.requires.as_slice()))
            .or_insert_with(|| cap.class_mask(&t.tolerations, &t.requires))
            .clone(),
    }
}

fn intersect(
    a: &crate::placement::TypeMask,
    b: &crate::placement::TypeMask,
    n: usize,
) -> crate::placement::TypeMask {
    let ids: Vec<u16> = (0..n as u16)
        .filter(|&i| a.contains(i) && b.contains(i))
        .collect();
    crate::placement::TypeMask::from_ids(&ids)
}

/// What a running task holding `a` needs to be placed again elsewhere.
fn migrant_need(cap: &Capacity, r: &TaskRequest, a: &Alloc) -> WorkerNeed {
    WorkerNeed {
        gpus: a.gpu_pos.len() as u32,
        demand: a.demand,
        cpu_millis: a.cpu_millis,
        mem_bytes: a.mem_bytes,
        types: cap.type_mask(&r.gpu_types),
        classes: cap.class_mask(&r.tolerations, &r.requires),
    }
}

/// `nodes_per_class` counts the nodes of each node class (taints and features).
fn describe(
    cap: &Capacity,
    nodes_per_class: &[usize],
    t: &TaskRequest,
    need: &WorkerNeed,
) -> String {
    let types: Vec<&str> = cap
        .types
        .iter()
        .enumerate()
        .filter(|(i, _)| need.types.contains(*i as u16))
        .map(|(_, s)| s.as_str())
        .collect();
    let gpu = match need.demand {
        GpuDemand::Whole => "whole GPU(s)".to_string(),
        GpuDemand::Share(m) => format!(
            "GPU(s) with {:.1} GiB free",
            m as f64 / f64::from(1u32 << 30)
        ),
    };
    let admitting: usize = nodes_per_class
        .iter()
        .enumerate()
        .filter(|(c, _)| need.classes.contains(*c as u16))
        .map(|(_, n)| n)
        .sum();
    let restricted = if admitting < cap.nodes.len() {
        format!(
            ", on the {admitting} of {} nodes open to it (trusted-only nodes, dataset roots)",
            cap.nodes.len()
        )
    } else {
        String::new()
    };
    // Said where it narrows the choice: a gang cannot span isolated nodes.
    let meeting = if t.workers > 1 && cap.nodes.iter().any(|n| n.own_network) {
        ", on nodes whose tasks share their network or all on one isolated node \
         (a gang does not span isolated nodes: their tasks' networks do not reach each other)"
    } else {
        ""
    };
    format!(
        "{} worker(s) x {} {} of type {} with {} mCPU and {:.1} GiB RAM each{}{restricted}{meeting}",
        t.workers,
        t.gpus_per_worker,
        gpu,
        if t.gpu_types.is_empty() {
            "any".to_string()
        } else {
            types.join("|")
        },
        t.cpu_millis,
        t.mem_bytes as f64 / f64::from(1u32 << 30),
        if t.zone_affinity {
            ", all in one zone"
        } else {
            ""
        }
    )
}

impl Cycle<'_> {
    fn describe_cached(&mut self, key: ShapeKey, t: &TaskRequest, need: &WorkerNeed) -> String {
        if let Some(d) = self.descriptions.get(&key) {
            return d.clone();
        }
        if self.nodes_per_class.is_empty() {
            self.nodes_per_class = vec![0; self.cap.classes.len().max(1)];
            for n in &self.cap.nodes {
                if let Some(c) = self.nodes_per_class.get_mut(n.class as usize) {
                    *c += 1;
                }
            }
        }
        let d = describe(&self.cap, &self.nodes_per_class, t, need);
        self.descriptions.insert(key, d.clone());
        d
    }

    fn allowed_types(&self, t: &TaskRequest) -> Option<&[String]> {
        let q = &self.state.quotas;
        q.users
            .get(&t.user)
            .filter(|q| !q.allowed_gpu_types.is_empty())
            .or_else(|| {
                q.tenants
                    .get(&t.tenant)
                    .filter(|q| !q.allowed_gpu_types.is_empty())
            })
            .map(|q| q.allowed_gpu_types.as_slice())
    }

    fn quota_block(
        &self,
        t: &TaskRequest,
        in_use: &FastMap<(QuotaScope, &str), u32>,
    ) -> Option<PendingReason> {
        let q = &self.state.quotas;
        let checks: [(QuotaScope, &str, Option<&Quota>); 2] = [
            (
                QuotaScope::Tenant,
                t.tenant.as_str(),
                q.tenants.get(&t.tenant),
            ),
            (QuotaScope::User, t.user.as_str(), q.users.get(&t.user)),
        ];
        for (scope, name, quota) in checks {
            let Some(quota) = quota else { continue };
            let mk = |cap| {
                Some(PendingReason::Quota {
                    scope,
                    name: name.to_string(),
                    cap,
                })
            };
            if !quota.allowed_gpu_types.is_empty() && t.total_gpus() > 0 {
                let ok = self.cap.types.iter().any(|ty| {
                    crate::types::accepts_type(&quota.allowed_gpu_types, ty)
                        && crate::types::accepts_type(&t.gpu_types, ty)
                });
                if !ok {
                    return mk(QuotaCap::GpuTypes {
                        allowed: quota.allowed_gpu_types.clone(),
                    });
                }
            }
            if let Some(limit) = quota.max_gpus {
                let used = in_use.get(&(scope, name)).copied().unwrap_or(0);
                if used + t.total_gpus() > limit {
                    return mk(QuotaCap::Gpus {
                        limit,
                        in_use: used,
                        requested: t.total_gpus(),
                    });
                }
            }
            if let Some(limit) = quota.max_gpu_hours_per_month {
                let ledger = match scope {
                    QuotaScope::Tenant => &self.state.usage.tenants,
                    QuotaScope::User => &self.state.usage.users,
                };
                let used = ledger
                    .get(name)
                    .map_or(0.0, |u| u.month_used(self.now) / 3600.0);
                if used >= limit && t.total_gpus() > 0 {
                    return mk(QuotaCap::GpuHoursPerMonth { limit, used });
                }
            }
        }
        None
    }

    /// A gang runs on GPUs of one type (data-parallel workers go at the slowest card's pace,
    /// and mixed cards break collective libraries' assumptions): for a gang that accepts
    /// several types, the need of each type alone, the types with the most cards that fit
    /// first; `None` when the need is already of one type (or not a gang).
    fn one_type_needs(&self, t: &TaskRequest, need: &WorkerNeed) -> Option<Vec<WorkerNeed>> {
        if t.workers <= 1 || need.gpus == 0 {
            return None;
        }
        let n_types = self.cap.types.len();
        let mut fitting = vec![0u32; n_types];
        for g in self.cap.nodes.iter().flat_map(|n| n.gpus.iter()) {
            if need.types.contains(g.type_id) && g.fits(need.demand) {
                fitting[g.type_id as usize] += 1;
            }
        }
        let mut ids: Vec<u16> = (0..n_types as u16)
            .filter(|&i| need.types.contains(i))
            .collect();
        if ids.len() <= 1 {
            return None;
        }
        ids.sort_by_key(|&i| (std::cmp::Reverse(fitting[i as usize]), i));
        Some(
            ids.into_iter()
                .map(|i| WorkerNeed {
                    types: TypeMask::from_ids(&[i]),
                    ..need.clone()
                })
                .collect(),
        )
    }

    /// Whether some node not reserved for another task could take one worker of `need` now
    /// (whatever its zone): when none can, no placement of the task can succeed, and a
    /// blocked task costs a glance at a short list instead of a pass over every node. The
    /// nodes that could hold the GPUs of a shape (whatever their CPU and memory, and for a
    /// coarser share of memory: [`GpuDemand::coarse_below`]) are listed once per cycle and
    /// follow capacity from then on ([`Holders`]).
    fn any_node_fits(&mut self, need: &WorkerNeed) -> bool {
        if need.gpus == 0 {
            return true;
        }
        let gpus_only = WorkerNeed {
            cpu_millis: 0,
            mem_bytes: 0,
            demand: need.demand.coarse_below(),
            ..need.clone()
        };
        let cap = &self.cap;
        let holders = self
            .gpu_holders
            .entry(gpus_only.clone())
            .or_insert_with(|| Holders::list(cap, &gpus_only));
        holders.follow(cap, &gpus_only);
        // Reservations only grow within a cycle, and a placement respects them.
        holders
            .nodes
            .iter()
            .any(|&p| !cap.nodes[p].reserved && cap.nodes[p].fits(need))
    }

    /// All workers or none, all on one GPU type ([`Self::one_type_needs`]).
    fn place_gang(
        &mut self,
        t: &TaskRequest,
        need: &WorkerNeed,
        respect_reserved: bool,
    ) -> Option<Vec<Alloc>> {
        if let Some(needs) = self.one_type_needs(t, need) {
            return needs
                .iter()
                .find_map(|n| self.place_gang_of_one_type(t, n, respect_reserved));
        }
        self.place_gang_of_one_type(t, need, respect_reserved)
    }

    /// With zone affinity each zone is tried, fullest first, so gangs go where they leave the
    /// least stranded capacity.
    fn place_gang_of_one_type(
        &mut self,
        t: &TaskRequest,
        need: &WorkerNeed,
        respect_reserved: bool,
    ) -> Option<Vec<Alloc>> {
        let workers = t.workers.max(1);
        if t.zone_affinity && self.cap.zones.len() > 1 {
            let mut zones: Vec<(u64, u32)> = (0..self.cap.zones.len() as u32)
                .map(|z| {
                    (
                        self.cap
                            .nodes
                            .iter()
                            .filter(|n| n.zone == z)
                            .map(CapNode::gpu_free_total)
                            .sum(),
                        z,
                    )
                })
                .collect();
            zones.sort();
            for (_, z) in zones {
                if let Some(a) = self.place_meeting(need, workers, &|n: &CapNode| {
                    n.zone == z && (!respect_reserved || !n.reserved)
                }) {
                    return Some(a);
                }
            }
            return None;
        }
        self.place_meeting(need, workers, &|n: &CapNode| {
            !respect_reserved || !n.reserved
        })
    }

    /// Places a gang where its workers can meet: on nodes whose tasks share their hosts'
    /// network, or all on one node whose tasks each have a network of their own
    /// ([`crate::Node::own_network`]). Where no such node takes part, this is the plain
    /// placement.
    fn place_meeting(
        &mut self,
        need: &WorkerNeed,
        workers: u32,
        allowed: &dyn Fn(&CapNode) -> bool,
    ) -> Option<Vec<Alloc>> {
        let allocs = self.place_workers(need, workers, allowed)?;
        if !self.cannot_meet(&allocs) {
            return Some(allocs);
        }
        for a in allocs.iter().rev() {
            self.cap.release(a);
        }
        if let Some(a) =
            self.place_workers(need, workers, &|n: &CapNode| !n.own_network && allowed(n))
        {
            return Some(a);
        }
        // The isolated nodes with GPUs enough for the whole gang, fullest first.
        let whole = workers as usize * need.gpus as usize;
        let mut islands: Vec<(u64, usize)> = self
            .cap
            .nodes
            .iter()
            .filter(|n| n.own_network && n.gpus.len() >= whole && allowed(n))
            .map(|n| (n.gpu_free_total(), n.node))
            .collect();
        islands.sort_unstable();
        islands.into_iter().find_map(|(_, node)| {
            self.place_workers(need, workers, &|n: &CapNode| n.node == node && allowed(n))
        })
    }

    /// Whether a gang placed as `allocs` spans nodes one of which keeps each task's network
    /// apart: its workers there could not reach the others.
    fn cannot_meet(&self, allocs: &[Alloc]) -> bool {
        let Some(first) = allocs.first() else {
            return false;
        };
        allocs.iter().any(|a| a.pos != first.pos)
            && allocs.iter().any(|a| self.cap.nodes[a.pos].own_network)
    }

    fn place_workers(
        &mut self,
        need: &WorkerNeed,
        workers: u32,
        allowed: &dyn Fn(&CapNode) -> bool,
    ) -> Option<Vec<Alloc>> {
        let mut allocs = Vec::with_capacity(workers as usize);
        for _ in 0..workers {
            match self
                .placer
                .place_worker(&mut self.cap, need, allowed, &mut self.rng)
            {
                Some(a) => allocs.push(a),
                None => {
                    for a in allocs.iter().rev() {
                        self.cap.release(a);
                    }
                    return None;
                }
            }
        }
        Some(allocs)
    }

    fn to_placements(&self, allocs: &[Alloc]) -> Vec<WorkerPlacement> {
        allocs
            .iter()
            .map(|a| {
                let n = &self.cap.nodes[a.pos];
                WorkerPlacement {
                    node: self.state.nodes[n.node].id.clone(),
                    gpu_indices: a.gpu_pos.iter().map(|&g| n.gpus[g].index).collect(),
                }
            })
            .collect()
    }

    fn fits_ignoring_reservations(&self, t: &TaskRequest, need: &WorkerNeed) -> bool {
        t.workers <= 1 && self.cap.nodes.iter().any(|n| n.fits(need))
    }

    fn running_priority(&mut self, v: usize) -> PriorityBreakdown {
        if let Some(p) = self.running_prio[v] {
            return p;
        }
        let p = self.ctx.running(&self.state.running[v], self.cfg);
        self.running_prio[v] = Some(p);
        p
    }

    fn lost_work(&self, r: &RunningTask) -> f64 {
        self.now.saturating_sub(r.saved_at()) as f64 * f64::from(r.held_gpus())
    }

    /// Finds the cheapest set of victims (least work lost since their checkpoints) that makes
    /// room for every worker, node by node. Already-preempting tasks cost nothing. On success
    /// the victims' resources are handed to the preemptor in this cycle's capacity.
    fn try_preempt(
        &mut self,
        t: &TaskRequest,
        need: &WorkerNeed,
        prio: f64,
    ) -> Option<Vec<(usize, f64)>> {
        if self.victims_on_node.is_none() {
            let mut by_node = vec![Vec::new(); self.cap.nodes.len()];
            for (i, r) in self.state.running.iter().enumerate() {
                for p in &r.placements {
                    if let Some(pos) = self.cap.node_position(&p.node) {
                        if !by_node[pos].contains(&i) {
                            by_node[pos].push(i);
                        }
                    }
                }
            }
            self.victims_on_node = Some(by_node);
        }
        let margin = self.cfg.preempt_margin;
        let min_run = self.cfg.min_runtime_s;
        let mut chosen: Vec<(usize, f64)> = Vec::new();
        let mut released: Vec<Alloc> = Vec::new();
        let mut placed: Vec<Alloc> = Vec::new();
        let mut ok = true;
        for _ in 0..t.workers.max(1) {
            let mut best: Option<(f64, usize, Vec<usize>)> = None;
            // A victim chosen for an earlier worker may have freed room for this one too (a
            // gang of several workers on one node): it goes there at no further cost.
            let freed = released.iter().map(|a| a.pos).find(|&pos| {
                let n = &self.cap.nodes[pos];
                n.admits(need) && !n.reserved && n.fits(need)
            });
            if let Some(pos) = freed {
                best = Some((0.0, pos, Vec::new()));
            }
            let scan = if freed.is_some() {
                0
            } else {
                self.cap.nodes.len()
            };
            for pos in 0..scan {
                let n = &self.cap.nodes[pos];
                if !n.admits(need) || n.reserved || n.gpus.len() < need.gpus as usize {
                    continue;
                }
                let on_node =
                    std::mem::take(&mut self.victims_on_node.as_mut().expect("index")[pos]);
                let mut cands: Vec<(f64, f64, usize)> = Vec::new();
                for &v in &on_node {
                    if self.taken.contains(&v) || chosen.iter().any(|c| c.0 == v) {
                        continue;
                    }
                    let r = &self.state.running[v];
                    if !r.request.preemptible {
                        continue;
                    }
                    if r.preempting {
                        cands.push((0.0, 0.0, v));
                        continue;
                    }
                    if self.now.saturating_sub(r.started_at) < min_run {
                        continue;
                    }
                    if self.now.saturating_sub(r.saved_at()) > self.cfg.victim_max_unsaved_s {
                        continue;
                    }
                    let vp = self.running_priority(v).total;
                    if prio - vp > margin {
                        cands.push((self.lost_work(r), vp, v));
                    }
                }
                self.victims_on_node.as_mut().expect("index")[pos] = on_node;
                if cands.is_empty() {
                    continue;
                }
                // Ties go by task id, not by where a run sits in the input: the server and
                // the simulator list running tasks in different orders.
                let running = &self.state.running;
                cands.sort_by(|a, b| {
                    a.0.total_cmp(&b.0)
                        .then(a.1.total_cmp(&b.1))
                        .then_with(|| running[a.2].request.id.cmp(&running[b.2].request.id))
                });
                // Release victims one by one until the worker fits, on a copy of the node: a
                // trial on the capacity itself would mark the node changed for every
                // placement index.
                let mut trial = self.cap.nodes[pos].clone();
                let mut cost = 0.0;
                let mut used = Vec::new();
                let mut fits = false;
                for &(lost, _, v) in &cands {
                    if best.as_ref().is_some_and(|b| cost + lost >= b.0) {
                        break;
                    }
                    for a in self
                        .cap
                        .allocs_of(&self.state.running[v], self.cfg.share_margin_bytes)
                    {
                        if a.pos == pos {
                            trial.release(&a);
                        }
                    }
                    cost += lost;
                    used.push(v);
                    if trial.fits(need) {
                        fits = true;
                        break;
                    }
                }
                if fits && best.as_ref().is_none_or(|b| cost < b.0) {
                    best = Some((cost, pos, used));
                }
            }
            let Some((_, pos, used)) = best else {
                ok = false;
                break;
            };
            for v in used {
                for a in self
                    .cap
                    .allocs_of(&self.state.running[v], self.cfg.share_margin_bytes)
                {
                    self.cap.release(&a);
                    released.push(a);
                }
                let lost = if self.state.running[v].preempting {
                    0.0
                } else {
                    self.lost_work(&self.state.running[v])
                };
                chosen.push((v, lost));
            }
            match self
                .placer
                .place_on(&mut self.cap, pos, need, &mut self.rng)
            {
                Some(a) => placed.push(a),
                None => {
                    ok = false;
                    break;
                }
            }
        }
        if !ok || self.cannot_meet(&placed) {
            for a in placed.iter().rev() {
                self.cap.release(a);
            }
            for a in released.iter().rev() {
                self.cap.apply(a);
            }
            return None;
        }
        // The victims hold their resources until they have stopped (after the grace period),
        // and the preemptor waits until then: put the capacity back as it really is, so no
        // other task of this cycle is placed on resources that are still in use.
        for a in placed.iter().rev() {
            self.cap.release(a);
        }
        for a in released.iter().rev() {
            self.cap.apply(a);
        }
        for (v, _) in &chosen {
            self.taken.insert(*v);
        }
        Some(chosen)
    }

    /// Defragmentation: on a node where the worker would fit if some lower-priority shared tasks
    /// moved, move them to other cards (if they all fit elsewhere) and keep the node's room for
    /// the blocked task.
    fn try_migrate(
        &mut self,
        t: &TaskRequest,
        need: &WorkerNeed,
        prio: f64,
    ) -> Option<Vec<(usize, Vec<WorkerPlacement>)>> {
        let margin = self.cfg.share_margin_bytes;
        if self.movable_on.is_none() {
            // Which running tasks could move, by node: the same for every attempt of the
            // cycle except for tasks already taken, which are skipped below.
            let mut by_node: FastMap<usize, Vec<(usize, Alloc)>> = FastMap::default();
            for (i, r) in self.state.running.iter().enumerate() {
                if r.placements.len() != 1 || !r.request.preemptible || r.preempting {
                    continue;
                }
                let Some(pos) = self.cap.node_position(&r.placements[0].node) else {
                    continue;
                };
                let Some(a) = self.cap.allocs_of(r, margin).into_iter().next() else {
                    continue;
                };
                if matches!(a.demand, GpuDemand::Share(_)) {
                    by_node.entry(pos).or_default().push((i, a));
                }
            }
            let mut v: Vec<MovableOnNode> = by_node.into_iter().collect();
            v.sort_unstable_by_key(|e| e.0);
            self.movable_on = Some(v);
        }
        let movable_on = self.movable_on.take().expect("built above");
        let found = self.migrate_on(&movable_on, t, need, prio);
        self.movable_on = Some(movable_on);
        found
    }

    fn migrate_on(
        &mut self,
        movable_on: &[MovableOnNode],
        t: &TaskRequest,
        need: &WorkerNeed,
        prio: f64,
    ) -> Option<Vec<(usize, Vec<WorkerPlacement>)>> {
        let margin = self.cfg.share_margin_bytes;
        for (pos, on_node) in movable_on {
            let pos = *pos;
            {
                let n = &self.cap.nodes[pos];
                if !n.admits(need) || n.reserved {
                    continue;
                }
            }
            let mut movable: Vec<(usize, &Alloc)> = on_node
                .iter()
                .filter(|(v, _)| !self.taken.contains(v))
                .map(|(v, a)| (*v, a))
                .collect();
            movable.retain(|&(v, _)| prio > self.running_priority(v).total);
            if movable.is_empty() {
                continue;
            }
            let running = &self.state.running;
            movable.sort_by(|&(a, _), &(b, _)| {
                let (ra, rb) = (&running[a].request, &running[b].request);
                (ra.gpu_mem_bytes, &ra.id).cmp(&(rb.gpu_mem_bytes, &rb.id))
            });
            // Whether moving them makes room at all, on a copy of the node first: most nodes
            // fail here, and a trial on the capacity itself would mark the node changed for
            // every placement index.
            let mut trial = self.cap.nodes[pos].clone();
            if !movable.iter().any(|(_, a)| {
                trial.release(a);
                trial.fits(need)
            }) {
                continue;
            }
            let movable: Vec<usize> = movable.into_iter().map(|(v, _)| v).collect();
            let mut released: Vec<(usize, Alloc)> = Vec::new();
            for &v in &movable {
                for a in self.cap.allocs_of(&self.state.running[v], margin) {
                    self.cap.release(&a);
                    released.push((v, a));
                }
                if self.cap.nodes[pos].fits(need) {
                    break;
                }
            }
            let mut success = self.cap.nodes[pos].fits(need);
            let mut target: Option<Alloc> = None;
            let mut moved: Vec<(usize, Alloc)> = Vec::new();
            if success {
                // Hold the room first so the moved tasks cannot land back in it.
                target = self
                    .placer
                    .place_on(&mut self.cap, pos, need, &mut self.rng);
                success = target.is_some();
            }
            if success && self.prune {
                // On a full cluster most moves fail: proving first that some task moved would
                // find no room costs a lookup per task, where placing the others first costs a
                // placement scan of the cluster each. Placements only take room, so what has
                // no room now has none after them either.
                success = released.iter().all(|(v, a)| {
                    let vneed = migrant_need(&self.cap, &self.state.running[*v].request, a);
                    self.cap.nodes[pos].fits(&vneed)
                        || self.rooms.may_hold_elsewhere(&self.cap, &vneed, pos)
                });
            }
            if success {
                for (v, a) in &released {
                    let vneed = migrant_need(&self.cap, &self.state.running[*v].request, a);
                    // On a full cluster few nodes have the room: choosing among those alone
                    // is the same choice without a scan of the cluster.
                    let among = if self.prune {
                        self.rooms.holders(&self.cap, &vneed, 128)
                    } else {
                        None
                    };
                    let placed = if let Some(among) = among {
                        self.placer
                            .place_among(&mut self.cap, &among, &vneed, &mut self.rng)
                    } else {
                        self.placer.place_worker(
                            &mut self.cap,
                            &vneed,
                            &|n: &CapNode| !n.reserved,
                            &mut self.rng,
                        )
                    };
                    match placed {
                        Some(na) => moved.push((*v, na)),
                        None => {
                            success = false;
                            break;
                        }
                    }
                }
            }
            if success {
                let plan = moved
                    .iter()
                    .map(|(v, a)| (*v, self.to_placements(std::slice::from_ref(a))))
                    .collect::<Vec<_>>();
                for (v, _) in &plan {
                    self.taken.insert(*v);
                }
                // The moved tasks hold their old places until they have stopped and the waiting
                // task waits until then: keep both their old and new places counted this cycle
                // so nothing else lands on resources still in use.
                if let Some(a) = target {
                    self.cap.release(&a);
                }
                for (_, a) in released.iter().rev() {
                    self.cap.apply(a);
                }
                let _ = t;
                return Some(plan);
            }
            for (_, a) in moved.iter().rev() {
                self.cap.release(a);
            }
            if let Some(a) = target {
                self.cap.release(&a);
            }
            for (_, a) in released.iter().rev() {
                self.cap.apply(a);
            }
        }
        None
    }

    /// Holds the nodes closest to fitting the task, so that work finishing there accumulates
    /// for it instead of being taken by smaller tasks.
    fn reserve(&mut self, t: &TaskRequest, need: &WorkerNeed) -> Vec<String> {
        let mut cands: Vec<(u64, usize)> = Vec::new();
        for (pos, n) in self.cap.nodes.iter().enumerate() {
            if !n.admits(need) || n.reserved {
                continue;
            }
            let acceptable: Vec<&crate::placement::CapGpu> = n
                .gpus
                .iter()
                .filter(|g| need.types.contains(g.type_id))
                .collect();
            if (acceptable.len() as u32) < need.gpus {
                continue;
            }
            let free: u64 = acceptable.iter().map(|g| g.free).sum();
            cands.push((free, pos));
        }
        cands.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut nodes = Vec::new();
        for &(_, pos) in cands.iter().take(t.workers.max(1) as usize) {
            self.cap.reserve(pos);
            nodes.push(self.state.nodes[self.cap.nodes[pos].node].id.clone());
        }
        nodes
    }
}

/// A node's position and the running tasks on it that migration may move, with what they hold.
type MovableOnNode = (usize, Vec<(usize, Alloc)>);

/// GPUs per worker, workers, zone affinity, whole cards, acceptable types, node classes.
type ShapeClass = (
    u32,
    u32,
    bool,
    bool,
    crate::placement::TypeMask,
    crate::placement::TypeMask,
);

/// How hard a blocked request is to satisfy, for [`Futile`]: requests of one class (same GPU
/// count, workers, zone affinity, whole or shared cards, acceptable types and node classes)
/// are ordered by CPU, memory and shared-card memory; a lower priority can claim fewer victims.
/// The class is a number given out per cycle ([`ShapeClasses`]): a queue walked to its end
/// judges every task's hardness, and copying and hashing its masks each time was a visible
/// part of a steady cycle.
#[derive(Debug, Clone, Copy)]
struct Hardness {
    class: u32,
    cpu: u64,
    mem: u64,
    share: u64,
    priority: f64,
}

/// Numbers the classes of a cycle's request shapes, each worked out once per shape.
#[derive(Default)]
struct ShapeClasses {
    of_shape: FastMap<ShapeKey, u32>,
    ids: FastMap<ShapeClass, u32>,
}

impl ShapeClasses {
    fn hardness(
        &mut self,
        key: ShapeKey,
        need: &WorkerNeed,
        t: &TaskRequest,
        priority: f64,
    ) -> Hardness {
        let (whole, share) = match need.demand {
            GpuDemand::Whole => (true, 0),
            GpuDemand::Share(m) => (false, m),
        };
        let class = match self.of_shape.get(&key) {
            Some(&c) => c,
            None => {
                let class: ShapeClass = (
                    need.gpus,
                    t.workers.max(1),
                    t.zone_affinity,
                    whole,
                    need.types.clone(),
                    need.classes.clone(),
                );
                let next = self.ids.len() as u32;
                let c = *self.ids.entry(class).or_insert(next);
                self.of_shape.insert(key, c);
                c
            }
        };
        Hardness {
            class,
            cpu: need.cpu_millis,
            mem: need.mem_bytes,
            share,
            priority,
        }
    }
}

impl Hardness {
    fn at_least(&self, easier: &Hardness) -> bool {
        self.cpu >= easier.cpu
            && self.mem >= easier.mem
            && self.share >= easier.share
            && self.priority <= easier.priority
    }
}

/// Attempts (place, preempt, migrate) that failed in this cycle, kept per class as the easiest
/// ones. Within a cycle free capacity only shrinks, reservations and chosen victims only grow,
/// and the queue is in falling priority: so a request at least as hard as one that failed
/// fails too, and its attempt, which costs a pass over the nodes and the running tasks, is
/// skipped. When request shapes vary (CPU, memory and GPU memory differ per user) this keeps a
/// cycle from trying every blocked shape; it changes no decision.
#[derive(Default)]
struct Futile {
    by_class: FastMap<u32, Vec<Hardness>>,
}

/// Failed attempts kept per class: enough to cover the usual spread of shapes, and a bound on
/// the cost of the check.
const FUTILE_PER_CLASS: usize = 16;

impl Futile {
    fn proves(&self, h: &Hardness) -> bool {
        self.by_class
            .get(&h.class)
            .is_some_and(|v| v.iter().any(|f| h.at_least(f)))
    }

    fn note(&mut self, h: Hardness) {
        let v = self.by_class.entry(h.class).or_default();
        if v.iter().any(|f| h.at_least(f)) {
            return;
        }
        v.retain(|f| !f.at_least(&h));
        if v.len() < FUTILE_PER_CLASS {
            v.push(h);
        }
    }
}

/// The queue in order, popped from a heap or walked sorted (see [`Cycle::run`]).
enum Order<'a> {
    Lazy(std::collections::BinaryHeap<QueueKey<'a>>),
    Sorted(std::vec::IntoIter<QueueKey<'a>>),
}

impl<'a> Iterator for Order<'a> {
    type Item = QueueKey<'a>;

    fn next(&mut self) -> Option<QueueKey<'a>> {
        match self {
            Order::Lazy(heap) => heap.pop(),
            Order::Sorted(sorted) => sorted.next(),
        }
    }
}

/// Queue position: higher total first, then older, then by id so the order is total.
struct QueueKey<'a> {
    total: f64,
    submitted_at: Time,
    id: &'a str,
    idx: usize,
}

impl Ord for QueueKey<'_> {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        // BinaryHeap pops the greatest: greatest = highest total, earliest, smallest id.
        self.total
            .total_cmp(&o.total)
            .then(o.submitted_at.cmp(&self.submitted_at))
            .then_with(|| o.id.cmp(self.id))
            .then(o.idx.cmp(&self.idx))
    }
}

impl PartialOrd for QueueKey<'_> {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

impl PartialEq for QueueKey<'_> {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == std::cmp::Ordering::Equal
    }
}

impl Eq for QueueKey<'_> {}

/// Free GPUs per type, sorted, so a task's GPU-type fit is a few binary searches rather than a
/// scan of the cluster.
struct FitIndex {
    free_by_type: Vec<Vec<u64>>,
    capacity_by_type: Vec<u64>,
}

impl FitIndex {
    fn new(cap: &Capacity) -> FitIndex {
        let mut free_by_type = vec![Vec::new(); cap.types.len()];
        let mut capacity_by_type = vec![0; cap.types.len()];
        for n in cap.nodes.iter().filter(|n| n.schedulable) {
            for g in &n.gpus {
                let t = g.type_id as usize;
                capacity_by_type[t] = capacity_by_type[t].max(g.capacity);
                if g.free == g.capacity {
                    free_by_type[t].push(u64::MAX);
                } else {
                    free_by_type[t].push(g.free);
                }
            }
        }
        for v in &mut free_by_type {
            v.sort_unstable();
        }
        FitIndex {
            free_by_type,
            capacity_by_type,
        }
    }

    /// Share of the requested GPUs that free, acceptable GPUs could cover now.
    fn fit(&self, need: &WorkerNeed, total: u32) -> f64 {
        if total == 0 {
            return 1.0;
        }
        let mut avail = 0usize;
        for (t, v) in self.free_by_type.iter().enumerate() {
            if !need.types.contains(t as u16) {
                continue;
            }
            let threshold = match need.demand {
                GpuDemand::Whole => u64::MAX,
                GpuDemand::Share(m) => m.min(self.capacity_by_type[t]),
            };
            avail += v.len() - v.partition_point(|&f| f < threshold);
        }
        (avail as f64 / f64::from(total)).min(1.0)
    }
}
