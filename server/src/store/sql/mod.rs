//! The two SQL backends. Their SQL is the same text (`$n` placeholders work in SQLite and
//! PostgreSQL alike), so one macro per aggregate (in the module named after it) writes both
//! implementations and they cannot drift apart; only connecting, migrating and leading differ.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use super::*;

/// Refuses the transaction unless `term` is still the leader's: the row lock it takes also
/// orders it against a new leader's start, so no write of a deposed leader lands after it.
macro_rules! fence {
    ($conn:expr, $term:expr) => {
        if sqlx::query("UPDATE scheduler_leader SET term = term WHERE id = 1 AND term = $1")
            .bind($term.0)
            .execute($conn)
            .await?
            .rows_affected()
            != 1
        {
            return Err(StoreError::Fenced);
        }
    };
}

/// The ending run's service joins its task's (runs still open count apart): called in the
/// transaction that ends the run, before the attempt is closed.
macro_rules! settle_service {
    ($conn:expr, $task:expr) => {
        sqlx::query(
            "UPDATE tasks SET attained_gpu_seconds = attained_gpu_seconds + COALESCE(
                (SELECT SUM(a.gpu_seconds) FROM attempts a WHERE a.task_id = tasks.id AND a.ended_at IS NULL), 0)
             WHERE id = $1",
        )
        .bind($task)
        .execute($conn)
        .await?
    };
}

/// The task no longer occupies any node: its rows in the poll index go, in the transaction
/// that clears its placement.
macro_rules! unplace {
    ($conn:expr, $task:expr) => {
        sqlx::query("DELETE FROM task_nodes WHERE task_id = $1")
            .bind($task)
            .execute($conn)
            .await?
    };
}

macro_rules! insert_event {
    ($conn:expr, $task:expr, $at:expr, $kind:expr, $msg:expr) => {
        sqlx::query("INSERT INTO task_events (task_id, at, kind, message) VALUES ($1, $2, $3, $4)")
            .bind($task)
            .bind($at)
            .bind($kind)
            .bind($msg)
            .execute($conn)
            .await?
    };
}

macro_rules! insert_tenant {
    ($conn:expr, $t:expr) => {
        sqlx::query("INSERT INTO tenants (id, name, created_at, internal) VALUES ($1, $2, $3, $4)")
            .bind(&$t.id)
            .bind(&$t.name)
            .bind($t.created_at)
            .bind($t.internal)
            .execute($conn)
            .await
            .map_err(conflict("an organization with this name already exists"))?
    };
}

macro_rules! insert_user {
    ($conn:expr, $u:expr) => {
        sqlx::query(
            "INSERT INTO users (id, email, password_hash, tenant_id, role, platform_admin, disabled, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&$u.id)
        .bind(&$u.email)
        .bind(&$u.password_hash)
        .bind(&$u.tenant_id)
        .bind($u.role.as_str())
        .bind($u.platform_admin)
        .bind($u.disabled)
        .bind($u.created_at)
        .execute($conn)
        .await
        .map_err(conflict("an account with this email already exists"))?
    };
}

/// The migrations of a backend. Applied ones are checked against their checksums (a released
/// migration is never edited: a change is a new one), and a database that a newer release
/// already brought forward is accepted: migrations only add, so this release's queries still
/// hold, and during a rolling upgrade an older replica can restart.
macro_rules! migrator {
    ($dir:literal) => {{
        let mut m = sqlx::migrate!($dir);
        m.set_ignore_missing(true);
        m
    }};
}

// The helper macros above are in scope in these modules: they come after them.
mod accounts;
mod artifacts;
mod audit;
mod journal;
mod leadership;
mod nodes;
mod notifications;
mod run_results;
mod sso;
mod sweeps;
mod task_rows;
mod tasks;
mod usage;
mod webhooks;

pub struct SqliteStore {
    pool: SqlitePool,
    /// The scheduler's own few connections for a cycle's reads and its bulk writes
    /// (placements, charges, explanations, nodes' presence), so that a cycle does not queue
    /// behind thousands of API and agent requests for a connection of `pool`.
    sched: SqlitePool,
}

pub struct PostgresStore {
    pool: PgPool,
    /// See [`SqliteStore::sched`].
    sched: PgPool,
}

/// Connections of the scheduler's own pool: a cycle's reads run side by side, and a long
/// queue's explanations are written beside the cycles.
const SCHEDULER_CONNECTIONS: u32 = 4;

impl SqliteStore {
    /// Every transaction here writes. A deferred one that reads first and then writes fails
    /// at once with SQLITE_BUSY (no busy timeout applies) when another connection wrote in
    /// between; taking the write lock at `BEGIN` waits for it instead.
    const BEGIN_WRITE: &'static str = "BEGIN IMMEDIATE";

    pub async fn open(url: &str, max_connections: u32) -> StoreResult<Self> {
        let opts = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        if let Some(parent) = std::path::Path::new(opts.get_filename()).parent() {
            if !parent.as_os_str().is_empty() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| StoreError::from(sqlx::Error::Io(e)))?;
            }
        }
        let file = std::path::PathBuf::from(opts.get_filename());
        let pool_of = |n: u32| {
            SqlitePoolOptions::new()
                .max_connections(n)
                .before_acquire(|_, meta| Box::pin(async move { Ok(!fault::is_stale(meta.age)) }))
                .after_release(|_, meta| Box::pin(async move { Ok(!fault::is_stale(meta.age)) }))
        };
        let pool = pool_of(max_connections.max(1))
            .connect_with(opts.clone())
            .await?;
        let sched = pool_of(SCHEDULER_CONNECTIONS).connect_lazy_with(opts);
        // The database holds every secret digest and all tenants' data: only the server's
        // user may read it, whatever the umask (tasks may run on the same host).
        for suffix in ["", "-wal", "-shm"] {
            let mut p = file.clone().into_os_string();
            p.push(suffix);
            if let Err(e) =
                std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(path = ?p, error = %e, "could not make the database private");
                }
            }
        }
        migrator!("../migrations/sqlite").run(&pool).await?;
        Ok(SqliteStore { pool, sched })
    }
}

impl PostgresStore {
    /// See [`SqliteStore::BEGIN_WRITE`]; PostgreSQL locks rows as it writes them.
    const BEGIN_WRITE: &'static str = "BEGIN";

    pub async fn open(url: &str, max_connections: u32) -> StoreResult<Self> {
        let pool_of = |n: u32| {
            PgPoolOptions::new()
                .max_connections(n)
                .before_acquire(|_, meta| Box::pin(async move { Ok(!fault::is_stale(meta.age)) }))
                .after_release(|_, meta| Box::pin(async move { Ok(!fault::is_stale(meta.age)) }))
                .acquire_timeout(Duration::from_secs(10))
        };
        // Every session of this server carries one name, so a follower taking over from this
        // server frozen as the leader can end them all (their row locks with them).
        let session = format!(
            "autodl-{}-{}",
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let options = PgConnectOptions::from_str(url)?.application_name(&session);
        let pool = pool_of(max_connections.max(1))
            .connect_with(options.clone())
            .await?;
        let sched = pool_of(SCHEDULER_CONNECTIONS).connect_lazy_with(options);
        migrator!("../migrations/postgres").run(&pool).await?;
        Ok(PostgresStore { pool, sched })
    }
}

/// Maps a unique-constraint failure to a conflict the caller can show.
fn conflict(what: &str) -> impl FnOnce(sqlx::Error) -> StoreError + '_ {
    move |e| match e {
        sqlx::Error::Database(ref db) if db.is_unique_violation() => {
            StoreError::Conflict(what.to_owned())
        }
        other => other.into(),
    }
}

macro_rules! impl_core {
    ($store:ty, $backend:literal) => {
        #[async_trait]
        impl Store for $store {
            fn backend(&self) -> &'static str {
                $backend
            }
            async fn ping(&self) -> StoreResult<()> {
                sqlx::query("SELECT 1").execute(&self.pool).await?;
                Ok(())
            }
            async fn probe_write(&self, now_ms: i64) -> StoreResult<()> {
                sqlx::query(
                    "INSERT INTO store_probe (id, at) VALUES (1, $1) \
                     ON CONFLICT (id) DO UPDATE SET at = excluded.at",
                )
                .bind(now_ms)
                .execute(&self.pool)
                .await?;
                Ok(())
            }
        }
    };
}

impl_core!(SqliteStore, "sqlite");
impl_core!(PostgresStore, "postgres");
