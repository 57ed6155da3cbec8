//! Runs charged to fair share, GPU samples and standings.

use autodl_common::tasks::{TaskSpec, WorkerPlacement};

use super::JsonText;

/// A run that ended before it was charged up to its end.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct UnsettledRunRecord {
    pub task_id: String,
    pub number: i64,
    pub user_id: String,
    pub tenant_id: String,
    /// The task's spec (its GPU memory decides the share of a shared card).
    #[sqlx(try_from = "String")]
    pub spec: JsonText<TaskSpec>,
    #[sqlx(try_from = "String")]
    pub placement: JsonText<Vec<WorkerPlacement>>,
    pub started_at: i64,
    pub ended_at: i64,
    pub charged_until: Option<i64>,
    pub gpu_seconds: f64,
}

/// A charge the scheduler made to one run, to be kept only if the run was still as it read
/// it (`from`: what it had been charged up to).
#[derive(Debug, Clone)]
pub struct RunChargeRecord {
    pub task_id: String,
    pub number: i64,
    pub from: i64,
    pub charged_until: i64,
    /// The run's total after this charge, and what this charge added.
    pub gpu_seconds: f64,
    pub added: f64,
    /// The run had ended: this charge settles it and its service joins the task's.
    pub settles: bool,
}

/// A run's GPU samples in brief, for judging whether it sits idle (clock milliseconds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuActivity {
    pub first: Option<i64>,
    pub last: Option<i64>,
    pub last_busy: Option<i64>,
}

/// Which of a task's samples [`GpuActivity`] sums up: those since `from`, and busy at or
/// above `busy` (0..1).
#[derive(Debug, Clone)]
pub struct ActivityAsk {
    pub task_id: String,
    pub from: i64,
    pub busy: f64,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct UsageRecord {
    pub scope: String,
    pub subject_id: String,
    pub decayed_gpu_seconds: f64,
    pub updated_at: i64,
    pub window_alloc_gpu_seconds: f64,
    pub window_busy_gpu_seconds: f64,
    /// "YYYY-MM" of `month_gpu_seconds`.
    pub month: String,
    pub month_gpu_seconds: f64,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct GpuSampleRecord {
    pub node_id: String,
    pub gpu_index: i64,
    pub at: i64,
    pub util: f64,
    pub mem_used: i64,
    pub mem_total: i64,
    pub temperature: Option<f64>,
    pub power_w: Option<f64>,
    pub task_id: Option<String>,
}

/// A person's fair-share and utilization factors at one moment (see `standings`).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct StandingRecord {
    pub user_id: String,
    pub tenant_id: String,
    pub at: i64,
    pub fair_share: f64,
    pub utilization: f64,
}
