//! Live streams for the web app, as Server-Sent Events (the log tail is in `tasks`).

use std::time::Duration;

use actix_web::web::Bytes;
use actix_web::{get, web, HttpResponse};
use autodl_common::api::ErrorBody;
use serde::Deserialize;

use crate::auth::caller::{LiveCaller, STREAM_REVOKED};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;
use crate::tasks::spec;
use crate::usecases::reach::find;
use crate::usecases::task_history;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct MetricStreamQuery {
    /// RFC 3339: only samples after this time (the last one a dropped stream delivered).
    after: Option<String>,
}

/// How many samples of each kind the first message may carry (the most recent ones).
const BACKLOG: i64 = 1000;
const POLL: Duration = Duration::from_millis(1000);

/// Live metrics of a task as Server-Sent Events: one `data: {MetricSample}` per sample (GPU
/// utilization and memory from the agent, numbers the task reported), then `event: end` once the
/// task has finished and everything was sent.
#[utoipa::path(
    params(("id" = String, Path), MetricStreamQuery),
    responses((status = 200, description = "text/event-stream of MetricSample"), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody))
)]
#[get("/tasks/{id}/metrics/stream")]
pub async fn metric_stream(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
    q: web::Query<MetricStreamQuery>,
) -> Result<HttpResponse, ApiError> {
    let task = find(&state, &caller, &id).await?;
    let after = match q.after.as_deref() {
        None => 0,
        Some(a) => spec::parse_time_ms(a)
            .ok_or_else(|| ApiError::invalid("after", "after must be an RFC 3339 time"))?,
    };
    let task_id = task.task.id;
    // Separate cursors: GPU samples may arrive later than numbers the task reported.
    let rx = state.agents.watch_data();
    let live = LiveCaller::new(caller, state.clock.now_ms());
    let stream = futures_util::stream::unfold(
        (after, after, false, rx, live),
        move |(metric_after, gpu_after, done, mut rx, mut live)| {
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
                            (metric_after, gpu_after, true, rx, live),
                        ));
                    }
                    // Read the state first: what is stored by then is all there will be.
                    let finished = task_history::has_ended(&state, &task_id)
                        .await
                        .unwrap_or(true);
                    let fetched = task_history::samples_since(
                        &state,
                        &task_id,
                        (metric_after, gpu_after),
                        BACKLOG,
                    )
                    .await;
                    let (reported, gpu) = match fetched {
                        Ok(x) => x,
                        Err(e) => {
                            return Some((
                                Err(actix_web::error::ErrorInternalServerError(e)),
                                (metric_after, gpu_after, true, rx, live),
                            ))
                        }
                    };
                    let next_metric = reported.last().map_or(metric_after, |r| r.at);
                    let next_gpu = gpu.last().map_or(gpu_after, |g| g.at);
                    let batch = crate::tasks::metrics::samples(reported, &gpu);
                    if !batch.is_empty() {
                        let mut out = String::new();
                        for (_, s) in &batch {
                            out.push_str("data: ");
                            out.push_str(&serde_json::to_string(s).unwrap_or_default());
                            out.push_str("\n\n");
                        }
                        return Some((
                            Ok(Bytes::from(out)),
                            (next_metric, next_gpu, false, rx, live),
                        ));
                    }
                    if finished {
                        return Some((
                            Ok(Bytes::from_static(b"event: end\ndata: {}\n\n")),
                            (metric_after, gpu_after, true, rx, live),
                        ));
                    }
                    crate::agents::wait_for_data(&mut rx, POLL).await;
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
