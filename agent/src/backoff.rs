//! Reconnection delays. Exponential so a dead server is not hammered, capped so the agent
//! notices a returning server within `max`, and jittered so a rack of agents that lost the
//! server together does not reconnect in lock-step.

use std::time::Duration;

/// Tiny deterministic PRNG (SplitMix64): jitter needs no cryptographic quality, and a seed
/// makes schedules reproducible in tests.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.0)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The SplitMix64 finaliser; also used as a stateless hash for simulated noise.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// "Equal jitter" backoff: the n-th delay lies in [c/2, c] with c = min(max, initial * 2^n).
/// Keeping half the ceiling fixed guarantees the delay still grows, unlike full jitter.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    failures: u32,
    rng: SplitMix64,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration, seed: u64) -> Self {
        Backoff {
            initial,
            max: max.max(initial),
            failures: 0,
            rng: SplitMix64::new(seed),
        }
    }

    /// The ceiling of the delay after `failures` consecutive failures (0-based).
    pub fn ceiling(&self, failures: u32) -> Duration {
        let factor = 1u32.checked_shl(failures.min(31)).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }

    pub fn next_delay(&mut self) -> Duration {
        let c = self.ceiling(self.failures);
        self.failures = self.failures.saturating_add(1);
        let half = c / 2;
        half + half.mul_f64(self.rng.next_f64())
    }

    pub fn reset(&mut self) {
        self.failures = 0;
    }

    pub fn failures(&self) -> u32 {
        self.failures
    }
}

/// A seed that differs between agents and runs, for production jitter.
pub fn entropy_seed(salt: &str) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut h = nanos ^ u64::from(std::process::id()).rotate_left(32);
    for b in salt.bytes() {
        h = mix64(h ^ u64::from(b));
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_doubles_then_caps_with_bounded_jitter() {
        let mut b = Backoff::new(Duration::from_millis(500), Duration::from_secs(30), 7);
        let expected_ceilings = [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0];
        for c in expected_ceilings {
            let d = b.next_delay().as_secs_f64();
            assert!(
                d >= c / 2.0 - 1e-9 && d <= c + 1e-9,
                "{d} not in [{}, {c}]",
                c / 2.0
            );
        }
        // Very many failures must not overflow.
        for _ in 0..100 {
            assert!(b.next_delay() <= Duration::from_secs(30));
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(500));
    }

    #[test]
    fn jitter_is_deterministic_per_seed_and_differs_between_seeds() {
        let run = |seed| {
            let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(60), seed);
            (0..6).map(|_| b.next_delay()).collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }
}
