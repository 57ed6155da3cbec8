//! What tasks leave in object storage, as their owners and nodes reach it: checkpoints,
//! results (every node's part of the last attempt, merged), and the data a task reads.

use crate::domain::{ArtifactKind, ArtifactState};
use crate::error::ApiError;
use crate::state::AppState;
use crate::storage::tar::Entry;
use crate::store::{ArtifactRecord, TaskRecord};
use crate::tasks::results as task_results;
use crate::usecases::runs::{placed_on, rank0_node};

/// A complete checkpoint, for the node its task is placed on (the node restores it).
pub async fn checkpoint_for(
    state: &AppState,
    node_id: &str,
    id: &str,
) -> Result<ArtifactRecord, ApiError> {
    let a = state
        .store
        .artifact(id)
        .await?
        .filter(|a| a.state == ArtifactState::Complete && a.kind == ArtifactKind::Checkpoint)
        .ok_or_else(|| ApiError::NotFound("no such checkpoint".into()))?;
    placed_on(state, node_id, &a.task_id).await?;
    Ok(a)
}

/// A task's complete checkpoints, newest first.
pub async fn checkpoints(
    state: &AppState,
    t: &TaskRecord,
) -> Result<Vec<ArtifactRecord>, ApiError> {
    Ok(state
        .store
        .task_artifacts(&t.id, ArtifactKind::Checkpoint)
        .await?)
}

/// Bucket and key prefix of a task's `s3://` data path.
pub fn data_location(state: &AppState, t: &TaskRecord) -> Result<(String, String), ApiError> {
    let url = t
        .spec
        .data_path
        .as_deref()
        .filter(|p| p.starts_with("s3://"))
        .ok_or_else(|| ApiError::NotFound("the task has no s3:// data path".into()))?;
    state
        .storage
        .resolve(&t.tenant_id, url)
        .map_err(|m| ApiError::invalid("data_path", m))
}

/// The files of the task's results (every node's of its newest attempt with results, rank 0's
/// node's first: [`task_results::tree`]) and when the newest was stored, or why there are none.
pub async fn results(state: &AppState, t: &TaskRecord) -> Result<(Vec<Entry>, i64), ApiError> {
    if t.results.as_deref() == Some(crate::tasks::lifecycle::RESULTS_UPLOADING) {
        return Err(ApiError::Conflict(format!(
            "the results of task {} are still uploading: its run ended while the server or storage was away, and its node keeps them until they are stored",
            t.id
        )));
    }
    if t.results.as_deref() == Some(crate::tasks::lifecycle::RESULTS_LOST) {
        return Err(ApiError::NoResults(format!(
            "the results of task {} could not be kept (its timeline says why)",
            t.id
        )));
    }
    // The last attempt's only: a gang's node may have saved its part of an attempt that
    // then failed.
    let (current, _) = task_results::current(
        state
            .store
            .task_artifacts(&t.id, ArtifactKind::Results)
            .await?
            .into_iter()
            .filter(|a| a.attempt == t.attempts)
            .collect(),
    );
    let Some(newest) = current.first() else {
        return Err(ApiError::NoResults(format!(
            "task {} has no results (the files a run leaves in AUTODL_RESULTS_DIR are kept when it ends: completed, failed or timed out)",
            t.id
        )));
    };
    let at = current
        .iter()
        .map(|a| a.completed_at.unwrap_or(a.created_at))
        .max()
        .unwrap_or_default();
    let rank0 = if current.len() > 1 {
        rank0_node(state, &t.id, newest.attempt).await?
    } else {
        None
    };
    Ok((task_results::tree(&current, rank0.as_deref()), at))
}
