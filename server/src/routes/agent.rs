//! The agent API: registration with a one-time token, then long polls and reports with the
//! node credential. Reports about attempts that are no longer current change nothing (409).

use std::collections::HashSet;
use std::time::Duration;

use actix_web::{delete, get, post, web, HttpResponse};
use autodl_common::agent::{
    AgentHost, AttemptRef, CreateRegistrationToken, ExitReason, FinishedReport, LogBatch,
    MetricBatch, PollRequest, PollResponse, RegisterRequest, RegisterResponse, RegistrationToken,
};
use autodl_common::api::ErrorBody;
use autodl_common::tasks::TaskState;
use autodl_scheduler::Gpu;
use serde::Deserialize;

use crate::agents::dispatch::work_for;
use crate::agents::node_caller::NodeCaller;
use crate::agents::skew::ClockSkew;
use crate::agents::{NODE_CREDENTIAL_PREFIX, REGISTRATION_TOKEN_PREFIX};
use crate::app::runs::current_run;
use crate::auth::secrets::{digest, new_id, random_hex};
use crate::auth::Caller;
use crate::domain::{parse_name, parse_node_id};
use crate::error::ApiError;
use crate::json::Json;
use crate::state::{rfc3339, AppState};
use crate::store::{GpuSampleRecord, NodeRecord, RegistrationTokenRecord};
use crate::tasks::access::{self, Isolation};
use crate::tasks::lifecycle::{after_attempt, ExitKind};
use crate::tasks::{spec::parse_time_ms, spec_of};

const MAX_LOG_LINES: usize = 1000;
const MAX_LINE_BYTES: usize = 16 * 1024;
const MAX_SAMPLES: usize = 10_000;
pub const METRIC_BODY_LIMIT: usize = 8 * 1024 * 1024;

fn token_info(t: &RegistrationTokenRecord, token: Option<String>) -> RegistrationToken {
    RegistrationToken {
        id: t.id.clone(),
        name: t.name.clone(),
        created_at: rfc3339(t.created_at),
        expires_at: rfc3339(t.expires_at),
        max_uses: t.max_uses.clamp(0, i64::from(u32::MAX)) as u32,
        uses: t.uses.clamp(0, i64::from(u32::MAX)) as u32,
        node_id: t.node_id.clone(),
        token,
    }
}

/// What an agent says about how it runs tasks, checked and in the stored form
/// (runtime, isolation, JSON of the dataset roots). An agent that says nothing is a node
/// that cannot isolate tasks.
fn host_fields(h: Option<&AgentHost>) -> Result<(String, String, String), ApiError> {
    let Some(h) = h else {
        return Ok((String::new(), Isolation::None.as_str().into(), "[]".into()));
    };
    if !matches!(h.runtime.as_str(), "docker" | "process") {
        return Err(ApiError::invalid(
            "host.runtime",
            "runtime is docker or process",
        ));
    }
    let isolation = Isolation::parse(&h.isolation);
    if isolation == Isolation::Declared || isolation.as_str() != h.isolation {
        return Err(ApiError::invalid(
            "host.isolation",
            "isolation is container, sandbox, uid or none",
        ));
    }
    if h.data_roots.len() > 64
        || h.data_roots
            .iter()
            .any(|r| r == "/" || r.len() > 1024 || !access::is_clean_absolute(r))
    {
        return Err(ApiError::invalid(
            "host.data_roots",
            "at most 64 dataset roots, each a normalised absolute folder other than /",
        ));
    }
    Ok((
        h.runtime.clone(),
        isolation.as_str().into(),
        serde_json::to_string(&h.data_roots).map_err(anyhow::Error::from)?,
    ))
}

#[utoipa::path(request_body = CreateRegistrationToken, responses((status = 201, body = RegistrationToken), (status = 403, body = ErrorBody)))]
#[post("/admin/registration-tokens")]
pub async fn create_token(
    state: web::Data<AppState>,
    caller: Caller,
    body: Json<CreateRegistrationToken>,
) -> Result<HttpResponse, ApiError> {
    caller.require_platform_admin()?;
    let name = parse_name("name", body.name.as_deref().unwrap_or("agents"), 64)?;
    let hours = body.expires_in_hours.unwrap_or(24);
    if !(1..=24 * 365).contains(&hours) {
        return Err(ApiError::invalid(
            "expires_in_hours",
            "expires_in_hours must be between 1 and 8760",
        ));
    }
    let max_uses = body.max_uses.unwrap_or(1);
    if !(1..=10_000).contains(&max_uses) {
        return Err(ApiError::invalid(
            "max_uses",
            "max_uses must be between 1 and 10000",
        ));
    }
    if let Some(n) = &body.node_id {
        parse_node_id("node_id", n)?;
        if max_uses != 1 {
            return Err(ApiError::invalid(
                "max_uses",
                "a token for one node is used once",
            ));
        }
    }
    let now = state.clock.now_ms();
    let token = format!("{REGISTRATION_TOKEN_PREFIX}{}", random_hex(24));
    let rec = RegistrationTokenRecord {
        id: new_id(),
        name,
        token_hash: digest(&token),
        created_by: caller.user.id.clone(),
        created_at: now,
        expires_at: now + i64::from(hours) * 3_600_000,
        revoked: false,
        max_uses: i64::from(max_uses),
        uses: 0,
        node_id: body.node_id.clone(),
    };
    state.store.create_registration_token(&rec).await?;
    Ok(HttpResponse::Created().json(token_info(&rec, Some(token))))
}

#[utoipa::path(responses((status = 200, body = [RegistrationToken]), (status = 403, body = ErrorBody)))]
#[get("/admin/registration-tokens")]
pub async fn list_tokens(
    state: web::Data<AppState>,
    caller: Caller,
) -> Result<web::Json<Vec<RegistrationToken>>, ApiError> {
    caller.require_platform_admin()?;
    let list = state.store.list_registration_tokens().await?;
    Ok(web::Json(
        list.iter().map(|t| token_info(t, None)).collect(),
    ))
}

#[utoipa::path(params(("id" = String, Path)), responses((status = 204), (status = 404, body = ErrorBody)))]
#[delete("/admin/registration-tokens/{id}")]
pub async fn revoke_token(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    caller.require_platform_admin()?;
    if state.store.revoke_registration_token(&id).await? {
        Ok(HttpResponse::NoContent().finish())
    } else {
        Err(ApiError::NotFound("no such registration token".into()))
    }
}

/// An agent joins with a registration token and receives its own node credential.
#[utoipa::path(request_body = RegisterRequest, responses((status = 201, body = RegisterResponse), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
#[post("/agent/register")]
#[tracing::instrument(skip_all, fields(node = %body.node.id))]
pub async fn register(
    state: web::Data<AppState>,
    body: Json<RegisterRequest>,
) -> Result<HttpResponse, ApiError> {
    let now = state.clock.now_ms();
    let token = state
        .store
        .registration_token_by_hash(&digest(&body.token))
        .await?
        .filter(|t| !t.revoked && t.expires_at > now && t.uses < t.max_uses)
        .ok_or_else(|| {
            ApiError::Unauthorized("invalid, revoked, expired or used-up registration token".into())
        })?;
    let n = &body.node;
    parse_node_id("node.id", &n.id)?;
    if token.node_id.as_deref().is_some_and(|bound| bound != n.id) {
        return Err(ApiError::Forbidden(format!(
            "this registration token is for node {}",
            token.node_id.as_deref().unwrap_or_default()
        )));
    }
    // Taking over an existing node (its credential, the tasks placed on it) needs an
    // administrator's token made for that node.
    let existing = state
        .store
        .list_nodes()
        .await?
        .into_iter()
        .find(|x| x.id == n.id);
    if existing.is_some() && token.node_id.is_none() {
        return Err(ApiError::Conflict(format!(
            "node {} is already registered; to register it again an administrator makes a registration token for this node (node_id) or removes the node",
            n.id
        )));
    }
    let (runtime, isolation, data_roots) = host_fields(n.host.as_ref())?;
    if !n.cpu.is_finite() || n.cpu <= 0.0 || n.memory == 0 {
        return Err(ApiError::invalid("node", "cpu and memory must be positive"));
    }
    if n.gpus.len() > 64
        || n.gpus
            .iter()
            .any(|g| g.gpu_type.is_empty() || g.gpu_type.len() > 64 || g.memory == 0)
    {
        return Err(ApiError::invalid(
            "node.gpus",
            "at most 64 GPUs, each with a type and memory",
        ));
    }
    let indices: HashSet<u32> = n.gpus.iter().map(|g| g.index).collect();
    if indices.len() != n.gpus.len() {
        return Err(ApiError::invalid(
            "node.gpus",
            "GPU indices must be distinct",
        ));
    }
    // Counted only now that everything else is valid, in one statement with its checks.
    if !state
        .store
        .use_registration_token(&token.id, &n.id, now)
        .await?
    {
        return Err(ApiError::Unauthorized(
            "invalid, revoked, expired or used-up registration token".into(),
        ));
    }
    let gpus: Vec<Gpu> = n
        .gpus
        .iter()
        .map(|g| Gpu {
            index: g.index,
            gpu_type: g.gpu_type.clone(),
            mem_bytes: g.memory,
            util: 0.0,
        })
        .collect();
    let rec = NodeRecord {
        id: n.id.clone(),
        zone: n.zone.clone(),
        labels: serde_json::to_string(&n.labels).map_err(anyhow::Error::from)?,
        cpu_millis: (n.cpu * 1000.0).round() as i64,
        mem_bytes: n.memory as i64,
        gpus: serde_json::to_string(&gpus).map_err(anyhow::Error::from)?,
        schedulable: true,
        created_at: now,
        updated_at: now,
        credential_hash: None,
        last_seen: Some(now),
        status: "ready".into(),
        runtime,
        isolation,
        data_roots,
        open_to_all: false,
    };
    state.store.upsert_node(&rec).await?;
    let credential = format!("{NODE_CREDENTIAL_PREFIX}{}", random_hex(24));
    state
        .store
        .set_node_credential(&rec.id, &digest(&credential))
        .await?;
    state.store.touch_node(&rec.id, now).await?;
    state.scheduler.invalidate_nodes();
    state.scheduler.wake();
    tracing::info!(node = %rec.id, gpus = gpus.len(), isolation = %rec.isolation, "agent registered");
    Ok(HttpResponse::Created().json(RegisterResponse {
        node_id: rec.id,
        credential,
    }))
}

/// Longest a poll is held.
pub const MAX_POLL_WAIT_S: u64 = 30;

#[derive(Debug, Deserialize)]
pub struct PollQuery {
    /// Seconds to hold the poll when there is nothing to do, 0..=30.
    wait: Option<u64>,
}

/// Heartbeat and work in one call: answers at once when there is work, otherwise holds the
/// request up to `wait` seconds and answers as soon as work appears.
#[utoipa::path(request_body = PollRequest, params(("wait" = Option<u64>, Query)), responses((status = 200, body = PollResponse), (status = 401, body = ErrorBody)))]
#[post("/agent/poll")]
pub async fn poll(
    state: web::Data<AppState>,
    node: NodeCaller,
    q: web::Query<PollQuery>,
    body: Json<PollRequest>,
) -> Result<web::Json<PollResponse>, ApiError> {
    let wait = match q.wait.unwrap_or(0) {
        w @ 0..=MAX_POLL_WAIT_S => Duration::from_secs(w),
        _ => {
            return Err(ApiError::invalid(
                "wait",
                format!("wait is 0 to {MAX_POLL_WAIT_S} seconds"),
            ))
        }
    };
    let waiter = state.agents.waiter(&node.node.id);
    state
        .store
        .touch_node(&node.node.id, state.clock.now_ms())
        .await?;
    // An agent restarted with other settings (Docker gone, isolation off, new dataset roots)
    // says so in its polls; an agent that says nothing keeps what it said at registration.
    if body.host.is_some() {
        let (runtime, isolation, data_roots) = host_fields(body.host.as_ref())?;
        let n = &node.node;
        if (&runtime, &isolation, &data_roots) != (&n.runtime, &n.isolation, &n.data_roots) {
            tracing::info!(node = %n.id, %runtime, %isolation, "node reports a change in how it runs tasks");
            state
                .store
                .set_node_host(&n.id, &runtime, &isolation, &data_roots)
                .await?;
            state.scheduler.invalidate_nodes();
            state.scheduler.wake();
        }
    }
    if node.node.status == "lost" {
        state.scheduler.invalidate_nodes();
        state.scheduler.wake();
    }
    // Once, as the poll arrives: what it says the agent runs is what it runs now. The first
    // look at its work reuses that read unless it requeued something.
    let active = state.store.active_tasks().await?;
    let requeued =
        crate::agents::dispatch::reconcile(&state, &node.node, &body.running, &active).await?;
    let mut fresh = (requeued == 0).then_some(active);
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        // Register interest before looking, so a notification between the look and the wait
        // is not lost.
        let notified = waiter.notified();
        let active = match fresh.take() {
            Some(a) => a,
            None => state.store.active_tasks().await?,
        };
        let work = work_for(&state, &node.node, &body.running, &active).await?;
        if !work.assignments.is_empty()
            || !work.stop.is_empty()
            || tokio::time::Instant::now() >= deadline
        {
            return Ok(web::Json(work));
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return Ok(web::Json(work));
        }
    }
}

#[utoipa::path(params(("id" = String, Path)), request_body = AttemptRef, responses((status = 204), (status = 409, body = ErrorBody)))]
#[post("/agent/tasks/{id}/started")]
pub async fn started(
    state: web::Data<AppState>,
    node: NodeCaller,
    id: web::Path<String>,
    body: Json<AttemptRef>,
) -> Result<HttpResponse, ApiError> {
    let t = current_run(&state, &node.node.id, &id, body.attempt).await?;
    if t.task.state == TaskState::Scheduled {
        let placed_at = t.task.updated_at;
        state
            .store
            .mark_running(&id, i64::from(body.attempt), state.clock.now_ms())
            .await?;
        state
            .metrics
            .dispatch_latency
            .observe((state.clock.now_ms() - placed_at).max(0) as f64 / 1000.0);
    }
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(params(("id" = String, Path)), request_body = LogBatch, responses((status = 204), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)))]
#[post("/agent/tasks/{id}/logs")]
pub async fn logs(
    state: web::Data<AppState>,
    node: NodeCaller,
    id: web::Path<String>,
    body: Json<LogBatch>,
) -> Result<HttpResponse, ApiError> {
    if body.lines.len() > MAX_LOG_LINES {
        return Err(ApiError::invalid(
            "lines",
            format!("at most {MAX_LOG_LINES} lines a call"),
        ));
    }
    current_run(&state, &node.node.id, &id, body.attempt).await?;
    let skew = ClockSkew::of_batch(body.sent_at.as_deref(), state.clock.now_ms());
    let mut lines = Vec::with_capacity(body.lines.len());
    for l in &body.lines {
        let stream = l.stream.as_str().to_owned();
        let at = skew.correct(parse_time_ms(&l.at));
        let mut line = l.line.clone();
        if line.len() > MAX_LINE_BYTES {
            let mut cut = MAX_LINE_BYTES;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
        }
        lines.push((at, stream, line));
    }
    state
        .store
        .append_logs(&id, i64::from(body.attempt), &lines)
        .await?;
    state.agents.data_stored();
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(params(("id" = String, Path)), request_body = FinishedReport, responses((status = 204), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)))]
#[post("/agent/tasks/{id}/finished")]
#[tracing::instrument(skip_all, fields(node = %node.node.id, task = %id))]
pub async fn finished(
    state: web::Data<AppState>,
    node: NodeCaller,
    id: web::Path<String>,
    body: Json<FinishedReport>,
) -> Result<HttpResponse, ApiError> {
    let kind = match body.reason {
        ExitReason::Success => Some(ExitKind::Success),
        ExitReason::Error => Some(ExitKind::Error),
        ExitReason::Oom => Some(ExitKind::Oom),
        ExitReason::Stopped => None,
    };
    let t = current_run(&state, &node.node.id, &id, body.attempt).await?;
    let now = state.clock.now_ms();
    match (kind, t.task.stop_reason.as_deref()) {
        // Stopped on the scheduler's request (preempted, drained): back to the queue.
        (_, Some(reason)) => {
            state
                .store
                .requeue_task(None, &id, reason, &format!("stopped: {reason}"), now)
                .await?;
        }
        (Some(kind), None) => {
            let spec = spec_of(&t.task)?;
            let earlier_failures = state
                .store
                .task_attempts(&id)
                .await?
                .iter()
                .filter(|a| {
                    a.number < i64::from(body.attempt)
                        && matches!(a.reason.as_deref(), Some("error" | "oom"))
                })
                .count() as u32;
            let end = after_attempt(
                &spec,
                body.attempt,
                earlier_failures,
                t.task.batch_size.map(|b| b as u32),
                body.exit_code,
                kind,
            );
            state
                .store
                .finish_attempt(&id, i64::from(body.attempt), &end, now)
                .await?;
        }
        // Stopped without being asked (the agent shut down): run it again elsewhere.
        (None, None) => {
            state
                .store
                .requeue_task(None, &id, "node_lost", "the agent stopped the task", now)
                .await?;
        }
    }
    state.scheduler.wake();
    Ok(HttpResponse::NoContent().finish())
}

/// How long after an attempt ended its node may still deliver samples taken during it (an
/// agent that was away sends what it buffered).
const LATE_SAMPLES_MS: i64 = 3_600_000;

/// For each task the samples name: the GPUs of this node its attempts held, and until when
/// samples are accepted (`None` while the attempt runs).
async fn gpus_of_tasks_here<'a>(
    state: &AppState,
    node_id: &str,
    samples: &'a [autodl_common::agent::GpuSample],
) -> Result<std::collections::HashMap<&'a str, Vec<(u32, Option<i64>)>>, ApiError> {
    let mut out = std::collections::HashMap::new();
    for s in samples {
        let Some(t) = s.task_id.as_deref() else {
            continue;
        };
        if out.contains_key(t) {
            continue;
        }
        let mut spans = Vec::new();
        for a in state.store.task_attempts(t).await? {
            let until = a.ended_at.map(|e| e + LATE_SAMPLES_MS);
            let placed: Vec<autodl_common::tasks::WorkerPlacement> =
                serde_json::from_str(&a.placement).unwrap_or_default();
            for w in placed.iter().filter(|w| w.node == node_id) {
                spans.extend(w.gpu_indices.iter().map(|g| (*g, until)));
            }
        }
        out.insert(t, spans);
    }
    Ok(out)
}

/// GPU samples in batches. A sample for a GPU the node does not have, or naming a task that
/// did not run on that GPU of this node, rejects the whole batch (nothing is stored).
///
/// Batches are large (up to 10,000 samples), so this route takes bodies up to
/// `METRIC_BODY_LIMIT` (see `routes::configure`), above the API's usual limit.
#[utoipa::path(post, path = "/agent/metrics", request_body = MetricBatch, responses((status = 204), (status = 400, body = ErrorBody)))]
pub async fn metrics(
    state: web::Data<AppState>,
    node: NodeCaller,
    body: Json<MetricBatch>,
) -> Result<HttpResponse, ApiError> {
    if body.samples.len() > MAX_SAMPLES {
        return Err(ApiError::invalid(
            "samples",
            format!("at most {MAX_SAMPLES} samples a call"),
        ));
    }
    let gpus: Vec<Gpu> = serde_json::from_str(&node.node.gpus).map_err(anyhow::Error::from)?;
    let skew = ClockSkew::of_batch(body.sent_at.as_deref(), state.clock.now_ms());
    let ran_here = gpus_of_tasks_here(&state, &node.node.id, &body.samples).await?;
    let mut rows = Vec::with_capacity(body.samples.len());
    for s in &body.samples {
        // A node reports only its own GPUs.
        let Some(gpu) = gpus.iter().find(|g| g.index == s.gpu_index) else {
            return Err(ApiError::Refused {
                field: "samples",
                message: format!("this node has no GPU {}", s.gpu_index),
            });
        };
        if !s.util.is_finite() || !(0.0..=1.0).contains(&s.util) {
            return Err(ApiError::invalid(
                "samples",
                format!("sample for GPU {} is out of range", s.gpu_index),
            ));
        }
        let at = parse_time_ms(&s.at)
            .ok_or_else(|| ApiError::invalid("samples", "sample time is not RFC 3339"))?;
        // A node's clock being off does not cost its samples: they move onto the server's.
        let at = skew.correct(Some(at));
        let mem_total = s.mem_total.max(gpu.mem_bytes);
        if let Some(t) = &s.task_id {
            // A node speaks only for the tasks it ran: samples naming another node's task
            // would count in that task's utilization and its organization's usage.
            let ok = ran_here.get(t.as_str()).is_some_and(|spans| {
                spans
                    .iter()
                    .any(|(g, until)| *g == s.gpu_index && until.is_none_or(|u| at <= u))
            });
            if !ok {
                return Err(ApiError::Refused {
                    field: "samples",
                    message: format!("task {t} did not run on GPU {} of this node", s.gpu_index),
                });
            }
        }
        rows.push(GpuSampleRecord {
            node_id: node.node.id.clone(),
            gpu_index: i64::from(s.gpu_index),
            at,
            util: s.util,
            mem_used: s.mem_used.min(mem_total) as i64,
            mem_total: mem_total as i64,
            temperature: s.temperature.filter(|v| v.is_finite()),
            power_w: s.power_w.filter(|v| v.is_finite()),
            task_id: s.task_id.clone(),
        });
    }
    state.store.insert_gpu_samples(&rows).await?;
    state.agents.data_stored();
    for s in &body.samples {
        let labels = [node.node.id.as_str(), &s.gpu_index.to_string()];
        state
            .metrics
            .gpu_util
            .with_label_values(&labels)
            .set(s.util);
        state
            .metrics
            .gpu_mem
            .with_label_values(&labels)
            .set(s.mem_used as f64);
    }
    state.metrics.samples_ingested.inc_by(rows.len() as u64);
    Ok(HttpResponse::NoContent().finish())
}
