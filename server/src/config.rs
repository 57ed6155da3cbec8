//! Layered configuration: built-in defaults, then an optional TOML file, then `AUTODL_*`
//! environment variables, so one binary serves a laptop demo and a production cluster.

use std::net::SocketAddr;
use std::path::PathBuf;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Settings {
    /// Address to listen on; port 0 picks a free port (tests).
    pub listen: SocketAddr,
    pub database_url: String,
    /// Signing secret of session JWTs. Empty means "make one at start" (sessions then end
    /// with the process), which suits a demo but not a cluster of replicas.
    pub jwt_secret: String,
    pub session_ttl_secs: u64,
    /// Set when the server is reached over TLS, so session cookies are marked Secure.
    pub secure_cookies: bool,
    /// Folder with the compiled web app (`pkg/autodl.js`, `pkg/autodl_bg.wasm`, `pkg/autodl.css`).
    pub site_root: PathBuf,
    /// Password checks (logins, password changes) per account from one client address.
    pub login_attempts_per_minute_per_account: u32,
    /// Password checks per client address, whatever the account.
    pub login_attempts_per_minute_per_address: u32,
    /// Sign-ups per client address.
    pub signups_per_minute_per_address: u32,
    /// Bearer token a Prometheus scraper sends to `/metrics`; platform administrators may
    /// read it with their session or key. Unset: administrators only.
    pub metrics_token: Option<String>,
    pub invitation_ttl_days: u32,
    pub db_max_connections: u32,
    /// Milliseconds between scheduling cycles when nothing wakes the scheduler earlier.
    pub schedule_interval_ms: u64,
    /// Seconds between checks of the leader's kept task state against a full read
    /// (`scheduling::active`).
    pub scheduler_state_check_secs: u64,
    /// Over this many active tasks that check reads beside the cycles instead of within one.
    pub scheduler_state_check_beside_over: usize,
    /// Run the scheduler in this process (tests that drive cycles by hand turn it off).
    pub run_scheduler: bool,
    /// Address tasks and agents use to reach this server; defaults to `http://<listen>`.
    pub public_url: Option<String>,
    /// Where tasks' declared web ports (JupyterLab, TensorBoard) are served, each on its own
    /// origin `<port>-<task>.<apps host>`: e.g. `https://apps.example.net` with a wildcard DNS
    /// name and certificate. It must not share a site with `public_url` (another registrable
    /// domain), or a task's page could act as its viewer. Unset: `http://apps.localhost:<port>`
    /// while the server is reached on this machine (browsers send `*.localhost` home), else no
    /// "Open" links.
    pub apps_url: Option<String>,
    /// Let organizations' webhooks reach private, loopback and link-local addresses (a lab
    /// whose receivers sit on its own network; tests). Off: only public addresses.
    pub webhook_allow_internal: bool,
    /// Let organizations' OpenID providers sit on private, loopback and link-local addresses
    /// (and on plain http on this machine). Off: an organization's provider is reached on
    /// public https addresses only; the platform's own provider may always be internal.
    pub sso_allow_internal: bool,
    /// Where email goes out: `smtp://host:25`, `smtp://user:pass@host:587?tls=required`
    /// (STARTTLS) or `smtps://user:pass@host:465`. Unset: the server sends no email and
    /// people cannot ask for it.
    pub smtp_url: Option<String>,
    /// The sender of the platform's email.
    pub mail_from: String,
    /// A sign-up is finished from a link sent to its email address, and answered the same
    /// whether the address has an account or not (no account enumeration). Unset: on when the
    /// server sends email (`smtp_url`).
    pub signup_confirmation: Option<bool>,
    /// A node whose agent has not polled for this long is lost and its tasks requeued.
    pub node_lost_timeout_secs: u64,
    /// Raw GPU samples are kept this long, then folded into hourly rollups.
    pub raw_sample_retention_days: u64,
    pub rollup_retention_days: u64,
    /// Object storage for checkpoints, results and datasets: `file:///folder` (relative
    /// folders work too: `file://data/objects`) or `s3://bucket/prefix`.
    pub storage_url: String,
    /// S3 endpoint for non-AWS services (MinIO, Ceph), e.g. `http://minio:9000`.
    pub storage_endpoint: Option<String>,
    pub storage_region: String,
    /// Path-style addressing (`endpoint/bucket/key`), which MinIO and most self-hosted
    /// services need.
    pub storage_path_style: bool,
    /// Credentials; when unset, `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` are used.
    pub storage_access_key_id: Option<String>,
    pub storage_secret_access_key: Option<String>,
    /// More buckets tenants may name in `s3://` URLs (checkpoint `save_to`, `data_path`),
    /// besides the one in `storage_url`; each tenant sees only its own prefix in each.
    pub storage_buckets: Vec<String>,
    /// Complete checkpoints kept per task when the task does not say (`checkpoint.keep`).
    pub checkpoint_keep: u32,
    /// Largest object a user may upload through `/objects`.
    pub storage_max_object_bytes: u64,
    /// Largest code bundle (a task's `workdir`, packed) one may upload, and the most it may
    /// hold unpacked.
    pub code_max_bytes: u64,
    pub code_max_unpacked_bytes: u64,
    /// `serve --demo`: host folders its sandboxed tasks may read (a Python installation
    /// beside the system's), and dataset roots they may name as `data_path`.
    pub demo_task_paths: Vec<PathBuf>,
    pub demo_data_roots: Vec<PathBuf>,
    /// `serve --demo`: a Python environment (a virtualenv's folder) whose `bin/` comes first
    /// on demo tasks' PATH, so their `python` has the SDK (`scripts/run.sh` makes one).
    pub demo_python: Option<PathBuf>,
    /// The scheduling policy (`[policy]` in the file, `AUTODL_POLICY__PREEMPT_MARGIN=0.2`
    /// and the like in the environment); read at start, so a change applies on restart.
    pub policy: autodl_scheduler::PolicyConfig,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            listen: "127.0.0.1:8080".parse().expect("valid default address"),
            database_url: "sqlite://data/autodl.db".into(),
            jwt_secret: String::new(),
            session_ttl_secs: 12 * 3600,
            secure_cookies: false,
            site_root: PathBuf::from("target/site"),
            login_attempts_per_minute_per_account: 10,
            login_attempts_per_minute_per_address: 60,
            signups_per_minute_per_address: 20,
            metrics_token: None,
            invitation_ttl_days: 7,
            db_max_connections: 16,
            schedule_interval_ms: 2000,
            scheduler_state_check_secs: 300,
            scheduler_state_check_beside_over: 1_000,
            run_scheduler: true,
            public_url: None,
            apps_url: None,
            webhook_allow_internal: false,
            sso_allow_internal: false,
            smtp_url: None,
            mail_from: "autodl <autodl@localhost>".into(),
            signup_confirmation: None,
            node_lost_timeout_secs: 30,
            raw_sample_retention_days: 7,
            rollup_retention_days: 400,
            storage_url: "file://data/objects".into(),
            storage_endpoint: None,
            storage_region: "us-east-1".into(),
            storage_path_style: true,
            storage_access_key_id: None,
            storage_secret_access_key: None,
            storage_buckets: Vec::new(),
            checkpoint_keep: 3,
            storage_max_object_bytes: 100 << 30,
            code_max_bytes: 200 << 20,
            code_max_unpacked_bytes: 2 << 30,
            demo_task_paths: Vec::new(),
            demo_data_roots: Vec::new(),
            demo_python: None,
            policy: autodl_scheduler::PolicyConfig::default(),
        }
    }
}

impl Settings {
    /// Whether sign-ups are finished from an emailed link (see `signup_confirmation`).
    pub fn confirms_signups(&self) -> bool {
        self.signup_confirmation
            .unwrap_or_else(|| self.smtp_url.as_deref().is_some_and(|u| !u.is_empty()))
    }

    pub fn public_url(&self) -> String {
        self.public_url
            .clone()
            .unwrap_or_else(|| format!("http://{}", self.listen))
    }

    /// Reads defaults, then `file` (or `AUTODL_CONFIG`) if it exists, then `AUTODL_*` variables.
    pub fn load(file: Option<PathBuf>) -> Result<Settings, Box<figment::Error>> {
        let file = file.or_else(|| std::env::var_os("AUTODL_CONFIG").map(PathBuf::from));
        let mut fig = Figment::from(Serialized::defaults(Settings::default()));
        if let Some(file) = file {
            fig = fig.merge(Toml::file(file));
        }
        fig.merge(Env::prefixed("AUTODL_").ignore(&["config"]).split("__"))
            .extract()
            .map_err(Box::new)
    }
}
