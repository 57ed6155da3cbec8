//! Several servers on one PostgreSQL database. Any of them takes user requests and agent
//! polls; one (the leader) schedules. What one server does that another must react to at once
//! travels through the database (PostgreSQL LISTEN/NOTIFY), not through a new service:
//! a submission wakes the leader's scheduler, a placement or stop order wakes the long poll of
//! the node's agent wherever it polls, stored logs and samples wake live streams, node changes
//! drop cached node lists. Timers stay as the safety net: a lost notification delays, never
//! loses, anything.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use tokio::sync::mpsc;

use crate::state::AppState;

/// Something the other servers should react to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Signal {
    /// Run a scheduling cycle soon (the leader).
    Wake,
    /// Nodes changed: re-read them.
    Nodes,
    /// New work or a stop order for this node: answer its long poll.
    Node(String),
    /// Logs or samples were stored: live streams read them.
    Data,
    /// Keys, members, roles, quotas or organizations changed: forget what was kept of them.
    Accounts,
    /// Someone waits for a tunnel into a task on this node: tell its agent wherever it polls
    /// (JSON of the node and the request).
    Tunnel(String),
}

impl Signal {
    fn encode(&self) -> String {
        match self {
            Signal::Wake => "wake".into(),
            Signal::Nodes => "nodes".into(),
            Signal::Data => "data".into(),
            Signal::Accounts => "accounts".into(),
            Signal::Node(n) => format!("node:{n}"),
            Signal::Tunnel(t) => format!("tunnel:{t}"),
        }
    }

    fn decode(s: &str) -> Option<Signal> {
        match s {
            "wake" => Some(Signal::Wake),
            "nodes" => Some(Signal::Nodes),
            "data" => Some(Signal::Data),
            "accounts" => Some(Signal::Accounts),
            _ => s
                .strip_prefix("node:")
                .map(|n| Signal::Node(n.to_owned()))
                .or_else(|| {
                    s.strip_prefix("tunnel:")
                        .map(|t| Signal::Tunnel(t.to_owned()))
                }),
        }
    }
}

/// The way out to the other servers; silent until [`connect`] runs (and on SQLite, which one
/// server serves).
#[derive(Debug, Default)]
pub struct Peers(OnceLock<mpsc::UnboundedSender<Signal>>);

impl Peers {
    pub fn tell(&self, signal: Signal) {
        if let Some(tx) = self.0.get() {
            let _ = tx.send(signal);
        }
    }

    /// Other servers may share the work (the store can reach them).
    pub fn connected(&self) -> bool {
        self.0.get().is_some()
    }

    /// `false` when already connected.
    fn connect(&self, tx: mpsc::UnboundedSender<Signal>) -> bool {
        self.0.set(tx).is_ok()
    }
}

/// Starts telling and listening, where the store has other servers to reach. Returns the
/// background tasks (none on SQLite).
pub async fn connect(state: &AppState) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let Some(mut incoming) = state.store.subscribe().await? else {
        return Ok(Vec::new());
    };
    let me = uuid::Uuid::new_v4().simple().to_string();
    let (tx, mut outgoing) = mpsc::unbounded_channel::<Signal>();
    if !state.scheduler.peers().connect(tx.clone()) || !state.agents.peers().connect(tx) {
        anyhow::bail!("this server is already connected to its peers");
    }

    let store = state.store.clone();
    let sender = me.clone();
    let publisher = tokio::spawn(async move {
        while let Some(first) = outgoing.recv().await {
            // Whatever queued up meanwhile goes out once: a burst of submissions is one wake-up.
            let mut batch = BTreeSet::from([first]);
            while let Ok(more) = outgoing.try_recv() {
                batch.insert(more);
            }
            for s in batch {
                if let Err(e) = store.publish(&format!("{sender}|{}", s.encode())).await {
                    tracing::warn!(error = %e, "could not tell the other servers");
                }
            }
        }
    });

    let (scheduler, agents, accounts, tunnels) = (
        state.scheduler.clone(),
        state.agents.clone(),
        state.accounts.clone(),
        state.tunnels.clone(),
    );
    let listener = tokio::spawn(async move {
        while let Some(payload) = incoming.recv().await {
            let Some((from, what)) = payload.split_once('|') else {
                continue;
            };
            if from == me {
                continue;
            }
            match Signal::decode(what) {
                Some(Signal::Wake) => scheduler.wake_here(),
                Some(Signal::Nodes) => scheduler.invalidate_nodes_here(),
                Some(Signal::Node(n)) => agents.notify_here(&n),
                Some(Signal::Data) => agents.data_stored_here(),
                Some(Signal::Accounts) => accounts.clear(),
                Some(Signal::Tunnel(t)) => {
                    if let Some(node) = tunnels.offered(&t) {
                        agents.notify_here(&node);
                    }
                }
                None => tracing::debug!(payload, "unknown signal from another server"),
            }
        }
    });
    Ok(vec![publisher, listener])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_survive_the_wire() {
        for s in [
            Signal::Wake,
            Signal::Nodes,
            Signal::Data,
            Signal::Accounts,
            Signal::Node("gpu-1.rack:3".into()),
            Signal::Tunnel(r#"{"node":"n|1","request":{}}"#.into()),
        ] {
            assert_eq!(Signal::decode(&s.encode()), Some(s));
        }
        assert_eq!(Signal::decode("bogus"), None);
    }
}
