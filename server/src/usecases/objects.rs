//! An organization's own objects (datasets and whatever its members keep) in the buckets the
//! platform offers: how a request names an object, who may change which, and the storage
//! quota they count against.

use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;
use crate::storage::usage;
use crate::usecases::uploads::{check_key, not_writable, parse_rel};

/// Who may change an organization's objects, one rule for storing, replacing and deleting:
/// every member, anywhere but `checkpoints/` and `results/`, which hold what the platform saved
/// for tasks (users read them, only agents write there), and `code/`, whose bundles are named
/// by their digest (a replaced bundle would change what another member's task runs).
fn may_write(_caller: &Caller, rel: &str) -> Result<(), ApiError> {
    let top = rel.split('/').next().unwrap_or_default();
    if top == "checkpoints" || top == "results" || top == "code" {
        return Err(ApiError::Forbidden(format!(
            "{top}/ holds what the platform saved for tasks; it is read-only"
        )));
    }
    Ok(())
}

/// The bucket and key prefix of a path in the caller's area.
pub fn tenant_key(
    state: &AppState,
    caller: &Caller,
    bucket: &str,
    path: &str,
) -> Result<(String, String), ApiError> {
    let (bucket, dir) = state
        .storage
        .resolve(caller.tenant_id(), &format!("s3://{bucket}/{path}"))
        .map_err(|m| ApiError::invalid("path", m))?;
    Ok((bucket, dir.trim_end_matches('/').to_owned()))
}

/// How a user's object request names its object, checked: `(bucket, key, path)`. A bucket
/// the platform does not offer is a bad request; a path no object can have (`..`, control
/// characters, too long) names nothing to read (404) and may not be written (403).
pub fn user_object(
    state: &AppState,
    caller: &Caller,
    bucket: &str,
    path: &str,
    write: bool,
) -> Result<(String, String, String), ApiError> {
    if !state.storage.allowed_buckets.iter().any(|b| b == bucket) {
        return Err(ApiError::invalid(
            "bucket",
            format!(
                "bucket {bucket:?} is not one this platform lets tenants use ({})",
                state.storage.allowed_buckets.join(", ")
            ),
        ));
    }
    let named = (|| {
        let rel = parse_rel(path)?;
        if write {
            may_write(caller, &rel)?;
        }
        let (bucket, key) = tenant_key(state, caller, bucket, &rel)?;
        check_key(&key)?;
        Ok::<_, ApiError>((bucket, key, rel))
    })();
    named.map_err(|e| match e {
        e if write => not_writable(e),
        ApiError::Validation { .. } => ApiError::NotFound("no such object".into()),
        other => other,
    })
}

/// Room left under the organization's storage cap for an object replacing `old` bytes, if
/// capped.
pub async fn room(state: &AppState, caller: &Caller, old: u64) -> Result<Option<u64>, ApiError> {
    Ok(usage::room(state.store.as_ref(), caller.tenant_id())
        .await?
        .map(|r| r.saturating_add(old)))
}

/// Counts an upload against the storage cap as its bytes arrive (concurrent uploads never pass
/// the cap together), crediting the `old` bytes it replaces.
pub async fn reserve<'a>(
    state: &'a AppState,
    caller: &Caller,
    old: u64,
) -> Result<usage::Reservation<'a, dyn crate::store::Store>, ApiError> {
    Ok(usage::Reservation::new(state.store.as_ref(), caller.tenant_id(), old).await?)
}

/// A deleted object frees what it held.
pub async fn freed(state: &AppState, caller: &Caller, bytes: u64) -> Result<(), ApiError> {
    state
        .store
        .add_storage_bytes(caller.tenant_id(), -(bytes as i64))
        .await?;
    Ok(())
}
