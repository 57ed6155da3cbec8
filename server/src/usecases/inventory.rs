//! The cluster's inventory: every node and what is allocated on it as the caller may see it
//! (only the caller's organization's task ids; platform administrators see all), and nodes a
//! platform administrator declares by hand (a node whose agent registered it reports its own
//! capacity and isolation).

use std::collections::{BTreeMap, HashMap};

use autodl_common::tasks::{GpuInventoryInput, NodeGpu, NodeInfo, NodeInput};
use autodl_scheduler::Gpu;

use crate::auth::Caller;
use crate::domain::{parse_gpu_type, parse_node_id, NodeStatus};
use crate::error::ApiError;
use crate::scheduling::to_node;
use crate::state::AppState;
use crate::store::NodeRecord;
use crate::tasks::access::{self, Isolation};
use crate::tasks::spec::parse_size;

/// GPUs held per node and GPU: memory, the caller's tasks, and how many of others'.
#[derive(Default)]
struct Held {
    memory: u64,
    tasks: Vec<String>,
    /// The numbers of `tasks`, in their order.
    numbers: Vec<u64>,
    others: u32,
    /// Of `tasks`, another organization's (shown to platform admins).
    foreign: Vec<String>,
}

pub async fn nodes(state: &AppState, caller: &Caller) -> Result<Vec<NodeInfo>, ApiError> {
    let nodes = state.store.list_nodes().await?;
    // Which tasks hold which GPU, from the placements of scheduled and running tasks.
    let mut held: HashMap<(String, u32), Held> = HashMap::new();
    for t in state.store.active_tasks().await? {
        let (Some(placement), spec) = (t.placement.0.clone(), &t.spec) else {
            continue;
        };
        let visible = caller.user.platform_admin || t.tenant_id == caller.tenant_id();
        for p in placement {
            for i in p.gpu_indices {
                let e = held.entry((p.node.clone(), i)).or_default();
                e.memory = e.memory.saturating_add(spec.gpu_memory.unwrap_or(u64::MAX));
                if visible {
                    e.tasks.push(t.id.clone());
                    e.numbers.push(t.number.max(0) as u64);
                    if t.tenant_id != caller.tenant_id() {
                        e.foreign.push(t.id.clone());
                    }
                } else {
                    e.others += 1;
                }
            }
        }
    }
    // How busy each GPU is now: its latest sample of the last half minute.
    let since = state.clock.now_ms() - 30_000;
    let busy: HashMap<(String, u32), f64> = state
        .store
        .latest_gpu_utilization(since)
        .await?
        .into_iter()
        .filter_map(|(n, i, u)| Some(((n, u32::try_from(i).ok()?), u)))
        .collect();
    let mut out = Vec::new();
    for r in &nodes {
        let n = to_node(r)?;
        out.push(NodeInfo {
            gpus: n
                .gpus
                .iter()
                .map(|g| {
                    let h = held.remove(&(n.id.clone(), g.index)).unwrap_or_default();
                    NodeGpu {
                        index: g.index,
                        gpu_type: g.gpu_type.clone(),
                        memory: g.mem_bytes,
                        allocated_memory: h.memory.min(g.mem_bytes),
                        tasks: h.tasks,
                        task_numbers: h.numbers,
                        other_tasks: h.others,
                        other_org_tasks: h.foreign,
                        utilization: busy.get(&(n.id.clone(), g.index)).copied(),
                    }
                })
                .collect(),
            id: n.id,
            zone: n.zone,
            labels: n.labels,
            cpu: n.cpu_millis as f64 / 1000.0,
            memory: n.mem_bytes,
            schedulable: n.schedulable,
            runtime: r.runtime.clone(),
            isolation: r.isolation.clone(),
            trusted_only: access::is_trusted_only(r),
            data_roots: access::data_roots(r),
            limits: crate::store::HostDetail::of(r).limits,
            network: crate::store::HostDetail::of(r).network,
        });
    }
    Ok(out)
}

/// Declares (or updates) a node and its GPUs by hand.
pub async fn declare(
    state: &AppState,
    caller: &Caller,
    input: NodeInput,
) -> Result<NodeInfo, ApiError> {
    caller.require_platform_admin()?;
    parse_node_id("id", &input.id)?;
    if !input.cpu.is_finite() || input.cpu <= 0.0 || input.cpu > 100_000.0 {
        return Err(ApiError::invalid(
            "cpu",
            "cpu must be a positive number of cores",
        ));
    }
    let memory = parse_size("memory", &input.memory)?;
    let gpu_list: Vec<(String, u64)> = match &input.gpus {
        GpuInventoryInput::Uniform {
            gpu_type,
            count,
            memory,
        } => {
            let m = parse_size("gpus.memory", memory)?;
            (0..*count).map(|_| (gpu_type.clone(), m)).collect()
        }
        GpuInventoryInput::List(each) => each
            .iter()
            .map(|g| Ok((g.gpu_type.clone(), parse_size("gpus.memory", &g.memory)?)))
            .collect::<Result<_, ApiError>>()?,
    };
    if gpu_list.len() > 64 {
        return Err(ApiError::invalid("gpus", "at most 64 GPUs per node"));
    }
    let gpu_list = gpu_list
        .into_iter()
        .map(|(t, m)| Ok((parse_gpu_type("gpus", &t)?, m)))
        .collect::<Result<Vec<_>, ApiError>>()?;
    if input.data_roots.len() > 64
        || input
            .data_roots
            .iter()
            .any(|r| r == "/" || r.len() > 1024 || !access::is_clean_absolute(r))
    {
        return Err(ApiError::invalid(
            "data_roots",
            "at most 64 dataset roots, each a normalised absolute folder other than /",
        ));
    }
    if input.labels.len() > 64 || input.zone.len() > 128 {
        return Err(ApiError::invalid(
            "labels",
            "too many labels or zone name too long",
        ));
    }
    let gpus: Vec<Gpu> = gpu_list
        .into_iter()
        .enumerate()
        .map(|(i, (gpu_type, mem_bytes))| Gpu {
            index: i as u32,
            gpu_type,
            mem_bytes,
            util: 0.0,
        })
        .collect();
    // A node whose agent registered it reports its own capacity and isolation.
    if state
        .store
        .list_nodes()
        .await?
        .iter()
        .any(|n| n.id == input.id && n.credential_hash.is_some())
    {
        return Err(ApiError::Conflict(format!(
            "node {} is managed by its agent; remove it first to declare it by hand",
            input.id
        )));
    }
    let now = state.clock.now_ms();
    let rec = NodeRecord {
        id: input.id.clone(),
        zone: input.zone.clone(),
        labels: crate::store::JsonText(input.labels.clone().into_iter().collect()),
        cpu_millis: (input.cpu * 1000.0).round() as i64,
        mem_bytes: memory as i64,
        gpus: crate::store::JsonText(gpus.clone()),
        schedulable: true,
        created_at: now,
        updated_at: now,
        credential_hash: None,
        last_seen: None,
        status: NodeStatus::Ready,
        runtime: String::new(),
        isolation: Isolation::Declared.as_str().into(),
        data_roots: serde_json::to_string(&input.data_roots).map_err(anyhow::Error::from)?,
        host_detail: "{}".into(),
        open_to_all: false,
    };
    state.store.upsert_node(&rec).await?;
    state.scheduler.invalidate_nodes();
    state.scheduler.wake();
    let info = NodeInfo {
        id: rec.id,
        zone: rec.zone,
        labels: input.labels.into_iter().collect::<BTreeMap<_, _>>(),
        cpu: input.cpu,
        memory,
        schedulable: true,
        gpus: gpus
            .into_iter()
            .map(|g| NodeGpu {
                index: g.index,
                gpu_type: g.gpu_type,
                memory: g.mem_bytes,
                allocated_memory: 0,
                tasks: vec![],
                task_numbers: vec![],
                other_tasks: 0,
                other_org_tasks: vec![],
                utilization: None,
            })
            .collect(),
        runtime: String::new(),
        isolation: Isolation::Declared.as_str().into(),
        trusted_only: false,
        data_roots: input.data_roots.clone(),
        limits: String::new(),
        network: String::new(),
    };
    Ok(info)
}

/// Removes a node from the inventory.
pub async fn remove(state: &AppState, caller: &Caller, id: &str) -> Result<(), ApiError> {
    caller.require_platform_admin()?;
    if !state.store.delete_node(id).await? {
        return Err(ApiError::NotFound("no such node".into()));
    }
    state.scheduler.invalidate_nodes();
    Ok(())
}
