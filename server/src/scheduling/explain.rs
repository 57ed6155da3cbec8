//! The policy's reasons for a waiting task, in words a researcher can act on.

use std::collections::HashMap;

use autodl_common::tasks::{PriorityFactors, Waiting};
use autodl_scheduler::{ClusterState, PendingReason, PendingTask, QuotaCap, TaskRequest};

/// The nodes that could hold a waiting task but are closed to new tasks, when no open node
/// could: worked out once per request shape, as thousands of waiting tasks share a few.
pub struct ClosedNodes<'a> {
    state: &'a ClusterState,
    /// Whether any node is closed at all: mostly none is, and then no task needs a look.
    any: bool,
    pending: HashMap<&'a str, &'a TaskRequest>,
    by_shape: HashMap<String, Vec<String>>,
}

impl<'a> ClosedNodes<'a> {
    pub fn new(state: &'a ClusterState) -> Self {
        ClosedNodes {
            state,
            any: state.nodes.iter().any(|n| !n.schedulable),
            pending: state.pending.iter().map(|t| (t.id.as_str(), t)).collect(),
            by_shape: HashMap::new(),
        }
    }

    /// Closed nodes that would hold `p` (empty unless it waits for resources nothing open has).
    pub fn for_task(&mut self, p: &PendingTask) -> Vec<String> {
        if !self.any {
            return Vec::new();
        }
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
        PendingReason::BehindHigherPriority { .. } => (
            "priority",
            // Ahead means earlier in the scheduler's order (fair share, deadline, priority,
            // age), which is not always a higher declared priority.
            // The position has its own field: a message that carried it would change
            // whenever anything ahead started, and be rewritten for the whole queue.
            "it would fit, but the free GPUs are held for tasks ahead of it in the queue"
                .to_owned(),
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

/// Where the queue's head ends: positions up to here are kept exact, as the researchers
/// whose tasks are about to start watch them.
const EXACT_POSITIONS: usize = 100;

/// Whether a queue position is at the head, where explanations are kept exact and current.
pub fn at_the_head(position: usize) -> bool {
    position <= EXACT_POSITIONS
}

/// What a new explanation says that the one already stored does not (the first found), or
/// `None` when the stored one still says it and need not be written again. Every placement
/// moves everything behind it in the queue; deep in a queue of tens of thousands a move of a
/// few per cent tells nobody anything, and rewriting every waiting task each cycle would cost
/// more than deciding. What is kept is refreshed anyway every little while
/// (`waiting::REFRESH_MS`).
pub fn change(old: &Waiting, new: &Waiting, now_ms: i64) -> Option<Change> {
    let position = match (old.position, new.position) {
        (Some(a), Some(b)) if !at_the_head(a.max(b)) => a.abs_diff(b) <= a.max(b) / 10,
        (a, b) => a == b,
    };
    if old.reason != new.reason || old.message != new.message {
        Some(Change::Reason)
    } else if !position {
        Some(Change::Position)
    } else if !super::forecast::close_enough(
        old.estimated_start.as_deref(),
        new.estimated_start.as_deref(),
        now_ms,
    ) {
        Some(Change::Estimate)
    } else {
        None
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Reason = 0,
    Position = 1,
    Estimate = 2,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(position: usize) -> Waiting {
        Waiting {
            reason: Some("priority".into()),
            message: "held for tasks ahead".into(),
            position: Some(position),
            estimated_start: None,
            priority: None,
        }
    }

    #[test]
    fn the_head_of_the_queue_is_exact_and_the_deep_queue_approximate() {
        assert_eq!(change(&at(3), &at(3), 0), None);
        assert_eq!(change(&at(3), &at(2), 0), Some(Change::Position));
        assert_eq!(change(&at(100), &at(99), 0), Some(Change::Position));
        assert_eq!(change(&at(20_000), &at(19_000), 0), None);
        assert_eq!(change(&at(20_000), &at(17_000), 0), Some(Change::Position));
        assert_eq!(change(&at(150), &at(90), 0), Some(Change::Position));
        let mut other = at(3);
        other.reason = Some("resources".into());
        assert_eq!(change(&at(3), &other, 0), Some(Change::Reason));
    }
}
