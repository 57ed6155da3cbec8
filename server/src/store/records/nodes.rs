//! GPU hosts and the tokens their agents register with.

use std::collections::BTreeMap;

use autodl_scheduler::Gpu;

use super::JsonText;
use crate::domain::NodeStatus;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct NodeRecord {
    pub id: String,
    pub zone: String,
    #[sqlx(try_from = "String")]
    pub labels: JsonText<BTreeMap<String, String>>,
    pub cpu_millis: i64,
    pub mem_bytes: i64,
    /// Its GPUs as registered (`util` is not kept here: samples are).
    #[sqlx(try_from = "String")]
    pub gpus: JsonText<Vec<Gpu>>,
    pub schedulable: bool,
    pub created_at: i64,
    pub updated_at: i64,
    /// Digest of the agent's node credential; `None` for nodes registered by hand.
    pub credential_hash: Option<String>,
    pub last_seen: Option<i64>,
    /// ready, cordoned, draining or lost.
    #[sqlx(try_from = "String")]
    pub status: NodeStatus,
    /// "docker" or "process" as the agent reports it; empty for nodes registered by hand.
    pub runtime: String,
    /// "container", "sandbox", "uid", "none" (trusted-only) or "declared" (registered by hand).
    pub isolation: String,
    /// JSON array of host dataset roots tasks may name as `data_path`.
    pub data_roots: String,
    /// JSON of [`HostDetail`]: what the agent says of its limits and task networks.
    pub host_detail: String,
    /// An administrator lets every organization use this node although it cannot isolate
    /// tasks (the demo on a machine where it does not run as root).
    pub open_to_all: bool,
}

/// What a node's agent says of how it confines tasks beyond its isolation level, kept as it
/// said it and shown to administrators.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostDetail {
    #[serde(default)]
    pub limits: String,
    #[serde(default)]
    pub network: String,
    /// Where other nodes' tasks reach this node's (see `AgentHost::address`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

impl HostDetail {
    pub fn of(node: &NodeRecord) -> HostDetail {
        serde_json::from_str(&node.host_detail).unwrap_or_default()
    }
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct RegistrationTokenRecord {
    pub id: String,
    pub name: String,
    pub token_hash: String,
    pub created_by: String,
    pub created_at: i64,
    pub expires_at: i64,
    pub revoked: bool,
    /// Nodes that may join with it (1 unless an administrator chose more) and how many did.
    pub max_uses: i64,
    pub uses: i64,
    /// Set: only this node id may register with it, replacing that node's credential.
    pub node_id: Option<String>,
}
