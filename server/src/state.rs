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
    pub metrics: Arc<crate::prometheus_metrics::Metrics>,
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
    pub apps: crate::task_web::Apps,
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
