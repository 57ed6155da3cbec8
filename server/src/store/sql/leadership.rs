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
        // One server: its term is the lease's.
        sqlx::query("UPDATE scheduler_lease SET term = $2, last_cycle_at = $1 WHERE id = 1")
            .bind(now)
            .bind(term.0)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn leader_status(&self, now: i64) -> StoreResult<LeaderStatus> {
        let (holder, term, last): (String, i64, i64) = sqlx::query_as(
            "SELECT s.holder, s.term, l.last_cycle_at FROM scheduler_leader s, scheduler_lease l
             WHERE s.id = 1 AND l.id = 1",
        )
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
    /// frozen rather than dead: its sessions are ended here (`pg_terminate_backend`, allowed
    /// on the same role's sessions), which frees the lock; the new term fences it.
    async fn try_lead(&self, holder: &str, now: i64) -> StoreResult<Option<LeaderGuard>> {
        let mut conn = self.pool.acquire().await?;
        let mut ok = try_lock(&mut conn).await?;
        if !ok {
            // In one statement, so that what is judged is what is ended: the sessions of the
            // server whose lease it is (they share its name, see `PostgresStore::open`; one
            // frozen inside a transaction would hold row locks against the next leader), only
            // while its term still leads and its lease has run out, and never this server's.
            // A follower that took over a moment ago has a fresh lease: nothing matches.
            // (The ending is in the select list: evaluated for the matching rows only.)
            let ended: Vec<(String, i64, bool)> = sqlx::query_as(&format!(
                "SELECT l.session, {DB_NOW_MS} - l.renewed_at, pg_terminate_backend(a.pid)
                 FROM scheduler_lease l JOIN pg_stat_activity a ON a.application_name = l.session
                 WHERE l.id = 1 AND l.renewed_at > 0 AND l.session <> ''
                   AND l.session <> current_setting('application_name')
                   AND l.term = (SELECT term FROM scheduler_leader WHERE id = 1)
                   AND {DB_NOW_MS} - l.renewed_at > $1"
            ))
            .bind(LEASE.as_millis() as i64)
            .fetch_all(&mut *conn)
            .await?;
            let Some((session, silent_ms, _)) = ended.first() else {
                return Ok(None);
            };
            tracing::warn!(
                session,
                silent_ms,
                sessions = ended.len(),
                "the scheduler leader had not renewed its lease: ended its sessions to take over"
            );
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
            "UPDATE scheduler_lease SET term = $1, session = current_setting('application_name'),
                 renewed_at = {DB_NOW_MS} WHERE id = 1"
        ))
        .bind(term)
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
            "UPDATE scheduler_lease SET last_cycle_at = {DB_NOW_MS} WHERE id = 1 AND term = $1"
        ))
        .bind(term.0)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn leader_status(&self, _now: i64) -> StoreResult<LeaderStatus> {
        let (holder, term, renewed, lease_age, last, cycle_age): (String, i64, i64, i64, i64, i64) =
            sqlx::query_as(&format!(
                "SELECT s.holder, s.term, l.renewed_at, {DB_NOW_MS} - l.renewed_at, l.last_cycle_at,
                        {DB_NOW_MS} - l.last_cycle_at
                 FROM scheduler_leader s, scheduler_lease l WHERE s.id = 1 AND l.id = 1"
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
        format!("UPDATE scheduler_lease SET renewed_at = {DB_NOW_MS} WHERE id = 1 AND term = $1");
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(RENEW_EVERY) => {}
        }
        let mut c = conn.lock().await;
        // Resigned while waiting for the connection: no renewal after it.
        if stop.is_cancelled() {
            return;
        }
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
            // Tried again each second: a moment's failure must not cost the lease. A lock
            // connection that is gone fails `still_leads` too, and the runner steps down.
            Ok(Err(e)) => {
                tracing::warn!(term = term.0, error = %e, "could not renew the leader's lease")
            }
            Err(_) => tracing::warn!(term = term.0, "renewing the leader's lease is slow"),
        }
    }
}
