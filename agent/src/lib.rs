//! autodl GPU host agent.
//!
//! The agent joins the cluster with a registration token, long-polls the server for work
//! (docs/agent-protocol.md), runs assigned tasks through a [`Runtime`] (Docker or plain
//! processes), ships their output and GPU samples, and stops tasks on request.
//!
//! It is a library first so the server's demo mode and integration tests can run agents in
//! process: build an [`AgentConfig`], pick a [`GpuBackend`] ([`SimulatedBackend`] or
//! [`NvmlBackend`]) and a [`Runtime`] ([`ProcessRuntime`] or [`DockerRuntime`]), then call
//! [`Agent::run`] with a [`CancellationToken`]. See [`Agent`] for an example.

pub mod artifacts;
pub mod backoff;
pub mod beneath;
pub mod client;
pub mod config;
pub mod environments;
pub mod error;
pub mod gpu;
pub mod hostinfo;
pub mod isolation;
pub mod logs;
pub mod metrics;
pub mod outbox;
pub mod ports;
pub mod protocol;
pub mod runtime;
pub mod state;
pub mod tunnel;

mod agent;

pub use agent::Agent;
pub use config::AgentConfig;
pub use error::{AgentError, ClientError, GpuError, RuntimeError};
pub use gpu::{
    gpu_type_from_name, known_gpu_types, parse_simulate_spec, GpuBackend, NvmlBackend,
    SimulatedBackend, SimulatedGpu,
};
pub use isolation::{IsolationChoice, IsolationConfig, IsolationLevel, DEFAULT_PATH};
pub use runtime::{DockerRuntime, ProcessRuntime, Runtime};
pub use tokio_util::sync::CancellationToken;

/// The README's example, compiled with the crate's tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// A test this machine cannot run says that it skipped. CI runs the suite as root
/// (`scripts/test.sh`), so there a skip is a failure: a case CI can run never passes there
/// without running.
#[cfg(test)]
pub(crate) fn skip(reason: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "not skipped under CI, which can run this case: {reason}"
    );
    eprintln!("SKIPPED: {reason}");
}
