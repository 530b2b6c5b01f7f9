//! The leader's session tracker: keepalive deadlines on the leader's monotonic clock.
//!
//! Keepalives never touch the log (GUIDE §2): the leader alone keeps `session -> deadline` in
//! memory and proposes `ExpireSessions` once a deadline passes. This module is the pure data
//! structure (no clock reads, no IO): callers pass `now`, so the rules are unit-testable.
//!
//! Rules held here:
//! * a deadline only moves later (a keepalive never shortens what a new leader granted);
//! * a session whose deadline has passed is *expiring*: it is due for `ExpireSessions` and a
//!   keepalive for it is refused, so no keepalive is acknowledged for a session that is about to
//!   be expired (S6);
//! * a new leader restarts every session at full TTL + slack (the election timeout), so a
//!   leader change never shortens a lease.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use lockd_core::SessionId;

/// At most this many sessions go into one `ExpireSessions` proposal.
pub(crate) const MAX_EXPIRE_BATCH: usize = 1024;

#[derive(Clone, Copy, Debug)]
struct Tracked {
    ttl_ms: u64,
    deadline: Instant,
}

/// `session -> deadline`, with an index by deadline so the next wake-up is O(log n).
#[derive(Debug, Default)]
pub(crate) struct SessionTracker {
    sessions: HashMap<SessionId, Tracked>,
    by_deadline: BTreeSet<(Instant, SessionId)>,
}

impl SessionTracker {
    /// Starts over with every session of the applied state at `now + ttl + slack`.
    pub(crate) fn reset(
        &mut self,
        ttls: impl IntoIterator<Item = (SessionId, u64)>,
        now: Instant,
        slack: Duration,
    ) {
        self.clear();
        for (session, ttl_ms) in ttls {
            self.set(session, ttl_ms, now + Duration::from_millis(ttl_ms) + slack);
        }
    }

    pub(crate) fn clear(&mut self) {
        self.sessions.clear();
        self.by_deadline.clear();
    }

    /// A session opened by a committed entry: tracked from `now` with its TTL. A session
    /// already tracked (by a reset that saw it) keeps its later deadline.
    pub(crate) fn opened(&mut self, session: SessionId, ttl_ms: u64, now: Instant) {
        if !self.sessions.contains_key(&session) {
            self.set(session, ttl_ms, now + Duration::from_millis(ttl_ms));
        }
    }

    /// A session closed or expired by a committed entry.
    pub(crate) fn ended(&mut self, session: SessionId) {
        if let Some(t) = self.sessions.remove(&session) {
            self.by_deadline.remove(&(t.deadline, session));
        }
    }

    /// Refreshes the deadline to `now + ttl` (never earlier than it was). Returns the TTL, or
    /// `None` if the session is unknown or already expiring.
    pub(crate) fn keepalive(&mut self, session: SessionId, now: Instant) -> Option<u64> {
        let t = *self.sessions.get(&session)?;
        if t.deadline <= now {
            return None;
        }
        let deadline = t.deadline.max(now + Duration::from_millis(t.ttl_ms));
        self.set(session, t.ttl_ms, deadline);
        Some(t.ttl_ms)
    }

    /// Sessions whose deadline has passed (at most [`MAX_EXPIRE_BATCH`]), oldest first.
    pub(crate) fn due(&self, now: Instant) -> Vec<SessionId> {
        self.by_deadline
            .iter()
            .take_while(|(d, _)| *d <= now)
            .take(MAX_EXPIRE_BATCH)
            .map(|(_, s)| *s)
            .collect()
    }

    /// The earliest deadline, i.e. when `due` next returns something.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.by_deadline.first().map(|(d, _)| *d)
    }

    pub(crate) fn len(&self) -> usize {
        self.sessions.len()
    }

    fn set(&mut self, session: SessionId, ttl_ms: u64, deadline: Instant) {
        if let Some(old) = self.sessions.insert(session, Tracked { ttl_ms, deadline }) {
            self.by_deadline.remove(&(old.deadline, session));
        }
        self.by_deadline.insert((deadline, session));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S1: SessionId = SessionId(1);
    const S2: SessionId = SessionId(2);

    #[test]
    fn keepalive_extends_and_expiry_is_due_after_ttl() {
        let t0 = Instant::now();
        let mut t = SessionTracker::default();
        t.opened(S1, 1000, t0);
        assert!(t.due(t0 + Duration::from_millis(999)).is_empty());
        assert_eq!(t.keepalive(S1, t0 + Duration::from_millis(500)), Some(1000));
        assert!(t.due(t0 + Duration::from_millis(1499)).is_empty());
        assert_eq!(t.due(t0 + Duration::from_millis(1500)), vec![S1]);
        assert_eq!(t.next_deadline(), Some(t0 + Duration::from_millis(1500)));
    }

    #[test]
    fn expiring_session_refuses_keepalive_and_unknown_is_refused() {
        let t0 = Instant::now();
        let mut t = SessionTracker::default();
        t.opened(S1, 1000, t0);
        assert_eq!(t.keepalive(S1, t0 + Duration::from_millis(1000)), None);
        assert_eq!(t.keepalive(S2, t0), None);
        t.ended(S1);
        assert!(t.due(t0 + Duration::from_secs(10)).is_empty());
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn reset_adds_slack_and_keepalive_never_shortens() {
        let t0 = Instant::now();
        let mut t = SessionTracker::default();
        t.reset([(S1, 1000), (S2, 2000)], t0, Duration::from_millis(500));
        assert_eq!(t.keepalive(S1, t0), Some(1000));
        assert!(t.due(t0 + Duration::from_millis(1499)).is_empty());
        assert_eq!(t.due(t0 + Duration::from_millis(1500)), vec![S1]);
        // A reset saw S2 first: the open's apply must not shorten it.
        t.opened(S2, 2000, t0);
        assert_eq!(t.due(t0 + Duration::from_millis(2499)), vec![S1]);
    }
}
