//! Cluster inventory as HTTP: the nodes as the caller may see them, nodes declared by hand,
//! and administrators' actions on nodes (`usecases::inventory`, `usecases::nodes`).

use actix_web::{delete, get, post, web, HttpRequest, HttpResponse};
use autodl_common::api::ErrorBody;
use autodl_common::tasks::{NodeInfo, NodeInput};

use crate::audit::{self, Action, Actor};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::routes::json::Json;
use crate::state::AppState;
use crate::usecases::inventory;
use crate::usecases::nodes::{self, NodeAction};

/// The cluster as the caller may see it: every node and what is allocated, but only the
/// caller's organization's task ids (platform admins see all).
#[utoipa::path(responses((status = 200, body = [NodeInfo]), (status = 401, body = ErrorBody)))]
#[get("/nodes")]
pub async fn list(
    state: web::Data<AppState>,
    caller: Caller,
) -> Result<web::Json<Vec<NodeInfo>>, ApiError> {
    Ok(web::Json(inventory::nodes(&state, &caller).await?))
}

/// Registers (or updates) a node and its GPUs.
#[utoipa::path(request_body = NodeInput, responses((status = 201, body = NodeInfo), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody)))]
#[post("/admin/nodes")]
#[tracing::instrument(skip_all, fields(admin = %caller.user.id))]
pub async fn register(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    body: Json<NodeInput>,
) -> Result<HttpResponse, ApiError> {
    caller.require_platform_admin()?;
    let info = inventory::declare(&state, &caller, body.into_inner()).await?;
    audit::record(
        &state,
        Actor::of(&caller, &req),
        None,
        Action::NodeRegistered,
        &format!("node {}", info.id),
        serde_json::json!({ "gpus": info.gpus.len(), "zone": info.zone, "by": "admin" }),
    )
    .await;
    Ok(HttpResponse::Created().json(info))
}

#[utoipa::path(params(("id" = String, Path)), responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
#[delete("/admin/nodes/{id}")]
pub async fn remove(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    inventory::remove(&state, &caller, &id).await?;
    audit::record(
        &state,
        Actor::of(&caller, &req),
        None,
        Action::NodeRemoved,
        &format!("node {id}"),
        serde_json::json!({}),
    )
    .await;
    Ok(HttpResponse::NoContent().finish())
}

/// Cordon (no new tasks), uncordon, or drain (no new tasks, and its tasks are stopped through
/// their agent so they checkpoint and move elsewhere). A node that cannot isolate tasks is
/// trusted-only; `open-to-all` lets every organization use it anyway (at their risk), and
/// `trusted-only` takes that back.
#[utoipa::path(params(("id" = String, Path), ("action" = String, Path, description = "cordon, uncordon, drain, open-to-all or trusted-only")), responses((status = 204), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
#[post("/admin/nodes/{id}/{action}")]
#[tracing::instrument(skip_all, fields(admin = %caller.user.id))]
pub async fn set_status(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    caller.require_platform_admin()?;
    let (id, raw) = path.into_inner();
    let action = NodeAction::parse(&raw)?;
    nodes::act(&state, &id, action).await?;
    audit::record(
        &state,
        Actor::of(&caller, &req),
        None,
        Action::NodeStatusChanged,
        &format!("node {id}"),
        serde_json::json!({ "action": raw }),
    )
    .await;
    Ok(HttpResponse::NoContent().finish())
}
