//! How nodes are named and whether they take new tasks.

use super::DomainError;

/// Whether a node takes new tasks: ready, cordoned or draining by an administrator (draining
/// also stops what runs there), or lost (its agent stopped polling; ready again when it polls).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeStatus {
    Ready,
    Cordoned,
    Draining,
    Lost,
}

impl NodeStatus {
    pub const ALL: [NodeStatus; 4] = [
        NodeStatus::Ready,
        NodeStatus::Cordoned,
        NodeStatus::Draining,
        NodeStatus::Lost,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NodeStatus::Ready => "ready",
            NodeStatus::Cordoned => "cordoned",
            NodeStatus::Draining => "draining",
            NodeStatus::Lost => "lost",
        }
    }

    /// The scheduler places new tasks only on ready nodes.
    pub fn takes_new_tasks(self) -> bool {
        self == NodeStatus::Ready
    }
}

/// As a database column holds it.
impl TryFrom<String> for NodeStatus {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        NodeStatus::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("unknown node status {s:?}"))
    }
}

/// A node id, as agents and administrators name nodes: it appears in URLs, logs and task
/// placements, so only 1..=128 letters, digits, '-', '_' or '.'.
pub fn parse_node_id(field: &'static str, raw: &str) -> Result<String, DomainError> {
    if !super::names::is_node_id(raw) {
        return Err(DomainError::invalid(
            field,
            "node id is 1..128 letters, digits, '-', '_' or '.'",
        ));
    }
    Ok(raw.to_owned())
}
