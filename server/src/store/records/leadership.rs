//! The scheduler's lease.

/// A leader's term: every server that becomes the leader starts a new, larger one, and the
/// store refuses scheduling writes of any other term (fencing a leader that lost its lock
/// without noticing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Term(pub i64);

/// Held while this server is the scheduler leader; dropping it gives leadership up.
pub struct LeaderGuard {
    pub term: Term,
    /// What holds the lock (PostgreSQL: the connection that took the advisory lock).
    pub(in crate::store) hold: Box<dyn std::any::Any + Send + Sync>,
}
