//! The two SQL backends. Their SQL is the same text (`$n` placeholders work in SQLite and
//! PostgreSQL alike), so one macro writes both implementations and they cannot drift apart;
//! only connecting and migrating differ.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use super::*;

pub struct SqliteStore {
    pool: SqlitePool,
}

pub struct PostgresStore {
    pool: PgPool,
}

impl SqliteStore {
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
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections.max(1))
            .before_acquire(|_, meta| Box::pin(async move { Ok(!fault::is_stale(meta.age)) }))
            .after_release(|_, meta| Box::pin(async move { Ok(!fault::is_stale(meta.age)) }))
            .connect_with(opts)
            .await?;
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
        sqlx::migrate!("../migrations/sqlite").run(&pool).await?;
        Ok(SqliteStore { pool })
    }
}

impl SqliteStore {
    /// SQLite serves one server process, which is therefore always the leader; each start is
    /// a new term all the same, so writes of a runner left over from before are refused.
    async fn try_lead_impl(&self, holder: &str, now: i64) -> StoreResult<Option<LeaderGuard>> {
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

    async fn still_leads_impl(&self, guard: &mut LeaderGuard) -> StoreResult<bool> {
        let (term,): (i64,) = sqlx::query_as(CURRENT_TERM).fetch_one(&self.pool).await?;
        Ok(term == guard.term.0)
    }

    async fn resign_impl(&self, _guard: LeaderGuard) -> StoreResult<()> {
        Ok(())
    }

    async fn publish_impl(&self, _payload: &str) -> StoreResult<()> {
        Ok(())
    }

    async fn subscribe_impl(&self) -> StoreResult<Option<tokio::sync::mpsc::Receiver<String>>> {
        Ok(None)
    }
}

const NEW_TERM: &str = "UPDATE scheduler_leader SET term = term + 1, holder = $1, since = $2 WHERE id = 1 RETURNING term";
const CURRENT_TERM: &str = "SELECT term FROM scheduler_leader WHERE id = 1";
/// The channel of PostgreSQL notifications between the servers of one database.
const CHANNEL: &str = "autodl";

/// Key of the PostgreSQL advisory lock that elects the scheduler leader among replicas.
const LEADER_LOCK_KEY: i64 = 0x6175_746f_646c;

impl PostgresStore {
    /// Takes the advisory lock on a connection of its own, kept out of the pool: the lock lives
    /// as long as that connection, so a crashed leader's lock goes with its connection.
    async fn try_lead_impl(&self, holder: &str, now: i64) -> StoreResult<Option<LeaderGuard>> {
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
    async fn still_leads_impl(&self, guard: &mut LeaderGuard) -> StoreResult<bool> {
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

    async fn resign_impl(&self, guard: LeaderGuard) -> StoreResult<()> {
        if let Ok(conn) = guard
            .hold
            .downcast::<tokio::sync::Mutex<sqlx::PgConnection>>()
        {
            use sqlx::Connection;
            conn.into_inner().close().await?;
        }
        Ok(())
    }

    async fn publish_impl(&self, payload: &str) -> StoreResult<()> {
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
    async fn subscribe_impl(&self) -> StoreResult<Option<tokio::sync::mpsc::Receiver<String>>> {
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

    pub async fn open(url: &str, max_connections: u32) -> StoreResult<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(1))
            .before_acquire(|_, meta| Box::pin(async move { Ok(!fault::is_stale(meta.age)) }))
            .after_release(|_, meta| Box::pin(async move { Ok(!fault::is_stale(meta.age)) }))
            .acquire_timeout(Duration::from_secs(10))
            .connect(url)
            .await?;
        sqlx::migrate!("../migrations/postgres").run(&pool).await?;
        Ok(PostgresStore { pool })
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

const TASK_COLS: &str = "t.id, t.tenant_id, t.user_id, t.name, t.state, t.spec, t.gpus_total, t.idempotency_key, \
     t.attempts, t.batch_size, t.placement, t.attained_gpu_seconds, t.last_checkpoint_at, t.created_at, \
     t.updated_at, t.started_at, t.finished_at, t.stop_reason, t.waiting";

const API_KEY_COLS: &str =
    "id, user_id, name, prefix, key_hash, created_at, last_used_at, expires_at, revoked";
const INVITATION_COLS: &str = "id, tenant_id, email, role, token_hash, created_by, created_at, expires_at, accepted_at, revoked";
const ARTIFACT_COLS: &str = "id, task_id, tenant_id, attempt, kind, state, bucket, prefix, manifest, files, size_bytes, step, epoch, created_at, completed_at";
const REG_TOKEN_COLS: &str =
    "id, name, token_hash, created_by, created_at, expires_at, revoked, max_uses, uses, node_id";

const NODE_COLS: &str =
    "id, zone, labels, cpu_millis, mem_bytes, gpus, schedulable, created_at, updated_at, credential_hash, last_seen, status, \
     runtime, isolation, data_roots, open_to_all";

const SAMPLE_COLS: &str =
    "node_id, gpu_index, at, util, mem_used, mem_total, temperature, power_w, task_id";

/// States the scheduler still acts on.
const ACTIVE: &str = "('pending', 'scheduled', 'running')";

const USER_COLS: &str =
    "u.id, u.email, u.password_hash, u.tenant_id, u.role, u.platform_admin, u.disabled, u.created_at";

macro_rules! impl_store {
    ($store:ty, $backend:literal, $db:ty) => {
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

            async fn create_tenant_with_owner(&self, t: &TenantRecord, u: &UserRecord) -> StoreResult<()> {
                let mut tx = self.pool.begin().await?;
                sqlx::query("INSERT INTO tenants (id, name, created_at) VALUES ($1, $2, $3)")
                    .bind(&t.id)
                    .bind(&t.name)
                    .bind(t.created_at)
                    .execute(&mut *tx)
                    .await
                    .map_err(conflict("an organization with this name already exists"))?;
                insert_user!(&mut *tx, u);
                tx.commit().await?;
                Ok(())
            }

            async fn accept_invitation(&self, invitation_id: &str, u: &UserRecord, now: i64) -> StoreResult<()> {
                let mut tx = self.pool.begin().await?;
                let done = sqlx::query(
                    "UPDATE invitations SET accepted_at = $1
                     WHERE id = $2 AND accepted_at IS NULL AND revoked = FALSE AND expires_at > $1",
                )
                .bind(now)
                .bind(invitation_id)
                .execute(&mut *tx)
                .await?;
                if done.rows_affected() != 1 {
                    return Err(StoreError::Conflict("this invitation is no longer valid".into()));
                }
                insert_user!(&mut *tx, u);
                tx.commit().await?;
                Ok(())
            }

            async fn tenant(&self, id: &str) -> StoreResult<Option<TenantRecord>> {
                Ok(sqlx::query_as("SELECT id, name, created_at, trusted FROM tenants WHERE id = $1")
                    .bind(id)
                    .fetch_optional(&self.pool)
                    .await?)
            }

            async fn user(&self, id: &str) -> StoreResult<Option<UserRecord>> {
                Ok(sqlx::query_as(&format!("SELECT {USER_COLS} FROM users u WHERE u.id = $1"))
                    .bind(id)
                    .fetch_optional(&self.pool)
                    .await?)
            }

            async fn user_by_email(&self, email: &str) -> StoreResult<Option<UserRecord>> {
                Ok(sqlx::query_as(&format!("SELECT {USER_COLS} FROM users u WHERE u.email = $1"))
                    .bind(email)
                    .fetch_optional(&self.pool)
                    .await?)
            }

            async fn set_password(&self, user_id: &str, hash: &str) -> StoreResult<()> {
                let r = sqlx::query("UPDATE users SET password_hash = $1 WHERE id = $2")
                    .bind(hash)
                    .bind(user_id)
                    .execute(&self.pool)
                    .await?;
                if r.rows_affected() == 0 {
                    return Err(StoreError::NotFound);
                }
                Ok(())
            }

            async fn list_members(&self, tenant_id: &str) -> StoreResult<Vec<UserRecord>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {USER_COLS} FROM users u WHERE u.tenant_id = $1 ORDER BY u.created_at, u.email"
                ))
                .bind(tenant_id)
                .fetch_all(&self.pool)
                .await?)
            }

            async fn set_member_role(&self, tenant_id: &str, user_id: &str, role: &str) -> StoreResult<bool> {
                let r = sqlx::query("UPDATE users SET role = $1 WHERE id = $2 AND tenant_id = $3")
                    .bind(role)
                    .bind(user_id)
                    .bind(tenant_id)
                    .execute(&self.pool)
                    .await?;
                Ok(r.rows_affected() == 1)
            }

            async fn set_user_flags(&self, user_id: &str, disabled: Option<bool>, platform_admin: Option<bool>) -> StoreResult<bool> {
                let r = sqlx::query(
                    "UPDATE users SET disabled = COALESCE($1, disabled),
                                      platform_admin = COALESCE($2, platform_admin)
                     WHERE id = $3",
                )
                .bind(disabled)
                .bind(platform_admin)
                .bind(user_id)
                .execute(&self.pool)
                .await?;
                Ok(r.rows_affected() == 1)
            }

            async fn list_tenants(&self) -> StoreResult<Vec<TenantSummary>> {
                Ok(sqlx::query_as(
                    "SELECT t.id, t.name, t.created_at, t.trusted,
                            (SELECT COUNT(*) FROM users u WHERE u.tenant_id = t.id) AS members
                     FROM tenants t ORDER BY t.created_at, t.name",
                )
                .fetch_all(&self.pool)
                .await?)
            }

            async fn list_users(&self) -> StoreResult<Vec<UserWithTenant>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {USER_COLS}, t.name AS tenant_name FROM users u
                     JOIN tenants t ON t.id = u.tenant_id ORDER BY u.created_at, u.email"
                ))
                .fetch_all(&self.pool)
                .await?)
            }

            async fn count_owners(&self, tenant_id: &str) -> StoreResult<i64> {
                let (n,): (i64,) = sqlx::query_as(
                    "SELECT COUNT(*) FROM users WHERE tenant_id = $1 AND role = 'owner' AND disabled = FALSE",
                )
                .bind(tenant_id)
                .fetch_one(&self.pool)
                .await?;
                Ok(n)
            }

            async fn create_session(&self, s: &SessionRecord) -> StoreResult<()> {
                sqlx::query(
                    "INSERT INTO sessions (id, user_id, created_at, expires_at, revoked) VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(&s.id)
                .bind(&s.user_id)
                .bind(s.created_at)
                .bind(s.expires_at)
                .bind(s.revoked)
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn session(&self, id: &str) -> StoreResult<Option<SessionRecord>> {
                Ok(sqlx::query_as(
                    "SELECT id, user_id, created_at, expires_at, revoked FROM sessions WHERE id = $1",
                )
                .bind(id)
                .fetch_optional(&self.pool)
                .await?)
            }

            async fn extend_session(&self, id: &str, expires_at: i64) -> StoreResult<()> {
                sqlx::query("UPDATE sessions SET expires_at = $1 WHERE id = $2 AND revoked = FALSE")
                    .bind(expires_at)
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn revoke_session(&self, id: &str) -> StoreResult<()> {
                sqlx::query("UPDATE sessions SET revoked = TRUE WHERE id = $1")
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn revoke_user_sessions(&self, user_id: &str, keep: Option<&str>) -> StoreResult<()> {
                sqlx::query("UPDATE sessions SET revoked = TRUE WHERE user_id = $1 AND id <> COALESCE($2, '')")
                    .bind(user_id)
                    .bind(keep)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn create_api_key(&self, k: &ApiKeyRecord) -> StoreResult<()> {
                sqlx::query(
                    "INSERT INTO api_keys (id, user_id, name, prefix, key_hash, created_at, last_used_at, expires_at, revoked)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                )
                .bind(&k.id)
                .bind(&k.user_id)
                .bind(&k.name)
                .bind(&k.prefix)
                .bind(&k.key_hash)
                .bind(k.created_at)
                .bind(k.last_used_at)
                .bind(k.expires_at)
                .bind(k.revoked)
                .execute(&self.pool)
                .await
                .map_err(conflict("key collision; try again"))?;
                Ok(())
            }

            async fn list_api_keys(&self, user_id: &str) -> StoreResult<Vec<ApiKeyRecord>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {API_KEY_COLS}
                     FROM api_keys WHERE user_id = $1 AND revoked = FALSE ORDER BY created_at DESC, id"
                ))
                .bind(user_id)
                .fetch_all(&self.pool)
                .await?)
            }

            async fn api_key_by_hash(&self, hash: &str) -> StoreResult<Option<ApiKeyRecord>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {API_KEY_COLS}
                     FROM api_keys WHERE key_hash = $1"
                ))
                .bind(hash)
                .fetch_optional(&self.pool)
                .await?)
            }

            async fn touch_api_key(&self, id: &str, now: i64) -> StoreResult<()> {
                sqlx::query("UPDATE api_keys SET last_used_at = $1 WHERE id = $2")
                    .bind(now)
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn revoke_api_key(&self, user_id: &str, id: &str) -> StoreResult<bool> {
                let r = sqlx::query("UPDATE api_keys SET revoked = TRUE WHERE id = $1 AND user_id = $2 AND revoked = FALSE")
                    .bind(id)
                    .bind(user_id)
                    .execute(&self.pool)
                    .await?;
                Ok(r.rows_affected() == 1)
            }

            async fn revoke_user_api_keys(&self, user_id: &str) -> StoreResult<()> {
                sqlx::query("UPDATE api_keys SET revoked = TRUE WHERE user_id = $1")
                    .bind(user_id)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn create_invitation(&self, i: &InvitationRecord) -> StoreResult<()> {
                sqlx::query(
                    "INSERT INTO invitations (id, tenant_id, email, role, token_hash, created_by, created_at, expires_at, accepted_at, revoked)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                )
                .bind(&i.id)
                .bind(&i.tenant_id)
                .bind(&i.email)
                .bind(&i.role)
                .bind(&i.token_hash)
                .bind(&i.created_by)
                .bind(i.created_at)
                .bind(i.expires_at)
                .bind(i.accepted_at)
                .bind(i.revoked)
                .execute(&self.pool)
                .await
                .map_err(conflict("invitation collision; try again"))?;
                Ok(())
            }

            async fn list_invitations(&self, tenant_id: &str) -> StoreResult<Vec<InvitationRecord>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {INVITATION_COLS}
                     FROM invitations WHERE tenant_id = $1 AND revoked = FALSE ORDER BY created_at DESC, id"
                ))
                .bind(tenant_id)
                .fetch_all(&self.pool)
                .await?)
            }

            async fn invitation_by_token_hash(&self, hash: &str) -> StoreResult<Option<InvitationRecord>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {INVITATION_COLS}
                     FROM invitations WHERE token_hash = $1"
                ))
                .bind(hash)
                .fetch_optional(&self.pool)
                .await?)
            }

            async fn revoke_invitation(&self, tenant_id: &str, id: &str) -> StoreResult<bool> {
                let r = sqlx::query(
                    "UPDATE invitations SET revoked = TRUE WHERE id = $1 AND tenant_id = $2 AND revoked = FALSE",
                )
                .bind(id)
                .bind(tenant_id)
                .execute(&self.pool)
                .await?;
                Ok(r.rows_affected() == 1)
            }

            async fn quota(&self, scope: QuotaScope, subject_id: &str) -> StoreResult<QuotaRecord> {
                let q: Option<QuotaRecord> = sqlx::query_as(
                    "SELECT max_gpus, gpu_hours_per_month, max_queued_tasks, allowed_gpu_types, max_storage_bytes, share
                     FROM quotas WHERE scope = $1 AND subject_id = $2",
                )
                .bind(scope.as_str())
                .bind(subject_id)
                .fetch_optional(&self.pool)
                .await?;
                Ok(q.unwrap_or_default())
            }

            async fn set_quota(&self, scope: QuotaScope, subject_id: &str, q: &QuotaRecord, now: i64) -> StoreResult<()> {
                sqlx::query(
                    "INSERT INTO quotas (scope, subject_id, max_gpus, gpu_hours_per_month, max_queued_tasks, allowed_gpu_types, max_storage_bytes, updated_at, share)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                     ON CONFLICT (scope, subject_id) DO UPDATE SET
                        max_gpus = excluded.max_gpus,
                        gpu_hours_per_month = excluded.gpu_hours_per_month,
                        max_queued_tasks = excluded.max_queued_tasks,
                        allowed_gpu_types = excluded.allowed_gpu_types,
                        max_storage_bytes = excluded.max_storage_bytes,
                        updated_at = excluded.updated_at,
                        share = excluded.share",
                )
                .bind(scope.as_str())
                .bind(subject_id)
                .bind(q.max_gpus)
                .bind(q.gpu_hours_per_month)
                .bind(q.max_queued_tasks)
                .bind(&q.allowed_gpu_types)
                .bind(q.max_storage_bytes)
                .bind(now)
                .bind(q.share)
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn all_quotas(&self) -> StoreResult<Vec<QuotaRow>> {
                Ok(sqlx::query_as(
                    "SELECT scope, subject_id, max_gpus, gpu_hours_per_month, max_queued_tasks, allowed_gpu_types, max_storage_bytes, share FROM quotas",
                )
                .fetch_all(&self.pool)
                .await?)
            }

            async fn upsert_node(&self, n: &NodeRecord) -> StoreResult<()> {
                sqlx::query(
                    "INSERT INTO nodes (id, zone, labels, cpu_millis, mem_bytes, gpus, schedulable, created_at, updated_at, status,
                                        runtime, isolation, data_roots)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
                     ON CONFLICT (id) DO UPDATE SET zone = excluded.zone, labels = excluded.labels,
                        cpu_millis = excluded.cpu_millis, mem_bytes = excluded.mem_bytes, gpus = excluded.gpus,
                        schedulable = excluded.schedulable, updated_at = excluded.updated_at,
                        runtime = excluded.runtime, isolation = excluded.isolation, data_roots = excluded.data_roots",
                )
                .bind(&n.id)
                .bind(&n.zone)
                .bind(&n.labels)
                .bind(n.cpu_millis)
                .bind(n.mem_bytes)
                .bind(&n.gpus)
                .bind(n.schedulable)
                .bind(n.created_at)
                .bind(n.updated_at)
                .bind(&n.status)
                .bind(&n.runtime)
                .bind(&n.isolation)
                .bind(&n.data_roots)
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn set_node_host(&self, id: &str, runtime: &str, isolation: &str, data_roots: &str) -> StoreResult<()> {
                sqlx::query("UPDATE nodes SET runtime = $1, isolation = $2, data_roots = $3 WHERE id = $4")
                    .bind(runtime)
                    .bind(isolation)
                    .bind(data_roots)
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn set_node_open_to_all(&self, id: &str, open: bool) -> StoreResult<bool> {
                let r = sqlx::query("UPDATE nodes SET open_to_all = $1 WHERE id = $2")
                    .bind(open)
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                Ok(r.rows_affected() == 1)
            }

            async fn set_tenant_trusted(&self, id: &str, trusted: bool) -> StoreResult<bool> {
                let r = sqlx::query("UPDATE tenants SET trusted = $1 WHERE id = $2")
                    .bind(trusted)
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                Ok(r.rows_affected() == 1)
            }

            async fn trusted_tenants(&self) -> StoreResult<Vec<String>> {
                let rows: Vec<(String,)> = sqlx::query_as("SELECT id FROM tenants WHERE trusted = TRUE")
                    .fetch_all(&self.pool)
                    .await?;
                Ok(rows.into_iter().map(|r| r.0).collect())
            }

            async fn storage_bytes(&self, tenant_id: &str) -> StoreResult<i64> {
                let row: Option<(i64,)> = sqlx::query_as("SELECT bytes FROM tenant_storage WHERE tenant_id = $1")
                    .bind(tenant_id)
                    .fetch_optional(&self.pool)
                    .await?;
                Ok(row.map_or(0, |r| r.0))
            }

            async fn add_storage_bytes(&self, tenant_id: &str, delta: i64) -> StoreResult<()> {
                let mut tx = self.pool.begin().await?;
                sqlx::query("INSERT INTO tenant_storage (tenant_id, bytes) VALUES ($1, 0) ON CONFLICT (tenant_id) DO NOTHING")
                    .bind(tenant_id)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(
                    "UPDATE tenant_storage SET bytes = CASE WHEN bytes + $1 < 0 THEN 0 ELSE bytes + $1 END
                     WHERE tenant_id = $2",
                )
                .bind(delta)
                .bind(tenant_id)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(())
            }

            async fn list_nodes(&self) -> StoreResult<Vec<NodeRecord>> {
                Ok(sqlx::query_as(&format!("SELECT {NODE_COLS} FROM nodes ORDER BY id"))
                .fetch_all(&self.pool)
                .await?)
            }

            async fn delete_node(&self, id: &str) -> StoreResult<bool> {
                let r = sqlx::query("DELETE FROM nodes WHERE id = $1").bind(id).execute(&self.pool).await?;
                Ok(r.rows_affected() == 1)
            }

            async fn create_task(&self, t: &TaskRecord, labels: &[(String, String)]) -> StoreResult<TaskCreated> {
                let mut tx = self.pool.begin().await?;
                let inserted = sqlx::query(
                    "INSERT INTO tasks (id, tenant_id, user_id, name, state, spec, gpus_total, idempotency_key, attempts,
                        batch_size, placement, attained_gpu_seconds, last_checkpoint_at, created_at, updated_at, started_at, finished_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)",
                )
                .bind(&t.id)
                .bind(&t.tenant_id)
                .bind(&t.user_id)
                .bind(&t.name)
                .bind(&t.state)
                .bind(&t.spec)
                .bind(t.gpus_total)
                .bind(&t.idempotency_key)
                .bind(t.attempts)
                .bind(t.batch_size)
                .bind(&t.placement)
                .bind(t.attained_gpu_seconds)
                .bind(t.last_checkpoint_at)
                .bind(t.created_at)
                .bind(t.updated_at)
                .bind(t.started_at)
                .bind(t.finished_at)
                .execute(&mut *tx)
                .await;
                match inserted {
                    Ok(_) => {}
                    Err(sqlx::Error::Database(ref e)) if e.is_unique_violation() && t.idempotency_key.is_some() => {
                        drop(tx);
                        let existing: Option<TaskWithUser> = sqlx::query_as(&format!(
                            "SELECT {TASK_COLS}, u.email AS user_email FROM tasks t JOIN users u ON u.id = t.user_id
                             WHERE t.user_id = $1 AND t.idempotency_key = $2"
                        ))
                        .bind(&t.user_id)
                        .bind(&t.idempotency_key)
                        .fetch_optional(&self.pool)
                        .await?;
                        return existing
                            .map(|e| TaskCreated::Existing(Box::new(e)))
                            .ok_or_else(|| StoreError::Conflict("idempotency key clash; retry".into()));
                    }
                    Err(e) => return Err(e.into()),
                }
                for (k, v) in labels {
                    sqlx::query("INSERT INTO task_labels (task_id, key, value) VALUES ($1, $2, $3)")
                        .bind(&t.id)
                        .bind(k)
                        .bind(v)
                        .execute(&mut *tx)
                        .await?;
                }
                insert_event!(&mut *tx, &t.id, t.created_at, "submitted", "task submitted");
                tx.commit().await?;
                Ok(TaskCreated::Created)
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

            async fn list_tasks(&self, f: &TaskFilter) -> StoreResult<Vec<TaskWithUser>> {
                let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                    "SELECT {TASK_COLS}, u.email AS user_email FROM tasks t JOIN users u ON u.id = t.user_id WHERE t.tenant_id = "
                ));
                q.push_bind(&f.tenant_id);
                if let Some(state) = &f.state {
                    q.push(" AND t.state = ").push_bind(state);
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

            async fn active_tasks(&self) -> StoreResult<Vec<TaskRecord>> {
                Ok(sqlx::query_as(&format!("SELECT {TASK_COLS} FROM tasks t WHERE t.state IN {ACTIVE} ORDER BY t.created_at, t.id"))
                    .fetch_all(&self.pool)
                    .await?)
            }

            async fn cancel_task(&self, tenant_id: &str, id: &str, now: i64) -> StoreResult<CancelOutcome> {
                let mut tx = self.pool.begin().await?;
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
                // The ending run's service joins the task's (runs still open count apart).
                sqlx::query(
                    "UPDATE tasks SET attained_gpu_seconds = attained_gpu_seconds + COALESCE(
                        (SELECT SUM(a.gpu_seconds) FROM attempts a WHERE a.task_id = tasks.id AND a.ended_at IS NULL), 0)
                     WHERE id = $1",
                )
                .bind(id)
                .execute(&mut *tx)
                .await?;
                sqlx::query("UPDATE attempts SET ended_at = $1, reason = 'cancelled' WHERE task_id = $2 AND ended_at IS NULL")
                    .bind(now)
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                insert_event!(&mut *tx, id, now, "cancelled", "cancelled by the user");
                tx.commit().await?;
                Ok(CancelOutcome::Cancelled)
            }

            async fn place_task(&self, term: Term, id: &str, placement: &str, node: &str, gpus: i64, now: i64) -> StoreResult<bool> {
                let mut tx = self.pool.begin().await?;
                fence!(&mut *tx, term);
                let r = sqlx::query(
                    "UPDATE tasks SET state = 'scheduled', placement = $1, attempts = attempts + 1, updated_at = $2, stop_reason = NULL,
                        waiting = NULL
                     WHERE id = $3 AND state = 'pending'",
                )
                .bind(placement)
                .bind(now)
                .bind(id)
                .execute(&mut *tx)
                .await?;
                if r.rows_affected() != 1 {
                    return Ok(false);
                }
                sqlx::query(
                    "INSERT INTO attempts (task_id, number, node, placement, gpus, started_at, batch_size)
                     SELECT id, attempts, $1, $2, $3, $4, batch_size FROM tasks WHERE id = $5",
                )
                .bind(node)
                .bind(placement)
                .bind(gpus)
                .bind(now)
                .bind(id)
                .execute(&mut *tx)
                .await?;
                insert_event!(&mut *tx, id, now, "scheduled", &format!("placed on {node}"));
                tx.commit().await?;
                Ok(true)
            }

            async fn requeue_task(&self, fence: Option<Term>, id: &str, reason: &str, message: &str, now: i64) -> StoreResult<bool> {
                let mut tx = self.pool.begin().await?;
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
                // The ending run's service joins the task's (runs still open count apart).
                sqlx::query(
                    "UPDATE tasks SET attained_gpu_seconds = attained_gpu_seconds + COALESCE(
                        (SELECT SUM(a.gpu_seconds) FROM attempts a WHERE a.task_id = tasks.id AND a.ended_at IS NULL), 0)
                     WHERE id = $1",
                )
                .bind(id)
                .execute(&mut *tx)
                .await?;
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

            async fn mark_running(&self, id: &str, attempt: i64, now: i64) -> StoreResult<bool> {
                let mut tx = self.pool.begin().await?;
                let r = sqlx::query(
                    "UPDATE tasks SET state = 'running', started_at = COALESCE(started_at, $1), updated_at = $1
                     WHERE id = $2 AND state = 'scheduled' AND attempts = $3",
                )
                .bind(now)
                .bind(id)
                .bind(attempt)
                .execute(&mut *tx)
                .await?;
                if r.rows_affected() != 1 {
                    return Ok(false);
                }
                insert_event!(&mut *tx, id, now, "running", &format!("attempt {attempt} started"));
                tx.commit().await?;
                Ok(true)
            }

            async fn finish_attempt(&self, id: &str, attempt: i64, end: &AttemptEnd, now: i64) -> StoreResult<bool> {
                let mut tx = self.pool.begin().await?;
                let finished = if end.next_state == "pending" { None } else { Some(now) };
                let r = sqlx::query(
                    "UPDATE tasks SET state = $1, placement = NULL, batch_size = $2, updated_at = $3, finished_at = $4, stop_reason = NULL
                     WHERE id = $5 AND attempts = $6 AND state IN ('scheduled', 'running')",
                )
                .bind(&end.next_state)
                .bind(end.next_batch_size)
                .bind(now)
                .bind(finished)
                .bind(id)
                .bind(attempt)
                .execute(&mut *tx)
                .await?;
                if r.rows_affected() != 1 {
                    return Ok(false);
                }
                // The ending run's service joins the task's (runs still open count apart).
                sqlx::query(
                    "UPDATE tasks SET attained_gpu_seconds = attained_gpu_seconds + COALESCE(
                        (SELECT SUM(a.gpu_seconds) FROM attempts a WHERE a.task_id = tasks.id AND a.ended_at IS NULL), 0)
                     WHERE id = $1",
                )
                .bind(id)
                .execute(&mut *tx)
                .await?;
                sqlx::query("UPDATE attempts SET ended_at = $1, exit_code = $2, reason = $3 WHERE task_id = $4 AND number = $5")
                    .bind(now)
                    .bind(end.exit_code)
                    .bind(&end.reason)
                    .bind(id)
                    .bind(attempt)
                    .execute(&mut *tx)
                    .await?;
                let kind = if end.next_state == "pending" { "retrying" } else { end.next_state.as_str() };
                insert_event!(&mut *tx, id, now, kind, &end.message);
                tx.commit().await?;
                Ok(true)
            }

            async fn scheduling_tasks(&self) -> StoreResult<Vec<SchedulingTaskRecord>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {TASK_COLS}, a.started_at AS run_started_at, a.charged_until AS run_charged_until,
                            a.gpu_seconds AS run_gpu_seconds
                     FROM tasks t LEFT JOIN attempts a ON a.task_id = t.id AND a.number = t.attempts AND a.ended_at IS NULL
                     WHERE t.state IN {ACTIVE} ORDER BY t.created_at, t.id"
                ))
                .fetch_all(&self.pool)
                .await?)
            }

            async fn unsettled_runs(&self) -> StoreResult<Vec<UnsettledRunRecord>> {
                Ok(sqlx::query_as(
                    "SELECT a.task_id, a.number, t.user_id, t.tenant_id, t.spec, a.placement, a.started_at, a.ended_at,
                            a.charged_until, a.gpu_seconds
                     FROM attempts a JOIN tasks t ON t.id = a.task_id
                     WHERE a.settled = FALSE AND a.ended_at IS NOT NULL",
                )
                .fetch_all(&self.pool)
                .await?)
            }

            async fn task_utilization(&self, from: i64, to: i64) -> StoreResult<Vec<(String, f64)>> {
                Ok(sqlx::query_as(
                    "SELECT task_id, AVG(util) FROM gpu_samples
                     WHERE at > $1 AND at <= $2 AND task_id IS NOT NULL GROUP BY task_id",
                )
                .bind(from)
                .bind(to)
                .fetch_all(&self.pool)
                .await?)
            }

            async fn save_charges(&self, charges: &[RunChargeRecord], usage: &[UsageRecord]) -> StoreResult<bool> {
                let mut tx = self.pool.begin().await?;
                for c in charges {
                    // Only as the scheduler read it: charged up to `from`, and (while it is
                    // charged as running) not ended since.
                    let r = sqlx::query(
                        "UPDATE attempts SET charged_until = $1, gpu_seconds = $2, settled = $3
                         WHERE task_id = $4 AND number = $5 AND COALESCE(charged_until, started_at) = $6
                           AND settled = FALSE AND (($3 AND ended_at IS NOT NULL) OR (NOT $3 AND ended_at IS NULL))",
                    )
                    .bind(c.charged_until)
                    .bind(c.gpu_seconds)
                    .bind(c.settles)
                    .bind(&c.task_id)
                    .bind(c.number)
                    .bind(c.from)
                    .execute(&mut *tx)
                    .await?;
                    if r.rows_affected() != 1 {
                        tx.rollback().await?;
                        return Ok(false);
                    }
                    if c.settles {
                        sqlx::query("UPDATE tasks SET attained_gpu_seconds = attained_gpu_seconds + $1 WHERE id = $2")
                            .bind(c.added)
                            .bind(&c.task_id)
                            .execute(&mut *tx)
                            .await?;
                    }
                }
                for r in usage {
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
                Ok(true)
            }

            async fn task_events(&self, id: &str) -> StoreResult<Vec<EventRecord>> {
                Ok(sqlx::query_as("SELECT at, kind, message FROM task_events WHERE task_id = $1 ORDER BY id")
                    .bind(id)
                    .fetch_all(&self.pool)
                    .await?)
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

            async fn append_logs(&self, id: &str, attempt: i64, lines: &[(i64, String, String)]) -> StoreResult<()> {
                if lines.is_empty() {
                    return Ok(());
                }
                let mut q = sqlx::QueryBuilder::<$db>::new("INSERT INTO task_logs (task_id, attempt, at, stream, line) ");
                q.push_values(lines, |mut b, (at, stream, line)| {
                    b.push_bind(id).push_bind(attempt).push_bind(*at).push_bind(stream).push_bind(line);
                });
                q.build().execute(&self.pool).await?;
                Ok(())
            }

            async fn task_logs(&self, id: &str, after: i64, limit: i64) -> StoreResult<Vec<LogRecord>> {
                Ok(sqlx::query_as(
                    "SELECT id, at, stream, line FROM task_logs WHERE task_id = $1 AND id > $2 ORDER BY id LIMIT $3",
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

            async fn load_usage(&self) -> StoreResult<Vec<UsageRecord>> {
                Ok(sqlx::query_as(
                    "SELECT scope, subject_id, decayed_gpu_seconds, updated_at, window_alloc_gpu_seconds,
                            window_busy_gpu_seconds, month, month_gpu_seconds FROM usage",
                )
                .fetch_all(&self.pool)
                .await?)
            }

            async fn create_registration_token(&self, t: &RegistrationTokenRecord) -> StoreResult<()> {
                sqlx::query(
                    "INSERT INTO registration_tokens (id, name, token_hash, created_by, created_at, expires_at, revoked, max_uses, uses, node_id)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                )
                .bind(&t.id)
                .bind(&t.name)
                .bind(&t.token_hash)
                .bind(&t.created_by)
                .bind(t.created_at)
                .bind(t.expires_at)
                .bind(t.revoked)
                .bind(t.max_uses)
                .bind(t.uses)
                .bind(&t.node_id)
                .execute(&self.pool)
                .await
                .map_err(conflict("token collision; try again"))?;
                Ok(())
            }

            async fn list_registration_tokens(&self) -> StoreResult<Vec<RegistrationTokenRecord>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {REG_TOKEN_COLS} FROM registration_tokens
                     WHERE revoked = FALSE AND uses < max_uses ORDER BY created_at DESC"
                ))
                .fetch_all(&self.pool)
                .await?)
            }

            async fn registration_token_by_hash(&self, hash: &str) -> StoreResult<Option<RegistrationTokenRecord>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {REG_TOKEN_COLS} FROM registration_tokens
                     WHERE token_hash = $1"
                ))
                .bind(hash)
                .fetch_optional(&self.pool)
                .await?)
            }

            async fn use_registration_token(&self, id: &str, node_id: &str, now: i64) -> StoreResult<bool> {
                let r = sqlx::query(
                    "UPDATE registration_tokens SET uses = uses + 1
                     WHERE id = $1 AND revoked = FALSE AND expires_at > $2 AND uses < max_uses
                       AND (node_id IS NULL OR node_id = $3)",
                )
                .bind(id)
                .bind(now)
                .bind(node_id)
                .execute(&self.pool)
                .await?;
                Ok(r.rows_affected() == 1)
            }

            async fn revoke_registration_token(&self, id: &str) -> StoreResult<bool> {
                let r = sqlx::query("UPDATE registration_tokens SET revoked = TRUE WHERE id = $1 AND revoked = FALSE")
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                Ok(r.rows_affected() == 1)
            }

            async fn set_node_credential(&self, id: &str, hash: &str) -> StoreResult<()> {
                sqlx::query("UPDATE nodes SET credential_hash = $1 WHERE id = $2")
                    .bind(hash)
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn node_by_credential(&self, hash: &str) -> StoreResult<Option<NodeRecord>> {
                Ok(sqlx::query_as(&format!("SELECT {NODE_COLS} FROM nodes WHERE credential_hash = $1"))
                    .bind(hash)
                    .fetch_optional(&self.pool)
                    .await?)
            }

            async fn touch_node(&self, id: &str, now: i64) -> StoreResult<()> {
                sqlx::query(
                    "UPDATE nodes SET last_seen = $1, status = CASE WHEN status = 'lost' THEN 'ready' ELSE status END
                     WHERE id = $2",
                )
                .bind(now)
                .bind(id)
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn set_node_status(&self, id: &str, status: &str) -> StoreResult<bool> {
                let r = sqlx::query("UPDATE nodes SET status = $1 WHERE id = $2")
                    .bind(status)
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                Ok(r.rows_affected() == 1)
            }

            async fn set_stop_reason(&self, fence: Option<Term>, id: &str, reason: &str) -> StoreResult<bool> {
                let mut tx = self.pool.begin().await?;
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
                let mut tx = self.pool.begin().await?;
                fence!(&mut *tx, term);
                for (id, waiting) in changes {
                    sqlx::query("UPDATE tasks SET waiting = $1 WHERE id = $2 AND state = 'pending'")
                        .bind(waiting)
                        .bind(id)
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
                Ok(())
            }

            async fn insert_gpu_samples(&self, samples: &[GpuSampleRecord]) -> StoreResult<()> {
                let mut tx = self.pool.begin().await?;
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

            async fn create_artifact(&self, a: &ArtifactRecord) -> StoreResult<()> {
                sqlx::query(&format!(
                    "INSERT INTO artifacts ({ARTIFACT_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)"
                ))
                .bind(&a.id)
                .bind(&a.task_id)
                .bind(&a.tenant_id)
                .bind(a.attempt)
                .bind(&a.kind)
                .bind(&a.state)
                .bind(&a.bucket)
                .bind(&a.prefix)
                .bind(&a.manifest)
                .bind(a.files)
                .bind(a.size_bytes)
                .bind(a.step)
                .bind(a.epoch)
                .bind(a.created_at)
                .bind(a.completed_at)
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn artifact(&self, id: &str) -> StoreResult<Option<ArtifactRecord>> {
                Ok(sqlx::query_as(&format!("SELECT {ARTIFACT_COLS} FROM artifacts WHERE id = $1"))
                    .bind(id)
                    .fetch_optional(&self.pool)
                    .await?)
            }

            async fn complete_artifact(&self, a: &ArtifactRecord, now: i64) -> StoreResult<bool> {
                let mut tx = self.pool.begin().await?;
                let r = sqlx::query(
                    "UPDATE artifacts SET state = 'complete', manifest = $1, files = $2, size_bytes = $3, step = $4, epoch = $5, completed_at = $6
                     WHERE id = $7 AND state = 'uploading'
                       AND EXISTS (SELECT 1 FROM tasks WHERE tasks.id = artifacts.task_id AND tasks.attempts = artifacts.attempt)",
                )
                .bind(&a.manifest)
                .bind(a.files)
                .bind(a.size_bytes)
                .bind(a.step)
                .bind(a.epoch)
                .bind(now)
                .bind(&a.id)
                .execute(&mut *tx)
                .await?;
                if r.rows_affected() != 1 {
                    return Ok(false);
                }
                let size = bytesize::ByteSize(a.size_bytes.max(0) as u64).display().si().to_string();
                let step = a.step.map(|s| format!(", step {s}")).unwrap_or_default();
                let message = if a.kind == "checkpoint" {
                    sqlx::query("UPDATE tasks SET last_checkpoint_at = $1 WHERE id = $2")
                        .bind(now)
                        .bind(&a.task_id)
                        .execute(&mut *tx)
                        .await?;
                    format!("checkpoint of attempt {} saved: {} files, {size}{step}", a.attempt, a.files)
                } else {
                    format!("results saved: {} files, {size}", a.files)
                };
                let kind = if a.kind == "checkpoint" { "checkpoint" } else { "results" };
                insert_event!(&mut *tx, &a.task_id, now, kind, &message);
                tx.commit().await?;
                Ok(true)
            }

            async fn task_artifacts(&self, task_id: &str, kind: &str) -> StoreResult<Vec<ArtifactRecord>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {ARTIFACT_COLS} FROM artifacts WHERE task_id = $1 AND kind = $2 AND state = 'complete'
                     ORDER BY completed_at DESC, created_at DESC"
                ))
                .bind(task_id)
                .bind(kind)
                .fetch_all(&self.pool)
                .await?)
            }

            async fn open_uploads(&self, task_id: &str, kind: &str) -> StoreResult<Vec<ArtifactRecord>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {ARTIFACT_COLS} FROM artifacts WHERE task_id = $1 AND kind = $2 AND state = 'uploading'
                     ORDER BY created_at, id"
                ))
                .bind(task_id)
                .bind(kind)
                .fetch_all(&self.pool)
                .await?)
            }

            async fn set_artifact_state(&self, id: &str, from: &str, to: &str) -> StoreResult<bool> {
                let r = sqlx::query("UPDATE artifacts SET state = $1 WHERE id = $2 AND state = $3")
                    .bind(to)
                    .bind(id)
                    .bind(from)
                    .execute(&self.pool)
                    .await?;
                Ok(r.rows_affected() == 1)
            }

            async fn stale_uploads(&self, before: i64) -> StoreResult<Vec<ArtifactRecord>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {ARTIFACT_COLS} FROM artifacts WHERE (state = 'uploading' AND created_at < $1) OR state = 'deleting'"
                ))
                .bind(before)
                .fetch_all(&self.pool)
                .await?)
            }

            async fn add_event(&self, task_id: &str, kind: &str, message: &str, now: i64) -> StoreResult<()> {
                insert_event!(&self.pool, task_id, now, kind, message);
                Ok(())
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

            async fn usage_utilization(&self, from: i64, to: i64) -> StoreResult<Vec<UsageUtilRecord>> {
                Ok(sqlx::query_as(
                    "SELECT user_id, SUM(s * u) / CAST(SUM(s) AS DOUBLE PRECISION) AS avg_util, CAST(SUM(s) AS BIGINT) AS samples
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
                .fetch_all(&self.pool)
                .await?)
            }

            async fn compact_gpu_samples(&self, before: i64, rollups_before: i64) -> StoreResult<u64> {
                let mut tx = self.pool.begin().await?;
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

            async fn still_leads(&self, guard: &mut LeaderGuard) -> StoreResult<bool> {
                self.still_leads_impl(guard).await
            }

            async fn resign(&self, guard: LeaderGuard) -> StoreResult<()> {
                self.resign_impl(guard).await
            }

            async fn publish(&self, payload: &str) -> StoreResult<()> {
                self.publish_impl(payload).await
            }

            async fn subscribe(&self) -> StoreResult<Option<tokio::sync::mpsc::Receiver<String>>> {
                self.subscribe_impl().await
            }

            async fn try_lead(&self, holder: &str, now: i64) -> StoreResult<Option<LeaderGuard>> {
                self.try_lead_impl(holder, now).await
            }
        }
    };
}

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
        .bind(&$u.role)
        .bind($u.platform_admin)
        .bind($u.disabled)
        .bind($u.created_at)
        .execute($conn)
        .await
        .map_err(conflict("an account with this email already exists"))?
    };
}

// `insert_user!` must be defined before use inside the expanded impls.
impl_store!(SqliteStore, "sqlite", sqlx::Sqlite);
impl_store!(PostgresStore, "postgres", sqlx::Postgres);
