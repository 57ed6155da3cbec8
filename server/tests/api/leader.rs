//! One scheduler leader per database: the PostgreSQL advisory lock admits a single holder.

use autodl_server::store;

use crate::helpers::{database_url, Backend};

crate::on_both_backends!(one_leader_at_a_time);

async fn one_leader_at_a_time(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let url = database_url(b, dir.path()).await;
    let first = store::open(&url, 2).await.unwrap();
    let second = store::open(&url, 2).await.unwrap();
    let guard = first.try_lead().await.unwrap();
    assert!(guard.is_some());
    match b {
        // SQLite serves a single server process, which always leads.
        Backend::Sqlite => assert!(second.try_lead().await.unwrap().is_some()),
        Backend::Postgres => {
            assert!(
                second.try_lead().await.unwrap().is_none(),
                "a second replica must not lead"
            );
            drop(guard);
            // The lock goes with the leader's connection; the other replica takes over.
            let mut took_over = false;
            for _ in 0..50 {
                if second.try_lead().await.unwrap().is_some() {
                    took_over = true;
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            assert!(took_over);
        }
    }
}
