//! C1, mutual exclusion as the clients lived it: no two clients believed they held a name at
//! the same time. A client's belief runs from the grant it heard to its release, or to its
//! local deadline if it lost the lease first.

use super::*;

pub(super) fn check(w: &World) {
    let holds = lock(&w.holds);
    for (i, a) in holds.iter().enumerate() {
        for b in &holds[i + 1..] {
            if a.name == b.name && a.process != b.process && a.from < b.to && b.from < a.to {
                w.violation_of(
                    Signature::BeliefOverlap,
                    format!(
                        "C1: {} believed held by process {} (token {}) during [{:.3}s, \
                         {:.3}s] and by process {} (token {}) during [{:.3}s, {:.3}s]",
                        a.name,
                        a.process,
                        a.token,
                        w.ns(a.from) as f64 / 1e9,
                        w.ns(a.to) as f64 / 1e9,
                        b.process,
                        b.token,
                        w.ns(b.from) as f64 / 1e9,
                        w.ns(b.to) as f64 / 1e9
                    ),
                );
            }
        }
    }
}
