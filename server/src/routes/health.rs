use actix_web::{web, HttpResponse};
use autodl_common::api::Health;

use crate::state::AppState;

/// Liveness and store reachability, for load balancers and the compose health check.
/// Routed in `routes::configure`, so that other methods on it answer 405.
#[utoipa::path(get, path = "/healthz", responses((status = 200, body = Health), (status = 503, body = Health)))]
pub async fn healthz(state: web::Data<AppState>) -> HttpResponse {
    let db_ok = state.store.ping().await.is_ok();
    let body = Health {
        status: if db_ok { "ok" } else { "degraded" }.into(),
        database: state.store.backend().into(),
    };
    if db_ok {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}
