//! Submission-time check: reject at once what could never run, instead of letting it wait
//! forever with a reason the user has to decode.

use crate::config::PolicyConfig;
use crate::types::{accepts_type, Node, Quotas, TaskRequest};
use std::collections::BTreeMap;

/// What the admission check looks at: the cluster's capacity (not its current load) and caps.
#[derive(Debug, Clone, Copy)]
pub struct ClusterView<'a> {
    pub nodes: &'a [Node],
    pub quotas: &'a Quotas,
    pub config: &'a PolicyConfig,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdmissionError {
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("no GPU of type {requested} exists in this cluster (available: {available})")]
    UnknownGpuType {
        requested: String,
        available: String,
    },
    #[error("{requested_gib:.1} GiB of GPU memory per GPU requested, but the largest acceptable GPU has {largest_gib:.1} GiB")]
    GpuMemoryTooLarge {
        requested_gib: f64,
        largest_gib: f64,
    },
    #[error("one worker needs {gpus} GPU(s), {cpu_millis} mCPU and {mem_gib:.1} GiB RAM on a single node; no node has that much")]
    WorkerTooLarge {
        gpus: u32,
        cpu_millis: u64,
        mem_gib: f64,
    },
    #[error("{requested} GPUs requested, but the cluster has only {available} acceptable GPUs")]
    TooManyGpus { requested: u32, available: u32 },
    #[error("{workers} workers requested, but at most {possible} fit in the cluster{}{}{}", if *.same_zone { " within one zone" } else { "" }, if *.one_type { " on GPUs of one type (a gang never mixes types)" } else { "" }, if *.isolated { " (a gang does not span isolated nodes: each task there has a network of its own)" } else { "" })]
    TooManyWorkers {
        workers: u32,
        possible: u32,
        same_zone: bool,
        /// The task accepts several GPU types, and no one type has room for all its workers.
        one_type: bool,
        /// Some nodes keep each task's network apart: a gang there stays on one node.
        isolated: bool,
    },
    #[error("{} may use at most {limit} GPUs at once, the task asks for {requested}", whose(.scope))]
    OverGpuQuota {
        scope: &'static str,
        name: String,
        limit: u32,
        requested: u32,
    },
    #[error("no node of the cluster is open to this task: {why}")]
    NoNodeAdmits { why: String },
    #[error("{} may only use GPU types {}, none of which the task accepts", whose(.scope), .allowed.join(", "))]
    GpuTypeNotAllowed {
        scope: &'static str,
        name: String,
        allowed: Vec<String>,
    },
}

/// Who a quota binds, as the submitter reads it: the ids in `name` mean nothing to them.
fn whose(scope: &str) -> &'static str {
    if scope == "tenant" {
        "your organization"
    } else {
        "you"
    }
}

const GIB: f64 = (1u64 << 30) as f64;

/// Checks a request against the cluster's total capacity and the static caps.
/// An elastic task is judged at its narrowest: it is admitted if its minimum could ever run.
pub fn admission_check(view: &ClusterView<'_>, t: &TaskRequest) -> Result<(), AdmissionError> {
    let narrowest;
    let t = if t.is_elastic() {
        narrowest = t.at_width(t.narrowest());
        &narrowest
    } else {
        t
    };
    if t.workers == 0 {
        return Err(AdmissionError::Invalid("workers must be at least 1".into()));
    }
    if !(0.0..=1.0).contains(&t.priority) || t.priority.is_nan() {
        return Err(AdmissionError::Invalid(format!(
            "priority must be in [0, 1], got {}",
            t.priority
        )));
    }
    if t.gpu_mem_bytes.is_some() && t.gpus_per_worker == 0 {
        return Err(AdmissionError::Invalid(
            "gpu_mem_bytes given for a task without GPUs".into(),
        ));
    }
    for (scope, name, quota) in [
        ("tenant", &t.tenant, view.quotas.tenants.get(&t.tenant)),
        ("user", &t.user, view.quotas.users.get(&t.user)),
    ] {
        let Some(q) = quota else { continue };
        if let Some(limit) = q.max_gpus {
            if t.total_gpus() > limit {
                return Err(AdmissionError::OverGpuQuota {
                    scope,
                    name: name.clone(),
                    limit,
                    requested: t.total_gpus(),
                });
            }
        }
        if t.total_gpus() > 0 && !q.allowed_gpu_types.is_empty() {
            let any = view.nodes.iter().flat_map(|n| n.gpus.iter()).any(|g| {
                accepts_type(&q.allowed_gpu_types, &g.gpu_type)
                    && accepts_type(&t.gpu_types, &g.gpu_type)
            }) || t
                .gpu_types
                .iter()
                .any(|r| accepts_type(&q.allowed_gpu_types, r));
            if !any {
                return Err(AdmissionError::GpuTypeNotAllowed {
                    scope,
                    name: name.clone(),
                    allowed: q.allowed_gpu_types.clone(),
                });
            }
        }
    }
    if !view.nodes.is_empty()
        && !view
            .nodes
            .iter()
            .any(|n| n.admits(&t.tolerations, &t.requires))
    {
        let missing: Vec<&str> = t
            .requires
            .iter()
            .filter(|r| !view.nodes.iter().any(|n| n.features.contains(r)))
            .map(String::as_str)
            .collect();
        let why = if missing.is_empty() {
            "the nodes that could run it take only tasks of organizations an administrator trusts (they cannot isolate tasks from each other)".to_string()
        } else {
            format!("no node offers {}", missing.join(", "))
        };
        return Err(AdmissionError::NoNodeAdmits { why });
    }
    let margin = view.config.share_margin_bytes;
    let gpu_ok = |g: &crate::types::Gpu| {
        accepts_type(&t.gpu_types, &g.gpu_type) && t.gpu_mem_bytes.is_none_or(|m| m <= g.mem_bytes)
    };
    if t.gpus_per_worker > 0 {
        let mut types: Vec<&str> = view
            .nodes
            .iter()
            .flat_map(|n| n.gpus.iter())
            .map(|g| g.gpu_type.as_str())
            .collect();
        types.sort_unstable();
        types.dedup();
        let acceptable: Vec<&crate::types::Gpu> = view
            .nodes
            .iter()
            .flat_map(|n| n.gpus.iter())
            .filter(|g| accepts_type(&t.gpu_types, &g.gpu_type))
            .collect();
        if acceptable.is_empty() {
            return Err(AdmissionError::UnknownGpuType {
                requested: t.gpu_types.join("|"),
                available: types.join(", "),
            });
        }
        if let Some(m) = t.gpu_mem_bytes {
            let largest = acceptable.iter().map(|g| g.mem_bytes).max().unwrap_or(0);
            if m > largest {
                return Err(AdmissionError::GpuMemoryTooLarge {
                    requested_gib: m as f64 / GIB,
                    largest_gib: largest as f64 / GIB,
                });
            }
        }
        let available = view
            .nodes
            .iter()
            // A cordoned or draining node is capacity closed for now, not gone: what only it
            // could hold waits (and says so) rather than being refused.
            .filter(|n| n.admits(&t.tolerations, &t.requires))
            .flat_map(|n| n.gpus.iter())
            .filter(|g| gpu_ok(g))
            .count() as u32;
        if t.total_gpus() > available {
            return Err(AdmissionError::TooManyGpus {
                requested: t.total_gpus(),
                available,
            });
        }
    }
    // How many workers each empty node could hold, per zone, on GPUs `gpu_ok` accepts.
    let per_node = |n: &Node, gpu_ok: &dyn Fn(&crate::types::Gpu) -> bool| -> u32 {
        if !n.admits(&t.tolerations, &t.requires)
            || n.cpu_millis < t.cpu_millis
            || n.mem_bytes < t.mem_bytes
        {
            return 0;
        }
        let mut k = u32::MAX;
        if t.gpus_per_worker > 0 {
            // A shared task fits several to a card; count cards only, which is conservative.
            let cards = n.gpus.iter().filter(|g| gpu_ok(g)).count() as u32;
            let per_card = match t.gpu_mem_bytes {
                Some(m) if t.gpus_per_worker == 1 => n
                    .gpus
                    .iter()
                    .filter(|g| gpu_ok(g))
                    .map(|g| (g.mem_bytes / (m + margin).max(1)).max(1) as u32)
                    .sum::<u32>(),
                _ => cards / t.gpus_per_worker,
            };
            k = k.min(per_card);
        }
        if let Some(by_cpu) = n.cpu_millis.checked_div(t.cpu_millis) {
            k = k.min(u32::try_from(by_cpu).unwrap_or(u32::MAX));
        }
        if let Some(by_mem) = n.mem_bytes.checked_div(t.mem_bytes) {
            k = k.min(u32::try_from(by_mem).unwrap_or(u32::MAX));
        }
        k.min(t.workers)
    };
    // Nodes whose tasks share their network hold a gang together, per zone; a node that
    // keeps each task's network apart holds one only by itself (its `""` entry is the most
    // any one such node holds).
    let by_zone = |gpu_ok: &dyn Fn(&crate::types::Gpu) -> bool| {
        let mut by_zone: BTreeMap<Option<&str>, u32> = BTreeMap::new();
        for n in view.nodes {
            let k = per_node(n, gpu_ok);
            if n.own_network {
                let best = by_zone.entry(None).or_default();
                *best = (*best).max(k);
            } else {
                let z = by_zone.entry(Some(n.zone.as_str())).or_default();
                *z = z.saturating_add(k);
            }
        }
        by_zone
    };
    let fits = |by_zone: &BTreeMap<Option<&str>, u32>| {
        let shared = by_zone.iter().filter(|(z, _)| z.is_some()).map(|(_, k)| *k);
        let shared = if t.zone_affinity {
            shared.max().unwrap_or(0)
        } else {
            shared.fold(0u32, u32::saturating_add)
        };
        shared.max(by_zone.get(&None).copied().unwrap_or(0))
    };
    let all_types = by_zone(&gpu_ok);
    if all_types.values().all(|&k| k == 0) {
        return Err(AdmissionError::WorkerTooLarge {
            gpus: t.gpus_per_worker,
            cpu_millis: t.cpu_millis,
            mem_gib: t.mem_bytes as f64 / GIB,
        });
    }
    // A gang runs on one GPU type: the best single type is what it can get.
    let mut types: Vec<&str> = if t.workers > 1 && t.gpus_per_worker > 0 {
        view.nodes
            .iter()
            .flat_map(|n| n.gpus.iter())
            .filter(|g| gpu_ok(g))
            .map(|g| g.gpu_type.as_str())
            .collect()
    } else {
        Vec::new()
    };
    types.sort_unstable();
    types.dedup();
    let one_type = types.len() > 1;
    let possible = if one_type {
        types
            .iter()
            .map(|ty| {
                fits(&by_zone(&|g: &crate::types::Gpu| {
                    gpu_ok(g) && g.gpu_type == *ty
                }))
            })
            .max()
            .unwrap_or(0)
    } else {
        fits(&all_types)
    };
    if possible < t.workers {
        return Err(AdmissionError::TooManyWorkers {
            workers: t.workers,
            possible,
            same_zone: t.zone_affinity,
            one_type,
            isolated: view.nodes.iter().any(|n| n.own_network),
        });
    }
    Ok(())
}
