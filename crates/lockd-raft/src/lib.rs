//! # lockd-raft: replicated lock groups
//!
//! Runs one Raft group per lock group (plus the meta group 0) on the nodes it is placed on
//! (`placement.rs`; groups placed elsewhere are reached through `group/remote.rs`), each driving a
//! [`lockd_core::LockTable`]. This crate owns the protocol rules that need time or a leader
//! (GUIDE §2), each in one place:
//!
//! * **group time** — `leader`: the leader stamps `now_ms` = last applied `now_ms` advanced by
//!   its own monotonic clock;
//! * **session expiry** — `tracker`: the leader's in-memory keepalive deadlines, restarted at
//!   full TTL + election timeout on every new leader; expiries are proposed, never local;
//! * **ticks** — `leader`: a `Tick` is proposed when group time reaches the table's next timer;
//! * **durability** — `raft::log_store` (raft-log WAL, fdatasync before an entry counts, a torn
//!   tail cut and a corrupt record refused on open; a group whose storage fails reports it through
//!   [`Node::fatal`]) and `raft::state_machine` (snapshots written tmp → fsync → rename);
//! * **routing** — `group`: proposals, keepalives and reads on a follower are forwarded to the
//!   leader over the peer gRPC service (`peer`);
//! * **leader placement** — `balance`: each group's preferred leader, spread over the voters, and
//!   the hand-off to it.
//!
//! openraft's types never leave the private `raft` module, so an openraft upgrade touches one
//! directory.

mod audit;
mod clock;
mod config;
mod error;
mod group;
mod identity;
mod node;
mod peer;
mod placement;
mod private;
pub use private::{make_private_dir, write_private_file};
mod raft;
mod watch;
mod wire;

pub use audit::AuditEvent;
pub use clock::NodeClock;
pub use config::{check_peer_addr, NodeConfig, Storage};
pub use error::{GroupError, StartError};
pub use group::remote::RemoteGroup;
pub use group::{Group, GroupStatus, ProposeResult, ProposedResult, Renewed};
pub use identity::{check_zone, format_zones, parse_zones, Identity};
pub use node::fatal::GroupFailure;
pub use node::{DiskUsage, Node, Route, META_MAX_VOTERS};
pub use peer::tls::{peer_dns_name, PeerTls};
pub use peer::{Method as PeerMethod, PeerBook, PeerPool, PeerTransport};
pub use peer::{PeerServer, PeerService};
pub use placement::{initial_placement, zone_majority, ZoneMajority, Zones};
pub use raft::{
    inspect_snapshot, seed_thread_rng, MemStorage, MemberCall, MemberError, Membership,
    SnapshotReport, UNREACHABLE_AFTER,
};
pub use wire::Proposed;

/// A Raft group: 0 is the meta group (namespaces + shard map), 1..=G are lock groups.
pub type GroupId = u32;
/// A node (process) of the cluster.
pub type NodeId = u64;

/// The id of the meta group.
pub const META_GROUP: GroupId = 0;

/// The group id an app call ([`crate::PeerMethod::App`]) names when it is addressed to a node
/// rather than to a group it hosts (a node's own status): no group has it.
pub const NODE_CALL: GroupId = GroupId::MAX;

/// Where committed effects go (grants to waiting requests, ended waits, ended sessions).
pub trait EffectSink: Send + Sync + 'static {
    /// Called on EVERY replica, in log order, right after a committed entry is applied, with that
    /// entry's effects. Entries without effects are skipped. Must not block.
    fn applied(&self, group: GroupId, effects: &[lockd_core::Effect]);

    /// Called when a replica's state was replaced by a snapshot from the leader (a lagging
    /// follower): the effects of the entries the snapshot covers were never delivered here, so
    /// anything waiting for them on this node should re-read the state. Default: nothing.
    fn reset(&self, group: GroupId) {
        let _ = group;
    }

    /// RAW HOOK (simulator, tests): called on every replica for every applied command, in log
    /// order, while the replica's state lock is held, with the log index of its entry, its slot
    /// in that entry (an entry carries up to 256 commands), the command, what applying it
    /// returned, and the table afterwards. Must be cheap and must not call back into the group.
    /// Default: nothing.
    #[doc(hidden)]
    fn applied_entry(
        &self,
        group: GroupId,
        index: u64,
        slot: usize,
        cmd: &lockd_core::Command,
        applied: &lockd_core::Applied,
        table: &lockd_core::LockTable,
    ) {
        let _ = (group, index, slot, cmd, applied, table);
    }

    /// Called from the log's flush thread when an append became durable, with the time from the
    /// append to its fdatasync completing (queueing included). For metrics; must not block.
    fn log_synced(&self, group: GroupId, took: std::time::Duration) {
        let _ = (group, took);
    }

    /// Called when a replica of `group` made a snapshot of `bytes`: `captured` is the time the
    /// apply task spent serialising the state (applies wait meanwhile), `written` the time to
    /// write and fsync it. For metrics; must not block.
    fn snapshot_made(
        &self,
        group: GroupId,
        captured: std::time::Duration,
        written: std::time::Duration,
        bytes: usize,
    ) {
        let _ = (group, captured, written, bytes);
    }

    /// Called on every replica, in log order, with the core's ownership events of the entry at
    /// `index` (group time `now_ms`), when there are any: the audit log, watches and metrics
    /// are made from these. `leading`: this replica was the group's leader when it applied the
    /// entry (count cluster-wide figures there only, so they are not counted once per replica).
    /// The events are handed over, so a sink that keeps them copies nothing. Must not block.
    fn events(
        &self,
        group: GroupId,
        index: u64,
        now_ms: u64,
        leading: bool,
        events: Vec<lockd_core::LockEvent>,
    ) {
        let _ = (group, index, now_ms, leading, events);
    }
}

/// Serves the embedding server's own node-to-node calls ([`PeerMethod::App`]): a node that
/// hosts no replica of a group asks one that does (a wait's outcome, a read of its state).
/// Called only on a node whose replica of `group` is a member. Answer `NotFound` only to mean
/// "no replica here" (the caller then asks another node).
pub trait AppHandler: Send + Sync + 'static {
    fn serve(
        &self,
        group: GroupId,
        payload: Vec<u8>,
    ) -> futures_util::future::BoxFuture<'static, Result<Vec<u8>, tonic::Status>>;
}

/// An [`EffectSink`] that drops everything (for nodes that serve no waiting clients, and tests).
pub struct NoEffects;

impl EffectSink for NoEffects {
    fn applied(&self, _group: GroupId, _effects: &[lockd_core::Effect]) {}
}
