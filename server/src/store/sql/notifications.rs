//! The SQL of [`Notifications`], for both backends.

use super::*;

const EMAIL_COLS: &str = "id, to_addr, event, subject, body, attempts, next_at, sent_at, \
     last_error, created_at";

macro_rules! impl_notifications {
    ($store:ty) => {
        #[async_trait]
        impl Notifications for $store {
            async fn email_events(&self, user_id: &str) -> StoreResult<Option<String>> {
                Ok(sqlx::query_scalar(
                    "SELECT email_events FROM notification_settings WHERE user_id = $1",
                )
                .bind(user_id)
                .fetch_optional(&self.pool)
                .await?)
            }

            async fn set_email_events(&self, user_id: &str, events: &str, now: i64) -> StoreResult<()> {
                sqlx::query(
                    "INSERT INTO notification_settings (user_id, email_events, updated_at)
                     VALUES ($1, $2, $3)
                     ON CONFLICT (user_id) DO UPDATE SET email_events = excluded.email_events,
                         updated_at = excluded.updated_at",
                )
                .bind(user_id)
                .bind(events)
                .bind(now)
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn queue_email(&self, e: &EmailRecord) -> StoreResult<()> {
                sqlx::query(
                    "INSERT INTO email_outbox (id, to_addr, event, subject, body, attempts, next_at, created_at)
                     VALUES ($1, $2, $3, $4, $5, 0, $6, $7)",
                )
                .bind(&e.id)
                .bind(&e.to_addr)
                .bind(&e.event)
                .bind(&e.subject)
                .bind(&e.body)
                .bind(e.next_at)
                .bind(e.created_at)
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn due_emails(&self, now: i64, limit: i64) -> StoreResult<Vec<EmailRecord>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {EMAIL_COLS} FROM email_outbox WHERE next_at IS NOT NULL AND next_at <= $1
                     ORDER BY next_at LIMIT $2"
                ))
                .bind(now)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?)
            }

            async fn claim_email(&self, id: &str, due_at: i64, until: i64) -> StoreResult<bool> {
                let r = sqlx::query("UPDATE email_outbox SET next_at = $3 WHERE id = $1 AND next_at = $2")
                    .bind(id)
                    .bind(due_at)
                    .bind(until)
                    .execute(&self.pool)
                    .await?;
                Ok(r.rows_affected() == 1)
            }

            async fn record_email(
                &self,
                id: &str,
                attempts: i64,
                next_at: Option<i64>,
                sent_at: Option<i64>,
                error: Option<&str>,
            ) -> StoreResult<()> {
                sqlx::query(
                    "UPDATE email_outbox SET attempts = $2, next_at = $3, sent_at = $4, last_error = $5
                     WHERE id = $1",
                )
                .bind(id)
                .bind(attempts)
                .bind(next_at)
                .bind(sent_at)
                .bind(error)
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn emails_to(&self, to_addr: &str, limit: i64) -> StoreResult<Vec<EmailRecord>> {
                Ok(sqlx::query_as(&format!(
                    "SELECT {EMAIL_COLS} FROM email_outbox WHERE to_addr = $1
                     ORDER BY created_at DESC, id DESC LIMIT $2"
                ))
                .bind(to_addr)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?)
            }

            async fn claim_quota_alert(
                &self,
                scope: &str,
                subject_id: &str,
                month: &str,
                level: i64,
                now: i64,
            ) -> StoreResult<bool> {
                let r = sqlx::query(
                    "INSERT INTO quota_alerts (scope, subject_id, month, level, at) VALUES ($1, $2, $3, $4, $5)
                     ON CONFLICT DO NOTHING",
                )
                .bind(scope)
                .bind(subject_id)
                .bind(month)
                .bind(level)
                .bind(now)
                .execute(&self.pool)
                .await?;
                Ok(r.rows_affected() == 1)
            }
        }
    };
}

impl_notifications!(SqliteStore);
impl_notifications!(PostgresStore);
