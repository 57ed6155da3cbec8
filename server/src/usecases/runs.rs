//! Which runs a node may speak for: an agent reports on, uploads for and fetches for tasks
//! placed on its own node only, so a node's credential reaches no other node's tasks.

use autodl_common::tasks::TaskState;

use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{TaskRecord, TaskWithUser};

/// The task whose latest attempt ran on `node`, or 409. A cancelled task has lost its
/// placement but its last attempt still reports (its last log lines, its exit).
pub async fn current_run(
    state: &AppState,
    node: &str,
    task_id: &str,
    attempt: u32,
) -> Result<TaskWithUser, ApiError> {
    run_on(state, node, task_id, attempt, false).await
}

/// As [`current_run`], and also the last run of a task that has ended for good, for what it
/// left: the output its workers print after the first to finish ended the attempt, and what
/// its node kept of it (results and the last checkpoint, uploaded late when the server or
/// storage was away at the end: `FinishedReport::uploading`). A run whose task went back to
/// the queue is refused: the next attempt starts from what was saved before.
pub async fn run_or_ended_run(
    state: &AppState,
    node: &str,
    task_id: &str,
    attempt: u32,
) -> Result<TaskWithUser, ApiError> {
    run_on(state, node, task_id, attempt, true).await
}

async fn run_on(
    state: &AppState,
    node: &str,
    task_id: &str,
    attempt: u32,
    ended_too: bool,
) -> Result<TaskWithUser, ApiError> {
    let t = state
        .store
        .task(None, task_id)
        .await?
        .ok_or_else(|| ApiError::NotFound("no such task".into()))?;
    let stale = || {
        ApiError::Conflict(format!(
            "attempt {attempt} of task {task_id} is not current on this node"
        ))
    };
    if t.task.attempts as u32 != attempt {
        return Err(stale());
    }
    let here = match t.task.placement.as_ref() {
        Some(p) => p.iter().any(|w| w.node == node),
        None if t.task.state == TaskState::Cancelled
            || (ended_too && t.task.state.is_finished()) =>
        {
            let attempts = state.store.task_attempts(task_id).await?;
            attempts.iter().any(|a| {
                a.number == i64::from(attempt) && a.placement.iter().any(|w| w.node == node)
            })
        }
        None => false,
    };
    if !here {
        return Err(stale());
    }
    Ok(t)
}

/// The node rank 0 of a task's attempt `attempt` ran on (the one that saves its checkpoints
/// and whose results come first), as the attempt's placement recorded it.
pub async fn rank0_node(
    state: &AppState,
    task_id: &str,
    attempt: i64,
) -> Result<Option<String>, ApiError> {
    Ok(state
        .store
        .task_attempts(task_id)
        .await?
        .into_iter()
        .find(|a| a.number == attempt)
        .and_then(|a| a.placement.first().map(|w| w.node.clone())))
}

/// A task placed on `node` (any attempt): restores and data are fetched before it starts.
pub async fn placed_on(
    state: &AppState,
    node: &str,
    task_id: &str,
) -> Result<TaskRecord, ApiError> {
    let t = state
        .store
        .task(None, task_id)
        .await?
        .ok_or_else(|| ApiError::NotFound("no such task".into()))?;
    let here = t.task.state.is_placed()
        && t.task
            .placement
            .0
            .clone()
            .is_some_and(|p| p.iter().any(|w| w.node == node));
    if !here {
        return Err(ApiError::Conflict(format!(
            "task {task_id} is not placed on this node"
        )));
    }
    Ok(t.task)
}
