//! What the store knows of a task's saved artifacts, in the shapes dispatch and the API use,
//! and how an upload that will never complete is discarded.

use autodl_common::agent::{ArtifactFile, RestoreRef};

use crate::domain::ArtifactKind;
use crate::domain::ArtifactState;
use crate::storage::{delete_prefix, Storage};
use crate::store::{ArtifactRecord, Artifacts, StoreResult};

/// The files of a complete artifact, from its manifest.
pub fn files_of(a: &ArtifactRecord) -> Vec<ArtifactFile> {
    a.manifest
        .as_deref()
        .and_then(|m| serde_json::from_str(m).ok())
        .unwrap_or_default()
}

/// The newest complete checkpoint of a task, for its next attempt.
pub async fn latest_checkpoint(
    store: &dyn Artifacts,
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

/// Deletes the objects of an upload that will never be completed (its agent gave up, a newer
/// upload replaced it, or it is a day old), so a failed save does not hold storage. Claimed
/// first (uploading → deleting), so that a commit arriving meanwhile cannot complete it; a
/// deletion that fails stays `deleting` and the next sweep finishes it. `false` when the upload
/// was not there to discard (completed, or already gone).
pub async fn discard_upload(store: &dyn Artifacts, storage: &Storage, a: &ArtifactRecord) -> bool {
    if a.state == ArtifactState::Uploading {
        if !store
            .set_artifact_state(&a.id, ArtifactState::Uploading, ArtifactState::Deleting)
            .await
            .unwrap_or(false)
        {
            return false;
        }
        // What it received counted against the quota; it is the organization's no more.
        if let Ok(Some(now)) = store.artifact(&a.id).await {
            let _ = store
                .add_storage_bytes(&now.tenant_id, -now.size_bytes)
                .await;
        }
    }
    if !matches!(a.state, ArtifactState::Uploading | ArtifactState::Deleting) {
        return false;
    }
    match delete_prefix(storage.backend.as_ref(), &a.bucket, &a.prefix).await {
        Ok(_) => store
            .set_artifact_state(&a.id, ArtifactState::Deleting, ArtifactState::Deleted)
            .await
            .unwrap_or(false),
        Err(e) => {
            tracing::warn!(error = %e, artifact = a.id, "could not delete an abandoned upload");
            false
        }
    }
}
