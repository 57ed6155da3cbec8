//! One scheduler leader per database: the PostgreSQL advisory lock admits a single holder, each
//! leader has a newer term, and the writes of a leader whose term is over are refused (fencing),
//! also when its lock was cut without it noticing.

use autodl_server::store::{self, StoreError};

use crate::helpers::{database_url, Backend};

crate::on_both_backends!(one_leader_at_a_time_and_deposed_leaders_are_fenced);

async fn one_leader_at_a_time_and_deposed_leaders_are_fenced(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let url = database_url(b, dir.path()).await;
    let first = store::open(&url, 2).await.unwrap();
    let second = store::open(&url, 2).await.unwrap();
    let mut old = first.try_lead("first", 1).await.unwrap().expect("leads");
    assert!(first.still_leads(&mut old).await.unwrap());
    let mut new = match b {
        // SQLite serves a single server process, which always leads; a restarted one starts
        // a newer term.
        Backend::Sqlite => second.try_lead("second", 2).await.unwrap().expect("leads"),
        Backend::Postgres => {
            assert!(
                second.try_lead("second", 2).await.unwrap().is_none(),
                "a second replica must not lead"
            );
            // Cut the leader's lock connection, as a network cut or an operator would: the
            // leader learns it before its next cycle.
            let admin = sqlx::PgPool::connect(&url).await.unwrap();
            let cut: Vec<(bool,)> = sqlx::query_as(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            )
            .fetch_all(&admin)
            .await
            .unwrap();
            assert_eq!(cut.len(), 1);
            admin.close().await;
            assert!(!first.still_leads(&mut old).await.unwrap());
            // The lock went with the connection; the other replica takes over.
            let mut took_over = None;
            for _ in 0..50 {
                if let Some(g) = second.try_lead("second", 2).await.unwrap() {
                    took_over = Some(g);
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            took_over.expect("the other replica takes over")
        }
    };
    assert!(new.term > old.term);
    assert!(second.still_leads(&mut new).await.unwrap());
    assert!(!first.still_leads(&mut old).await.unwrap());
    // Whatever the deposed leader still tries is refused.
    let waiting = first
        .set_waiting(old.term, &[("some-task".to_owned(), None)])
        .await;
    assert!(matches!(waiting, Err(StoreError::Fenced)), "{waiting:?}");
    let placed = first
        .place_tasks(
            old.term,
            &[autodl_server::store::Placing {
                task: "some-task".into(),
                placement: "[]".into(),
                nodes: vec!["n1".into()],
                gpus: 1,
            }],
            3,
        )
        .await;
    assert!(matches!(placed, Err(StoreError::Fenced)), "{placed:?}");
    let stopped = first
        .set_stop_reason(Some(old.term), "some-task", "preempted")
        .await;
    assert!(matches!(stopped, Err(StoreError::Fenced)), "{stopped:?}");
    // The new leader's writes go through.
    second
        .set_waiting(new.term, &[("some-task".to_owned(), None)])
        .await
        .unwrap();
}

/// A scheduler that has not cycled for far longer than its interval (a leader whose cycles
/// keep failing) is reported by every server: `/healthz` says so (still 200: every server
/// would say the same) and `/metrics` carries the age, from the heartbeat the leader writes.
#[tokio::test]
async fn a_stalled_scheduler_is_reported_by_healthz_and_metrics() {
    let app = crate::helpers::spawn_app_with(Backend::Sqlite, |s| s.run_scheduler = false).await;
    let health = || async {
        let res = reqwest::get(app.url("/healthz")).await.unwrap();
        (res.status(), res.json::<serde_json::Value>().await.unwrap())
    };
    let (code, h) = health().await;
    assert_eq!(code, reqwest::StatusCode::OK);
    assert_eq!(h["scheduler_stalled"], false, "{h}");
    assert!(h.get("last_cycle_s").is_none(), "no cycle yet: {h}");

    // The leader's last heartbeat, one minute ago.
    let term = app
        .state
        .store
        .try_lead("stuck", 1)
        .await
        .unwrap()
        .unwrap()
        .term;
    let now = app.state.clock.now_ms();
    app.state.store.cycled(term, now - 60_000).await.unwrap();
    let (code, h) = health().await;
    assert_eq!(code, reqwest::StatusCode::OK, "{h}");
    assert_eq!(h["status"], "degraded", "{h}");
    assert_eq!(h["scheduler_stalled"], true, "{h}");
    assert!(h["last_cycle_s"].as_f64().unwrap() >= 60.0, "{h}");
    assert!(
        h["problem"]
            .as_str()
            .unwrap()
            .contains("no scheduling cycle for 60 s (leader stuck"),
        "{h}"
    );
    let op = app.operator().await;
    let metrics = op
        .send(&app, reqwest::Method::GET, "/metrics", None)
        .await
        .text()
        .await
        .unwrap();
    let age: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("autodl_scheduler_last_cycle_age_seconds "))
        .expect("the age is exported")
        .parse()
        .unwrap();
    assert!(age >= 60.0, "{age}");

    // A cycle now: healthy again.
    app.state
        .store
        .cycled(term, app.state.clock.now_ms())
        .await
        .unwrap();
    let (_, h) = health().await;
    assert_eq!(h["status"], "ok", "{h}");
    assert_eq!(h["scheduler_stalled"], false, "{h}");
    app.kill().await;
}
