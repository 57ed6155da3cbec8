//! How tasks run: a trait with a Docker implementation (production) and a child-process one
//! (hosts without Docker, the in-process demo, tests).

mod docker;
mod gang;
pub mod leftovers;
mod process;
mod rendezvous;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{oneshot, watch};

pub use docker::DockerRuntime;
pub use process::ProcessRuntime;
pub use rendezvous::Rendezvous;

pub use crate::error::RuntimeError;
use crate::isolation::IsolationLevel;
use crate::logs::LogBuffer;
use crate::protocol::{Assignment, ExitReason, WorkerSlot};

/// Paths of the per-task folders as a task sees them in a container or in the sandbox.
pub const CONTAINER_CHECKPOINT_DIR: &str = "/autodl/checkpoints";
pub const CONTAINER_RESULTS_DIR: &str = "/autodl/results";
pub const CONTAINER_HOME_DIR: &str = "/autodl/home";
pub const CONTAINER_DATA_DIR: &str = "/autodl/data";
pub const CONTAINER_CODE_DIR: &str = "/autodl/code";
pub const CONTAINER_ENV_DIR: &str = "/autodl/env";

/// Puts the task's environment first on its `PATH` (and names it as the active virtualenv
/// when it is one) before the command: the same for the task, its workers, and every shell
/// or command a person runs in it, on every runtime, whatever `PATH` the image has.
const ACTIVATE: &str = r#"PATH="$AUTODL_ENV_DIR/bin:$PATH"; export PATH; if [ -f "$AUTODL_ENV_DIR/pyvenv.cfg" ]; then VIRTUAL_ENV="$AUTODL_ENV_DIR"; export VIRTUAL_ENV; unset PYTHONHOME; fi; exec "$@""#;

/// The node's copy of the task's environment ([`crate::environments`]).
#[derive(Debug, Clone, PartialEq)]
pub struct EnvDir {
    pub host: PathBuf,
    /// Only while it is being built: every task sees it read-only.
    pub writable: bool,
}

/// A dataset the task reads: where it is on the host and where the task finds it.
#[derive(Debug, Clone, PartialEq)]
pub struct DataMount {
    /// On the host: the node's cache of an `s3://` dataset, or a path resolved inside a
    /// dataset root (links followed, so the mount cannot point outside the root).
    pub host: PathBuf,
    /// A host path under a dataset root keeps its name inside containers; cached `s3://`
    /// data appears at [`CONTAINER_DATA_DIR`].
    pub requested_path: Option<String>,
}

/// What a person's terminal in a task says it is, unless the task set `TERM` itself:
/// full-screen programs (vim, htop, tmux) and colours need to know, and the CLI's shell and
/// the web terminal (xterm.js) both speak xterm.
pub(crate) fn terminal_env(
    terminal: bool,
    launch: &TaskLaunch,
) -> Option<(&'static str, &'static str)> {
    (terminal && !launch.env.contains_key("TERM")).then_some(("TERM", "xterm-256color"))
}

/// Everything a runtime needs to start one attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskLaunch {
    pub task_id: String,
    pub attempt: u32,
    pub node_id: String,
    pub image: String,
    pub command: Vec<String>,
    /// The task's own environment: what the server sends and the user asked for. The folder,
    /// data and GPU-visibility variables are added by the runtime (host paths for plain
    /// processes, `/autodl/...` in containers and the sandbox); nothing of the agent's own
    /// environment is in here.
    pub env: BTreeMap<String, String>,
    pub gpu_indices: Vec<u32>,
    /// True when `gpu_indices` name real devices that Docker can pass through.
    pub real_gpus: bool,
    pub cpu: Option<f64>,
    pub memory: Option<u64>,
    /// `data_path` as the task asked for it; `data` once the agent made it available.
    pub data_path: Option<String>,
    pub data: Option<DataMount>,
    /// `<state_dir>/tasks/<task_id>`, shared by all attempts of the task, so a retried attempt
    /// finds the checkpoints of the previous one. Created before the launch.
    pub task_dir: PathBuf,
    pub checkpoint_dir: PathBuf,
    pub results_dir: PathBuf,
    /// A checkpoint was downloaded into `checkpoint_dir` before the start.
    pub restored: bool,
    /// The task's code bundle was unpacked into `code_dir()`: the task runs there.
    pub has_code: bool,
    /// Where a container sees the checkpoint folder when the task named an absolute path
    /// (`checkpoint.save_to: "/checkpoints"`); `/autodl/checkpoints` otherwise.
    pub checkpoint_mount: Option<String>,
    /// The unprivileged user the task runs as (isolated nodes); `None` runs it as the agent.
    pub user: Option<crate::isolation::TaskUser>,
    /// The agent's state folder (its own: tasks cannot write there).
    pub state_dir: PathBuf,
    /// The worker processes of this attempt on this node, each with its own GPUs and
    /// variables; empty: one process.
    pub workers: Vec<WorkerSlot>,
    /// The worker this launch starts (one of `workers` of the attempt's launch); `None`: the
    /// attempt's one process, or a command run in the attempt.
    pub rank: Option<u32>,
    /// How long a gang's workers have to meet, judged where rank 0 runs ([`Rendezvous`]).
    pub rendezvous_timeout: Option<Duration>,
    /// What the task's environment is built from (`setup`, `requirements`).
    pub environment: Option<autodl_common::agent::EnvironmentSpec>,
    /// The environment once built (or being built), shown at [`CONTAINER_ENV_DIR`].
    pub env_dir: Option<EnvDir>,
}

/// One process of an attempt: its rank when the attempt runs a process per worker.
#[derive(Debug, Clone)]
pub struct WorkerLaunch {
    pub rank: Option<u32>,
    pub launch: TaskLaunch,
}

/// How long a gang's other workers get to end (SIGTERM, then SIGKILL) once one of them
/// failed: what a training script needs to leave its collective, not to save.
pub(crate) const PEER_GRACE: Duration = Duration::from_secs(10);

/// Variables only the runtime sets: a task's own `env` cannot point them elsewhere.
const RUNTIME_OWNED: [&str; 10] = [
    "AUTODL_CODE_DIR",
    "AUTODL_ENV_DIR",
    "AUTODL_RESTORE_PATH",
    "AUTODL_CHECKPOINT_DIR",
    "AUTODL_RESULTS_DIR",
    "AUTODL_DATA_PATH",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "HOME",
];

impl TaskLaunch {
    /// Builds the launch for an assignment; the task's folders live under
    /// `<state_dir>/tasks/<task_id>/`.
    pub fn from_assignment(
        a: &Assignment,
        node_id: &str,
        state_dir: &Path,
        real_gpus: bool,
    ) -> TaskLaunch {
        // Absolute: the task runs in its own working directory (and Docker mounts need it).
        let state_dir = std::path::absolute(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
        let task_dir = state_dir.join("tasks").join(safe_name(&a.task_id));
        let mut env = BTreeMap::new();
        env.insert("AUTODL_TASK_ID".to_string(), a.task_id.clone());
        env.insert("AUTODL_ATTEMPT".to_string(), a.attempt.to_string());
        env.insert("AUTODL_NODE_ID".to_string(), node_id.to_string());
        if let Some(b) = a.batch_size {
            env.insert("AUTODL_BATCH_SIZE".to_string(), b.to_string());
        }
        if let Some(i) = a.checkpoint.as_ref().and_then(|c| c.interval) {
            env.insert("AUTODL_CHECKPOINT_INTERVAL".to_string(), i.to_string());
        }
        // A Python training script writes its stdout through a block buffer when it is a pipe,
        // so its prints would reach the log long after its warnings on stderr: unbuffered
        // output keeps the two streams in the order they were written. A task may set it off.
        env.insert("PYTHONUNBUFFERED".to_string(), "1".to_string());
        // The server's values (rank, master address, batch size after OOM recovery, ...) win.
        env.extend(a.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        // Restored or not is known once the checkpoint is downloaded (`mark_restored`).
        env.insert("AUTODL_IS_RESTORED".to_string(), "0".to_string());
        for owned in RUNTIME_OWNED {
            env.remove(owned);
        }
        TaskLaunch {
            task_id: a.task_id.clone(),
            attempt: a.attempt,
            node_id: node_id.to_string(),
            image: a.image.clone(),
            command: a.command.clone(),
            env,
            gpu_indices: a.gpu_indices.clone(),
            real_gpus,
            // 0 in the assignment: no limit.
            cpu: (a.cpu > 0.0).then_some(a.cpu),
            memory: (a.memory > 0).then_some(a.memory),
            data_path: a.data_path.clone(),
            data: None,
            checkpoint_dir: task_dir.join("checkpoints"),
            results_dir: task_dir.join("results"),
            task_dir,
            restored: false,
            has_code: false,
            // Only a folder apart from the system's and the platform's (the server refuses
            // others; an agent trusts no assignment): shown over /etc, a folder the task writes
            // would run as root in its sandbox.
            checkpoint_mount: a
                .checkpoint
                .as_ref()
                .and_then(|c| c.save_to.clone())
                .filter(|p| {
                    p.starts_with('/')
                        && autodl_common::tasks::checkpoint_mount_allowed(p)
                            .inspect_err(|why| tracing::warn!(task = a.task_id, %why, "the checkpoint folder is shown at the usual place instead"))
                            .is_ok()
                }),
            user: None,
            state_dir,
            workers: a
                .workers
                .iter()
                .map(|w| WorkerSlot {
                    rank: w.rank,
                    gpu_indices: w.gpu_indices.clone(),
                    // A worker's own variables are its rank's; nothing it could use to point
                    // the runtime's folders or GPUs elsewhere.
                    env: w
                        .env
                        .iter()
                        .filter(|(k, _)| !RUNTIME_OWNED.contains(&k.as_str()))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                })
                .collect(),
            rank: None,
            rendezvous_timeout: a.rendezvous_timeout.map(Duration::from_secs),
            environment: a.environment.clone(),
            env_dir: None,
        }
    }

    /// `argv` run with the task's environment active, when it has one.
    pub fn in_environment(&self, argv: &[String]) -> Vec<String> {
        if self.env_dir.is_none() || argv.is_empty() {
            return argv.to_vec();
        }
        ["/bin/sh", "-c", ACTIVATE, "autodl-env"]
            .iter()
            .map(|s| s.to_string())
            .chain(argv.iter().cloned())
            .collect()
    }

    /// The file the task's shell reads its variables from: one per worker, so that workers
    /// starting together never read one another's.
    pub fn env_file(&self) -> PathBuf {
        match self.rank {
            Some(r) => self.task_dir.join(format!(".autodl-env-{r}")),
            None => self.task_dir.join(".autodl-env"),
        }
    }

    /// Where worker `rank` leaves its results: rank 0 at the top of the results folder, the
    /// others in a folder each, so that what every worker leaves is kept.
    pub fn worker_results_dir(&self, rank: u32) -> PathBuf {
        match rank {
            0 => self.results_dir.clone(),
            r => self.results_dir.join(format!("rank-{r}")),
        }
    }

    /// The processes to start: one per worker (each with its GPUs and its variables on top
    /// of the attempt's), or the attempt itself as one process. One process per node (the
    /// `torchrun` and `none` launchers) on a node other than the first leaves its results in
    /// a folder of its node's (`node-<k>`), so no node's replace the first's at the top.
    pub fn worker_launches(&self) -> Vec<WorkerLaunch> {
        if self.workers.is_empty() {
            let mut launch = self.clone();
            let node_rank = self
                .env
                .get("NODE_RANK")
                .and_then(|r| r.parse::<u32>().ok())
                .unwrap_or(0);
            if node_rank > 0 {
                launch.results_dir = self.results_dir.join(format!("node-{node_rank}"));
            }
            return vec![WorkerLaunch { rank: None, launch }];
        }
        self.workers
            .iter()
            .map(|w| {
                let mut launch = self.clone();
                launch.workers = Vec::new();
                launch.rank = Some(w.rank);
                launch.results_dir = self.worker_results_dir(w.rank);
                launch.gpu_indices = w.gpu_indices.clone();
                launch.env.extend(w.env.clone());
                WorkerLaunch {
                    rank: Some(w.rank),
                    launch,
                }
            })
            .collect()
    }

    /// The checkpoint folder now holds a restored checkpoint: the task sees
    /// AUTODL_IS_RESTORED=1 and AUTODL_RESTORE_PATH (the checkpoint folder, as the runtime
    /// shows it to the task).
    pub fn mark_restored(&mut self) {
        self.restored = true;
        self.env
            .insert("AUTODL_IS_RESTORED".to_string(), "1".to_string());
    }

    /// Comma-separated device indices, as the CUDA and NVIDIA variables take them.
    pub fn gpu_list(&self) -> String {
        self.gpu_indices
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn home_dir(&self) -> PathBuf {
        self.task_dir.join("home")
    }

    /// The unpacked code bundle; made fresh for each attempt.
    pub fn code_dir(&self) -> PathBuf {
        self.task_dir.join("code")
    }

    /// On a node with simulated GPUs, where the agent writes the attempt's GPUs for its
    /// `nvidia-smi` ([`crate::gpu::smi`]): in the agent's state folder, never the task's to
    /// change.
    pub fn simulated_gpus_dir(&self) -> PathBuf {
        self.state_dir
            .join("smi")
            .join(format!("{}-{}", self.task_id, self.attempt))
    }

    pub fn tmp_dir(&self) -> PathBuf {
        self.task_dir.join("tmp")
    }

    /// Where cached `s3://` data is linked for tasks that see host paths.
    pub fn data_link_dir(&self) -> PathBuf {
        self.task_dir.join("data")
    }

    /// The folders as a task in a container or the sandbox sees them.
    pub fn mounted_paths(&self) -> TaskPaths {
        TaskPaths {
            checkpoints: self
                .checkpoint_mount
                .clone()
                .unwrap_or_else(|| CONTAINER_CHECKPOINT_DIR.to_string()),
            results: CONTAINER_RESULTS_DIR.into(),
            home: CONTAINER_HOME_DIR.into(),
            code: self.has_code.then(|| CONTAINER_CODE_DIR.into()),
            env: self.env_dir.as_ref().map(|_| CONTAINER_ENV_DIR.into()),
            data: self.data.as_ref().map(|d| {
                d.requested_path
                    .clone()
                    .unwrap_or_else(|| CONTAINER_DATA_DIR.to_string())
            }),
        }
    }

    /// The folders as a plain process sees them (host paths).
    pub fn host_paths(&self) -> TaskPaths {
        let shown = |p: &Path| p.display().to_string();
        TaskPaths {
            checkpoints: shown(&self.checkpoint_dir),
            results: shown(&self.results_dir),
            home: shown(&self.home_dir()),
            code: self.has_code.then(|| shown(&self.code_dir())),
            env: self.env_dir.as_ref().map(|e| shown(&e.host)),
            data: self.data.as_ref().map(|d| match &d.requested_path {
                Some(p) => p.clone(),
                None if self.user.is_some() => shown(&self.data_link_dir()),
                None => shown(&d.host),
            }),
        }
    }

    /// The task's environment with the folder, data and GPU variables for `paths`, and the
    /// operator's variables underneath the task's own.
    pub fn full_env(
        &self,
        paths: &TaskPaths,
        operator: &BTreeMap<String, String>,
        gpu_visibility: bool,
    ) -> BTreeMap<String, String> {
        let mut env: BTreeMap<String, String> = operator
            .iter()
            .filter(|(k, _)| !RUNTIME_OWNED.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        env.extend(self.env.clone());
        env.insert("HOME".into(), paths.home.clone());
        env.insert("AUTODL_CHECKPOINT_DIR".into(), paths.checkpoints.clone());
        env.insert("AUTODL_RESULTS_DIR".into(), paths.results.clone());
        if self.restored {
            env.insert("AUTODL_RESTORE_PATH".into(), paths.checkpoints.clone());
        }
        if let Some(d) = &paths.data {
            env.insert("AUTODL_DATA_PATH".into(), d.clone());
        }
        if let Some(c) = &paths.code {
            env.insert("AUTODL_CODE_DIR".into(), c.clone());
        }
        if let Some(e) = &paths.env {
            env.insert("AUTODL_ENV_DIR".into(), e.clone());
        }
        if gpu_visibility {
            // NVML numbers GPUs in PCI order; CUDA's default order differs on mixed hosts.
            env.insert("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into());
            env.insert("CUDA_VISIBLE_DEVICES".into(), self.gpu_list());
            env.insert("NVIDIA_VISIBLE_DEVICES".into(), self.gpu_list());
        }
        env
    }
}

/// Where a task finds its folders.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskPaths {
    pub checkpoints: String,
    pub results: String,
    pub home: String,
    /// The unpacked code bundle, when the task has one: its working directory.
    pub code: Option<String>,
    /// The task's environment, when it has one.
    pub env: Option<String>,
    pub data: Option<String>,
}

impl TaskPaths {
    /// Where the task starts: its code when it brought some, its home folder otherwise.
    pub fn workdir(&self) -> &str {
        self.code.as_deref().unwrap_or(&self.home)
    }
}

/// Keeps ids usable as file and container names whatever the server sends.
pub fn safe_name(id: &str) -> String {
    let s: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    match s.as_str() {
        "" | "." | ".." => format!("_{s}"),
        _ => s,
    }
}

/// Sent once the process or container is running.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Started {
    /// Host pid of the task's main process, for matching GPU processes to tasks.
    pub pid: Option<u32>,
}

/// The agent's side of a running task.
pub struct TaskIo {
    pub output: Arc<LogBuffer>,
    pub started: oneshot::Sender<Started>,
    /// Becomes `Some(grace)` when the agent wants the task stopped: SIGTERM, then SIGKILL
    /// after the grace period.
    pub stop: watch::Receiver<Option<Duration>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunOutcome {
    /// Exit status; 128 + signal number when a signal ended it (137 after SIGKILL).
    pub exit_code: i32,
    /// The kernel's OOM killer ended it (container memory limit).
    pub oom_killed: bool,
    /// The agent stopped it on request.
    pub stopped: bool,
    /// The gang never formed, and why ([`Rendezvous::unformed`]): the agent ended it.
    pub unformed: Option<String>,
}

#[async_trait]
pub trait Runtime: Send + Sync {
    fn name(&self) -> &'static str;

    /// How this runtime keeps tasks apart (reported to the server).
    fn isolation(&self) -> IsolationLevel;

    /// How tasks are held to their memory, CPU and process limits, for the node's page.
    fn limits(&self) -> String {
        String::new()
    }

    /// What network a task gets, for the node's page.
    fn network(&self) -> String {
        String::new()
    }

    /// Tasks reach their folders by host paths as their own uid (no mount namespace shows
    /// them): the folders must be reachable, and cached data is linked in for them.
    fn tasks_see_host_paths(&self) -> bool {
        false
    }

    /// The agent leases a task uid for every attempt and hands the task's folders to it.
    fn task_users(&self) -> bool {
        matches!(
            self.isolation(),
            IsolationLevel::Sandbox | IsolationLevel::Uid
        )
    }

    /// Removes what earlier agent runs left behind on `node_id` (containers or process
    /// groups of attempts not in `keep`, noted under `state_dir`), e.g. after an agent crash.
    async fn cleanup(
        &self,
        node_id: &str,
        state_dir: &Path,
        keep: &[(String, u32)],
    ) -> Result<(), RuntimeError>;

    /// Runs one attempt to its end. Returns an error only when the task could not be started;
    /// a task that ran and failed is an `Ok` outcome with its exit code.
    async fn run(&self, launch: TaskLaunch, io: TaskIo) -> Result<RunOutcome, RuntimeError>;

    /// Starts a command inside a running attempt, confined as the attempt is (its user, its
    /// sandbox or container, its environment and folders).
    async fn exec(&self, launch: &TaskLaunch, spec: &ExecSpec) -> Result<Exec, RuntimeError>;

    /// A connection to a port the attempt listens on, made from where the task's own
    /// network is (its loopback, or its container's address).
    async fn connect_port(
        &self,
        launch: &TaskLaunch,
        port: u16,
        timeout: Duration,
    ) -> Result<tokio::net::TcpStream, RuntimeError>;
}

/// A command someone runs in a task: a shell (no command, a terminal) or `autodl exec`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecSpec {
    pub command: Vec<String>,
    pub tty: bool,
    pub cols: u16,
    pub rows: u16,
}

impl ExecSpec {
    /// What to run: the command, or the login shell of the task's environment (bash when it
    /// has one).
    pub fn argv(&self) -> Vec<String> {
        if self.command.is_empty() {
            [
                "/bin/sh",
                "-c",
                "command -v bash >/dev/null 2>&1 && exec bash -l || exec sh -l",
            ]
            .map(String::from)
            .to_vec()
        } else {
            self.command.clone()
        }
    }
}

pub type ExecReader = std::pin::Pin<Box<dyn tokio::io::AsyncRead + Send>>;
pub type ExecWriter = std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>;

/// A started command: its streams and a handle on it. Dropping it ends the command.
pub struct Exec {
    /// The terminal's output with a tty, stdout without.
    pub stdout: ExecReader,
    /// Without a tty.
    pub stderr: Option<ExecReader>,
    pub stdin: ExecWriter,
    pub control: Box<dyn ExecControl>,
}

#[async_trait]
pub trait ExecControl: Send {
    async fn resize(&mut self, cols: u16, rows: u16) -> Result<(), RuntimeError>;
    /// Waits for the end: the exit status (128 + signal when a signal ended it).
    async fn wait(&mut self) -> Result<i32, RuntimeError>;
    /// Says when the command has exited, where its output can outlast it (a terminal that
    /// what it started in the background still holds open): the tunnel then ends at its exit,
    /// not at the output's end. None where the output ends with the command.
    fn exited(&mut self) -> Option<tokio::sync::watch::Receiver<Option<i32>>> {
        None
    }
}

/// The reason reported to the server. A stop on request wins (the exit code of a stopped task
/// says nothing about the task), then a clean exit (a task that caught an OOM and recovered
/// succeeded), then OOM, then error.
pub fn classify_exit(
    exit_code: Option<i32>,
    oom_killed: bool,
    oom_in_output: bool,
    stopped: bool,
) -> ExitReason {
    if stopped {
        ExitReason::Stopped
    } else if exit_code == Some(0) {
        ExitReason::Success
    } else if oom_killed || oom_in_output {
        ExitReason::Oom
    } else {
        ExitReason::Error
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::CheckpointSpec;

    #[test]
    fn classification() {
        assert_eq!(
            classify_exit(Some(0), false, false, false),
            ExitReason::Success
        );
        assert_eq!(
            classify_exit(Some(0), false, true, false),
            ExitReason::Success
        );
        assert_eq!(classify_exit(Some(1), false, true, false), ExitReason::Oom);
        assert_eq!(
            classify_exit(Some(137), true, false, false),
            ExitReason::Oom
        );
        assert_eq!(
            classify_exit(Some(3), false, false, false),
            ExitReason::Error
        );
        assert_eq!(classify_exit(None, false, false, false), ExitReason::Error);
        assert_eq!(
            classify_exit(Some(137), false, true, true),
            ExitReason::Stopped
        );
    }

    #[test]
    fn launch_env_from_assignment() {
        let a = Assignment {
            task_id: "t/1".into(),
            attempt: 3,
            command: vec!["python".into()],
            env: [
                ("RANK", "1"),
                ("AUTODL_BATCH_SIZE", "16"),
                ("AUTODL_CHECKPOINT_DIR", "/nope"),
                ("HOME", "/nope"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            batch_size: Some(32),
            checkpoint: Some(CheckpointSpec {
                interval: Some(600),
                save_to: None,
                keep: None,
            }),
            gpu_indices: vec![2, 3],
            ..Default::default()
        };
        // A relative state folder (the demo's `data/demo-agents`) still gives absolute paths:
        // the task runs in its own working directory.
        let rel = TaskLaunch::from_assignment(&a, "n1", Path::new("data/agent"), false);
        assert!(rel.results_dir.is_absolute() && rel.checkpoint_dir.is_absolute());
        assert!(rel.results_dir.ends_with("data/agent/tasks/t_1/results"));
        let l = TaskLaunch::from_assignment(&a, "n1", Path::new("/state"), false);
        assert_eq!(l.env["AUTODL_TASK_ID"], "t/1");
        assert_eq!(l.env["AUTODL_ATTEMPT"], "3");
        assert_eq!(l.env["AUTODL_BATCH_SIZE"], "16", "the server's env wins");
        assert_eq!(l.env["AUTODL_IS_RESTORED"], "0");
        assert!(!l.env.contains_key("AUTODL_RESTORE_PATH"));
        let mut r = l.clone();
        r.mark_restored();
        assert_eq!(r.env["AUTODL_IS_RESTORED"], "1");
        assert_eq!(l.env["AUTODL_CHECKPOINT_INTERVAL"], "600");
        assert_eq!(l.env["RANK"], "1");
        assert!(!l.env.contains_key("AUTODL_CHECKPOINT_DIR"));
        assert!(!l.env.contains_key("HOME"), "the runtime owns HOME");
        let operator = BTreeMap::from([
            (
                "LD_LIBRARY_PATH".to_string(),
                "/usr/local/cuda/lib64".to_string(),
            ),
            ("RANK".to_string(), "9".to_string()),
            ("HOME".to_string(), "/root".to_string()),
        ]);
        let full = r.full_env(&r.mounted_paths(), &operator, true);
        assert_eq!(full["LD_LIBRARY_PATH"], "/usr/local/cuda/lib64");
        assert_eq!(
            full["RANK"], "1",
            "the task's own values win over the operator's"
        );
        assert_eq!(full["HOME"], "/autodl/home");
        assert_eq!(full["AUTODL_CHECKPOINT_DIR"], "/autodl/checkpoints");
        assert_eq!(full["AUTODL_RESTORE_PATH"], "/autodl/checkpoints");
        assert_eq!(full["CUDA_VISIBLE_DEVICES"], "2,3");
        let host = l.full_env(&l.host_paths(), &BTreeMap::new(), false);
        assert_eq!(
            host["AUTODL_CHECKPOINT_DIR"],
            "/state/tasks/t_1/checkpoints"
        );
        assert!(
            !host.contains_key("CUDA_VISIBLE_DEVICES") && !host.contains_key("AUTODL_RESTORE_PATH")
        );
        assert_eq!(l.checkpoint_dir, Path::new("/state/tasks/t_1/checkpoints"));
        assert_eq!(l.results_dir, Path::new("/state/tasks/t_1/results"));
        assert_eq!(l.gpu_list(), "2,3");
        assert_eq!(safe_name(".."), "_..");
    }

    /// What each process leaves lands where the upload of its node keeps it apart from the
    /// other nodes': rank 0's at the top, other ranks in `rank-<r>`, one process of a node
    /// other than the first in `node-<k>`.
    #[test]
    fn every_process_leaves_results_in_a_folder_of_its_own() {
        let one_per_node = |node_rank: &str| Assignment {
            task_id: "t".into(),
            env: [("NODE_RANK".to_string(), node_rank.to_string())].into(),
            ..Default::default()
        };
        let dirs = |a: &Assignment| -> Vec<PathBuf> {
            TaskLaunch::from_assignment(a, "n", Path::new("/s"), false)
                .worker_launches()
                .into_iter()
                .map(|w| w.launch.results_dir)
                .collect()
        };
        assert_eq!(dirs(&one_per_node("0")), [Path::new("/s/tasks/t/results")]);
        assert_eq!(
            dirs(&one_per_node("2")),
            [Path::new("/s/tasks/t/results/node-2")]
        );
        let mut workers = one_per_node("1");
        workers.workers = [2, 3]
            .into_iter()
            .map(|rank| autodl_common::agent::WorkerSlot {
                rank,
                gpu_indices: vec![rank - 2],
                env: BTreeMap::new(),
            })
            .collect();
        assert_eq!(
            dirs(&workers),
            [
                Path::new("/s/tasks/t/results/rank-2"),
                Path::new("/s/tasks/t/results/rank-3")
            ]
        );
    }
}
