//! Clock skew between a node and the server. Agents stamp each batch with their clock at
//! sending; the server knows its own time, so the difference moves every time in the batch
//! onto the server's clock. Nothing is refused for a wrong clock: a node whose clock runs
//! minutes ahead or behind still has its samples counted and its log lines in order.

use crate::tasks::spec::parse_time_ms;

/// Differences below this are network latency, not skew, and are left alone.
const TOLERANCE_MS: i64 = 2_000;

/// How far a node's clock is behind the server's (negative: ahead), as seen in one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockSkew {
    offset_ms: i64,
    now_ms: i64,
}

impl ClockSkew {
    /// `sent_at` is the batch's stamp; without one (older agents) only future times are
    /// pulled back to now.
    pub fn of_batch(sent_at: Option<&str>, now_ms: i64) -> Self {
        let offset_ms = sent_at
            .and_then(parse_time_ms)
            .map(|sent| now_ms - sent)
            .filter(|d| d.abs() > TOLERANCE_MS)
            .unwrap_or(0);
        ClockSkew { offset_ms, now_ms }
    }

    pub fn offset_ms(&self) -> i64 {
        self.offset_ms
    }

    /// A node's time on the server's clock; never later than now. Unreadable times are now.
    pub fn correct(&self, at: Option<i64>) -> i64 {
        at.map_or(self.now_ms, |t| t.saturating_add(self.offset_ms))
            .min(self.now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    fn rfc(ms: i64) -> String {
        time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
            .unwrap()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    }

    #[test]
    fn a_fast_clock_is_moved_back_by_its_lead() {
        let skew = ClockSkew::of_batch(Some(&rfc(NOW + 120_000)), NOW);
        assert_eq!(skew.offset_ms(), -120_000);
        assert_eq!(skew.correct(Some(NOW + 110_000)), NOW - 10_000);
    }

    #[test]
    fn a_slow_clock_is_moved_forward_but_never_past_now() {
        let skew = ClockSkew::of_batch(Some(&rfc(NOW - 300_000)), NOW);
        assert_eq!(skew.correct(Some(NOW - 305_000)), NOW - 5_000);
        assert_eq!(skew.correct(Some(NOW - 200_000)), NOW);
    }

    #[test]
    fn latency_is_not_skew_and_unstamped_batches_are_only_clamped() {
        let skew = ClockSkew::of_batch(Some(&rfc(NOW - 300)), NOW);
        assert_eq!(skew.correct(Some(NOW - 1_000)), NOW - 1_000);
        let old = ClockSkew::of_batch(None, NOW);
        assert_eq!(old.correct(Some(NOW + 86_400_000 * 365 * 70)), NOW);
        assert_eq!(old.correct(None), NOW);
        assert_eq!(ClockSkew::of_batch(Some("garbage"), NOW).offset_ms(), 0);
    }
}
