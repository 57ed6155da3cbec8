//! Rules of the policy, each checked in virtual time on a tiny cluster.

mod common;

use autodl_scheduler::*;
use common::*;

fn only(weights: Weights) -> PolicyConfig {
    PolicyConfig {
        weights,
        ..PolicyConfig::default()
    }
}

fn declared_only() -> Weights {
    Weights {
        fair_share: 0.0,
        utilization: 0.0,
        deadline: 0.0,
        declared: 1.0,
        age: 0.0,
        gpu_fit: 0.0,
        service: 0.0,
    }
}

#[test]
fn places_what_fits_and_explains_the_rest() {
    let state = ClusterState {
        nodes: vec![node("n1", "", 2, "A100-80G", 80)],
        pending: vec![task("a", "u", 1, 0), task("b", "u", 2, 1)],
        ..Default::default()
    };
    let d = Scheduler::default().schedule(&state, 10);
    assert!(placed(&d, "a").is_some());
    let p = d.pending.iter().find(|p| p.task == "b").expect("b pending");
    assert!(p.priority.total > 0.0);
    match &p.reason {
        PendingReason::Reserved { waiting_for, .. } | PendingReason::NoFit { waiting_for } => {
            assert!(waiting_for.contains("2 whole GPU"), "{waiting_for}")
        }
        r => panic!("unexpected reason {r:?}"),
    }
}

#[test]
fn gang_is_all_or_nothing() {
    let mut state = ClusterState {
        nodes: vec![node("n1", "", 4, "A100", 80), node("n2", "", 4, "A100", 80)],
        ..Default::default()
    };
    let mut blocker = task("blocker", "other", 2, 0);
    blocker.preemptible = false;
    state.running.push(running(blocker, "n2", &[0, 1], 0));
    let mut gang = task("gang", "u", 4, 5);
    gang.workers = 2;
    state.pending.push(gang);
    let cfg = PolicyConfig {
        migration: false,
        ..PolicyConfig::default()
    };
    let d = Scheduler::new(cfg.clone()).schedule(&state, 100);
    assert!(
        placed(&d, "gang").is_none(),
        "half a gang must not start: {d:?}"
    );
    assert!(d.decisions.is_empty());
    // Once the blocker leaves, both workers start together on distinct nodes.
    state.running.clear();
    let d = Scheduler::new(cfg).schedule(&state, 200);
    let p = placed(&d, "gang").expect("gang placed");
    assert_eq!(p.len(), 2);
    assert_ne!(p[0].node, p[1].node);
    assert!(p.iter().all(|w| w.gpu_indices.len() == 4));
}

/// A task no one may preempt on GPU 0 of nodes `i1` and `i2`.
fn occupy_one_gpu_of_each(state: &mut ClusterState) {
    for (i, n) in ["i1", "i2"].into_iter().enumerate() {
        let mut t = task(&format!("busy{i}"), "other", 1, 0);
        t.preemptible = false;
        state.running.push(running(t, n, &[0], 0));
    }
}

/// Each task of an isolated node has a network of its own that other nodes' tasks do not
/// reach: a gang goes on one such node, or on nodes that share their network, never across.
#[test]
fn a_gang_does_not_span_isolated_nodes() {
    let isolated = |id: &str| {
        let mut n = node(id, "", 2, "A100", 80);
        n.own_network = true;
        n
    };
    let gang = |id: &str, workers: u32| {
        let mut t = task(id, "u", 1, 0);
        t.workers = workers;
        t
    };
    // Two isolated nodes of two GPUs each, one GPU taken on each: a gang of two waits,
    // saying why, though two GPUs are free; on an empty node it runs there.
    let mut state = ClusterState {
        nodes: vec![isolated("i1"), isolated("i2")],
        pending: vec![gang("two", 2)],
        ..Default::default()
    };
    occupy_one_gpu_of_each(&mut state);
    let d = Scheduler::default().schedule(&state, 10);
    assert!(placed(&d, "two").is_none(), "{d:?}");
    let p = d.pending.iter().find(|p| p.task == "two").expect("waits");
    match &p.reason {
        PendingReason::NoFit { waiting_for } | PendingReason::Reserved { waiting_for, .. } => {
            assert!(
                waiting_for.contains("does not span isolated nodes"),
                "{waiting_for}"
            )
        }
        r => panic!("unexpected reason {r:?}"),
    }
    state.running.pop();
    let d = Scheduler::default().schedule(&state, 20);
    let two = placed(&d, "two").expect("fits the empty node");
    assert!(two.iter().all(|p| p.node == "i2"), "{two:?}");
    // Admission refuses at once a gang no isolated node can hold by itself.
    let nodes = [isolated("i1"), isolated("i2")];
    let quotas = Quotas::default();
    let cfg = PolicyConfig::default();
    let view = ClusterView {
        nodes: &nodes,
        quotas: &quotas,
        config: &cfg,
    };
    let e = admission_check(&view, &gang("four", 4)).unwrap_err();
    assert!(
        matches!(
            e,
            AdmissionError::TooManyWorkers {
                possible: 2,
                isolated: true,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("does not span isolated nodes"),
        "{e}"
    );
    assert!(admission_check(&view, &gang("two", 2)).is_ok());
    // One GPU free on each isolated node and two nodes sharing their network: the gang of
    // two goes to the shared nodes even where it must span them.
    let mut state = ClusterState {
        nodes: vec![
            isolated("i1"),
            isolated("i2"),
            node("s1", "", 1, "A100", 80),
            node("s2", "", 1, "A100", 80),
        ],
        pending: vec![gang("two", 2)],
        ..Default::default()
    };
    occupy_one_gpu_of_each(&mut state);
    let d = Scheduler::default().schedule(&state, 10);
    let two = placed(&d, "two").unwrap_or_else(|| panic!("placed on the shared nodes: {d:?}"));
    let mut nodes: Vec<&str> = two.iter().map(|p| p.node.as_str()).collect();
    nodes.sort_unstable();
    assert_eq!(nodes, ["s1", "s2"]);
}

#[test]
fn a_gang_runs_on_one_gpu_type() {
    // Two A100 nodes (one half taken) and two A40 nodes: a 2 x 4-GPU gang that accepts any
    // type could start at once on an A100 and an A40 node; it takes the two A40 nodes.
    let mut state = ClusterState {
        nodes: vec![
            node("a100-1", "", 4, "A100", 80),
            node("a100-2", "", 4, "A100", 80),
            node("a40-1", "", 4, "A40", 48),
            node("a40-2", "", 4, "A40", 48),
        ],
        ..Default::default()
    };
    let mut blocker = task("blocker", "other", 2, 0);
    blocker.preemptible = false;
    state.running.push(running(blocker, "a100-2", &[0, 1], 0));
    let mut gang = task("gang", "u", 4, 5);
    gang.workers = 2;
    state.pending.push(gang.clone());
    let d = Scheduler::default().schedule(&state, 100);
    let p = placed(&d, "gang").expect("gang placed");
    let mut nodes: Vec<&str> = p.iter().map(|w| w.node.as_str()).collect();
    nodes.sort_unstable();
    assert_eq!(nodes, ["a40-1", "a40-2"]);
    // With one A40 node gone, no single type has room: the gang waits rather than mixing.
    state.nodes.retain(|n| n.id != "a40-2");
    let d = Scheduler::default().schedule(&state, 100);
    assert!(placed(&d, "gang").is_none(), "{d:?}");
    // A gang of shared cards is of one type too.
    let mut shared = task("shared", "u", 1, 5);
    shared.workers = 3;
    shared.gpu_mem_bytes = Some(10 << 30);
    state.pending = vec![shared];
    state.running.clear();
    state.nodes = vec![
        node("a100", "", 2, "A100", 80),
        node("a40", "", 1, "A40", 48),
    ];
    let d = Scheduler::default().schedule(&state, 100);
    let p = placed(&d, "shared").expect("shared gang placed");
    assert!(p.iter().all(|w| w.node == "a100"), "{p:?}");
}

#[test]
fn preemption_for_a_gang_frees_one_gpu_type() {
    // Every GPU is busy with preemptible low-priority work; the gang's victims are all on the
    // nodes of one type.
    let mut state = ClusterState {
        nodes: vec![
            node("a100", "", 4, "A100", 80),
            node("a40", "", 4, "A40", 48),
        ],
        ..Default::default()
    };
    state.nodes.push(node("a100-b", "", 4, "A100", 80));
    for (id, n) in [
        ("low-a100", "a100"),
        ("low-a40", "a40"),
        ("low-a100-b", "a100-b"),
    ] {
        let mut low = running(
            TaskRequest {
                priority: 0.0,
                ..task(id, "other", 4, 0)
            },
            n,
            &[0, 1, 2, 3],
            0,
        );
        low.last_checkpoint_at = Some(9_990);
        state.running.push(low);
    }
    state.pending.push(TaskRequest {
        workers: 2,
        priority: 1.0,
        ..task("gang", "u", 4, 5)
    });
    let d = Scheduler::new(only(declared_only())).schedule(&state, 10_000);
    let mut victims = preempted(&d);
    victims.sort();
    assert_eq!(victims, ["low-a100", "low-a100-b"], "{d:?}");
}

#[test]
fn zone_affinity_keeps_a_gang_in_one_zone() {
    let state = ClusterState {
        nodes: vec![
            node("a1", "za", 4, "H100", 80),
            node("b1", "zb", 4, "H100", 80),
            node("b2", "zb", 4, "H100", 80),
        ],
        pending: vec![TaskRequest {
            workers: 2,
            zone_affinity: true,
            ..task("g", "u", 4, 0)
        }],
        ..Default::default()
    };
    let d = Scheduler::default().schedule(&state, 1);
    let p = placed(&d, "g").expect("placed");
    assert!(p.iter().all(|w| w.node.starts_with('b')), "{p:?}");
}

#[test]
fn shared_gpu_never_exceeds_its_memory() {
    let mut state = ClusterState {
        nodes: vec![node("n1", "", 1, "A100-16G", 16)],
        ..Default::default()
    };
    for i in 0..3 {
        state.pending.push(TaskRequest {
            gpu_mem_bytes: Some(6 * GIB),
            ..task(&format!("s{i}"), "u", 1, i)
        });
    }
    // 6 GiB + 1 GiB margin: two fit on a 16 GiB card, the third waits.
    let d = Scheduler::default().schedule(&state, 10);
    let n = d
        .decisions
        .iter()
        .filter(|x| matches!(x, Decision::Place { .. }))
        .count();
    assert_eq!(n, 2);
    apply(&mut state, &d, 10);
    let d = Scheduler::default().schedule(&state, 20);
    assert!(d
        .decisions
        .iter()
        .all(|x| !matches!(x, Decision::Place { .. })));
    // A whole-card task cannot join a shared card either.
    state.pending = vec![task("whole", "u", 1, 30)];
    let d = Scheduler::new(PolicyConfig {
        preemption: false,
        ..PolicyConfig::default()
    })
    .schedule(&state, 40);
    assert!(placed(&d, "whole").is_none());
}

#[test]
fn urgent_deadline_overtakes_in_the_queue() {
    let mut state = ClusterState {
        nodes: vec![node("n1", "", 1, "T4", 16)],
        ..Default::default()
    };
    state.pending.push(task("early", "u1", 1, 0));
    state.pending.push(TaskRequest {
        deadline: Some(1_000 + 3_700),
        estimated_runtime: Some(3_600),
        ..task("urgent", "u2", 1, 1_000)
    });
    let d = Scheduler::default().schedule(&state, 1_000);
    assert!(placed(&d, "urgent").is_some(), "{d:?}");
    assert!(placed(&d, "early").is_none());
}

#[test]
fn preemption_respects_minimum_run_time() {
    let cfg = PolicyConfig {
        min_runtime_s: 600,
        preempt_margin: 0.1,
        ..only(declared_only())
    };
    let mut state = ClusterState {
        nodes: vec![node("n1", "", 1, "A100", 80)],
        ..Default::default()
    };
    let low = TaskRequest {
        priority: 0.0,
        ..task("low", "u1", 1, 0)
    };
    state.running.push(running(low, "n1", &[0], 0));
    state.pending.push(TaskRequest {
        priority: 1.0,
        ..task("high", "u2", 1, 100)
    });
    // Too early: the victim has not had its minimum run time.
    let d = Scheduler::new(cfg.clone()).schedule(&state, 300);
    assert!(preempted(&d).is_empty(), "{d:?}");
    // After it, and right after a checkpoint, it is preempted with a grace period.
    state.running[0].last_checkpoint_at = Some(650);
    let d = Scheduler::new(cfg.clone()).schedule(&state, 700);
    assert_eq!(preempted(&d), vec!["low".to_string()]);
    assert!(d
        .decisions
        .iter()
        .any(|x| matches!(x, Decision::Preempt { grace_s, .. } if *grace_s == cfg.grace_s)));
    assert!(matches!(
        reason(&d, "high"),
        Some(PendingReason::WaitingForPreemption { .. })
    ));
    // A gap below the margin does not preempt.
    state.pending[0].priority = 0.05;
    let d = Scheduler::new(cfg).schedule(&state, 700);
    assert!(preempted(&d).is_empty());
}

#[test]
fn preemption_prefers_the_victim_that_loses_least_work() {
    let cfg = PolicyConfig {
        victim_max_unsaved_s: 100_000,
        ..only(declared_only())
    };
    let mut state = ClusterState {
        nodes: vec![node("n1", "", 1, "A100", 80), node("n2", "", 1, "A100", 80)],
        ..Default::default()
    };
    let mut a = running(
        TaskRequest {
            priority: 0.0,
            ..task("fresh-ckpt", "u1", 1, 0)
        },
        "n1",
        &[0],
        0,
    );
    a.last_checkpoint_at = Some(9_900);
    let mut b = running(
        TaskRequest {
            priority: 0.0,
            ..task("stale-ckpt", "u1", 1, 0)
        },
        "n2",
        &[0],
        0,
    );
    b.last_checkpoint_at = Some(3_600);
    state.running = vec![b, a];
    state.pending.push(TaskRequest {
        priority: 1.0,
        ..task("high", "u2", 1, 9_000)
    });
    let d = Scheduler::new(cfg).schedule(&state, 10_000);
    assert_eq!(preempted(&d), vec!["fresh-ckpt".to_string()]);
}

#[test]
fn non_preemptible_tasks_are_never_victims() {
    let cfg = only(declared_only());
    let mut state = ClusterState {
        nodes: vec![node("n1", "", 1, "A100", 80)],
        ..Default::default()
    };
    let low = TaskRequest {
        priority: 0.0,
        preemptible: false,
        ..task("low", "u1", 1, 0)
    };
    state.running.push(running(low, "n1", &[0], 0));
    state.pending.push(TaskRequest {
        priority: 1.0,
        ..task("high", "u2", 1, 0)
    });
    assert!(preempted(&Scheduler::new(cfg).schedule(&state, 5_000)).is_empty());
}

#[test]
fn quota_holds_a_task_with_the_cap_named() {
    let mut state = ClusterState {
        nodes: vec![node("n1", "", 4, "A100", 80)],
        ..Default::default()
    };
    state.quotas.users.insert(
        "alice".into(),
        Quota {
            max_gpus: Some(2),
            ..Default::default()
        },
    );
    state
        .running
        .push(running(task("r", "alice", 2, 0), "n1", &[0, 1], 0));
    state.pending.push(task("p", "alice", 1, 10));
    state.pending.push(task("q", "bob", 1, 10));
    let d = Scheduler::default().schedule(&state, 20);
    assert!(placed(&d, "q").is_some());
    match reason(&d, "p") {
        Some(PendingReason::Quota {
            scope: QuotaScope::User,
            name,
            cap:
                QuotaCap::Gpus {
                    limit: 2,
                    in_use: 2,
                    requested: 1,
                },
        }) => {
            assert_eq!(name, "alice")
        }
        r => panic!("unexpected {r:?}"),
    }
}

#[test]
fn monthly_gpu_hours_and_allowed_types_hold_tasks() {
    let mut state = ClusterState {
        nodes: vec![node("n1", "", 4, "A100", 80)],
        ..Default::default()
    };
    state.quotas.tenants.insert(
        "lab".into(),
        Quota {
            max_gpu_hours_per_month: Some(10.0),
            ..Default::default()
        },
    );
    state
        .usage
        .charge("u", "lab", 11.0 * 3600.0, Some(1.0), 0, 86_400.0, 86_400);
    state.pending.push(task("p", "u", 1, 0));
    let d = Scheduler::default().schedule(&state, 1);
    assert!(matches!(
        reason(&d, "p"),
        Some(PendingReason::Quota {
            scope: QuotaScope::Tenant,
            cap: QuotaCap::GpuHoursPerMonth { .. },
            ..
        })
    ));

    let mut state = ClusterState {
        nodes: vec![node("n1", "", 4, "A100", 80)],
        ..Default::default()
    };
    state.quotas.users.insert(
        "u".into(),
        Quota {
            allowed_gpu_types: vec!["T4".into()],
            ..Default::default()
        },
    );
    state.pending.push(task("p", "u", 1, 0));
    let d = Scheduler::default().schedule(&state, 1);
    assert!(matches!(
        reason(&d, "p"),
        Some(PendingReason::Quota {
            cap: QuotaCap::GpuTypes { .. },
            ..
        })
    ));
}

#[test]
fn gpu_type_families_match() {
    let state = ClusterState {
        nodes: vec![
            node("t4", "", 1, "T4", 16),
            node("a100", "", 1, "A100-80G", 80),
        ],
        pending: vec![TaskRequest {
            gpu_types: vec!["A100".into()],
            ..task("x", "u", 1, 0)
        }],
        ..Default::default()
    };
    let d = Scheduler::default().schedule(&state, 1);
    assert_eq!(placed(&d, "x").expect("placed")[0].node, "a100");
}

#[test]
fn backfill_does_not_take_the_reserved_node() {
    // Each node has one GPU busy; the top task needs two GPUs on one node and is blocked.
    let cfg = PolicyConfig {
        preemption: false,
        migration: false,
        ..only(declared_only())
    };
    let mut state = ClusterState {
        nodes: vec![node("a", "", 2, "A100", 80), node("b", "", 2, "A100", 80)],
        ..Default::default()
    };
    state
        .running
        .push(running(task("ra", "x", 1, 0), "a", &[0], 0));
    state
        .running
        .push(running(task("rb", "x", 1, 0), "b", &[0], 0));
    state.pending.push(TaskRequest {
        priority: 1.0,
        ..task("big", "u", 2, 0)
    });
    state.pending.push(TaskRequest {
        priority: 0.1,
        ..task("small1", "u", 1, 0)
    });
    state.pending.push(TaskRequest {
        priority: 0.0,
        ..task("small2", "u", 1, 0)
    });
    let d = Scheduler::new(cfg).schedule(&state, 10);
    let reserved = match reason(&d, "big") {
        Some(PendingReason::Reserved { nodes, .. }) => nodes.clone(),
        r => panic!("unexpected {r:?}"),
    };
    assert_eq!(reserved.len(), 1);
    let p = placed(&d, "small1").expect("backfilled");
    assert_ne!(p[0].node, reserved[0]);
    // The second small task would fit only on the reserved node: it waits behind `big`.
    assert!(
        matches!(reason(&d, "small2"), Some(PendingReason::BehindHigherPriority { blocked_by, .. }) if blocked_by == "big")
    );
}

#[test]
fn strict_fifo_starts_nothing_behind_a_blocked_task() {
    let mut state = ClusterState {
        nodes: vec![node("a", "", 2, "A100", 80)],
        ..Default::default()
    };
    state
        .running
        .push(running(task("r", "x", 1, 0), "a", &[0], 0));
    state.pending.push(task("first", "u", 2, 1));
    state.pending.push(task("second", "u", 1, 2));
    let d = Scheduler::new(PolicyConfig::fifo()).schedule(&state, 10);
    assert!(d.decisions.is_empty());
    assert!(matches!(
        reason(&d, "second"),
        Some(PendingReason::BehindHigherPriority { position: 1, .. })
    ));
    let d = Scheduler::new(PolicyConfig::fifo_backfill()).schedule(&state, 10);
    assert!(placed(&d, "second").is_some());
}

#[test]
fn tainted_nodes_take_only_tolerating_tasks_even_by_preemption() {
    let cfg = PolicyConfig {
        min_runtime_s: 0,
        victim_max_unsaved_s: 1_000_000,
        ..only(declared_only())
    };
    let mut trusted_only = node("shared-host", "", 1, "A100", 80);
    trusted_only.taints = vec!["trusted-only".into()];
    let mut state = ClusterState {
        nodes: vec![trusted_only, node("isolated", "", 1, "A100", 80)],
        ..Default::default()
    };
    let ours = |id: &str, prio: f64| TaskRequest {
        priority: prio,
        tolerations: vec!["trusted-only".into()],
        ..task(id, "ours", 1, 0)
    };
    // An untrusted task goes to the isolated node, a trusted one may use either.
    state.pending.push(task("untrusted", "them", 1, 0));
    state.pending.push(ours("trusted", 0.5));
    let d = Scheduler::new(cfg.clone()).schedule(&state, 10);
    assert_eq!(placed(&d, "untrusted").unwrap()[0].node, "isolated");
    assert_eq!(placed(&d, "trusted").unwrap()[0].node, "shared-host");
    // A high-priority untrusted task never preempts its way onto the trusted-only node: only
    // the task on the isolated node is a candidate victim.
    state.pending.clear();
    state
        .running
        .push(running(ours("low-trusted", 0.0), "shared-host", &[0], 0));
    state
        .running
        .push(running(ours("low-isolated", 0.0), "isolated", &[0], 0));
    state.pending.push(TaskRequest {
        priority: 1.0,
        ..task("urgent", "them", 1, 5)
    });
    let d = Scheduler::new(cfg.clone()).schedule(&state, 100);
    assert_eq!(preempted(&d), vec!["low-isolated".to_string()], "{d:?}");
    // Required features: a task that needs a dataset root waits for a node that has it.
    let mut state = ClusterState {
        nodes: vec![node("plain", "", 1, "A100", 80)],
        ..Default::default()
    };
    state.pending.push(TaskRequest {
        requires: vec!["data:/datasets".into()],
        ..task("needs-data", "u", 1, 0)
    });
    let d = Scheduler::new(cfg.clone()).schedule(&state, 10);
    assert!(placed(&d, "needs-data").is_none());
    state.nodes[0].features = vec!["data:/datasets".into()];
    let d = Scheduler::new(cfg).schedule(&state, 10);
    assert!(placed(&d, "needs-data").is_some());
}

#[test]
fn defragments_by_migrating_shared_tasks() {
    let cfg = PolicyConfig {
        preemption: false,
        ..only(declared_only())
    };
    let mut state = ClusterState {
        nodes: vec![node("a", "", 1, "A100", 16), node("b", "", 1, "A100", 16)],
        ..Default::default()
    };
    let s = |id: &str| TaskRequest {
        priority: 0.0,
        gpu_mem_bytes: Some(4 * GIB),
        ..task(id, "x", 1, 0)
    };
    state.running.push(running(s("sa"), "a", &[0], 0));
    state.running.push(running(s("sb"), "b", &[0], 0));
    state.pending.push(TaskRequest {
        priority: 1.0,
        ..task("whole", "u", 1, 5)
    });
    let d = Scheduler::new(cfg).schedule(&state, 10);
    let moves: Vec<_> = d
        .decisions
        .iter()
        .filter_map(|x| match x {
            Decision::Migrate {
                task,
                from,
                to,
                for_task,
            } => Some((task, from, to, for_task)),
            _ => None,
        })
        .collect();
    assert_eq!(moves.len(), 1, "{d:?}");
    assert_ne!(moves[0].1[0].node, moves[0].2[0].node);
    assert_eq!(moves[0].3, "whole");
    assert!(matches!(
        reason(&d, "whole"),
        Some(PendingReason::WaitingForMigration { .. })
    ));
}

/// Migration and preemption attempts are bounded per cycle, highest priority first: with
/// room for two moves but one attempt allowed, only the first blocked task gets one, and the
/// next cycle gives the second its turn.
#[test]
fn migration_and_preemption_attempts_are_bounded_per_cycle() {
    let cfg = PolicyConfig {
        preemption: false,
        max_migration_attempts_per_cycle: 1,
        ..only(declared_only())
    };
    let mut state = ClusterState {
        nodes: (0..4)
            .map(|i| node(&format!("n{i}"), "", 1, "A100", 16))
            .collect(),
        ..Default::default()
    };
    let s = |id: &str| TaskRequest {
        priority: 0.0,
        gpu_mem_bytes: Some(4 * GIB),
        ..task(id, "x", 1, 0)
    };
    for i in 0..4 {
        state
            .running
            .push(running(s(&format!("s{i}")), &format!("n{i}"), &[0], 0));
    }
    for (id, p) in [("first", 0.9), ("second", 0.8)] {
        state.pending.push(TaskRequest {
            priority: p,
            ..task(id, "u", 1, 5)
        });
    }
    let migrating_for = |d: &Decisions| -> Vec<String> {
        d.decisions
            .iter()
            .filter_map(|x| match x {
                Decision::Migrate { for_task, .. } => Some(for_task.clone()),
                _ => None,
            })
            .collect()
    };
    let d = Scheduler::new(cfg.clone()).schedule(&state, 10);
    assert_eq!(migrating_for(&d), vec!["first".to_string()], "{d:?}");
    let d = Scheduler::new(PolicyConfig {
        max_migration_attempts_per_cycle: 16,
        ..cfg
    })
    .schedule(&state, 10);
    let mut both = migrating_for(&d);
    both.dedup();
    assert_eq!(
        both,
        vec!["first".to_string(), "second".to_string()],
        "{d:?}"
    );

    // Preemption: two urgent tasks, two victims, one attempt allowed.
    let cfg = PolicyConfig {
        migration: false,
        min_runtime_s: 0,
        max_preemption_attempts_per_cycle: 1,
        ..only(declared_only())
    };
    let mut state = ClusterState {
        nodes: vec![node("a", "", 1, "A100", 80), node("b", "", 1, "A100", 80)],
        ..Default::default()
    };
    for n in ["a", "b"] {
        let low = TaskRequest {
            priority: 0.0,
            ..task(&format!("low-{n}"), "x", 1, 0)
        };
        state.running.push(running(low, n, &[0], 0));
    }
    for (id, p) in [("urgent-1", 1.0), ("urgent-2", 0.9)] {
        state.pending.push(TaskRequest {
            priority: p,
            ..task(id, "u", 1, 5)
        });
    }
    let d = Scheduler::new(cfg.clone()).schedule(&state, 100);
    assert_eq!(preempted(&d).len(), 1, "{d:?}");
    let d = Scheduler::new(PolicyConfig {
        max_preemption_attempts_per_cycle: 64,
        ..cfg
    })
    .schedule(&state, 100);
    assert_eq!(preempted(&d).len(), 2, "{d:?}");
}

#[test]
fn idle_gpu_user_waits_behind_busy_user() {
    let cfg = only(Weights {
        utilization: 1.0,
        age: 0.0,
        ..declared_only()
    });
    let mut state = ClusterState {
        nodes: vec![node("a", "", 1, "A100", 80)],
        ..Default::default()
    };
    state.usage.charge(
        "idle",
        "lab",
        50_000.0,
        Some(0.02),
        0,
        cfg.usage_half_life_s,
        86_400,
    );
    state.usage.charge(
        "busy",
        "lab",
        50_000.0,
        Some(0.98),
        0,
        cfg.usage_half_life_s,
        86_400,
    );
    state.pending.push(task("i", "idle", 1, 0));
    state.pending.push(task("b", "busy", 1, 5));
    let d = Scheduler::new(cfg).schedule(&state, 10);
    assert!(placed(&d, "b").is_some());
    let i = d.pending.iter().find(|p| p.task == "i").expect("pending");
    assert!(i.priority.utilization < 0.2);
}

#[test]
fn fair_share_prefers_the_light_user_and_decays() {
    let cfg = only(Weights {
        fair_share: 1.0,
        ..declared_only()
    });
    let hl = cfg.usage_half_life_s;
    let mut state = ClusterState {
        nodes: vec![node("a", "", 1, "A100", 80)],
        ..Default::default()
    };
    state
        .usage
        .charge("heavy", "lab", 1e6, Some(1.0), 0, hl, 86_400);
    state
        .usage
        .charge("light", "lab", 1e5, Some(1.0), 0, hl, 86_400);
    state.pending.push(task("h", "heavy", 1, 0));
    state.pending.push(task("l", "light", 1, 5));
    let d = Scheduler::new(cfg.clone()).schedule(&state, 10);
    assert!(placed(&d, "l").is_some());
    assert!((state.usage.user_usage("heavy", hl as u64, hl) - 5e5).abs() < 1e-6);
}

#[test]
fn tenants_split_shares_before_users() {
    // Tenant big has many users; tenant small has one. With equal tenant shares and equal
    // per-user usage, the small tenant's user is ahead (Fair Tree).
    let cfg = only(Weights {
        fair_share: 1.0,
        ..declared_only()
    });
    let hl = cfg.usage_half_life_s;
    let mut state = ClusterState {
        nodes: vec![node("a", "", 1, "A100", 80)],
        ..Default::default()
    };
    for u in ["b1", "b2", "b3"] {
        state.usage.charge(u, "big", 1e5, Some(1.0), 0, hl, 86_400);
        state.pending.push(TaskRequest {
            tenant: "big".into(),
            ..task(&format!("t-{u}"), u, 1, 0)
        });
    }
    state
        .usage
        .charge("s1", "small", 1e5, Some(1.0), 0, hl, 86_400);
    state.pending.push(TaskRequest {
        tenant: "small".into(),
        ..task("t-s1", "s1", 1, 5)
    });
    let d = Scheduler::new(cfg).schedule(&state, 10);
    assert!(placed(&d, "t-s1").is_some(), "{d:?}");
}

#[test]
fn admission_rejects_what_can_never_fit() {
    let nodes = vec![
        node("a", "z1", 8, "A100-40G", 40),
        node("b", "z2", 8, "A100-40G", 40),
    ];
    let quotas = Quotas::default();
    let cfg = PolicyConfig::default();
    let view = ClusterView {
        nodes: &nodes,
        quotas: &quotas,
        config: &cfg,
    };
    assert!(admission_check(&view, &task("ok", "u", 8, 0)).is_ok());
    let e = admission_check(
        &view,
        &TaskRequest {
            requires: vec!["data:/datasets".into()],
            ..task("d", "u", 1, 0)
        },
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("no node offers data:/datasets"),
        "{e}"
    );
    let mut tainted = nodes.clone();
    for n in &mut tainted {
        n.taints = vec!["trusted-only".into()];
    }
    let tv = ClusterView {
        nodes: &tainted,
        quotas: &quotas,
        config: &cfg,
    };
    let e = admission_check(&tv, &task("t", "u", 1, 0)).unwrap_err();
    assert!(matches!(e, AdmissionError::NoNodeAdmits { .. }), "{e}");
    let trusted = TaskRequest {
        tolerations: vec!["trusted-only".into()],
        ..task("t", "u", 1, 0)
    };
    assert!(admission_check(&tv, &trusted).is_ok());
    // Cordoned nodes are closed for now, not gone: what only they hold is admitted to wait.
    let mut cordoned = nodes.clone();
    for n in &mut cordoned {
        n.schedulable = false;
    }
    let cv = ClusterView {
        nodes: &cordoned,
        quotas: &quotas,
        config: &cfg,
    };
    assert!(admission_check(&cv, &task("c", "u", 8, 0)).is_ok());
    let e = admission_check(
        &view,
        &TaskRequest {
            gpu_mem_bytes: Some(60 * GIB),
            ..task("m", "u", 1, 0)
        },
    )
    .unwrap_err();
    assert!(matches!(e, AdmissionError::GpuMemoryTooLarge { .. }), "{e}");
    assert!(e.to_string().contains("60.0 GiB"));
    let e = admission_check(
        &view,
        &TaskRequest {
            workers: 3,
            ..task("g", "u", 8, 0)
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            AdmissionError::TooManyGpus {
                requested: 24,
                available: 16
            }
        ),
        "{e}"
    );
    let e = admission_check(&view, &task("w", "u", 9, 0)).unwrap_err();
    assert!(matches!(e, AdmissionError::WorkerTooLarge { .. }), "{e}");
    let e = admission_check(
        &view,
        &TaskRequest {
            gpu_types: vec!["H100".into()],
            ..task("t", "u", 1, 0)
        },
    )
    .unwrap_err();
    assert!(matches!(e, AdmissionError::UnknownGpuType { .. }), "{e}");
    let e = admission_check(
        &view,
        &TaskRequest {
            workers: 2,
            zone_affinity: true,
            ..task("z", "u", 8, 0)
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            AdmissionError::TooManyWorkers {
                same_zone: true,
                ..
            }
        ),
        "{e}"
    );
    assert!(admission_check(
        &view,
        &TaskRequest {
            workers: 2,
            ..task("z", "u", 8, 0)
        }
    )
    .is_ok());
    // A gang that only fits by mixing GPU types is refused, and says why.
    let mixed = [node("a", "", 4, "A100", 80), node("b", "", 4, "A40", 48)];
    let mixed_view = ClusterView {
        nodes: &mixed,
        ..view
    };
    let e = admission_check(
        &mixed_view,
        &TaskRequest {
            workers: 2,
            ..task("m", "u", 4, 0)
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            AdmissionError::TooManyWorkers {
                one_type: true,
                possible: 1,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("one type"), "{e}");
    assert!(admission_check(&mixed_view, &task("one", "u", 4, 0)).is_ok());
    let mut quotas = Quotas::default();
    quotas.users.insert(
        "u".into(),
        Quota {
            max_gpus: Some(4),
            ..Default::default()
        },
    );
    let view = ClusterView {
        nodes: &nodes,
        quotas: &quotas,
        config: &cfg,
    };
    assert!(matches!(
        admission_check(&view, &task("q", "u", 8, 0)),
        Err(AdmissionError::OverGpuQuota { .. })
    ));
}

#[test]
fn decisions_serialize_for_the_api() {
    let state = ClusterState {
        nodes: vec![node("n1", "", 1, "A100", 80)],
        pending: vec![task("a", "u", 1, 0), task("b", "u", 1, 0)],
        ..Default::default()
    };
    let d = Scheduler::default().schedule(&state, 1);
    let json = serde_json::to_value(&d).expect("json");
    assert_eq!(json["decisions"][0]["kind"], "place");
    assert!(json["pending"][0]["priority"]["total"].is_number());
    let back: Decisions = serde_json::from_value(json).expect("roundtrip");
    assert_eq!(back, d);
}

#[test]
fn scheduling_is_deterministic() {
    let mut state = ClusterState {
        nodes: (0..4)
            .map(|i| node(&format!("n{i}"), "", 4, "A100", 40))
            .collect(),
        ..Default::default()
    };
    for i in 0..20 {
        let mut t = task(
            &format!("t{i}"),
            &format!("u{}", i % 3),
            1 + i % 3,
            u64::from(i),
        );
        if i % 4 == 0 {
            t.gpu_mem_bytes = Some(10 * GIB);
        }
        state.pending.push(t);
    }
    let a = Scheduler::default().schedule(&state, 100);
    let b = Scheduler::default().schedule(&state, 100);
    assert_eq!(a, b);
}

/// An elastic gang of one-GPU workers (`min`..=`max`).
fn elastic(id: &str, user: &str, min: u32, max: u32, at: Time) -> TaskRequest {
    TaskRequest {
        workers: max,
        min_workers: Some(min),
        ..task(id, user, 1, at)
    }
}

#[test]
fn an_elastic_task_starts_as_wide_as_fits_and_no_narrower_than_its_minimum() {
    let mut state = ClusterState {
        nodes: vec![node("n1", "", 8, "A100", 80)],
        ..Default::default()
    };
    let mut blocker = task("blocker", "other", 3, 0);
    blocker.preemptible = false;
    state.running.push(running(blocker, "n1", &[0, 1, 2], 0));
    state.pending.push(elastic("e", "u", 2, 8, 5));
    let d = Scheduler::default().schedule(&state, 100);
    let p = placed(&d, "e").expect("started with what is free");
    assert_eq!(p.len(), 5, "{d:?}");
    assert!(p.iter().all(|w| w.gpu_indices.len() == 1));
    // Rigid, the same gang waits for all eight.
    state.pending[0].min_workers = None;
    let d = Scheduler::default().schedule(&state, 100);
    assert!(placed(&d, "e").is_none(), "{d:?}");
    // Below its minimum it waits too.
    state.pending[0].min_workers = Some(6);
    let d = Scheduler::default().schedule(&state, 100);
    assert!(placed(&d, "e").is_none(), "{d:?}");
}

#[test]
fn an_elastic_task_makes_room_for_its_narrowest_start_only() {
    let cfg = PolicyConfig {
        min_runtime_s: 0,
        preempt_margin: 0.1,
        ..only(declared_only())
    };
    let mut state = ClusterState {
        nodes: vec![node("n1", "", 4, "A100", 80)],
        ..Default::default()
    };
    for (i, g) in [0u32, 1, 2, 3].into_iter().enumerate() {
        let low = TaskRequest {
            priority: 0.0,
            ..task(&format!("low{i}"), "u1", 1, 0)
        };
        state.running.push(running(low, "n1", &[g], 0));
    }
    state.pending.push(TaskRequest {
        priority: 1.0,
        ..elastic("e", "u2", 2, 4, 10)
    });
    let d = Scheduler::new(cfg).schedule(&state, 100);
    assert_eq!(
        preempted(&d).len(),
        2,
        "two GPUs are enough to start: {d:?}"
    );
}

#[test]
fn an_elastic_task_starts_within_its_caps() {
    let mut state = ClusterState {
        nodes: vec![node("n1", "", 8, "A100", 80)],
        ..Default::default()
    };
    state.quotas.users.insert(
        "u".into(),
        Quota {
            max_gpus: Some(3),
            ..Default::default()
        },
    );
    state.pending.push(elastic("e", "u", 2, 8, 5));
    let d = Scheduler::default().schedule(&state, 100);
    assert_eq!(placed(&d, "e").map(|p| p.len()), Some(3), "{d:?}");
    state.quotas.users.get_mut("u").unwrap().max_gpus = Some(1);
    let d = Scheduler::default().schedule(&state, 100);
    assert!(placed(&d, "e").is_none());
    assert!(matches!(reason(&d, "e"), Some(PendingReason::Quota { .. })));
}

#[test]
fn a_narrow_run_is_charged_for_the_gpus_it_holds() {
    let mut state = ClusterState {
        nodes: vec![node("n1", "", 8, "A100", 80)],
        ..Default::default()
    };
    state
        .running
        .push(running(elastic("e", "u", 2, 8, 0), "n1", &[0, 1], 0));
    assert_eq!(state.running[0].held_gpus(), 2);
    state.quotas.users.insert(
        "u".into(),
        Quota {
            max_gpus: Some(4),
            ..Default::default()
        },
    );
    // Two of the user's four GPUs are held: a two-GPU task fits the cap, a three-GPU one not.
    state.pending.push(task("two", "u", 2, 5));
    let d = Scheduler::default().schedule(&state, 100);
    assert!(placed(&d, "two").is_some(), "{d:?}");
}

/// A running elastic gang of one-GPU workers on `node`, one worker per GPU in `gpus`.
fn running_elastic(t: TaskRequest, node: &str, gpus: &[u32], started_at: Time) -> RunningTask {
    RunningTask {
        placements: gpus
            .iter()
            .map(|&g| WorkerPlacement {
                node: node.into(),
                gpu_indices: vec![g],
            })
            .collect(),
        ..running(t, node, &[], started_at)
    }
}

fn resized(d: &Decisions) -> Vec<(String, ResizeReason)> {
    d.decisions
        .iter()
        .filter_map(|x| match x {
            Decision::Resize { task, reason, .. } => Some((task.clone(), reason.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn an_elastic_task_grows_into_idle_gpus_when_it_is_worth_a_restart() {
    let now = 4_000;
    let mut state = ClusterState {
        nodes: vec![node("n1", "", 8, "A100", 80)],
        ..Default::default()
    };
    let mut r = running_elastic(elastic("e", "u", 2, 8, 0), "n1", &[0, 1], 0);
    r.last_checkpoint_at = Some(now - 10);
    state.running.push(r);
    let d = Scheduler::default().schedule(&state, now);
    match resized(&d).as_slice() {
        [(
            task,
            ResizeReason::Grow {
                from_workers: 2,
                to_workers: 8,
                seconds_saved,
                cost_s,
            },
        )] if task == "e" => {
            // 4,000 s more at 2 of 8 workers take 1,000 s at 8: 3,000 s saved against 70.
            assert_eq!(*seconds_saved, 3_000.0);
            assert_eq!(*cost_s, 70.0);
        }
        other => panic!("expected e to grow to 8: {other:?}"),
    }
    // A waiting task comes first: it takes what it needs, and e grows into the rest.
    state.pending.push(task("w", "v", 4, now - 5));
    let d = Scheduler::default().schedule(&state, now);
    assert_eq!(placed(&d, "w").map(Vec::len), Some(1), "{d:?}");
    assert!(matches!(
        resized(&d).as_slice(),
        [(_, ResizeReason::Grow { to_workers: 4, .. })]
    ));
    state.pending.clear();
    // Not within the interval after a (re)start.
    state.running[0].started_at = now - 100;
    assert!(resized(&Scheduler::default().schedule(&state, now)).is_empty());
    // Not when the work since its checkpoint makes the restart cost more than it saves.
    state.running[0].started_at = 0;
    state.running[0].last_checkpoint_at = None;
    assert!(resized(&Scheduler::default().schedule(&state, now)).is_empty());
    // Not a rigid task, and not when growth is off.
    state.running[0].last_checkpoint_at = Some(now - 10);
    let off = PolicyConfig {
        elastic_growth: false,
        ..PolicyConfig::default()
    };
    assert!(resized(&Scheduler::new(off).schedule(&state, now)).is_empty());
    state.running[0].request.min_workers = None;
    assert!(resized(&Scheduler::default().schedule(&state, now)).is_empty());
}

#[test]
fn an_elastic_task_grows_within_its_caps() {
    let now = 4_000;
    let mut state = ClusterState {
        nodes: vec![node("n1", "", 8, "A100", 80)],
        ..Default::default()
    };
    let mut r = running_elastic(elastic("e", "u", 2, 8, 0), "n1", &[0, 1], 0);
    r.last_checkpoint_at = Some(now - 10);
    state.running.push(r);
    state.quotas.users.insert(
        "u".into(),
        Quota {
            max_gpus: Some(5),
            ..Default::default()
        },
    );
    let d = Scheduler::default().schedule(&state, now);
    assert!(
        matches!(
            resized(&d).as_slice(),
            [(_, ResizeReason::Grow { to_workers: 5, .. })]
        ),
        "{d:?}"
    );
}

#[test]
fn an_elastic_victim_shrinks_instead_of_losing_its_place() {
    let cfg = PolicyConfig {
        min_runtime_s: 0,
        preempt_margin: 0.1,
        ..only(declared_only())
    };
    let mut state = ClusterState {
        nodes: vec![node("n1", "", 4, "A100", 80)],
        ..Default::default()
    };
    let low = TaskRequest {
        priority: 0.0,
        ..elastic("e", "u1", 2, 4, 0)
    };
    state
        .running
        .push(running_elastic(low, "n1", &[0, 1, 2, 3], 0));
    state.pending.push(TaskRequest {
        priority: 1.0,
        ..task("high", "u2", 2, 10)
    });
    let d = Scheduler::new(cfg.clone()).schedule(&state, 100);
    assert!(preempted(&d).is_empty(), "{d:?}");
    match resized(&d).as_slice() {
        [(
            task,
            ResizeReason::Shrink {
                from_workers: 4,
                min_workers: 2,
                preempt,
            },
        )] if task == "e" && preempt.for_task == "high" => {}
        other => panic!("expected e to shrink for high: {other:?}"),
    }
    // At its minimum it is preempted as a rigid task is.
    state.running[0].placements.truncate(2);
    let mut blocker = task("blocker", "u3", 2, 0);
    blocker.preemptible = false;
    state.running.push(running(blocker, "n1", &[2, 3], 0));
    let d = Scheduler::new(cfg).schedule(&state, 100);
    assert_eq!(preempted(&d), vec!["e".to_string()], "{d:?}");
}

#[test]
fn a_gang_of_several_workers_on_one_node_preempts_one_task_for_all_of_them() {
    let cfg = PolicyConfig {
        min_runtime_s: 0,
        ..only(declared_only())
    };
    let mut state = ClusterState {
        nodes: vec![node("n1", "", 2, "A100", 80)],
        ..Default::default()
    };
    let low = TaskRequest {
        priority: 0.0,
        ..task("low", "u1", 2, 0)
    };
    state.running.push(running(low, "n1", &[0, 1], 0));
    state.pending.push(TaskRequest {
        priority: 1.0,
        workers: 2,
        ..task("gang", "u2", 1, 10)
    });
    let d = Scheduler::new(cfg).schedule(&state, 100);
    assert_eq!(preempted(&d), vec!["low".to_string()], "{d:?}");
}
