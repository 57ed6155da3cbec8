//! `autodl-agent`: the node agent as a daemon.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use autodl_agent::config::DEFAULT_STATE_DIR;
use autodl_agent::gpu::GpuBackend;
use autodl_agent::{
    Agent, AgentConfig, CancellationToken, DockerRuntime, IsolationChoice, IsolationConfig,
    NvmlBackend, ProcessRuntime, Runtime, SimulatedBackend,
};
use clap::{Parser, ValueEnum};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum RuntimeKind {
    /// Docker; refuses to start when the engine does not answer (say `process` to run
    /// tasks as processes instead).
    Auto,
    Docker,
    Process,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum IsolationArg {
    /// The strongest this host offers; trusted-only (with a warning) when none.
    Auto,
    /// Refuse to start unless tasks can be isolated.
    Required,
    /// Run process tasks as the agent's own user: the node is trusted-only.
    Off,
}

#[derive(Debug, Parser)]
#[command(
    version,
    about = "autodl GPU host agent: joins the cluster and runs assigned training tasks"
)]
struct Cli {
    /// Server base URL, e.g. http://autodl.internal:8080.
    #[arg(long, env = "AUTODL_SERVER")]
    server: String,
    /// Registration token (adlreg_...); needed only for the first start, or after the
    /// node's credential was revoked.
    #[arg(long, env = "AUTODL_REGISTRATION_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Holds the node credential (mode 0600) and the task folders.
    #[arg(long, env = "AUTODL_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// Node id; defaults to the host name.
    #[arg(long, env = "AUTODL_NODE_ID")]
    node_id: Option<String>,
    #[arg(long, env = "AUTODL_ZONE", default_value = "")]
    zone: String,
    /// Node label KEY=VALUE; repeatable.
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// Simulate GPUs instead of reading NVML, e.g. "4xA100-40G" or "2xA100-40G,1xFOO:24GiB".
    #[arg(long, env = "AUTODL_SIMULATE", conflicts_with = "no_gpus")]
    simulate: Option<String>,
    /// Seed of the simulated GPUs' numbers and UUIDs (defaults to one derived from the node id).
    #[arg(long)]
    seed: Option<u64>,
    /// Join without GPUs (CPU-only host).
    #[arg(long)]
    no_gpus: bool,
    #[arg(long, value_enum, env = "AUTODL_RUNTIME", default_value = "auto")]
    runtime: RuntimeKind,
    /// Working directory of tasks under the process runtime (default: the task's home
    /// folder); read-only to sandboxed tasks.
    #[arg(long)]
    workdir: Option<PathBuf>,
    /// How process tasks are kept apart (containers always are).
    #[arg(long, value_enum, env = "AUTODL_ISOLATION", default_value = "auto")]
    isolation: IsolationArg,
    /// Uids (and gids) given to tasks, e.g. 2000000-2099999; nobody else may use them.
    #[arg(long, value_parser = parse_uid_range, default_value = "2000000-2099999")]
    task_uids: std::ops::RangeInclusive<u32>,
    /// Host-wide folder of task uid locks (shared by every agent on the host).
    #[arg(long, default_value = autodl_agent::isolation::DEFAULT_LOCK_DIR)]
    uid_lock_dir: PathBuf,
    /// bubblewrap binary for the process runtime's sandbox (default: bwrap on PATH).
    #[arg(long)]
    bwrap: Option<PathBuf>,
    /// Host folder sandboxed tasks may read besides the system folders; repeatable.
    #[arg(long = "task-path")]
    task_paths: Vec<PathBuf>,
    /// Variable every task gets, KEY=VALUE (e.g. LD_LIBRARY_PATH); repeatable.
    #[arg(long = "task-env", value_parser = parse_label)]
    task_env: Vec<(String, String)>,
    /// Host folder tasks may name as data_path (read-only); repeatable. Without one, only
    /// s3:// data paths are accepted.
    #[arg(long = "data-root", env = "AUTODL_DATA_ROOTS", value_delimiter = ',')]
    data_roots: Vec<PathBuf>,
    /// The address other nodes' tasks reach this node's tasks at (where a gang spanning nodes
    /// meets when its rank 0 is here); default: the host's primary address.
    #[arg(long, env = "AUTODL_ADVERTISE_ADDR")]
    advertise_addr: Option<std::net::IpAddr>,
    /// Most processes (and threads) one task may hold, in a container or a cgroup.
    #[arg(long, default_value = "4096")]
    pids_limit: i64,
    /// Addresses for the networks of process-runtime tasks (a /30 each, leased host-wide);
    /// tasks reach the outside through the host with address translation.
    #[arg(long, value_parser = autodl_agent::isolation::network::parse_cidr, default_value = "10.213.0.0/16")]
    task_network: (std::net::Ipv4Addr, u8),
    /// A private network tasks may reach (an internal package mirror); repeatable. Every other
    /// private, shared and link-local address is closed to them.
    #[arg(long = "task-network-allow", value_parser = autodl_agent::isolation::network::parse_cidr_any)]
    task_network_allow: Vec<(std::net::Ipv4Addr, u8)>,
    /// GPU sampling period: "5s", "500ms", "1m" or plain seconds.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    sample_interval: Duration,
    /// Longest the server may hold a poll.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    poll_wait: Duration,
    /// Grace period for tasks still running when the agent stops.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    shutdown_grace: Duration,
    /// How long a finished task's results and last checkpoint are kept on this node while
    /// the server or storage cannot take them ("3d", "12h"); then they are given up.
    #[arg(long, default_value = "3d", value_parser = parse_duration)]
    keep_results_for: Duration,
    /// Most bytes kept that way; past it the oldest are given up.
    #[arg(long, default_value = "53687091200")]
    keep_results_bytes: u64,
    /// Prometheus endpoint address, or "off".
    #[arg(long, env = "AUTODL_METRICS_LISTEN", default_value = "127.0.0.1:9101")]
    metrics_listen: String,
    /// Cores to report instead of the detected count.
    #[arg(long)]
    cpu: Option<u32>,
    /// RAM bytes to report instead of the detected size.
    #[arg(long)]
    memory: Option<u64>,
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

fn parse_uid_range(s: &str) -> Result<std::ops::RangeInclusive<u32>, String> {
    let bad = || format!("expected FIRST-LAST uids above 0, got {s:?}");
    let (a, b) = s.split_once('-').ok_or_else(bad)?;
    let (a, b): (u32, u32) = (
        a.trim().parse().map_err(|_| bad())?,
        b.trim().parse().map_err(|_| bad())?,
    );
    if a == 0 || b < a {
        return Err(bad());
    }
    Ok(a..=b)
}

/// A positive length of time, in the grammar task specs use ("5s", "500ms", "3d", seconds).
fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = autodl_common::units::parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("duration must be positive: {s:?}"));
    }
    Ok(d)
}

async fn pick_runtime(
    kind: RuntimeKind,
    workdir: Option<PathBuf>,
    isolation: &IsolationConfig,
    simulated: bool,
) -> Result<Arc<dyn Runtime>> {
    let docker = || async {
        DockerRuntime::connect()
            .await
            .map(|d| d.with_isolation(isolation))
    };
    Ok(match kind {
        RuntimeKind::Process => {
            let mut rt = ProcessRuntime::detect(isolation).map_err(anyhow::Error::msg)?;
            if let Some(d) = workdir {
                rt = rt.with_workdir(d);
            }
            if simulated {
                // This program answers as nvidia-smi for the simulated GPUs.
                match std::env::current_exe() {
                    Ok(me) => rt = rt.with_simulated_smi(me),
                    Err(e) => tracing::warn!(error = %e, "tasks get no nvidia-smi for the simulated GPUs"),
                }
            }
            Arc::new(rt)
        }
        RuntimeKind::Docker => Arc::new(
            docker()
                .await
                .context("connecting to Docker (DOCKER_HOST or /var/run/docker.sock)")?,
        ),
        RuntimeKind::Auto => match docker().await {
            Ok(d) => Arc::new(d),
            Err(e) => bail!(
                "Docker is not reachable ({e}). Start Docker, or pass --runtime process to run tasks as processes (isolated in a bubblewrap sandbox when the agent runs as root; trusted-only otherwise)."
            ),
        },
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    // Shown to tasks on simulated nodes as their nvidia-smi.
    autodl_agent::gpu::smi::run_if_called();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let cli = Cli::parse();

    let mut config = AgentConfig::new(cli.server)
        .state_dir(cli.state_dir)
        .zone(cli.zone)
        .sample_interval(cli.sample_interval)
        .poll_wait(cli.poll_wait)
        .shutdown_grace(cli.shutdown_grace)
        .keep_results_for(cli.keep_results_for)
        .keep_results_bytes(cli.keep_results_bytes);
    if let Some(id) = cli.node_id {
        config = config.node_id(id);
    }
    if let Some(t) = cli.token {
        config = config.registration_token(t);
    }
    for (k, v) in cli.labels {
        config = config.label(k, v);
    }
    if let Some(c) = cli.cpu {
        config = config.cpu(c);
    }
    if let Some(m) = cli.memory {
        config = config.memory(m);
    }
    if cli.metrics_listen != "off" {
        let addr: SocketAddr = cli
            .metrics_listen
            .parse()
            .with_context(|| format!("--metrics-listen {:?}", cli.metrics_listen))?;
        config = config.metrics_listen(addr);
    }

    let backend: Arc<dyn GpuBackend> = if let Some(spec) = &cli.simulate {
        let seed = cli.seed.unwrap_or_else(|| seed_of(&config.node_id));
        Arc::new(SimulatedBackend::from_spec(spec, seed)?)
    } else if cli.no_gpus {
        Arc::new(SimulatedBackend::new(Vec::new(), 0))
    } else {
        match NvmlBackend::new() {
            Ok(b) => Arc::new(b),
            Err(e) => bail!(
                "{e}\nNo NVIDIA driver here? Pass --simulate SPEC (e.g. 4xA100-40G) to simulate GPUs, or --no-gpus to join without GPUs."
            ),
        }
    };
    let isolation = IsolationConfig {
        choice: match cli.isolation {
            IsolationArg::Auto => IsolationChoice::Auto,
            IsolationArg::Required => IsolationChoice::Required,
            IsolationArg::Off => IsolationChoice::Off,
        },
        task_uids: cli.task_uids,
        network: autodl_agent::isolation::network::NetworkConfig {
            cidr: cli.task_network,
            lock_dir: autodl_agent::isolation::network::lock_dir_beside(&cli.uid_lock_dir),
            allow: cli.task_network_allow,
        },
        lock_dir: cli.uid_lock_dir,
        bwrap: cli.bwrap,
        read_only_paths: cli.task_paths,
        task_env: cli.task_env.into_iter().collect(),
        pids_limit: cli.pids_limit,
    };
    config = config.isolation(isolation.clone());
    for r in cli.data_roots {
        config = config.data_root(r);
    }
    if let Some(addr) = cli.advertise_addr {
        config = config.advertise_addr(addr);
    }
    let runtime =
        pick_runtime(cli.runtime, cli.workdir, &isolation, cli.simulate.is_some()).await?;
    let agent = Agent::new(config, backend, runtime)?;

    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutting down");
        on_signal.cancel();
    });
    agent.run(shutdown).await?;
    Ok(())
}

/// Stable per node, so a restarted simulated node keeps its GPU UUIDs.
fn seed_of(node_id: &str) -> u64 {
    node_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_parsing() {
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert!(parse_duration("0").is_err() && parse_duration("x").is_err());
        assert_eq!(parse_label("rack=3").unwrap(), ("rack".into(), "3".into()));
        assert!(parse_label("rack").is_err());
        let cli = Cli::try_parse_from([
            "autodl-agent",
            "--server",
            "http://s:8080",
            "--token",
            "adlreg_x",
            "--label",
            "a=1",
            "--label",
            "b=2",
            "--simulate",
            "2xA40",
        ])
        .unwrap();
        assert_eq!(cli.labels.len(), 2);
        assert_eq!(cli.runtime, RuntimeKind::Auto);
        assert_eq!(cli.sample_interval, Duration::from_secs(5));
        assert_eq!(cli.metrics_listen, "127.0.0.1:9101");
        assert_eq!(seed_of("n1"), seed_of("n1"));
        assert_eq!(cli.isolation, IsolationArg::Auto);
        assert_eq!(cli.task_uids, 2_000_000..=2_099_999);
        assert_eq!(parse_uid_range("10-20").unwrap(), 10..=20);
        assert!(parse_uid_range("0-20").is_err() && parse_uid_range("20-10").is_err());
    }
}
