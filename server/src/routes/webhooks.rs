//! The organization's webhooks (owners and admins): add, list, remove, and what was sent.

use actix_web::{delete, get, post, web, HttpRequest, HttpResponse};
use autodl_common::api::{ErrorBody, Webhook, WebhookDelivery, WebhookInput};

use crate::audit::{self, Action, Actor};
use crate::auth::Caller;
use crate::domain::rfc3339;
use crate::error::ApiError;
use crate::routes::json::Json;
use crate::state::AppState;
use crate::store::{DeliveryRecord, WebhookRecord};
use crate::usecases::webhooks;

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
    let hooks = webhooks::list(&state, &caller).await?;
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
    let (rec, events) = webhooks::add(&state, &caller, &body).await?;
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
    webhooks::remove(&state, &caller, &id).await?;
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
    let sent = webhooks::deliveries(&state, &caller, &id).await?;
    Ok(web::Json(sent.iter().map(delivery).collect()))
}
