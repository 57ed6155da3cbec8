//! The SQL of [`Tasks`], for both backends.

use super::task_rows::INSERT_ROWS;
use super::*;
use autodl_common::tasks::TaskState;

const TASK_COLS: &str = "t.id, t.number, t.tenant_id, t.user_id, t.name, t.state, t.spec, t.gpus_total, t.idempotency_key, \
     t.attempts, t.batch_size, t.placement, t.attained_gpu_seconds, t.last_checkpoint_at, t.created_at, \
     t.updated_at, t.started_at, t.finished_at, t.stop_reason, t.waiting, t.results";

/// States the scheduler still acts on.
const ACTIVE: &str = "('pending', 'scheduled', 'running')";

macro_rules! impl_tasks {
    ($store:ty, $db:ty) => {
        #[async_trait]
        impl Tasks for $store {
            async fn create_tasks(&self, batch: &[NewTask]) -> StoreResult<Vec<StoreResult<TaskCreated>>> {
                let mut tx = self.pool.begin_with(Self::BEGIN_WRITE).await?;
                let numbers = Self::take_numbers(&mut tx, batch).await?;
                let mut over: std::collections::HashMap<String, String> = std::collections::HashMap::new();
                let stored = if batch.iter().any(|n| n.caps.any()) {
                    let (capped, free): (Vec<NewTask>, Vec<NewTask>) =
                        batch.iter().cloned().partition(|n| n.caps.any());
                    let mut stored = Self::insert_tasks(&mut tx, &free, &numbers).await?;
                    // One at a time, each counted with all stored before it.
                    for n in capped {
                        match Self::over_cap(&mut tx, &n).await? {
                            Some(why) => {
                                over.insert(n.task.id.clone(), why);
                            }
                            None => stored.extend(Self::insert_tasks(&mut tx, std::slice::from_ref(&n), &numbers).await?),
                        }
                    }
                    stored
                } else {
                    Self::insert_tasks(&mut tx, batch, &numbers).await?
                };
                tx.commit().await?;
                let mut out = Vec::with_capacity(batch.len());
                for n in batch {
                    let t = &n.task;
                    if let Some(number) = stored.get(&t.id) {
                        out.push(Ok(TaskCreated::Created(*number)));
                        continue;
                    }
                    if let Some(why) = over.remove(&t.id) {
                        out.push(Ok(TaskCreated::OverCap(why)));
                        continue;
                    }
                    // Not stored: its idempotency key made a task before (else an id clash).
                    let existing: Option<TaskWithUser> = match &t.idempotency_key {
                        Some(key) => sqlx::query_as(&format!(
                            "SELECT {TASK_COLS}, u.email AS user_email FROM tasks t JOIN users u ON u.id = t.user_id
                             WHERE t.user_id = $1 AND t.idempotency_key = $2"
                        ))
                        .bind(&t.user_id)
                        .bind(key)
                        .fetch_optional(&self.pool)
                        .await?,
                        None => None,
                    };
                    out.push(
                        existing
                            .map(|e| TaskCreated::Existing(Box::new(e)))
                            .ok_or_else(|| StoreError::Conflict("the task could not be stored (an id clash); submit it again".into())),
                    );
                }
                Ok(out)
            }

            async fn task(&self, tenant_id: Option<&str>, id: &str) -> StoreResult<Option<TaskWithUser>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {TASK_COLS}, u.email AS user_email FROM tasks t JOIN users u ON u.id = t.user_id
                     WHERE t.id = $1 AND ($2 IS NULL OR t.tenant_id = $2)"
                ))
                .bind(id)
                .bind(tenant_id)
                .fetch_optional(&self.pool)
                .await?)
            }

            async fn tasks_meant(&self, tenant_id: &str, what: &crate::domain::TaskRef, limit: i64) -> StoreResult<Vec<TaskHandle>> {
                use crate::domain::TaskRef;
                let mut q = sqlx::QueryBuilder::<$db>::new("SELECT id, number, name FROM tasks WHERE tenant_id = ");
                q.push_bind(tenant_id);
                match what {
                    TaskRef::Id(id) => {
                        q.push(" AND id = ").push_bind(id);
                    }
                    TaskRef::Number(n) => {
                        q.push(" AND number = ").push_bind(*n);
                    }
                    TaskRef::PrefixOrName(s) => {
                        // Compared as text of a known length, not as a range: a range of
                        // strings orders by the database's collation, which need not be
                        // byte order (PostgreSQL's default locale is not).
                        q.push(format!(" AND (substr(id, 1, {}) = ", s.len()))
                            .push_bind(s.to_ascii_lowercase())
                            .push(" OR name = ")
                            .push_bind(s)
                            .push(")");
                    }
                    TaskRef::Name(s) => {
                        q.push(" AND name = ").push_bind(s);
                    }
                }
                q.push(" ORDER BY created_at DESC, id DESC LIMIT ").push_bind(limit);
                Ok(q.build_query_as().fetch_all(&self.pool).await?)
            }

            async fn list_tasks(&self, f: &TaskFilter) -> StoreResult<Vec<TaskWithUser>> {
                let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                    "SELECT {TASK_COLS}, u.email AS user_email FROM tasks t JOIN users u ON u.id = t.user_id WHERE t.tenant_id = "
                ));
                Self::push_task_filter(&mut q, f);
                if let Some((at, id)) = &f.before {
                    q.push(" AND (t.created_at < ")
                        .push_bind(*at)
                        .push(" OR (t.created_at = ")
                        .push_bind(*at)
                        .push(" AND t.id < ")
                        .push_bind(id)
                        .push("))");
                }
                q.push(" ORDER BY t.created_at DESC, t.id DESC LIMIT ").push_bind(f.limit);
                Ok(q.build_query_as().fetch_all(&self.pool).await?)
            }

            async fn count_tasks(&self, f: &TaskFilter) -> StoreResult<i64> {
                let mut q = sqlx::QueryBuilder::<$db>::new(
                    "SELECT COUNT(*) FROM tasks t WHERE t.tenant_id = ",
                );
                Self::push_task_filter(&mut q, f);
                let (n,): (i64,) = q.build_query_as().fetch_one(&self.pool).await?;
                Ok(n)
            }

            async fn count_pending(&self, user_id: &str, tenant_id: &str) -> StoreResult<(i64, i64)> {
                let (u, t): (i64, i64) = sqlx::query_as(
                    "SELECT COALESCE(SUM(CASE WHEN user_id = $1 THEN 1 ELSE 0 END), 0), COUNT(*)
                     FROM tasks WHERE tenant_id = $2 AND state = 'pending'",
                )
                .bind(user_id)
                .bind(tenant_id)
                .fetch_one(&self.pool)
                .await?;
                Ok((u, t))
            }

            async fn count_open_sessions(&self, user_id: &str) -> StoreResult<i64> {
                let (n,): (i64,) = sqlx::query_as(
                    "SELECT COUNT(*) FROM tasks WHERE user_id = $1 AND kind = 'session'
                     AND state IN ('pending', 'scheduled', 'running')",
                )
                .bind(user_id)
                .fetch_one(&self.pool)
                .await?;
                Ok(n)
            }

            async fn recent_run_times(&self, limit: i64) -> StoreResult<Vec<(String, i64)>> {
                Ok(sqlx::query_as(
                    "SELECT user_id, (finished_at - started_at) / 1000 FROM tasks
                     WHERE state = 'completed' AND started_at IS NOT NULL AND finished_at >= started_at
                     ORDER BY finished_at DESC LIMIT $1",
                )
                .bind(limit)
                .fetch_all(&self.sched)
                .await?)
            }

            async fn node_tasks(&self, node: &str) -> StoreResult<Vec<TaskRecord>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {TASK_COLS} FROM task_nodes n JOIN tasks t ON t.id = n.task_id
                     WHERE n.node_id = $1 AND t.state IN ('scheduled', 'running') ORDER BY t.created_at, t.id"
                ))
                .bind(node)
                .fetch_all(&self.pool)
                .await?)
            }

            async fn active_tasks(&self) -> StoreResult<Vec<TaskRecord>> {
                Ok(sqlx::query_as(&format!("SELECT {TASK_COLS} FROM tasks t WHERE t.state IN {ACTIVE} ORDER BY t.created_at, t.id"))
                    .fetch_all(&self.pool)
                    .await?)
            }

            async fn cancel_task(&self, tenant_id: &str, id: &str, now: i64) -> StoreResult<CancelOutcome> {
                let mut tx = self.pool.begin_with(Self::BEGIN_WRITE).await?;
                let r = sqlx::query(&format!(
                    "UPDATE tasks SET state = 'cancelled', placement = NULL, updated_at = $1, finished_at = $1
                     WHERE id = $2 AND tenant_id = $3 AND state IN {ACTIVE}"
                ))
                .bind(now)
                .bind(id)
                .bind(tenant_id)
                .execute(&mut *tx)
                .await?;
                if r.rows_affected() == 0 {
                    let state: Option<(String,)> = sqlx::query_as("SELECT state FROM tasks WHERE id = $1 AND tenant_id = $2")
                        .bind(id)
                        .bind(tenant_id)
                        .fetch_optional(&mut *tx)
                        .await?;
                    return Ok(match state {
                        None => CancelOutcome::NotFound,
                        Some((s,)) => CancelOutcome::AlreadyFinished(s),
                    });
                }
                settle_service!(&mut *tx, id);
                unplace!(&mut *tx, id);
                sqlx::query("UPDATE attempts SET ended_at = $1, reason = 'cancelled' WHERE task_id = $2 AND ended_at IS NULL")
                    .bind(now)
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                insert_event!(&mut *tx, id, now, "cancelled", "cancelled by the user");
                tx.commit().await?;
                Ok(CancelOutcome::Cancelled)
            }

            async fn task_states(&self, tenant_id: Option<&str>, ids: &[String]) -> StoreResult<Vec<(String, TaskState)>> {
                let mut out = Vec::with_capacity(ids.len());
                for chunk in ids.chunks(INSERT_ROWS) {
                    let mut q = sqlx::QueryBuilder::<$db>::new("SELECT id, state FROM tasks WHERE id IN (");
                    let mut list = q.separated(", ");
                    for id in chunk {
                        list.push_bind(id);
                    }
                    list.push_unseparated(")");
                    if let Some(t) = tenant_id {
                        q.push(" AND tenant_id = ").push_bind(t);
                    }
                    let rows: Vec<(String, String)> = q.build_query_as().fetch_all(&self.pool).await?;
                    out.extend(rows.into_iter().filter_map(|(id, s)| TaskState::parse(&s).map(|st| (id, st))));
                }
                Ok(out)
            }

            async fn end_unstarted(&self, id: &str, state: TaskState, message: &str, now: i64) -> StoreResult<bool> {
                let mut tx = self.pool.begin_with(Self::BEGIN_WRITE).await?;
                let r = sqlx::query(
                    "UPDATE tasks SET state = $1, updated_at = $2, finished_at = $2, waiting = NULL
                     WHERE id = $3 AND state = 'pending'",
                )
                .bind(state.as_str())
                .bind(now)
                .bind(id)
                .execute(&mut *tx)
                .await?;
                if r.rows_affected() != 1 {
                    return Ok(false);
                }
                insert_event!(&mut *tx, id, now, state.as_str(), message);
                tx.commit().await?;
                Ok(true)
            }

            async fn place_tasks(&self, term: Term, placing: &[Placing], now: i64) -> StoreResult<Vec<bool>> {
                let mut tx = self.sched.begin_with(Self::BEGIN_WRITE).await?;
                fence!(&mut *tx, term);
                // A few statements for the whole batch: one per row would make a cycle that
                // places thousands pay thousands of round trips.
                let mut placed: std::collections::HashSet<String> = std::collections::HashSet::new();
                for chunk in placing.chunks(INSERT_ROWS) {
                    let mut q = sqlx::QueryBuilder::<$db>::new("WITH v (id, placement) AS (");
                    q.push_values(chunk, |mut b, p| {
                        b.push_bind(&p.task).push_bind(&p.placement);
                    });
                    q.push(") UPDATE tasks SET state = 'scheduled', placement = v.placement, attempts = attempts + 1, updated_at = ");
                    q.push_bind(now);
                    q.push(", stop_reason = NULL, waiting = NULL FROM v WHERE tasks.id = v.id AND tasks.state = 'pending' RETURNING tasks.id");
                    let ids: Vec<(String,)> = q.build_query_as().fetch_all(&mut *tx).await?;
                    placed.extend(ids.into_iter().map(|(id,)| id));
                }
                let done: Vec<&Placing> = placing.iter().filter(|p| placed.contains(&p.task)).collect();
                for chunk in done.chunks(INSERT_ROWS) {
                    let mut q = sqlx::QueryBuilder::<$db>::new("WITH v (id, node, placement, gpus) AS (");
                    q.push_values(chunk, |mut b, p| {
                        b.push_bind(&p.task)
                            .push_bind(p.nodes.first().map_or("", String::as_str))
                            .push_bind(&p.placement)
                            .push_bind(p.gpus);
                    });
                    q.push(") INSERT INTO attempts (task_id, number, node, placement, gpus, started_at, batch_size) SELECT t.id, t.attempts, v.node, v.placement, v.gpus, ");
                    q.push_bind(now);
                    q.push(", t.batch_size FROM v JOIN tasks t ON t.id = v.id");
                    q.build().execute(&mut *tx).await?;

                    let on_nodes: Vec<(&str, &str)> = chunk
                        .iter()
                        .flat_map(|p| {
                            let mut nodes: Vec<&str> = p.nodes.iter().map(String::as_str).collect();
                            nodes.dedup();
                            nodes.into_iter().map(|n| (n, p.task.as_str()))
                        })
                        .collect();
                    for rows in on_nodes.chunks(INSERT_ROWS) {
                        let mut q = sqlx::QueryBuilder::<$db>::new("INSERT INTO task_nodes (node_id, task_id) ");
                        q.push_values(rows, |mut b, (n, t)| {
                            b.push_bind(*n).push_bind(*t);
                        });
                        q.push(" ON CONFLICT DO NOTHING");
                        q.build().execute(&mut *tx).await?;
                    }

                    let mut q = sqlx::QueryBuilder::<$db>::new("INSERT INTO task_events (task_id, at, kind, message) ");
                    q.push_values(chunk, |mut b, p| {
                        b.push_bind(&p.task)
                            .push_bind(now)
                            .push_bind("scheduled")
                            .push_bind(format!("placed on {}", p.nodes.first().map_or("", String::as_str)));
                    });
                    q.build().execute(&mut *tx).await?;
                }
                tx.commit().await?;
                Ok(placing.iter().map(|p| placed.contains(&p.task)).collect())
            }

            async fn requeue_task(&self, fence: Option<Term>, id: &str, reason: &str, message: &str, now: i64) -> StoreResult<bool> {
                let mut tx = self.pool.begin_with(Self::BEGIN_WRITE).await?;
                if let Some(term) = fence {
                    fence!(&mut *tx, term);
                }
                let r = sqlx::query(
                    "UPDATE tasks SET state = 'pending', placement = NULL, updated_at = $1, stop_reason = NULL
                     WHERE id = $2 AND state IN ('scheduled', 'running')",
                )
                .bind(now)
                .bind(id)
                .execute(&mut *tx)
                .await?;
                if r.rows_affected() != 1 {
                    return Ok(false);
                }
                settle_service!(&mut *tx, id);
                unplace!(&mut *tx, id);
                sqlx::query("UPDATE attempts SET ended_at = $1, reason = $2 WHERE task_id = $3 AND ended_at IS NULL")
                    .bind(now)
                    .bind(reason)
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                insert_event!(&mut *tx, id, now, reason, message);
                tx.commit().await?;
                Ok(true)
            }

            async fn mark_running_many(&self, starts: &[RunStart]) -> StoreResult<Vec<bool>> {
                let mut tx = self.pool.begin_with(Self::BEGIN_WRITE).await?;
                let mut marked = Vec::with_capacity(starts.len());
                for s in starts {
                    let r = sqlx::query(
                        "UPDATE tasks SET state = 'running', started_at = COALESCE(started_at, $1), updated_at = $1
                         WHERE id = $2 AND state = 'scheduled' AND attempts = $3",
                    )
                    .bind(s.at)
                    .bind(&s.task_id)
                    .bind(s.attempt)
                    .execute(&mut *tx)
                    .await?;
                    let started = r.rows_affected() == 1;
                    if started {
                        insert_event!(&mut *tx, &s.task_id, s.at, "running", &format!("attempt {} started", s.attempt));
                    }
                    marked.push(started);
                }
                tx.commit().await?;
                Ok(marked)
            }

            async fn finish_attempts(&self, ends: &[RunEnd]) -> StoreResult<Vec<bool>> {
                let mut tx = self.pool.begin_with(Self::BEGIN_WRITE).await?;
                let mut finished = Vec::with_capacity(ends.len());
                for RunEnd { task_id: id, attempt, end, at: now, results } in ends {
                    let ended = if end.next_state == TaskState::Pending { None } else { Some(*now) };
                    let r = sqlx::query(
                        "UPDATE tasks SET state = $1, placement = NULL, batch_size = $2, updated_at = $3, finished_at = $4, stop_reason = NULL, results = $7
                         WHERE id = $5 AND attempts = $6 AND state IN ('scheduled', 'running')",
                    )
                    .bind(end.next_state.as_str())
                    .bind(end.next_batch_size)
                    .bind(*now)
                    .bind(ended)
                    .bind(id)
                    .bind(*attempt)
                    .bind(results.as_deref())
                    .execute(&mut *tx)
                    .await?;
                    if r.rows_affected() != 1 {
                        finished.push(false);
                        continue;
                    }
                    settle_service!(&mut *tx, id);
                    unplace!(&mut *tx, id);
                    sqlx::query("UPDATE attempts SET ended_at = $1, exit_code = $2, reason = $3 WHERE task_id = $4 AND number = $5")
                        .bind(*now)
                        .bind(end.exit_code)
                        .bind(&end.reason)
                        .bind(id)
                        .bind(*attempt)
                        .execute(&mut *tx)
                        .await?;
                    let kind = if end.next_state == TaskState::Pending { "retrying" } else { end.next_state.as_str() };
                    insert_event!(&mut *tx, id, *now, kind, &end.message);
                    finished.push(true);
                }
                tx.commit().await?;
                Ok(finished)
            }

            async fn scheduling_tasks(&self) -> StoreResult<Vec<SchedulingTaskRecord>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {TASK_COLS}, a.started_at AS run_started_at, a.charged_until AS run_charged_until,
                            a.gpu_seconds AS run_gpu_seconds
                     FROM tasks t LEFT JOIN attempts a ON a.task_id = t.id AND a.number = t.attempts AND a.ended_at IS NULL
                     WHERE t.state IN {ACTIVE} ORDER BY t.created_at, t.id"
                ))
                .fetch_all(&self.sched)
                .await?)
            }

            async fn task_change_cursor(&self) -> StoreResult<i64> {
                Ok(sqlx::query_scalar(<$store>::CHANGE_CURSOR).fetch_one(&self.sched).await?)
            }

            async fn scheduling_task_changes(&self, cursor: i64) -> StoreResult<(Vec<SchedulingTaskRecord>, i64)> {
                // Where the next read starts is taken before this one: whatever commits
                // meanwhile is read (again) next time, never skipped.
                let next = self.task_change_cursor().await?;
                let rows = sqlx::query_as(&format!(
                    "SELECT {TASK_COLS}, a.started_at AS run_started_at, a.charged_until AS run_charged_until,
                            a.gpu_seconds AS run_gpu_seconds
                     FROM tasks t LEFT JOIN attempts a ON a.task_id = t.id AND a.number = t.attempts AND a.ended_at IS NULL
                     WHERE t.rev >= $1"
                ))
                .bind(cursor)
                .fetch_all(&self.sched)
                .await?;
                Ok((rows, next))
            }

            async fn last_held(&self, task_ids: &[String]) -> StoreResult<std::collections::HashMap<String, i64>> {
                let mut out = std::collections::HashMap::new();
                for chunk in task_ids.chunks(500) {
                    let mut q = sqlx::QueryBuilder::<$db>::new(
                        "SELECT task_id, MAX(at) FROM task_events WHERE kind IN ('shell', 'port_forward') AND task_id IN (",
                    );
                    let mut ids = q.separated(", ");
                    for id in chunk {
                        ids.push_bind(id);
                    }
                    q.push(") GROUP BY task_id");
                    let rows: Vec<(String, i64)> = q.build_query_as().fetch_all(&self.pool).await?;
                    out.extend(rows);
                }
                Ok(out)
            }

            async fn task_attempts(&self, id: &str) -> StoreResult<Vec<AttemptRecord>> {
                Ok(sqlx::query_as(
                    "SELECT task_id, number, node, placement, gpus, started_at, ended_at, exit_code, reason, batch_size, gpu_seconds
                     FROM attempts WHERE task_id = $1 ORDER BY number",
                )
                .bind(id)
                .fetch_all(&self.pool)
                .await?)
            }

            async fn set_stop_reason(&self, fence: Option<Term>, id: &str, reason: &str) -> StoreResult<bool> {
                let mut tx = self.pool.begin_with(Self::BEGIN_WRITE).await?;
                if let Some(term) = fence {
                    fence!(&mut *tx, term);
                }
                let r = sqlx::query(
                    "UPDATE tasks SET stop_reason = $1 WHERE id = $2 AND state IN ('scheduled', 'running') AND stop_reason IS NULL",
                )
                .bind(reason)
                .bind(id)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(r.rows_affected() == 1)
            }

            async fn set_waiting(&self, term: Term, changes: &[(String, Option<String>)]) -> StoreResult<()> {
                if changes.is_empty() {
                    return Ok(());
                }
                let mut tx = self.sched.begin_with(Self::BEGIN_WRITE).await?;
                fence!(&mut *tx, term);
                // Many rows to a statement: a cycle that explains thousands of new tasks
                // would otherwise spend longer writing than deciding.
                for chunk in changes.chunks(INSERT_ROWS) {
                    let mut q = sqlx::QueryBuilder::<$db>::new("WITH v (id, waiting) AS (");
                    q.push_values(chunk, |mut b, (id, waiting)| {
                        b.push_bind(id).push_bind(waiting);
                    });
                    q.push(
                        ") UPDATE tasks SET waiting = v.waiting FROM v
                         WHERE tasks.id = v.id AND tasks.state = 'pending'",
                    );
                    q.build().execute(&mut *tx).await?;
                }
                tx.commit().await?;
                Ok(())
            }
        }
    };
}

impl SqliteStore {
    /// Writers take turns, so every change committed later gets a higher revision.
    const CHANGE_CURSOR: &'static str = "SELECT COALESCE(MAX(rev), 0) + 1 FROM tasks";
    /// Evaluated by the INSERT, which holds the write lock: later than every committed change.
    pub(super) const NEW_TASK_REV: &'static str = "(SELECT COALESCE(MAX(rev), 0) + 1 FROM tasks)";
}

impl PostgresStore {
    /// The oldest transaction still running: one that commits later has this id or a higher one.
    const CHANGE_CURSOR: &'static str =
        "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint";
    /// The inserting transaction, as the update trigger records it.
    pub(super) const NEW_TASK_REV: &'static str = "pg_current_xact_id()::text::bigint";
}

impl SqliteStore {
    /// SQLite has one writer (and one server): a transaction begun with the write lock
    /// ([`SqliteStore::BEGIN_WRITE`]) already counts what no other can change.
    pub(super) const TENANT_LOCK: Option<&'static str> = None;
}

impl PostgresStore {
    /// Several servers may store an organization's submissions at once: a capped one is
    /// counted under a lock of its organization's, held to the end of the transaction.
    pub(super) const TENANT_LOCK: Option<&'static str> =
        Some("SELECT pg_advisory_xact_lock(7103, hashtext($1))");
}

impl_tasks!(SqliteStore, sqlx::Sqlite);
impl_tasks!(PostgresStore, sqlx::Postgres);
