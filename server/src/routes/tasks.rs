//! Tasks API: submit, list, inspect, cancel, and what a task leaves behind (events, attempts,
//! logs, metrics, results). Every query is scoped by the caller's tenant.

use std::collections::BTreeMap;
use std::time::Duration;

use actix_web::web::Bytes;
use actix_web::{get, post, web, FromRequest, HttpRequest, HttpResponse};
use autodl_common::api::ErrorBody;
use autodl_common::tasks::{
    Attempt, LogLine, LogPage, MetricSeries, Task, TaskEvent, TaskPage, TaskSpecInput, TaskState,
};
use serde::Deserialize;

use crate::audit::{self, Action, Actor};
use crate::auth::caller::{LiveCaller, STREAM_REVOKED};
use crate::auth::Caller;
use crate::domain::rfc3339;
use crate::domain::IdempotencyKey;
use crate::error::ApiError;
use crate::routes::json::Json;
use crate::state::AppState;
use crate::store::TaskFilter;
use crate::tasks::{spec, to_api};
use crate::usecases::reach::find;
use crate::usecases::submit::Submitted;
use crate::usecases::task_history;

const IDEMPOTENCY_HEADER: &str = "idempotency-key";

/// Submits a task. With an `Idempotency-Key` header, repeating the request returns the task the
/// first one created (200) instead of creating another; the same key with a different request
/// is refused (422).
#[utoipa::path(
    request_body = TaskSpecInput,
    params(("Idempotency-Key" = Option<String>, Header, description = "makes retries of this request safe")),
    responses(
        (status = 201, body = Task), (status = 200, body = Task, description = "an earlier request with this Idempotency-Key"),
        (status = 400, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 422, body = ErrorBody, description = "the Idempotency-Key was used for a different request")
    )
)]
#[post("/tasks")]
#[tracing::instrument(skip_all, fields(user = %caller.user.id))]
pub async fn submit(
    state: web::Data<AppState>,
    caller: Caller,
    req: HttpRequest,
    body: Json<TaskSpecInput>,
) -> Result<HttpResponse, ApiError> {
    let key = req
        .headers()
        .get(IDEMPOTENCY_HEADER)
        .map(|v| {
            v.to_str()
                .map_err(|_| ApiError::BadRequest("Idempotency-Key must be printable ASCII".into()))
                .and_then(|k| IdempotencyKey::parse(k).map_err(ApiError::from))
        })
        .transpose()?;
    Ok(
        match crate::usecases::submit::submit(&state, &caller, body.into_inner(), key).await? {
            Submitted::Created(t) => HttpResponse::Created().json(to_api(t)),
            Submitted::Existing(t) => HttpResponse::Ok().json(to_api(t)),
        },
    )
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// pending, scheduled, running, completed, failed or cancelled
    state: Option<String>,
    /// A user id, or `me`.
    user: Option<String>,
    /// `key=value`
    label: Option<String>,
    /// 1..=200, default 50
    limit: Option<i64>,
    /// `next_cursor` of the previous page
    cursor: Option<String>,
}

#[utoipa::path(params(ListQuery), responses((status = 200, body = TaskPage), (status = 400, body = ErrorBody)))]
#[get("/tasks")]
pub async fn list(
    state: web::Data<AppState>,
    caller: Caller,
    q: web::Query<ListQuery>,
) -> Result<web::Json<TaskPage>, ApiError> {
    let q = q.into_inner();
    let in_state = q
        .state
        .as_deref()
        .map(|s| {
            TaskState::parse(s)
                .ok_or_else(|| ApiError::invalid("state", format!("unknown state {s:?}")))
        })
        .transpose()?;
    let limit = q.limit.unwrap_or(50);
    if !(1..=200).contains(&limit) {
        return Err(ApiError::invalid(
            "limit",
            "limit must be between 1 and 200",
        ));
    }
    let label = match q.label.as_deref() {
        None => None,
        Some(l) => {
            let (k, v) = l
                .split_once('=')
                .ok_or_else(|| ApiError::invalid("label", "label filter is key=value"))?;
            Some((k.to_owned(), v.to_owned()))
        }
    };
    let before = match q.cursor.as_deref() {
        None => None,
        Some(c) => {
            let (at, id) = c
                .split_once('_')
                .and_then(|(a, id)| a.parse::<i64>().ok().map(|a| (a, id.to_owned())))
                .ok_or_else(|| {
                    ApiError::invalid("cursor", "cursor is not one this server gave out")
                })?;
            Some((at, id))
        }
    };
    let user_id = match q.user.as_deref() {
        Some("me") => Some(caller.user.id.clone()),
        other => other.map(str::to_owned),
    };
    let filter = TaskFilter {
        tenant_id: caller.tenant_id().to_owned(),
        state: in_state,
        user_id,
        label,
        before,
        limit: limit + 1,
    };
    let (mut rows, total) = task_history::list(&state, &caller, filter).await?;
    let next_cursor = if rows.len() as i64 > limit {
        rows.truncate(limit as usize);
        rows.last()
            .map(|t| format!("{}_{}", t.task.created_at, t.task.id))
    } else {
        None
    };
    let mut items: Vec<Task> = rows.into_iter().map(to_api).collect();
    task_history::summarize(&state, &mut items).await?;
    Ok(web::Json(TaskPage {
        items,
        next_cursor,
        total: u64::try_from(total).unwrap_or(0),
    }))
}

#[utoipa::path(params(("id" = String, Path)), responses((status = 200, body = Task), (status = 404, body = ErrorBody)))]
#[get("/tasks/{id}")]
pub async fn show(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<web::Json<Task>, ApiError> {
    let t = find(&state, &caller, &id).await?;
    let mut task = to_api(t);
    task_history::summarize(&state, std::slice::from_mut(&mut task)).await?;
    Ok(web::Json(task))
}

/// The request that submits this task again as it was (`autodl export`, clone, retry): every
/// spec the API hands out is one it accepts.
#[utoipa::path(params(("id" = String, Path)), responses((status = 200, body = TaskSpecInput), (status = 404, body = ErrorBody)))]
#[get("/tasks/{id}/spec")]
pub async fn spec_input(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<web::Json<TaskSpecInput>, ApiError> {
    let t = find(&state, &caller, &id).await?;
    Ok(web::Json(t.task.spec.to_input()))
}

/// Cancels a task that has not finished; its resources are freed at the next cycle.
#[utoipa::path(params(("id" = String, Path)), responses((status = 200, body = Task), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
#[post("/tasks/{id}/cancel")]
#[tracing::instrument(skip_all, fields(user = %caller.user.id, task = %id))]
pub async fn cancel(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    id: web::Path<String>,
) -> Result<web::Json<Task>, ApiError> {
    let t = task_history::cancel(&state, &caller, &id).await?;
    if t.task.user_id != caller.user.id {
        audit::record(
            &state,
            Actor::of(&caller, &req),
            Some(&t.task.tenant_id),
            Action::TaskCancelledByOther,
            &format!("task {}", t.task.id),
            serde_json::json!({ "owner": t.user_email, "name": t.task.name }),
        )
        .await;
    }
    Ok(web::Json(to_api(t)))
}

#[utoipa::path(params(("id" = String, Path)), responses((status = 200, body = [TaskEvent]), (status = 404, body = ErrorBody)))]
#[get("/tasks/{id}/events")]
pub async fn events(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<web::Json<Vec<TaskEvent>>, ApiError> {
    let t = find(&state, &caller, &id).await?;
    let events = task_history::events(&state, &t.task.id).await?;
    Ok(web::Json(
        events
            .into_iter()
            .map(|e| TaskEvent {
                at: rfc3339(e.at),
                kind: e.kind,
                message: e.message,
            })
            .collect(),
    ))
}

#[utoipa::path(params(("id" = String, Path)), responses((status = 200, body = [Attempt]), (status = 404, body = ErrorBody)))]
#[get("/tasks/{id}/attempts")]
pub async fn attempts(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<web::Json<Vec<Attempt>>, ApiError> {
    let t = find(&state, &caller, &id).await?;
    let rows = task_history::attempts(&state, &t.task.id).await?;
    Ok(web::Json(
        rows.into_iter()
            .map(|a| Attempt {
                number: a.number as u32,
                node: a.node,
                placement: a.placement.0,
                started_at: rfc3339(a.started_at),
                ended_at: a.ended_at.map(rfc3339),
                exit_code: a.exit_code.map(|c| c as i32),
                reason: a.reason,
                batch_size: a.batch_size.map(|b| b as u32),
                gpu_seconds: a.gpu_seconds,
            })
            .collect(),
    ))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct LogQuery {
    /// Only lines after this sequence number.
    after: Option<i64>,
    /// 1..=5000, default 1000
    limit: Option<i64>,
}

fn log_lines(rows: Vec<crate::store::LogRecord>) -> Vec<LogLine> {
    rows.into_iter()
        .map(|l| LogLine {
            seq: l.id,
            at: rfc3339(l.at),
            stream: l.stream,
            line: l.line,
            attempt: u32::try_from(l.attempt).unwrap_or(0),
            rank: l.rank.and_then(|r| u32::try_from(r).ok()),
        })
        .collect()
}

/// Lines read for one download at most (about 100 MB of typical log).
const DOWNLOAD_LINES: i64 = 1_000_000;

/// The whole log as a text file: each line with its time, attempt and stream, so it can be
/// kept, grepped and attached to a bug report.
#[utoipa::path(params(("id" = String, Path)), responses((status = 200, description = "text/plain: one line per log line", content_type = "text/plain"), (status = 404, body = ErrorBody)))]
#[get("/tasks/{id}/logs/download")]
pub async fn log_download(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let t = find(&state, &caller, &id).await?;
    let mut out = String::new();
    let (mut after, mut read) = (0, 0);
    loop {
        let rows = task_history::logs(&state, &t.task.id, after, 5000).await?;
        let Some(last) = rows.last() else { break };
        after = last.id;
        read += rows.len() as i64;
        for l in &rows {
            out.push_str(&format!(
                "{} attempt {} {}: {}\n",
                rfc3339(l.at),
                l.attempt,
                l.stream,
                l.line
            ));
        }
        if rows.len() < 5000 || read >= DOWNLOAD_LINES {
            break;
        }
    }
    // The name is built from the id only: a task's name is the user's text.
    let file = format!("{}-log.txt", t.task.id);
    Ok(HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .insert_header(super::attachment::attachment(&file))
        .body(out))
}

#[utoipa::path(params(("id" = String, Path), LogQuery), responses((status = 200, body = LogPage), (status = 404, body = ErrorBody)))]
#[get("/tasks/{id}/logs")]
pub async fn logs(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
    q: web::Query<LogQuery>,
) -> Result<web::Json<LogPage>, ApiError> {
    let t = find(&state, &caller, &id).await?;
    let after = q.after.unwrap_or(0);
    let limit = q.limit.unwrap_or(1000);
    if !(1..=5000).contains(&limit) {
        return Err(ApiError::invalid(
            "limit",
            "limit must be between 1 and 5000",
        ));
    }
    let lines = log_lines(task_history::logs(&state, &t.task.id, after, limit).await?);
    let next_after = lines.last().map_or(after, |l| l.seq);
    Ok(web::Json(LogPage { lines, next_after }))
}

/// Live log tail as Server-Sent Events; the stream ends once the task has finished and every
/// line was sent.
#[utoipa::path(params(("id" = String, Path), LogQuery), responses((status = 200, description = "text/event-stream of LogLine"), (status = 404, body = ErrorBody)))]
#[get("/tasks/{id}/logs/stream")]
pub async fn log_stream(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
    q: web::Query<LogQuery>,
) -> Result<HttpResponse, ApiError> {
    let t = find(&state, &caller, &id).await?;
    let task_id = t.task.id;
    let start = q.after.unwrap_or(0);
    let rx = state.agents.watch_data();
    let live = LiveCaller::new(caller, state.clock.now_ms());
    let stream = futures_util::stream::unfold(
        (start, false, rx, live),
        move |(after, done, mut rx, mut live)| {
            let state = state.clone();
            let task_id = task_id.clone();
            async move {
                if done {
                    return None;
                }
                loop {
                    if !live.still_allowed(&state).await {
                        return Some((
                            Ok(Bytes::from_static(STREAM_REVOKED)),
                            (after, true, rx, live),
                        ));
                    }
                    let rows = match task_history::logs(&state, &task_id, after, 500).await {
                        Ok(r) => r,
                        Err(e) => {
                            return Some((
                                Err(actix_web::error::ErrorInternalServerError(e)),
                                (after, true, rx, live),
                            ))
                        }
                    };
                    if !rows.is_empty() {
                        let lines = log_lines(rows);
                        let next = lines.last().map_or(after, |l| l.seq);
                        let mut out = String::new();
                        for l in &lines {
                            out.push_str("data: ");
                            out.push_str(&serde_json::to_string(l).unwrap_or_default());
                            out.push_str("\n\n");
                        }
                        return Some((Ok(Bytes::from(out)), (next, false, rx, live)));
                    }
                    let finished = task_history::has_ended(&state, &task_id)
                        .await
                        .unwrap_or(true);
                    if finished {
                        return Some((
                            Ok(Bytes::from_static(b"event: end\ndata: {}\n\n")),
                            (after, true, rx, live),
                        ));
                    }
                    crate::agents::wait_for_data(&mut rx, Duration::from_secs(1)).await;
                }
            }
        },
    );
    Ok(HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("Cache-Control", "no-cache"))
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(stream))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct MetricQuery {
    /// RFC 3339: only samples after this time.
    after: Option<String>,
    /// 1..=10000, default 1000 (the most recent)
    limit: Option<i64>,
}

#[utoipa::path(params(("id" = String, Path), MetricQuery), responses((status = 200, body = MetricSeries), (status = 404, body = ErrorBody)))]
#[get("/tasks/{id}/metrics")]
pub async fn metrics(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
    q: web::Query<MetricQuery>,
) -> Result<web::Json<MetricSeries>, ApiError> {
    let t = find(&state, &caller, &id).await?;
    let after = match q.after.as_deref() {
        None => 0,
        Some(a) => spec::parse_time_ms(a)
            .ok_or_else(|| ApiError::invalid("after", "after must be an RFC 3339 time"))?,
    };
    let limit = q.limit.unwrap_or(1000);
    if !(1..=10_000).contains(&limit) {
        return Err(ApiError::invalid(
            "limit",
            "limit must be between 1 and 10000",
        ));
    }
    let samples = task_history::metrics(&state, &t.task.id, after, limit).await?;
    Ok(web::Json(MetricSeries { samples }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct MetricLinesQuery {
    /// RFC 3339: the window's start (default: the task's first sample).
    from: Option<String>,
    /// RFC 3339: the window's end (default: now); a window that ends before it starts is empty.
    to: Option<String>,
    /// Points per line at most, 10..=5000 (default 600): lines are thinned with LTTB, which
    /// keeps peaks and shape.
    points: Option<usize>,
}

/// Rows of each kind read for one window at most: a week of 8 GPUs sampled every 5 s.
const WINDOW_ROWS: i64 = 1_000_000;

/// A task's whole history (or a window of it) as named lines for charts, each thinned to a
/// budget of points: a long run keeps its shape without sending every sample.
#[utoipa::path(params(("id" = String, Path), MetricLinesQuery), responses((status = 200, body = autodl_common::metrics::MetricLines), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
#[get("/tasks/{id}/metrics/lines")]
pub async fn metric_lines(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
    q: web::Query<MetricLinesQuery>,
) -> Result<web::Json<autodl_common::metrics::MetricLines>, ApiError> {
    let t = find(&state, &caller, &id).await?;
    let time = |field: &'static str, v: &Option<String>| -> Result<Option<i64>, ApiError> {
        v.as_deref()
            .map(|a| {
                spec::parse_time_ms(a).ok_or_else(|| {
                    ApiError::invalid(field, format!("{field} must be an RFC 3339 time"))
                })
            })
            .transpose()
    };
    let from = time("from", &q.from)?.unwrap_or(0);
    let to = time("to", &q.to)?.unwrap_or(i64::MAX);
    let points = q.points.unwrap_or(600);
    if !(10..=5000).contains(&points) {
        return Err(ApiError::invalid(
            "points",
            "points must be between 10 and 5000",
        ));
    }
    let lines =
        task_history::metric_lines(&state, &t.task.id, (from, to), points, WINDOW_ROWS).await?;
    Ok(web::Json(lines))
}

/// Lets training code report its own numbers (epoch, loss, accuracy, ...).
#[utoipa::path(
    params(("id" = String, Path)),
    request_body(content = Object, description = "flat object of numbers, e.g. {\"epoch\": 3, \"loss\": 0.21}"),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody))
)]
#[post("/tasks/{id}/metrics")]
pub async fn report_metrics(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
    body: Json<serde_json::Map<String, serde_json::Value>>,
) -> Result<HttpResponse, ApiError> {
    // The task's own token (AUTODL_TASK_TOKEN) is good for this task only; otherwise a user of
    // the task's tenant.
    let bearer = crate::auth::bearer::bearer_token(req.headers());
    let t = match bearer.and_then(|b| {
        state
            .sessions
            .verify_task_token(b.trim(), state.clock.now_ms())
    }) {
        Some(claims) if claims.task == *id => {
            task_history::task_of_token(&state, &id, claims.attempt).await?
        }
        Some(_) => {
            return Err(ApiError::Forbidden(
                "this task token belongs to another task".into(),
            ))
        }
        None => {
            // Another member's numbers would be drawn on their charts (and judge their
            // sweep's trials): the owner or a manager only.
            let caller = Caller::extract(&req).await?;
            let t = find(&state, &caller, &id).await?;
            if t.task.user_id != caller.user.id {
                caller.require_manager().map_err(|_| {
                    ApiError::Forbidden(
                        "only the task's owner (or its own token) reports its metrics".into(),
                    )
                })?;
            }
            t
        }
    };
    if body.is_empty() || body.len() > 64 {
        return Err(ApiError::invalid(
            "metrics",
            "report between 1 and 64 numbers",
        ));
    }
    let mut values = BTreeMap::new();
    for (k, v) in body.iter() {
        if !crate::domain::names::is_metric_name(k) {
            return Err(ApiError::invalid(
                "metrics",
                format!("{k:?} is not a metric name"),
            ));
        }
        // GPU lines are measured by the platform: a task cannot draw its own.
        if ["mem_used", "mem_total"].contains(&k.as_str()) || autodl_common::metrics::is_gpu_line(k)
        {
            return Err(ApiError::invalid(
                "metrics",
                format!("{k} is measured by the platform"),
            ));
        }
        let n = v
            .as_f64()
            .filter(|n| n.is_finite())
            .ok_or_else(|| ApiError::invalid("metrics", format!("{k} must be a finite number")))?;
        values.insert(k.clone(), autodl_common::metrics::json_number(n));
    }
    task_history::report_metrics(&state, &t.task, &values).await?;
    Ok(HttpResponse::NoContent().finish())
}
