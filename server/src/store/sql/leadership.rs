//! Leadership on each backend: PostgreSQL elects one leader among replicas with an advisory
//! lock held on a connection of its own; SQLite serves one server, always the leader, with a new
//! term at each start.

use std::sync::Arc;

use super::*;

const NEW_TERM: &str = "UPDATE scheduler_leader SET term = term + 1, holder = $1, since = $2 WHERE id = 1 RETURNING term";
/// PostgreSQL's clock in milliseconds: leases and heartbeats are stamped and judged by the one
/// clock every replica shares.
const DB_NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// How long a leader may go without renewing its lease before a follower takes over, and how
/// often it renews. A frozen leader (SIGSTOP, a paused VM) keeps its lock connection, which
/// PostgreSQL sees alive; only the lease tells it has stopped. Two renewals may be missed (a
/// slow database moment) before it is deposed; its stale writes are fenced by the term. A
/// follower asks every second: placement stops for at most about four seconds.
pub const LEASE: Duration = Duration::from_secs(3);
const RENEW_EVERY: Duration = Duration::from_secs(1);

/// What holds a PostgreSQL leadership: the connection with the advisory lock (renewing the
/// lease on it, so the lease lives no longer than the lock) and the renewal task's stop.
struct PgHold {
    conn: Arc<tokio::sync::Mutex<sqlx::PgConnection>>,
    _renewing: tokio_util::sync::DropGuard,
}
const CURRENT_TERM: &str = "SELECT term FROM scheduler_leader WHERE id = 1";
/// The channel of PostgreSQL notifications between the servers of one database.
const CHANNEL: &str = "autodl";

/// Key of the PostgreSQL advisory lock that elects the scheduler leader among replicas.
const LEADER_LOCK_KEY: i64 = 0x6175_746f_646c;

#[async_trait]
impl Leadership for SqliteStore {
    /// SQLite serves one server process, which is therefore always the leader; each start is
    /// a new term all the same, so writes of a runner left over from before are refused.
    async fn try_lead(&self, holder: &str, now: i64) -> StoreResult<Option<LeaderGuard>> {
        let (term,): (i64,) = sqlx::query_as(NEW_TERM)
            .bind(holder)
            .bind(now)
            .fetch_one(&self.pool)
            .await?;
        Ok(Some(LeaderGuard {
            term: Term(term),
            hold: Box::new(()),
        }))
    }

    async fn still_leads(&self, guard: &mut LeaderGuard) -> StoreResult<bool> {
        let (term,): (i64,) = sqlx::query_as(CURRENT_TERM).fetch_one(&self.pool).await?;
        Ok(term == guard.term.0)
    }

    async fn resign(&self, _guard: LeaderGuard) -> StoreResult<()> {
        Ok(())
    }

    async fn publish(&self, _payload: &str) -> StoreResult<()> {
        Ok(())
    }

    async fn subscribe(&self) -> StoreResult<Option<tokio::sync::mpsc::Receiver<String>>> {
        Ok(None)
    }

    async fn cycled(&self, term: Term, now: i64) -> StoreResult<()> {
        sqlx::query("UPDATE scheduler_leader SET last_cycle_at = $1 WHERE id = 1 AND term = $2")
            .bind(now)
            .bind(term.0)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn leader_status(&self, now: i64) -> StoreResult<LeaderStatus> {
        let (holder, term, last): (String, i64, i64) =
            sqlx::query_as("SELECT holder, term, last_cycle_at FROM scheduler_leader WHERE id = 1")
                .fetch_one(&self.pool)
                .await?;
        Ok(LeaderStatus {
            holder,
            term,
            lease_age_ms: None,
            last_cycle_age_ms: (last > 0).then(|| (now - last).max(0)),
        })
    }
}

#[async_trait]
impl Leadership for PostgresStore {
    /// Takes the advisory lock on a connection of its own, kept out of the pool: the lock lives
    /// as long as that connection, so a crashed leader's lock goes with its connection.
    ///
    /// A leader whose lease has expired (see [`LEASE`]) still holds the lock when it is
    /// frozen rather than dead: its lock connection is ended here (`pg_terminate_backend`,
    /// allowed on the same role's sessions), which frees the lock and fences it.
    async fn try_lead(&self, holder: &str, now: i64) -> StoreResult<Option<LeaderGuard>> {
        let mut conn = self.pool.acquire().await?;
        let mut ok = try_lock(&mut conn).await?;
        if !ok {
            let (old, renewed, age): (String, i64, i64) = sqlx::query_as(&format!(
                "SELECT holder, renewed_at, {DB_NOW_MS} - renewed_at FROM scheduler_leader WHERE id = 1"
            ))
            .fetch_one(&mut *conn)
            .await?;
            // A leader that never renewed speaks no lease (a version before them): left be.
            if renewed == 0 || age <= LEASE.as_millis() as i64 {
                return Ok(None);
            }
            tracing::warn!(
                leader = old,
                silent_ms = age,
                "the scheduler leader has not renewed its lease: ending its sessions to take over"
            );
            // Every session of that server (they share its name, see `PostgresStore::open`):
            // one frozen inside a transaction would hold its row locks against this leader.
            // Then the lock's own session, whatever its name.
            const LOCK_HOLDER: &str =
                "SELECT l.pid FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted
                 AND l.classid = ($1::bigint)::oid AND l.objid = ($2::bigint)::oid
                 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())";
            sqlx::query(&format!(
                "SELECT pg_terminate_backend(a.pid) FROM pg_stat_activity a
                 WHERE a.pid <> pg_backend_pid() AND a.application_name LIKE 'autodl-%'
                   AND a.application_name IN (
                     SELECT s.application_name FROM pg_stat_activity s WHERE s.pid IN ({LOCK_HOLDER}))"
            ))
            .bind(LEADER_LOCK_KEY >> 32)
            .bind(LEADER_LOCK_KEY & 0xffff_ffff)
            .execute(&mut *conn)
            .await?;
            sqlx::query(&format!(
                "SELECT pg_terminate_backend(pid) FROM ({LOCK_HOLDER}) h"
            ))
            .bind(LEADER_LOCK_KEY >> 32)
            .bind(LEADER_LOCK_KEY & 0xffff_ffff)
            .execute(&mut *conn)
            .await?;
            // The lock goes once PostgreSQL has ended that session: a moment.
            for _ in 0..20 {
                ok = try_lock(&mut conn).await?;
                if ok {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if !ok {
                return Ok(None);
            }
        }
        let mut conn = conn.detach();
        let (term,): (i64,) = sqlx::query_as(NEW_TERM)
            .bind(holder)
            .bind(now)
            .fetch_one(&mut conn)
            .await?;
        sqlx::query(&format!(
            "UPDATE scheduler_leader SET renewed_at = {DB_NOW_MS} WHERE id = 1"
        ))
        .execute(&mut conn)
        .await?;
        let conn = Arc::new(tokio::sync::Mutex::new(conn));
        let stop = tokio_util::sync::CancellationToken::new();
        tokio::spawn(renew_lease(conn.clone(), Term(term), stop.clone()));
        Ok(Some(LeaderGuard {
            term: Term(term),
            hold: Box::new(PgHold {
                conn,
                _renewing: stop.drop_guard(),
            }),
        }))
    }

    /// Asked on the lock's own connection: if that connection was cut (the lock with it),
    /// the query fails and this server is no longer the leader.
    async fn still_leads(&self, guard: &mut LeaderGuard) -> StoreResult<bool> {
        let Some(hold) = guard.hold.downcast_ref::<PgHold>() else {
            return Ok(false);
        };
        let mut conn = hold.conn.lock().await;
        let asked = tokio::time::timeout(
            Duration::from_secs(5),
            sqlx::query_as::<_, (i64,)>(CURRENT_TERM).fetch_one(&mut *conn),
        )
        .await;
        Ok(matches!(asked, Ok(Ok((term,))) if term == guard.term.0))
    }

    /// Unlocks before closing: closing alone frees the lock only once PostgreSQL has ended the
    /// connection's backend, a moment later, and a successor that asks in between is refused.
    async fn resign(&self, guard: LeaderGuard) -> StoreResult<()> {
        if let Ok(hold) = guard.hold.downcast::<PgHold>() {
            let PgHold {
                conn,
                _renewing: renewing,
            } = *hold;
            drop(renewing);
            let mut conn = conn.lock().await;
            sqlx::query("SELECT pg_advisory_unlock($1)")
                .bind(LEADER_LOCK_KEY)
                .execute(&mut *conn)
                .await?;
            // Closed when the renewal task lets go of it too (at once: it was stopped).
        }
        Ok(())
    }

    async fn publish(&self, payload: &str) -> StoreResult<()> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(CHANNEL)
            .bind(payload)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// A listening connection of its own; sqlx reconnects it when it breaks (notifications
    /// sent meanwhile are lost, which costs a wake-up, never a task: polls and cycles also run
    /// on timers).
    async fn subscribe(&self) -> StoreResult<Option<tokio::sync::mpsc::Receiver<String>>> {
        let mut listener = sqlx::postgres::PgListener::connect_with(&self.pool).await?;
        listener.listen(CHANNEL).await?;
        let (tx, rx) = tokio::sync::mpsc::channel(4096);
        tokio::spawn(async move {
            loop {
                match listener.recv().await {
                    Ok(n) => {
                        if tx.send(n.payload().to_owned()).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        if tx.is_closed() {
                            return;
                        }
                        tracing::warn!(error = %e, "lost the notification connection; reconnecting");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        });
        Ok(Some(rx))
    }

    async fn cycled(&self, term: Term, _now: i64) -> StoreResult<()> {
        sqlx::query(&format!(
            "UPDATE scheduler_leader SET last_cycle_at = {DB_NOW_MS} WHERE id = 1 AND term = $1"
        ))
        .bind(term.0)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn leader_status(&self, _now: i64) -> StoreResult<LeaderStatus> {
        let (holder, term, renewed, lease_age, last, cycle_age): (String, i64, i64, i64, i64, i64) =
            sqlx::query_as(&format!(
                "SELECT holder, term, renewed_at, {DB_NOW_MS} - renewed_at, last_cycle_at, {DB_NOW_MS} - last_cycle_at
                 FROM scheduler_leader WHERE id = 1"
            ))
            .fetch_one(&self.pool)
            .await?;
        Ok(LeaderStatus {
            holder,
            term,
            lease_age_ms: (renewed > 0).then_some(lease_age.max(0)),
            last_cycle_age_ms: (last > 0).then_some(cycle_age.max(0)),
        })
    }
}

async fn try_lock(conn: &mut sqlx::PgConnection) -> StoreResult<bool> {
    let (ok,): (bool,) = sqlx::query_as("SELECT pg_try_advisory_lock($1)")
        .bind(LEADER_LOCK_KEY)
        .fetch_one(conn)
        .await?;
    Ok(ok)
}

/// Renews the lease of `term` every [`RENEW_EVERY`] on the lock's own connection until
/// stopped, or until it cannot (the connection is gone, or another term leads: the runner's
/// next `still_leads` then steps down).
async fn renew_lease(
    conn: Arc<tokio::sync::Mutex<sqlx::PgConnection>>,
    term: Term,
    stop: tokio_util::sync::CancellationToken,
) {
    let renew =
        format!("UPDATE scheduler_leader SET renewed_at = {DB_NOW_MS} WHERE id = 1 AND term = $1");
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(RENEW_EVERY) => {}
        }
        let mut c = conn.lock().await;
        let done =
            tokio::time::timeout(LEASE, sqlx::query(&renew).bind(term.0).execute(&mut *c)).await;
        match done {
            Ok(Ok(r)) if r.rows_affected() == 1 => {}
            Ok(Ok(_)) => {
                tracing::warn!(
                    term = term.0,
                    "another server leads now: no longer renewing the lease"
                );
                return;
            }
            Ok(Err(e)) => {
                tracing::warn!(term = term.0, error = %e, "could not renew the leader's lease");
                return;
            }
            Err(_) => tracing::warn!(term = term.0, "renewing the leader's lease is slow"),
        }
    }
}
