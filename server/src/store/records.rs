//! Rows as the store keeps them. Times are Unix milliseconds.

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TenantRecord {
    pub id: String,
    pub name: String,
    pub created_at: i64,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TenantSummary {
    pub id: String,
    pub name: String,
    pub created_at: i64,
    pub members: i64,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct UserRecord {
    pub id: String,
    pub email: String,
    pub password_hash: String,
    pub tenant_id: String,
    pub role: String,
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

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct InvitationRecord {
    pub id: String,
    pub tenant_id: String,
    pub email: String,
    pub role: String,
    pub token_hash: String,
    pub created_by: String,
    pub created_at: i64,
    pub expires_at: i64,
    pub accepted_at: Option<i64>,
    pub revoked: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// JSON array of GPU type names; NULL allows every type.
    pub allowed_gpu_types: Option<String>,
}
