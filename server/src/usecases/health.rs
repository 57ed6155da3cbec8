//! The server's health as load balancers and operators see it: whether the database can be
//! reached and written (a server whose database disk is full or read-only is not healthy even
//! if it still reads), whether this server leads, and whether scheduling has stalled.

use autodl_common::api::Health;

use crate::error::ApiError;
use crate::state::AppState;

pub async fn check(state: &AppState) -> Health {
    let reached = state.store.ping().await;
    let problem = match &reached {
        Err(e) => Some(format!("the database cannot be reached: {e}")),
        Ok(()) => state
            .store
            .probe_write(state.clock.now_ms())
            .await
            .err()
            .map(|e| format!("the database cannot write: {e}")),
    };
    let writable = problem.is_none();
    // Not asked of a database that cannot be reached: the answer must stay prompt.
    let leader = match reached {
        Ok(()) => state.store.leader_status(state.clock.now_ms()).await.ok(),
        Err(_) => None,
    };
    let last_cycle_ms = leader.as_ref().and_then(|l| l.last_cycle_age_ms);
    let scheduler_stalled =
        crate::scheduling::stalled(last_cycle_ms, state.settings.schedule_interval_ms);
    let problem = problem.or_else(|| {
        let l = leader.as_ref().filter(|_| scheduler_stalled)?;
        Some(format!(
            "no scheduling cycle for {} s (leader {}, term {}): placement has stopped",
            last_cycle_ms.unwrap_or_default() / 1000,
            l.holder,
            l.term
        ))
    });
    Health {
        status: if problem.is_none() { "ok" } else { "degraded" }.into(),
        database: state.store.backend().into(),
        writable,
        // Leading in the term the database has: a server woken from a freeze that another
        // replaced still believes it leads for a moment.
        role: match (state.scheduler.leader_term(), leader.as_ref()) {
            (Some(mine), Some(l)) if mine == l.term => "leader",
            (Some(_), None) => "leader",
            _ => "follower",
        }
        .into(),
        problem,
        last_cycle_s: last_cycle_ms.map(|ms| ms as f64 / 1000.0),
        scheduler_stalled,
    }
}

/// The server's Prometheus figures, with the scheduler's cycle and lease ages read now.
pub async fn scrape(state: &AppState) -> Result<String, ApiError> {
    if let Ok(l) = state.store.leader_status(state.clock.now_ms()).await {
        let secs = |ms: Option<i64>| ms.map_or(-1.0, |ms| ms as f64 / 1000.0);
        state.metrics.last_cycle_age.set(secs(l.last_cycle_age_ms));
        state.metrics.lease_age.set(secs(l.lease_age_ms));
    }
    Ok(state.metrics.render()?)
}
