//! The audit trail's records and the head of their hash chain.

use async_trait::async_trait;

use super::*;

#[async_trait]
pub trait AuditTrail: Send + Sync {
    /// Appends a record at `at` after the chain's head (one append at a time, across
    /// replicas too) and returns it as stored.
    async fn append_audit(&self, r: &NewAuditRecord, at: i64) -> StoreResult<AuditRecord>;
    /// Records matching `filter`, newest first.
    async fn audit_records(
        &self,
        filter: &AuditFilter,
        limit: i64,
    ) -> StoreResult<Vec<AuditRecord>>;
    /// The chain from record `after + 1` on, oldest first (for verifying it).
    async fn audit_chain(&self, after: i64, limit: i64) -> StoreResult<Vec<AuditRecord>>;
    /// The last record's number and hash, as the head remembers them.
    async fn audit_head(&self) -> StoreResult<(i64, String)>;
}
