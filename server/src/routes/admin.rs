//! Platform operators' view across organizations, as HTTP; the rules are
//! `usecases::platform`'s.

use actix_web::{get, patch, put, web, HttpRequest};
use autodl_common::api::{
    AdminTenant, AdminUpdateTenantRequest, AdminUpdateUserRequest, AdminUser, ErrorBody, Quota,
    SchedulingPolicy,
};

use crate::audit::{self, Action, Actor};
use crate::auth::Caller;
use crate::domain::rfc3339;
use crate::domain::{parse_quota, quota_to_api};
use crate::error::ApiError;
use crate::routes::json::Json;
use crate::state::AppState;
use crate::store::UserRecord;
use crate::usecases::platform::{self, OrganizationView};

#[utoipa::path(responses((status = 200, body = [AdminTenant]), (status = 403, body = ErrorBody)))]
#[get("/admin/tenants")]
pub async fn tenants(
    state: web::Data<AppState>,
    caller: Caller,
) -> Result<web::Json<Vec<AdminTenant>>, ApiError> {
    let all = platform::organizations(&state, &caller).await?;
    Ok(web::Json(all.into_iter().map(admin_tenant).collect()))
}

fn admin_tenant(v: OrganizationView) -> AdminTenant {
    let t = v.summary;
    AdminTenant {
        id: t.id,
        name: t.name,
        created_at: rfc3339(t.created_at),
        members: t.members as u64,
        quota: quota_to_api(&v.quota),
        trusted: t.trusted,
        storage_bytes: v.storage_bytes,
    }
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
        platform::set_trusted(&state, &caller, &id, trusted).await?;
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
    }
    let v = platform::organization(&state, &caller, &id).await?;
    Ok(web::Json(admin_tenant(v)))
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
    platform::set_quota(&state, &caller, &id, &rec).await?;
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
    let users = platform::accounts(&state, &caller).await?;
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
    let (u, tenant_name) =
        platform::set_account_flags(&state, &caller, &id, body.disabled, body.platform_admin)
            .await?;
    audit::record(
        &state,
        Actor::of(&caller, &req),
        Some(&u.tenant_id),
        Action::UserChanged,
        &format!("user {}", u.email),
        serde_json::json!({ "disabled": body.disabled, "platform_admin": body.platform_admin }),
    )
    .await;
    Ok(web::Json(admin_user(u, tenant_name)?))
}

fn admin_user(u: UserRecord, tenant_name: String) -> Result<AdminUser, ApiError> {
    Ok(AdminUser {
        role: u.role,
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
