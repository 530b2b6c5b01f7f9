//! Leader duties of one group: the loop that proposes `ExpireSessions` and `Tick` when they
//! fall due, over the state in `raft/leadership.rs` (the group clock, the session tracker).
//!
//! They start only once this node leads *and* has applied an entry of its own term (the blank
//! entry openraft commits on election), so every entry of earlier terms is in the table when the
//! clock is based on its `now_ms` and the session timers restart from `session_ttls()`.
//! The loop sleeps until the next deadline and wakes on every apply or role change; it never
//! polls.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::watch;
use lockd_core::Op;
use tracing::{debug, info, warn};

use crate::group::Group;

/// How long to back off after a failed expiry or tick proposal before trying again.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Runs the leader duties of `group` until `stop` changes or is dropped.
pub(crate) async fn run(group: Arc<Group>, mut stop: watch::Receiver<bool>) {
    let mut applied = group.replica().subscribe();
    let mut roles = group.raft().role_changes();
    let clock = *group.replica().clock();
    // Every role change passes here: start the clock of a lost leader now, not when a call
    // first asks (`Group::is_stranded`). Not per apply: that is the hot path.
    let _ = group.is_stranded();
    loop {
        let wake = step(&group).await;
        let sleep = async {
            match wake {
                Some(at) => clock.sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        // `biased`: a fixed poll order, so a seeded simulation replays exactly.
        tokio::select! {
            biased;
            _ = stop.changed() => return,
            _ = applied.changed() => {}
            r = roles.changed() => {
                if r.is_err() {
                    return;
                }
                let _ = group.is_stranded();
            }
            _ = sleep => {}
        }
    }
}

/// One pass: follow role changes, propose what is due, and say when to look again.
async fn step(group: &Group) -> Option<Instant> {
    let term = follow_role(group)?;
    let replica = group.replica();
    let clock = *replica.clock();
    let due = replica.with_leadership(|l| l.due(clock.now()));
    if !due.is_empty() {
        return Some(expire(group, due).await);
    }
    let wake = replica.with_leadership(|l| l.next_deadline());
    let Some(timer_ms) = replica.read(|t| t.next_timer_ms()) else {
        return wake;
    };
    let now_ms = replica.stamp(term)?;
    if timer_ms <= now_ms {
        return Some(tick(group, timer_ms).await);
    }
    let at = clock.now() + Duration::from_millis(timer_ms - now_ms);
    Some(wake.map_or(at, |w| w.min(at)))
}

/// Starts or stops the duties as the role changed; the term they are active for, if any.
fn follow_role(group: &Group) -> Option<u64> {
    let replica = group.replica();
    let status = group.raft().role();
    if !status.is_leader {
        if replica.active_term().is_some() {
            replica.deactivate();
            info!(
                group = replica.group(),
                term = status.term,
                "leader duties stopped"
            );
        }
        return None;
    }
    if replica.active_term() != Some(status.term) {
        let (_, applied_term) = replica.applied();
        if applied_term < status.term {
            // The blank entry of this term is not applied yet; the apply wakes us.
            return None;
        }
        let slack = group.election_timeout_max();
        let sessions = replica.activate(status.term, slack);
        info!(
            group = replica.group(),
            term = status.term,
            sessions,
            "leader duties started"
        );
    }
    Some(status.term)
}

/// Proposes the expiry of the sessions whose deadlines passed; when to look again.
async fn expire(group: &Group, due: Vec<lockd_core::SessionId>) -> Instant {
    let replica = group.replica();
    let clock = *replica.clock();
    debug!(
        group = replica.group(),
        n = due.len(),
        "proposing ExpireSessions"
    );
    match group
        .propose_on_leader(Op::ExpireSessions { sessions: due })
        .await
    {
        Ok(_) => clock.now(),
        Err(e) => {
            warn!(group = replica.group(), error = %e, "ExpireSessions failed; retrying");
            clock.now() + RETRY_PAUSE
        }
    }
}

/// Proposes a tick for the first timer (due at group time `timer_ms`); when to look again.
async fn tick(group: &Group, timer_ms: u64) -> Instant {
    let replica = group.replica();
    let clock = *replica.clock();
    match group.propose_on_leader(Op::Tick).await {
        // A tick handles every timer due at its time; if this one is still first, the
        // machine disagrees with us: do not spin.
        Ok(_) if replica.read(|t| t.next_timer_ms()) == Some(timer_ms) => {
            warn!(
                group = replica.group(),
                timer_ms, "timer still due after Tick"
            );
            clock.now() + RETRY_PAUSE
        }
        Ok(_) => clock.now(),
        Err(e) => {
            warn!(group = replica.group(), error = %e, "Tick failed; retrying");
            clock.now() + RETRY_PAUSE
        }
    }
}
