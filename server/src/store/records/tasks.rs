//! Tasks and sweeps, their attempts, events, logs and training metrics.

use autodl_common::tasks::{TaskSpec, TaskState, WorkerPlacement};

use super::JsonText;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TaskRecord {
    pub id: String,
    /// Its number in its organization (`#412`), given as it is stored (0 before).
    pub number: i64,
    pub tenant_id: String,
    pub user_id: String,
    pub name: String,
    #[sqlx(try_from = "String")]
    pub state: TaskState,
    /// The normalised spec.
    #[sqlx(try_from = "String")]
    pub spec: JsonText<TaskSpec>,
    pub gpus_total: i64,
    pub idempotency_key: Option<String>,
    pub attempts: i64,
    pub batch_size: Option<i64>,
    /// Where its workers are, while scheduled or running.
    #[sqlx(try_from = "Option<String>")]
    pub placement: JsonText<Option<Vec<WorkerPlacement>>>,
    pub attained_gpu_seconds: f64,
    pub last_checkpoint_at: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    /// Why the scheduler wants this placed task stopped (preempted, resized, migrated,
    /// drained).
    pub stop_reason: Option<String>,
    /// Why it waits (JSON of `Waiting`), as the leader's latest cycle explained it.
    pub waiting: Option<String>,
    /// "uploading" or "lost" when its results are not simply stored (see `Task::results`).
    pub results: Option<String>,
}

/// How a task is named to people: enough to tell several apart.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TaskHandle {
    pub id: String,
    pub number: i64,
    pub name: String,
}

/// One placement the scheduler writes: the task, its placement (JSON of worker placements), the
/// distinct nodes it occupies (first: the one its attempt names) and its GPU count.
#[derive(Debug, Clone)]
pub struct Placing {
    pub task: String,
    pub placement: String,
    pub nodes: Vec<String>,
    pub gpus: i64,
}

/// An active task with what the scheduler needs of its current run (none while pending).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SchedulingTaskRecord {
    #[sqlx(flatten)]
    pub task: TaskRecord,
    /// When the current run was placed.
    pub run_started_at: Option<i64>,
    /// Charged up to here (NULL: nothing yet, i.e. from its start).
    pub run_charged_until: Option<i64>,
    pub run_gpu_seconds: Option<f64>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TaskWithUser {
    #[sqlx(flatten)]
    pub task: TaskRecord,
    pub user_email: String,
}

#[derive(Debug, Clone, Default)]
pub struct TaskFilter {
    pub tenant_id: String,
    pub state: Option<TaskState>,
    pub user_id: Option<String>,
    pub label: Option<(String, String)>,
    /// Keyset cursor: only tasks strictly older than (created_at, id).
    pub before: Option<(i64, String)>,
    pub limit: i64,
}

/// A sweep as stored; its trials are tasks labelled `sweep=<id>`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SweepRecord {
    pub id: String,
    pub tenant_id: String,
    pub user_id: String,
    pub name: String,
    pub method: String,
    /// JSON of the parameters as asked for.
    pub parameters: String,
    pub max_concurrency: i64,
    pub trials: i64,
    pub created_at: i64,
    /// JSON of what it optimises (`tasks::asha::Objective`), when it names a metric.
    pub objective: Option<String>,
}

/// A sweep with the email of who made it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SweepWithUser {
    #[sqlx(flatten)]
    pub sweep: SweepRecord,
    pub user_email: String,
}

/// A task to store, with its labels.
#[derive(Clone)]
pub struct NewTask {
    pub task: TaskRecord,
    pub labels: Vec<(String, String)>,
    pub kind: autodl_common::tasks::TaskKind,
    /// Caps the task is held to, counted in the transaction that stores it (with everything
    /// stored before it), so concurrent submissions never pass them together.
    pub caps: TaskCaps,
}

/// A submission's caps: queued tasks of its user and of its organization, open sessions of
/// its user (a session only). `None`: no cap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TaskCaps {
    pub user_queued: Option<i64>,
    pub tenant_queued: Option<i64>,
    pub user_sessions: Option<i64>,
}

impl TaskCaps {
    pub fn any(&self) -> bool {
        self.user_queued.is_some() || self.tenant_queued.is_some() || self.user_sessions.is_some()
    }
}

/// An agent's report that a run's process started.
#[derive(Debug, Clone)]
pub struct RunStart {
    pub task_id: String,
    pub attempt: i64,
    /// When the server heard it.
    pub at: i64,
}

/// A run that ended, as its agent reported it.
#[derive(Debug, Clone)]
pub struct RunEnd {
    pub task_id: String,
    pub attempt: i64,
    pub end: AttemptEnd,
    /// When the server heard it.
    pub at: i64,
    /// Where the task's results stand if not simply stored ("uploading", "lost").
    pub results: Option<String>,
}

pub enum TaskCreated {
    /// Stored, with this number in its organization.
    Created(i64),
    /// The idempotency key was used before; this is the task it created.
    Existing(Box<TaskWithUser>),
    /// Not stored: it would pass one of its caps (what to tell the submitter).
    OverCap(String),
}

pub enum CancelOutcome {
    Cancelled,
    NotFound,
    AlreadyFinished(String),
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EventRecord {
    pub at: i64,
    pub kind: String,
    pub message: String,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AttemptRecord {
    pub task_id: String,
    pub number: i64,
    pub node: Option<String>,
    #[sqlx(try_from = "String")]
    pub placement: JsonText<Vec<WorkerPlacement>>,
    pub gpus: i64,
    pub started_at: i64,
    pub ended_at: Option<i64>,
    pub exit_code: Option<i64>,
    pub reason: Option<String>,
    pub batch_size: Option<i64>,
    pub gpu_seconds: f64,
}

/// A line of output to store: when (ms), `stdout`/`stderr`, the text, and the worker that
/// printed it in a multi-worker task.
#[derive(Debug, Clone, PartialEq)]
pub struct NewLogLine {
    pub at: i64,
    pub stream: String,
    pub line: String,
    pub rank: Option<i64>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct LogRecord {
    pub id: i64,
    pub attempt: i64,
    pub rank: Option<i64>,
    pub at: i64,
    pub stream: String,
    pub line: String,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct MetricRecord {
    pub at: i64,
    /// JSON object of the sample's values.
    pub sample: String,
}

/// How an attempt ended, and what the task does next.
#[derive(Debug, Clone)]
pub struct AttemptEnd {
    pub exit_code: Option<i64>,
    /// "oom", "error", "preempted", "resized", "node_lost", "cancelled", or None for success.
    pub reason: Option<String>,
    /// Completed, failed, or pending again (a retry).
    pub next_state: TaskState,
    pub next_batch_size: Option<i64>,
    pub message: String,
}

/// A node's part of a gang's attempt that ended with all of its workers succeeding, while
/// other nodes' workers may still run (see `Tasks::end_part`).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct PartEnded {
    pub node: String,
    /// The node still keeps its part's results for the server.
    pub results_uploading: bool,
    pub ended_at: i64,
}
