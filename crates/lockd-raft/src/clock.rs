//! The node's monotonic clock for lockd's own time reads (group-time stamping, the leader's
//! session tracker, a follower's group-time estimate).
//!
//! It reads `tokio::time::Instant` — the real monotonic clock in production, virtual time under
//! a paused tokio runtime (the simulator) — optionally running at a `rate` other than 1 to model
//! a node whose clock drifts. openraft's own timers are not affected.

use std::time::Duration;

use tokio::time::Instant;

/// A monotonic clock running at `rate` × real time since its creation. Cheap to copy.
#[derive(Clone, Copy, Debug)]
pub struct NodeClock {
    origin: Instant,
    rate: f64,
}

impl NodeClock {
    /// A clock at `rate` × tokio time (1.0 = production). `rate` must be positive and finite;
    /// anything else is treated as 1.0.
    pub fn new(rate: f64) -> NodeClock {
        let rate = if rate.is_finite() && rate > 0.0 {
            rate
        } else {
            1.0
        };
        NodeClock {
            origin: Instant::now(),
            rate,
        }
    }

    /// This clock's rate relative to tokio time.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Now, on this clock.
    pub fn now(&self) -> Instant {
        let real = Instant::now();
        if self.rate == 1.0 {
            return real;
        }
        self.origin + (real - self.origin).mul_f64(self.rate)
    }

    /// Time on this clock since `earlier` (an instant of this clock).
    pub fn elapsed(&self, earlier: Instant) -> Duration {
        self.now().saturating_duration_since(earlier)
    }

    /// The tokio instant at which this clock shows `at` (for sleeping until it).
    pub fn to_tokio(&self, at: Instant) -> Instant {
        if self.rate == 1.0 {
            return at;
        }
        self.origin + at.saturating_duration_since(self.origin).div_f64(self.rate)
    }

    /// Sleeps until this clock shows `at`.
    pub async fn sleep_until(&self, at: Instant) {
        tokio::time::sleep_until(self.to_tokio(at)).await
    }
}

impl Default for NodeClock {
    fn default() -> Self {
        NodeClock::new(1.0)
    }
}
