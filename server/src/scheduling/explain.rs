//! The policy's reasons for a waiting task, in words a researcher can act on.

use autodl_common::tasks::{PriorityFactors, Waiting};
use autodl_scheduler::{PendingReason, PendingTask, QuotaCap};

/// Puts the policy's reason into words a researcher can act on.
pub fn explain(p: PendingTask) -> Waiting {
    let (reason, message) = match &p.reason {
        PendingReason::Quota { scope, cap, .. } => {
            let whose = match scope {
                autodl_scheduler::QuotaScope::Tenant => "your organization's",
                autodl_scheduler::QuotaScope::User => "your",
            };
            let msg = match cap {
                QuotaCap::Gpus {
                    limit,
                    in_use,
                    requested,
                } => {
                    format!("over {whose} GPU quota: {in_use} of {limit} GPUs in use, this task needs {requested}")
                }
                QuotaCap::GpuHoursPerMonth { limit, used } => {
                    format!("{whose} monthly GPU-hours are spent: {used:.1} of {limit:.1} used")
                }
                QuotaCap::GpuTypes { allowed } => {
                    format!(
                        "{whose} quota allows only these GPU types: {}",
                        allowed.join(", ")
                    )
                }
            };
            ("quota", msg)
        }
        PendingReason::NoFit { waiting_for } => (
            "resources",
            format!("waiting for free resources: {waiting_for}"),
        ),
        PendingReason::Reserved { waiting_for, nodes } => (
            "resources",
            format!(
                "next in line: {} reserved while they drain, for {waiting_for}",
                nodes.join(", ")
            ),
        ),
        PendingReason::WaitingForPreemption { victims } => (
            "preemption",
            format!(
                "lower-priority tasks are being preempted to make room ({})",
                victims.len()
            ),
        ),
        PendingReason::WaitingForMigration { tasks } => (
            "preemption",
            format!(
                "shared tasks are being moved to make room ({})",
                tasks.len()
            ),
        ),
        PendingReason::BehindHigherPriority { position, .. } => (
            "priority",
            format!(
                "behind higher-priority tasks (position {} in the queue)",
                position + 1
            ),
        ),
    };
    let b = &p.priority;
    Waiting {
        reason: Some(reason.to_owned()),
        message,
        position: Some(p.position),
        estimated_start: None,
        priority: Some(PriorityFactors {
            fair_share: b.fair_share,
            utilization: b.utilization,
            deadline: b.deadline,
            declared: b.declared,
            age: b.age,
            gpu_fit: b.gpu_fit,
            total: b.total,
        }),
    }
}
