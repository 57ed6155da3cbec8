//! The agent API: registration with a one-time token, then long polls and reports with the
//! node credential. Reports about attempts that are no longer current change nothing (409).

use std::time::Duration;

use actix_web::{delete, get, post, web, HttpRequest, HttpResponse};
use autodl_common::agent::{
    AttemptRef, CreateRegistrationToken, FinishedReport, LogBatch, MetricBatch, NotKeptReport,
    PollRequest, PollResponse, ProgressReport, RegisterRequest, RegisterResponse,
    RegistrationToken,
};
use autodl_common::api::ErrorBody;
use serde::Deserialize;

use crate::agents::node_caller::NodeCaller;
use crate::audit::{self, Action, Actor};
use crate::auth::Caller;
use crate::domain::rfc3339;
use crate::domain::{parse_name, parse_node_id};
use crate::error::ApiError;
use crate::routes::json::Json;
use crate::state::AppState;
use crate::store::RegistrationTokenRecord;
use crate::usecases::{agents, poll as polls, reports};

pub const METRIC_BODY_LIMIT: usize = 8 * 1024 * 1024;

fn token_info(t: &RegistrationTokenRecord, token: Option<String>) -> RegistrationToken {
    RegistrationToken {
        id: t.id.clone(),
        name: t.name.clone(),
        created_at: rfc3339(t.created_at),
        expires_at: rfc3339(t.expires_at),
        max_uses: t.max_uses.clamp(0, i64::from(u32::MAX)) as u32,
        uses: t.uses.clamp(0, i64::from(u32::MAX)) as u32,
        node_id: t.node_id.clone(),
        token,
    }
}

/// A token agents register with (shown once): for any node up to `max_uses` times, or once
/// for one named node.
#[utoipa::path(request_body = CreateRegistrationToken, responses((status = 201, body = RegistrationToken), (status = 403, body = ErrorBody)))]
#[post("/admin/registration-tokens")]
pub async fn create_token(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    body: Json<CreateRegistrationToken>,
) -> Result<HttpResponse, ApiError> {
    caller.require_platform_admin()?;
    let name = parse_name("name", body.name.as_deref().unwrap_or("agents"), 64)?;
    let hours = body.expires_in_hours.unwrap_or(24);
    if !(1..=24 * 365).contains(&hours) {
        return Err(ApiError::invalid(
            "expires_in_hours",
            "expires_in_hours must be between 1 and 8760",
        ));
    }
    let max_uses = body.max_uses.unwrap_or(1);
    if !(1..=10_000).contains(&max_uses) {
        return Err(ApiError::invalid(
            "max_uses",
            "max_uses must be between 1 and 10000",
        ));
    }
    if let Some(n) = &body.node_id {
        parse_node_id("node_id", n)?;
        if max_uses != 1 {
            return Err(ApiError::invalid(
                "max_uses",
                "a token for one node is used once",
            ));
        }
    }
    let (token, rec) = agents::grant_registration_token(
        &state,
        &caller,
        agents::TokenGrant {
            name,
            created_by: caller.user.id.clone(),
            node_id: body.node_id.clone(),
            max_uses,
            valid_ms: i64::from(hours) * 3_600_000,
        },
    )
    .await?;
    audit::record(
        &state,
        Actor::of(&caller, &req),
        None,
        Action::RegistrationTokenCreated,
        &format!("registration token {}", rec.id),
        serde_json::json!({ "name": rec.name, "node_id": rec.node_id, "max_uses": rec.max_uses }),
    )
    .await;
    Ok(HttpResponse::Created().json(token_info(&rec, Some(token))))
}

#[utoipa::path(responses((status = 200, body = [RegistrationToken]), (status = 403, body = ErrorBody)))]
#[get("/admin/registration-tokens")]
pub async fn list_tokens(
    state: web::Data<AppState>,
    caller: Caller,
) -> Result<web::Json<Vec<RegistrationToken>>, ApiError> {
    let list = agents::registration_tokens(&state, &caller).await?;
    Ok(web::Json(
        list.iter().map(|t| token_info(t, None)).collect(),
    ))
}

#[utoipa::path(params(("id" = String, Path)), responses((status = 204), (status = 404, body = ErrorBody)))]
#[delete("/admin/registration-tokens/{id}")]
pub async fn revoke_token(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    agents::revoke_registration_token(&state, &caller, &id).await?;
    audit::record(
        &state,
        Actor::of(&caller, &req),
        None,
        Action::RegistrationTokenRevoked,
        &format!("registration token {id}"),
        serde_json::json!({}),
    )
    .await;
    Ok(HttpResponse::NoContent().finish())
}

/// An agent joins with a registration token and receives its own node credential.
#[utoipa::path(request_body = RegisterRequest, responses((status = 201, body = RegisterResponse), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
#[post("/agent/register")]
#[tracing::instrument(skip_all, fields(node = %body.node.id))]
pub async fn register(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: Json<RegisterRequest>,
) -> Result<HttpResponse, ApiError> {
    let joined = agents::register(&state, &body).await?;
    audit::record(
        &state,
        Actor::anonymous(None, &req),
        None,
        Action::NodeRegistered,
        &format!("node {}", body.node.id),
        serde_json::json!({ "gpus": body.node.gpus.len(), "by": "agent" }),
    )
    .await;
    Ok(HttpResponse::Created().json(joined))
}

/// Longest a poll is held.
pub const MAX_POLL_WAIT_S: u64 = 30;

#[derive(Debug, Deserialize)]
pub struct PollQuery {
    /// Seconds to hold the poll when there is nothing to do, 0..=30.
    wait: Option<u64>,
}

/// Heartbeat and work in one call: answers at once when there is work, otherwise holds the
/// request up to `wait` seconds and answers as soon as work appears.
#[utoipa::path(request_body = PollRequest, params(("wait" = Option<u64>, Query)), responses((status = 200, body = PollResponse), (status = 401, body = ErrorBody)))]
#[post("/agent/poll")]
pub async fn poll(
    state: web::Data<AppState>,
    node: NodeCaller,
    q: web::Query<PollQuery>,
    body: Json<PollRequest>,
) -> Result<web::Json<PollResponse>, ApiError> {
    let wait = match q.wait.unwrap_or(0) {
        w @ 0..=MAX_POLL_WAIT_S => Duration::from_secs(w),
        _ => {
            return Err(ApiError::invalid(
                "wait",
                format!("wait is 0 to {MAX_POLL_WAIT_S} seconds"),
            ))
        }
    };
    Ok(web::Json(
        polls::answer(&state, &node.node, &body, wait).await?,
    ))
}

#[utoipa::path(params(("id" = String, Path)), request_body = AttemptRef, responses((status = 204), (status = 409, body = ErrorBody)))]
#[post("/agent/tasks/{id}/started")]
pub async fn started(
    state: web::Data<AppState>,
    node: NodeCaller,
    id: web::Path<String>,
    body: Json<AttemptRef>,
) -> Result<HttpResponse, ApiError> {
    reports::started(&state, &node.node.id, &id, body.attempt).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// A step before the attempt starts, kept in the task's timeline.
#[utoipa::path(params(("id" = String, Path)), request_body = ProgressReport, responses((status = 204), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)))]
#[post("/agent/tasks/{id}/progress")]
pub async fn progress(
    state: web::Data<AppState>,
    node: NodeCaller,
    id: web::Path<String>,
    body: Json<ProgressReport>,
) -> Result<HttpResponse, ApiError> {
    reports::progress(&state, &node.node.id, &id, &body).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(params(("id" = String, Path)), request_body = LogBatch, responses((status = 204), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)))]
#[post("/agent/tasks/{id}/logs")]
pub async fn logs(
    state: web::Data<AppState>,
    node: NodeCaller,
    id: web::Path<String>,
    body: Json<LogBatch>,
) -> Result<HttpResponse, ApiError> {
    reports::logs(&state, &node.node.id, &id, &body).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(params(("id" = String, Path)), request_body = FinishedReport, responses((status = 204), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)))]
#[post("/agent/tasks/{id}/finished")]
#[tracing::instrument(skip_all, fields(node = %node.node.id, task = %id))]
pub async fn finished(
    state: web::Data<AppState>,
    node: NodeCaller,
    id: web::Path<String>,
    body: Json<FinishedReport>,
) -> Result<HttpResponse, ApiError> {
    reports::finished(&state, &node.node.id, &id, &body).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// The node gives up results or a last checkpoint it kept after the run ended (kept too
/// long, or its disk was needed): the task says plainly that they are lost.
#[utoipa::path(params(("id" = String, Path)), request_body = NotKeptReport, responses((status = 204), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)))]
#[post("/agent/tasks/{id}/not-kept")]
#[tracing::instrument(skip_all, fields(node = %node.node.id, task = %id))]
pub async fn not_kept(
    state: web::Data<AppState>,
    node: NodeCaller,
    id: web::Path<String>,
    body: Json<NotKeptReport>,
) -> Result<HttpResponse, ApiError> {
    reports::not_kept(&state, &node.node.id, &id, &body).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// GPU samples in batches. A sample for a GPU the node does not have, or naming a task that
/// did not run on that GPU of this node, rejects the whole batch (nothing is stored).
///
/// Batches are large (up to 10,000 samples), so this route takes bodies up to
/// `METRIC_BODY_LIMIT` (see `routes::configure`), above the API's usual limit.
#[utoipa::path(post, path = "/agent/metrics", request_body = MetricBatch, responses((status = 204), (status = 400, body = ErrorBody)))]
pub async fn metrics(
    state: web::Data<AppState>,
    node: NodeCaller,
    body: Json<MetricBatch>,
) -> Result<HttpResponse, ApiError> {
    reports::metrics(&state, &node.node, &body).await?;
    Ok(HttpResponse::NoContent().finish())
}
