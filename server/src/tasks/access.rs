//! Which nodes a task may use. Two rules, both expressed to the scheduler as node taints and
//! features so that placement, preemption and migration all honour them:
//! - a node whose agent cannot isolate tasks from each other (isolation "none") is
//!   trusted-only: it takes tasks of organizations an administrator trusts, unless an
//!   administrator opened it to all (the demo on a machine where it is not root);
//! - a task whose `data_path` is a host folder needs a node that offers a dataset root
//!   containing it.

use std::collections::HashSet;
use std::path::Path;

use autodl_common::tasks::TaskSpec;
use autodl_scheduler::Node;

use crate::store::NodeRecord;

/// The taint of nodes that cannot isolate tasks.
pub const TRUSTED_ONLY: &str = "trusted-only";

/// How a node keeps tasks apart, as its agent reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    Container,
    Sandbox,
    Uid,
    /// Tasks run as the agent's own user.
    None,
    /// Registered by hand by an administrator; no agent has reported yet.
    Declared,
}

impl Isolation {
    /// Anything unknown counts as no isolation: a node must say what it does to be trusted.
    pub fn parse(s: &str) -> Isolation {
        match s {
            "container" => Isolation::Container,
            "sandbox" => Isolation::Sandbox,
            "uid" => Isolation::Uid,
            "declared" => Isolation::Declared,
            _ => Isolation::None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Container => "container",
            Isolation::Sandbox => "sandbox",
            Isolation::Uid => "uid",
            Isolation::None => "none",
            Isolation::Declared => "declared",
        }
    }
}

/// Tasks of untrusted organizations may not run on this node.
pub fn is_trusted_only(n: &NodeRecord) -> bool {
    Isolation::parse(&n.isolation) == Isolation::None && !n.open_to_all
}

/// Each task on this node has a network of its own: every runtime that isolates tasks gives
/// them one (the agent reports no isolation where it cannot), so only the tasks of a node that
/// does not isolate them share their host's network, where other nodes reach them.
pub fn tasks_have_own_network(n: &NodeRecord) -> bool {
    Isolation::parse(&n.isolation) != Isolation::None
}

pub fn data_roots(n: &NodeRecord) -> Vec<String> {
    serde_json::from_str(&n.data_roots).unwrap_or_default()
}

fn data_feature(root: &str) -> String {
    format!("data-root:{root}")
}

pub fn node_taints(n: &NodeRecord) -> Vec<String> {
    if is_trusted_only(n) {
        vec![TRUSTED_ONLY.to_string()]
    } else {
        Vec::new()
    }
}

pub fn node_features(n: &NodeRecord) -> Vec<String> {
    data_roots(n).iter().map(|r| data_feature(r)).collect()
}

/// A `data_path` that names a host folder (not platform storage).
pub fn host_data_path(spec: &TaskSpec) -> Option<&str> {
    spec.data_path
        .as_deref()
        .filter(|p| !p.starts_with("s3://"))
}

/// An absolute, normalised path: no `.`, `..` or empty segments, so that prefix checks
/// against dataset roots mean what they say (the agent resolves links again on the host).
pub fn is_clean_absolute(p: &str) -> bool {
    p == "/"
        || p.strip_prefix('/').is_some_and(|rest| {
            rest.split('/')
                .all(|seg| !seg.is_empty() && seg != "." && seg != "..")
        })
}

/// The dataset root that holds `path`, among those the nodes offer: the one most nodes
/// have (the deepest on a tie), so the task can run on as many nodes as possible.
pub fn root_for(path: &str, nodes: &[Node]) -> Option<String> {
    let mut best: Option<(usize, usize, String)> = None;
    let mut seen = HashSet::new();
    for feature in nodes.iter().flat_map(|n| n.features.iter()) {
        let Some(root) = feature.strip_prefix("data-root:") else {
            continue;
        };
        if !seen.insert(root) || !Path::new(path).starts_with(root) {
            continue;
        }
        let f = data_feature(root);
        let count = nodes.iter().filter(|n| n.features.contains(&f)).count();
        let key = (count, root.len(), root.to_string());
        if best.as_ref().is_none_or(|b| (key.0, key.1) > (b.0, b.1)) {
            best = Some(key);
        }
    }
    best.map(|b| b.2)
}

/// What a task tolerates and requires, given its organization's trust and the nodes.
pub fn task_access(trusted: bool, spec: &TaskSpec, nodes: &[Node]) -> (Vec<String>, Vec<String>) {
    let tolerations = if trusted {
        vec![TRUSTED_ONLY.to_string()]
    } else {
        Vec::new()
    };
    let requires = match host_data_path(spec) {
        // No node offers a root for it (any more): a requirement nothing meets keeps the task
        // pending with that reason instead of sending it where the path does not exist.
        Some(p) => vec![data_feature(
            &root_for(p, nodes).unwrap_or_else(|| p.to_string()),
        )],
        None => Vec::new(),
    };
    (tolerations, requires)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, roots: &[&str]) -> Node {
        Node {
            id: id.into(),
            zone: String::new(),
            labels: Default::default(),
            cpu_millis: 1,
            mem_bytes: 1,
            gpus: vec![],
            schedulable: true,
            taints: vec![],
            features: roots.iter().map(|r| data_feature(r)).collect(),
            own_network: false,
        }
    }

    #[test]
    fn clean_paths() {
        for ok in ["/datasets", "/datasets/imagenet/train", "/"] {
            assert!(is_clean_absolute(ok), "{ok}");
        }
        for bad in [
            "datasets",
            "/datasets/../etc",
            "/datasets/./x",
            "/datasets//x",
            "/datasets/",
            "",
        ] {
            assert!(!is_clean_absolute(bad), "{bad}");
        }
    }

    #[test]
    fn roots_are_matched_by_whole_segments() {
        let nodes = [
            node("a", &["/datasets"]),
            node("b", &["/datasets", "/datasets/imagenet"]),
            node("c", &["/scratch"]),
        ];
        assert_eq!(
            root_for("/datasets/imagenet/train", &nodes).as_deref(),
            Some("/datasets"),
            "the root most nodes have"
        );
        assert_eq!(root_for("/datasets-secret/x", &nodes), None);
        assert_eq!(root_for("/var/run/docker.sock", &nodes), None);
        assert_eq!(root_for("/scratch", &nodes).as_deref(), Some("/scratch"));
    }

    #[test]
    fn isolation_names() {
        for i in [
            Isolation::Container,
            Isolation::Sandbox,
            Isolation::Uid,
            Isolation::None,
            Isolation::Declared,
        ] {
            assert_eq!(Isolation::parse(i.as_str()), i);
        }
        assert_eq!(Isolation::parse("weird"), Isolation::None);
    }
}
