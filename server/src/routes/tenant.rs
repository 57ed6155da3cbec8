//! The caller's own organization: members, roles, invitations and quotas. Every query is
//! scoped by the caller's tenant id, so ids from another tenant simply are not found.

use actix_web::{delete, get, patch, post, put, web, HttpRequest, HttpResponse};
use autodl_common::api::{
    CreateInvitationRequest, ErrorBody, Invitation, InvitationPreview, Member, Quota, Role,
    SessionPolicy, TenantInfo, UpdateMemberRequest,
};

use crate::audit::{self, Action, Actor};
use crate::auth::caller::parse_role;
use crate::auth::secrets::{digest, new_id, random_hex};
use crate::auth::Caller;
use crate::domain::rfc3339;
use crate::domain::{check_within, parse_quota, quota_to_api, Email};
use crate::error::ApiError;
use crate::routes::json::Json;
use crate::state::AppState;
use crate::store::{InvitationRecord, QuotaScope, UserRecord};

fn member(u: &UserRecord) -> Result<Member, ApiError> {
    Ok(Member {
        id: u.id.clone(),
        email: u.email.clone(),
        role: parse_role(&u.role)?,
        disabled: u.disabled,
        created_at: rfc3339(u.created_at),
    })
}

fn invitation(i: &InvitationRecord, token: Option<String>) -> Result<Invitation, ApiError> {
    Ok(Invitation {
        id: i.id.clone(),
        email: i.email.clone(),
        role: parse_role(&i.role)?,
        created_at: rfc3339(i.created_at),
        expires_at: rfc3339(i.expires_at),
        accepted: i.accepted_at.is_some(),
        link: token.as_ref().map(|t| format!("/signup?invitation={t}")),
        token,
    })
}

/// A member of the caller's tenant, or 404 (also for users of other tenants).
async fn member_of_tenant(
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

#[utoipa::path(responses((status = 200, body = TenantInfo), (status = 401, body = ErrorBody)))]
#[get("/tenant")]
pub async fn show(
    state: web::Data<AppState>,
    caller: Caller,
) -> Result<web::Json<TenantInfo>, ApiError> {
    let t = state
        .store
        .tenant(caller.tenant_id())
        .await?
        .ok_or_else(|| anyhow::anyhow!("tenant missing"))?;
    let count = state.store.list_members(&t.id).await?.len() as u64;
    let storage_bytes = state.store.storage_bytes(&t.id).await?.max(0) as u64;
    Ok(web::Json(TenantInfo {
        id: t.id,
        name: t.name,
        created_at: rfc3339(t.created_at),
        members: count,
        storage_bytes,
        trusted: t.trusted,
    }))
}

#[utoipa::path(responses((status = 200, body = [Member]), (status = 401, body = ErrorBody)))]
#[get("/tenant/members")]
pub async fn members(
    state: web::Data<AppState>,
    caller: Caller,
) -> Result<web::Json<Vec<Member>>, ApiError> {
    let list = state.store.list_members(caller.tenant_id()).await?;
    Ok(web::Json(
        list.iter().map(member).collect::<Result<_, _>>()?,
    ))
}

/// Changes a member's role. Only owners grant or withdraw ownership, and the last owner stays.
#[utoipa::path(
    params(("id" = String, Path, description = "user id")),
    request_body = UpdateMemberRequest,
    responses((status = 200, body = Member), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody))
)]
#[patch("/tenant/members/{id}")]
#[tracing::instrument(skip_all, fields(caller = %caller.user.id, member = %id))]
pub async fn update_member(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    id: web::Path<String>,
    body: Json<UpdateMemberRequest>,
) -> Result<web::Json<Member>, ApiError> {
    caller.require_manager()?;
    let target = member_of_tenant(&state, &caller, &id).await?;
    let current = parse_role(&target.role)?;
    let touches_owner = current == Role::Owner || body.role == Role::Owner;
    if touches_owner && caller.role != Role::Owner {
        return Err(ApiError::Forbidden(
            "only an owner can grant or withdraw the owner role".into(),
        ));
    }
    if current == Role::Owner
        && body.role != Role::Owner
        && state.store.count_owners(caller.tenant_id()).await? <= 1
    {
        return Err(ApiError::Conflict(
            "an organization needs at least one owner".into(),
        ));
    }
    state
        .store
        .set_member_role(caller.tenant_id(), &target.id, body.role.as_str())
        .await?;
    state.accounts_changed();
    audit::record(
        &state,
        Actor::of(&caller, &req),
        Some(caller.tenant_id()),
        Action::MemberRoleChanged,
        &format!("user {}", target.email),
        serde_json::json!({ "role": { "from": target.role, "to": body.role.as_str() } }),
    )
    .await;
    let updated = member_of_tenant(&state, &caller, &id).await?;
    Ok(web::Json(member(&updated)?))
}

/// Removes a member: the account is disabled (its history stays) and its sessions and keys end.
#[utoipa::path(
    params(("id" = String, Path, description = "user id")),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody))
)]
#[delete("/tenant/members/{id}")]
#[tracing::instrument(skip_all, fields(caller = %caller.user.id, member = %id))]
pub async fn remove_member(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    caller.require_manager()?;
    let target = member_of_tenant(&state, &caller, &id).await?;
    if target.id == caller.user.id {
        return Err(ApiError::Refused {
            field: "id",
            message: "you cannot remove yourself".into(),
        });
    }
    if parse_role(&target.role)? == Role::Owner && caller.role != Role::Owner {
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
    audit::record(
        &state,
        Actor::of(&caller, &req),
        Some(caller.tenant_id()),
        Action::MemberRemoved,
        &format!("user {}", target.email),
        serde_json::json!({ "role": target.role }),
    )
    .await;
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(responses((status = 200, body = [Invitation]), (status = 403, body = ErrorBody)))]
#[get("/tenant/invitations")]
pub async fn invitations(
    state: web::Data<AppState>,
    caller: Caller,
) -> Result<web::Json<Vec<Invitation>>, ApiError> {
    caller.require_manager()?;
    let list = state.store.list_invitations(caller.tenant_id()).await?;
    Ok(web::Json(
        list.iter()
            .map(|i| invitation(i, None))
            .collect::<Result<_, _>>()?,
    ))
}

/// Makes an invitation link for one email address. The answer holds the link's token once.
#[utoipa::path(
    request_body = CreateInvitationRequest,
    responses((status = 201, body = Invitation), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody))
)]
#[post("/tenant/invitations")]
#[tracing::instrument(skip_all, fields(caller = %caller.user.id))]
pub async fn invite(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    body: Json<CreateInvitationRequest>,
) -> Result<HttpResponse, ApiError> {
    caller.require_manager()?;
    let email = Email::parse(&body.email)?;
    if body.role == Role::Owner && caller.role != Role::Owner {
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
    let token = random_hex(24);
    let rec = InvitationRecord {
        id: new_id(),
        tenant_id: caller.tenant_id().to_owned(),
        email: email.as_str().to_owned(),
        role: body.role.as_str().to_owned(),
        token_hash: digest(&token),
        created_by: caller.user.id.clone(),
        created_at: now,
        expires_at: now + i64::from(state.settings.invitation_ttl_days) * 86_400_000,
        accepted_at: None,
        revoked: false,
    };
    state.store.create_invitation(&rec).await?;
    audit::record(
        &state,
        Actor::of(&caller, &req),
        Some(caller.tenant_id()),
        Action::MemberInvited,
        &format!("user {}", rec.email),
        serde_json::json!({ "role": rec.role, "invitation": rec.id }),
    )
    .await;
    Ok(HttpResponse::Created().json(invitation(&rec, Some(token))?))
}

#[utoipa::path(
    params(("id" = String, Path, description = "invitation id")),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody))
)]
#[delete("/tenant/invitations/{id}")]
pub async fn revoke_invitation(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    caller.require_manager()?;
    if state
        .store
        .revoke_invitation(caller.tenant_id(), &id)
        .await?
    {
        audit::record(
            &state,
            Actor::of(&caller, &req),
            Some(caller.tenant_id()),
            Action::InvitationRevoked,
            &format!("invitation {id}"),
            serde_json::json!({}),
        )
        .await;
        Ok(HttpResponse::NoContent().finish())
    } else {
        Err(ApiError::NotFound("no such invitation".into()))
    }
}

/// What an invitation link offers, for the sign-up page; needs no account.
#[utoipa::path(
    params(("token" = String, Path, description = "invitation token from the link")),
    responses((status = 200, body = InvitationPreview), (status = 404, body = ErrorBody))
)]
#[get("/invitations/{token}")]
pub async fn preview_invitation(
    state: web::Data<AppState>,
    token: web::Path<String>,
) -> Result<web::Json<InvitationPreview>, ApiError> {
    let gone = || ApiError::NotFound("this invitation link is invalid or has expired".into());
    let inv = state
        .store
        .invitation_by_token_hash(&digest(&token))
        .await?
        .filter(|i| !i.revoked && i.accepted_at.is_none() && i.expires_at > state.clock.now_ms())
        .ok_or_else(gone)?;
    let tenant = state.store.tenant(&inv.tenant_id).await?.ok_or_else(gone)?;
    Ok(web::Json(InvitationPreview {
        tenant_name: tenant.name,
        email: inv.email,
        role: parse_role(&inv.role)?,
        expires_at: rfc3339(inv.expires_at),
    }))
}

/// The organization's caps, set by platform administrators.
#[utoipa::path(responses((status = 200, body = Quota), (status = 401, body = ErrorBody)))]
#[get("/tenant/quota")]
pub async fn tenant_quota(
    state: web::Data<AppState>,
    caller: Caller,
) -> Result<web::Json<Quota>, ApiError> {
    let q = state
        .store
        .quota(QuotaScope::Tenant, caller.tenant_id())
        .await?;
    Ok(web::Json(quota_to_api(&q)))
}

#[utoipa::path(
    params(("id" = String, Path, description = "user id")),
    responses((status = 200, body = Quota), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody))
)]
#[get("/tenant/members/{id}/quota")]
pub async fn member_quota(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<web::Json<Quota>, ApiError> {
    if *id != caller.user.id {
        caller.require_manager()?;
    }
    let target = member_of_tenant(&state, &caller, &id).await?;
    let q = state.store.quota(QuotaScope::User, &target.id).await?;
    Ok(web::Json(quota_to_api(&q)))
}

/// Sets a member's caps; each must stay within the organization's.
#[utoipa::path(
    params(("id" = String, Path, description = "user id")),
    request_body = Quota,
    responses((status = 200, body = Quota), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody))
)]
#[put("/tenant/members/{id}/quota")]
#[tracing::instrument(skip_all, fields(caller = %caller.user.id, member = %id))]
pub async fn set_member_quota(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    id: web::Path<String>,
    body: Json<Quota>,
) -> Result<web::Json<Quota>, ApiError> {
    caller.require_manager()?;
    if body.max_storage_bytes.is_some() {
        return Err(ApiError::Refused {
            field: "max_storage_bytes",
            message: "storage is capped per organization, not per member".into(),
        });
    }
    let rec = parse_quota(&body)?;
    let target = member_of_tenant(&state, &caller, &id).await?;
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
    audit::record(
        &state,
        Actor::of(&caller, &req),
        Some(caller.tenant_id()),
        Action::MemberQuotaChanged,
        &format!("user {}", target.email),
        serde_json::json!({ "quota": quota_to_api(&rec) }),
    )
    .await;
    Ok(web::Json(quota_to_api(&rec)))
}

/// The organization's rules for sessions and idle GPUs; every member may read them.
#[utoipa::path(responses((status = 200, body = SessionPolicy), (status = 401, body = ErrorBody)))]
#[get("/tenant/session-policy")]
pub async fn session_policy(
    state: web::Data<AppState>,
    caller: Caller,
) -> Result<web::Json<SessionPolicy>, ApiError> {
    Ok(web::Json(
        state.store.session_policy(caller.tenant_id()).await?,
    ))
}

/// Sets the organization's rules for sessions and idle GPUs (owners and admins).
#[utoipa::path(request_body = SessionPolicy, responses((status = 200, body = SessionPolicy), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody)))]
#[put("/tenant/session-policy")]
#[tracing::instrument(skip_all, fields(user = %caller.user.id))]
pub async fn set_session_policy(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    body: Json<SessionPolicy>,
) -> Result<web::Json<SessionPolicy>, ApiError> {
    caller.require_manager()?;
    let policy = body.into_inner();
    crate::tasks::session::check_policy(&policy)?;
    if !state
        .store
        .set_session_policy(caller.tenant_id(), &policy)
        .await?
    {
        return Err(ApiError::NotFound("no such organization".into()));
    }
    audit::record(
        &state,
        Actor::of(&caller, &req),
        Some(caller.tenant_id()),
        Action::SessionPolicyChanged,
        &format!("organization {}", caller.tenant_id()),
        serde_json::to_value(&policy).unwrap_or_default(),
    )
    .await;
    tracing::info!(?policy, "session policy changed");
    Ok(web::Json(policy))
}
