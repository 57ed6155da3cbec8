//! Tasks as child processes: as the agent's user on trusted-only nodes, as a task uid, or as a
//! task uid inside a bubblewrap sandbox (see [`crate::isolation`]).
//!
//! A trusted task runs in its own process group so that stopping it reaches the workers it
//! forked (dataloaders, torchrun children). An isolated task is stopped through its uid:
//! every process running as it is the task's, including ones that left the process group.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

use super::gang::{wait_for_workers, WorkerExit, Workers};
use super::leftovers::Leftovers;
use super::Rendezvous;
use super::{
    Exec, ExecControl, ExecSpec, RunOutcome, Runtime, RuntimeError, Started, TaskIo, TaskLaunch,
};
use crate::isolation::limits::{Limiter, Limits, TaskCgroup, JOIN_SCRIPT};
use crate::isolation::network::{needs_relay, Networks, TaskNetwork};
use crate::isolation::sandbox::{sh_quote, write_env_file, write_identity_files, SandboxLaunch};
use crate::isolation::{
    inherited_env, is_root, signal_uid, IsolationChoice, IsolationConfig, IsolationLevel, Sandbox,
    TaskUser, UidPool, DEFAULT_PATH,
};
use crate::logs::{LogBuffer, MAX_LINE_BYTES};
use crate::protocol::Stream;

/// How long output may keep flowing after the leader exited before the rest of its process
/// group is killed (a forgotten background child would otherwise hold the pipes open forever).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
enum Mode {
    Trusted,
    /// `setpriv` drops to the task's uid. `shareable`: `/proc` hides other users' processes
    /// (`hidepid`), so tasks of other organizations may share the node; without it every
    /// task's command line is readable by all, and the node is trusted-only.
    Uid {
        setpriv: PathBuf,
        shareable: bool,
    },
    Sandbox(Sandbox),
}

/// What confines one running attempt besides its uid: its cgroup and its network. Made when
/// the attempt starts and ended (every process in it killed) when it ends.
#[derive(Debug)]
struct Confinement {
    cgroup: Option<TaskCgroup>,
    network: Option<TaskNetwork>,
}

/// Running attempts by node, task and attempt (one runtime may serve several agents, as the
/// demo's two do).
type Attempts = Arc<Mutex<HashMap<(String, String, u32), Arc<Confinement>>>>;

#[derive(Debug, Clone)]
pub struct ProcessRuntime {
    mode: Mode,
    workdir: Option<PathBuf>,
    operator_env: BTreeMap<String, String>,
    /// How isolated tasks are limited; `Err` says why they are not.
    limiter: Result<Limiter, String>,
    /// Task networks (isolated modes only); `Err` says why tasks share the host's.
    networks: Result<Networks, String>,
    /// Most processes an isolated task may hold.
    pids_limit: u64,
    attempts: Attempts,
    /// The program that answers as `nvidia-smi` on a node with simulated GPUs (the agent's
    /// own, or the demo server's: [`crate::gpu::smi::run_if_called`]).
    simulated_smi: Option<PathBuf>,
}

impl ProcessRuntime {
    /// Tasks run as the agent's own user and see what it sees: for a node that only runs
    /// tasks of organizations an administrator trusts (and for tests of the runtime itself).
    pub fn trusted() -> Self {
        ProcessRuntime {
            mode: Mode::Trusted,
            workdir: None,
            operator_env: BTreeMap::new(),
            limiter: Err("tasks run as the agent's own user".into()),
            networks: Err("tasks run as the agent's own user".into()),
            pids_limit: 4096,
            attempts: Attempts::default(),
            simulated_smi: None,
        }
    }

    /// Shows tasks on a node with simulated GPUs an `nvidia-smi` of them: `program` (which
    /// calls [`crate::gpu::smi::run_if_called`] first) under that name, first on `PATH`.
    pub fn with_simulated_smi(mut self, program: PathBuf) -> Self {
        self.simulated_smi = Some(program);
        self
    }

    /// On a simulated node, `nvidia-smi` for the task ([`crate::gpu::smi`]): the variable
    /// naming its GPUs' state, the program first on `PATH`, and what a sandbox must show of
    /// both (`sandboxed`). Nothing on a node with real GPUs or without the program.
    fn simulated_gpus(
        &self,
        launch: &TaskLaunch,
        env: &mut BTreeMap<String, String>,
        sandboxed: bool,
    ) -> Vec<(PathBuf, PathBuf)> {
        use crate::gpu::smi::{PROGRAM, STATE_FILE, STATE_VAR};
        let dir = launch.simulated_gpus_dir();
        let Some(program) = self
            .simulated_smi
            .as_ref()
            .filter(|_| !launch.real_gpus && dir.is_dir())
        else {
            return Vec::new();
        };
        let (state, bin, mounts) = if sandboxed {
            let bin = PathBuf::from("/autodl/bin");
            let mounts = vec![
                (dir, PathBuf::from("/autodl/gpu")),
                (program.clone(), bin.join(PROGRAM)),
            ];
            (format!("/autodl/gpu/{STATE_FILE}"), bin, mounts)
        } else {
            // A link named after the program, in the agent's own folder.
            let bin = launch.state_dir.join("smi").join("bin");
            let link = bin.join(PROGRAM);
            let linked = std::fs::create_dir_all(&bin).and_then(|()| {
                if std::fs::read_link(&link).ok().as_ref() == Some(program) {
                    return Ok(());
                }
                let _ = std::fs::remove_file(&link);
                std::os::unix::fs::symlink(program, &link)
            });
            if let Err(e) = linked {
                tracing::warn!(error = %e, "no nvidia-smi for the simulated GPUs");
                return Vec::new();
            }
            (dir.join(STATE_FILE).display().to_string(), bin, Vec::new())
        };
        env.insert(STATE_VAR.into(), state);
        let path = env
            .get("PATH")
            .cloned()
            .unwrap_or_else(|| DEFAULT_PATH.into());
        env.insert("PATH".into(), format!("{}:{path}", bin.display()));
        mounts
    }

    /// The strongest isolation this host offers within what `config` asks: a sandbox as a
    /// task uid (root, bubblewrap), a task uid alone (root), or none (not root). `Err` when
    /// `config` requires isolation the host cannot give.
    pub fn detect(config: &IsolationConfig) -> Result<Self, String> {
        let mut rt = ProcessRuntime::trusted();
        rt.operator_env = config.task_env.clone();
        if config.choice == IsolationChoice::Off {
            return Ok(rt);
        }
        if !is_root() {
            if config.choice == IsolationChoice::Required {
                return Err(
                    "isolating tasks needs the agent to run as root (each task gets its own uid)"
                        .into(),
                );
            }
            tracing::warn!("the agent does not run as root: tasks run as its own user and are not isolated from each other; this node is trusted-only");
            return Ok(rt);
        }
        let pool = UidPool::new(config.task_uids.clone(), &config.lock_dir)
            .map_err(|e| format!("task uid locks in {}: {e}", config.lock_dir.display()))?;
        let probe = pool
            .lease()
            .map_err(|e| format!("no task uid for the sandbox probe: {e}"))?;
        rt.mode = match Sandbox::detect(
            config.bwrap.as_deref(),
            &config.read_only_paths,
            probe.user().uid,
        ) {
            Ok(sb) => Mode::Sandbox(sb),
            Err(why) => {
                tracing::warn!(%why, "no namespace sandbox: tasks run as their own uid without namespaces");
                let shareable = crate::isolation::proc_hides_processes();
                if !shareable {
                    tracing::warn!("tasks run as their own uids without namespaces, and /proc shows every process's command line to every user: the node is trusted-only; remount /proc with hidepid=invisible, or install bubblewrap, to share it between organizations");
                }
                Mode::Uid {
                    setpriv: crate::isolation::sandbox::find_setpriv()?,
                    shareable,
                }
            }
        };
        rt.pids_limit = u64::try_from(config.pids_limit).unwrap_or(4096).max(1);
        rt.limiter = Limiter::detect();
        if let Err(why) = &rt.limiter {
            tracing::warn!(%why, "tasks' memory, CPU and processes are not limited");
        }
        rt.networks = Networks::detect(config.network.clone());
        if let Err(why) = &rt.networks {
            if config.choice == IsolationChoice::Required {
                return Err(format!(
                    "isolating tasks needs a network namespace for each: {why}"
                ));
            }
            tracing::warn!(%why, "tasks would share the host's network (each could reach the others' ports and the host's loopback services): this node is trusted-only");
        }
        Ok(rt)
    }

    /// For the node's page: how tasks are limited and what network they get.
    pub fn describe_limits(&self) -> String {
        match &self.limiter {
            Ok(l) => l.describe(),
            Err(why) => format!("none ({why})"),
        }
    }

    pub fn describe_network(&self) -> String {
        match &self.networks {
            Ok(n) => n.describe(),
            Err(why) => format!("the host's ({why})"),
        }
    }

    /// Makes the attempt's cgroup and network (isolated tasks only).
    async fn confine(&self, launch: &TaskLaunch) -> Result<Confinement, RuntimeError> {
        let mut c = Confinement {
            cgroup: None,
            network: None,
        };
        if launch.user.is_none() {
            return Ok(c);
        }
        if let Ok(limiter) = &self.limiter {
            let limits = Limits {
                memory: launch.memory,
                cpu: launch.cpu,
                pids: self.pids_limit,
            };
            let name = format!(
                "{}-{}-{}",
                super::safe_name(&launch.node_id),
                super::safe_name(&launch.task_id),
                launch.attempt
            );
            let limiter = limiter.clone();
            let made = tokio::task::spawn_blocking(move || limiter.create(&name, &limits))
                .await
                .map_err(|e| RuntimeError::Unavailable(e.to_string()))?;
            c.cgroup = Some(made.map_err(|e| {
                RuntimeError::Unavailable(format!("could not make the task's cgroup: {e}"))
            })?);
        }
        if let Ok(networks) = &self.networks {
            let relayed = relayed_addresses(launch).await;
            let name = format!(
                "{}-{}-{}",
                super::safe_name(&launch.node_id),
                super::safe_name(&launch.task_id),
                launch.attempt
            );
            c.network = Some(networks.create(&name, &relayed).await.map_err(|e| {
                RuntimeError::Unavailable(format!("could not make the task's network: {e}"))
            })?);
        }
        Ok(c)
    }

    fn confinement(&self, launch: &TaskLaunch) -> Option<Arc<Confinement>> {
        lock(&self.attempts).get(&attempt_key(launch)).cloned()
    }

    /// Tasks start in `dir` instead of their home folder, e.g. a checkout holding the
    /// training scripts (shown read-only to sandboxed tasks).
    pub fn with_workdir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.workdir = Some(dir.into());
        self
    }
}

fn attempt_key(launch: &TaskLaunch) -> (String, String, u32) {
    (
        launch.node_id.clone(),
        launch.task_id.clone(),
        launch.attempt,
    )
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The platform's own addresses when tasks cannot reach them themselves (on the host's
/// loopback in a single-host install or the demo, or on a private network the task firewall
/// closes): the agent relays each into the task's network at the same address and port.
async fn relayed_addresses(launch: &TaskLaunch) -> Vec<std::net::SocketAddr> {
    let Some(url) = launch
        .env
        .get("AUTODL_API_URL")
        .and_then(|u| reqwest::Url::parse(u).ok())
    else {
        return Vec::new();
    };
    let Some(port) = url.port_or_known_default() else {
        return Vec::new();
    };
    let addrs: Vec<std::net::SocketAddr> = match url.host() {
        Some(url::Host::Ipv4(ip)) => vec![(ip, port).into()],
        Some(url::Host::Ipv6(ip)) => vec![(ip, port).into()],
        Some(url::Host::Domain(name)) => match tokio::net::lookup_host((name, port)).await {
            Ok(addrs) => addrs.collect(),
            Err(_) => Vec::new(),
        },
        None => Vec::new(),
    };
    addrs.into_iter().filter(|a| needs_relay(a.ip())).collect()
}

fn signal_group(pid: u32, sig: Signal) {
    if let Ok(raw) = i32::try_from(pid) {
        // ESRCH (already gone) is the expected race here.
        let _ = killpg(Pid::from_raw(raw), sig);
    }
}

/// The children of a live process (none once it has exited).
fn children_of(pid: u32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|c| c.parse().ok())
        .collect()
}

/// Signals what belongs to the task: its uid's processes when it has one (the sandbox's own
/// helpers run as root and must live on to report the exit), else its process group. A kill
/// also takes the group, so the sandbox goes too.
fn signal_task(pid: u32, user: Option<TaskUser>, cgroup: Option<&TaskCgroup>, sig: Signal) {
    match user {
        Some(u) => {
            signal_uid(u.uid, sig);
            if sig == Signal::SIGKILL {
                if let Some(cg) = cgroup {
                    cg.signal(sig);
                }
                signal_group(pid, sig);
            }
        }
        None => signal_group(pid, sig),
    }
}

/// Reads a process's lines into the task's log (`rank`: the worker it is, in an attempt of
/// several).
async fn read_lines<R: AsyncRead + Unpin>(
    reader: R,
    stream: Stream,
    out: Arc<LogBuffer>,
    rank: Option<u32>,
) {
    let mut reader = BufReader::new(reader);
    let mut buf = Vec::with_capacity(1024);
    loop {
        buf.clear();
        // Bounded read: a line longer than the cap is split rather than buffered unboundedly.
        let mut limited = (&mut reader).take(MAX_LINE_BYTES as u64 + 1);
        match limited.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                while matches!(buf.last(), Some(b'\n' | b'\r')) {
                    buf.pop();
                }
                out.push_from(stream, String::from_utf8_lossy(&buf).into_owned(), rank);
            }
        }
    }
}

/// Who a command runs for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    /// The task's own command (each worker's).
    Task,
    /// `autodl exec`: a command on pipes.
    Exec,
    /// A person's shell on a terminal.
    Shell,
}

/// What to start for a task or for a command inside it, before it becomes a process (piped
/// for tasks and `exec`, on a terminal for shells).
struct Plan {
    program: PathBuf,
    args: Vec<std::ffi::OsString>,
    env: BTreeMap<String, String>,
    cwd: Option<PathBuf>,
}

impl Plan {
    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args).env_clear().envs(&self.env);
        if let Some(d) = &self.cwd {
            cmd.current_dir(d);
        }
        cmd
    }

    fn terminal_command(&self) -> pty_process::Command {
        let mut cmd = pty_process::Command::new(&self.program)
            .args(&self.args)
            .env_clear()
            .envs(&self.env)
            .kill_on_drop(true);
        if let Some(d) = &self.cwd {
            cmd = cmd.current_dir(d);
        }
        cmd
    }
}

impl ProcessRuntime {
    /// The plan for running `argv` in the task's environment, with nothing of the agent's
    /// environment but the allow-listed variables, for `caller`.
    ///
    /// An isolated task starts as a root shell with an empty environment that moves itself
    /// into the attempt's cgroup and execs the sandbox (or `setpriv`), which drops to the
    /// task's uid before a shell, now the task user, reads the task's environment from a file
    /// and execs the command: nothing running as root sees a variable the task chose.
    fn plan(
        &self,
        launch: &TaskLaunch,
        argv: &[String],
        caller: Caller,
    ) -> Result<Plan, RuntimeError> {
        let terminal = caller == Caller::Shell;
        let argv = &launch.in_environment(argv);
        let (program, args) = argv.split_first().ok_or(RuntimeError::NoCommand)?;
        let mut operator = inherited_env();
        operator
            .entry("PATH".into())
            .or_insert_with(|| DEFAULT_PATH.into());
        operator.extend(self.operator_env.clone());
        operator.extend(super::terminal_env(terminal, launch).map(|(k, v)| (k.into(), v.into())));
        let confinement = self.confinement(launch);
        if launch.user.is_some() && confinement.is_none() && !matches!(self.mode, Mode::Trusted) {
            return Err(RuntimeError::Unavailable(
                "the attempt does not run on this node (any more)".into(),
            ));
        }
        let root_env = BTreeMap::from([("PATH".to_string(), DEFAULT_PATH.to_string())]);
        let (program, args, env, cwd) = match (&self.mode, launch.user) {
            (Mode::Sandbox(sb), Some(user)) => {
                let paths = launch.mounted_paths();
                let mut env = launch.full_env(&paths, &operator, true);
                let mut read_only = self.simulated_gpus(launch, &mut env, true);
                let env_file = launch.env_file();
                write_env_file(
                    &env_file,
                    user.gid,
                    env.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                )?;
                let identity = write_identity_files(&launch.task_dir, user)?;
                if let (Some(d), Some(inside)) = (&launch.data, &paths.data) {
                    read_only.push((d.host.clone(), PathBuf::from(inside)));
                }
                if let Some(w) = &self.workdir {
                    read_only.push((w.clone(), w.clone()));
                }
                // The task's own code wins over the operator's folder.
                let workdir = match (&paths.code, &self.workdir) {
                    (Some(code), _) => PathBuf::from(code),
                    (None, Some(w)) => w.clone(),
                    (None, None) => PathBuf::from(&paths.home),
                };
                let mut binds = vec![
                    (
                        launch.checkpoint_dir.clone(),
                        PathBuf::from(&paths.checkpoints),
                    ),
                    (launch.results_dir.clone(), PathBuf::from(&paths.results)),
                    (launch.home_dir(), PathBuf::from(&paths.home)),
                ];
                if let Some(code) = &paths.code {
                    binds.push((launch.code_dir(), PathBuf::from(code)));
                }
                if let (Some(e), Some(inside)) = (&launch.env_dir, &paths.env) {
                    let at = (e.host.clone(), PathBuf::from(inside));
                    if e.writable {
                        binds.push(at);
                    } else {
                        read_only.push(at);
                    }
                }
                let tmp = launch.tmp_dir();
                let l = SandboxLaunch {
                    user,
                    binds,
                    read_only,
                    tmp_dir: &tmp,
                    workdir: &workdir,
                    gpus: if launch.real_gpus {
                        &launch.gpu_indices
                    } else {
                        &[]
                    },
                    env_file: &env_file,
                    command: argv,
                    terminal,
                    exec: caller != Caller::Task,
                    identity: Some((&identity.0, &identity.1)),
                };
                (sb.bwrap().to_path_buf(), sb.args(&l), root_env, None)
            }
            (Mode::Uid { setpriv, .. }, Some(user)) => {
                let paths = launch.host_paths();
                let mut env = launch.full_env(&paths, &operator, true);
                self.simulated_gpus(launch, &mut env, false);
                let env_file = launch.env_file();
                write_env_file(
                    &env_file,
                    user.gid,
                    env.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                )?;
                let workdir = match (&paths.code, &self.workdir) {
                    (Some(code), _) => code.clone(),
                    (None, Some(w)) => w.display().to_string(),
                    (None, None) => paths.home.clone(),
                };
                let mut a: Vec<std::ffi::OsString> = vec![
                    format!("--reuid={}", user.uid).into(),
                    format!("--regid={}", user.gid).into(),
                    "--clear-groups".into(),
                    "--no-new-privs".into(),
                    "--".into(),
                    "/bin/sh".into(),
                    "-c".into(),
                    // Files the task makes in the host's shared folders (/tmp, /dev/shm) are
                    // its own alone.
                    format!(
                        "umask 077 && cd {} && . {} && exec \"$@\"",
                        sh_quote(&workdir),
                        sh_quote(&env_file.display().to_string())
                    )
                    .into(),
                    "autodl-task".into(),
                ];
                a.extend(argv.iter().map(Into::into));
                (setpriv.clone(), a, root_env, None)
            }
            (_, _) => {
                let paths = launch.host_paths();
                let cwd = match (&paths.code, &self.workdir) {
                    (Some(code), _) => PathBuf::from(code),
                    (None, Some(w)) => w.clone(),
                    (None, None) => PathBuf::from(&paths.home),
                };
                let mut env = launch.full_env(&paths, &operator, true);
                self.simulated_gpus(launch, &mut env, false);
                (
                    PathBuf::from(program),
                    args.iter().map(Into::into).collect(),
                    env,
                    Some(cwd),
                )
            }
        };
        // Into the attempt's network, then (outermost) its cgroup, before anything of the
        // task runs.
        let (program, args) = match (
            confinement.as_ref().and_then(|c| c.network.as_ref()),
            &self.networks,
        ) {
            (Some(net), Ok(networks)) => {
                let mut a: Vec<std::ffi::OsString> = vec![
                    format!("--net={}", net.path().display()).into(),
                    "--".into(),
                    program.into(),
                ];
                a.extend(args);
                (networks.nsenter().to_path_buf(), a)
            }
            _ => (program, args),
        };
        let (program, args) = match confinement.as_ref().and_then(|c| c.cgroup.as_ref()) {
            Some(cg) => {
                let mut a: Vec<std::ffi::OsString> =
                    vec!["-c".into(), JOIN_SCRIPT.into(), "autodl-join".into()];
                a.extend(cg.procs_files().into_iter().map(Into::into));
                a.push("--".into());
                a.push(program.into());
                a.extend(args);
                (PathBuf::from("/bin/sh"), a)
            }
            None => (program, args),
        };
        Ok(Plan {
            program,
            args,
            env,
            cwd,
        })
    }

    async fn run_confined(
        &self,
        launch: TaskLaunch,
        io: TaskIo,
        confinement: &Confinement,
    ) -> Result<RunOutcome, RuntimeError> {
        if launch.user.is_none() {
            std::fs::create_dir_all(launch.home_dir())?;
        }
        let user = launch.user;
        let cgroup = confinement.cgroup.as_ref();
        // Every worker is planned (its variables written) before the first one starts.
        let workers = launch.worker_launches();
        let plans = workers
            .iter()
            .map(|w| self.plan(&w.launch, &w.launch.command, Caller::Task))
            .collect::<Result<Vec<_>, _>>()?;
        let leftovers = Leftovers::new(&launch.state_dir);
        let mut pids = Vec::with_capacity(plans.len());
        let mut waits: Vec<WorkerExit<'_>> = Vec::with_capacity(plans.len());
        let mut records = Vec::new();
        let mut readers = Vec::new();
        for (i, (w, plan)) in workers.iter().zip(&plans).enumerate() {
            let mut cmd = plan.command();
            cmd.stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0)
                .kill_on_drop(true);
            let mut child = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => {
                    // A gang starts whole or not at all.
                    for pid in &pids {
                        signal_task(*pid, user, cgroup, Signal::SIGKILL);
                    }
                    return Err(RuntimeError::Spawn(e));
                }
            };
            let pid = child.id().unwrap_or(0);
            pids.push(pid);
            // Noted until the attempt ends, for an agent that dies before it can stop it.
            match leftovers.record(&launch.task_id, launch.attempt, w.rank, pid) {
                Ok(r) => records.push(r),
                Err(e) => tracing::warn!(error = %e, "could not note the task's process group"),
            }
            // Each worker's lines say whose they are (the task's log holds them all).
            if let Some(out) = child.stdout.take() {
                readers.push(tokio::spawn(read_lines(
                    out,
                    Stream::Stdout,
                    io.output.clone(),
                    w.rank,
                )));
            }
            if let Some(err) = child.stderr.take() {
                readers.push(tokio::spawn(read_lines(
                    err,
                    Stream::Stderr,
                    io.output.clone(),
                    w.rank,
                )));
            }
            waits.push(Box::pin(async move {
                let exit = child.wait().await.map_err(RuntimeError::from);
                (i, exit.map(|status| i64::from(code_of(status))))
            }));
        }
        let _ = io.started.send(Started {
            pid: pids.first().copied().filter(|p| *p != 0),
        });

        let ranks: Vec<Option<u32>> = workers.iter().map(|w| w.rank).collect();
        let signals = ProcessWorkers {
            pids: &pids,
            user,
            cgroup,
        };
        let mut stop = io.stop;
        // Rank 0's process shows the attempt's network (its own namespace on an isolated node).
        let rank0 = ranks
            .iter()
            .position(|r| r.unwrap_or(0) == 0)
            .and_then(|i| pids.get(i).copied())
            .filter(|p| *p != 0);
        let formation = Rendezvous::held_here(&launch)
            .map(|r| Box::pin(r.unformed(rank0)) as super::gang::Formation<'_>);
        let end =
            wait_for_workers(waits, &ranks, &signals, &mut stop, &io.output, formation).await?;
        drop(records);

        let drain = futures_util::future::join_all(readers.iter_mut());
        if tokio::time::timeout(DRAIN_TIMEOUT, drain).await.is_err() {
            for pid in &pids {
                signal_task(*pid, user, cgroup, Signal::SIGKILL);
            }
            for r in &readers {
                r.abort();
            }
        }
        let exit_code = i32::try_from(end.exit_code()).unwrap_or(-1);
        let oom_killed = cgroup.is_some_and(|cg| cg.oom_kills() > 0);
        if oom_killed {
            let limit = launch
                .memory
                .map(|m| format!(" of {} MiB", m >> 20))
                .unwrap_or_default();
            io.output.push(
                Stream::Stderr,
                format!(
                    "[autodl-agent] the kernel killed a process of the task for using more than its memory limit{limit} (the task's memory request)"
                ),
            );
        }
        Ok(RunOutcome {
            exit_code,
            oom_killed,
            stopped: end.stopped,
            unformed: end.unformed,
        })
    }
}

/// An attempt's processes, signalled by their process groups or (isolated tasks) their uid.
struct ProcessWorkers<'a> {
    pids: &'a [u32],
    user: Option<TaskUser>,
    cgroup: Option<&'a TaskCgroup>,
}

#[async_trait]
impl Workers for ProcessWorkers<'_> {
    async fn terminate(&self, which: &[usize]) {
        for i in which {
            signal_task(self.pids[*i], self.user, self.cgroup, Signal::SIGTERM);
        }
    }

    async fn kill(&self, which: &[usize]) {
        for i in which {
            signal_task(self.pids[*i], self.user, self.cgroup, Signal::SIGKILL);
        }
    }
}

/// Exit status as a code: 128 + the signal's number when a signal ended the process.
fn code_of(status: std::process::ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

#[async_trait]
impl Runtime for ProcessRuntime {
    fn name(&self) -> &'static str {
        "process"
    }

    fn limits(&self) -> String {
        self.describe_limits()
    }

    fn task_users(&self) -> bool {
        matches!(self.mode, Mode::Uid { .. } | Mode::Sandbox(_))
    }

    fn tasks_see_host_paths(&self) -> bool {
        matches!(self.mode, Mode::Uid { .. })
    }

    fn network(&self) -> String {
        self.describe_network()
    }

    fn isolation(&self) -> IsolationLevel {
        // Tasks on the host's network reach each other's ports and the host's loopback
        // services: only trusted organizations' tasks may be placed there.
        if self.networks.is_err() {
            return IsolationLevel::None;
        }
        match self.mode {
            Mode::Trusted => IsolationLevel::None,
            Mode::Uid {
                shareable: true, ..
            } => IsolationLevel::Uid,
            Mode::Uid {
                shareable: false, ..
            } => IsolationLevel::None,
            Mode::Sandbox(_) => IsolationLevel::Sandbox,
        }
    }

    async fn cleanup(
        &self,
        _node_id: &str,
        state_dir: &Path,
        _keep: &[(String, u32)],
    ) -> Result<(), RuntimeError> {
        let killed = Leftovers::new(state_dir).reap();
        if killed > 0 {
            tracing::warn!(killed, "stopped tasks an earlier agent run left running");
        }
        Ok(())
    }

    async fn run(&self, launch: TaskLaunch, io: TaskIo) -> Result<RunOutcome, RuntimeError> {
        let key = attempt_key(&launch);
        let confinement = Arc::new(self.confine(&launch).await?);
        lock(&self.attempts).insert(key.clone(), confinement.clone());
        let outcome = self.run_confined(launch, io, &confinement).await;
        lock(&self.attempts).remove(&key);
        // Nothing of the attempt outlives it: what is left in its cgroup is killed, its
        // network is taken down.
        let _ = tokio::task::spawn_blocking(move || drop(confinement)).await;
        outcome
    }

    async fn exec(&self, launch: &TaskLaunch, spec: &ExecSpec) -> Result<Exec, RuntimeError> {
        self.start_exec(launch, spec)
    }

    /// An isolated task listens in a network of its own: the agent connects from inside it,
    /// to the task's own loopback, so no other task and no service of the node is reachable
    /// this way. A trusted task listens on the host's loopback.
    async fn connect_port(
        &self,
        launch: &TaskLaunch,
        port: u16,
        timeout: Duration,
    ) -> Result<tokio::net::TcpStream, RuntimeError> {
        let local = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        if launch.user.is_none() || matches!(self.mode, Mode::Trusted) {
            return Ok(
                tokio::time::timeout(timeout, tokio::net::TcpStream::connect(local))
                    .await
                    .map_err(|_| {
                        RuntimeError::Unavailable(format!("port {port} did not answer"))
                    })??,
            );
        }
        let confinement = self.confinement(launch).ok_or_else(|| {
            RuntimeError::Unavailable("the attempt does not run on this node (any more)".into())
        })?;
        let net = confinement.network.as_ref().ok_or_else(|| {
            RuntimeError::Unavailable("the attempt has no network of its own".into())
        })?;
        match net.connect(local, timeout).await {
            Ok(s) => Ok(s),
            // A server listening on IPv6 only.
            Err(_) => Ok(net
                .connect(
                    std::net::SocketAddr::from(([0u16, 0, 0, 0, 0, 0, 0, 1], port)),
                    timeout,
                )
                .await?),
        }
    }
}

/// A command running in a task's environment on pipes. What it starts in the background
/// outlives it (`nohup server &`, as over ssh) and may hold its pipes open (bwrap's reaper
/// does while they run), so its exit is watched apart from its output. Dropping it before
/// its exit (the person went away) kills it with its process group, the sandbox included.
struct ProcessExec {
    status: Exited,
}

/// A started command's exit, watched apart from its output: dropping the handle before the
/// exit kills the command (and, with `group`, its process group).
struct Exited {
    status: tokio::sync::watch::Receiver<Option<i32>>,
    /// Dropped with this: the waiter then kills the command.
    _kill: tokio::sync::oneshot::Sender<()>,
}

impl Exited {
    fn watch(mut child: Child, group: bool) -> Self {
        let (status_tx, status) = tokio::sync::watch::channel(None);
        let (kill, mut killed) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let code = tokio::select! {
                s = child.wait() => s.map_or(-1, exit_status),
                _ = &mut killed => {
                    if let Some(pid) = child.id().filter(|_| group) {
                        // The sandbox's reaper (pid 1 of its namespace, which takes every
                        // process in it along) is a child of its own session.
                        for c in children_of(pid) {
                            let _ = nix::sys::signal::kill(Pid::from_raw(c), Signal::SIGKILL);
                        }
                        signal_group(pid, Signal::SIGKILL);
                    }
                    let _ = child.start_kill();
                    child.wait().await.map_or(-1, exit_status)
                }
            };
            let _ = status_tx.send(Some(code));
        });
        Exited {
            status,
            _kill: kill,
        }
    }

    async fn wait(&mut self) -> Result<i32, RuntimeError> {
        let code = *self
            .status
            .wait_for(Option::is_some)
            .await
            .map_err(|_| RuntimeError::Unavailable("the command's waiter is gone".into()))?;
        Ok(code.unwrap_or(-1))
    }
}

/// The exit status a process reports: its code, or 128 + the signal that ended it.
fn exit_status(status: std::process::ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

#[async_trait]
impl ExecControl for ProcessExec {
    async fn resize(&mut self, _cols: u16, _rows: u16) -> Result<(), RuntimeError> {
        Ok(())
    }

    async fn wait(&mut self) -> Result<i32, RuntimeError> {
        self.status.wait().await
    }

    fn exited(&mut self) -> Option<tokio::sync::watch::Receiver<Option<i32>>> {
        Some(self.status.status.clone())
    }
}

/// A person's shell on a terminal. What it starts with nohup or setsid outlives it, and may
/// keep the terminal open after it exits (bwrap's reaper holds it while they run), so its
/// exit is watched apart from its output. Dropping it (the person left first) kills it; the
/// terminal's hang-up then ends what it started that does not ignore one.
struct TerminalExec {
    /// The terminal's controlling side, kept to resize it.
    terminal: std::os::fd::OwnedFd,
    /// Dropped with this: the shell is killed, and the terminal's hang-up ends the rest.
    status: Exited,
}

#[async_trait]
impl ExecControl for TerminalExec {
    async fn resize(&mut self, cols: u16, rows: u16) -> Result<(), RuntimeError> {
        let size = rustix::termios::Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        rustix::termios::tcsetwinsize(&self.terminal, size).map_err(std::io::Error::from)?;
        Ok(())
    }

    async fn wait(&mut self) -> Result<i32, RuntimeError> {
        self.status.wait().await
    }

    fn exited(&mut self) -> Option<tokio::sync::watch::Receiver<Option<i32>>> {
        Some(self.status.status.clone())
    }
}

impl ProcessRuntime {
    fn start_exec(&self, launch: &TaskLaunch, spec: &ExecSpec) -> Result<Exec, RuntimeError> {
        let caller = if spec.tty {
            Caller::Shell
        } else {
            Caller::Exec
        };
        let plan = self.plan(launch, &spec.argv(), caller)?;
        if spec.tty {
            let (pty, pts) = pty_process::open()?;
            pty.resize(pty_process::Size::new(spec.rows.max(1), spec.cols.max(1)))?;
            let cmd = plan.terminal_command();
            let child = cmd.spawn(pts).map_err(std::io::Error::other)?;
            let control = std::os::fd::AsFd::as_fd(&pty).try_clone_to_owned()?;
            let (read, write) = pty.into_split();
            return Ok(Exec {
                stdout: Box::pin(read),
                stderr: None,
                stdin: Box::pin(write),
                control: Box::new(TerminalExec {
                    terminal: control,
                    status: Exited::watch(child, false),
                }),
            });
        }
        let mut cmd = plan.command();
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(RuntimeError::Spawn)?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(RuntimeError::Unavailable(
                "the command's pipes are missing".into(),
            ));
        };
        Ok(Exec {
            stdout: Box::pin(stdout),
            stderr: Some(Box::pin(stderr)),
            stdin: Box::pin(stdin),
            control: Box::new(ProcessExec {
                status: Exited::watch(child, true),
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::protocol::{AgentLogLine, Assignment, ExitReason};
    use crate::runtime::classify_exit;
    use std::path::Path;
    use std::time::Instant;
    use tokio::sync::{oneshot, watch};

    struct Harness {
        output: Arc<LogBuffer>,
        started: oneshot::Receiver<Started>,
        stop: watch::Sender<Option<Duration>>,
        _dir: tempfile::TempDir,
    }

    fn launch(script: &str) -> (TaskLaunch, TaskIo, Harness) {
        let dir = tempfile::tempdir().unwrap();
        let a = Assignment {
            task_id: "task-1".into(),
            attempt: 2,
            command: vec!["sh".into(), "-c".into(), script.into()],
            env: [("MASTER_ADDR", "gpu-host-1"), ("RANK", "0")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            gpu_indices: vec![1, 3],
            batch_size: Some(64),
            ..Default::default()
        };
        // A node of its own per launch: the tests run at once, and an attempt's cgroup is
        // named by its node, task and attempt.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let node = format!(
            "node-{}",
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let l = TaskLaunch::from_assignment(&a, &node, dir.path(), false);
        std::fs::create_dir_all(&l.checkpoint_dir).unwrap();
        std::fs::create_dir_all(&l.results_dir).unwrap();
        let output = Arc::new(LogBuffer::new(10_000));
        let (started_tx, started) = oneshot::channel();
        let (stop, stop_rx) = watch::channel(None);
        let io = TaskIo {
            output: output.clone(),
            started: started_tx,
            stop: stop_rx,
        };
        (
            l,
            io,
            Harness {
                output,
                started,
                stop,
                _dir: dir,
            },
        )
    }

    fn lines(h: &Harness) -> Vec<AgentLogLine> {
        h.output.take_batch(usize::MAX)
    }

    fn reason(o: &RunOutcome, h: &Harness) -> ExitReason {
        classify_exit(
            Some(o.exit_code),
            o.oom_killed,
            h.output.oom_detected(),
            o.stopped,
        )
    }

    #[tokio::test]
    async fn output_on_both_streams_and_exit_code() {
        let (l, io, mut h) = launch("echo hi; echo err >&2; exit 3");
        let o = ProcessRuntime::trusted().run(l, io).await.unwrap();
        assert!(h.started.try_recv().unwrap().pid.is_some());
        assert_eq!(o.exit_code, 3);
        assert_eq!(reason(&o, &h), ExitReason::Error);
        let ls = lines(&h);
        assert!(
            ls.iter()
                .any(|l| l.stream == Stream::Stdout && l.line == "hi"),
            "{ls:?}"
        );
        assert!(
            ls.iter()
                .any(|l| l.stream == Stream::Stderr && l.line == "err"),
            "{ls:?}"
        );
    }

    /// The launch of `script` as a gang of `ranks` workers on this node, a GPU each.
    fn gang(script: &str, ranks: u32) -> (TaskLaunch, TaskIo, Harness) {
        let (mut l, io, h) = launch(script);
        l.workers = (0..ranks)
            .map(|r| crate::protocol::WorkerSlot {
                rank: r,
                gpu_indices: vec![r],
                env: [("RANK".to_string(), r.to_string())].into(),
            })
            .collect();
        (l, io, h)
    }

    #[tokio::test]
    async fn each_worker_is_a_process_with_its_gpu_rank_and_lines() {
        let (l, io, mut h) = gang("echo \"rank $RANK gpus $CUDA_VISIBLE_DEVICES\"", 3);
        let o = ProcessRuntime::trusted().run(l, io).await.unwrap();
        assert_eq!(o.exit_code, 0);
        assert!(h.started.try_recv().unwrap().pid.is_some());
        let mut got: Vec<(Option<u32>, String)> =
            lines(&h).into_iter().map(|l| (l.rank, l.line)).collect();
        got.sort();
        assert_eq!(
            got,
            (0..3)
                .map(|r| (Some(r), format!("rank {r} gpus {r}")))
                .collect::<Vec<_>>()
        );
    }

    #[tokio::test]
    async fn a_failing_worker_stops_the_others() {
        // Rank 1 fails at once; the others would wait for it for a minute.
        let (l, io, h) = gang("if [ \"$RANK\" = 1 ]; then exit 3; fi; sleep 60", 3);
        let began = Instant::now();
        let o = ProcessRuntime::trusted().run(l, io).await.unwrap();
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "{:?}",
            began.elapsed()
        );
        assert_eq!(o.exit_code, 3);
        assert!(!o.stopped);
        assert!(lines(&h).iter().any(|l| l
            .line
            .contains("worker 1 exited with code 3: stopping the other workers")),);
    }

    #[tokio::test]
    async fn a_python_script_s_stdout_and_stderr_keep_their_order() {
        let script = "import sys, time\n\
            for i in range(6):\n\
            \x20   print(f'out {i}')\n\
            \x20   print(f'err {i}', file=sys.stderr)\n\
            \x20   time.sleep(0.02)\n";
        let (l, io, h) = launch(&format!("python3 -c \"{script}\""));
        let o = ProcessRuntime::trusted().run(l, io).await.unwrap();
        assert_eq!(o.exit_code, 0);
        let got: Vec<String> = lines(&h).into_iter().map(|l| l.line).collect();
        let want: Vec<String> = (0..6)
            .flat_map(|i| [format!("out {i}"), format!("err {i}")])
            .collect();
        assert_eq!(got, want);
    }

    #[tokio::test]
    async fn success_and_oom() {
        let (l, io, h) = launch("echo done");
        let o = ProcessRuntime::trusted().run(l, io).await.unwrap();
        assert_eq!((o.exit_code, reason(&o, &h)), (0, ExitReason::Success));

        let (l, io, h) = launch(
            "echo 'RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB' >&2; exit 1",
        );
        let o = ProcessRuntime::trusted().run(l, io).await.unwrap();
        assert_eq!((o.exit_code, reason(&o, &h)), (1, ExitReason::Oom));
    }

    #[tokio::test]
    async fn task_environment() {
        let (l, io, h) = launch("env");
        let home = l.home_dir();
        let ckpt = l.checkpoint_dir.clone();
        let results = l.results_dir.clone();
        let o = ProcessRuntime::trusted().run(l, io).await.unwrap();
        assert_eq!(o.exit_code, 0);
        let env: Vec<String> = lines(&h).into_iter().map(|l| l.line).collect();
        let has = |kv: String| assert!(env.contains(&kv), "{kv} missing from {env:?}");
        has("AUTODL_TASK_ID=task-1".into());
        has("AUTODL_ATTEMPT=2".into());
        has("AUTODL_IS_RESTORED=0".into());
        has("AUTODL_BATCH_SIZE=64".into());
        has(format!("AUTODL_CHECKPOINT_DIR={}", ckpt.display()));
        has(format!("AUTODL_RESULTS_DIR={}", results.display()));
        has("CUDA_VISIBLE_DEVICES=1,3".into());
        has("MASTER_ADDR=gpu-host-1".into());
        has("RANK=0".into());
        has(format!("HOME={}", home.display()));
        assert!(
            env.iter().any(|l| l.starts_with("PATH=")),
            "host PATH is inherited"
        );
        // `cargo test` runs this process with CARGO_* variables: none of them may leak.
        assert!(std::env::vars().any(|(k, _)| k.starts_with("CARGO")));
        assert!(
            !env.iter().any(|l| l.starts_with("CARGO")),
            "the agent's environment leaked: {env:?}"
        );
    }

    #[tokio::test]
    async fn runs_in_its_home_folder() {
        let (l, io, h) = launch("pwd; touch \"$AUTODL_RESULTS_DIR/out.txt\"");
        let task_dir = l.home_dir();
        let results = l.results_dir.clone();
        let o = ProcessRuntime::trusted().run(l, io).await.unwrap();
        assert_eq!(o.exit_code, 0);
        let pwd = lines(&h)[0].line.clone();
        assert_eq!(
            Path::new(&pwd).canonicalize().unwrap(),
            task_dir.canonicalize().unwrap()
        );
        assert!(results.join("out.txt").exists());
    }

    #[tokio::test]
    async fn sigterm_within_grace_is_stopped() {
        let (l, io, h) = launch(
            "trap 'echo saving checkpoint; exit 0' TERM; echo ready; while true; do sleep 0.1; done",
        );
        let stop = h.stop.clone();
        let output = h.output.clone();
        let run = tokio::spawn(async move { ProcessRuntime::trusted().run(l, io).await });
        wait_for_line(&output, "ready").await;
        let t = Instant::now();
        stop.send(Some(Duration::from_secs(10))).unwrap();
        let o = run.await.unwrap().unwrap();
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert_eq!(o.exit_code, 0);
        assert!(o.stopped);
        assert_eq!(reason(&o, &h), ExitReason::Stopped);
        assert!(lines(&h).iter().any(|l| l.line == "saving checkpoint"));
    }

    #[tokio::test]
    async fn ignoring_sigterm_gets_sigkill_after_grace() {
        let (l, io, h) = launch("trap '' TERM; echo ready; while true; do sleep 0.1; done");
        let stop = h.stop.clone();
        let output = h.output.clone();
        let run = tokio::spawn(async move { ProcessRuntime::trusted().run(l, io).await });
        wait_for_line(&output, "ready").await;
        let t = Instant::now();
        stop.send(Some(Duration::from_millis(700))).unwrap();
        let o = run.await.unwrap().unwrap();
        let took = t.elapsed();
        assert!(
            took >= Duration::from_millis(650) && took < Duration::from_secs(5),
            "{took:?}"
        );
        assert_eq!(o.exit_code, 137);
        assert_eq!(reason(&o, &h), ExitReason::Stopped);
    }

    #[tokio::test]
    async fn stop_reaches_the_whole_process_group() {
        // The leader waits on a child that ignores nothing: both must go.
        let (l, io, h) = launch("sleep 30 & echo ready; wait");
        let stop = h.stop.clone();
        let output = h.output.clone();
        let run = tokio::spawn(async move { ProcessRuntime::trusted().run(l, io).await });
        wait_for_line(&output, "ready").await;
        let t = Instant::now();
        stop.send(Some(Duration::from_secs(10))).unwrap();
        let o = run.await.unwrap().unwrap();
        assert!(t.elapsed() < Duration::from_secs(5));
        assert!(o.stopped);
    }

    #[tokio::test]
    async fn missing_command_and_program() {
        let (mut l, io, _h) = launch("true");
        l.command.clear();
        assert!(matches!(
            ProcessRuntime::trusted().run(l, io).await,
            Err(RuntimeError::NoCommand)
        ));
        let (mut l, io, _h) = launch("true");
        l.command = vec!["/nonexistent/autodl-test-binary".into()];
        assert!(matches!(
            ProcessRuntime::trusted().run(l, io).await,
            Err(RuntimeError::Spawn(_))
        ));
    }

    /// The sandbox as root: the task runs as a leased uid, sees an allow-listed environment,
    /// its own folders and the system's, nothing of the agent's state, and nothing it starts
    /// outlives the lease.
    #[tokio::test]
    async fn sandboxed_task_is_confined() {
        if !crate::isolation::is_root() {
            crate::skip("isolation needs root");
            return;
        }
        let rt = ProcessRuntime::detect(&crate::isolation::IsolationConfig::default()).unwrap();
        assert_eq!(
            rt.isolation(),
            IsolationLevel::Sandbox,
            "install bubblewrap"
        );
        let script = r#"
            echo "uid=$(id -u) name=$(id -un)"
            echo "home=$HOME pwd=$(pwd)"
            env | sed 's/^/env:/'
            test -e /proc/1/environ && cat /proc/1/environ >/dev/null 2>&1 && echo "read-pid1-env"
            ls "$STATE" >/dev/null 2>&1 && echo "listed-state"
            cat "$STATE/credential.json" 2>/dev/null && echo "read-credential"
            test -e /var/run/docker.sock -o -e /run/docker.sock && echo "sees-docker"
            test -e /root/.cargo && echo "sees-root-home"
            echo hello > "$AUTODL_RESULTS_DIR/out.txt" && echo "wrote-results"
            touch /etc/autodl-escape 2>/dev/null && echo "wrote-etc"
            setsid sh -c 'sleep 300' </dev/null >/dev/null 2>&1 &
            echo done
        "#;
        let (mut l, io, h) = launch(script);
        let state = l.task_dir.parent().unwrap().parent().unwrap().to_path_buf();
        std::fs::write(state.join("credential.json"), "secret").unwrap();
        crate::isolation::lock_down_state_dir(&state).unwrap();
        l.env.insert("STATE".into(), state.display().to_string());
        let pool = UidPool::new(
            crate::isolation::DEFAULT_TASK_UIDS,
            crate::isolation::DEFAULT_LOCK_DIR,
        )
        .unwrap();
        let lease = pool.lease().unwrap();
        let uid = lease.user().uid;
        l.user = Some(lease.user());
        crate::isolation::hand_over_task_dir(&l.task_dir, lease.user()).unwrap();
        let results = l.results_dir.clone();
        let o = rt.run(l, io).await.unwrap();
        assert_eq!(o.exit_code, 0);
        let out: Vec<String> = lines(&h).into_iter().map(|l| l.line).collect();
        assert!(out.contains(&format!("uid={uid} name=autodl")), "{out:?}");
        assert!(
            out.contains(&"home=/autodl/home pwd=/autodl/home".to_string()),
            "{out:?}"
        );
        for leak in [
            "read-pid1-env",
            "listed-state",
            "read-credential",
            "sees-docker",
            "sees-root-home",
            "wrote-etc",
        ] {
            assert!(!out.iter().any(|l| l == leak), "{leak}: {out:?}");
        }
        assert!(!out.iter().any(|l| l.starts_with("env:CARGO")), "{out:?}");
        assert!(
            out.iter()
                .any(|l| l == "env:AUTODL_RESULTS_DIR=/autodl/results"),
            "{out:?}"
        );
        assert_eq!(
            std::fs::read_to_string(results.join("out.txt")).unwrap(),
            "hello\n"
        );
        assert!(out.contains(&"done".to_string()));
        // The daemon it left behind dies with the lease.
        drop(lease);
        assert_eq!(
            signal_uid(uid, Signal::SIGCONT),
            0,
            "processes of uid {uid} survived"
        );
    }

    #[tokio::test]
    async fn sandboxed_task_gets_sigterm_and_its_grace() {
        if !crate::isolation::is_root() {
            crate::skip("isolation needs root");
            return;
        }
        let rt = ProcessRuntime::detect(&crate::isolation::IsolationConfig::default()).unwrap();
        let (mut l, io, h) =
            launch("trap 'echo saving; exit 0' TERM; echo ready; while true; do sleep 0.1; done");
        let pool = UidPool::new(
            crate::isolation::DEFAULT_TASK_UIDS,
            crate::isolation::DEFAULT_LOCK_DIR,
        )
        .unwrap();
        let lease = pool.lease().unwrap();
        l.user = Some(lease.user());
        crate::isolation::hand_over_task_dir(&l.task_dir, lease.user()).unwrap();
        let stop = h.stop.clone();
        let output = h.output.clone();
        let run = tokio::spawn(async move { rt.run(l, io).await });
        wait_for_line(&output, "ready").await;
        stop.send(Some(Duration::from_secs(10))).unwrap();
        let o = run.await.unwrap().unwrap();
        assert!(o.stopped);
        assert_eq!(o.exit_code, 0, "the trap ran and exited cleanly");
        assert!(lines(&h).iter().any(|l| l.line == "saving"));
    }

    async fn wait_for_line(out: &LogBuffer, want: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut seen = Vec::new();
        while Instant::now() < deadline {
            let batch = out.take_batch(usize::MAX);
            let found = batch.iter().any(|l| l.line == want);
            // Keep what we consumed for later assertions.
            seen.extend(batch);
            if found {
                out.requeue_front(seen);
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("no line {want:?}");
    }
}
