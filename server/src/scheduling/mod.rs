//! The live scheduler: the runner loads the policy's input from the store (the same
//! [`autodl_scheduler::Snapshot`] the simulator runs on), asks the pure policy for decisions
//! at the clock's `now`, and applies them.

pub mod active;
pub mod beside;
pub mod dependencies;
pub mod explain;
pub mod forecast;
pub mod handle;
pub mod housekeeping;
pub mod idle;
pub mod runner;
pub mod snapshot;
pub mod sweeps;
pub mod waiting;

pub use explain::explain;

/// Whether the scheduler has stalled: its last cycle ended `last_cycle_age_ms` ago, against
/// cycles every `interval_ms` at least. A leader that froze is replaced within its lease
/// (seconds); one that stays stalled beyond this has stopped placing work (its cycles fail,
/// or no server can lead), which `/healthz` and `/metrics` then say.
pub fn stalled(last_cycle_age_ms: Option<i64>, interval_ms: u64) -> bool {
    let limit = (interval_ms as i64).saturating_mul(5).max(10_000);
    last_cycle_age_ms.is_some_and(|age| age > limit)
}
pub use handle::SchedulerHandle;
pub use runner::Runner;
pub use snapshot::{load_quotas, to_node, to_quota};

#[cfg(test)]
mod tests {
    #[test]
    fn a_scheduler_is_stalled_only_well_past_its_interval() {
        assert!(!super::stalled(None, 2000));
        assert!(!super::stalled(Some(9_000), 2000));
        assert!(super::stalled(Some(10_001), 2000));
        assert!(!super::stalled(Some(20_000), 5000));
        assert!(super::stalled(Some(25_001), 5000));
    }
}
