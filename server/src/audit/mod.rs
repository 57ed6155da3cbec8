//! The audit trail: security- and money-relevant actions with who did them, when and from
//! where. Append-only and tamper-evident (see [`chain`]); a failure to record is logged loudly
//! but does not undo the action it describes, which has already happened.

pub mod chain;

use actix_web::HttpRequest;
use serde_json::Value;

use crate::auth::Caller;
use crate::state::AppState;
use crate::store::{AuditRecord, NewAuditRecord, UserRecord};

/// What was done. The names are the API's and the CSV's; new ones are only ever added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    SignIn,
    SignInFailed,
    SignUp,
    PasswordChanged,
    ApiKeyCreated,
    ApiKeyRevoked,
    MemberInvited,
    InvitationRevoked,
    MemberRoleChanged,
    MemberRemoved,
    MemberQuotaChanged,
    SessionPolicyChanged,
    TenantChanged,
    TenantQuotaChanged,
    UserChanged,
    NodeRegistered,
    NodeRemoved,
    NodeStatusChanged,
    RegistrationTokenCreated,
    RegistrationTokenRevoked,
    TaskCancelledByOther,
    SweepCancelledByOther,
    ObjectReplaced,
    ObjectDeleted,
    TaskShellOpened,
    TaskPortOpened,
    WebhookAdded,
    WebhookRemoved,
    SsoConfigured,
    SsoRemoved,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::SignIn => "auth.sign_in",
            Action::SignInFailed => "auth.sign_in_failed",
            Action::SignUp => "auth.sign_up",
            Action::PasswordChanged => "auth.password_changed",
            Action::ApiKeyCreated => "api_key.created",
            Action::ApiKeyRevoked => "api_key.revoked",
            Action::MemberInvited => "member.invited",
            Action::InvitationRevoked => "member.invitation_revoked",
            Action::MemberRoleChanged => "member.changed",
            Action::MemberRemoved => "member.removed",
            Action::MemberQuotaChanged => "member.quota_changed",
            Action::SessionPolicyChanged => "tenant.session_policy_changed",
            Action::TenantChanged => "tenant.changed",
            Action::TenantQuotaChanged => "tenant.quota_changed",
            Action::UserChanged => "user.changed",
            Action::NodeRegistered => "node.registered",
            Action::NodeRemoved => "node.removed",
            Action::NodeStatusChanged => "node.status_changed",
            Action::RegistrationTokenCreated => "registration_token.created",
            Action::RegistrationTokenRevoked => "registration_token.revoked",
            Action::TaskCancelledByOther => "task.cancelled_by_other",
            Action::SweepCancelledByOther => "sweep.cancelled_by_other",
            Action::ObjectReplaced => "object.replaced",
            Action::ObjectDeleted => "object.deleted",
            Action::TaskShellOpened => "task.shell_opened",
            Action::TaskPortOpened => "task.port_opened",
            Action::WebhookAdded => "webhook.added",
            Action::WebhookRemoved => "webhook.removed",
            Action::SsoConfigured => "sso.configured",
            Action::SsoRemoved => "sso.removed",
        }
    }
}

/// Who acted and from where: the signed-in person (or their key), or, for sign-ins that failed
/// and agents registering, only the name they gave.
#[derive(Debug, Clone, Default)]
pub struct Actor {
    pub id: Option<String>,
    pub email: Option<String>,
    pub ip: Option<String>,
}

impl Actor {
    pub fn of(caller: &Caller, req: &HttpRequest) -> Self {
        Self::user(&caller.user, req)
    }

    /// An account acting before it holds a session (signing up or in).
    pub fn user(user: &UserRecord, req: &HttpRequest) -> Self {
        Actor {
            id: Some(user.id.clone()),
            email: Some(user.email.clone()),
            ip: ip_of(req),
        }
    }

    /// Someone not signed in (yet), known by the email they typed, if any.
    pub fn anonymous(email: Option<&str>, req: &HttpRequest) -> Self {
        Actor {
            id: None,
            email: email.map(str::to_owned),
            ip: ip_of(req),
        }
    }
}

/// The connection's address, as the login limiter sees it (a proxy in front shows as itself:
/// headers a client can write are not evidence).
fn ip_of(req: &HttpRequest) -> Option<String> {
    req.peer_addr().map(|a| a.ip().to_string())
}

/// Records `action` on `target` by `actor`, in `tenant` (None: platform-wide).
pub async fn record(
    state: &AppState,
    actor: Actor,
    tenant: Option<&str>,
    action: Action,
    target: &str,
    detail: Value,
) {
    let entry = NewAuditRecord {
        tenant_id: tenant.map(str::to_owned),
        actor_id: actor.id,
        actor_email: actor.email,
        action: action.as_str().to_owned(),
        target: target.to_owned(),
        detail: detail.to_string(),
        ip: actor.ip,
    };
    if let Err(e) = state.store.append_audit(&entry, state.clock.now_ms()).await {
        tracing::error!(error = %e, action = action.as_str(), target, "could not record an audit event");
    }
}

/// The API's view of a stored record.
pub fn entry(r: AuditRecord) -> autodl_common::api::AuditEntry {
    autodl_common::api::AuditEntry {
        seq: r.seq,
        at: crate::domain::rfc3339(r.at),
        tenant_id: r.tenant_id,
        actor_id: r.actor_id,
        actor_email: r.actor_email,
        action: r.action,
        target: r.target,
        detail: serde_json::from_str(&r.detail).unwrap_or(Value::String(r.detail)),
        ip: r.ip,
        hash: r.hash,
        prev_hash: r.prev_hash,
    }
}

/// Walks the whole chain from the start, a page at a time, up to the head as it was when the
/// walk began (appends may go on meanwhile).
pub async fn verify(
    store: &dyn crate::store::AuditTrail,
) -> Result<Result<chain::Verified, chain::Broken>, crate::store::StoreError> {
    const PAGE: i64 = 1000;
    let (head_seq, head_hash) = store.audit_head().await?;
    let mut v = chain::Verifier::default();
    let mut after = 0;
    loop {
        let page = store.audit_chain(after, PAGE).await?;
        for r in page.iter().take_while(|r| r.seq <= head_seq) {
            if let Err(b) = v.check(r) {
                return Ok(Err(b));
            }
            after = r.seq;
        }
        if (page.len() as i64) < PAGE || after >= head_seq {
            break;
        }
    }
    Ok(v.finish(head_seq, &head_hash))
}
