//! Periodic upkeep the leader does beside scheduling: folding old GPU samples into rollups
//! and removing uploads that were never completed.

use std::sync::Arc;
use std::time::Duration;

use crate::config::Settings;
use crate::storage::Storage;
use crate::store::Store;
use crate::tasks::checkpoints::discard_upload;

const DAY_MS: i64 = 86_400_000;
/// How long the server waits for results a node kept after their run ended.
pub const RESULTS_WAIT_DAYS: i64 = 7;

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
    // Results a node kept after their run ended and never sent (it is gone, or its disk was
    // wiped): the task says so rather than "uploading" for ever. Agents keep them 3 days by
    // default (`--keep-results-for`) and say when they give up; this bounds the rest.
    let expired = store
        .expire_uploading_results(
            now_ms - RESULTS_WAIT_DAYS * DAY_MS,
            &format!(
                "its results could not be kept: their node did not upload them within {RESULTS_WAIT_DAYS} days of the run's end"
            ),
            now_ms,
        )
        .await?;
    if expired > 0 {
        tracing::warn!(expired, "gave up results their nodes never uploaded");
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
