//! Agent settings with the defaults of the `autodl-agent` binary, set builder-style:
//!
//! ```
//! use autodl_agent::AgentConfig;
//! let config = AgentConfig::new("http://127.0.0.1:8080")
//!     .node_id("demo-a100")
//!     .registration_token("adlreg_...")
//!     .state_dir("/tmp/autodl-demo/demo-a100")
//!     .zone("demo")
//!     .label("pool", "demo");
//! assert_eq!(config.node_id, "demo-a100");
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::hostinfo;
use crate::isolation::IsolationConfig;

pub const DEFAULT_STATE_DIR: &str = "/var/lib/autodl-agent";

#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Base URL of the server, e.g. `http://10.0.0.5:8080`.
    pub server_url: String,
    /// `adlreg_...`; needed only while the node has no credential of its own.
    pub registration_token: Option<String>,
    /// A node credential handed over directly (embedding); it is used as is and not saved.
    pub credential: Option<String>,
    /// Holds the credential file and the per-task folders.
    pub state_dir: PathBuf,
    pub node_id: String,
    pub zone: String,
    pub labels: BTreeMap<String, String>,
    /// Overrides the detected core count (e.g. for simulated nodes).
    pub cpu: Option<u32>,
    /// Overrides the detected RAM in bytes.
    pub memory: Option<u64>,
    pub sample_interval: Duration,
    /// Longest the server may hold a poll; the server's `heartbeat_s` can only shorten it.
    pub poll_wait: Duration,
    /// `None` serves no Prometheus endpoint (the library default: embedders have their own).
    pub metrics_listen: Option<SocketAddr>,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    pub log_flush_interval: Duration,
    pub log_flush_lines: usize,
    /// Lines kept per task while the server is away; the oldest go first.
    pub log_buffer_lines: usize,
    /// GPU samples kept while the server is away; the oldest go first.
    pub metrics_buffer_samples: usize,
    /// SIGTERM-to-SIGKILL time for tasks still running when the agent shuts down.
    pub shutdown_grace: Duration,
    /// How long an ended attempt's results and last checkpoint are kept on the node while
    /// the server or storage cannot take them ([`crate::outbox`]).
    pub keep_results_for: Duration,
    /// Most bytes kept that way; past it the oldest are given up.
    pub keep_results_bytes: u64,
    /// How tasks are kept apart (task uids, sandbox, what tasks may read).
    pub isolation: IsolationConfig,
    /// Host folders tasks may name as `data_path` (read-only); none by default, so no host
    /// path reaches a task unless an operator says so.
    pub data_roots: Vec<PathBuf>,
    /// Where the tasks of other nodes reach this node's tasks (the rendezvous of a gang whose
    /// rank 0 runs here); the host's primary address by default.
    pub advertise_addr: std::net::IpAddr,
}

macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty),* $(,)?) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, value: $ty) -> Self {
                self.$name = value;
                self
            }
        )*
    };
}

impl AgentConfig {
    pub fn new(server_url: impl Into<String>) -> Self {
        AgentConfig {
            server_url: server_url.into(),
            registration_token: None,
            credential: None,
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            node_id: hostinfo::hostname(),
            zone: String::new(),
            labels: BTreeMap::new(),
            cpu: None,
            memory: None,
            sample_interval: Duration::from_secs(5),
            poll_wait: Duration::from_secs(20),
            metrics_listen: None,
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(10),
            log_flush_interval: Duration::from_millis(200),
            log_flush_lines: 500,
            log_buffer_lines: 50_000,
            metrics_buffer_samples: 50_000,
            shutdown_grace: Duration::from_secs(10),
            keep_results_for: Duration::from_secs(3 * 86_400),
            keep_results_bytes: 50 << 30,
            isolation: IsolationConfig::default(),
            data_roots: Vec::new(),
            advertise_addr: hostinfo::primary_address(),
        }
    }

    pub fn data_root(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_roots.push(dir.into());
        self
    }

    pub fn advertise_addr(mut self, addr: std::net::IpAddr) -> Self {
        self.advertise_addr = addr;
        self
    }

    pub fn registration_token(mut self, token: impl Into<String>) -> Self {
        self.registration_token = Some(token.into());
        self
    }

    pub fn credential(mut self, credential: impl Into<String>) -> Self {
        self.credential = Some(credential.into());
        self
    }

    pub fn state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.state_dir = dir.into();
        self
    }

    pub fn node_id(mut self, id: impl Into<String>) -> Self {
        self.node_id = id.into();
        self
    }

    pub fn zone(mut self, zone: impl Into<String>) -> Self {
        self.zone = zone.into();
        self
    }

    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    pub fn cpu(mut self, cores: u32) -> Self {
        self.cpu = Some(cores);
        self
    }

    pub fn memory(mut self, bytes: u64) -> Self {
        self.memory = Some(bytes);
        self
    }

    pub fn metrics_listen(mut self, addr: SocketAddr) -> Self {
        self.metrics_listen = Some(addr);
        self
    }

    setters! {
        sample_interval: Duration,
        poll_wait: Duration,
        backoff_initial: Duration,
        backoff_max: Duration,
        log_flush_interval: Duration,
        log_flush_lines: usize,
        log_buffer_lines: usize,
        metrics_buffer_samples: usize,
        shutdown_grace: Duration,
        keep_results_for: Duration,
        keep_results_bytes: u64,
        isolation: IsolationConfig,
    }
}
