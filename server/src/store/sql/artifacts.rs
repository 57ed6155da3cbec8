//! The SQL of [`Artifacts`], for both backends.

use super::*;
use crate::domain::{ArtifactKind, ArtifactState};

const ARTIFACT_COLS: &str = "id, task_id, tenant_id, attempt, kind, state, bucket, prefix, manifest, files, size_bytes, step, epoch, created_at, completed_at, node";

macro_rules! impl_artifacts {
    ($store:ty, $db:ty) => {
        #[async_trait]
        impl Artifacts for $store {
            async fn storage_bytes(&self, tenant_id: &str) -> StoreResult<i64> {
                let row: Option<(i64,)> = sqlx::query_as("SELECT bytes FROM tenant_storage WHERE tenant_id = $1")
                    .bind(tenant_id)
                    .fetch_optional(&self.pool)
                    .await?;
                Ok(row.map_or(0, |r| r.0))
            }

            async fn add_storage_bytes(&self, tenant_id: &str, delta: i64) -> StoreResult<()> {
                let mut tx = self.pool.begin_with(Self::BEGIN_WRITE).await?;
                sqlx::query("INSERT INTO tenant_storage (tenant_id, bytes) VALUES ($1, 0) ON CONFLICT (tenant_id) DO NOTHING")
                    .bind(tenant_id)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(
                    "UPDATE tenant_storage SET bytes = CASE WHEN bytes + $1 < 0 THEN 0 ELSE bytes + $1 END
                     WHERE tenant_id = $2",
                )
                .bind(delta)
                .bind(tenant_id)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(())
            }

            async fn reserve_storage_bytes(&self, tenant_id: &str, bytes: i64, limit: i64) -> StoreResult<bool> {
                let mut tx = self.pool.begin_with(Self::BEGIN_WRITE).await?;
                sqlx::query("INSERT INTO tenant_storage (tenant_id, bytes) VALUES ($1, 0) ON CONFLICT (tenant_id) DO NOTHING")
                    .bind(tenant_id)
                    .execute(&mut *tx)
                    .await?;
                let r = sqlx::query(
                    "UPDATE tenant_storage SET bytes = bytes + $1 WHERE tenant_id = $2 AND bytes + $1 <= $3",
                )
                .bind(bytes)
                .bind(tenant_id)
                .bind(limit)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(r.rows_affected() == 1)
            }

            async fn add_upload_bytes(&self, artifact_id: &str, bytes: i64) -> StoreResult<()> {
                sqlx::query("UPDATE artifacts SET size_bytes = size_bytes + $1 WHERE id = $2 AND state = 'uploading'")
                    .bind(bytes)
                    .bind(artifact_id)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn create_artifact(&self, a: &ArtifactRecord) -> StoreResult<()> {
                sqlx::query(&format!(
                    "INSERT INTO artifacts ({ARTIFACT_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)"
                ))
                .bind(&a.id)
                .bind(&a.task_id)
                .bind(&a.tenant_id)
                .bind(a.attempt)
                .bind(a.kind.as_str())
                .bind(a.state.as_str())
                .bind(&a.bucket)
                .bind(&a.prefix)
                .bind(&a.manifest)
                .bind(a.files)
                .bind(a.size_bytes)
                .bind(a.step)
                .bind(a.epoch)
                .bind(a.created_at)
                .bind(a.completed_at)
                .bind(&a.node)
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn artifact(&self, id: &str) -> StoreResult<Option<ArtifactRecord>> {
                Ok(sqlx::query_as(&format!("SELECT {ARTIFACT_COLS} FROM artifacts WHERE id = $1"))
                    .bind(id)
                    .fetch_optional(&self.pool)
                    .await?)
            }

            async fn complete_artifact(&self, a: &ArtifactRecord, now: i64) -> StoreResult<bool> {
                let mut tx = self.pool.begin_with(Self::BEGIN_WRITE).await?;
                let r = sqlx::query(
                    "UPDATE artifacts SET state = 'complete', manifest = $1, files = $2, size_bytes = $3, step = $4, epoch = $5, completed_at = $6
                     WHERE id = $7 AND state = 'uploading'
                       AND EXISTS (SELECT 1 FROM tasks WHERE tasks.id = artifacts.task_id AND tasks.attempts = artifacts.attempt)",
                )
                .bind(&a.manifest)
                .bind(a.files)
                .bind(a.size_bytes)
                .bind(a.step)
                .bind(a.epoch)
                .bind(now)
                .bind(&a.id)
                .execute(&mut *tx)
                .await?;
                if r.rows_affected() != 1 {
                    return Ok(false);
                }
                let size = bytesize::ByteSize(a.size_bytes.max(0) as u64).display().si().to_string();
                let step = a.step.map(|s| format!(", step {s}")).unwrap_or_default();
                let message = if a.kind == ArtifactKind::Checkpoint {
                    sqlx::query("UPDATE tasks SET last_checkpoint_at = $1 WHERE id = $2")
                        .bind(now)
                        .bind(&a.task_id)
                        .execute(&mut *tx)
                        .await?;
                    format!("checkpoint of attempt {} saved: {} files, {size}{step}", a.attempt, a.files)
                } else {
                    format!("results saved: {} files, {size}", a.files)
                };
                let kind = a.kind.as_str();
                insert_event!(&mut *tx, &a.task_id, now, kind, &message);
                tx.commit().await?;
                Ok(true)
            }

            async fn task_artifacts(&self, task_id: &str, kind: ArtifactKind) -> StoreResult<Vec<ArtifactRecord>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {ARTIFACT_COLS} FROM artifacts WHERE task_id = $1 AND kind = $2 AND state = 'complete'
                     ORDER BY completed_at DESC, created_at DESC"
                ))
                .bind(task_id)
                .bind(kind.as_str())
                .fetch_all(&self.pool)
                .await?)
            }

            async fn open_uploads(&self, task_id: &str, kind: ArtifactKind) -> StoreResult<Vec<ArtifactRecord>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {ARTIFACT_COLS} FROM artifacts WHERE task_id = $1 AND kind = $2 AND state = 'uploading'
                     ORDER BY created_at, id"
                ))
                .bind(task_id)
                .bind(kind.as_str())
                .fetch_all(&self.pool)
                .await?)
            }

            async fn set_artifact_state(&self, id: &str, from: ArtifactState, to: ArtifactState) -> StoreResult<bool> {
                let r = sqlx::query("UPDATE artifacts SET state = $1 WHERE id = $2 AND state = $3")
                    .bind(to.as_str())
                    .bind(id)
                    .bind(from.as_str())
                    .execute(&self.pool)
                    .await?;
                Ok(r.rows_affected() == 1)
            }

            async fn stale_uploads(&self, before: i64) -> StoreResult<Vec<ArtifactRecord>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {ARTIFACT_COLS} FROM artifacts WHERE (state = 'uploading' AND created_at < $1) OR state = 'deleting'"
                ))
                .bind(before)
                .fetch_all(&self.pool)
                .await?)
            }
        }
    };
}

impl_artifacts!(SqliteStore, sqlx::Sqlite);
impl_artifacts!(PostgresStore, sqlx::Postgres);
