//! Rows as the store keeps them, with states and kinds as types (parsed when read). Times are
//! Unix milliseconds.

pub use autodl_common::api::SessionPolicy;
use autodl_common::tasks::TaskState;

use crate::domain::{AllowedGpuTypes, ArtifactKind, ArtifactState, NodeStatus};

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TenantRecord {
    pub id: String,
    pub name: String,
    pub created_at: i64,
    /// Its tasks may run on trusted-only nodes (set by platform administrators).
    pub trusted: bool,
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
    pub role: String,
    pub token_hash: String,
    pub created_by: String,
    pub created_at: i64,
    pub expires_at: i64,
    pub accepted_at: Option<i64>,
    pub revoked: bool,
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
pub struct NodeRecord {
    pub id: String,
    pub zone: String,
    /// JSON object of labels.
    pub labels: String,
    pub cpu_millis: i64,
    pub mem_bytes: i64,
    /// JSON array of `autodl_scheduler::Gpu`.
    pub gpus: String,
    pub schedulable: bool,
    pub created_at: i64,
    pub updated_at: i64,
    /// Digest of the agent's node credential; `None` for nodes registered by hand.
    pub credential_hash: Option<String>,
    pub last_seen: Option<i64>,
    /// ready, cordoned, draining or lost.
    #[sqlx(try_from = "String")]
    pub status: NodeStatus,
    /// "docker" or "process" as the agent reports it; empty for nodes registered by hand.
    pub runtime: String,
    /// "container", "sandbox", "uid", "none" (trusted-only) or "declared" (registered by hand).
    pub isolation: String,
    /// JSON array of host dataset roots tasks may name as `data_path`.
    pub data_roots: String,
    /// JSON of [`HostDetail`]: what the agent says of its limits and task networks.
    pub host_detail: String,
    /// An administrator lets every organization use this node although it cannot isolate
    /// tasks (the demo on a machine where it does not run as root).
    pub open_to_all: bool,
}

/// What a node's agent says of how it confines tasks beyond its isolation level, kept as it
/// said it and shown to administrators.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostDetail {
    #[serde(default)]
    pub limits: String,
    #[serde(default)]
    pub network: String,
    /// Where other nodes' tasks reach this node's (see `AgentHost::address`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

impl HostDetail {
    pub fn of(node: &NodeRecord) -> HostDetail {
        serde_json::from_str(&node.host_detail).unwrap_or_default()
    }
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TaskRecord {
    pub id: String,
    pub tenant_id: String,
    pub user_id: String,
    pub name: String,
    #[sqlx(try_from = "String")]
    pub state: TaskState,
    /// JSON of the normalised `TaskSpec`.
    pub spec: String,
    pub gpus_total: i64,
    pub idempotency_key: Option<String>,
    pub attempts: i64,
    pub batch_size: Option<i64>,
    /// JSON array of worker placements while scheduled or running.
    pub placement: Option<String>,
    pub attained_gpu_seconds: f64,
    pub last_checkpoint_at: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    /// Why the scheduler wants this placed task stopped (preempted, migrated, drained).
    pub stop_reason: Option<String>,
    /// Why it waits (JSON of `Waiting`), as the leader's latest cycle explained it.
    pub waiting: Option<String>,
    /// "uploading" or "lost" when its results are not simply stored (see `Task::results`).
    pub results: Option<String>,
}

/// One placement the scheduler writes: the task, its placement (JSON of worker placements), the
/// distinct nodes it occupies (first: the one its attempt names) and its GPU count.
#[derive(Debug, Clone)]
pub struct Placing {
    pub task: String,
    pub placement: String,
    pub nodes: Vec<String>,
    pub gpus: i64,
}

/// An active task with what the scheduler needs of its current run (none while pending).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SchedulingTaskRecord {
    #[sqlx(flatten)]
    pub task: TaskRecord,
    /// When the current run was placed.
    pub run_started_at: Option<i64>,
    /// Charged up to here (NULL: nothing yet, i.e. from its start).
    pub run_charged_until: Option<i64>,
    pub run_gpu_seconds: Option<f64>,
}

/// A run that ended before it was charged up to its end.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct UnsettledRunRecord {
    pub task_id: String,
    pub number: i64,
    pub user_id: String,
    pub tenant_id: String,
    /// JSON of the task's spec (its GPU memory decides the share of a shared card).
    pub spec: String,
    pub placement: String,
    pub started_at: i64,
    pub ended_at: i64,
    pub charged_until: Option<i64>,
    pub gpu_seconds: f64,
}

/// A charge the scheduler made to one run, to be kept only if the run was still as it read
/// it (`from`: what it had been charged up to).
#[derive(Debug, Clone)]
pub struct RunChargeRecord {
    pub task_id: String,
    pub number: i64,
    pub from: i64,
    pub charged_until: i64,
    /// The run's total after this charge, and what this charge added.
    pub gpu_seconds: f64,
    pub added: f64,
    /// The run had ended: this charge settles it and its service joins the task's.
    pub settles: bool,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TaskWithUser {
    #[sqlx(flatten)]
    pub task: TaskRecord,
    pub user_email: String,
}

#[derive(Debug, Clone, Default)]
pub struct TaskFilter {
    pub tenant_id: String,
    pub state: Option<TaskState>,
    pub user_id: Option<String>,
    pub label: Option<(String, String)>,
    /// Keyset cursor: only tasks strictly older than (created_at, id).
    pub before: Option<(i64, String)>,
    pub limit: i64,
}

/// A sweep as stored; its trials are tasks labelled `sweep=<id>`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SweepRecord {
    pub id: String,
    pub tenant_id: String,
    pub user_id: String,
    pub name: String,
    pub method: String,
    /// JSON of the parameters as asked for.
    pub parameters: String,
    pub max_concurrency: i64,
    pub trials: i64,
    pub created_at: i64,
}

/// A sweep with the email of who made it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SweepWithUser {
    #[sqlx(flatten)]
    pub sweep: SweepRecord,
    pub user_email: String,
}

/// A run's GPU samples in brief, for judging whether it sits idle (clock milliseconds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuActivity {
    pub first: Option<i64>,
    pub last: Option<i64>,
    pub last_busy: Option<i64>,
}

/// Which of a task's samples [`GpuActivity`] sums up: those since `from`, and busy at or
/// above `busy` (0..1).
#[derive(Debug, Clone)]
pub struct ActivityAsk {
    pub task_id: String,
    pub from: i64,
    pub busy: f64,
}

/// A task to store, with its labels.
#[derive(Clone)]
pub struct NewTask {
    pub task: TaskRecord,
    pub labels: Vec<(String, String)>,
    pub kind: autodl_common::tasks::TaskKind,
    /// Caps the task is held to, counted in the transaction that stores it (with everything
    /// stored before it), so concurrent submissions never pass them together.
    pub caps: TaskCaps,
}

/// A submission's caps: queued tasks of its user and of its organization, open sessions of
/// its user (a session only). `None`: no cap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TaskCaps {
    pub user_queued: Option<i64>,
    pub tenant_queued: Option<i64>,
    pub user_sessions: Option<i64>,
}

impl TaskCaps {
    pub fn any(&self) -> bool {
        self.user_queued.is_some() || self.tenant_queued.is_some() || self.user_sessions.is_some()
    }
}

/// An agent's report that a run's process started.
#[derive(Debug, Clone)]
pub struct RunStart {
    pub task_id: String,
    pub attempt: i64,
    /// When the server heard it.
    pub at: i64,
}

/// A run that ended, as its agent reported it.
#[derive(Debug, Clone)]
pub struct RunEnd {
    pub task_id: String,
    pub attempt: i64,
    pub end: AttemptEnd,
    /// When the server heard it.
    pub at: i64,
    /// Where the task's results stand if not simply stored ("uploading", "lost").
    pub results: Option<String>,
}

pub enum TaskCreated {
    Created,
    /// The idempotency key was used before; this is the task it created.
    Existing(Box<TaskWithUser>),
    /// Not stored: it would pass one of its caps (what to tell the submitter).
    OverCap(String),
}

pub enum CancelOutcome {
    Cancelled,
    NotFound,
    AlreadyFinished(String),
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EventRecord {
    pub at: i64,
    pub kind: String,
    pub message: String,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AttemptRecord {
    pub task_id: String,
    pub number: i64,
    pub node: Option<String>,
    pub placement: String,
    pub gpus: i64,
    pub started_at: i64,
    pub ended_at: Option<i64>,
    pub exit_code: Option<i64>,
    pub reason: Option<String>,
    pub batch_size: Option<i64>,
    pub gpu_seconds: f64,
}

/// A line of output to store: when (ms), `stdout`/`stderr`, the text, and the worker that
/// printed it in a multi-worker task.
#[derive(Debug, Clone, PartialEq)]
pub struct NewLogLine {
    pub at: i64,
    pub stream: String,
    pub line: String,
    pub rank: Option<i64>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct LogRecord {
    pub id: i64,
    pub attempt: i64,
    pub rank: Option<i64>,
    pub at: i64,
    pub stream: String,
    pub line: String,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct MetricRecord {
    pub at: i64,
    /// JSON object of the sample's values.
    pub sample: String,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct UsageRecord {
    pub scope: String,
    pub subject_id: String,
    pub decayed_gpu_seconds: f64,
    pub updated_at: i64,
    pub window_alloc_gpu_seconds: f64,
    pub window_busy_gpu_seconds: f64,
    /// "YYYY-MM" of `month_gpu_seconds`.
    pub month: String,
    pub month_gpu_seconds: f64,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct QuotaRow {
    pub scope: String,
    pub subject_id: String,
    #[sqlx(flatten)]
    pub quota: QuotaRecord,
}

/// How an attempt ended, and what the task does next.
#[derive(Debug, Clone)]
pub struct AttemptEnd {
    pub exit_code: Option<i64>,
    /// "oom", "error", "preempted", "node_lost", "cancelled", or None for success.
    pub reason: Option<String>,
    /// Completed, failed, or pending again (a retry).
    pub next_state: TaskState,
    pub next_batch_size: Option<i64>,
    pub message: String,
}

/// A leader's term: every server that becomes the leader starts a new, larger one, and the
/// store refuses scheduling writes of any other term (fencing a leader that lost its lock
/// without noticing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Term(pub i64);

/// Held while this server is the scheduler leader; dropping it gives leadership up.
pub struct LeaderGuard {
    pub term: Term,
    /// What holds the lock (PostgreSQL: the connection that took the advisory lock).
    pub(super) hold: Box<dyn std::any::Any + Send + Sync>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct RegistrationTokenRecord {
    pub id: String,
    pub name: String,
    pub token_hash: String,
    pub created_by: String,
    pub created_at: i64,
    pub expires_at: i64,
    pub revoked: bool,
    /// Nodes that may join with it (1 unless an administrator chose more) and how many did.
    pub max_uses: i64,
    pub uses: i64,
    /// Set: only this node id may register with it, replacing that node's credential.
    pub node_id: Option<String>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct GpuSampleRecord {
    pub node_id: String,
    pub gpu_index: i64,
    pub at: i64,
    pub util: f64,
    pub mem_used: i64,
    pub mem_total: i64,
    pub temperature: Option<f64>,
    pub power_w: Option<f64>,
    pub task_id: Option<String>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ArtifactRecord {
    pub id: String,
    pub task_id: String,
    pub tenant_id: String,
    pub attempt: i64,
    #[sqlx(try_from = "String")]
    pub kind: ArtifactKind,
    #[sqlx(try_from = "String")]
    pub state: ArtifactState,
    pub bucket: String,
    /// Key prefix of its files (ends in `/`).
    pub prefix: String,
    /// JSON array of `{"path", "size"}`.
    pub manifest: Option<String>,
    pub files: i64,
    pub size_bytes: i64,
    pub step: Option<i64>,
    pub epoch: Option<f64>,
    pub created_at: i64,
    pub completed_at: Option<i64>,
    /// The node it came from (none in uploads older than gangs spanning nodes).
    pub node: Option<String>,
}

/// A node's part of a gang's attempt that ended with all of its workers succeeding, while
/// other nodes' workers may still run (see `Tasks::end_part`).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct PartEnded {
    pub node: String,
    /// The node still keeps its part's results for the server.
    pub results_uploading: bool,
    pub ended_at: i64,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct WebhookRecord {
    pub id: String,
    pub tenant_id: String,
    pub url: String,
    pub secret: String,
    /// JSON list of event names.
    pub events: String,
    pub created_by: String,
    pub created_at: i64,
}

/// One event on its way to one webhook, with where it goes.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct DeliveryRecord {
    pub id: String,
    pub webhook_id: String,
    pub url: String,
    pub secret: String,
    pub event: String,
    pub body: String,
    pub attempts: i64,
    pub next_at: Option<i64>,
    pub delivered_at: Option<i64>,
    pub last_error: Option<String>,
    pub created_at: i64,
}

/// An audit record before it joins the chain (see `audit::chain`).
#[derive(Debug, Clone)]
pub struct NewAuditRecord {
    pub tenant_id: Option<String>,
    pub actor_id: Option<String>,
    pub actor_email: Option<String>,
    pub action: String,
    pub target: String,
    /// A JSON object, hashed as this text.
    pub detail: String,
    pub ip: Option<String>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AuditRecord {
    pub seq: i64,
    pub at: i64,
    pub tenant_id: Option<String>,
    pub actor_id: Option<String>,
    pub actor_email: Option<String>,
    pub action: String,
    pub target: String,
    pub detail: String,
    pub ip: Option<String>,
    pub prev_hash: String,
    pub hash: String,
}

impl AuditRecord {
    pub fn from_new(r: NewAuditRecord, seq: i64, at: i64, prev_hash: String, hash: String) -> Self {
        AuditRecord {
            seq,
            at,
            tenant_id: r.tenant_id,
            actor_id: r.actor_id,
            actor_email: r.actor_email,
            action: r.action,
            target: r.target,
            detail: r.detail,
            ip: r.ip,
            prev_hash,
            hash,
        }
    }

    /// What its hash covers besides its place, time and predecessor.
    pub fn fields(&self) -> NewAuditRecord {
        NewAuditRecord {
            tenant_id: self.tenant_id.clone(),
            actor_id: self.actor_id.clone(),
            actor_email: self.actor_email.clone(),
            action: self.action.clone(),
            target: self.target.clone(),
            detail: self.detail.clone(),
            ip: self.ip.clone(),
        }
    }
}

/// Which audit records to list (all given conditions hold), newest first from `before`.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    pub tenant_id: Option<String>,
    pub actor_email: Option<String>,
    /// An action name, or a family of them ending in `.` (`auth.`).
    pub action: Option<String>,
    pub since: Option<i64>,
    pub until: Option<i64>,
    /// Only records older than this one.
    pub before: Option<i64>,
}

/// An email in the outbox.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EmailRecord {
    pub id: String,
    pub to_addr: String,
    pub event: String,
    pub subject: String,
    pub body: String,
    pub attempts: i64,
    pub next_at: Option<i64>,
    pub sent_at: Option<i64>,
    pub last_error: Option<String>,
    pub created_at: i64,
}

/// A person's fair-share and utilization factors at one moment (see `standings`).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct StandingRecord {
    pub user_id: String,
    pub tenant_id: String,
    pub at: i64,
    pub fair_share: f64,
    pub utilization: f64,
}

/// An organization's or the platform's OpenID provider, as configured.
#[derive(Debug, Clone, PartialEq)]
pub struct SsoProviderRecord {
    pub id: String,
    pub scope: SsoScope,
    pub label: String,
    pub issuer: String,
    pub client_id: String,
    pub client_secret: String,
    /// Lowercase email domains whose people may sign in; empty: any.
    pub allowed_domains: Vec<String>,
    /// Scopes asked for besides `openid email profile`.
    pub scopes: Vec<String>,
    pub role_claim: Option<String>,
    /// Claim value → role.
    pub role_map: std::collections::BTreeMap<String, String>,
    /// The role when no value maps; None refuses such people.
    pub default_role: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// Whose provider it is: one organization's, or the whole platform's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SsoScope {
    Platform,
    Tenant(String),
}

impl SsoScope {
    const PLATFORM: &'static str = "platform";

    pub fn key(&self) -> &str {
        match self {
            SsoScope::Platform => Self::PLATFORM,
            SsoScope::Tenant(id) => id,
        }
    }

    pub fn from_key(key: &str) -> SsoScope {
        if key == Self::PLATFORM {
            SsoScope::Platform
        } else {
            SsoScope::Tenant(key.to_owned())
        }
    }

    pub fn tenant(&self) -> Option<&str> {
        match self {
            SsoScope::Platform => None,
            SsoScope::Tenant(id) => Some(id),
        }
    }
}

/// A sign-in started at a provider and not yet finished.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SsoLoginRecord {
    pub state_hash: String,
    pub provider_id: String,
    pub nonce: String,
    pub pkce_verifier: String,
    pub browser_hash: String,
    pub return_to: String,
    /// The signed-in account to link, when the sign-in was started to link one.
    pub link_user: Option<String>,
    pub expires_at: i64,
}
