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
}
