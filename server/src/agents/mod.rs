//! The server's side of the agents: who a node is (its credential), what it should run
//! (dispatch), and waking its long poll when that changes.

pub mod dispatch;
pub mod node_caller;
pub mod skew;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{watch, Notify};

pub const NODE_CREDENTIAL_PREFIX: &str = "adln_";
pub const REGISTRATION_TOKEN_PREFIX: &str = "adlreg_";

/// Wakes the long poll of a node when work for it appears, so an idle agent gets a placement
/// within a second instead of at its next poll.
pub struct AgentHub {
    waiters: Mutex<HashMap<String, Arc<Notify>>>,
    /// The other servers of the database: an agent may poll any of them.
    peers: crate::replicas::Peers,
    /// Bumped whenever samples, reported metrics or log lines are stored, so live streams
    /// read them at once instead of at their next poll (the chart-delay goal is under 1 s).
    data: watch::Sender<u64>,
}

impl Default for AgentHub {
    fn default() -> Self {
        Self {
            waiters: Mutex::default(),
            peers: crate::replicas::Peers::default(),
            data: watch::Sender::new(0),
        }
    }
}

impl AgentHub {
    pub fn data_stored(&self) {
        self.data_stored_here();
        self.tell(crate::replicas::Signal::Data);
    }

    pub(crate) fn data_stored_here(&self) {
        self.data.send_modify(|v| *v = v.wrapping_add(1));
    }

    pub(crate) fn peers(&self) -> &crate::replicas::Peers {
        &self.peers
    }

    fn tell(&self, signal: crate::replicas::Signal) {
        self.peers.tell(signal);
    }

    /// A receiver that sees every later `data_stored`; streams wait on it with `wait_for_data`.
    pub fn watch_data(&self) -> watch::Receiver<u64> {
        self.data.subscribe()
    }

    pub fn waiter(&self, node: &str) -> Arc<Notify> {
        let mut w = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        w.entry(node.to_owned()).or_default().clone()
    }

    /// Wakes the node's long poll, on whichever server the agent polls.
    pub fn notify(&self, node: &str) {
        self.notify_here(node);
        self.tell(crate::replicas::Signal::Node(node.to_owned()));
    }

    pub(crate) fn notify_here(&self, node: &str) {
        self.waiter(node).notify_one();
    }
}

/// Waits until something new is stored or `max` passes (the poll stays as a safety net for
/// data written by another server replica).
pub async fn wait_for_data(rx: &mut watch::Receiver<u64>, max: std::time::Duration) {
    if let Ok(Err(_)) = tokio::time::timeout(max, rx.changed()).await {
        tokio::time::sleep(max).await;
    }
}
