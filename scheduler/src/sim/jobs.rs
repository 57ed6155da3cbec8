//! The queueing benchmark (`shared/benchmarks/fairshare.md`): whole-GPU jobs from real traces on a
//! homogeneous cluster, in virtual time, through [`Scheduler::schedule`] exactly as the server
//! calls it. The policy never sees a job's true run time; the simulator alone uses it to decide
//! when a job finishes.

use crate::config::{Backfill, PolicyConfig};
use crate::scheduler::{Decision, Scheduler};
use crate::sim::SimError;
use crate::snapshot::Snapshot;
use crate::types::{Gpu, Node, TaskRequest, Time, WorkerPlacement};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::io::Read;

/// One job of a trace. `runtime` is the truth the policy must not see.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub id: String,
    pub user: String,
    pub submit: Time,
    pub gpus: u32,
    pub runtime: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum JobPolicy {
    Fifo,
    FifoBackfill,
    Multifactor,
    #[default]
    Autodl,
}

impl JobPolicy {
    pub fn config(self) -> PolicyConfig {
        let mut c = match self {
            JobPolicy::Fifo => PolicyConfig::fifo(),
            JobPolicy::FifoBackfill => PolicyConfig::fifo_backfill(),
            JobPolicy::Multifactor => PolicyConfig::multifactor(),
            JobPolicy::Autodl => PolicyConfig::default(),
        };
        c.explain_pending = false;
        c
    }
}

impl std::str::FromStr for JobPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fifo" => Ok(Self::Fifo),
            "fifo-backfill" => Ok(Self::FifoBackfill),
            "multifactor" => Ok(Self::Multifactor),
            "autodl" => Ok(Self::Autodl),
            _ => Err(format!(
                "unknown job policy {s:?} (fifo, fifo-backfill, multifactor, autodl)"
            )),
        }
    }
}

impl std::fmt::Display for JobPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            JobPolicy::Fifo => "fifo",
            JobPolicy::FifoBackfill => "fifo-backfill",
            JobPolicy::Multifactor => "multifactor",
            JobPolicy::Autodl => "autodl",
        })
    }
}

#[derive(Deserialize)]
struct HeliosRow {
    #[serde(alias = "job_id")]
    u_id: String,
    user: String,
    gpu_num: u32,
    interval: u64,
    run_time: u64,
}

#[derive(Deserialize)]
struct ItpRow {
    job_id: String,
    submission_time: u64,
    duration: u64,
    num_gpu: u32,
}

/// Reads the Helios format: submit time is the running sum of `interval` over all rows, and
/// only jobs with GPUs are kept.
pub fn read_helios<R: Read>(r: R) -> Result<Vec<Job>, SimError> {
    let mut t = 0u64;
    let mut out = Vec::new();
    for row in csv::Reader::from_reader(r).deserialize::<HeliosRow>() {
        let row = row?;
        t += row.interval;
        if row.gpu_num > 0 {
            out.push(Job {
                id: row.u_id,
                user: row.user,
                submit: t,
                gpus: row.gpu_num,
                runtime: row.run_time,
            });
        }
    }
    Ok(out)
}

/// Reads the ITP format, which has no users: every job is attributed to `user` (the caller
/// passes the cluster name, so merged clusters act as tenants).
pub fn read_itp<R: Read>(r: R, user: &str) -> Result<Vec<Job>, SimError> {
    let mut out = Vec::new();
    for row in csv::Reader::from_reader(r).deserialize::<ItpRow>() {
        let row = row?;
        if row.num_gpu > 0 {
            out.push(Job {
                id: format!("{user}/{}", row.job_id),
                user: user.to_string(),
                submit: row.submission_time,
                gpus: row.num_gpu,
                runtime: row.duration,
            });
        }
    }
    Ok(out)
}

#[derive(Debug, Clone, PartialEq)]
pub struct JobsConfig {
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub policy: JobPolicy,
    /// Checkpoint period in seconds of run time; a preempted job resumes from its last one.
    pub checkpoint_s: u64,
    /// Paid on every restart after a preemption.
    pub restart_s: u64,
    /// Re-run the cycle at least this often while jobs wait, so time-driven priority changes
    /// (age, attained service) take effect without an arrival or a completion.
    pub tick_s: u64,
}

impl Default for JobsConfig {
    fn default() -> Self {
        JobsConfig {
            nodes: 80,
            gpus_per_node: 8,
            policy: JobPolicy::Autodl,
            checkpoint_s: 3_600,
            restart_s: 60,
            tick_s: 600,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobsReport {
    pub policy: JobPolicy,
    pub jobs: usize,
    /// Jobs larger than the cluster, refused by the admission check.
    pub rejected: usize,
    pub avg_jct: f64,
    pub p50_jct: f64,
    pub p99_jct: f64,
    pub avg_wait: f64,
    pub p99_wait: f64,
    pub utilization: f64,
    pub makespan: u64,
    pub preemptions: u64,
    pub jain_slowdown: f64,
    pub worst_user_slowdown: f64,
    pub cycles: u64,
}

#[derive(Debug, Clone, Default)]
struct JobState {
    ckpt_progress: u64,
    attempt: u32,
    run_start: Option<Time>,
    overhead: u64,
    ran: u64,
    attained: f64,
    finish: Option<Time>,
    allocated: u64,
}

fn request(job: &Job, idx: usize, gpn: u32) -> TaskRequest {
    let (gpus_per_worker, workers) = if job.gpus <= gpn {
        (job.gpus, 1)
    } else {
        (gpn, job.gpus.div_ceil(gpn))
    };
    TaskRequest {
        id: idx.to_string(),
        user: job.user.clone(),
        tenant: String::new(),
        gpu_types: Vec::new(),
        gpus_per_worker,
        workers,
        gpu_mem_bytes: None,
        cpu_millis: 0,
        mem_bytes: 0,
        priority: 0.5,
        deadline: None,
        submitted_at: job.submit,
        estimated_runtime: None,
        preemptible: true,
        zone_affinity: false,
        attained_gpu_seconds: 0.0,
        tolerations: vec![],
        requires: vec![],
    }
}

/// Simulates the whole trace and reports the benchmark's metrics.
pub fn run(jobs: &[Job], cfg: &JobsConfig) -> JobsReport {
    let policy = cfg.policy.config();
    let sched = Scheduler::new(policy.clone());
    let gpn = cfg.gpus_per_node;
    let nodes: Vec<Node> = (0..cfg.nodes)
        .map(|i| Node {
            id: format!("n{i:04}"),
            zone: String::new(),
            labels: Default::default(),
            cpu_millis: 1 << 40,
            mem_bytes: 1 << 50,
            gpus: (0..gpn)
                .map(|g| Gpu {
                    index: g,
                    gpu_type: "GPU".into(),
                    mem_bytes: 80 << 30,
                    util: 1.0,
                })
                .collect(),
            schedulable: true,
            taints: vec![],
            features: vec![],
        })
        .collect();
    let capacity = u64::from(cfg.nodes * gpn);
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&i| (jobs[i].submit, i));
    let mut rejected = 0;
    order.retain(|&i| {
        let ok = jobs[i].gpus.div_ceil(gpn) <= cfg.nodes;
        if !ok {
            rejected += 1;
        }
        ok
    });
    let admitted: Vec<usize> = order.clone();

    let mut st = vec![JobState::default(); jobs.len()];
    // The same input the server builds from its store: see `crate::snapshot`.
    let mut snap = Snapshot::new(nodes, Default::default(), Default::default());
    let mut completions: BinaryHeap<Reverse<(Time, usize, u32)>> = BinaryHeap::new();
    let mut next_arrival = 0usize;
    let mut preemptions = 0u64;
    let mut cycles = 0u64;
    let mut now: Time = 0;
    let mut last_cycle: Time = 0;
    let skippable =
        !policy.preemption && matches!(policy.backfill, Backfill::None | Backfill::FirstFit);
    let (mut freed, mut blocked_after_last, mut min_new) = (false, false, None::<u32>);

    loop {
        // Next event: arrival, completion, or a tick while jobs wait.
        let na = order.get(next_arrival).map(|&i| jobs[i].submit);
        let nc = completions.peek().map(|Reverse((t, _, _))| *t);
        let nt = (!snap.state().pending.is_empty()).then_some(last_cycle + cfg.tick_s);
        let Some(t) = [na, nc, nt].into_iter().flatten().min() else {
            break;
        };
        now = now.max(t);
        let mut changed = false;
        while let Some(&Reverse((t, j, attempt))) = completions.peek() {
            if t > now {
                break;
            }
            completions.pop();
            if st[j].attempt != attempt || st[j].run_start.is_none() {
                continue;
            }
            finish_run(&mut st[j], now);
            st[j].finish = Some(now);
            snap.end_run(&j.to_string(), now, None, &policy);
            changed = true;
            freed = true;
        }
        while let Some(&j) = order.get(next_arrival) {
            if jobs[j].submit > now {
                break;
            }
            snap.add_pending(request(&jobs[j], j, gpn));
            next_arrival += 1;
            changed = true;
            min_new = Some(min_new.map_or(jobs[j].gpus, |m: u32| m.min(jobs[j].gpus)));
        }
        let tick = nt.is_some_and(|x| x <= now);
        if !(changed || tick) || snap.state().pending.is_empty() {
            continue;
        }
        // Without preemption, and with an order-independent backfill, a cycle can only start
        // something if GPUs were freed since the last one, or if a newly arrived job fits in
        // what is free: everything older already failed on at least this much room. Skipping
        // the other cycles changes no decision and keeps long queues cheap to simulate.
        if skippable && !freed && blocked_after_last {
            let used: u32 = snap
                .state()
                .running
                .iter()
                .map(|r| r.request.total_gpus())
                .sum();
            let free = capacity.saturating_sub(u64::from(used));
            let new_may_fit =
                policy.backfill != Backfill::None && min_new.is_some_and(|g| u64::from(g) <= free);
            if !new_may_fit {
                last_cycle = now;
                min_new = None;
                continue;
            }
        }
        freed = false;
        min_new = None;
        if policy.preemption {
            for r in snap.running_mut() {
                let j: usize = r.request.id.parse().expect("id");
                r.last_checkpoint_at = last_checkpoint(&st[j], now, cfg.checkpoint_s);
            }
        }
        for _round in 0..4 {
            cycles += 1;
            last_cycle = now;
            // Accounting up to now, exactly as the server's cycle does it.
            snap.charge(now, |_| None, &policy);
            let d = sched.schedule(snap.state(), now);
            let mut preempted = false;
            let mut placed: Vec<(String, Vec<WorkerPlacement>)> = Vec::new();
            for dec in d.decisions {
                match dec {
                    Decision::Preempt { task, .. } => {
                        let j: usize = task.parse().expect("id");
                        let Some(req) = snap.end_run(&task, now, None, &policy) else {
                            continue;
                        };
                        preempt(&mut st[j], now, cfg.checkpoint_s);
                        snap.add_pending(req);
                        preemptions += 1;
                        preempted = true;
                    }
                    Decision::Place {
                        task, placements, ..
                    } => placed.push((task, placements_sorted(placements))),
                    Decision::Migrate { .. } => {}
                }
            }
            for (task, placements) in &placed {
                let j: usize = task.parse().expect("id");
                let s = &mut st[j];
                s.run_start = Some(now);
                s.overhead = if s.attempt > 0 { cfg.restart_s } else { 0 };
                s.attempt += 1;
                s.allocated = placements.iter().map(|w| w.gpu_indices.len() as u64).sum();
                let remaining = jobs[j].runtime.saturating_sub(s.ckpt_progress) + s.overhead;
                completions.push(Reverse((now + remaining, j, s.attempt)));
            }
            snap.place(placed, now);
            if !preempted {
                break;
            }
            freed = true;
        }
        blocked_after_last = !snap.state().pending.is_empty();
        if snap.state().running.is_empty() && completions.is_empty() && next_arrival == order.len()
        {
            // Nothing runs and nothing will arrive: whatever still waits can never start.
            break;
        }
    }

    // Metrics.
    let mut jct = Vec::new();
    let mut wait = Vec::new();
    let mut per_user: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
    let mut alloc_gpu_s = 0.0;
    let first_submit = admitted.iter().map(|&i| jobs[i].submit).min().unwrap_or(0);
    let mut last_finish = first_submit;
    for &i in &admitted {
        let s = &st[i];
        let Some(f) = s.finish else { continue };
        let c = (f - jobs[i].submit) as f64;
        jct.push(c);
        wait.push(c - s.ran as f64);
        alloc_gpu_s += s.attained;
        last_finish = last_finish.max(f);
        let e = per_user.entry(jobs[i].user.as_str()).or_default();
        e.0 += c / (jobs[i].runtime.max(60) as f64);
        e.1 += 1;
    }
    let means: Vec<f64> = per_user.values().map(|(s, n)| s / *n as f64).collect();
    let sum: f64 = means.iter().sum();
    let sq: f64 = means.iter().map(|x| x * x).sum();
    let makespan = last_finish - first_submit;
    JobsReport {
        policy: cfg.policy,
        jobs: jct.len(),
        rejected,
        avg_jct: mean(&jct),
        p50_jct: percentile(&mut jct.clone(), 50.0),
        p99_jct: percentile(&mut jct, 99.0),
        avg_wait: mean(&wait),
        p99_wait: percentile(&mut wait, 99.0),
        utilization: if makespan > 0 {
            alloc_gpu_s / (capacity as f64 * makespan as f64)
        } else {
            0.0
        },
        makespan,
        preemptions,
        jain_slowdown: if sq > 0.0 {
            sum * sum / (means.len() as f64 * sq)
        } else {
            1.0
        },
        worst_user_slowdown: means.iter().copied().fold(0.0, f64::max),
        cycles,
    }
}

fn placements_sorted(mut p: Vec<WorkerPlacement>) -> Vec<WorkerPlacement> {
    p.sort_by(|a, b| a.node.cmp(&b.node));
    p
}

fn finish_run(s: &mut JobState, now: Time) {
    let start = s.run_start.take().expect("running");
    let d = now - start;
    s.ran += d;
    s.attained += d as f64 * s.allocated as f64;
}

fn preempt(s: &mut JobState, now: Time, ckpt: u64) {
    let start = s.run_start.expect("running");
    let progress = s.ckpt_progress + (now - start).saturating_sub(s.overhead);
    finish_run(s, now);
    s.ckpt_progress = s.ckpt_progress.max(progress / ckpt * ckpt);
}

/// Wall time of the latest checkpoint in the current run, if it has reached one.
fn last_checkpoint(s: &JobState, now: Time, ckpt: u64) -> Option<Time> {
    let start = s.run_start?;
    let progress = s.ckpt_progress + (now - start).saturating_sub(s.overhead);
    let k = progress / ckpt * ckpt;
    (k > s.ckpt_progress).then(|| start + s.overhead + (k - s.ckpt_progress))
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// Nearest-rank percentile.
fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}
