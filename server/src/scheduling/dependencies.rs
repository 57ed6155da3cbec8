//! Tasks that start after others (`after`): held out of the policy's input until what they
//! wait for has ended as they need, and ended themselves when that can no longer happen. The
//! policy never sees a held task, so the live cycle and the simulator decide over the same
//! input: what is ready to run.

use std::collections::HashMap;
use std::sync::Arc;

use autodl_common::tasks::{AfterFailure, AfterWhen, TaskState, Waiting};

use super::snapshot::ActiveTask;
use crate::store::{StoreResult, Tasks};

/// How the tasks of one cycle stand with respect to what they wait for.
#[derive(Default)]
pub struct Gated {
    /// For the policy: every active task but the held ones.
    pub ready: Vec<Arc<ActiveTask>>,
    /// Pending tasks still waiting for another to end, with what they say.
    pub held: HashMap<String, Waiting>,
    /// Pending tasks that can never start: (task, the state it ends in, why).
    pub doomed: Vec<(String, TaskState, String)>,
}

/// Remembers how finished tasks ended (which never changes), so a long chain does not read
/// them again every cycle.
#[derive(Default)]
pub struct Dependencies {
    ended: HashMap<String, TaskState>,
}

impl Dependencies {
    pub async fn gate(
        &mut self,
        store: &dyn Tasks,
        tasks: Vec<Arc<ActiveTask>>,
    ) -> StoreResult<Gated> {
        let active: HashMap<&str, TaskState> =
            tasks.iter().map(|t| (t.id(), t.rec.task.state)).collect();
        // How a waiting task names what it waits for: as its owner knows it.
        let named: HashMap<&str, String> = tasks
            .iter()
            .map(|t| {
                (
                    t.id(),
                    format!("#{} ({})", t.rec.task.number, t.rec.task.name),
                )
            })
            .collect();
        let unknown: Vec<String> = tasks
            .iter()
            .filter(|t| waits(t))
            .flat_map(|t| t.spec().after.iter())
            .filter(|dep| !active.contains_key(dep.as_str()) && !self.ended.contains_key(*dep))
            .cloned()
            .collect::<std::collections::BTreeSet<String>>()
            .into_iter()
            .collect();
        // Not active and not seen ended: read once. One that is active after all (submitted
        // after this cycle's read) is not kept, and is read again next cycle.
        let mut now_active: HashMap<String, TaskState> = HashMap::new();
        if !unknown.is_empty() {
            for (id, state) in store.task_states(None, &unknown).await? {
                if state.is_finished() {
                    self.ended.insert(id, state);
                } else {
                    now_active.insert(id, state);
                }
            }
        }
        let mut out = Gated::default();
        for t in &tasks {
            if !waits(t) {
                continue;
            }
            let state_of = |dep: &str| {
                active
                    .get(dep)
                    .or_else(|| now_active.get(dep))
                    .or_else(|| self.ended.get(dep))
                    .copied()
            };
            let need = match t.spec().after_when {
                AfterWhen::Ok => "complete",
                AfterWhen::Any => "end",
            };
            let mut verdict: Option<Result<(), String>> = None;
            for dep in &t.spec().after {
                match state_of(dep) {
                    Some(s) if !s.is_finished() => {
                        verdict = Some(Ok(()));
                        out.held.insert(
                            t.id().to_owned(),
                            Waiting {
                                reason: Some("dependency".into()),
                                message: format!(
                                    "waits for task {} to {need}; it is {}",
                                    named.get(dep.as_str()).map_or(dep.as_str(), String::as_str),
                                    // Placed is as good as running to the one waiting.
                                    if s == TaskState::Pending {
                                        "waiting to start"
                                    } else {
                                        "running"
                                    }
                                ),
                                position: None,
                                estimated_start: None,
                                priority: None,
                            },
                        );
                        break;
                    }
                    Some(s)
                        if t.spec().after_when == AfterWhen::Ok && s != TaskState::Completed =>
                    {
                        verdict = Some(Err(format!(
                            "task {dep} ended {}; this task was to start after it completed",
                            s.as_str()
                        )));
                        break;
                    }
                    Some(_) => {}
                    None => {
                        verdict = Some(Err(format!("task {dep} it was to start after is gone")));
                        break;
                    }
                }
            }
            if let Some(Err(why)) = verdict {
                let end = match t.spec().after_failure {
                    AfterFailure::Cancel => TaskState::Cancelled,
                    AfterFailure::Fail => TaskState::Failed,
                };
                out.doomed.push((t.id().to_owned(), end, why));
            }
        }
        let doomed: std::collections::HashSet<&str> =
            out.doomed.iter().map(|d| d.0.as_str()).collect();
        let ready = tasks
            .iter()
            .filter(|t| !out.held.contains_key(t.id()) && !doomed.contains(t.id()))
            .cloned()
            .collect();
        out.ready = ready;
        Ok(out)
    }
}

/// A pending task that names tasks to start after.
fn waits(t: &ActiveTask) -> bool {
    t.rec.task.state == TaskState::Pending && !t.spec().after.is_empty()
}
