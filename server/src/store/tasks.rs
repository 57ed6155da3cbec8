//! Tasks through their life: submission, placement (fenced by the leader's term), runs
//! (attempts), stops and requeues. What they print and report is in [`super::TaskJournal`],
//! what their runs leave in [`super::RunResults`].

use async_trait::async_trait;

use super::*;
use autodl_common::tasks::TaskState;

#[async_trait]
pub trait Tasks: Send + Sync {
    /// Stores new tasks in one transaction (group commit: a burst of submissions pays one
    /// commit). Each answer says whether its task was stored or its idempotency key had
    /// already made one; nothing is answered before the commit.
    async fn create_tasks(&self, batch: &[NewTask]) -> StoreResult<Vec<StoreResult<TaskCreated>>>;
    /// A task of `tenant_id` (any tenant when `None`).
    async fn task(&self, tenant_id: Option<&str>, id: &str) -> StoreResult<Option<TaskWithUser>>;
    /// The tasks of `tenant_id` that `what` may mean (by number, id prefix or name), newest
    /// first, at most `limit`: one is the task meant, several say it was not clear.
    async fn tasks_meant(
        &self,
        tenant_id: &str,
        what: &crate::domain::TaskRef,
        limit: i64,
    ) -> StoreResult<Vec<TaskHandle>>;
    async fn list_tasks(&self, filter: &TaskFilter) -> StoreResult<Vec<TaskWithUser>>;
    /// How many tasks match the filter, on every page (its cursor and limit are ignored).
    async fn count_tasks(&self, filter: &TaskFilter) -> StoreResult<i64>;
    /// Pending tasks of a user, and of their tenant.
    async fn count_pending(&self, user_id: &str, tenant_id: &str) -> StoreResult<(i64, i64)>;
    /// The member's sessions that are pending or running.
    async fn count_open_sessions(&self, user_id: &str) -> StoreResult<i64>;
    /// Tasks that are pending, scheduled or running: what the scheduler looks at.
    async fn active_tasks(&self) -> StoreResult<Vec<TaskRecord>>;
    /// (user id, seconds from start to finish) of the `limit` tasks that completed last,
    /// newest first: the history behind start-time estimates.
    async fn recent_run_times(&self, limit: i64) -> StoreResult<Vec<(String, i64)>>;
    async fn cancel_task(&self, tenant_id: &str, id: &str, now: i64) -> StoreResult<CancelOutcome>;
    /// The states of those of `ids` that exist (and are `tenant_id`'s, when given).
    async fn task_states(
        &self,
        tenant_id: Option<&str>,
        ids: &[String],
    ) -> StoreResult<Vec<(String, TaskState)>>;
    /// Ends a pending task that will never start (what it was to start after failed), as
    /// `state` with an event saying why; `false` if it was no longer pending.
    async fn end_unstarted(
        &self,
        id: &str,
        state: TaskState,
        message: &str,
        now: i64,
    ) -> StoreResult<bool>;
    /// Where the change feed of scheduling columns stands now (see migration 0011): a full
    /// read of [`Tasks::scheduling_tasks`] after this cursor, then
    /// [`Tasks::scheduling_task_changes`] from it, miss nothing.
    async fn task_change_cursor(&self) -> StoreResult<i64>;
    /// Tasks in any state whose scheduling columns changed at or after `cursor` (and maybe a
    /// few seen before), and the cursor to ask from next time.
    async fn scheduling_task_changes(
        &self,
        cursor: i64,
    ) -> StoreResult<(Vec<SchedulingTaskRecord>, i64)>;
    /// Moves a cycle's pending tasks to scheduled and opens their next attempts, in one
    /// transaction (one commit, one fence check): a cycle that starts thousands of tasks must
    /// not pay a commit for each. For each, `false` if it was no longer pending (so a task is
    /// never placed twice).
    async fn place_tasks(
        &self,
        term: Term,
        placing: &[Placing],
        now: i64,
    ) -> StoreResult<Vec<bool>>;
    /// The scheduled and running tasks placed (in part) on `node`: an agent's work, read by
    /// an index.
    async fn node_tasks(&self, node: &str) -> StoreResult<Vec<TaskRecord>>;
    /// Puts a scheduled or running task back to pending, closing its attempt with `reason`.
    async fn requeue_task(
        &self,
        fence: Option<Term>,
        id: &str,
        reason: &str,
        message: &str,
        now: i64,
    ) -> StoreResult<bool>;
    /// Marks runs started, all in one transaction (agents' start reports are group-committed:
    /// on a large cluster they come in hundreds a second). Each answer says whether its run was
    /// still the task's scheduled one.
    async fn mark_running_many(&self, starts: &[RunStart]) -> StoreResult<Vec<bool>>;
    async fn mark_running(&self, id: &str, attempt: i64, now: i64) -> StoreResult<bool> {
        let start = RunStart {
            task_id: id.to_owned(),
            attempt,
            at: now,
        };
        Ok(self.mark_running_many(&[start]).await?[0])
    }
    /// Ends runs, all in one transaction (agents' end reports are group-committed, like their
    /// starts). Each answer says whether its run was still the task's current one.
    async fn finish_attempts(&self, ends: &[RunEnd]) -> StoreResult<Vec<bool>>;
    async fn finish_attempt(
        &self,
        id: &str,
        attempt: i64,
        end: &AttemptEnd,
        now: i64,
    ) -> StoreResult<bool> {
        let end = RunEnd {
            task_id: id.to_owned(),
            attempt,
            end: end.clone(),
            at: now,
            results: None,
        };
        Ok(self.finish_attempts(&[end]).await?[0])
    }
    /// Active tasks with their current run, for the scheduler.
    async fn scheduling_tasks(&self) -> StoreResult<Vec<SchedulingTaskRecord>>;
    /// When each of these tasks last had a shell or a port (an app) opened into it, if ever:
    /// what holds a batch task like a session.
    async fn last_held(
        &self,
        task_ids: &[String],
    ) -> StoreResult<std::collections::HashMap<String, i64>>;
    async fn task_attempts(&self, id: &str) -> StoreResult<Vec<AttemptRecord>>;
    /// Marks a placed task to be stopped by its agent; `false` if it is not placed.
    async fn set_stop_reason(
        &self,
        fence: Option<Term>,
        id: &str,
        reason: &str,
    ) -> StoreResult<bool>;
    /// Replaces the explanations of these tasks (`None`: no longer waiting).
    async fn set_waiting(
        &self,
        term: Term,
        changes: &[(String, Option<String>)],
    ) -> StoreResult<()>;
}
