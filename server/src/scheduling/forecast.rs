//! Start-time estimates for waiting tasks, kept fresh beside the cycles. The forward run
//! ([`autodl_scheduler::forecast::estimate_starts`]) can take longer than a cycle on a long
//! queue, so it runs beside them ([`super::beside`], at a lower priority) from a copy of the
//! cycle's input, and the cycles that follow publish its answer with their explanations; no
//! decision waits for it. Its budget is wall time: on a host whose cores are all busy it looks
//! less far ahead rather than slowing the cycles.

use autodl_scheduler::forecast::{estimate_starts, RuntimeHistory};
use autodl_scheduler::{PolicyConfig, Snapshot, TaskId, WorkerPlacement};
use std::collections::HashMap;
use tokio::task::JoinHandle;

/// A new forecast starts at most this often (clock time).
pub const FORECAST_EVERY_MS: i64 = 10_000;
/// How far the forward run looks, in moments when runs end.
pub const FORECAST_STEPS: usize = 128;
/// Wall time one forecast may take: each step is a full cycle of the policy, and on a long queue
/// the forecast must not take the CPU the cycles need. Every `FORECAST_EVERY_MS`, so at most a
/// tenth of a core.
pub const FORECAST_BUDGET: std::time::Duration = std::time::Duration::from_secs(1);
/// Completed tasks whose run times make the users' histories.
pub const HISTORY_TASKS: i64 = 2_000;

/// What the latest finished forecast said, and the one under way.
#[derive(Default)]
pub struct Forecaster {
    /// Task id -> estimated start, in ms.
    pub starts: HashMap<TaskId, i64>,
    running: Option<JoinHandle<HashMap<TaskId, i64>>>,
    started_ms: Option<i64>,
}

impl Forecaster {
    /// Takes a finished forecast's answer, if one finished since the last call.
    pub async fn collect(&mut self) {
        if self.running.as_ref().is_some_and(|j| j.is_finished()) {
            self.settle().await;
        }
    }

    /// Waits for the forecast under way, if any, and takes its answer.
    pub async fn settle(&mut self) {
        if let Some(job) = self.running.take() {
            match job.await {
                Ok(starts) => self.starts = starts,
                Err(e) => tracing::error!(error = %e, "the start-time forecast failed"),
            }
        }
    }

    /// Whether a new forecast is due at `now_ms`: none is running, and the last one started
    /// long enough ago.
    pub fn due(&self, now_ms: i64) -> bool {
        self.running.is_none()
            && self
                .started_ms
                .is_none_or(|t| now_ms - t >= FORECAST_EVERY_MS || now_ms < t)
    }

    /// Starts a forecast from the cycle's input with its placements applied. `runs` are
    /// (user, seconds) of recently completed tasks, newest first.
    pub fn start(
        &mut self,
        mut snapshot: Snapshot,
        placed: Vec<(TaskId, Vec<WorkerPlacement>)>,
        now_ms: i64,
        config: &PolicyConfig,
        runs: Vec<(String, i64)>,
    ) {
        let config = config.clone();
        let now = super::snapshot::secs(now_ms);
        self.started_ms = Some(now_ms);
        self.running = Some(super::beside::spawn(move || {
            snapshot.place(placed, now);
            let mut history = RuntimeHistory::new(config.default_runtime_s);
            // Oldest first, so each user's latest runs are the ones kept.
            for (user, secs) in runs.iter().rev() {
                history.record(user, (*secs).max(1) as u64);
            }
            let until = std::time::Instant::now() + FORECAST_BUDGET;
            estimate_starts(
                &snapshot,
                now,
                &config,
                &|r| history.estimate(r),
                FORECAST_STEPS,
                &mut || std::time::Instant::now() < until,
            )
            .into_iter()
            .map(|(id, t)| (id, (t as i64).saturating_mul(1000)))
            .collect()
        }));
    }
}

/// Whether a stored estimate is still good enough: rewriting every pending task whenever its
/// estimate moves a second would cost a write per task per cycle. It is rewritten when it moves
/// by more than a minute or a tenth of the time left until it.
pub fn close_enough(old: Option<&str>, new: Option<&str>, now_ms: i64) -> bool {
    let parse = |s: &str| {
        time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
            .ok()
            .map(|d| (d.unix_timestamp_nanos() / 1_000_000) as i64)
    };
    match (old.and_then(parse), new.and_then(parse)) {
        (None, None) => true,
        (Some(a), Some(b)) => (a - b).abs() <= 60_000.max((b - now_ms).max(0) / 10),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_moves_are_not_rewritten() {
        let at = |ms: i64| crate::domain::rfc3339(ms);
        let now = 1_000_000_000_000;
        let hour = 3_600_000;
        assert!(close_enough(None, None, now));
        assert!(!close_enough(None, Some(&at(now + hour)), now));
        assert!(!close_enough(Some(&at(now + hour)), None, now));
        assert!(close_enough(
            Some(&at(now + hour)),
            Some(&at(now + hour + 59_000)),
            now
        ));
        // A tenth of an hour is six minutes.
        assert!(close_enough(
            Some(&at(now + hour)),
            Some(&at(now + hour + 300_000)),
            now
        ));
        assert!(!close_enough(
            Some(&at(now + hour)),
            Some(&at(now + hour + 500_000)),
            now
        ));
    }
}
