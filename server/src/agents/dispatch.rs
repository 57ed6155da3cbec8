//! What a node should be doing, derived from the store on every poll: the store is the single
//! source of truth, so a lost answer or a restarted agent converges on the next poll. A poll
//! reads only its node's tasks, by the store's index of placements, so a thousand agents
//! polling cost a thousand small reads, not a thousand scans of the queue.

use std::collections::{BTreeMap, HashSet};

use autodl_common::agent::{Assignment, PollResponse, RunningRef, StopOrder};
use autodl_common::tasks::{TaskSpec, TaskState};

use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{HostDetail, NodeRecord, TaskRecord};
use crate::tasks::lifecycle::final_stop;

pub const HEARTBEAT_S: u64 = 5;

/// Runs the server believes this node has but its agent does not report (its agent was
/// restarted, or lost them some other way) go back to the queue at once, each as a lost
/// attempt rather than as a failure of its task, and resume from their newest checkpoint.
///
/// Only runs the agent said it started are judged: the agent lists an attempt from the moment
/// it takes the assignment, before it reports the start, and its polls are sequential, so a
/// poll that misses a started attempt comes from an agent that no longer has it. `here` is the
/// node's placed tasks, as for [`work_for`].
pub async fn reconcile(
    state: &AppState,
    node: &NodeRecord,
    running: &[RunningRef],
    here: &[TaskRecord],
) -> Result<usize, ApiError> {
    let reported: HashSet<(&str, u32)> = running
        .iter()
        .map(|r| (r.task_id.as_str(), r.attempt))
        .collect();
    let mut lost = 0;
    for t in here {
        if t.state != TaskState::Running {
            continue;
        }
        let Some(placement) = t.placement.0.clone() else {
            continue;
        };
        let attempt = t.attempts as u32;
        if !placement.iter().any(|p| p.node == node.id)
            || reported.contains(&(t.id.as_str(), attempt))
        {
            continue;
        }
        // A gang's node whose workers all succeeded no longer lists the attempt: its part
        // ended and waits for the other nodes' (`reports::finished`).
        if placement.iter().any(|p| p.node != node.id)
            && state
                .store
                .ended_parts(&t.id, t.attempts)
                .await?
                .iter()
                .any(|p| p.node == node.id)
        {
            continue;
        }
        let last = match t.stop_reason.as_deref() {
            Some(r) => final_stop(r, &t.spec, attempt, None, t.batch_size),
            None => None,
        };
        if let Some(end) = last {
            // Stopped for good (time limit, idle) and gone unreported: it ended there.
            let now = state.clock.now_ms();
            if state
                .store
                .finish_attempt(&t.id, t.attempts, &end, now)
                .await?
            {
                lost += 1;
            }
            continue;
        }
        tracing::warn!(task = %t.id, attempt, node = %node.id, "the node no longer runs this attempt; requeueing it");
        let (reason, message) = match &t.stop_reason {
            // It was being stopped anyway: it stopped, unreported.
            Some(r) => (
                r.clone(),
                format!("{r}: the node stopped attempt {attempt}"),
            ),
            None => (
                "lost".to_owned(),
                format!(
                    "node {} no longer runs attempt {attempt} (its agent restarted)",
                    node.id
                ),
            ),
        };
        if state
            .store
            .requeue_task(None, &t.id, &reason, &message, state.clock.now_ms())
            .await?
        {
            lost += 1;
        }
    }
    if lost > 0 {
        state.scheduler.wake();
    }
    Ok(lost)
}

/// `here` is the node's placed tasks ([`crate::store::Tasks::node_tasks`]), read for this look.
pub async fn work_for(
    state: &AppState,
    node: &NodeRecord,
    running: &[RunningRef],
    here: &[TaskRecord],
) -> Result<PollResponse, ApiError> {
    let running_set: HashSet<(&str, u32)> = running
        .iter()
        .map(|r| (r.task_id.as_str(), r.attempt))
        .collect();
    let grace_s = state.scheduler.config.grace_s;
    let lost_s = state.settings.node_lost_timeout_secs;
    let mut out = PollResponse {
        // Heard well within the agent's fence (half the node timeout), whatever the timeout.
        heartbeat_s: HEARTBEAT_S.min((lost_s / 4).max(1)),
        node_lost_s: lost_s,
        tunnels: state.tunnels.take_for(&node.id),
        ..Default::default()
    };
    let mut expected: HashSet<(String, u32)> = HashSet::new();
    for t in here {
        if t.state == TaskState::Pending {
            continue;
        }
        let Some(placement) = t.placement.0.clone() else {
            continue;
        };
        if !placement.iter().any(|p| p.node == node.id) {
            continue;
        }
        let attempt = t.attempts as u32;
        expected.insert((t.id.clone(), attempt));
        let runs_here = running_set.contains(&(t.id.as_str(), attempt));
        if let Some(reason) = &t.stop_reason {
            if runs_here {
                out.stop.push(StopOrder {
                    task_id: t.id.clone(),
                    attempt,
                    grace_s,
                    reason: reason.clone(),
                    ends_task: crate::tasks::lifecycle::stop_ends_task(reason),
                });
            } else if t.state == TaskState::Scheduled {
                // Never started: nothing to checkpoint, back to the queue at once.
                state
                    .store
                    .requeue_task(
                        None,
                        &t.id,
                        reason,
                        &format!("{reason} before it started"),
                        state.clock.now_ms(),
                    )
                    .await?;
                state.scheduler.wake();
            }
            continue;
        }
        if t.state == TaskState::Scheduled && !runs_here {
            let spec = &t.spec;
            let rank0 = rank0_address(state, node, &placement).await?;
            let mut a = assignment(state, t, spec, node, &placement, rank0.as_deref())?;
            a.restore =
                crate::tasks::checkpoints::latest_checkpoint(state.store.as_ref(), &t.id).await?;
            out.assignments.push(a);
        }
    }
    for r in running {
        if !expected.contains(&(r.task_id.clone(), r.attempt)) {
            // Cancelled, or moved elsewhere while this agent was away.
            let reason = match state.store.task(None, &r.task_id).await? {
                Some(t) if t.task.state == TaskState::Cancelled => "cancelled",
                _ => "moved",
            };
            out.stop.push(StopOrder {
                task_id: r.task_id.clone(),
                attempt: r.attempt,
                grace_s,
                reason: reason.into(),
                ends_task: false,
            });
        }
    }
    Ok(out)
}

/// Where the tasks of other nodes reach rank 0's node, for a gang spanning nodes: its agent's
/// advertised address.
async fn rank0_address(
    state: &AppState,
    node: &NodeRecord,
    placement: &[autodl_common::tasks::WorkerPlacement],
) -> Result<Option<String>, ApiError> {
    let Some(first) = placement.first() else {
        return Ok(None);
    };
    if placement.iter().all(|p| p.node == first.node) {
        return Ok(None);
    }
    let rank0 = if first.node == node.id {
        Some(node.clone())
    } else {
        state.store.node(&first.node).await?
    };
    Ok(rank0.and_then(|n| HostDetail::of(&n).address))
}

/// The batch size each worker runs with: the task's (halved by out-of-memory retries), or
/// with `global_batch` its share of it among this attempt's `width` workers (rounded down, at
/// least 1), so the optimisation stays the same as an elastic task's width changes.
fn worker_batch(spec: &TaskSpec, batch: Option<i64>, width: u32) -> Option<u32> {
    let b = u32::try_from(batch?).ok()?;
    Some(if spec.global_batch {
        (b / width.max(1)).max(1)
    } else {
        b
    })
}

fn assignment(
    state: &AppState,
    t: &TaskRecord,
    spec: &TaskSpec,
    node: &NodeRecord,
    placement: &[autodl_common::tasks::WorkerPlacement],
    rank0_address: Option<&str>,
) -> Result<Assignment, ApiError> {
    let launch = crate::tasks::gang::node_launch(spec.launcher, placement, &node.id, rank0_address);
    let here: Vec<_> = placement.iter().filter(|p| p.node == node.id).collect();
    let gpu_indices: Vec<u32> = here
        .iter()
        .flat_map(|p| p.gpu_indices.iter().copied())
        .collect();
    let workers_here = here.len().max(1) as u64;

    let mut env: BTreeMap<String, String> = spec.env.clone();
    let mut set = |k: &str, v: String| {
        env.insert(k.to_owned(), v);
    };
    set("AUTODL_TASK_ID", t.id.clone());
    set("AUTODL_ATTEMPT", t.attempts.to_string());
    let width = placement.len().max(1) as u32;
    let batch = worker_batch(spec, t.batch_size, width);
    if let Some(b) = batch {
        set("AUTODL_BATCH_SIZE", b.to_string());
    }
    if let (true, Some(global)) = (spec.global_batch, t.batch_size) {
        set("AUTODL_GLOBAL_BATCH_SIZE", global.to_string());
    }
    set("AUTODL_IS_RESTORED", "0".into());
    set("AUTODL_API_URL", state.settings.public_url());
    // Bound to this attempt, and refused once it is no longer current or running; the
    // expiry only bounds a token of an attempt that never ends. The JWT library checks it
    // against the machine's clock, so it is set from that clock.
    let exp = crate::clock::Clock::now_ms(&crate::clock::SystemClock) / 1000 + 30 * 86_400;
    set(
        "AUTODL_TASK_TOKEN",
        state
            .sessions
            .issue_task_token(&t.id, &t.user_id, t.attempts as u32, exp)?,
    );
    // This attempt's width: an elastic task's changes from one attempt to the next.
    set("AUTODL_NUM_WORKERS", width.to_string());
    if let Some(min) = spec.min_workers {
        set("AUTODL_MIN_WORKERS", min.to_string());
        set("AUTODL_MAX_WORKERS", spec.num_workers.to_string());
    }
    set("AUTODL_GPUS_PER_WORKER", spec.gpus_per_worker.to_string());
    env.extend(launch.env);

    Ok(Assignment {
        task_id: t.id.clone(),
        attempt: t.attempts as u32,
        image: spec.image.clone(),
        command: crate::tasks::spec::launch_command(spec),
        env,
        gpu_indices,
        gpu_memory: spec.gpu_memory,
        cpu: spec.cpu * workers_here as f64,
        memory: spec.memory.saturating_mul(workers_here),
        data_path: spec.data_path.clone(),
        code: spec.code.clone(),
        checkpoint: spec.checkpoint.clone(),
        batch_size: batch,
        restore: None,
        workers: launch.workers,
        rendezvous_timeout: crate::tasks::gang::rendezvous_timeout(spec, width),
        environment: (spec.setup.is_some() || spec.requirements.is_some()).then(|| {
            autodl_common::agent::EnvironmentSpec {
                scope: t.tenant_id.clone(),
                setup: spec.setup.clone(),
                requirements: spec.requirements.clone(),
                env: spec.env.clone(),
            }
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_global_batch_is_shared_among_the_attempts_workers() {
        let input = autodl_common::tasks::TaskSpecInput {
            name: "train".into(),
            image: "pytorch:2".into(),
            command: Some(autodl_common::tasks::Command::Shell(
                "python train.py".into(),
            )),
            ..Default::default()
        };
        let mut spec = crate::tasks::spec::normalise(input, 0).expect("a valid spec");
        assert_eq!(worker_batch(&spec, Some(256), 4), Some(256));
        spec.global_batch = true;
        assert_eq!(worker_batch(&spec, Some(256), 4), Some(64));
        assert_eq!(worker_batch(&spec, Some(256), 3), Some(85));
        // Halved by out-of-memory retries below the width, each worker still runs one.
        assert_eq!(worker_batch(&spec, Some(2), 4), Some(1));
        assert_eq!(worker_batch(&spec, None, 4), None);
    }
}
