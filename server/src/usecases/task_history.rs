//! What a task leaves as it runs, read by the people of its organization (and written, for
//! training metrics, by the task itself): the list of tasks, cancelling, events, attempts,
//! logs and metrics. Every read goes through [`find`], so other organizations' tasks are not
//! found.

use autodl_common::metrics::MetricLines;
use autodl_common::tasks::MetricSample;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{
    AttemptRecord, CancelOutcome, EventRecord, GpuSampleRecord, LogRecord, MetricRecord,
    TaskFilter, TaskWithUser,
};
use crate::usecases::reach::find;

/// A page of the organization's tasks (the filter is scoped by the caller's organization) and
/// how many match in all.
pub async fn list(
    state: &AppState,
    caller: &Caller,
    mut filter: TaskFilter,
) -> Result<(Vec<TaskWithUser>, i64), ApiError> {
    caller.tenant_id().clone_into(&mut filter.tenant_id);
    let rows = state.store.list_tasks(&filter).await?;
    let total = state.store.count_tasks(&filter).await?;
    Ok((rows, total))
}

/// How many of a task's latest reports its summary reads: enough for numbers reported apart
/// (`loss` each step, `val_loss` each epoch), few enough for a page of 200 tasks.
const SUMMARY_REPORTS: i64 = 50;

/// Fills each task's summary: the latest value of each number it reported
/// ([`crate::tasks::metrics::latest`]), in one read for all of them.
pub async fn summarize(
    state: &AppState,
    tasks: &mut [autodl_common::tasks::Task],
) -> Result<(), ApiError> {
    let ids: Vec<String> = tasks.iter().map(|t| t.id.clone()).collect();
    let mut by_task: std::collections::HashMap<String, Vec<MetricRecord>> =
        std::collections::HashMap::new();
    for (id, r) in state.store.recent_metrics(&ids, SUMMARY_REPORTS).await? {
        by_task.entry(id).or_default().push(r);
    }
    for t in tasks {
        if let Some(reported) = by_task.get(&t.id) {
            t.summary = crate::tasks::metrics::latest(reported);
        }
    }
    Ok(())
}

/// Cancels a task that has not finished (its resources are freed at the next cycle), and
/// answers it as it is now.
pub async fn cancel(
    state: &AppState,
    caller: &Caller,
    what: &str,
) -> Result<TaskWithUser, ApiError> {
    let id = crate::usecases::reach::id_of(state, caller, what).await?;
    let id = id.as_str();
    match state
        .store
        .cancel_task(caller.tenant_id(), id, state.clock.now_ms())
        .await?
    {
        CancelOutcome::Cancelled => state.scheduler.wake(),
        CancelOutcome::NotFound => return Err(ApiError::NotFound("no such task".into())),
        CancelOutcome::AlreadyFinished(s) => {
            return Err(ApiError::Conflict(format!("the task is already {s}")))
        }
    }
    find(state, caller, id).await
}

pub async fn events(state: &AppState, task_id: &str) -> Result<Vec<EventRecord>, ApiError> {
    Ok(state.store.task_events(task_id).await?)
}

pub async fn attempts(state: &AppState, task_id: &str) -> Result<Vec<AttemptRecord>, ApiError> {
    Ok(state.store.task_attempts(task_id).await?)
}

/// Up to `limit` log lines after line `after`, in order.
pub async fn logs(
    state: &AppState,
    task_id: &str,
    after: i64,
    limit: i64,
) -> Result<Vec<LogRecord>, ApiError> {
    Ok(state.store.task_logs(task_id, after, limit).await?)
}

/// Whether the task has finished (or is gone): a live tail ends once it has sent every line.
pub async fn has_ended(state: &AppState, task_id: &str) -> Result<bool, ApiError> {
    Ok(match state.store.task(None, task_id).await? {
        Some(t) => t.task.state.is_finished(),
        None => true,
    })
}

/// The task's own numbers after `metric_after` and its GPUs' samples after `gpu_after` (ms),
/// up to `limit` of each, as stored: a live chart keeps a cursor for each, since GPU samples
/// may arrive later than numbers the task reported.
pub async fn samples_since(
    state: &AppState,
    task_id: &str,
    (metric_after, gpu_after): (i64, i64),
    limit: i64,
) -> Result<(Vec<MetricRecord>, Vec<GpuSampleRecord>), ApiError> {
    let reported = state
        .store
        .task_metrics(task_id, metric_after, limit)
        .await?;
    let gpu = state
        .store
        .task_gpu_samples(task_id, gpu_after, limit)
        .await?;
    Ok((reported, gpu))
}

/// Up to `limit` samples after `after` (ms), the task's own numbers merged with its GPUs'.
pub async fn metrics(
    state: &AppState,
    task_id: &str,
    after: i64,
    limit: i64,
) -> Result<Vec<MetricSample>, ApiError> {
    let (reported, gpu) = samples_since(state, task_id, (after, after), limit).await?;
    let samples = crate::tasks::metrics::samples(reported, &gpu);
    Ok(samples.into_iter().map(|(_, s)| s).collect())
}

/// A window of the task's history as named lines, each thinned to `points`, reading at most
/// `max_rows` rows of each kind.
pub async fn metric_lines(
    state: &AppState,
    task_id: &str,
    (from, to): (i64, i64),
    points: usize,
    max_rows: i64,
) -> Result<MetricLines, ApiError> {
    Ok(crate::tasks::metrics::window(&*state.store, task_id, from, to, points, max_rows).await?)
}

/// The task a task token is for, while the attempt it was given to is live: a token outlives
/// nothing it was given for.
pub async fn task_of_token(
    state: &AppState,
    task_id: &str,
    attempt: u32,
) -> Result<TaskWithUser, ApiError> {
    let t = state
        .store
        .task(None, task_id)
        .await?
        .ok_or_else(|| ApiError::NotFound("no such task".into()))?;
    let live = matches!(t.task.state.as_str(), "scheduled" | "running")
        && t.task.attempts == i64::from(attempt);
    if !live {
        return Err(ApiError::Unauthorized(
            "this task token belongs to an attempt that has ended".into(),
        ));
    }
    Ok(t)
}

/// Keeps one sample of the task's own numbers (name → number), stamped now, tells live
/// charts, and has an ASHA sweep judge the trial when the sample takes it to a new rung.
pub async fn report_metrics(
    state: &AppState,
    task: &crate::store::TaskRecord,
    values: &std::collections::BTreeMap<String, serde_json::Value>,
) -> Result<(), ApiError> {
    let sample = serde_json::to_string(values).map_err(anyhow::Error::from)?;
    let now = state.clock.now_ms();
    state.store.add_metrics(&task.id, &[(now, sample)]).await?;
    state.agents.data_stored();
    crate::usecases::sweeps::judge_trial(state, task, values, now).await
}
