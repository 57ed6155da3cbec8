//! Tunnels from a person into a running task: a shell, a one-shot command, a declared port.
//!
//! Nodes may sit on networks nobody reaches, so nothing dials a node. The person's WebSocket
//! arrives here first and waits; the node's next long poll carries the request; the agent
//! dials out with its own WebSocket (`/agent/tunnels/{id}`), and the two are joined frame for
//! frame. The server reads none of it: it only checks who may open what, and counts traffic
//! so that an idle session is told apart from one somebody works in.

pub mod relay;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_ws::Session;
use autodl_common::agent::TunnelRequest;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;

/// How long a person waits for the node's agent to answer before the tunnel is given up.
pub const AGENT_ANSWER: Duration = Duration::from_secs(20);

/// Largest frame either side may send (the agent reads 32 KiB at a time).
pub const MAX_FRAME: usize = 1 << 20;

/// Where the frames of one side of a tunnel go: a WebSocket (a person's, or the agent's), or
/// this server itself (the apps proxy reads a task's port as a byte stream).
pub enum Peer {
    Socket(Session),
    Local(mpsc::Sender<bytes::Bytes>),
}

impl Peer {
    async fn binary(&mut self, b: bytes::Bytes) -> Result<(), ()> {
        match self {
            Peer::Socket(s) => s.binary(b).await.map_err(|_| ()),
            Peer::Local(tx) => tx.send(b).await.map_err(|_| ()),
        }
    }

    /// Control frames: the server's own reader only learns that the tunnel ends.
    async fn text(&mut self, t: bytestring::ByteString) -> Result<(), ()> {
        match self {
            Peer::Socket(s) => s.text(t).await.map_err(|_| ()),
            Peer::Local(_) => {
                tracing::debug!(said = %t, "a local tunnel's agent side said");
                Ok(())
            }
        }
    }

    async fn close(self, reason: Option<actix_ws::CloseReason>) {
        if let Peer::Socket(s) = self {
            let _ = s.close(reason).await;
        }
    }
}

/// The near side, parked until the agent's side arrives.
struct Waiting {
    node: String,
    task_id: String,
    person: Peer,
    /// Receives the agent's session once it dials in.
    agent: oneshot::Sender<Session>,
    /// Ends the tunnel, both ways (the person lost the right to it).
    stop: CancellationToken,
}

/// A request to tell a node's agent of, until it is too late to answer it.
struct Unsent {
    request: TunnelRequest,
    until: tokio::time::Instant,
}

#[derive(Default)]
struct Inner {
    /// Requests the node's agent has not been told of yet (also those another server holds
    /// the person's side of, in case the agent polls here).
    unsent: HashMap<String, Vec<Unsent>>,
    /// Requests whose agent side has not arrived, by tunnel id.
    waiting: HashMap<String, Waiting>,
    /// When bytes last went through a tunnel into each task, or one opened or closed
    /// (clock milliseconds).
    last_traffic: HashMap<String, i64>,
}

/// Tasks whose traffic is remembered before old entries are dropped (an idle check needs
/// the last half hour or so, not tasks long gone).
const TRAFFIC_ENTRIES: usize = 4096;
const TRAFFIC_KEPT_MS: i64 = 24 * 3_600_000;

impl Inner {
    fn note_traffic(&mut self, task_id: &str, now: i64) {
        self.last_traffic.insert(task_id.to_owned(), now);
        if self.last_traffic.len() > TRAFFIC_ENTRIES {
            self.last_traffic
                .retain(|_, at| now - *at < TRAFFIC_KEPT_MS);
        }
    }
}

/// A parked tunnel its agent dialled in for.
pub struct Answered {
    pub person: Peer,
    pub task_id: String,
    /// Gives the person's side the agent's session.
    pub hand_over: oneshot::Sender<Session>,
    /// Cancelled when the tunnel must end.
    pub stop: CancellationToken,
}

/// The tunnels this server holds.
pub struct Tunnels {
    inner: Mutex<Inner>,
    clock: Arc<dyn Clock>,
}

fn lock(m: &Mutex<Inner>) -> std::sync::MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Notes the tunnel's end as traffic when the person's side ends, however it ends: an idle
/// session is judged from then on.
pub struct OpenGuard {
    tunnels: Arc<Tunnels>,
    task_id: String,
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.tunnels.traffic(&self.task_id);
    }
}

impl Tunnels {
    pub fn new(clock: Arc<dyn Clock>) -> Tunnels {
        Tunnels {
            inner: Mutex::default(),
            clock,
        }
    }

    /// Parks the person's side of `req` (to run on `node`) and returns what the agent's side
    /// will arrive on.
    pub fn request(
        self: &Arc<Self>,
        node: &str,
        req: TunnelRequest,
        person: Peer,
        stop: CancellationToken,
    ) -> (oneshot::Receiver<Session>, OpenGuard) {
        let (tx, rx) = oneshot::channel();
        let now = self.clock.now_ms();
        let mut g = lock(&self.inner);
        g.waiting.insert(
            req.id.clone(),
            Waiting {
                node: node.to_owned(),
                task_id: req.task_id.clone(),
                person,
                agent: tx,
                stop,
            },
        );
        g.note_traffic(&req.task_id, now);
        let guard = OpenGuard {
            tunnels: self.clone(),
            task_id: req.task_id.clone(),
        };
        g.unsent.entry(node.to_owned()).or_default().push(Unsent {
            request: req,
            until: tokio::time::Instant::now() + AGENT_ANSWER,
        });
        (rx, guard)
    }

    /// What another server says it waits for, as [`Signal::Tunnel`] carries it:
    /// `{"node": ..., "request": ...}`. Returns the node to wake.
    ///
    /// [`Signal::Tunnel`]: crate::replicas::Signal::Tunnel
    pub fn offered(&self, wire: &str) -> Option<String> {
        #[derive(serde::Deserialize)]
        struct Offer {
            node: String,
            request: TunnelRequest,
        }
        let o: Offer = serde_json::from_str(wire).ok()?;
        lock(&self.inner)
            .unsent
            .entry(o.node.clone())
            .or_default()
            .push(Unsent {
                request: o.request,
                until: tokio::time::Instant::now() + AGENT_ANSWER,
            });
        Some(o.node)
    }

    /// The wire form of a request for the other servers.
    pub fn offer(node: &str, req: &TunnelRequest) -> String {
        serde_json::json!({"node": node, "request": req}).to_string()
    }

    /// The requests for `node` its agent has not been told of; each is told once.
    pub fn take_for(&self, node: &str) -> Vec<TunnelRequest> {
        let now = tokio::time::Instant::now();
        lock(&self.inner)
            .unsent
            .remove(node)
            .unwrap_or_default()
            .into_iter()
            .filter(|u| u.until > now)
            .map(|u| u.request)
            .collect()
    }

    /// Forgets a request nobody answered.
    pub fn abandon(&self, id: &str) {
        let mut g = lock(&self.inner);
        if let Some(w) = g.waiting.remove(id) {
            if let Some(list) = g.unsent.get_mut(&w.node) {
                list.retain(|u| u.request.id != id);
                if list.is_empty() {
                    g.unsent.remove(&w.node);
                }
            }
        }
    }

    /// The agent of `node` dialled in for tunnel `id`: hands over the person's side. `None`
    /// when there is no such tunnel for this node (gone, or another node's).
    pub fn answer(&self, id: &str, node: &str) -> Option<Answered> {
        let mut g = lock(&self.inner);
        if g.waiting.get(id).is_none_or(|w| w.node != node) {
            return None;
        }
        let w = g.waiting.remove(id)?;
        // Told through another server: not to be told again by this one.
        if let Some(list) = g.unsent.get_mut(node) {
            list.retain(|u| u.request.id != id);
        }
        Some(Answered {
            person: w.person,
            task_id: w.task_id,
            hand_over: w.agent,
            stop: w.stop,
        })
    }

    pub fn traffic(&self, task_id: &str) {
        let now = self.clock.now_ms();
        lock(&self.inner).note_traffic(task_id, now);
    }

    /// Clock milliseconds of the last traffic into the task's tunnels, if any.
    pub fn last_traffic(&self, task_id: &str) -> Option<i64> {
        lock(&self.inner).last_traffic.get(task_id).copied()
    }
}
