#![allow(dead_code)]

use autodl_scheduler::*;

pub const GIB: u64 = 1 << 30;

pub fn node(id: &str, zone: &str, gpus: u32, gpu_type: &str, gpu_mem_gib: u64) -> Node {
    Node {
        id: id.into(),
        zone: zone.into(),
        labels: Default::default(),
        cpu_millis: 64_000,
        mem_bytes: 512 * GIB,
        gpus: (0..gpus)
            .map(|i| Gpu {
                index: i,
                gpu_type: gpu_type.into(),
                mem_bytes: gpu_mem_gib * GIB,
                util: 0.0,
            })
            .collect(),
        schedulable: true,
        taints: vec![],
        features: vec![],
        own_network: false,
    }
}

pub fn task(id: &str, user: &str, gpus: u32, submitted_at: Time) -> TaskRequest {
    TaskRequest {
        id: id.into(),
        user: user.into(),
        tenant: "lab".into(),
        gpu_types: vec![],
        gpus_per_worker: gpus,
        workers: 1,
        min_workers: None,
        gpu_mem_bytes: None,
        cpu_millis: 1_000,
        mem_bytes: 4 * GIB,
        priority: 0.5,
        deadline: None,
        submitted_at,
        estimated_runtime: None,
        preemptible: true,
        zone_affinity: false,
        attained_gpu_seconds: 0.0,
        tolerations: vec![],
        requires: vec![],
    }
}

pub fn running(t: TaskRequest, node: &str, gpus: &[u32], started_at: Time) -> RunningTask {
    RunningTask {
        request: t,
        placements: vec![WorkerPlacement {
            node: node.into(),
            gpu_indices: gpus.to_vec(),
        }],
        started_at,
        last_checkpoint_at: None,
        preempting: false,
    }
}

pub fn placed<'a>(d: &'a Decisions, id: &str) -> Option<&'a Vec<WorkerPlacement>> {
    d.decisions.iter().find_map(|x| match x {
        Decision::Place {
            task, placements, ..
        } if task == id => Some(placements),
        _ => None,
    })
}

pub fn reason<'a>(d: &'a Decisions, id: &str) -> Option<&'a PendingReason> {
    d.pending.iter().find(|p| p.task == id).map(|p| &p.reason)
}

pub fn preempted(d: &Decisions) -> Vec<String> {
    d.decisions
        .iter()
        .filter_map(|x| match x {
            Decision::Preempt { task, .. } => Some(task.clone()),
            _ => None,
        })
        .collect()
}

/// Applies the Place decisions as the server would, turning them into running tasks.
pub fn apply(state: &mut ClusterState, d: &Decisions, now: Time) {
    for x in &d.decisions {
        if let Decision::Place {
            task, placements, ..
        } = x
        {
            let i = state
                .pending
                .iter()
                .position(|t| &t.id == task)
                .expect("placed task was pending");
            let t = state.pending.remove(i);
            state.running.push(RunningTask {
                request: t,
                placements: placements.clone(),
                started_at: now,
                last_checkpoint_at: None,
                preempting: false,
            });
        }
    }
}
