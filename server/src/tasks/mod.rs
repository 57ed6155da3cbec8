//! Tasks: spec validation, the lifecycle rules, access to nodes, and the task as the API
//! shows it.

pub mod access;
pub mod asha;
pub mod checkpoints;
pub mod gang;
pub mod lifecycle;
pub mod metrics;
pub mod results;
pub mod session;
pub mod spec;
pub mod sweep;

use autodl_common::tasks::{Task, TaskSpec, TaskState, Waiting};
use autodl_scheduler::TaskRequest;

use crate::domain::rfc3339;
use crate::store::{TaskRecord, TaskWithUser};

/// The scheduler's view of a task. Times are Unix seconds. `access` is what
/// [`access::task_access`] says the task tolerates and requires.
pub fn to_request(
    rec: &TaskRecord,
    spec: &TaskSpec,
    access: (Vec<String>, Vec<String>),
) -> TaskRequest {
    let (tolerations, requires) = access;
    TaskRequest {
        id: rec.id.clone(),
        user: rec.user_id.clone(),
        tenant: rec.tenant_id.clone(),
        gpu_types: spec.gpu_types.clone(),
        gpus_per_worker: spec.gpus_per_worker,
        workers: spec.num_workers,
        min_workers: spec.min_workers,
        gpu_mem_bytes: spec.gpu_memory,
        cpu_millis: (spec.cpu * 1000.0).round() as u64,
        mem_bytes: spec.memory,
        priority: spec.priority,
        deadline: spec
            .deadline
            .as_deref()
            .and_then(|d| spec::parse_deadline(d).ok())
            .map(|s| s.max(0) as u64),
        submitted_at: (rec.created_at / 1000).max(0) as u64,
        estimated_runtime: spec.estimated_runtime,
        preemptible: spec.preemptible,
        zone_affinity: spec.zone_affinity,
        attained_gpu_seconds: rec.attained_gpu_seconds,
        tolerations,
        requires,
    }
}

/// The task as the API shows it; why it waits is what the leader's latest cycle stored.
pub fn to_api(t: TaskWithUser) -> Task {
    let waiting: Option<Waiting> = t
        .task
        .waiting
        .as_deref()
        .and_then(|w| serde_json::from_str(w).ok());
    let state = t.task.state;
    let waiting = (state == TaskState::Pending).then(|| {
        waiting.unwrap_or(Waiting {
            reason: None,
            message: "waiting for the scheduler's next cycle".into(),
            position: None,
            priority: None,
            estimated_start: None,
        })
    });
    Task {
        placement: t.task.placement.0,
        id: t.task.id,
        number: t.task.number.max(0) as u64,
        name: t.task.name,
        state,
        user_id: t.task.user_id,
        user_email: t.user_email,
        tenant_id: t.task.tenant_id,
        spec: t.task.spec.0,
        created_at: rfc3339(t.task.created_at),
        updated_at: rfc3339(t.task.updated_at),
        attempts: t.task.attempts as u32,
        batch_size: t.task.batch_size.map(|b| b as u32),
        waiting,
        started_at: t.task.started_at.map(rfc3339),
        finished_at: t.task.finished_at.map(rfc3339),
        gpu_seconds: t.task.attained_gpu_seconds,
        results: t.task.results,
        summary: Default::default(),
    }
}
