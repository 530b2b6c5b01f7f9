//! The records of groups created on a running cluster, as data: the meta group's record of each
//! lock group, a group's own birth and the sessions it adopted, and the epoch a session id
//! carries. The rules that change them are the topology commands (`topology_commands.rs`).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::types::SessionId;

/// The most replicas a group may be created with.
pub const MAX_GROUP_REPLICAS: usize = 7;

/// The meta group's record of one lock group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRecord {
    /// The nodes the group is placed on, ascending: its members as of membership config
    /// `placed_at` (the group's own membership is the truth; this record follows it).
    pub replicas: Vec<u64>,
    /// 0 for a founding group; one more than the newest group's for each group created since.
    pub born_epoch: u64,
    /// Founded, and so served: sessions, keepalives and buckets go to it.
    pub ready: bool,
    /// The version of `replicas`: the group's membership config they were read from (zero for
    /// the placement the group was founded or created with).
    pub placed_at: ConfigId,
}

/// Identifies one membership config of a group: the Raft log id of the entry that set it. A
/// later config of the same group has a larger id, so placements are ordered by it.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct ConfigId {
    pub term: u64,
    pub index: u64,
}

impl std::fmt::Display for ConfigId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.term, self.index)
    }
}

/// Whether a group knows a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence {
    /// Open here.
    Live,
    /// No lease here: never brought here, or ended here (a group keeps no record of ended
    /// sessions). An acquire may adopt it afresh.
    NotHere,
}

/// What a group's state records of the topology: the meta group's group records; a lock
/// group's birth.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Topology {
    /// Meta group: every lock group's record.
    pub groups: BTreeMap<u32, GroupRecord>,
    /// Lock group: the epoch it was born at (`None`: a founding group, epoch 0).
    pub birth: Option<u64>,
    /// Lock group: sessions whose lease a bucket import restarted here, until the next
    /// `ExpireSessions` that names them (`LockTable::expire_sessions` skips them once: that
    /// expiry may have been decided before the import). Snapshot formats before per-group
    /// leases kept here the older sessions a group adopted; the restore keeps only the open
    /// ones, which costs them at most one skipped expiry.
    pub lease_restarted: BTreeSet<SessionId>,
    /// Meta group: removed lock groups and the epochs they were born at (ids and epochs are
    /// never used again).
    pub removed: BTreeMap<u32, u64>,
    /// Lock group: closed for removal (`Op::CloseGroup`).
    pub closed: bool,
}

/// A group record as snapshot formats 5–7 wrote it (no placement version).
#[derive(Deserialize)]
struct GroupRecordV5 {
    replicas: Vec<u64>,
    born_epoch: u64,
    ready: bool,
}

/// [`Topology`] as snapshot formats 5–7 wrote it.
#[derive(Deserialize)]
pub(crate) struct TopologyV5 {
    groups: BTreeMap<u32, GroupRecordV5>,
    birth: Option<u64>,
    adopted: BTreeSet<SessionId>,
}

impl From<TopologyV5> for Topology {
    fn from(t: TopologyV5) -> Topology {
        let groups = t
            .groups
            .into_iter()
            .map(|(g, r)| {
                let record = GroupRecord {
                    replicas: r.replicas,
                    born_epoch: r.born_epoch,
                    ready: r.ready,
                    placed_at: ConfigId::default(),
                };
                (g, record)
            })
            .collect();
        Topology {
            groups,
            birth: t.birth,
            lease_restarted: t.adopted,
            removed: BTreeMap::new(),
            closed: false,
        }
    }
}

impl SessionId {
    /// A session id from 64 random bits: the low bit is set (never 0), the other 63 are the
    /// random ones. The id is a session's capability in an open namespace (docs/SECURITY.md),
    /// so every bit is random: since leases are per group, no group needs to read anything
    /// from the id (ids minted before carried a group-set epoch in their top 16 bits).
    pub fn random(bits: u64) -> SessionId {
        SessionId(bits | 1)
    }
}

/// The most groups a cluster creates over its life (birth epochs 1..=MAX_EPOCH).
pub const MAX_EPOCH: u64 = (1 << 16) - 1;
