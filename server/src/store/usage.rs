//! What tasks cost and how busy they kept their GPUs: the usage ledger and each run's charges,
//! raw GPU samples and their rollups, and the figures of usage reports.

use async_trait::async_trait;

use super::*;

#[async_trait]
pub trait Usage: Send + Sync {
    /// Runs that ended before they were charged up to their end.
    async fn unsettled_runs(&self) -> StoreResult<Vec<UnsettledRunRecord>>;
    /// Mean measured GPU utilisation (0..1) per task over samples in `(from, to]`.
    async fn task_utilization(&self, from: i64, to: i64) -> StoreResult<Vec<(String, f64)>>;
    /// Keeps one cycle's charges and the usage rows they changed, in one transaction. A
    /// running run that ended since the scheduler read it is left as it is (a later cycle
    /// settles it from what the store says); `usage` is given the positions in `charges` of
    /// those left out and answers the usage rows of the rest, which are written with them. The
    /// answer is those positions, or `None` (nothing kept) when any run was charged or settled
    /// by someone else meanwhile: the caller's ledger is then stale.
    async fn save_charges(
        &self,
        charges: &[RunChargeRecord],
        usage: &(dyn for<'x> Fn(&'x [usize]) -> Vec<UsageRecord> + Sync),
    ) -> StoreResult<Option<Vec<usize>>>;
    async fn load_usage(&self) -> StoreResult<Vec<UsageRecord>>;
    async fn insert_gpu_samples(&self, samples: &[GpuSampleRecord]) -> StoreResult<()>;
    async fn task_gpu_samples(
        &self,
        task_id: &str,
        after: i64,
        limit: i64,
    ) -> StoreResult<Vec<GpuSampleRecord>>;
    /// The oldest `limit` GPU samples of a task in `[from, to]` (milliseconds), oldest first.
    async fn task_gpu_samples_window(
        &self,
        task_id: &str,
        from: i64,
        to: i64,
        limit: i64,
    ) -> StoreResult<Vec<GpuSampleRecord>>;
    /// Attempts that ran at some time in `[from, to)`, with their task's tenant and user
    /// (usage reports).
    async fn usage_attempts(&self, from: i64, to: i64) -> StoreResult<Vec<UsageAttemptRecord>>;
    /// Keeps the scheduler's view of each person's standing at one moment.
    async fn record_standings(&self, rows: &[StandingRecord]) -> StoreResult<()>;
    /// Standings in `[from, to)`, oldest first, with each person's email.
    async fn standings(&self, from: i64, to: i64) -> StoreResult<Vec<(StandingRecord, String)>>;
    /// Mean GPU utilization (0..1) per user over the samples of their tasks in `[from, to)`,
    /// and how many were under `idle_below`.
    async fn usage_utilization(
        &self,
        from: i64,
        to: i64,
        idle_below: f64,
    ) -> StoreResult<Vec<UsageUtilRecord>>;
    /// Each GPU's latest sample taken since `since`: `(node, GPU index, utilization 0..1)`.
    async fn latest_gpu_utilization(&self, since: i64) -> StoreResult<Vec<(String, i64, f64)>>;
    /// Each asked task's GPU samples since its `from`: the first, the last, and the last of a
    /// GPU at or above its `busy` utilization (0..1). Tasks without samples are left out. One
    /// query for all: the idle check asks about every running task.
    async fn gpu_activity(
        &self,
        asks: &[ActivityAsk],
    ) -> StoreResult<std::collections::HashMap<String, GpuActivity>>;
    /// Folds raw samples older than `before` into hourly rollups and deletes them; drops
    /// rollups older than `rollups_before`.
    async fn compact_gpu_samples(&self, before: i64, rollups_before: i64) -> StoreResult<u64>;
}
