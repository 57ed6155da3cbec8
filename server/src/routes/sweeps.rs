//! Sweeps: submitted, listed, shown (a table of parameters and metrics) and cancelled as one.

use actix_web::{get, post, web, HttpRequest, HttpResponse};
use autodl_common::api::ErrorBody;
use autodl_common::tasks::{Sweep, SweepInput};
use serde::{Deserialize, Serialize};

use crate::audit::{self, Action, Actor};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::routes::json::Json;
use crate::state::AppState;

#[utoipa::path(
    request_body = SweepInput,
    responses((status = 201, body = Sweep), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody))
)]
#[post("/sweeps")]
#[tracing::instrument(skip_all, fields(user = %caller.user.id))]
pub async fn create(
    state: web::Data<AppState>,
    caller: Caller,
    body: Json<SweepInput>,
) -> Result<HttpResponse, ApiError> {
    let sweep = crate::usecases::sweeps::create(&state, &caller, body.into_inner()).await?;
    Ok(HttpResponse::Created().json(sweep))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// At most this many, newest first (default 50, at most 500).
    limit: Option<i64>,
}

#[utoipa::path(params(ListQuery), responses((status = 200, body = [Sweep]), (status = 400, body = ErrorBody)))]
#[get("/sweeps")]
#[tracing::instrument(skip(state, caller))]
pub async fn list(
    state: web::Data<AppState>,
    caller: Caller,
    q: web::Query<ListQuery>,
) -> Result<web::Json<Vec<Sweep>>, ApiError> {
    let limit = q.limit.unwrap_or(50);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::invalid(
            "limit",
            "limit must be between 1 and 500",
        ));
    }
    Ok(web::Json(
        crate::usecases::sweeps::list(&state, &caller, limit).await?,
    ))
}

#[utoipa::path(params(("id" = String, Path)), responses((status = 200, body = Sweep), (status = 404, body = ErrorBody)))]
#[get("/sweeps/{id}")]
#[tracing::instrument(skip(state, caller))]
pub async fn show(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<web::Json<Sweep>, ApiError> {
    Ok(web::Json(
        crate::usecases::sweeps::show(&state, &caller, &id).await?,
    ))
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SweepCancelled {
    /// Trials that were waiting or running and are now cancelled (running ones stop).
    pub cancelled: u32,
}

#[utoipa::path(params(("id" = String, Path)), responses((status = 200, body = SweepCancelled), (status = 404, body = ErrorBody)))]
#[post("/sweeps/{id}/cancel")]
#[tracing::instrument(skip(state, caller))]
pub async fn cancel(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    id: web::Path<String>,
) -> Result<web::Json<SweepCancelled>, ApiError> {
    let (sweep, cancelled) = crate::usecases::sweeps::cancel(&state, &caller, &id).await?;
    if sweep.sweep.user_id != caller.user.id {
        audit::record(
            &state,
            Actor::of(&caller, &req),
            Some(caller.tenant_id()),
            Action::SweepCancelledByOther,
            &format!("sweep {id}"),
            serde_json::json!({ "owner": sweep.user_email, "name": sweep.sweep.name, "cancelled": cancelled }),
        )
        .await;
    }
    Ok(web::Json(SweepCancelled { cancelled }))
}
