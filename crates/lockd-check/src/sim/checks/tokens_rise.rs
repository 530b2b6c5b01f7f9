//! S2: tokens for a name strictly rise, across grants, leader changes, restarts, snapshots and
//! bucket moves between groups (the receiving group's revision floor).

use super::*;

/// A grant of `name` with `token` by `group` at `index`, in first-apply order over all groups.
pub(super) fn check(
    a: &mut Audit,
    group: GroupId,
    index: u64,
    name: &str,
    token: u64,
) -> Option<(Signature, String)> {
    let last = a.last_token.insert(name.to_string(), token).unwrap_or(0);
    (token <= last).then(|| {
        (
            Signature::TokenRegression,
            format!(
                "S2: group {group} granted {name} token {token} at index {index} after token \
                 {last}"
            ),
        )
    })
}
