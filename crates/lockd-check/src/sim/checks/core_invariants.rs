//! S1 within a group, and the core's other structural invariants: after every apply on every
//! replica, the table passes lockd-core's own `check_invariants` (modes compatible, holder and
//! queue counts consistent, indexes agree), and no log entry carries more commands than a batch
//! may.

use super::*;

/// The most commands one log entry carries (lockd-raft's batch limit).
const MAX_BATCH: usize = 256;

pub(super) fn check(
    w: &World,
    node: NodeId,
    group: GroupId,
    (index, slot): (u64, usize),
    t: &LockTable,
) {
    if let Err(v) = t.check_invariants() {
        w.violation(format!(
            "invariant broken on node {node} group {group} at index {index}: {v:?}"
        ));
    }
    if slot >= MAX_BATCH {
        w.violation(format!(
            "entry {index} carries more than {MAX_BATCH} commands"
        ));
    }
}
