//! WebSocket tunnels into running tasks (see `crate::tunnels`): `shell`, `exec` and `ports`
//! for people, `/agent/tunnels/{id}` for the node's agent dialling back.

use actix_web::{get, web, HttpRequest, HttpResponse};
use autodl_common::agent::TunnelTarget;
use autodl_common::api::ErrorBody;
use serde::Deserialize;
use utoipa::IntoParams;

use crate::agents::node_caller::NodeCaller;
use crate::audit::{self, Action, Actor};
use crate::auth::{Caller, CallerVia};
use crate::error::ApiError;
use crate::state::AppState;
use crate::usecases::reach::{self, declared, target_of};

use crate::tunnels::relay::{pipe, refuse};
use crate::tunnels::{Peer, AGENT_ANSWER, MAX_FRAME};
use tokio_util::sync::CancellationToken;

/// Most arguments and bytes a one-shot command may have.
const MAX_ARGS: usize = 256;
const MAX_COMMAND_BYTES: usize = 16 * 1024;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ShellQuery {
    /// Terminal width in characters (default 80).
    cols: Option<u16>,
    /// Terminal height in lines (default 24).
    rows: Option<u16>,
    /// Which worker of a multi-node task (default 0).
    rank: Option<u32>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ExecQuery {
    /// The command as a JSON array of strings, e.g. `["nvidia-smi", "-L"]`.
    command: String,
    /// Give the command a terminal (stdout and stderr then arrive as one).
    tty: Option<bool>,
    cols: Option<u16>,
    rows: Option<u16>,
    rank: Option<u32>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PortQuery {
    rank: Option<u32>,
}

fn terminal_size(cols: Option<u16>, rows: Option<u16>) -> Result<(u16, u16), ApiError> {
    let cols = cols.unwrap_or(80);
    let rows = rows.unwrap_or(24);
    if !(1..=1000).contains(&cols) {
        return Err(ApiError::invalid("cols", "cols is 1 to 1000 (e.g. 80)"));
    }
    if !(1..=1000).contains(&rows) {
        return Err(ApiError::invalid("rows", "rows is 1 to 1000 (e.g. 24)"));
    }
    Ok((cols, rows))
}

fn parse_command(raw: &str) -> Result<Vec<String>, ApiError> {
    let bad = || {
        ApiError::invalid(
            "command",
            "command is a JSON array of strings, e.g. [\"nvidia-smi\", \"-L\"]",
        )
    };
    if raw.len() > MAX_COMMAND_BYTES {
        return Err(ApiError::invalid(
            "command",
            format!("command is at most {MAX_COMMAND_BYTES} bytes"),
        ));
    }
    let command: Vec<String> = serde_json::from_str(raw).map_err(|_| bad())?;
    if command.is_empty() || command[0].is_empty() {
        return Err(bad());
    }
    if command.len() > MAX_ARGS || command.iter().any(|a| a.contains('\0')) {
        return Err(ApiError::invalid(
            "command",
            format!("command has at most {MAX_ARGS} arguments and no NUL characters"),
        ));
    }
    Ok(command)
}

/// A browser's WebSocket carries the session cookie to any site that asks; one opened from
/// another site's page is refused (the cookie is `SameSite=Lax`, this is the second lock).
fn same_origin(req: &HttpRequest, caller: &Caller) -> Result<(), ApiError> {
    let from_cookie = matches!(
        caller.via,
        CallerVia::Session {
            from_cookie: true,
            ..
        }
    );
    let Some(origin) = req.headers().get("origin").and_then(|o| o.to_str().ok()) else {
        return Ok(());
    };
    let host = req.connection_info().host().to_owned();
    let origin_host = origin.split("://").nth(1).unwrap_or(origin);
    if from_cookie && origin_host != host {
        return Err(ApiError::Forbidden(
            "a tunnel opened from another site's page is refused".into(),
        ));
    }
    Ok(())
}

/// What a person asked to reach, and how the task's timeline will say it.
struct Reach {
    task: crate::store::TaskWithUser,
    node: String,
    target: TunnelTarget,
    /// The event's kind and what follows the person's email in it.
    event: (&'static str, String),
    /// The worker reached.
    rank: Option<u32>,
}

/// Opens the WebSocket and parks it until the node's agent answers; records who reached in.
async fn open(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Payload,
    caller: Caller,
    reach: Reach,
) -> Result<HttpResponse, ApiError> {
    let Reach {
        task,
        node,
        target,
        event,
        rank,
    } = reach;
    same_origin(&req, &caller)?;
    if event.0 != "exec" {
        reach::hold_like_a_session(&state, &task).await?;
    }
    let (response, person, stream) = actix_ws::handle(&req, body).map_err(|e| {
        ApiError::invalid(
            "upgrade",
            format!("this endpoint is a WebSocket (send the Upgrade: websocket headers): {e}"),
        )
    })?;
    let stream = stream.max_frame_size(MAX_FRAME);
    let request = crate::tunnels::relay::request_for(&state, &task.task, target);
    let id = request.id.clone();
    let task_id = task.task.id.clone();
    reach::reached(
        &state,
        &task_id,
        event.0,
        &format!("{} {}", caller.user.email, event.1),
    )
    .await?;
    let action = if event.0 == "port_forward" {
        Action::TaskPortOpened
    } else {
        Action::TaskShellOpened
    };
    audit::record(
        &state,
        Actor::of(&caller, &req),
        Some(&task.task.tenant_id),
        action,
        &format!("task {task_id}"),
        serde_json::json!({ "kind": event.0, "what": event.1, "owner": task.user_email, "node": node }),
    )
    .await;
    tracing::info!(task = %task_id, node = %node, user = %caller.user.email, kind = event.0, "tunnel requested");
    let tunnels = state.tunnels.clone();
    let stop = CancellationToken::new();
    let (agent, guard) = crate::tunnels::relay::ask(
        &state,
        &node,
        request,
        Peer::Socket(person.clone()),
        stop.clone(),
    );
    actix_web::rt::spawn(crate::tunnels::relay::watch_access(
        state.clone().into_inner(),
        (caller.user.id.clone(), caller.via.clone()),
        (task_id.clone(), rank),
        Some(person.clone()),
        stop.clone(),
    ));
    actix_web::rt::spawn(async move {
        let _guard = guard;
        match tokio::time::timeout(AGENT_ANSWER, agent).await {
            Ok(Ok(far)) => pipe(stream, person, Peer::Socket(far), tunnels, task_id, stop).await,
            _ => {
                stop.cancel();
                tunnels.abandon(&id);
                refuse(person, "the task's node did not answer; try again").await;
            }
        }
    });
    Ok(response)
}

/// An interactive shell in the task's environment (WebSocket; binary frames carry a channel
/// byte, text frames resize and end it: see the agent protocol).
#[utoipa::path(params(("id" = String, Path), ShellQuery), responses((status = 101, description = "switching to the WebSocket"), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
#[get("/tasks/{id}/shell")]
pub async fn shell(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Payload,
    caller: Caller,
    id: web::Path<String>,
    q: web::Query<ShellQuery>,
) -> Result<HttpResponse, ApiError> {
    let (cols, rows) = terminal_size(q.cols, q.rows)?;
    let (task, node) = target_of(&state, &caller, &id, q.rank).await?;
    let target = TunnelTarget::Exec {
        command: Vec::new(),
        tty: true,
        cols,
        rows,
    };
    let event = ("shell", "opened a shell".to_string());
    let reach = Reach {
        task,
        node,
        target,
        event,
        rank: q.rank,
    };
    open(state, req, body, caller, reach).await
}

/// One command in the task's environment; works for batch tasks too.
#[utoipa::path(params(("id" = String, Path), ExecQuery), responses((status = 101, description = "switching to the WebSocket"), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
#[get("/tasks/{id}/exec")]
pub async fn exec(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Payload,
    caller: Caller,
    id: web::Path<String>,
    q: web::Query<ExecQuery>,
) -> Result<HttpResponse, ApiError> {
    let command = parse_command(&q.command)?;
    let (cols, rows) = terminal_size(q.cols, q.rows)?;
    let (task, node) = target_of(&state, &caller, &id, q.rank).await?;
    let shown: String = command.join(" ").chars().take(500).collect();
    let target = TunnelTarget::Exec {
        command,
        tty: q.tty.unwrap_or(false),
        cols,
        rows,
    };
    let event = ("exec", format!("ran: {shown}"));
    let reach = Reach {
        task,
        node,
        target,
        event,
        rank: q.rank,
    };
    open(state, req, body, caller, reach).await
}

/// A TCP connection to a port the task declared in `ports` (binary frames are the bytes).
#[utoipa::path(params(("id" = String, Path), ("port" = u16, Path), PortQuery), responses((status = 101, description = "switching to the WebSocket"), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
#[get("/tasks/{id}/ports/{port}")]
pub async fn port(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Payload,
    caller: Caller,
    path: web::Path<(String, u16)>,
    q: web::Query<PortQuery>,
) -> Result<HttpResponse, ApiError> {
    let (id, port) = path.into_inner();
    let (task, node) = target_of(&state, &caller, &id, q.rank).await?;
    declared(&task, port)?;
    let reach = Reach {
        task,
        node,
        target: TunnelTarget::Port { port },
        event: ("port_forward", format!("opened port {port}")),
        rank: q.rank,
    };
    open(state, req, body, caller, reach).await
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct OpenQuery {
    /// The page of the app to land on (a path, e.g. `/lab`; default `/`).
    path: Option<String>,
}

/// Opens a declared web port (JupyterLab, TensorBoard) in the browser: answers with a
/// redirect to the app on its own origin, carrying a one-minute ticket that the app's origin
/// trades for a pass of its own (the platform's sign-in never goes there). Rank 0 only.
#[utoipa::path(params(("id" = String, Path), ("port" = u16, Path), OpenQuery), responses((status = 303, description = "to the app; the body's `url` says where"), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
#[get("/tasks/{id}/ports/{port}/open")]
pub async fn open_app(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    path: web::Path<(String, u16)>,
    q: web::Query<OpenQuery>,
) -> Result<HttpResponse, ApiError> {
    let (id, number) = path.into_inner();
    let (task, _) = target_of(&state, &caller, &id, None).await?;
    declared(&task, number)?;
    reach::hold_like_a_session(&state, &task).await?;
    let origin = state.apps.origin.as_ref().ok_or_else(|| {
        ApiError::Conflict(
            "this server serves no apps: its operator sets AUTODL_APPS_URL (see the README)".into(),
        )
    })?;
    let app = crate::task_web::AppHost {
        task_id: task.task.id.clone(),
        port: number,
    };
    let now = state.clock.now_ms();
    let ticket = state.apps.keys.ticket(&caller, &app, now)?;
    let next = crate::task_web::proxy::local_path(q.path.as_deref());
    let url = format!(
        "{}{}?ticket={ticket}&next={}",
        origin.url_of(&app),
        crate::task_web::proxy::ENTER_PATH,
        url::form_urlencoded::byte_serialize(next.as_bytes()).collect::<String>()
    );
    reach::reached(
        &state,
        &task.task.id,
        "port_forward",
        &format!("{} opened port {number} in the browser", caller.user.email),
    )
    .await?;
    audit::record(
        &state,
        Actor::of(&caller, &req),
        Some(&task.task.tenant_id),
        Action::TaskPortOpened,
        &format!("task {}", task.task.id),
        serde_json::json!({ "kind": "app", "port": number, "owner": task.user_email }),
    )
    .await;
    Ok(HttpResponse::SeeOther()
        .insert_header((actix_web::http::header::LOCATION, url.clone()))
        .insert_header((actix_web::http::header::CACHE_CONTROL, "no-store"))
        .json(serde_json::json!({ "url": url })))
}

/// The node's agent dials in for a tunnel its poll was told of.
#[utoipa::path(params(("id" = String, Path)), responses((status = 101, description = "switching to the WebSocket"), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
#[get("/agent/tunnels/{id}")]
pub async fn agent_side(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Payload,
    node: NodeCaller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let crate::tunnels::Answered {
        person,
        task_id,
        hand_over,
        stop,
    } = state
        .tunnels
        .answer(&id, &node.node.id)
        .ok_or_else(|| ApiError::NotFound("no such tunnel for this node".into()))?;
    // On an error `hand_over` is dropped, and the person is told the node did not answer.
    let (response, agent, stream) = actix_ws::handle(&req, body)
        .map_err(|e| ApiError::invalid("upgrade", format!("this endpoint is a WebSocket: {e}")))?;
    let stream = stream.max_frame_size(MAX_FRAME);
    if hand_over.send(agent.clone()).is_err() {
        // The person left while the agent was on its way.
        let _ = agent.close(None).await;
        return Ok(response);
    }
    let tunnels = state.tunnels.clone();
    actix_web::rt::spawn(pipe(stream, agent, person, tunnels, task_id, stop));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_json_arrays_of_strings() {
        assert_eq!(
            parse_command(r#"["nvidia-smi","-L"]"#).unwrap(),
            vec!["nvidia-smi", "-L"]
        );
        for bad in ["nvidia-smi", "[]", r#"[""]"#, "[1]", r#"["a\u0000"]"#] {
            assert!(parse_command(bad).is_err(), "{bad}");
        }
        assert!(parse_command(&format!("[{}]", vec!["\"a\""; 300].join(","))).is_err());
    }

    #[test]
    fn terminal_sizes_are_bounded() {
        assert_eq!(terminal_size(None, None).unwrap(), (80, 24));
        assert!(terminal_size(Some(0), None).is_err());
        assert!(terminal_size(None, Some(5000)).is_err());
    }
}
