//! How tasks run: a trait with a Docker implementation (production) and a child-process one
//! (hosts without Docker, the in-process demo, tests).

mod docker;
mod process;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{oneshot, watch};

pub use docker::DockerRuntime;
pub use process::ProcessRuntime;

pub use crate::error::RuntimeError;
use crate::logs::LogBuffer;
use crate::protocol::{Assignment, ExitReason};

/// Container paths of the per-task folders.
pub const CONTAINER_CHECKPOINT_DIR: &str = "/autodl/checkpoints";
pub const CONTAINER_RESULTS_DIR: &str = "/autodl/results";

/// Everything a runtime needs to start one attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskLaunch {
    pub task_id: String,
    pub attempt: u32,
    pub node_id: String,
    pub image: String,
    pub command: Vec<String>,
    /// The task's environment without the folder and GPU-visibility variables, which depend on
    /// the runtime (host paths for processes, container paths for Docker).
    pub env: BTreeMap<String, String>,
    pub gpu_indices: Vec<u32>,
    /// True when `gpu_indices` name real devices that Docker can pass through.
    pub real_gpus: bool,
    pub cpu: Option<f64>,
    pub memory: Option<u64>,
    pub data_path: Option<String>,
    /// Host folders, created before the launch.
    pub checkpoint_dir: PathBuf,
    pub results_dir: PathBuf,
    /// A checkpoint was downloaded into `checkpoint_dir` before the start.
    pub restored: bool,
    /// Where a container sees the checkpoint folder when the task named an absolute path
    /// (`checkpoint.save_to: "/checkpoints"`); `/autodl/checkpoints` otherwise.
    pub checkpoint_mount: Option<String>,
}

impl TaskLaunch {
    /// Builds the launch for an assignment. The folders live under
    /// `<state_dir>/tasks/<task_id>/` and are shared by all attempts of the task, so a retried
    /// attempt finds the checkpoints of the previous one.
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
        if let Some(p) = &a.data_path {
            env.insert("AUTODL_DATA_PATH".to_string(), p.clone());
        }
        if let Some(i) = a.checkpoint.as_ref().and_then(|c| c.interval) {
            env.insert("AUTODL_CHECKPOINT_INTERVAL".to_string(), i.to_string());
        }
        // The server's values (rank, master address, batch size after OOM recovery, ...) win.
        env.extend(a.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        // Restored or not is known once the checkpoint is downloaded (`mark_restored`).
        env.insert("AUTODL_IS_RESTORED".to_string(), "0".to_string());
        for owned in [
            "AUTODL_RESTORE_PATH",
            "AUTODL_CHECKPOINT_DIR",
            "AUTODL_RESULTS_DIR",
            "CUDA_VISIBLE_DEVICES",
            "NVIDIA_VISIBLE_DEVICES",
        ] {
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
            cpu: a.cpu,
            memory: a.memory,
            data_path: a.data_path.clone(),
            checkpoint_dir: task_dir.join("checkpoints"),
            results_dir: task_dir.join("results"),
            restored: false,
            checkpoint_mount: a
                .checkpoint
                .as_ref()
                .and_then(|c| c.save_to.clone())
                .filter(|p| p.starts_with('/') && !p.contains(':') && p != "/"),
        }
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunOutcome {
    /// Exit status; 128 + signal number when a signal ended it (137 after SIGKILL).
    pub exit_code: i32,
    /// The kernel's OOM killer ended it (container memory limit).
    pub oom_killed: bool,
    /// The agent stopped it on request.
    pub stopped: bool,
}

#[async_trait]
pub trait Runtime: Send + Sync {
    fn name(&self) -> &'static str;

    /// Removes what earlier agent runs left behind on `node_id` (containers of attempts not
    /// in `keep`), e.g. after an agent crash.
    async fn cleanup(&self, _node_id: &str, _keep: &[(String, u32)]) -> Result<(), RuntimeError> {
        Ok(())
    }

    /// Runs one attempt to its end. Returns an error only when the task could not be started;
    /// a task that ran and failed is an `Ok` outcome with its exit code.
    async fn run(&self, launch: TaskLaunch, io: TaskIo) -> Result<RunOutcome, RuntimeError>;
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
        assert_eq!(l.checkpoint_dir, Path::new("/state/tasks/t_1/checkpoints"));
        assert_eq!(l.results_dir, Path::new("/state/tasks/t_1/results"));
        assert_eq!(l.gpu_list(), "2,3");
        assert_eq!(safe_name(".."), "_..");
    }
}
