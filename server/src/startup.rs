//! Builds the application: store, shared state, HTTP server. Binding happens in `build` so
//! tests can ask for port 0 and read the real port before serving.

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::Server;
use actix_web::middleware::{from_fn, Compress, Next};
use actix_web::{
    body::MessageBody, dev::ServiceRequest, dev::ServiceResponse, web, App, HttpMessage, HttpServer,
};
use tokio::sync::mpsc;
use tracing_actix_web::TracingLogger;

use crate::auth::caller::RenewedSession;
use crate::auth::password;
use crate::auth::rate_limit::LoginLimiter;
use crate::auth::session::SessionKeys;
use crate::config::Settings;
use crate::error::{path_error_handler, query_error_handler};
use crate::replicas::Signal;
use crate::scheduling::{Runner, SchedulerHandle};
use crate::state::AppState;
use crate::store::{self, Store};

/// Connections the kernel holds for the server before it accepts them. std's listeners ask
/// for 128: a thousand agents reconnecting at once (after a restart of the server or a network
/// blip) overflow that, and the kernel then drops their handshakes without a word; each such
/// agent waits out TCP's retransmissions, seconds to tens of seconds, and may be judged lost
/// meanwhile. The kernel caps the figure at `net.core.somaxconn`.
const LISTEN_BACKLOG: i32 = 4096;

/// A listening socket as `TcpListener::bind` makes one, with a deeper accept queue.
pub fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // As std does on Unix: a restarted server binds again while old connections linger.
    #[cfg(unix)]
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    Ok(socket.into())
}

pub struct Application {
    port: u16,
    server: Server,
    pub state: web::Data<AppState>,
    /// The scheduler runner and other loops: they end with the server.
    background: Vec<tokio::task::JoinHandle<()>>,
}

impl Application {
    pub async fn build(settings: Settings) -> anyhow::Result<Application> {
        let store = store::open(&settings.database_url, settings.db_max_connections).await?;
        Self::build_with_store(settings, store).await
    }

    pub async fn build_with_store(
        settings: Settings,
        store: Arc<dyn Store>,
    ) -> anyhow::Result<Application> {
        Self::build_with(settings, store, Arc::new(crate::clock::SystemClock)).await
    }

    /// The application on a given store and clock (replays and tests run a manual clock).
    pub async fn build_with(
        mut settings: Settings,
        store: Arc<dyn Store>,
        clock: Arc<dyn crate::clock::Clock>,
    ) -> anyhow::Result<Application> {
        // Bind first: with port 0 the real port is only known now, and tasks are told it.
        let listener = listen(settings.listen)?;
        let port = listener.local_addr()?.port();
        settings.listen.set_port(port);
        let secret = if settings.jwt_secret.is_empty() {
            tracing::warn!("AUTODL_JWT_SECRET is not set: sessions end when the server restarts");
            crate::auth::secrets::random_hex(32)
        } else {
            settings.jwt_secret.clone()
        };
        let storage = crate::storage::Storage::from_settings(&settings)?;
        let mailer = crate::notify::email::Mailer::from_settings(&settings)?;
        tracing::info!(storage = %storage.backend.describe(), bucket = storage.default_bucket, "object storage");
        let (submissions, submission_writer) =
            crate::store::Submissions::submissions(store.clone());
        let (starts, start_writer) = crate::store::Starts::starts(store.clone());
        let (ends, end_writer) = crate::store::Ends::ends(store.clone());
        let state = web::Data::new(AppState {
            storage,
            store,
            submissions,
            starts,
            ends,
            accounts: Default::default(),
            sessions: SessionKeys::new(
                secret.as_bytes(),
                settings.session_ttl_secs,
                settings.secure_cookies,
            ),
            login_limiter: LoginLimiter::new(
                settings.login_attempts_per_minute_per_account,
                settings.login_attempts_per_minute_per_address,
                settings.signups_per_minute_per_address,
            ),
            dummy_hash: password::dummy_hash().await?,
            scheduler: SchedulerHandle::new(settings.policy.clone()),
            agents: Arc::new(crate::agents::AgentHub::default()),
            metrics: Arc::new(crate::prometheus_metrics::Metrics::new()?),
            settings: settings.clone(),
            tunnels: Arc::new(crate::tunnels::Tunnels::new(clock.clone())),
            apps: crate::task_web::Apps::new(&settings, secret.as_bytes())?,
            sso: Arc::new(crate::auth::sso::Oidc::new(
                &settings.public_url(),
                settings.sso_allow_internal,
            )?),
            clock,
        });
        let mut background = connect_peers(&state).await?;
        background.push(tokio::spawn(submission_writer));
        background.push(tokio::spawn(start_writer));
        background.push(tokio::spawn(end_writer));
        if settings.run_scheduler {
            let runner = Runner::new(
                &state,
                Duration::from_millis(settings.schedule_interval_ms.max(50)),
            );
            background.push(tokio::spawn(runner.run()));
        }

        let leptos = crate::site::WebApp::new(&settings, port)?;

        let server_state = state.clone();
        let server = HttpServer::new(move || {
            App::new()
                .wrap(from_fn(crate::security_headers::defaults))
                .wrap(from_fn(renew_session))
                .wrap(Compress::default())
                .wrap(TracingLogger::<crate::request_log::RequestSpans>::new())
                .app_data(server_state.clone())
                .app_data(web::PathConfig::default().error_handler(path_error_handler))
                .app_data(web::QueryConfig::default().error_handler(query_error_handler))
                .configure(crate::routes::configure)
                .configure(|cfg| leptos.configure(cfg))
        })
        // Pages are written in several chunks as they render: without this, Nagle's
        // algorithm holds the last one back until the client's delayed ACK (~40 ms).
        .on_connect(|conn, _| {
            if let Some(tcp) = conn.downcast_ref::<actix_web::rt::net::TcpStream>() {
                let _ = tcp.set_nodelay(true);
            }
        })
        .shutdown_timeout(10)
        .listen(listener)?
        .run();

        let presence_state = state.clone();
        background.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(crate::agents::presence::FLUSH_EVERY);
            loop {
                tick.tick().await;
                let s = &presence_state;
                if let Err(e) = s.agents.presence.flush(s.store.as_ref()).await {
                    tracing::warn!(error = %e, "could not record when nodes were last heard from");
                }
            }
        }));

        background.push(tokio::spawn(crate::notify::webhooks::run(state.clone())));
        if let Some(mailer) = mailer {
            background.push(tokio::spawn(crate::notify::email::run(
                state.clone(),
                mailer,
            )));
        }

        let limiter_state = state.clone();
        background.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(60));
            loop {
                tick.tick().await;
                limiter_state.login_limiter.shrink();
            }
        }));

        Ok(Application {
            port,
            server,
            state,
            background,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// A handle that stops the server (and with it everything it runs) from elsewhere.
    pub fn handle(&self) -> actix_web::dev::ServerHandle {
        self.server.handle()
    }

    /// Serves until SIGINT/SIGTERM (actix handles both and drains open requests) or until
    /// stopped through [`Application::handle`]; the scheduler and other loops stop with it.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let result = self.server.await;
        for b in self.background {
            b.abort();
        }
        result
    }
}

/// Sets a renewed session cookie when the `Caller` extractor (or a page render) refreshed the
/// session.
async fn renew_session(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let page = !req.path().starts_with("/api/") && !req.path().starts_with("/pkg/");
    if page {
        crate::auth::caller::renew_page_session(req.request()).await;
    }
    let mut res = next.call(req).await?;
    let renewed = res.request().extensions().get::<RenewedSession>().cloned();
    if let Some(r) = renewed {
        if let Some(state) = res.request().app_data::<web::Data<AppState>>().cloned() {
            for c in state.sessions.cookies(&r.token, &r.csrf) {
                res.response_mut().add_cookie(&c)?;
            }
        }
    }
    Ok(res)
}

/// Starts telling and listening, where the store has other servers to reach. Returns the
/// background tasks (none on SQLite).
async fn connect_peers(state: &AppState) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
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
    use std::time::Duration;

    /// A burst of agents connecting while the server is busy (nothing accepted yet): every
    /// handshake completes at once instead of waiting on the kernel's retransmissions.
    #[tokio::test]
    async fn a_burst_of_connections_is_queued_not_dropped() {
        let listener = super::listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        // Four times std's queue; a dropped handshake is retried after a second at the earliest.
        let burst = (0..512).map(|_| {
            tokio::time::timeout(
                Duration::from_millis(800),
                tokio::net::TcpStream::connect(addr),
            )
        });
        let results = futures_util::future::join_all(burst).await;
        let waited = results.iter().filter(|r| r.is_err()).count();
        assert_eq!(
            waited, 0,
            "{waited} of 512 connections waited for a retransmission"
        );
        drop(listener);
    }
}
