//! The SQL of [`Accounts`], for both backends.

use super::*;

const API_KEY_COLS: &str =
    "id, user_id, name, prefix, key_hash, created_at, last_used_at, expires_at, revoked";

const INVITATION_COLS: &str = "id, tenant_id, email, role, token_hash, created_by, created_at, expires_at, accepted_at, revoked";

const USER_COLS: &str =
    "u.id, u.email, u.password_hash, u.tenant_id, u.role, u.platform_admin, u.disabled, u.created_at";

macro_rules! impl_accounts {
    ($store:ty, $db:ty) => {
        #[async_trait]
        impl Accounts for $store {
            async fn create_tenant_with_owner(&self, t: &TenantRecord, u: &UserRecord) -> StoreResult<()> {
                let mut tx = self.pool.begin_with(Self::BEGIN_WRITE).await?;
                insert_tenant!(&mut *tx, t);
                insert_user!(&mut *tx, u);
                tx.commit().await?;
                Ok(())
            }

            async fn accept_invitation(&self, invitation_id: &str, u: &UserRecord, now: i64) -> StoreResult<()> {
                let mut tx = self.pool.begin_with(Self::BEGIN_WRITE).await?;
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
                Ok(sqlx::query_as("SELECT id, name, created_at, trusted, internal FROM tenants WHERE id = $1")
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
                     FROM tenants t WHERE t.internal = FALSE ORDER BY t.created_at, t.name",
                )
                .fetch_all(&self.pool)
                .await?)
            }

            async fn list_users(&self) -> StoreResult<Vec<UserWithTenant>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {USER_COLS}, t.name AS tenant_name FROM users u
                     JOIN tenants t ON t.id = u.tenant_id WHERE t.internal = FALSE ORDER BY u.created_at, u.email"
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

            async fn create_signup_request(&self, r: &SignupRequestRecord) -> StoreResult<()> {
                let mut tx = self.pool.begin_with(Self::BEGIN_WRITE).await?;
                sqlx::query("DELETE FROM signup_requests WHERE email = $1 OR expires_at < $2")
                    .bind(&r.email)
                    .bind(r.created_at)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(
                    "INSERT INTO signup_requests (token_hash, email, password_hash, tenant_name, created_at, expires_at)
                     VALUES ($1, $2, $3, $4, $5, $6)",
                )
                .bind(&r.token_hash)
                .bind(&r.email)
                .bind(&r.password_hash)
                .bind(&r.tenant_name)
                .bind(r.created_at)
                .bind(r.expires_at)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(())
            }

            async fn take_signup_request(&self, token_hash: &str, now: i64) -> StoreResult<Option<SignupRequestRecord>> {
                let mut tx = self.pool.begin_with(Self::BEGIN_WRITE).await?;
                let found: Option<SignupRequestRecord> = sqlx::query_as(
                    "SELECT token_hash, email, password_hash, tenant_name, created_at, expires_at
                     FROM signup_requests WHERE token_hash = $1",
                )
                .bind(token_hash)
                .fetch_optional(&mut *tx)
                .await?;
                sqlx::query("DELETE FROM signup_requests WHERE token_hash = $1")
                    .bind(token_hash)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(found.filter(|r| r.expires_at > now))
            }

            async fn create_invitation(&self, i: &InvitationRecord) -> StoreResult<()> {
                sqlx::query(
                    "INSERT INTO invitations (id, tenant_id, email, role, token_hash, created_by, created_at, expires_at, accepted_at, revoked)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                )
                .bind(&i.id)
                .bind(&i.tenant_id)
                .bind(&i.email)
                .bind(i.role.as_str())
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
                .bind(q.allowed_gpu_types.to_column())
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
                .fetch_all(&self.sched)
                .await?)
            }

            async fn set_tenant_trusted(&self, id: &str, trusted: bool) -> StoreResult<bool> {
                let r = sqlx::query("UPDATE tenants SET trusted = $1 WHERE id = $2")
                    .bind(trusted)
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                Ok(r.rows_affected() == 1)
            }

            async fn session_policy(&self, tenant_id: &str) -> StoreResult<SessionPolicy> {
                let row: Option<(Option<String>,)> =
                    sqlx::query_as("SELECT session_policy FROM tenants WHERE id = $1")
                        .bind(tenant_id)
                        .fetch_optional(&self.pool)
                        .await?;
                // A policy this version cannot read (written by a newer one) falls back to the
                // defaults rather than failing every check that needs it.
                Ok(row
                    .and_then(|(p,)| p)
                    .and_then(|p| serde_json::from_str(&p).ok())
                    .unwrap_or_default())
            }

            async fn set_session_policy(&self, tenant_id: &str, p: &SessionPolicy) -> StoreResult<bool> {
                let json = serde_json::to_string(p).unwrap_or_default();
                let r = sqlx::query("UPDATE tenants SET session_policy = $1 WHERE id = $2")
                    .bind(json)
                    .bind(tenant_id)
                    .execute(&self.pool)
                    .await?;
                Ok(r.rows_affected() == 1)
            }

            async fn trusted_tenants(&self) -> StoreResult<Vec<String>> {
                let rows: Vec<(String,)> = sqlx::query_as("SELECT id FROM tenants WHERE trusted = TRUE")
                    .fetch_all(&self.sched)
                    .await?;
                Ok(rows.into_iter().map(|r| r.0).collect())
            }
        }
    };
}

impl_accounts!(SqliteStore, sqlx::Sqlite);
impl_accounts!(PostgresStore, sqlx::Postgres);
