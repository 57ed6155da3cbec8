//! A task's results as one tree. Every node of a gang uploads what its own workers left (rank
//! 0's at the top, each other rank in a folder `rank-<r>`, a node's single process on a node
//! other than the first in `node-<k>`), one artifact per node; users see them together.

use std::collections::HashSet;

use crate::storage::tar::Entry;
use crate::store::ArtifactRecord;
use crate::tasks::checkpoints::files_of;

/// Splits a task's complete results artifacts (newest first) into those that make its results
/// now, the newest attempt's (the newest of each node), and those to retire.
pub fn current(all: Vec<ArtifactRecord>) -> (Vec<ArtifactRecord>, Vec<ArtifactRecord>) {
    let newest = all.iter().map(|a| a.attempt).max();
    let mut nodes = HashSet::new();
    all.into_iter()
        .partition(|a| Some(a.attempt) == newest && nodes.insert(a.node.clone()))
}

/// The files of the current results as one tree, the node named `first` (rank 0's) first: a
/// path that two nodes both hold is its.
pub fn tree(current: &[ArtifactRecord], first: Option<&str>) -> Vec<Entry> {
    let mut ordered: Vec<&ArtifactRecord> = current.iter().collect();
    // Stable: the rest keep their order (newest first).
    ordered.sort_by_key(|a| a.node.as_deref() != first);
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for a in ordered {
        for f in files_of(a) {
            if seen.insert(f.path.clone()) {
                out.push(Entry {
                    bucket: a.bucket.clone(),
                    key: format!("{}{}", a.prefix, f.path),
                    path: f.path,
                    size: f.size,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{ArtifactKind, ArtifactState};

    fn results(id: &str, attempt: i64, node: &str, files: &[(&str, u64)]) -> ArtifactRecord {
        let manifest: Vec<_> = files
            .iter()
            .map(|(p, s)| serde_json::json!({"path": p, "size": s}))
            .collect();
        ArtifactRecord {
            id: id.into(),
            task_id: "t".into(),
            tenant_id: "org".into(),
            attempt,
            kind: ArtifactKind::Results,
            state: ArtifactState::Complete,
            bucket: "b".into(),
            prefix: format!("org/results/{id}/"),
            manifest: Some(serde_json::to_string(&manifest).unwrap()),
            files: files.len() as i64,
            size_bytes: 0,
            step: None,
            epoch: None,
            created_at: 0,
            completed_at: Some(0),
            node: Some(node.into()),
        }
    }

    fn ids(list: &[ArtifactRecord]) -> Vec<&str> {
        list.iter().map(|a| a.id.as_str()).collect()
    }

    #[test]
    fn the_newest_attempt_s_upload_of_each_node_is_current() {
        let all = vec![
            results("b2", 2, "b", &[]),
            results("a2-again", 2, "a", &[]),
            results("a2", 2, "a", &[]),
            results("a1", 1, "a", &[]),
            results("c1", 1, "c", &[]),
        ];
        let (keep, retire) = current(all);
        assert_eq!(ids(&keep), ["b2", "a2-again"]);
        assert_eq!(ids(&retire), ["a2", "a1", "c1"]);
        let (keep, retire) = current(vec![]);
        assert!(keep.is_empty() && retire.is_empty());
    }

    #[test]
    fn the_first_node_s_files_come_first_and_win() {
        let keep = vec![
            results("b", 1, "node-b", &[("rank-2/out", 2), ("out", 9)]),
            results("a", 1, "node-a", &[("out", 1), ("rank-1/out", 1)]),
        ];
        let tree = tree(&keep, Some("node-a"));
        let got: Vec<(&str, &str, u64)> = tree
            .iter()
            .map(|e| (e.path.as_str(), e.key.as_str(), e.size))
            .collect();
        assert_eq!(
            got,
            [
                ("out", "org/results/a/out", 1),
                ("rank-1/out", "org/results/a/rank-1/out", 1),
                ("rank-2/out", "org/results/b/rank-2/out", 2),
            ]
        );
    }
}
