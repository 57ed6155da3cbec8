//! The SQL of [`TaskJournal`], for both backends.

use super::*;

macro_rules! impl_journal {
    ($store:ty, $db:ty) => {
        #[async_trait]
        impl TaskJournal for $store {
            async fn task_events(&self, id: &str) -> StoreResult<Vec<EventRecord>> {
                Ok(sqlx::query_as("SELECT at, kind, message FROM task_events WHERE task_id = $1 ORDER BY id")
                    .bind(id)
                    .fetch_all(&self.pool)
                    .await?)
            }

            async fn add_event(&self, task_id: &str, kind: &str, message: &str, now: i64) -> StoreResult<()> {
                insert_event!(&self.pool, task_id, now, kind, message);
                Ok(())
            }

            async fn append_logs(&self, id: &str, attempt: i64, lines: &[NewLogLine]) -> StoreResult<()> {
                if lines.is_empty() {
                    return Ok(());
                }
                let mut q = sqlx::QueryBuilder::<$db>::new("INSERT INTO task_logs (task_id, attempt, rank, at, stream, line) ");
                q.push_values(lines, |mut b, l| {
                    b.push_bind(id).push_bind(attempt).push_bind(l.rank).push_bind(l.at).push_bind(&l.stream).push_bind(&l.line);
                });
                q.build().execute(&self.pool).await?;
                Ok(())
            }

            async fn task_logs(&self, id: &str, after: i64, limit: i64) -> StoreResult<Vec<LogRecord>> {
                Ok(sqlx::query_as(
                    "SELECT id, attempt, rank, at, stream, line FROM task_logs WHERE task_id = $1 AND id > $2 ORDER BY id LIMIT $3",
                )
                .bind(id)
                .bind(after)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?)
            }

            async fn add_metrics(&self, id: &str, samples: &[(i64, String)]) -> StoreResult<()> {
                if samples.is_empty() {
                    return Ok(());
                }
                let mut q = sqlx::QueryBuilder::<$db>::new("INSERT INTO task_metrics (task_id, at, sample) ");
                q.push_values(samples, |mut b, (at, sample)| {
                    b.push_bind(id).push_bind(*at).push_bind(sample);
                });
                q.build().execute(&self.pool).await?;
                Ok(())
            }

            async fn task_metrics(&self, id: &str, after: i64, limit: i64) -> StoreResult<Vec<MetricRecord>> {
                Ok(sqlx::query_as(
                    "SELECT at, sample FROM (SELECT id, at, sample FROM task_metrics WHERE task_id = $1 AND at > $2
                     ORDER BY at DESC, id DESC LIMIT $3) AS recent ORDER BY at, id",
                )
                .bind(id)
                .bind(after)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?)
            }

            async fn recent_metrics(&self, ids: &[String], per_task: i64) -> StoreResult<Vec<(String, MetricRecord)>> {
                // One index range per task (its newest rows), joined: never a scan of a long
                // run's whole history. SQLite takes at most 500 parts in one compound query.
                let mut out = Vec::new();
                for chunk in ids.chunks(100) {
                    let mut q = sqlx::QueryBuilder::<$db>::new("SELECT task_id, at, sample, id FROM (");
                    for (n, id) in chunk.iter().enumerate() {
                        if n > 0 {
                            q.push(" UNION ALL ");
                        }
                        q.push("SELECT * FROM (SELECT task_id, at, sample, id FROM task_metrics WHERE task_id = ");
                        q.push_bind(id);
                        q.push(" ORDER BY at DESC, id DESC LIMIT ");
                        q.push_bind(per_task);
                        q.push(format!(") AS t{n}"));
                    }
                    q.push(") AS recent ORDER BY task_id, at, id");
                    let rows: Vec<(String, i64, String, i64)> = q.build_query_as().fetch_all(&self.pool).await?;
                    out.extend(rows.into_iter().map(|(task, at, sample, _)| (task, MetricRecord { at, sample })));
                }
                Ok(out)
            }

            async fn task_metrics_window(&self, id: &str, from: i64, to: i64, limit: i64) -> StoreResult<Vec<MetricRecord>> {
                Ok(sqlx::query_as(
                    "SELECT at, sample FROM task_metrics WHERE task_id = $1 AND at >= $2 AND at <= $3
                     ORDER BY at, id LIMIT $4",
                )
                .bind(id)
                .bind(from)
                .bind(to)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?)
            }
        }
    };
}

impl_journal!(SqliteStore, sqlx::Sqlite);
impl_journal!(PostgresStore, sqlx::Postgres);
