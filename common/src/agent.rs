//! Wire types between agents and the server (docs/agent-protocol.md).

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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Assignment {
    pub task_id: String,
    pub attempt: u32,
    pub image: String,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub gpu_indices: Vec<u32>,
    /// Declared GPU memory per GPU (bytes) when the task shares GPUs.
    pub gpu_memory: Option<u64>,
    pub cpu: f64,
    pub memory: u64,
    pub data_path: Option<String>,
    pub checkpoint: Option<CheckpointSpec>,
    /// The latest complete checkpoint, to download before the task starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestoreRef>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct RestoreRef {
    pub checkpoint_id: String,
    /// The attempt that saved it.
    pub attempt: u32,
    pub step: Option<i64>,
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
    #[serde(default)]
    pub step: Option<i64>,
    #[serde(default)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct DataManifest {
    /// Names where the files come from (bucket and tenant key prefix): the agent's cache key.
    pub source: String,
    pub files: Vec<DataFile>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct DataFile {
    pub path: String,
    pub size: u64,
    pub etag: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct StopOrder {
    pub task_id: String,
    pub attempt: u32,
    pub grace_s: u64,
    /// "preempted", "cancelled", "drained", "migrated" or "moved".
    pub reason: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct PollResponse {
    pub assignments: Vec<Assignment>,
    pub stop: Vec<StopOrder>,
    pub heartbeat_s: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AttemptRef {
    pub attempt: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct AgentLogLine {
    pub at: String,
    pub stream: String,
    pub line: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LogBatch {
    pub attempt: u32,
    pub lines: Vec<AgentLogLine>,
    /// The agent's clock when it sent the batch (RFC 3339): the server corrects line times by
    /// the difference to its own clock, so a node whose clock is off keeps its output in order.
    #[serde(default)]
    pub sent_at: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct FinishedReport {
    pub attempt: u32,
    #[serde(default)]
    pub exit_code: Option<i64>,
    /// "success", "error", "oom" or "stopped".
    pub reason: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ProcessMemory {
    pub pid: u32,
    pub mem_used: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
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
    #[serde(default)]
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
