//! Exponential backoff with full jitter, bounded.

use std::time::Duration;

use rand::Rng;

/// How retryable errors are retried: attempt `n` (from 0) sleeps a uniformly random time in
/// `[0, min(cap, base × 2ⁿ)]` ("full jitter"), but at least the service's `retry_after`, and
/// gives up after `max_attempts` attempts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (1 = never retry).
    pub max_attempts: u32,
    /// The first backoff ceiling.
    pub base: Duration,
    /// The largest backoff ceiling.
    pub cap: Duration,
}

impl Default for RetryPolicy {
    /// 8 attempts, 50 ms doubling to 2 s: about 6 s of retrying at most, enough to ride out a
    /// leader election.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 8,
            base: Duration::from_millis(50),
            cap: Duration::from_secs(2),
        }
    }
}

impl RetryPolicy {
    /// The sleep before retry number `attempt` (0 = the first retry).
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        let ceiling = self
            .base
            .saturating_mul(1u32 << attempt.min(20))
            .min(self.cap);
        let jitter = rand::rng().random_range(0..=ceiling.as_millis() as u64);
        Duration::from_millis(jitter).max(retry_after.unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_stay_under_the_ceiling_and_honour_retry_after() {
        let p = RetryPolicy::default();
        for attempt in 0..30 {
            let ceiling = (p.base * 2u32.pow(attempt.min(20))).min(p.cap);
            assert!(p.delay(attempt, None) <= ceiling);
        }
        let d = p.delay(0, Some(Duration::from_millis(700)));
        assert!(d >= Duration::from_millis(700));
    }
}
