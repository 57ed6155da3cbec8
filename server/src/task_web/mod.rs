//! Tasks' web ports (JupyterLab, TensorBoard, a researcher's own dashboard) served to people
//! through this server, each on an origin of its own.
//!
//! A task's page is code of whoever submitted the task. Served under the platform's origin
//! it could call the API as whoever opens it, so it lives at `<port>-<task>.<apps domain>`
//! (`origin`), where the platform's cookies never go. The person crosses over with a ticket
//! traded for a pass cookie of that origin alone (`pass`), and every request is checked again
//! (the sign-in still holds, the person may still reach the task, it still runs) before it
//! is carried through the same tunnels as `autodl port-forward` (`proxy`).

pub mod origin;
pub mod pass;
mod pool;
pub mod proxy;

pub use origin::{AppHost, AppsOrigin};

/// What the apps side of this server holds.
pub struct Apps {
    /// Unset: this server serves no apps (no `apps_url`, and it is not reached locally).
    pub origin: Option<AppsOrigin>,
    pub keys: pass::AppKeys,
    pool: pool::Pool,
}

impl Apps {
    pub fn new(settings: &crate::config::Settings, platform_secret: &[u8]) -> anyhow::Result<Apps> {
        let origin = AppsOrigin::from_settings(settings).map_err(anyhow::Error::msg)?;
        Ok(Apps {
            origin,
            keys: pass::AppKeys::new(platform_secret),
            pool: pool::Pool::default(),
        })
    }

    /// Whether a request's host is on the apps site (every such request is the proxy's).
    pub fn covers(&self, host: &str) -> bool {
        self.origin.as_ref().is_some_and(|o| o.covers(host))
    }

    /// The app a request's host names, when this server serves apps.
    pub fn app_of(&self, host: &str) -> Option<AppHost> {
        self.origin.as_ref()?.app_of(host)
    }
}
