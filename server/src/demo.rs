//! `serve --demo`: three agents on simulated GPUs (4xA100-40G, and two nodes of 2xA40 so that
//! a gang can span nodes) run inside the server process with the process runtime, so a
//! newcomer can submit a task and watch it run with one command and no GPU.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use autodl_agent::{
    Agent, AgentConfig, CancellationToken, IsolationConfig, ProcessRuntime, Runtime,
    SimulatedBackend,
};

use crate::auth::secrets::new_id;
use crate::state::AppState;
use crate::usecases::agents::{issue_registration_token, TokenGrant};

pub const DEMO_NODES: [(&str, &str); 3] = [
    ("demo-a100", "4xA100-40G"),
    ("demo-a40", "2xA40"),
    ("demo-a40-b", "2xA40"),
];

/// Starts the demo agents; they stop (SIGTERM to their tasks, then SIGKILL) when `shutdown`
/// is cancelled.
///
/// Run as root (as `scripts/run.sh` does on a fresh machine) the agents isolate every task
/// as production agents do: its own uid in a bubblewrap sandbox, seeing only its own folders.
/// Otherwise the tasks run as the server's user, unisolated: the demo says so at start, in
/// its log and on the pages, and opens its nodes to every organization anyway (a demo has no
/// administrator to trust anyone).
pub async fn start_agents(
    state: &AppState,
    data_dir: &Path,
    shutdown: CancellationToken,
) -> anyhow::Result<Vec<Agent>> {
    let owner = demo_owner(state).await?;
    let mut isolation = IsolationConfig {
        read_only_paths: state.settings.demo_task_paths.clone(),
        ..IsolationConfig::default()
    };
    // The Python demo tasks run, and the installation it was made from (a pyenv or conda
    // interpreter under a home folder the sandbox hides), made readable to them.
    let python_bin = match &state.settings.demo_python {
        Some(env) => {
            isolation.read_only_paths.push(env.clone());
            Some(env.join("bin"))
        }
        None => python_alias(data_dir)
            .await
            .inspect(|bin| isolation.read_only_paths.push(bin.clone())),
    };
    if let Some(bin) = python_bin {
        match describe_python(&bin.join("python")).await {
            Some(py) => {
                let data = std::fs::canonicalize(data_dir)
                    .or_else(|_| std::path::absolute(data_dir))
                    .unwrap_or_else(|_| data_dir.into());
                // A Python installed right into a home folder (`--prefix=$HOME`) would show
                // the whole home (keys, credentials) to every task: the demo's own folder
                // (data/python) is shown then, the installation not.
                let home = std::env::var_os("HOME").map(PathBuf::from);
                let holds = |p: &Path| p.starts_with(&py.base_prefix);
                if holds(&data) || home.as_deref().is_some_and(holds) {
                    tracing::warn!(python = %py.base_prefix.display(), "the demo's Python is installed in a folder that holds the data folder or a home folder: not shown to sandboxed tasks, which may not find its standard library");
                } else {
                    isolation.read_only_paths.push(py.base_prefix.clone());
                }
                tracing::info!(
                    "demo tasks run python {} from {} ({})",
                    py.version,
                    bin.display(),
                    py.base_prefix.display()
                );
            }
            None => tracing::warn!(
                bin = %bin.display(),
                "the demo's python does not run; demo tasks use the host's python3"
            ),
        }
        isolation.task_env.insert(
            "PATH".into(),
            format!("{}:{}", bin.display(), autodl_agent::DEFAULT_PATH),
        );
    }
    let mut runtime = ProcessRuntime::detect(&isolation).map_err(anyhow::Error::msg)?;
    // This program answers as nvidia-smi for the demo's simulated GPUs.
    match std::env::current_exe() {
        Ok(me) => runtime = runtime.with_simulated_smi(me),
        Err(e) => tracing::warn!(error = %e, "demo tasks get no nvidia-smi"),
    }
    let runtime = Arc::new(runtime);
    let level = runtime.isolation();
    if level.trusted_only() {
        tracing::warn!(
            "DEMO TASKS ARE NOT ISOLATED from each other or from this server: it does not run as root, so they run as its own user. Run it as root (scripts/run.sh does) to sandbox every task."
        );
    } else {
        tracing::info!(isolation = level.as_str(), "demo tasks are isolated");
    }
    let mut agents = Vec::new();
    for (i, (node, gpus)) in DEMO_NODES.iter().enumerate() {
        // A single-use token per node, made directly in the store (the demo has no
        // administrator yet) and bound to the node, so a restarted demo whose agent state was
        // deleted may register the node again.
        let (token, _) = issue_registration_token(
            state.store.as_ref(),
            TokenGrant {
                name: format!("demo agent {node}"),
                created_by: owner.clone(),
                node_id: Some(node.to_string()),
                max_uses: 1,
                valid_ms: 3_600_000,
            },
            state.clock.now_ms(),
        )
        .await?;
        let mut config = AgentConfig::new(state.settings.public_url())
            .node_id(*node)
            .zone("demo")
            .registration_token(token)
            .state_dir(data_dir.join(node))
            .cpu(32)
            .memory(256 << 30)
            // All of the demo's nodes are this host.
            .advertise_addr(std::net::Ipv4Addr::LOCALHOST.into())
            .isolation(isolation.clone());
        for r in &state.settings.demo_data_roots {
            config = config.data_root(r);
        }
        let backend = Arc::new(SimulatedBackend::from_spec(gpus, i as u64 + 1)?);
        let agent = Agent::new(config, backend, runtime.clone())?;
        let (a, t) = (agent.clone(), shutdown.clone());
        tokio::spawn(async move {
            if let Err(e) = a.run(t).await {
                tracing::error!(node = a.node_id(), error = %e, "demo agent stopped");
            }
        });
        if level.trusted_only() {
            tokio::spawn(open_to_all(
                state.store.clone(),
                state.scheduler.clone(),
                node.to_string(),
            ));
        }
        agents.push(agent);
    }
    tracing::info!(
        "demo agents started: {}",
        DEMO_NODES.map(|(n, g)| format!("{n} ({g})")).join(", ")
    );
    Ok(agents)
}

/// A Python as demo tasks see it.
struct PythonInstall {
    /// The interpreter itself, links and shims (pyenv's) resolved.
    executable: PathBuf,
    /// Where its standard library is: a virtualenv's is the interpreter's it was made from.
    base_prefix: PathBuf,
    version: String,
}

/// Asks `python` where it lives (`-I`: nothing of this process's environment or folder).
async fn describe_python(python: &Path) -> Option<PythonInstall> {
    let out = tokio::process::Command::new(python)
        .args([
            "-I",
            "-c",
            "import os, sys; print(os.path.realpath(sys.executable)); print(os.path.realpath(sys.base_prefix)); print(sys.version.split()[0])",
        ])
        .output()
        .await
        .ok()
        .filter(|o| o.status.success())?;
    let text = String::from_utf8(out.stdout).ok()?;
    let mut lines = text.lines();
    let executable = PathBuf::from(lines.next()?);
    let base_prefix = PathBuf::from(lines.next()?);
    let version = lines.next()?.to_owned();
    // Never the whole host.
    (base_prefix.is_absolute() && base_prefix.parent().is_some()).then_some(PythonInstall {
        executable,
        base_prefix,
        version,
    })
}

/// Container images of the field run `python`; a host may have only `python3`, or a shim
/// (pyenv's) that works only outside the sandbox. Demo tasks run on the host (the image is
/// not used), so they find `python` and `python3` in a folder of the demo's own, linked to
/// the interpreter the host's `python3` runs: `entry_point: train.py` runs as in the image.
async fn python_alias(data_dir: &Path) -> Option<PathBuf> {
    let python3 = std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join("python3"))
        .find(|p| p.is_file())?;
    let real = describe_python(&python3).await?.executable;
    let bin = std::path::absolute(data_dir.join("bin")).ok()?;
    std::fs::create_dir_all(&bin).ok()?;
    for name in ["python", "python3"] {
        let link = bin.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&real, &link).ok()?;
    }
    Some(bin)
}

/// Lets every organization use an unisolated demo node once its agent has registered it.
async fn open_to_all(
    store: Arc<dyn crate::store::Store>,
    scheduler: Arc<crate::scheduling::SchedulerHandle>,
    node: String,
) {
    for _ in 0..600 {
        match store.set_node_open_to_all(&node, true).await {
            Ok(true) => {
                scheduler.invalidate_nodes();
                scheduler.wake();
                return;
            }
            Ok(false) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
            Err(e) => {
                tracing::warn!(node, error = %e, "could not open the demo node to all");
                return;
            }
        }
    }
}

/// Registration tokens name their creator; the demo's is a service account of its own.
async fn demo_owner(state: &AppState) -> anyhow::Result<String> {
    use crate::store::{TenantRecord, UserRecord};
    const EMAIL: &str = "demo-agents@autodl.local";
    if let Some(u) = state.store.user_by_email(EMAIL).await? {
        return Ok(u.id);
    }
    let now = state.clock.now_ms();
    let tenant = TenantRecord {
        id: new_id(),
        name: "autodl demo agents".into(),
        created_at: now,
        trusted: false,
        internal: true,
    };
    let user = UserRecord {
        id: new_id(),
        email: EMAIL.into(),
        // Not a hash of anything: nobody can sign in as this account.
        password_hash: "!".into(),
        tenant_id: tenant.id.clone(),
        role: autodl_common::api::Role::Owner,
        platform_admin: false,
        disabled: true,
        created_at: now,
    };
    state.store.create_tenant_with_owner(&tenant, &user).await?;
    Ok(user.id)
}
