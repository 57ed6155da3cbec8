//! Wire types of tasks and nodes (see docs/tasks-api.md).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

/// A number of bytes, or a size with a unit such as "20GiB", "512MiB", "16GB".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(untagged)]
pub enum Size {
    Bytes(u64),
    Text(String),
}

/// A length of time: whole seconds, or text such as "2h30m", "90m", "1d 12h".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(untagged)]
pub enum TimeSpan {
    Seconds(u64),
    Text(String),
}

/// How many workers a task runs: a number (all of them, or it waits), or a range
/// `{"min": 2, "max": 8}` for an elastic task, which starts with as many workers as fit (at
/// least `min`), grows toward `max` into idle GPUs and gives workers up before it is preempted.
/// In a form: `4`, or `2-8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(untagged)]
pub enum WorkerCount {
    Fixed(u32),
    Range(WorkerRange),
}

/// The fewest and the most workers of an elastic task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct WorkerRange {
    pub min: u32,
    pub max: u32,
}

impl WorkerCount {
    /// The count a stored spec says: `max` workers, elastic down to `min` when given.
    pub fn of(max: u32, min: Option<u32>) -> WorkerCount {
        match min {
            Some(min) if min < max => WorkerCount::Range(WorkerRange { min, max }),
            _ => WorkerCount::Fixed(max),
        }
    }
}

impl std::fmt::Display for WorkerCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkerCount::Fixed(n) => write!(f, "{n}"),
            WorkerCount::Range(r) => write!(f, "{}-{}", r.min, r.max),
        }
    }
}

impl std::str::FromStr for WorkerCount {
    type Err = std::num::ParseIntError;

    /// `4`, or `2-8` for an elastic task.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('-') {
            Some((min, max)) => Ok(WorkerCount::Range(WorkerRange {
                min: min.trim().parse()?,
                max: max.trim().parse()?,
            })),
            None => Ok(WorkerCount::Fixed(s.trim().parse()?)),
        }
    }
}

/// Which end of the tasks in `after` lets a task start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum AfterWhen {
    /// Each completed.
    #[default]
    Ok,
    /// Each ended, however.
    Any,
}

/// What becomes of a task whose `after` can no longer be met (with `ok`, one of them failed,
/// was cancelled or timed out).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum AfterFailure {
    #[default]
    Cancel,
    Fail,
}

/// One value or a list of them (a GPU type, or several acceptable ones).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// Shell commands: a script, or a list of one-line commands run in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(untagged)]
pub enum Script {
    Text(String),
    Lines(Vec<String>),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(untagged)]
pub enum Command {
    Shell(String),
    Argv(Vec<String>),
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct GpuRequest {
    #[serde(default, rename = "type")]
    pub gpu_type: Option<OneOrMany>,
    #[serde(default)]
    pub count: Option<u32>,
    /// GPU memory per GPU; less than a card lets the task share it.
    #[serde(default)]
    pub memory: Option<Size>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Resources {
    #[serde(default)]
    pub gpu: Option<GpuRequest>,
    /// CPU cores per worker.
    #[serde(default)]
    pub cpu: Option<f64>,
    /// RAM per worker.
    #[serde(default)]
    pub memory: Option<Size>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CheckpointSpec {
    /// Seconds between checkpoints.
    #[serde(default)]
    pub interval: Option<u64>,
    /// `s3://bucket/path` in one of the platform's buckets (below the tenant's own prefix);
    /// the platform's default place when absent.
    #[serde(default)]
    pub save_to: Option<String>,
    /// Complete checkpoints kept; older ones are deleted (platform default when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<u32>,
}

/// Folders of a container's or sandbox's file system that a task's own checkpoint folder may
/// not be shown at, nor above or below: its system and the platform's own places. Shown over
/// `/etc` or `/usr/bin`, a folder the task writes would hand it what root runs as it starts.
const RESERVED_MOUNTS: [&str; 22] = [
    "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/proc",
    "/dev", "/sys", "/tmp", "/var", "/run", "/root", "/home", "/boot", "/srv", "/mnt", "/media",
    "/autodl",
];

/// Whether an absolute `checkpoint.save_to` (the seed articles' `checkpoint_path:
/// "/checkpoints"`) may be where a task sees its checkpoint folder: a plain absolute folder
/// apart from every reserved one. `Err` says why not.
pub fn checkpoint_mount_allowed(path: &str) -> Result<(), String> {
    let plain = path.starts_with('/')
        && path.len() > 1
        && !path.ends_with('/')
        && path[1..]
            .split('/')
            .all(|s| !s.is_empty() && s != "." && s != ".." && !s.contains(':'))
        && !path.chars().any(char::is_control);
    if !plain {
        return Err(format!(
            "{path:?} is not a plain absolute folder (such as /checkpoints)"
        ));
    }
    let within = |a: &str, b: &str| a == b || a.starts_with(&format!("{b}/"));
    if let Some(r) = RESERVED_MOUNTS
        .iter()
        .find(|r| within(path, r) || within(r, path))
    {
        return Err(format!(
            "{path} would cover {r}, which tasks may not replace; choose a folder of its own such as /checkpoints"
        ));
    }
    Ok(())
}

/// Checkpointing as asked: the interval as seconds or as text ("10m"), like every length of
/// time a task takes; the server makes it a [`CheckpointSpec`] of seconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CheckpointInput {
    /// Time between checkpoints: seconds, or text such as "10m".
    #[serde(default)]
    pub interval: Option<TimeSpan>,
    /// `s3://bucket/path` in one of the platform's buckets (below the tenant's own prefix);
    /// the platform's default place when absent.
    #[serde(default)]
    pub save_to: Option<String>,
    /// Complete checkpoints kept; older ones are deleted (platform default when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    #[serde(default)]
    pub max_retries: u32,
    /// Retry an out-of-memory attempt with the batch size halved.
    #[serde(default)]
    pub oom_recovery: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Affinity {
    /// "same" keeps all workers in one zone; "any" (default) does not care.
    #[serde(default)]
    pub zone: Option<String>,
    /// "high" or "normal".
    #[serde(default)]
    pub bandwidth: Option<String>,
}

/// What a task is for. A batch task runs its command to the end; a session holds its GPUs
/// for a person working in it (a shell, a notebook, declared ports) until it is stopped, runs
/// past its organization's session length, or sits idle.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[derive(strum::IntoStaticStr, strum::EnumString, strum::VariantArray)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum TaskKind {
    #[default]
    Batch,
    Session,
}

impl TaskKind {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// How a task's workers are started on each of its nodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[derive(strum::IntoStaticStr, strum::EnumString, strum::VariantArray)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum Launcher {
    /// A process per worker, each with its own GPUs and the variables of
    /// `torch.distributed`'s `env://` (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, ...), as a Kubeflow
    /// PyTorchJob or torchrun would start them: a script written for either runs unchanged.
    #[default]
    Workers,
    /// One process per node for the user's own `torchrun`, whose options come from `PET_*`
    /// variables (nodes, this node's rank, processes per node, the rendezvous endpoint).
    Torchrun,
    /// One process per node with all of the node's GPUs and node-level variables; the
    /// command starts its workers itself.
    None,
}

impl Launcher {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// What a user submits.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TaskSpecInput {
    pub name: String,
    pub image: String,
    #[serde(default)]
    pub command: Option<Command>,
    #[serde(default)]
    pub entry_point: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub resources: Resources,
    /// A number, or `{"min", "max"}` for an elastic task ([`WorkerCount`]).
    #[serde(default)]
    pub num_workers: Option<WorkerCount>,
    #[serde(default)]
    pub gpu_per_worker: Option<u32>,
    /// How workers start: `workers` (default, a process each), `torchrun` or `none`.
    #[serde(default)]
    pub launcher: Option<Launcher>,
    #[serde(default)]
    pub priority: Option<f64>,
    /// ISO 8601; without an offset it is UTC.
    #[serde(default)]
    pub deadline: Option<String>,
    /// How long the task is expected to run (seconds, or "2h30m").
    #[serde(default)]
    pub estimated_runtime: Option<TimeSpan>,
    /// The longest a run may last (seconds, or "2h30m"): then it is stopped, with the grace
    /// period, and ends `timed_out`.
    #[serde(default)]
    pub time_limit: Option<TimeSpan>,
    /// How long a gang's workers have to meet at its rendezvous once rank 0 runs (seconds, or
    /// "10m"; default 10 minutes): then an attempt that has not formed ends, saying so,
    /// instead of holding its GPUs.
    #[serde(default)]
    pub rendezvous_timeout: Option<TimeSpan>,
    #[serde(default)]
    pub checkpoint: Option<CheckpointInput>,
    #[serde(default)]
    pub retry_policy: Option<RetryPolicy>,
    #[serde(default)]
    pub affinity: Option<Affinity>,
    #[serde(default)]
    pub data_path: Option<String>,
    /// A code bundle uploaded with `POST /api/v1/code` (`sha256:...`): the task runs in it.
    #[serde(default)]
    pub code: Option<String>,
    /// Shell commands that prepare the task's environment (`pip install -e .`, a tool into
    /// `$AUTODL_ENV_DIR/bin`): a script, or a list of commands run in order. They run once
    /// per node for each distinct environment, which later attempts and tasks reuse.
    #[serde(default)]
    pub setup: Option<Script>,
    /// A pip requirements file in the task's code (`requirements.txt`), installed into the
    /// task's environment before `setup` runs.
    #[serde(default)]
    pub requirements: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub batch_size: Option<u32>,
    /// `batch_size` is the global batch, shared among the workers: each worker's
    /// `AUTODL_BATCH_SIZE` is its share, so an elastic task keeps its optimisation as its
    /// width changes.
    #[serde(default)]
    pub global_batch: Option<bool>,
    #[serde(default)]
    pub preemptible: Option<bool>,
    /// Ids of tasks of the organization that must end first.
    #[serde(default)]
    pub after: Vec<String>,
    /// `ok` (default): start when each of `after` completed; `any`: when each ended.
    #[serde(default)]
    pub after_when: Option<AfterWhen>,
    /// `cancel` (default) or `fail` this task when `after` can no longer be met.
    #[serde(default)]
    pub after_failure: Option<AfterFailure>,
    /// `batch` (default) or `session`.
    #[serde(default)]
    pub kind: Option<TaskKind>,
    /// TCP ports the task listens on that its owner may reach through the server
    /// (`autodl port-forward`, the task page's "Open" link).
    #[serde(default)]
    pub ports: Vec<u16>,
}

/// The spec as the server keeps it: validated, with defaults filled in and sizes in bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct TaskSpec {
    pub name: String,
    pub image: String,
    pub command: Vec<String>,
    /// The script the task was given as (`command` runs it with Python): the node checks it
    /// is there before it starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry_point: Option<String>,
    pub env: BTreeMap<String, String>,
    /// Acceptable GPU types; empty accepts any.
    pub gpu_types: Vec<String>,
    pub gpus_per_worker: u32,
    /// Per GPU; `None` takes whole cards.
    pub gpu_memory: Option<u64>,
    pub cpu: f64,
    pub memory: u64,
    /// Workers wanted: all of them, or for an elastic task at most this many.
    pub num_workers: u32,
    /// The fewest workers an elastic task runs with; absent for a rigid one. A run's own
    /// width is its placement's (`AUTODL_NUM_WORKERS`, `WORLD_SIZE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_workers: Option<u32>,
    /// Specs stored before launchers existed read as the default.
    #[serde(default)]
    pub launcher: Launcher,
    pub priority: f64,
    pub deadline: Option<String>,
    pub estimated_runtime: Option<u64>,
    /// Seconds a run may last.
    #[serde(default)]
    pub time_limit: Option<u64>,
    /// Seconds a gang's workers have to meet (see [`TaskSpecInput::rendezvous_timeout`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rendezvous_timeout: Option<u64>,
    pub checkpoint: Option<CheckpointSpec>,
    pub retry_policy: RetryPolicy,
    pub zone_affinity: bool,
    pub bandwidth: String,
    pub data_path: Option<String>,
    /// The code bundle the task runs in (`sha256:...`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// The setup script (commands joined by lines), see [`TaskSpecInput::setup`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<String>,
    /// The requirements file's path in the code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requirements: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub batch_size: Option<u32>,
    /// `batch_size` is the global batch (each worker gets its share).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub global_batch: bool,
    pub preemptible: bool,
    #[serde(default)]
    pub after: Vec<String>,
    #[serde(default)]
    pub after_when: AfterWhen,
    #[serde(default)]
    pub after_failure: AfterFailure,
    /// Set by the server on the tasks of a sweep: which trial this is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep: Option<SweepTrial>,
    #[serde(default)]
    pub kind: TaskKind,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
}

impl TaskSpec {
    /// The request that submits this task again as it was (retry, clone, `autodl export`):
    /// every spec the API hands out is one it accepts. Sizes and spans come back in bytes and
    /// seconds, the command as the argument list it became.
    pub fn to_input(&self) -> TaskSpecInput {
        let command = match self.command.as_slice() {
            [sh, c, script] if sh == "/bin/sh" && c == "-c" => Command::Shell(script.clone()),
            argv => Command::Argv(argv.to_vec()),
        };
        // A task given as an entry point is given so again (the node checks its script).
        let (command, entry_point) = match &self.entry_point {
            Some(e) => (None, Some(e.clone())),
            None => (Some(command), None),
        };
        TaskSpecInput {
            name: self.name.clone(),
            image: self.image.clone(),
            command,
            entry_point,
            env: self.env.clone(),
            resources: Resources {
                gpu: Some(GpuRequest {
                    gpu_type: match self.gpu_types.as_slice() {
                        [] => None,
                        [one] => Some(OneOrMany::One(one.clone())),
                        many => Some(OneOrMany::Many(many.to_vec())),
                    },
                    count: Some(self.gpus_per_worker),
                    memory: self.gpu_memory.map(Size::Bytes),
                }),
                cpu: Some(self.cpu),
                memory: Some(Size::Bytes(self.memory)),
            },
            num_workers: Some(WorkerCount::of(self.num_workers, self.min_workers)),
            gpu_per_worker: None,
            launcher: Some(self.launcher),
            priority: Some(self.priority),
            deadline: self.deadline.clone(),
            estimated_runtime: self.estimated_runtime.map(TimeSpan::Seconds),
            time_limit: self.time_limit.map(TimeSpan::Seconds),
            rendezvous_timeout: self.rendezvous_timeout.map(TimeSpan::Seconds),
            checkpoint: self.checkpoint.as_ref().map(|c| CheckpointInput {
                interval: c.interval.map(TimeSpan::Seconds),
                save_to: c.save_to.clone(),
                keep: c.keep,
            }),
            retry_policy: Some(RetryPolicy {
                max_retries: self.retry_policy.max_retries,
                oom_recovery: self.retry_policy.oom_recovery,
            }),
            affinity: Some(Affinity {
                zone: Some(if self.zone_affinity { "same" } else { "any" }.into()),
                bandwidth: Some(self.bandwidth.clone()),
            }),
            data_path: self.data_path.clone(),
            code: self.code.clone(),
            setup: self.setup.clone().map(Script::Text),
            requirements: self.requirements.clone(),
            labels: self.labels.clone(),
            batch_size: self.batch_size,
            global_batch: self.global_batch.then_some(true),
            preemptible: Some(self.preemptible),
            kind: Some(self.kind),
            ports: self.ports.clone(),
            after: self.after.clone(),
            after_when: Some(self.after_when),
            after_failure: Some(self.after_failure),
        }
    }
}

/// A task's place in its sweep. It carries the sweep's concurrency limit so that the
/// scheduler's gate is decided from the tasks it reads anyway.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SweepTrial {
    pub sweep_id: String,
    /// 0 for the first.
    pub trial: u32,
    pub max_concurrency: u32,
    /// This trial's value of each parameter.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub params: BTreeMap<String, serde_json::Value>,
}

/// How a sweep picks its trials.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum SweepMethod {
    /// Every combination of the listed values.
    #[default]
    Grid,
    /// `samples` draws: a list gives one of its values, a range a number in it.
    Random,
    /// Asynchronous successive halving: the trials of a grid (or `samples` random draws),
    /// each stopped early when, at a rung of its `resource`, its `metric` is not among the
    /// best `1/reduction_factor` of the trials that reached that rung before it.
    Asha,
}

/// Whether a smaller or a larger value of a metric is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum MetricGoal {
    Min,
    Max,
}

/// How an ASHA sweep judges its trials, as the sweep shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct EarlyStopping {
    /// The reported number that counts a trial's progress (`step` or `epoch`).
    pub resource: String,
    /// The progress at which trials are compared, smallest first; the last is
    /// `max_resource`, where nothing is stopped any more.
    pub rungs: Vec<f64>,
    pub reduction_factor: u32,
}

/// The values one parameter takes: a list, or (random sweeps) a range.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(untagged)]
pub enum SweepValues {
    List(Vec<serde_json::Value>),
    Range(SweepRange),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SweepRange {
    pub min: f64,
    pub max: f64,
    /// Uniform in the logarithm (learning rates).
    #[serde(default)]
    pub log: bool,
    /// Whole numbers only.
    #[serde(default)]
    pub integer: bool,
}

/// `POST /api/v1/sweeps`: one task per trial, `${name}` in the template's command, env and
/// name replaced by the trial's value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SweepInput {
    pub name: String,
    pub template: TaskSpecInput,
    pub parameters: BTreeMap<String, SweepValues>,
    #[serde(default)]
    pub method: SweepMethod,
    /// Trials of a random sweep.
    #[serde(default)]
    pub samples: Option<u32>,
    /// Makes a random sweep's draws repeatable.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Trials running at once; the others wait (default: all).
    #[serde(default)]
    pub max_concurrency: Option<u32>,
    /// The reported number the sweep optimises: what `best` and ASHA judge by.
    #[serde(default)]
    pub metric: Option<String>,
    /// Whether a smaller (`min`, the default) or a larger `metric` is better.
    #[serde(default)]
    pub mode: Option<MetricGoal>,
    /// ASHA: the reported number that counts progress, `step` (default) or `epoch`.
    #[serde(default)]
    pub resource: Option<String>,
    /// ASHA: the first rung (default 1).
    #[serde(default)]
    pub min_resource: Option<f64>,
    /// ASHA: the progress a trial that is never stopped reaches (required).
    #[serde(default)]
    pub max_resource: Option<f64>,
    /// ASHA: each rung keeps the best 1/this of the trials that reach it (default 3).
    #[serde(default)]
    pub reduction_factor: Option<u32>,
}

/// One trial of a sweep as its page shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SweepTrialRow {
    pub trial: u32,
    pub task_id: String,
    pub state: TaskState,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub params: BTreeMap<String, serde_json::Value>,
    /// The newest value of each metric the trial reported.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub metrics: BTreeMap<String, serde_json::Value>,
    /// Why ASHA stopped it early (null when it was not).
    #[serde(default)]
    pub stopped_early: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Sweep {
    pub id: String,
    pub name: String,
    pub user_email: String,
    pub method: SweepMethod,
    pub max_concurrency: u32,
    pub trials: u32,
    pub created_at: String,
    /// Parameter names, in the order the table shows them.
    pub parameters: Vec<String>,
    /// The number it optimises, and which way (null when it names none).
    #[serde(default)]
    pub metric: Option<String>,
    #[serde(default)]
    pub mode: Option<MetricGoal>,
    /// How ASHA judges the trials (null for grid and random sweeps).
    #[serde(default)]
    pub early_stopping: Option<EarlyStopping>,
    /// Trials per state (`pending`, `running`, `completed`, ...).
    pub states: BTreeMap<String, u32>,
    /// The trials, in order; empty in listings.
    #[serde(default)]
    pub items: Vec<SweepTrialRow>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[derive(strum::IntoStaticStr, strum::EnumString, strum::VariantArray)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum TaskState {
    Pending,
    Scheduled,
    Running,
    Completed,
    Failed,
    Cancelled,
    /// A run lasted its `time_limit` and was stopped.
    TimedOut,
}

impl TaskState {
    pub const ALL: &'static [TaskState] = <TaskState as strum::VariantArray>::VARIANTS;

    pub fn as_str(self) -> &'static str {
        self.into()
    }

    pub fn parse(s: &str) -> Option<TaskState> {
        s.parse().ok()
    }

    /// Pending, scheduled or running: the scheduler still acts on it.
    pub fn is_active(self) -> bool {
        !self.is_finished()
    }

    /// Scheduled or running: it holds a placement.
    pub fn is_placed(self) -> bool {
        matches!(self, TaskState::Scheduled | TaskState::Running)
    }

    pub fn is_finished(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::Failed | TaskState::Cancelled | TaskState::TimedOut
        )
    }
}

/// As a database column holds it.
impl TryFrom<String> for TaskState {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        TaskState::parse(&s).ok_or_else(|| format!("unknown task state {s:?}"))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct WorkerPlacement {
    pub node: String,
    pub gpu_indices: Vec<u32>,
    /// On the first worker of a gang spanning nodes: the port its rendezvous is at on that
    /// worker's node (leased to this placement alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct PriorityFactors {
    pub fair_share: f64,
    pub utilization: f64,
    pub deadline: f64,
    pub declared: f64,
    pub age: f64,
    pub gpu_fit: f64,
    pub total: f64,
}

/// Why a pending task waits, as the scheduler explained it in its last cycle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Waiting {
    /// "quota", "resources", "priority", "preemption" or "admission"; null before the first cycle.
    pub reason: Option<String>,
    pub message: String,
    /// Rank in the queue, 0 first.
    pub position: Option<usize>,
    pub priority: Option<PriorityFactors>,
    /// When the scheduler expects it to start (RFC 3339), from running its policy forward with
    /// each run's estimated run time; null until estimated, or when it would start beyond the
    /// forecast's horizon (or never, as the cluster stands).
    #[serde(default)]
    pub estimated_start: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Task {
    pub id: String,
    /// Its number in its organization (`#412`): accepted wherever an id is.
    #[serde(default)]
    pub number: u64,
    pub name: String,
    pub state: TaskState,
    pub user_id: String,
    pub user_email: String,
    pub tenant_id: String,
    pub spec: TaskSpec,
    pub created_at: String,
    pub updated_at: String,
    pub attempts: u32,
    pub batch_size: Option<u32>,
    pub placement: Option<Vec<WorkerPlacement>>,
    pub waiting: Option<Waiting>,
    /// When its first run started (null until then).
    #[serde(default)]
    pub started_at: Option<String>,
    /// When it reached a final state (null until then).
    #[serde(default)]
    pub finished_at: Option<String>,
    /// GPU time it has used over all its runs (a shared card counts by its memory share).
    #[serde(default)]
    pub gpu_seconds: f64,
    /// Where its results stand when they are not simply there: "uploading" (the run ended
    /// while the server or storage was away; its node keeps them and uploads them) or "lost"
    /// (they could not be kept; the timeline says why). Null otherwise.
    #[serde(default)]
    pub results: Option<String>,
    /// The latest value of each number the task reported (`loss`, `val/acc`, `step`), from
    /// its most recent reports: what a list of runs shows beside each. Empty until it reports.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub summary: std::collections::BTreeMap<String, f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct TaskPage {
    pub items: Vec<Task>,
    pub next_cursor: Option<String>,
    /// Tasks matching the filters on all pages.
    #[serde(default)]
    pub total: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct TaskEvent {
    pub at: String,
    pub kind: String,
    pub message: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Attempt {
    pub number: u32,
    pub node: Option<String>,
    pub placement: Vec<WorkerPlacement>,
    pub started_at: String,
    pub ended_at: Option<String>,
    pub exit_code: Option<i32>,
    /// "oom", "error", "preempted", "node_lost", "cancelled", "timed_out"; null while running or on success.
    pub reason: Option<String>,
    pub batch_size: Option<u32>,
    /// GPU time charged to this run so far (a shared card counts by its memory share).
    #[serde(default)]
    pub gpu_seconds: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct LogLine {
    pub seq: i64,
    pub at: String,
    pub stream: String,
    pub line: String,
    /// The run that printed it (1 for the first).
    #[serde(default)]
    pub attempt: u32,
    /// The worker that printed it (its `RANK`), in a task of several workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct LogPage {
    pub lines: Vec<LogLine>,
    pub next_after: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct MetricSample {
    pub at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_util: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_used: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_total: Option<u64>,
    /// Reported numbers keep their form: a whole number is an integer (`"epoch": 3`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "crate::metrics::whole::option"
    )]
    pub epoch: Option<f64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "crate::metrics::whole::option"
    )]
    pub loss: Option<f64>,
    /// Every other number the task reported (step, accuracy, ...).
    #[serde(default, serialize_with = "crate::metrics::whole::map")]
    pub values: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct MetricSeries {
    pub samples: Vec<MetricSample>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(untagged)]
pub enum GpuInventoryInput {
    /// `{"type": "A100-40G", "count": 4, "memory": "40GiB"}`
    Uniform {
        #[serde(rename = "type")]
        gpu_type: String,
        count: u32,
        memory: Size,
    },
    /// One entry per GPU.
    List(Vec<GpuInput>),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct GpuInput {
    #[serde(rename = "type")]
    pub gpu_type: String,
    pub memory: Size,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NodeInput {
    pub id: String,
    #[serde(default)]
    pub zone: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// CPU cores.
    pub cpu: f64,
    pub memory: Size,
    pub gpus: GpuInventoryInput,
    /// Host folders (shared dataset mounts) tasks may name as `data_path` on this node.
    #[serde(default)]
    pub data_roots: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct NodeGpu {
    pub index: u32,
    #[serde(rename = "type")]
    pub gpu_type: String,
    pub memory: u64,
    /// GPU memory held by tasks placed on this GPU (whole cards count fully).
    pub allocated_memory: u64,
    /// Tasks of the caller's organization on this GPU (every task for platform admins).
    pub tasks: Vec<String>,
    /// The numbers of `tasks` in their organizations (`#412`), in the same order.
    #[serde(default)]
    pub task_numbers: Vec<u64>,
    /// Tasks of other organizations on this GPU, which the caller may not see.
    #[serde(default)]
    pub other_tasks: u32,
    /// Those of `tasks` that belong to another organization (a platform admin sees them, but
    /// their pages are their organization's).
    #[serde(default)]
    pub other_org_tasks: Vec<String>,
    /// Measured utilization (0..1) from the GPU's latest sample of the last 30 s; null when
    /// none came.
    #[serde(default)]
    pub utilization: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct NodeInfo {
    pub id: String,
    pub zone: String,
    pub labels: BTreeMap<String, String>,
    pub cpu: f64,
    pub memory: u64,
    pub schedulable: bool,
    pub gpus: Vec<NodeGpu>,
    /// "docker" or "process" as the node's agent reports it ("" for nodes registered by hand).
    #[serde(default)]
    pub runtime: String,
    /// "container", "sandbox", "uid", "none" or "declared" (registered by hand).
    #[serde(default)]
    pub isolation: String,
    /// The node cannot isolate tasks from each other: only organizations an administrator
    /// trusts run tasks there.
    #[serde(default)]
    pub trusted_only: bool,
    /// Host folders tasks may name as `data_path` on this node.
    #[serde(default)]
    pub data_roots: Vec<String>,
    /// How the node holds tasks to their memory, CPU and process limits, as its agent says.
    #[serde(default)]
    pub limits: String,
    /// What network a task gets on the node, as its agent says.
    #[serde(default)]
    pub network: String,
}

/// One saved checkpoint of a task, as `GET /tasks/{id}/checkpoints` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Checkpoint {
    pub id: String,
    pub attempt: u32,
    pub step: Option<i64>,
    pub epoch: Option<f64>,
    pub files: u64,
    pub size_bytes: u64,
    pub created_at: String,
    /// Where it is stored: `s3://bucket/key-prefix/`.
    pub location: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_mounts_stay_apart_from_the_system() {
        for ok in ["/checkpoints", "/data/ckpt", "/workspace/run1"] {
            assert!(checkpoint_mount_allowed(ok).is_ok(), "{ok}");
        }
        for bad in [
            "/",
            "/etc",
            "/usr/bin",
            "/usr",
            "/lib64",
            "/proc/self",
            "/autodl",
            "/autodl/home",
            "/tmp/x",
            "relative",
            "/a/../etc",
            "/a//b",
            "/a/",
            "/x:y",
        ] {
            assert!(checkpoint_mount_allowed(bad).is_err(), "{bad}");
        }
    }
}
