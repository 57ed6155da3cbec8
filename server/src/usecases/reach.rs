//! Who may reach into a task (a shell, a command, a port, an app), and for how long: its
//! owner or a manager of its organization, while it runs, for as long as their sign-in holds.

use actix_web::web;
use autodl_common::tasks::TaskState;
use tokio_util::sync::CancellationToken;

use crate::auth::{Caller, CallerVia};
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::TaskWithUser;
use crate::tasks::{placement_of, spec_of};
use crate::tunnels::refuse;

/// A task of the caller's organization, or 404 (another organization's task is not there).
pub async fn find(state: &AppState, caller: &Caller, id: &str) -> Result<TaskWithUser, ApiError> {
    state
        .store
        .task(Some(caller.tenant_id()), id)
        .await?
        .ok_or_else(|| ApiError::NotFound("no such task".into()))
}

/// The node and attempt a running task's `rank` runs on, once the caller may reach into it:
/// its owner or a manager of its organization.
pub async fn target_of(
    state: &AppState,
    caller: &Caller,
    id: &str,
    rank: Option<u32>,
) -> Result<(TaskWithUser, String), ApiError> {
    let t = find(state, caller, id).await?;
    if t.task.user_id != caller.user.id {
        caller.require_manager().map_err(|_| {
            ApiError::Forbidden(
                "only the task's owner or an admin of its organization may reach into it".into(),
            )
        })?;
    }
    if t.task.state != TaskState::Running {
        return Err(ApiError::Conflict(format!(
            "the task is {}: only a running task can be reached",
            t.task.state.as_str()
        )));
    }
    let placement = placement_of(&t.task).unwrap_or_default();
    let rank = rank.unwrap_or(0) as usize;
    let by_rank = crate::tasks::gang::nodes_by_rank(&placement);
    let node = by_rank.get(rank).map(|n| (*n).to_owned()).ok_or_else(|| {
        ApiError::invalid(
            "rank",
            format!(
                "the task has {} worker(s), numbered from 0",
                placement.len()
            ),
        )
    })?;
    Ok((t, node))
}

/// Whether the person `user_id` (signed in `via`) may still reach into the task: the sign-in
/// holds, the account is active and in the task's organization, they own the task or manage
/// the organization, and it runs. `None` when the store could not say (kept open then).
pub async fn still_reaches(
    state: &AppState,
    user_id: &str,
    via: &CallerVia,
    task_id: &str,
    rank: Option<u32>,
) -> Option<bool> {
    let refused = |e: &ApiError| {
        matches!(
            e,
            ApiError::Unauthorized(_)
                | ApiError::Forbidden(_)
                | ApiError::NotFound(_)
                | ApiError::Conflict(_)
                | ApiError::Validation { .. }
        )
    };
    let caller = match crate::auth::caller::resume(state, user_id, via.clone()).await {
        Ok(c) => c,
        Err(e) => return refused(&e).then_some(false),
    };
    match target_of(state, &caller, task_id, rank).await {
        Ok(_) => Some(true),
        Err(e) => refused(&e).then_some(false),
    }
}

/// Ends a tunnel (`stop`) once its person may no longer reach into the task, as live log
/// and metric streams end ([`crate::auth::LiveCaller::EVERY`]): a revoked key, a session
/// signed out, a member removed, demoted or disabled. `person`, when given, is told why.
pub async fn watch_access(
    state: web::Data<AppState>,
    who: (String, CallerVia),
    (task_id, rank): (String, Option<u32>),
    person: Option<actix_ws::Session>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = state.clock.sleep(crate::auth::LiveCaller::EVERY) => {}
        }
        if still_reaches(&state, &who.0, &who.1, &task_id, rank).await == Some(false) {
            tracing::info!(task = %task_id, user = %who.0, "tunnel ended: its person may no longer reach the task");
            if let Some(p) = person {
                refuse(p, "access to the task was revoked; the tunnel is closed").await;
            }
            stop.cancel();
            return;
        }
    }
}

/// A port reached only if the task declared it (`ports` in its spec).
pub fn declared(task: &TaskWithUser, number: u16) -> Result<(), ApiError> {
    let spec = spec_of(&task.task)?;
    if spec.ports.contains(&number) {
        return Ok(());
    }
    Err(ApiError::invalid(
        "port",
        format!(
            "the task declared no port {number}; it declared {:?} (set ports when submitting)",
            spec.ports
        ),
    ))
}
