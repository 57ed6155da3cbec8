//! Priority factors. Each is in [0, 1] and kept separately in a [`PriorityBreakdown`], so a user
//! can be shown why a task is where it is in the queue.

use crate::config::PolicyConfig;
use crate::fasthash::{FastMap, FastSet};
use crate::types::{ClusterState, RunningTask, TaskRequest, Time};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The factors behind a task's priority and their weighted, normalised total.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct PriorityBreakdown {
    pub fair_share: f64,
    pub utilization: f64,
    pub deadline: f64,
    pub declared: f64,
    pub age: f64,
    pub gpu_fit: f64,
    pub service: f64,
    pub total: f64,
}

/// Per-cycle values shared by all tasks: fair-share and utilisation are per user, so they are
/// computed once per user, not once per task.
#[derive(Debug, Clone)]
pub struct PriorityContext {
    now: Time,
    fair_share: FastMap<String, f64>,
    utilization: FastMap<String, f64>,
}

impl PriorityContext {
    /// Fair-share in the spirit of Slurm's Fair Tree: first tenants against their shares, then
    /// users against their split of the tenant's share. A party at exactly its share gets 0.5,
    /// one that used nothing gets 1, and it halves for every further share's worth of use.
    /// Only active users (pending or running work) compete, so idle users do not dilute shares.
    pub fn new(state: &ClusterState, now: Time, cfg: &PolicyConfig) -> PriorityContext {
        if cfg.weights.fair_share == 0.0 && cfg.weights.utilization == 0.0 {
            // Neither per-user factor counts: skip the pass over every task.
            return PriorityContext {
                now,
                fair_share: FastMap::default(),
                utilization: FastMap::default(),
            };
        }
        let hl = cfg.usage_half_life_s;
        // tenant -> users (active)
        let mut tenants: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        let mut seen: FastSet<(&str, &str)> = FastSet::default();
        let tasks = state
            .pending
            .iter()
            .chain(state.running.iter().map(|r| &r.request));
        for t in tasks {
            if seen.insert((t.tenant.as_str(), t.user.as_str())) {
                tenants
                    .entry(t.tenant.as_str())
                    .or_default()
                    .push(t.user.as_str());
            }
        }
        let share_of =
            |q: Option<&crate::types::Quota>| q.and_then(|q| q.share).unwrap_or(1.0).max(1e-9);
        let tenant_share_sum: f64 = tenants
            .keys()
            .map(|t| share_of(state.quotas.tenants.get(*t)))
            .sum();
        let tenant_usage: Vec<f64> = tenants
            .keys()
            .map(|t| state.usage.tenant_usage(t, now, hl))
            .collect();
        let tenant_usage_sum: f64 = tenant_usage.iter().sum();
        let mut fair_share = FastMap::default();
        let mut utilization = FastMap::default();
        for ((tenant, users), t_usage) in tenants.iter().zip(&tenant_usage) {
            let s_t = share_of(state.quotas.tenants.get(*tenant)) / tenant_share_sum;
            let u_t = if tenant_usage_sum > 0.0 {
                t_usage / tenant_usage_sum
            } else {
                0.0
            };
            let f_t = 0.5f64.powf(u_t / s_t);
            let shares: Vec<f64> = users
                .iter()
                .map(|u| share_of(state.quotas.users.get(*u)))
                .collect();
            let share_sum: f64 = shares.iter().sum();
            let usages: Vec<f64> = users
                .iter()
                .map(|u| state.usage.user_usage(u, now, hl))
                .collect();
            let usage_sum: f64 = usages.iter().sum();
            for ((u, s), us) in users.iter().zip(&shares).zip(&usages) {
                let u_u = if usage_sum > 0.0 { us / usage_sum } else { 0.0 };
                let f_u = 0.5f64.powf(u_u / (s / share_sum));
                // With one tenant the tenant level is a constant; with several it dominates,
                // which is the Fair Tree property: a tenant's users cannot outrank another
                // tenant by splitting into many accounts.
                let f = if tenants.len() > 1 {
                    0.6 * f_t + 0.4 * f_u
                } else {
                    f_u
                };
                fair_share.insert(u.to_string(), f);
                let util = state.usage.users.get(*u).map_or(1.0, |x| {
                    x.utilization(now, cfg.util_window_s, cfg.util_prior_gpu_s)
                });
                utilization.insert(u.to_string(), util.clamp(0.0, 1.0));
            }
        }
        PriorityContext {
            now,
            fair_share,
            utilization,
        }
    }

    /// Each competing user's fair-share factor (1: used nothing lately, 0.5: at their share,
    /// halving with each further share's worth) and utilization factor, as this cycle ranks
    /// them: what operators and users see as a person's standing over time.
    pub fn standings(&self) -> Vec<(String, f64, f64)> {
        let mut out: Vec<(String, f64, f64)> = self
            .fair_share
            .iter()
            .map(|(u, f)| {
                let util = self.utilization.get(u).copied().unwrap_or(1.0);
                (u.clone(), *f, util)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Priority of a task that waits. `gpu_fit` comes from the placement side.
    pub fn pending(&self, t: &TaskRequest, gpu_fit: f64, cfg: &PolicyConfig) -> PriorityBreakdown {
        self.breakdown(t, t.attained_gpu_seconds, 0, gpu_fit, cfg)
    }

    /// Priority of a running task, for comparing against a would-be preemptor. Its service
    /// factor counts the current run, and it fits by definition.
    pub fn running(&self, r: &RunningTask, cfg: &PolicyConfig) -> PriorityBreakdown {
        let ran = self.now.saturating_sub(r.started_at);
        let attained = r.request.attained_gpu_seconds + ran as f64 * f64::from(r.held_gpus());
        self.breakdown(&r.request, attained, ran, 1.0, cfg)
    }

    fn breakdown(
        &self,
        t: &TaskRequest,
        attained: f64,
        ran_s: u64,
        gpu_fit: f64,
        cfg: &PolicyConfig,
    ) -> PriorityBreakdown {
        let w = &cfg.weights;
        let fair_share = self.fair_share.get(&t.user).copied().unwrap_or(1.0);
        let utilization = self.utilization.get(&t.user).copied().unwrap_or(1.0);
        let deadline = deadline_urgency(t, self.now, ran_s, cfg.default_runtime_s);
        let declared = t.priority.clamp(0.0, 1.0);
        let wait = self.now.saturating_sub(t.submitted_at) as f64;
        let age = if cfg.max_age_s > 0.0 {
            (wait / cfg.max_age_s).min(1.0)
        } else {
            1.0
        };
        let service = service_factor(attained, cfg.service_scale_gpu_s);
        let sum = w.sum();
        let total = if sum > 0.0 {
            (w.fair_share * fair_share
                + w.utilization * utilization
                + w.deadline * deadline
                + w.declared * declared
                + w.age * age
                + w.gpu_fit * gpu_fit
                + w.service * service)
                / sum
        } else {
            0.0
        };
        PriorityBreakdown {
            fair_share,
            utilization,
            deadline,
            declared,
            age,
            gpu_fit,
            service,
            total,
        }
    }
}

/// Rises from 0 toward 1 as the time left before the deadline shrinks to the time the task still
/// needs; 1 once it can only just make it (or cannot).
pub fn deadline_urgency(t: &TaskRequest, now: Time, ran_s: u64, default_runtime_s: u64) -> f64 {
    let Some(deadline) = t.deadline else {
        return 0.0;
    };
    let need = t
        .estimated_runtime
        .unwrap_or(default_runtime_s)
        .saturating_sub(ran_s)
        .max(1) as f64;
    let left = deadline.saturating_sub(now) as f64;
    if left <= need {
        1.0
    } else {
        need / left
    }
}

/// 1 for a task that has had no GPU time, one half at `scale` GPU-seconds, falling off on a log
/// scale so that a day-long job and a week-long job still differ.
pub fn service_factor(attained_gpu_s: f64, scale: f64) -> f64 {
    if scale <= 0.0 {
        return 1.0;
    }
    1.0 / (1.0 + (1.0 + attained_gpu_s.max(0.0) / scale).log2())
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn task(id: &str, user: &str, submitted_at: Time) -> TaskRequest {
        TaskRequest {
            id: id.into(),
            user: user.into(),
            tenant: "t".into(),
            gpu_types: vec![],
            gpus_per_worker: 1,
            workers: 1,
            min_workers: None,
            gpu_mem_bytes: None,
            cpu_millis: 0,
            mem_bytes: 0,
            priority: 0.5,
            deadline: None,
            submitted_at,
            estimated_runtime: None,
            preemptible: true,
            zone_affinity: false,
            attained_gpu_seconds: 0.0,
            tolerations: vec![],
            requires: vec![],
        }
    }

    fn state(tasks: Vec<TaskRequest>) -> ClusterState {
        ClusterState {
            pending: tasks,
            ..Default::default()
        }
    }

    #[test]
    fn heavy_user_gets_lower_fair_share() {
        let cfg = PolicyConfig::default();
        let mut s = state(vec![task("a", "heavy", 0), task("b", "light", 0)]);
        s.usage.charge(
            "heavy",
            "t",
            1e6,
            Some(1.0),
            0,
            cfg.usage_half_life_s,
            86_400,
        );
        s.usage.charge(
            "light",
            "t",
            1e3,
            Some(1.0),
            0,
            cfg.usage_half_life_s,
            86_400,
        );
        let ctx = PriorityContext::new(&s, 10, &cfg);
        let h = ctx.pending(&s.pending[0], 1.0, &cfg);
        let l = ctx.pending(&s.pending[1], 1.0, &cfg);
        assert!(l.fair_share > h.fair_share);
        assert!(l.total > h.total);
    }

    #[test]
    fn standings_are_the_factors_tasks_are_ranked_by() {
        let cfg = PolicyConfig::default();
        let mut s = state(vec![task("a", "heavy", 0), task("b", "light", 0)]);
        let hl = cfg.usage_half_life_s;
        s.usage.charge("heavy", "t", 1e6, Some(0.4), 0, hl, 86_400);
        let ctx = PriorityContext::new(&s, 10, &cfg);
        let standings = ctx.standings();
        assert_eq!(
            standings.iter().map(|s| s.0.as_str()).collect::<Vec<_>>(),
            ["heavy", "light"]
        );
        for (i, (_, fair_share, util)) in standings.iter().enumerate() {
            let b = ctx.pending(&s.pending[i], 1.0, &cfg);
            assert_eq!(*fair_share, b.fair_share);
            assert_eq!(*util, b.utilization);
        }
        assert_eq!(standings[1].1, 1.0, "no use lately: the top standing");
    }

    #[test]
    fn fair_share_recovers_as_usage_decays() {
        let cfg = PolicyConfig::default();
        let hl = cfg.usage_half_life_s;
        let mut s = state(vec![task("a", "x", 0), task("b", "y", 0)]);
        // x used twice as much as y, but two half-lives earlier: x now counts 1/4 of it.
        s.usage.charge("x", "t", 2e5, Some(1.0), 0, hl, 86_400);
        s.usage
            .charge("y", "t", 1e5, Some(1.0), 2 * hl as u64, hl, 86_400);
        let at_start = PriorityContext::new(&s, 0, &cfg);
        let later = PriorityContext::new(&s, 2 * hl as u64, &cfg);
        assert!((s.usage.user_usage("x", 2 * hl as u64, hl) - 5e4).abs() < 1e-6);
        let fx = later.pending(&s.pending[0], 1.0, &cfg).fair_share;
        let fy = later.pending(&s.pending[1], 1.0, &cfg).fair_share;
        assert!(fx > fy, "{fx} {fy}");
        assert!(at_start.pending(&s.pending[0], 1.0, &cfg).fair_share < fx);
    }

    #[test]
    fn idle_gpu_user_drops_below_busy_user() {
        let cfg = PolicyConfig::default();
        let mut s = state(vec![task("a", "idle", 0), task("b", "busy", 0)]);
        // Same allocation, so fair-share is equal; only utilisation differs.
        s.usage.charge(
            "idle",
            "t",
            86_400.0,
            Some(0.05),
            0,
            cfg.usage_half_life_s,
            86_400,
        );
        s.usage.charge(
            "busy",
            "t",
            86_400.0,
            Some(0.95),
            0,
            cfg.usage_half_life_s,
            86_400,
        );
        let ctx = PriorityContext::new(&s, 0, &cfg);
        let idle = ctx.pending(&s.pending[0], 1.0, &cfg);
        let busy = ctx.pending(&s.pending[1], 1.0, &cfg);
        assert_eq!(idle.fair_share, busy.fair_share);
        assert!(idle.utilization < busy.utilization);
        assert!(idle.total < busy.total);
    }

    #[test]
    fn urgent_deadline_overtakes() {
        let cfg = PolicyConfig::default();
        let mut early = task("early", "u", 0);
        early.priority = 0.8;
        let mut urgent = task("urgent", "u", 3_000);
        urgent.deadline = Some(3_000 + 4_000);
        urgent.estimated_runtime = Some(3_600);
        let s = state(vec![early.clone(), urgent.clone()]);
        let ctx = PriorityContext::new(&s, 3_000, &cfg);
        let e = ctx.pending(&early, 1.0, &cfg);
        let u = ctx.pending(&urgent, 1.0, &cfg);
        assert!(u.deadline >= 0.9);
        assert!(u.total > e.total, "{u:?} vs {e:?}");
        // Far from its deadline the same task is not urgent.
        let relaxed = PriorityContext::new(&s, 3_000, &cfg);
        let mut far = urgent.clone();
        far.deadline = Some(3_000 + 30 * 86_400);
        assert!(relaxed.pending(&far, 1.0, &cfg).deadline < 0.01);
    }

    #[test]
    fn age_grows_until_cap_so_nothing_starves() {
        let cfg = PolicyConfig::default();
        let t = task("a", "u", 0);
        let s = state(vec![t.clone()]);
        let a1 = PriorityContext::new(&s, 3_600, &cfg).pending(&t, 1.0, &cfg);
        let a2 = PriorityContext::new(&s, 7_200, &cfg).pending(&t, 1.0, &cfg);
        let a3 = PriorityContext::new(&s, 10 * 86_400, &cfg).pending(&t, 1.0, &cfg);
        assert!(a1.age < a2.age && a2.total > a1.total);
        assert_eq!(a3.age, 1.0);
    }

    #[test]
    fn declared_priority_and_gpu_fit_count() {
        let cfg = PolicyConfig::default();
        let mut hi = task("hi", "u", 0);
        hi.priority = 1.0;
        let lo = task("lo", "u", 0);
        let s = state(vec![hi.clone(), lo.clone()]);
        let ctx = PriorityContext::new(&s, 0, &cfg);
        assert!(ctx.pending(&hi, 1.0, &cfg).total > ctx.pending(&lo, 1.0, &cfg).total);
        assert!(ctx.pending(&lo, 1.0, &cfg).total > ctx.pending(&lo, 0.0, &cfg).total);
    }

    #[test]
    fn service_factor_decreases() {
        assert_eq!(service_factor(0.0, 3600.0), 1.0);
        assert!((service_factor(3600.0, 3600.0) - 0.5).abs() < 1e-12);
        assert!(service_factor(86_400.0, 3600.0) > service_factor(7.0 * 86_400.0, 3600.0));
    }
}
