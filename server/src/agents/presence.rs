//! When each node was last heard from, written in batches. Every request of a node (its polls,
//! its reports) proves it alive; writing that per request would be thousands of small write
//! transactions a second on a large cluster, all competing with submissions and the scheduler
//! for the database. Requests only note the time here; a flush every [`FLUSH_EVERY`] (and the
//! leader, before it judges nodes lost) writes the nodes that need it in one statement. A crash
//! loses at most that second, against a lost-node timeout of tens of seconds. A node marked
//! lost is still written at once by its poll, so that it comes back without waiting.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::domain::NodeStatus;
use crate::store::{NodeRecord, Nodes, StoreResult};

pub const FLUSH_EVERY: Duration = Duration::from_secs(1);

#[derive(Default)]
pub struct Presence {
    /// Heard from and not yet written: node -> when.
    due: Mutex<HashMap<String, i64>>,
    /// What this server last wrote for each node (its record may be older, kept in a cache).
    written: Mutex<HashMap<String, i64>>,
}

impl Presence {
    /// Notes a request of `node` at `now_ms`, to be written if the stored time needs it.
    pub fn heard(&self, node: &NodeRecord, now_ms: i64, lost_timeout_secs: u64) {
        debug_assert!(
            node.status != NodeStatus::Lost,
            "lost nodes are written at once"
        );
        let written = self
            .written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&node.id)
            .copied();
        let last = match (node.last_seen, written) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        if super::last_seen_is_stale(node.status, last, now_ms, lost_timeout_secs) {
            self.due
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(node.id.clone(), now_ms);
        }
    }

    /// Writes what is due.
    pub async fn flush(&self, store: &dyn Nodes) -> StoreResult<()> {
        let due: Vec<(String, i64)> = self
            .due
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .collect();
        if due.is_empty() {
            return Ok(());
        }
        if let Err(e) = store.touch_nodes(&due).await {
            // Put back what was not written; a later poll's time wins over it.
            let mut pending = self.due.lock().unwrap_or_else(|p| p.into_inner());
            for (node, at) in due {
                pending.entry(node).or_insert(at);
            }
            return Err(e);
        }
        let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        for (node, at) in due {
            written.insert(node, at);
        }
        Ok(())
    }
}
