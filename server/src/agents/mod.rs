//! The server's side of the agents: who a node is (its credential), what it should run
//! (dispatch), and waking its long poll when that changes.

pub mod dispatch;
pub mod node_caller;
pub mod presence;
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
    /// When nodes were last heard from, written in batches.
    pub presence: presence::Presence,
}

impl Default for AgentHub {
    fn default() -> Self {
        Self {
            waiters: Mutex::default(),
            peers: crate::replicas::Peers::default(),
            data: watch::Sender::new(0),
            presence: Default::default(),
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

    /// Every poll of the node wakes, not one: the poll of an agent that died stays parked
    /// until its wait ends, and woken alone it would leave the live agent's poll asleep for its
    /// whole wait. Each poll registers before it looks at the store, so none misses a wake.
    pub(crate) fn notify_here(&self, node: &str) {
        self.waiter(node).notify_waiters();
    }
}

/// Waits until something new is stored or `max` passes (the poll stays as a safety net for
/// data written by another server replica).
pub async fn wait_for_data(rx: &mut watch::Receiver<u64>, max: std::time::Duration) {
    if let Ok(Err(_)) = tokio::time::timeout(max, rx.changed()).await {
        tokio::time::sleep(max).await;
    }
}

/// Whether a poll must record the node as seen: a node is judged lost after
/// `lost_timeout_secs` of silence, so its last-seen time needs to be only that fresh, within a
/// sixth of the timeout (at most 5 s). Writing it on every poll would be one write per agent
/// every few seconds, which on a thousand nodes competes with submissions for the database.
/// A node marked lost is always recorded, so that it comes back at once.
pub fn last_seen_is_stale(
    status: crate::domain::NodeStatus,
    last_seen: Option<i64>,
    now_ms: i64,
    lost_timeout_secs: u64,
) -> bool {
    let fresh_ms = (lost_timeout_secs as i64 * 1000 / 6).min(5_000);
    status == crate::domain::NodeStatus::Lost
        || last_seen.is_none_or(|t| now_ms - t >= fresh_ms || now_ms < t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::NodeStatus;

    #[test]
    fn last_seen_is_written_only_when_it_matters() {
        let ready = NodeStatus::Ready;
        assert!(last_seen_is_stale(ready, None, 1_000_000, 30), "never seen");
        let seen = Some(1_000_000);
        assert!(!last_seen_is_stale(ready, seen, 1_004_999, 30));
        assert!(last_seen_is_stale(ready, seen, 1_005_000, 30));
        // A short timeout asks for fresher times.
        assert!(last_seen_is_stale(ready, seen, 1_001_000, 6));
        // A clock that went back is no reason to trust the old time.
        assert!(last_seen_is_stale(ready, seen, 999_000, 30));
        assert!(last_seen_is_stale(NodeStatus::Lost, seen, 1_000_001, 30));
    }
}
