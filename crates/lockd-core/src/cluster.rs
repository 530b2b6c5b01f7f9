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

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::machine::LockTable;
use crate::types::{Rejection, Reply};

/// The Raft timing of every node of a cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClusterTiming {
    pub heartbeat_ms: u64,
    pub election_min_ms: u64,
    /// The leader lease, and the slack a new leader gives every session.
    pub election_max_ms: u64,
}

impl std::fmt::Display for ClusterTiming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "heartbeat {} ms, election timeout {}..{} ms",
            self.heartbeat_ms, self.election_min_ms, self.election_max_ms
        )
    }
}

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
}

/// What a node that came back with a new data dir under a known id is told (by the meta group,
/// by its peers, and at its start): what happened, why it may not serve, and the fix.
pub fn wiped_disk_message(node: u64, known: u64, given: u64) -> String {
    format!(
        "the cluster knows node {node} by data dir incarnation {known:016x}, and this data dir \
         is incarnation {given:016x}: the node lost its data (a wiped or replaced disk), and a \
         voter that forgot its log and its vote must not come back under its old id. Rejoin \
         under a new id: `lockctl members replace {node} NEW_ID NEW_PEER_ADDR`, then start this \
         node with --node-id NEW_ID, --initial-cluster-state existing and this empty data dir"
    )
}

impl LockTable {
    /// The cluster's Raft timing, once a node has recorded it.
    pub fn cluster_timing(&self) -> Option<ClusterTiming> {
        self.cluster.timing
    }

    /// Whether node `id` has left the cluster for good (its id may not come back).
    pub fn is_retired(&self, id: u64) -> bool {
        self.cluster.retired.contains(&id)
    }

    /// Every retired node id, ascending.
    pub fn retired_nodes(&self) -> Vec<u64> {
        self.cluster.retired.iter().copied().collect()
    }

    /// The nodes marked draining, ascending.
    pub fn draining_nodes(&self) -> Vec<u64> {
        self.cluster.draining.iter().copied().collect()
    }

    /// Marks node `node` draining or not; idempotent. A retired id cannot be marked (it is
    /// gone); unmarking one is a no-op, so the mark never outlives a node's retirement.
    pub(crate) fn set_draining(&mut self, node: u64, draining: bool) -> Result<Reply, Rejection> {
        if draining && self.cluster.retired.contains(&node) {
            return Err(Rejection::NodeRetired { node });
        }
        if draining {
            self.cluster.draining.insert(node);
        } else {
            self.cluster.draining.remove(&node);
        }
        Ok(Reply::DrainingSet { node, draining })
    }

    /// Every node's recorded data dir incarnation, by node id.
    pub fn incarnations(&self) -> &BTreeMap<u64, u64> {
        &self.cluster.incarnations
    }

    /// Records node `node`'s incarnation. The same again is a no-op; another one is refused
    /// (the node lost its disk), and so is a retired id.
    pub(crate) fn register_incarnation(
        &mut self,
        node: u64,
        incarnation: u64,
    ) -> Result<Reply, Rejection> {
        if self.cluster.retired.contains(&node) {
            return Err(Rejection::NodeRetired { node });
        }
        match self.cluster.incarnations.get(&node) {
            Some(&known) if known != incarnation => Err(Rejection::IncarnationMismatch {
                node,
                known,
                given: incarnation,
            }),
            _ => {
                self.cluster.incarnations.insert(node, incarnation);
                Ok(Reply::IncarnationRegistered { node, incarnation })
            }
        }
    }

    /// Records the cluster's timing; the same again is a no-op, another one is refused.
    pub(crate) fn set_cluster_timing(&mut self, t: ClusterTiming) -> Result<Reply, Rejection> {
        if !(0 < t.heartbeat_ms && t.heartbeat_ms < t.election_min_ms)
            || t.election_min_ms >= t.election_max_ms
        {
            return Err(Rejection::InvalidClusterTiming { given: t });
        }
        match self.cluster.timing {
            Some(have) if have != t => Err(Rejection::ClusterTimingMismatch {
                cluster: have,
                given: t,
            }),
            _ => {
                self.cluster.timing = Some(t);
                Ok(Reply::ClusterTimingSet { timing: t })
            }
        }
    }

    /// Retires node `id` for good; idempotent. (Node ids are checked, 1 and up, where they
    /// enter: the admin API.)
    pub(crate) fn retire_node(&mut self, id: u64) -> Result<Reply, Rejection> {
        self.cluster.retired.insert(id);
        self.cluster.draining.remove(&id);
        self.cluster.incarnations.remove(&id);
        Ok(Reply::NodeRetired { node: id })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Command, Op};

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
}
