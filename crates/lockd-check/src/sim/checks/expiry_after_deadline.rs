//! S6 and C1 from the service's side: a group must not expire a session while its client's
//! deadline for that group (lockd-client's rule, fed by the keepalives that group's leaders
//! acknowledged) still runs, nor while the client still works under a hold that may be in
//! that group (granted there and provably still there, or moved since, so anywhere) and whose
//! deadline still runs. Otherwise the name could go to another client while the first still
//! works under it.

use super::*;

pub(super) fn check(w: &World, group: GroupId, applied: &Applied) {
    let Ok(Reply::SessionsExpired { expired }) = &applied.reply else {
        return;
    };
    for s in expired {
        let deadline = lock(&w.sessions).get(s).and_then(|c| {
            let leases = lock(&c.lease);
            let of_hold = (*lock(&c.hold)).and_then(|hold| {
                let here = hold.group == group || !leases.in_its_group(&hold);
                here.then(|| leases.deadline_of(&hold)).flatten()
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
