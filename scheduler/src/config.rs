//! Policy knobs. Every weight and time constant is here so operators can tune without code
//! changes; the defaults are what `autodl` ships with and what the simulator's `autodl` policy runs.

use crate::placement::PlacementPolicy;
use serde::{Deserialize, Serialize};

/// Weights of the priority factors. Only their ratios matter: the total is normalised by their
/// sum so that it, and the preemption margin, stay in [0, 1].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Weights {
    pub fair_share: f64,
    pub utilization: f64,
    pub deadline: f64,
    pub declared: f64,
    pub age: f64,
    pub gpu_fit: f64,
    /// Least attained service: tasks that have had little GPU time so far go first. Most jobs
    /// are short and their length is unknown up front, so this approximates shortest-job-first
    /// without trusting estimates.
    pub service: f64,
}

impl Default for Weights {
    fn default() -> Self {
        Weights {
            fair_share: 1.0,
            utilization: 0.5,
            deadline: 1.0,
            declared: 0.5,
            age: 0.5,
            gpu_fit: 0.1,
            service: 2.0,
        }
    }
}

impl Weights {
    pub fn sum(&self) -> f64 {
        self.fair_share
            + self.utilization
            + self.deadline
            + self.declared
            + self.age
            + self.gpu_fit
            + self.service
    }
}

/// How lower-priority tasks may start while a higher-priority one is blocked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backfill {
    /// Strict order: nothing starts behind a blocked task.
    None,
    /// Anything that fits starts; a large task can wait forever behind a stream of small ones.
    FirstFit,
    /// The top blocked tasks hold the nodes they will use; others fill the rest of the cluster.
    Reserve,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PolicyConfig {
    pub weights: Weights,
    /// Half-life of the decayed usage behind fair-share.
    pub usage_half_life_s: f64,
    /// Window over which GPU utilisation is judged; the caller keeps the ledger's window sums
    /// over this span.
    pub util_window_s: u64,
    /// A running run is charged once this long has passed since its last charge (an ended run
    /// at once). Usage decays over days, so ten seconds late changes no priority that
    /// matters, while charging every run every second was one row written per running task
    /// per second: the largest write of a busy cluster's cycle.
    pub charge_every_s: u64,
    /// GPU-seconds of allocation before measured utilisation counts fully; smooths new users.
    pub util_prior_gpu_s: f64,
    /// Wait after which the age factor is 1.
    pub max_age_s: f64,
    /// Attained GPU-seconds at which the service factor is one half.
    pub service_scale_gpu_s: f64,
    /// Run time assumed for deadline urgency when the task gives no estimate.
    pub default_runtime_s: u64,
    pub placement: PlacementPolicy,
    /// Memory added to every shared task's declared GPU memory (CUDA context, allocator slack).
    pub share_margin_bytes: u64,
    pub backfill: Backfill,
    /// How many blocked tasks may hold reservations (or preempt) per cycle.
    pub reservations: usize,
    pub preemption: bool,
    /// A task preempts only tasks whose total priority is lower by more than this.
    pub preempt_margin: f64,
    /// No task is preempted before it ran this long, so every start makes progress.
    pub min_runtime_s: u64,
    /// Time a victim gets to checkpoint before it is killed.
    pub grace_s: u64,
    pub max_preemptions_per_cycle: usize,
    /// Blocked tasks that may look for victims per cycle, highest priority first. An attempt
    /// weighs every running task on every node; on a full cluster with thousands of blocked
    /// tasks of their own shapes, unbounded attempts took most of a cycle.
    pub max_preemption_attempts_per_cycle: usize,
    /// Only tasks that saved a checkpoint (or started) at most this long ago are preempted:
    /// everything since the checkpoint is lost, so a victim that just checkpointed is cheap
    /// and one an hour past its checkpoint is not worth it.
    pub victim_max_unsaved_s: u64,
    /// Move shared low-priority tasks to other GPUs when that frees a card for a blocked task.
    pub migration: bool,
    /// Blocked tasks that may try migration per cycle, highest priority first. An attempt
    /// looks at every node with movable tasks and places the tasks it would move, so unbounded
    /// attempts make a busy cycle quadratic (4,000 blocked tasks of their own shapes beside
    /// 20,000 running shared ones took over a minute); moves are disruptive anyway.
    pub max_migration_attempts_per_cycle: usize,
    /// Let running elastic tasks grow into GPUs that no waiting task can use.
    pub elastic_growth: bool,
    /// No elastic task changes width (grows) within this long of its last start: a change
    /// costs a restart, so a task that just started or changed keeps its width a while.
    pub resize_interval_s: u64,
    /// What the policy counts a restart as costing, in seconds of the task's progress (start
    /// up, loading the checkpoint), on top of the work since its last checkpoint. A growth
    /// happens only when it is expected to save at least twice that.
    pub resize_cost_s: u64,
    /// Produce a priority breakdown and reason for every pending task. The simulator turns it
    /// off for speed; the server wants it on.
    pub explain_pending: bool,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            weights: Weights::default(),
            usage_half_life_s: 7.0 * 86_400.0,
            util_window_s: 86_400,
            charge_every_s: 10,
            util_prior_gpu_s: 3_600.0,
            max_age_s: 86_400.0,
            service_scale_gpu_s: 4.0 * 3_600.0,
            default_runtime_s: 3_600,
            placement: PlacementPolicy::Autodl,
            share_margin_bytes: 1 << 30,
            backfill: Backfill::Reserve,
            reservations: 1,
            preemption: true,
            preempt_margin: 0.1,
            min_runtime_s: 600,
            grace_s: 120,
            max_preemptions_per_cycle: 16,
            max_preemption_attempts_per_cycle: 64,
            victim_max_unsaved_s: 600,
            migration: true,
            max_migration_attempts_per_cycle: 16,
            elastic_growth: true,
            resize_interval_s: 1_800,
            resize_cost_s: 60,
            explain_pending: true,
        }
    }
}

impl PolicyConfig {
    /// Strict first-in first-out, the baseline of the job benchmark.
    pub fn fifo() -> Self {
        PolicyConfig {
            weights: Weights {
                fair_share: 0.0,
                utilization: 0.0,
                deadline: 0.0,
                declared: 0.0,
                age: 1.0,
                gpu_fit: 0.0,
                service: 0.0,
            },
            max_age_s: f64::INFINITY,
            placement: PlacementPolicy::BestFit,
            backfill: Backfill::None,
            reservations: 0,
            preemption: false,
            migration: false,
            ..PolicyConfig::default()
        }
    }

    /// FIFO order, but anything that fits starts.
    pub fn fifo_backfill() -> Self {
        PolicyConfig {
            backfill: Backfill::FirstFit,
            ..PolicyConfig::fifo()
        }
    }

    /// Slurm's multifactor priority as most clusters run it: age and fair-share from usage with
    /// a 7-day half-life (Slurm's weights 1000 : 10000 over a 7-day max age), with backfill.
    /// Slurm backfills around the top job's reservation using time limits; with no run times
    /// known a reservation can only hold nodes idle (measured: about twice the average JCT on
    /// Helios), so the baseline backfills first-fit, the stronger of the two.
    pub fn multifactor() -> Self {
        PolicyConfig {
            weights: Weights {
                fair_share: 10.0,
                utilization: 0.0,
                deadline: 0.0,
                declared: 0.0,
                age: 1.0,
                gpu_fit: 0.0,
                service: 0.0,
            },
            max_age_s: 7.0 * 86_400.0,
            placement: PlacementPolicy::BestFit,
            backfill: Backfill::FirstFit,
            reservations: 1,
            preemption: false,
            migration: false,
            ..PolicyConfig::default()
        }
    }
}
