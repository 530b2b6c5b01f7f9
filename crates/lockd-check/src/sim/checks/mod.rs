//! What the simulation checks, one file per invariant (names as in docs/INVARIANTS.md).
//!
//! Online, on every replica for every applied command ([`World::audited`], the sink's raw
//! hook): the core's own invariants on the table ([`core_invariants`], S1 within a group), the
//! same command and state at every index on every replica ([`replicas_agree`], S9), tokens per
//! name strictly rising across groups ([`tokens_rise`], S2), no name granted by one group while
//! another group's holder still has it ([`one_owner_per_name`], S1/S10 across bucket moves),
//! and no session expired while its client's lease still ran ([`expiry_after_deadline`],
//! S6/C1). As they happen: no acknowledged grant that no replica applied and, at the end,
//! every acknowledged grant applied on every replica ([`acked_grants`], S3); reads that miss no
//! acknowledged grant ([`stale_read`]); a store that accepts no stale write ([`store_fence`]).
//! At the end: no two clients believed they held a name at once ([`belief_overlap`], C1).
//!
//! [`service_view`] is not a check: it keeps the service's view of who holds what across the
//! groups and writes the service records the history checker reads.

mod acked_grants;
mod belief_overlap;
mod core_invariants;
mod expiry_after_deadline;
mod one_owner_per_name;
mod replicas_agree;
mod service_view;
pub(crate) mod stale_read;
pub(crate) mod store_fence;
mod tokens_rise;

pub(crate) use acked_grants::acknowledged_group;
pub(crate) use stale_read::check_read;

use super::*;

impl World {
    /// One command applied on `node` to group `group` at `(index, slot)`: the `slot`th command
    /// of the log entry at `index` (the audit hook of its sink). Runs every online check.
    pub(crate) fn audited(
        &self,
        node: NodeId,
        group: GroupId,
        (index, slot): (u64, usize),
        cmd: &Command,
        applied: &Applied,
        t: &LockTable,
    ) {
        core_invariants::check(self, node, group, (index, slot), t);
        let entry = hash_of(&format!(
            "{cmd:?}|{:?}|{:?}",
            applied.reply, applied.effects
        ));
        let state = t.state_hash();
        lock(&self.digest).write_u64(hash_of(&(
            node,
            group,
            index,
            slot,
            entry,
            state,
            self.now_ns(),
        )));
        self.trace(format!(
            "{} node {node} group {group} applied {index}.{slot}: {cmd:?} -> {:?} state {state:x}",
            self.now_ns(),
            applied.reply
        ));
        let mut a = lock(&self.audit);
        a.applies += 1;
        // The other checks and the records look at each command once: on its first replica.
        if !replicas_agree::first_to_apply(self, &mut a, node, (group, index, slot), (entry, state))
        {
            return;
        }
        if group == lockd_raft::META_GROUP {
            return;
        }
        expiry_after_deadline::check(self, group, applied);
        let mut found = Vec::new();
        let mut recs = service_view::apply(&mut a, group, cmd, applied, |a, name, token| {
            found.extend(tokens_rise::check(a, group, index, name, token));
            found.extend(one_owner_per_name::check(a, group, index, name, token));
            a.grants.insert((name.to_string(), token), (group, index));
        });
        service_view::sequence(&mut a, &mut recs);
        drop(a);
        for (kind, what) in found {
            self.violation_of(kind, what);
        }
        for r in recs {
            self.push(r);
        }
    }
}

/// The checks after healing, on the converged replicas (`None`: they did not converge).
pub(crate) fn final_checks(w: &World, converged: Result<Converged, String>) {
    let final_state = match converged {
        Ok(s) => s,
        Err(why) => {
            w.violation(format!(
                "replicas did not converge within 30 s after healing: {why}"
            ));
            return;
        }
    };
    acked_grants::all_applied(w, &final_state);
    belief_overlap::check(w);
}
