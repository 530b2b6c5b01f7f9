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

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use hashbrown::HashMap;
use tokio::time::Instant;

use lockd_core::SessionId;

/// At most this many sessions go into one `ExpireSessions` proposal.
pub(crate) const MAX_EXPIRE_BATCH: usize = 1024;

/// `due` re-files every entry this close to coming due, so stale entries wake the leader about
/// once per this period, not once per session.
const REFILE_AHEAD: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug)]
struct Tracked {
    ttl_ms: u64,
    deadline: Instant,
    /// Where the session's live entry sits in the index: never after `deadline`. `None` only
    /// inside `due`, while the entry is out of the heap.
    indexed: Option<Instant>,
}

/// `session -> deadline`, with a min-heap index by deadline.
///
/// The index is lazy, because keepalives are the hot path (one per session per TTL/3, per
/// group): a keepalive only moves the deadline in the map, O(1). Deadlines only move later, so
/// a session's index entry is a lower bound of its deadline; when the entry comes within
/// [`REFILE_AHEAD`] of due, `due` files it again at its real deadline. Each session is re-filed
/// about once per TTL instead of re-indexed on every keepalive. Entries of ended sessions are
/// dropped when they surface. Measured with 20,000 sessions in 4 groups (16,000 keepalives/s):
/// the tracker went from 12% of the leader's `perf` samples (a B-tree remove and insert per
/// keepalive) to 6% (4% the hash lookup in `keepalive`, 2% `due`).
#[derive(Debug, Default)]
pub(crate) struct SessionTracker {
    sessions: HashMap<SessionId, Tracked>,
    /// `(indexed, session)`: one live entry per tracked session, plus stale ones (ended or
    /// re-filed sessions) that are dropped when they reach the top.
    index: BinaryHeap<Reverse<(Instant, SessionId)>>,
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
        self.index.clear();
    }

    /// A session opened, adopted or brought by an import in a committed entry: its deadline
    /// is `now` + its TTL, or the later one it had (a reset's, a keepalive's). An expiring
    /// session brought by an import lives again (the core skips the expiry already proposed).
    pub(crate) fn opened(&mut self, session: SessionId, ttl_ms: u64, now: Instant) {
        let deadline = now + Duration::from_millis(ttl_ms);
        if self
            .sessions
            .get(&session)
            .is_none_or(|t| t.deadline < deadline)
        {
            self.set(session, ttl_ms, deadline);
        }
    }

    /// A session closed or expired by a committed entry (its index entry goes stale).
    pub(crate) fn ended(&mut self, session: SessionId) {
        self.sessions.remove(&session);
    }

    /// Refreshes the deadline to `now + ttl` (never earlier than it was). Returns the TTL, or
    /// `None` if the session is unknown or already expiring.
    /// Renews `session` at `now`: its lease left from `now` in whole milliseconds, rounded
    /// down (the TTL, or more while a new leader's extension lasts; never less), or `None` if
    /// it is not tracked or already expiring.
    pub(crate) fn keepalive(&mut self, session: SessionId, now: Instant) -> Option<u64> {
        let t = self.sessions.get_mut(&session)?;
        if t.deadline <= now {
            return None;
        }
        t.deadline = t.deadline.max(now + Duration::from_millis(t.ttl_ms));
        Some((t.deadline - now).as_millis() as u64)
    }

    /// Sessions whose deadline has passed (at most [`MAX_EXPIRE_BATCH`]), in index order.
    /// They stay tracked (and refuse keepalives) until their expiry is applied and `ended`.
    /// Re-files the entries that come due within [`REFILE_AHEAD`] at their real deadlines.
    pub(crate) fn due(&mut self, now: Instant) -> Vec<SessionId> {
        let horizon = now + REFILE_AHEAD;
        let mut due = Vec::new();
        let mut refile = Vec::new();
        while due.len() < MAX_EXPIRE_BATCH {
            let Some(&Reverse((at, session))) = self.index.peek() else {
                break;
            };
            if at > horizon {
                break;
            }
            self.index.pop();
            // An ended session's entry, or one superseded by a re-filing, is dropped.
            let Some(t) = self.sessions.get_mut(&session) else {
                continue;
            };
            if t.indexed != Some(at) {
                continue;
            }
            t.indexed = None;
            if t.deadline <= now {
                due.push(session);
            }
            refile.push(session);
        }
        for s in refile {
            let t = self
                .sessions
                .get_mut(&s)
                .expect("re-filed session is tracked");
            t.indexed = Some(t.deadline);
            self.index.push(Reverse((t.deadline, s)));
        }
        due
    }

    /// When to call `due` next: never later than the earliest deadline (it may be earlier,
    /// when the earliest entry has since been kept alive; `due` then re-files it).
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.index.peek().map(|Reverse((at, _))| *at)
    }

    pub(crate) fn len(&self) -> usize {
        self.sessions.len()
    }

    fn set(&mut self, session: SessionId, ttl_ms: u64, deadline: Instant) {
        self.sessions.insert(
            session,
            Tracked {
                ttl_ms,
                deadline,
                indexed: Some(deadline),
            },
        );
        self.index.push(Reverse((deadline, session)));
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
        // The keepalive reply says what is left: the TTL plus the new leader's slack, less the
        // time since; never less than the TTL.
        assert_eq!(t.keepalive(S1, t0), Some(1500));
        assert_eq!(t.keepalive(S2, t0 + Duration::from_millis(200)), Some(2300));
        assert_eq!(t.keepalive(S2, t0 + Duration::from_millis(600)), Some(2000));
        assert!(t.due(t0 + Duration::from_millis(1499)).is_empty());
        assert_eq!(t.due(t0 + Duration::from_millis(1500)), vec![S1]);
        // A reset saw S2 first: the open's apply must not shorten it.
        t.opened(S2, 2000, t0);
        assert_eq!(t.due(t0 + Duration::from_millis(2599)), vec![S1]);
    }

    #[test]
    fn an_import_restarts_a_lease_even_an_expiring_one_and_never_shortens_one() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut t = SessionTracker::default();
        t.opened(S1, 1000, t0);
        assert_eq!(t.due(t0 + ms(1000)), vec![S1]);
        // An import brought holds of S1 while its expiry was due: its lease runs again.
        t.opened(S1, 1000, t0 + ms(1200));
        assert_eq!(t.keepalive(S1, t0 + ms(1300)), Some(1000));
        assert!(t.due(t0 + ms(2299)).is_empty());
        // A later deadline (a keepalive's) is kept.
        t.opened(S1, 1000, t0 + ms(1250));
        assert_eq!(t.due(t0 + ms(2300)), vec![S1]);
    }

    #[test]
    fn keepalives_do_not_grow_the_index_and_ended_entries_are_dropped() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut t = SessionTracker::default();
        for i in 1..=100 {
            t.opened(SessionId(i), 3000, t0);
        }
        for step in 1..=30 {
            for i in 1..=100 {
                assert_eq!(t.keepalive(SessionId(i), t0 + ms(step * 100)), Some(3000));
            }
        }
        assert_eq!(t.index.len(), 100);
        // All entries still sit at t0+3s; the first look within a second of that re-files them
        // at their real deadline (t0+6s), and the leader's next wake-up moves with them.
        assert_eq!(t.next_deadline(), Some(t0 + ms(3000)));
        assert!(t.due(t0 + ms(2000)).is_empty());
        assert_eq!(t.index.len(), 100);
        assert_eq!(t.next_deadline(), Some(t0 + ms(6000)));
        for i in 1..=50 {
            t.ended(SessionId(i));
        }
        assert_eq!(t.due(t0 + ms(6000)).len(), 50);
        assert_eq!(t.index.len(), 50, "ended sessions' entries are gone");
    }

    #[test]
    fn a_session_expires_exactly_at_its_deadline_and_is_listed_once() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut t = SessionTracker::default();
        t.opened(S1, 1000, t0);
        // Ended and opened again under the same id at the same instant: two identical entries.
        t.ended(S1);
        t.opened(S1, 1000, t0);
        t.opened(S2, 5000, t0);
        assert!(t.due(t0 + ms(999)).is_empty());
        assert_eq!(t.due(t0 + ms(1000)), vec![S1]);
        // Still tracked until its expiry is applied: listed again, and keepalives refused.
        assert_eq!(t.due(t0 + ms(1001)), vec![S1]);
        assert_eq!(t.keepalive(S1, t0 + ms(1001)), None);
        t.ended(S1);
        assert!(t.due(t0 + ms(4999)).is_empty());
        assert_eq!(t.due(t0 + ms(5000)), vec![S2]);
    }
}
