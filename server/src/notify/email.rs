//! Email: each person chooses the events they want (none until they do), each message waits
//! in an outbox in the database (a restart or a mail server that is down loses nothing), and
//! every server sends what is due through the operator's SMTP server, claiming each message
//! so two never send the same one.

use std::time::Duration;

use lettre::message::header::ContentType;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use serde_json::Value;

use super::Event;
use crate::state::AppState;
use crate::store::{Accounts, EmailRecord, Notifications};

/// Tries of one message before it is given up.
pub const MAX_ATTEMPTS: i64 = 8;
const CLAIM_MS: i64 = 60_000;
const SEND_TIMEOUT: Duration = Duration::from_secs(15);

/// The events a person may ask to be emailed about.
pub const EMAIL_EVENTS: [Event; 6] = [
    Event::TaskFinished,
    Event::TaskFailed,
    Event::TaskIdle,
    Event::TaskIdleStopped,
    Event::NodeLost,
    Event::QuotaNearlyUsed,
];

/// The events `user_id` wants by email (none when they never chose).
pub async fn wanted<S: Notifications + ?Sized>(
    store: &S,
    user_id: &str,
) -> crate::store::StoreResult<Vec<Event>> {
    Ok(store
        .email_events(user_id)
        .await?
        .and_then(|j| serde_json::from_str::<Vec<Event>>(&j).ok())
        .unwrap_or_default())
}

/// An email to send now, as the outbox keeps it until it is sent.
pub fn outgoing(to: String, event: &str, subject: String, body: String, now: i64) -> EmailRecord {
    EmailRecord {
        id: uuid::Uuid::now_v7().to_string(),
        to_addr: to,
        event: event.to_owned(),
        subject,
        body,
        attempts: 0,
        next_at: Some(now),
        sent_at: None,
        last_error: None,
        created_at: now,
    }
}

/// Queues the email for `event` to `user_id` if they asked for it.
pub async fn queue_for<S: Accounts + Notifications + ?Sized>(
    store: &S,
    user_id: &str,
    event: Event,
    data: &Value,
    now: i64,
) {
    let outcome = async {
        if !wanted(store, user_id).await?.contains(&event) {
            return Ok(false);
        }
        let Some(user) = store.user(user_id).await?.filter(|u| !u.disabled) else {
            return Ok(false);
        };
        let (subject, body) = words(event, data);
        store
            .queue_email(&outgoing(user.email, event.as_str(), subject, body, now))
            .await
            .map(|()| true)
    };
    if let Err(e) = outcome.await {
        tracing::warn!(error = %e, event = event.as_str(), "could not queue an email");
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        v => v.to_string(),
    }
}

/// The subject and plain-text body that say `event`.
pub fn words(event: Event, data: &Value) -> (String, String) {
    let name = text(&data["task"]["name"]);
    let id = text(&data["task"]["id"]);
    let task = format!("{name} ({id})");
    let message = text(&data["message"]);
    match event {
        Event::TaskFinished => (
            format!("Task {name} completed"),
            format!(
                "Your task {task} completed (attempt {}).",
                text(&data["attempt"])
            ),
        ),
        Event::TaskFailed => (
            format!("Task {name} {}", text(&data["state"]).replace('_', " ")),
            format!(
                "Your task {task} ended as {} after attempt {} (exit code {}, {}).\n{message}",
                text(&data["state"]),
                text(&data["attempt"]),
                text(&data["exit_code"]),
                text(&data["reason"]),
            ),
        ),
        Event::TaskIdle => (
            format!("Task {name} is idle"),
            format!("Your task {task}: {message}."),
        ),
        Event::TaskIdleStopped => (
            format!("Task {name} was stopped for being idle"),
            format!("Your task {task}: {message}."),
        ),
        Event::NodeLost => (
            format!("Node {} stopped answering", text(&data["node"])),
            format!(
                "Node {} stopped answering; your tasks on it go back to the queue: {}.",
                text(&data["node"]),
                data["requeued_tasks"]
                    .as_array()
                    .map(|a| a.iter().map(text).collect::<Vec<_>>().join(", "))
                    .unwrap_or_default()
            ),
        ),
        Event::QuotaNearlyUsed => {
            let whose = if data["scope"] == "tenant" {
                "your organization's"
            } else {
                "your"
            };
            (
                format!(
                    "{}% of {whose} GPU-hours for {} used",
                    text(&data["percent"]),
                    text(&data["month"])
                ),
                format!(
                    "{} of {} GPU-hours of {whose} monthly quota are used in {}. Tasks that \
                     would go over it wait until the next month or a higher quota.",
                    text(&data["used_gpu_hours"]),
                    text(&data["limit_gpu_hours"]),
                    text(&data["month"]),
                ),
            )
        }
    }
}

/// The operator's mail server, from `AUTODL_SMTP_URL`.
pub struct Mailer {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: lettre::message::Mailbox,
}

impl Mailer {
    pub fn from_settings(s: &crate::config::Settings) -> anyhow::Result<Option<Mailer>> {
        let Some(url) = s.smtp_url.as_deref().filter(|u| !u.is_empty()) else {
            return Ok(None);
        };
        let transport = AsyncSmtpTransport::<Tokio1Executor>::from_url(url)
            .map_err(|e| anyhow::anyhow!("AUTODL_SMTP_URL: {e}"))?
            .timeout(Some(SEND_TIMEOUT))
            .build();
        let from = s
            .mail_from
            .parse()
            .map_err(|e| anyhow::anyhow!("AUTODL_MAIL_FROM {:?}: {e}", s.mail_from))?;
        Ok(Some(Mailer { transport, from }))
    }

    async fn send(&self, e: &EmailRecord) -> Result<(), (bool, String)> {
        let to = e
            .to_addr
            .parse()
            .map_err(|err| (false, format!("bad address: {err}")))?;
        let message = Message::builder()
            .from(self.from.clone())
            .to(to)
            .subject(e.subject.clone())
            .header(ContentType::TEXT_PLAIN)
            .body(e.body.clone())
            .map_err(|err| (false, err.to_string()))?;
        self.transport
            .send(message)
            .await
            .map(|_| ())
            .map_err(|err| (!err.is_permanent(), err.to_string()))
    }
}

/// When to try again after `attempts` failed tries: a minute, doubling, at most 4 h.
pub fn retry_after_ms(attempts: i64) -> i64 {
    let exp = attempts.clamp(1, 20) - 1;
    (60_000i64 << exp).min(4 * 3_600_000)
}

/// Sends what is due; the number sent.
pub async fn send_due(state: &AppState, mailer: &Mailer) -> anyhow::Result<usize> {
    let now = state.clock.now_ms();
    let mut sent = 0;
    for e in state.store.due_emails(now, 50).await? {
        let Some(due_at) = e.next_at else { continue };
        if !state
            .store
            .claim_email(&e.id, due_at, now + CLAIM_MS)
            .await?
        {
            continue;
        }
        let attempts = e.attempts + 1;
        let outcome = mailer.send(&e).await;
        let now = state.clock.now_ms();
        match outcome {
            Ok(()) => {
                state
                    .store
                    .record_email(&e.id, attempts, None, Some(now), None)
                    .await?;
                sent += 1;
            }
            Err((transient, why)) => {
                let next =
                    (transient && attempts < MAX_ATTEMPTS).then(|| now + retry_after_ms(attempts));
                tracing::info!(email = %e.id, attempts, error = %why, "email not sent");
                state
                    .store
                    .record_email(&e.id, attempts, next, None, Some(&why))
                    .await?;
            }
        }
    }
    Ok(sent)
}

/// Sends due email every couple of seconds while the server runs (when it has a mail server).
pub async fn run(state: actix_web::web::Data<AppState>, mailer: Mailer) {
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tick.tick().await;
        if let Err(e) = send_due(&state, &mailer).await {
            tracing::warn!(error = %e, "sending email failed");
        }
    }
}
