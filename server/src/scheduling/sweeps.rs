//! A sweep's `max_concurrency`: trials beyond it wait, held out of the policy's input like
//! tasks waiting for a dependency, so the live cycle and the simulator decide over the same
//! ready tasks. Trials go forward in order; a requeued (preempted) trial keeps its turn.

use std::collections::HashMap;

use autodl_common::tasks::{SweepTrial, TaskState, Waiting};

/// Pending trials that must wait for a free slot of their sweep, with what they say. Placed
/// trials (scheduled or running) hold the slots.
pub fn over_concurrency<'a>(
    tasks: impl IntoIterator<Item = (&'a str, TaskState, Option<&'a SweepTrial>)>,
) -> HashMap<String, Waiting> {
    let mut placed: HashMap<&str, u32> = HashMap::new();
    let mut pending: HashMap<&str, Vec<(u32, &str, u32)>> = HashMap::new();
    for (id, state, trial) in tasks {
        let Some(t) = trial else { continue };
        match state {
            TaskState::Scheduled | TaskState::Running => {
                *placed.entry(&t.sweep_id).or_default() += 1;
            }
            TaskState::Pending => {
                pending
                    .entry(&t.sweep_id)
                    .or_default()
                    .push((t.trial, id, t.max_concurrency))
            }
            _ => {}
        }
    }
    let mut held = HashMap::new();
    for (sweep, mut trials) in pending {
        trials.sort_unstable();
        let running = placed.get(sweep).copied().unwrap_or(0);
        for (i, (_, id, max)) in trials.into_iter().enumerate() {
            if running + i as u32 >= max {
                held.insert(
                    id.to_owned(),
                    Waiting {
                        reason: Some("sweep".into()),
                        message: format!(
                            "its sweep runs at most {max} trials at once ({running} running); it is number {} in line",
                            i + 1
                        ),
                        position: None,
                        estimated_start: None,
                        priority: None,
                    },
                );
            }
        }
    }
    held
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn trial(sweep: &str, n: u32, max: u32) -> SweepTrial {
        SweepTrial {
            sweep_id: sweep.into(),
            trial: n,
            max_concurrency: max,
            params: BTreeMap::new(),
        }
    }

    #[test]
    fn only_the_first_trials_up_to_the_limit_go_forward() {
        let t: Vec<(String, TaskState, SweepTrial)> = vec![
            ("a0".into(), TaskState::Running, trial("a", 0, 2)),
            ("a3".into(), TaskState::Pending, trial("a", 3, 2)),
            ("a1".into(), TaskState::Pending, trial("a", 1, 2)),
            ("a2".into(), TaskState::Pending, trial("a", 2, 2)),
            ("a9".into(), TaskState::Completed, trial("a", 9, 2)),
            ("b0".into(), TaskState::Pending, trial("b", 0, 5)),
        ];
        let held = over_concurrency(t.iter().map(|(id, s, tr)| (id.as_str(), *s, Some(tr))));
        let mut ids: Vec<&str> = held.keys().map(String::as_str).collect();
        ids.sort_unstable();
        assert_eq!(
            ids,
            ["a2", "a3"],
            "a1 takes the free slot; b is under its limit"
        );
        assert!(held["a2"]
            .message
            .contains("at most 2 trials at once (1 running)"));
        assert_eq!(held["a2"].reason.as_deref(), Some("sweep"));
        // Plain tasks are never held.
        assert!(over_concurrency([("x", TaskState::Pending, None)]).is_empty());
    }
}
