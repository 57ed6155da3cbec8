//! Tasks as Docker containers through bollard. Containers are named and labelled after the
//! task attempt so a restarted agent can find and remove what it no longer tracks.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bollard::errors::Error as DockerError;
use bollard::models::{ContainerCreateBody, DeviceRequest, HostConfig};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, KillContainerOptionsBuilder, ListContainersOptionsBuilder,
    LogsOptionsBuilder, RemoveContainerOptionsBuilder,
};
use bollard::Docker;
use futures_util::StreamExt;

use super::gang::{wait_for_workers, GangEnd, WorkerExit, Workers};
use super::{
    safe_name, terminal_env, Exec, ExecControl, ExecSpec, RunOutcome, Runtime, RuntimeError,
    Started, TaskIo, TaskLaunch,
};
use crate::isolation::{IsolationConfig, IsolationLevel};
use crate::logs::{LogBuffer, MAX_LINE_BYTES};
use crate::protocol::Stream;

pub const LABEL_TASK: &str = "autodl.task";
pub const LABEL_ATTEMPT: &str = "autodl.attempt";
pub const LABEL_NODE: &str = "autodl.node";

/// The network task containers join: Docker's default bridge lets every container reach every
/// other (one organization's batch task another's app port), this one does not
/// (`enable_icc=false`); each still reaches the outside world through the host.
pub const TASK_NETWORK: &str = "autodl-tasks";

/// How long the log stream may lag behind the container's exit before it is abandoned.
const LOG_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct DockerRuntime {
    docker: Docker,
    pids_limit: i64,
    operator_env: std::collections::BTreeMap<String, String>,
}

impl DockerRuntime {
    /// Connects through `DOCKER_HOST` (or the default socket) and agrees on an API version, so
    /// older engines (Docker 20.10 speaks 1.41) accept the requests.
    pub async fn connect() -> Result<Self, RuntimeError> {
        let docker = Docker::connect_with_defaults()?.negotiate_version().await?;
        docker.ping().await?;
        Self::ensure_task_network(&docker).await?;
        let defaults = IsolationConfig::default();
        Ok(DockerRuntime {
            docker,
            pids_limit: defaults.pids_limit,
            operator_env: defaults.task_env,
        })
    }

    /// Makes [`TASK_NETWORK`] unless it exists; one that exists with containers talking to
    /// each other is refused rather than used.
    async fn ensure_task_network(docker: &Docker) -> Result<(), RuntimeError> {
        const ICC: &str = "com.docker.network.bridge.enable_icc";
        // An engine before API 1.44 makes a second network of the same name when two
        // requests meet (containers then cannot name it): agents of one process (the demo,
        // the tests) make it one at a time.
        static MAKING: std::sync::OnceLock<tokio::sync::Mutex<()>> = std::sync::OnceLock::new();
        let _one_at_a_time = MAKING.get_or_init(Default::default).lock().await;
        match docker.inspect_network(TASK_NETWORK, None).await {
            Ok(n) => {
                let icc = n
                    .options
                    .as_ref()
                    .and_then(|o| o.get(ICC))
                    .map(String::as_str);
                if icc != Some("false") {
                    return Err(RuntimeError::Unavailable(format!(
                        "the Docker network {TASK_NETWORK} lets containers reach each other; remove it (docker network rm {TASK_NETWORK}) and the agent makes it again"
                    )));
                }
                Ok(())
            }
            Err(DockerError::DockerResponseServerError {
                status_code: 404, ..
            }) => {
                let request = bollard::models::NetworkCreateRequest {
                    name: TASK_NETWORK.into(),
                    driver: Some("bridge".into()),
                    options: Some(HashMap::from([(ICC.to_string(), "false".to_string())])),
                    labels: Some(HashMap::from([(
                        "autodl.purpose".to_string(),
                        "task containers".to_string(),
                    )])),
                    ..Default::default()
                };
                match docker.create_network(request).await {
                    Ok(_) => Ok(()),
                    // Another agent of the host made it meanwhile.
                    Err(DockerError::DockerResponseServerError {
                        status_code: 409, ..
                    }) => Ok(()),
                    Err(e) => Err(e.into()),
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Takes the operator's pids limit and task variables.
    pub fn with_isolation(mut self, config: &IsolationConfig) -> Self {
        self.pids_limit = config.pids_limit;
        self.operator_env = config.task_env.clone();
        self
    }

    pub fn client(&self) -> &Docker {
        &self.docker
    }

    pub fn container_name(task_id: &str, attempt: u32) -> String {
        format!("autodl-{}-{attempt}", safe_name(task_id))
    }

    /// The container: the task's uid (the agent's own when it is not root), no capabilities,
    /// no privilege gain, a pids limit, and no host path but the task's own folders and its
    /// dataset.
    fn create_body(&self, launch: &TaskLaunch) -> ContainerCreateBody {
        let paths = launch.mounted_paths();
        let env: Vec<String> = launch
            .full_env(&paths, &self.operator_env, !launch.real_gpus)
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let mut device_requests = None;
        if !launch.gpu_indices.is_empty() && launch.real_gpus {
            // The NVIDIA runtime renumbers the passed devices from 0 inside the container
            // and sets the visibility variables itself.
            device_requests = Some(vec![DeviceRequest {
                driver: Some("nvidia".into()),
                device_ids: Some(launch.gpu_indices.iter().map(u32::to_string).collect()),
                capabilities: Some(vec![vec!["gpu".into()]]),
                ..Default::default()
            }]);
        }
        let mut binds = vec![
            format!("{}:{}", launch.checkpoint_dir.display(), paths.checkpoints),
            format!("{}:{}", launch.results_dir.display(), paths.results),
            format!("{}:{}", launch.home_dir().display(), paths.home),
        ];
        if let Some(inside) = &paths.code {
            binds.push(format!("{}:{inside}", launch.code_dir().display()));
        }
        if let (Some(e), Some(inside)) = (&launch.env_dir, &paths.env) {
            let mode = if e.writable { "" } else { ":ro" };
            binds.push(format!("{}:{inside}{mode}", e.host.display()));
        }
        if let (Some(d), Some(inside)) = (&launch.data, &paths.data) {
            binds.push(format!("{}:{inside}:ro", d.host.display()));
        }
        let user = launch.user.map_or_else(
            || {
                format!(
                    "{}:{}",
                    nix::unistd::getuid().as_raw(),
                    nix::unistd::getgid().as_raw()
                )
            },
            |u| format!("{}:{}", u.uid, u.gid),
        );
        let labels = HashMap::from([
            (LABEL_TASK.to_string(), launch.task_id.clone()),
            (LABEL_ATTEMPT.to_string(), launch.attempt.to_string()),
            (LABEL_NODE.to_string(), launch.node_id.clone()),
        ]);
        ContainerCreateBody {
            image: Some(launch.image.clone()),
            cmd: (!launch.command.is_empty()).then(|| launch.in_environment(&launch.command)),
            env: Some(env),
            user: Some(user),
            working_dir: Some(paths.workdir().to_owned()),
            labels: Some(labels),
            host_config: Some(HostConfig {
                nano_cpus: launch
                    .cpu
                    .filter(|c| *c > 0.0)
                    .map(|c| (c * 1e9).round() as i64),
                memory: launch
                    .memory
                    .filter(|m| *m > 0)
                    .and_then(|m| i64::try_from(m).ok()),
                binds: Some(binds),
                device_requests,
                cap_drop: Some(vec!["ALL".into()]),
                security_opt: Some(vec!["no-new-privileges".into()]),
                pids_limit: Some(self.pids_limit),
                privileged: Some(false),
                network_mode: Some(TASK_NETWORK.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The container of worker `i` of `n` (`first`: rank 0's container). A worker holds its
    /// share of what the node's part of the attempt asked for.
    fn worker_body(
        &self,
        launch: &TaskLaunch,
        i: usize,
        n: usize,
        first: &str,
    ) -> ContainerCreateBody {
        let mut body = self.create_body(launch);
        if n > 1 {
            let host = body.host_config.get_or_insert_with(Default::default);
            host.nano_cpus = launch
                .cpu
                .filter(|c| *c > 0.0)
                .map(|c| (c / n as f64 * 1e9).round() as i64);
            host.memory = launch
                .memory
                .filter(|m| *m > 0)
                .and_then(|m| i64::try_from(m / n as u64).ok());
            if i == 0 {
                host.ipc_mode = Some("shareable".into());
            } else {
                host.network_mode = Some(format!("container:{first}"));
                host.ipc_mode = Some(format!("container:{first}"));
            }
        }
        body
    }

    async fn remove(&self, name: &str) {
        let opts = RemoveContainerOptionsBuilder::default().force(true).build();
        match self.docker.remove_container(name, Some(opts)).await {
            Ok(())
            | Err(DockerError::DockerResponseServerError {
                status_code: 404, ..
            }) => {}
            Err(e) => tracing::warn!(container = name, error = %e, "could not remove container"),
        }
    }

    async fn kill(&self, name: &str, signal: &str) {
        let opts = KillContainerOptionsBuilder::default()
            .signal(signal)
            .build();
        if let Err(e) = self.docker.kill_container(name, Some(opts)).await {
            tracing::debug!(container = name, signal, error = %e, "kill failed (already exited?)");
        }
    }

    /// Exit code once the container stops. bollard reports a non-zero exit as an error.
    async fn wait_exit(&self, name: &str) -> Result<i64, RuntimeError> {
        let mut stream = self.docker.wait_container(name, None);
        match stream.next().await {
            Some(Ok(r)) => Ok(r.status_code),
            Some(Err(DockerError::DockerContainerWaitError { code, .. })) => Ok(code),
            Some(Err(e)) => Err(e.into()),
            None => {
                // The wait stream closed early (connection hiccup): fall back to polling.
                loop {
                    let state = self.docker.inspect_container(name, None).await?.state;
                    if !state.as_ref().and_then(|s| s.running).unwrap_or(false) {
                        return Ok(state.and_then(|s| s.exit_code).unwrap_or(-1));
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
}

/// An attempt's containers, signalled through the engine.
struct DockerWorkers<'a> {
    runtime: &'a DockerRuntime,
    names: Vec<&'a str>,
}

#[async_trait]
impl Workers for DockerWorkers<'_> {
    async fn terminate(&self, which: &[usize]) {
        for i in which {
            self.runtime.kill(self.names[*i], "SIGTERM").await;
        }
    }

    async fn kill(&self, which: &[usize]) {
        for i in which {
            self.runtime.kill(self.names[*i], "SIGKILL").await;
        }
    }
}

/// Follows a container's output into the task's log until the container ends (`rank`: the
/// worker it runs, in an attempt of several).
async fn follow_logs(docker: Docker, name: String, output: Arc<LogBuffer>, rank: Option<u32>) {
    let opts = LogsOptionsBuilder::default()
        .follow(true)
        .stdout(true)
        .stderr(true)
        .build();
    let mut stream = docker.logs(&name, Some(opts));
    let mut out = LineSplitter {
        rank,
        ..Default::default()
    };
    let mut err = LineSplitter {
        rank,
        ..Default::default()
    };
    while let Some(item) = stream.next().await {
        match item {
            Ok(bollard::container::LogOutput::StdErr { message }) => {
                err.feed(&message, Stream::Stderr, &output)
            }
            Ok(other) => out.feed(&other.into_bytes(), Stream::Stdout, &output),
            Err(e) => {
                tracing::warn!(container = name, error = %e, "log stream ended");
                break;
            }
        }
    }
    out.finish(Stream::Stdout, &output);
    err.finish(Stream::Stderr, &output);
}

/// Splits Docker's log chunks (which need not end at line breaks) into lines per stream.
#[derive(Default)]
struct LineSplitter {
    partial: Vec<u8>,
    rank: Option<u32>,
}

impl LineSplitter {
    fn feed(&mut self, chunk: &[u8], stream: Stream, out: &LogBuffer) {
        for &b in chunk {
            if b == b'\n' || self.partial.len() >= MAX_LINE_BYTES {
                self.emit(stream, out);
                if b == b'\n' {
                    continue;
                }
            }
            self.partial.push(b);
        }
    }

    fn emit(&mut self, stream: Stream, out: &LogBuffer) {
        if self.partial.last() == Some(&b'\r') {
            self.partial.pop();
        }
        out.push_from(
            stream,
            String::from_utf8_lossy(&self.partial).into_owned(),
            self.rank,
        );
        self.partial.clear();
    }

    fn finish(&mut self, stream: Stream, out: &LogBuffer) {
        if !self.partial.is_empty() {
            self.emit(stream, out);
        }
    }
}

#[async_trait]
impl Runtime for DockerRuntime {
    fn name(&self) -> &'static str {
        "docker"
    }

    fn isolation(&self) -> IsolationLevel {
        IsolationLevel::Container
    }

    fn limits(&self) -> String {
        format!("Docker: memory, cpu, pids ({} processes)", self.pids_limit)
    }

    fn network(&self) -> String {
        format!("Docker network {TASK_NETWORK}, no traffic between containers")
    }

    /// As root the agent gives each container its own uid; otherwise containers run as the
    /// agent's user, still apart in their own namespaces.
    fn task_users(&self) -> bool {
        crate::isolation::is_root()
    }

    async fn cleanup(
        &self,
        node_id: &str,
        _state_dir: &std::path::Path,
        keep: &[(String, u32)],
    ) -> Result<(), RuntimeError> {
        let filters = HashMap::from([("label", vec![format!("{LABEL_NODE}={node_id}")])]);
        let opts = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        for c in self.docker.list_containers(Some(opts)).await? {
            let labels = c.labels.unwrap_or_default();
            let task = labels.get(LABEL_TASK).cloned().unwrap_or_default();
            let attempt = labels
                .get(LABEL_ATTEMPT)
                .and_then(|a| a.parse::<u32>().ok())
                .unwrap_or(0);
            if keep.iter().any(|(t, a)| *t == task && *a == attempt) {
                continue;
            }
            if let Some(id) = c.id {
                tracing::info!(container = %id, task, attempt, "removing leftover container");
                self.remove(&id).await;
            }
        }
        Ok(())
    }

    /// Runs the attempt's containers: one, or one per worker (rank 0's named as the attempt,
    /// so that shells and ports reach into it; the others in its network and IPC namespaces,
    /// so that the gang meets on its loopback and shares memory as processes of one host do).
    /// A worker that fails stops the others, as on the process runtime.
    async fn run(&self, launch: TaskLaunch, io: TaskIo) -> Result<RunOutcome, RuntimeError> {
        let workers = launch.worker_launches();
        let first = Self::container_name(&launch.task_id, launch.attempt);
        let mut containers: Vec<(String, Option<u32>)> = Vec::new();
        for (i, w) in workers.iter().enumerate() {
            let name = match w.rank {
                Some(rank) if i > 0 => format!("{first}-rank{rank}"),
                _ => first.clone(),
            };
            // A container of the same attempt can only be a leftover of a crashed agent.
            self.remove(&name).await;
            let body = self.worker_body(&w.launch, i, workers.len(), &first);
            let opts = CreateContainerOptionsBuilder::default().name(&name).build();
            let started = match self.docker.create_container(Some(opts), body).await {
                Ok(_) => self
                    .docker
                    .start_container(&name, None)
                    .await
                    .map_err(RuntimeError::from),
                Err(e) => Err(e.into()),
            };
            if let Err(e) = started {
                // A gang starts whole or not at all.
                self.remove(&name).await;
                for (c, _) in &containers {
                    self.remove(c).await;
                }
                return Err(e);
            }
            containers.push((name, w.rank));
        }
        let pid = self
            .docker
            .inspect_container(&first, None)
            .await
            .ok()
            .and_then(|i| i.state?.pid)
            .and_then(|p| u32::try_from(p).ok())
            .filter(|p| *p != 0);
        let _ = io.started.send(Started { pid });
        let logs: Vec<_> = containers
            .iter()
            .map(|(name, rank)| {
                tokio::spawn(follow_logs(
                    self.docker.clone(),
                    name.clone(),
                    io.output.clone(),
                    *rank,
                ))
            })
            .collect();

        let waits: Vec<WorkerExit<'_>> = containers
            .iter()
            .enumerate()
            .map(|(i, (name, _))| {
                Box::pin(async move { (i, self.wait_exit(name).await) }) as WorkerExit<'_>
            })
            .collect();
        let ranks: Vec<Option<u32>> = containers.iter().map(|(_, rank)| *rank).collect();
        let signals = DockerWorkers {
            runtime: self,
            names: containers.iter().map(|(name, _)| name.as_str()).collect(),
        };
        let mut stop = io.stop;
        // Every worker's container is in the first one's network.
        let formation = super::Rendezvous::held_here(&launch)
            .map(|r| Box::pin(r.unformed(pid)) as super::gang::Formation<'_>);
        let end = match wait_for_workers(waits, &ranks, &signals, &mut stop, &io.output, formation)
            .await
        {
            Ok(end) => end,
            Err(e) => {
                for l in &logs {
                    l.abort();
                }
                for (name, _) in &containers {
                    self.remove(name).await;
                }
                return Err(e);
            }
        };
        let mut codes = end.codes.clone();
        for l in logs {
            if tokio::time::timeout(LOG_DRAIN_TIMEOUT, l).await.is_err() {
                tracing::warn!(
                    container = first,
                    "log stream did not end after the container"
                );
            }
        }
        let mut oom_killed = false;
        for (i, (name, _)) in containers.iter().enumerate() {
            let state = self
                .docker
                .inspect_container(name, None)
                .await
                .ok()
                .and_then(|i| i.state);
            oom_killed |= state.as_ref().and_then(|s| s.oom_killed).unwrap_or(false);
            if let Some(code) = state.and_then(|s| s.exit_code) {
                codes[i] = Some(code);
            }
            self.remove(name).await;
        }
        // The engine's word on each exit code, where it has one.
        let end = GangEnd { codes, ..end };
        Ok(RunOutcome {
            exit_code: i32::try_from(end.exit_code()).unwrap_or(-1),
            oom_killed,
            stopped: end.stopped,
            unformed: end.unformed,
        })
    }

    /// `docker exec` as the task's user, in its working directory, with its environment
    /// (the container's own).
    async fn exec(&self, launch: &TaskLaunch, spec: &ExecSpec) -> Result<Exec, RuntimeError> {
        use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
        let name = Self::container_name(&launch.task_id, launch.attempt);
        let body = self.create_body(launch);
        let created = self
            .docker
            .create_exec(
                &name,
                CreateExecOptions {
                    attach_stdin: Some(true),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    tty: Some(spec.tty),
                    env: terminal_env(spec.tty, launch).map(|(k, v)| vec![format!("{k}={v}")]),
                    cmd: Some(launch.in_environment(&spec.argv())),
                    user: body.user,
                    working_dir: body.working_dir,
                    ..Default::default()
                },
            )
            .await?;
        let started = self
            .docker
            .start_exec(
                &created.id,
                Some(StartExecOptions {
                    detach: false,
                    tty: spec.tty,
                    output_capacity: None,
                }),
            )
            .await?;
        let StartExecResults::Attached { mut output, input } = started else {
            return Err(RuntimeError::Unavailable(
                "docker did not attach to the command".into(),
            ));
        };
        let (mut out_w, out_r) = tokio::io::duplex(64 * 1024);
        let (mut err_w, err_r) = tokio::io::duplex(64 * 1024);
        let pump = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            while let Some(Ok(chunk)) = output.next().await {
                let sent = match chunk {
                    bollard::container::LogOutput::StdErr { message } => {
                        err_w.write_all(&message).await
                    }
                    other => out_w.write_all(&other.into_bytes()).await,
                };
                if sent.is_err() {
                    break;
                }
            }
        });
        let mut control = DockerExec {
            docker: self.docker.clone(),
            id: created.id,
            pump: Some(pump),
        };
        if spec.tty {
            let _ = control.resize(spec.cols, spec.rows).await;
        }
        Ok(Exec {
            stdout: Box::pin(out_r),
            stderr: (!spec.tty).then(|| Box::pin(err_r) as super::ExecReader),
            stdin: input,
            control: Box::new(control),
        })
    }

    /// The container's address on its network.
    async fn connect_port(
        &self,
        launch: &TaskLaunch,
        port: u16,
        timeout: Duration,
    ) -> Result<tokio::net::TcpStream, RuntimeError> {
        let name = Self::container_name(&launch.task_id, launch.attempt);
        let info = self.docker.inspect_container(&name, None).await?;
        let ip = info
            .network_settings
            .and_then(|n| n.networks)
            .into_iter()
            .flatten()
            .filter_map(|(_, net)| net.ip_address)
            .find_map(|ip| ip.parse::<std::net::IpAddr>().ok())
            .ok_or_else(|| {
                RuntimeError::Unavailable("the task's container has no network address".into())
            })?;
        let addr = std::net::SocketAddr::new(ip, port);
        tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr))
            .await
            .map_err(|_| RuntimeError::Unavailable(format!("port {port} did not answer")))?
            .map_err(RuntimeError::from)
    }
}

struct DockerExec {
    docker: Docker,
    id: String,
    pump: Option<tokio::task::JoinHandle<()>>,
}

#[async_trait]
impl ExecControl for DockerExec {
    async fn resize(&mut self, cols: u16, rows: u16) -> Result<(), RuntimeError> {
        let size = bollard::exec::ResizeExecOptions {
            height: rows,
            width: cols,
        };
        self.docker.resize_exec(&self.id, size).await?;
        Ok(())
    }

    async fn wait(&mut self) -> Result<i32, RuntimeError> {
        if let Some(p) = self.pump.take() {
            let _ = p.await;
        }
        // The output ends a moment before the engine records the exit.
        for _ in 0..50 {
            let info = self.docker.inspect_exec(&self.id).await?;
            if info.running != Some(true) {
                return Ok(info
                    .exit_code
                    .and_then(|c| i32::try_from(c).ok())
                    .unwrap_or(-1));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(-1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Assignment;
    use tokio::sync::{oneshot, watch};

    fn prepare(l: &TaskLaunch) {
        for d in [&l.checkpoint_dir, &l.results_dir, &l.home_dir()] {
            std::fs::create_dir_all(d).unwrap();
        }
        if let Some(u) = l.user {
            crate::isolation::hand_over_task_dir(&l.task_dir, u).unwrap();
        }
    }

    fn offline() -> DockerRuntime {
        DockerRuntime {
            // Never contacted: only the container body is built.
            docker: Docker::connect_with_http(
                "http://127.0.0.1:9",
                1,
                bollard::API_DEFAULT_VERSION,
            )
            .unwrap(),
            pids_limit: 321,
            operator_env: [("LD_LIBRARY_PATH".to_string(), "/usr/local/cuda".to_string())].into(),
        }
    }

    #[test]
    fn container_spec() {
        let dir = tempfile::tempdir().unwrap();
        let rt = offline();
        let a = Assignment {
            task_id: "abc".into(),
            attempt: 2,
            image: "img:1".into(),
            command: vec!["python".into(), "train.py".into()],
            gpu_indices: vec![0, 2],
            cpu: 1.5,
            memory: 1 << 30,
            data_path: Some("/datasets/x".into()),
            ..Default::default()
        };
        let mut real = TaskLaunch::from_assignment(&a, "n1", dir.path(), true);
        real.data = Some(crate::runtime::DataMount {
            host: "/srv/datasets/x".into(),
            requested_path: Some("/datasets/x".into()),
        });
        real.user = Some(crate::isolation::TaskUser {
            uid: 2_000_007,
            gid: 2_000_007,
        });
        let body = rt.create_body(&real);
        let hc = body.host_config.clone().unwrap();
        assert_eq!(hc.nano_cpus, Some(1_500_000_000));
        assert_eq!(hc.memory, Some(1 << 30));
        let dr = &hc.device_requests.unwrap()[0];
        assert_eq!(dr.driver.as_deref(), Some("nvidia"));
        assert_eq!(dr.device_ids, Some(vec!["0".to_string(), "2".to_string()]));
        let env = body.env.clone().unwrap();
        assert!(env.contains(&"AUTODL_CHECKPOINT_DIR=/autodl/checkpoints".to_string()));
        assert!(!env.iter().any(|e| e.starts_with("CUDA_VISIBLE_DEVICES=")));
        assert!(env.contains(&"HOME=/autodl/home".to_string()));
        assert!(env.contains(&"AUTODL_DATA_PATH=/datasets/x".to_string()));
        assert!(env.contains(&"LD_LIBRARY_PATH=/usr/local/cuda".to_string()));
        let binds = hc.binds.unwrap();
        assert!(binds.iter().any(|b| b.ends_with(":/autodl/results")));
        assert!(binds.iter().any(|b| b.ends_with(":/autodl/home")));
        assert_eq!(
            binds
                .iter()
                .filter(|b| b.ends_with(":ro"))
                .collect::<Vec<_>>(),
            ["/srv/datasets/x:/datasets/x:ro"],
            "only the resolved dataset: {binds:?}"
        );
        assert_eq!(binds.len(), 4, "{binds:?}");
        assert_eq!(body.working_dir.as_deref(), Some("/autodl/home"));
        // A task with code starts in it, mounted where `AUTODL_CODE_DIR` says.
        real.has_code = true;
        let coded = rt.create_body(&real);
        assert_eq!(coded.working_dir.as_deref(), Some("/autodl/code"));
        assert!(coded
            .env
            .unwrap()
            .contains(&"AUTODL_CODE_DIR=/autodl/code".to_string()));
        let code_bind = format!("{}:/autodl/code", real.code_dir().display());
        assert!(coded
            .host_config
            .unwrap()
            .binds
            .unwrap()
            .contains(&code_bind));
        assert_eq!(body.user.as_deref(), Some("2000007:2000007"));
        assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(hc.security_opt, Some(vec!["no-new-privileges".to_string()]));
        assert_eq!(hc.pids_limit, Some(321));
        assert_ne!(hc.privileged, Some(true));
        let labels = body.labels.unwrap();
        assert_eq!(labels[LABEL_TASK], "abc");
        assert_eq!(labels[LABEL_ATTEMPT], "2");
        assert_eq!(labels[LABEL_NODE], "n1");
        assert_eq!(DockerRuntime::container_name("abc", 2), "autodl-abc-2");

        let sim = TaskLaunch::from_assignment(&a, "n1", dir.path(), false);
        let body = rt.create_body(&sim);
        assert!(body.host_config.unwrap().device_requests.is_none());
        let env = body.env.unwrap();
        assert!(env.contains(&"CUDA_VISIBLE_DEVICES=0,2".to_string()));
        assert!(env.contains(&"NVIDIA_VISIBLE_DEVICES=0,2".to_string()));
    }

    #[test]
    fn chunks_split_into_lines() {
        let out = LogBuffer::new(100);
        let mut s = LineSplitter::default();
        s.feed(b"a\nb", Stream::Stdout, &out);
        s.feed(b"c\r\n\nd", Stream::Stdout, &out);
        s.finish(Stream::Stdout, &out);
        let got: Vec<_> = out.take_batch(10).into_iter().map(|l| l.line).collect();
        assert_eq!(got, ["a", "bc", "", "d"]);
    }

    /// A worker's container holds its share of the node's part of the attempt; the others
    /// join rank 0's network and IPC namespaces.
    #[test]
    fn a_gang_is_a_container_per_worker_in_rank_0_s_namespaces() {
        let dir = tempfile::tempdir().unwrap();
        let a = Assignment {
            task_id: "gang".into(),
            attempt: 1,
            image: "img:1".into(),
            command: vec!["python".into(), "train.py".into()],
            gpu_indices: vec![0, 1],
            cpu: 4.0,
            memory: 8 << 30,
            workers: (0..2)
                .map(|r| crate::protocol::WorkerSlot {
                    rank: r,
                    gpu_indices: vec![r],
                    env: [("RANK".to_string(), r.to_string())].into(),
                })
                .collect(),
            ..Default::default()
        };
        let l = TaskLaunch::from_assignment(&a, "n1", dir.path(), false);
        let workers = l.worker_launches();
        let rt = offline();
        let first = DockerRuntime::container_name("gang", 1);
        let zero = rt.worker_body(&workers[0].launch, 0, 2, &first);
        let one = rt.worker_body(&workers[1].launch, 1, 2, &first);
        let (h0, h1) = (zero.host_config.unwrap(), one.host_config.unwrap());
        assert_eq!(h0.network_mode.as_deref(), Some(TASK_NETWORK));
        assert_eq!(h0.ipc_mode.as_deref(), Some("shareable"));
        let joined = format!("container:{first}");
        assert_eq!(h1.network_mode.as_deref(), Some(joined.as_str()));
        assert_eq!(h1.ipc_mode.as_deref(), Some(joined.as_str()));
        assert_eq!(h1.nano_cpus, Some(2_000_000_000));
        assert_eq!(h1.memory, Some(4 << 30));
        let env = one.env.unwrap();
        assert!(env.contains(&"RANK=1".to_string()), "{env:?}");
        assert!(
            env.contains(&"CUDA_VISIBLE_DEVICES=1".to_string()),
            "{env:?}"
        );
    }

    /// On a real engine: each worker's container prints its own rank and GPU, and one that
    /// fails stops the others (which would wait for a minute).
    #[tokio::test]
    async fn a_docker_gang_lives_and_dies_together() {
        let Ok(image) = std::env::var("AUTODL_TEST_DOCKER_IMAGE") else {
            crate::skip("set AUTODL_TEST_DOCKER_IMAGE to a local image with /bin/sh to run the Docker runtime test (scripts/test.sh does)");
            return;
        };
        let rt = DockerRuntime::connect()
            .await
            .expect("docker engine reachable");
        let dir = tempfile::tempdir().unwrap();
        let a = Assignment {
            task_id: format!("dockergang{}", std::process::id()),
            attempt: 1,
            image,
            command: vec![
                "sh".into(),
                "-c".into(),
                "echo \"rank $RANK gpus $CUDA_VISIBLE_DEVICES\"; if [ \"$RANK\" = 1 ]; then sleep 1; exit 3; fi; sleep 60".into(),
            ],
            gpu_indices: vec![0, 1, 2],
            workers: (0..3)
                .map(|r| crate::protocol::WorkerSlot {
                    rank: r,
                    gpu_indices: vec![r],
                    env: [("RANK".to_string(), r.to_string())].into(),
                })
                .collect(),
            ..Default::default()
        };
        let l = TaskLaunch::from_assignment(&a, "gang-node", dir.path(), false);
        prepare(&l);
        let output = Arc::new(LogBuffer::new(1000));
        let (started_tx, _started_rx) = oneshot::channel();
        let (_stop, stop_rx) = watch::channel(None);
        let io = TaskIo {
            output: output.clone(),
            started: started_tx,
            stop: stop_rx,
        };
        let began = std::time::Instant::now();
        let o = rt.run(l, io).await.unwrap();
        assert!(
            began.elapsed() < Duration::from_secs(40),
            "{:?}",
            began.elapsed()
        );
        assert_eq!(o.exit_code, 3);
        let lines = output.take_batch(100);
        for r in 0..3u32 {
            assert!(
                lines
                    .iter()
                    .any(|l| l.rank == Some(r) && l.line == format!("rank {r} gpus {r}")),
                "{lines:?}"
            );
        }
        assert!(
            lines
                .iter()
                .any(|l| l.line.contains("worker 1 exited with code 3")),
            "{lines:?}"
        );
        let first = DockerRuntime::container_name(&a.task_id, 1);
        for name in [
            first.clone(),
            format!("{first}-rank1"),
            format!("{first}-rank2"),
        ] {
            assert!(
                rt.docker.inspect_container(&name, None).await.is_err(),
                "{name} left behind"
            );
        }
    }

    /// Needs a Docker engine and a local image with /bin/sh named by AUTODL_TEST_DOCKER_IMAGE
    /// (no registry is reachable from CI machines, so the test cannot pull one).
    #[tokio::test]
    async fn docker_runs_a_container_with_limits() {
        let Ok(image) = std::env::var("AUTODL_TEST_DOCKER_IMAGE") else {
            crate::skip("set AUTODL_TEST_DOCKER_IMAGE to a local image with /bin/sh to run the Docker runtime test (scripts/test.sh does)");
            return;
        };
        let rt = DockerRuntime::connect()
            .await
            .expect("docker engine reachable");
        let node = format!("test-node-{}", std::process::id());

        // A leftover from a "crashed" agent run on this node is removed by cleanup.
        let leftover = format!("autodl-leftover-{}", std::process::id());
        let body = ContainerCreateBody {
            image: Some(image.clone()),
            cmd: Some(vec!["sh".into(), "-c".into(), "sleep 60".into()]),
            labels: Some(HashMap::from([
                (LABEL_TASK.to_string(), "old".to_string()),
                (LABEL_ATTEMPT.to_string(), "1".to_string()),
                (LABEL_NODE.to_string(), node.clone()),
            ])),
            ..Default::default()
        };
        rt.docker
            .create_container(
                Some(
                    CreateContainerOptionsBuilder::default()
                        .name(&leftover)
                        .build(),
                ),
                body,
            )
            .await
            .unwrap();
        rt.cleanup(&node, std::path::Path::new("/nonexistent"), &[])
            .await
            .unwrap();
        assert!(rt.docker.inspect_container(&leftover, None).await.is_err());

        let dir = tempfile::tempdir().unwrap();
        let a = Assignment {
            task_id: format!("dockertest{}", std::process::id()),
            attempt: 1,
            image,
            command: vec![
                "sh".into(),
                "-c".into(),
                "echo out; echo err >&2; echo \"$AUTODL_TASK_ID $AUTODL_CHECKPOINT_DIR $CUDA_VISIBLE_DEVICES\"; \
                 echo \"uid $(id -u)\"; echo saved > \"$AUTODL_RESULTS_DIR/r.txt\"; sleep 2; exit 4"
                    .into(),
            ],
            gpu_indices: vec![1],
            cpu: 0.5,
            memory: 64 << 20,
            ..Default::default()
        };
        let pool = crate::isolation::UidPool::new(
            crate::isolation::DEFAULT_TASK_UIDS,
            crate::isolation::DEFAULT_LOCK_DIR,
        )
        .unwrap();
        let lease = pool.lease().unwrap();
        let mut l = TaskLaunch::from_assignment(&a, &node, dir.path(), false);
        l.user = Some(lease.user());
        prepare(&l);
        let results = l.results_dir.clone();
        let output = Arc::new(LogBuffer::new(1000));
        let (started_tx, started_rx) = oneshot::channel();
        let (_stop, stop_rx) = watch::channel(None);
        let io = TaskIo {
            output: output.clone(),
            started: started_tx,
            stop: stop_rx,
        };
        let name = DockerRuntime::container_name(&a.task_id, 1);
        let rt2 = rt.clone();
        let run = tokio::spawn(async move { rt2.run(l, io).await });
        started_rx.await.expect("started");
        let info = rt.docker.inspect_container(&name, None).await.unwrap();
        let hc = info.host_config.unwrap();
        assert_eq!(hc.nano_cpus, Some(500_000_000));
        assert_eq!(hc.memory, Some(64 << 20));
        let o = run.await.unwrap().unwrap();
        assert_eq!(o.exit_code, 4);
        assert!(!o.oom_killed && !o.stopped);
        let lines = output.take_batch(100);
        assert!(
            lines
                .iter()
                .any(|l| l.stream == Stream::Stdout && l.line == "out"),
            "{lines:?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.stream == Stream::Stderr && l.line == "err"),
            "{lines:?}"
        );
        let expect = format!("{} /autodl/checkpoints 1", a.task_id);
        assert!(lines.iter().any(|l| l.line == expect), "{lines:?}");
        let uid = format!("uid {}", lease.user().uid);
        assert!(
            lines.iter().any(|l| l.line == uid),
            "runs as the task uid: {lines:?}"
        );
        assert_eq!(
            std::fs::read_to_string(results.join("r.txt")).unwrap(),
            "saved\n"
        );
        assert!(
            rt.docker.inspect_container(&name, None).await.is_err(),
            "container removed after the run"
        );

        // Stop on request: SIGTERM trapped, exit within the grace period.
        let a2 = Assignment {
            task_id: format!("dockerstop{}", std::process::id()),
            attempt: 1,
            image: a.image.clone(),
            command: vec![
                "sh".into(),
                "-c".into(),
                "trap 'echo bye; exit 0' TERM; echo ready; while true; do sleep 0.1; done".into(),
            ],
            ..Default::default()
        };
        let l = TaskLaunch::from_assignment(&a2, &node, dir.path(), false);
        prepare(&l);
        let output = Arc::new(LogBuffer::new(1000));
        let (started_tx, started_rx) = oneshot::channel();
        let (stop, stop_rx) = watch::channel(None);
        let io = TaskIo {
            output: output.clone(),
            started: started_tx,
            stop: stop_rx,
        };
        let rt2 = rt.clone();
        let run = tokio::spawn(async move { rt2.run(l, io).await });
        started_rx.await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.send(Some(Duration::from_secs(10))).unwrap();
        let o = run.await.unwrap().unwrap();
        assert!(o.stopped);
        assert_eq!(o.exit_code, 0);

        // Over the memory limit: the kernel kills it and Docker reports OOMKilled.
        let a3 = Assignment {
            task_id: format!("dockeroom{}", std::process::id()),
            attempt: 1,
            image: a.image.clone(),
            command: vec![
                "sh".into(),
                "-c".into(),
                "x=a; while true; do x=\"$x$x\"; done".into(),
            ],
            memory: 16 << 20,
            ..Default::default()
        };
        let l = TaskLaunch::from_assignment(&a3, &node, dir.path(), false);
        prepare(&l);
        let output = Arc::new(LogBuffer::new(1000));
        let (started_tx, _started_rx) = oneshot::channel();
        let (_stop, stop_rx) = watch::channel(None);
        let io = TaskIo {
            output: output.clone(),
            started: started_tx,
            stop: stop_rx,
        };
        let o = tokio::time::timeout(Duration::from_secs(60), rt.run(l, io))
            .await
            .expect("OOM kill within a minute")
            .unwrap();
        assert!(o.oom_killed, "{o:?}");
        assert_eq!(o.exit_code, 137);
        rt.cleanup(&node, std::path::Path::new("/nonexistent"), &[])
            .await
            .unwrap();
    }
}
