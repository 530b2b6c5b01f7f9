//! The leader's in-memory state of one group: the stamping clock of its term and the session
//! tracker. Inactive on followers.
//!
//! It sits beside the applied state (`raft/replica.rs`) and under the same lock order, because an
//! apply updates both at once (a session opened or ended in the entry starts or stops its
//! timer). The loop that acts on it (proposing expiries and ticks) is a group duty:
//! `group/leader.rs`.

use std::time::Duration;

use lockd_core::{LockTable, SessionId};
use tokio::time::Instant;

use crate::raft::tracker::SessionTracker;

/// Base of the leader's stamping clock for one term.
#[derive(Clone, Copy, Debug)]
struct Clock {
    term: u64,
    base_ms: u64,
    base_at: Instant,
}

/// The in-memory, leader-only state of a group (inactive on followers).
#[derive(Debug, Default)]
pub(crate) struct Leadership {
    clock: Option<Clock>,
    tracker: SessionTracker,
}

/// Why the leader did not acknowledge a keepalive.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum KeepaliveRefused {
    /// Leader duties are not active (yet): the caller retries, maybe elsewhere.
    NotActive,
    /// Unknown or already expiring.
    NotFound,
}

impl Leadership {
    pub(crate) fn term(&self) -> Option<u64> {
        self.clock.map(|c| c.term)
    }

    /// Rule 1 and 2 at election: group time goes on from `base_ms` (never behind the applied
    /// `now_ms`); every session gets a full TTL plus `slack` from now. Returns the number of
    /// sessions tracked.
    pub(crate) fn activate(
        &mut self,
        term: u64,
        table: &LockTable,
        base_ms: u64,
        now: Instant,
        slack: Duration,
    ) -> usize {
        self.clock = Some(Clock {
            term,
            base_ms: base_ms.max(table.now_ms()),
            base_at: now,
        });
        self.tracker.reset(table.session_ttls(), now, slack);
        self.tracker.len()
    }

    pub(crate) fn deactivate(&mut self) {
        self.clock = None;
        self.tracker.clear();
    }

    /// Group time on the leader at `now` (the node clock): never behind the applied time,
    /// advancing with the node's monotonic clock.
    pub(crate) fn stamp(&self, applied_now_ms: u64, now: Instant) -> Option<u64> {
        let c = self.clock?;
        let elapsed = now.saturating_duration_since(c.base_at).as_millis() as u64;
        Some(c.base_ms.saturating_add(elapsed).max(applied_now_ms))
    }

    pub(crate) fn session_opened(&mut self, session: SessionId, ttl_ms: u64, now: Instant) {
        if self.clock.is_some() {
            self.tracker.opened(session, ttl_ms, now);
        }
    }

    pub(crate) fn session_ended(&mut self, session: SessionId) {
        self.tracker.ended(session);
    }

    pub(crate) fn keepalive(
        &mut self,
        term: u64,
        session: SessionId,
        now: Instant,
    ) -> Result<u64, KeepaliveRefused> {
        if self.term() != Some(term) {
            return Err(KeepaliveRefused::NotActive);
        }
        self.tracker
            .keepalive(session, now)
            .ok_or(KeepaliveRefused::NotFound)
    }

    /// Renews `session` at `now` because this leader granted or queued an acquire of it in an
    /// entry of `term`, its own (no lease check: the entry's commit proves a quorum was in this
    /// term after the acquire was sent). `None` if not active for `term`, untracked or already
    /// expiring.
    pub(crate) fn renew(&mut self, term: u64, session: SessionId, now: Instant) -> Option<u64> {
        if self.term() != Some(term) {
            return None;
        }
        self.tracker.keepalive(session, now)
    }

    pub(crate) fn due(&mut self, now: Instant) -> Vec<SessionId> {
        self.tracker.due(now)
    }

    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.tracker.next_deadline()
    }

    pub(crate) fn tracked(&self) -> Option<usize> {
        self.clock.map(|_| self.tracker.len())
    }
}
