//! Sweeps: a search over parameters, stored with its trials (tasks labelled `sweep=<id>`).

use async_trait::async_trait;

use super::*;
use autodl_common::tasks::TaskState;

/// Stores a sweep and its trials in one transaction, reads sweeps and counts their trials' states.
#[async_trait]
pub trait Sweeps: Send + Sync {
    /// Stores a sweep and its trials in one transaction: all of them or none.
    async fn create_sweep(&self, sweep: &SweepRecord, trials: &[NewTask]) -> StoreResult<()>;
    async fn sweep(&self, tenant_id: &str, id: &str) -> StoreResult<Option<SweepWithUser>>;
    /// The organization's sweeps, newest first.
    async fn list_sweeps(&self, tenant_id: &str, limit: i64) -> StoreResult<Vec<SweepWithUser>>;
    /// The trials' states, by sweep id, for a listing.
    async fn sweep_states(
        &self,
        tenant_id: &str,
        sweep_ids: &[String],
    ) -> StoreResult<Vec<(String, TaskState, i64)>>;
    /// Records the value a trial reported at rungs it reached (by index) for the first time;
    /// answers the rungs newly recorded (a rung already recorded keeps its first value).
    async fn record_rungs(
        &self,
        sweep_id: &str,
        task_id: &str,
        rungs: &[(i64, f64)],
        at: i64,
    ) -> StoreResult<Vec<i64>>;
    /// The values other trials recorded at `rung` before `task_id` did (earlier, or at the
    /// same time with a smaller id: one order, whoever asks).
    async fn rung_values_before(
        &self,
        sweep_id: &str,
        rung: i64,
        task_id: &str,
    ) -> StoreResult<Vec<f64>>;
    /// Says why a trial was stopped early.
    async fn record_stop(
        &self,
        sweep_id: &str,
        task_id: &str,
        message: &str,
        at: i64,
    ) -> StoreResult<()>;
    /// (trial, why) of the sweep's trials stopped early.
    async fn sweep_stops(&self, sweep_id: &str) -> StoreResult<Vec<(String, String)>>;
}
