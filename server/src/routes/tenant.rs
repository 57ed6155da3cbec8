//! The caller's own organization: members, roles, invitations and quotas, as HTTP. The rules
//! are the use cases' (`usecases::organization`); each handler reads the request, calls one,
//! records what changed in the audit trail and shapes the answer.

use actix_web::{delete, get, patch, post, put, web, HttpRequest, HttpResponse};
use autodl_common::api::{
    CreateInvitationRequest, ErrorBody, Invitation, InvitationPreview, Member, Quota,
    SessionPolicy, TenantInfo, UpdateMemberRequest,
};

use crate::audit::{self, Action, Actor};
use crate::auth::Caller;
use crate::domain::{quota_to_api, rfc3339};
use crate::error::ApiError;
use crate::routes::json::Json;
use crate::state::AppState;
use crate::store::{InvitationRecord, UserRecord};
use crate::usecases::organization;

fn member(u: &UserRecord) -> Result<Member, ApiError> {
    Ok(Member {
        id: u.id.clone(),
        email: u.email.clone(),
        role: u.role,
        disabled: u.disabled,
        created_at: rfc3339(u.created_at),
    })
}

/// An invitation as the API shows it; `base` is the server's public URL, so the link works
/// wherever it is pasted.
fn invitation(
    i: &InvitationRecord,
    token: Option<String>,
    base: &str,
) -> Result<Invitation, ApiError> {
    Ok(Invitation {
        id: i.id.clone(),
        email: i.email.clone(),
        role: i.role,
        created_at: rfc3339(i.created_at),
        expires_at: rfc3339(i.expires_at),
        accepted: i.accepted_at.is_some(),
        link: token
            .as_ref()
            .map(|t| format!("{}/signup?invitation={t}", base.trim_end_matches('/'))),
        token,
    })
}

#[utoipa::path(responses((status = 200, body = TenantInfo), (status = 401, body = ErrorBody)))]
#[get("/tenant")]
pub async fn show(
    state: web::Data<AppState>,
    caller: Caller,
) -> Result<web::Json<TenantInfo>, ApiError> {
    let (t, count, storage_bytes) = organization::info(&state, &caller).await?;
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
    let list = organization::members(&state, &caller).await?;
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
    let (target, updated) = organization::change_role(&state, &caller, &id, body.role).await?;
    audit::record(
        &state,
        Actor::of(&caller, &req),
        Some(caller.tenant_id()),
        Action::MemberRoleChanged,
        &format!("user {}", target.email),
        serde_json::json!({ "role": { "from": target.role, "to": body.role.as_str() } }),
    )
    .await;
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
    let target = organization::remove(&state, &caller, &id).await?;
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
    let list = organization::invitations(&state, &caller).await?;
    Ok(web::Json(
        list.iter()
            .map(|i| invitation(i, None, ""))
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
    let (rec, token) = organization::invite(&state, &caller, &body.email, body.role).await?;
    audit::record(
        &state,
        Actor::of(&caller, &req),
        Some(caller.tenant_id()),
        Action::MemberInvited,
        &format!("user {}", rec.email),
        serde_json::json!({ "role": rec.role, "invitation": rec.id }),
    )
    .await;
    let base = state.settings.public_url();
    Ok(HttpResponse::Created().json(invitation(&rec, Some(token), &base)?))
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
    organization::revoke_invitation(&state, &caller, &id).await?;
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
    let (inv, tenant) = organization::open_invitation(&state, &token).await?;
    Ok(web::Json(InvitationPreview {
        tenant_name: tenant.name,
        email: inv.email,
        role: inv.role,
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
    let q = organization::quota(&state, &caller).await?;
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
    let q = organization::member_quota(&state, &caller, &id).await?;
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
    let (target, rec) = organization::set_member_quota(&state, &caller, &id, &body).await?;
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
        organization::session_policy(&state, &caller).await?,
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
    let policy = body.into_inner();
    organization::set_session_policy(&state, &caller, &policy).await?;
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
