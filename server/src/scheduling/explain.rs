//! The policy's reasons for a waiting task, in words a researcher can act on.

use std::collections::HashMap;

use autodl_common::tasks::{PriorityFactors, Waiting};
use autodl_scheduler::{ClusterState, PendingReason, PendingTask, QuotaCap, TaskRequest};

/// The nodes that could hold a waiting task but are closed to new tasks, when no open node
/// could: worked out once per request shape, as thousands of waiting tasks share a few.
pub struct ClosedNodes<'a> {
    state: &'a ClusterState,
    pending: HashMap<&'a str, &'a TaskRequest>,
    by_shape: HashMap<String, Vec<String>>,
}

impl<'a> ClosedNodes<'a> {
    pub fn new(state: &'a ClusterState) -> Self {
        ClosedNodes {
            state,
            pending: state.pending.iter().map(|t| (t.id.as_str(), t)).collect(),
            by_shape: HashMap::new(),
        }
    }

    /// Closed nodes that would hold `p` (empty unless it waits for resources nothing open has).
    pub fn for_task(&mut self, p: &PendingTask) -> Vec<String> {
        let waits_for_room = match &p.reason {
            PendingReason::NoFit { .. } => true,
            PendingReason::Reserved { nodes, .. } => nodes.is_empty(),
            _ => false,
        };
        let Some(t) = self.pending.get(p.task.as_str()).filter(|_| waits_for_room) else {
            return Vec::new();
        };
        let shape = format!(
            "{:?}/{}/{:?}/{}/{}/{:?}/{:?}",
            t.gpu_types,
            t.gpus_per_worker,
            t.gpu_mem_bytes,
            t.cpu_millis,
            t.mem_bytes,
            t.tolerations,
            t.requires
        );
        let state = self.state;
        self.by_shape
            .entry(shape)
            .or_insert_with(|| {
                let holders = state.nodes.iter().filter(|n| n.could_hold(t));
                let (open, closed): (Vec<_>, Vec<_>) = holders.partition(|n| n.schedulable);
                if open.is_empty() {
                    closed.into_iter().map(|n| n.id.clone()).collect()
                } else {
                    Vec::new()
                }
            })
            .clone()
    }
}

/// Puts the policy's reason into words a researcher can act on. `closed` names the nodes that
/// could hold the task but take no new tasks (cordoned, draining), when no open node could:
/// then no amount of waiting for running tasks helps, and the task should say so.
pub fn explain(p: PendingTask, closed: &[String]) -> Waiting {
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
        PendingReason::Reserved { waiting_for, nodes } if nodes.is_empty() => (
            "resources",
            format!("first in line for {waiting_for}; no node can hold it yet"),
        ),
        PendingReason::Reserved { waiting_for, nodes } => (
            "resources",
            // A reservation keeps the node for this task: nothing queued behind it starts
            // there; tasks ahead of it in the queue still may.
            format!(
                "first in line for {waiting_for}: {} kept for it as running tasks there \
                 finish; tasks queued behind it do not start there",
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
            // Ahead means earlier in the scheduler's order (fair share, deadline, priority,
            // age), which is not always a higher declared priority.
            format!(
                "it would fit, but the free GPUs are held for tasks ahead of it in the queue \
                 (position {})",
                position + 1
            ),
        ),
    };
    let message = match (reason, closed) {
        ("resources", [_, ..]) => format!(
            "{message}. No open node has what it needs: {} {} cordoned or draining, so it \
             waits until an administrator opens {} again or a node that fits joins",
            closed.join(", "),
            if closed.len() == 1 { "is" } else { "are" },
            if closed.len() == 1 { "it" } else { "one" },
        ),
        _ => message,
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
