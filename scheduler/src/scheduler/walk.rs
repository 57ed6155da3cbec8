//! One cycle's walk down the queue: each pending task, in priority order, is placed, or makes
//! room by preemption or migration, or waits (holding a reservation, or explained). What the
//! walk learns on the way (shapes that cannot be placed this cycle, the bounds on preemption
//! and migration, the task that blocks those behind it) is a [`Walk`]; each way a task can go
//! is a step of its own.

use super::{
    worker_need, Cycle, Decision, Decisions, FitIndex, Futile, Hardness, Masks, Order,
    PendingReason, PendingTask, PreemptReason, QueueKey, QuotaScope, ResizeReason, ShapeClasses,
    ShapeKey, WorkerNeed,
};
use crate::config::Backfill;
use crate::fasthash::{FastMap, FastSet};
use crate::priority::PriorityBreakdown;
use crate::types::{TaskId, TaskRequest};

/// What the pending tasks need: the worker need of each distinct request shape (identical
/// requests share one, computed once: queues are long but have few distinct shapes), each
/// task's shape, and each task's priority.
struct Needs {
    shapes: Vec<WorkerNeed>,
    of: Vec<usize>,
    prios: Vec<PriorityBreakdown>,
}

/// What the walk has learnt so far in this cycle. Capacity only shrinks within a cycle, so a
/// shape that failed to be placed (or to make room) fails again; the counters bound the work
/// of preemption and migration; `blocked_by` is the first task that waits for room, which
/// those behind it pass only with backfill.
#[derive(Default)]
struct Walk<'a> {
    /// GPUs in use per user and tenant, for the concurrent-GPU caps.
    in_use: InUse<'a>,
    failed: FastSet<ShapeKey>,
    preempt_failed: FastSet<ShapeKey>,
    migrate_failed: FastSet<ShapeKey>,
    place_futile: Futile,
    preempt_futile: Futile,
    /// Requests that fit on no node even ignoring reservations (for explanations).
    unfit: Futile,
    classes: ShapeClasses,
    fits_memo: FastMap<ShapeKey, bool>,
    blocked_by: Option<&'a TaskId>,
    reserved: usize,
    preemptions: usize,
    preemption_attempts: usize,
    migration_attempts: usize,
    /// No GPU is free any more (victims chosen this cycle may free some again).
    cluster_full: bool,
    /// A pending task is left waiting for room (not for a cap): idle GPUs are its, not
    /// elastic tasks' to grow into.
    someone_waits: bool,
}

/// GPUs in use per user and tenant, for the concurrent-GPU caps.
pub(super) type InUse<'a> = FastMap<(QuotaScope, &'a str), u32>;

/// Counts `gpus` of `t`'s against its user's and its tenant's concurrent-GPU caps.
pub(super) fn count<'a>(in_use: &mut InUse<'a>, t: &'a TaskRequest, gpus: u32) {
    *in_use
        .entry((QuotaScope::User, t.user.as_str()))
        .or_default() += gpus;
    *in_use
        .entry((QuotaScope::Tenant, t.tenant.as_str()))
        .or_default() += gpus;
}

/// Takes back `gpus` of `t`'s that [`count`] counted (a run about to change width).
pub(super) fn uncount<'a>(in_use: &mut InUse<'a>, t: &'a TaskRequest, gpus: u32) {
    for key in [
        (QuotaScope::User, t.user.as_str()),
        (QuotaScope::Tenant, t.tenant.as_str()),
    ] {
        if let Some(n) = in_use.get_mut(&key) {
            *n = n.saturating_sub(gpus);
        }
    }
}

/// The pending task the walk is at (an elastic one at one of its widths).
#[derive(Clone, Copy)]
struct Turn<'a, 'n> {
    t: &'a TaskRequest,
    /// Its index in the queue.
    idx: usize,
    position: usize,
    prio: PriorityBreakdown,
    need: &'n WorkerNeed,
    key: ShapeKey,
}

impl<'a, 'n> Turn<'a, 'n> {
    /// The same turn for `t`, the task at another of its widths.
    fn at(self, t: &'a TaskRequest) -> Turn<'a, 'n> {
        Turn {
            t,
            key: (self.key.0, t.workers, t.zone_affinity),
            ..self
        }
    }

    /// Says why the task waits, when the cycle explains every waiting task.
    fn pend(&self, explain: bool, reason: PendingReason, out: &mut Decisions) {
        if explain {
            out.pending.push(PendingTask {
                task: self.t.id.clone(),
                position: self.position,
                reason,
                priority: self.prio,
            });
        }
    }
}

impl<'a> Cycle<'a> {
    pub(super) fn run(&mut self) -> Decisions {
        let (state, cfg) = (self.state, self.cfg);
        let mut out = Decisions::default();
        let needs = self.needs();
        let has_shared = state
            .running
            .iter()
            .any(|r| r.request.gpu_mem_bytes.is_some());
        let order = self.queue_order(&needs.prios, has_shared);
        let needs_gpu_only = state.pending.iter().all(|t| t.total_gpus() > 0);
        let mut walk = Walk {
            in_use: self.gpus_in_use(),
            ..Walk::default()
        };
        for (position, QueueKey { idx: i, .. }) in order.enumerate() {
            if !self.explain && position > 0 {
                let strict_blocked = cfg.backfill == Backfill::None && walk.blocked_by.is_some();
                let nothing_can_change = needs_gpu_only
                    && !walk.failed.is_empty()
                    && (!cfg.preemption || walk.preemptions >= cfg.max_preemptions_per_cycle)
                    && !has_shared
                    && walk.cluster_full;
                if strict_blocked || nothing_can_change {
                    walk.someone_waits = true;
                    break;
                }
            }
            let t = &state.pending[i];
            let need = &needs.shapes[needs.of[i]];
            let key: ShapeKey = (needs.of[i], t.workers.max(1), t.zone_affinity);
            let turn = Turn {
                t,
                idx: i,
                position,
                prio: needs.prios[i],
                need,
                key,
            };
            self.consider(turn, has_shared, &mut walk, &mut out);
        }
        if !walk.someone_waits {
            self.grow(&mut walk.in_use, &mut out);
        }
        out
    }

    fn needs(&self) -> Needs {
        let (state, cfg) = (self.state, self.cfg);
        type Sig<'s> = (
            &'s [String],
            Option<&'s [String]>,
            Option<u64>,
            u32,
            u64,
            u64,
            (&'s [String], &'s [String]),
        );
        let mut sig_ids: FastMap<Sig<'_>, usize> =
            FastMap::with_capacity_and_hasher(state.pending.len(), Default::default());
        let mut shapes: Vec<WorkerNeed> = Vec::new();
        let mut masks = Masks::default();
        let of: Vec<usize> = state
            .pending
            .iter()
            .map(|t| {
                let allowed = self.allowed_types(t);
                let sig = (
                    t.gpu_types.as_slice(),
                    allowed,
                    t.gpu_mem_bytes,
                    t.gpus_per_worker,
                    t.cpu_millis,
                    t.mem_bytes,
                    (t.tolerations.as_slice(), t.requires.as_slice()),
                );
                *sig_ids.entry(sig).or_insert_with(|| {
                    shapes.push(worker_need(
                        &self.cap,
                        t,
                        allowed,
                        cfg.share_margin_bytes,
                        &self.largest_card,
                        &mut masks,
                    ));
                    shapes.len() - 1
                })
            })
            .collect();
        let fit_index = FitIndex::new(&self.cap);
        let prios = state
            .pending
            .iter()
            .zip(&of)
            .map(|(t, &n)| {
                let fit = if cfg.weights.gpu_fit > 0.0 {
                    fit_index.fit(&shapes[n], t.total_gpus())
                } else {
                    0.0
                };
                self.ctx.pending(t, fit, cfg)
            })
            .collect();
        Needs { shapes, of, prios }
    }

    /// The queue in priority order. A cycle that may stop early (strict FIFO blocked, or a
    /// full cluster) pops the queue lazily from a heap and does not pay for sorting all of
    /// it. One that will walk all of it, to explain it or because shared cards let a small
    /// task fit until the end, sorts it at once: the same order, for a fraction of the cost of
    /// as many pops.
    fn queue_order(&self, prios: &[PriorityBreakdown], has_shared: bool) -> Order<'a> {
        let keys = self
            .state
            .pending
            .iter()
            .enumerate()
            .map(|(i, t)| QueueKey {
                total: prios[i].total,
                submitted_at: t.submitted_at,
                id: &t.id,
                idx: i,
            });
        let walks_all = self.explain || (has_shared && self.cfg.backfill != Backfill::None);
        if walks_all {
            let mut v: Vec<QueueKey<'a>> = keys.collect();
            v.sort_unstable_by(|a, b| b.cmp(a));
            Order::Sorted(v.into_iter())
        } else {
            Order::Lazy(keys.collect())
        }
    }

    /// GPUs the running tasks hold per user and tenant, where any concurrent-GPU cap is set.
    fn gpus_in_use(&self) -> InUse<'a> {
        let state = self.state;
        let mut in_use = InUse::default();
        let has_caps = state
            .quotas
            .tenants
            .values()
            .chain(state.quotas.users.values())
            .any(|q| q.max_gpus.is_some());
        for r in state.running.iter().filter(|_| has_caps) {
            count(&mut in_use, &r.request, r.held_gpus());
        }
        in_use
    }

    /// One pending task: placed, or room made for it, or it waits.
    fn consider(
        &mut self,
        turn: Turn<'a, '_>,
        has_shared: bool,
        walk: &mut Walk<'a>,
        out: &mut Decisions,
    ) {
        let (t, need, key) = (turn.t, turn.need, turn.key);
        // An elastic task is held back by a cap only if its narrowest start is.
        if let Some(q) = self.quota_block(self.narrowest(turn).t, &walk.in_use) {
            turn.pend(self.explain, q, out);
            return;
        }
        if need.types.is_empty_mask() && need.gpus > 0 {
            let waiting_for = self.describe_cached(key, t, need);
            turn.pend(self.explain, PendingReason::NoFit { waiting_for }, out);
            return;
        }
        if let (Backfill::None, Some(b)) = (self.cfg.backfill, walk.blocked_by) {
            let reason = PendingReason::BehindHigherPriority {
                position: turn.position,
                blocked_by: b.clone(),
            };
            walk.someone_waits = true;
            turn.pend(self.explain, reason, out);
            return;
        }
        let hard = walk.classes.hardness(key, need, t, turn.prio.total);
        if self.place(turn, hard, walk, out) {
            return;
        }
        // An elastic task that fits at none of its widths makes room for its narrowest start,
        // and waits as it.
        let narrow = self.narrowest(turn);
        let hard = if narrow.key == key {
            hard
        } else {
            walk.classes
                .hardness(narrow.key, need, narrow.t, turn.prio.total)
        };
        if self.preempt_for(narrow, hard, walk, out)
            || self.migrate_for(narrow, has_shared, walk, out)
        {
            walk.someone_waits = true;
            return;
        }
        self.wait(narrow, hard, walk, out);
    }

    /// The task at its narrowest width (itself unless it is elastic).
    fn narrowest<'n>(&self, turn: Turn<'a, 'n>) -> Turn<'a, 'n> {
        match self.narrower.get(&turn.idx).and_then(|v| v.last()) {
            Some(t) => turn.at(t),
            None => turn,
        }
    }

    /// Places the task if it fits now: with all of its workers, or an elastic task with as
    /// many as fit down to its narrowest (widest first, so it starts as wide as it can).
    fn place(
        &mut self,
        turn: Turn<'a, '_>,
        hard: Hardness,
        walk: &mut Walk<'a>,
        out: &mut Decisions,
    ) -> bool {
        let Some(narrower) = self.narrower.get(&turn.idx) else {
            return self.place_at(turn, hard, walk, out);
        };
        let widths = std::iter::once(turn.t).chain(narrower.iter());
        for t in widths {
            let at = turn.at(t);
            // Its caps were checked at its narrowest: a wider start must keep within them.
            if self.quota_block(t, &walk.in_use).is_some() {
                continue;
            }
            let hard = if at.key == turn.key {
                hard
            } else {
                walk.classes.hardness(at.key, at.need, t, turn.prio.total)
            };
            if self.place_at(at, hard, walk, out) {
                return true;
            }
        }
        false
    }

    /// Places the task at its width if it fits now.
    fn place_at(
        &mut self,
        turn: Turn<'a, '_>,
        hard: Hardness,
        walk: &mut Walk<'a>,
        out: &mut Decisions,
    ) -> bool {
        let (t, need, key) = (turn.t, turn.need, turn.key);
        if walk.failed.contains(&key) || (self.prune && walk.place_futile.proves(&hard)) {
            walk.failed.insert(key);
            return false;
        }
        let somewhere = !self.prune || self.any_node_fits(need);
        if let Some(allocs) = somewhere.then(|| self.place_gang(t, need, true)).flatten() {
            let placements = self.to_placements(&allocs);
            count(&mut walk.in_use, t, t.total_gpus());
            out.decisions.push(Decision::Place {
                task: t.id.clone(),
                placements,
                priority: turn.prio,
            });
            return true;
        }
        walk.failed.insert(key);
        walk.place_futile.note(hard);
        // Capacity only shrinks within a cycle, so once no GPU is free none will be.
        walk.cluster_full = walk.cluster_full || self.cap.total_gpu_free() == 0;
        false
    }

    /// Preempts lower-priority tasks to make room, within the cycle's bounds.
    fn preempt_for(
        &mut self,
        turn: Turn<'a, '_>,
        hard: Hardness,
        walk: &mut Walk<'a>,
        out: &mut Decisions,
    ) -> bool {
        let (cfg, state) = (self.cfg, self.state);
        let (t, need, key) = (turn.t, turn.need, turn.key);
        if self.prune && !walk.preempt_failed.contains(&key) && walk.preempt_futile.proves(&hard) {
            walk.preempt_failed.insert(key);
        }
        if !cfg.preemption
            || walk.preemptions >= cfg.max_preemptions_per_cycle
            || walk.preemption_attempts >= cfg.max_preemption_attempts_per_cycle
            || walk.preempt_failed.contains(&key)
        {
            return false;
        }
        walk.preemption_attempts += 1;
        let priority = turn.prio.total;
        let victims = match self.one_type_needs(t, need) {
            Some(needs) => needs.iter().find_map(|n| self.try_preempt(t, n, priority)),
            None => self.try_preempt(t, need, priority),
        };
        let Some(victims) = victims else {
            walk.preempt_failed.insert(key);
            walk.preempt_futile.note(hard);
            return false;
        };
        let mut names = Vec::new();
        for (v, lost) in victims {
            let r = &state.running[v];
            names.push(r.request.id.clone());
            if !r.preempting {
                walk.preemptions += 1;
                let preempt = PreemptReason {
                    for_task: t.id.clone(),
                    preemptor_priority: priority,
                    victim_priority: self.running_priority(v).total,
                    lost_gpu_seconds: lost,
                };
                let (width, min_workers) = (r.placements.len() as u32, r.request.narrowest());
                // An elastic victim above its minimum gives up workers rather than its place:
                // it restarts at once with what the preemptor leaves.
                let decision = if r.request.is_elastic() && width > min_workers {
                    Decision::Resize {
                        task: r.request.id.clone(),
                        grace_s: cfg.grace_s,
                        reason: ResizeReason::Shrink {
                            from_workers: width,
                            min_workers,
                            preempt,
                        },
                    }
                } else {
                    Decision::Preempt {
                        task: r.request.id.clone(),
                        grace_s: cfg.grace_s,
                        reason: preempt,
                    }
                };
                out.decisions.push(decision);
            }
        }
        // Victims may free more than the preemptor takes.
        walk.cluster_full = false;
        let reason = PendingReason::WaitingForPreemption { victims: names };
        turn.pend(self.explain, reason, out);
        true
    }

    /// Moves shared tasks to other cards to make room for a single worker. Not pruned by
    /// hardness: a lower priority may move fewer tasks and so succeed where a higher one
    /// failed. Its attempts are bounded per cycle instead.
    fn migrate_for(
        &mut self,
        turn: Turn<'a, '_>,
        has_shared: bool,
        walk: &mut Walk<'a>,
        out: &mut Decisions,
    ) -> bool {
        let (cfg, state) = (self.cfg, self.state);
        let (t, need, key) = (turn.t, turn.need, turn.key);
        if !cfg.migration
            || walk.migration_attempts >= cfg.max_migration_attempts_per_cycle
            || t.workers > 1
            || need.gpus == 0
            || !has_shared
            || walk.migrate_failed.contains(&key)
        {
            return false;
        }
        walk.migration_attempts += 1;
        let Some(moves) = self.try_migrate(t, need, turn.prio.total) else {
            walk.migrate_failed.insert(key);
            return false;
        };
        let mut names = Vec::new();
        for (v, to) in moves {
            let r = &state.running[v];
            names.push(r.request.id.clone());
            out.decisions.push(Decision::Migrate {
                task: r.request.id.clone(),
                from: r.placements.clone(),
                to,
                for_task: t.id.clone(),
            });
        }
        let reason = PendingReason::WaitingForMigration { tasks: names };
        turn.pend(self.explain, reason, out);
        true
    }

    /// The task waits: it blocks those behind it (strict order), or holds a reservation
    /// (backfill with reservations), or is passed and, when the cycle explains, told why.
    fn wait(
        &mut self,
        turn: Turn<'a, '_>,
        hard: Hardness,
        walk: &mut Walk<'a>,
        out: &mut Decisions,
    ) {
        let cfg = self.cfg;
        let (t, need, key) = (turn.t, turn.need, turn.key);
        let explain = self.explain;
        match cfg.backfill {
            Backfill::None => {
                walk.blocked_by = Some(&t.id);
                let waiting_for = if explain {
                    self.describe_cached(key, t, need)
                } else {
                    String::new()
                };
                turn.pend(explain, PendingReason::NoFit { waiting_for }, out);
            }
            Backfill::Reserve if walk.reserved < cfg.reservations => {
                walk.reserved += 1;
                walk.blocked_by.get_or_insert(&t.id);
                // A gang of several acceptable types holds nodes of the type with the most
                // cards that fit.
                let nodes = match self.one_type_needs(t, need) {
                    Some(needs) => self.reserve(t, &needs[0]),
                    None => self.reserve(t, need),
                };
                let waiting_for = if explain {
                    self.describe_cached(key, t, need)
                } else {
                    String::new()
                };
                let reason = PendingReason::Reserved { nodes, waiting_for };
                turn.pend(explain, reason, out);
            }
            _ => {
                if !explain {
                    return;
                }
                let fits = match walk.fits_memo.get(&key) {
                    Some(&f) => f,
                    None if walk.blocked_by.is_none() => false,
                    None => {
                        let f = !(self.prune && walk.unfit.proves(&hard))
                            && self.fits_ignoring_reservations(t, need);
                        if !f {
                            walk.unfit.note(hard);
                        }
                        walk.fits_memo.insert(key, f);
                        f
                    }
                };
                let reason = match walk.blocked_by {
                    Some(b) if fits => PendingReason::BehindHigherPriority {
                        position: turn.position,
                        blocked_by: b.clone(),
                    },
                    _ => PendingReason::NoFit {
                        waiting_for: self.describe_cached(key, t, need),
                    },
                };
                turn.pend(explain, reason, out);
            }
        }
    }
}
