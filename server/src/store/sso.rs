//! Single sign-on: configured OpenID providers, the identities they vouch for, and sign-ins
//! under way (kept in the database so any replica can finish what another started).

use async_trait::async_trait;

use super::*;

#[async_trait]
pub trait SingleSignOn: Send + Sync {
    async fn sso_provider(&self, id: &str) -> StoreResult<Option<SsoProviderRecord>>;
    async fn sso_provider_of(&self, scope: &SsoScope) -> StoreResult<Option<SsoProviderRecord>>;
    async fn sso_providers(&self) -> StoreResult<Vec<SsoProviderRecord>>;
    /// Adds the scope's provider or replaces it (keeping its id, so identities stay linked).
    async fn put_sso_provider(&self, p: &SsoProviderRecord) -> StoreResult<SsoProviderRecord>;
    /// Removes the scope's provider; an organization's people may sign in with passwords again.
    async fn delete_sso_provider(&self, scope: &SsoScope) -> StoreResult<bool>;
    async fn password_login(&self, tenant_id: &str) -> StoreResult<bool>;
    async fn set_password_login(&self, tenant_id: &str, allowed: bool) -> StoreResult<()>;
    /// Keeps a sign-in under way and forgets those expired at `now`.
    async fn begin_sso_login(&self, login: &SsoLoginRecord, now: i64) -> StoreResult<()>;
    /// Takes the sign-in of this state: it is gone afterwards, so a replayed state finds none.
    async fn take_sso_login(&self, state_hash: &str) -> StoreResult<Option<SsoLoginRecord>>;
    async fn sso_identity(&self, provider_id: &str, subject: &str) -> StoreResult<Option<String>>;
    /// The providers an account is linked to.
    async fn sso_links_of(&self, user_id: &str) -> StoreResult<Vec<String>>;
    /// Forgets who the provider's subjects were (its issuer changed: they are other people).
    async fn forget_sso_identities(&self, provider_id: &str) -> StoreResult<()>;
    async fn link_sso_identity(
        &self,
        provider_id: &str,
        subject: &str,
        user_id: &str,
        now: i64,
    ) -> StoreResult<()>;
    /// Creates the account (and, when given, its new organization) linked to the subject.
    async fn create_sso_account(
        &self,
        tenant: Option<&TenantRecord>,
        user: &UserRecord,
        provider_id: &str,
        subject: &str,
    ) -> StoreResult<()>;
}
