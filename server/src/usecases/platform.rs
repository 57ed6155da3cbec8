//! Platform administration across organizations: trusting an organization, its caps, and
//! accounts' flags. Only platform administrators reach these; each rule checks that first.

use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{QuotaRecord, QuotaScope, TenantSummary, UserRecord, UserWithTenant};

/// An organization as operators see it: its summary, caps and the bytes its storage holds.
pub struct OrganizationView {
    pub summary: TenantSummary,
    pub quota: QuotaRecord,
    pub storage_bytes: u64,
}

async fn view(state: &AppState, summary: TenantSummary) -> Result<OrganizationView, ApiError> {
    let quota = state.store.quota(QuotaScope::Tenant, &summary.id).await?;
    let storage_bytes = state.store.storage_bytes(&summary.id).await?.max(0) as u64;
    Ok(OrganizationView {
        summary,
        quota,
        storage_bytes,
    })
}

pub async fn organizations(
    state: &AppState,
    caller: &Caller,
) -> Result<Vec<OrganizationView>, ApiError> {
    caller.require_platform_admin()?;
    let mut out = Vec::new();
    for t in state.store.list_tenants().await? {
        out.push(view(state, t).await?);
    }
    Ok(out)
}

/// One organization, or 404.
pub async fn organization(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<OrganizationView, ApiError> {
    caller.require_platform_admin()?;
    let t = state
        .store
        .list_tenants()
        .await?
        .into_iter()
        .find(|t| t.id == id)
        .ok_or_else(|| ApiError::NotFound("no such tenant".into()))?;
    view(state, t).await
}

/// Trusts an organization (its tasks may run on trusted-only nodes) or withdraws the trust;
/// the scheduler looks again, since what may run where changed.
pub async fn set_trusted(
    state: &AppState,
    caller: &Caller,
    id: &str,
    trusted: bool,
) -> Result<(), ApiError> {
    caller.require_platform_admin()?;
    if !state.store.set_tenant_trusted(id, trusted).await? {
        return Err(ApiError::NotFound("no such tenant".into()));
    }
    state.accounts_changed();
    state.scheduler.wake();
    Ok(())
}

/// Sets an organization's caps.
pub async fn set_quota(
    state: &AppState,
    caller: &Caller,
    id: &str,
    quota: &QuotaRecord,
) -> Result<(), ApiError> {
    caller.require_platform_admin()?;
    state
        .store
        .tenant(id)
        .await?
        .ok_or_else(|| ApiError::NotFound("no such tenant".into()))?;
    state
        .store
        .set_quota(QuotaScope::Tenant, id, quota, state.clock.now_ms())
        .await?;
    state.accounts_changed();
    Ok(())
}

pub async fn accounts(state: &AppState, caller: &Caller) -> Result<Vec<UserWithTenant>, ApiError> {
    caller.require_platform_admin()?;
    Ok(state.store.list_users().await?)
}

/// Disables or enables an account, or grants or withdraws platform administration. Nobody
/// disables themselves or drops their own rights (a platform keeps an administrator), and a
/// disabled account's sessions end at once. Returns the account and its organization's name.
pub async fn set_account_flags(
    state: &AppState,
    caller: &Caller,
    id: &str,
    disabled: Option<bool>,
    platform_admin: Option<bool>,
) -> Result<(UserRecord, String), ApiError> {
    caller.require_platform_admin()?;
    if id == caller.user.id && (disabled == Some(true) || platform_admin == Some(false)) {
        return Err(ApiError::Refused {
            field: "id",
            message: "you cannot disable yourself or drop your own admin rights".into(),
        });
    }
    if !state
        .store
        .set_user_flags(id, disabled, platform_admin)
        .await?
    {
        return Err(ApiError::NotFound("no such user".into()));
    }
    state.accounts_changed();
    if disabled == Some(true) {
        state.store.revoke_user_sessions(id, None).await?;
    }
    let u = state
        .store
        .user(id)
        .await?
        .ok_or(ApiError::NotFound("no such user".into()))?;
    let t = state
        .store
        .tenant(&u.tenant_id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("tenant missing"))?;
    Ok((u, t.name))
}
