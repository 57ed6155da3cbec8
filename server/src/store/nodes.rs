//! GPU hosts and how their agents join: nodes, registration tokens, agent credentials and
//! liveness.

use async_trait::async_trait;

use super::*;
use crate::domain::NodeStatus;

/// How a node runs tasks, as the node row keeps what its agent reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeHost {
    pub runtime: String,
    pub isolation: String,
    /// JSON array of host dataset roots.
    pub data_roots: String,
    /// JSON of [`HostDetail`].
    pub detail: String,
}

impl NodeHost {
    pub fn of(n: &NodeRecord) -> NodeHost {
        NodeHost {
            runtime: n.runtime.clone(),
            isolation: n.isolation.clone(),
            data_roots: n.data_roots.clone(),
            detail: n.host_detail.clone(),
        }
    }
}

#[async_trait]
pub trait Nodes: Send + Sync {
    async fn upsert_node(&self, node: &NodeRecord) -> StoreResult<()>;
    async fn list_nodes(&self) -> StoreResult<Vec<NodeRecord>>;
    async fn node(&self, id: &str) -> StoreResult<Option<NodeRecord>>;
    /// Nodes with an agent, not already lost, last heard from before `before`.
    async fn silent_nodes(&self, before: i64) -> StoreResult<Vec<NodeRecord>>;
    async fn delete_node(&self, id: &str) -> StoreResult<bool>;
    /// What the node's agent reports about how it runs tasks.
    async fn set_node_host(&self, id: &str, host: &NodeHost) -> StoreResult<()>;
    async fn set_node_open_to_all(&self, id: &str, open: bool) -> StoreResult<bool>;
    async fn create_registration_token(&self, t: &RegistrationTokenRecord) -> StoreResult<()>;
    async fn list_registration_tokens(&self) -> StoreResult<Vec<RegistrationTokenRecord>>;
    async fn registration_token_by_hash(
        &self,
        hash: &str,
    ) -> StoreResult<Option<RegistrationTokenRecord>>;
    /// Counts one registration of `node_id` against the token; `false` when it is revoked,
    /// expired, used up or bound to another node (checked and counted in one statement, so
    /// two agents cannot both take a token's last use).
    async fn use_registration_token(&self, id: &str, node_id: &str, now: i64) -> StoreResult<bool>;
    async fn revoke_registration_token(&self, id: &str) -> StoreResult<bool>;
    async fn set_node_credential(&self, id: &str, hash: &str) -> StoreResult<()>;
    async fn node_by_credential(&self, hash: &str) -> StoreResult<Option<NodeRecord>>;
    /// Records a heartbeat; a node that was lost is ready again.
    async fn touch_node(&self, id: &str, now: i64) -> StoreResult<()>;
    /// Records when each node was last heard from, in one statement (never moving a time back).
    async fn touch_nodes(&self, seen: &[(String, i64)]) -> StoreResult<()>;
    async fn set_node_status(&self, id: &str, status: NodeStatus) -> StoreResult<bool>;
}
