//! Talking to the server: the long-poll loop (joining first, keeping the node's credential),
//! what its answers start and stop, and how the agent behaves while the server is away.

use super::*;

impl Inner {
    pub(super) async fn control_loop(
        self: &Arc<Self>,
        shutdown: &CancellationToken,
    ) -> Result<(), AgentError> {
        let cfg = &self.config;
        if let Some(c) = &cfg.credential {
            self.client.set_credential(Some(c.clone()));
        } else if let Some(saved) = load_credential(&cfg.state_dir) {
            if saved.node_id == cfg.node_id && saved.server == cfg.server_url {
                self.client.set_credential(Some(saved.credential));
            } else {
                tracing::info!(
                    saved_node = saved.node_id,
                    saved_server = saved.server,
                    "saved credential is for another node or server; registering again"
                );
            }
        }
        let mut backoff = self.new_backoff("poll");
        let mut wait = cfg.poll_wait;
        loop {
            if shutdown.is_cancelled() {
                return Ok(());
            }
            if !self.client.has_credential() {
                let Some(token) = cfg.registration_token.clone() else {
                    return Err(AgentError::Rejected(format!(
                        "no node credential in {} and no registration token to join with",
                        cfg.state_dir.display()
                    )));
                };
                let registered = tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    r = self.register(token) => r,
                };
                match registered {
                    Ok(()) => {
                        self.set_reachable(true);
                        backoff.reset();
                    }
                    Err(e) if e.is_transient() => {
                        self.away(&e, &backoff, "register");
                        sleep_or_cancel(backoff.next_delay(), shutdown).await;
                        continue;
                    }
                    Err(e) => {
                        return Err(AgentError::Rejected(format!("registration refused: {e}")))
                    }
                }
            }

            let req = PollRequest {
                running: self.running_list(),
                gpus: Some(lock(&self.inventory).clone()),
                host: Some(self.host_report()),
            };
            let answer = tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                r = self.client.poll(wait, &req) => r,
            };
            match answer {
                Ok(resp) => {
                    if backoff.failures() > 0 {
                        tracing::info!("server reachable again");
                    }
                    self.set_reachable(true);
                    backoff.reset();
                    self.node_lost_s
                        .store(resp.node_lost_s, std::sync::atomic::Ordering::Relaxed);
                    wait = match resp.heartbeat_s {
                        0 => cfg.poll_wait,
                        h => Duration::from_secs(h).min(cfg.poll_wait),
                    };
                    self.apply(resp, shutdown);
                }
                Err(e) if e.is_unauthorized() => {
                    if cfg.registration_token.is_none() {
                        return Err(AgentError::Rejected(format!(
                            "the server no longer accepts this node's credential ({e}) and there is no registration token"
                        )));
                    }
                    tracing::warn!(error = %e, "node credential refused; registering again");
                    self.client.set_credential(None);
                    sleep_or_cancel(backoff.next_delay(), shutdown).await;
                }
                Err(e) => {
                    self.away(&e, &backoff, "poll");
                    sleep_or_cancel(backoff.next_delay(), shutdown).await;
                }
            }
        }
    }

    /// Logs the first failure of a streak loudly and the rest quietly.
    pub(super) fn away(&self, e: &ClientError, backoff: &Backoff, what: &str) {
        if matches!(e, ClientError::Transport(_)) {
            self.set_reachable(false);
        }
        if backoff.failures() == 0 {
            tracing::warn!(error = %e, what, "server call failed; retrying with backoff");
        } else {
            tracing::debug!(error = %e, what, failures = backoff.failures(), "server call failed");
        }
    }

    pub(super) async fn register(&self, token: String) -> Result<(), ClientError> {
        let cfg = &self.config;
        let node = AgentNode {
            id: cfg.node_id.clone(),
            zone: cfg.zone.clone(),
            labels: cfg.labels.clone(),
            cpu: f64::from(cfg.cpu.unwrap_or_else(hostinfo::cpu_count)),
            memory: cfg.memory.unwrap_or_else(hostinfo::memory_bytes),
            gpus: lock(&self.inventory).clone(),
            host: Some(self.host_report()),
        };
        let resp = self
            .client
            .register(&RegisterRequest { token, node })
            .await?;
        if resp.node_id != cfg.node_id {
            tracing::warn!(
                ours = cfg.node_id,
                theirs = resp.node_id,
                "server registered this node under another id"
            );
        }
        self.client.set_credential(Some(resp.credential.clone()));
        tracing::info!(node = %cfg.node_id, "registered with the server");
        let saved = SavedCredential {
            server: cfg.server_url.clone(),
            node_id: cfg.node_id.clone(),
            credential: resp.credential,
        };
        if let Err(e) = save_credential(&cfg.state_dir, &saved) {
            // The credential works for this run; the next start registers again if it can.
            tracing::error!(error = %e, "could not save the node credential");
        }
        Ok(())
    }

    pub(super) fn apply(self: &Arc<Self>, resp: PollResponse, shutdown: &CancellationToken) {
        for s in resp.stop {
            let mut tasks = lock(&self.tasks);
            match tasks.get_mut(&(s.task_id.clone(), s.attempt)) {
                Some(e) if !e.finished => {
                    tracing::info!(
                        task = s.task_id,
                        attempt = s.attempt,
                        reason = s.reason,
                        grace_s = s.grace_s,
                        "stopping task"
                    );
                    e.ends_task |= s.ends_task;
                    e.stop.send_replace(Some(Duration::from_secs(s.grace_s)));
                }
                _ => tracing::debug!(
                    task = s.task_id,
                    attempt = s.attempt,
                    "stop for an attempt not running here"
                ),
            }
        }
        for t in resp.tunnels {
            let launch = lock(&self.tasks)
                .get(&(t.task_id.clone(), t.attempt))
                .filter(|e| !e.finished)
                .and_then(|e| e.launch.clone());
            let inner = self.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = crate::tunnel::serve(&inner.client, inner.runtime.clone(), launch, t) => {}
                    _ = shutdown.cancelled() => {}
                }
            });
        }
        for a in resp.assignments {
            let key = (a.task_id.clone(), a.attempt);
            if lock(&self.tasks).contains_key(&key) {
                continue;
            }
            self.start_task(a, shutdown);
        }
    }

    pub(super) fn start_task(self: &Arc<Self>, a: Assignment, shutdown: &CancellationToken) {
        let mut launch = TaskLaunch::from_assignment(
            &a,
            &self.config.node_id,
            &self.config.state_dir,
            !self.backend.is_simulated(),
        );
        // Held until the attempt's supervision ends.
        let port = self.ports.lease_rendezvous(&mut launch.env);
        let (stop_tx, stop_rx) = watch::channel(None);
        let key = (a.task_id.clone(), a.attempt);
        tracing::info!(task = a.task_id, attempt = a.attempt, gpus = ?a.gpu_indices, "starting task");
        lock(&self.tasks).insert(
            key.clone(),
            TaskEntry {
                stop: stop_tx,
                allocation: GpuAllocation {
                    task_id: a.task_id.clone(),
                    gpu_indices: a.gpu_indices.clone(),
                    gpu_memory: a.gpu_memory,
                    since: Instant::now(),
                    pid: None,
                },
                finished: false,
                ends_task: false,
                launch: None,
            },
        );
        self.push_allocations();
        // In a multi-node task the first node (rank 0's) saves the checkpoints, as torchrun's
        // rank 0 does, so ranks do not overwrite one another's; every node saves the results
        // of its own workers (each in a folder of its rank's, rank 0's at the top).
        let rank_zero = a
            .env
            .get("NODE_RANK")
            .or(a.env.get("RANK"))
            .is_none_or(|r| r == "0");
        let job = StorageJob {
            restore: a.restore.clone(),
            checkpoint_interval: a
                .checkpoint
                .as_ref()
                .and_then(|c| c.interval)
                .filter(|i| *i > 0 && rank_zero)
                .map(Duration::from_secs),
            checkpointing: a.checkpoint.is_some() && rank_zero,
            saves_checkpoints: rank_zero,
            data_from_storage: a
                .data_path
                .as_deref()
                .is_some_and(|p| p.starts_with("s3://")),
            code: a.code.clone(),
        };
        let supervised = supervise(self.clone(), key, launch, job, stop_rx, shutdown.clone());
        self.tracker.spawn(async move {
            supervised.await;
            drop(port);
        });
    }
}
