//! Use cases: what the platform does, between HTTP and the store. Each takes the application
//! (its store, object storage and clock) and input already parsed into types, applies the
//! rules named after what they are, and answers with typed results or an [`ApiError`]; actix
//! handlers in `routes/` only translate requests and answers.
//!
//! [`ApiError`]: crate::error::ApiError

pub mod agents;
pub mod api_keys;
pub mod code;
pub mod nodes;
pub mod organization;
pub mod reach;
pub mod reports;
pub mod runs;
pub mod sso;
pub mod submit;
pub mod sweeps;
pub mod uploads;
pub mod webhooks;
