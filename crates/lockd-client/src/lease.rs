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

/// What one lock group answered a keepalive (`GroupLease` in the proto).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupAnswer {
    /// The group's leader extended the lease: `ttl_ms` left, at move count `group_moves`.
    Extended {
        /// The lease left in the group.
        ttl_ms: u64,
        /// The group's move count when its leader answered.
        group_moves: u64,
    },
    /// The session has no lease in the group.
    NotHere,
    /// Anything else (the group could not answer): it extends nothing, and the reply does not
    /// count as every group's.
    Other,
}

/// Which lease a hold follows: its group's, as of the grant ([`GroupLeases::granted`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HoldLease {
    /// The group that granted it.
    pub group: u32,
    /// The group's move count at the grant.
    pub group_moves: u64,
    /// The group's lease epoch at the grant (bumped when the client learns that lease ended).
    epoch: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct GroupState {
    lease: LocalLease,
    moves: u64,
    epoch: u64,
}

/// A session's leases, one per lock group, and the session-wide one (docs/API.md, "Leases per
/// group"; C1 in docs/INVARIANTS.md for each).
///
/// A hold follows the lease of the group that granted it while that group keeps reporting the
/// move count of the grant: a hold leaves its group only by a bucket move, which raises the count
/// in both groups first. Once the count differs the hold may live in another group, so it
/// follows the session-wide lease, which only a keepalive that every group answered renews.
/// Pure: time is an input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupLeases {
    all: LocalLease,
    groups: std::collections::BTreeMap<u32, GroupState>,
}

impl GroupLeases {
    /// A session opened (or attached) by a request sent at `sent`, granted `ttl`.
    pub fn opened(sent: Instant, ttl: Duration, margin: Duration) -> GroupLeases {
        GroupLeases {
            all: LocalLease::opened(sent, ttl, margin),
            groups: Default::default(),
        }
    }

    /// The session-wide lease.
    pub fn session(&self) -> &LocalLease {
        &self.all
    }

    /// A keepalive sent at `sent` was answered at `now`: `ttl_ms` the least lease over the
    /// groups that extended it, `groups` what each said (empty: a service that does not say;
    /// then every group counts as extended with `ttl_ms`). Returns what it did to the
    /// session-wide lease ([`Renewal::Unchanged`] when not every group answered).
    pub fn renewed(
        &mut self,
        sent: Instant,
        ttl_ms: u64,
        groups: &[(u32, GroupAnswer)],
        now: Instant,
    ) -> Renewal {
        let mut every = true;
        for (g, answer) in groups {
            match *answer {
                GroupAnswer::Extended {
                    ttl_ms,
                    group_moves,
                } => self.extended(*g, sent, ttl_ms, group_moves, now),
                GroupAnswer::NotHere => {
                    // Its lease there ended (or never was): the holds of that lease are lost.
                    if let Some(st) = self.groups.get_mut(g) {
                        st.epoch += 1;
                    }
                }
                GroupAnswer::Other => every = false,
            }
        }
        if every {
            self.all.renewed(sent, ttl_ms, now)
        } else {
            Renewal::Unchanged
        }
    }

    fn extended(&mut self, g: u32, sent: Instant, ttl_ms: u64, moves: u64, now: Instant) {
        let (ttl, margin) = (self.all.ttl, self.all.margin);
        let st = self.groups.entry(g).or_insert(GroupState {
            lease: LocalLease::opened(sent, ttl.min(Duration::from_millis(ttl_ms)), margin),
            moves,
            epoch: 0,
        });
        st.moves = st.moves.max(moves);
        if st.lease.renewed(sent, ttl_ms, now) == Renewal::TooLate {
            // Too late for the holds of this lease; the group's lease goes on for new ones.
            st.epoch += 1;
            st.lease = LocalLease::opened(sent, ttl.min(Duration::from_millis(ttl_ms)), margin);
        }
    }

    /// A hold granted by `group` at its move count `group_moves`, for an acquire sent at `sent`
    /// that was told the lease is `lease_ttl_ms`.
    pub fn granted(
        &mut self,
        sent: Instant,
        group: u32,
        group_moves: u64,
        lease_ttl_ms: u64,
    ) -> HoldLease {
        let (ttl, margin) = (self.all.ttl, self.all.margin);
        let ttl = ttl.min(Duration::from_millis(lease_ttl_ms.max(1)));
        // A group not heard from yet: its lease there started no earlier than the acquire's
        // send (opened or adopted there by it, or earlier).
        let st = self.groups.entry(group).or_insert(GroupState {
            lease: LocalLease::opened(sent, ttl, margin),
            moves: group_moves,
            epoch: 0,
        });
        st.moves = st.moves.max(group_moves);
        HoldLease {
            group,
            group_moves,
            epoch: st.epoch,
        }
    }

    /// When `hold` must be counted lost: its group's deadline while the hold is provably still
    /// there, else the session-wide one; `None` once its group's lease is known to have ended.
    pub fn deadline_of(&self, hold: &HoldLease) -> Option<Instant> {
        match self.groups.get(&hold.group) {
            Some(st) if st.epoch != hold.epoch => None,
            Some(st) if st.moves == hold.group_moves => Some(st.lease.deadline()),
            _ => Some(self.all.deadline()),
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

    fn ext(ttl_ms: u64, group_moves: u64) -> GroupAnswer {
        GroupAnswer::Extended {
            ttl_ms,
            group_moves,
        }
    }

    #[test]
    fn a_hold_follows_its_groups_lease_while_the_move_count_holds() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut l = GroupLeases::opened(t0, TTL, default_margin(TTL));
        let hold = l.granted(s(1), 2, 5, 15_000);
        assert_eq!(l.deadline_of(&hold), Some(s(13)));
        // Group 2 extends; group 1 cannot answer: the hold follows group 2, the session-wide
        // lease does not move.
        let answers = [(1, GroupAnswer::Other), (2, ext(15_000, 5))];
        assert_eq!(l.renewed(s(6), 15_000, &answers, s(6)), Renewal::Unchanged);
        assert_eq!(l.deadline_of(&hold), Some(s(18)));
        assert_eq!(l.session().deadline(), s(12));
        // A move in group 2: the hold may be elsewhere now, so it follows the session-wide
        // lease, which every group must renew.
        l.renewed(
            s(9),
            15_000,
            &[(1, GroupAnswer::Other), (2, ext(15_000, 6))],
            s(9),
        );
        assert_eq!(l.deadline_of(&hold), Some(s(12)));
        l.renewed(
            s(10),
            15_000,
            &[(1, ext(15_000, 0)), (2, ext(15_000, 6))],
            s(10),
        );
        assert_eq!(l.deadline_of(&hold), Some(s(22)));
        // A hold granted after the move follows group 2 again.
        let later = l.granted(s(10), 2, 6, 15_000);
        assert_eq!(l.deadline_of(&later), Some(s(22)));
    }

    #[test]
    fn a_group_that_ended_the_lease_loses_its_holds_for_good_but_not_later_ones() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut l = GroupLeases::opened(t0, TTL, default_margin(TTL));
        let a = l.granted(s(1), 1, 0, 15_000);
        let b = l.granted(s(1), 2, 0, 15_000);
        l.renewed(
            s(2),
            15_000,
            &[(1, GroupAnswer::NotHere), (2, ext(15_000, 0))],
            s(2),
        );
        assert_eq!(l.deadline_of(&a), None);
        assert_eq!(l.deadline_of(&b), Some(s(14)));
        // A late answer does not revive a hold; a grant after it is not lost.
        let c = l.granted(s(3), 2, 0, 15_000);
        l.renewed(s(13), 15_000, &[(2, ext(15_000, 0))], s(14));
        assert_eq!(l.deadline_of(&b), None, "acknowledged after its deadline");
        assert_eq!(l.deadline_of(&c), None, "the same lease as b");
        let d = l.granted(s(14), 2, 0, 15_000);
        assert_eq!(l.deadline_of(&d), Some(s(25)));
        // Group 1 was not heard from since its lease ended: a grant there follows the last
        // deadline the client knows for it (already past: lost at once, never too late) until
        // a keepalive answers for the group again.
        let e = l.granted(s(14), 1, 0, 15_000);
        assert_eq!(l.deadline_of(&e), Some(s(13)));
        l.renewed(
            s(15),
            15_000,
            &[(1, ext(15_000, 0)), (2, ext(15_000, 0))],
            s(15),
        );
        let f = l.granted(s(15), 1, 0, 15_000);
        assert_eq!(l.deadline_of(&f), Some(s(27)));
    }

    #[test]
    fn a_reply_without_groups_renews_the_session_wide_lease_only() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut l = GroupLeases::opened(t0, TTL, default_margin(TTL));
        assert_eq!(
            l.renewed(s(5), 15_000, &[], s(5)),
            Renewal::Extended { deadline: s(17) }
        );
        let hold = l.granted(s(5), 3, 0, 15_000);
        assert_eq!(l.deadline_of(&hold), Some(s(17)));
        assert_eq!(l.renewed(s(4), 15_000, &[], s(30)), Renewal::TooLate);
    }

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
