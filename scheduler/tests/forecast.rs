//! Start-time estimates: the policy run forward on a copy of the cluster.

mod common;

use autodl_scheduler::forecast::{estimate_starts, RuntimeHistory};
use autodl_scheduler::{PolicyConfig, RunAccount, Snapshot};
use common::{node, running, task};

/// One node of 8 GPUs, busy until 1,000 s by a run that said it takes 1,000 s. Two whole-node
/// tasks wait: the first starts when the run ends, the second when the first has run its own
/// estimate of 500 s (not its user's history of 700 s).
#[test]
fn waiting_tasks_start_as_the_runs_ahead_of_them_end() {
    let mut snap = Snapshot::new(
        vec![node("n1", "z", 8, "A100", 80)],
        Default::default(),
        Default::default(),
    );
    let mut busy = task("busy", "u0", 8, 0);
    busy.estimated_runtime = Some(1_000);
    let gpus: Vec<u32> = (0..8).collect();
    snap.add_running(running(busy, "n1", &gpus, 0), RunAccount::starting(0));
    let mut a = task("a", "u1", 8, 10);
    a.estimated_runtime = Some(500);
    snap.add_pending(a);
    let b = task("b", "u1", 8, 20);
    snap.add_pending(b);
    let mut history = RuntimeHistory::new(3_600);
    history.record("u1", 700);
    let cfg = PolicyConfig {
        explain_pending: false,
        ..PolicyConfig::default()
    };
    let est = estimate_starts(&snap, 100, &cfg, &|r| history.estimate(r), 64, &mut || true);
    assert_eq!(est.get("a"), Some(&1_000), "{est:?}");
    assert_eq!(est.get("b"), Some(&1_500), "{est:?}");
    // A run already past its estimate is taken to end a tenth of its estimate later.
    let est = estimate_starts(
        &snap,
        1_200,
        &cfg,
        &|r| history.estimate(r),
        64,
        &mut || true,
    );
    assert_eq!(est.get("a"), Some(&1_300), "{est:?}");
    assert_eq!(est.get("b"), Some(&1_800), "{est:?}");
    // The horizon bounds the work: one step sees only the first start.
    let est = estimate_starts(&snap, 100, &cfg, &|r| history.estimate(r), 1, &mut || true);
    assert_eq!(est.len(), 1);
    // So does the caller's budget.
    let mut steps = 0;
    let mut budget = || {
        steps += 1;
        steps <= 1
    };
    let est = estimate_starts(&snap, 100, &cfg, &|r| history.estimate(r), 64, &mut budget);
    assert_eq!(est.len(), 1);
}

#[test]
fn history_takes_the_median_of_recent_run_times() {
    let mut h = RuntimeHistory::new(3_600);
    let t = task("x", "u", 1, 0);
    assert_eq!(h.estimate(&t), 3_600);
    for s in [100, 200, 100_000] {
        h.record("u", s);
    }
    assert_eq!(h.estimate(&t), 200);
    for _ in 0..30 {
        h.record("u", 50);
    }
    assert_eq!(h.estimate(&t), 50);
}
