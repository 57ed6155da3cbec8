//! The live side of a replay: a real server (store, runner, agent protocol) on a manual clock,
//! with one simulated agent per node, deciding for the simulator's world through [`Decider`].

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use autodl_agent::client::ServerClient;
use autodl_agent::protocol::{
    AgentGpu, AgentHost, AgentNode, ArtifactCommit, ArtifactFile, ArtifactStart, ExitReason,
    FinishedReport, PollRequest, RegisterRequest, RunningRef,
};
use autodl_scheduler::sim::jobs::{self, Decider, Job, JobsConfig, Round};
use autodl_scheduler::{TaskRequest, Time, WorkerPlacement};
use serde_json::{json, Value};
use tokio::runtime::Handle;

use crate::auth::secrets::random_hex;
use crate::clock::ManualClock;
use crate::config::Settings;
use crate::scheduling::Runner;
use crate::startup::Application;
use crate::store;
use crate::usecases::agents::{issue_registration_token, TokenGrant};

/// One simulated node: its agent's client and what it runs, as it tells the server.
struct Agent {
    node: String,
    client: ServerClient,
    gpus: Vec<AgentGpu>,
    running: Vec<RunningRef>,
    /// What it says of itself in every poll, as at registration.
    host: AgentHost,
}

/// The live server as the world's decider. Calls come from the world's blocking thread and
/// wait on the runtime the server runs on.
pub(super) struct LiveCluster {
    rt: Handle,
    clock: Arc<ManualClock>,
    runner: Runner,
    pub(super) server: actix_web::dev::ServerHandle,
    base: String,
    http: reqwest::Client,
    /// Bearer token per trace user.
    users: HashMap<String, String>,
    agents: Vec<Agent>,
    /// World id -> server id, and back.
    pub(super) ids: HashMap<String, String>,
    world_id: HashMap<String, String>,
    /// Server id -> (attempt, nodes) of its current run.
    runs: HashMap<String, (u32, Vec<usize>)>,
    /// Runs told to stop, still holding their GPUs until the world says they stopped.
    stopping: std::collections::HashSet<String>,
    checkpoint_file: PathBuf,
    /// The first failure: the world cannot be told, so the replay ends with it.
    pub(super) error: Option<anyhow::Error>,
}

fn ms(t: Time) -> i64 {
    (t as i64) * 1000
}

impl LiveCluster {
    pub(super) async fn start(
        jobs_in: &[Job],
        cfg: &JobsConfig,
        database_url: &str,
        dir: &Path,
        start_ms: i64,
    ) -> anyhow::Result<LiveCluster> {
        let clock = Arc::new(ManualClock::new(start_ms));
        let mut policy = cfg.policy_config();
        policy.explain_pending = true;
        let settings = Settings {
            listen: "127.0.0.1:0".parse()?,
            database_url: database_url.to_owned(),
            jwt_secret: random_hex(32),
            site_root: dir.join("site"),
            storage_url: format!("file://{}/objects", dir.display()),
            db_max_connections: 4,
            // Cycles are the world's: the runner runs only when asked.
            run_scheduler: false,
            // Nodes answer whenever asked; sessions outlive any trace.
            node_lost_timeout_secs: 1 << 40,
            session_ttl_secs: 1 << 40,
            signups_per_minute_per_address: u32::MAX,
            policy,
            ..Settings::default()
        };
        let store = store::open(&settings.database_url, settings.db_max_connections).await?;
        let app = Application::build_with(settings, store, clock.clone()).await?;
        let state = app.state.clone();
        let base = format!("http://127.0.0.1:{}", app.port());
        let server = app.handle();
        tokio::spawn(app.run_until_stopped());
        let runner = Runner::new(&state, Duration::from_secs(3600));
        let http = reqwest::Client::new();

        // The trace's users, all in one organization: the first signs up, the others are
        // invited.
        let mut names: Vec<&str> = jobs_in.iter().map(|j| j.user.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        let mut users = HashMap::new();
        let password = format!("Replay-{}", random_hex(8));
        let mut owner: Option<String> = None;
        let mut owner_id = String::new();
        for (i, name) in names.iter().enumerate() {
            let email = format!("user{i}@replay.example");
            let mut body = json!({"email": email, "password": password});
            match &owner {
                None => body["tenant_name"] = json!("Replay"),
                Some(token) => {
                    let inv = call(
                        &http,
                        &base,
                        token,
                        "/api/v1/tenant/invitations",
                        json!({"email": email, "role": "member"}),
                    )
                    .await?;
                    body["invitation"] = inv["token"].clone();
                }
            }
            let res = http
                .post(format!("{base}/api/v1/auth/signup"))
                .json(&body)
                .send()
                .await?;
            let res = answer(res).await.context("signing up a trace user")?;
            let token = res["token"]
                .as_str()
                .context("signup answered without a token")?
                .to_owned();
            if owner.is_none() {
                owner = Some(token.clone());
                owner_id = res["user"]["id"].as_str().unwrap_or_default().to_owned();
            }
            users.insert((*name).to_owned(), token);
        }

        // The simulator's nodes, each registered by its own agent.
        let hw = &cfg.hardware;
        let mut agents = Vec::new();
        for node in jobs::nodes(cfg) {
            let (token, _) = issue_registration_token(
                state.store.as_ref(),
                TokenGrant {
                    name: format!("replay agent {}", node.id),
                    created_by: owner_id.clone(),
                    node_id: Some(node.id.clone()),
                    max_uses: 1,
                    valid_ms: 3_600_000,
                },
                start_ms,
            )
            .await?;
            let gpus: Vec<AgentGpu> = node
                .gpus
                .iter()
                .map(|g| AgentGpu {
                    index: g.index,
                    gpu_type: g.gpu_type.clone(),
                    uuid: Some(format!("GPU-{}-{}", node.id, g.index)),
                    memory: g.mem_bytes,
                })
                .collect();
            let client = ServerClient::new(&base)?;
            let reg = client
                .register(&RegisterRequest {
                    token,
                    node: AgentNode {
                        id: node.id.clone(),
                        zone: node.zone.clone(),
                        labels: BTreeMap::new(),
                        cpu: hw.node_cpu_millis as f64 / 1000.0,
                        memory: hw.node_mem_bytes,
                        gpus: gpus.clone(),
                        host: Some(host(&node)),
                    },
                })
                .await
                .with_context(|| format!("registering node {}", node.id))?;
            client.set_credential(Some(reg.credential));
            if !node.own_network {
                // The simulator's node shares its host's network (gangs span it): a node that
                // does not isolate tasks, opened to every organization as its administrator
                // would.
                state.store.set_node_open_to_all(&node.id, true).await?;
                state.scheduler.invalidate_nodes();
            }
            agents.push(Agent {
                host: host(&node),
                node: node.id,
                client,
                gpus,
                running: Vec::new(),
            });
        }
        let checkpoint_file = dir.join("replay-checkpoint.bin");
        tokio::fs::write(&checkpoint_file, b"checkpoint").await?;
        Ok(LiveCluster {
            rt: Handle::current(),
            clock,
            runner,
            server,
            base,
            http,
            users,
            agents,
            ids: HashMap::new(),
            world_id: HashMap::new(),
            runs: HashMap::new(),
            stopping: Default::default(),
            checkpoint_file,
            error: None,
        })
    }

    /// Runs `f` unless an earlier step failed; keeps its failure.
    fn step<T: Default>(
        &mut self,
        f: impl for<'a> FnOnce(
            &'a mut LiveCluster,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = anyhow::Result<T>> + 'a>,
        >,
    ) -> T {
        if self.error.is_some() {
            return T::default();
        }
        let rt = self.rt.clone();
        match rt.block_on(f(self)) {
            Ok(v) => v,
            Err(e) => {
                self.error = Some(e);
                T::default()
            }
        }
    }

    async fn submit_job(&mut self, request: TaskRequest) -> anyhow::Result<()> {
        let token = self
            .users
            .get(&request.user)
            .context("a job of a user the trace did not name")?;
        let workers = match request.min_workers {
            Some(min) => json!({"min": min, "max": request.workers}),
            None => json!(request.workers),
        };
        let body = json!({
            "name": format!("job-{}", request.id),
            "image": "replay",
            "command": "true",
            "num_workers": workers,
            "gpu_per_worker": request.gpus_per_worker,
            "resources": {
                "cpu": request.cpu_millis as f64 / 1000.0,
                "memory": request.mem_bytes,
            },
            "priority": request.priority,
            "preemptible": request.preemptible,
        });
        let task = call(&self.http, &self.base, token, "/api/v1/tasks", body)
            .await
            .with_context(|| format!("submitting job {}", request.id))?;
        let id = task["id"]
            .as_str()
            .context("the task has no id")?
            .to_owned();
        self.world_id.insert(id.clone(), request.id.clone());
        self.ids.insert(request.id, id);
        Ok(())
    }

    fn server_id(&self, world: &str) -> anyhow::Result<String> {
        self.ids
            .get(world)
            .cloned()
            .with_context(|| format!("job {world} was never submitted"))
    }

    async fn save_checkpoint(&mut self, world: String) -> anyhow::Result<()> {
        let id = self.server_id(&world)?;
        let Some((attempt, nodes)) = self.runs.get(&id).cloned() else {
            anyhow::bail!("job {world} checkpointed while not running");
        };
        let agent = &self.agents[nodes[0]].client;
        let created = agent
            .start_artifact(
                &id,
                &ArtifactStart {
                    attempt,
                    kind: "checkpoint".into(),
                    step: None,
                    epoch: None,
                },
            )
            .await?;
        agent
            .put_artifact_file(&created.id, "model.bin", &self.checkpoint_file)
            .await?;
        let size = tokio::fs::metadata(&self.checkpoint_file).await?.len();
        agent
            .commit_artifact(
                &created.id,
                &ArtifactCommit {
                    files: vec![ArtifactFile {
                        path: "model.bin".into(),
                        size,
                    }],
                },
            )
            .await?;
        Ok(())
    }

    /// The run of `id` ended on its nodes, and all forget it: a success is reported by each
    /// of them (a gang ends with its last node, as real agents report it), anything else by
    /// the first, which ends the attempt.
    async fn end_run(&mut self, id: &str, reason: ExitReason) -> anyhow::Result<()> {
        self.stopping.remove(id);
        let Some((attempt, nodes)) = self.runs.remove(id) else {
            anyhow::bail!("task {id} ended while not running");
        };
        for &n in &nodes {
            self.agents[n].running.retain(|r| r.task_id != id);
        }
        let exit_code = match reason {
            ExitReason::Success => Some(0),
            _ => None,
        };
        let mut reporters: Vec<usize> = Vec::new();
        for &n in &nodes {
            if !reporters.contains(&n) {
                reporters.push(n);
            }
        }
        if reason != ExitReason::Success {
            reporters.truncate(1);
        }
        for n in reporters {
            self.agents[n]
                .client
                .finished(
                    id,
                    &FinishedReport {
                        attempt,
                        exit_code,
                        reason,
                        detail: None,
                        uploading: vec![],
                        not_kept: None,
                    },
                )
                .await?;
        }
        Ok(())
    }

    async fn run_cycle(&mut self, now: Time) -> anyhow::Result<Round> {
        self.clock.set(ms(now));
        self.runner.cycle(ms(now)).await?;
        let mut round = Round::default();
        // Every agent polls once: a stop order is a preemption (the run stops when the world
        // says, as a real task checkpoints within its grace period); assignments start once
        // every agent has heard its own.
        // Per task: its attempt, the agents that run it, and its workers' placements.
        type Assigned = (u32, Vec<usize>, Vec<WorkerPlacement>);
        let mut assigned: BTreeMap<String, Assigned> = BTreeMap::new();
        for a in 0..self.agents.len() {
            let agent = &self.agents[a];
            let work = agent
                .client
                .poll(
                    Duration::ZERO,
                    &PollRequest {
                        running: agent.running.clone(),
                        gpus: Some(agent.gpus.clone()),
                        host: Some(agent.host.clone()),
                    },
                )
                .await
                .with_context(|| format!("polling as {}", agent.node))?;
            for stop in work.stop {
                if self.runs.contains_key(&stop.task_id)
                    && self.stopping.insert(stop.task_id.clone())
                {
                    let world = self
                        .world_id
                        .get(&stop.task_id)
                        .cloned()
                        .context("a stop order for a task the replay did not submit")?;
                    if stop.reason == "resized" {
                        round.resized.push(world);
                    } else {
                        round.preempted.push(world);
                    }
                }
            }
            for asg in work.assignments {
                let e =
                    assigned
                        .entry(asg.task_id)
                        .or_insert((asg.attempt, Vec::new(), Vec::new()));
                e.1.push(a);
                let node = &self.agents[a].node;
                // A node running several workers of a gang lists them (and their GPUs) apart.
                if asg.workers.is_empty() {
                    e.2.push(WorkerPlacement {
                        node: node.clone(),
                        gpu_indices: asg.gpu_indices,
                    });
                } else {
                    e.2.extend(asg.workers.into_iter().map(|w| WorkerPlacement {
                        node: node.clone(),
                        gpu_indices: w.gpu_indices,
                    }));
                }
            }
        }
        for (id, (attempt, agents, placements)) in assigned {
            for a in &agents {
                let agent = &mut self.agents[*a];
                agent.client.started(&id, attempt).await?;
                agent.running.push(RunningRef {
                    task_id: id.clone(),
                    attempt,
                });
            }
            let world = self
                .world_id
                .get(&id)
                .cloned()
                .context("an assignment of a task the replay did not submit")?;
            self.runs.insert(id, (attempt, agents));
            round.placed.push((world, placements));
        }
        Ok(round)
    }
}

impl Decider for LiveCluster {
    fn submit(&mut self, request: TaskRequest, now: Time) {
        self.clock.set(ms(now));
        self.step(|c| Box::pin(c.submit_job(request)));
    }

    fn checkpoint(&mut self, task: &str, at: Time) {
        self.clock.set(ms(at));
        let task = task.to_owned();
        self.step(|c| Box::pin(c.save_checkpoint(task)));
    }

    fn finish(&mut self, task: &str, now: Time) {
        self.clock.set(ms(now));
        let task = task.to_owned();
        self.step(|c| {
            Box::pin(async move {
                let id = c.server_id(&task)?;
                c.end_run(&id, ExitReason::Success).await
            })
        });
    }

    fn cycle(&mut self, now: Time) -> Round {
        self.step(|c| Box::pin(c.run_cycle(now)))
    }

    fn stopped(&mut self, task: &str, at: Time) {
        self.clock.set(ms(at));
        let task = task.to_owned();
        self.step(|c| {
            Box::pin(async move {
                let id = c.server_id(&task)?;
                c.end_run(&id, ExitReason::Stopped).await
            })
        });
    }
}

/// What the agent of a simulated node says of itself: where the simulator's node keeps each
/// task's network apart, an isolated container node; otherwise one whose tasks share its
/// network.
fn host(node: &autodl_scheduler::Node) -> AgentHost {
    AgentHost {
        runtime: "docker".into(),
        isolation: if node.own_network {
            "container"
        } else {
            "none"
        }
        .into(),
        data_roots: Vec::new(),
        ..Default::default()
    }
}

/// A user's API call; the answer's JSON, or its error.
async fn call(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    path: &str,
    body: Value,
) -> anyhow::Result<Value> {
    let res = http
        .post(format!("{base}{path}"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await?;
    answer(res).await
}

async fn answer(res: reqwest::Response) -> anyhow::Result<Value> {
    let status = res.status();
    let body = res.text().await?;
    if !status.is_success() {
        anyhow::bail!("{status}: {body}");
    }
    Ok(serde_json::from_str(&body).unwrap_or(Value::Null))
}
