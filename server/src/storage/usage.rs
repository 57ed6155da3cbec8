//! Bytes each organization holds in object storage, against its quota. Uploads through the
//! API, checkpoints and results all count; the count moves when an object is stored, replaced
//! or deleted, so no listing of the bucket is needed to enforce the cap.

use crate::error::ApiError;
use crate::store::{QuotaScope, Store, StoreResult};

/// Bytes the organization may still store, `None` without a cap.
pub async fn room(store: &dyn Store, tenant_id: &str) -> StoreResult<Option<u64>> {
    let Some(limit) = store
        .quota(QuotaScope::Tenant, tenant_id)
        .await?
        .max_storage_bytes
    else {
        return Ok(None);
    };
    let used = store.storage_bytes(tenant_id).await?;
    Ok(Some(limit.saturating_sub(used).max(0) as u64))
}

pub fn over_quota(room: u64, wanted: Option<u64>) -> ApiError {
    ApiError::Quota(match wanted {
        Some(w) => format!(
            "your organization's storage quota leaves {room} bytes; this needs {w} (delete objects or ask an administrator for more)"
        ),
        None => format!(
            "your organization's storage quota is used up ({room} bytes left); delete objects or ask an administrator for more"
        ),
    })
}
