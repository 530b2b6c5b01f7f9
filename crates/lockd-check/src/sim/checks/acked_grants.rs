//! S3: a grant is acknowledged only after it is committed, and no committed grant is lost. When
//! a client hears "granted", some replica has applied the grant (the leader answers after
//! applying it); after healing, every acknowledged grant is in its group's log at or below the
//! index every replica applied.

use super::*;

/// The group whose log holds the acknowledged grant `name`/`token`; `None`, and a violation,
/// if no replica has applied it.
pub(crate) fn acknowledged_group(w: &World, name: &str, token: u64) -> Option<GroupId> {
    let group = lock(&w.audit)
        .grants
        .get(&(name.to_string(), token))
        .map(|(g, _)| *g);
    match group {
        Some(g) => lock(&w.acked_grants).push((name.to_string(), token, g)),
        None => w.violation(format!(
            "S3: grant {name}/{token} was acknowledged before any replica applied it"
        )),
    }
    group
}

/// After healing: every acknowledged grant is at or below its group's final applied index.
pub(super) fn all_applied(w: &World, final_state: &Converged) {
    let applied = |group: GroupId| {
        final_state
            .iter()
            .find(|((g, _), _)| *g == group)
            .map_or(0, |(_, v)| v.0)
    };
    let acked = lock(&w.acked_grants).clone();
    let audit = lock(&w.audit);
    for (name, token, group) in &acked {
        match audit.grants.get(&(name.clone(), *token)) {
            Some((g, index)) if g == group && *index <= applied(*g) => {}
            Some((g, index)) => w.violation(format!(
                "S3: acknowledged grant {name}/{token} of group {group} is at group {g} index \
                 {index}, beyond its final applied index {}",
                applied(*g)
            )),
            None => w.violation(format!(
                "S3: acknowledged grant {name}/{token} is not in the committed log"
            )),
        }
    }
}
