use actix_web::{web, HttpResponse};
use autodl_common::api::Health;

use crate::state::AppState;

/// Liveness and whether the store can write, for load balancers and the compose health check:
/// a server whose database disk is full or read-only is not healthy even if it still reads.
/// Routed in `routes::configure`, so that other methods on it answer 405.
#[utoipa::path(get, path = "/healthz", responses((status = 200, body = Health), (status = 503, body = Health)))]
pub async fn healthz(state: web::Data<AppState>) -> HttpResponse {
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
    let body = Health {
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
    };
    if body.writable {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}
