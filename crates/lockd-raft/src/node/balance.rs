//! Leader balance: every group has a preferred leader, and a leader that is not its group's
//! preferred one hands the group over once the preferred voter has the whole log.
//!
//! Why: a group's leader does most of its work (it orders every write, fsyncs first, replicates
//! to the others, answers reads and keepalives), so the groups only spread that load if their
//! leaders are spread. Elections do not spread them: the node that initialises the groups wins
//! every first election, and the survivors of a failover keep the groups they took. With the
//! groups' leaders on one node, one node's CPU is the cluster's ceiling (measured: all four
//! lock groups led by node 1, its scheduler thread at 77% while the others idled at 20%).
//!
//! The rule, in one place (`placement.rs`, a pure function): the preferred leader of group `g` is the `(g mod n)`-th of its `n`
//! voters in id order, leaving out the nodes marked draining (unless every voter is): a
//! draining node is handed no group, and hands the groups it leads to the others. A hand-off is openraft's TransferLeader: the leader stops proposing and
//! tells the voters; the target, once its log has everything the leader had, starts an election
//! at once and wins it. It is a leader change like any other, so every rule of a new term holds
//! (a new leader never shortens a lease: each session restarts at TTL + election timeout). If
//! the target cannot take over, the group elects a leader after an election timeout, as after a
//! crash; a node retries a hand-off that did not happen only after a back-off that doubles.

use std::collections::BTreeMap;
use std::sync::Weak;
use std::time::Duration;

use tokio::time::Instant;
use tracing::info;

use crate::node::Node;
use crate::placement::preferred_leader;
use crate::watch;
use crate::{GroupId, NodeId};

/// How often a node looks at the groups it leads.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// A leader hands a group over only after leading it this long, so a node that just won an
/// election (or just restarted) is not asked to move again at once.
const SETTLE: Duration = Duration::from_secs(2);
/// The first wait before a group whose hand-off did not take is tried again; it doubles up to
/// [`RETRY_MAX`] and resets once the preferred voter leads.
const RETRY_FIRST: Duration = Duration::from_secs(10);
const RETRY_MAX: Duration = Duration::from_secs(300);

/// What this node remembers about one group between checks.
#[derive(Debug)]
struct Watch {
    /// The term this node has led the group in, and since when.
    leading: Option<(u64, Instant)>,
    /// No hand-off before this.
    next_try: Instant,
    backoff: Duration,
}

/// What to do with one group now.
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    Stay,
    HandOver(NodeId),
}

impl Watch {
    fn new(now: Instant) -> Watch {
        Watch {
            leading: None,
            next_try: now,
            backoff: RETRY_FIRST,
        }
    }

    /// The decision for a group this node sees in `term`, led by `leader`, preferring
    /// `preferred`; `caught_up` says whether the preferred voter has this leader's whole log.
    fn decide(
        &mut self,
        me: NodeId,
        term: u64,
        leader: Option<NodeId>,
        preferred: Option<NodeId>,
        caught_up: impl FnOnce(NodeId) -> bool,
        now: Instant,
    ) -> Decision {
        if leader.is_some() && leader == preferred {
            self.backoff = RETRY_FIRST;
        }
        if leader != Some(me) {
            self.leading = None;
            return Decision::Stay;
        }
        let since = match self.leading {
            Some((t, since)) if t == term => since,
            _ => {
                self.leading = Some((term, now));
                now
            }
        };
        let Some(to) = preferred.filter(|p| *p != me) else {
            return Decision::Stay;
        };
        if now.saturating_duration_since(since) < SETTLE || now < self.next_try || !caught_up(to) {
            return Decision::Stay;
        }
        self.next_try = now + self.backoff;
        self.backoff = (self.backoff * 2).min(RETRY_MAX);
        Decision::HandOver(to)
    }
}

/// Runs the balancer of `node` over the groups it hosts at each check, until `stop` changes,
/// is dropped, or the node is gone.
pub(crate) async fn run(node: Weak<Node>, mut stop: watch::Receiver<bool>) {
    let mut watches: BTreeMap<GroupId, Watch> = BTreeMap::new();
    loop {
        tokio::select! {
            biased;
            _ = stop.changed() => return,
            _ = tokio::time::sleep(CHECK_EVERY) => {}
        }
        let Some((me, groups, draining)) = node
            .upgrade()
            .map(|n| (n.node_id(), n.hosted_groups(), n.draining()))
        else {
            return;
        };
        let now = Instant::now();
        watches.retain(|id, _| groups.iter().any(|g| g.id() == *id));
        for g in &groups {
            let raft = g.raft();
            let status = raft.status();
            let preferred = preferred_leader(g.id(), status.voters.iter().copied(), &draining);
            let w = watches.entry(g.id()).or_insert_with(|| Watch::new(now));
            let role = status.role;
            let caught_up = |to| raft.has_whole_log(to);
            if let Decision::HandOver(to) =
                w.decide(me, role.term, role.leader, preferred, caught_up, now)
            {
                info!(
                    group = g.id(),
                    term = role.term,
                    to,
                    "handing leadership to the preferred voter"
                );
                raft.transfer_leader(to).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_leader_hands_over_only_after_settling_to_a_caught_up_voter() {
        let t0 = Instant::now();
        let mut w = Watch::new(t0);
        let s = |secs: u64| t0 + Duration::from_secs(secs);
        // Node 1 leads term 3 of a group that prefers node 2.
        assert_eq!(
            w.decide(1, 3, Some(1), Some(2), |_| true, s(0)),
            Decision::Stay
        );
        assert_eq!(
            w.decide(1, 3, Some(1), Some(2), |_| true, s(1)),
            Decision::Stay
        );
        // Settled, but node 2 lacks part of the log.
        assert_eq!(
            w.decide(1, 3, Some(1), Some(2), |_| false, s(2)),
            Decision::Stay
        );
        assert_eq!(
            w.decide(1, 3, Some(1), Some(2), |n| n == 2, s(3)),
            Decision::HandOver(2)
        );
        // The hand-off did not take: the next try waits 10 s, then 20 s.
        assert_eq!(
            w.decide(1, 3, Some(1), Some(2), |_| true, s(12)),
            Decision::Stay
        );
        assert_eq!(
            w.decide(1, 3, Some(1), Some(2), |_| true, s(13)),
            Decision::HandOver(2)
        );
        assert_eq!(
            w.decide(1, 3, Some(1), Some(2), |_| true, s(32)),
            Decision::Stay
        );
        assert_eq!(
            w.decide(1, 3, Some(1), Some(2), |_| true, s(33)),
            Decision::HandOver(2)
        );
        // It took: node 2 leads, which also resets the back-off.
        assert_eq!(
            w.decide(1, 4, Some(2), Some(2), |_| true, s(34)),
            Decision::Stay
        );
        assert_eq!(w.backoff, RETRY_FIRST);
        // Node 1 wins term 5 after a failover: it settles again before handing back.
        assert_eq!(
            w.decide(1, 5, Some(1), Some(2), |_| true, s(73)),
            Decision::Stay
        );
        assert_eq!(
            w.decide(1, 5, Some(1), Some(2), |_| true, s(74)),
            Decision::Stay
        );
        assert_eq!(
            w.decide(1, 5, Some(1), Some(2), |_| true, s(75)),
            Decision::HandOver(2)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_preferred_leader_and_followers_never_hand_over() {
        let t0 = Instant::now();
        let mut w = Watch::new(t0);
        for secs in 0..30 {
            let now = t0 + Duration::from_secs(secs);
            assert_eq!(
                w.decide(2, 3, Some(2), Some(2), |_| true, now),
                Decision::Stay
            );
            assert_eq!(
                w.decide(3, 3, Some(2), Some(2), |_| true, now),
                Decision::Stay
            );
            assert_eq!(w.decide(3, 3, None, Some(2), |_| true, now), Decision::Stay);
        }
    }
}
