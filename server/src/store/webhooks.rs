//! Organizations' webhooks and the outbox of their deliveries.

use async_trait::async_trait;

use super::*;

#[async_trait]
pub trait Webhooks: Send + Sync {
    async fn add_webhook(&self, w: &WebhookRecord) -> StoreResult<()>;
    async fn webhooks(&self, tenant_id: &str) -> StoreResult<Vec<WebhookRecord>>;
    /// False when the organization has no such webhook.
    async fn delete_webhook(&self, tenant_id: &str, id: &str) -> StoreResult<bool>;
    /// Queues `body` for each of the organization's webhooks that wants `event`; returns how
    /// many deliveries were queued.
    async fn queue_deliveries(
        &self,
        tenant_id: &str,
        event: &str,
        body: &str,
        now: i64,
    ) -> StoreResult<usize>;
    /// Deliveries due at `now`, oldest first.
    async fn due_deliveries(&self, now: i64, limit: i64) -> StoreResult<Vec<DeliveryRecord>>;
    /// Takes a due delivery for this server until `until` (another server may be looking at
    /// the same row): false when someone else took it first.
    async fn claim_delivery(&self, id: &str, due_at: i64, until: i64) -> StoreResult<bool>;
    /// Records an attempt: delivered (`next_at` None and `delivered`), to be tried again at
    /// `next_at`, or given up (both None).
    async fn record_delivery(
        &self,
        id: &str,
        attempts: i64,
        next_at: Option<i64>,
        delivered_at: Option<i64>,
        error: Option<&str>,
    ) -> StoreResult<()>;
    /// A webhook's latest deliveries, newest first.
    async fn deliveries(&self, webhook_id: &str, limit: i64) -> StoreResult<Vec<DeliveryRecord>>;
}
