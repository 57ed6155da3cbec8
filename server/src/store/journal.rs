//! What a task leaves in its journal as it runs: events (its timeline), log lines and training
//! metrics.

use async_trait::async_trait;

use super::*;

/// A task's timeline, log lines and reported metrics.
#[async_trait]
pub trait TaskJournal: Send + Sync {
    async fn task_events(&self, id: &str) -> StoreResult<Vec<EventRecord>>;
    async fn add_event(
        &self,
        task_id: &str,
        kind: &str,
        message: &str,
        now: i64,
    ) -> StoreResult<()>;
    /// Lines of one attempt, kept in this order, in one statement.
    async fn append_logs(&self, id: &str, attempt: i64, lines: &[NewLogLine]) -> StoreResult<()>;
    async fn task_logs(&self, id: &str, after: i64, limit: i64) -> StoreResult<Vec<LogRecord>>;
    async fn add_metrics(&self, id: &str, samples: &[(i64, String)]) -> StoreResult<()>;
    async fn task_metrics(
        &self,
        id: &str,
        after: i64,
        limit: i64,
    ) -> StoreResult<Vec<MetricRecord>>;
    /// The latest `per_task` reported samples of each of `ids`, as (task id, sample), each
    /// task's oldest first.
    async fn recent_metrics(
        &self,
        ids: &[String],
        per_task: i64,
    ) -> StoreResult<Vec<(String, MetricRecord)>>;
    /// The oldest `limit` reported samples in `[from, to]` (milliseconds), oldest first.
    async fn task_metrics_window(
        &self,
        id: &str,
        from: i64,
        to: i64,
        limit: i64,
    ) -> StoreResult<Vec<MetricRecord>>;
}
