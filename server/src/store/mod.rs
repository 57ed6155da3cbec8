//! Persistence behind one trait per aggregate, with a SQLite backend (the embedded default) and a
//! PostgreSQL backend (production), chosen by the database URL.

mod accounts;
mod artifacts;
mod audit;
pub mod backup;
pub mod fault;
mod group_commit;
mod journal;
mod leadership;
mod nodes;
mod notifications;
mod records;
mod run_results;
mod sql;
mod sso;
mod sweeps;
mod tasks;
mod usage;
mod webhooks;

use std::sync::Arc;

use async_trait::async_trait;

pub use accounts::Accounts;
pub use artifacts::Artifacts;
pub use audit::AuditTrail;
pub use group_commit::{Ends, GroupCommit, Starts, Submissions};
pub use journal::TaskJournal;
pub use leadership::{LeaderStatus, Leadership};
pub use nodes::{NodeHost, Nodes};
pub use notifications::Notifications;
pub use records::*;
pub use run_results::RunResults;
pub use sql::{PostgresStore, SqliteStore};
pub use sso::SingleSignOn;
pub use sweeps::Sweeps;
pub use tasks::Tasks;
pub use usage::Usage;
pub use webhooks::Webhooks;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("not found")]
    NotFound,
    #[error("{0}")]
    Conflict(String),
    #[error("unsupported database URL {0:?}: use sqlite://PATH or postgres://...")]
    UnsupportedUrl(String),
    /// The database cannot write for now (disk full, read-only, I/O error); retry later.
    #[error("{0}")]
    Unavailable(fault::StoreFault),
    /// A scheduling write of a leader whose term is over: another server leads now.
    #[error("another server leads the scheduler now")]
    Fenced,
    #[error(transparent)]
    Database(sqlx::Error),
    #[error(transparent)]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        match fault::StoreFault::of(&e) {
            Some(f) => {
                fault::record(f);
                StoreError::Unavailable(f)
            }
            None => StoreError::Database(e),
        }
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// One attempt with the tenant and user it counts against (usage reports).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct UsageAttemptRecord {
    pub tenant_id: String,
    pub tenant_name: String,
    pub user_id: String,
    pub user_email: String,
    pub gpus: i64,
    pub started_at: i64,
    pub ended_at: Option<i64>,
}

/// A user's mean GPU utilization over a period, and how many samples it rests on.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct UsageUtilRecord {
    pub user_id: String,
    pub avg_util: f64,
    pub samples: i64,
    /// Of `samples`, those under the idle threshold (an hour's rollup counts by its mean).
    pub idle_samples: i64,
}

/// Everything the server keeps, one trait per aggregate (each in its own module, each backend's
/// SQL beside it in `sql/`); a handler or use case asks for what it needs through this one.
#[async_trait]
pub trait Store:
    Accounts
    + AuditTrail
    + Nodes
    + Notifications
    + Tasks
    + Sweeps
    + TaskJournal
    + RunResults
    + Usage
    + Artifacts
    + Leadership
    + Webhooks
    + SingleSignOn
    + Send
    + Sync
    + 'static
{
    fn backend(&self) -> &'static str;
    async fn ping(&self) -> StoreResult<()>;
    /// Writes one row: the health check's proof that the database takes writes now.
    async fn probe_write(&self, now_ms: i64) -> StoreResult<()>;
}

/// Opens (and migrates) the store named by `url`: `sqlite://PATH` (created if missing) or
/// `postgres://...`.
pub async fn open(url: &str, max_connections: u32) -> StoreResult<Arc<dyn Store>> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::open(url, max_connections).await?))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(PostgresStore::open(url, max_connections).await?))
    } else {
        Err(StoreError::UnsupportedUrl(url.to_owned()))
    }
}
