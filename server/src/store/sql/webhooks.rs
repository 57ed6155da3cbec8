//! The SQL of [`Webhooks`], for both backends.

use super::*;

const DELIVERY_COLS: &str = "d.id, d.webhook_id, w.url, w.secret, d.event, d.body, d.attempts, \
     d.next_at, d.delivered_at, d.last_error, d.created_at";

macro_rules! impl_webhooks {
    ($store:ty) => {
        #[async_trait]
        impl Webhooks for $store {
            async fn add_webhook(&self, w: &WebhookRecord) -> StoreResult<()> {
                sqlx::query(
                    "INSERT INTO webhooks (id, tenant_id, url, secret, events, created_by, created_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7)",
                )
                .bind(&w.id)
                .bind(&w.tenant_id)
                .bind(&w.url)
                .bind(&w.secret)
                .bind(&w.events)
                .bind(&w.created_by)
                .bind(w.created_at)
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn webhooks(&self, tenant_id: &str) -> StoreResult<Vec<WebhookRecord>> {
                Ok(sqlx::query_as(
                    "SELECT id, tenant_id, url, secret, events, created_by, created_at
                     FROM webhooks WHERE tenant_id = $1 ORDER BY created_at, id",
                )
                .bind(tenant_id)
                .fetch_all(&self.pool)
                .await?)
            }

            async fn delete_webhook(&self, tenant_id: &str, id: &str) -> StoreResult<bool> {
                let r = sqlx::query("DELETE FROM webhooks WHERE tenant_id = $1 AND id = $2")
                    .bind(tenant_id)
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                Ok(r.rows_affected() == 1)
            }

            async fn queue_deliveries(
                &self,
                tenant_id: &str,
                event: &str,
                body: &str,
                now: i64,
            ) -> StoreResult<usize> {
                let hooks = self.webhooks(tenant_id).await?;
                let mut tx = self.pool.begin_with(Self::BEGIN_WRITE).await?;
                let mut queued = 0;
                for w in hooks {
                    let wants: Vec<String> = serde_json::from_str(&w.events).unwrap_or_default();
                    if !wants.iter().any(|e| e == event) {
                        continue;
                    }
                    sqlx::query(
                        "INSERT INTO webhook_deliveries (id, webhook_id, event, body, attempts, next_at, created_at)
                         VALUES ($1, $2, $3, $4, 0, $5, $5)",
                    )
                    .bind(uuid::Uuid::now_v7().to_string())
                    .bind(&w.id)
                    .bind(event)
                    .bind(body)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
                    queued += 1;
                }
                tx.commit().await?;
                Ok(queued)
            }

            async fn due_deliveries(&self, now: i64, limit: i64) -> StoreResult<Vec<DeliveryRecord>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {DELIVERY_COLS} FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id
                     WHERE d.next_at IS NOT NULL AND d.next_at <= $1 ORDER BY d.next_at, d.id LIMIT $2"
                ))
                .bind(now)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?)
            }

            async fn claim_delivery(&self, id: &str, due_at: i64, until: i64) -> StoreResult<bool> {
                let r = sqlx::query(
                    "UPDATE webhook_deliveries SET next_at = $1 WHERE id = $2 AND next_at = $3",
                )
                .bind(until)
                .bind(id)
                .bind(due_at)
                .execute(&self.pool)
                .await?;
                Ok(r.rows_affected() == 1)
            }

            async fn record_delivery(
                &self,
                id: &str,
                attempts: i64,
                next_at: Option<i64>,
                delivered_at: Option<i64>,
                error: Option<&str>,
            ) -> StoreResult<()> {
                sqlx::query(
                    "UPDATE webhook_deliveries SET attempts = $1, next_at = $2, delivered_at = $3, last_error = $4
                     WHERE id = $5",
                )
                .bind(attempts)
                .bind(next_at)
                .bind(delivered_at)
                .bind(error)
                .bind(id)
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn deliveries(&self, webhook_id: &str, limit: i64) -> StoreResult<Vec<DeliveryRecord>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {DELIVERY_COLS} FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id
                     WHERE d.webhook_id = $1 ORDER BY d.created_at DESC, d.id DESC LIMIT $2"
                ))
                .bind(webhook_id)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?)
            }
        }
    };
}

impl_webhooks!(SqliteStore);
impl_webhooks!(PostgresStore);
