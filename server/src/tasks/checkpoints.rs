//! What the store knows of a task's saved artifacts, in the shapes dispatch and the API use.

use autodl_common::agent::{ArtifactFile, RestoreRef};

use crate::domain::ArtifactKind;
use crate::store::{ArtifactRecord, Store, StoreResult};

/// The files of a complete artifact, from its manifest.
pub fn files_of(a: &ArtifactRecord) -> Vec<ArtifactFile> {
    a.manifest
        .as_deref()
        .and_then(|m| serde_json::from_str(m).ok())
        .unwrap_or_default()
}

/// The newest complete checkpoint of a task, for its next attempt.
pub async fn latest_checkpoint(
    store: &dyn Store,
    task_id: &str,
) -> StoreResult<Option<RestoreRef>> {
    let list = store
        .task_artifacts(task_id, ArtifactKind::Checkpoint)
        .await?;
    Ok(list.into_iter().next().map(|a| RestoreRef {
        files: files_of(&a),
        checkpoint_id: a.id,
        attempt: a.attempt as u32,
        step: a.step,
    }))
}
