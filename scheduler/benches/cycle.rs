//! One scheduling cycle at the scale the live server must handle: 10,000 pending tasks on
//! 1,000 nodes x 8 GPUs, half of the GPUs busy, with the full explanation of every pending task.
//! The `varied` runs give every task its own CPU, memory and GPU memory, as real users' tasks
//! differ, so nearly every task is a request shape of its own; `exhaustive` is the same cycle
//! trying every blocked shape, which is what skipping futile attempts saves; `busy_shared` is
//! a full cluster of 2,000 nodes with shared cards, where blocked tasks look for victims and
//! migrations; `50k_pending` is the scale goal, 50,000 pending on 2,000 nodes, and the last
//! run is the live server's steady cycle there (a full cluster, decided without explaining).

use autodl_scheduler::*;
use criterion::{criterion_group, criterion_main, Criterion};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const GIB: u64 = 1 << 30;

pub fn fixture(nodes: usize, pending: usize, seed: u64, varied: bool) -> ClusterState {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let types = [
        ("A100-80G", 80),
        ("H100-80G", 80),
        ("L40S", 48),
        ("A100-40G", 40),
    ];
    let mut state = ClusterState::default();
    for i in 0..nodes {
        let (ty, mem) = types[i % types.len()];
        state.nodes.push(Node {
            id: format!("node-{i:04}"),
            zone: format!("zone-{}", i % 4),
            labels: Default::default(),
            cpu_millis: 128_000,
            mem_bytes: 1024 * GIB,
            gpus: (0..8)
                .map(|g| Gpu {
                    index: g,
                    gpu_type: ty.into(),
                    mem_bytes: mem * GIB,
                    util: 0.5,
                })
                .collect(),
            schedulable: true,
            taints: vec![],
            features: vec![],
            own_network: false,
        });
    }
    let mk = move |rng: &mut ChaCha8Rng, id: String, at: u64| {
        let r: f64 = rng.gen();
        let (gpus, workers, shared) = if r < 0.55 {
            (1, 1, None)
        } else if r < 0.75 {
            (
                1,
                1,
                Some(rng.gen_range(8..32) * GIB + varied as u64 * rng.gen_range(0..GIB)),
            )
        } else if r < 0.88 {
            ([2, 4][rng.gen_range(0..2)], 1, None)
        } else if r < 0.97 {
            (8, 1, None)
        } else {
            (8, rng.gen_range(2..5), None)
        };
        let user = rng.gen_range(0..200);
        TaskRequest {
            id,
            user: format!("user-{user}"),
            tenant: format!("tenant-{}", user % 10),
            gpu_types: match rng.gen_range(0..4) {
                0 => vec!["A100".into()],
                1 => vec!["H100-80G".into(), "A100-80G".into()],
                _ => vec![],
            },
            gpus_per_worker: gpus,
            workers,
            min_workers: None,
            gpu_mem_bytes: shared,
            cpu_millis: if varied {
                rng.gen_range(1_000..8_000) * u64::from(gpus)
            } else {
                4_000 * u64::from(gpus)
            },
            mem_bytes: if varied {
                rng.gen_range(8 * GIB..64 * GIB) * u64::from(gpus)
            } else {
                32 * GIB * u64::from(gpus)
            },
            priority: rng.gen_range(0.0..1.0),
            deadline: (rng.gen_range(0..10) == 0).then(|| at + rng.gen_range(3_600..86_400)),
            submitted_at: at,
            estimated_runtime: None,
            preemptible: rng.gen_range(0..5) != 0,
            zone_affinity: workers > 1,
            attained_gpu_seconds: 0.0,
            tolerations: vec![],
            requires: vec![],
        }
    };
    // Half the GPUs busy: one running 1-GPU task on every other GPU.
    let mut k = 0;
    for n in &state.nodes {
        for g in (0..8).step_by(2) {
            let mut t = mk(&mut rng, format!("run-{k}"), 0);
            t.gpus_per_worker = 1;
            t.workers = 1;
            t.gpu_mem_bytes = None;
            t.zone_affinity = false;
            t.cpu_millis = 4_000;
            t.mem_bytes = 32 * GIB;
            state
                .running
                .push(one_gpu_run(t, &n.id, g, rng.gen_range(0..50_000)));
            k += 1;
        }
    }
    for i in 0..pending {
        let at = rng.gen_range(0..100_000);
        let t = mk(&mut rng, format!("task-{i}"), at);
        state.pending.push(t);
    }
    for u in 0..200 {
        state.usage.charge(
            &format!("user-{u}"),
            &format!("tenant-{}", u % 10),
            f64::from(u) * 3_600.0,
            Some(0.3 + f64::from(u % 7) / 10.0),
            90_000,
            7.0 * 86_400.0,
            86_400,
        );
    }
    state
}

fn one_gpu_run(request: TaskRequest, node: &str, gpu: u32, started_at: u64) -> RunningTask {
    RunningTask {
        request,
        placements: vec![WorkerPlacement {
            node: node.into(),
            gpu_indices: vec![gpu],
        }],
        started_at,
        last_checkpoint_at: None,
        preempting: false,
    }
}

/// The cluster as it is when busy: every GPU taken, a quarter of them shared by two or three
/// tasks of their own GPU memory, as in the scale harness once the queue has filled it.
pub fn busy_shared(mut state: ClusterState, seed: u64) -> ClusterState {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xb05e);
    let template = state.running[0].request.clone();
    state.running.clear();
    let mut k = 0;
    for n in &state.nodes {
        let card = n.gpus[0].mem_bytes;
        for g in 0..8u32 {
            let shared = rng.gen_range(0..4) == 0;
            let parts = if shared { rng.gen_range(2..4) } else { 1 };
            for _ in 0..parts {
                let mut t = template.clone();
                t.id = format!("run-{k}");
                t.user = format!("user-{}", rng.gen_range(0..200));
                t.tenant = format!("tenant-{}", k % 10);
                t.gpu_mem_bytes = shared.then(|| card / 4 + rng.gen_range(0..GIB));
                t.cpu_millis = rng.gen_range(1_000..8_000);
                t.mem_bytes = rng.gen_range(8 * GIB..64 * GIB);
                t.preemptible = rng.gen_range(0..5) != 0;
                state
                    .running
                    .push(one_gpu_run(t, &n.id, g, rng.gen_range(0..50_000)));
                k += 1;
            }
        }
    }
    state
}

/// Starts what a cycle placed, as the live server would before its next cycle.
fn apply_placements(state: &mut ClusterState, d: &Decisions) {
    for x in &d.decisions {
        if let Decision::Place {
            task, placements, ..
        } = x
        {
            if let Some(i) = state.pending.iter().position(|t| &t.id == task) {
                let request = state.pending.swap_remove(i);
                state.running.push(RunningTask {
                    request,
                    placements: placements.clone(),
                    started_at: 100_000,
                    last_checkpoint_at: None,
                    preempting: false,
                });
            }
        }
    }
}

fn report(name: &str, d: &Decisions) {
    let placed = d
        .decisions
        .iter()
        .filter(|x| matches!(x, Decision::Place { .. }))
        .count();
    eprintln!(
        "{name}: {placed} placed, {} decisions, {} pending explained",
        d.decisions.len(),
        d.pending.len()
    );
}

fn cycle(c: &mut Criterion) {
    let sched = Scheduler::default();
    let mut g = c.benchmark_group("cycle");
    g.sample_size(10);
    let state = fixture(1_000, 10_000, 7, false);
    report("10k_pending_1000x8", &sched.schedule(&state, 100_000));
    g.bench_function("10k_pending_1000x8", |b| {
        b.iter(|| sched.schedule(std::hint::black_box(&state), 100_000))
    });
    let varied = fixture(1_000, 10_000, 7, true);
    let d = sched.schedule(&varied, 100_000);
    assert_eq!(d, sched.schedule_exhaustively(&varied, 100_000));
    report("10k_pending_1000x8_varied", &d);
    g.bench_function("10k_pending_1000x8_varied", |b| {
        b.iter(|| sched.schedule(std::hint::black_box(&varied), 100_000))
    });
    g.bench_function("10k_pending_1000x8_varied_exhaustive", |b| {
        b.iter(|| sched.schedule_exhaustively(std::hint::black_box(&varied), 100_000))
    });
    let busy = busy_shared(fixture(2_000, 5_000, 7, true), 7);
    report(
        "5k_pending_2000x8_busy_shared",
        &sched.schedule(&busy, 100_000),
    );
    g.bench_function("5k_pending_2000x8_busy_shared", |b| {
        b.iter(|| sched.schedule(std::hint::black_box(&busy), 100_000))
    });
    let goal = fixture(2_000, 50_000, 7, true);
    report("50k_pending_2000x8_varied", &sched.schedule(&goal, 100_000));
    g.bench_function("50k_pending_2000x8_varied", |b| {
        b.iter(|| sched.schedule(std::hint::black_box(&goal), 100_000))
    });
    // The live server's steady state at the scale goal: a full cluster with shared cards and
    // a long queue, decided without explanations (they are written beside the cycles).
    let mut steady = busy_shared(fixture(2_000, 42_000, 7, true), 7);
    for _ in 0..3 {
        let d = sched.decide(&steady, 100_000);
        apply_placements(&mut steady, &d);
    }
    report(
        "42k_pending_2000x8_busy_shared_decide",
        &sched.decide(&steady, 100_000),
    );
    g.bench_function("42k_pending_2000x8_busy_shared_decide", |b| {
        b.iter(|| sched.decide(std::hint::black_box(&steady), 100_000))
    });
    g.finish();
}

criterion_group!(benches, cycle);
criterion_main!(benches);
