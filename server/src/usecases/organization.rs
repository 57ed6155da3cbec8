//! The caller's own organization: its members and their roles, invitations, quotas and
//! session rules. Every read is scoped by the caller's organization, so ids from another one
//! are simply not found; the rules of who may change what live here.

use autodl_common::api::{Quota, Role, SessionPolicy};

use crate::auth::secrets::{digest, new_id, random_hex};
use crate::auth::Caller;
use crate::domain::{check_within, parse_quota, Email};
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{InvitationRecord, QuotaRecord, QuotaScope, TenantRecord, UserRecord};

/// The caller's organization.
pub async fn of(state: &AppState, caller: &Caller) -> Result<TenantRecord, ApiError> {
    Ok(state
        .store
        .tenant(caller.tenant_id())
        .await?
        .ok_or_else(|| anyhow::anyhow!("tenant missing"))?)
}

/// The organization, how many members it has, and the bytes its storage holds.
pub async fn info(state: &AppState, caller: &Caller) -> Result<(TenantRecord, u64, u64), ApiError> {
    let t = of(state, caller).await?;
    let members = state.store.list_members(&t.id).await?.len() as u64;
    let storage_bytes = state.store.storage_bytes(&t.id).await?.max(0) as u64;
    Ok((t, members, storage_bytes))
}

pub async fn members(state: &AppState, caller: &Caller) -> Result<Vec<UserRecord>, ApiError> {
    Ok(state.store.list_members(caller.tenant_id()).await?)
}

/// A member of the caller's organization, or 404 (also for people of other organizations).
pub async fn member(
    state: &AppState,
    caller: &Caller,
    user_id: &str,
) -> Result<UserRecord, ApiError> {
    state
        .store
        .user(user_id)
        .await?
        .filter(|u| u.tenant_id == caller.user.tenant_id)
        .ok_or_else(|| ApiError::NotFound("no such member in your organization".into()))
}

/// Changes a member's role: managers do, only owners grant or withdraw ownership, and the last
/// owner stays. Returns the member before and after.
pub async fn change_role(
    state: &AppState,
    caller: &Caller,
    user_id: &str,
    role: Role,
) -> Result<(UserRecord, UserRecord), ApiError> {
    caller.require_manager()?;
    let target = member(state, caller, user_id).await?;
    let current = target.role;
    let touches_owner = current == Role::Owner || role == Role::Owner;
    if touches_owner && caller.role != Role::Owner {
        return Err(ApiError::Forbidden(
            "only an owner can grant or withdraw the owner role".into(),
        ));
    }
    if current == Role::Owner
        && role != Role::Owner
        && state.store.count_owners(caller.tenant_id()).await? <= 1
    {
        return Err(ApiError::Conflict(
            "an organization needs at least one owner".into(),
        ));
    }
    state
        .store
        .set_member_role(caller.tenant_id(), &target.id, role.as_str())
        .await?;
    state.accounts_changed();
    let updated = member(state, caller, user_id).await?;
    Ok((target, updated))
}

/// Removes a member: the account is disabled (its history stays) and its sessions and keys
/// end. Nobody removes themselves, and only owners remove owners.
pub async fn remove(
    state: &AppState,
    caller: &Caller,
    user_id: &str,
) -> Result<UserRecord, ApiError> {
    caller.require_manager()?;
    let target = member(state, caller, user_id).await?;
    if target.id == caller.user.id {
        return Err(ApiError::Refused {
            field: "id",
            message: "you cannot remove yourself".into(),
        });
    }
    if target.role == Role::Owner && caller.role != Role::Owner {
        return Err(ApiError::Forbidden(
            "only an owner can remove an owner".into(),
        ));
    }
    state
        .store
        .set_user_flags(&target.id, Some(true), None)
        .await?;
    state.store.revoke_user_sessions(&target.id, None).await?;
    state.store.revoke_user_api_keys(&target.id).await?;
    state.accounts_changed();
    Ok(target)
}

pub async fn invitations(
    state: &AppState,
    caller: &Caller,
) -> Result<Vec<InvitationRecord>, ApiError> {
    caller.require_manager()?;
    Ok(state.store.list_invitations(caller.tenant_id()).await?)
}

/// An invitation link for one email address with no account yet, and its token (said once).
/// Only owners invite owners.
pub async fn invite(
    state: &AppState,
    caller: &Caller,
    email: &str,
    role: Role,
) -> Result<(InvitationRecord, String), ApiError> {
    caller.require_manager()?;
    let email = Email::parse(email)?;
    if role == Role::Owner && caller.role != Role::Owner {
        return Err(ApiError::Forbidden(
            "only an owner can invite another owner".into(),
        ));
    }
    if state.store.user_by_email(email.as_str()).await?.is_some() {
        return Err(ApiError::Conflict(
            "an account with this email already exists".into(),
        ));
    }
    let now = state.clock.now_ms();
    // One open link per address: a second would leave two ways in and no telling which
    // was sent.
    let open = state
        .store
        .list_invitations(caller.tenant_id())
        .await?
        .into_iter()
        .any(|i| i.email == email.as_str() && i.is_open(now));
    if open {
        return Err(ApiError::Conflict(
            "an invitation for this email is already open; revoke it to send a new link".into(),
        ));
    }
    let token = random_hex(24);
    let rec = InvitationRecord {
        id: new_id(),
        tenant_id: caller.tenant_id().to_owned(),
        email: email.as_str().to_owned(),
        role,
        token_hash: digest(&token),
        created_by: caller.user.id.clone(),
        created_at: now,
        expires_at: now + i64::from(state.settings.invitation_ttl_days) * 86_400_000,
        accepted_at: None,
        revoked: false,
    };
    state.store.create_invitation(&rec).await?;
    Ok((rec, token))
}

pub async fn revoke_invitation(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<(), ApiError> {
    caller.require_manager()?;
    if state
        .store
        .revoke_invitation(caller.tenant_id(), id)
        .await?
    {
        Ok(())
    } else {
        Err(ApiError::NotFound("no such invitation".into()))
    }
}

/// What an invitation link offers (for the sign-up page, without an account): the invitation
/// and its organization, while it is open.
pub async fn open_invitation(
    state: &AppState,
    token: &str,
) -> Result<(InvitationRecord, TenantRecord), ApiError> {
    let gone = || ApiError::NotFound("this invitation link is invalid or has expired".into());
    let inv = state
        .store
        .invitation_by_token_hash(&digest(token))
        .await?
        .filter(|i| i.is_open(state.clock.now_ms()))
        .ok_or_else(gone)?;
    let tenant = state.store.tenant(&inv.tenant_id).await?.ok_or_else(gone)?;
    Ok((inv, tenant))
}

pub async fn quota(state: &AppState, caller: &Caller) -> Result<QuotaRecord, ApiError> {
    Ok(state
        .store
        .quota(QuotaScope::Tenant, caller.tenant_id())
        .await?)
}

/// A member's caps: their own, or anyone's for a manager.
pub async fn member_quota(
    state: &AppState,
    caller: &Caller,
    user_id: &str,
) -> Result<QuotaRecord, ApiError> {
    if user_id != caller.user.id {
        caller.require_manager()?;
    }
    let target = member(state, caller, user_id).await?;
    Ok(state.store.quota(QuotaScope::User, &target.id).await?)
}

/// Sets a member's caps; each must stay within the organization's, and storage is capped per
/// organization only. Returns the member and the caps set.
pub async fn set_member_quota(
    state: &AppState,
    caller: &Caller,
    user_id: &str,
    quota: &Quota,
) -> Result<(UserRecord, QuotaRecord), ApiError> {
    caller.require_manager()?;
    if quota.max_storage_bytes.is_some() {
        return Err(ApiError::Refused {
            field: "max_storage_bytes",
            message: "storage is capped per organization, not per member".into(),
        });
    }
    let rec = parse_quota(quota)?;
    let target = member(state, caller, user_id).await?;
    let tenant_q = state
        .store
        .quota(QuotaScope::Tenant, caller.tenant_id())
        .await?;
    check_within(&rec, &tenant_q)?;
    state
        .store
        .set_quota(QuotaScope::User, &target.id, &rec, state.clock.now_ms())
        .await?;
    state.accounts_changed();
    Ok((target, rec))
}

pub async fn session_policy(state: &AppState, caller: &Caller) -> Result<SessionPolicy, ApiError> {
    Ok(state.store.session_policy(caller.tenant_id()).await?)
}

/// Sets the organization's rules for sessions and idle GPUs (owners and admins).
pub async fn set_session_policy(
    state: &AppState,
    caller: &Caller,
    policy: &SessionPolicy,
) -> Result<(), ApiError> {
    caller.require_manager()?;
    crate::tasks::session::check_policy(policy)?;
    if !state
        .store
        .set_session_policy(caller.tenant_id(), policy)
        .await?
    {
        return Err(ApiError::NotFound("no such organization".into()));
    }
    Ok(())
}
