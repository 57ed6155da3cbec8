//! Tasks as child processes. Each runs in its own process group so that stopping it reaches
//! the workers it forked (dataloaders, torchrun children), not only the leader.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

use super::{RunOutcome, Runtime, RuntimeError, Started, TaskIo, TaskLaunch};
use crate::logs::{LogBuffer, MAX_LINE_BYTES};
use crate::protocol::Stream;

/// How long output may keep flowing after the leader exited before the rest of its process
/// group is killed (a forgotten background child would otherwise hold the pipes open forever).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Default)]
pub struct ProcessRuntime {
    workdir: Option<PathBuf>,
}

impl ProcessRuntime {
    /// Tasks start in their own task folder (`<state>/tasks/<id>`).
    pub fn new() -> Self {
        Self::default()
    }

    /// Tasks start in `dir` instead, e.g. a checkout holding the training scripts.
    pub fn with_workdir(dir: impl Into<PathBuf>) -> Self {
        ProcessRuntime {
            workdir: Some(dir.into()),
        }
    }
}

fn signal_group(pid: u32, sig: Signal) {
    if let Ok(raw) = i32::try_from(pid) {
        // ESRCH (already gone) is the expected race here.
        let _ = killpg(Pid::from_raw(raw), sig);
    }
}

async fn read_lines<R: AsyncRead + Unpin>(reader: R, stream: Stream, out: Arc<LogBuffer>) {
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
                out.push(stream, String::from_utf8_lossy(&buf).into_owned());
            }
        }
    }
}

async fn terminate(
    child: &mut Child,
    pid: u32,
    grace: Duration,
) -> std::io::Result<std::process::ExitStatus> {
    signal_group(pid, Signal::SIGTERM);
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            signal_group(pid, Signal::SIGKILL);
            child.wait().await
        }
    }
}

#[async_trait]
impl Runtime for ProcessRuntime {
    fn name(&self) -> &'static str {
        "process"
    }

    async fn run(&self, launch: TaskLaunch, io: TaskIo) -> Result<RunOutcome, RuntimeError> {
        let (program, args) = launch
            .command
            .split_first()
            .ok_or(RuntimeError::NoCommand)?;
        let workdir = match &self.workdir {
            Some(d) => d.clone(),
            None => launch
                .checkpoint_dir
                .parent()
                .map(PathBuf::from)
                .unwrap_or_else(|| launch.results_dir.clone()),
        };
        let mut cmd = Command::new(program);
        cmd.args(args)
            .envs(&launch.env)
            .env("AUTODL_CHECKPOINT_DIR", &launch.checkpoint_dir)
            .env("AUTODL_RESULTS_DIR", &launch.results_dir)
            // NVML numbers GPUs in PCI order; CUDA's default order differs on mixed hosts.
            .env("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
            .env("CUDA_VISIBLE_DEVICES", launch.gpu_list())
            .env("NVIDIA_VISIBLE_DEVICES", launch.gpu_list())
            .current_dir(workdir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if launch.restored {
            cmd.env("AUTODL_RESTORE_PATH", &launch.checkpoint_dir);
        }
        cmd.process_group(0).kill_on_drop(true);
        let mut child = cmd.spawn().map_err(RuntimeError::Spawn)?;
        let pid = child.id().unwrap_or(0);
        let _ = io.started.send(Started {
            pid: (pid != 0).then_some(pid),
        });
        let mut readers = Vec::new();
        if let Some(out) = child.stdout.take() {
            readers.push(tokio::spawn(read_lines(
                out,
                Stream::Stdout,
                io.output.clone(),
            )));
        }
        if let Some(err) = child.stderr.take() {
            readers.push(tokio::spawn(read_lines(
                err,
                Stream::Stderr,
                io.output.clone(),
            )));
        }

        let mut stop = io.stop;
        let mut stop_open = true;
        let mut stopped = false;
        let status = loop {
            let requested = *stop.borrow_and_update();
            if let Some(grace) = requested {
                stopped = true;
                break terminate(&mut child, pid, grace).await?;
            }
            tokio::select! {
                status = child.wait() => break status?,
                changed = stop.changed(), if stop_open => {
                    if changed.is_err() {
                        // The agent dropped its handle; nobody can ask for a stop any more.
                        stop_open = false;
                    }
                }
            }
        };

        let drain = futures_util::future::join_all(readers.iter_mut());
        if tokio::time::timeout(DRAIN_TIMEOUT, drain).await.is_err() {
            signal_group(pid, Signal::SIGKILL);
            for r in &readers {
                r.abort();
            }
        }
        let exit_code = status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
        Ok(RunOutcome {
            exit_code,
            oom_killed: false,
            stopped,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Assignment, ExitReason, LogLine};
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
        let l = TaskLaunch::from_assignment(&a, "node-a", dir.path(), false);
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

    fn lines(h: &Harness) -> Vec<LogLine> {
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
        let o = ProcessRuntime::new().run(l, io).await.unwrap();
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

    #[tokio::test]
    async fn success_and_oom() {
        let (l, io, h) = launch("echo done");
        let o = ProcessRuntime::new().run(l, io).await.unwrap();
        assert_eq!((o.exit_code, reason(&o, &h)), (0, ExitReason::Success));

        let (l, io, h) = launch(
            "echo 'RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB' >&2; exit 1",
        );
        let o = ProcessRuntime::new().run(l, io).await.unwrap();
        assert_eq!((o.exit_code, reason(&o, &h)), (1, ExitReason::Oom));
    }

    #[tokio::test]
    async fn task_environment() {
        let (l, io, h) = launch("env");
        let ckpt = l.checkpoint_dir.clone();
        let results = l.results_dir.clone();
        let o = ProcessRuntime::new().run(l, io).await.unwrap();
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
        assert!(
            env.iter().any(|l| l.starts_with("PATH=")),
            "host PATH is inherited"
        );
    }

    #[tokio::test]
    async fn runs_in_the_task_folder() {
        let (l, io, h) = launch("pwd; touch \"$AUTODL_RESULTS_DIR/out.txt\"");
        let task_dir = l.checkpoint_dir.parent().unwrap().to_path_buf();
        let results = l.results_dir.clone();
        let o = ProcessRuntime::new().run(l, io).await.unwrap();
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
        let run = tokio::spawn(async move { ProcessRuntime::new().run(l, io).await });
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
        let run = tokio::spawn(async move { ProcessRuntime::new().run(l, io).await });
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
        let run = tokio::spawn(async move { ProcessRuntime::new().run(l, io).await });
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
            ProcessRuntime::new().run(l, io).await,
            Err(RuntimeError::NoCommand)
        ));
        let (mut l, io, _h) = launch("true");
        l.command = vec!["/nonexistent/autodl-test-binary".into()];
        assert!(matches!(
            ProcessRuntime::new().run(l, io).await,
            Err(RuntimeError::Spawn(_))
        ));
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
