use actix_web::{delete, get, post, web, HttpRequest, HttpResponse};
use autodl_common::api::{ApiKeyInfo, CreateApiKeyRequest, CreatedApiKey, ErrorBody};

use crate::audit::{self, Action, Actor};
use crate::auth::Caller;
use crate::domain::rfc3339;
use crate::error::ApiError;
use crate::routes::json::Json;
use crate::state::AppState;
use crate::store::ApiKeyRecord;
use crate::usecases::api_keys;

fn info(k: &ApiKeyRecord) -> ApiKeyInfo {
    ApiKeyInfo {
        id: k.id.clone(),
        name: k.name.clone(),
        prefix: k.prefix.clone(),
        created_at: rfc3339(k.created_at),
        last_used_at: k.last_used_at.map(rfc3339),
        expires_at: k.expires_at.map(rfc3339),
    }
}

/// The caller's own active keys (never the secret).
#[utoipa::path(responses((status = 200, body = [ApiKeyInfo]), (status = 401, body = ErrorBody)))]
#[get("/api-keys")]
pub async fn list(
    state: web::Data<AppState>,
    caller: Caller,
) -> Result<web::Json<Vec<ApiKeyInfo>>, ApiError> {
    let keys = api_keys::list(&state, &caller).await?;
    Ok(web::Json(keys.iter().map(info).collect()))
}

/// Creates a key acting as the caller in the caller's tenant. The answer holds the key once.
#[utoipa::path(
    request_body = CreateApiKeyRequest,
    responses((status = 201, body = CreatedApiKey), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody))
)]
#[post("/api-keys")]
#[tracing::instrument(skip_all, fields(user = %caller.user.id))]
pub async fn create(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    body: Json<CreateApiKeyRequest>,
) -> Result<HttpResponse, ApiError> {
    let (rec, key) = api_keys::create(&state, &caller, &body.name, body.expires_in_days).await?;
    audit::record(
        &state,
        Actor::of(&caller, &req),
        Some(caller.tenant_id()),
        Action::ApiKeyCreated,
        &format!("api key {} ({})", rec.id, rec.prefix),
        serde_json::json!({ "name": rec.name, "expires_at": rec.expires_at.map(rfc3339) }),
    )
    .await;
    Ok(HttpResponse::Created().json(CreatedApiKey {
        key,
        info: info(&rec),
    }))
}

#[utoipa::path(
    params(("id" = String, Path, description = "API key id")),
    responses((status = 204), (status = 404, body = ErrorBody))
)]
#[delete("/api-keys/{id}")]
#[tracing::instrument(skip_all, fields(user = %caller.user.id))]
pub async fn revoke(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    api_keys::revoke(&state, &caller, &id).await?;
    audit::record(
        &state,
        Actor::of(&caller, &req),
        Some(caller.tenant_id()),
        Action::ApiKeyRevoked,
        &format!("api key {id}"),
        serde_json::json!({}),
    )
    .await;
    Ok(HttpResponse::NoContent().finish())
}
