//! The Prometheus scrape endpoint: the figures of `prometheus_metrics`, for the scraper's token
//! or a platform administrator.

use actix_web::{get, web, HttpResponse};

use crate::usecases::health;

/// For Prometheus (the bearer token `AUTODL_METRICS_TOKEN`) and platform administrators: the
/// figures name nodes and tasks of every organization.
#[get("/metrics")]
pub async fn endpoint(
    state: web::Data<crate::state::AppState>,
    req: actix_web::HttpRequest,
) -> Result<HttpResponse, crate::error::ApiError> {
    let bearer = crate::auth::bearer::bearer_token(req.headers());
    let scraper = match (&state.settings.metrics_token, bearer) {
        (Some(want), Some(got)) if !want.is_empty() => {
            use sha2::Digest;
            // Compared as digests, so the comparison time says nothing about the token.
            sha2::Sha256::digest(want.as_bytes()) == sha2::Sha256::digest(got.as_bytes())
        }
        _ => false,
    };
    if !scraper {
        use actix_web::FromRequest;
        let caller =
            crate::auth::Caller::from_request(&req, &mut actix_web::dev::Payload::None).await?;
        caller.require_platform_admin()?;
    }
    Ok(HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(health::scrape(&state).await?))
}
