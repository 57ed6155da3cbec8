//! Wire types of the autodl REST API.
//!
//! They live in their own crate so the server, the Leptos web app (compiled to wasm) and the
//! agent agree on one definition: a renamed field breaks the build instead of a user's page.

pub mod agent;
pub mod api;
#[cfg(feature = "bundle")]
pub mod bundle;
pub mod metrics;
pub mod tasks;
