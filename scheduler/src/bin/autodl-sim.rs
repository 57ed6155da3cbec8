//! `autodl-sim`: runs the scheduler's policy code on traces in virtual time.
//! See `scheduler/README.md` for the benchmarks these commands implement.

use anyhow::{bail, Context, Result};
use autodl_scheduler::sim::jobs::{self, JobPolicy, JobsConfig};
use autodl_scheduler::sim::{packing, parse_seeds};
use autodl_scheduler::PlacementPolicy;
use clap::{Parser, Subcommand, ValueEnum};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Parser)]
#[command(
    name = "autodl-sim",
    about = "Trace-driven simulator for the autodl scheduler"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// GPU-sharing packing on the Alibaba openb traces (benchmarks/packing.md).
    Packing {
        #[arg(long)]
        pods: PathBuf,
        #[arg(long)]
        nodes: PathBuf,
        /// Seeds, e.g. `42-51` or `1,2,3`.
        #[arg(long, default_value = "42-51")]
        seeds: String,
        /// random, bestfit, fgd, autodl, or `all`.
        #[arg(long, default_value = "autodl")]
        policy: String,
        #[arg(long)]
        json: bool,
    },
    /// Job queueing on Helios / ITP traces (benchmarks/fairshare.md).
    Jobs {
        /// A trace file, a comma-separated list of files, or a directory of `*.csv` files.
        #[arg(long)]
        trace: String,
        #[arg(long, value_enum, default_value_t = Format::Helios)]
        format: Format,
        #[arg(long, default_value_t = 80)]
        nodes: u32,
        #[arg(long, default_value_t = 8)]
        gpus_per_node: u32,
        /// fifo, fifo-backfill, multifactor, autodl, srtf-oracle, or `all`.
        #[arg(long, default_value = "autodl")]
        policy: String,
        /// Draw each user's GPU utilisation with this seed (Beta(2, 2), see the README) and
        /// report average JCT per utilisation band; autodl also runs without its utilisation
        /// factor, as `autodl-no-util`.
        #[arg(long)]
        util_seed: Option<u64>,
        /// Predict each job's start when it arrives and has to wait, and report how far off
        /// the predictions were.
        #[arg(long)]
        forecast: bool,
        /// Run every multi-GPU job as a gang of one-GPU workers that may start with as few as
        /// this fraction of them (0.5: half); 1.0 runs the same gangs rigid, for comparison.
        #[arg(long)]
        elastic: Option<f64>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Helios,
    Itp,
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Packing {
            pods,
            nodes,
            seeds,
            policy,
            json,
        } => {
            let node_list = packing::read_nodes(
                File::open(&nodes).with_context(|| format!("{}", nodes.display()))?,
            )?;
            let pod_list = packing::read_pods(
                File::open(&pods).with_context(|| format!("{}", pods.display()))?,
            )?;
            let seeds = parse_seeds(&seeds)?;
            let policies: Vec<PlacementPolicy> = if policy == "all" {
                vec![
                    PlacementPolicy::Random,
                    PlacementPolicy::BestFit,
                    PlacementPolicy::Fgd,
                    PlacementPolicy::Autodl,
                ]
            } else {
                vec![policy.parse().map_err(anyhow::Error::msg)?]
            };
            let mut reports = Vec::new();
            for p in policies {
                let t = Instant::now();
                let r = packing::run(&node_list, &pod_list, &seeds, p);
                eprintln!("{p:?}: {:.1} s", t.elapsed().as_secs_f64());
                reports.push(r);
            }
            if json {
                for r in &reports {
                    let v = serde_json::json!({
                        "policy": r.policy, "seeds": r.seeds, "alloc_100": r.alloc_100,
                        "alloc_130": r.alloc_130, "frag_130": r.frag_130,
                    });
                    println!("{v}");
                }
            } else {
                println!("trace: {}  seeds: {}", pods.display(), seeds.len());
                println!(
                    "{:<8} {:>10} {:>10} {:>10}",
                    "policy", "alloc@100", "alloc@130", "frag@130"
                );
                for r in &reports {
                    println!(
                        "{:<8} {:>10.2} {:>10.2} {:>10.2}",
                        format!("{:?}", r.policy).to_lowercase(),
                        r.alloc_100,
                        r.alloc_130,
                        r.frag_130
                    );
                }
                if policy == "all" {
                    let t = Instant::now();
                    let (a100, a130) = packing::offline(&node_list, &pod_list, &seeds);
                    eprintln!("offline: {:.1} s", t.elapsed().as_secs_f64());
                    println!(
                        "{:<8} {:>10.2} {:>10.2} {:>10}",
                        "offline*", a100, a130, "-"
                    );
                    println!("* a reference: sees every task in advance (see scheduler/README.md)");
                }
            }
        }
        Cmd::Jobs {
            trace,
            format,
            nodes,
            gpus_per_node,
            policy,
            util_seed,
            forecast,
            elastic,
            json,
        } => {
            let mut job_list = Vec::new();
            for path in trace_files(&trace)? {
                let f = File::open(&path).with_context(|| format!("{}", path.display()))?;
                match format {
                    Format::Helios => job_list.extend(jobs::read_helios(f)?),
                    Format::Itp => {
                        let name = path
                            .file_stem()
                            .map(|s| s.to_string_lossy().into_owned())
                            .unwrap_or_default();
                        job_list.extend(jobs::read_itp(f, &name)?);
                    }
                }
            }
            if job_list.is_empty() {
                bail!("no jobs with GPUs in {trace}");
            }
            let policies: Vec<JobPolicy> = if policy == "all" {
                vec![
                    JobPolicy::Fifo,
                    JobPolicy::FifoBackfill,
                    JobPolicy::Multifactor,
                    JobPolicy::Autodl,
                    JobPolicy::SrtfOracle,
                ]
            } else {
                vec![policy.parse().map_err(anyhow::Error::msg)?]
            };
            if !json {
                println!(
                    "trace: {trace}  jobs: {}  cluster: {nodes} x {gpus_per_node} GPUs",
                    job_list.len()
                );
                println!(
                    "{:<14} {:>9} {:>9} {:>10} {:>9} {:>10} {:>6} {:>9} {:>7} {:>6} {:>6} {:>8} {:>6}",
                    "policy",
                    "avg_jct",
                    "p50_jct",
                    "p99_jct",
                    "avg_wait",
                    "p99_wait",
                    "util",
                    "makespan",
                    "preempt",
                    "wasted",
                    "jain",
                    "worst_sd",
                    "secs"
                );
            }
            let mut runs: Vec<(String, JobsConfig)> = Vec::new();
            for p in policies {
                let cfg = JobsConfig {
                    nodes,
                    gpus_per_node,
                    policy: p,
                    util_seed,
                    forecast,
                    elastic,
                    ..JobsConfig::default()
                };
                runs.push((p.to_string(), cfg.clone()));
                if util_seed.is_some() && p == JobPolicy::Autodl {
                    let off = JobsConfig {
                        util_factor: false,
                        ..cfg
                    };
                    runs.push(("autodl-no-util".into(), off));
                }
            }
            let mut bands: Vec<(String, Vec<jobs::UtilBand>)> = Vec::new();
            for (name, cfg) in runs {
                let t = Instant::now();
                let r = jobs::run(&job_list, &cfg);
                let secs = t.elapsed().as_secs_f64();
                if json {
                    let v = serde_json::json!({
                        "policy": r.policy, "jobs": r.jobs, "avg_jct": r.avg_jct, "p50_jct": r.p50_jct,
                        "p99_jct": r.p99_jct, "avg_wait": r.avg_wait, "p99_wait": r.p99_wait,
                        "utilization": r.utilization, "makespan": r.makespan, "preemptions": r.preemptions,
                        "wasted_gpu_s": r.wasted_gpu_s, "allocated_gpu_s": r.allocated_gpu_s,
                        "jain_slowdown": r.jain_slowdown, "worst_user_slowdown": r.worst_user_slowdown,
                        "rejected": r.rejected, "resizes": r.resizes, "narrow_starts": r.narrow_starts, "resize_stops": r.resize_stops, "wasted_resizing_gpu_s": r.wasted_resizing_gpu_s, "sim_seconds": secs, "util_bands": r.util_bands, "forecast": r.forecast,
                        "name": name,
                    });
                    println!("{v}");
                } else {
                    println!(
                        "{:<14} {:>9.0} {:>9.0} {:>10.0} {:>9.0} {:>10.0} {:>6.3} {:>9} {:>7} {:>6.3} {:>6.3} {:>8.2} {:>6.1}",
                        name.clone(), r.avg_jct, r.p50_jct, r.p99_jct, r.avg_wait, r.p99_wait, r.utilization,
                        r.makespan, r.preemptions,
                        if r.allocated_gpu_s > 0.0 { r.wasted_gpu_s / r.allocated_gpu_s } else { 0.0 },
                        r.jain_slowdown, r.worst_user_slowdown, secs
                    );
                }
                if let (Some(f), false) = (&r.forecast, json) {
                    println!(
                        "  start forecast at arrival: {} waiting jobs predicted ({} beyond the horizon, {} started at once); abs error median {:.0} s, p90 {:.0} s; median error / wait {:.2}; mean wait {:.0} s",
                        f.predicted, f.beyond_horizon, f.started_at_once, f.median_abs_error_s,
                        f.p90_abs_error_s, f.median_rel_error, f.mean_wait_s
                    );
                }
                bands.push((name, r.util_bands));
            }
            if util_seed.is_some() && !json {
                println!("average JCT by the user's GPU utilisation (jobs in band):");
                for (name, b) in &bands {
                    let cells: Vec<String> = b
                        .iter()
                        .map(|b| {
                            format!("{:.2}-{:.2}: {:.0} ({})", b.from, b.to, b.avg_jct, b.jobs)
                        })
                        .collect();
                    println!("{name:<14} {}", cells.join("   "));
                }
            }
        }
    }
    Ok(())
}

fn trace_files(spec: &str) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for part in spec.split(',').filter(|s| !s.is_empty()) {
        let p = Path::new(part);
        if p.is_dir() {
            let mut v: Vec<PathBuf> = std::fs::read_dir(p)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "csv"))
                .collect();
            v.sort();
            out.extend(v);
        } else {
            out.push(p.to_path_buf());
        }
    }
    Ok(out)
}
