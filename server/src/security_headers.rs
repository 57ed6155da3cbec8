//! Response headers that keep the web app out of frames, stop type sniffing and referrer
//! leaks (invitation links carry a token), and hold every response to a content policy.
//!
//! Pages set their own policy with the per-response nonce Leptos puts on its hydration script
//! ([`page_policy`]); everything else (API answers, files) gets [`API_POLICY`], which allows
//! nothing to run. Defaults are only added where a response has none of its own.

use actix_web::http::header::{self, HeaderValue};
use actix_web::middleware::DefaultHeaders;

/// Answers that are not pages: nothing in them may load or run, nobody may frame them.
pub const API_POLICY: &str = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'";

pub fn defaults() -> DefaultHeaders {
    DefaultHeaders::new()
        .add((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .add((header::X_FRAME_OPTIONS, "DENY"))
        .add((header::REFERRER_POLICY, "no-referrer"))
        .add((header::CONTENT_SECURITY_POLICY, API_POLICY))
        .add((
            header::HeaderName::from_static("cross-origin-opener-policy"),
            "same-origin",
        ))
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
