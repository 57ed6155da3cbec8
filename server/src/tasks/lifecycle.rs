//! What happens to a task when an attempt ends: the retry policy, and OOM recovery that halves
//! the batch size. Pure rules, so they are tested without a store.

use autodl_common::tasks::{TaskSpec, TaskState};

use crate::domain::ArtifactKind;
use crate::store::AttemptEnd;

/// Why an attempt ended, as the agent reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitKind {
    Success,
    Oom,
    Error,
}

impl ExitKind {
    pub fn reason(self) -> Option<&'static str> {
        match self {
            ExitKind::Success => None,
            ExitKind::Oom => Some("oom"),
            ExitKind::Error => Some("error"),
        }
    }
}

/// `attempt` is the number of the attempt that ended (1 for the first run), `earlier_failures`
/// how many attempts before it failed (errors and OOMs: preempted, lost or drained runs are
/// not the task's failures and do not spend its retries); `batch_size` the one it ran with;
/// `detail` what the agent said of why (see `FinishedReport::detail`).
pub fn after_attempt(
    spec: &TaskSpec,
    attempt: u32,
    earlier_failures: u32,
    batch_size: Option<u32>,
    exit_code: Option<i64>,
    kind: ExitKind,
    detail: Option<&str>,
) -> AttemptEnd {
    let mut code = exit_code
        .map(|c| format!(" (exit code {c})"))
        .unwrap_or_default();
    if let Some(d) = detail {
        code = format!("{code}: {d}");
    }
    if kind == ExitKind::Success {
        return AttemptEnd {
            exit_code,
            reason: None,
            next_state: TaskState::Completed,
            next_batch_size: batch_size.map(i64::from),
            message: format!("attempt {attempt} completed{code}"),
        };
    }
    let what = if kind == ExitKind::Oom {
        "ran out of GPU memory"
    } else {
        "failed"
    };
    let retries_used = earlier_failures;
    if retries_used >= spec.retry_policy.max_retries {
        return AttemptEnd {
            exit_code,
            reason: kind.reason().map(str::to_owned),
            next_state: TaskState::Failed,
            next_batch_size: batch_size.map(i64::from),
            message: format!("attempt {attempt} {what}{code}; no retries left"),
        };
    }
    let (next_batch, note) = match (kind, spec.retry_policy.oom_recovery, batch_size) {
        (ExitKind::Oom, true, Some(b)) if b > 1 => {
            (Some(b / 2), format!("; retrying with batch size {}", b / 2))
        }
        (ExitKind::Oom, true, Some(_)) => (
            Some(1),
            "; batch size is already 1, retrying as is".to_owned(),
        ),
        // Said in the timeline, so an identical retry is no surprise: the memory may have been
        // a neighbour's on a shared GPU, but a task that always needs more will fail again.
        (ExitKind::Oom, true, None) => (
            None,
            "; retrying as is: the task has no batch_size for oom_recovery to halve".to_owned(),
        ),
        _ => (batch_size, "; retrying".to_owned()),
    };
    AttemptEnd {
        exit_code,
        reason: kind.reason().map(str::to_owned),
        next_state: TaskState::Pending,
        next_batch_size: next_batch.map(i64::from),
        message: format!("attempt {attempt} {what}{code}{note}"),
    }
}

/// The stop reason of a run stopped at its task's time limit.
pub const TIMED_OUT: &str = "timed_out";

/// How a run stopped at its time limit ends: the task is `timed_out`, whatever retries it has
/// left (running longer again would only meet the same limit).
pub fn timed_out(
    spec: &TaskSpec,
    attempt: u32,
    exit_code: Option<i64>,
    batch_size: Option<i64>,
) -> AttemptEnd {
    let limit = spec.time_limit.unwrap_or_default();
    AttemptEnd {
        exit_code,
        reason: Some(TIMED_OUT.to_owned()),
        next_state: TaskState::TimedOut,
        next_batch_size: batch_size,
        message: format!(
            "attempt {attempt} reached the time limit of {}; stopped",
            humantime::format_duration(std::time::Duration::from_secs(limit))
        ),
    }
}

/// Whether a stop for `reason` ends the task instead of sending its run back to the queue
/// (the reasons [`final_stop`] ends a task for).
pub fn stop_ends_task(reason: &str) -> bool {
    matches!(reason, TIMED_OUT | super::session::IDLE)
}

/// How a run ends that was stopped for good, not to run again elsewhere: at its time limit
/// (`timed_out`) or for sitting idle (`cancelled`, its GPUs given back). `None` for the stop
/// reasons that send a run back to the queue (preempted, drained, ...).
pub fn final_stop(
    reason: &str,
    spec: &TaskSpec,
    attempt: u32,
    exit_code: Option<i64>,
    batch_size: Option<i64>,
) -> Option<AttemptEnd> {
    match reason {
        TIMED_OUT => Some(timed_out(spec, attempt, exit_code, batch_size)),
        super::session::IDLE => Some(AttemptEnd {
            exit_code,
            reason: Some(super::session::IDLE.to_owned()),
            next_state: TaskState::Cancelled,
            next_batch_size: batch_size,
            message: format!("attempt {attempt} stopped: its GPUs sat idle; they were given back"),
        }),
        _ => None,
    }
}

/// An ended task whose results its node still keeps, uploading them once the server or
/// storage takes them (see `FinishedReport::uploading`).
pub const RESULTS_UPLOADING: &str = "uploading";
/// An ended task whose results could not be kept: its timeline says why.
pub const RESULTS_LOST: &str = "lost";

/// What an end report says of the folders the attempt saved, for a run ending in `next`:
/// where the task's results stand (`Task::results`) and the words added to the attempt's
/// message. `uploading` lists the folders its node keeps until the server has them;
/// `not_kept`, why the node could not keep them; `others_keeping`, the other nodes of a gang
/// that still keep their workers' results (their parts ended earlier).
pub fn results_on_end(
    next: TaskState,
    uploading: &[String],
    not_kept: Option<&str>,
    node: &str,
    others_keeping: &[String],
) -> (Option<&'static str>, String) {
    let listed = |kind: ArtifactKind| uploading.iter().any(|k| k == kind.as_str());
    let checkpoint_uploading = listed(ArtifactKind::Checkpoint);
    let keepers: Vec<&str> = listed(ArtifactKind::Results)
        .then_some(node)
        .into_iter()
        .chain(others_keeping.iter().map(String::as_str))
        .collect();
    // Every end keeps what the run left (a failed run's files tell why it failed); a run
    // sent back to the queue has its results from the attempt that ends the task.
    let ended = next.is_finished();
    let mut note = String::new();
    let mut results = None;
    if ended && !keepers.is_empty() {
        results = Some(RESULTS_UPLOADING);
        let who = match keepers.as_slice() {
            [one] => format!("node {one} keeps them"),
            many => format!("nodes {} keep them", many.join(", ")),
        };
        note.push_str(&format!(
            "; its results are uploading: {who} until they are stored"
        ));
    } else if let Some(why) = not_kept.filter(|_| ended) {
        results = Some(RESULTS_LOST);
        note.push_str(&format!("; its results could not be kept: {why}"));
    }
    // A run sent back to the queue starts again from what was saved before: its late
    // checkpoint is refused, so it is not promised.
    if checkpoint_uploading && next.is_finished() {
        note.push_str(&format!(
            "; its last checkpoint is uploading from node {node}"
        ));
    }
    (results, note)
}

#[cfg(test)]
mod tests {
    use super::*;
    use autodl_common::tasks::{Command, RetryPolicy, TaskSpecInput};

    fn spec(max_retries: u32, oom_recovery: bool) -> TaskSpec {
        let mut s = crate::tasks::spec::normalise(
            TaskSpecInput {
                name: "t".into(),
                image: "i".into(),
                command: Some(Command::Shell("true".into())),
                ..Default::default()
            },
            0,
        )
        .unwrap();
        s.retry_policy = RetryPolicy {
            max_retries,
            oom_recovery,
        };
        s
    }

    #[test]
    fn success_completes() {
        let e = after_attempt(
            &spec(3, true),
            1,
            0,
            Some(64),
            Some(0),
            ExitKind::Success,
            None,
        );
        assert_eq!(e.next_state, TaskState::Completed);
        assert_eq!(e.reason, None);
    }

    #[test]
    fn failures_retry_until_the_budget_is_spent() {
        let s = spec(2, false);
        assert_eq!(
            after_attempt(&s, 1, 0, None, Some(1), ExitKind::Error, None).next_state,
            TaskState::Pending
        );
        assert_eq!(
            after_attempt(&s, 2, 1, None, Some(1), ExitKind::Error, None).next_state,
            TaskState::Pending
        );
        let last = after_attempt(&s, 3, 2, None, Some(1), ExitKind::Error, None);
        assert_eq!(last.next_state, TaskState::Failed);
        assert_eq!(last.reason.as_deref(), Some("error"));
        assert_eq!(
            after_attempt(&spec(0, false), 1, 0, None, Some(1), ExitKind::Error, None).next_state,
            TaskState::Failed
        );
        // Runs that were preempted or lost before do not count: attempt 4 is the first failure.
        assert_eq!(
            after_attempt(&spec(1, false), 4, 0, None, Some(1), ExitKind::Error, None).next_state,
            TaskState::Pending
        );
    }

    #[test]
    fn the_agent_s_reason_is_in_the_message() {
        let why = "the gang did not form within 600 s";
        let e = after_attempt(
            &spec(0, false),
            1,
            0,
            None,
            Some(143),
            ExitKind::Error,
            Some(why),
        );
        assert_eq!(e.next_state, TaskState::Failed);
        assert_eq!(
            e.message,
            format!("attempt 1 failed (exit code 143): {why}; no retries left")
        );
    }

    #[test]
    fn oom_recovery_halves_the_batch() {
        let e = after_attempt(
            &spec(3, true),
            1,
            0,
            Some(64),
            Some(137),
            ExitKind::Oom,
            None,
        );
        assert_eq!(e.next_state, TaskState::Pending);
        assert_eq!(e.next_batch_size, Some(32));
        assert_eq!(e.reason.as_deref(), Some("oom"));
        assert_eq!(
            after_attempt(&spec(3, true), 2, 1, Some(1), None, ExitKind::Oom, None).next_batch_size,
            Some(1)
        );
        // Without a batch size there is nothing to halve, and the retry says so.
        let e = after_attempt(&spec(3, true), 1, 0, None, Some(137), ExitKind::Oom, None);
        assert_eq!(
            (e.next_state, e.next_batch_size),
            (TaskState::Pending, None)
        );
        assert!(e.message.contains("no batch_size"), "{}", e.message);
        // Without oom_recovery the batch stays.
        assert_eq!(
            after_attempt(&spec(3, false), 1, 0, Some(64), None, ExitKind::Oom, None)
                .next_batch_size,
            Some(64)
        );
    }

    #[test]
    fn results_kept_on_the_node_are_said_and_only_for_an_ended_task() {
        let up = vec!["results".to_owned(), "checkpoint".to_owned()];
        let (r, note) = results_on_end(TaskState::Completed, &up, None, "n1", &[]);
        assert_eq!(r, Some(RESULTS_UPLOADING));
        assert!(
            note.contains("results are uploading: node n1 keeps them"),
            "{note}"
        );
        assert!(note.contains("last checkpoint is uploading"), "{note}");
        let (r, note) = results_on_end(TaskState::Completed, &[], Some("disk full"), "n1", &[]);
        assert_eq!(r, Some(RESULTS_LOST));
        assert!(note.contains("could not be kept: disk full"), "{note}");
        // A failed or timed-out run's results are its task's too.
        let (r, note) = results_on_end(TaskState::Failed, &up, None, "n1", &[]);
        assert_eq!(r, Some(RESULTS_UPLOADING));
        assert!(note.contains("last checkpoint is uploading"), "{note}");
        let (r, _) = results_on_end(TaskState::TimedOut, &[], Some("x"), "n1", &[]);
        assert_eq!(r, Some(RESULTS_LOST));
        // A retried run starts again from what was saved before: nothing is promised.
        assert_eq!(
            results_on_end(TaskState::Pending, &up, None, "n1", &[]),
            (None, String::new())
        );
        assert_eq!(
            results_on_end(TaskState::Completed, &[], None, "n1", &[]),
            (None, String::new())
        );
        // A gang's other node ended its part earlier and keeps its workers' results still.
        let (r, note) = results_on_end(TaskState::Completed, &up, None, "n1", &["n2".into()]);
        assert_eq!(r, Some(RESULTS_UPLOADING));
        assert!(note.contains("nodes n1, n2 keep them"), "{note}");
        let (r, note) = results_on_end(TaskState::Completed, &[], None, "n1", &["n2".into()]);
        assert_eq!(r, Some(RESULTS_UPLOADING));
        assert!(note.contains("node n2 keeps them"), "{note}");
    }
}
