//! What administrators do to nodes beside declaring them: cordon (no new tasks), uncordon,
//! drain (no new tasks, and what runs there is stopped through its agent so it checkpoints and
//! moves elsewhere), and open a trusted-only node to every organization or close it again.

use crate::domain::NodeStatus;
use crate::error::ApiError;
use crate::state::AppState;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeAction {
    Cordon,
    Uncordon,
    Drain,
    /// A node that cannot isolate tasks takes every organization's anyway (at their risk).
    OpenToAll,
    TrustedOnly,
}

impl NodeAction {
    pub fn parse(raw: &str) -> Result<Self, ApiError> {
        Ok(match raw {
            "cordon" => NodeAction::Cordon,
            "uncordon" => NodeAction::Uncordon,
            "drain" => NodeAction::Drain,
            "open-to-all" => NodeAction::OpenToAll,
            "trusted-only" => NodeAction::TrustedOnly,
            other => {
                return Err(ApiError::invalid(
                    "action",
                    format!(
                        "unknown node action {other:?} (cordon, uncordon, drain, open-to-all, trusted-only)"
                    ),
                ))
            }
        })
    }
}

pub async fn act(state: &AppState, id: &str, action: NodeAction) -> Result<(), ApiError> {
    let status = match action {
        NodeAction::OpenToAll | NodeAction::TrustedOnly => {
            let open = action == NodeAction::OpenToAll;
            if !state.store.set_node_open_to_all(id, open).await? {
                return Err(ApiError::NotFound("no such node".into()));
            }
            tracing::warn!(node = %id, open, "trusted-only node opened or closed to all organizations");
            state.scheduler.invalidate_nodes();
            state.scheduler.wake();
            return Ok(());
        }
        NodeAction::Cordon => NodeStatus::Cordoned,
        NodeAction::Uncordon => NodeStatus::Ready,
        NodeAction::Drain => NodeStatus::Draining,
    };
    let node = state
        .store
        .list_nodes()
        .await?
        .into_iter()
        .find(|n| n.id == id)
        .ok_or_else(|| ApiError::NotFound("no such node".into()))?;
    state.store.set_node_status(id, status).await?;
    if status == NodeStatus::Draining {
        let now = state.clock.now_ms();
        for t in state.store.active_tasks().await? {
            if !t
                .placement
                .0
                .clone()
                .is_some_and(|p| p.iter().any(|w| w.node == id))
            {
                continue;
            }
            // A gang's part on this node has ended: nothing of it runs here to move.
            if state
                .store
                .ended_parts(&t.id, t.attempts)
                .await?
                .iter()
                .any(|p| p.node == id)
            {
                continue;
            }
            if node.credential_hash.is_some() {
                state.store.set_stop_reason(None, &t.id, "drained").await?;
            } else {
                state
                    .store
                    .requeue_task(
                        None,
                        &t.id,
                        "drained",
                        &format!("node {id} is draining"),
                        now,
                    )
                    .await?;
            }
        }
        state.agents.notify(id);
    }
    state.scheduler.invalidate_nodes();
    state.scheduler.wake();
    Ok(())
}
