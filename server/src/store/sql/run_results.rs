//! The SQL of [`RunResults`], for both backends.

use super::*;

macro_rules! impl_run_results {
    ($store:ty, $db:ty) => {
        #[async_trait]
        impl RunResults for $store {
            async fn expire_uploading_results(
                &self,
                ended_before: i64,
                message: &str,
                now: i64,
            ) -> StoreResult<u64> {
                let mut tx = self.pool.begin_with(Self::BEGIN_WRITE).await?;
                let ids: Vec<(String,)> = sqlx::query_as(
                    "UPDATE tasks SET results = 'lost', updated_at = $1
                     WHERE results = 'uploading' AND finished_at < $2 RETURNING id",
                )
                .bind(now)
                .bind(ended_before)
                .fetch_all(&mut *tx)
                .await?;
                for (id,) in &ids {
                    insert_event!(&mut *tx, id, now, "results_lost", message);
                }
                tx.commit().await?;
                Ok(ids.len() as u64)
            }

            async fn end_part(&self, task_id: &str, attempt: i64, part: &PartEnded) -> StoreResult<Option<Vec<PartEnded>>> {
                let mut tx = self.pool.begin_with(Self::BEGIN_WRITE).await?;
                if let Some(lock) = Self::PART_LOCK {
                    sqlx::query(lock).bind(task_id).execute(&mut *tx).await?;
                }
                let r = sqlx::query(
                    "INSERT INTO attempt_parts (task_id, attempt, node, results_uploading, ended_at)
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (task_id, attempt, node) DO NOTHING",
                )
                .bind(task_id)
                .bind(attempt)
                .bind(&part.node)
                .bind(part.results_uploading)
                .bind(part.ended_at)
                .execute(&mut *tx)
                .await?;
                if r.rows_affected() == 0 {
                    return Ok(None);
                }
                let parts = sqlx::query_as(
                    "SELECT node, results_uploading, ended_at FROM attempt_parts
                     WHERE task_id = $1 AND attempt = $2 ORDER BY node",
                )
                .bind(task_id)
                .bind(attempt)
                .fetch_all(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(Some(parts))
            }

            async fn ended_parts(&self, task_id: &str, attempt: i64) -> StoreResult<Vec<PartEnded>> {
                Ok(sqlx::query_as(
                    "SELECT node, results_uploading, ended_at FROM attempt_parts
                     WHERE task_id = $1 AND attempt = $2 ORDER BY node",
                )
                .bind(task_id)
                .bind(attempt)
                .fetch_all(&self.pool)
                .await?)
            }

            async fn part_results_settled(&self, task_id: &str, attempt: i64, node: &str) -> StoreResult<()> {
                sqlx::query(
                    "UPDATE attempt_parts SET results_uploading = FALSE
                     WHERE task_id = $1 AND attempt = $2 AND node = $3",
                )
                .bind(task_id)
                .bind(attempt)
                .bind(node)
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn settle_results(
                &self,
                task_id: &str,
                attempt: i64,
                results: Option<&str>,
                message: &str,
                now: i64,
            ) -> StoreResult<bool> {
                let mut tx = self.pool.begin_with(Self::BEGIN_WRITE).await?;
                let r = sqlx::query(
                    "UPDATE tasks SET results = $1, updated_at = $2 WHERE id = $3 AND attempts = $4 AND results = 'uploading'",
                )
                .bind(results)
                .bind(now)
                .bind(task_id)
                .bind(attempt)
                .execute(&mut *tx)
                .await?;
                if r.rows_affected() != 1 {
                    return Ok(false);
                }
                let kind = if results.is_some() { "results_lost" } else { "results_saved" };
                insert_event!(&mut *tx, task_id, now, kind, message);
                tx.commit().await?;
                Ok(true)
            }
        }
    };
}

impl SqliteStore {
    /// One writer at a time already (see [`SqliteStore::TENANT_LOCK`]).
    const PART_LOCK: Option<&'static str> = None;
}

impl PostgresStore {
    /// The parts of a task's attempt are recorded one at a time: two nodes reporting their
    /// last parts together cannot both see the attempt's end.
    const PART_LOCK: Option<&'static str> =
        Some("SELECT pg_advisory_xact_lock(7104, hashtext($1))");
}

impl_run_results!(SqliteStore, sqlx::Sqlite);
impl_run_results!(PostgresStore, sqlx::Postgres);
