//! What the meta group records about the cluster itself: the Raft timing every node must share,
//! and the node ids that have left for good.
//!
//! **Timing.** The lease hand-over rests on it: a new leader gives every session the election
//! timeout's upper bound as slack, which covers the old leader's lease only if every node uses
//! the same bound. So the timing is a cluster setting, not a per-node guess: the first node to
//! start records its own, and a node whose flags differ is refused at start with both values.
//!
//! **Retired ids.** A node id is never reused (openraft's rule: a wiped node that came back
//! under its old id could vote twice in one term). Once a node has left every group its id is
//! recorded here, and adding it again is refused.
//!
//! **Draining nodes.** An operator marks a node draining before taking it away (maintenance,
//! removal): leader balancing then prefers the other voters of every group, so the groups the
//! node leads move off it with a hand-off and no group is handed to it. Only leadership moves:
//! the node stays a voter and keeps serving clients until it is removed or stopped.
//!
//! **Incarnations.** A node's identity is its disk: its data dir carries an incarnation, a
//! random id made when the dir was first created. Each node records its own here once it can
//! reach the meta group; the first one recorded for an id stands. A node that comes back under
//! its id with another incarnation has lost its log and its vote (a voter that forgot both can
//! vote twice in one term, or help elect a leader that lacks a commit), so the record refuses
//! it, every node refuses its peer calls (`lockd-raft/src/peer`), and it must rejoin under a new
//! id (`lockctl members replace OLD NEW ADDR`).
//!
//! **Zones.** Each node's zone, which membership changes read to keep every group's voters out
//! of a zone majority (`lockd-raft/src/placement.rs`). Like an incarnation, the first one
//! recorded for an id stands: a data dir records its zone and never changes it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::types::{ClusterTiming, Op, Rejection, Reply};

/// The meta group's record of the cluster (empty in lock groups).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ClusterRecord {
    pub timing: Option<ClusterTiming>,
    pub retired: BTreeSet<u64>,
    /// In the image as a field of its own (format 6), after the topology.
    #[serde(skip)]
    pub draining: BTreeSet<u64>,
    /// In the image as a field of its own (format 10), after the namespaces' version.
    #[serde(skip)]
    pub incarnations: BTreeMap<u64, u64>,
    /// In the image as a field of its own (format 11), after the incarnations.
    #[serde(skip)]
    pub zones: BTreeMap<u64, String>,
}

impl ClusterRecord {
    /// Applies one of the commands that change this record (`LockTable::apply` sends them).
    pub(crate) fn apply(&mut self, op: &Op) -> Result<Reply, Rejection> {
        match op {
            Op::SetClusterTiming { timing } => self.set_timing(*timing),
            Op::RetireNode { node } => self.retire_node(*node),
            Op::SetDraining { node, draining } => self.set_draining(*node, *draining),
            Op::RegisterIncarnation { node, incarnation } => {
                self.register_incarnation(*node, *incarnation)
            }
            Op::RegisterZones { zones } => self.register_zones(zones),
            other => unreachable!("not a cluster record command: {other:?}"),
        }
    }

    /// Marks node `node` draining or not; idempotent. A retired id cannot be marked (it is
    /// gone); unmarking one is a no-op, so the mark never outlives a node's retirement.
    pub(crate) fn set_draining(&mut self, node: u64, draining: bool) -> Result<Reply, Rejection> {
        if draining && self.retired.contains(&node) {
            return Err(Rejection::NodeRetired { node });
        }
        if draining {
            self.draining.insert(node);
        } else {
            self.draining.remove(&node);
        }
        Ok(Reply::DrainingSet { node, draining })
    }

    /// Records node `node`'s incarnation. The same again is a no-op; another one is refused
    /// (the node lost its disk), and so is a retired id.
    pub(crate) fn register_incarnation(
        &mut self,
        node: u64,
        incarnation: u64,
    ) -> Result<Reply, Rejection> {
        if self.retired.contains(&node) {
            return Err(Rejection::NodeRetired { node });
        }
        match self.incarnations.get(&node) {
            Some(&known) if known != incarnation => Err(Rejection::IncarnationMismatch {
                node,
                known,
                given: incarnation,
            }),
            _ => {
                self.incarnations.insert(node, incarnation);
                Ok(Reply::IncarnationRegistered { node, incarnation })
            }
        }
    }

    /// Records each node's zone, all or none: a zone other than the recorded one refuses the
    /// whole command. Retired ids are skipped (a founder registers every founder's zone, some
    /// of which may have left since).
    pub(crate) fn register_zones(
        &mut self,
        zones: &BTreeMap<u64, String>,
    ) -> Result<Reply, Rejection> {
        for (&node, zone) in zones {
            if zone.is_empty() || zone.len() > crate::limits::MAX_ZONE_LEN {
                return Err(Rejection::InvalidZone {
                    node,
                    max: crate::limits::MAX_ZONE_LEN,
                });
            }
            match self.zones.get(&node) {
                Some(known) if known != zone && !self.retired.contains(&node) => {
                    return Err(Rejection::ZoneMismatch {
                        node,
                        known: known.clone(),
                        given: zone.clone(),
                    })
                }
                _ => {}
            }
        }
        for (&node, zone) in zones {
            if !self.retired.contains(&node) {
                self.zones.insert(node, zone.clone());
            }
        }
        Ok(Reply::ZonesRegistered)
    }

    /// Records the cluster's timing; the same again is a no-op, another one is refused.
    pub(crate) fn set_timing(&mut self, t: ClusterTiming) -> Result<Reply, Rejection> {
        if !(0 < t.heartbeat_ms && t.heartbeat_ms < t.election_min_ms)
            || t.election_min_ms >= t.election_max_ms
        {
            return Err(Rejection::InvalidClusterTiming { given: t });
        }
        match self.timing {
            Some(have) if have != t => Err(Rejection::ClusterTimingMismatch {
                cluster: have,
                given: t,
            }),
            _ => {
                self.timing = Some(t);
                Ok(Reply::ClusterTimingSet { timing: t })
            }
        }
    }

    /// Retires node `id` for good; idempotent. (Node ids are checked, 1 and up, where they
    /// enter: the admin API.)
    pub(crate) fn retire_node(&mut self, id: u64) -> Result<Reply, Rejection> {
        self.retired.insert(id);
        self.draining.remove(&id);
        self.incarnations.remove(&id);
        self.zones.remove(&id);
        Ok(Reply::NodeRetired { node: id })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Command, LockTable, Op};

    fn timing(max: u64) -> ClusterTiming {
        ClusterTiming {
            heartbeat_ms: 100,
            election_min_ms: 400,
            election_max_ms: max,
        }
    }

    fn apply(t: &mut LockTable, op: Op) -> Result<Reply, Rejection> {
        t.apply(&Command { now_ms: 1, op }).reply
    }

    #[test]
    fn the_first_timing_stands_and_another_is_refused_naming_both() {
        let mut t = LockTable::new();
        assert_eq!(t.cluster_timing(), None);
        let set = |m| Op::SetClusterTiming { timing: timing(m) };
        assert!(apply(&mut t, set(600)).is_ok());
        assert!(apply(&mut t, set(600)).is_ok(), "the same again is a no-op");
        let e = apply(&mut t, set(900)).unwrap_err();
        assert_eq!(e.code(), "cluster_timing_mismatch");
        let msg = e.to_string();
        assert!(
            msg.contains("400..600") && msg.contains("400..900"),
            "{msg}"
        );
        assert_eq!(t.cluster_timing(), Some(timing(600)));
        let bad = ClusterTiming {
            heartbeat_ms: 500,
            ..timing(600)
        };
        let e = apply(&mut t, Op::SetClusterTiming { timing: bad }).unwrap_err();
        assert_eq!(e.code(), "invalid_cluster_timing");
        let before = t.snapshot();
        let restored = LockTable::restore(&before).unwrap();
        assert_eq!(restored.cluster_timing(), Some(timing(600)));
    }

    #[test]
    fn a_retired_id_stays_retired_across_a_snapshot() {
        let mut t = LockTable::new();
        assert!(apply(&mut t, Op::RetireNode { node: 3 }).is_ok());
        assert!(apply(&mut t, Op::RetireNode { node: 3 }).is_ok());
        let restored = LockTable::restore(&t.snapshot()).unwrap();
        assert!(restored.is_retired(3) && !restored.is_retired(2));
        assert_eq!(restored.retired_nodes(), vec![3]);
    }

    #[test]
    fn the_draining_mark_is_set_cleared_kept_across_a_snapshot_and_ends_at_retirement() {
        let mut t = LockTable::new();
        let set = |node, draining| Op::SetDraining { node, draining };
        assert!(apply(&mut t, set(2, true)).is_ok());
        assert!(apply(&mut t, set(2, true)).is_ok(), "idempotent");
        assert!(apply(&mut t, set(4, true)).is_ok());
        assert!(apply(&mut t, set(4, false)).is_ok());
        assert!(
            apply(&mut t, set(5, false)).is_ok(),
            "unmarking an unmarked node"
        );
        assert_eq!(t.draining_nodes(), vec![2]);
        let restored = LockTable::restore(&t.snapshot()).unwrap();
        assert_eq!(restored.draining_nodes(), vec![2]);
        assert_eq!(restored.snapshot(), t.snapshot());
        assert!(apply(&mut t, Op::RetireNode { node: 2 }).is_ok());
        assert_eq!(t.draining_nodes(), Vec::<u64>::new());
        let e = apply(&mut t, set(2, true)).unwrap_err();
        assert_eq!(e.code(), "node_retired");
        assert_eq!(
            t.draining_nodes(),
            Vec::<u64>::new(),
            "a refusal changes nothing"
        );
    }

    #[test]
    fn the_first_incarnation_stands_another_is_refused_and_retirement_forgets_it() {
        let mut t = LockTable::new();
        let reg = |node, incarnation| Op::RegisterIncarnation { node, incarnation };
        assert!(apply(&mut t, reg(1, 0xa1)).is_ok());
        assert!(
            apply(&mut t, reg(1, 0xa1)).is_ok(),
            "the same again is a no-op"
        );
        assert!(apply(&mut t, reg(2, 0xb2)).is_ok());
        let before = t.snapshot();
        let e = apply(&mut t, reg(1, 0xc3)).unwrap_err();
        assert_eq!(e.code(), "member_change_refused");
        let msg = e.to_string();
        assert!(
            msg.contains("00000000000000a1")
                && msg.contains("00000000000000c3")
                && msg.contains("lockctl members replace 1 "),
            "{msg}"
        );
        assert_eq!(t.snapshot(), before, "a refusal changes nothing");
        let restored = LockTable::restore(&before).unwrap();
        assert_eq!(
            restored.incarnations().iter().collect::<Vec<_>>(),
            vec![(&1, &0xa1), (&2, &0xb2)]
        );
        assert!(apply(&mut t, Op::RetireNode { node: 1 }).is_ok());
        assert!(!t.incarnations().contains_key(&1));
        let e = apply(&mut t, reg(1, 0xc3)).unwrap_err();
        assert_eq!(e.code(), "node_retired");
    }

    #[test]
    fn the_first_zone_stands_a_change_is_refused_whole_and_retirement_forgets_it() {
        let mut t = LockTable::new();
        let reg = |spec: &[(u64, &str)]| Op::RegisterZones {
            zones: spec.iter().map(|(n, z)| (*n, z.to_string())).collect(),
        };
        assert!(apply(&mut t, reg(&[(1, "a"), (2, "b"), (3, "c")])).is_ok());
        assert!(apply(&mut t, reg(&[(2, "b")])).is_ok(), "the same again");
        let before = t.snapshot();
        let e = apply(&mut t, reg(&[(4, "a"), (2, "c")])).unwrap_err();
        assert_eq!(e.code(), "member_change_refused");
        assert!(e.to_string().contains("zone 'b', not 'c'"), "{e}");
        assert_eq!(
            t.snapshot(),
            before,
            "refused whole: node 4 was not recorded"
        );
        let e = apply(&mut t, reg(&[(5, "")])).unwrap_err();
        assert_eq!(e.code(), "invalid_argument");
        let restored = LockTable::restore(&before).unwrap();
        assert_eq!(restored.zones().get(&3).map(String::as_str), Some("c"));
        assert_eq!(restored.snapshot(), before);
        assert!(apply(&mut t, Op::RetireNode { node: 3 }).is_ok());
        assert!(!t.zones().contains_key(&3));
        // A founder's registration naming a retired id records the others.
        assert!(apply(&mut t, reg(&[(3, "z"), (4, "a")])).is_ok());
        assert_eq!(t.zones().keys().copied().collect::<Vec<_>>(), vec![1, 2, 4]);
    }
}
