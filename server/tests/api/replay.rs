//! Live equals simulated: a trace with contention (users competing, jobs of 1 to 8 GPUs,
//! preemptions through checkpoints) replayed through the real server and through the
//! simulator gives the same placements and preemptions, decision by decision; and the same
//! trace with its multi-GPU jobs elastic, with its resizes.

use autodl_scheduler::sim::jobs::{self, Action, JobPolicy, JobsConfig};
use autodl_server::replay;

use crate::helpers::{database_url, Backend};

fn config() -> JobsConfig {
    JobsConfig {
        nodes: 2,
        gpus_per_node: 4,
        policy: JobPolicy::Autodl,
        checkpoint_s: 1_800,
        restart_s: 60,
        tick_s: 600,
        hardware: replay::hardware(),
        ..JobsConfig::default()
    }
}

async fn the_server_decides_as_the_simulator(b: Backend) {
    let c = compare(b, config()).await;
    let preemptions = c
        .live
        .log
        .iter()
        .filter(|d| d.what == Action::Preempt)
        .count();
    assert!(preemptions >= 1, "the trace must exercise preemption");
}

/// Every multi-GPU job a gang of one-GPU workers that runs with half of them or more: the
/// server starts them narrow, grows and shrinks them as the simulator does.
async fn the_server_resizes_as_the_simulator(b: Backend) {
    let c = compare(
        b,
        JobsConfig {
            elastic: Some(0.5),
            ..config()
        },
    )
    .await;
    let resizes = c
        .live
        .log
        .iter()
        .filter(|d| d.what == Action::Resize)
        .count();
    assert!(resizes >= 1, "the trace must exercise resizing");
    assert!(c.live.report.narrow_starts >= 1, "{:?}", c.live.report);
}

async fn compare(b: Backend, cfg: JobsConfig) -> replay::Comparison {
    let dir = tempfile::tempdir().unwrap();
    // Arrivals four times denser than the generator's: cycles fall inside victims' grace
    // periods, where a victim already stopping must not be picked again.
    let jobs: Vec<_> = jobs::synthetic(40, 3, 7)
        .into_iter()
        .map(|j| jobs::Job {
            submit: j.submit / 4,
            ..j
        })
        .collect();
    let url = database_url(b, dir.path()).await;
    let c = replay::compare(&jobs, &cfg, &url, dir.path())
        .await
        .expect("replay");
    assert_eq!(c.tasks, 40);
    assert_eq!(
        c.first_difference, None,
        "the server and the simulator differ after {} equal decisions",
        c.agreeing
    );
    assert_eq!(c.simulated.report, c.live.report);
    assert_eq!(c.live.report.jobs, 40, "every job finished");
    c
}

mod the_server_decides_as_the_simulator {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() {
        super::the_server_decides_as_the_simulator(crate::helpers::Backend::Sqlite).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        super::the_server_decides_as_the_simulator(crate::helpers::Backend::Postgres).await
    }
}

mod the_server_resizes_as_the_simulator {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() {
        super::the_server_resizes_as_the_simulator(crate::helpers::Backend::Sqlite).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        super::the_server_resizes_as_the_simulator(crate::helpers::Backend::Postgres).await
    }
}
