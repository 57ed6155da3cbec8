//! Which server schedules: the leader's term (PostgreSQL advisory lock; SQLite serves one
//! server) and the wake-ups servers on one database send each other.

use async_trait::async_trait;

use super::*;

#[async_trait]
pub trait Leadership: Send + Sync {
    /// Tries to become the one scheduler of this database, starting a new term; `None` if
    /// another server is the leader.
    async fn try_lead(&self, holder: &str, now: i64) -> StoreResult<Option<LeaderGuard>>;
    /// Whether `guard` still holds the leadership (its lock alive, its term current); checked
    /// before every cycle.
    async fn still_leads(&self, guard: &mut LeaderGuard) -> StoreResult<bool>;
    /// Gives the leadership up now (a clean handover), rather than when the lock's
    /// connection is noticed gone.
    async fn resign(&self, guard: LeaderGuard) -> StoreResult<()>;
    /// Tells the other servers on this database (PostgreSQL NOTIFY); nothing on SQLite, which
    /// one server serves.
    async fn publish(&self, payload: &str) -> StoreResult<()>;
    /// What the other servers publish, as it arrives; `None` where there are none (SQLite).
    async fn subscribe(&self) -> StoreResult<Option<tokio::sync::mpsc::Receiver<String>>>;
    /// The leader of `term` ended a scheduling cycle at `now` (the heartbeat every server
    /// reads for `/healthz`); nothing when another term leads.
    async fn cycled(&self, term: Term, now: i64) -> StoreResult<()>;
    /// The leadership as the database records it, ages measured at `now` (PostgreSQL
    /// measures by its own clock, which every replica shares).
    async fn leader_status(&self, now: i64) -> StoreResult<LeaderStatus>;
}

/// Who leads and how recently it was heard, for `/healthz` and `/metrics`.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaderStatus {
    pub holder: String,
    pub term: i64,
    /// Since the leader last renewed its lease (PostgreSQL); `None` where there is no lease.
    pub lease_age_ms: Option<i64>,
    /// Since the leader's last scheduling cycle ended; `None` before the first.
    pub last_cycle_age_ms: Option<i64>,
}
