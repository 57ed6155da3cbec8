//! What agents report about the runs they hold: a start, output, the end, GPU samples. A node
//! speaks only for runs placed on it ([`current_run`]); times it sends are moved onto the
//! server's clock by the skew of its batch, so a node whose clock is off loses nothing.

use std::collections::HashMap;

use autodl_common::agent::{
    ExitReason, FinishedReport, GpuSample, LogBatch, MetricBatch, NotKeptReport, ProgressReport,
};
use autodl_common::tasks::TaskState;

use crate::agents::skew::ClockSkew;
use crate::domain::ArtifactKind;
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{GpuSampleRecord, NewLogLine, NodeRecord, PartEnded, RunEnd, RunStart};
use crate::tasks::lifecycle::{after_attempt, final_stop, results_on_end, ExitKind, RESULTS_LOST};
use crate::tasks::spec::parse_time_ms;
use crate::usecases::runs::{current_run, rank0_node, run_or_ended_run};

const MAX_LOG_LINES: usize = 1000;
const MAX_LINE_BYTES: usize = 16 * 1024;
const MAX_SAMPLES: usize = 10_000;

/// The run's process started: the task is running (reported again, nothing changes).
pub async fn started(
    state: &AppState,
    node: &str,
    task_id: &str,
    attempt: u32,
) -> Result<(), ApiError> {
    let t = current_run(state, node, task_id, attempt).await?;
    if t.task.state == TaskState::Scheduled {
        let placed_at = t.task.updated_at;
        state
            .starts
            .submit(RunStart {
                task_id: task_id.to_owned(),
                attempt: i64::from(attempt),
                at: state.clock.now_ms(),
            })
            .await?;
        state
            .metrics
            .dispatch_latency
            .observe((state.clock.now_ms() - placed_at).max(0) as f64 / 1000.0);
    }
    Ok(())
}

/// A step of a current attempt before its start, as an event of the task.
pub async fn progress(
    state: &AppState,
    node: &str,
    task_id: &str,
    report: &ProgressReport,
) -> Result<(), ApiError> {
    let kind = match report.stage.as_str() {
        "environment" => "environment",
        other => {
            return Err(ApiError::invalid(
                "stage",
                format!("stage is \"environment\", not {other:?}"),
            ))
        }
    };
    let message: String = report
        .message
        .chars()
        .filter(|c| !c.is_control())
        .take(500)
        .collect();
    if message.trim().is_empty() {
        return Err(ApiError::invalid("message", "message must not be empty"));
    }
    current_run(state, node, task_id, report.attempt).await?;
    state
        .store
        .add_event(task_id, kind, &message, state.clock.now_ms())
        .await?;
    Ok(())
}

/// Lines of output, kept in order, each at most 16 KiB.
pub async fn logs(
    state: &AppState,
    node: &str,
    task_id: &str,
    report: &LogBatch,
) -> Result<(), ApiError> {
    if report.lines.len() > MAX_LOG_LINES {
        return Err(ApiError::invalid(
            "lines",
            format!("at most {MAX_LOG_LINES} lines a call"),
        ));
    }
    let t = run_or_ended_run(state, node, task_id, report.attempt).await?;
    // In a task of several workers, the line's worker: this node's place in the placement
    // (the attempt's own once the task has ended and left its placement).
    let placement = match t.task.placement.0.clone() {
        Some(p) => Some(p),
        None => state
            .store
            .task_attempts(task_id)
            .await?
            .into_iter()
            .find(|a| a.number == i64::from(report.attempt))
            .map(|a| a.placement.0),
    };
    // The ranks this node runs; a line names its own (the agent's word for it is taken only
    // among these), else it is the node's first.
    let ranks: Vec<i64> = placement
        .filter(|p| p.len() > 1)
        .map(|p| {
            crate::tasks::gang::nodes_by_rank(&p)
                .iter()
                .enumerate()
                .filter(|(_, n)| **n == node)
                .map(|(r, _)| r as i64)
                .collect()
        })
        .unwrap_or_default();
    let skew = ClockSkew::of_batch(report.sent_at.as_deref(), state.clock.now_ms());
    let mut lines = Vec::with_capacity(report.lines.len());
    for l in &report.lines {
        let rank = l
            .rank
            .map(i64::from)
            .filter(|r| ranks.contains(r))
            .or(ranks.first().copied());
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
        lines.push(NewLogLine {
            at,
            stream,
            line,
            rank,
        });
    }
    state
        .store
        .append_logs(task_id, i64::from(report.attempt), &lines)
        .await?;
    state.agents.data_stored();
    Ok(())
}

/// The run ended: asked to stop (back to the queue), or by itself (success, or a failure that
/// is retried within the task's budget, an out-of-memory one with a smaller batch).
pub async fn finished(
    state: &AppState,
    node: &str,
    task_id: &str,
    report: &FinishedReport,
) -> Result<(), ApiError> {
    let kind = match report.reason {
        ExitReason::Success => Some(ExitKind::Success),
        ExitReason::Error => Some(ExitKind::Error),
        ExitReason::Oom => Some(ExitKind::Oom),
        ExitReason::Stopped => None,
    };
    let t = current_run(state, node, task_id, report.attempt).await?;
    let detail = report.detail.as_deref().map(|d| sentence(d, 500));
    let now = state.clock.now_ms();
    // A gang spanning nodes ends when every node's workers have: a node whose workers all
    // succeeded waits for the others (as torchrun's agents do), its results stored or kept.
    let mut others_keeping = Vec::new();
    if matches!(kind, Some(ExitKind::Success)) {
        match part_ended(state, &t.task, node, report, now).await? {
            Some(keeping) => others_keeping = keeping,
            None => return Ok(()),
        }
    }
    let spec = &t.task.spec;
    let last = t
        .task
        .stop_reason
        .as_deref()
        .and_then(|r| final_stop(r, spec, report.attempt, report.exit_code, t.task.batch_size));
    match (kind, t.task.stop_reason.as_deref(), last) {
        // Stopped for good (time limit, idle), or failed while stopping: the task ends there.
        (None | Some(ExitKind::Error | ExitKind::Oom), Some(_), Some(end)) => {
            end_run(state, &t.task, spec, (report, node, &[]), end, now).await?;
        }
        // Stopped on the scheduler's request (preempted, drained), or failed while stopping:
        // back to the queue. A run that completed its work before it stopped is done.
        (None | Some(ExitKind::Error | ExitKind::Oom), Some(reason), None) => {
            state
                .store
                .requeue_task(None, task_id, reason, &format!("stopped: {reason}"), now)
                .await?;
        }
        (Some(kind), _, _) => {
            let earlier_failures = state
                .store
                .task_attempts(task_id)
                .await?
                .iter()
                .filter(|a| {
                    a.number < i64::from(report.attempt)
                        && matches!(a.reason.as_deref(), Some("error" | "oom"))
                })
                .count() as u32;
            let end = after_attempt(
                spec,
                report.attempt,
                earlier_failures,
                t.task.batch_size.map(|b| b as u32),
                report.exit_code,
                kind,
                detail.as_deref(),
            );
            end_run(
                state,
                &t.task,
                spec,
                (report, node, &others_keeping),
                end,
                now,
            )
            .await?;
        }
        // Stopped without being asked (the agent shut down): run it again elsewhere.
        (None, None, _) => {
            state
                .store
                .requeue_task(
                    None,
                    task_id,
                    "node_lost",
                    "the agent stopped the task",
                    now,
                )
                .await?;
        }
    }
    state.scheduler.wake();
    Ok(())
}

/// What a node's report that all of its workers succeeded means for their attempt: its end
/// (`Some`, with the gang's other nodes that still keep their workers' results), or, while
/// other nodes' workers of a gang still run, a wait for them (`None`; the part is recorded,
/// so the node's silence about the attempt from now on is not its loss).
async fn part_ended(
    state: &AppState,
    task: &crate::store::TaskRecord,
    node: &str,
    report: &FinishedReport,
    now: i64,
) -> Result<Option<Vec<String>>, ApiError> {
    let nodes: std::collections::BTreeSet<String> = task
        .placement
        .0
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|w| w.node)
        .collect();
    if nodes.len() < 2 {
        return Ok(Some(Vec::new()));
    }
    let part = PartEnded {
        node: node.to_owned(),
        results_uploading: report
            .uploading
            .iter()
            .any(|k| k == ArtifactKind::Results.as_str()),
        ended_at: now,
    };
    // `None`: said before (an answer lost on the way, or an end that failed after it).
    let (ended, first_word) = match state.store.end_part(&task.id, task.attempts, &part).await? {
        Some(ended) => (ended, true),
        None => (
            state.store.ended_parts(&task.id, task.attempts).await?,
            false,
        ),
    };
    let running: Vec<&str> = nodes
        .iter()
        .filter(|n| !ended.iter().any(|p| &p.node == *n))
        .map(String::as_str)
        .collect();
    if running.is_empty() {
        return Ok(Some(
            ended
                .into_iter()
                .filter(|p| p.results_uploading && p.node != node)
                .map(|p| p.node)
                .collect(),
        ));
    }
    if !first_word {
        return Ok(None);
    }
    if let Some(why) = &report.not_kept {
        state
            .store
            .add_event(
                &task.id,
                "results_lost",
                &format!(
                    "the results of the workers on node {node} could not be kept: {}",
                    sentence(why, 300)
                ),
                now,
            )
            .await?;
    }
    state
        .store
        .add_event(
            &task.id,
            "part_ended",
            &format!(
                "the workers on node {node} all succeeded; attempt {} ends when those on {} have too",
                task.attempts,
                running.join(", ")
            ),
            now,
        )
        .await?;
    Ok(None)
}

/// Closes the run (group-committed with other agents' end reports), then tells whoever
/// listens if the task ended for good. The report says what of its saved folders the node
/// still keeps, and `others_keeping` which other nodes of a gang keep theirs
/// ([`results_on_end`]).
async fn end_run(
    state: &AppState,
    task: &crate::store::TaskRecord,
    spec: &autodl_common::tasks::TaskSpec,
    (report, node, others_keeping): (&FinishedReport, &str, &[String]),
    mut end: crate::store::AttemptEnd,
    now: i64,
) -> Result<(), ApiError> {
    let not_kept = report.not_kept.as_deref().map(|d| sentence(d, 300));
    let (results, note) = results_on_end(
        end.next_state,
        &report.uploading,
        not_kept.as_deref(),
        node,
        others_keeping,
    );
    end.message.push_str(&note);
    let attempt = report.attempt;
    let ended = state
        .ends
        .submit(RunEnd {
            task_id: task.id.clone(),
            attempt: i64::from(attempt),
            end: end.clone(),
            at: now,
            results: results.map(str::to_owned),
        })
        .await?;
    // Ended here, not by a report that raced this one: told once.
    if ended {
        tell_ended(state, task, spec, attempt, (&end, results), now).await;
    }
    if !others_keeping.is_empty() {
        // A node that kept its results may have stored them while this end was written.
        crate::usecases::uploads::settle_when_every_part_is_in(
            state,
            &task.id,
            i64::from(attempt),
            "results of every node stored",
        )
        .await?;
    }
    Ok(())
}

/// The node gave up results (or a checkpoint) it kept for the server: kept too long, or its
/// disk was needed. The task says plainly that they are lost.
pub async fn not_kept(
    state: &AppState,
    node: &str,
    task_id: &str,
    report: &NotKeptReport,
) -> Result<(), ApiError> {
    let kind = ArtifactKind::parse(&report.kind)?;
    let t = run_or_ended_run(state, node, task_id, report.attempt).await?;
    // Only rank 0's node saves (and so keeps) a task's checkpoints; every node of the attempt
    // saves its own workers' results.
    let rank0 = rank0_node(state, task_id, i64::from(report.attempt)).await?;
    if kind == ArtifactKind::Checkpoint && rank0.as_deref() != Some(node) {
        return Err(ApiError::Conflict(format!(
            "node {node} does not keep what attempt {} of task {task_id} saved (rank 0's node does)",
            report.attempt
        )));
    }
    let reason = sentence(&report.reason, 300);
    let now = state.clock.now_ms();
    match kind {
        // One node of a gang: its part is lost, the others' stand.
        ArtifactKind::Results
            if !state
                .store
                .ended_parts(&t.task.id, i64::from(report.attempt))
                .await?
                .is_empty() =>
        {
            state
                .store
                .part_results_settled(&t.task.id, i64::from(report.attempt), node)
                .await?;
            state
                .store
                .add_event(
                    &t.task.id,
                    "results_lost",
                    &format!(
                        "the results of the workers on node {node} could not be kept: {reason}"
                    ),
                    now,
                )
                .await?;
            crate::usecases::uploads::settle_when_every_part_is_in(
                state,
                &t.task.id,
                i64::from(report.attempt),
                &format!("results stored, except those of node {node}'s workers"),
            )
            .await?;
        }
        ArtifactKind::Results => {
            state
                .store
                .settle_results(
                    &t.task.id,
                    i64::from(report.attempt),
                    Some(RESULTS_LOST),
                    &format!("its results could not be kept by node {node}: {reason}"),
                    now,
                )
                .await?;
        }
        ArtifactKind::Checkpoint => {
            state
                .store
                .add_event(
                    &t.task.id,
                    "checkpoint_lost",
                    &format!(
                        "the last checkpoint of attempt {} could not be kept by node {node}: {reason}",
                        report.attempt
                    ),
                    now,
                )
                .await?;
        }
    }
    Ok(())
}

/// An agent's words for a task's timeline: a sentence of at most `max` characters, not a log.
fn sentence(raw: &str, max: usize) -> String {
    raw.chars().filter(|c| !c.is_control()).take(max).collect()
}

/// Tells the organization's webhooks of a task that ended for good.
async fn tell_ended(
    state: &AppState,
    task: &crate::store::TaskRecord,
    spec: &autodl_common::tasks::TaskSpec,
    attempt: u32,
    (end, results): (&crate::store::AttemptEnd, Option<&str>),
    now: i64,
) {
    use crate::notify::{tell, Event};
    let Some(event) = Event::of_end(end.next_state) else {
        return;
    };
    let data = serde_json::json!({
        "task": {"id": task.id, "name": task.name, "user_id": task.user_id, "kind": spec.kind},
        "state": end.next_state.as_str(),
        "attempt": attempt,
        "exit_code": end.exit_code,
        "reason": end.reason,
        "message": end.message,
        "results": results,
    });
    let owner = [task.user_id.as_str()];
    tell(
        state.store.as_ref(),
        &task.tenant_id,
        &owner,
        event,
        data,
        now,
    )
    .await;
}

/// How long after an attempt ended its node may still deliver samples taken during it (an
/// agent that was away sends what it buffered).
const LATE_SAMPLES_MS: i64 = 3_600_000;

/// For each task the samples name: the GPUs of this node its attempts held, and until when
/// samples are accepted (`None` while the attempt runs).
async fn gpus_of_tasks_here<'a>(
    state: &AppState,
    node_id: &str,
    samples: &'a [GpuSample],
) -> Result<HashMap<&'a str, Vec<(u32, Option<i64>)>>, ApiError> {
    let mut out = HashMap::new();
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
            for w in a.placement.iter().filter(|w| w.node == node_id) {
                spans.extend(w.gpu_indices.iter().map(|g| (*g, until)));
            }
        }
        out.insert(t, spans);
    }
    Ok(out)
}

/// GPU samples in batches. A sample for a GPU the node does not have, or naming a task that
/// did not run on that GPU of this node, rejects the whole batch (nothing is stored).
pub async fn metrics(
    state: &AppState,
    node: &NodeRecord,
    report: &MetricBatch,
) -> Result<(), ApiError> {
    if report.samples.len() > MAX_SAMPLES {
        return Err(ApiError::invalid(
            "samples",
            format!("at most {MAX_SAMPLES} samples a call"),
        ));
    }
    let gpus = &node.gpus;
    let skew = ClockSkew::of_batch(report.sent_at.as_deref(), state.clock.now_ms());
    let ran_here = gpus_of_tasks_here(state, &node.id, &report.samples).await?;
    let mut rows = Vec::with_capacity(report.samples.len());
    for s in &report.samples {
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
            node_id: node.id.clone(),
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
    for s in &report.samples {
        let labels = [node.id.as_str(), &s.gpu_index.to_string()];
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
    Ok(())
}
