//! Use cases: what the platform does, between HTTP and the store. Each takes the application
//! (its store, object storage and clock) and input already parsed into types, applies the
//! rules named after what they are, and answers with typed results or an [`ApiError`]; actix
//! handlers in `routes/` only translate requests and answers.
//!
//! [`ApiError`]: crate::error::ApiError

pub mod accounts;
pub mod agents;
pub mod api_keys;
pub mod audit_trail;
pub mod code;
pub mod health;
pub mod inventory;
pub mod nodes;
pub mod notifications;
pub mod objects;
pub mod organization;
pub mod platform;
pub mod poll;
pub mod reach;
pub mod reports;
pub mod runs;
pub mod sso;
pub mod sso_settings;
pub mod submit;
pub mod sweeps;
pub mod task_history;
pub mod task_outputs;
pub mod uploads;
pub mod usage;
pub mod webhooks;
