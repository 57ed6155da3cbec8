//! What the leader keeps up beside its decisions: nodes whose agent went silent are lost (their
//! tasks go back to the queue), tasks past their time limit are stopped, and fair-share
//! standings are recorded for the usage pages.

use super::*;

impl Runner {
    /// Nodes whose agent stopped polling are lost: their tasks go back to the queue (and resume
    /// from their last checkpoint when they start again).
    pub(super) async fn detect_lost_nodes(
        &mut self,
        term: Term,
        tasks: &[Arc<ActiveTask>],
        now_ms: i64,
    ) -> anyhow::Result<bool> {
        let timeout = (self.settings.node_lost_timeout_secs as i64) * 1000;
        let listening_since = self
            .leader_since
            .unwrap_or(now_ms)
            .max(self.heard_since(now_ms));
        if now_ms - listening_since <= timeout {
            return Ok(false);
        }
        let mut any = false;
        // Silent for longer than the timeout, all of it while this server listened.
        for n in &self.store.silent_nodes(now_ms - timeout).await? {
            tracing::warn!(node = %n.id, "no heartbeat: node lost, requeueing its tasks");
            self.store.set_node_status(&n.id, NodeStatus::Lost).await?;
            let on_node = |t: &&Arc<ActiveTask>| {
                t.placement()
                    .as_ref()
                    .is_some_and(|p| p.iter().any(|w| w.node == n.id))
            };
            // Per organization: the requeued tasks and their owners.
            let mut by_tenant: HashMap<&str, (Vec<&str>, Vec<&str>)> = HashMap::new();
            for t in tasks.iter().filter(on_node) {
                // A gang's node whose workers all succeeded is not needed by it any more.
                if self
                    .store
                    .ended_parts(t.id(), t.rec.task.attempts)
                    .await?
                    .iter()
                    .any(|p| p.node == n.id)
                {
                    continue;
                }
                let msg = format!("node {} stopped answering", n.id);
                self.store
                    .requeue_task(Some(term), t.id(), "node_lost", &msg, now_ms)
                    .await?;
                let (ids, owners) = by_tenant.entry(t.rec.task.tenant_id.as_str()).or_default();
                ids.push(t.id());
                if !owners.contains(&t.rec.task.user_id.as_str()) {
                    owners.push(t.rec.task.user_id.as_str());
                }
            }
            // Each organization hears of its own tasks only.
            for (tenant, (ids, owners)) in by_tenant {
                let data = serde_json::json!({"node": n.id, "requeued_tasks": ids});
                let event = crate::notify::Event::NodeLost;
                crate::notify::tell(self.store.as_ref(), tenant, &owners, event, data, now_ms)
                    .await;
            }
            any = true;
        }
        if any {
            self.handle.invalidate_nodes();
        }
        Ok(any)
    }

    /// Since when this server has been awake to hear its nodes. A leader cycles every few
    /// seconds; a stretch of the clock without a cycle longer than a third of the node timeout
    /// is one it was not listening through (the process stopped or frozen: a debugger, a
    /// cgroup freezer, a VM paused or migrated), and nodes silent only because of it are not
    /// lost: each gets a whole timeout from the wake-up to be heard again.
    pub(super) fn heard_since(&mut self, now_ms: i64) -> i64 {
        let gap = (self.settings.node_lost_timeout_secs as i64 * 1000 / 3)
            .max(3 * i64::try_from(self.interval.as_millis()).unwrap_or(i64::MAX / 4));
        if let Some(last) = self.last_cycle_at.replace(now_ms) {
            if now_ms - last > gap {
                tracing::warn!(
                    gap_ms = now_ms - last,
                    "this server was not running for a while (paused or frozen): nodes get a whole timeout to be heard before any is judged lost"
                );
                self.awake_since = Some(now_ms);
            }
        }
        self.awake_since.unwrap_or(i64::MIN)
    }

    /// Keeps the factors this cycle ranks each competing person by, computed as the policy
    /// computes them from the same input.
    pub(super) async fn record_standings(
        &self,
        state: &autodl_scheduler::ClusterState,
        now: u64,
        now_ms: i64,
    ) -> anyhow::Result<bool> {
        let ctx = autodl_scheduler::PriorityContext::new(state, now, &self.config);
        let tenant_of: HashMap<&str, &str> = state
            .pending
            .iter()
            .chain(state.running.iter().map(|r| &r.request))
            .map(|t| (t.user.as_str(), t.tenant.as_str()))
            .collect();
        let rows: Vec<crate::store::StandingRecord> = ctx
            .standings()
            .into_iter()
            .filter_map(|(user, fair_share, utilization)| {
                let tenant_id = tenant_of.get(user.as_str())?.to_string();
                Some(crate::store::StandingRecord {
                    user_id: user,
                    tenant_id,
                    at: now_ms,
                    fair_share,
                    utilization,
                })
            })
            .collect();
        if rows.is_empty() {
            return Ok(false);
        }
        self.store.record_standings(&rows).await?;
        Ok(true)
    }

    /// Stops a placed task: through its agent (which lets it checkpoint) when it has one,
    /// otherwise by putting it back in the queue at once.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn stop_task(
        &self,
        term: Term,
        task: &str,
        reason: &str,
        message: &str,
        agent_nodes: &HashMap<String, bool>,
        tasks: &[Arc<ActiveTask>],
        now_ms: i64,
    ) -> anyhow::Result<()> {
        let nodes: Vec<String> = tasks
            .iter()
            .find(|t| t.id() == task)
            .and_then(|t| t.placement().as_ref())
            .map(|p| p.iter().map(|w| w.node.clone()).collect())
            .unwrap_or_default();
        if nodes
            .iter()
            .any(|n| agent_nodes.get(n).copied().unwrap_or(false))
        {
            if self.store.set_stop_reason(Some(term), task, reason).await? {
                // The timeline says why now; it says "stopped" once the agents have.
                self.store
                    .add_event(task, "stopping", message, now_ms)
                    .await?;
                for n in &nodes {
                    self.agents.notify(n);
                }
            }
        } else {
            self.store
                .requeue_task(Some(term), task, reason, message, now_ms)
                .await?;
        }
        Ok(())
    }

    /// Runs that have lasted their task's `time_limit` are stopped as a preemption is (their
    /// agent sends SIGTERM, waits the grace period, then kills) and end `timed_out` when the
    /// agent reports them stopped (`app::reports::finished`). Asking again each cycle is
    /// harmless: a stop reason, once set, stays.
    pub(super) async fn stop_overdue(
        &self,
        term: Term,
        tasks: &[Arc<ActiveTask>],
        agent_nodes: &HashMap<String, bool>,
        now_ms: i64,
    ) -> anyhow::Result<()> {
        for t in tasks {
            let (Some(limit), Some(started)) = (t.spec().time_limit, t.rec.run_started_at) else {
                continue;
            };
            if t.rec.task.state != TaskState::Running
                || t.rec.task.stop_reason.is_some()
                || now_ms - started < limit as i64 * 1000
            {
                continue;
            }
            let on_agents = t
                .placement()
                .iter()
                .flatten()
                .any(|w| agent_nodes.get(&w.node).copied().unwrap_or(false));
            if on_agents {
                if self
                    .store
                    .set_stop_reason(Some(term), t.id(), TIMED_OUT)
                    .await?
                {
                    tracing::info!(task = t.id(), limit, "time limit reached: stopping the run");
                    for w in t.placement().iter().flatten() {
                        self.agents.notify(&w.node);
                    }
                }
            } else {
                // Nothing runs it but the record (a node without an agent): end it now.
                let end = crate::tasks::lifecycle::timed_out(
                    t.spec(),
                    t.rec.task.attempts as u32,
                    None,
                    t.rec.task.batch_size,
                );
                self.store
                    .finish_attempt(t.id(), t.rec.task.attempts, &end, now_ms)
                    .await?;
            }
        }
        Ok(())
    }
}
