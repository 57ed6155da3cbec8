//! Telling people what happened without them watching a page: the organization's webhooks,
//! and email to each person who asked for it.

pub mod email;
pub mod quota;
pub mod webhooks;

pub use webhooks::Event;

use crate::store::{Accounts, Notifications, Webhooks};

/// Tells `event`: to the organization's webhooks that want it, and by email to each of
/// `people` (user ids) who asked for it. Failures are logged, never the caller's.
pub async fn tell<S: Accounts + Notifications + Webhooks + ?Sized>(
    store: &S,
    tenant_id: &str,
    people: &[&str],
    event: Event,
    data: serde_json::Value,
    now_ms: i64,
) {
    webhooks::queue(store, tenant_id, event, data.clone(), now_ms).await;
    for person in people {
        email::queue_for(store, person, event, &data, now_ms).await;
    }
}
