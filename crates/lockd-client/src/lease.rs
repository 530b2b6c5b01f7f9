//! The client's side of a lease: when it must stop believing it holds its locks.
//!
//! The rule (C1 in docs/INVARIANTS.md): the local deadline is `send time of the last
//! acknowledged open, attach or keepalive + TTL − margin`, on the monotonic clock. The service
//! expires a session no earlier than TTL after a renewal it acknowledged, and it received that
//! renewal after the client sent it, so a client that stops at its deadline stops before the
//! service can give its locks to anyone else, by at least the margin (which covers clock-rate
//! drift between the two machines).
//!
//! Pure: time is an input, so the session driver and the simulator (`lockd-check sim`, on
//! virtual time) run this one rule.

use std::time::Duration;

use tokio::time::Instant;

/// The margin used when the options give none: a fifth of the TTL (3 s at 15 s).
pub fn default_margin(ttl: Duration) -> Duration {
    ttl / 5
}

/// A session's local lease: its deadline, which only moves forward while it is alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalLease {
    ttl: Duration,
    margin: Duration,
    deadline: Instant,
}

/// What an acknowledged renewal did to the lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The deadline moved to `deadline`.
    Extended {
        /// The new local deadline.
        deadline: Instant,
    },
    /// The renewal was sent before the one that set the current deadline: nothing changes.
    Unchanged,
    /// The acknowledgement came at or after the deadline: the holder may already have stopped,
    /// so the lease stays lost (a lost lease is never revived).
    TooLate,
}

impl LocalLease {
    /// A session opened (or attached) by a request sent at `sent`, which the service granted
    /// `ttl`; `margin` is what the client keeps back.
    pub fn opened(sent: Instant, ttl: Duration, margin: Duration) -> LocalLease {
        LocalLease {
            ttl,
            margin,
            deadline: sent + ttl.saturating_sub(margin),
        }
    }

    /// The instant the holder must stop.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The TTL granted at open: renewals never lengthen it.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Whether the lease is gone at `now` (the deadline itself counts as gone).
    pub fn expired(&self, now: Instant) -> bool {
        now >= self.deadline
    }

    /// A renewal sent at `sent` was acknowledged at `now`, granting `ttl_ms` (the shorter of it
    /// and the TTL granted at open counts).
    pub fn renewed(&mut self, sent: Instant, ttl_ms: u64, now: Instant) -> Renewal {
        if self.expired(now) {
            return Renewal::TooLate;
        }
        let ttl = self.ttl.min(Duration::from_millis(ttl_ms.max(1)));
        let deadline = sent + ttl.saturating_sub(self.margin);
        if deadline > self.deadline {
            self.deadline = deadline;
            Renewal::Extended { deadline }
        } else {
            Renewal::Unchanged
        }
    }
}

/// What the service said a client's lease has left ([`Client::lease_report`]).
///
/// [`Client::lease_report`]: crate::Client::lease_report
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseReport {
    /// The lease left, as of `at`.
    pub remaining: Duration,
    /// When it was so: a keepalive's send time, or when a new leader's notice arrived.
    pub at: Instant,
    /// The lock group whose new leader extended the lease and said so (`None`: a keepalive
    /// reply, the least over the session's groups).
    pub extended_by_new_leader_of: Option<u32>,
}

impl LeaseReport {
    /// The lease left at `now` by this report.
    pub fn remaining_at(&self, now: Instant) -> Duration {
        self.remaining
            .saturating_sub(now.saturating_duration_since(self.at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(15);

    #[test]
    fn the_deadline_is_the_send_time_plus_ttl_minus_margin() {
        let t0 = Instant::now();
        let l = LocalLease::opened(t0, TTL, default_margin(TTL));
        assert_eq!(l.deadline(), t0 + Duration::from_secs(12));
        assert!(!l.expired(t0 + Duration::from_millis(11_999)));
        assert!(l.expired(t0 + Duration::from_secs(12)));
    }

    #[test]
    fn a_renewal_counts_from_its_send_time_and_never_moves_the_deadline_back() {
        let t0 = Instant::now();
        let mut l = LocalLease::opened(t0, TTL, default_margin(TTL));
        let sent = t0 + Duration::from_secs(5);
        // Acknowledged 4 s after it was sent: the deadline counts from the send.
        assert_eq!(
            l.renewed(sent, 15_000, sent + Duration::from_secs(4)),
            Renewal::Extended {
                deadline: sent + Duration::from_secs(12)
            }
        );
        // An older renewal answered late changes nothing.
        assert_eq!(
            l.renewed(
                t0 + Duration::from_secs(1),
                15_000,
                sent + Duration::from_secs(5)
            ),
            Renewal::Unchanged
        );
        assert_eq!(l.deadline(), sent + Duration::from_secs(12));
    }

    #[test]
    fn a_renewal_never_grants_more_than_the_ttl_of_the_open() {
        let t0 = Instant::now();
        let mut l = LocalLease::opened(t0, TTL, default_margin(TTL));
        let sent = t0 + Duration::from_secs(1);
        l.renewed(sent, 60_000, sent);
        assert_eq!(l.deadline(), sent + Duration::from_secs(12));
        // A shorter TTL in the answer is taken as is.
        let sent = sent + Duration::from_secs(9);
        assert_eq!(
            l.renewed(sent, 10_000, sent),
            Renewal::Extended {
                deadline: sent + Duration::from_secs(7)
            }
        );
    }

    #[test]
    fn an_acknowledgement_after_the_deadline_does_not_revive_the_lease() {
        let t0 = Instant::now();
        let mut l = LocalLease::opened(t0, TTL, default_margin(TTL));
        let late = t0 + Duration::from_secs(12);
        assert_eq!(
            l.renewed(t0 + Duration::from_secs(11), 15_000, late),
            Renewal::TooLate
        );
        assert_eq!(l.deadline(), t0 + Duration::from_secs(12));
        assert!(l.expired(late));
    }
}
