//! Linearizable reads: a read must see every grant acknowledged before it began. A read served
//! by a deposed leader, or answered from a ReadIndex round that started before the read, would
//! not.

use super::*;

/// The highest token acknowledged by `group` so far (take it before the read starts).
pub(crate) fn floor(w: &World, group: GroupId) -> u64 {
    lock(&w.acked_grants)
        .iter()
        .filter(|(_, _, g)| *g == group)
        .map(|(_, t, _)| *t)
        .max()
        .unwrap_or(0)
}

/// `node` answered `group`'s revision `revision` to a read that began when `floor` was the
/// highest acknowledged token.
pub(crate) fn check_read(w: &World, node: NodeId, group: GroupId, floor: u64, revision: u64) {
    if revision < floor {
        w.violation_of(
            Signature::StaleRead,
            format!(
                "stale read: node {node} answered group {group}'s revision {revision} after \
                 token {floor} was acknowledged"
            ),
        );
    }
}
