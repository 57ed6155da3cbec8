//! A cycle's placements: what the policy decided, turned into the rows the store writes (each
//! gang spanning nodes given a rendezvous port free at its first host), and written in a few
//! transactions.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use autodl_common::tasks::WorkerPlacement as ApiPlacement;
use autodl_scheduler::WorkerPlacement;

use super::Runner;
use crate::scheduling::snapshot::ActiveTask;
use crate::store::{HostDetail, NodeRecord, Placing, Term};
use crate::tasks::gang;

/// Placements written per transaction: a commit each would make a cycle that starts thousands
/// of tasks take seconds, and one transaction for all would hold the database's write lock as
/// long.
const PLACE_BATCH: usize = 256;

/// The placements of one cycle, in the policy's order.
pub(super) struct Placings {
    rows: Vec<Placing>,
    placements: Vec<(String, Vec<WorkerPlacement>)>,
    /// The address each node advertises: agents of one machine share its ports.
    addresses: HashMap<String, String>,
    /// Rendezvous ports held at each host by live gangs spanning nodes, and those this cycle
    /// hands out (read once per host).
    rendezvous: HashMap<String, BTreeSet<u16>>,
}

impl Placings {
    pub(super) fn new(nodes: Option<&[NodeRecord]>) -> Placings {
        let addresses = nodes
            .unwrap_or_default()
            .iter()
            .filter_map(|n| HostDetail::of(n).address.map(|a| (n.id.clone(), a)))
            .collect();
        Placings {
            rows: Vec::new(),
            placements: Vec::new(),
            addresses,
            rendezvous: HashMap::new(),
        }
    }

    fn host_of(&self, node: &str) -> String {
        self.addresses
            .get(node)
            .cloned()
            .unwrap_or_else(|| node.to_owned())
    }

    /// Adds the policy's placement of `task`; `tasks` are the active tasks, whose gangs hold
    /// rendezvous ports.
    pub(super) fn add(
        &mut self,
        task: String,
        placements: Vec<WorkerPlacement>,
        tasks: &[Arc<ActiveTask>],
    ) -> anyhow::Result<()> {
        let mut api: Vec<ApiPlacement> = placements
            .iter()
            .map(|p| ApiPlacement {
                node: p.node.clone(),
                gpu_indices: p.gpu_indices.clone(),
                port: None,
            })
            .collect();
        let gpus: usize = placements.iter().map(|p| p.gpu_indices.len()).sum();
        let mut nodes: Vec<String> = Vec::new();
        for p in &placements {
            if !nodes.contains(&p.node) {
                nodes.push(p.node.clone());
            }
        }
        if let (true, Some(first)) = (nodes.len() > 1, api.first_mut()) {
            let host = self.host_of(&first.node);
            if !self.rendezvous.contains_key(&host) {
                let held = gang::rendezvous_ports_at(
                    |n| self.host_of(n) == host,
                    tasks.iter().filter_map(|t| t.placement().as_deref()),
                );
                self.rendezvous.insert(host.clone(), held);
            }
            let taken = self.rendezvous.get_mut(&host).expect("inserted above");
            first.port = gang::free_rendezvous_port(taken);
            match first.port {
                Some(port) => {
                    taken.insert(port);
                }
                None => tracing::warn!(
                    task = %task,
                    node = %first.node,
                    "every rendezvous port of the node is held: the gang meets at the first"
                ),
            }
        }
        self.rows.push(Placing {
            task: task.clone(),
            placement: serde_json::to_string(&api)?,
            nodes,
            gpus: gpus as i64,
        });
        self.placements.push((task, placements));
        Ok(())
    }
}

impl Runner {
    /// Writes the cycle's placements, in a few transactions rather than one each, and wakes
    /// the agents of the placed tasks. Returns the tasks placed (one the store refused was no
    /// longer pending).
    pub(super) async fn place(
        &mut self,
        term: Term,
        placing: Placings,
        now_ms: i64,
    ) -> anyhow::Result<Vec<(String, Vec<WorkerPlacement>)>> {
        let mut started = Vec::new();
        let mut to_start = placing.placements.into_iter();
        for chunk in placing.rows.chunks(PLACE_BATCH) {
            let done = self.store.place_tasks(term, chunk, now_ms).await?;
            for ok in done {
                let (task, placements) = to_start.next().expect("one per placement");
                if ok {
                    for p in &placements {
                        self.agents.notify(&p.node);
                    }
                    started.push((task, placements));
                }
            }
        }
        Ok(started)
    }
}
