//! What request handlers share with the runner: wake-ups (also from the other servers of the
//! database), whether this server leads, and short-lived caches of the nodes, for admission
//! checks and for the agents' requests (each names its node by its credential; on a large
//! cluster that is thousands of reads a second of rows that rarely change). Why tasks wait is
//! kept in the store, so any server can answer.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use autodl_common::tasks::Waiting;
use autodl_scheduler::{Node, PolicyConfig};
use tokio::sync::Notify;

use super::snapshot::to_node;
use crate::store::{NodeRecord, Nodes, StoreResult};

/// Shared between handlers and the runner: wake-ups, the last explanations, cached nodes.
pub struct SchedulerHandle {
    pub(super) notify: Notify,
    /// Explanations as this leader last wrote them, so a cycle writes only what changed.
    pub(super) written: std::sync::Mutex<HashMap<String, (Waiting, i64)>>,
    /// The term this server leads in; 0 while it does not lead.
    leading: std::sync::atomic::AtomicI64,
    /// Other servers of the database, told of wake-ups and node changes.
    peers: crate::replicas::Peers,
    /// The nodes as last read for admission checks, and when (by the clock).
    nodes: RwLock<(Option<i64>, Arc<Vec<Node>>)>,
    /// Bumped by every invalidation, so a read that raced with a node change does not put a
    /// stale list back into the cache.
    nodes_generation: std::sync::atomic::AtomicU64,
    /// Node credential digest -> its node, for [`CREDENTIAL_CACHE_TTL`] or until nodes change.
    node_callers: moka::sync::Cache<String, Option<NodeRecord>>,
    pub config: PolicyConfig,
}

/// Nodes are re-read at most this often for admission checks.
const NODE_CACHE_TTL: Duration = Duration::from_secs(2);

/// How long an agent's node is believed without a change to nodes. Every change to a node
/// clears it here and on the other servers; this bounds only a change nobody was told of.
const CREDENTIAL_CACHE_TTL: Duration = Duration::from_secs(30);

impl SchedulerHandle {
    pub fn new(config: PolicyConfig) -> Arc<Self> {
        Arc::new(SchedulerHandle {
            notify: Notify::new(),
            written: std::sync::Mutex::new(HashMap::new()),
            leading: std::sync::atomic::AtomicI64::new(0),
            peers: crate::replicas::Peers::default(),
            nodes: RwLock::new((None, Arc::new(Vec::new()))),
            config,
            nodes_generation: std::sync::atomic::AtomicU64::new(0),
            node_callers: moka::sync::Cache::builder()
                .max_capacity(1_000_000)
                .time_to_live(CREDENTIAL_CACHE_TTL)
                .build(),
        })
    }

    /// Asks for a cycle soon, wherever the leader runs; many wake-ups before it runs make
    /// one cycle.
    pub fn wake(&self) {
        self.wake_here();
        self.peers.tell(crate::replicas::Signal::Wake);
    }

    pub(crate) fn wake_here(&self) {
        self.notify.notify_one();
    }

    pub fn is_leader(&self) -> bool {
        self.leader_term().is_some()
    }

    /// The term this server believes it leads in. A server woken from a freeze believes so
    /// until its runner next asks; the database's term says whether it still does.
    pub fn leader_term(&self) -> Option<i64> {
        Some(self.leading.load(std::sync::atomic::Ordering::Relaxed)).filter(|t| *t != 0)
    }

    pub(super) fn set_leader(&self, term: Option<crate::store::Term>) {
        self.leading.store(
            term.map_or(0, |t| t.0),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    pub(crate) fn peers(&self) -> &crate::replicas::Peers {
        &self.peers
    }

    /// Nodes changed (joined, drained, lost): every server re-reads them.
    pub fn invalidate_nodes(&self) {
        self.invalidate_nodes_here();
        self.peers.tell(crate::replicas::Signal::Nodes);
    }

    pub(crate) fn invalidate_nodes_here(&self) {
        self.nodes_generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if let Ok(mut n) = self.nodes.write() {
            n.0 = None;
        }
        self.node_callers.invalidate_all();
    }

    /// Changes with every change to nodes (here, or told by another server).
    pub fn nodes_generation(&self) -> u64 {
        self.nodes_generation
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The node whose credential has this digest.
    pub async fn node_by_credential(
        &self,
        store: &dyn Nodes,
        digest: &str,
    ) -> StoreResult<Option<NodeRecord>> {
        if let Some(n) = self.node_callers.get(digest) {
            return Ok(n);
        }
        let generation = self
            .nodes_generation
            .load(std::sync::atomic::Ordering::SeqCst);
        let node = store.node_by_credential(digest).await?;
        if self
            .nodes_generation
            .load(std::sync::atomic::Ordering::SeqCst)
            == generation
        {
            self.node_callers.insert(digest.to_owned(), node.clone());
        }
        Ok(node)
    }

    pub async fn nodes(&self, store: &dyn Nodes, now_ms: i64) -> anyhow::Result<Arc<Vec<Node>>> {
        if let Ok(n) = self.nodes.read() {
            if n.0.is_some() && !crate::clock::due(n.0, now_ms, NODE_CACHE_TTL) {
                return Ok(n.1.clone());
            }
        }
        let generation = self
            .nodes_generation
            .load(std::sync::atomic::Ordering::SeqCst);
        let nodes = Arc::new(
            store
                .list_nodes()
                .await?
                .iter()
                .map(to_node)
                .collect::<anyhow::Result<Vec<_>>>()?,
        );
        if let Ok(mut n) = self.nodes.write() {
            if self
                .nodes_generation
                .load(std::sync::atomic::Ordering::SeqCst)
                == generation
            {
                *n = (Some(now_ms), nodes.clone());
            }
        }
        Ok(nodes)
    }
}
