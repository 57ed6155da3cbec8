//! Sessions (tasks of kind `session`) under their organization's rules: how long one may
//! run, how many a member may hold, and when one (or a batch task) counts as idle. Pure:
//! the runner passes the measurements and the time.

use autodl_common::api::SessionPolicy;
use autodl_common::tasks::{TaskKind, TaskSpec};

use crate::domain::DomainError;

/// The stop reason of a run stopped for sitting idle.
pub const IDLE: &str = "idle";

/// Checks a policy an admin sends.
pub fn check_policy(p: &SessionPolicy) -> Result<(), DomainError> {
    if !(0.0..=100.0).contains(&p.idle_util_pct) {
        return Err(DomainError::invalid(
            "idle_util_pct",
            "idle_util_pct is a utilization from 0 to 100 percent (e.g. 5)",
        ));
    }
    if p.idle_minutes > 7 * 24 * 60 {
        return Err(DomainError::invalid(
            "idle_minutes",
            "idle_minutes is at most 10080 (a week); 0 turns idle stopping off (e.g. 30)",
        ));
    }
    if let Some(h) = p.max_session_hours {
        if !(h.is_finite() && h > 0.0 && h <= 8760.0) {
            return Err(DomainError::invalid(
                "max_session_hours",
                "max_session_hours is more than 0 and at most 8760 (e.g. 24)",
            ));
        }
    }
    if p.max_sessions_per_user.is_some_and(|n| n > 10_000) {
        return Err(DomainError::invalid(
            "max_sessions_per_user",
            "max_sessions_per_user is at most 10000 (0 allows no sessions; e.g. 2)",
        ));
    }
    Ok(())
}

/// A session may not outlast its organization's session length: its `time_limit` becomes the
/// smaller of its own and the cap (and it then ends `timed_out` like any task at its limit).
pub fn cap_length(spec: &mut TaskSpec, p: &SessionPolicy) {
    if spec.kind != TaskKind::Session {
        return;
    }
    if let Some(h) = p.max_session_hours {
        let cap = (h * 3600.0).round().max(1.0) as u64;
        spec.time_limit = Some(spec.time_limit.map_or(cap, |t| t.min(cap)));
    }
}

/// The refusal when a member already holds as many sessions as allowed.
pub fn check_open_sessions(open: i64, adding: i64, p: &SessionPolicy) -> Result<(), DomainError> {
    match p.max_sessions_per_user {
        Some(cap) if open + adding > i64::from(cap) => Err(DomainError::OverQuota(format!(
            "you have {open} session(s) pending or running; your organization allows {cap} \
             per member (stop one with `autodl cancel`)"
        ))),
        _ => Ok(()),
    }
}

/// How the rules see a task: a session, or a batch task someone holds like one (a shell or a
/// port opened into its current run; `held_at` is when the last was). A batch task that
/// sleeps with `ports` would otherwise be a session outside its organization's rules.
pub fn treated_as(kind: TaskKind, run_started: i64, held_at: Option<i64>) -> TaskKind {
    match (kind, held_at) {
        (TaskKind::Batch, Some(at)) if at >= run_started => TaskKind::Session,
        (k, _) => k,
    }
}

/// The refusal when a shell or a port would hold one more batch task like a session than a
/// member may hold (`holding`: their sessions and batch tasks already held).
pub fn check_holding(holding: i64, p: &SessionPolicy) -> Result<(), DomainError> {
    match p.max_sessions_per_user {
        Some(cap) if holding + 1 > i64::from(cap) => Err(DomainError::OverQuota(format!(
            "a shell or an app in a batch task holds it like a session, and its owner holds \
             {holding} session(s) already; your organization allows {cap} per member"
        ))),
        _ => Ok(()),
    }
}

/// Whether a run held like a session has lasted its organization's session length.
pub fn past_session_length(p: &SessionPolicy, run_started: i64, now: i64) -> bool {
    p.max_session_hours
        .is_some_and(|h| (now - run_started) as f64 >= h * 3_600_000.0)
}

/// What is known of a running task's activity. Times are clock milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Activity {
    /// When the run started.
    pub started: i64,
    /// The first and last GPU samples of the run, and the last with a GPU at or above the
    /// idle threshold.
    pub first_sample: Option<i64>,
    pub last_sample: Option<i64>,
    pub last_busy: Option<i64>,
    /// The last byte through a tunnel into it (or the last tunnel opened or closed).
    pub last_traffic: Option<i64>,
}

/// Samples older than this say nothing about now: an agent that stopped reporting is not
/// proof of idleness.
pub const STALE_SAMPLES_MS: i64 = 5 * 60_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Active,
    /// Idle since `since`; `stop` when the policy stops it now, otherwise a warning.
    Idle {
        since: i64,
        stop: bool,
    },
}

/// Judges one running task. A task is idle from the later of its start, its first sample,
/// its last busy sample and its last tunnel traffic; it is warned once idle for half the
/// policy's minutes and stopped at the full count (sessions always, batch tasks only where
/// the organization asks). Without fresh samples nothing is judged.
pub fn judge(p: &SessionPolicy, kind: TaskKind, a: &Activity, now: i64) -> Verdict {
    if p.idle_minutes == 0 {
        return Verdict::Active;
    }
    let (Some(first), Some(last)) = (a.first_sample, a.last_sample) else {
        return Verdict::Active;
    };
    if now - last > STALE_SAMPLES_MS {
        return Verdict::Active;
    }
    let since = [Some(a.started), Some(first), a.last_busy, a.last_traffic]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(now);
    let limit = i64::from(p.idle_minutes) * 60_000;
    let idle_for = now - since;
    if idle_for >= limit {
        Verdict::Idle {
            since,
            stop: kind == TaskKind::Session || p.stop_idle_batch,
        }
    } else if idle_for * 2 >= limit {
        Verdict::Idle { since, stop: false }
    } else {
        Verdict::Active
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIN: i64 = 60_000;

    fn policy(minutes: u32) -> SessionPolicy {
        SessionPolicy {
            idle_minutes: minutes,
            ..Default::default()
        }
    }

    fn sampled(started: i64, last_busy: Option<i64>, now: i64) -> Activity {
        Activity {
            started,
            first_sample: Some(started + 1_000),
            last_sample: Some(now - 1_000),
            last_busy,
            last_traffic: None,
        }
    }

    #[test]
    fn sessions_are_warned_at_half_and_stopped_at_the_limit() {
        let p = policy(30);
        let a = sampled(0, Some(10 * MIN), 0);
        let at = |now: i64| {
            judge(
                &p,
                TaskKind::Session,
                &Activity {
                    last_sample: Some(now - 1_000),
                    ..a
                },
                now,
            )
        };
        assert_eq!(at(20 * MIN), Verdict::Active);
        assert_eq!(
            at(25 * MIN),
            Verdict::Idle {
                since: 10 * MIN,
                stop: false
            }
        );
        assert_eq!(
            at(40 * MIN),
            Verdict::Idle {
                since: 10 * MIN,
                stop: true
            }
        );
    }

    #[test]
    fn batch_tasks_are_only_warned_unless_the_organization_asks() {
        let now = 60 * MIN;
        let a = sampled(0, None, now);
        assert_eq!(
            judge(&policy(30), TaskKind::Batch, &a, now),
            Verdict::Idle {
                since: 1_000,
                stop: false
            }
        );
        let strict = SessionPolicy {
            stop_idle_batch: true,
            ..policy(30)
        };
        assert!(matches!(
            judge(&strict, TaskKind::Batch, &a, now),
            Verdict::Idle { stop: true, .. }
        ));
    }

    #[test]
    fn traffic_and_missing_samples_keep_a_task_active() {
        let now = 60 * MIN;
        let mut a = sampled(0, None, now);
        a.last_traffic = Some(now - MIN);
        assert_eq!(
            judge(&policy(30), TaskKind::Session, &a, now),
            Verdict::Active
        );
        let unsampled = Activity {
            started: 0,
            ..Default::default()
        };
        assert_eq!(
            judge(&policy(30), TaskKind::Session, &unsampled, now),
            Verdict::Active
        );
        let stale = Activity {
            last_sample: Some(now - 10 * MIN),
            ..sampled(0, None, now)
        };
        assert_eq!(
            judge(&policy(30), TaskKind::Session, &stale, now),
            Verdict::Active
        );
        assert_eq!(
            judge(&policy(0), TaskKind::Session, &sampled(0, None, now), now),
            Verdict::Active,
            "0 minutes turns it off"
        );
    }

    #[test]
    fn session_length_caps_the_time_limit() {
        let mut spec = crate::tasks::spec::normalise(
            autodl_common::tasks::TaskSpecInput {
                name: "s".into(),
                image: "i".into(),
                kind: Some(TaskKind::Session),
                ..Default::default()
            },
            0,
        )
        .unwrap();
        assert_eq!(spec.command, ["sleep", "infinity"]);
        let p = SessionPolicy {
            max_session_hours: Some(2.0),
            ..Default::default()
        };
        cap_length(&mut spec, &p);
        assert_eq!(spec.time_limit, Some(7200));
        spec.time_limit = Some(600);
        cap_length(&mut spec, &p);
        assert_eq!(
            spec.time_limit,
            Some(600),
            "a shorter limit of its own stays"
        );
        assert!(check_open_sessions(
            2,
            1,
            &SessionPolicy {
                max_sessions_per_user: Some(2),
                ..p.clone()
            }
        )
        .is_err());
        assert!(check_open_sessions(
            1,
            1,
            &SessionPolicy {
                max_sessions_per_user: Some(2),
                ..p
            }
        )
        .is_ok());
    }

    proptest! {
        /// Busier tasks are never judged more idle: moving the last busy sample later never
        /// turns a verdict from active to idle, nor from a warning to a stop.
        #[test]
        fn later_activity_never_makes_a_task_more_idle(
            busy in 0i64..120, later in 0i64..60, now in 60i64..240, minutes in 1u32..120,
        ) {
            let p = policy(minutes);
            let rank = |v: Verdict| match v {
                Verdict::Active => 0,
                Verdict::Idle { stop: false, .. } => 1,
                Verdict::Idle { stop: true, .. } => 2,
            };
            let now = now * MIN;
            let a = sampled(0, Some(busy * MIN), now);
            let b = sampled(0, Some((busy + later) * MIN), now);
            prop_assert!(rank(judge(&p, TaskKind::Session, &b, now)) <= rank(judge(&p, TaskKind::Session, &a, now)));
        }
    }
}
