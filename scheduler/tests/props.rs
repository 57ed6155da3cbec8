//! Property: whatever the cluster and the queue, no placement over-commits a GPU (memory or
//! exclusivity), a node's CPU or its memory, gangs are complete, and no task lands on a node
//! whose taints it does not tolerate or that lacks a feature it requires, and no gang spans
//! nodes one of which keeps each task's network apart.

mod common;

use autodl_scheduler::*;
use common::*;
use proptest::prelude::*;
use std::collections::HashMap;

const TYPES: [&str; 3] = ["A100-40G", "A100-80G", "T4"];

fn arb_node(i: usize) -> impl Strategy<Value = Node> {
    (
        1u32..=8,
        0usize..3,
        8_000u64..64_000,
        16u64..256,
        0usize..2,
        0usize..8,
    )
        .prop_map(move |(g, ty, cpu, mem, zone, class)| {
            let mem_gib = match TYPES[ty] {
                "A100-40G" => 40,
                "A100-80G" => 80,
                _ => 16,
            };
            let mut n = node(&format!("n{i}"), ["z1", "z2"][zone], g, TYPES[ty], mem_gib);
            n.cpu_millis = cpu;
            n.mem_bytes = mem * GIB;
            if class & 1 != 0 {
                n.taints = vec!["trusted-only".into()];
            }
            if class & 2 != 0 {
                n.features = vec!["data:/ds".into()];
            }
            n.own_network = class & 4 != 0;
            n
        })
}

fn arb_task(i: usize) -> impl Strategy<Value = TaskRequest> {
    (
        0u32..=4,
        1u32..=3,
        prop::option::of(1u64..48),
        0u64..16_000,
        0u64..64,
        0.0f64..=1.0,
        prop::option::of(0usize..3),
        any::<bool>(),
        0u64..1000,
        0usize..4,
        0u32..3,
    )
        .prop_map(
            move |(g, w, shared, cpu, mem, prio, ty, zone, at, class, min)| {
                let mut t = task(&format!("t{i}"), &format!("u{}", i % 4), g, at);
                t.workers = w;
                // Some gangs are elastic down to `min` workers.
                t.min_workers = (min > 0 && min < w).then_some(min);
                t.gpu_mem_bytes = if g > 0 { shared.map(|m| m * GIB) } else { None };
                t.cpu_millis = cpu;
                t.mem_bytes = mem * GIB;
                t.priority = prio;
                t.gpu_types = ty.map(|k| vec![TYPES[k].to_string()]).unwrap_or_default();
                if ty == Some(0) {
                    t.gpu_types = vec!["A100".into()];
                }
                t.zone_affinity = zone;
                if class & 1 != 0 {
                    t.tolerations = vec!["trusted-only".into()];
                }
                if class & 2 != 0 {
                    t.requires = vec!["data:/ds".into()];
                }
                t
            },
        )
}

/// Tasks from a few classes (1 or 2 GPUs, whole or shared, any type) that differ in CPU,
/// memory, GPU memory and priority, as real users' tasks do: many are blocked in one cycle, and
/// many are at least as hard as another blocked one.
fn arb_crowded_task() -> impl Strategy<Value = TaskRequest> {
    (
        1u32..=2,
        prop::option::of(1u64..40),
        0u64..32_000,
        0u64..128,
        0.0f64..=1.0,
    )
        .prop_map(|(g, shared, cpu, mem, prio)| {
            let mut t = task("x", "u", g, 0);
            t.gpu_mem_bytes = shared.map(|m| m * GIB);
            t.cpu_millis = cpu;
            t.mem_bytes = mem * GIB;
            t.priority = prio;
            t
        })
}

fn arb_state() -> impl Strategy<Value = ClusterState> {
    let nodes = (1usize..6).prop_flat_map(|n| (0..n).map(arb_node).collect::<Vec<_>>());
    let tasks = (0usize..25).prop_flat_map(|n| (0..n).map(arb_task).collect::<Vec<_>>());
    (nodes, tasks).prop_map(|(nodes, pending)| ClusterState {
        nodes,
        pending,
        ..Default::default()
    })
}

/// Checks every running task against node capacity, as an independent re-count.
fn check_no_overcommit(state: &ClusterState, margin: u64) -> Result<(), TestCaseError> {
    let nodes: HashMap<&str, &Node> = state.nodes.iter().map(|n| (n.id.as_str(), n)).collect();
    let mut cpu: HashMap<&str, u64> = HashMap::new();
    let mut mem: HashMap<&str, u64> = HashMap::new();
    let mut whole: HashMap<(&str, u32), u32> = HashMap::new();
    let mut shared: HashMap<(&str, u32), u64> = HashMap::new();
    for r in &state.running {
        let t = &r.request;
        // An elastic gang runs at any width between its minimum and its request.
        let width = r.placements.len() as u32;
        prop_assert!(
            width >= t.narrowest() && width <= t.workers,
            "gang incomplete: {:?}",
            r
        );
        for p in &r.placements {
            let n = nodes.get(p.node.as_str()).expect("known node");
            *cpu.entry(&p.node).or_default() += t.cpu_millis;
            *mem.entry(&p.node).or_default() += t.mem_bytes;
            prop_assert_eq!(p.gpu_indices.len() as u32, t.gpus_per_worker);
            let mut seen = p.gpu_indices.clone();
            seen.sort_unstable();
            seen.dedup();
            prop_assert_eq!(
                seen.len(),
                p.gpu_indices.len(),
                "GPU used twice by one worker"
            );
            for ix in &p.gpu_indices {
                let g = n.gpus.iter().find(|g| g.index == *ix).expect("known GPU");
                prop_assert!(accepts_type(&t.gpu_types, &g.gpu_type), "wrong GPU type");
                match t.gpu_mem_bytes {
                    Some(m) if m + margin < g.mem_bytes => {
                        *shared.entry((&p.node, *ix)).or_default() += m + margin
                    }
                    _ => *whole.entry((&p.node, *ix)).or_default() += 1,
                }
            }
        }
        for p in &r.placements {
            prop_assert!(
                nodes[p.node.as_str()].admits(&t.tolerations, &t.requires),
                "{} placed on {}, which does not admit it",
                t.id,
                p.node
            );
        }
        let spans = r.placements.windows(2).any(|w| w[0].node != w[1].node);
        prop_assert!(
            !spans
                || r.placements
                    .iter()
                    .all(|p| !nodes[p.node.as_str()].own_network),
            "gang {} spans nodes, one of them isolated: {:?}",
            t.id,
            r.placements
        );
        if t.zone_affinity {
            let zones: Vec<&str> = r
                .placements
                .iter()
                .map(|p| nodes[p.node.as_str()].zone.as_str())
                .collect();
            prop_assert!(
                zones.windows(2).all(|w| w[0] == w[1]),
                "zone affinity broken"
            );
        }
    }
    for (id, n) in &nodes {
        prop_assert!(
            cpu.get(id).copied().unwrap_or(0) <= n.cpu_millis,
            "CPU over-committed on {}",
            id
        );
        prop_assert!(
            mem.get(id).copied().unwrap_or(0) <= n.mem_bytes,
            "memory over-committed on {}",
            id
        );
        for g in &n.gpus {
            let w = whole.get(&(*id, g.index)).copied().unwrap_or(0);
            let s = shared.get(&(*id, g.index)).copied().unwrap_or(0);
            prop_assert!(w <= 1, "GPU {}/{} given whole to {} tasks", id, g.index, w);
            prop_assert!(w == 0 || s == 0, "whole GPU {}/{} also shared", id, g.index);
            prop_assert!(
                s <= g.mem_bytes,
                "shared GPU {}/{} over its memory",
                id,
                g.index
            );
        }
    }
    Ok(())
}

/// A cluster after one cycle at t = 1,000, with `more` tasks of three other users queued
/// behind: crowded enough that many attempts fail.
fn crowded(sched: &Scheduler, mut state: ClusterState, more: Vec<TaskRequest>) -> ClusterState {
    let d = sched.schedule(&state, 1_000);
    apply(&mut state, &d, 1_000);
    for (k, mut t) in more.into_iter().enumerate() {
        t.id = format!("m{k}");
        t.user = format!("v{}", k % 3);
        state.pending.push(t);
    }
    state
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn placements_never_overcommit(state in arb_state(), more in prop::collection::vec(arb_task(100), 0..10)) {
        let cfg = PolicyConfig::default();
        let sched = Scheduler::new(cfg.clone());
        let mut state = state;
        // Cycle 1 on an empty cluster, cycle 2 on top of what cycle 1 started.
        let d = sched.schedule(&state, 1_000);
        apply(&mut state, &d, 1_000);
        check_no_overcommit(&state, cfg.share_margin_bytes)?;
        for (k, mut t) in more.into_iter().enumerate() {
            t.id = format!("m{k}");
            state.pending.push(t);
        }
        let d = sched.schedule(&state, 2_000);
        let asked: std::collections::HashMap<String, (u32, u32)> = state
            .pending
            .iter()
            .map(|t| (t.id.clone(), (t.narrowest(), t.workers.max(1))))
            .collect();
        for x in &d.decisions {
            if let Decision::Place { task, placements, .. } = x {
                // A rigid gang starts whole; an elastic one with its minimum or more.
                let (min, max) = asked[task];
                prop_assert!((min as usize..=max as usize).contains(&placements.len()), "{task}: {placements:?}");
            }
        }
        apply(&mut state, &d, 2_000);
        check_no_overcommit(&state, cfg.share_margin_bytes)?;
        // Every pending task has a reason; every task is either placed or explained.
        prop_assert_eq!(d.pending.len(), state.pending.len());
    }

    #[test]
    fn every_placement_policy_respects_capacity(state in arb_state(), policy in 0usize..4) {
        let placement = [PlacementPolicy::Random, PlacementPolicy::BestFit, PlacementPolicy::Fgd, PlacementPolicy::Autodl][policy];
        let cfg = PolicyConfig { placement, ..PolicyConfig::default() };
        let mut state = state;
        let d = Scheduler::new(cfg.clone()).schedule(&state, 50);
        apply(&mut state, &d, 50);
        check_no_overcommit(&state, cfg.share_margin_bytes)?;
    }

    /// The server lists running and waiting tasks in the store's order, the simulator in its
    /// own: the policy must decide the same either way (ties go by id, never by position).
    #[test]
    fn decisions_do_not_depend_on_the_order_of_the_input(
        state in arb_state(),
        more in prop::collection::vec(arb_task(100), 0..10),
        turn in 0usize..7,
    ) {
        let sched = Scheduler::new(PolicyConfig::default());
        let mut state = state;
        // Alike in everything the policy weighs, so that victims tie.
        for t in &mut state.pending {
            t.user = "u0".into();
            t.priority = 0.1;
            t.submitted_at = 0;
        }
        let d = sched.schedule(&state, 1_000);
        apply(&mut state, &d, 1_000);
        // Urgent newcomers, so some of the running tasks may be preempted for them.
        for (k, mut t) in more.into_iter().enumerate() {
            t.id = format!("m{k}");
            t.priority = 1.0;
            state.pending.push(t);
        }
        let mut other = state.clone();
        other.running.reverse();
        other.pending.reverse();
        if !other.running.is_empty() {
            let n = turn % other.running.len();
            other.running.rotate_left(n);
        }
        if !other.pending.is_empty() {
            let n = turn % other.pending.len();
            other.pending.rotate_left(n);
        }
        prop_assert_eq!(
            sched.schedule(&state, 1_600).decisions,
            sched.schedule(&other, 1_600).decisions
        );
    }

    /// A cycle skips attempts that a failed attempt of an easier request (same class, no more
    /// CPU, memory or GPU memory, no lower priority) proves futile. It must decide and explain
    /// exactly what the cycle that tries every blocked shape does.
    #[test]
    fn skipping_futile_attempts_changes_no_decision(
        state in arb_state(),
        more in prop::collection::vec(arb_crowded_task(), 8..40),
        explain in any::<bool>(),
    ) {
        let cfg = PolicyConfig { explain_pending: explain, ..PolicyConfig::default() };
        let sched = Scheduler::new(cfg);
        let state = crowded(&sched, state, more);
        prop_assert_eq!(
            sched.schedule(&state, 1_600),
            sched.schedule_exhaustively(&state, 1_600)
        );
    }

    /// A task that migration moves is placed among the few nodes with room on one GPU
    /// (`RoomIndex::holders`) instead of by a scan of the cluster: the same choice, for each
    /// placement policy that scores nodes, as placements fill the cluster and nodes are held.
    #[test]
    fn placing_among_the_nodes_with_room_is_placing_anywhere(
        state in arb_state(),
        more in prop::collection::vec(arb_crowded_task(), 8..40),
        asks in prop::collection::vec(
            (1u32..3, prop::option::of(1u64..100), 0u64..16_000, 0u64..64),
            1..30,
        ),
        held in prop::collection::vec(any::<bool>(), 6),
    ) {
        use autodl_scheduler::placement::{
            CapNode, Capacity, FragModel, GpuDemand, Placer, RoomIndex, TypeMask, WorkerNeed,
        };
        use rand::SeedableRng;
        let sched = Scheduler::default();
        let state = crowded(&sched, state, more);
        for policy in [PlacementPolicy::BestFit, PlacementPolicy::Fgd, PlacementPolicy::Autodl] {
            let mut scanned = Capacity::new(&state.nodes, &state.running, 0);
            let nodes = scanned.nodes.len();
            for (p, _) in held.iter().enumerate().filter(|(p, h)| **h && *p < nodes) {
                scanned.reserve(p);
            }
            let mut chosen = scanned.clone();
            let all_types: Vec<u16> = (0..scanned.types.len() as u16).collect();
            let classes = scanned.class_mask_all();
            let need = |(gpus, gib, cpu, mem): (u32, Option<u64>, u64, u64)| WorkerNeed {
                gpus,
                demand: gib.map_or(GpuDemand::Whole, |g| GpuDemand::Share(g << 30)),
                cpu_millis: cpu,
                mem_bytes: mem << 30,
                types: TypeMask::from_ids(&all_types),
                classes: classes.clone(),
            };
            let model = FragModel::from_counts(vec![(need((1, None, 4_000, 16)), 1.0)], 0.95, 16, 80 << 30);
            let (mut scan, mut among) = (Placer::new(policy, model.clone()), Placer::new(policy, model));
            let mut rooms = RoomIndex::default();
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
            for &ask in &asks {
                let need = need(ask);
                let a = scan.place_worker(&mut scanned, &need, &|n: &CapNode| !n.reserved, &mut rng);
                let b = match rooms.holders(&chosen, &need, 128) {
                    Some(h) => among.place_among(&mut chosen, &h, &need, &mut rng),
                    None => among.place_worker(&mut chosen, &need, &|n: &CapNode| !n.reserved, &mut rng),
                };
                prop_assert_eq!(a, b);
            }
        }
    }

    /// The live server explains a long queue only every little while: a cycle that does not
    /// explain may stop early, and must decide exactly what the explaining cycle does.
    #[test]
    fn explaining_the_queue_changes_no_decision(
        state in arb_state(),
        more in prop::collection::vec(arb_crowded_task(), 8..40),
    ) {
        let sched = Scheduler::new(PolicyConfig::default());
        let state = crowded(&sched, state, more);
        let explained = sched.schedule(&state, 1_600);
        let quiet = sched.decide(&state, 1_600);
        prop_assert!(quiet.pending.is_empty());
        prop_assert_eq!(explained.decisions, quiet.decisions);
    }
}
