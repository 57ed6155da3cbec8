//! The queueing benchmark (`shared/benchmarks/fairshare.md`): whole-GPU jobs from real traces on a
//! homogeneous cluster, in virtual time, through [`Scheduler::schedule`] exactly as the server
//! calls it. The policy never sees a job's true run time; the simulator alone uses it to decide
//! when a job finishes.

use crate::config::{Backfill, PolicyConfig};
use crate::forecast::{estimate_starts, RuntimeHistory};
use crate::scheduler::{Decision, Scheduler};
use crate::sim::SimError;
use crate::snapshot::Snapshot;
use crate::types::{Gpu, Node, TaskId, TaskRequest, Time, WorkerPlacement};
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
    /// Not a policy: the clairvoyant reference ([`crate::sim::oracle`]).
    SrtfOracle,
}

impl JobPolicy {
    pub fn config(self) -> PolicyConfig {
        let mut c = match self {
            JobPolicy::Fifo => PolicyConfig::fifo(),
            JobPolicy::FifoBackfill => PolicyConfig::fifo_backfill(),
            JobPolicy::Multifactor => PolicyConfig::multifactor(),
            // The oracle decides itself; the world takes the grace period and checkpoint
            // rules from autodl's, so both pay the same for a preemption.
            JobPolicy::Autodl | JobPolicy::SrtfOracle => PolicyConfig::default(),
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
            "srtf-oracle" => Ok(Self::SrtfOracle),
            _ => Err(format!(
                "unknown job policy {s:?} (fifo, fifo-backfill, multifactor, autodl, srtf-oracle)"
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
            JobPolicy::SrtfOracle => "srtf-oracle",
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

/// `n` jobs of `users` users arriving over time (0 to 15 minutes apart), of 1 to 8 GPUs and
/// 5 minutes to 4 hours of work, from a fixed seed: the same trace on every machine, for
/// tests and benchmarks that need contention without a trace file.
pub fn synthetic(n: usize, users: usize, seed: u64) -> Vec<Job> {
    let mut x = seed;
    let mut next = move |m: u64| {
        // SplitMix64.
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % m.max(1)
    };
    let mut at = 0;
    (0..n)
        .map(|i| {
            at += next(900);
            Job {
                id: format!("j{i}"),
                user: format!("u{}", next(users as u64)),
                submit: at,
                gpus: [1, 1, 2, 2, 4, 8][next(6) as usize],
                runtime: 300 + next(14_000),
            }
        })
        .collect()
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
    pub hardware: Hardware,
    /// Seed of the per-user GPU utilisation ([`user_utilization`]); without one every job
    /// keeps its GPUs fully busy and the utilisation factor never acts.
    pub util_seed: Option<u64>,
    /// Whether the policy weighs measured utilisation (off: its weight is zero), to measure
    /// what the factor does.
    pub util_factor: bool,
    /// Ask the decider, when a job arrives and has to wait, when it will start; the report
    /// then says how far off that was.
    pub forecast: bool,
    /// Multi-GPU jobs as gangs of one-GPU workers (data-parallel ranks) that run with at least
    /// this fraction of their GPUs: elastic below 1.0, rigid gangs of the same shape at 1.0.
    /// `None`: jobs as traced (a worker per node's worth of GPUs, rigid). How a narrower run
    /// progresses: see `work_done`.
    pub elastic: Option<f64>,
}

impl JobsConfig {
    /// The policy as this run uses it.
    pub fn policy_config(&self) -> PolicyConfig {
        let mut c = self.policy.config();
        if !self.util_factor {
            c.weights.utilization = 0.0;
        }
        c
    }
}

/// Each user's GPU utilisation, drawn once per user from Beta(2, 2) and held for all their jobs.
/// Why this distribution: in published studies of shared training clusters (Microsoft's Philly,
/// ATC'19), job GPU utilisation spreads across the whole range with a median near one half, and
/// what sets it (input pipeline, model size, code) belongs to the user more than to the job.
/// Beta(2, 2) has mean 0.5 and standard deviation 0.22, with few users at either extreme. Users
/// are drawn in name order, so the result depends only on the seed and the set of users.
pub fn user_utilization(jobs: &[Job], seed: u64) -> BTreeMap<String, f64> {
    use rand::SeedableRng;
    use rand_distr::Distribution;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let beta = rand_distr::Beta::new(2.0, 2.0).expect("valid parameters");
    let users: std::collections::BTreeSet<&str> = jobs.iter().map(|j| j.user.as_str()).collect();
    users
        .into_iter()
        .map(|u| (u.to_owned(), beta.sample(&mut rng)))
        .collect()
}

/// Average JCT of the jobs whose user's utilisation falls in one band.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UtilBand {
    /// Lower and upper utilisation of the band; the upper bound is exclusive but for 1.0.
    pub from: f64,
    pub to: f64,
    pub jobs: usize,
    pub avg_jct: f64,
}

/// The bands JCT is reported in: a third of the range each.
pub const UTIL_BANDS: [(f64, f64); 3] =
    [(0.0, 1.0 / 3.0), (1.0 / 3.0, 2.0 / 3.0), (2.0 / 3.0, 1.0)];

impl Default for JobsConfig {
    fn default() -> Self {
        JobsConfig {
            nodes: 80,
            gpus_per_node: 8,
            policy: JobPolicy::Autodl,
            checkpoint_s: 3_600,
            restart_s: 60,
            tick_s: 600,
            hardware: Hardware::default(),
            util_seed: None,
            util_factor: true,
            forecast: false,
            elastic: None,
        }
    }
}

/// What every node has and every job asks for beside whole GPUs. Traces record GPUs only; the
/// defaults make CPU and memory never bind. A replay through a live server names what its
/// simulated agents register and its tasks ask for, so both sides decide on the same input.
#[derive(Debug, Clone, PartialEq)]
pub struct Hardware {
    pub gpu_type: String,
    pub gpu_mem_bytes: u64,
    pub node_cpu_millis: u64,
    pub node_mem_bytes: u64,
    pub job_cpu_millis: u64,
    pub job_mem_bytes: u64,
}

impl Default for Hardware {
    fn default() -> Self {
        Hardware {
            gpu_type: "GPU".into(),
            gpu_mem_bytes: 80 << 30,
            node_cpu_millis: 1 << 40,
            node_mem_bytes: 1 << 50,
            job_cpu_millis: 0,
            job_mem_bytes: 0,
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
    /// GPU-seconds of work lost to preemption (done again after a restart) and of restarts.
    pub wasted_gpu_s: f64,
    /// Runs started with a different number of GPUs than the same job's run before (an
    /// elastic job restarting wider or narrower).
    pub resizes: u64,
    /// Runs started with fewer GPUs than their job asked for.
    pub narrow_starts: u64,
    /// Runs the decider stopped to change their width (growing, or shrinking instead of a
    /// preemption; not counted in `preemptions`).
    pub resize_stops: u64,
    /// The part of `wasted_gpu_s` lost to those changes (work since the checkpoint, restarts).
    pub wasted_resizing_gpu_s: f64,
    /// GPU-seconds allocated to jobs, wasted ones included.
    pub allocated_gpu_s: f64,
    pub jain_slowdown: f64,
    pub worst_user_slowdown: f64,
    pub cycles: u64,
    /// Average JCT per band of user utilisation ([`UTIL_BANDS`]), when utilisation is drawn.
    pub util_bands: Vec<UtilBand>,
    /// With `forecast`: how good the start times predicted at arrival were.
    pub forecast: Option<ForecastAccuracy>,
}

/// Start times predicted when a job arrived and could not start at once, against when it did
/// start.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ForecastAccuracy {
    /// Jobs that had to wait and got a prediction.
    pub predicted: usize,
    /// Jobs that had to wait but were beyond the forward run's horizon.
    pub beyond_horizon: usize,
    /// Jobs that started at arrival (no prediction needed).
    pub started_at_once: usize,
    /// Absolute error of the prediction, seconds.
    pub median_abs_error_s: f64,
    pub p90_abs_error_s: f64,
    /// The same errors relative to the actual wait (error / wait).
    pub median_rel_error: f64,
    /// Mean actual wait of the predicted jobs, for scale.
    pub mean_wait_s: f64,
}

#[derive(Debug, Clone, Default)]
struct JobState {
    /// Work done up to the last checkpoint, in seconds of a run at full width.
    ckpt_progress: u64,
    attempt: u32,
    /// GPUs of a run at full width, and those of the last run.
    full: u64,
    last_width: Option<u64>,
    run_start: Option<Time>,
    overhead: u64,
    ran: u64,
    attained: f64,
    finish: Option<Time>,
    allocated: u64,
    /// The checkpoint of the current run last told to the decider.
    reported_checkpoint: Option<Time>,
    /// Told to stop: the run ends then, holding its GPUs until it does (the grace period).
    stopping: Option<Time>,
    /// GPU-seconds of work lost to preemption (progress past the last checkpoint) and paid
    /// again in restarts.
    wasted: f64,
    /// The part of `wasted` lost to changes of width.
    wasted_resizing: f64,
    /// Stopping because of a change of width, not a preemption.
    resizing: bool,
    /// The current run is the restart after a change of width.
    restarted_resizing: bool,
}

/// Who decides where and when jobs run. The simulator's world (arrivals, true run times,
/// checkpoints, restarts) is the same whoever decides: the policy in this process
/// ([`InProcess`]), or a live server the trace is replayed through, whose decisions are then
/// compared with the simulator's (`autodl-server`'s `replay`).
///
/// A task's id is the world's: the job's position in arrival order, zero-padded, so ids sort
/// as the tasks were submitted (a server that hands out time-ordered ids sorts them alike).
pub trait Decider {
    /// A job is submitted at `now`.
    fn submit(&mut self, request: TaskRequest, now: Time);
    /// The current run of `task` saved a checkpoint at `at` (no later than the next call's
    /// `now`, and reported before anything else happens at a later time).
    fn checkpoint(&mut self, task: &str, at: Time);
    /// The current run of `task` did all its work at `now`.
    fn finish(&mut self, task: &str, now: Time);
    /// One scheduling cycle at `now`. Runs it preempts are told to stop: each keeps its GPUs
    /// until [`Decider::stopped`] (the policy's grace period later, or at once without one).
    fn cycle(&mut self, now: Time) -> Round;
    /// A run told to stop has stopped at `at`; its task waits again.
    fn stopped(&mut self, task: &str, at: Time);
    /// The agents measure the current run of `task` at `util` GPU utilisation (as long as it
    /// runs, until told otherwise). Deciders that do not weigh utilisation ignore it.
    fn utilization(&mut self, _task: &str, _util: f64) {}
    /// Estimated start of waiting tasks, after the cycle at `now`.
    fn estimates(&mut self, _now: Time) -> BTreeMap<TaskId, Time> {
        BTreeMap::new()
    }
}

/// What one cycle did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Round {
    pub placed: Vec<(TaskId, Vec<WorkerPlacement>)>,
    pub preempted: Vec<TaskId>,
    /// Elastic tasks told to stop so that they start again at another width.
    pub resized: Vec<TaskId>,
}

/// One decision, as the replay log keeps it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Decided {
    pub at: Time,
    /// Cycles at the same time are numbered from 0 (a preemption is followed by another).
    pub round: u32,
    pub task: TaskId,
    pub what: Action,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Action {
    /// (node, GPU indices) per worker, by node.
    Place(Vec<(String, Vec<u32>)>),
    Preempt,
    /// Stopped to start again at another width (an elastic task).
    Resize,
}

/// A whole run: the benchmark's metrics and every decision in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    pub report: JobsReport,
    pub log: Vec<Decided>,
}

/// The policy of this process on the same input builder the server uses ([`Snapshot`]).
pub struct InProcess {
    sched: Scheduler,
    policy: PolicyConfig,
    snap: Snapshot,
    /// Measured utilisation of running tasks, as the server keeps its agents' samples.
    busy: BTreeMap<TaskId, f64>,
    /// Start of the current run and time run before it, per task, for the run-time history.
    runs: BTreeMap<TaskId, (Time, u64)>,
    history: RuntimeHistory,
}

impl InProcess {
    pub fn new(cfg: &JobsConfig) -> InProcess {
        let policy = cfg.policy_config();
        InProcess {
            sched: Scheduler::new(policy.clone()),
            snap: Snapshot::new(nodes(cfg), Default::default(), Default::default()),
            history: RuntimeHistory::new(policy.default_runtime_s),
            policy,
            busy: BTreeMap::new(),
            runs: BTreeMap::new(),
        }
    }
}

impl Decider for InProcess {
    fn submit(&mut self, request: TaskRequest, _now: Time) {
        self.snap.add_pending(request);
    }

    fn checkpoint(&mut self, task: &str, at: Time) {
        if let Some(r) = self.snap.running_mut().find(|r| r.request.id == task) {
            r.last_checkpoint_at = Some(at);
        }
    }

    fn finish(&mut self, task: &str, now: Time) {
        let busy = self.busy.remove(task);
        if let Some(req) = self.snap.end_run(task, now, busy, &self.policy) {
            if let Some((start, before)) = self.runs.remove(task) {
                self.history.record(&req.user, before + (now - start));
            }
        }
    }

    fn cycle(&mut self, now: Time) -> Round {
        // Accounting up to now, exactly as the server's cycle does it.
        let busy = &self.busy;
        self.snap
            .charge(now, |t| busy.get(t).copied(), &self.policy);
        let d = self.sched.schedule(self.snap.state(), now);
        let mut round = Round::default();
        for dec in d.decisions {
            match dec {
                Decision::Preempt { task, .. } => {
                    if let Some(r) = self.snap.running_mut().find(|r| r.request.id == task) {
                        r.preempting = true;
                        round.preempted.push(task);
                    }
                }
                Decision::Place {
                    task, placements, ..
                } => round.placed.push((task, placements)),
                Decision::Resize { task, .. } => {
                    if let Some(r) = self.snap.running_mut().find(|r| r.request.id == task) {
                        r.preempting = true;
                        round.resized.push(task);
                    }
                }
                Decision::Migrate { .. } => {}
            }
        }
        for (task, _) in &round.placed {
            let before = self.runs.get(task).map_or(0, |r| r.1);
            self.runs.insert(task.clone(), (now, before));
        }
        self.snap.place(round.placed.clone(), now);
        round
    }

    fn stopped(&mut self, task: &str, at: Time) {
        if let Some((start, before)) = self.runs.get_mut(task) {
            *before += at - *start;
        }
        let busy = self.busy.remove(task);
        if let Some(req) = self.snap.end_run(task, at, busy, &self.policy) {
            self.snap.add_pending(req);
        }
    }

    fn utilization(&mut self, task: &str, util: f64) {
        self.busy.insert(task.to_owned(), util);
    }

    fn estimates(&mut self, now: Time) -> BTreeMap<TaskId, Time> {
        let history = &self.history;
        estimate_starts(
            &self.snap,
            now,
            &self.policy,
            &|r| history.estimate(r),
            FORECAST_STEPS,
            &mut || true,
        )
    }
}

/// How far the forward run looks, in moments when runs end.
pub const FORECAST_STEPS: usize = 256;

/// The simulated cluster: `cfg.nodes` nodes named `n0000`, `n0001`, ... in one zone.
pub fn nodes(cfg: &JobsConfig) -> Vec<Node> {
    let hw = &cfg.hardware;
    (0..cfg.nodes)
        .map(|i| Node {
            id: node_name(i),
            zone: String::new(),
            labels: Default::default(),
            cpu_millis: hw.node_cpu_millis,
            mem_bytes: hw.node_mem_bytes,
            gpus: (0..cfg.gpus_per_node)
                .map(|g| Gpu {
                    index: g,
                    gpu_type: hw.gpu_type.clone(),
                    mem_bytes: hw.gpu_mem_bytes,
                    util: 1.0,
                })
                .collect(),
            schedulable: true,
            taints: vec![],
            features: vec![],
            own_network: false,
        })
        .collect()
}

pub fn node_name(i: u32) -> String {
    format!("n{i:04}")
}

/// How a job asks for its GPUs: (GPUs per worker, workers, fewest workers when elastic).
/// As traced: whole nodes' worth of GPUs per worker when it needs more than one node,
/// otherwise one worker. With [`JobsConfig::elastic`]: a multi-GPU job is a gang of one-GPU
/// workers.
pub fn shape(job: &Job, cfg: &JobsConfig) -> (u32, u32, Option<u32>) {
    let gpn = cfg.gpus_per_node;
    match cfg.elastic {
        Some(f) if job.gpus > 1 => {
            let min = (f64::from(job.gpus) * f.clamp(0.0, 1.0)).ceil().max(1.0) as u32;
            (1, job.gpus, (min < job.gpus).then_some(min))
        }
        _ if job.gpus <= gpn => (job.gpus, 1, None),
        _ => (gpn, job.gpus.div_ceil(gpn), None),
    }
}

/// The request a job makes (see [`shape`]).
pub fn request(job: &Job, id: TaskId, cfg: &JobsConfig) -> TaskRequest {
    let (gpus_per_worker, workers, min_workers) = shape(job, cfg);
    TaskRequest {
        id,
        user: job.user.clone(),
        tenant: String::new(),
        gpu_types: Vec::new(),
        gpus_per_worker,
        workers,
        min_workers,
        gpu_mem_bytes: None,
        cpu_millis: cfg.hardware.job_cpu_millis,
        mem_bytes: cfg.hardware.job_mem_bytes,
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
    if cfg.policy == JobPolicy::SrtfOracle {
        let (order, _) = admitted(jobs, cfg);
        let mut oracle = crate::sim::oracle::Clairvoyant::new(jobs, &order, cfg);
        return replay(jobs, cfg, &mut oracle).report;
    }
    replay(jobs, cfg, &mut InProcess::new(cfg)).report
}

/// The jobs the world submits, in submission order (task id `k` is job `order[k]`), and how
/// many it refuses because they need more nodes than the cluster has.
pub fn admitted(jobs: &[Job], cfg: &JobsConfig) -> (Vec<usize>, usize) {
    let gpn = cfg.gpus_per_node;
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&i| (jobs[i].submit, i));
    let before = order.len();
    order.retain(|&i| jobs[i].gpus.div_ceil(gpn) <= cfg.nodes);
    let rejected = before - order.len();
    (order, rejected)
}

/// Runs the trace's world with `decider` deciding; the log holds every decision.
pub fn replay(jobs: &[Job], cfg: &JobsConfig, decider: &mut dyn Decider) -> Replay {
    let policy = cfg.policy_config();
    let user_util = cfg.util_seed.map(|seed| user_utilization(jobs, seed));
    let gpn = cfg.gpus_per_node;
    let capacity = u64::from(cfg.nodes * gpn);
    let (order, rejected) = admitted(jobs, cfg);
    // Task ids are positions in `order`; their width keeps them sorted as numbers.
    let width = order.len().to_string().len();
    let id_of = |seq: usize| format!("{seq:0width$}");
    let seq_of = |id: &str| -> usize { id.parse().expect("a task id the world gave") };

    let mut st = vec![JobState::default(); order.len()];
    let mut log: Vec<Decided> = Vec::new();
    let mut running: Vec<usize> = Vec::new();
    let mut waiting = 0usize;
    let mut used_gpus = 0u64;
    let mut completions: BinaryHeap<Reverse<(Time, usize, u32)>> = BinaryHeap::new();
    // Runs told to stop, by when they stop.
    let mut stops: BinaryHeap<Reverse<(Time, usize, u32)>> = BinaryHeap::new();
    let mut next_arrival = 0usize;
    let mut preemptions = 0u64;
    let (mut resizes, mut narrow_starts, mut resize_stops) = (0u64, 0u64, 0u64);
    let mut cycles = 0u64;
    let mut now: Time = 0;
    let mut last_cycle: Time = 0;
    let skippable =
        !policy.preemption && matches!(policy.backfill, Backfill::None | Backfill::FirstFit);
    let (mut freed, mut blocked_after_last, mut min_new) = (false, false, None::<u32>);
    // Per task: the start predicted at arrival (None: beyond the horizon), and the first start.
    let mut predicted: Vec<Option<Option<Time>>> = vec![None; order.len()];
    let mut first_start: Vec<Option<Time>> = vec![None; order.len()];
    let mut arrived_now: Vec<usize> = Vec::new();

    loop {
        // Next event: arrival, completion, or a tick while jobs wait.
        let na = order.get(next_arrival).map(|&i| jobs[i].submit);
        let nc = completions.peek().map(|Reverse((t, _, _))| *t);
        let ns = stops.peek().map(|Reverse((t, _, _))| *t);
        // With nobody waiting, cycles still run while an elastic job runs narrower than it
        // asked and GPUs are idle: it may grow into them.
        let may_grow = waiting == 0
            && used_gpus < capacity
            && running
                .iter()
                .any(|&s| st[s].allocated < st[s].full && st[s].stopping.is_none());
        let nt = (waiting > 0 || may_grow).then_some(last_cycle + cfg.tick_s);
        let Some(t) = [na, nc, ns, nt].into_iter().flatten().min() else {
            break;
        };
        now = now.max(t);
        if policy.preemption {
            // Checkpoints saved since the last event come first: they happened earlier.
            let mut saved: Vec<(Time, usize)> = running
                .iter()
                .filter_map(|&s| {
                    let at = last_checkpoint(&st[s], now, cfg.checkpoint_s)?;
                    (st[s].reported_checkpoint != Some(at)).then_some((at, s))
                })
                .collect();
            saved.sort_unstable();
            for (at, s) in saved {
                st[s].reported_checkpoint = Some(at);
                decider.checkpoint(&id_of(s), at);
            }
        }
        let mut changed = false;
        while let Some(&Reverse((t, s, attempt))) = completions.peek() {
            if t > now {
                break;
            }
            completions.pop();
            if st[s].attempt != attempt || st[s].run_start.is_none() {
                continue;
            }
            used_gpus -= st[s].allocated;
            finish_run(&mut st[s], now);
            running.retain(|&r| r != s);
            st[s].finish = Some(now);
            decider.finish(&id_of(s), now);
            changed = true;
            freed = true;
        }
        // Runs told to stop stop now (unless they finished first).
        while let Some(&Reverse((t, s, attempt))) = stops.peek() {
            if t > now {
                break;
            }
            stops.pop();
            if st[s].attempt != attempt || st[s].run_start.is_none() {
                continue;
            }
            used_gpus -= st[s].allocated;
            preempt(&mut st[s], t, cfg.checkpoint_s);
            running.retain(|&x| x != s);
            waiting += 1;
            decider.stopped(&id_of(s), t);
            changed = true;
            freed = true;
        }
        while let Some(&j) = order.get(next_arrival) {
            if jobs[j].submit > now {
                break;
            }
            decider.submit(request(&jobs[j], id_of(next_arrival), cfg), now);
            arrived_now.push(next_arrival);
            next_arrival += 1;
            waiting += 1;
            changed = true;
            min_new = Some(min_new.map_or(jobs[j].gpus, |m: u32| m.min(jobs[j].gpus)));
        }
        let tick = nt.is_some_and(|x| x <= now);
        if !(changed || tick) || (waiting == 0 && !may_grow) {
            continue;
        }
        // Without preemption, and with an order-independent backfill, a cycle can only start
        // something if GPUs were freed since the last one, or if a newly arrived job fits in
        // what is free: everything older already failed on at least this much room. Skipping
        // the other cycles changes no decision and keeps long queues cheap to simulate.
        if skippable && !freed && blocked_after_last {
            let free = capacity.saturating_sub(used_gpus);
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
        for round in 0..4u32 {
            cycles += 1;
            last_cycle = now;
            let r = decider.cycle(now);
            let mut decided: Vec<Decided> = Vec::new();
            let stops_now = r.preempted.iter().map(|t| (t, false));
            for (task, resize) in stops_now.chain(r.resized.iter().map(|t| (t, true))) {
                let s = seq_of(task);
                if st[s].run_start.is_none() || st[s].stopping.is_some() {
                    continue;
                }
                if resize {
                    resize_stops += 1;
                } else {
                    preemptions += 1;
                }
                st[s].resizing = resize;
                if policy.grace_s > 0 {
                    // It checkpoints and stops within the grace period, holding its GPUs.
                    let at = now + policy.grace_s;
                    st[s].stopping = Some(at);
                    stops.push(Reverse((at, s, st[s].attempt)));
                } else {
                    used_gpus -= st[s].allocated;
                    preempt(&mut st[s], now, cfg.checkpoint_s);
                    running.retain(|&x| x != s);
                    waiting += 1;
                    decider.stopped(task, now);
                }
                decided.push(Decided {
                    at: now,
                    round,
                    task: task.clone(),
                    what: if resize {
                        Action::Resize
                    } else {
                        Action::Preempt
                    },
                });
            }
            for (task, placements) in &r.placed {
                let s = seq_of(task);
                let j = order[s];
                first_start[s].get_or_insert(now);
                let st = &mut st[s];
                st.run_start = Some(now);
                st.overhead = if st.attempt > 0 { cfg.restart_s } else { 0 };
                st.attempt += 1;
                st.allocated = placements.iter().map(|w| w.gpu_indices.len() as u64).sum();
                let (per_worker, workers, _) = shape(&jobs[j], cfg);
                st.full = u64::from(per_worker) * u64::from(workers);
                if st.last_width.is_some_and(|w| w != st.allocated) {
                    resizes += 1;
                }
                if st.allocated < st.full {
                    narrow_starts += 1;
                }
                st.last_width = Some(st.allocated);
                st.reported_checkpoint = None;
                st.stopping = None;
                st.restarted_resizing = std::mem::take(&mut st.resizing);
                used_gpus += st.allocated;
                running.push(s);
                waiting -= 1;
                if let Some(u) = user_util.as_ref().and_then(|m| m.get(&jobs[j].user)) {
                    decider.utilization(task, *u);
                }
                let work = jobs[j].runtime.saturating_sub(st.ckpt_progress);
                let remaining = wall_time(st, work) + st.overhead;
                completions.push(Reverse((now + remaining, s, st.attempt)));
                decided.push(Decided {
                    at: now,
                    round,
                    task: task.clone(),
                    what: Action::Place(placements_sorted(placements)),
                });
            }
            // Within a cycle, decisions are a set: the log keeps them in one order.
            decided.sort();
            log.extend(decided);
            // Only GPUs freed at once are worth another cycle now.
            if (r.preempted.is_empty() && r.resized.is_empty()) || policy.grace_s > 0 {
                break;
            }
            freed = true;
        }
        blocked_after_last = waiting > 0;
        if cfg.forecast {
            let waited: Vec<usize> = arrived_now
                .drain(..)
                .filter(|&s| first_start[s].is_none())
                .collect();
            if !waited.is_empty() {
                let est = decider.estimates(now);
                for s in waited {
                    predicted[s] = Some(est.get(&id_of(s)).copied());
                }
            }
        }
        arrived_now.clear();
        if running.is_empty()
            && completions.is_empty()
            && stops.is_empty()
            && next_arrival == order.len()
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
    let mut wasted_gpu_s = 0.0;
    let mut wasted_resizing_gpu_s = 0.0;
    let first_submit = order.iter().map(|&i| jobs[i].submit).min().unwrap_or(0);
    let mut last_finish = first_submit;
    for (s, &i) in order.iter().enumerate() {
        let st = &st[s];
        let Some(f) = st.finish else { continue };
        let c = (f - jobs[i].submit) as f64;
        jct.push(c);
        wait.push(c - st.ran as f64);
        alloc_gpu_s += st.attained;
        wasted_gpu_s += st.wasted;
        wasted_resizing_gpu_s += st.wasted_resizing;
        last_finish = last_finish.max(f);
        let e = per_user.entry(jobs[i].user.as_str()).or_default();
        e.0 += c / (jobs[i].runtime.max(60) as f64);
        e.1 += 1;
    }
    let util_bands = user_util.as_ref().map_or_else(Vec::new, |m| {
        UTIL_BANDS
            .iter()
            .map(|&(from, to)| {
                let in_band: Vec<f64> = order
                    .iter()
                    .enumerate()
                    .filter_map(|(s, &i)| {
                        let u = m.get(&jobs[i].user).copied()?;
                        let inside = u >= from && (u < to || (to >= 1.0 && u <= 1.0));
                        Some((st[s].finish? - jobs[i].submit) as f64).filter(|_| inside)
                    })
                    .collect();
                UtilBand {
                    from,
                    to,
                    jobs: in_band.len(),
                    avg_jct: mean(&in_band),
                }
            })
            .collect()
    });
    let forecast = cfg.forecast.then(|| {
        let mut abs = Vec::new();
        let mut rel = Vec::new();
        let mut waits = Vec::new();
        let (mut beyond, mut at_once) = (0, 0);
        for s in 0..order.len() {
            let Some(start) = first_start[s] else {
                continue;
            };
            let submit = jobs[order[s]].submit;
            match predicted[s] {
                None => at_once += 1,
                Some(None) => beyond += 1,
                Some(Some(p)) => {
                    let e = (p as f64 - start as f64).abs();
                    let wait = (start - submit) as f64;
                    abs.push(e);
                    rel.push(e / wait.max(1.0));
                    waits.push(wait);
                }
            }
        }
        ForecastAccuracy {
            predicted: abs.len(),
            beyond_horizon: beyond,
            started_at_once: at_once,
            median_abs_error_s: percentile(&mut abs.clone(), 50.0),
            p90_abs_error_s: percentile(&mut abs, 90.0),
            median_rel_error: percentile(&mut rel, 50.0),
            mean_wait_s: mean(&waits),
        }
    });
    let means: Vec<f64> = per_user.values().map(|(s, n)| s / *n as f64).collect();
    let sum: f64 = means.iter().sum();
    let sq: f64 = means.iter().map(|x| x * x).sum();
    let makespan = last_finish - first_submit;
    let report = JobsReport {
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
        wasted_gpu_s,
        resizes,
        narrow_starts,
        resize_stops,
        wasted_resizing_gpu_s,
        allocated_gpu_s: alloc_gpu_s,
        jain_slowdown: if sq > 0.0 {
            sum * sum / (means.len() as f64 * sq)
        } else {
            1.0
        },
        worst_user_slowdown: means.iter().copied().fold(0.0, f64::max),
        cycles,
        util_bands,
        forecast,
    };
    Replay { report, log }
}

fn placements_sorted(p: &[WorkerPlacement]) -> Vec<(String, Vec<u32>)> {
    let mut v: Vec<(String, Vec<u32>)> = p
        .iter()
        .map(|w| {
            let mut g = w.gpu_indices.clone();
            g.sort_unstable();
            (w.node.clone(), g)
        })
        .collect();
    v.sort();
    v
}

fn finish_run(s: &mut JobState, now: Time) {
    let start = s.run_start.take().expect("running");
    let d = now - start;
    s.ran += d;
    s.attained += d as f64 * s.allocated as f64;
    // A restart after a preemption does no work.
    let restart = d.min(s.overhead) as f64 * s.allocated as f64;
    s.wasted += restart;
    if s.restarted_resizing {
        s.wasted_resizing += restart;
    }
}

fn preempt(s: &mut JobState, now: Time, ckpt: u64) {
    let start = s.run_start.expect("running");
    let progress = s.ckpt_progress + work_done(s, (now - start).saturating_sub(s.overhead));
    finish_run(s, now);
    let kept = s.ckpt_progress.max(progress / ckpt * ckpt);
    // Work past the last checkpoint is done again: at full width it costs every GPU of the
    // job for as long, at any width the same GPU-seconds (the speed is linear in them).
    let lost = (progress - kept) as f64 * s.full.max(s.allocated) as f64;
    s.wasted += lost;
    if s.resizing {
        s.wasted_resizing += lost;
    }
    s.ckpt_progress = kept;
}

/// Work (seconds at full width) a run of `s` does in `d` seconds of running. The speed-up
/// model: linear in the GPUs held, a run with `held` of its job's `full` GPUs goes at
/// `held / full` of full speed. Data-parallel training with a fixed global batch scales close
/// to linearly over the widths an elastic job spans (at most a factor of two with the
/// half-width minimum measured here); what a change of width costs is paid apart, as a
/// restart ([`JobsConfig::restart_s`]) and the work since the last checkpoint.
fn work_done(s: &JobState, d: u64) -> u64 {
    if s.allocated >= s.full {
        d
    } else {
        (u128::from(d) * u128::from(s.allocated) / u128::from(s.full)) as u64
    }
}

/// Seconds of running the current run of `s` takes to do `work` (the inverse of
/// [`work_done`], rounded up).
fn wall_time(s: &JobState, work: u64) -> u64 {
    if s.allocated >= s.full || s.allocated == 0 {
        work
    } else {
        (u128::from(work) * u128::from(s.full)).div_ceil(u128::from(s.allocated)) as u64
    }
}

/// Wall time of the latest checkpoint in the current run, if it has reached one. Checkpoints
/// come every `ckpt` seconds of work (a number of steps), so a narrower run saves less often.
fn last_checkpoint(s: &JobState, now: Time, ckpt: u64) -> Option<Time> {
    let start = s.run_start?;
    let progress = s.ckpt_progress + work_done(s, (now - start).saturating_sub(s.overhead));
    let k = progress / ckpt * ckpt;
    (k > s.ckpt_progress).then(|| start + s.overhead + wall_time(s, k - s.ckpt_progress))
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
