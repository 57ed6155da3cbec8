//! The SQL of [`Sweeps`], for both backends.

use super::*;
use autodl_common::tasks::TaskState;

macro_rules! impl_sweeps {
    ($store:ty, $db:ty) => {
        #[async_trait]
        impl Sweeps for $store {
            async fn create_sweep(&self, sweep: &SweepRecord, trials: &[NewTask]) -> StoreResult<()> {
                let mut tx = self.pool.begin_with(Self::BEGIN_WRITE).await?;
                let numbers = Self::take_numbers(&mut tx, trials).await?;
                sqlx::query(
                    "INSERT INTO sweeps (id, tenant_id, user_id, name, method, parameters, max_concurrency, trials, created_at, objective)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                )
                .bind(&sweep.id)
                .bind(&sweep.tenant_id)
                .bind(&sweep.user_id)
                .bind(&sweep.name)
                .bind(&sweep.method)
                .bind(&sweep.parameters)
                .bind(sweep.max_concurrency)
                .bind(sweep.trials)
                .bind(sweep.created_at)
                .bind(&sweep.objective)
                .execute(&mut *tx)
                .await?;
                let stored = Self::insert_tasks(&mut tx, trials, &numbers).await?;
                if stored.len() != trials.len() {
                    return Err(StoreError::Conflict("a trial could not be stored (an id clash); submit the sweep again".into()));
                }
                tx.commit().await?;
                Ok(())
            }

            async fn sweep(&self, tenant_id: &str, id: &str) -> StoreResult<Option<SweepWithUser>> {
                Ok(sqlx::query_as(
                    "SELECT s.*, u.email AS user_email FROM sweeps s JOIN users u ON u.id = s.user_id
                     WHERE s.tenant_id = $1 AND s.id = $2",
                )
                .bind(tenant_id)
                .bind(id)
                .fetch_optional(&self.pool)
                .await?)
            }

            async fn list_sweeps(&self, tenant_id: &str, limit: i64) -> StoreResult<Vec<SweepWithUser>> {
                Ok(sqlx::query_as(
                    "SELECT s.*, u.email AS user_email FROM sweeps s JOIN users u ON u.id = s.user_id
                     WHERE s.tenant_id = $1 ORDER BY s.created_at DESC, s.id DESC LIMIT $2",
                )
                .bind(tenant_id)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?)
            }

            async fn sweep_states(&self, tenant_id: &str, sweep_ids: &[String]) -> StoreResult<Vec<(String, TaskState, i64)>> {
                if sweep_ids.is_empty() {
                    return Ok(Vec::new());
                }
                let mut q = sqlx::QueryBuilder::<$db>::new(
                    "SELECT l.value, t.state, COUNT(*) FROM task_labels l JOIN tasks t ON t.id = l.task_id
                     WHERE l.key = 'sweep' AND t.tenant_id = ",
                );
                q.push_bind(tenant_id).push(" AND l.value IN (");
                let mut sep = q.separated(", ");
                for id in sweep_ids {
                    sep.push_bind(id);
                }
                q.push(") GROUP BY l.value, t.state");
                let rows: Vec<(String, String, i64)> = q.build_query_as().fetch_all(&self.pool).await?;
                Ok(rows
                    .into_iter()
                    .filter_map(|(id, state, n)| TaskState::parse(&state).map(|s| (id, s, n)))
                    .collect())
            }

            async fn record_rungs(&self, sweep_id: &str, task_id: &str, rungs: &[(i64, f64)], at: i64) -> StoreResult<Vec<i64>> {
                if rungs.is_empty() {
                    return Ok(Vec::new());
                }
                let mut q = sqlx::QueryBuilder::<$db>::new("INSERT INTO sweep_rungs (sweep_id, task_id, rung, value, at) ");
                q.push_values(rungs, |mut b, (rung, value)| {
                    b.push_bind(sweep_id).push_bind(task_id).push_bind(*rung).push_bind(*value).push_bind(at);
                });
                q.push(" ON CONFLICT DO NOTHING RETURNING rung");
                let new: Vec<(i64,)> = q.build_query_as().fetch_all(&self.pool).await?;
                Ok(new.into_iter().map(|(r,)| r).collect())
            }

            async fn rung_values_before(&self, sweep_id: &str, rung: i64, task_id: &str) -> StoreResult<Vec<f64>> {
                let rows: Vec<(f64,)> = sqlx::query_as(
                    "SELECT o.value FROM sweep_rungs o JOIN sweep_rungs m ON m.task_id = $3 AND m.rung = $2
                     WHERE o.sweep_id = $1 AND o.rung = $2 AND o.task_id <> $3
                       AND (o.at < m.at OR (o.at = m.at AND o.task_id < m.task_id))",
                )
                .bind(sweep_id)
                .bind(rung)
                .bind(task_id)
                .fetch_all(&self.pool)
                .await?;
                Ok(rows.into_iter().map(|(v,)| v).collect())
            }

            async fn record_stop(&self, sweep_id: &str, task_id: &str, message: &str, at: i64) -> StoreResult<()> {
                sqlx::query(
                    "INSERT INTO sweep_stops (task_id, sweep_id, message, at) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                )
                .bind(task_id)
                .bind(sweep_id)
                .bind(message)
                .bind(at)
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn sweep_stops(&self, sweep_id: &str) -> StoreResult<Vec<(String, String)>> {
                Ok(sqlx::query_as("SELECT task_id, message FROM sweep_stops WHERE sweep_id = $1")
                    .bind(sweep_id)
                    .fetch_all(&self.pool)
                    .await?)
            }
        }
    };
}

impl_sweeps!(SqliteStore, sqlx::Sqlite);
impl_sweeps!(PostgresStore, sqlx::Postgres);
