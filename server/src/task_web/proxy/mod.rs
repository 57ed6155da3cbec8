//! The apps origin's requests: the ticket trade (`/.autodl/enter`), then every request and
//! WebSocket carried to the task's port, without the platform's credentials.

use actix_web::cookie::{time::Duration as CookieDuration, Cookie, SameSite};
use actix_web::http::header::{self, HeaderName, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::protocol::{frame::coding::CloseCode, CloseFrame, Role};
use tokio_tungstenite::tungstenite::Message as TaskMessage;

use super::pass::{AppClaims, Kind, PASS_COOKIE, PASS_SECS};
use super::pool::Body;
use super::AppHost;
use crate::auth::cookies;
use crate::auth::session::{CSRF_COOKIE, SESSION_COOKIE};
use crate::error::ApiError;
use crate::state::AppState;

#[cfg(test)]
mod tests;

/// Where the ticket is traded; no app is sent requests under it.
pub const ENTER_PATH: &str = "/.autodl/enter";

/// Largest WebSocket message carried either way (notebook outputs can be large).
const MAX_WS_MESSAGE: usize = 64 << 20;

/// Marks a response as the app's own: the platform's page policy is not added to it.
#[derive(Clone, Copy)]
pub struct AppResponse;

/// Every request whose host names an app.
pub async fn serve(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Payload,
) -> HttpResponse {
    // The Host header itself, as the router judged it (not an X-Forwarded-Host).
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let Some(app) = state.apps.app_of(&host) else {
        return page(StatusCode::NOT_FOUND, "No such app.");
    };
    let answer = if req.path() == ENTER_PATH {
        enter(&state, &req, &app).await
    } else {
        carry(&state, &req, body, &app).await
    };
    match answer {
        Ok(mut r) => {
            r.extensions_mut().insert(AppResponse);
            r
        }
        Err(e) => {
            let status = actix_web::ResponseError::status_code(&e);
            let mut text = e.to_string();
            if status == StatusCode::UNAUTHORIZED {
                let task = format!("{}/tasks/{}", state.settings.public_url(), app.task_id);
                text = format!("{text}\n\nOpen the app from its task's page: {task}");
            }
            page(status, &text)
        }
    }
}

fn page(status: StatusCode, text: &str) -> HttpResponse {
    HttpResponse::build(status)
        .content_type("text/plain; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .body(text.to_owned())
}

#[derive(serde::Deserialize)]
struct EnterQuery {
    ticket: String,
    next: Option<String>,
}

/// Trades the ticket for the pass cookie and goes on to the page asked for.
async fn enter(
    state: &AppState,
    req: &HttpRequest,
    app: &AppHost,
) -> Result<HttpResponse, ApiError> {
    let q = web::Query::<EnterQuery>::from_query(req.query_string())
        .map_err(|_| ApiError::BadRequest("expected ?ticket=…".into()))?;
    let now = state.clock.now_ms();
    let (pass, claims) = state.apps.keys.trade(&q.ticket, app, now).ok_or_else(|| {
        ApiError::Unauthorized("this link was used already or has expired".into())
    })?;
    admit(state, &claims, app).await?;
    let secure = state.apps.origin.as_ref().is_some_and(|o| o.secure());
    let cookie = Cookie::build(PASS_COOKIE, pass)
        .path("/")
        .http_only(true)
        .same_site(SameSite::Lax)
        .secure(secure)
        .max_age(CookieDuration::seconds(PASS_SECS))
        .finish();
    Ok(HttpResponse::SeeOther()
        .cookie(cookie)
        .insert_header((header::LOCATION, local_path(q.next.as_deref())))
        .insert_header((header::REFERRER_POLICY, "no-referrer"))
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .finish())
}

/// A path on the app's own origin (never another site's URL).
pub fn local_path(next: Option<&str>) -> String {
    match next {
        Some(p)
            if p.starts_with('/')
                && !p.starts_with("//")
                && !p.contains('\\')
                && !p.chars().any(char::is_control) =>
        {
            p.to_owned()
        }
        _ => "/".into(),
    }
}

/// The person the pass is for may still reach the task's port: the sign-in it came from
/// holds, they own the task or manage its organization, it runs, the port is declared.
/// Returns the task and the node its first worker runs on.
async fn admit(
    state: &AppState,
    claims: &AppClaims,
    app: &AppHost,
) -> Result<(crate::store::TaskWithUser, String), ApiError> {
    let via = claims
        .via()
        .ok_or_else(|| ApiError::Unauthorized("this pass is not valid".into()))?;
    let caller = crate::auth::caller::resume(state, &claims.sub, via).await?;
    let (task, node) =
        crate::usecases::reach::target_of(state, &caller, &app.task_id, None).await?;
    crate::usecases::reach::declared(&task, app.port)?;
    Ok((task, node))
}

/// Requests from another origin that could act with the pass: a page of another app (every
/// app shares the apps site) must not drive this one. Navigations to it are fine, as a link.
fn cross_origin(req: &HttpRequest) -> bool {
    let h = |n: &str| req.headers().get(n).and_then(|v| v.to_str().ok());
    match h("sec-fetch-site") {
        None | Some("same-origin") | Some("none") => false,
        Some(_) => {
            let navigation = h("sec-fetch-mode") == Some("navigate");
            let reading = matches!(req.method().as_str(), "GET" | "HEAD");
            !(navigation && reading)
        }
    }
}

async fn carry(
    state: &AppState,
    req: &HttpRequest,
    body: web::Payload,
    app: &AppHost,
) -> Result<HttpResponse, ApiError> {
    if cross_origin(req) {
        return Err(ApiError::Forbidden(
            "a request from another site's page is refused".into(),
        ));
    }
    let now = state.clock.now_ms();
    let claims = req
        .cookie(PASS_COOKIE)
        .and_then(|c| state.apps.keys.verify(c.value(), Kind::Pass, app, now))
        .ok_or_else(|| ApiError::Unauthorized("you have no pass for this app".into()))?;
    let (task, node) = admit(state, &claims, app).await?;
    let upgrade = is_websocket(req);
    let headers = to_app(req, upgrade, |token| is_platform_credential(state, token));
    let mut builder = hyper::Request::builder()
        .method(req.method().as_str())
        .uri(req.uri().path_and_query().map_or("/", |p| p.as_str()));
    for (name, value) in &headers {
        builder = builder.header(name.as_str(), value.as_bytes());
    }
    if upgrade {
        let request = builder
            .body(empty())
            .map_err(|e| ApiError::BadRequest(format!("this request cannot be carried: {e}")))?;
        let watch = (claims.sub.clone(), claims.via());
        return websocket(state, req, body, (&task.task, &node, app), request, watch).await;
    }
    let request = builder
        .body(request_body(req, body))
        .map_err(|e| ApiError::BadRequest(format!("this request cannot be carried: {e}")))?;
    let mut sender = match state.apps.pool.take(&app.task_id, app.port) {
        Some(s) => s,
        None => {
            let stream =
                crate::tunnels::relay::connect_port(state, &task.task, &node, app.port).await?;
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(unreachable_app)?;
            actix_web::rt::spawn(async move {
                let _ = conn.await;
            });
            sender
        }
    };
    let answer = sender
        .send_request(request)
        .await
        .map_err(unreachable_app)?;
    state.apps.pool.put(&app.task_id, app.port, sender);
    Ok(from_app(answer))
}

fn unreachable_app(e: hyper::Error) -> ApiError {
    ApiError::BadGateway(format!("the task's app did not answer: {e}"))
}

fn empty() -> Body {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// The request's body as it arrives (uploads are not held in memory).
fn request_body(req: &HttpRequest, mut payload: web::Payload) -> Body {
    let has_body = req.headers().contains_key(header::TRANSFER_ENCODING)
        || req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0");
    if !has_body {
        return empty();
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(8);
    // The request's payload lives on this worker's thread; a pump hands it over.
    actix_web::rt::spawn(async move {
        while let Some(chunk) = payload.next().await {
            let item = chunk
                .map(Frame::data)
                .map_err(|e| std::io::Error::other(e.to_string()));
            let failed = item.is_err();
            if tx.send(item).await.is_err() || failed {
                break;
            }
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    StreamBody::new(Box::pin(stream)).boxed_unsync()
}

/// The app's answer, streamed, with its cookies held to its own origin.
fn from_app(answer: hyper::Response<hyper::body::Incoming>) -> HttpResponse {
    let (parts, incoming) = answer.into_parts();
    let status = StatusCode::from_u16(parts.status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut out = HttpResponse::build(status);
    for (name, value) in from_app_headers(&parts.headers) {
        out.append_header((name, value));
    }
    let body = http_body_util::BodyStream::new(incoming).filter_map(|frame| async move {
        match frame {
            Ok(f) => f.into_data().ok().map(Ok::<Bytes, std::io::Error>),
            Err(e) => Some(Err(std::io::Error::other(e.to_string()))),
        }
    });
    out.streaming(body)
}

/// Headers that belong to one connection, not to the message (RFC 9110 §7.6.1).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
];

/// Whether a header belongs to the connection: a standard one, or one its `Connection`
/// values name (`connection`: those values, as they came).
fn hop_by_hop<'a>(connection: impl IntoIterator<Item = &'a str>, name: &str) -> bool {
    HOP_BY_HOP.contains(&name)
        || connection
            .into_iter()
            .flat_map(|v| v.split(','))
            .any(|n| n.trim().eq_ignore_ascii_case(name))
}

/// A bearer token that is a platform API key or session: never the app's business.
fn is_platform_credential(state: &AppState, token: &str) -> bool {
    token.starts_with(crate::auth::secrets::API_KEY_PREFIX)
        || state.sessions.verify(token, state.clock.now_ms()).is_some()
}

/// The request's headers as the app gets them: the connection's own removed, the platform's
/// cookies and credentials taken out, where it came from added.
fn to_app(
    req: &HttpRequest,
    websocket: bool,
    platform_credential: impl Fn(&str) -> bool,
) -> Vec<(HeaderName, HeaderValue)> {
    let headers = req.headers();
    let mut out = Vec::new();
    for (name, value) in headers.iter() {
        let keep_for_upgrade = websocket && (name == header::CONNECTION || name == header::UPGRADE);
        let connection = headers
            .get_all(header::CONNECTION)
            .filter_map(|v| v.to_str().ok());
        if (hop_by_hop(connection, name.as_str()) || name == header::UPGRADE) && !keep_for_upgrade {
            continue;
        }
        if name.as_str().starts_with("x-forwarded-") || name == header::FORWARDED {
            continue;
        }
        // This server's WebSocket to the app speaks no compression.
        if name.as_str() == "sec-websocket-extensions" {
            continue;
        }
        if name == header::AUTHORIZATION {
            let token = value.to_str().ok().and_then(crate::auth::bearer::token_of);
            if token.is_some_and(&platform_credential) {
                continue;
            }
        }
        if name == header::COOKIE {
            if let Some(kept) = value.to_str().ok().and_then(app_cookies) {
                out.push((name.clone(), kept));
            }
            continue;
        }
        out.push((name.clone(), value.clone()));
    }
    if websocket {
        out.retain(|(n, _)| n != header::CONNECTION);
        out.push((header::CONNECTION, HeaderValue::from_static("upgrade")));
    }
    let info = req.connection_info();
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    for (name, value) in [
        ("x-forwarded-proto", info.scheme()),
        ("x-forwarded-host", host),
    ] {
        if let Ok(v) = HeaderValue::from_str(value) {
            out.push((HeaderName::from_static(name), v));
        }
    }
    out
}

/// The app's own cookies of a `Cookie` header (the pass and the platform's are not).
fn app_cookies(header: &str) -> Option<HeaderValue> {
    let ours = [PASS_COOKIE, SESSION_COOKIE, CSRF_COOKIE];
    let kept: Vec<&str> = cookies::pieces(header)
        .filter(|c| !cookies::is_one_of(c, &ours))
        .collect();
    if kept.is_empty() {
        return None;
    }
    HeaderValue::from_str(&kept.join("; ")).ok()
}

/// The app's response headers as the person gets them: its cookies stay on its own host (a
/// `Domain` would hand them to every app) and may not replace the pass.
fn from_app_headers(headers: &hyper::HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
    let mut out = Vec::new();
    for (name, value) in headers.iter() {
        let Ok(name) = HeaderName::from_bytes(name.as_str().as_bytes()) else {
            continue;
        };
        let Ok(value) = HeaderValue::from_bytes(value.as_bytes()) else {
            continue;
        };
        let connection = headers
            .get_all(hyper::header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok());
        if hop_by_hop(connection, name.as_str()) || name == header::UPGRADE {
            continue;
        }
        if name == header::SET_COOKIE {
            let Some(kept) = value
                .to_str()
                .ok()
                .and_then(|v| Cookie::parse(v.to_owned()).ok())
                .filter(|c| ![PASS_COOKIE, SESSION_COOKIE, CSRF_COOKIE].contains(&c.name()))
                .and_then(|mut c| {
                    c.unset_domain();
                    HeaderValue::from_str(&c.to_string()).ok()
                })
            else {
                continue;
            };
            out.push((name, kept));
            continue;
        }
        out.push((name, value));
    }
    out
}

fn is_websocket(req: &HttpRequest) -> bool {
    req.headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// A WebSocket: the app's handshake first (its answer, its chosen subprotocol), then the
/// person's, then messages both ways until either side closes.
///
/// The relay ends once the person the pass is for may no longer reach the task (a revoked
/// key, a signed-out session, a removed member), as tunnels do.
async fn websocket(
    state: &AppState,
    req: &HttpRequest,
    body: web::Payload,
    (task, node, app): (&crate::store::TaskRecord, &str, &AppHost),
    request: hyper::Request<Body>,
    (user_id, via): (String, Option<crate::auth::CallerVia>),
) -> Result<HttpResponse, ApiError> {
    let stream = crate::tunnels::relay::connect_port(state, task, node, app.port).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(unreachable_app)?;
    actix_web::rt::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let answer = sender
        .send_request(request)
        .await
        .map_err(unreachable_app)?;
    if answer.status() != hyper::StatusCode::SWITCHING_PROTOCOLS {
        return Ok(from_app(answer));
    }
    let protocol = answer
        .headers()
        .get("sec-websocket-protocol")
        .and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok());
    let upgraded = hyper::upgrade::on(answer)
        .await
        .map_err(|e| ApiError::BadGateway(format!("the task's app did not switch: {e}")))?;
    let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(MAX_WS_MESSAGE))
        .max_frame_size(Some(MAX_WS_MESSAGE));
    let to_app = tokio_tungstenite::WebSocketStream::from_raw_socket(
        TokioIo::new(upgraded),
        Role::Client,
        Some(config),
    )
    .await;
    let (mut response, person, messages) = actix_ws::handle(req, body)
        .map_err(|e| ApiError::BadRequest(format!("this WebSocket handshake is not valid: {e}")))?;
    if let Some(p) = protocol {
        response
            .headers_mut()
            .insert(HeaderName::from_static("sec-websocket-protocol"), p);
    }
    let messages = messages
        .max_frame_size(MAX_WS_MESSAGE)
        .aggregate_continuations()
        .max_continuation_size(MAX_WS_MESSAGE);
    let stop = tokio_util::sync::CancellationToken::new();
    if let (Some(via), Some(data)) = (via, req.app_data::<web::Data<AppState>>()) {
        actix_web::rt::spawn(crate::tunnels::relay::watch_access(
            data.clone().into_inner(),
            (user_id, via),
            (app.task_id.clone(), None),
            None,
            stop.clone(),
        ));
    }
    actix_web::rt::spawn(relay(messages, person, to_app, stop));
    Ok(response)
}

async fn relay<S>(
    mut from_person: actix_ws::AggregatedMessageStream,
    mut person: actix_ws::Session,
    to_app: tokio_tungstenite::WebSocketStream<S>,
    stop: tokio_util::sync::CancellationToken,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use actix_ws::AggregatedMessage as P;
    // Traffic into the task is noted by the port tunnel underneath. However it ends, the
    // watch on its person ends with it.
    let _watch = stop.clone().drop_guard();
    let (mut app_sink, mut from_app) = to_app.split();
    loop {
        tokio::select! {
            () = stop.cancelled() => {
                let _ = app_sink.send(TaskMessage::Close(None)).await;
                break;
            }
            m = from_person.next() => {
                let out = match m {
                    Some(Ok(P::Text(t))) => TaskMessage::text(t.to_string()),
                    Some(Ok(P::Binary(b))) => TaskMessage::binary(b),
                    Some(Ok(P::Ping(b))) => TaskMessage::Ping(b),
                    Some(Ok(P::Pong(b))) => TaskMessage::Pong(b),
                    Some(Ok(P::Close(reason))) => {
                        let frame = reason.map(|r| CloseFrame {
                            code: CloseCode::from(u16::from(r.code)),
                            reason: r.description.unwrap_or_default().into(),
                        });
                        let _ = app_sink.send(TaskMessage::Close(frame)).await;
                        break;
                    }
                    None | Some(Err(_)) => {
                        let _ = app_sink.send(TaskMessage::Close(None)).await;
                        break;
                    }
                };
                if app_sink.send(out).await.is_err() {
                    break;
                }
            }
            m = from_app.next() => {
                let sent = match m {
                    Some(Ok(TaskMessage::Text(t))) => person.text(t.as_str().to_owned()).await,
                    Some(Ok(TaskMessage::Binary(b))) => person.binary(b).await,
                    Some(Ok(TaskMessage::Ping(b))) => person.ping(&b).await,
                    Some(Ok(TaskMessage::Pong(b))) => person.pong(&b).await,
                    Some(Ok(TaskMessage::Frame(_))) => Ok(()),
                    Some(Ok(TaskMessage::Close(frame))) => {
                        let reason = frame.map(|f| actix_ws::CloseReason {
                            code: u16::from(f.code).into(),
                            description: Some(f.reason.as_str().to_owned()),
                        });
                        let _ = person.close(reason).await;
                        return;
                    }
                    None | Some(Err(_)) => {
                        let _ = person.close(None).await;
                        return;
                    }
                };
                if sent.is_err() {
                    break;
                }
            }
        }
    }
    let _ = person.close(None).await;
}
