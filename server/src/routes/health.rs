use actix_web::{web, HttpResponse};
use autodl_common::api::Health;

use crate::state::AppState;

/// Liveness and whether the store can write, for load balancers and the compose health check:
/// a server whose database disk is full or read-only is not healthy even if it still reads.
/// Routed in `routes::configure`, so that other methods on it answer 405.
#[utoipa::path(get, path = "/healthz", responses((status = 200, body = Health), (status = 503, body = Health)))]
pub async fn healthz(state: web::Data<AppState>) -> HttpResponse {
    let problem = match state.store.ping().await {
        Err(e) => Some(format!("the database cannot be reached: {e}")),
        Ok(()) => state
            .store
            .probe_write(state.clock.now_ms())
            .await
            .err()
            .map(|e| format!("the database cannot write: {e}")),
    };
    let body = Health {
        status: if problem.is_none() { "ok" } else { "degraded" }.into(),
        database: state.store.backend().into(),
        writable: problem.is_none(),
        role: if state.scheduler.is_leader() {
            "leader"
        } else {
            "follower"
        }
        .into(),
        problem,
    };
    if body.writable {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}
