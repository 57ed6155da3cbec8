//! An agent's poll: its heartbeat and its work in one call. What the poll says the agent runs
//! is reconciled with what the server thinks it runs, then the answer is the node's work,
//! given at once when there is some, or as soon as some appears within the wait.

use std::time::Duration;

use autodl_common::agent::{PollRequest, PollResponse};

use crate::agents::dispatch::{reconcile, work_for};
use crate::domain::NodeStatus;
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{NodeHost, NodeRecord};
use crate::usecases::agents::host_fields;

pub async fn answer(
    state: &AppState,
    n: &NodeRecord,
    body: &PollRequest,
    wait: Duration,
) -> Result<PollResponse, ApiError> {
    let waiter = state.agents.waiter(&n.id);
    // Any other node is noted as heard by `NodeCaller`.
    if n.status == NodeStatus::Lost {
        state.store.touch_node(&n.id, state.clock.now_ms()).await?;
    }
    // An agent restarted with other settings (Docker gone, isolation off, new dataset roots)
    // says so in its polls; an agent that says nothing keeps what it said at registration.
    if body.host.is_some() {
        let host = host_fields(body.host.as_ref())?;
        if host != NodeHost::of(n) {
            tracing::info!(node = %n.id, runtime = %host.runtime, isolation = %host.isolation, "node reports a change in how it runs tasks");
            state.store.set_node_host(&n.id, &host).await?;
            state.scheduler.invalidate_nodes();
            state.scheduler.wake();
        }
    }
    if n.status == NodeStatus::Lost {
        state.scheduler.invalidate_nodes();
        state.scheduler.wake();
    }
    // Once, as the poll arrives: what it says the agent runs is what it runs now. The first
    // look at its work reuses that read unless it requeued something.
    let active = state.store.node_tasks(&n.id).await?;
    let requeued = reconcile(state, n, &body.running, &active).await?;
    let mut fresh = (requeued == 0).then_some(active);
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        // Register interest before looking, so a notification between the look and the wait
        // is not lost.
        let notified = waiter.notified();
        let active = match fresh.take() {
            Some(a) => a,
            None => state.store.node_tasks(&n.id).await?,
        };
        let work = work_for(state, n, &body.running, &active).await?;
        if !work.assignments.is_empty()
            || !work.stop.is_empty()
            || !work.tunnels.is_empty()
            || tokio::time::Instant::now() >= deadline
        {
            return Ok(work);
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return Ok(work);
        }
    }
}
