//! S1 across groups (S10): a name is granted by the group that owns its bucket only. While a
//! bucket moves, its holds travel with it; a group that grants a name another group's holder
//! still has (a stale shard map served by a group that gave the bucket away) breaks mutual
//! exclusion even though each group's own table is fine.

use super::*;

/// A grant of `name` with `token` by `group` at `index`, before the view records it.
pub(super) fn check(
    a: &Audit,
    group: GroupId,
    index: u64,
    name: &str,
    token: u64,
) -> Option<(Signature, String)> {
    let (held, _, g) = a.holds.get(name).filter(|h| h.2 != group)?;
    Some((
        Signature::DoubleGrant,
        format!(
            "S1: group {group} granted {name} token {token} at index {index} while group {g} \
             held it with token {held}"
        ),
    ))
}
