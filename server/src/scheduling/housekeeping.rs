//! Periodic upkeep the leader does beside scheduling: folding old GPU samples into rollups
//! and removing uploads that were never completed.

use std::sync::Arc;
use std::time::Duration;

use crate::config::Settings;
use crate::domain::ArtifactState;
use crate::storage::Storage;
use crate::store::{ArtifactRecord, Store};

const DAY_MS: i64 = 86_400_000;

/// Compacts GPU samples and sweeps abandoned uploads, as of `now_ms`.
pub async fn run(
    store: &Arc<dyn Store>,
    storage: &Storage,
    settings: &Settings,
    now_ms: i64,
) -> anyhow::Result<()> {
    let raw_before = now_ms - settings.raw_sample_retention_days as i64 * DAY_MS;
    let rollups_before = now_ms - settings.rollup_retention_days as i64 * DAY_MS;
    let folded = store
        .compact_gpu_samples(raw_before, rollups_before)
        .await?;
    tracing::debug!(folded, "GPU samples compacted");
    // Uploads an agent began and never committed (it died, or its node was lost): their
    // objects are garbage. A day is far longer than any upload.
    match storage
        .backend
        .sweep_abandoned(Duration::from_secs(86_400))
        .await
    {
        Ok(0) => {}
        Ok(n) => tracing::info!(n, "removed abandoned upload files"),
        Err(e) => tracing::warn!(error = %e, "could not sweep abandoned uploads"),
    }
    let stale = store.stale_uploads(now_ms - DAY_MS).await?;
    if stale.is_empty() {
        return Ok(());
    }
    let (store, storage) = (store.clone(), storage.clone());
    tokio::spawn(async move {
        for a in stale {
            discard_upload(store.as_ref(), &storage, &a).await;
        }
    });
    Ok(())
}

/// Deletes the objects of an upload that will never be completed (its agent gave up, a newer
/// upload replaced it, or it is a day old), so a failed save does not hold storage. Claimed
/// first (uploading → deleting), so that a commit arriving meanwhile cannot complete it; a
/// deletion that fails stays `deleting` and the next sweep finishes it. `false` when the upload
/// was not there to discard (completed, or already gone).
pub async fn discard_upload(store: &dyn Store, storage: &Storage, a: &ArtifactRecord) -> bool {
    if a.state == ArtifactState::Uploading
        && !store
            .set_artifact_state(&a.id, ArtifactState::Uploading, ArtifactState::Deleting)
            .await
            .unwrap_or(false)
    {
        return false;
    }
    if !matches!(a.state, ArtifactState::Uploading | ArtifactState::Deleting) {
        return false;
    }
    match crate::storage::delete_prefix(storage.backend.as_ref(), &a.bucket, &a.prefix).await {
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
