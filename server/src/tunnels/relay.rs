//! Joining a person's side of a tunnel to the agent's: parking the request, telling the
//! node's agent (here or through the other servers), piping frames and counting traffic, and
//! ending a tunnel whose person may no longer reach the task.

use std::sync::Arc;
use std::time::Duration;

use actix_ws::{Message, MessageStream, Session};
use autodl_common::agent::{TunnelControl, TunnelRequest};
use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::{OpenGuard, Peer, Tunnels, AGENT_ANSWER};
use crate::state::AppState;

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

/// Ends a tunnel (`stop`) once its person may no longer reach into the task, as live log
/// and metric streams end ([`crate::auth::LiveCaller::EVERY`]): a revoked key, a session
/// signed out, a member removed, demoted or disabled. `person`, when given, is told why.
pub async fn watch_access(
    state: Arc<AppState>,
    who: (String, crate::auth::CallerVia),
    (task_id, rank): (String, Option<u32>),
    person: Option<Session>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = state.clock.sleep(crate::auth::LiveCaller::EVERY) => {}
        }
        if crate::usecases::reach::still_reaches(&state, &who.0, &who.1, &task_id, rank).await
            == Some(false)
        {
            tracing::info!(task = %task_id, user = %who.0, "tunnel ended: its person may no longer reach the task");
            if let Some(p) = person {
                refuse(p, "access to the task was revoked; the tunnel is closed").await;
            }
            stop.cancel();
            return;
        }
    }
}
