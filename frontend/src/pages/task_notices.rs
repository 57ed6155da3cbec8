//! What a task's page says of it beyond its fields: results that are not simply there, an
//! idle warning or stop, and why a failed task failed (how, where, after how many tries).

use autodl_common::tasks::{Attempt, Task, TaskEvent, TaskState};

/// What the page says of results that are not simply there (`Task::results`).
pub(super) fn results_notice(t: &Task) -> Option<(&'static str, &'static str)> {
    match t.results.as_deref()? {
        "uploading" => Some((
            "banner warn",
            "Results uploading: the run ended while the server or storage was away; its node keeps them and uploads them (the timeline says which node).",
        )),
        "lost" => Some((
            "banner error",
            "Results lost: they could not be kept (the timeline says why).",
        )),
        _ => None,
    }
}

/// An idle warning is easy to miss among the events: the latest one is said at the top while
/// the task runs, and the stop when idleness ended it (with the GPU-hours it held idle).
pub(super) fn idle_notice(
    state: TaskState,
    events: &[TaskEvent],
) -> Option<(&'static str, &TaskEvent)> {
    let last = events
        .iter()
        .rev()
        .find(|e| e.kind == "idle" || e.kind == "idle_stop")?;
    match (state.is_finished(), last.kind.as_str()) {
        (false, "idle") => Some(("Idle GPUs, warned", last)),
        (_, "idle_stop") => Some(("Stopped for idle GPUs", last)),
        _ => None,
    }
}

/// What a researcher asks first of a task that failed: how it ended, where, after how many
/// tries. Said from its last attempt.
pub(super) fn failure_summary(t: &Task, attempts: &[Attempt]) -> Option<String> {
    if t.state == TaskState::TimedOut {
        let limit = t.spec.time_limit.map(span_words).unwrap_or_default();
        return Some(format!(
            "It ran for its whole time limit ({limit}) and was stopped. Raise time_limit, or \
             checkpoint and submit it again to continue."
        ));
    }
    if t.state != TaskState::Failed {
        return None;
    }
    let Some(last) = attempts.iter().max_by_key(|a| a.number) else {
        return Some("It failed before it could start.".into());
    };
    let how = match (last.reason.as_deref(), last.exit_code) {
        (Some("oom"), _) => "ran out of GPU memory".to_owned(),
        (Some("node_lost"), _) => "lost its node".to_owned(),
        (_, Some(code)) => format!("exited with code {code}"),
        (Some(r), None) => exit_reason(Some(r), None).to_owned(),
        (None, None) => "stopped".to_owned(),
    };
    let node = last
        .node
        .clone()
        .or_else(|| last.placement.first().map(|p| p.node.clone()))
        .map(|n| format!(" on {n}"))
        .unwrap_or_default();
    let tries = match t.attempts {
        0 | 1 => String::new(),
        n => format!(" after {n} attempts"),
    };
    Some(format!(
        "Attempt {} {how}{node}{tries}. The log below ends where it stopped.",
        last.number
    ))
}

/// "2h 30m" for 9,000 seconds.
pub(super) fn span_words(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3_600 % 24, secs / 60 % 60, secs % 60);
    let parts: Vec<String> = [(d, "d"), (h, "h"), (m, "m"), (s, "s")]
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, u)| format!("{n}{u}"))
        .collect();
    if parts.is_empty() {
        "0s".into()
    } else {
        parts.join(" ")
    }
}

pub(super) fn exit_reason(reason: Option<&str>, code: Option<i32>) -> &'static str {
    match reason {
        Some("oom") => "out of GPU memory",
        Some("error") => "exited with an error",
        Some("preempted") => "preempted (checkpointed)",
        Some("resized") => "resized (restarts from its checkpoint with more or fewer workers)",
        Some("migrated") => "moved to other GPUs (checkpointed)",
        Some("drained") => "node drained",
        Some("node_lost") => "node lost",
        Some("cancelled") => "cancelled",
        Some("timed_out") => "reached its time limit",
        Some(_) => "other",
        None if code == Some(0) => "succeeded",
        None => "",
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::task_view::gpu_hours;
    use super::super::tasks::bytes;
    use super::*;
    use autodl_common::tasks::TaskSpec;
    use autodl_common::tasks::WorkerPlacement;

    #[test]
    fn the_latest_idle_warning_shows_while_running_and_the_stop_after() {
        let e = |kind: &str, message: &str| TaskEvent {
            at: "2026-12-03T10:00:00.000Z".into(),
            kind: kind.into(),
            message: message.into(),
        };
        let warned = [e("submitted", "-"), e("idle", "first"), e("idle", "second")];
        let (head, last) = idle_notice(TaskState::Running, &warned).unwrap();
        assert_eq!(
            (head, last.message.as_str()),
            ("Idle GPUs, warned", "second")
        );
        // A warning is history once the task has ended for another reason.
        assert!(idle_notice(TaskState::Completed, &warned).is_none());
        let stopped = [e("idle", "w"), e("idle_stop", "0.50 GPU-hours idle")];
        let (head, last) = idle_notice(TaskState::Cancelled, &stopped).unwrap();
        assert_eq!(head, "Stopped for idle GPUs");
        assert!(last.message.contains("GPU-hours idle"));
        assert!(idle_notice(TaskState::Running, &warned[..1]).is_none());
    }

    #[test]
    fn results_not_simply_there_are_said() {
        let mut t = task(TaskState::Completed, 1);
        assert!(results_notice(&t).is_none());
        t.results = Some("uploading".into());
        assert!(results_notice(&t)
            .unwrap()
            .1
            .starts_with("Results uploading"));
        t.results = Some("lost".into());
        assert_eq!(results_notice(&t).unwrap().0, "banner error");
    }

    /// A task in `state` after `attempts` tries, for the pages' tests.
    pub(crate) fn task(state: TaskState, attempts: u32) -> Task {
        Task {
            id: "t".into(),
            number: 1,
            name: "n".into(),
            state,
            user_id: "u".into(),
            user_email: "u@example.com".into(),
            tenant_id: "o".into(),
            spec: TaskSpec {
                name: "n".into(),
                image: "i".into(),
                command: vec!["true".into()],
                entry_point: None,
                env: Default::default(),
                gpu_types: vec![],
                gpus_per_worker: 1,
                gpu_memory: None,
                cpu: 1.0,
                memory: 1,
                num_workers: 1,
                min_workers: None,
                launcher: Default::default(),
                priority: 0.5,
                deadline: None,
                estimated_runtime: None,
                time_limit: None,
                rendezvous_timeout: None,
                checkpoint: None,
                retry_policy: Default::default(),
                zone_affinity: false,
                bandwidth: String::new(),
                data_path: None,
                code: None,
                setup: None,
                requirements: None,
                labels: Default::default(),
                batch_size: None,
                global_batch: false,
                preemptible: true,
                after: Vec::new(),
                sweep: None,
                after_when: Default::default(),
                after_failure: Default::default(),
                kind: Default::default(),
                ports: Vec::new(),
            },
            created_at: "2026-12-02T10:00:00Z".into(),
            updated_at: "2026-12-02T10:00:00Z".into(),
            attempts,
            batch_size: None,
            placement: None,
            waiting: None,
            started_at: None,
            finished_at: None,
            gpu_seconds: 0.0,
            results: None,
            summary: Default::default(),
        }
    }

    #[test]
    fn an_elastic_task_shows_its_range_of_gpus() {
        use super::super::tasks::gpu_summary;
        let mut t = task(TaskState::Pending, 0);
        t.spec.num_workers = 4;
        assert_eq!(gpu_summary(&t.spec), "4 × any");
        t.spec.min_workers = Some(2);
        assert_eq!(gpu_summary(&t.spec), "2–4 × any");
        assert_eq!(
            exit_reason(Some("resized"), None),
            "resized (restarts from its checkpoint with more or fewer workers)"
        );
    }

    fn attempt(number: u32, reason: Option<&str>, exit_code: Option<i32>) -> Attempt {
        Attempt {
            number,
            node: None,
            placement: vec![WorkerPlacement {
                node: "gpu-7".into(),
                gpu_indices: vec![0],
                port: None,
            }],
            started_at: "2026-12-02T10:00:00Z".into(),
            ended_at: Some("2026-12-02T10:05:00Z".into()),
            exit_code,
            reason: reason.map(str::to_owned),
            batch_size: None,
            gpu_seconds: 300.0,
        }
    }

    #[test]
    fn a_failed_task_says_how_where_and_after_how_many_tries() {
        let t = task(TaskState::Failed, 3);
        let a = [
            attempt(1, Some("oom"), None),
            attempt(3, Some("error"), Some(137)),
            attempt(2, Some("oom"), None),
        ];
        assert_eq!(
            failure_summary(&t, &a).unwrap(),
            "Attempt 3 exited with code 137 on gpu-7 after 3 attempts. The log below ends where it stopped."
        );
        let oom = [attempt(1, Some("oom"), None)];
        assert!(failure_summary(&task(TaskState::Failed, 1), &oom)
            .unwrap()
            .starts_with("Attempt 1 ran out of GPU memory on gpu-7."));
        assert!(failure_summary(&task(TaskState::Completed, 1), &oom).is_none());
        let mut limited = task(TaskState::TimedOut, 1);
        limited.spec.time_limit = Some(9_000);
        assert!(
            failure_summary(&limited, &[attempt(1, Some("timed_out"), None)])
                .unwrap()
                .starts_with("It ran for its whole time limit (2h 30m)")
        );
        assert_eq!(span_words(90), "1m 30s");
        assert_eq!(span_words(86_400 + 3_600), "1d 1h");
        assert_eq!(gpu_hours(300.0), "5 GPU-minutes");
        assert_eq!(gpu_hours(7200.0), "2.0 GPU-hours");
        assert_eq!(bytes(17), "17 B");
        assert_eq!(bytes(200_000), "195.3 KiB");
        assert_eq!(bytes(40 << 30), "40 GiB");
    }
}
