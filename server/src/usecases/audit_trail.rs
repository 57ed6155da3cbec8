//! Reading the audit trail: an organization's owners and admins read their organization's,
//! platform administrators anyone's (or all of it).

use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{AuditFilter, AuditRecord};

/// The organization whose trail the caller reads when asking for `asked` (None: every
/// organization's, for platform administrators only): a manager reads their own.
pub fn in_view(caller: &Caller, asked: Option<String>) -> Result<Option<String>, ApiError> {
    caller.require_manager()?;
    if caller.user.platform_admin {
        return Ok(asked);
    }
    if asked.as_deref().is_some_and(|t| t != caller.tenant_id()) {
        return Err(ApiError::Forbidden(
            "you see your own organization's audit trail only".into(),
        ));
    }
    Ok(Some(caller.tenant_id().to_owned()))
}

/// A page of the records `filter` selects (newest first), its organization checked against
/// what the caller may read ([`in_view`]).
pub async fn page(
    state: &AppState,
    caller: &Caller,
    mut filter: AuditFilter,
    limit: i64,
) -> Result<Vec<AuditRecord>, ApiError> {
    filter.tenant_id = in_view(caller, filter.tenant_id)?;
    Ok(state.store.audit_records(&filter, limit).await?)
}
