//! Organizations and their people: tenants, users, sessions, API keys, invitations, which
//! organizations are trusted, and quotas. Methods that take a `tenant_id` only ever touch rows
//! of that tenant, so a handler cannot reach another tenant's data by passing a foreign id.

use async_trait::async_trait;

use super::*;

#[async_trait]
pub trait Accounts: Send + Sync {
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
    async fn create_session(&self, session: &SessionRecord) -> StoreResult<()>;
    async fn session(&self, id: &str) -> StoreResult<Option<SessionRecord>>;
    async fn extend_session(&self, id: &str, expires_at: i64) -> StoreResult<()>;
    async fn revoke_session(&self, id: &str) -> StoreResult<()>;
    /// Ends every session of the user except `keep` (the one that changed the password).
    async fn revoke_user_sessions(&self, user_id: &str, keep: Option<&str>) -> StoreResult<()>;
    async fn create_api_key(&self, key: &ApiKeyRecord) -> StoreResult<()>;
    async fn list_api_keys(&self, user_id: &str) -> StoreResult<Vec<ApiKeyRecord>>;
    async fn api_key_by_hash(&self, hash: &str) -> StoreResult<Option<ApiKeyRecord>>;
    async fn touch_api_key(&self, id: &str, now: i64) -> StoreResult<()>;
    async fn revoke_api_key(&self, user_id: &str, id: &str) -> StoreResult<bool>;
    async fn revoke_user_api_keys(&self, user_id: &str) -> StoreResult<()>;
    async fn create_invitation(&self, inv: &InvitationRecord) -> StoreResult<()>;
    /// Keeps a sign-up until its email is confirmed (older requests of that email and expired
    /// ones are dropped).
    async fn create_signup_request(&self, r: &SignupRequestRecord) -> StoreResult<()>;
    /// The sign-up a confirmation link names, taken once; `None` when unknown or expired.
    async fn take_signup_request(
        &self,
        token_hash: &str,
        now: i64,
    ) -> StoreResult<Option<SignupRequestRecord>>;
    async fn list_invitations(&self, tenant_id: &str) -> StoreResult<Vec<InvitationRecord>>;
    async fn invitation_by_token_hash(&self, hash: &str) -> StoreResult<Option<InvitationRecord>>;
    async fn revoke_invitation(&self, tenant_id: &str, id: &str) -> StoreResult<bool>;
    async fn quota(&self, scope: QuotaScope, subject_id: &str) -> StoreResult<QuotaRecord>;
    async fn set_quota(
        &self,
        scope: QuotaScope,
        subject_id: &str,
        quota: &QuotaRecord,
        now: i64,
    ) -> StoreResult<()>;
    async fn all_quotas(&self) -> StoreResult<Vec<QuotaRow>>;
    async fn set_tenant_trusted(&self, id: &str, trusted: bool) -> StoreResult<bool>;
    /// The organization's session and idle rules (the defaults until an admin sets them).
    async fn session_policy(&self, tenant_id: &str) -> StoreResult<SessionPolicy>;
    /// False when there is no such organization.
    async fn set_session_policy(&self, tenant_id: &str, p: &SessionPolicy) -> StoreResult<bool>;
    /// Organizations whose tasks may run on trusted-only nodes.
    async fn trusted_tenants(&self) -> StoreResult<Vec<String>>;
}
