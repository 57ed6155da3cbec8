//! The SQL of [`Usage`], for both backends.

use super::*;

const SAMPLE_COLS: &str =
    "node_id, gpu_index, at, util, mem_used, mem_total, temperature, power_w, task_id";

/// Runs charged per statement: five bound values each, well inside both backends' limits.
const CHARGE_ROWS: usize = 1000;

/// What follows the values `v (task_id, number, from_ms, charged_until, gpu_seconds)`: each
/// run is looked up by its key and charged only as the scheduler read it. The `+ 0` is there
/// for SQLite's planner, which would otherwise index `v` on `from_ms` and, for every
/// statement, walk every unsettled attempt through the partial index: runs charged at the
/// same second (a wave of starts) then cost 1.2 s for 6,500 of them, all under the write
/// lock every agent report waits for (50 ms by key).
fn charge_update(settles: bool) -> String {
    format!(
        ") UPDATE attempts SET charged_until = v.charged_until, gpu_seconds = v.gpu_seconds{}
         FROM v WHERE attempts.task_id = v.task_id AND attempts.number = v.number
           AND COALESCE(attempts.charged_until, attempts.started_at) = v.from_ms + 0
           AND attempts.settled = FALSE AND attempts.ended_at {}",
        if settles { ", settled = TRUE" } else { "" },
        if settles { "IS NOT NULL" } else { "IS NULL" },
    )
}

macro_rules! impl_usage {
    ($store:ty, $db:ty) => {
        #[async_trait]
        impl Usage for $store {
            async fn unsettled_runs(&self) -> StoreResult<Vec<UnsettledRunRecord>> {
                Ok(sqlx::query_as(
                    "SELECT a.task_id, a.number, t.user_id, t.tenant_id, t.spec, a.placement, a.started_at, a.ended_at,
                            a.charged_until, a.gpu_seconds
                     FROM attempts a JOIN tasks t ON t.id = a.task_id
                     WHERE a.settled = FALSE AND a.ended_at IS NOT NULL",
                )
                .fetch_all(&self.sched)
                .await?)
            }

            async fn task_utilization(&self, from: i64, to: i64) -> StoreResult<Vec<(String, f64)>> {
                Ok(sqlx::query_as(
                    "SELECT task_id, AVG(util) FROM gpu_samples
                     WHERE at > $1 AND at <= $2 AND task_id IS NOT NULL GROUP BY task_id",
                )
                .bind(from)
                .bind(to)
                .fetch_all(&self.sched)
                .await?)
            }

            async fn save_charges(
                &self,
                charges: &[RunChargeRecord],
                usage: &(dyn for<'x> Fn(&'x [usize]) -> Vec<UsageRecord> + Sync),
            ) -> StoreResult<Option<Vec<usize>>> {
                let mut tx = self.sched.begin_with(Self::BEGIN_WRITE).await?;
                // Running runs, many to a statement (each cycle charges every one of them), and
                // ended runs settled the same way (a cycle after a wave of ends settles
                // thousands). Each only as the scheduler read it: charged up to `from`, not
                // settled, and still running, or ended.
                let (settling, running): (Vec<(usize, &RunChargeRecord)>, Vec<(usize, &RunChargeRecord)>) =
                    charges.iter().enumerate().partition(|(_, c)| c.settles);
                let mut left_out = Vec::new();
                for (runs, settles) in [(&running, false), (&settling, true)] {
                    for chunk in runs.chunks(CHARGE_ROWS) {
                        let mut q = sqlx::QueryBuilder::<$db>::new(
                            "WITH v (task_id, number, from_ms, charged_until, gpu_seconds) AS (",
                        );
                        q.push_values(chunk, |mut b, (_, c)| {
                            b.push_bind(&c.task_id)
                                .push_bind(c.number)
                                .push_bind(c.from)
                                .push_bind(c.charged_until)
                                .push_bind(c.gpu_seconds);
                        });
                        q.push(charge_update(settles));
                        q.push(" RETURNING attempts.task_id, attempts.number");
                        let charged: std::collections::HashSet<(String, i64)> =
                            q.build_query_as().fetch_all(&mut *tx).await?.into_iter().collect();
                        if charged.len() == chunk.len() {
                            continue;
                        }
                        if settles {
                            // What an ended run owes joins its task's service: settled once,
                            // by whoever read it last.
                            tx.rollback().await?;
                            return Ok(None);
                        }
                        // A run that ended meanwhile is settled from what the store says by a
                        // later cycle; the others are not held back by it: with thousands
                        // running, one of them ends during most cycles. A run charged by
                        // someone else (another leader, for a moment) means this cycle's ledger
                        // is stale: nothing of it is kept.
                        for (i, c) in chunk.iter().filter(|(_, c)| !charged.contains(&(c.task_id.clone(), c.number))) {
                            let ended: Option<i64> = sqlx::query_scalar(
                                "SELECT number FROM attempts WHERE task_id = $1 AND number = $2 AND settled = FALSE
                                   AND ended_at IS NOT NULL AND COALESCE(charged_until, started_at) = $3",
                            )
                            .bind(&c.task_id)
                            .bind(c.number)
                            .bind(c.from)
                            .fetch_optional(&mut *tx)
                            .await?;
                            if ended.is_none() {
                                tx.rollback().await?;
                                return Ok(None);
                            }
                            left_out.push(*i);
                        }
                    }
                }
                let settling: Vec<&RunChargeRecord> = settling.into_iter().map(|(_, c)| c).collect();
                let usage = usage(&left_out);
                // A task whose two attempts settle at once gets both: one row per task.
                let mut attained: std::collections::BTreeMap<&str, f64> = std::collections::BTreeMap::new();
                for c in &settling {
                    *attained.entry(c.task_id.as_str()).or_default() += c.added;
                }
                let attained: Vec<(&str, f64)> = attained.into_iter().collect();
                for chunk in attained.chunks(CHARGE_ROWS) {
                    let mut q = sqlx::QueryBuilder::<$db>::new("WITH v (id, added) AS (");
                    q.push_values(chunk, |mut b, (id, added)| {
                        b.push_bind(*id).push_bind(*added);
                    });
                    q.push(
                        ") UPDATE tasks SET attained_gpu_seconds = tasks.attained_gpu_seconds + v.added FROM v
                         WHERE tasks.id = v.id",
                    );
                    q.build().execute(&mut *tx).await?;
                }
                for r in &usage {
                    sqlx::query(
                        "INSERT INTO usage (scope, subject_id, decayed_gpu_seconds, updated_at, window_alloc_gpu_seconds,
                            window_busy_gpu_seconds, month, month_gpu_seconds)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                         ON CONFLICT (scope, subject_id) DO UPDATE SET decayed_gpu_seconds = excluded.decayed_gpu_seconds,
                            updated_at = excluded.updated_at, window_alloc_gpu_seconds = excluded.window_alloc_gpu_seconds,
                            window_busy_gpu_seconds = excluded.window_busy_gpu_seconds, month = excluded.month,
                            month_gpu_seconds = excluded.month_gpu_seconds",
                    )
                    .bind(&r.scope)
                    .bind(&r.subject_id)
                    .bind(r.decayed_gpu_seconds)
                    .bind(r.updated_at)
                    .bind(r.window_alloc_gpu_seconds)
                    .bind(r.window_busy_gpu_seconds)
                    .bind(&r.month)
                    .bind(r.month_gpu_seconds)
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await?;
                Ok(Some(left_out))
            }

            async fn load_usage(&self) -> StoreResult<Vec<UsageRecord>> {
                Ok(sqlx::query_as(
                    "SELECT scope, subject_id, decayed_gpu_seconds, updated_at, window_alloc_gpu_seconds,
                            window_busy_gpu_seconds, month, month_gpu_seconds FROM usage",
                )
                .fetch_all(&self.sched)
                .await?)
            }

            async fn insert_gpu_samples(&self, samples: &[GpuSampleRecord]) -> StoreResult<()> {
                let mut tx = self.pool.begin_with(Self::BEGIN_WRITE).await?;
                // Parameters per statement are bounded (SQLite allows 32766): chunk the batch.
                for chunk in samples.chunks(3000) {
                    let mut q = sqlx::QueryBuilder::<$db>::new(format!("INSERT INTO gpu_samples ({SAMPLE_COLS}) "));
                    q.push_values(chunk, |mut b, s| {
                        b.push_bind(&s.node_id)
                            .push_bind(s.gpu_index)
                            .push_bind(s.at)
                            .push_bind(s.util)
                            .push_bind(s.mem_used)
                            .push_bind(s.mem_total)
                            .push_bind(s.temperature)
                            .push_bind(s.power_w)
                            .push_bind(&s.task_id);
                    });
                    q.build().execute(&mut *tx).await?;
                }
                tx.commit().await?;
                Ok(())
            }

            async fn task_gpu_samples(&self, task_id: &str, after: i64, limit: i64) -> StoreResult<Vec<GpuSampleRecord>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {SAMPLE_COLS} FROM (SELECT {SAMPLE_COLS} FROM gpu_samples WHERE task_id = $1 AND at > $2
                     ORDER BY at DESC LIMIT $3) AS recent ORDER BY at, gpu_index"
                ))
                .bind(task_id)
                .bind(after)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?)
            }

            async fn task_gpu_samples_window(&self, task_id: &str, from: i64, to: i64, limit: i64) -> StoreResult<Vec<GpuSampleRecord>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {SAMPLE_COLS} FROM gpu_samples WHERE task_id = $1 AND at >= $2 AND at <= $3
                     ORDER BY at, gpu_index LIMIT $4"
                ))
                .bind(task_id)
                .bind(from)
                .bind(to)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?)
            }

            async fn latest_gpu_utilization(&self, since: i64) -> StoreResult<Vec<(String, i64, f64)>> {
                // One row per GPU, found by the (node, GPU, time) index.
                Ok(sqlx::query_as(
                    "SELECT g.node_id, g.gpu_index, g.util FROM gpu_samples g
                     WHERE g.at >= $1 AND g.at = (SELECT MAX(l.at) FROM gpu_samples l
                         WHERE l.node_id = g.node_id AND l.gpu_index = g.gpu_index)",
                )
                .bind(since)
                .fetch_all(&self.pool)
                .await?)
            }

            async fn gpu_activity(&self, asks: &[ActivityAsk]) -> StoreResult<std::collections::HashMap<String, GpuActivity>> {
                let mut out = std::collections::HashMap::with_capacity(asks.len());
                for chunk in asks.chunks(CHARGE_ROWS) {
                    let mut q = sqlx::QueryBuilder::<$db>::new("WITH v (task_id, from_ms, busy) AS (");
                    q.push_values(chunk, |mut b, a| {
                        b.push_bind(&a.task_id).push_bind(a.from).push_bind(a.busy);
                    });
                    q.push(
                        ") SELECT v.task_id, MIN(s.at), MAX(s.at), MAX(CASE WHEN s.util >= v.busy THEN s.at END)
                         FROM v JOIN gpu_samples s ON s.task_id = v.task_id AND s.at >= v.from_ms
                         GROUP BY v.task_id",
                    );
                    let rows: Vec<(String, Option<i64>, Option<i64>, Option<i64>)> =
                        q.build_query_as().fetch_all(&self.sched).await?;
                    out.extend(rows.into_iter().map(|(id, first, last, last_busy)| {
                        (id, GpuActivity { first, last, last_busy })
                    }));
                }
                Ok(out)
            }

            async fn usage_attempts(&self, from: i64, to: i64) -> StoreResult<Vec<UsageAttemptRecord>> {
                Ok(sqlx::query_as(
                    "SELECT t.tenant_id, n.name AS tenant_name, t.user_id, u.email AS user_email,
                            a.gpus, a.started_at, a.ended_at
                     FROM attempts a
                     JOIN tasks t ON t.id = a.task_id
                     JOIN users u ON u.id = t.user_id
                     JOIN tenants n ON n.id = t.tenant_id
                     WHERE a.started_at < $2 AND (a.ended_at IS NULL OR a.ended_at > $1)
                     ORDER BY n.name, u.email",
                )
                .bind(from)
                .bind(to)
                .fetch_all(&self.pool)
                .await?)
            }

            async fn record_standings(&self, rows: &[StandingRecord]) -> StoreResult<()> {
                let mut tx = self.pool.begin_with(Self::BEGIN_WRITE).await?;
                for r in rows {
                    sqlx::query(
                        "INSERT INTO standings (user_id, tenant_id, at, fair_share, utilization)
                         VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                    )
                    .bind(&r.user_id)
                    .bind(&r.tenant_id)
                    .bind(r.at)
                    .bind(r.fair_share)
                    .bind(r.utilization)
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await?;
                Ok(())
            }

            async fn standings(&self, from: i64, to: i64) -> StoreResult<Vec<(StandingRecord, String)>> {
                #[derive(sqlx::FromRow)]
                struct Row {
                    #[sqlx(flatten)]
                    s: StandingRecord,
                    email: String,
                }
                let rows: Vec<Row> = sqlx::query_as(
                    "SELECT s.user_id, s.tenant_id, s.at, s.fair_share, s.utilization, u.email
                     FROM standings s JOIN users u ON u.id = s.user_id
                     WHERE s.at >= $1 AND s.at < $2 ORDER BY s.at, s.user_id",
                )
                .bind(from)
                .bind(to)
                .fetch_all(&self.pool)
                .await?;
                Ok(rows.into_iter().map(|r| (r.s, r.email)).collect())
            }

            async fn usage_utilization(
                &self,
                from: i64,
                to: i64,
                idle_below: f64,
            ) -> StoreResult<Vec<UsageUtilRecord>> {
                Ok(sqlx::query_as(
                    "SELECT user_id, SUM(s * u) / CAST(SUM(s) AS DOUBLE PRECISION) AS avg_util, CAST(SUM(s) AS BIGINT) AS samples,
                            CAST(SUM(CASE WHEN u < $3 THEN s ELSE 0 END) AS BIGINT) AS idle_samples
                     FROM (
                        SELECT t.user_id, g.util AS u, CAST(1 AS BIGINT) AS s
                        FROM gpu_samples g JOIN tasks t ON t.id = g.task_id
                        WHERE g.at >= $1 AND g.at < $2
                        UNION ALL
                        SELECT t.user_id, r.avg_util AS u, r.samples AS s
                        FROM task_util_rollups r JOIN tasks t ON t.id = r.task_id
                        WHERE r.hour >= $1 AND r.hour < $2
                     ) x
                     GROUP BY user_id",
                )
                .bind(from)
                .bind(to)
                .bind(idle_below)
                .fetch_all(&self.pool)
                .await?)
            }

            async fn compact_gpu_samples(&self, before: i64, rollups_before: i64) -> StoreResult<u64> {
                let mut tx = self.pool.begin_with(Self::BEGIN_WRITE).await?;
                sqlx::query(
                    "INSERT INTO gpu_rollups (node_id, gpu_index, hour, samples, avg_util, max_mem)
                     SELECT node_id, gpu_index, (at / 3600000) * 3600000, COUNT(*), AVG(util), MAX(mem_used)
                     FROM gpu_samples WHERE at < $1 GROUP BY node_id, gpu_index, (at / 3600000) * 3600000
                     ON CONFLICT (node_id, gpu_index, hour) DO UPDATE SET
                        avg_util = (gpu_rollups.avg_util * gpu_rollups.samples + excluded.avg_util * excluded.samples)
                                   / (gpu_rollups.samples + excluded.samples),
                        samples = gpu_rollups.samples + excluded.samples,
                        max_mem = CASE WHEN excluded.max_mem > gpu_rollups.max_mem THEN excluded.max_mem ELSE gpu_rollups.max_mem END",
                )
                .bind(before)
                .execute(&mut *tx)
                .await?;
                // Per task too: usage reports of past months need each user's utilization.
                sqlx::query(
                    "INSERT INTO task_util_rollups (task_id, hour, samples, avg_util)
                     SELECT task_id, (at / 3600000) * 3600000, COUNT(*), AVG(util)
                     FROM gpu_samples WHERE at < $1 AND task_id IS NOT NULL GROUP BY task_id, (at / 3600000) * 3600000
                     ON CONFLICT (task_id, hour) DO UPDATE SET
                        avg_util = (task_util_rollups.avg_util * task_util_rollups.samples + excluded.avg_util * excluded.samples)
                                   / (task_util_rollups.samples + excluded.samples),
                        samples = task_util_rollups.samples + excluded.samples",
                )
                .bind(before)
                .execute(&mut *tx)
                .await?;
                let r = sqlx::query("DELETE FROM gpu_samples WHERE at < $1").bind(before).execute(&mut *tx).await?;
                sqlx::query("DELETE FROM gpu_rollups WHERE hour < $1").bind(rollups_before).execute(&mut *tx).await?;
                sqlx::query("DELETE FROM task_util_rollups WHERE hour < $1").bind(rollups_before).execute(&mut *tx).await?;
                tx.commit().await?;
                Ok(r.rows_affected())
            }
        }
    };
}

impl_usage!(SqliteStore, sqlx::Sqlite);
impl_usage!(PostgresStore, sqlx::Postgres);

#[cfg(test)]
mod tests {
    use sqlx::Connection;

    use super::*;

    /// A full chunk of runs charged at the same second, as after a wave of starts: SQLite must
    /// find each by its key, not walk the unsettled attempts for every statement.
    #[tokio::test]
    async fn runs_are_charged_by_their_key_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/autodl.db", dir.path().display());
        // Migrated as the server migrates it.
        SqliteStore::open(&url, 1).await.unwrap();
        let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
        let values: Vec<String> = (0..CHARGE_ROWS)
            .map(|i| format!("('task-{i}', 1, 1000, 11000, 10.0)"))
            .collect();
        for settles in [false, true] {
            let sql = format!(
                "EXPLAIN QUERY PLAN WITH v (task_id, number, from_ms, charged_until, gpu_seconds) AS (VALUES {}{}",
                values.join(","),
                charge_update(settles)
            );
            let plan: Vec<(i64, i64, i64, String)> =
                sqlx::query_as(&sql).fetch_all(&mut conn).await.unwrap();
            let steps: Vec<&str> = plan.iter().map(|p| p.3.as_str()).collect();
            assert!(
                steps.iter().any(|s| s.starts_with("SEARCH attempts USING INDEX sqlite_autoindex_attempts_1 (task_id=? AND number=?)")),
                "{steps:?}"
            );
            assert!(!steps.iter().any(|s| s.contains("AUTOMATIC")), "{steps:?}");
        }
    }
}
