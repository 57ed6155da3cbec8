use std::sync::Arc;

use crate::auth::rate_limit::LoginLimiter;
use crate::auth::session::SessionKeys;
use crate::config::Settings;
use crate::scheduling::SchedulerHandle;
use crate::store::Store;

/// What every handler shares; built once in `Application::build`.
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub sessions: SessionKeys,
    pub login_limiter: LoginLimiter,
    pub settings: Settings,
    /// See `auth::password::dummy_hash`.
    pub dummy_hash: String,
    pub scheduler: Arc<SchedulerHandle>,
    pub agents: Arc<crate::agents::AgentHub>,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub storage: crate::storage::Storage,
    /// Every decision by time asks this clock (a manual one in replays and tests).
    pub clock: Arc<dyn crate::clock::Clock>,
    /// Callers' keys, quotas and organizations, kept for a moment (see `auth::cache`).
    pub accounts: Arc<crate::auth::cache::AccountCache>,
    /// New tasks, stored many to a transaction.
    pub submissions: crate::store::Submissions,
    pub starts: crate::store::Starts,
    pub ends: crate::store::Ends,
    /// Shells, commands and ports people have open into tasks.
    pub tunnels: Arc<crate::tunnels::Tunnels>,
    /// Tasks' web ports on origins of their own.
    pub apps: crate::apps::Apps,
    /// OpenID providers' documents and keys, and the clients that reach them.
    pub sso: Arc<crate::auth::sso::Oidc>,
}

impl AppState {
    /// Keys, members, roles, quotas or organizations changed: no server may go on answering
    /// from what it kept of them.
    pub fn accounts_changed(&self) {
        self.accounts.clear();
        self.scheduler
            .peers()
            .tell(crate::replicas::Signal::Accounts);
    }
}

/// RFC 3339 text of a millisecond timestamp, as every API answer shows times: always three
/// fraction digits in UTC, so the text sorts as the time does (clients compare it as text).
pub fn rfc3339(ms: i64) -> String {
    const FORMAT: &[time::format_description::FormatItem<'static>] = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .ok()
        .and_then(|t| t.format(FORMAT).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::rfc3339;

    #[test]
    fn times_read_as_text_sort_as_the_times_do() {
        assert_eq!(rfc3339(1_796_315_353_830), "2026-12-03T16:29:13.830Z");
        assert_eq!(rfc3339(1_796_315_353_000), "2026-12-03T16:29:13.000Z");
        let times: Vec<i64> = (0..2_000).map(|i| 1_796_316_553_000 + i * 7).collect();
        let texts: Vec<String> = times.iter().map(|&t| rfc3339(t)).collect();
        assert!(texts.windows(2).all(|w| w[0] < w[1]), "{texts:?}");
    }
}
