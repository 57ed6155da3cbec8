//! Simulators on tiny traces whose results are worked out by hand.

use autodl_scheduler::sim::jobs::{self, JobPolicy, JobsConfig};
use autodl_scheduler::sim::packing;
use autodl_scheduler::PlacementPolicy;

const HELIOS: &str = include_str!("../testdata/tiny_helios.csv");
const ITP: &str = include_str!("../testdata/tiny_itp.csv");
const NODES: &str = include_str!("../testdata/tiny_nodes.csv");
const PODS: &str = include_str!("../testdata/tiny_pods.csv");

/// `n` jobs of `users` users arriving within `spread` seconds, cycling through `sizes` GPUs
/// (sizes above a node are multi-node jobs), with run times from `runtime.0` up to
/// `runtime.0 + runtime.1`: a dense, mixed, deterministic trace.
fn mixed(n: u64, users: u64, spread: u64, sizes: &[u32], runtime: (u64, u64)) -> Vec<jobs::Job> {
    (0..n)
        .map(|i| jobs::Job {
            id: i.to_string(),
            user: format!("u{}", i % users),
            submit: i * (spread / 500 + 37) % spread,
            gpus: sizes[(i % sizes.len() as u64) as usize],
            runtime: runtime.0 + (i * 7_919) % runtime.1,
        })
        .collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// One node of 8 GPUs. Submit times are the running sum of `interval` (0, 10, 20, 25, 30); the
/// CPU-only row 3 is dropped. FIFO by hand:
///   job0 (8 GPUs, 100 s) runs 0..100; job1 (4, 50 s) and job2 (4, 30 s) both start at 100,
///   end at 150 and 130; job4 (2, 10 s) starts when job2 ends, 130..140.
///   JCT: 100, 140, 110, 110 -> avg 115, p50 110, p99 140; waits 0, 90, 80, 100 -> avg 67.5.
///   Utilization: (8*100 + 4*50 + 4*30 + 2*10) / (8 * 150) = 1140 / 1200.
///   Bounded slowdown: a: 100/100 = 1; b: (140/60 + 110/60) / 2 = 25/12; c: 110/60 = 11/6.
#[test]
fn fifo_on_a_tiny_helios_trace_matches_hand_computation() {
    let js = jobs::read_helios(HELIOS.as_bytes()).unwrap();
    assert_eq!(js.len(), 4);
    assert_eq!(
        js.iter().map(|j| j.submit).collect::<Vec<_>>(),
        vec![0, 10, 20, 30]
    );
    for policy in [
        JobPolicy::Fifo,
        JobPolicy::FifoBackfill,
        JobPolicy::Multifactor,
    ] {
        let r = jobs::run(
            &js,
            &JobsConfig {
                nodes: 1,
                gpus_per_node: 8,
                policy,
                ..JobsConfig::default()
            },
        );
        assert_eq!(r.jobs, 4);
        assert!(close(r.avg_jct, 115.0), "{policy}: {r:?}");
        assert!(close(r.p50_jct, 110.0));
        assert!(close(r.p99_jct, 140.0));
        assert!(close(r.avg_wait, 67.5));
        assert!(close(r.p99_wait, 100.0));
        assert_eq!(r.makespan, 150);
        assert!(close(r.utilization, 1140.0 / 1200.0));
        assert_eq!(r.preemptions, 0);
        let means = [1.0, 25.0 / 12.0, 11.0 / 6.0];
        let sum: f64 = means.iter().sum();
        let sq: f64 = means.iter().map(|x| x * x).sum();
        assert!(close(r.jain_slowdown, sum * sum / (3.0 * sq)));
        assert!(close(r.worst_user_slowdown, 25.0 / 12.0));
    }
}

#[test]
fn itp_format_reads_the_same_jobs() {
    let js = jobs::read_itp(ITP.as_bytes(), "cluster").unwrap();
    let r = jobs::run(
        &js,
        &JobsConfig {
            nodes: 1,
            gpus_per_node: 8,
            policy: JobPolicy::Fifo,
            ..JobsConfig::default()
        },
    );
    assert!(close(r.avg_jct, 115.0));
}

/// Preemption by hand: one 1-GPU node. A long job (10,000 s) starts at 0; a 100 s job arrives at
/// 3,700, just after the long job's first checkpoint (3,600 s of progress). The autodl policy
/// preempts the long job (it has had far more service); it stops at the end of the 120 s grace
/// period (3,820), keeps its checkpoint and pays 60 s to restart: the short job runs
/// 3,820..3,920, the long one resumes at 3,920 with 6,400 s left plus 60 s of restart, finishing
/// at 10,380. Wasted: the 220 s past the checkpoint and the 60 s restart.
#[test]
fn preemption_keeps_the_last_checkpoint() {
    let js = vec![
        jobs::Job {
            id: "long".into(),
            user: "a".into(),
            submit: 0,
            gpus: 1,
            runtime: 10_000,
        },
        jobs::Job {
            id: "short".into(),
            user: "b".into(),
            submit: 3_700,
            gpus: 1,
            runtime: 100,
        },
    ];
    let cfg = JobsConfig {
        nodes: 1,
        gpus_per_node: 1,
        policy: JobPolicy::Autodl,
        ..JobsConfig::default()
    };
    let r = jobs::run(&js, &cfg);
    assert_eq!(r.preemptions, 1, "{r:?}");
    assert_eq!(r.makespan, 10_380);
    assert!(close(r.avg_jct, (10_380.0 + 220.0) / 2.0), "{r:?}");
    assert!(close(r.wasted_gpu_s, 220.0 + 60.0), "{r:?}");
    // FIFO makes the short job wait for the long one.
    let f = jobs::run(
        &js,
        &JobsConfig {
            policy: JobPolicy::Fifo,
            ..cfg
        },
    );
    assert!(close(f.avg_jct, (10_000.0 + 6_400.0) / 2.0), "{f:?}");
}

/// The clairvoyant reference pays the same for a preemption as the policies: on the scenario
/// above it preempts too (the long job would still need 6,400 s + 60 s after stopping, the short
/// one 100 s) and gets the same numbers. When the running job is nearly done, it does not.
#[test]
fn srtf_oracle_preempts_only_for_a_shorter_job() {
    let job = |id: &str, submit, runtime| jobs::Job {
        id: id.into(),
        user: id.into(),
        submit,
        gpus: 1,
        runtime,
    };
    let cfg = JobsConfig {
        nodes: 1,
        gpus_per_node: 1,
        policy: JobPolicy::SrtfOracle,
        ..JobsConfig::default()
    };
    let r = jobs::run(&[job("long", 0, 10_000), job("short", 3_700, 100)], &cfg);
    assert_eq!(r.preemptions, 1, "{r:?}");
    assert_eq!(r.makespan, 10_380);
    assert!(close(r.wasted_gpu_s, 220.0 + 60.0), "{r:?}");
    // Stopped at 3,700 the 4,000 s job would still need 460 s: the 1,000 s job waits for it.
    let r = jobs::run(&[job("long", 0, 4_000), job("short", 3_700, 1_000)], &cfg);
    assert_eq!(r.preemptions, 0, "{r:?}");
    assert_eq!(r.makespan, 5_000);
}

/// Every job of a dense mixed trace (multi-node jobs included) finishes under the oracle, and
/// its average JCT is no worse than the policy's, which does not know run times.
#[test]
fn srtf_oracle_finishes_every_job() {
    let js = mixed(400, 5, 20_000, &[1, 1, 2, 4, 8, 16], (200, 30_000));
    let cfg = JobsConfig {
        nodes: 4,
        gpus_per_node: 8,
        policy: JobPolicy::SrtfOracle,
        ..JobsConfig::default()
    };
    let oracle = jobs::run(&js, &cfg);
    assert_eq!(oracle.jobs, 400, "{oracle:?}");
    assert!(oracle.preemptions > 0);
    let autodl = jobs::run(
        &js,
        &JobsConfig {
            policy: JobPolicy::Autodl,
            ..cfg
        },
    );
    assert!(oracle.avg_jct <= autodl.avg_jct, "{oracle:?} vs {autodl:?}");
}

#[test]
fn job_simulation_is_deterministic() {
    let js = mixed(300, 7, 5_000, &[1, 2, 4, 8, 16], (60, 20_000));
    let cfg = JobsConfig {
        nodes: 4,
        gpus_per_node: 8,
        ..JobsConfig::default()
    };
    assert_eq!(jobs::run(&js, &cfg), jobs::run(&js, &cfg));
}

/// Three GPUs (two T4 on node-a, one V100M16 on node-b) = 3,000 milli.
///   pod-4 (2 x T4) must go to node-a; pod-1 (1 whole GPU) then takes node-b;
///   pod-0 (500 milli) and pod-3 (300 on V100M16) find nothing.
/// Arrived after each: 2000, 3000, 3500, 3800; used: 2000, 3000, 3000, 3000.
#[test]
fn packing_replay_matches_hand_computation() {
    let nodes = packing::read_nodes(NODES.as_bytes()).unwrap();
    let pods = packing::read_pods(PODS.as_bytes()).unwrap();
    let by = |n: &str| pods.iter().find(|p| p.name == n).unwrap().clone();
    let seq = vec![by("pod-4"), by("pod-1"), by("pod-0"), by("pod-3")];
    for policy in [
        PlacementPolicy::Random,
        PlacementPolicy::BestFit,
        PlacementPolicy::Fgd,
        PlacementPolicy::Autodl,
    ] {
        let r = packing::replay(&nodes, &pods, &seq, policy, 1);
        assert_eq!(
            r.records,
            vec![(2000, 2000), (3000, 3000), (3500, 3000), (3800, 3000)],
            "{policy:?}"
        );
        assert_eq!(r.failed, 2);
    }
    // A half-GPU task first: a fragmentation-aware policy keeps node-a's two T4s whole for
    // the 2-GPU task.
    let seq = vec![by("pod-0"), by("pod-4")];
    for policy in [
        PlacementPolicy::BestFit,
        PlacementPolicy::Fgd,
        PlacementPolicy::Autodl,
    ] {
        let r = packing::replay(&nodes, &pods, &seq, policy, 1);
        assert_eq!(r.failed, 0, "{policy:?}");
    }
}

#[test]
fn packing_inflates_to_130_percent_deterministically() {
    let nodes = packing::read_nodes(NODES.as_bytes()).unwrap();
    let pods = packing::read_pods(PODS.as_bytes()).unwrap();
    let a = packing::arrival_sequence(&pods, 3_000, 7);
    let total: u64 = a.iter().map(|p| p.gpu_request()).sum();
    assert!(total >= 3_900);
    assert_eq!(a, packing::arrival_sequence(&pods, 3_000, 7));
    let r = packing::run(&nodes, &pods, &[1, 2, 3], PlacementPolicy::Autodl);
    assert!(r.alloc_130 <= 100.0 && r.alloc_130 > 0.0);
    assert_eq!(
        r,
        packing::run(&nodes, &pods, &[1, 2, 3], PlacementPolicy::Autodl)
    );
}

#[test]
fn seed_ranges_parse() {
    assert_eq!(
        autodl_scheduler::sim::parse_seeds("42-45").unwrap(),
        vec![42, 43, 44, 45]
    );
    assert_eq!(
        autodl_scheduler::sim::parse_seeds("1,3").unwrap(),
        vec![1, 3]
    );
    assert!(autodl_scheduler::sim::parse_seeds("5-1").is_err());
}

/// Two users with the same jobs competing for one node: with utilisation drawn per user, the
/// factor moves the busier user's jobs ahead; without it, both fare alike.
#[test]
fn utilization_factor_favours_the_busier_user() {
    let mut js = Vec::new();
    for i in 0..60u64 {
        js.push(jobs::Job {
            id: i.to_string(),
            user: format!("u{}", i % 2),
            submit: i * 10,
            gpus: 8,
            runtime: 1_000,
        });
    }
    let seed = 7;
    let util = jobs::user_utilization(&js, seed);
    assert_eq!(util, jobs::user_utilization(&js, seed));
    assert!(util.values().all(|u| (0.0..=1.0).contains(u)));
    let (busy, idle) = if util["u0"] > util["u1"] {
        ("u0", "u1")
    } else {
        ("u1", "u0")
    };
    assert!(util[busy] - util[idle] > 0.1, "{util:?}");
    let cfg = JobsConfig {
        nodes: 1,
        gpus_per_node: 8,
        policy: JobPolicy::Autodl,
        util_seed: Some(seed),
        ..JobsConfig::default()
    };
    let avg_of = |r: &jobs::JobsReport, u: f64| -> f64 {
        let b = r
            .util_bands
            .iter()
            .find(|b| u >= b.from && (u < b.to || b.to >= 1.0))
            .unwrap();
        b.avg_jct
    };
    let on = jobs::run(&js, &cfg);
    assert_eq!(on.util_bands.iter().map(|b| b.jobs).sum::<usize>(), 60);
    let off = jobs::run(
        &js,
        &JobsConfig {
            util_factor: false,
            ..cfg
        },
    );
    assert!(
        avg_of(&on, util[busy]) < avg_of(&off, util[busy]),
        "{on:?}\n{off:?}"
    );
}

/// FGD's typical tasks are GPU demands: three half-GPU tasks asking 1, 2 and 8 CPUs are one
/// shape that asks the median, 2 CPUs; the CPU-only task is a shape of its own.
#[test]
fn fgd_typical_tasks_are_gpu_demands_with_their_median_cpu() {
    let nodes = packing::read_nodes(NODES.as_bytes()).unwrap();
    let pods = packing::read_pods(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n\
         a,1000,1024,1,500,\n\
         b,8000,4096,1,500,\n\
         c,2000,2048,1,500,\n\
         d,4000,1024,0,0,\n"
            .as_bytes(),
    )
    .unwrap();
    let cap = autodl_scheduler::placement::Capacity::new(&nodes, &[], 0);
    let model = packing::frag_model(&cap, &pods, PlacementPolicy::Fgd);
    let mut shapes: Vec<(u32, u64, u64, f64)> = model
        .shapes
        .iter()
        .map(|(n, p)| (n.gpus, n.cpu_millis, n.mem_bytes, *p))
        .collect();
    shapes.sort_by_key(|s| s.0);
    assert_eq!(shapes, vec![(0, 4000, 0, 0.25), (1, 2000, 0, 0.75)]);
}

/// An elastic job on one node of 4 GPUs, beside a 1-GPU job running 0..5,000. The 4-GPU job
/// (elastic down to 2) arrives at 10 and starts with the 3 GPUs free, going at 3/4 speed. Its
/// first checkpoint (3,600 s of work) comes at 10 + 4,800 = 4,810. At 5,000 a GPU is idle and
/// nobody waits: it has run 4,990 s, so a fourth worker should save 4,990 / 4 = 1,247 s against
/// 190 s unsaved + 60 s of restart, and it grows. It stops at the end of the grace period
/// (5,120) having done 5,110 · 3/4 = 3,832 s of work, keeps 3,600, and restarts at 4 workers:
/// 60 s of restart and 4,400 s of work, done at 9,580. Lost to the resize: 232 s of work at 4
/// GPUs and the 60 s restart at 4. Rigid, it waits for the fourth GPU (or takes it by
/// preemption, paying for that) and ends at 13,000 or later.
#[test]
fn an_elastic_job_starts_narrow_and_grows_into_a_freed_gpu() {
    let js = vec![
        jobs::Job {
            id: "small".into(),
            user: "a".into(),
            submit: 0,
            gpus: 1,
            runtime: 5_000,
        },
        jobs::Job {
            id: "wide".into(),
            user: "b".into(),
            submit: 10,
            gpus: 4,
            runtime: 8_000,
        },
    ];
    let cfg = JobsConfig {
        nodes: 1,
        gpus_per_node: 4,
        policy: JobPolicy::Autodl,
        elastic: Some(0.5),
        ..JobsConfig::default()
    };
    let r = jobs::run(&js, &cfg);
    assert_eq!(
        (r.narrow_starts, r.resize_stops, r.resizes, r.preemptions),
        (1, 1, 1, 0),
        "{r:?}"
    );
    assert_eq!(r.makespan, 9_580, "{r:?}");
    assert!(close(r.avg_jct, (5_000.0 + 9_570.0) / 2.0), "{r:?}");
    assert!(
        close(r.wasted_resizing_gpu_s, 232.0 * 4.0 + 60.0 * 4.0),
        "{r:?}"
    );
    assert!(close(r.wasted_gpu_s, r.wasted_resizing_gpu_s), "{r:?}");
    let rigid = jobs::run(
        &js,
        &JobsConfig {
            elastic: Some(1.0),
            ..cfg
        },
    );
    assert_eq!((rigid.narrow_starts, rigid.resize_stops), (0, 0));
    assert!(rigid.makespan >= 13_000, "{rigid:?}");
}
