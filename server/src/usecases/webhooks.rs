//! An organization's webhooks (owners and admins): added with a signing secret (said once), at
//! most [`MAX_PER_TENANT`], removed, and what was sent to each.

use crate::auth::secrets::{new_id, random_hex};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::notify::webhooks::{NewWebhook, MAX_PER_TENANT};
use crate::state::AppState;
use crate::store::{DeliveryRecord, WebhookRecord};
use autodl_common::api::WebhookInput;

pub async fn list(state: &AppState, caller: &Caller) -> Result<Vec<WebhookRecord>, ApiError> {
    caller.require_manager()?;
    Ok(state.store.webhooks(caller.tenant_id()).await?)
}

/// A new webhook, with the events it is sent (their names, as stored).
pub async fn add(
    state: &AppState,
    caller: &Caller,
    input: &WebhookInput,
) -> Result<(WebhookRecord, Vec<String>), ApiError> {
    caller.require_manager()?;
    let new = NewWebhook::parse(input)?;
    if state.store.webhooks(caller.tenant_id()).await?.len() >= MAX_PER_TENANT {
        return Err(ApiError::Conflict(format!(
            "an organization has at most {MAX_PER_TENANT} webhooks; remove one first"
        )));
    }
    let events: Vec<String> = new.events.iter().map(|e| e.as_str().to_owned()).collect();
    let rec = WebhookRecord {
        id: new_id(),
        tenant_id: caller.tenant_id().to_owned(),
        url: new.url.to_string(),
        secret: random_hex(32),
        events: serde_json::to_string(&events).unwrap_or_default(),
        created_by: caller.user.email.clone(),
        created_at: state.clock.now_ms(),
    };
    state.store.add_webhook(&rec).await?;
    tracing::info!(webhook = %rec.id, url = %rec.url, "webhook added");
    Ok((rec, events))
}

pub async fn remove(state: &AppState, caller: &Caller, id: &str) -> Result<(), ApiError> {
    caller.require_manager()?;
    if !state.store.delete_webhook(caller.tenant_id(), id).await? {
        return Err(ApiError::NotFound("no such webhook".into()));
    }
    Ok(())
}

/// The webhook's latest 100 deliveries, newest first; 404 for another organization's.
pub async fn deliveries(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<Vec<DeliveryRecord>, ApiError> {
    caller.require_manager()?;
    let hooks = state.store.webhooks(caller.tenant_id()).await?;
    if !hooks.iter().any(|w| w.id == id) {
        return Err(ApiError::NotFound("no such webhook".into()));
    }
    Ok(state.store.deliveries(id, 100).await?)
}
