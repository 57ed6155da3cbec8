//! The leader's watch on idle GPUs: once a minute (of the clock) each running task is judged
//! by `tasks::session::judge` from its measured GPU utilization and its tunnel traffic. An
//! idle task is warned in its timeline; an idle session (or batch task, where the
//! organization asks) is stopped through its grace period and ends `cancelled`, its GPUs
//! given back. Idle GPU-time also lowers its owner's fair-share through the utilization
//! factor, which reads the same samples.

use std::collections::HashMap;
use std::sync::Arc;

use autodl_common::api::SessionPolicy;
use autodl_common::tasks::{TaskKind, TaskState};

use crate::agents::AgentHub;
use crate::notify::{tell, Event};
use crate::store::{
    Accounts, ActivityAsk, Notifications, TaskJournal, Tasks, Term, Usage, Webhooks,
};
use crate::tasks::lifecycle::TIMED_OUT;
use crate::tasks::session::{judge, past_session_length, treated_as, Activity, Verdict, IDLE};
use crate::tunnels::Tunnels;

use super::snapshot::ActiveTask;

/// How often tasks are judged (clock milliseconds).
pub const CHECK_EVERY_MS: i64 = 60_000;

#[derive(Default)]
pub struct IdleWatch {
    last_check: Option<i64>,
    /// The idle period each task was last warned of (its start), so one period is told once.
    warned: HashMap<String, i64>,
}

fn minutes(ms: i64) -> i64 {
    (ms / 60_000).max(0)
}

impl IdleWatch {
    #[allow(clippy::too_many_arguments)]
    pub async fn check<
        S: Accounts + Notifications + Tasks + TaskJournal + Usage + Webhooks + ?Sized,
    >(
        &mut self,
        store: &S,
        tunnels: &Tunnels,
        agents: &AgentHub,
        term: Term,
        tasks: &[Arc<ActiveTask>],
        agent_nodes: &HashMap<String, bool>,
        now_ms: i64,
    ) -> anyhow::Result<()> {
        if self
            .last_check
            .is_some_and(|t| now_ms - t < CHECK_EVERY_MS && now_ms >= t)
        {
            return Ok(());
        }
        self.last_check = Some(now_ms);
        let mut policies: HashMap<String, SessionPolicy> = HashMap::new();
        let mut seen = Vec::new();
        // The running tasks to judge, with their nodes and their organization's rules.
        let mut judged: Vec<(&ActiveTask, Vec<&str>, i64)> = Vec::new();
        for t in tasks {
            let (TaskState::Running, None, Some(started)) = (
                t.rec.task.state,
                t.rec.task.stop_reason.as_ref(),
                t.rec.run_started_at,
            ) else {
                continue;
            };
            let nodes: Vec<&str> = t
                .placement()
                .iter()
                .flatten()
                .map(|w| w.node.as_str())
                .collect();
            if !nodes
                .iter()
                .any(|n| agent_nodes.get(*n).copied().unwrap_or(false))
            {
                continue;
            }
            seen.push(t.id().to_owned());
            let tenant = &t.rec.task.tenant_id;
            if !policies.contains_key(tenant) {
                policies.insert(tenant.clone(), store.session_policy(tenant).await?);
            }
            let p = &policies[tenant];
            // Held batch tasks are also held to the session length.
            if p.idle_minutes != 0
                || (p.max_session_hours.is_some() && t.spec().kind == TaskKind::Batch)
            {
                judged.push((t.as_ref(), nodes, started));
            }
        }
        let asks: Vec<ActivityAsk> = judged
            .iter()
            .map(|(t, _, started)| ActivityAsk {
                task_id: t.id().to_owned(),
                from: *started,
                busy: policies[&t.rec.task.tenant_id].idle_util_pct / 100.0,
            })
            .collect();
        let activity = store.gpu_activity(&asks).await?;
        // Batch tasks someone holds like a session (a shell, a port) are under its rules.
        let batch: Vec<String> = judged
            .iter()
            .filter(|(t, _, _)| t.spec().kind == TaskKind::Batch)
            .map(|(t, _, _)| t.id().to_owned())
            .collect();
        let held = if batch.is_empty() {
            HashMap::new()
        } else {
            store.last_held(&batch).await?
        };
        for (t, nodes, started) in judged {
            let tenant = &t.rec.task.tenant_id;
            let policy = &policies[tenant];
            let gpu = activity.get(t.id()).copied().unwrap_or_default();
            let activity = Activity {
                started,
                first_sample: gpu.first,
                last_sample: gpu.last,
                last_busy: gpu.last_busy,
                last_traffic: tunnels.last_traffic(t.id()),
            };
            let kind = treated_as(t.spec().kind, started, held.get(t.id()).copied());
            if kind != t.spec().kind && past_session_length(policy, started, now_ms) {
                if store.set_stop_reason(Some(term), t.id(), TIMED_OUT).await? {
                    let message = format!(
                        "stopping: a shell or an app held this batch task like a session, and it has run the {} h your organization allows sessions",
                        policy.max_session_hours.unwrap_or_default()
                    );
                    store
                        .add_event(t.id(), "session_length", &message, now_ms)
                        .await?;
                    tracing::info!(
                        task = t.id(),
                        "held like a session past its length: stopping the run"
                    );
                    for n in &nodes {
                        agents.notify(n);
                    }
                }
                continue;
            }
            let Verdict::Idle { since, stop } = judge(policy, kind, &activity, now_ms) else {
                continue;
            };
            let idle = minutes(now_ms - since);
            // The GPUs the run holds (an elastic task's may be fewer than it asked for).
            let gpus = match t.placement() {
                Some(p) => p.iter().map(|w| w.gpu_indices.len()).sum::<usize>() as f64,
                None => t.rec.task.gpus_total.max(0) as f64,
            };
            let wasted = gpus * (now_ms - since) as f64 / 3_600_000.0;
            let under = policy.idle_util_pct;
            let about = |message: &str| {
                serde_json::json!({
                    "task": {"id": t.id(), "name": t.rec.task.name, "user_id": t.rec.task.user_id,
                             "kind": t.spec().kind},
                    "idle_minutes": idle,
                    "idle_gpu_hours": (wasted * 100.0).round() / 100.0,
                    "message": message,
                })
            };
            let tenant = tenant.clone();
            if stop {
                if store.set_stop_reason(Some(term), t.id(), IDLE).await? {
                    let message = format!(
                        "stopping: its GPUs have been under {under}% for {idle} min with nobody \
                         connected ({wasted:.2} GPU-hours idle)"
                    );
                    store
                        .add_event(t.id(), "idle_stop", &message, now_ms)
                        .await?;
                    let data = about(&message);
                    let owner = [t.rec.task.user_id.as_str()];
                    tell(store, &tenant, &owner, Event::TaskIdleStopped, data, now_ms).await;
                    tracing::info!(task = t.id(), idle, "idle: stopping the run");
                    for n in &nodes {
                        agents.notify(n);
                    }
                }
            } else if self.warned.get(t.id()) != Some(&since) {
                let then = if t.spec().kind == autodl_common::tasks::TaskKind::Session
                    || policy.stop_idle_batch
                {
                    format!(
                        "; it will be stopped after {} min idle",
                        policy.idle_minutes
                    )
                } else {
                    String::new()
                };
                let message = format!(
                    "its GPUs have been under {under}% for {idle} min ({wasted:.2} GPU-hours \
                     idle){then}"
                );
                store.add_event(t.id(), "idle", &message, now_ms).await?;
                let data = about(&message);
                let owner = [t.rec.task.user_id.as_str()];
                tell(store, &tenant, &owner, Event::TaskIdle, data, now_ms).await;
                self.warned.insert(t.id().to_owned(), since);
            }
        }
        self.warned.retain(|id, _| seen.contains(id));
        Ok(())
    }
}
