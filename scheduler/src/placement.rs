//! Free-capacity bookkeeping and fragmentation-aware placement.
//!
//! Both the live cycle and the packing simulator place through [`Placer`], so the numbers the
//! simulator reports are the numbers the server gets.
//!
//! GPU capacity is counted in memory units: a whole-card request takes the card, a shared request
//! takes its declared memory plus the safety margin. In the packing simulator a card is 1000 units
//! ("milli-GPU") and the margin is 0, which is the openb trace's own unit.

use crate::fasthash::FastMap;
use crate::types::{accepts_type, Node, RunningTask};
use rand::Rng;
use serde::{Deserialize, Serialize};

/// How one GPU of a worker is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GpuDemand {
    /// The whole card, exclusively.
    Whole,
    /// This many memory units (already including the safety margin) on a card others may share;
    /// on a card no larger than that it is the whole card.
    Share(u64),
}

impl GpuDemand {
    /// A demand no larger than this one, out of a few per power of two: every card that fits
    /// this demand fits that one too (a smaller share fits wherever a larger one does, and a
    /// share that takes a whole card takes no more than that card's room). Lists of the nodes
    /// that could hold a demand are kept per coarse demand, so that they stay few when every
    /// task asks for its own amount of memory; the exact demand is checked on the list.
    pub fn coarse_below(self) -> GpuDemand {
        match self {
            GpuDemand::Share(m) if m >= 16 => {
                // Keeps the four highest bits.
                let shift = (63 - m.leading_zeros()) - 3;
                GpuDemand::Share((m >> shift) << shift)
            }
            d => d,
        }
    }
}

/// A set of interned GPU type ids a request accepts. Bitset so that fit checks stay branch-cheap.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TypeMask(Vec<u64>);

impl TypeMask {
    pub fn contains(&self, id: u16) -> bool {
        let i = id as usize;
        self.0.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
    }
    pub fn from_ids(ids: &[u16]) -> TypeMask {
        let mut m = TypeMask(Vec::new());
        for &i in ids {
            m.insert(i);
        }
        m
    }
    /// True when no type is accepted (the request can never get a GPU).
    pub fn is_empty_mask(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }
    fn insert(&mut self, id: u16) {
        let i = id as usize;
        if self.0.len() <= i / 64 {
            self.0.resize(i / 64 + 1, 0);
        }
        self.0[i / 64] |= 1 << (i % 64);
    }
}

/// What one worker of a task needs on a single node.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerNeed {
    pub gpus: u32,
    pub demand: GpuDemand,
    pub cpu_millis: u64,
    pub mem_bytes: u64,
    pub types: TypeMask,
    /// Node classes (distinct taints and features) that admit the task.
    pub classes: TypeMask,
}

/// Free state of one GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CapGpu {
    pub index: u32,
    pub type_id: u16,
    pub capacity: u64,
    pub free: u64,
}

impl CapGpu {
    /// A share at least as large as the card is a whole card: the demand is stated once per
    /// task and means "whole" on small cards and "a slice" on big ones.
    pub fn fits(&self, d: GpuDemand) -> bool {
        match d {
            GpuDemand::Share(m) if m < self.capacity => self.free >= m.max(1),
            _ => self.free == self.capacity && self.capacity > 0,
        }
    }
    fn take(&self, d: GpuDemand) -> u64 {
        match d {
            GpuDemand::Share(m) if m < self.capacity => m,
            _ => self.capacity,
        }
    }
}

/// Free state of one node.
#[derive(Debug, Clone, PartialEq)]
pub struct CapNode {
    /// Index into the caller's node list.
    pub node: usize,
    pub zone: u32,
    pub schedulable: bool,
    /// Held for a blocked higher-priority task: lower-priority tasks must not land here.
    pub reserved: bool,
    /// Index into [`Capacity::classes`]: nodes with the same taints and features.
    pub class: u16,
    pub cpu_free: u64,
    pub mem_free: u64,
    pub cpu_total: u64,
    pub gpus: Vec<CapGpu>,
    /// Bumped on every change so cached scores can be invalidated per node.
    pub version: u32,
    /// See [`crate::Node::own_network`].
    pub own_network: bool,
}

impl CapNode {
    /// Takes an allocation's resources from this node alone, for a trial on a copy: placement
    /// indexes never see it. [`Capacity::apply`] is the change they follow.
    pub fn apply(&mut self, a: &Alloc) {
        self.cpu_free = self.cpu_free.saturating_sub(a.cpu_millis);
        self.mem_free = self.mem_free.saturating_sub(a.mem_bytes);
        for &g in &a.gpu_pos {
            let gpu = &mut self.gpus[g];
            gpu.free = gpu.free.saturating_sub(gpu.take(a.demand));
        }
    }

    /// Gives an allocation's resources back to this node alone; see [`CapNode::apply`].
    pub fn release(&mut self, a: &Alloc) {
        self.cpu_free += a.cpu_millis;
        self.mem_free += a.mem_bytes;
        for &g in &a.gpu_pos {
            let gpu = &mut self.gpus[g];
            gpu.free = (gpu.free + gpu.take(a.demand)).min(gpu.capacity);
        }
    }

    pub fn gpu_free_total(&self) -> u64 {
        self.gpus.iter().map(|g| g.free).sum()
    }
    pub fn gpu_capacity_total(&self) -> u64 {
        self.gpus.iter().map(|g| g.capacity).sum()
    }

    /// The node takes new work and admits this kind of task at all.
    pub fn admits(&self, need: &WorkerNeed) -> bool {
        self.schedulable && need.classes.contains(self.class)
    }

    /// Can this worker fit here right now?
    pub fn fits(&self, need: &WorkerNeed) -> bool {
        if !self.admits(need) || self.cpu_free < need.cpu_millis || self.mem_free < need.mem_bytes {
            return false;
        }
        if need.gpus == 0 {
            return true;
        }
        let mut n = 0;
        for g in &self.gpus {
            if need.types.contains(g.type_id) && g.fits(need.demand) {
                n += 1;
                if n >= need.gpus {
                    return true;
                }
            }
        }
        false
    }
}

/// One worker's allocation, kept so that a failed gang can be rolled back exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alloc {
    /// Position in [`Capacity::nodes`].
    pub pos: usize,
    /// Positions in the node's `gpus`.
    pub gpu_pos: Vec<usize>,
    pub demand: GpuDemand,
    pub cpu_millis: u64,
    pub mem_bytes: u64,
}

/// Free capacity of the whole cluster, built from the nodes and the running tasks.
#[derive(Debug, Clone, PartialEq)]
pub struct Capacity {
    pub nodes: Vec<CapNode>,
    pub types: Vec<String>,
    pub zones: Vec<String>,
    /// Distinct (taints, features) of the nodes; most clusters have one.
    pub classes: Vec<(Vec<String>, Vec<String>)>,
    node_pos: FastMap<String, usize>,
    /// Positions of nodes changed by `apply`/`release`, in order, so placement indexes can
    /// catch up with exactly the nodes that changed.
    log: Vec<usize>,
    /// Allocations given back so far: capacity that grows again (see [`Capacity::releases`]).
    releases: u64,
}

impl Capacity {
    /// Builds free capacity: node capacity minus what every running task holds. Tasks being
    /// preempted still hold their resources until they are gone.
    pub fn new(nodes: &[Node], running: &[RunningTask], margin: u64) -> Capacity {
        let mut types: Vec<String> = Vec::new();
        let mut zones: Vec<String> = Vec::new();
        let mut classes: Vec<(Vec<String>, Vec<String>)> = Vec::new();
        let mut node_pos = FastMap::default();
        let mut cap_nodes = Vec::with_capacity(nodes.len());
        for (i, n) in nodes.iter().enumerate() {
            let zone = intern(&mut zones, &n.zone);
            let mut key = (n.taints.clone(), n.features.clone());
            key.0.sort();
            key.0.dedup();
            key.1.sort();
            key.1.dedup();
            let class = match classes.iter().position(|c| *c == key) {
                Some(c) => c,
                None => {
                    classes.push(key);
                    classes.len() - 1
                }
            } as u16;
            let gpus = n
                .gpus
                .iter()
                .map(|g| CapGpu {
                    index: g.index,
                    type_id: intern(&mut types, &g.gpu_type) as u16,
                    capacity: g.mem_bytes,
                    free: g.mem_bytes,
                })
                .collect();
            node_pos.insert(n.id.clone(), i);
            cap_nodes.push(CapNode {
                node: i,
                zone,
                schedulable: n.schedulable,
                reserved: false,
                class,
                cpu_free: n.cpu_millis,
                mem_free: n.mem_bytes,
                cpu_total: n.cpu_millis,
                gpus,
                version: 0,
                own_network: n.own_network,
            });
        }
        let mut cap = Capacity {
            nodes: cap_nodes,
            types,
            zones,
            classes,
            node_pos,
            log: Vec::new(),
            releases: 0,
        };
        for t in running {
            cap.apply_running(t, margin);
        }
        cap
    }

    /// Same as applying [`Capacity::allocs_of`], without the allocations: this runs for every
    /// running task in every cycle.
    fn apply_running(&mut self, t: &RunningTask, margin: u64) {
        for p in &t.placements {
            let Some(pos) = self.node_position(&p.node) else {
                continue;
            };
            let n = &mut self.nodes[pos];
            n.cpu_free = n.cpu_free.saturating_sub(t.request.cpu_millis);
            n.mem_free = n.mem_free.saturating_sub(t.request.mem_bytes);
            for ix in &p.gpu_indices {
                if let Some(g) = n.gpus.iter_mut().find(|g| g.index == *ix) {
                    let d = demand_for(t.request.gpu_mem_bytes, margin);
                    g.free = g.free.saturating_sub(g.take(d));
                }
            }
            n.version = n.version.wrapping_add(1);
        }
    }

    pub fn node_position(&self, id: &str) -> Option<usize> {
        self.node_pos.get(id).copied()
    }

    /// The allocations a running task holds, in this capacity's coordinates. Unknown nodes or
    /// GPUs (a node that left the cluster) are skipped.
    pub fn allocs_of(&self, t: &RunningTask, margin: u64) -> Vec<Alloc> {
        let mut out = Vec::with_capacity(t.placements.len());
        for p in &t.placements {
            let Some(pos) = self.node_position(&p.node) else {
                continue;
            };
            let node = &self.nodes[pos];
            let gpu_pos: Vec<usize> = p
                .gpu_indices
                .iter()
                .filter_map(|ix| node.gpus.iter().position(|g| g.index == *ix))
                .collect();
            out.push(Alloc {
                pos,
                gpu_pos,
                demand: demand_for(t.request.gpu_mem_bytes, margin),
                cpu_millis: t.request.cpu_millis,
                mem_bytes: t.request.mem_bytes,
            });
        }
        out
    }

    /// The node classes whose taints a task tolerates and whose features it finds.
    pub fn class_mask(&self, tolerations: &[String], requires: &[String]) -> TypeMask {
        let mut m = TypeMask(Vec::new());
        for (i, (taints, features)) in self.classes.iter().enumerate() {
            if taints.iter().all(|t| tolerations.contains(t))
                && requires.iter().all(|r| features.contains(r))
            {
                m.insert(i as u16);
            }
        }
        m
    }

    /// Every node class.
    pub fn class_mask_all(&self) -> TypeMask {
        let ids: Vec<u16> = (0..self.classes.len() as u16).collect();
        TypeMask::from_ids(&ids)
    }

    /// Interns the acceptable types of a request. An empty list accepts every type.
    pub fn type_mask(&self, types: &[String]) -> TypeMask {
        let mut m = TypeMask(Vec::new());
        for (i, t) in self.types.iter().enumerate() {
            if accepts_type(types, t) {
                m.insert(i as u16);
            }
        }
        m
    }

    pub fn apply(&mut self, a: &Alloc) {
        let n = &mut self.nodes[a.pos];
        n.apply(a);
        n.version = n.version.wrapping_add(1);
        self.log.push(a.pos);
    }

    /// Holds the node for a blocked task: nothing of lower priority lands there this cycle.
    /// Logged like a change of capacity, for indexes of where things could still go.
    pub fn reserve(&mut self, pos: usize) {
        self.nodes[pos].reserved = true;
        self.log.push(pos);
    }

    pub fn release(&mut self, a: &Alloc) {
        let n = &mut self.nodes[a.pos];
        n.release(a);
        n.version = n.version.wrapping_add(1);
        self.log.push(a.pos);
        self.releases += 1;
    }

    /// How many allocations were given back: while it stays the same, capacity only shrank,
    /// and a node that could not hold something still cannot.
    pub fn releases(&self) -> u64 {
        self.releases
    }

    /// Nodes changed (taken from, reserved or given back to) since the log held `cursor`
    /// entries, and the log's length now, for lists that follow capacity.
    pub fn changed_since(&self, cursor: usize) -> (&[usize], usize) {
        (self.log.get(cursor..).unwrap_or(&[]), self.log.len())
    }

    pub fn total_gpu_capacity(&self) -> u64 {
        self.nodes.iter().map(|n| n.gpu_capacity_total()).sum()
    }

    pub fn total_gpu_free(&self) -> u64 {
        self.nodes.iter().map(|n| n.gpu_free_total()).sum()
    }
}

/// A task that declares its GPU memory may share; one that does not takes whole cards.
pub fn demand_for(gpu_mem: Option<u64>, margin: u64) -> GpuDemand {
    match gpu_mem {
        Some(m) => GpuDemand::Share(m.saturating_add(margin)),
        None => GpuDemand::Whole,
    }
}

fn intern(list: &mut Vec<String>, s: &str) -> u32 {
    if let Some(i) = list.iter().position(|x| x == s) {
        return i as u32;
    }
    list.push(s.to_string());
    (list.len() - 1) as u32
}

/// The placement strategies. `Autodl` is what the live scheduler uses; the others are the
/// published baselines, kept to measure against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum PlacementPolicy {
    Random,
    BestFit,
    Fgd,
    #[default]
    Autodl,
}

impl std::str::FromStr for PlacementPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "random" => Ok(Self::Random),
            "bestfit" => Ok(Self::BestFit),
            "fgd" => Ok(Self::Fgd),
            "autodl" => Ok(Self::Autodl),
            _ => Err(format!(
                "unknown placement policy {s:?} (random, bestfit, fgd, autodl)"
            )),
        }
    }
}

/// The workload the cluster expects, as shapes with probabilities: fragmentation is measured
/// against it (capacity no typical task could use is wasted).
#[derive(Debug, Clone, Default)]
pub struct FragModel {
    pub shapes: Vec<(WorkerNeed, f64)>,
    /// CPU millis and memory bytes the typical GPU task brings per unit of GPU it takes.
    pub cpu_per_unit: f64,
    pub mem_per_unit: f64,
}

impl FragModel {
    /// Keeps the most frequent shapes that together make up `coverage` of the weight, so the
    /// per-node cost stays bounded; weights are renormalised. This is autodl's own model:
    /// shapes without GPUs are dropped, because the stranded-capacity term already charges a
    /// node for running out of CPU or memory. The `fgd` baseline uses [`FragModel::paper`].
    pub fn from_counts(
        mut counts: Vec<(WorkerNeed, f64)>,
        coverage: f64,
        max_shapes: usize,
        unit: u64,
    ) -> FragModel {
        counts.retain(|(n, w)| n.gpus > 0 && *w > 0.0);
        counts.sort_by(|a, b| b.1.total_cmp(&a.1));
        let total: f64 = counts.iter().map(|c| c.1).sum();
        if total <= 0.0 {
            return FragModel::default();
        }
        let mut acc = 0.0;
        let mut shapes = Vec::new();
        for (n, w) in counts {
            if acc >= coverage * total || shapes.len() >= max_shapes {
                break;
            }
            acc += w;
            shapes.push((n, w));
        }
        let sum: f64 = shapes.iter().map(|s| s.1).sum();
        for s in &mut shapes {
            s.1 /= sum;
        }
        let (mut cpu, mut mem, mut units) = (0.0, 0.0, 0.0);
        for (n, p) in &shapes {
            cpu += p * n.cpu_millis as f64;
            mem += p * n.mem_bytes as f64;
            units += p * f64::from(n.gpus) * unit_of(n.demand, unit);
        }
        let units = units.max(f64::MIN_POSITIVE);
        FragModel {
            shapes,
            cpu_per_unit: cpu / units,
            mem_per_unit: mem / units,
        }
    }

    /// The typical-task model as the FGD paper defines it, for the `fgd` baseline: the caller
    /// gives one shape per GPU demand with a representative CPU and no memory (the paper's
    /// "cannot fit" names only type, CPU and GPUs). CPU-only tasks stay in the model: one that
    /// fits sees no fragment, one whose CPU ran out sees every idle GPU as one, so using up a
    /// node's CPU is charged. The most popular shapes are kept until they cover `coverage` of
    /// the tasks, however many that takes.
    pub fn paper(mut counts: Vec<(WorkerNeed, f64)>, coverage: f64) -> FragModel {
        counts.retain(|(_, w)| *w > 0.0);
        counts.sort_by(|a, b| b.1.total_cmp(&a.1));
        let total: f64 = counts.iter().map(|c| c.1).sum();
        let mut acc = 0.0;
        let mut shapes = Vec::new();
        for (n, w) in counts {
            if acc >= coverage * total {
                break;
            }
            acc += w;
            shapes.push((n, w / total));
        }
        let sum: f64 = shapes
            .iter()
            .map(|s| s.1)
            .sum::<f64>()
            .max(f64::MIN_POSITIVE);
        for s in &mut shapes {
            s.1 /= sum;
        }
        FragModel {
            shapes,
            cpu_per_unit: 0.0,
            mem_per_unit: 0.0,
        }
    }

    /// GPU capacity on the node that is likely to stay idle because the CPU or memory left
    /// there would run out first, judged by the typical task's CPU and memory per GPU unit.
    pub fn stranded(&self, n: &CapNode) -> f64 {
        let free = n.gpu_free_total() as f64;
        if free == 0.0 || self.cpu_per_unit <= 0.0 {
            return 0.0;
        }
        let by_cpu = n.cpu_free as f64 / self.cpu_per_unit;
        let by_mem = if self.mem_per_unit > 0.0 {
            n.mem_free as f64 / self.mem_per_unit
        } else {
            f64::INFINITY
        };
        (free - by_cpu.min(by_mem)).max(0.0)
    }

    /// Expected GPU capacity on the node that a typical task could not use.
    pub fn node_frag(&self, n: &CapNode) -> f64 {
        let total_free = n.gpu_free_total() as f64;
        if total_free == 0.0 {
            return 0.0;
        }
        let mut f = 0.0;
        for (m, p) in &self.shapes {
            f += p * shape_frag(n, m, total_free);
        }
        f
    }
}

fn unit_of(d: GpuDemand, card: u64) -> f64 {
    match d {
        GpuDemand::Whole => card as f64,
        GpuDemand::Share(m) => m as f64,
    }
}

fn shape_frag(n: &CapNode, m: &WorkerNeed, total_free: f64) -> f64 {
    if n.cpu_free < m.cpu_millis || n.mem_free < m.mem_bytes {
        return total_free;
    }
    let mut fit = 0;
    let mut unusable = 0u64;
    for g in &n.gpus {
        if m.types.contains(g.type_id) && g.fits(m.demand) {
            fit += 1;
        } else {
            unusable += g.free;
        }
    }
    if fit < m.gpus {
        total_free
    } else {
        unusable as f64
    }
}

/// A scored way to place one worker on one node.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Choice {
    score: f64,
    /// Bitmask of GPU positions on the node.
    gpus: u64,
}

/// Every node's best choice for one request shape, ordered by score. Kept up to date from the
/// capacity's change log, so a placement costs a few tree operations instead of a scan of the
/// cluster.
#[derive(Debug, Clone, Default)]
struct ShapeIndex {
    ranked: MinTree,
    entry: Vec<Option<(u64, Choice)>>,
    /// Node version each entry was computed at.
    seen: Vec<u32>,
    cursor: usize,
}

/// The largest room on a single GPU of each unreserved node, kept up to date from the
/// capacity's change log: a cheap proof that a worker fits on no node open to it, and a short
/// list of the nodes it might fit on. A migration attempt on a full cluster tries hundreds of
/// nodes, and for each one asks where the tasks it would move could go; a placement scan of
/// the whole cluster per question made such cycles take most of a second.
#[derive(Debug, Clone, Default)]
pub struct RoomIndex {
    /// Keyed by the complement of the room, so the tree's minimum is the largest room.
    ranked: MinTree,
    cursor: usize,
}

impl RoomIndex {
    /// What one GPU of the node can still take: a free card counts as room for anything, as
    /// [`CapGpu::fits`] lets a free card take a whole-card demand or a share of any size.
    fn room(n: &CapNode) -> Option<u64> {
        if !n.schedulable || n.reserved {
            return None;
        }
        n.gpus
            .iter()
            .map(|g| {
                if g.capacity > 0 && g.free == g.capacity {
                    u64::MAX
                } else {
                    g.free
                }
            })
            .max()
            .filter(|&r| r > 0)
    }

    fn refresh(&mut self, cap: &Capacity) {
        let n = cap.nodes.len();
        if self.ranked.n != n || self.cursor > cap.log.len() {
            self.ranked = MinTree::new(n);
            for (p, node) in cap.nodes.iter().enumerate() {
                self.ranked.set(p, Self::room(node).map(|r| !r));
            }
        } else {
            for &p in &cap.log[self.cursor..] {
                self.ranked.set(p, Self::room(&cap.nodes[p]).map(|r| !r));
            }
        }
        self.cursor = cap.log.len();
    }

    /// The unreserved nodes (in order) that could have room for one GPU of the worker, when
    /// there are at most `limit` of them: every node the worker fits on is among them.
    pub fn holders(
        &mut self,
        cap: &Capacity,
        need: &WorkerNeed,
        limit: usize,
    ) -> Option<Vec<usize>> {
        if need.gpus == 0 {
            return None;
        }
        self.refresh(cap);
        let most = !wanted_room(need.demand);
        let (t, n) = (&self.ranked.t, self.ranked.n);
        let mut found = Vec::new();
        let mut stack = vec![1usize];
        while let Some(j) = stack.pop() {
            if j >= t.len() || t[j] == EMPTY || t[j].0 > most {
                continue;
            }
            if j >= n {
                if found.len() == limit {
                    return None;
                }
                found.push(j - n);
            } else {
                stack.extend([2 * j, 2 * j + 1]);
            }
        }
        found.sort_unstable();
        Some(found)
    }

    /// Whether some unreserved node other than `except` could have room for one GPU of the
    /// worker. False proves that it fits on none of them; true proves nothing (CPU, memory,
    /// GPU types and node classes are not looked at).
    pub fn may_hold_elsewhere(&mut self, cap: &Capacity, need: &WorkerNeed, except: usize) -> bool {
        if need.gpus == 0 {
            return true;
        }
        self.refresh(cap);
        let wanted = wanted_room(need.demand);
        let largest = match self.ranked.min() {
            Some((_, p)) if p == except => {
                let kept = self.ranked.t[except + self.ranked.n];
                self.ranked.set(except, None);
                let second = self.ranked.min();
                self.ranked.set(except, (kept != EMPTY).then_some(kept.0));
                second
            }
            other => other,
        };
        largest.is_some_and(|(k, _)| !k >= wanted)
    }
}

/// The room on one GPU that a demand needs at least (see [`RoomIndex::room`]).
fn wanted_room(d: GpuDemand) -> u64 {
    match d {
        GpuDemand::Share(m) => m.max(1),
        GpuDemand::Whole => u64::MAX,
    }
}

/// Minimum (score key, node position) over all nodes, updated in O(log n) without allocating.
#[derive(Debug, Clone, Default)]
struct MinTree {
    n: usize,
    t: Vec<(u64, u32)>,
}

const EMPTY: (u64, u32) = (u64::MAX, u32::MAX);

impl MinTree {
    fn new(n: usize) -> MinTree {
        MinTree {
            n,
            t: vec![EMPTY; 2 * n.max(1)],
        }
    }
    fn set(&mut self, pos: usize, key: Option<u64>) {
        let mut i = pos + self.n;
        self.t[i] = key.map_or(EMPTY, |k| (k, pos as u32));
        while i > 1 {
            i /= 2;
            self.t[i] = self.t[2 * i].min(self.t[2 * i + 1]);
        }
    }
    fn min(&self) -> Option<(u64, usize)> {
        let m = self.t[1];
        (m != EMPTY).then_some((m.0, m.1 as usize))
    }
}

/// Order-preserving map of a score to an integer key.
fn score_key(x: f64) -> u64 {
    // -0.0 and 0.0 are the same score.
    let b = if x == 0.0 { 0 } else { x.to_bits() };
    if b >> 63 == 1 {
        !b
    } else {
        b | (1 << 63)
    }
}

/// Chooses nodes and GPUs. Per request shape it keeps every node's best choice in a ranked
/// index that is refreshed only for nodes that changed.
#[derive(Debug, Clone)]
pub struct Placer {
    pub policy: PlacementPolicy,
    pub model: FragModel,
    frag: Vec<(u32, f64)>,
    shapes: FastMap<WorkerNeed, usize>,
    index: Vec<ShapeIndex>,
    by_state: FastMap<(usize, u64), Option<Choice>>,
    sigs: Vec<(u32, u64)>,
    /// Per shape, whether it was placed before: a shape's ranked index is built on its second
    /// placement, since when every task is a shape of its own (CPU, memory and GPU memory all
    /// vary) most shapes are placed once, and one scan costs less than building an index.
    placed_before: Vec<bool>,
    /// See [`Placer::with_random_ties`].
    tie_salt: Option<u64>,
}

impl Placer {
    pub fn new(policy: PlacementPolicy, model: FragModel) -> Placer {
        Placer {
            policy,
            model,
            frag: Vec::new(),
            shapes: FastMap::default(),
            index: Vec::new(),
            by_state: FastMap::default(),
            sigs: Vec::new(),
            placed_before: Vec::new(),
            tie_salt: None,
        }
    }

    /// Breaks ties among equally scored nodes in a random (seeded) order instead of by
    /// position. The published FGD runs do so (the Kubernetes scheduler picks at random among
    /// its best-scoring nodes), and on gpushare100 taking the first node instead costs FGD about
    /// a point. Only the `fgd` baseline of the packing benchmark uses it; the live policy breaks
    /// ties by node id, so that its decisions can be replayed.
    pub fn with_random_ties(mut self, seed: u64) -> Placer {
        self.tie_salt = Some(seed);
        self
    }

    /// A node's tie-break: far below any score difference that matters (a millionth of a unit
    /// per step, under a thousandth in all), fixed for the node within one run.
    fn jitter(&self, pos: usize) -> f64 {
        let Some(salt) = self.tie_salt else {
            return 0.0;
        };
        let mut x = (pos as u64 ^ salt).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^= x >> 31;
        x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x ^= x >> 29;
        (x % 1000) as f64 * 1e-6
    }

    fn node_frag(&mut self, cap: &Capacity, pos: usize) -> f64 {
        if self.frag.len() != cap.nodes.len() {
            self.frag = vec![(u32::MAX, 0.0); cap.nodes.len()];
        }
        let n = &cap.nodes[pos];
        let (v, f) = self.frag[pos];
        if v == n.version {
            return f;
        }
        let f = self.model.node_frag(n);
        self.frag[pos] = (n.version, f);
        f
    }

    /// Fragmentation of the whole cluster against the model, as a share of idle GPU capacity.
    pub fn frag_rate(&mut self, cap: &Capacity) -> f64 {
        let free = cap.total_gpu_free() as f64;
        if free == 0.0 {
            return 0.0;
        }
        let f: f64 = (0..cap.nodes.len()).map(|p| self.node_frag(cap, p)).sum();
        f / free
    }

    /// Places one worker: picks node and GPUs, applies them to `cap`, returns the allocation.
    /// `allowed` filters nodes (zone affinity, reservations); `rng` is used only by `Random`.
    pub fn place_worker<R: Rng>(
        &mut self,
        cap: &mut Capacity,
        need: &WorkerNeed,
        allowed: &dyn Fn(&CapNode) -> bool,
        rng: &mut R,
    ) -> Option<Alloc> {
        if self.policy == PlacementPolicy::Random {
            let feasible: Vec<usize> = (0..cap.nodes.len())
                .filter(|&p| allowed(&cap.nodes[p]) && cap.nodes[p].fits(need))
                .collect();
            if feasible.is_empty() {
                return None;
            }
            let p = feasible[rng.gen_range(0..feasible.len())];
            let n = &cap.nodes[p];
            let mut cands: Vec<usize> = (0..n.gpus.len())
                .filter(|&g| need.types.contains(n.gpus[g].type_id) && n.gpus[g].fits(need.demand))
                .collect();
            let mut gpus = Vec::with_capacity(need.gpus as usize);
            for _ in 0..need.gpus {
                let i = rng.gen_range(0..cands.len());
                gpus.push(cands.swap_remove(i));
            }
            gpus.sort_unstable();
            return Some(self.commit(cap, p, gpus, need));
        }
        let shape = self.shape_id(need);
        if !std::mem::replace(&mut self.placed_before[shape], true) {
            return self.place_best_of(cap, shape, need, 0..cap.nodes.len(), allowed);
        }
        self.refresh(cap, shape, need);
        let mut p = self.select(cap, shape, allowed)?;
        if !cap.nodes[p].fits(need) {
            // The index missed a change to this node; never trust it over the capacity itself:
            // rebuild the shape's index and choose again, and give up rather than over-commit.
            self.index[shape].entry.clear();
            self.refresh(cap, shape, need);
            p = self.select(cap, shape, allowed)?;
            if !cap.nodes[p].fits(need) {
                return None;
            }
        }
        let mask = self.index[shape].entry[p].map(|(_, c)| c.gpus)?;
        let gpus = mask_positions(mask);
        Some(self.commit(cap, p, gpus, need))
    }

    /// Places one worker on the node at `pos`, as [`Placer::place_worker`] would if only that
    /// node were allowed, without building or refreshing the shape's index: preemption and
    /// migration place on the node they made room on, and an index over every node for each
    /// such shape would cost a pass over the cluster per blocked task.
    pub fn place_on<R: Rng>(
        &mut self,
        cap: &mut Capacity,
        pos: usize,
        need: &WorkerNeed,
        rng: &mut R,
    ) -> Option<Alloc> {
        if self.policy == PlacementPolicy::Random {
            let id = cap.nodes[pos].node;
            return self.place_worker(cap, need, &|n: &CapNode| n.node == id, rng);
        }
        let shape = self.shape_id(need);
        let c = self.cached_choice(cap, pos, shape, need)?;
        let gpus = mask_positions(c.gpus);
        Some(self.commit(cap, pos, gpus, need))
    }

    /// Places one worker as [`Placer::place_worker`] would when the nodes it fits on are all
    /// among `among` (in order): the same choice, from a scan of those nodes alone.
    pub fn place_among<R: Rng>(
        &mut self,
        cap: &mut Capacity,
        among: &[usize],
        need: &WorkerNeed,
        rng: &mut R,
    ) -> Option<Alloc> {
        if self.policy == PlacementPolicy::Random {
            return self.place_worker(cap, need, &|n: &CapNode| !n.reserved, rng);
        }
        let shape = self.shape_id(need);
        let unreserved = |n: &CapNode| !n.reserved;
        self.place_best_of(cap, shape, need, among.iter().copied(), &unreserved)
    }

    /// Places the worker on the best (score, position) of `nodes` (in order) that `allowed`
    /// admits, as the shape's index would rank them.
    fn place_best_of(
        &mut self,
        cap: &mut Capacity,
        shape: usize,
        need: &WorkerNeed,
        nodes: impl Iterator<Item = usize>,
        allowed: &dyn Fn(&CapNode) -> bool,
    ) -> Option<Alloc> {
        let mut best: Option<(u64, usize, Choice)> = None;
        for p in nodes {
            if !allowed(&cap.nodes[p]) {
                continue;
            }
            if let Some(c) = self.cached_choice(cap, p, shape, need) {
                let k = score_key(c.score + self.jitter(p));
                if best.is_none_or(|b| k < b.0) {
                    best = Some((k, p, c));
                }
            }
        }
        let (_, p, c) = best?;
        let gpus = mask_positions(c.gpus);
        Some(self.commit(cap, p, gpus, need))
    }

    /// The best-ranked node of the shape's index that `allowed` admits.
    fn select(
        &self,
        cap: &Capacity,
        shape: usize,
        allowed: &dyn Fn(&CapNode) -> bool,
    ) -> Option<usize> {
        let idx = &self.index[shape];
        let (_, top) = idx.ranked.min()?;
        if allowed(&cap.nodes[top]) {
            return Some(top);
        }
        // The best node is held or outside the zone: scan for the best allowed one.
        let mut best: Option<(u64, usize)> = None;
        for (p, e) in idx.entry.iter().enumerate() {
            if let Some((k, _)) = e {
                if best.is_none_or(|b| *k < b.0) && allowed(&cap.nodes[p]) {
                    best = Some((*k, p));
                }
            }
        }
        best.map(|b| b.1)
    }

    /// Brings the shape's index up to date: built on first use, then only nodes in the change
    /// log since the last refresh are rescored.
    fn refresh(&mut self, cap: &Capacity, shape: usize, need: &WorkerNeed) {
        let n = cap.nodes.len();
        if self.index[shape].entry.len() != n {
            let mut idx = ShapeIndex {
                ranked: MinTree::new(n),
                entry: vec![None; n],
                seen: cap.nodes.iter().map(|n| n.version).collect(),
                cursor: cap.log.len(),
            };
            for p in 0..n {
                if let Some(c) = self.cached_choice(cap, p, shape, need) {
                    let k = score_key(c.score + self.jitter(p));
                    idx.entry[p] = Some((k, c));
                    idx.ranked.set(p, Some(k));
                }
            }
            self.index[shape] = idx;
            return;
        }
        let from = self.index[shape].cursor;
        if from == cap.log.len() {
            return;
        }
        for i in from..cap.log.len() {
            let p = cap.log[i];
            let version = cap.nodes[p].version;
            if self.index[shape].seen[p] == version {
                continue;
            }
            self.index[shape].seen[p] = version;
            let j = self.jitter(p);
            let fresh = self
                .cached_choice(cap, p, shape, need)
                .map(|c| (score_key(c.score + j), c));
            let idx = &mut self.index[shape];
            let old = idx.entry[p];
            if old.map(|o| o.0) != fresh.map(|f| f.0) {
                idx.ranked.set(p, fresh.map(|f| f.0));
            }
            idx.entry[p] = fresh;
        }
        self.index[shape].cursor = cap.log.len();
    }

    fn commit(
        &mut self,
        cap: &mut Capacity,
        pos: usize,
        gpu_pos: Vec<usize>,
        need: &WorkerNeed,
    ) -> Alloc {
        let a = Alloc {
            pos,
            gpu_pos,
            demand: need.demand,
            cpu_millis: need.cpu_millis,
            mem_bytes: need.mem_bytes,
        };
        cap.apply(&a);
        a
    }

    fn shape_id(&mut self, need: &WorkerNeed) -> usize {
        if let Some(&i) = self.shapes.get(need) {
            return i;
        }
        let i = self.index.len();
        self.shapes.insert(need.clone(), i);
        self.index.push(ShapeIndex::default());
        self.placed_before.push(false);
        i
    }

    /// Nodes in the same state score the same, and clusters have many such nodes (empty ones,
    /// full ones, identically loaded ones), so choices are memoised by node state. A hit is
    /// re-validated against the node, so a hash collision can cost time but never over-commit.
    fn cached_choice(
        &mut self,
        cap: &Capacity,
        pos: usize,
        shape: usize,
        need: &WorkerNeed,
    ) -> Option<Choice> {
        let n = &cap.nodes[pos];
        if !n.fits(need) {
            return None;
        }
        if self.sigs.len() != cap.nodes.len() {
            self.sigs = vec![(u32::MAX, 0); cap.nodes.len()];
        }
        let sig = match self.sigs[pos] {
            (v, sig) if v == n.version => sig,
            _ => {
                let sig = node_signature(n);
                self.sigs[pos] = (n.version, sig);
                sig
            }
        };
        if let Some(&c) = self.by_state.get(&(shape, sig)) {
            if c.is_some_and(|c| choice_valid(n, need, c.gpus)) {
                return c;
            }
        }
        let c = self.compute_choice(cap, pos, need);
        self.by_state.insert((shape, sig), c);
        c
    }

    /// Scores the best way to put the worker on this node; lower is better.
    fn compute_choice(&mut self, cap: &Capacity, pos: usize, need: &WorkerNeed) -> Option<Choice> {
        let n = &cap.nodes[pos];
        if !n.fits(need) {
            return None;
        }
        let cands = candidate_gpu_sets(n, need);
        let node_cap = n.gpu_capacity_total().max(1) as f64;
        let cpu_total = n.cpu_total.max(1) as f64;
        match self.policy {
            PlacementPolicy::Random => None,
            PlacementPolicy::BestFit => {
                // Least capacity left over, GPU first, CPU as a tie-break.
                let mut best: Option<Choice> = None;
                for mask in cands {
                    let left = n.gpu_free_total() - take_sum(n, mask, need.demand);
                    let cpu_left = (n.cpu_free - need.cpu_millis) as f64 / cpu_total;
                    let s = left as f64 / node_cap + 1e-3 * cpu_left;
                    if best.is_none_or(|b| s < b.score) {
                        best = Some(Choice {
                            score: s,
                            gpus: mask,
                        });
                    }
                }
                best
            }
            PlacementPolicy::Fgd | PlacementPolicy::Autodl => {
                let before = self.node_frag(cap, pos);
                let mut scratch = n.clone();
                let mut best: Option<Choice> = None;
                for mask in cands {
                    scratch.cpu_free = n.cpu_free - need.cpu_millis;
                    scratch.mem_free = n.mem_free - need.mem_bytes;
                    for (i, g) in scratch.gpus.iter_mut().enumerate() {
                        g.free = n.gpus[i].free;
                        if mask & (1 << i) != 0 {
                            g.free -= g.take(need.demand);
                        }
                    }
                    let after = self.model.node_frag(&scratch);
                    let mut s = after - before;
                    if self.policy == PlacementPolicy::Autodl {
                        s = self.autodl_adjust(s, n, &scratch);
                    }
                    if best.is_none_or(|b| s < b.score) {
                        best = Some(Choice {
                            score: s,
                            gpus: mask,
                        });
                    }
                }
                best
            }
        }
    }

    /// Our refinement of FGD. FGD only sees the GPU side, but on real clusters a node whose CPU
    /// or memory ran out strands its free GPUs (on openb that is most of the idle capacity at
    /// saturation). So the score adds the change in GPU capacity expected to be stranded given
    /// the typical task's CPU and memory per GPU, and a best-fit term that keeps whole nodes
    /// free for gang tasks and packs CPU-only tasks onto nodes whose GPUs are already taken.
    fn autodl_adjust(&self, frag_delta: f64, before: &CapNode, after: &CapNode) -> f64 {
        let left = after.gpu_free_total() as f64 / before.gpu_capacity_total().max(1) as f64;
        let card = before.gpus.first().map_or(1.0, |g| g.capacity as f64);
        let strand = self.model.stranded(after) - self.model.stranded(before);
        frag_delta + STRAND_WEIGHT * strand + BESTFIT_WEIGHT * card * left
    }
}

/// Weight of the stranded-capacity change, in the same unit as the fragmentation change.
const STRAND_WEIGHT: f64 = 1.0;
/// Weight of the best-fit term, as a share of one card per node's worth of capacity left.
const BESTFIT_WEIGHT: f64 = 1e-3;

/// Hash of everything a node's score depends on.
fn node_signature(n: &CapNode) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = crate::fasthash::Fx::default();
    (n.schedulable, n.cpu_free, n.mem_free, n.cpu_total).hash(&mut h);
    for g in &n.gpus {
        (g.type_id, g.capacity, g.free).hash(&mut h);
    }
    h.finish()
}

/// The GPU set still fits this node for this need.
fn choice_valid(n: &CapNode, need: &WorkerNeed, mask: u64) -> bool {
    let mut k = 0;
    for (i, g) in n.gpus.iter().enumerate().take(64) {
        if mask & (1 << i) != 0 {
            if !need.types.contains(g.type_id) || !g.fits(need.demand) {
                return false;
            }
            k += 1;
        }
    }
    k == need.gpus && (n.gpus.len() >= 64 || mask >> n.gpus.len() == 0)
}

/// The GPU positions a choice's mask names, in order.
fn mask_positions(mask: u64) -> Vec<usize> {
    (0..64).filter(|b| mask & (1u64 << b) != 0).collect()
}

fn take_sum(n: &CapNode, mask: u64, d: GpuDemand) -> u64 {
    n.gpus
        .iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(_, g)| g.take(d))
        .sum()
}

/// The distinct ways to put the worker's GPUs on this node. For one shared GPU every distinct
/// free level is a candidate (choosing which card to share is where fragmentation is decided);
/// for several GPUs the tightest-fitting cards are taken.
fn candidate_gpu_sets(n: &CapNode, need: &WorkerNeed) -> Vec<u64> {
    if need.gpus == 0 {
        return vec![0];
    }
    let mut fitting: Vec<usize> = (0..n.gpus.len().min(64))
        .filter(|&i| need.types.contains(n.gpus[i].type_id) && n.gpus[i].fits(need.demand))
        .collect();
    if need.gpus == 1 {
        let mut seen: Vec<(u16, u64)> = Vec::new();
        let mut out = Vec::new();
        for i in fitting {
            let key = (n.gpus[i].type_id, n.gpus[i].free);
            if !seen.contains(&key) {
                seen.push(key);
                out.push(1u64 << i);
            }
        }
        return out;
    }
    fitting.sort_by_key(|&i| (n.gpus[i].free, i));
    vec![fitting
        .iter()
        .take(need.gpus as usize)
        .fold(0u64, |m, &i| m | (1 << i))]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Gpu;
    use rand::SeedableRng;

    proptest::proptest! {
        /// A coarse demand is a safe filter: any card, of any size and in any state, that fits
        /// a demand also fits its coarse form, which is never larger.
        #[test]
        fn a_card_that_fits_a_demand_fits_its_coarse_form(
            m in 0u64..(1 << 40),
            capacity in 1u64..(1 << 40),
            used in 0u64..(1 << 40),
            whole in proptest::bool::ANY,
        ) {
            let d = if whole { GpuDemand::Whole } else { GpuDemand::Share(m) };
            let gpu = CapGpu { index: 0, type_id: 0, capacity, free: capacity.saturating_sub(used) };
            let coarse = d.coarse_below();
            proptest::prop_assert!(!gpu.fits(d) || gpu.fits(coarse), "{d:?} -> {coarse:?} on {gpu:?}");
            if let (GpuDemand::Share(a), GpuDemand::Share(b)) = (d, coarse) {
                proptest::prop_assert!(b <= a && b * 9 >= a * 8, "{a} -> {b}");
            }
        }
    }

    fn node(id: &str, gpus: u32, ty: &str) -> Node {
        Node {
            id: id.into(),
            zone: String::new(),
            labels: Default::default(),
            cpu_millis: 64_000,
            mem_bytes: 256 << 30,
            gpus: (0..gpus)
                .map(|i| Gpu {
                    index: i,
                    gpu_type: ty.into(),
                    mem_bytes: 1000,
                    util: 0.0,
                })
                .collect(),
            schedulable: true,
            taints: vec![],
            features: vec![],
            own_network: false,
        }
    }

    #[test]
    fn shared_gpu_never_exceeds_memory() {
        let nodes = vec![node("a", 1, "T4")];
        let mut cap = Capacity::new(&nodes, &[], 0);
        let mask = cap.type_mask(&[]);
        let need = WorkerNeed {
            gpus: 1,
            demand: GpuDemand::Share(400),
            cpu_millis: 1,
            mem_bytes: 1,
            types: mask,
            classes: cap.class_mask(&[], &[]),
        };
        let mut placer = Placer::new(PlacementPolicy::Autodl, FragModel::default());
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        assert!(placer
            .place_worker(&mut cap, &need, &|_| true, &mut rng)
            .is_some());
        assert!(placer
            .place_worker(&mut cap, &need, &|_| true, &mut rng)
            .is_some());
        assert!(placer
            .place_worker(&mut cap, &need, &|_| true, &mut rng)
            .is_none());
        assert_eq!(cap.nodes[0].gpus[0].free, 200);
    }

    /// The paper's model keeps CPU-only tasks: taking the CPU they need strands the node's idle
    /// GPUs for them, which the fragmentation FGD minimises has to show.
    #[test]
    fn paper_model_charges_cpu_only_tasks_for_exhausted_cpu() {
        let nodes = vec![node("a", 2, "T4")];
        let mut cap = Capacity::new(&nodes, &[], 0);
        let cpu_only = WorkerNeed {
            gpus: 0,
            demand: GpuDemand::Share(0),
            cpu_millis: 8_000,
            mem_bytes: 0,
            types: cap.type_mask(&[]),
            classes: cap.class_mask(&[], &[]),
        };
        let paper = FragModel::paper(vec![(cpu_only.clone(), 1.0)], 0.95);
        assert_eq!(paper.node_frag(&cap.nodes[0]), 0.0);
        let ours = FragModel::from_counts(vec![(cpu_only, 1.0)], 0.95, 64, 1000);
        assert!(ours.shapes.is_empty());
        cap.nodes[0].cpu_free = 4_000;
        assert_eq!(paper.node_frag(&cap.nodes[0]), 2000.0);
    }
}
