//! Wire types of the agent protocol (docs/agent-protocol.md). Deserialised types accept unknown
//! fields so a newer server can add some without breaking older agents.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One GPU as reported at registration and with every poll.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    pub index: u32,
    #[serde(rename = "type")]
    pub gpu_type: String,
    pub uuid: String,
    /// Bytes.
    pub memory: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeReport {
    pub id: String,
    pub zone: String,
    pub labels: BTreeMap<String, String>,
    /// Whole cores: an integer parses into both integer and float fields on the server.
    pub cpu: u32,
    /// Bytes of RAM.
    pub memory: u64,
    pub gpus: Vec<GpuInfo>,
    pub host: HostReport,
}

/// How this node runs tasks: the server keeps tasks of untrusted organizations off nodes that
/// cannot isolate them, and accepts host `data_path`s only under a node's dataset roots.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostReport {
    /// "docker" or "process".
    pub runtime: String,
    /// "container", "sandbox", "uid" or "none" (trusted-only).
    pub isolation: String,
    pub data_roots: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RegisterRequest {
    pub token: String,
    pub node: NodeReport,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RegisterResponse {
    pub node_id: String,
    pub credential: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RunningTask {
    pub task_id: String,
    pub attempt: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PollRequest {
    pub running: Vec<RunningTask>,
    pub gpus: Vec<GpuInfo>,
    pub host: HostReport,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PollResponse {
    #[serde(default)]
    pub assignments: Vec<Assignment>,
    #[serde(default)]
    pub stop: Vec<StopOrder>,
    /// How often the server wants to hear from the agent; caps the long-poll wait.
    #[serde(default)]
    pub heartbeat_s: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointSpec {
    #[serde(default)]
    pub interval: Option<u64>,
    #[serde(default)]
    pub save_to: Option<String>,
    #[serde(default)]
    pub keep: Option<u32>,
}

/// Work for this node. Only `task_id` and `attempt` are required so that a sparse assignment
/// (e.g. a process-runtime demo task without an image) still parses.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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
    /// Bytes per GPU the task declared; `None` means it holds whole cards.
    #[serde(default)]
    pub gpu_memory: Option<u64>,
    /// Cores.
    #[serde(default)]
    pub cpu: Option<f64>,
    /// Bytes of RAM.
    #[serde(default)]
    pub memory: Option<u64>,
    #[serde(default)]
    pub data_path: Option<String>,
    #[serde(default)]
    pub checkpoint: Option<CheckpointSpec>,
    /// Also accepted outside `env` (the env entry wins when both are present).
    #[serde(default)]
    pub batch_size: Option<u32>,
    /// The latest complete checkpoint of the task; downloaded into the checkpoint folder
    /// before the task starts, which then sees AUTODL_IS_RESTORED=1.
    #[serde(default)]
    pub restore: Option<RestoreRef>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RestoreRef {
    pub checkpoint_id: String,
    #[serde(default)]
    pub attempt: u32,
    #[serde(default)]
    pub step: Option<i64>,
    #[serde(default)]
    pub files: Vec<ArtifactFile>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactFile {
    pub path: String,
    pub size: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArtifactStart {
    pub attempt: u32,
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epoch: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArtifactCreated {
    pub id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArtifactCommit {
    pub files: Vec<ArtifactFile>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DataManifest {
    /// Names where the files come from (bucket and tenant key prefix): the cache key.
    #[serde(default)]
    pub source: String,
    #[serde(default)]
    pub files: Vec<DataFile>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
pub struct StopOrder {
    pub task_id: String,
    pub attempt: u32,
    #[serde(default = "default_grace")]
    pub grace_s: u64,
    /// "preempted" or "cancelled"; informational for the agent.
    #[serde(default)]
    pub reason: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StartedReport {
    pub attempt: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogLine {
    /// RFC 3339, taken when the line was read, not when it was shipped.
    pub at: String,
    pub stream: Stream,
    pub line: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogBatch {
    pub attempt: u32,
    pub lines: Vec<LogLine>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExitReason {
    Success,
    Error,
    Oom,
    Stopped,
}

impl ExitReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ExitReason::Success => "success",
            ExitReason::Error => "error",
            ExitReason::Oom => "oom",
            ExitReason::Stopped => "stopped",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FinishedReport {
    pub attempt: u32,
    /// `null` when the task never started (bad image, missing command).
    pub exit_code: Option<i32>,
    pub reason: ExitReason,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessMem {
    pub pid: u32,
    pub mem_used: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricSample {
    pub at: String,
    pub gpu_index: u32,
    /// Fraction in [0, 1].
    pub util: f64,
    pub mem_used: u64,
    pub mem_total: u64,
    pub temperature: Option<u32>,
    pub power_w: Option<f64>,
    pub processes: Vec<ProcessMem>,
    pub task_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MetricsBatch {
    pub samples: Vec<MetricSample>,
}

/// Current time as the protocol writes it.
pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_answer_from_the_protocol_doc_parses() {
        let body = r#"{"assignments": [{
           "task_id": "t1", "attempt": 2, "image": "pytorch/pytorch:2.1",
           "command": ["python", "train.py"], "env": {"KEY": "value", "AUTODL_BATCH_SIZE": "32"},
           "gpu_indices": [0, 1], "gpu_memory": null, "cpu": 8.0, "memory": 34359738368,
           "data_path": null, "checkpoint": {"interval": 600, "save_to": "s3://x"}
         }],
         "stop": [{"task_id": "t0", "attempt": 1, "grace_s": 30, "reason": "preempted"}],
         "heartbeat_s": 5}"#;
        let r: PollResponse = serde_json::from_str(body).unwrap();
        assert_eq!(r.assignments[0].gpu_indices, vec![0, 1]);
        assert_eq!(r.assignments[0].memory, Some(34359738368));
        assert_eq!(r.stop[0].grace_s, 30);
        assert_eq!(r.heartbeat_s, Some(5));
        let empty: PollResponse = serde_json::from_str("{}").unwrap();
        assert!(empty.assignments.is_empty() && empty.stop.is_empty());
    }

    #[test]
    fn reports_serialise_as_documented() {
        let f = FinishedReport {
            attempt: 2,
            exit_code: Some(137),
            reason: ExitReason::Oom,
        };
        assert_eq!(
            serde_json::to_value(&f).unwrap(),
            serde_json::json!({"attempt": 2, "exit_code": 137, "reason": "oom"})
        );
        let g = GpuInfo {
            index: 0,
            gpu_type: "A100-40G".into(),
            uuid: "GPU-1".into(),
            memory: 42949672960,
        };
        assert_eq!(
            serde_json::to_value(&g).unwrap(),
            serde_json::json!({"index": 0, "type": "A100-40G", "uuid": "GPU-1", "memory": 42949672960u64})
        );
        let l = LogLine {
            at: "2024-01-01T00:00:00Z".into(),
            stream: Stream::Stderr,
            line: "x".into(),
        };
        assert_eq!(serde_json::to_value(&l).unwrap()["stream"], "stderr");
    }
}
