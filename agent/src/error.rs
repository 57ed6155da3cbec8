//! Error types of the library. `main.rs` wraps them in `anyhow`; embedders match on them.

use std::path::PathBuf;

/// Why [`crate::Agent::run`] gave up. Transient trouble (server away, a task failing) never
/// ends the agent; only conditions that need a person do.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("state directory {path}: {source}")]
    State {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The server refused the registration token or the node credential, and there is no
    /// token left to (re)register with.
    #[error("the server refused this node: {0}")]
    Rejected(String),
    #[error("GPU backend: {0}")]
    Gpu(#[from] GpuError),
    #[error("metrics listener on {addr}: {source}")]
    MetricsListen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("HTTP client: {0}")]
    Http(String),
}

/// A failed call to the server.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No answer (connection refused, reset, timeout): the server is away.
    #[error("server unreachable: {0}")]
    Transport(#[from] reqwest::Error),
    #[error("server answered {status}: {body}")]
    Status { status: u16, body: String },
    /// Reading or writing the local side of a transfer failed; retrying will not help.
    #[error("{0}")]
    Local(String),
}

impl ClientError {
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Status { status, .. } => Some(*status),
            ClientError::Transport(_) | ClientError::Local(_) => None,
        }
    }

    /// 409: the report is about an attempt that is no longer current; retrying cannot help.
    pub fn is_conflict(&self) -> bool {
        self.status() == Some(409)
    }

    /// 413: the body is over the server's limit; a smaller one may pass.
    pub fn is_too_large(&self) -> bool {
        self.status() == Some(413)
    }

    pub fn is_unauthorized(&self) -> bool {
        matches!(self.status(), Some(401 | 403))
    }

    /// Worth retrying later: the server is away, overloaded, restarting or not yet serving the
    /// agent API (404 while an older server version runs during an upgrade).
    pub fn is_transient(&self) -> bool {
        if matches!(self, ClientError::Local(_)) {
            return false;
        }
        match self.status() {
            None => true,
            Some(s) => s >= 500 || s == 404 || s == 408 || s == 429,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("NVML: {0}")]
    Nvml(String),
    #[error("{0}")]
    Spec(String),
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("task has no command to run")]
    NoCommand,
    #[error("could not start the process: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("docker: {0}")]
    Docker(#[from] bollard::errors::Error),
    #[error("terminal: {0}")]
    Terminal(#[from] pty_process::Error),
    #[error("{0}")]
    Unavailable(String),
}
