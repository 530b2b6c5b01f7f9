//! S6 and C1 from the service's side: a group must not expire a session while its client's
//! deadline for that group (lockd-client's rule, fed by the keepalives that group's leaders
//! acknowledged) still runs, nor free a hold its client still works under while that hold's
//! deadline runs: the hold granted there and provably still there, or moved since and freed by
//! this expiry. Otherwise the name could go to another client while the first still works
//! under it. (A moved hold follows the session-wide deadline, which a keepalive naming only
//! the groups in use renews; a group the session left may end its lease there before that
//! deadline, which frees nothing the client holds.)

use super::*;

pub(super) fn check(w: &World, group: GroupId, applied: &Applied) {
    let Ok(Reply::SessionsExpired { expired }) = &applied.reply else {
        return;
    };
    let freed_here = |s: SessionId, name: &str, token: u64| {
        applied.events.iter().any(|e| {
            matches!(e, lockd_core::LockEvent::HoldEnded { name: n, session, token: t, .. }
                if *session == s && &**n == name && *t == token)
        })
    };
    for s in expired {
        let deadline = lock(&w.sessions).get(s).and_then(|c| {
            let leases = lock(&c.lease);
            let of_hold = lock(&c.hold).as_ref().and_then(|(hold, name, token)| {
                let here = if leases.in_its_group(hold) {
                    hold.group == group
                } else {
                    freed_here(*s, name, *token)
                };
                here.then(|| leases.deadline_of(hold)).flatten()
            });
            of_hold.max(leases.group_deadline(group))
        });
        if let Some(d) = deadline.filter(|d| *d > Instant::now()) {
            w.violation_of(
                Signature::GrantWhileBelieved,
                format!(
                    "C1: session {s} expired in group {group} at {:.3}s while its client's \
                     deadline ran to {:.3}s",
                    w.now_ns() as f64 / 1e9,
                    w.ns(d) as f64 / 1e9
                ),
            );
        }
    }
}
