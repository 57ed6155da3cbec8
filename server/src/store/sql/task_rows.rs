//! How new tasks are written, for submissions and sweeps alike: each organization's caps
//! checked under its lock inside the transaction, rows inserted many at a time; and the
//! filter that listing and counting share.

use super::*;

/// Rows per multi-row INSERT: well inside both backends' limits on bound values (17 per task).
pub(super) const INSERT_ROWS: usize = 500;

macro_rules! impl_task_rows {
    ($store:ty, $db:ty) => {
        impl $store {
            /// A filter's conditions after `WHERE t.tenant_id = `: listing and counting share
            /// them, so the total is of exactly what the pages show.
            pub(super) fn push_task_filter<'a>(q: &mut sqlx::QueryBuilder<'a, $db>, f: &'a TaskFilter) {
                q.push_bind(&f.tenant_id);
                if let Some(state) = &f.state {
                    q.push(" AND t.state = ").push_bind(state.as_str());
                }
                if let Some(user) = &f.user_id {
                    q.push(" AND t.user_id = ").push_bind(user);
                }
                if let Some((k, v)) = &f.label {
                    q.push(" AND EXISTS (SELECT 1 FROM task_labels l WHERE l.task_id = t.id AND l.key = ")
                        .push_bind(k)
                        .push(" AND l.value = ")
                        .push_bind(v)
                        .push(")");
                }
            }

            /// Why `n` may not be stored now, by its caps and what `tx` sees (other servers'
            /// submissions of the organization wait for this transaction: see `TENANT_LOCK`).
            pub(super) async fn over_cap(tx: &mut sqlx::Transaction<'_, $db>, n: &NewTask) -> StoreResult<Option<String>> {
                let t = &n.task;
                if let Some(lock) = Self::TENANT_LOCK {
                    sqlx::query(lock).bind(&t.tenant_id).execute(&mut **tx).await?;
                }
                let (mine, tenant): (i64, i64) = sqlx::query_as(
                    "SELECT COALESCE(SUM(CASE WHEN user_id = $1 THEN 1 ELSE 0 END), 0), COUNT(*)
                     FROM tasks WHERE tenant_id = $2 AND state = 'pending'",
                )
                .bind(&t.user_id)
                .bind(&t.tenant_id)
                .fetch_one(&mut **tx)
                .await?;
                if let Some(cap) = n.caps.user_queued.filter(|c| mine >= *c) {
                    return Ok(Some(format!("you already have {mine} queued tasks (your cap is {cap})")));
                }
                if let Some(cap) = n.caps.tenant_queued.filter(|c| tenant >= *c) {
                    return Ok(Some(format!("your organization already has {tenant} queued tasks (cap {cap})")));
                }
                if let Some(cap) = n.caps.user_sessions {
                    let (open,): (i64,) = sqlx::query_as(
                        "SELECT COUNT(*) FROM tasks WHERE user_id = $1 AND kind = 'session'
                         AND state IN ('pending', 'scheduled', 'running')",
                    )
                    .bind(&t.user_id)
                    .fetch_one(&mut **tx)
                    .await?;
                    if open >= cap {
                        return Ok(Some(format!(
                            "you have {open} session(s) pending or running; your organization allows {cap} \
                             per member (stop one with `autodl cancel`)"
                        )));
                    }
                }
                Ok(None)
            }

            /// Reserves the next numbers of each task's organization for every task of
            /// `batch` (answered by task id). Each organization's counter moves once, in the
            /// order of their ids, and its row stays locked until `tx` ends: done first in a
            /// transaction, before any other lock (an organization's cap lock included), so two
            /// servers' batches always lock in the same order and never wait on each other in
            /// a circle.
            pub(super) async fn take_numbers(
                tx: &mut sqlx::Transaction<'_, $db>,
                batch: &[NewTask],
            ) -> StoreResult<std::collections::HashMap<String, i64>> {
                let mut wanted: std::collections::BTreeMap<&str, i64> = std::collections::BTreeMap::new();
                for n in batch {
                    *wanted.entry(n.task.tenant_id.as_str()).or_default() += 1;
                }
                let mut next: std::collections::HashMap<&str, i64> = std::collections::HashMap::new();
                for (tenant, count) in wanted {
                    let (last,): (i64,) = sqlx::query_as(
                        "INSERT INTO task_numbers (tenant_id, last) VALUES ($1, $2)
                         ON CONFLICT (tenant_id) DO UPDATE SET last = task_numbers.last + excluded.last
                         RETURNING last",
                    )
                    .bind(tenant)
                    .bind(count)
                    .fetch_one(&mut **tx)
                    .await?;
                    next.insert(tenant, last - count + 1);
                }
                Ok(batch
                    .iter()
                    .map(|n| {
                        let at = next.entry(n.task.tenant_id.as_str()).or_default();
                        *at += 1;
                        (n.task.id.clone(), *at - 1)
                    })
                    .collect())
            }

            /// Inserts new tasks, their labels and their first event inside `tx`; answers the
            /// ids stored with their numbers (a repeated idempotency key stores nothing, and
            /// the number it was given stays unused).
            pub(super) async fn insert_tasks(
                tx: &mut sqlx::Transaction<'_, $db>,
                batch: &[NewTask],
                numbers: &std::collections::HashMap<String, i64>,
            ) -> StoreResult<std::collections::HashMap<String, i64>> {
                let mut stored: std::collections::HashMap<String, i64> = std::collections::HashMap::new();
                for chunk in batch.chunks(INSERT_ROWS) {
                    let mut q = sqlx::QueryBuilder::<$db>::new(
                        "INSERT INTO tasks (id, tenant_id, user_id, name, state, spec, gpus_total, idempotency_key, attempts,
                            batch_size, placement, attained_gpu_seconds, last_checkpoint_at, created_at, updated_at, started_at, finished_at,
                            kind, number, rev) ",
                    );
                    q.push_values(chunk, |mut b, n| {
                        let number = numbers.get(&n.task.id).copied().unwrap_or_default();
                        let t = &n.task;
                        b.push_bind(&t.id)
                            .push_bind(&t.tenant_id)
                            .push_bind(&t.user_id)
                            .push_bind(&t.name)
                            .push_bind(t.state.as_str())
                            .push_bind(t.spec.text())
                            .push_bind(t.gpus_total)
                            .push_bind(&t.idempotency_key)
                            .push_bind(t.attempts)
                            .push_bind(t.batch_size)
                            .push_bind(t.placement.is_some().then(|| t.placement.text()))
                            .push_bind(t.attained_gpu_seconds)
                            .push_bind(t.last_checkpoint_at)
                            .push_bind(t.created_at)
                            .push_bind(t.updated_at)
                            .push_bind(t.started_at)
                            .push_bind(t.finished_at)
                            .push_bind(n.kind.as_str())
                            .push_bind(number)
                            .push(<$store>::NEW_TASK_REV);
                    });
                    // A repeated idempotency key stores nothing; the task it made is read below.
                    q.push(" ON CONFLICT DO NOTHING RETURNING id, number");
                    let ids: Vec<(String, i64)> = q.build_query_as().fetch_all(&mut **tx).await?;
                    stored.extend(ids);
                }
                let new: Vec<&NewTask> = batch.iter().filter(|n| stored.contains_key(&n.task.id)).collect();
                let labels: Vec<(&str, &str, &str)> = new
                    .iter()
                    .flat_map(|n| n.labels.iter().map(|(k, v)| (n.task.id.as_str(), k.as_str(), v.as_str())))
                    .collect();
                for chunk in labels.chunks(INSERT_ROWS) {
                    let mut q = sqlx::QueryBuilder::<$db>::new("INSERT INTO task_labels (task_id, key, value) ");
                    q.push_values(chunk, |mut b, (id, k, v)| {
                        b.push_bind(*id).push_bind(*k).push_bind(*v);
                    });
                    q.build().execute(&mut **tx).await?;
                }
                for chunk in new.chunks(INSERT_ROWS) {
                    let mut q = sqlx::QueryBuilder::<$db>::new("INSERT INTO task_events (task_id, at, kind, message) ");
                    q.push_values(chunk, |mut b, n| {
                        b.push_bind(&n.task.id)
                            .push_bind(n.task.created_at)
                            .push_bind("submitted")
                            .push_bind("task submitted");
                    });
                    q.build().execute(&mut **tx).await?;
                }
                Ok(stored)
            }
        }
    };
}

impl_task_rows!(SqliteStore, sqlx::Sqlite);
impl_task_rows!(PostgresStore, sqlx::Postgres);
