//! Tunnels from a person into a running task: a shell, a one-shot command, a declared port.
//!
//! Nodes may sit on networks nobody reaches, so nothing dials a node. The person's WebSocket
//! arrives here first and waits; the node's next long poll carries the request; the agent
//! dials out with its own WebSocket (`/agent/tunnels/{id}`), and the two are joined frame for
//! frame. The server reads none of it: it only checks who may open what, and counts traffic
//! so that an idle session is told apart from one somebody works in.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_ws::{Message, MessageStream, Session};
use autodl_common::agent::{TunnelControl, TunnelRequest};
use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::state::AppState;

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

/// A request for a tunnel to `target` in the task's current attempt. With other servers on
/// the database the agent may poll any of them, so it names this server to dial.
pub fn request_for(
    state: &AppState,
    task: &crate::store::TaskRecord,
    target: autodl_common::agent::TunnelTarget,
) -> TunnelRequest {
    TunnelRequest {
        id: uuid::Uuid::new_v4().to_string(),
        task_id: task.id.clone(),
        attempt: task.attempts.clamp(0, i64::from(u32::MAX)) as u32,
        target,
        server: state
            .agents
            .peers()
            .connected()
            .then(|| state.settings.public_url()),
    }
}

/// Parks `near` for `request` on `node` and tells the node's agent, here and through the
/// other servers; returns what the agent's side will arrive on.
pub fn ask(
    state: &AppState,
    node: &str,
    request: TunnelRequest,
    near: Peer,
    stop: CancellationToken,
) -> (oneshot::Receiver<Session>, OpenGuard) {
    let offer = (request.server.is_some()).then(|| Tunnels::offer(node, &request));
    let parked = state.tunnels.request(node, request, near, stop);
    if let Some(offer) = offer {
        state
            .agents
            .peers()
            .tell(crate::replicas::Signal::Tunnel(offer));
    }
    state.agents.notify(node);
    parked
}

/// A byte stream to a task's port for this server's own use (the apps proxy): what is
/// written reaches the port, what the task answers is read, and the end of either is the end.
pub async fn connect_port(
    state: &AppState,
    task: &crate::store::TaskRecord,
    node: &str,
    port: u16,
) -> Result<tokio::io::DuplexStream, crate::error::ApiError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (tx, mut from_agent) = mpsc::channel::<bytes::Bytes>(16);
    let request = request_for(
        state,
        task,
        autodl_common::agent::TunnelTarget::Port { port },
    );
    let id = request.id.clone();
    // Each request through the apps proxy is admitted on its own; a WebSocket relayed on top
    // ends the stream when its person loses access (see the proxy).
    let (agent, guard) = ask(
        state,
        node,
        request,
        Peer::Local(tx),
        CancellationToken::new(),
    );
    let mut agent = match tokio::time::timeout(AGENT_ANSWER, agent).await {
        Ok(Ok(a)) => a,
        _ => {
            state.tunnels.abandon(&id);
            return Err(crate::error::ApiError::BadGateway(
                "the task's node did not answer; try again".into(),
            ));
        }
    };
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    let (mut read, mut write) = tokio::io::split(theirs);
    let mut traffic = TrafficNote::new(state.tunnels.clone(), task.id.clone());
    actix_web::rt::spawn(async move {
        let _guard = guard;
        let up = async {
            let mut buf = vec![0u8; 32 * 1024];
            loop {
                let n = match read.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if agent
                    .binary(bytes::Bytes::copy_from_slice(&buf[..n]))
                    .await
                    .is_err()
                {
                    break;
                }
                traffic.note();
            }
            let _ = agent.close(None).await;
        };
        let down = async {
            while let Some(b) = from_agent.recv().await {
                if write.write_all(&b).await.is_err() {
                    break;
                }
            }
            let _ = write.shutdown().await;
        };
        futures_util::join!(up, down);
    });
    Ok(ours)
}

/// Says why a tunnel could not be served, in the exec protocol's own words, and closes it.
pub async fn refuse(mut person: Session, message: &str) {
    let c = TunnelControl::Error {
        message: message.to_owned(),
    };
    if let Ok(text) = serde_json::to_string(&c) {
        let _ = person.text(text).await;
    }
    let _ = person.close(None).await;
}

/// Notes traffic into a task at most once a second: the idle check needs minutes, not bytes.
struct TrafficNote {
    tunnels: Arc<Tunnels>,
    task_id: String,
    last: Option<tokio::time::Instant>,
}

impl TrafficNote {
    fn new(tunnels: Arc<Tunnels>, task_id: String) -> TrafficNote {
        TrafficNote {
            tunnels,
            task_id,
            last: None,
        }
    }

    fn note(&mut self) {
        if self
            .last
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
        {
            self.last = Some(tokio::time::Instant::now());
            self.tunnels.traffic(&self.task_id);
        }
    }
}

/// Copies every frame of `from` to `to` until either side ends or `stop` is cancelled, then
/// closes `to`. `own` is the session of `from`'s own connection, which answers its pings.
pub async fn pipe(
    mut from: MessageStream,
    mut own: Session,
    mut to: Peer,
    tunnels: Arc<Tunnels>,
    task_id: String,
    stop: CancellationToken,
) {
    let mut traffic = TrafficNote::new(tunnels, task_id.clone());
    loop {
        let msg = tokio::select! {
            () = stop.cancelled() => break,
            msg = from.next() => match msg {
                Some(m) => m,
                None => break,
            },
        };
        let msg = match msg {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(task = %task_id, error = %e, "tunnel stream failed");
                break;
            }
        };
        let sent = match msg {
            Message::Binary(b) => to.binary(b).await,
            Message::Text(t) => to.text(t).await,
            Message::Ping(p) => {
                let _ = own.pong(&p).await;
                Ok(())
            }
            Message::Close(reason) => {
                stop.cancel();
                to.close(reason).await;
                let _ = own.close(None).await;
                return;
            }
            _ => Ok(()),
        };
        if sent.is_err() {
            tracing::debug!(task = %task_id, "tunnel peer gone");
            break;
        }
        traffic.note();
    }
    stop.cancel();
    tracing::debug!(task = %task_id, "tunnel stream ended");
    to.close(None).await;
    let _ = own.close(None).await;
}
