//! Who may reach into a task (a shell, a command, a port, an app), and for how long: its
//! owner or a manager of its organization, while it runs, for as long as their sign-in holds.

use autodl_common::tasks::TaskState;

use crate::auth::{Caller, CallerVia};
use crate::domain::TaskRef;
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::TaskWithUser;

/// A task of the caller's organization, or 404 (another organization's task is not there).
/// `what` is how the caller named it: its id, `#412`, a prefix of its id or its name
/// ([`TaskRef`]); a name or prefix that several tasks share is refused, naming them.
pub async fn find(state: &AppState, caller: &Caller, what: &str) -> Result<TaskWithUser, ApiError> {
    let id = id_of(state, caller, what).await?;
    state
        .store
        .task(Some(caller.tenant_id()), &id)
        .await?
        .ok_or_else(|| ApiError::NotFound("no such task".into()))
}

/// The id of the task the caller means by `what` (an id is taken as it is: reading the task
/// says whether it is theirs).
pub async fn id_of(state: &AppState, caller: &Caller, what: &str) -> Result<String, ApiError> {
    match TaskRef::parse(what) {
        TaskRef::Id(id) => Ok(id),
        meant => the_one(state, caller.tenant_id(), &meant).await,
    }
}

/// The id of the one task of `tenant_id` that `meant` names.
async fn the_one(state: &AppState, tenant_id: &str, meant: &TaskRef) -> Result<String, ApiError> {
    const SHOWN: usize = 5;
    let mut found = state
        .store
        .tasks_meant(tenant_id, meant, SHOWN as i64 + 1)
        .await?;
    match found.len() {
        0 => Err(ApiError::NotFound(meant.describe())),
        1 => Ok(found.remove(0).id),
        n => {
            let named: Vec<String> = found
                .iter()
                .take(SHOWN)
                .map(|t| format!("#{} {}", t.number, t.name))
                .collect();
            let more = if n > SHOWN { ", and more" } else { "" };
            Err(ApiError::Conflict(format!(
                "several tasks answer to that: {}{more}; name one by its number (#N) or id",
                named.join(", ")
            )))
        }
    }
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
    let placement = t.task.placement.0.clone().unwrap_or_default();
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

/// A port reached only if the task declared it (`ports` in its spec).
pub fn declared(task: &TaskWithUser, number: u16) -> Result<(), ApiError> {
    let spec = &task.task.spec;
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

/// A shell or a port opened into a batch task holds it like a session: the member's session
/// cap counts it (the owner's sessions and batch tasks already held this way), and from then
/// on its organization's session length and idle stop apply (`scheduling::idle`).
pub async fn hold_like_a_session(
    state: &AppState,
    task: &crate::store::TaskWithUser,
) -> Result<(), ApiError> {
    use autodl_common::tasks::TaskKind;
    let t = &task.task;
    if t.spec.kind != TaskKind::Batch {
        return Ok(());
    }
    let policy = state.store.session_policy(&t.tenant_id).await?;
    if policy.max_sessions_per_user.is_none() {
        return Ok(());
    }
    let started = t.started_at.unwrap_or(0);
    let running = state
        .store
        .list_tasks(&crate::store::TaskFilter {
            tenant_id: t.tenant_id.clone(),
            state: Some(TaskState::Running),
            user_id: Some(t.user_id.clone()),
            label: None,
            before: None,
            limit: 1000,
        })
        .await?;
    let batch: Vec<String> = running
        .iter()
        .filter(|r| Some(&r.task.spec).is_some_and(|s| s.kind == TaskKind::Batch))
        .map(|r| r.task.id.clone())
        .collect();
    let held = state.store.last_held(&batch).await?;
    if held.get(&t.id).is_some_and(|at| *at >= started) {
        // Already held this run: counted already.
        return Ok(());
    }
    let held_others = running
        .iter()
        .filter(|r| r.task.id != t.id)
        .filter(|r| {
            held.get(&r.task.id)
                .is_some_and(|at| *at >= r.task.started_at.unwrap_or(0))
        })
        .count() as i64;
    let sessions = state.store.count_open_sessions(&t.user_id).await?;
    Ok(crate::tasks::session::check_holding(
        sessions + held_others,
        &policy,
    )?)
}

/// Says in the task's timeline who reached into it and how (a shell, a command, a port).
pub async fn reached(
    state: &AppState,
    task_id: &str,
    kind: &str,
    what: &str,
) -> Result<(), ApiError> {
    state
        .store
        .add_event(task_id, kind, what, state.clock.now_ms())
        .await?;
    Ok(())
}
