//! A group that had no usable leader for a call's whole retry budget is *out*: later calls try
//! once (one round of candidates for a remote group) and fail fast with `NoLeader`, instead of
//! each waiting out the budget again. The first answer from a leader ends the outage.
//!
//! One group's outage thus costs its own names a quick retryable 503, and costs the calls that
//! fan out over every group (a session's open and keepalive) a few milliseconds, not the retry
//! budget each. Failing fast only ever replaces a wait that would have ended in the same
//! `NoLeader` (nothing was proposed): it never changes an answer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::{GroupError, GroupId};

/// One handle's view of whether its group is out (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Outage {
    out: AtomicBool,
}

impl Outage {
    /// When a call starting now stops waiting for a leader, and whether the group is out (then
    /// the call tries once and the deadline is now).
    pub(crate) fn give_up_at(&self, budget: Duration) -> (Instant, bool) {
        let now = Instant::now();
        if self.out.load(Ordering::Relaxed) {
            (now, true)
        } else {
            (now + budget, false)
        }
    }

    /// Records what a call of `group` came to. `NoLeader` after waiting the whole budget marks
    /// the group out; any other answer from a leader (a reply, or a refusal such as "no lease
    /// here") ends the outage. Failures that say nothing about leadership (a timeout, an
    /// unknown outcome, a stopping node) change nothing.
    pub(crate) fn settle<T>(&self, group: GroupId, r: &Result<T, GroupError>, waited_out: bool) {
        match r {
            Err(GroupError::NoLeader { .. }) if waited_out => {
                if !self.out.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        group,
                        "no leader for a whole retry budget; calls fail fast until one answers"
                    );
                }
            }
            Ok(_) | Err(GroupError::SessionNotFound) => {
                if self.out.swap(false, Ordering::Relaxed) {
                    tracing::info!(group, "a leader answers again");
                }
            }
            Err(_) => {}
        }
    }

    #[cfg(test)]
    pub(crate) fn is_out(&self) -> bool {
        self.out.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGET: Duration = Duration::from_secs(2);

    fn no_leader() -> Result<(), GroupError> {
        Err(GroupError::NoLeader { retry_after_ms: 1 })
    }

    #[tokio::test(start_paused = true)]
    async fn a_budget_waited_out_without_a_leader_makes_later_calls_fail_fast() {
        let o = Outage::default();
        let (at, out) = o.give_up_at(BUDGET);
        assert!(!out);
        assert_eq!(at, Instant::now() + BUDGET);
        // A call that gave up early (a stranded replica's) does not mark the group out.
        o.settle(1, &no_leader(), false);
        assert!(!o.is_out());
        o.settle(1, &no_leader(), true);
        let (at, out) = o.give_up_at(BUDGET);
        assert!(out);
        assert_eq!(at, Instant::now());
    }

    #[tokio::test(start_paused = true)]
    async fn a_leaders_answer_ends_the_outage_and_other_failures_do_not() {
        let o = Outage::default();
        o.settle(1, &no_leader(), true);
        o.settle(1, &Err::<(), _>(GroupError::Timeout), false);
        o.settle(1, &Err::<(), _>(GroupError::Unavailable("x".into())), false);
        o.settle(1, &Err::<(), _>(GroupError::ShuttingDown), false);
        assert!(o.is_out());
        // "No lease here" is a leader's answer.
        o.settle(1, &Err::<(), _>(GroupError::SessionNotFound), false);
        assert!(!o.is_out());
        o.settle(1, &no_leader(), true);
        o.settle(1, &Ok(()), false);
        assert!(!o.is_out());
        assert!(!o.give_up_at(BUDGET).1);
    }
}
