//! The audit trail.

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
