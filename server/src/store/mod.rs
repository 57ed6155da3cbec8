//! Persistence behind one trait, with a SQLite backend (the embedded default) and a
//! PostgreSQL backend (production), chosen by the database URL.

pub mod fault;
mod records;
mod sql;

use std::sync::Arc;

use async_trait::async_trait;

pub use records::*;
pub use sql::{PostgresStore, SqliteStore};

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
}

/// Everything the server keeps. Methods that take a `tenant_id` only ever touch rows of that
/// tenant, so a handler cannot reach another tenant's data by passing a foreign id.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    fn backend(&self) -> &'static str;
    async fn ping(&self) -> StoreResult<()>;
    /// Writes one row: the health check's proof that the database takes writes now.
    async fn probe_write(&self, now_ms: i64) -> StoreResult<()>;

    // Tenants and users.
    async fn create_tenant_with_owner(
        &self,
        tenant: &TenantRecord,
        owner: &UserRecord,
    ) -> StoreResult<()>;
    /// Creates the user and marks the invitation accepted, or neither.
    async fn accept_invitation(
        &self,
        invitation_id: &str,
        user: &UserRecord,
        now: i64,
    ) -> StoreResult<()>;
    async fn tenant(&self, id: &str) -> StoreResult<Option<TenantRecord>>;
    async fn user(&self, id: &str) -> StoreResult<Option<UserRecord>>;
    async fn user_by_email(&self, email: &str) -> StoreResult<Option<UserRecord>>;
    async fn set_password(&self, user_id: &str, hash: &str) -> StoreResult<()>;
    async fn list_members(&self, tenant_id: &str) -> StoreResult<Vec<UserRecord>>;
    async fn set_member_role(
        &self,
        tenant_id: &str,
        user_id: &str,
        role: &str,
    ) -> StoreResult<bool>;
    async fn set_user_flags(
        &self,
        user_id: &str,
        disabled: Option<bool>,
        platform_admin: Option<bool>,
    ) -> StoreResult<bool>;
    async fn list_tenants(&self) -> StoreResult<Vec<TenantSummary>>;
    async fn list_users(&self) -> StoreResult<Vec<UserWithTenant>>;
    async fn count_owners(&self, tenant_id: &str) -> StoreResult<i64>;

    // Sessions.
    async fn create_session(&self, session: &SessionRecord) -> StoreResult<()>;
    async fn session(&self, id: &str) -> StoreResult<Option<SessionRecord>>;
    async fn extend_session(&self, id: &str, expires_at: i64) -> StoreResult<()>;
    async fn revoke_session(&self, id: &str) -> StoreResult<()>;
    /// Ends every session of the user except `keep` (the one that changed the password).
    async fn revoke_user_sessions(&self, user_id: &str, keep: Option<&str>) -> StoreResult<()>;

    // API keys.
    async fn create_api_key(&self, key: &ApiKeyRecord) -> StoreResult<()>;
    async fn list_api_keys(&self, user_id: &str) -> StoreResult<Vec<ApiKeyRecord>>;
    async fn api_key_by_hash(&self, hash: &str) -> StoreResult<Option<ApiKeyRecord>>;
    async fn touch_api_key(&self, id: &str, now: i64) -> StoreResult<()>;
    async fn revoke_api_key(&self, user_id: &str, id: &str) -> StoreResult<bool>;
    async fn revoke_user_api_keys(&self, user_id: &str) -> StoreResult<()>;

    // Invitations.
    async fn create_invitation(&self, inv: &InvitationRecord) -> StoreResult<()>;
    async fn list_invitations(&self, tenant_id: &str) -> StoreResult<Vec<InvitationRecord>>;
    async fn invitation_by_token_hash(&self, hash: &str) -> StoreResult<Option<InvitationRecord>>;
    async fn revoke_invitation(&self, tenant_id: &str, id: &str) -> StoreResult<bool>;

    // Quotas.
    async fn quota(&self, scope: QuotaScope, subject_id: &str) -> StoreResult<QuotaRecord>;
    async fn set_quota(
        &self,
        scope: QuotaScope,
        subject_id: &str,
        quota: &QuotaRecord,
        now: i64,
    ) -> StoreResult<()>;
    async fn all_quotas(&self) -> StoreResult<Vec<QuotaRow>>;

    // Nodes.
    async fn upsert_node(&self, node: &NodeRecord) -> StoreResult<()>;
    async fn list_nodes(&self) -> StoreResult<Vec<NodeRecord>>;
    async fn delete_node(&self, id: &str) -> StoreResult<bool>;
    /// What the node's agent reports about how it runs tasks (`data_roots`: JSON array).
    async fn set_node_host(
        &self,
        id: &str,
        runtime: &str,
        isolation: &str,
        data_roots: &str,
    ) -> StoreResult<()>;
    async fn set_node_open_to_all(&self, id: &str, open: bool) -> StoreResult<bool>;

    // Trust and storage per organization.
    async fn set_tenant_trusted(&self, id: &str, trusted: bool) -> StoreResult<bool>;
    /// Organizations whose tasks may run on trusted-only nodes.
    async fn trusted_tenants(&self) -> StoreResult<Vec<String>>;
    /// Bytes the organization holds in object storage.
    async fn storage_bytes(&self, tenant_id: &str) -> StoreResult<i64>;
    /// Adds (or, negative, removes) bytes; the count never goes below zero.
    async fn add_storage_bytes(&self, tenant_id: &str, delta: i64) -> StoreResult<()>;

    // Tasks.
    async fn create_task(
        &self,
        task: &TaskRecord,
        labels: &[(String, String)],
    ) -> StoreResult<TaskCreated>;
    /// A task of `tenant_id` (any tenant when `None`).
    async fn task(&self, tenant_id: Option<&str>, id: &str) -> StoreResult<Option<TaskWithUser>>;
    async fn list_tasks(&self, filter: &TaskFilter) -> StoreResult<Vec<TaskWithUser>>;
    /// Pending tasks of a user, and of their tenant.
    async fn count_pending(&self, user_id: &str, tenant_id: &str) -> StoreResult<(i64, i64)>;
    /// Tasks that are pending, scheduled or running: what the scheduler looks at.
    async fn active_tasks(&self) -> StoreResult<Vec<TaskRecord>>;
    async fn cancel_task(&self, tenant_id: &str, id: &str, now: i64) -> StoreResult<CancelOutcome>;
    /// Moves a pending task to scheduled and opens its next attempt; `false` if it was no
    /// longer pending (so a task is never placed twice).
    async fn place_task(
        &self,
        term: Term,
        id: &str,
        placement: &str,
        node: &str,
        gpus: i64,
        now: i64,
    ) -> StoreResult<bool>;
    /// Puts a scheduled or running task back to pending, closing its attempt with `reason`.
    async fn requeue_task(
        &self,
        fence: Option<Term>,
        id: &str,
        reason: &str,
        message: &str,
        now: i64,
    ) -> StoreResult<bool>;
    async fn mark_running(&self, id: &str, attempt: i64, now: i64) -> StoreResult<bool>;
    async fn finish_attempt(
        &self,
        id: &str,
        attempt: i64,
        end: &AttemptEnd,
        now: i64,
    ) -> StoreResult<bool>;
    /// Active tasks with their current run, for the scheduler.
    async fn scheduling_tasks(&self) -> StoreResult<Vec<SchedulingTaskRecord>>;
    /// Runs that ended before they were charged up to their end.
    async fn unsettled_runs(&self) -> StoreResult<Vec<UnsettledRunRecord>>;
    /// Mean measured GPU utilisation (0..1) per task over samples in `(from, to]`.
    async fn task_utilization(&self, from: i64, to: i64) -> StoreResult<Vec<(String, f64)>>;
    /// Keeps one cycle's charges and the usage rows they changed, all or nothing: `false`
    /// (and nothing kept) when a run was charged or ended by someone else meanwhile.
    async fn save_charges(
        &self,
        charges: &[RunChargeRecord],
        usage: &[UsageRecord],
    ) -> StoreResult<bool>;
    async fn task_events(&self, id: &str) -> StoreResult<Vec<EventRecord>>;
    async fn task_attempts(&self, id: &str) -> StoreResult<Vec<AttemptRecord>>;
    async fn append_logs(
        &self,
        id: &str,
        attempt: i64,
        lines: &[(i64, String, String)],
    ) -> StoreResult<()>;
    async fn task_logs(&self, id: &str, after: i64, limit: i64) -> StoreResult<Vec<LogRecord>>;
    async fn add_metrics(&self, id: &str, samples: &[(i64, String)]) -> StoreResult<()>;
    async fn task_metrics(
        &self,
        id: &str,
        after: i64,
        limit: i64,
    ) -> StoreResult<Vec<MetricRecord>>;

    // Accounting.
    async fn load_usage(&self) -> StoreResult<Vec<UsageRecord>>;

    // Agents.
    async fn create_registration_token(&self, t: &RegistrationTokenRecord) -> StoreResult<()>;
    async fn list_registration_tokens(&self) -> StoreResult<Vec<RegistrationTokenRecord>>;
    async fn registration_token_by_hash(
        &self,
        hash: &str,
    ) -> StoreResult<Option<RegistrationTokenRecord>>;
    /// Counts one registration of `node_id` against the token; `false` when it is revoked,
    /// expired, used up or bound to another node (checked and counted in one statement, so
    /// two agents cannot both take a token's last use).
    async fn use_registration_token(&self, id: &str, node_id: &str, now: i64) -> StoreResult<bool>;
    async fn revoke_registration_token(&self, id: &str) -> StoreResult<bool>;
    async fn set_node_credential(&self, id: &str, hash: &str) -> StoreResult<()>;
    async fn node_by_credential(&self, hash: &str) -> StoreResult<Option<NodeRecord>>;
    /// Records a heartbeat; a node that was lost is ready again.
    async fn touch_node(&self, id: &str, now: i64) -> StoreResult<()>;
    async fn set_node_status(&self, id: &str, status: &str) -> StoreResult<bool>;
    /// Marks a placed task to be stopped by its agent; `false` if it is not placed.
    async fn set_stop_reason(
        &self,
        fence: Option<Term>,
        id: &str,
        reason: &str,
    ) -> StoreResult<bool>;
    /// Replaces the explanations of these tasks (`None`: no longer waiting).
    async fn set_waiting(
        &self,
        term: Term,
        changes: &[(String, Option<String>)],
    ) -> StoreResult<()>;
    async fn insert_gpu_samples(&self, samples: &[GpuSampleRecord]) -> StoreResult<()>;
    async fn task_gpu_samples(
        &self,
        task_id: &str,
        after: i64,
        limit: i64,
    ) -> StoreResult<Vec<GpuSampleRecord>>;
    /// Attempts that ran at some time in `[from, to)`, with their task's tenant and user
    /// (usage reports).
    async fn usage_attempts(&self, from: i64, to: i64) -> StoreResult<Vec<UsageAttemptRecord>>;
    /// Mean GPU utilization (0..1) per user over the raw samples of their tasks in `[from, to)`.
    async fn usage_utilization(&self, from: i64, to: i64) -> StoreResult<Vec<UsageUtilRecord>>;
    /// Folds raw samples older than `before` into hourly rollups and deletes them; drops
    /// rollups older than `rollups_before`.
    async fn compact_gpu_samples(&self, before: i64, rollups_before: i64) -> StoreResult<u64>;

    /// Tries to become the one scheduler of this database, starting a new term; `None` if
    /// another server is the leader.
    async fn try_lead(&self, holder: &str, now: i64) -> StoreResult<Option<LeaderGuard>>;
    /// Whether `guard` still holds the leadership (its lock alive, its term current); checked
    /// before every cycle.
    async fn still_leads(&self, guard: &mut LeaderGuard) -> StoreResult<bool>;
    /// Gives the leadership up now (a clean handover), rather than when the lock's
    /// connection is noticed gone.
    async fn resign(&self, guard: LeaderGuard) -> StoreResult<()>;
    /// Tells the other servers on this database (PostgreSQL NOTIFY); nothing on SQLite, which
    /// one server serves.
    async fn publish(&self, payload: &str) -> StoreResult<()>;
    /// What the other servers publish, as it arrives; `None` where there are none (SQLite).
    async fn subscribe(&self) -> StoreResult<Option<tokio::sync::mpsc::Receiver<String>>>;

    // Checkpoints and results in object storage.
    async fn create_artifact(&self, a: &ArtifactRecord) -> StoreResult<()>;
    async fn artifact(&self, id: &str) -> StoreResult<Option<ArtifactRecord>>;
    /// Marks an uploading artifact complete (with an event on its task); `false` if it was not
    /// uploading or its attempt is no longer the task's current one (a late commit of an
    /// attempt that was already requeued). A complete checkpoint also becomes the task's
    /// `last_checkpoint_at`.
    async fn complete_artifact(&self, a: &ArtifactRecord, now: i64) -> StoreResult<bool>;
    /// Complete artifacts of a task of one kind, newest first.
    async fn task_artifacts(&self, task_id: &str, kind: &str) -> StoreResult<Vec<ArtifactRecord>>;
    /// Uploads of a task and kind still in progress (not committed), oldest first.
    async fn open_uploads(&self, task_id: &str, kind: &str) -> StoreResult<Vec<ArtifactRecord>>;
    /// Moves an artifact from state `from` to `to`; `false` if it was not in `from`.
    async fn set_artifact_state(&self, id: &str, from: &str, to: &str) -> StoreResult<bool>;
    /// Uploads started before `before` and never completed (their agent went away), and
    /// artifacts whose deletion did not finish.
    async fn stale_uploads(&self, before: i64) -> StoreResult<Vec<ArtifactRecord>>;
    async fn add_event(
        &self,
        task_id: &str,
        kind: &str,
        message: &str,
        now: i64,
    ) -> StoreResult<()>;
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
