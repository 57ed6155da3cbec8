//! Response headers that keep the web app out of frames, stop type sniffing and referrer
//! leaks (invitation links carry a token), and hold every response to a content policy.
//!
//! Pages set their own policy with the per-response nonce Leptos puts on its hydration script
//! ([`page_policy`]); everything else (API answers, files) gets [`API_POLICY`], which allows
//! nothing to run. Defaults are only added where a response has none of its own.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderName, HeaderValue};
use actix_web::middleware::Next;

/// Answers that are not pages: nothing in them may load or run, nobody may frame them.
pub const API_POLICY: &str = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'";

/// Adds the defaults to every response of the platform's own; a task's app (served on its own
/// origin, see `crate::task_web`) keeps the headers it chose.
pub async fn defaults(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let mut res = next.call(req).await?;
    if res
        .response()
        .extensions()
        .get::<crate::task_web::proxy::AppResponse>()
        .is_some()
    {
        return Ok(res);
    }
    let headers = res.headers_mut();
    for (name, value) in [
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CONTENT_SECURITY_POLICY, API_POLICY),
        (
            HeaderName::from_static("cross-origin-opener-policy"),
            "same-origin",
        ),
    ] {
        if !headers.contains_key(&name) {
            headers.insert(name, HeaderValue::from_static(value));
        }
    }
    Ok(res)
}

/// The policy of a server-rendered page: its own scripts and the hydration script carrying
/// `nonce`, WebAssembly, styles of its own (the charts set inline style attributes), and
/// requests to its own origin only (the API and the live streams).
pub fn page_policy(nonce: &str) -> HeaderValue {
    let policy = format!(
        "default-src 'self'; script-src 'self' 'nonce-{nonce}' 'wasm-unsafe-eval'; \
         style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; \
         object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'"
    );
    HeaderValue::from_str(&policy).unwrap_or_else(|_| HeaderValue::from_static(API_POLICY))
}
