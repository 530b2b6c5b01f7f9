//! What a node shares with the groups it hosts: the draining marks, a handle on every group of
//! the cluster, and the peer book. The node fills it; the groups read it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};

use crate::group::remote::RemoteGroup;
use crate::peer::PeerBook;
use crate::{GroupId, NodeId};

/// What a node shares with the replicas it hosts.
#[derive(Clone, Default)]
pub(crate) struct Shared {
    /// The nodes marked draining in the meta group (set by the server as it reads the mark):
    /// leader balancing and the hand-over at stop choose other voters first; a group's status
    /// names its preferred leader.
    pub(crate) draining: Arc<RwLock<BTreeSet<NodeId>>>,
    /// A handle on every group of the cluster over the peer port: for when this node has no
    /// member replica of it, or its replica is stranded (`Group::is_stranded`).
    pub(crate) remotes: Arc<RwLock<BTreeMap<GroupId, Arc<RemoteGroup>>>>,
    /// Who may call the peer port; the meta group's replica keeps it current.
    pub(crate) book: Option<Arc<PeerBook>>,
    /// The entry slots every group this node leads shares (`raft/mod.rs`).
    pub(crate) entry_slots: crate::raft::EntrySlots,
}
