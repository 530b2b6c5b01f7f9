//! S6 and C1 from the service's side: a group must not expire a session while its client
//! still works under a hold that may be in that group (granted there and provably still there,
//! or moved since, so anywhere) and whose deadline (lockd-client's rule, fed by the keepalives
//! the leaders acknowledged) still runs. Otherwise the name could go to another client while
//! the first still works under it.

use super::*;

pub(super) fn check(w: &World, group: GroupId, applied: &Applied) {
    let Ok(Reply::SessionsExpired { expired }) = &applied.reply else {
        return;
    };
    for s in expired {
        let deadline = lock(&w.sessions).get(s).and_then(|c| {
            let hold = (*lock(&c.hold))?;
            let leases = lock(&c.lease);
            let here = hold.group == group || !leases.in_its_group(&hold);
            here.then(|| leases.deadline_of(&hold)).flatten()
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
