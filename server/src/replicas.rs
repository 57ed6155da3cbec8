//! Several servers on one PostgreSQL database. Any of them takes user requests and agent
//! polls; one (the leader) schedules. What one server does that another must react to at once
//! travels through the database (PostgreSQL LISTEN/NOTIFY), not through a new service:
//! a submission wakes the leader's scheduler, a placement or stop order wakes the long poll of
//! the node's agent wherever it polls, stored logs and samples wake live streams, node changes
//! drop cached node lists. Timers stay as the safety net: a lost notification delays, never
//! loses, anything.

use std::sync::OnceLock;

use tokio::sync::mpsc;

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
    pub(crate) fn encode(&self) -> String {
        match self {
            Signal::Wake => "wake".into(),
            Signal::Nodes => "nodes".into(),
            Signal::Data => "data".into(),
            Signal::Accounts => "accounts".into(),
            Signal::Node(n) => format!("node:{n}"),
            Signal::Tunnel(t) => format!("tunnel:{t}"),
        }
    }

    pub(crate) fn decode(s: &str) -> Option<Signal> {
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
    pub(crate) fn connect(&self, tx: mpsc::UnboundedSender<Signal>) -> bool {
        self.0.set(tx).is_ok()
    }
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
