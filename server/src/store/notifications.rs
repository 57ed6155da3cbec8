//! What each person wants to hear of by email, the outbox of that email, and the quota alerts
//! already given.

use async_trait::async_trait;

use super::*;

#[async_trait]
pub trait Notifications: Send + Sync {
    /// The JSON list of events `user_id` wants by email; None when they never chose.
    async fn email_events(&self, user_id: &str) -> StoreResult<Option<String>>;
    async fn set_email_events(&self, user_id: &str, events: &str, now: i64) -> StoreResult<()>;
    async fn queue_email(&self, e: &EmailRecord) -> StoreResult<()>;
    /// Email due at `now`, oldest first.
    async fn due_emails(&self, now: i64, limit: i64) -> StoreResult<Vec<EmailRecord>>;
    /// Takes a due email for this server until `until`: false when another took it first.
    async fn claim_email(&self, id: &str, due_at: i64, until: i64) -> StoreResult<bool>;
    /// Records a try: sent (`sent_at`), to be tried at `next_at`, or given up (both None).
    async fn record_email(
        &self,
        id: &str,
        attempts: i64,
        next_at: Option<i64>,
        sent_at: Option<i64>,
        error: Option<&str>,
    ) -> StoreResult<()>;
    /// The latest email to an address, newest first (what a person was told).
    async fn emails_to(&self, to_addr: &str, limit: i64) -> StoreResult<Vec<EmailRecord>>;
    /// Notes that `subject` passed `level` percent of its quota in `month`: true the first
    /// time only (across servers), so each alert is given once.
    async fn claim_quota_alert(
        &self,
        scope: &str,
        subject_id: &str,
        month: &str,
        level: i64,
        now: i64,
    ) -> StoreResult<bool>;
}
