//! Submitting a task: the spec is normalised, then checked against what the platform and the
//! caller's quotas allow, and refused at once if it could never run; an idempotency key makes a
//! retried submission return the task the first one created.

use std::collections::BTreeSet;

use autodl_common::tasks::{TaskKind, TaskSpec, TaskSpecInput, TaskState};
use autodl_scheduler::{admission_check, ClusterView, Node, Quotas};

use crate::auth::secrets::time_ordered_id;
use crate::auth::Caller;
use crate::domain::IdempotencyKey;
use crate::error::ApiError;
use crate::scheduling::to_quota;
use crate::state::AppState;
use crate::store::{
    JsonText, NewTask, QuotaRecord, QuotaScope, TaskCaps, TaskCreated, TaskRecord, TaskWithUser,
};
use crate::tasks::{access, session, spec, to_request};

/// What a submission did.
pub enum Submitted {
    Created(TaskWithUser),
    /// The idempotency key was used before: the task that first request created.
    Existing(TaskWithUser),
}

pub async fn submit(
    state: &AppState,
    caller: &Caller,
    input: TaskSpecInput,
    key: Option<IdempotencyKey>,
) -> Result<Submitted, ApiError> {
    let now = state.clock.now_ms();
    let mut input = input;
    name_after(state, caller, &mut input.after).await?;
    let mut spec = spec::normalise(input, now / 1000)?;
    session_rules(state, caller, &mut spec).await?;
    let rec = new_record(caller, &spec, key.map(IdempotencyKey::into_inner), now)?;
    let caps = vet(state, caller, &rec, &spec, 1).await?;

    let labels: Vec<(String, String)> = spec
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let created = state
        .submissions
        .submit(NewTask {
            task: rec.clone(),
            labels,
            kind: spec.kind,
            caps,
        })
        .await?;
    Ok(match created {
        TaskCreated::Created(number) => {
            state.scheduler.wake();
            Submitted::Created(TaskWithUser {
                task: TaskRecord { number, ..rec },
                user_email: caller.user.email.clone(),
            })
        }
        TaskCreated::Existing(t) => {
            same_request(&t.task, &spec)?;
            Submitted::Existing(*t)
        }
        TaskCreated::OverCap(why) => return Err(ApiError::Quota(why)),
    })
}

/// A session's length under its organization's cap (see `tasks::session`).
pub(crate) async fn session_rules(
    state: &AppState,
    caller: &Caller,
    spec: &mut TaskSpec,
) -> Result<(), ApiError> {
    if spec.kind == TaskKind::Session {
        let policy = state.store.session_policy(caller.tenant_id()).await?;
        session::cap_length(spec, &policy);
    }
    Ok(())
}

/// A new task of the caller's, pending.
pub(crate) fn new_record(
    caller: &Caller,
    spec: &TaskSpec,
    idempotency_key: Option<String>,
    now: i64,
) -> Result<TaskRecord, ApiError> {
    Ok(TaskRecord {
        id: time_ordered_id(),
        number: 0,
        tenant_id: caller.tenant_id().to_owned(),
        user_id: caller.user.id.clone(),
        name: spec.name.clone(),
        state: TaskState::Pending,
        spec: JsonText(spec.clone()),
        gpus_total: i64::from(spec.gpus_per_worker) * i64::from(spec.num_workers),
        idempotency_key,
        attempts: 0,
        batch_size: spec.batch_size.map(i64::from),
        placement: JsonText(None),
        attained_gpu_seconds: 0.0,
        last_checkpoint_at: None,
        created_at: now,
        updated_at: now,
        started_at: None,
        finished_at: None,
        stop_reason: None,
        waiting: None,
        results: None,
    })
}

/// Everything a new task is checked against before it is stored: its storage, code and data,
/// the caller's GPU types and queue caps (for `adding` tasks at once), what it starts after,
/// and whether it could ever fit. Returns the caps the store checks again as it stores it
/// (concurrent submissions could all pass this first check).
pub(crate) async fn vet(
    state: &AppState,
    caller: &Caller,
    rec: &TaskRecord,
    spec: &TaskSpec,
    adding: i64,
) -> Result<TaskCaps, ApiError> {
    check_storage_urls(state, caller.tenant_id(), spec).await?;
    if let Some(code) = &spec.code {
        crate::usecases::code::check_submitted(state, caller.tenant_id(), code).await?;
    }
    let store = state.store.as_ref();
    let nodes = state.scheduler.nodes(store, state.clock.now_ms()).await?;
    check_host_data_path(spec, &nodes)?;
    let tenant_q = state
        .accounts
        .quota(store, QuotaScope::Tenant, caller.tenant_id())
        .await?;
    let user_q = state
        .accounts
        .quota(store, QuotaScope::User, &caller.user.id)
        .await?;
    check_gpu_types(spec, &tenant_q, &user_q)?;
    check_after(state, caller, spec).await?;
    check_queue_caps(state, caller, &tenant_q, &user_q, adding).await?;
    let mut caps = TaskCaps {
        user_queued: user_q.max_queued_tasks,
        tenant_queued: tenant_q.max_queued_tasks,
        user_sessions: None,
    };
    if spec.kind == TaskKind::Session {
        let policy = state.store.session_policy(caller.tenant_id()).await?;
        let open = state.store.count_open_sessions(&caller.user.id).await?;
        session::check_open_sessions(open, adding, &policy)?;
        caps.user_sessions = policy.max_sessions_per_user.map(i64::from);
    }
    admit(state, caller, rec, spec, &nodes, &tenant_q, &user_q).await?;
    Ok(caps)
}

/// A repeated idempotency key must come with the request it was first used for: a different
/// one is a client's mistake (a key reused across tasks), and answering it with the old task
/// would hide that the new task was never made.
fn same_request(existing: &TaskRecord, spec: &TaskSpec) -> Result<(), ApiError> {
    if *existing.spec == *spec {
        Ok(())
    } else {
        Err(ApiError::Unprocessable(format!(
            "this Idempotency-Key was used for a different request (task {}); send a new key \
             for a new task, or the same request to get that task again",
            existing.id
        )))
    }
}

/// `checkpoint.save_to` and an `s3://` `data_path` must name a bucket tenants may use, and one
/// that exists (when object storage answers; an outage does not block submissions).
async fn check_storage_urls(
    state: &AppState,
    tenant_id: &str,
    spec: &TaskSpec,
) -> Result<(), ApiError> {
    // An absolute path is where the task sees its checkpoint folder inside its container
    // (the seed articles' `checkpoint_path: "/checkpoints"`); the platform still stores it.
    let save_to = spec
        .checkpoint
        .as_ref()
        .and_then(|c| c.save_to.as_deref())
        .filter(|p| !p.starts_with('/'));
    let data = spec.data_path.as_deref().filter(|p| p.starts_with("s3://"));
    for (field, url) in [("checkpoint.save_to", save_to), ("data_path", data)] {
        let Some(url) = url else { continue };
        if !url.starts_with("s3://") {
            return Err(ApiError::invalid(
                field,
                format!("{field} is an s3://bucket/path URL or an absolute path in the container"),
            ));
        }
        let (bucket, prefix) = state
            .storage
            .resolve(tenant_id, url)
            .map_err(|m| ApiError::invalid(field, format!("{field}: {m}")))?;
        let backend = &state.storage.backend;
        match backend.bucket_exists(&bucket).await {
            Ok(true) => {}
            Ok(false) => {
                return Err(ApiError::invalid(
                    field,
                    format!("{field}: bucket {bucket:?} does not exist"),
                ))
            }
            Err(e) => {
                tracing::warn!(error = %e, bucket, "could not check a bucket at submission");
                continue;
            }
        }
        // Checkpoints are written by the task; data must be there before it starts, or the
        // task would train on an empty folder.
        if field == "data_path" {
            match backend.any_under(&bucket, &prefix).await {
                Ok(true) => {}
                Ok(false) => {
                    return Err(ApiError::invalid(
                        field,
                        format!(
                            "data_path: nothing is stored under {url}; upload the data first \
                             (the Python SDK's `Client.upload_data(DIR, \"{url}\")`, or PUT \
                             /api/v1/objects/{bucket}/PATH), or name a folder that holds it"
                        ),
                    ))
                }
                Err(e) => {
                    tracing::warn!(error = %e, bucket, "could not check a data path at submission")
                }
            }
        }
    }
    Ok(())
}

/// `after` may name tasks as people do (`#412`, a name, an id prefix): each becomes the id of
/// the one task of the organization it names, as the spec keeps it.
pub(crate) async fn name_after(
    state: &AppState,
    caller: &Caller,
    after: &mut [String],
) -> Result<(), ApiError> {
    // Checked before any is looked up: each name costs a query.
    if after.len() > spec::MAX_AFTER {
        return Err(ApiError::invalid(
            "after",
            format!("after names at most {} tasks", spec::MAX_AFTER),
        ));
    }
    for what in after.iter_mut() {
        *what = crate::usecases::reach::id_of(state, caller, what)
            .await
            .map_err(|e| match e {
                ApiError::NotFound(m) | ApiError::Conflict(m) => {
                    ApiError::invalid("after", format!("after: {m}"))
                }
                other => other,
            })?;
    }
    Ok(())
}

/// Tasks named in `after` must be the organization's, and able still to end as needed. They
/// exist before this one does, so no chain of them can loop back to it.
async fn check_after(state: &AppState, caller: &Caller, spec: &TaskSpec) -> Result<(), ApiError> {
    if spec.after.is_empty() {
        return Ok(());
    }
    let found = state
        .store
        .task_states(Some(caller.tenant_id()), &spec.after)
        .await?;
    for id in &spec.after {
        match found.iter().find(|(f, _)| f == id) {
            None => {
                return Err(ApiError::invalid(
                    "after",
                    format!("after: no task {id} in your organization"),
                ))
            }
            Some((_, s))
                if spec.after_when == autodl_common::tasks::AfterWhen::Ok
                    && s.is_finished()
                    && *s != TaskState::Completed =>
            {
                return Err(ApiError::invalid(
                    "after",
                    format!(
                        "after: task {id} already ended {}, so this task could never start; \
                         use after_when \"any\" to start after it regardless",
                        s.as_str()
                    ),
                ))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// A host folder as `data_path` must be inside a dataset root some node shares.
fn check_host_data_path(spec: &TaskSpec, nodes: &[Node]) -> Result<(), ApiError> {
    let Some(p) = access::host_data_path(spec) else {
        return Ok(());
    };
    if access::root_for(p, nodes).is_some() {
        return Ok(());
    }
    let roots: BTreeSet<&str> = nodes
        .iter()
        .flat_map(|n| n.features.iter())
        .filter_map(|f| f.strip_prefix("data-root:"))
        .collect();
    Err(ApiError::invalid(
        "data_path",
        format!(
            "data_path {p} is not inside a dataset root of any node ({}); use platform storage (s3://...) or a folder an administrator shares",
            if roots.is_empty() {
                "no node shares one".to_string()
            } else {
                format!("roots: {}", roots.into_iter().collect::<Vec<_>>().join(", "))
            }
        ),
    ))
}

/// Requested GPU types must be allowed by the organization's quota and the user's. (GPUs at
/// once and GPU-hours keep a task pending instead: they change as other tasks end.)
fn check_gpu_types(
    spec: &TaskSpec,
    tenant_q: &QuotaRecord,
    user_q: &QuotaRecord,
) -> Result<(), ApiError> {
    for (whose, q) in [("your organization's", tenant_q), ("your", user_q)] {
        let permitted = &q.allowed_gpu_types;
        if let Some(allowed) = permitted.list() {
            if let Some(bad) = spec.gpu_types.iter().find(|t| !permitted.admits_request(t)) {
                return Err(ApiError::Quota(format!(
                    "GPU type {bad} is not allowed by {whose} quota (allowed: {})",
                    allowed.join(", ")
                )));
            }
        }
    }
    Ok(())
}

/// At most `max_queued_tasks` pending tasks per user and per organization.
async fn check_queue_caps(
    state: &AppState,
    caller: &Caller,
    tenant_q: &QuotaRecord,
    user_q: &QuotaRecord,
    adding: i64,
) -> Result<(), ApiError> {
    if tenant_q.max_queued_tasks.is_none() && user_q.max_queued_tasks.is_none() {
        return Ok(());
    }
    let (mine, tenant) = state
        .store
        .count_pending(&caller.user.id, caller.tenant_id())
        .await?;
    if let Some(cap) = user_q.max_queued_tasks.filter(|cap| mine + adding > *cap) {
        return Err(ApiError::Quota(format!(
            "you already have {mine} queued tasks{} (your cap is {cap})",
            adding_text(adding)
        )));
    }
    if let Some(cap) = tenant_q
        .max_queued_tasks
        .filter(|cap| tenant + adding > *cap)
    {
        return Err(ApiError::Quota(format!(
            "your organization already has {tenant} queued tasks{} (cap {cap})",
            adding_text(adding)
        )));
    }
    Ok(())
}

fn adding_text(adding: i64) -> String {
    if adding > 1 {
        format!(" and this adds {adding}")
    } else {
        String::new()
    }
}

/// Admission: refuse what can never fit, by the scheduler's own check. With no nodes
/// registered yet nothing is known, so the task waits for capacity instead.
async fn admit(
    state: &AppState,
    caller: &Caller,
    rec: &TaskRecord,
    spec: &TaskSpec,
    nodes: &[Node],
    tenant_q: &QuotaRecord,
    user_q: &QuotaRecord,
) -> Result<(), ApiError> {
    if nodes.is_empty() {
        return Ok(());
    }
    let mut quotas = Quotas::default();
    quotas
        .tenants
        .insert(caller.tenant_id().to_owned(), to_quota(tenant_q));
    quotas
        .users
        .insert(caller.user.id.clone(), to_quota(user_q));
    let view = ClusterView {
        nodes,
        quotas: &quotas,
        config: &state.scheduler.config,
    };
    let trusted = state
        .accounts
        .tenant(state.store.as_ref(), caller.tenant_id())
        .await?
        .is_some_and(|t| t.trusted);
    let access = access::task_access(trusted, spec, nodes);
    admission_check(&view, &to_request(rec, spec, access))
        .map_err(|e| ApiError::Unschedulable(e.to_string()))
}
