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
}
