use serde::{Deserialize, Serialize};

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

/// Body of every error answer: `{"error": {"code": "...", "message": "..."}}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ErrorDetail {
    /// Stable machine-readable code, e.g. `validation`, `unauthorized`, `not_found`.
    pub code: String,
    pub message: String,
    /// The request field the error is about, so forms can show it inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// A code bundle (a task's `workdir`, packed), as uploaded or looked up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct CodeBundle {
    /// `sha256:` and the digest of the archive: the task's `code`.
    pub id: String,
    pub size_bytes: u64,
    /// `tar.gz`, `tar` or `zip`; absent when only looked up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unpacked_bytes: Option<u64>,
    /// False when the organization already had this bundle.
    #[serde(default)]
    pub stored: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[derive(strum::IntoStaticStr, strum::EnumString, strum::VariantArray)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum Role {
    Owner,
    Admin,
    Member,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    pub fn parse(s: &str) -> Option<Role> {
        s.parse().ok()
    }

    /// Owners and admins manage their tenant's members, invitations and quotas.
    pub fn can_manage(self) -> bool {
        matches!(self, Role::Owner | Role::Admin)
    }
}

/// A role as a database column holds it (the server reads its rows with this).
impl TryFrom<String> for Role {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        Role::parse(&s).ok_or_else(|| format!("unknown role {s:?}"))
    }
}

/// A sign-up that waits for its email to be confirmed (`202`): answered the same whether the
/// address has an account or not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SignupPending {
    /// `confirm_email`.
    pub status: String,
    pub message: String,
}

/// The token of a sign-up confirmation link.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SignupConfirmRequest {
    pub token: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SignupRequest {
    pub email: String,
    pub password: String,
    /// Name of the new organization; omit when joining through `invitation`.
    #[serde(default)]
    pub tenant_name: Option<String>,
    /// Invitation token from an invitation link.
    #[serde(default)]
    pub invitation: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LoginRequest {
    pub email: String,
    pub password: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct LoginResponse {
    /// The session JWT, also set as an HttpOnly cookie; programs send it as a Bearer token.
    pub token: String,
    pub user: Me,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PasswordChangeRequest {
    pub current_password: String,
    pub new_password: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Me {
    pub id: String,
    pub email: String,
    pub tenant_id: String,
    pub tenant_name: String,
    pub role: Role,
    pub platform_admin: bool,
    pub created_at: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateApiKeyRequest {
    pub name: String,
    /// Days until the key expires; omit for a key that does not expire.
    #[serde(default)]
    pub expires_in_days: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ApiKeyInfo {
    pub id: String,
    pub name: String,
    /// First characters of the key, enough to recognise it in a list.
    pub prefix: String,
    pub created_at: String,
    pub last_used_at: Option<String>,
    pub expires_at: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct CreatedApiKey {
    /// The whole key. It is shown this once: the server keeps only its hash.
    pub key: String,
    pub info: ApiKeyInfo,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct TenantInfo {
    pub id: String,
    pub name: String,
    pub created_at: String,
    pub members: u64,
    /// Bytes the organization holds in object storage (uploads, checkpoints, results).
    #[serde(default)]
    pub storage_bytes: u64,
    /// Its tasks may run on trusted-only nodes.
    #[serde(default)]
    pub trusted: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Member {
    pub id: String,
    pub email: String,
    pub role: Role,
    pub disabled: bool,
    pub created_at: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct UpdateMemberRequest {
    pub role: Role,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateInvitationRequest {
    /// Address the invitation is meant for; only that address can accept it.
    pub email: String,
    #[serde(default = "default_invite_role")]
    pub role: Role,
}

fn default_invite_role() -> Role {
    Role::Member
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Invitation {
    pub id: String,
    pub email: String,
    pub role: Role,
    pub created_at: String,
    pub expires_at: String,
    pub accepted: bool,
    /// Present only in the answer that creates it: the secret part of the link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Path of the sign-up page for this invitation (with the token), when `token` is present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct InvitationPreview {
    pub tenant_name: String,
    pub email: String,
    pub role: Role,
    pub expires_at: String,
}

/// Caps on a tenant or a user. `None` means "no cap of its own" (a user is still held by the
/// tenant's cap).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Quota {
    #[serde(default)]
    pub max_gpus: Option<u32>,
    #[serde(default)]
    pub gpu_hours_per_month: Option<f64>,
    #[serde(default)]
    pub max_queued_tasks: Option<u32>,
    /// GPU types (or families such as "A100") allowed; `None` allows every type.
    #[serde(default)]
    pub allowed_gpu_types: Option<Vec<String>>,
    /// Bytes of object storage the organization may hold (organizations only); absent
    /// means no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_storage_bytes: Option<u64>,
    /// Relative weight in fair-share against the organization's (or user's) peers: 2 gets
    /// twice the GPU time of 1 under contention. Absent means 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct AdminTenant {
    pub id: String,
    pub name: String,
    pub created_at: String,
    pub members: u64,
    pub quota: Quota,
    /// Its tasks may run on trusted-only nodes.
    #[serde(default)]
    pub trusted: bool,
    #[serde(default)]
    pub storage_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AdminUpdateTenantRequest {
    /// Let the organization's tasks run on nodes that cannot isolate them from other
    /// organizations' tasks.
    #[serde(default)]
    pub trusted: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct AdminUser {
    pub id: String,
    pub email: String,
    pub tenant_id: String,
    pub tenant_name: String,
    pub role: Role,
    pub platform_admin: bool,
    pub disabled: bool,
    pub created_at: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AdminUpdateUserRequest {
    #[serde(default)]
    pub disabled: Option<bool>,
    #[serde(default)]
    pub platform_admin: Option<bool>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Health {
    /// "ok", or "degraded": 503 when the database cannot be reached or cannot write, 200 when
    /// only the scheduler has stalled.
    pub status: String,
    pub database: String,
    /// A write to the database just succeeded: a full or read-only disk shows here.
    #[serde(default)]
    pub writable: bool,
    /// "leader" on the server that schedules, "follower" on the others of its database.
    #[serde(default)]
    pub role: String,
    /// Why the database is not usable, or why scheduling has stalled, when it is so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// Seconds since the scheduler's last cycle ended, on whichever server leads (the
    /// database records it); null before the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_cycle_s: Option<f64>,
    /// No cycle for far longer than the scheduling interval: placement has stopped
    /// (`status` says "degraded"; the answer stays 200, since every server would say the same).
    #[serde(default)]
    pub scheduler_stalled: bool,
}

/// The scheduling policy this server runs, as its configuration sets it (`[policy]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SchedulingPolicy {
    /// Every knob of the policy (weights, half-life, preemption margins, ...) and its value.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub policy: serde_json::Value,
    /// When a change of the configuration takes effect.
    pub applies: String,
}

/// An organization's rules for sessions and for GPUs left idle. GPU utilization is measured
/// by the nodes (NVML), so "idle" means the GPUs did nothing, not that a notebook kernel was
/// quiet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SessionPolicy {
    /// A GPU under this utilization (percent) counts as idle.
    #[serde(default = "SessionPolicy::default_idle_util")]
    pub idle_util_pct: f64,
    /// Minutes a session may sit idle (its GPUs under the threshold and no tunnel traffic)
    /// before it is stopped; it is warned at half. 0 turns idle stopping off.
    #[serde(default = "SessionPolicy::default_idle_minutes")]
    pub idle_minutes: u32,
    /// Stop idle batch tasks too; otherwise they are only warned.
    #[serde(default)]
    pub stop_idle_batch: bool,
    /// Longest a session may run, in hours (its `time_limit` is capped to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_session_hours: Option<f64>,
    /// Sessions one member may have pending or running at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sessions_per_user: Option<u32>,
}

impl SessionPolicy {
    fn default_idle_util() -> f64 {
        5.0
    }

    fn default_idle_minutes() -> u32 {
        30
    }
}

impl Default for SessionPolicy {
    fn default() -> Self {
        SessionPolicy {
            idle_util_pct: Self::default_idle_util(),
            idle_minutes: Self::default_idle_minutes(),
            stop_idle_batch: false,
            max_session_hours: None,
            max_sessions_per_user: None,
        }
    }
}

/// A webhook to add: where to send and which events (`task.idle`, `task.idle_stopped`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct WebhookInput {
    /// `https://…` (http too); a public address unless the operator allows internal ones.
    pub url: String,
    pub events: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Webhook {
    pub id: String,
    pub url: String,
    pub events: Vec<String>,
    pub created_by: String,
    pub created_at: String,
    /// Only in the answer that made it: the key of `X-Autodl-Signature`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct WebhookDelivery {
    pub id: String,
    pub event: String,
    pub attempts: i64,
    /// `delivered`, `pending` (tried again at `next_at`) or `failed` (given up).
    pub status: String,
    pub next_at: Option<String>,
    pub delivered_at: Option<String>,
    pub last_error: Option<String>,
    pub created_at: String,
}

/// One record of the audit trail: who did what, when and from where.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct AuditEntry {
    /// Its place in the chain, from 1.
    pub seq: i64,
    pub at: String,
    /// The organization it concerns; null for platform-wide actions (nodes).
    pub tenant_id: Option<String>,
    pub actor_id: Option<String>,
    pub actor_email: Option<String>,
    /// For example `auth.sign_in`, `api_key.created`, `node.cordoned`.
    pub action: String,
    /// What it was done to (a user, key, node, task, organization).
    pub target: String,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub detail: serde_json::Value,
    /// The address the request came from.
    pub ip: Option<String>,
    /// SHA-256 over the record and `prev_hash`.
    pub hash: String,
    pub prev_hash: String,
}

/// A page of the audit trail, newest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct AuditPage {
    pub records: Vec<AuditEntry>,
    /// Pass as `before` for the next (older) page; null at the start of the trail.
    pub next_before: Option<i64>,
}

/// The events a person wants by email.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NotificationSettingsInput {
    /// Event names, from `events` of the settings.
    pub email: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct NotificationSettings {
    /// The events emailed to `address`.
    pub email: Vec<String>,
    /// Every event one may choose.
    pub events: Vec<String>,
    pub address: String,
    /// False when this server has no mail server configured: nothing can be emailed.
    pub email_available: bool,
}

/// One person's use in one period (a day, week or month, UTC).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct UsagePoint {
    /// The period's start.
    pub start: String,
    pub tenant_id: String,
    pub tenant_name: String,
    pub user_id: String,
    pub user_email: String,
    pub gpu_hours: f64,
    /// Mean measured GPU utilization 0..1 of their tasks in the period; null without samples.
    pub avg_utilization: Option<f64>,
    /// GPU-hours whose measured utilization was under the idle threshold (5%); null without
    /// samples.
    pub idle_gpu_hours: Option<f64>,
}

/// A monthly GPU-hour cap and what is used of it this month.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct QuotaUse {
    /// `tenant` or `user`.
    pub scope: String,
    pub id: String,
    pub name: String,
    pub month: String,
    pub used_gpu_hours: f64,
    pub gpu_hours_per_month: Option<f64>,
    pub max_gpus: Option<i64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct UsageSeries {
    /// `day`, `week` (from Monday) or `month`.
    pub bucket: String,
    pub from: String,
    pub to: String,
    /// The periods' starts, oldest first.
    pub periods: Vec<String>,
    /// One per person and period with any use.
    pub points: Vec<UsagePoint>,
    pub quotas: Vec<QuotaUse>,
    /// Each person's standing as the scheduler ranked them, sampled every 10 minutes while
    /// they had work waiting or running.
    #[serde(default)]
    pub standing: Vec<StandingPoint>,
}

/// A person's fair-share factor (1: used nothing lately; 0.5: at their share; halving with each
/// further share's worth) and utilization factor (their measured GPU use) at one moment.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct StandingPoint {
    pub at: String,
    pub tenant_id: String,
    pub user_id: String,
    pub user_email: String,
    pub fair_share: f64,
    pub utilization: f64,
}

/// A way to sign in with single sign-on, as the sign-in page lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SsoOption {
    pub id: String,
    /// What the button says, e.g. "Acme Okta".
    pub label: String,
}

/// An OpenID Connect provider as configured (its client secret is never shown).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SsoProvider {
    pub id: String,
    pub label: String,
    pub issuer: String,
    pub client_id: String,
    /// Email domains whose people may sign in; empty: any.
    pub allowed_domains: Vec<String>,
    /// Scopes asked for besides `openid email profile` (e.g. `groups`).
    pub scopes: Vec<String>,
    /// The claim (in the ID token or the userinfo answer) whose values pick a role.
    pub role_claim: Option<String>,
    /// Claim value → role (`admin` or `member`).
    pub role_map: std::collections::BTreeMap<String, String>,
    /// The role of people no value maps; none: they are refused.
    pub default_role: Option<String>,
    /// Where the provider sends people back: register it with the provider.
    pub redirect_uri: String,
    pub updated_at: String,
}

/// An organization's (or the platform's) single sign-on and whether passwords still work.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SsoSettings {
    pub provider: Option<SsoProvider>,
    /// Members may sign in with a password (always true for the platform's settings).
    pub password_login: bool,
    /// Where the provider sends people back: register it with the provider.
    pub redirect_uri: String,
}

/// Sets up (or changes) the OpenID provider. The issuer is checked by reading its discovery
/// document before anything is saved.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SsoSettingsRequest {
    pub label: String,
    /// The issuer URL (https; http only on a loopback address).
    pub issuer: String,
    pub client_id: String,
    /// Required the first time; left out, the stored one is kept.
    #[serde(default)]
    pub client_secret: Option<String>,
    #[serde(default)]
    pub allowed_domains: Vec<String>,
    #[serde(default)]
    pub scopes: Vec<String>,
    #[serde(default)]
    pub role_claim: Option<String>,
    #[serde(default)]
    pub role_map: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub default_role: Option<String>,
    /// Organizations only: false makes members sign in through the provider.
    #[serde(default)]
    pub password_login: Option<bool>,
}
