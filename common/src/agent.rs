//! Wire types between agents and the server (docs/agent-protocol.md), the one definition both
//! sides compile against. What the agent sends is parsed strictly by the server (unknown
//! fields refused); what the server sends fills defaults, so an older agent keeps working when
//! a newer server adds a field.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

use crate::tasks::CheckpointSpec;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AgentGpu {
    pub index: u32,
    #[serde(rename = "type")]
    pub gpu_type: String,
    #[serde(default)]
    pub uuid: Option<String>,
    /// Bytes.
    pub memory: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AgentNode {
    pub id: String,
    #[serde(default)]
    pub zone: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// CPU cores.
    pub cpu: f64,
    /// Bytes of RAM.
    pub memory: u64,
    pub gpus: Vec<AgentGpu>,
    /// Absent from agents that predate it: the node then counts as trusted-only.
    #[serde(default)]
    pub host: Option<AgentHost>,
}

/// How a node runs tasks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AgentHost {
    /// "docker" or "process".
    pub runtime: String,
    /// "container", "sandbox", "uid" or "none": tasks of a node that cannot isolate them
    /// ("none") are only those of organizations an administrator trusts.
    pub isolation: String,
    /// Host folders tasks may name as `data_path`.
    #[serde(default)]
    pub data_roots: Vec<String>,
    /// How tasks are held to their memory, CPU and process limits, in words (e.g.
    /// "cgroup v2: memory, cpu, pids", or "none (why)").
    #[serde(default)]
    pub limits: String,
    /// What network a task gets, in words.
    #[serde(default)]
    pub network: String,
    /// The address the tasks of other nodes reach this node's tasks at (`--advertise-addr`):
    /// where a gang whose rank 0 is here meets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RegisterRequest {
    pub token: String,
    pub node: AgentNode,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct RegisterResponse {
    pub node_id: String,
    pub credential: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct RunningRef {
    pub task_id: String,
    pub attempt: u32,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct PollRequest {
    #[serde(default)]
    pub running: Vec<RunningRef>,
    #[serde(default)]
    pub gpus: Option<Vec<AgentGpu>>,
    #[serde(default)]
    pub host: Option<AgentHost>,
}

/// Work for a node. Only `task_id` and `attempt` are required, so that a sparse assignment
/// (a process-runtime demo task without an image) still parses.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Assignment {
    pub task_id: String,
    pub attempt: u32,
    #[serde(default)]
    pub image: String,
    #[serde(default)]
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub gpu_indices: Vec<u32>,
    /// Declared GPU memory per GPU (bytes) when the task shares GPUs; `None`: whole cards.
    #[serde(default)]
    pub gpu_memory: Option<u64>,
    /// Cores per worker; 0: no limit.
    #[serde(default)]
    pub cpu: f64,
    /// Bytes of RAM per worker; 0: no limit.
    #[serde(default)]
    pub memory: u64,
    #[serde(default)]
    pub data_path: Option<String>,
    /// The code bundle (`sha256:...`) to unpack as the working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(default)]
    pub checkpoint: Option<CheckpointSpec>,
    /// Also accepted outside `env` (the env entry wins when both are present).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<u32>,
    /// The latest complete checkpoint, to download before the task starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestoreRef>,
    /// The worker processes to start on this node (`launcher: "workers"`), each with its own
    /// GPUs and variables on top of `env`; empty: one process with all of `gpu_indices`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workers: Vec<WorkerSlot>,
    /// Seconds the workers of a gang have to meet at its rendezvous, judged on rank 0's node;
    /// `None`: one process, nothing to meet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rendezvous_timeout: Option<u64>,
    /// What the task's environment is built from, when it asked for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<EnvironmentSpec>,
}

/// A task's environment: built once on a node for each distinct value of this (and of the
/// image and the requirements file's content), then reused by later attempts and tasks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct EnvironmentSpec {
    /// Whose environments may be shared: the organization's. A tenant's setup runs its own
    /// code, so what it leaves is never handed to another organization's task.
    pub scope: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<String>,
    /// A requirements file in the task's code, `/`-separated and relative.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requirements: Option<String>,
    /// The task's own variables (an index URL, what setup reads): part of what the
    /// environment is made of.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// One worker process of an attempt.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct WorkerSlot {
    /// Its rank in the whole task (0..num_workers).
    pub rank: u32,
    #[serde(default)]
    pub gpu_indices: Vec<u32>,
    /// Set on top of the assignment's `env` (`RANK`, `LOCAL_RANK`, ...).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct RestoreRef {
    pub checkpoint_id: String,
    /// The attempt that saved it.
    #[serde(default)]
    pub attempt: u32,
    #[serde(default)]
    pub step: Option<i64>,
    #[serde(default)]
    pub files: Vec<ArtifactFile>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ArtifactFile {
    /// Relative to the checkpoint or results folder, `/`-separated.
    pub path: String,
    pub size: u64,
}

/// `POST /agent/tasks/{id}/artifacts`: an upload begins.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ArtifactStart {
    pub attempt: u32,
    /// "checkpoint" or "results".
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ArtifactCreated {
    pub id: String,
}

/// `POST /agent/artifacts/{id}/commit`: every file is uploaded; make it visible.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ArtifactCommit {
    pub files: Vec<ArtifactFile>,
}

/// `GET /agent/tasks/{id}/data`: the objects under the task's `s3://` data path.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct DataManifest {
    /// Names where the files come from (bucket and tenant key prefix): the agent's cache key.
    #[serde(default)]
    pub source: String,
    #[serde(default)]
    pub files: Vec<DataFile>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct DataFile {
    pub path: String,
    pub size: u64,
    #[serde(default)]
    pub etag: String,
}

fn default_grace() -> u64 {
    30
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct StopOrder {
    pub task_id: String,
    pub attempt: u32,
    #[serde(default = "default_grace")]
    pub grace_s: u64,
    /// "preempted", "resized", "cancelled", "drained", "migrated" or "moved"; informational
    /// for the agent.
    #[serde(default)]
    pub reason: String,
    /// The task ends with this stop (its time limit, its GPUs idle) instead of going back to
    /// the queue: what the run leaves in its results folder is kept, as at any other end.
    #[serde(default)]
    pub ends_task: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct PollResponse {
    #[serde(default)]
    pub assignments: Vec<Assignment>,
    #[serde(default)]
    pub stop: Vec<StopOrder>,
    /// How often the server wants to hear from the agent (caps the long-poll wait); 0: the
    /// agent's own default.
    #[serde(default)]
    pub heartbeat_s: u64,
    /// After how many seconds of silence the server judges a node lost and runs its tasks
    /// elsewhere; the agent stops its tasks well before (its fence), so no task ever runs
    /// twice. 0: not said (the agent assumes 30).
    #[serde(default)]
    pub node_lost_s: u64,
    /// People waiting to reach into tasks here: the agent opens each as a WebSocket.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tunnels: Vec<TunnelRequest>,
}

/// Someone asked to reach into a task on this node (a shell, a command, a port). Agents may
/// sit on networks nobody can reach, so the agent dials out: it opens
/// `GET /agent/tunnels/{id}` as a WebSocket and the server joins it to the person's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct TunnelRequest {
    pub id: String,
    pub task_id: String,
    pub attempt: u32,
    pub target: TunnelTarget,
    /// The server that holds the person's side, where several share the work: the agent
    /// dials it (and its own server when that fails). Absent: the server the agent polls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
}

/// What the far end of a tunnel is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum TunnelTarget {
    /// A command in the task's environment (an empty one: the login shell). With `tty` it
    /// gets a terminal of `cols` x `rows`; without, separate stdout and stderr.
    Exec {
        command: Vec<String>,
        tty: bool,
        #[serde(default)]
        cols: u16,
        #[serde(default)]
        rows: u16,
    },
    /// A TCP connection to a port the task declared.
    Port { port: u16 },
}

/// Binary frames of an exec tunnel start with the channel they belong to (as Kubernetes'
/// `channel.k8s.io` does); a port tunnel's frames are the bytes alone.
pub mod channel {
    pub const STDIN: u8 = 0;
    pub const STDOUT: u8 = 1;
    pub const STDERR: u8 = 2;
}

/// Text frames of an exec tunnel: the terminal's size one way, the end the other.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum TunnelControl {
    Resize {
        cols: u16,
        rows: u16,
    },
    /// No more input (the client's stdin ended).
    Eof,
    /// The command ended with this status (128 + signal when a signal ended it).
    Exit {
        code: i32,
    },
    /// The tunnel could not be served; said once, then the tunnel closes.
    Error {
        message: String,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AttemptRef {
    pub attempt: u32,
}

/// `POST /agent/tasks/{id}/progress`: a step of an attempt before it starts, for the task's
/// timeline (building its environment, reusing one, the build failing).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ProgressReport {
    pub attempt: u32,
    /// `environment`.
    pub stage: String,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[derive(strum::IntoStaticStr, strum::EnumString, strum::VariantArray)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AgentLogLine {
    /// RFC 3339, taken when the line was read, not when it was shipped.
    pub at: String,
    pub stream: Stream,
    pub line: String,
    /// The worker that printed it, when the attempt runs a process per worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LogBatch {
    pub attempt: u32,
    pub lines: Vec<AgentLogLine>,
    /// The agent's clock when it sent the batch (RFC 3339): the server corrects line times by
    /// the difference to its own clock, so a node whose clock is off keeps its output in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_at: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct FinishedReport {
    pub attempt: u32,
    /// `null` when the task never started (bad image, missing command).
    #[serde(default)]
    pub exit_code: Option<i64>,
    pub reason: ExitReason,
    /// Why, in the agent's words, where the exit code does not say it (a gang that did not
    /// form); put in the attempt's message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// What the attempt saved that the server does not have yet ("results", "checkpoint"):
    /// kept on the node's disk and uploaded once the server or storage takes it. The task
    /// ends now (its GPUs are free) and says its results are uploading meanwhile.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uploading: Vec<String>,
    /// Why what the attempt saved could not be kept (the node's disk refused it); the task
    /// says so plainly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_kept: Option<String>,
}

/// An agent gives up a folder it kept for the server (kept too long, or its disk is needed):
/// the task says plainly that it is lost.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NotKeptReport {
    pub attempt: u32,
    /// "results" or "checkpoint".
    pub kind: String,
    pub reason: String,
}

/// Why a run ended, as its agent saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[derive(strum::IntoStaticStr, strum::EnumString, strum::VariantArray)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum ExitReason {
    Success,
    Error,
    Oom,
    /// Stopped when told to (preempted, cancelled, drained).
    Stopped,
}

impl ExitReason {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ProcessMemory {
    pub pid: u32,
    pub mem_used: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct GpuSample {
    pub at: String,
    pub gpu_index: u32,
    /// 0..1
    pub util: f64,
    pub mem_used: u64,
    pub mem_total: u64,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub power_w: Option<f64>,
    #[serde(default)]
    pub processes: Vec<ProcessMemory>,
    #[serde(default)]
    pub task_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct MetricBatch {
    pub samples: Vec<GpuSample>,
    /// The agent's clock when it sent the batch; see [`LogBatch::sent_at`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_at: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateRegistrationToken {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub expires_in_hours: Option<u32>,
    /// How many nodes may join with it; 1 (single use) unless given.
    #[serde(default)]
    pub max_uses: Option<u32>,
    /// Only this node id may register with it, and it may replace that existing node's
    /// credential (an agent that lost its state, a reinstalled host).
    #[serde(default)]
    pub node_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct RegistrationToken {
    pub id: String,
    pub name: String,
    pub created_at: String,
    pub expires_at: String,
    pub max_uses: u32,
    pub uses: u32,
    #[serde(default)]
    pub node_id: Option<String>,
    /// Only in the answer that creates it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}
