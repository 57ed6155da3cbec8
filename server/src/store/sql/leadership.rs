//! Leadership on each backend: PostgreSQL elects one leader among replicas with an advisory
//! lock held on a connection of its own; SQLite serves one server, always the leader, with a new
//! term at each start.

use super::*;

const NEW_TERM: &str = "UPDATE scheduler_leader SET term = term + 1, holder = $1, since = $2 WHERE id = 1 RETURNING term";
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
}

#[async_trait]
impl Leadership for PostgresStore {
    /// Takes the advisory lock on a connection of its own, kept out of the pool: the lock lives
    /// as long as that connection, so a crashed leader's lock goes with its connection.
    async fn try_lead(&self, holder: &str, now: i64) -> StoreResult<Option<LeaderGuard>> {
        let mut conn = self.pool.acquire().await?;
        let (ok,): (bool,) = sqlx::query_as("SELECT pg_try_advisory_lock($1)")
            .bind(LEADER_LOCK_KEY)
            .fetch_one(&mut *conn)
            .await?;
        if !ok {
            return Ok(None);
        }
        let mut conn = conn.detach();
        let (term,): (i64,) = sqlx::query_as(NEW_TERM)
            .bind(holder)
            .bind(now)
            .fetch_one(&mut conn)
            .await?;
        Ok(Some(LeaderGuard {
            term: Term(term),
            hold: Box::new(tokio::sync::Mutex::new(conn)),
        }))
    }

    /// Asked on the lock's own connection: if that connection was cut (the lock with it),
    /// the query fails and this server is no longer the leader.
    async fn still_leads(&self, guard: &mut LeaderGuard) -> StoreResult<bool> {
        let Some(conn) = guard
            .hold
            .downcast_ref::<tokio::sync::Mutex<sqlx::PgConnection>>()
        else {
            return Ok(false);
        };
        let mut conn = conn.lock().await;
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
        if let Ok(conn) = guard
            .hold
            .downcast::<tokio::sync::Mutex<sqlx::PgConnection>>()
        {
            use sqlx::Connection;
            let mut conn = conn.into_inner();
            sqlx::query("SELECT pg_advisory_unlock($1)")
                .bind(LEADER_LOCK_KEY)
                .execute(&mut conn)
                .await?;
            conn.close().await?;
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
}
