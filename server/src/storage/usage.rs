//! Bytes each organization holds in object storage, against its quota. Uploads through the
//! API, checkpoints and results all count; the count moves when an object is stored, replaced
//! or deleted, so no listing of the bucket is needed to enforce the cap.

use crate::error::ApiError;
use crate::store::{Accounts, Artifacts, QuotaScope, StoreResult};

/// Bytes the organization may still store, `None` without a cap.
pub async fn room<S: Accounts + Artifacts + ?Sized>(
    store: &S,
    tenant_id: &str,
) -> StoreResult<Option<u64>> {
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

/// Bytes of the organization's quota taken for one write as its bytes arrive: reserved in
/// blocks in one statement each, so that concurrent writes of an organization never pass its
/// cap together, and what the last block left unused given back at the end. `credit`: bytes
/// the write frees when it ends (the object it replaces), which it may use meanwhile.
pub struct Reservation<'a, S: Artifacts + ?Sized> {
    store: &'a S,
    tenant_id: String,
    limit: Option<i64>,
    credit: u64,
    /// Reserved in the store so far.
    held: u64,
    /// Taken by the write so far.
    used: u64,
}

/// Bytes reserved at a time: a write of any size costs a statement per block, not per chunk.
const BLOCK: u64 = 8 << 20;

impl<'a, S: Accounts + Artifacts + ?Sized> Reservation<'a, S> {
    pub async fn new(
        store: &'a S,
        tenant_id: &str,
        credit: u64,
    ) -> StoreResult<Reservation<'a, S>> {
        let limit = store
            .quota(QuotaScope::Tenant, tenant_id)
            .await?
            .max_storage_bytes;
        Ok(Reservation {
            store,
            tenant_id: tenant_id.to_owned(),
            limit,
            credit,
            held: 0,
            used: 0,
        })
    }

    /// Takes `n` more bytes; refused (a quota error) when the organization has no room left.
    pub async fn take(&mut self, n: u64) -> Result<(), ApiError> {
        self.used += n;
        let Some(limit) = self.limit else {
            return Ok(());
        };
        let covered = self.credit + self.held;
        if self.used <= covered {
            return Ok(());
        }
        let short = self.used - covered;
        for want in [short.max(BLOCK), short] {
            if self
                .store
                .reserve_storage_bytes(&self.tenant_id, want as i64, limit)
                .await?
            {
                self.held += want;
                return Ok(());
            }
        }
        let used = self.store.storage_bytes(&self.tenant_id).await?;
        Err(over_quota(limit.saturating_sub(used).max(0) as u64, None))
    }

    /// The write ended keeping `kept` bytes (0 when it failed): the count ends up moved by
    /// `kept - credit`, whatever was reserved.
    pub async fn finish(self, kept: u64) -> StoreResult<()> {
        let delta = kept as i64 - self.credit as i64 - self.held as i64;
        if delta != 0 {
            self.store.add_storage_bytes(&self.tenant_id, delta).await?;
        }
        Ok(())
    }
}
