//! A person's API keys: listed without their secrets, made with an optional expiry (at most
//! [`MAX_KEYS_PER_USER`] live at once), revoked at once everywhere.

use crate::auth::secrets::{digest, new_api_key, new_id, SHOWN_PREFIX_LEN};
use crate::auth::Caller;
use crate::domain::parse_name;
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::ApiKeyRecord;

pub const MAX_KEYS_PER_USER: usize = 100;

pub async fn list(state: &AppState, caller: &Caller) -> Result<Vec<ApiKeyRecord>, ApiError> {
    Ok(state.store.list_api_keys(&caller.user.id).await?)
}

/// A new key acting as the caller in the caller's organization, and its secret (said once).
pub async fn create(
    state: &AppState,
    caller: &Caller,
    name: &str,
    expires_in_days: Option<u32>,
) -> Result<(ApiKeyRecord, String), ApiError> {
    let name = parse_name("name", name, 64)?;
    if let Some(days) = expires_in_days {
        if !(1..=3650).contains(&days) {
            return Err(ApiError::invalid(
                "expires_in_days",
                "expires_in_days must be between 1 and 3650",
            ));
        }
    }
    if state.store.list_api_keys(&caller.user.id).await?.len() >= MAX_KEYS_PER_USER {
        return Err(ApiError::Conflict(format!(
            "you already have {MAX_KEYS_PER_USER} keys; revoke one first"
        )));
    }
    let now = state.clock.now_ms();
    let key = new_api_key();
    let rec = ApiKeyRecord {
        id: new_id(),
        user_id: caller.user.id.clone(),
        name,
        prefix: key[..SHOWN_PREFIX_LEN].to_owned(),
        key_hash: digest(&key),
        created_at: now,
        last_used_at: None,
        expires_at: expires_in_days.map(|d| now + i64::from(d) * 86_400_000),
        revoked: false,
    };
    state.store.create_api_key(&rec).await?;
    Ok((rec, key))
}

/// Revokes one of the caller's own keys; 404 for any other.
pub async fn revoke(state: &AppState, caller: &Caller, id: &str) -> Result<(), ApiError> {
    if !state.store.revoke_api_key(&caller.user.id, id).await? {
        return Err(ApiError::NotFound("no such API key".into()));
    }
    state.accounts_changed();
    Ok(())
}
