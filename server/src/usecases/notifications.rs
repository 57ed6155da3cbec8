//! Each person's choice of the events they are emailed about.

use crate::auth::Caller;
use crate::error::ApiError;
use crate::notify::email::wanted;
use crate::notify::Event;
use crate::state::AppState;

pub async fn email_events(state: &AppState, caller: &Caller) -> Result<Vec<Event>, ApiError> {
    Ok(wanted(state.store.as_ref(), &caller.user.id).await?)
}

/// Sets the events emailed to the caller (empty: none).
pub async fn set_email_events(
    state: &AppState,
    caller: &Caller,
    events: &[Event],
) -> Result<(), ApiError> {
    let json = serde_json::to_string(events).map_err(anyhow::Error::from)?;
    state
        .store
        .set_email_events(&caller.user.id, &json, state.clock.now_ms())
        .await?;
    Ok(())
}
