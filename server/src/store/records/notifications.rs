//! Webhooks and their deliveries, emails.

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct WebhookRecord {
    pub id: String,
    pub tenant_id: String,
    pub url: String,
    pub secret: String,
    /// JSON list of event names.
    pub events: String,
    pub created_by: String,
    pub created_at: i64,
}

/// One event on its way to one webhook, with where it goes.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct DeliveryRecord {
    pub id: String,
    pub webhook_id: String,
    pub url: String,
    pub secret: String,
    pub event: String,
    pub body: String,
    pub attempts: i64,
    pub next_at: Option<i64>,
    pub delivered_at: Option<i64>,
    pub last_error: Option<String>,
    pub created_at: i64,
}

/// An email in the outbox.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EmailRecord {
    pub id: String,
    pub to_addr: String,
    pub event: String,
    pub subject: String,
    pub body: String,
    pub attempts: i64,
    pub next_at: Option<i64>,
    pub sent_at: Option<i64>,
    pub last_error: Option<String>,
    pub created_at: i64,
}
