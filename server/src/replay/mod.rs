//! Proof that the live server runs the policy as the simulator measures it: a job trace is
//! replayed through a real server (its store, scheduler runner and agent protocol, with
//! simulated agents and a manual clock) and through the simulator, on the same world (arrivals,
//! true run times, checkpoints, restarts), and the two decision logs are compared.
//!
//! The world is the simulator's ([`jobs::replay`]); only who decides differs. Here the
//! decider is the server: jobs are submitted over the API by their users, every cycle is the
//! runner's own, and placements and stop orders reach the simulated agents through their
//! polls, which report starts, checkpoints and ends back as real agents do.

use std::path::Path;

use autodl_scheduler::sim::jobs::{self, Decided, Job, JobsConfig, Replay};

use crate::clock::{Clock, SystemClock};

mod live;

use live::LiveCluster;

/// What the simulated nodes have and the jobs ask for, beside whole GPUs: real enough for the
/// server's validation (a task asks for some CPU and memory), never binding.
pub fn hardware() -> jobs::Hardware {
    jobs::Hardware {
        gpu_type: "A100-80G".into(),
        gpu_mem_bytes: 80 << 30,
        node_cpu_millis: 128_000,
        node_mem_bytes: 1 << 40,
        job_cpu_millis: 1_000,
        job_mem_bytes: 1 << 30,
    }
}

/// Both runs of one trace.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// Jobs submitted (those that fit the cluster).
    pub tasks: usize,
    pub simulated: Replay,
    pub live: Replay,
    /// Decisions (placements and preemptions) that are the same in both logs, position by
    /// position, up to the first difference.
    pub agreeing: usize,
    /// The first decision that differs: (simulator's, server's); `None` when the logs are equal.
    pub first_difference: Option<(Option<Decided>, Option<Decided>)>,
}

impl Comparison {
    pub fn identical(&self) -> bool {
        self.first_difference.is_none()
    }
}

/// Replays `jobs` through a fresh server on `database_url` (an empty database) and through the
/// simulator, and compares. `dir` holds the server's object storage and scratch files.
///
/// Must run on a multi-threaded runtime: the world runs on a blocking thread and waits for the
/// server's answers.
pub async fn compare(
    jobs_in: &[Job],
    cfg: &JobsConfig,
    database_url: &str,
    dir: &Path,
) -> anyhow::Result<Comparison> {
    // Both sides see the trace at the same absolute times, starting at the manual clock's start
    // (accounting keeps months; the server's own records want plausible dates).
    let start = SystemClock.now_ms() / 1000;
    let first = jobs_in.iter().map(|j| j.submit).min().unwrap_or(0);
    let shifted: Vec<Job> = jobs_in
        .iter()
        .map(|j| Job {
            submit: j.submit - first + start as u64,
            ..j.clone()
        })
        .collect();
    let simulated = {
        let (jobs, cfg) = (shifted.clone(), cfg.clone());
        tokio::task::spawn_blocking(move || {
            jobs::replay(&jobs, &cfg, &mut jobs::InProcess::new(&cfg))
        })
        .await?
    };
    let mut live = LiveCluster::start(&shifted, cfg, database_url, dir, start * 1000).await?;
    let live_result = {
        let (jobs, cfg) = (shifted.clone(), cfg.clone());
        tokio::task::spawn_blocking(move || {
            let replay = jobs::replay(&jobs, &cfg, &mut live);
            (replay, live)
        })
        .await?
    };
    let (live_replay, live) = live_result;
    live.server.stop(false).await;
    if let Some(e) = live.error {
        return Err(e.context("the live server failed during the replay"));
    }
    let agreeing = simulated
        .log
        .iter()
        .zip(&live_replay.log)
        .take_while(|(a, b)| a == b)
        .count();
    let first_difference = (agreeing < simulated.log.len().max(live_replay.log.len())).then(|| {
        (
            simulated.log.get(agreeing).cloned(),
            live_replay.log.get(agreeing).cloned(),
        )
    });
    Ok(Comparison {
        tasks: live.ids.len(),
        simulated,
        live: live_replay,
        agreeing,
        first_difference,
    })
}
