//! The organization's webhooks (owners and admins): add, list, remove, and what was sent.

use actix_web::{delete, get, post, web, HttpRequest, HttpResponse};
use autodl_common::api::{ErrorBody, Webhook, WebhookDelivery, WebhookInput};

use crate::audit::{self, Action, Actor};
use crate::auth::secrets::{new_id, random_hex};
use crate::auth::Caller;
use crate::domain::rfc3339;
use crate::error::ApiError;
use crate::notify::webhooks::{NewWebhook, MAX_PER_TENANT};
use crate::routes::json::Json;
use crate::state::AppState;
use crate::store::{DeliveryRecord, WebhookRecord};

fn to_api(w: &WebhookRecord) -> Webhook {
    Webhook {
        id: w.id.clone(),
        url: w.url.clone(),
        events: serde_json::from_str(&w.events).unwrap_or_default(),
        created_by: w.created_by.clone(),
        created_at: rfc3339(w.created_at),
        secret: None,
    }
}

fn delivery(d: &DeliveryRecord) -> WebhookDelivery {
    let status = match (d.delivered_at, d.next_at) {
        (Some(_), _) => "delivered",
        (None, Some(_)) => "pending",
        (None, None) => "failed",
    };
    WebhookDelivery {
        id: d.id.clone(),
        event: d.event.clone(),
        attempts: d.attempts,
        status: status.into(),
        next_at: d.next_at.map(rfc3339),
        delivered_at: d.delivered_at.map(rfc3339),
        last_error: d.last_error.clone(),
        created_at: rfc3339(d.created_at),
    }
}

#[utoipa::path(responses((status = 200, body = [Webhook]), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
#[get("/tenant/webhooks")]
pub async fn list(
    state: web::Data<AppState>,
    caller: Caller,
) -> Result<web::Json<Vec<Webhook>>, ApiError> {
    caller.require_manager()?;
    let hooks = state.store.webhooks(caller.tenant_id()).await?;
    Ok(web::Json(hooks.iter().map(to_api).collect()))
}

/// Adds a webhook; the answer holds its signing secret, shown this once.
#[utoipa::path(request_body = WebhookInput, responses((status = 201, body = Webhook), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)))]
#[post("/tenant/webhooks")]
#[tracing::instrument(skip_all, fields(user = %caller.user.id))]
pub async fn create(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    body: Json<WebhookInput>,
) -> Result<HttpResponse, ApiError> {
    caller.require_manager()?;
    let new = NewWebhook::parse(&body)?;
    if state.store.webhooks(caller.tenant_id()).await?.len() >= MAX_PER_TENANT {
        return Err(ApiError::Conflict(format!(
            "an organization has at most {MAX_PER_TENANT} webhooks; remove one first"
        )));
    }
    let events: Vec<&str> = new.events.iter().map(|e| e.as_str()).collect();
    let rec = WebhookRecord {
        id: new_id(),
        tenant_id: caller.tenant_id().to_owned(),
        url: new.url.to_string(),
        secret: random_hex(32),
        events: serde_json::to_string(&events).unwrap_or_default(),
        created_by: caller.user.email.clone(),
        created_at: state.clock.now_ms(),
    };
    state.store.add_webhook(&rec).await?;
    tracing::info!(webhook = %rec.id, url = %rec.url, "webhook added");
    let mut out = to_api(&rec);
    out.secret = Some(rec.secret);
    audit::record(
        &state,
        Actor::of(&caller, &req),
        Some(caller.tenant_id()),
        Action::WebhookAdded,
        &format!("webhook {}", rec.id),
        serde_json::json!({ "url": rec.url, "events": events }),
    )
    .await;
    Ok(HttpResponse::Created().json(out))
}

#[utoipa::path(params(("id" = String, Path)), responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
#[delete("/tenant/webhooks/{id}")]
#[tracing::instrument(skip_all, fields(user = %caller.user.id))]
pub async fn remove(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    caller.require_manager()?;
    if !state.store.delete_webhook(caller.tenant_id(), &id).await? {
        return Err(ApiError::NotFound("no such webhook".into()));
    }
    audit::record(
        &state,
        Actor::of(&caller, &req),
        Some(caller.tenant_id()),
        Action::WebhookRemoved,
        &format!("webhook {id}"),
        serde_json::json!({}),
    )
    .await;
    Ok(HttpResponse::NoContent().finish())
}

/// The webhook's latest 100 deliveries, newest first.
#[utoipa::path(params(("id" = String, Path)), responses((status = 200, body = [WebhookDelivery]), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
#[get("/tenant/webhooks/{id}/deliveries")]
pub async fn deliveries(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<web::Json<Vec<WebhookDelivery>>, ApiError> {
    caller.require_manager()?;
    let hooks = state.store.webhooks(caller.tenant_id()).await?;
    if !hooks.iter().any(|w| w.id == *id) {
        return Err(ApiError::NotFound("no such webhook".into()));
    }
    let sent = state.store.deliveries(&id, 100).await?;
    Ok(web::Json(sent.iter().map(delivery).collect()))
}
