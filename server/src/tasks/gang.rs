//! How a task's workers find one another: their ranks, and the variables of
//! `torch.distributed`'s `env://` and of torchrun that each node and each worker gets.
//!
//! Nodes are numbered in the order of the placement (the node of its first worker is node 0,
//! and holds rank 0), and ranks are consecutive on each node, as torchrun numbers them: a
//! worker's `LOCAL_RANK` is its rank less its node's first rank. The rendezvous and the
//! worker set are per attempt, so a gang whose membership changes is a new attempt.

use std::collections::BTreeMap;

use autodl_common::agent::WorkerSlot;
use autodl_common::tasks::{Launcher, WorkerPlacement};

/// Where a gang on one node meets: its workers share the attempt's network (its own
/// namespace on an isolated node), and the agent leases the port on that node.
pub const LOOPBACK: &str = "127.0.0.1";
/// The ports gangs spanning nodes meet at on their rank 0's node, one per live placement
/// (torchrun's default first). Apart from the ephemeral ports, where a node's own leases for
/// gangs on one node come from.
pub const RENDEZVOUS_PORTS: std::ops::RangeInclusive<u16> = 29500..=30499;

/// The rendezvous ports the live `placements` hold at one host: those whose rank 0 is on a
/// node `at_host` says is there. Nodes sharing an address (several agents on one machine)
/// share its ports, so two gangs never meet at one address and port.
pub fn rendezvous_ports_at<'a>(
    at_host: impl Fn(&str) -> bool,
    placements: impl IntoIterator<Item = &'a [WorkerPlacement]>,
) -> std::collections::BTreeSet<u16> {
    placements
        .into_iter()
        .filter_map(|p| p.first())
        .filter(|first| at_host(&first.node))
        .filter_map(|first| first.port)
        .collect()
}

/// The first rendezvous port not `taken` (by the live placements whose rank 0 is on the same
/// node); `None` when all are.
pub fn free_rendezvous_port(taken: &std::collections::BTreeSet<u16>) -> Option<u16> {
    RENDEZVOUS_PORTS.into_iter().find(|p| !taken.contains(p))
}

/// How long a gang's workers have to meet when its task does not say: long enough for the
/// other nodes to pull a large image, short enough that GPUs held by a gang that cannot meet
/// go back within minutes rather than at torch's own 30-minute limit.
pub const DEFAULT_RENDEZVOUS_TIMEOUT_S: u64 = 600;

/// The seconds `spec`'s workers have to meet at the rendezvous (judged on rank 0's node);
/// `None` for an attempt of one worker (`width`: its workers, an elastic task's vary).
pub fn rendezvous_timeout(spec: &autodl_common::tasks::TaskSpec, width: u32) -> Option<u64> {
    (width > 1).then(|| {
        spec.rendezvous_timeout
            .unwrap_or(DEFAULT_RENDEZVOUS_TIMEOUT_S)
    })
}

/// What one node of an attempt starts: variables for all of its processes, and the worker
/// processes themselves (empty: one process with all of the node's GPUs).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeLaunch {
    pub env: BTreeMap<String, String>,
    pub workers: Vec<WorkerSlot>,
}

/// The node each rank runs on (index: rank): ranks are consecutive per node, nodes in the
/// order they first appear in the placement.
pub fn nodes_by_rank(placement: &[WorkerPlacement]) -> Vec<&str> {
    let mut nodes: Vec<&str> = Vec::new();
    for p in placement {
        if !nodes.contains(&p.node.as_str()) {
            nodes.push(&p.node);
        }
    }
    nodes
        .iter()
        .flat_map(|n| {
            let count = placement.iter().filter(|p| p.node == *n).count();
            std::iter::repeat_n(*n, count)
        })
        .collect()
}

/// The launch of `node` for an attempt placed as `placement` (a worker each). `rank0_address`:
/// where rank 0's node is reached by other nodes (its agent's advertised address), for a gang
/// spanning nodes.
pub fn node_launch(
    launcher: Launcher,
    placement: &[WorkerPlacement],
    node: &str,
    rank0_address: Option<&str>,
) -> NodeLaunch {
    let mut nodes: Vec<&str> = Vec::new();
    for p in placement {
        if !nodes.contains(&p.node.as_str()) {
            nodes.push(&p.node);
        }
    }
    let node_rank = nodes.iter().position(|n| *n == node).unwrap_or(0);
    let first_rank: usize = nodes[..node_rank.min(nodes.len())]
        .iter()
        .map(|n| placement.iter().filter(|p| p.node == *n).count())
        .sum();
    let here: Vec<&WorkerPlacement> = placement.iter().filter(|p| p.node == node).collect();
    let world = placement.len().max(1);
    let (master_addr, master_port) = match nodes.as_slice() {
        [] | [_] => (LOOPBACK.to_owned(), None),
        [first, ..] => (
            rank0_address.unwrap_or(first).to_owned(),
            Some(
                placement
                    .first()
                    .and_then(|p| p.port)
                    .unwrap_or(*RENDEZVOUS_PORTS.start()),
            ),
        ),
    };

    let mut env = BTreeMap::new();
    let mut set = |k: &str, v: String| {
        env.insert(k.to_owned(), v);
    };
    set("AUTODL_NUM_NODES", nodes.len().max(1).to_string());
    set("AUTODL_NODE_RANK", node_rank.to_string());
    set("NODE_RANK", node_rank.to_string());
    set("GROUP_RANK", node_rank.to_string());
    set("MASTER_ADDR", master_addr.clone());
    if let Some(port) = master_port {
        set("MASTER_PORT", port.to_string());
    }
    let mut workers = Vec::new();
    match launcher {
        Launcher::Workers => {
            set("WORLD_SIZE", world.to_string());
            set("LOCAL_WORLD_SIZE", here.len().max(1).to_string());
            if world == 1 {
                // One worker is the node's one process.
                set("RANK", "0".into());
                set("LOCAL_RANK", "0".into());
            } else {
                workers = here
                    .iter()
                    .enumerate()
                    .map(|(local, p)| {
                        let rank = first_rank + local;
                        WorkerSlot {
                            rank: rank as u32,
                            gpu_indices: p.gpu_indices.clone(),
                            env: BTreeMap::from([
                                ("RANK".to_owned(), rank.to_string()),
                                ("LOCAL_RANK".to_owned(), local.to_string()),
                            ]),
                        }
                    })
                    .collect();
            }
        }
        Launcher::Torchrun => {
            set("PET_NNODES", nodes.len().max(1).to_string());
            set("PET_NODE_RANK", node_rank.to_string());
            set("PET_NPROC_PER_NODE", here.len().max(1).to_string());
            set("PET_MASTER_ADDR", master_addr);
            if let Some(port) = master_port {
                set("PET_MASTER_PORT", port.to_string());
            }
        }
        Launcher::None => {
            set("WORLD_SIZE", nodes.len().max(1).to_string());
            set("RANK", node_rank.to_string());
            set("LOCAL_RANK", "0".into());
        }
    }
    NodeLaunch { env, workers }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn placed(nodes: &[(&str, usize)]) -> Vec<WorkerPlacement> {
        let mut out = Vec::new();
        for (node, n) in nodes {
            for i in 0..*n {
                out.push(WorkerPlacement {
                    node: (*node).to_owned(),
                    gpu_indices: vec![i as u32],
                    port: None,
                });
            }
        }
        out
    }

    #[test]
    fn four_workers_on_one_node_are_four_processes_meeting_on_its_loopback() {
        let p = placed(&[("a", 4)]);
        let l = node_launch(Launcher::Workers, &p, "a", None);
        assert_eq!(l.env["WORLD_SIZE"], "4");
        assert_eq!(l.env["LOCAL_WORLD_SIZE"], "4");
        assert_eq!(l.env["MASTER_ADDR"], LOOPBACK);
        assert!(!l.env.contains_key("MASTER_PORT"), "the agent leases it");
        assert!(!l.env.contains_key("RANK"));
        let ranks: Vec<_> = l.workers.iter().map(|w| w.env["RANK"].clone()).collect();
        assert_eq!(ranks, ["0", "1", "2", "3"]);
        assert_eq!(l.workers[2].gpu_indices, [2]);
    }

    #[test]
    fn one_worker_is_one_process_of_rank_zero() {
        let l = node_launch(Launcher::Workers, &placed(&[("a", 1)]), "a", None);
        assert!(l.workers.is_empty());
        assert_eq!(l.env["RANK"], "0");
        assert_eq!(l.env["WORLD_SIZE"], "1");
    }

    #[test]
    fn torchrun_gets_its_options_per_node() {
        let p = placed(&[("a", 2), ("b", 3)]);
        let b = node_launch(Launcher::Torchrun, &p, "b", Some("10.0.0.1"));
        assert!(b.workers.is_empty());
        assert_eq!(b.env["PET_NNODES"], "2");
        assert_eq!(b.env["PET_NODE_RANK"], "1");
        assert_eq!(b.env["PET_NPROC_PER_NODE"], "3");
        assert_eq!(b.env["PET_MASTER_ADDR"], "10.0.0.1");
        assert_eq!(b.env["PET_MASTER_PORT"], "29500");
    }

    #[test]
    fn a_gang_spanning_nodes_meets_at_rank_0_s_address_and_leased_port() {
        let mut p = placed(&[("a", 2), ("b", 2)]);
        p[0].port = Some(29507);
        let b = node_launch(Launcher::Workers, &p, "b", Some("10.0.0.1"));
        assert_eq!(b.env["MASTER_ADDR"], "10.0.0.1");
        assert_eq!(b.env["MASTER_PORT"], "29507");
        let ranks: Vec<u32> = b.workers.iter().map(|w| w.rank).collect();
        assert_eq!(ranks, [2, 3]);
        // Without an advertised address, the node's name (resolvable on some clusters).
        p[0].port = None;
        let a = node_launch(Launcher::Workers, &p, "a", None);
        assert_eq!(
            (a.env["MASTER_ADDR"].as_str(), a.env["MASTER_PORT"].as_str()),
            ("a", "29500")
        );
    }

    #[test]
    fn nodes_at_one_address_share_its_rendezvous_ports() {
        let gang = |first: &str, port: u16| {
            vec![
                WorkerPlacement {
                    node: first.into(),
                    gpu_indices: vec![0],
                    port: Some(port),
                },
                WorkerPlacement {
                    node: "z".into(),
                    gpu_indices: vec![0],
                    port: None,
                },
            ]
        };
        let live = [gang("a", 29500), gang("b", 29501), gang("c", 29502)];
        // "a" and "b" are agents of one machine; "c" is another.
        let same = |n: &str| n == "a" || n == "b";
        let taken = rendezvous_ports_at(same, live.iter().map(Vec::as_slice));
        assert_eq!(taken, [29500, 29501].into());
        assert_eq!(free_rendezvous_port(&taken), Some(29502));
    }

    #[test]
    fn rendezvous_ports_are_taken_in_order_and_run_out() {
        let taken: std::collections::BTreeSet<u16> = [29500, 29501, 29503].into();
        assert_eq!(free_rendezvous_port(&taken), Some(29502));
        let all: std::collections::BTreeSet<u16> = RENDEZVOUS_PORTS.collect();
        assert_eq!(free_rendezvous_port(&all), None);
    }

    #[test]
    fn launcher_none_keeps_a_process_per_node() {
        let p = placed(&[("a", 2), ("b", 2)]);
        let b = node_launch(Launcher::None, &p, "b", None);
        assert!(b.workers.is_empty());
        assert_eq!(b.env["WORLD_SIZE"], "2");
        assert_eq!(b.env["RANK"], "1");
    }

    proptest! {
        /// Every rank of 0..N is one worker's, once; ranks are consecutive on each node from
        /// node 0 on, and each worker keeps the GPUs it was placed on.
        #[test]
        fn ranks_cover_the_gang_once_and_are_consecutive_per_node(
            sizes in proptest::collection::vec(1usize..5, 1..5),
            interleave in any::<bool>(),
        ) {
            let names: Vec<String> = (0..sizes.len()).map(|i| format!("n{i}")).collect();
            let mut placement = Vec::new();
            if interleave {
                // Placements list workers in any order: node order is by first appearance.
                let most = *sizes.iter().max().unwrap();
                for round in 0..most {
                    for (i, n) in sizes.iter().enumerate() {
                        if round < *n {
                            placement.push(WorkerPlacement {
                                node: names[i].clone(),
                                gpu_indices: vec![round as u32],
                                port: None,
                            });
                        }
                    }
                }
            } else {
                let pairs: Vec<(&str, usize)> =
                    names.iter().map(String::as_str).zip(sizes.iter().copied()).collect();
                placement = placed(&pairs);
            }
            let world: usize = sizes.iter().sum();
            let mut seen = vec![false; world];
            let mut next = 0;
            let by_rank = nodes_by_rank(&placement);
            prop_assert_eq!(by_rank.len(), world);
            for (node_rank, name) in names.iter().enumerate() {
                let l = node_launch(Launcher::Workers, &placement, name, None);
                for w in &l.workers {
                    prop_assert_eq!(by_rank[w.rank as usize], name.as_str());
                }
                prop_assert_eq!(&l.env["NODE_RANK"], &node_rank.to_string());
                prop_assert_eq!(&l.env["WORLD_SIZE"], &world.to_string());
                if world == 1 {
                    seen[0] = true;
                    continue;
                }
                prop_assert_eq!(l.workers.len(), sizes[node_rank]);
                for (local, w) in l.workers.iter().enumerate() {
                    prop_assert_eq!(w.rank as usize, next);
                    prop_assert_eq!(&w.env["LOCAL_RANK"], &local.to_string());
                    prop_assert_eq!(&w.gpu_indices, &vec![local as u32]);
                    prop_assert!(!seen[next]);
                    seen[next] = true;
                    next += 1;
                }
            }
            prop_assert!(seen.iter().all(|s| *s));
        }
    }
}
