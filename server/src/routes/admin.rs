//! Platform operators' view across tenants.

use actix_web::{get, patch, put, web, HttpRequest};
use autodl_common::api::{
    AdminTenant, AdminUpdateTenantRequest, AdminUpdateUserRequest, AdminUser, ErrorBody, Quota,
    SchedulingPolicy,
};

use crate::audit::{self, Action, Actor};
use crate::auth::caller::parse_role;
use crate::auth::Caller;
use crate::domain::rfc3339;
use crate::domain::{parse_quota, quota_to_api};
use crate::error::ApiError;
use crate::routes::json::Json;
use crate::state::AppState;
use crate::store::{QuotaScope, UserRecord};

#[utoipa::path(responses((status = 200, body = [AdminTenant]), (status = 403, body = ErrorBody)))]
#[get("/admin/tenants")]
pub async fn tenants(
    state: web::Data<AppState>,
    caller: Caller,
) -> Result<web::Json<Vec<AdminTenant>>, ApiError> {
    caller.require_platform_admin()?;
    let mut out = Vec::new();
    for t in state.store.list_tenants().await? {
        let quota = quota_to_api(&state.store.quota(QuotaScope::Tenant, &t.id).await?);
        let storage_bytes = state.store.storage_bytes(&t.id).await?.max(0) as u64;
        out.push(AdminTenant {
            id: t.id,
            name: t.name,
            created_at: rfc3339(t.created_at),
            members: t.members as u64,
            quota,
            trusted: t.trusted,
            storage_bytes,
        });
    }
    Ok(web::Json(out))
}

/// Trusts an organization (its tasks may run on trusted-only nodes) or withdraws the trust.
#[utoipa::path(
    params(("id" = String, Path, description = "tenant id")),
    request_body = AdminUpdateTenantRequest,
    responses((status = 200, body = AdminTenant), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody))
)]
#[patch("/admin/tenants/{id}")]
#[tracing::instrument(skip_all, fields(admin = %caller.user.id, tenant = %id))]
pub async fn update_tenant(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    id: web::Path<String>,
    body: Json<AdminUpdateTenantRequest>,
) -> Result<web::Json<AdminTenant>, ApiError> {
    caller.require_platform_admin()?;
    if let Some(trusted) = body.trusted {
        if !state.store.set_tenant_trusted(&id, trusted).await? {
            return Err(ApiError::NotFound("no such tenant".into()));
        }
        audit::record(
            &state,
            Actor::of(&caller, &req),
            Some(&id),
            Action::TenantChanged,
            &format!("organization {id}"),
            serde_json::json!({ "trusted": trusted }),
        )
        .await;
        tracing::info!(trusted, "organization trust changed");
        state.accounts_changed();
        state.scheduler.wake();
    }
    let t = state
        .store
        .list_tenants()
        .await?
        .into_iter()
        .find(|t| t.id == *id)
        .ok_or_else(|| ApiError::NotFound("no such tenant".into()))?;
    Ok(web::Json(AdminTenant {
        quota: quota_to_api(&state.store.quota(QuotaScope::Tenant, &t.id).await?),
        storage_bytes: state.store.storage_bytes(&t.id).await?.max(0) as u64,
        id: t.id,
        name: t.name,
        created_at: rfc3339(t.created_at),
        members: t.members as u64,
        trusted: t.trusted,
    }))
}

#[utoipa::path(
    params(("id" = String, Path, description = "tenant id")),
    request_body = Quota,
    responses((status = 200, body = Quota), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody))
)]
#[put("/admin/tenants/{id}/quota")]
#[tracing::instrument(skip_all, fields(admin = %caller.user.id, tenant = %id))]
pub async fn set_tenant_quota(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    id: web::Path<String>,
    body: Json<Quota>,
) -> Result<web::Json<Quota>, ApiError> {
    caller.require_platform_admin()?;
    let rec = parse_quota(&body)?;
    state
        .store
        .tenant(&id)
        .await?
        .ok_or_else(|| ApiError::NotFound("no such tenant".into()))?;
    state
        .store
        .set_quota(QuotaScope::Tenant, &id, &rec, state.clock.now_ms())
        .await?;
    state.accounts_changed();
    audit::record(
        &state,
        Actor::of(&caller, &req),
        Some(&id),
        Action::TenantQuotaChanged,
        &format!("organization {id}"),
        serde_json::json!({ "quota": quota_to_api(&rec) }),
    )
    .await;
    Ok(web::Json(quota_to_api(&rec)))
}

#[utoipa::path(responses((status = 200, body = [AdminUser]), (status = 403, body = ErrorBody)))]
#[get("/admin/users")]
pub async fn users(
    state: web::Data<AppState>,
    caller: Caller,
) -> Result<web::Json<Vec<AdminUser>>, ApiError> {
    caller.require_platform_admin()?;
    let users = state.store.list_users().await?;
    let out = users
        .into_iter()
        .map(|u| admin_user(u.user, u.tenant_name))
        .collect::<Result<_, _>>()?;
    Ok(web::Json(out))
}

/// Disables or enables an account, or grants or withdraws platform administration.
#[utoipa::path(
    params(("id" = String, Path, description = "user id")),
    request_body = AdminUpdateUserRequest,
    responses((status = 200, body = AdminUser), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody))
)]
#[patch("/admin/users/{id}")]
#[tracing::instrument(skip_all, fields(admin = %caller.user.id, user = %id))]
pub async fn update_user(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    id: web::Path<String>,
    body: Json<AdminUpdateUserRequest>,
) -> Result<web::Json<AdminUser>, ApiError> {
    caller.require_platform_admin()?;
    if *id == caller.user.id && (body.disabled == Some(true) || body.platform_admin == Some(false))
    {
        return Err(ApiError::Refused {
            field: "id",
            message: "you cannot disable yourself or drop your own admin rights".into(),
        });
    }
    if !state
        .store
        .set_user_flags(&id, body.disabled, body.platform_admin)
        .await?
    {
        return Err(ApiError::NotFound("no such user".into()));
    }
    state.accounts_changed();
    if body.disabled == Some(true) {
        state.store.revoke_user_sessions(&id, None).await?;
    }
    let u = state
        .store
        .user(&id)
        .await?
        .ok_or(ApiError::NotFound("no such user".into()))?;
    let t = state
        .store
        .tenant(&u.tenant_id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("tenant missing"))?;
    audit::record(
        &state,
        Actor::of(&caller, &req),
        Some(&u.tenant_id),
        Action::UserChanged,
        &format!("user {}", u.email),
        serde_json::json!({ "disabled": body.disabled, "platform_admin": body.platform_admin }),
    )
    .await;
    Ok(web::Json(admin_user(u, t.name)?))
}

fn admin_user(u: UserRecord, tenant_name: String) -> Result<AdminUser, ApiError> {
    Ok(AdminUser {
        role: parse_role(&u.role)?,
        id: u.id,
        email: u.email,
        tenant_id: u.tenant_id,
        tenant_name,
        platform_admin: u.platform_admin,
        disabled: u.disabled,
        created_at: rfc3339(u.created_at),
    })
}

/// The scheduling policy in force. It is read from the configuration when the server starts,
/// so a change applies on restart (every replica reads the same file).
#[utoipa::path(responses((status = 200, body = SchedulingPolicy), (status = 403, body = ErrorBody)))]
#[get("/admin/policy")]
pub async fn policy(
    state: web::Data<AppState>,
    caller: Caller,
) -> Result<web::Json<SchedulingPolicy>, ApiError> {
    caller.require_platform_admin()?;
    Ok(web::Json(SchedulingPolicy {
        policy: serde_json::to_value(&state.scheduler.config).map_err(anyhow::Error::from)?,
        applies: "on restart: the server reads [policy] from its configuration when it starts"
            .into(),
    }))
}
