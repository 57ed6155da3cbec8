//! Where the server's "now" comes from, and how it waits. Everything that decides by time
//! (scheduling, accounting, expiry, liveness, the runner's cadences and how long a cached read
//! is believed) asks the [`Clock`] in `AppState`, and waits with it, so a test or a replay can
//! run the server on a manual clock and get the same decisions as the simulator at the same
//! virtual times. Only measurements of the server's own work (how long a cycle took) and the
//! timeouts of its I/O (a long poll's wait, an agent's answer to a tunnel, an idle pooled
//! connection) use the machine's monotonic clock: they bound waits on other machines, not
//! decisions.

use std::time::Duration;

use futures_util::future::BoxFuture;

pub trait Clock: Send + Sync + 'static {
    /// Unix time in milliseconds.
    fn now_ms(&self) -> i64;

    /// Resolves once the clock reads `at_ms` or later (at once if it already does).
    fn sleep_until(&self, at_ms: i64) -> BoxFuture<'static, ()>;

    /// Resolves once `d` has passed on this clock.
    fn sleep(&self, d: Duration) -> BoxFuture<'static, ()> {
        self.sleep_until(self.now_ms().saturating_add(d.as_millis() as i64))
    }
}

/// Whether something done at `last` (by the clock, ms) is due again `every` later at `now`.
/// Never done is due; so is a `last` after `now` (the clock was set back: waiting for it to
/// catch up would stop the cadence for as long as it was moved).
pub fn due(last: Option<i64>, now_ms: i64, every: Duration) -> bool {
    last.is_none_or(|t| now_ms < t || now_ms - t >= every.as_millis() as i64)
}

/// The machine's clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
    }

    fn sleep_until(&self, at_ms: i64) -> BoxFuture<'static, ()> {
        let wait = at_ms.saturating_sub(self.now_ms()).max(0) as u64;
        Box::pin(tokio::time::sleep(Duration::from_millis(wait)))
    }
}

/// A clock that moves only when told to; whoever sleeps on it wakes when it is moved far
/// enough.
#[derive(Debug)]
pub struct ManualClock(tokio::sync::watch::Sender<i64>);

impl ManualClock {
    pub fn new(start_ms: i64) -> ManualClock {
        ManualClock(tokio::sync::watch::Sender::new(start_ms))
    }

    pub fn set(&self, ms: i64) {
        self.0.send_replace(ms);
    }

    pub fn advance(&self, ms: i64) {
        self.0.send_modify(|now| *now += ms);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        *self.0.borrow()
    }

    fn sleep_until(&self, at_ms: i64) -> BoxFuture<'static, ()> {
        let mut now = self.0.subscribe();
        Box::pin(async move {
            // The sender lives as long as the clock; a dropped clock wakes its sleepers.
            let _ = now.wait_for(|ms| *ms >= at_ms).await;
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new(1_000);
        assert_eq!(c.now_ms(), 1_000);
        c.advance(500);
        assert_eq!(c.now_ms(), 1_500);
        c.set(42);
        assert_eq!(c.now_ms(), 42);
        assert!(SystemClock.now_ms() > 1_700_000_000_000);
    }

    #[tokio::test]
    async fn a_sleeper_on_the_manual_clock_wakes_when_it_is_moved_far_enough() {
        let c = std::sync::Arc::new(ManualClock::new(0));
        let sleeper = tokio::spawn(c.sleep(Duration::from_secs(10)));
        tokio::task::yield_now().await;
        c.advance(9_999);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!sleeper.is_finished(), "woke before its time");
        c.advance(1);
        tokio::time::timeout(Duration::from_secs(5), sleeper)
            .await
            .expect("still asleep at its time")
            .unwrap();
        // Already past: at once.
        tokio::time::timeout(Duration::from_millis(100), c.sleep_until(5))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn the_system_clock_sleeps_for_real() {
        let before = std::time::Instant::now();
        SystemClock.sleep(Duration::from_millis(50)).await;
        assert!(before.elapsed() >= Duration::from_millis(45));
    }

    #[test]
    fn a_cadence_is_due_after_its_period_and_after_the_clock_went_back() {
        let every = Duration::from_secs(60);
        assert!(due(None, 0, every));
        assert!(!due(Some(1_000), 60_999, every));
        assert!(due(Some(1_000), 61_000, every));
        assert!(due(Some(1_000), 999, every), "set back");
    }
}
