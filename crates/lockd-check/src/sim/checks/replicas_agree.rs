//! S9: replicas that applied the same log prefix hold identical state. Every replica must apply
//! the same command with the same result and reach the same state hash at every (index, slot)
//! as the first replica that applied it.

use super::*;

/// Records the first replica's (entry, state) hashes at `at`, or compares a later replica's
/// with them. True for the first replica to apply the command.
pub(super) fn first_to_apply(
    w: &World,
    a: &mut Audit,
    node: NodeId,
    at: (GroupId, u64, usize),
    hashes: (u64, u64),
) -> bool {
    let Some(&first) = a.first.get(&at) else {
        a.first.insert(at, hashes);
        return true;
    };
    if first != hashes {
        let (group, index, slot) = at;
        w.violation(format!(
            "S9: node {node} applied a different command or reached a different state in \
             group {group} at index {index} slot {slot}"
        ));
    }
    false
}
