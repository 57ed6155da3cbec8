//! Organizations, people, sessions, API keys, invitations and quotas.

use autodl_common::api::Role;

use crate::domain::AllowedGpuTypes;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TenantRecord {
    pub id: String,
    pub name: String,
    pub created_at: i64,
    /// Its tasks may run on trusted-only nodes (set by platform administrators).
    pub trusted: bool,
    /// Kept by the platform for itself (the demo agents' account): not listed to people.
    #[sqlx(default)]
    pub internal: bool,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TenantSummary {
    pub id: String,
    pub name: String,
    pub created_at: i64,
    pub members: i64,
    /// May run tasks on trusted-only nodes.
    pub trusted: bool,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct UserRecord {
    pub id: String,
    pub email: String,
    pub password_hash: String,
    pub tenant_id: String,
    #[sqlx(try_from = "String")]
    pub role: Role,
    pub platform_admin: bool,
    pub disabled: bool,
    pub created_at: i64,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct UserWithTenant {
    #[sqlx(flatten)]
    pub user: UserRecord,
    pub tenant_name: String,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SessionRecord {
    pub id: String,
    pub user_id: String,
    pub created_at: i64,
    pub expires_at: i64,
    pub revoked: bool,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ApiKeyRecord {
    pub id: String,
    pub user_id: String,
    pub name: String,
    pub prefix: String,
    pub key_hash: String,
    pub created_at: i64,
    pub last_used_at: Option<i64>,
    pub expires_at: Option<i64>,
    pub revoked: bool,
}

/// A sign-up waiting for its email address to be confirmed: the account is made from it when
/// the link sent there is followed.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SignupRequestRecord {
    pub token_hash: String,
    pub email: String,
    pub password_hash: String,
    pub tenant_name: String,
    pub created_at: i64,
    pub expires_at: i64,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct InvitationRecord {
    pub id: String,
    pub tenant_id: String,
    pub email: String,
    #[sqlx(try_from = "String")]
    pub role: Role,
    pub token_hash: String,
    pub created_by: String,
    pub created_at: i64,
    pub expires_at: i64,
    pub accepted_at: Option<i64>,
    pub revoked: bool,
}

impl InvitationRecord {
    /// Whether its link still lets someone in at `now` (ms): not revoked, not used, not expired.
    pub fn is_open(&self, now: i64) -> bool {
        !self.revoked && self.accepted_at.is_none() && self.expires_at > now
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuotaScope {
    Tenant,
    User,
}

impl QuotaScope {
    pub fn as_str(self) -> &'static str {
        match self {
            QuotaScope::Tenant => "tenant",
            QuotaScope::User => "user",
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, sqlx::FromRow)]
pub struct QuotaRecord {
    pub max_gpus: Option<i64>,
    pub gpu_hours_per_month: Option<f64>,
    pub max_queued_tasks: Option<i64>,
    #[sqlx(try_from = "Option<String>")]
    pub allowed_gpu_types: AllowedGpuTypes,
    /// Bytes of object storage (tenant scope only).
    pub max_storage_bytes: Option<i64>,
    /// Relative share in fair-share (1 when unset).
    pub share: Option<f64>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct QuotaRow {
    pub scope: String,
    pub subject_id: String,
    #[sqlx(flatten)]
    pub quota: QuotaRecord,
}
