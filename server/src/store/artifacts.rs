//! Checkpoints and results in object storage: uploads from start to commit, retention, and
//! the bytes each organization holds.

use async_trait::async_trait;

use super::*;
use crate::domain::{ArtifactKind, ArtifactState};

#[async_trait]
pub trait Artifacts: Send + Sync {
    /// Bytes the organization holds in object storage.
    async fn storage_bytes(&self, tenant_id: &str) -> StoreResult<i64>;
    /// Adds (or, negative, removes) bytes; the count never goes below zero.
    async fn add_storage_bytes(&self, tenant_id: &str, delta: i64) -> StoreResult<()>;
    /// Adds `bytes` only if the count stays within `limit`, in one statement (concurrent
    /// writes of one organization never pass its cap together); whether it did.
    async fn reserve_storage_bytes(
        &self,
        tenant_id: &str,
        bytes: i64,
        limit: i64,
    ) -> StoreResult<bool>;
    /// Bytes an open upload has received so far (counted against the quota as they came).
    async fn add_upload_bytes(&self, artifact_id: &str, bytes: i64) -> StoreResult<()>;
    async fn create_artifact(&self, a: &ArtifactRecord) -> StoreResult<()>;
    async fn artifact(&self, id: &str) -> StoreResult<Option<ArtifactRecord>>;
    /// Marks an uploading artifact complete (with an event on its task); `false` if it was not
    /// uploading or its attempt is no longer the task's current one (a late commit of an
    /// attempt that was already requeued). A complete checkpoint also becomes the task's
    /// `last_checkpoint_at`.
    async fn complete_artifact(&self, a: &ArtifactRecord, now: i64) -> StoreResult<bool>;
    /// Complete artifacts of a task of one kind, newest first.
    async fn task_artifacts(
        &self,
        task_id: &str,
        kind: ArtifactKind,
    ) -> StoreResult<Vec<ArtifactRecord>>;
    /// Uploads of a task and kind still in progress (not committed), oldest first.
    async fn open_uploads(
        &self,
        task_id: &str,
        kind: ArtifactKind,
    ) -> StoreResult<Vec<ArtifactRecord>>;
    /// Moves an artifact from state `from` to `to`; `false` if it was not in `from`.
    async fn set_artifact_state(
        &self,
        id: &str,
        from: ArtifactState,
        to: ArtifactState,
    ) -> StoreResult<bool>;
    /// Uploads started before `before` and never completed (their agent went away), and
    /// artifacts whose deletion did not finish.
    async fn stale_uploads(&self, before: i64) -> StoreResult<Vec<ArtifactRecord>>;
}
