//! Reading the audit trail: an organization's owners and admins read their organization's,
//! platform administrators anyone's (or all of it).

use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{AuditFilter, AuditRecord};

/// A page of the records `filter` selects (newest first), its organization checked against
/// what the caller may read: a manager asking for none gets their own organization's.
pub async fn page(
    state: &AppState,
    caller: &Caller,
    mut filter: AuditFilter,
    limit: i64,
) -> Result<Vec<AuditRecord>, ApiError> {
    caller.require_manager()?;
    if !caller.user.platform_admin {
        if filter
            .tenant_id
            .as_deref()
            .is_some_and(|t| t != caller.tenant_id())
        {
            return Err(ApiError::Forbidden(
                "you see your own organization's audit trail only".into(),
            ));
        }
        filter.tenant_id = Some(caller.tenant_id().to_owned());
    }
    Ok(state.store.audit_records(&filter, limit).await?)
}
