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
    /// The session-wide lease's epoch at the grant (bumped when it was renewed too late).
    all_epoch: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct GroupState {
    /// Send time of the last keepalive the group extended + its TTL − margin; `None` while
    /// the session has no lease there that the client knows of (after `not_here`).
    deadline: Option<Instant>,
    /// The highest move count the group reported (in a keepalive answer or a grant).
    moves: u64,
    epoch: u64,
    /// When the first grant of this epoch arrived.
    first_grant: Option<Instant>,
    /// When each ended epoch counts as having ended (its deadline, or when the client learnt
    /// the lease was gone, whichever came first): a lost hold's deadline.
    ended_at: std::collections::BTreeMap<u64, Instant>,
}

/// A session's leases, one per lock group, and the session-wide one (docs/API.md, "Leases per
/// group"; C1 in docs/INVARIANTS.md for each). The Python client's `_lease.py` has the same rule.
///
/// - The session-wide deadline moves only with a keepalive reply in which every listed group
///   answered extended or not here (a reply without groups counts as every group extended).
/// - Per group: a deadline, the highest move count seen, and an epoch, bumped when the client
///   learns the lease there ended: the group answered not here although a grant of the epoch
///   had arrived before the keepalive was sent, or it extended the lease only after the
///   group's deadline had passed. A lost lease stays lost for the holds of its epoch.
/// - A hold follows its group's deadline while the group's move count is the grant's (a hold
///   leaves its group only by a bucket move, which raises the count in both groups first);
///   once the count differs it follows the session-wide deadline (and is lost for good if
///   that was renewed only after it passed); once its epoch ended it is lost.
/// - The session is lost once no lease of it may be alive ([`GroupLeases::session_deadline`]).
///
/// Pure: time is an input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupLeases {
    all: LocalLease,
    /// Bumped when every group answered only after the session-wide deadline: the holds that
    /// followed it are lost; it starts again for later ones.
    all_epoch: u64,
    /// When each ended session-wide epoch counts as having ended (its deadline).
    all_ended_at: std::collections::BTreeMap<u64, Instant>,
    groups: std::collections::BTreeMap<u32, GroupState>,
    /// The group that opened the session (`None`: a service that opens it in every group;
    /// then every keepalive goes to every group).
    home: Option<u32>,
    /// When the session last used each group (a grant there, or a hold or wait seen there by a
    /// keepalive): keepalives go on naming a group for one TTL after, since the group keeps
    /// the session that long and a grant there in the meantime counts from the lease the
    /// client knows there.
    used: std::collections::BTreeMap<u32, Instant>,
    /// The send time of the earliest acquire whose answer was lost: it may have brought the
    /// session into a group the client has no lease of (see [`GroupLeases::granted`]).
    unsure_since: Option<Instant>,
    /// Send time + TTL − margin of the last keepalive that asked every group (or of the open):
    /// every lease the session has anywhere lasts at least until then, since each was renewed
    /// by it or started after it. A grant in a group the client knows no lease of never
    /// counts past it (a named keepalive says nothing of the groups it does not name).
    every_deadline: Instant,
}

impl GroupLeases {
    /// A session opened (or attached) by a request sent at `sent`, granted `ttl`.
    pub fn opened(sent: Instant, ttl: Duration, margin: Duration) -> GroupLeases {
        GroupLeases {
            all: LocalLease::opened(sent, ttl, margin),
            all_epoch: 0,
            all_ended_at: Default::default(),
            groups: Default::default(),
            home: None,
            used: Default::default(),
            unsure_since: None,
            every_deadline: sent + ttl.saturating_sub(margin),
        }
    }

    /// The open sent at `sent` was answered by lock group `home` (0: a service that opens
    /// sessions in every group). The lease there started after `sent`; from now on keepalives
    /// name only the groups the session uses ([`GroupLeases::keepalive_groups`]).
    pub fn homed(&mut self, home: u32, sent: Instant, now: Instant) {
        if home == 0 {
            return;
        }
        self.home = Some(home);
        self.started(home, sent, 0, now);
    }

    /// The groups a keepalive sent at `now` should renew, given the session's holds and the
    /// groups of its queued waits: its home, every group a hold or wait lives in, and every
    /// group the session used within the last TTL (the group keeps the session that long
    /// after its last hold there ends; renewing it keeps the lease the client knows there
    /// fresh for the next grant, which renews nothing by itself). Empty means every lock
    /// group, which is what it asks while a hold may have left its group (a bucket move
    /// raised the group's move count since the grant: the hold may live in any group now),
    /// while `unsure` (an acquire whose outcome a broken stream took may be queued or held in
    /// a group it cannot name), and for a service that opens sessions in every group.
    pub fn keepalive_groups(
        &mut self,
        holds: impl IntoIterator<Item = HoldLease>,
        waits: impl IntoIterator<Item = u32>,
        unsure: bool,
        now: Instant,
    ) -> Vec<u32> {
        let Some(home) = self.home else {
            return Vec::new();
        };
        let mut named = std::collections::BTreeSet::from([home]);
        let mut moved = false;
        for h in holds {
            moved |= !self.in_its_group(&h);
            named.insert(h.group);
        }
        named.extend(waits);
        for g in &named {
            self.used.insert(*g, now);
        }
        let ttl = self.all.ttl;
        self.used.retain(|_, t| *t + ttl > now);
        if unsure || moved {
            return Vec::new();
        }
        named.extend(self.used.keys());
        named.into_iter().collect()
    }

    /// An acquire sent at `sent` lost its answer with a broken stream: it may have brought the
    /// session into a group the client will not name. Grants in a group the client has no
    /// lease of count from no later than that send ([`GroupLeases::granted`]).
    pub fn unsure_since(&mut self, sent: Instant) {
        self.unsure_since = Some(self.unsure_since.map_or(sent, |t| t.min(sent)));
    }

    /// A request sent at `sent` started the session's lease in `group` (the service said
    /// `lease_started`: the group adopted the session for it), granting `ttl_ms` (0: the
    /// TTL of the open). A lease the client knew there before has ended (the group had none
    /// when it adopted), unless a grant of it arrived after `sent` (the order is then unknown,
    /// and its deadline stays as it was, which is never later than the truth).
    pub fn started(&mut self, group: u32, sent: Instant, ttl_ms: u64, now: Instant) {
        self.used.insert(group, now);
        let d = self.deadline_from(sent, ttl_ms);
        let st = self.groups.entry(group).or_insert(GroupState {
            deadline: None,
            moves: 0,
            epoch: 0,
            first_grant: None,
            ended_at: Default::default(),
        });
        match (st.deadline, st.first_grant) {
            (None, _) => st.deadline = Some(d),
            (Some(_), Some(first)) if first > sent => {}
            (Some(old), _) => {
                end_epoch(st, old.min(now));
                st.deadline = Some(d);
            }
        }
    }

    /// The session-wide lease (renewed only when every group answered).
    pub fn session(&self) -> &LocalLease {
        &self.all
    }

    /// When the session is lost: once no lease of it may still be alive, neither the
    /// session-wide one nor any group's. Until then it lives in the groups that keep answering.
    pub fn session_deadline(&self) -> Instant {
        let groups = self.groups.values().filter_map(|g| g.deadline);
        groups.fold(self.all.deadline(), Instant::max)
    }

    /// The deadline of the session's lease in `group` (C1 on that group's answers), `None`
    /// while the client knows of no lease there.
    pub fn group_deadline(&self, group: u32) -> Option<Instant> {
        self.groups.get(&group).and_then(|g| g.deadline)
    }

    /// Whether `hold` is provably still in the group that granted it: the group reports the
    /// move count of the grant. Otherwise it may live in any group now.
    pub fn in_its_group(&self, hold: &HoldLease) -> bool {
        self.groups
            .get(&hold.group)
            .is_some_and(|g| g.moves == hold.group_moves)
    }

    /// The service said the session's lease in `group` ended (a pushed `session_ended` that
    /// names the group), and the client learnt it at `at`: as a "not here" answer to a
    /// keepalive sent then.
    pub fn ended(&mut self, group: u32, at: Instant) {
        self.not_here(group, at, at);
    }

    /// `sent + TTL − margin` for a renewal granting `ttl_ms` (never more than the TTL of the
    /// open; 0, an answer that does not say, counts as that TTL).
    fn deadline_from(&self, sent: Instant, ttl_ms: u64) -> Instant {
        let ttl = match ttl_ms {
            0 => self.all.ttl,
            t => self.all.ttl.min(Duration::from_millis(t)),
        };
        sent + ttl.saturating_sub(self.all.margin)
    }

    /// A keepalive sent at `sent` was answered at `now`: `ttl_ms` the least lease over the
    /// groups that extended it, `groups` what each said (empty: a service that does not say;
    /// then every group counts as extended with `ttl_ms`). `named`: the keepalive named the
    /// groups it renews ([`GroupLeases::keepalive_groups`]) rather than asking every group.
    /// Returns what it did to the session-wide lease ([`Renewal::Unchanged`] when not every
    /// group answered).
    ///
    /// The session-wide lease is what a hold follows once it may have left its group, so it
    /// moves only with a reply that covers wherever such a hold can be: one from every group,
    /// or a named one in which no group reported a move the client did not know of (every
    /// hold is then still in its named group, so a hold that leaves later lands in a group
    /// whose lease restarts after this reply).
    pub fn renewed(
        &mut self,
        sent: Instant,
        ttl_ms: u64,
        groups: &[(u32, GroupAnswer)],
        named: bool,
        now: Instant,
    ) -> Renewal {
        let moved = groups.iter().any(|(g, a)| match a {
            GroupAnswer::Extended { group_moves, .. } => {
                self.groups.get(g).is_some_and(|st| *group_moves > st.moves)
            }
            _ => false,
        });
        let mut every = !(named && moved);
        if groups.is_empty() {
            let known: Vec<(u32, u64)> = self.groups.iter().map(|(g, s)| (*g, s.moves)).collect();
            for (g, moves) in known {
                self.extended(g, sent, ttl_ms, moves, now);
            }
        }
        for (g, answer) in groups {
            match *answer {
                GroupAnswer::Extended {
                    ttl_ms,
                    group_moves,
                } => self.extended(*g, sent, ttl_ms, group_moves, now),
                GroupAnswer::NotHere => self.not_here(*g, sent, now),
                GroupAnswer::Other => every = false,
            }
        }
        // A reply in which no group extended the lease (a named keepalive whose groups all
        // said not here) renews nothing.
        let extended = groups.is_empty()
            || (groups.iter()).any(|(_, a)| matches!(a, GroupAnswer::Extended { .. }));
        if !every || !extended {
            return Renewal::Unchanged;
        }
        if !named {
            let d = self.deadline_from(sent, ttl_ms);
            self.every_deadline = self.every_deadline.max(d);
        }
        let renewal = self.all.renewed(sent, ttl_ms, now);
        if renewal == Renewal::TooLate {
            // Too late for the holds that followed it; it goes on for later ones.
            self.all_ended_at
                .insert(self.all_epoch, self.all.deadline());
            self.all_epoch += 1;
            self.all = LocalLease::opened(sent, self.all.ttl, self.all.margin);
            self.all.renewed(sent, ttl_ms, now);
        }
        renewal
    }

    /// An acquire sent at `sent` was granted or queued in `group`, and the group's leader said
    /// it renewed the session's lease there as it did (`renewed`: `ttl_ms` left, the group's
    /// move count `group_moves`). Counted exactly as a keepalive sent at `sent` that only
    /// `group` answered, extended: the session-wide lease is untouched. A grant of a lease the
    /// client had counted lapsed keeps the holds of the lapsed lease lost and starts a new one.
    /// A lost session stays lost.
    pub fn renewed_in(
        &mut self,
        group: u32,
        sent: Instant,
        ttl_ms: u64,
        group_moves: u64,
        now: Instant,
    ) {
        if now >= self.session_deadline() {
            return;
        }
        self.used.insert(group, now);
        self.extended(group, sent, ttl_ms, group_moves, now);
    }

    fn extended(&mut self, g: u32, sent: Instant, ttl_ms: u64, moves: u64, now: Instant) {
        let d = self.deadline_from(sent, ttl_ms);
        let st = self.groups.entry(g).or_insert(GroupState {
            deadline: None,
            moves,
            epoch: 0,
            first_grant: None,
            ended_at: Default::default(),
        });
        st.moves = st.moves.max(moves);
        match st.deadline {
            // Too late for the holds of this epoch (they may have stopped already); the
            // group's lease goes on for later grants.
            Some(old) if now >= old => {
                end_epoch(st, old);
                st.deadline = Some(d);
            }
            Some(old) if d <= old => {}
            _ => st.deadline = Some(d),
        }
    }

    fn not_here(&mut self, g: u32, sent: Instant, now: Instant) {
        let Some(st) = self.groups.get_mut(&g) else {
            return;
        };
        match st.first_grant {
            // Every grant of this epoch arrived after the keepalive was sent: the group may
            // have answered before the acquire brought the session there. Nothing is known
            // to have ended.
            Some(first) if first > sent => return,
            Some(_) => {
                let at = st.deadline.map_or(now, |d| d.min(now));
                end_epoch(st, at);
            }
            None => {}
        }
        st.deadline = None;
    }

    /// A hold granted by `group` at its move count `group_moves`, for an acquire sent at
    /// `sent` and answered (or pushed) at `now`, told the lease is `lease_ttl_ms`. A group
    /// without a lease the client knows of starts one at `sent + TTL − margin`, but never past
    /// the last keepalive that asked every group: a grant renews nothing, and the lease there
    /// may be older than the acquire (an import brought the session, or another request
    /// adopted it). Nor, once keepalives name their groups, past `others + TTL − margin` for
    /// the earliest send of another acquire still unanswered (`others`) or whose answer was
    /// lost. A grant whose request started the lease itself goes through
    /// [`GroupLeases::started`] first, and then counts from its own send.
    pub fn granted(
        &mut self,
        sent: Instant,
        now: Instant,
        group: u32,
        group_moves: u64,
        lease_ttl_ms: u64,
        others: Option<Instant>,
    ) -> HoldLease {
        let mut start = self
            .deadline_from(sent, lease_ttl_ms)
            .min(self.every_deadline);
        if self.home.is_some() {
            let unknown = [others, self.unsure_since].into_iter().flatten().min();
            if let Some(t) = unknown {
                start = start.min(self.deadline_from(t, 0));
            }
        }
        let st = self.groups.entry(group).or_insert(GroupState {
            deadline: None,
            moves: group_moves,
            epoch: 0,
            first_grant: None,
            ended_at: Default::default(),
        });
        st.deadline.get_or_insert(start);
        st.moves = st.moves.max(group_moves);
        st.first_grant.get_or_insert(now);
        self.used.insert(group, now);
        HoldLease {
            group,
            group_moves,
            epoch: st.epoch,
            all_epoch: self.all_epoch,
        }
    }

    /// When `hold` was lost, once the lease of its epoch is known to have ended: that lease's
    /// deadline, or when the client learnt of the end if that came first.
    pub fn ended_at(&self, hold: &HoldLease) -> Option<Instant> {
        let all = self.all_ended_at.get(&hold.all_epoch).copied();
        let Some(st) = self.groups.get(&hold.group) else {
            return all;
        };
        if st.epoch != hold.epoch {
            return st.ended_at.get(&hold.epoch).copied();
        }
        match st.deadline {
            Some(_) if st.moves == hold.group_moves => None,
            _ => all,
        }
    }

    /// When `hold` must be counted lost, apart from the session's own end: its group's
    /// deadline while the group's move count is the grant's, else the session-wide one;
    /// `None` once the lease of its epoch is known to have ended ([`GroupLeases::ended_at`]).
    pub fn deadline_of(&self, hold: &HoldLease) -> Option<Instant> {
        let all = (self.all_epoch == hold.all_epoch).then(|| self.all.deadline());
        let Some(st) = self.groups.get(&hold.group) else {
            return all;
        };
        if st.epoch != hold.epoch {
            return None;
        }
        match st.deadline {
            Some(d) if st.moves == hold.group_moves => Some(d),
            _ => all,
        }
    }
}

fn end_epoch(st: &mut GroupState, at: Instant) {
    st.ended_at.insert(st.epoch, at);
    st.epoch += 1;
    st.first_grant = None;
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
        l.renewed(
            s(1),
            15_000,
            &[(1, ext(15_000, 0)), (2, ext(15_000, 5))],
            false,
            s(1),
        );
        let hold = l.granted(s(1), s(1), 2, 5, 15_000, None);
        assert_eq!(l.deadline_of(&hold), Some(s(13)));
        // Group 2 extends; group 1 cannot answer: the hold follows group 2, the session-wide
        // lease does not move.
        let answers = [(1, GroupAnswer::Other), (2, ext(15_000, 5))];
        assert_eq!(
            l.renewed(s(6), 15_000, &answers, false, s(6)),
            Renewal::Unchanged
        );
        assert_eq!(l.deadline_of(&hold), Some(s(18)));
        assert_eq!(l.session().deadline(), s(13));
        // A move in group 2: the hold may be elsewhere now, so it follows the session-wide
        // lease, which every group must renew.
        l.renewed(
            s(9),
            15_000,
            &[(1, GroupAnswer::Other), (2, ext(15_000, 6))],
            false,
            s(9),
        );
        assert_eq!(l.deadline_of(&hold), Some(s(13)));
        l.renewed(
            s(10),
            15_000,
            &[(1, ext(15_000, 0)), (2, ext(15_000, 6))],
            false,
            s(10),
        );
        assert_eq!(l.deadline_of(&hold), Some(s(22)));
        // A hold granted after the move follows group 2 again.
        let later = l.granted(s(10), s(10), 2, 6, 15_000, None);
        assert_eq!(l.deadline_of(&later), Some(s(22)));
    }

    #[test]
    fn a_first_grant_in_a_group_never_outlasts_the_session_wide_deadline() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut l = GroupLeases::opened(t0, TTL, default_margin(TTL));
        // A grant renews nothing: the group may have had the session since the open.
        let hold = l.granted(s(4), s(4), 3, 0, 15_000, None);
        assert_eq!(l.deadline_of(&hold), Some(s(12)));
    }

    #[test]
    fn a_group_that_ended_the_lease_loses_the_holds_granted_before_it_said_so() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut l = GroupLeases::opened(t0, TTL, default_margin(TTL));
        l.renewed(
            s(1),
            15_000,
            &[(1, ext(15_000, 0)), (2, ext(15_000, 0))],
            false,
            s(1),
        );
        let a = l.granted(s(1), s(1), 1, 0, 15_000, None);
        let b = l.granted(s(1), s(1), 2, 0, 15_000, None);
        // Group 1 has no lease for the session, asked after `a` was granted: `a` is lost.
        l.renewed(
            s(2),
            15_000,
            &[(1, GroupAnswer::NotHere), (2, ext(15_000, 0))],
            false,
            s(2),
        );
        assert_eq!(l.deadline_of(&a), None);
        assert_eq!(l.deadline_of(&b), Some(s(14)));
        // A grant in group 1 that arrived after a keepalive was sent is not ended by that
        // keepalive's "not here" (the group may have answered before the acquire adopted the
        // session); it starts a new lease, within the session-wide deadline.
        let c = l.granted(s(3), s(4), 1, 0, 15_000, None);
        l.renewed(
            s(3),
            15_000,
            &[(1, GroupAnswer::NotHere), (2, ext(15_000, 0))],
            false,
            s(5),
        );
        assert_eq!(l.deadline_of(&c), Some(s(14)));
        // A later "not here" for a keepalive sent after that grant arrived ends it.
        l.renewed(
            s(6),
            15_000,
            &[(1, GroupAnswer::NotHere), (2, ext(15_000, 0))],
            false,
            s(6),
        );
        assert_eq!(l.deadline_of(&c), None);
        assert_eq!(l.ended_at(&c), Some(s(6)), "lost when the client learnt it");
        assert_eq!(l.deadline_of(&a), None, "a lost lease stays lost");
    }

    #[test]
    fn a_late_answer_does_not_revive_the_holds_of_the_lease_it_came_too_late_for() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut l = GroupLeases::opened(t0, TTL, default_margin(TTL));
        l.renewed(s(1), 15_000, &[(2, ext(15_000, 0))], false, s(1));
        let b = l.granted(s(2), s(2), 2, 0, 15_000, None);
        assert_eq!(l.deadline_of(&b), Some(s(13)));
        // Answered after group 2's deadline: b is lost; the lease goes on for new grants.
        l.renewed(s(12), 15_000, &[(2, ext(15_000, 0))], false, s(14));
        assert_eq!(l.deadline_of(&b), None);
        assert_eq!(l.ended_at(&b), Some(s(13)), "lost at its deadline");
        let d = l.granted(s(14), s(14), 2, 0, 15_000, None);
        assert_eq!(l.deadline_of(&d), Some(s(24)));
    }

    #[test]
    fn one_groups_outage_loses_only_its_holds_and_the_session_lives_on() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut l = GroupLeases::opened(t0, TTL, default_margin(TTL));
        l.renewed(
            s(1),
            15_000,
            &[(1, ext(15_000, 0)), (2, ext(15_000, 0))],
            false,
            s(1),
        );
        let in1 = l.granted(s(1), s(1), 1, 0, 15_000, None);
        let in2 = l.granted(s(1), s(1), 2, 0, 15_000, None);
        // Group 1 is down for longer than the TTL; group 2 answers every 5 s.
        for n in [6, 11, 16, 21] {
            let answers = [(1, GroupAnswer::Other), (2, ext(15_000, 0))];
            assert_eq!(
                l.renewed(s(n), 15_000, &answers, false, s(n)),
                Renewal::Unchanged
            );
        }
        assert_eq!(
            l.deadline_of(&in1),
            Some(s(13)),
            "lost at group 1's deadline"
        );
        assert_eq!(l.deadline_of(&in2), Some(s(33)));
        assert_eq!(l.session().deadline(), s(13));
        assert_eq!(l.session_deadline(), s(33), "the session lives in group 2");
        // Group 1 comes back: every group answers, late for the session-wide lease, which
        // starts again; group 1's holds of before stay lost.
        let both = [(1, ext(15_000, 0)), (2, ext(15_000, 0))];
        assert_eq!(
            l.renewed(s(26), 15_000, &both, false, s(26)),
            Renewal::TooLate
        );
        assert_eq!(l.deadline_of(&in1), None);
        assert_eq!(l.session().deadline(), s(38));
        let again = l.granted(s(26), s(26), 1, 0, 15_000, None);
        assert_eq!(l.deadline_of(&again), Some(s(38)));
    }

    #[test]
    fn a_moved_hold_is_lost_for_good_when_the_session_wide_lease_was_renewed_late() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut l = GroupLeases::opened(t0, TTL, default_margin(TTL));
        l.renewed(
            s(1),
            15_000,
            &[(1, ext(15_000, 0)), (2, ext(15_000, 0))],
            false,
            s(1),
        );
        let hold = l.granted(s(1), s(1), 2, 0, 15_000, None);
        // A move in group 2 while group 1 is down: the hold follows the session-wide lease.
        l.renewed(
            s(6),
            15_000,
            &[(1, GroupAnswer::Other), (2, ext(15_000, 1))],
            false,
            s(6),
        );
        assert_eq!(l.deadline_of(&hold), Some(s(13)));
        // Every group answers again only after that deadline: the hold is lost for good.
        l.renewed(
            s(14),
            15_000,
            &[(1, ext(15_000, 0)), (2, ext(15_000, 1))],
            false,
            s(14),
        );
        assert_eq!(l.deadline_of(&hold), None);
        assert_eq!(
            l.ended_at(&hold),
            Some(s(13)),
            "lost at the session-wide deadline"
        );
        assert!(l.session_deadline() > s(14), "the session goes on");
    }

    #[test]
    fn a_pushed_end_in_one_group_loses_the_holds_granted_before_it() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut l = GroupLeases::opened(t0, TTL, default_margin(TTL));
        l.renewed(
            s(1),
            15_000,
            &[(1, ext(15_000, 0)), (2, ext(15_000, 0))],
            false,
            s(1),
        );
        let in1 = l.granted(s(1), s(1), 1, 0, 15_000, None);
        let in2 = l.granted(s(1), s(1), 2, 0, 15_000, None);
        l.ended(1, s(5));
        assert_eq!(l.deadline_of(&in1), None);
        assert_eq!(l.deadline_of(&in2), Some(s(13)));
        // A grant after the notice (the session brought back into group 1) is not lost.
        let back = l.granted(s(6), s(6), 1, 0, 15_000, None);
        assert_eq!(l.deadline_of(&back), Some(s(13)));
    }

    #[test]
    fn a_reply_without_groups_renews_every_group_as_the_session() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut l = GroupLeases::opened(t0, TTL, default_margin(TTL));
        let hold = l.granted(s(1), s(1), 3, 0, 15_000, None);
        assert_eq!(
            l.renewed(s(5), 15_000, &[], false, s(5)),
            Renewal::Extended { deadline: s(17) }
        );
        assert_eq!(l.deadline_of(&hold), Some(s(17)));
        assert_eq!(l.renewed(s(4), 15_000, &[], false, s(30)), Renewal::TooLate);
    }

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

    /// A session homed in group 1: keepalives name the home and the groups of its holds and
    /// waits, and ask every group while a hold may have left its group or an outcome is lost.
    #[test]
    fn keepalives_name_the_home_and_the_groups_in_use() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut l = GroupLeases::opened(t0, TTL, default_margin(TTL));
        assert!(
            l.keepalive_groups([], [], false, t0).is_empty(),
            "no home: every group"
        );
        l.homed(1, t0, t0);
        assert_eq!(l.keepalive_groups([], [], false, t0), vec![1]);
        assert_eq!(l.group_deadline(1), Some(s(12)));
        // An acquire sent at 2 adopted the session in group 3 (`lease_started`).
        l.started(3, s(2), 15_000, s(2));
        let hold = l.granted(s(2), s(2), 3, 4, 15_000, None);
        assert_eq!(
            l.deadline_of(&hold),
            Some(s(14)),
            "counted from its own send"
        );
        assert_eq!(l.keepalive_groups([hold], [5], false, s(2)), vec![1, 3, 5]);
        assert!(
            l.keepalive_groups([hold], [], true, s(2)).is_empty(),
            "unsure"
        );
        // A named renewal with no move renews the session-wide lease too.
        let named = [(1, ext(15_000, 0)), (3, ext(15_000, 4))];
        assert!(matches!(
            l.renewed(s(5), 15_000, &named, true, s(5)),
            Renewal::Extended { .. }
        ));
        assert_eq!(l.deadline_of(&hold), Some(s(17)));
        assert_eq!(l.session().deadline(), s(17));
        // Group 3 reports a move: the named reply does not renew the session-wide lease, the
        // hold follows it from the last reply without a move, and the next keepalive asks
        // every group.
        let moved = [(1, ext(15_000, 0)), (3, ext(15_000, 5))];
        assert_eq!(
            l.renewed(s(9), 15_000, &moved, true, s(9)),
            Renewal::Unchanged
        );
        assert_eq!(l.deadline_of(&hold), Some(s(17)));
        assert!(l.keepalive_groups([hold], [], false, s(9)).is_empty());
        // Every group answers in time: the moved hold goes on.
        let every = [
            (1, ext(15_000, 0)),
            (2, ext(15_000, 7)),
            (3, ext(15_000, 5)),
        ];
        l.renewed(s(13), 15_000, &every, false, s(13));
        assert_eq!(l.deadline_of(&hold), Some(s(25)));
        // A named reply in which every group said not here renews nothing, even once the
        // session-wide deadline has passed.
        let none = [(1, GroupAnswer::NotHere)];
        assert_eq!(l.renewed(s(26), 0, &none, true, s(26)), Renewal::Unchanged);
        assert_eq!(l.session().deadline(), s(25));
    }

    /// A group stays named for one TTL after the session last used it: the group keeps the
    /// session that long, and a grant there counts from the lease the client knows there.
    #[test]
    fn a_group_stays_named_for_one_ttl_after_its_last_use() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut l = GroupLeases::opened(t0, TTL, default_margin(TTL));
        l.homed(1, t0, t0);
        l.started(3, s(1), 15_000, s(1));
        let _hold = l.granted(s(1), s(1), 3, 0, 15_000, None);
        // Released before any keepalive saw it: group 3 is named until 1 + 15.
        assert_eq!(l.keepalive_groups([], [], false, s(2)), vec![1, 3]);
        assert_eq!(l.keepalive_groups([], [], false, s(15)), vec![1, 3]);
        assert_eq!(l.keepalive_groups([], [], false, s(16)), vec![1]);
        // A wait a keepalive saw counts as a use too.
        assert_eq!(l.keepalive_groups([], [4], false, s(17)), vec![1, 4]);
        assert_eq!(l.keepalive_groups([], [], false, s(31)), vec![1, 4]);
        assert_eq!(l.keepalive_groups([], [], false, s(32)), vec![1]);
    }

    /// A grant in a group the client has no lease of (which no keepalive it knows of renewed)
    /// counts no further than the last keepalive that asked every group, nor, once keepalives
    /// name their groups, than an acquire that may have brought the session there: one still
    /// unanswered, or one whose answer was lost.
    #[test]
    fn a_grant_in_an_unnamed_group_counts_from_the_earliest_acquire_that_may_have_adopted() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut l = GroupLeases::opened(t0, TTL, default_margin(TTL));
        l.homed(1, t0, t0);
        // A named keepalive says nothing of group 2: the open is the last word on it.
        l.renewed(s(10), 15_000, &[(1, ext(15_000, 0))], true, s(10));
        assert_eq!(l.session().deadline(), s(22));
        let stale = l.granted(s(9), s(11), 2, 0, 15_000, None);
        assert_eq!(l.deadline_of(&stale), Some(s(12)));
        // Every group answers a keepalive sent at 13; an acquire sent at 14 is still
        // unanswered when one sent at 15 is granted in group 3, which had the session.
        let every = [
            (1, ext(15_000, 0)),
            (2, GroupAnswer::NotHere),
            (3, ext(15_000, 0)),
        ];
        l.renewed(s(13), 15_000, &every, false, s(13));
        let hold = l.granted(s(15), s(15), 4, 0, 15_000, Some(s(14)));
        assert_eq!(l.deadline_of(&hold), Some(s(25)), "the full keepalive's");
        let hold = l.granted(s(15), s(15), 5, 0, 15_000, Some(s(11)));
        assert_eq!(
            l.deadline_of(&hold),
            Some(s(23)),
            "the unanswered acquire's"
        );
        // A lost answer bounds later ones the same way.
        l.unsure_since(s(12));
        let hold = l.granted(s(16), s(16), 6, 0, 15_000, None);
        assert_eq!(l.deadline_of(&hold), Some(s(24)));
        // A group that adopted the session for the acquire counts from its own send.
        l.started(7, s(16), 15_000, s(16));
        let adopted = l.granted(s(16), s(16), 7, 0, 15_000, None);
        assert_eq!(l.deadline_of(&adopted), Some(s(28)));
    }

    /// An adoption proves the group had no lease just before it: holds of the lease the client
    /// knew there are lost as of then, and the new lease counts from the adopting send.
    #[test]
    fn an_adoption_ends_the_lease_the_client_knew_there() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut l = GroupLeases::opened(t0, TTL, default_margin(TTL));
        l.homed(1, t0, t0);
        l.started(2, s(1), 15_000, s(1));
        let old = l.granted(s(1), s(1), 2, 0, 15_000, None);
        l.started(2, s(5), 15_000, s(6));
        assert_eq!(l.deadline_of(&old), None);
        assert_eq!(l.ended_at(&old), Some(s(6)));
        let new = l.granted(s(5), s(6), 2, 0, 15_000, None);
        assert_eq!(l.deadline_of(&new), Some(s(17)));
    }
    /// A grant the leader renewed the session's lease for counts from the acquire's send,
    /// even after the lease the client knew there had lapsed (a re-entry long after the last
    /// keepalive that named the group): it is not lost at once. The lapsed lease's holds stay
    /// lost. Without the renewal the same grant is lost at once.
    #[test]
    fn a_grant_with_a_renewal_counts_from_its_send_and_the_lapsed_leases_holds_stay_lost() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut plain = GroupLeases::opened(t0, TTL, default_margin(TTL));
        plain.homed(1, t0, t0);
        plain.started(2, s(1), 15_000, s(1));
        let old = plain.granted(s(1), s(1), 2, 0, 15_000, None);
        assert_eq!(plain.deadline_of(&old), Some(s(13)));
        // Keepalives go on naming the home group only.
        plain.renewed(s(10), 15_000, &[(1, ext(15_000, 0))], true, s(10));
        let mut renewing = plain.clone();
        // Sent at 12.5 (within the margin before 13), answered at 13.5.
        let sent = s(12) + Duration::from_millis(500);
        let now = s(13) + Duration::from_millis(500);
        let lost = plain.granted(sent, now, 2, 0, 15_000, None);
        assert!(
            plain.deadline_of(&lost).is_some_and(|d| d <= now),
            "lost at once"
        );
        renewing.renewed_in(2, sent, 15_000, 0, now);
        let kept = renewing.granted(sent, now, 2, 0, 15_000, None);
        assert_eq!(
            renewing.deadline_of(&kept),
            Some(sent + Duration::from_secs(12))
        );
        assert_eq!(renewing.deadline_of(&old), None);
        assert_eq!(renewing.ended_at(&old), Some(s(13)));
        assert_eq!(
            renewing.group_deadline(2),
            Some(sent + Duration::from_secs(12))
        );
        // The session-wide lease is untouched.
        assert_eq!(renewing.session().deadline(), s(22));
    }

    /// A renewal while the client's lease there still runs extends the holds of that lease
    /// too; one that reports moves the client did not know of sends the older holds to the
    /// session-wide deadline, as a keepalive's answer would.
    #[test]
    fn a_renewal_extends_the_live_leases_holds_unless_the_group_moved() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut l = GroupLeases::opened(t0, TTL, default_margin(TTL));
        l.homed(1, t0, t0);
        l.started(2, s(1), 15_000, s(1));
        let first = l.granted(s(1), s(1), 2, 0, 15_000, None);
        l.renewed_in(2, s(5), 15_000, 0, s(5));
        let second = l.granted(s(5), s(5), 2, 0, 15_000, None);
        assert_eq!(l.deadline_of(&first), Some(s(17)));
        assert_eq!(l.deadline_of(&second), Some(s(17)));
        l.renewed_in(2, s(8), 15_000, 1, s(8));
        assert_eq!(
            l.deadline_of(&first),
            Some(s(12)),
            "the session-wide deadline"
        );
        let third = l.granted(s(8), s(8), 2, 1, 15_000, None);
        assert_eq!(l.deadline_of(&third), Some(s(20)));
        // Once the session is lost, a renewal revives nothing.
        let mut lost = GroupLeases::opened(t0, TTL, default_margin(TTL));
        lost.homed(1, t0, t0);
        lost.renewed_in(1, s(13), 15_000, 0, s(13));
        assert_eq!(lost.session_deadline(), s(12));
    }
}
