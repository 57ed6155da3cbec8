use actix_web::{web, HttpResponse};
use autodl_common::api::Health;

use crate::state::AppState;
use crate::usecases::health;

/// Liveness and whether the store can write, for load balancers and the compose health check:
/// a server whose database disk is full or read-only is not healthy even if it still reads.
/// Routed in `routes::configure`, so that other methods on it answer 405.
#[utoipa::path(get, path = "/healthz", responses((status = 200, body = Health), (status = 503, body = Health)))]
pub async fn healthz(state: web::Data<AppState>) -> HttpResponse {
    let body = health::check(&state).await;
    if body.writable {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}
