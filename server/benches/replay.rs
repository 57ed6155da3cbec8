//! Live equals simulated on a bigger trace: replays it through a real server (store, runner,
//! agent protocol with simulated agents, manual clock) and through the simulator, and reports
//! how many decisions agree and the average JCT both ways.
//!
//!   cargo bench -p autodl-server --bench replay
//!
//! A synthetic trace by default (`AUTODL_BENCH_JOBS` jobs, default 400, of 8 users); or the
//! first `AUTODL_BENCH_JOBS` jobs of a Helios CSV named by `AUTODL_BENCH_TRACE`. The cluster
//! is `AUTODL_BENCH_NODES` nodes (default 4) of 8 GPUs. SQLite, or PostgreSQL with
//! `AUTODL_BENCH_PG_URL`.

use std::time::Instant;

use autodl_scheduler::sim::jobs::{self, Action, JobPolicy, JobsConfig};
use autodl_server::replay;

mod support;
use support::env_num;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n = env_num("AUTODL_BENCH_JOBS", 400) as usize;
    let (source, mut trace) = match std::env::var("AUTODL_BENCH_TRACE") {
        Ok(path) => (
            path.clone(),
            jobs::read_helios(
                std::fs::File::open(&path).map_err(|e| anyhow::anyhow!("reading {path}: {e}"))?,
            )?,
        ),
        Err(_) => ("synthetic".to_owned(), jobs::synthetic(n, 8, 42)),
    };
    trace.sort_by_key(|j| j.submit);
    trace.truncate(n);
    let cfg = JobsConfig {
        nodes: env_num("AUTODL_BENCH_NODES", 4) as u32,
        gpus_per_node: 8,
        policy: JobPolicy::Autodl,
        hardware: replay::hardware(),
        ..JobsConfig::default()
    };
    let dir = tempfile::tempdir()?;
    let (backend, db) = support::database(dir.path()).await?;
    let started = Instant::now();
    let c = replay::compare(&trace, &cfg, &db, dir.path()).await?;
    let count = |log: &[jobs::Decided], preempt: bool| {
        log.iter()
            .filter(|d| (d.what == Action::Preempt) == preempt)
            .count()
    };
    println!(
        "replay of {} tasks ({source}, {} x {} GPUs, {} backend) in {:.1} s",
        c.tasks,
        cfg.nodes,
        cfg.gpus_per_node,
        backend,
        started.elapsed().as_secs_f64()
    );
    println!(
        "decisions: simulator {} ({} placements, {} preemptions), server {} ({} placements, {} preemptions); {} agree in order{}",
        c.simulated.log.len(),
        count(&c.simulated.log, false),
        count(&c.simulated.log, true),
        c.live.log.len(),
        count(&c.live.log, false),
        count(&c.live.log, true),
        c.agreeing,
        if c.identical() { " (identical)" } else { "" }
    );
    if let Some((sim, live)) = &c.first_difference {
        println!("first difference: simulator {sim:?}, server {live:?}");
    }
    let jct = |r: &jobs::JobsReport| r.avg_jct;
    println!(
        "average JCT: simulator {:.1} s, server {:.1} s ({:+.3}%)",
        jct(&c.simulated.report),
        jct(&c.live.report),
        (jct(&c.live.report) / jct(&c.simulated.report) - 1.0) * 100.0
    );
    Ok(())
}
