//! Elastic tasks growing: once the walk has left nobody waiting for room, a running elastic task
//! below its width is stopped (through its grace period, with a checkpoint) to start again wider
//! in the GPUs that are idle. Shrinking is the other half and lives with preemption
//! ([`Cycle::preempt_for`]'s victims): an elastic victim is resized, not preempted.
//!
//! A change of width costs a restart, so the rule guards against thrashing twice: no task grows
//! within [`PolicyConfig::resize_interval_s`] of its last start, and none grows unless the time
//! it is expected to save is at least twice what the restart costs.
//!
//! [`PolicyConfig::resize_interval_s`]: crate::config::PolicyConfig::resize_interval_s

use super::walk::{count, uncount, InUse};
use super::{worker_need, Cycle, Decision, Decisions, Masks, ResizeReason};
use crate::types::RunningTask;

impl<'a> Cycle<'a> {
    /// Grows running elastic tasks into idle GPUs, highest priority first (ties by id, so the
    /// server and the simulator agree whatever order they list runs in). Called after the
    /// walk, and only when no pending task is left waiting for room: a waiting task of any
    /// priority has the first claim on what is free.
    pub(super) fn grow(&mut self, in_use: &mut InUse<'a>, out: &mut Decisions) {
        let (cfg, state, now) = (self.cfg, self.state, self.now);
        if !cfg.elastic_growth {
            return;
        }
        let mut cands: Vec<(f64, usize)> = Vec::new();
        for (v, r) in state.running.iter().enumerate() {
            let width = r.placements.len() as u32;
            if !r.request.is_elastic()
                || width >= r.request.workers
                || r.preempting
                || self.taken.contains(&v)
                || now.saturating_sub(r.started_at) < cfg.resize_interval_s
            {
                continue;
            }
            cands.push((self.running_priority(v).total, v));
        }
        cands.sort_by(|a, b| {
            b.0.total_cmp(&a.0).then_with(|| {
                let (x, y) = (&state.running[a.1].request, &state.running[b.1].request);
                x.id.cmp(&y.id)
            })
        });
        for (_, v) in cands {
            self.grow_one(v, in_use, out);
        }
    }

    /// Grows one running task as wide as the idle GPUs (and its own) allow, if that is worth
    /// a restart. The new placement stays taken in the cycle's capacity, so a later growth in
    /// the same cycle sees the GPUs as this task will hold them.
    fn grow_one(&mut self, v: usize, in_use: &mut InUse<'a>, out: &mut Decisions) {
        let (cfg, state, now) = (self.cfg, self.state, self.now);
        let r: &'a RunningTask = &state.running[v];
        let t = &r.request;
        let width = r.placements.len() as u32;
        let held = r.held_gpus();
        // What a restart costs: the work since the checkpoint, done again, and the restart.
        let cost = now.saturating_sub(r.saved_at()) as f64 + cfg.resize_cost_s as f64;
        // How much longer the run has to go: the time it has run so far (a run that has lasted
        // long is likely to last as long again), or what is left of its estimate at this width.
        let ran = now.saturating_sub(r.started_at) as f64;
        let left = match t.estimated_runtime {
            Some(est) => {
                let at_width = est as f64 * f64::from(t.workers) / f64::from(width.max(1));
                (at_width - ran).max(0.0)
            }
            None => ran,
        };
        let own = self.cap.allocs_of(r, cfg.share_margin_bytes);
        for a in &own {
            self.cap.release(a);
        }
        let mut masks = Masks::default();
        let need = worker_need(
            &self.cap,
            t,
            self.allowed_types(t),
            cfg.share_margin_bytes,
            &self.largest_card,
            &mut masks,
        );
        uncount(in_use, t, held);
        let mut grown = None;
        for w in (width + 1..=t.workers).rev() {
            // Linear speed-up: the rest of the run goes `w / width` times as fast.
            let saved = left * (1.0 - f64::from(width) / f64::from(w));
            if saved < 2.0 * cost {
                // A narrower growth saves less still.
                break;
            }
            let at = t.at_width(w);
            if self.quota_block(&at, in_use).is_some() {
                continue;
            }
            if self.place_gang(&at, &need, true).is_some() {
                grown = Some((at.total_gpus(), w, saved));
                break;
            }
        }
        let Some((gpus, to_workers, seconds_saved)) = grown else {
            count(in_use, t, held);
            for a in own.iter().rev() {
                self.cap.apply(a);
            }
            return;
        };
        count(in_use, t, gpus);
        self.taken.insert(v);
        out.decisions.push(Decision::Resize {
            task: t.id.clone(),
            grace_s: cfg.grace_s,
            reason: ResizeReason::Grow {
                from_workers: width,
                to_workers,
                seconds_saved,
                cost_s: cost,
            },
        });
    }
}
