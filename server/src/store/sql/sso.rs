//! The SQL of [`SingleSignOn`], for both backends.

use super::*;

const PROVIDER_COLS: &str = "id, scope, label, issuer, client_id, client_secret, allowed_domains, \
     scopes, role_claim, role_map, default_role, created_at, updated_at";

/// A provider's row: lists and maps as JSON text.
#[derive(sqlx::FromRow)]
struct ProviderRow {
    id: String,
    scope: String,
    label: String,
    issuer: String,
    client_id: String,
    client_secret: String,
    allowed_domains: String,
    scopes: String,
    role_claim: Option<String>,
    role_map: String,
    default_role: Option<String>,
    created_at: i64,
    updated_at: i64,
}

impl ProviderRow {
    fn into_record(self) -> StoreResult<SsoProviderRecord> {
        let json = |e: serde_json::Error| StoreError::Database(sqlx::Error::Decode(Box::new(e)));
        Ok(SsoProviderRecord {
            allowed_domains: serde_json::from_str(&self.allowed_domains).map_err(json)?,
            scopes: serde_json::from_str(&self.scopes).map_err(json)?,
            role_map: serde_json::from_str(&self.role_map).map_err(json)?,
            scope: SsoScope::from_key(&self.scope),
            id: self.id,
            label: self.label,
            issuer: self.issuer,
            client_id: self.client_id,
            client_secret: self.client_secret,
            role_claim: self.role_claim,
            default_role: self.default_role,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }
}

fn records(rows: Vec<ProviderRow>) -> StoreResult<Vec<SsoProviderRecord>> {
    rows.into_iter().map(ProviderRow::into_record).collect()
}

macro_rules! impl_sso {
    ($store:ty) => {
        #[async_trait]
        impl SingleSignOn for $store {
            async fn sso_provider(&self, id: &str) -> StoreResult<Option<SsoProviderRecord>> {
                let rows: Vec<ProviderRow> =
                    sqlx::query_as(&format!("SELECT {PROVIDER_COLS} FROM sso_providers WHERE id = $1"))
                        .bind(id)
                        .fetch_all(&self.pool)
                        .await?;
                Ok(records(rows)?.pop())
            }

            async fn sso_provider_of(&self, scope: &SsoScope) -> StoreResult<Option<SsoProviderRecord>> {
                let rows: Vec<ProviderRow> =
                    sqlx::query_as(&format!("SELECT {PROVIDER_COLS} FROM sso_providers WHERE scope = $1"))
                        .bind(scope.key())
                        .fetch_all(&self.pool)
                        .await?;
                Ok(records(rows)?.pop())
            }

            async fn sso_providers(&self) -> StoreResult<Vec<SsoProviderRecord>> {
                let rows: Vec<ProviderRow> = sqlx::query_as(&format!(
                    "SELECT {PROVIDER_COLS} FROM sso_providers ORDER BY label, id"
                ))
                .fetch_all(&self.pool)
                .await?;
                records(rows)
            }

            async fn put_sso_provider(&self, p: &SsoProviderRecord) -> StoreResult<SsoProviderRecord> {
                let rows: Vec<ProviderRow> = sqlx::query_as(&format!(
                    "INSERT INTO sso_providers ({PROVIDER_COLS})
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
                     ON CONFLICT (scope) DO UPDATE SET label = excluded.label, issuer = excluded.issuer,
                        client_id = excluded.client_id, client_secret = excluded.client_secret,
                        allowed_domains = excluded.allowed_domains, scopes = excluded.scopes, role_claim = excluded.role_claim,
                        role_map = excluded.role_map, default_role = excluded.default_role,
                        updated_at = excluded.updated_at
                     RETURNING {PROVIDER_COLS}"
                ))
                .bind(&p.id)
                .bind(p.scope.key())
                .bind(&p.label)
                .bind(&p.issuer)
                .bind(&p.client_id)
                .bind(&p.client_secret)
                .bind(serde_json::json!(p.allowed_domains).to_string())
                .bind(serde_json::json!(p.scopes).to_string())
                .bind(&p.role_claim)
                .bind(serde_json::json!(p.role_map).to_string())
                .bind(&p.default_role)
                .bind(p.created_at)
                .bind(p.updated_at)
                .fetch_all(&self.pool)
                .await?;
                records(rows)?.pop().ok_or(StoreError::NotFound)
            }

            async fn delete_sso_provider(&self, scope: &SsoScope) -> StoreResult<bool> {
                let mut tx = self.pool.begin_with(Self::BEGIN_WRITE).await?;
                let r = sqlx::query("DELETE FROM sso_providers WHERE scope = $1")
                    .bind(scope.key())
                    .execute(&mut *tx)
                    .await?;
                if let Some(tenant) = scope.tenant() {
                    sqlx::query("UPDATE tenants SET password_login = TRUE WHERE id = $1")
                        .bind(tenant)
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
                Ok(r.rows_affected() == 1)
            }

            async fn password_login(&self, tenant_id: &str) -> StoreResult<bool> {
                let allowed: Option<bool> =
                    sqlx::query_scalar("SELECT password_login FROM tenants WHERE id = $1")
                        .bind(tenant_id)
                        .fetch_optional(&self.pool)
                        .await?;
                Ok(allowed.unwrap_or(true))
            }

            async fn set_password_login(&self, tenant_id: &str, allowed: bool) -> StoreResult<()> {
                sqlx::query("UPDATE tenants SET password_login = $1 WHERE id = $2")
                    .bind(allowed)
                    .bind(tenant_id)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn begin_sso_login(&self, l: &SsoLoginRecord, now: i64) -> StoreResult<()> {
                sqlx::query("DELETE FROM sso_logins WHERE expires_at <= $1")
                    .bind(now)
                    .execute(&self.pool)
                    .await?;
                sqlx::query(
                    "INSERT INTO sso_logins (state_hash, provider_id, nonce, pkce_verifier, browser_hash, return_to, link_user, expires_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                )
                .bind(&l.state_hash)
                .bind(&l.provider_id)
                .bind(&l.nonce)
                .bind(&l.pkce_verifier)
                .bind(&l.browser_hash)
                .bind(&l.return_to)
                .bind(&l.link_user)
                .bind(l.expires_at)
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn take_sso_login(&self, state_hash: &str) -> StoreResult<Option<SsoLoginRecord>> {
                Ok(sqlx::query_as(
                    "DELETE FROM sso_logins WHERE state_hash = $1
                     RETURNING state_hash, provider_id, nonce, pkce_verifier, browser_hash, return_to, link_user, expires_at",
                )
                .bind(state_hash)
                .fetch_optional(&self.pool)
                .await?)
            }

            async fn sso_identity(&self, provider_id: &str, subject: &str) -> StoreResult<Option<String>> {
                Ok(sqlx::query_scalar(
                    "SELECT user_id FROM sso_identities WHERE provider_id = $1 AND subject = $2",
                )
                .bind(provider_id)
                .bind(subject)
                .fetch_optional(&self.pool)
                .await?)
            }

            async fn sso_links_of(&self, user_id: &str) -> StoreResult<Vec<String>> {
                Ok(sqlx::query_scalar("SELECT provider_id FROM sso_identities WHERE user_id = $1")
                    .bind(user_id)
                    .fetch_all(&self.pool)
                    .await?)
            }

            async fn forget_sso_identities(&self, provider_id: &str) -> StoreResult<()> {
                sqlx::query("DELETE FROM sso_identities WHERE provider_id = $1")
                    .bind(provider_id)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn link_sso_identity(
                &self,
                provider_id: &str,
                subject: &str,
                user_id: &str,
                now: i64,
            ) -> StoreResult<()> {
                sqlx::query(
                    "INSERT INTO sso_identities (provider_id, subject, user_id, created_at)
                     VALUES ($1, $2, $3, $4) ON CONFLICT (provider_id, subject) DO NOTHING",
                )
                .bind(provider_id)
                .bind(subject)
                .bind(user_id)
                .bind(now)
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn create_sso_account(
                &self,
                tenant: Option<&TenantRecord>,
                u: &UserRecord,
                provider_id: &str,
                subject: &str,
            ) -> StoreResult<()> {
                let mut tx = self.pool.begin_with(Self::BEGIN_WRITE).await?;
                if let Some(t) = tenant {
                    insert_tenant!(&mut *tx, t);
                }
                insert_user!(&mut *tx, u);
                sqlx::query(
                    "INSERT INTO sso_identities (provider_id, subject, user_id, created_at)
                     VALUES ($1, $2, $3, $4)",
                )
                .bind(provider_id)
                .bind(subject)
                .bind(&u.id)
                .bind(u.created_at)
                .execute(&mut *tx)
                .await
                .map_err(conflict("this identity already has an account"))?;
                tx.commit().await?;
                Ok(())
            }
        }
    };
}

impl_sso!(SqliteStore);
impl_sso!(PostgresStore);
