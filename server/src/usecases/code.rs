//! Code bundles: what a task's `workdir` was when it was submitted. A bundle is named by the
//! digest of its bytes and stored once per organization, so submitting from an unchanged
//! folder uploads nothing, and a task always runs the code it was submitted with.

use autodl_common::api::CodeBundle;
use autodl_common::bundle::{self, BundleError, Limits};
use bytes::Bytes;

use crate::error::ApiError;
use crate::state::AppState;
use crate::storage::{put_bytes, usage};

pub fn limits(state: &AppState) -> Limits {
    Limits {
        max_unpacked_bytes: state.settings.code_max_unpacked_bytes,
        ..Limits::default()
    }
}

/// The digest of a well-formed id, or a 400 naming `field`.
pub fn digest_of<'a>(field: &'static str, id: &'a str) -> Result<&'a str, ApiError> {
    bundle::parse_id(id).ok_or_else(|| {
        ApiError::invalid(
            field,
            format!("{field} is \"sha256:\" and 64 lower-case hex digits, not {id:?}"),
        )
    })
}

/// Checks and stores an uploaded bundle for the organization.
pub async fn store(
    state: &AppState,
    tenant_id: &str,
    bytes: Bytes,
) -> Result<CodeBundle, ApiError> {
    let summary = bundle::inspect(&bytes, limits(state)).map_err(|e| match e {
        BundleError::TooLarge(_) | BundleError::TooManyFiles(_) => ApiError::PayloadTooLarge(
            format!("the code bundle holds {e}; leave data and outputs out of it (.autodlignore)"),
        ),
        e => ApiError::invalid("code", format!("the code bundle is refused: {e}")),
    })?;
    let id = bundle::id_of(&bytes);
    let hex = bundle::parse_id(&id).unwrap_or_default();
    let (bucket, key) = state.storage.code_key(tenant_id, hex);
    let backend = state.storage.backend.as_ref();
    let size = bytes.len() as u64;
    let found = CodeBundle {
        id: id.clone(),
        size_bytes: size,
        format: Some(summary.format.as_str().to_owned()),
        files: Some(summary.files),
        unpacked_bytes: Some(summary.unpacked_bytes),
        stored: false,
    };
    // Named by its digest, a stored bundle of this size is this one; anything else under the
    // name (an interrupted write) is replaced, and what it held is freed.
    let old = backend.size(&bucket, &key).await?;
    if old == Some(size) {
        return Ok(found);
    }
    let old = old.unwrap_or(0);
    if let Some(room) = usage::room(state.store.as_ref(), tenant_id).await? {
        if size > room.saturating_add(old) {
            return Err(usage::over_quota(room, Some(size)));
        }
    }
    // Taken before it is written, in one statement: bundles uploaded at once never pass the
    // cap together.
    let mut quota = usage::Reservation::new(state.store.as_ref(), tenant_id, old).await?;
    quota.take(size).await?;
    match put_bytes(backend, &bucket, &key, bytes).await {
        Ok(written) => quota.finish(written).await?,
        Err(e) => {
            quota.finish(old).await?;
            return Err(e.into());
        }
    }
    Ok(CodeBundle {
        stored: true,
        ..found
    })
}

/// The organization's bundle with this id, if it has one.
pub async fn find(
    state: &AppState,
    tenant_id: &str,
    id: &str,
) -> Result<Option<CodeBundle>, ApiError> {
    let hex = digest_of("code", id)?;
    let (bucket, key) = state.storage.code_key(tenant_id, hex);
    Ok(state
        .storage
        .backend
        .size(&bucket, &key)
        .await?
        .map(|size_bytes| CodeBundle {
            id: id.to_owned(),
            size_bytes,
            format: None,
            files: None,
            unpacked_bytes: None,
            stored: false,
        }))
}

/// A task may name only a bundle its organization uploaded.
pub async fn check_submitted(state: &AppState, tenant_id: &str, id: &str) -> Result<(), ApiError> {
    match find(state, tenant_id, id).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(ApiError::invalid(
            "code",
            format!(
                "code: your organization has no bundle {id}; upload it first (POST /api/v1/code, \
                 or `workdir` in the Python SDK and CLI, which upload it for you)"
            ),
        )),
        // An outage of object storage does not block submissions; the agent retries the fetch.
        Err(ApiError::StorageUnavailable(m)) => {
            tracing::warn!(error = m, "could not check a code bundle at submission");
            Ok(())
        }
        Err(e) => Err(e),
    }
}
