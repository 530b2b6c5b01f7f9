//! What one node asks another about a group it hosts a member replica of (the embedding
//! server's calls over the peer port, [`lockd_raft::PeerMethod::App`]): the reads ([`Query`],
//! each answered by [`Query::answer`], the same function wherever the replica is), and the
//! [`Ask`] envelope that also carries remote waits and contention reports. Plain data and
//! pure functions: `route.rs` sends them, and serves them from the replicas here.

use lockd_core::BucketSet;
use lockd_core::{
    LockInfo, LockTable, MoveId, MoveRecord, Namespace, OwnershipView, Rejection, SessionId,
    SessionInfo, SessionSummary, WaiterId,
};
use lockd_raft::GroupId;
use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::waits::WaitOutcome;

/// A read of one group's state.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum Query {
    /// A name's holders and waiters, or `wrong_group`/`bucket_moving` if the group does not
    /// serve it now.
    LockInfo {
        name: String,
    },
    SessionInfo {
        session: SessionId,
    },
    SessionPage {
        after: Option<SessionId>,
        limit: usize,
    },
    SessionNamespace {
        session: SessionId,
    },
    Ownership,
    OutgoingMoves,
    MoveRecord {
        move_id: MoveId,
    },
    HasNamespace {
        namespace: Namespace,
    },
    ShardMap,
    IsRetired {
        node: u64,
    },
    /// What a session was opened with: (client, TTL, namespace), to adopt it elsewhere.
    SessionOpening {
        session: SessionId,
    },
    /// The meta group's record of every lock group.
    Groups,
    /// Every namespace the group has.
    Namespaces,
    /// The meta group's draining nodes.
    Draining,
    /// Every namespace the group has, with the namespaces' version (one read, so a
    /// compare-and-set made from it compares what was listed).
    NamespaceConfig,
    /// The group's counters: revision, sessions, locks, holds (for a backup).
    Stats,
    /// The meta group's removed lock groups (id → birth epoch).
    RemovedGroups,
    /// The meta group's record of each node's zone.
    Zones,
    /// A session's queued waits: (name, waiter, ms left).
    SessionWaits {
        session: SessionId,
    },
}

/// The answer to a [`Query`] (the variant of the same name).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum Answer {
    LockInfo(Result<Option<LockInfo>, Rejection>),
    SessionInfo(Option<SessionInfo>),
    SessionPage(Vec<SessionSummary>),
    SessionNamespace(Option<String>),
    Ownership(Box<OwnershipView>),
    OutgoingMoves(Vec<(MoveId, u32, BucketSet)>),
    MoveRecord(Option<Box<MoveRecord>>),
    HasNamespace(bool),
    ShardMap(Option<Box<lockd_core::ShardMap>>),
    IsRetired(bool),
    SessionOpening(Option<(String, u64, String)>),
    Groups(std::collections::BTreeMap<GroupId, lockd_core::GroupRecord>),
    Namespaces(Vec<Namespace>),
    Draining(Vec<u64>),
    NamespaceConfig((u64, Vec<Namespace>)),
    Stats(lockd_core::Stats),
    RemovedGroups(std::collections::BTreeMap<GroupId, u64>),
    Zones(std::collections::BTreeMap<u64, String>),
    SessionWaits(Vec<(String, WaiterId, u64)>),
}

impl Query {
    /// Answers the query from `t` at group time `now_ms`: the one place each read is written.
    pub(crate) fn answer(&self, t: &LockTable, now_ms: u64) -> Answer {
        match self {
            Query::LockInfo { name } => {
                Answer::LockInfo(t.check_serves(name).map(|()| t.lock_info(name, now_ms)))
            }
            Query::SessionInfo { session } => Answer::SessionInfo(t.session_info(*session)),
            Query::SessionPage { after, limit } => {
                Answer::SessionPage(t.session_page(*after, *limit))
            }
            Query::SessionNamespace { session } => {
                Answer::SessionNamespace(t.session_namespace(*session).map(str::to_string))
            }
            Query::Ownership => Answer::Ownership(Box::new(t.ownership())),
            Query::OutgoingMoves => Answer::OutgoingMoves(t.outgoing_moves()),
            Query::MoveRecord { move_id } => {
                Answer::MoveRecord(t.move_record(*move_id).cloned().map(Box::new))
            }
            Query::HasNamespace { namespace } => {
                Answer::HasNamespace(t.namespaces().any(|n| n == namespace))
            }
            Query::ShardMap => Answer::ShardMap(t.shard_map().cloned().map(Box::new)),
            Query::IsRetired { node } => Answer::IsRetired(t.is_retired(*node)),
            Query::SessionOpening { session } => {
                Answer::SessionOpening(t.session_opening(*session))
            }
            Query::Groups => Answer::Groups(t.group_records().clone()),
            Query::Namespaces => Answer::Namespaces(t.namespaces().cloned().collect()),
            Query::Draining => Answer::Draining(t.draining_nodes()),
            Query::NamespaceConfig => {
                Answer::NamespaceConfig((t.namespaces_version(), t.namespaces().cloned().collect()))
            }
            Query::Stats => Answer::Stats(t.stats()),
            Query::RemovedGroups => Answer::RemovedGroups(t.removed_groups().clone()),
            Query::Zones => Answer::Zones(t.zones().clone()),
            Query::SessionWaits { session } => {
                Answer::SessionWaits(t.session_waits(*session, now_ms))
            }
        }
    }
}

/// What a node asks of one that hosts a member replica of the group.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Ask {
    /// A linearizable read; answers `Result<Answer, GroupError>`.
    Query(Query),
    /// Waits up to `limit_ms` for waiter `waiter`'s outcome; answers
    /// `Option<(WaitOutcome, holder on a timeout)>`, `None` if none came in time.
    AwaitWaiter {
        waiter: WaiterId,
        name: String,
        limit_ms: u64,
    },
    /// The group's part of a contention report from the member's replica; answers
    /// `contention::Report`.
    Contention {
        top: usize,
        namespaces: Option<Vec<String>>,
    },
    /// [`Ask::AwaitWaiter`] for a wait a session stream queued: if the ask ends without the
    /// outcome (its node died, or the time ran out), the member does not release a later grant,
    /// since the wait is the session's and its stream may have moved to a node that relays it.
    AwaitStreamWaiter {
        waiter: WaiterId,
        name: String,
        limit_ms: u64,
    },
    /// The node's own report (`status::NodeReport`), addressed to the node
    /// (`lockd_raft::NODE_CALL`) rather than to a group; new variants go last.
    NodeStatus,
}

/// A remote wait's outcome, with the holder on a timeout; `None`: no outcome in time.
pub(crate) type RemoteOutcome = Option<(WaitOutcome, Option<String>)>;

pub(crate) fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, tonic::Status> {
    postcard::to_allocvec(v).map_err(|e| tonic::Status::internal(e.to_string()))
}

pub(crate) fn unexpected(what: &str) -> ApiError {
    ApiError::unexpected(what, None)
}

/// Pulls the answer of the variant named out of `Service::query`'s result.
macro_rules! answer_of {
    ($svc:expr, $route:expr, $q:expr, $variant:ident) => {
        match $svc.query($route, $q).await? {
            $crate::ask::Answer::$variant(v) => Ok::<_, $crate::error::ApiError>(v),
            _ => Err($crate::ask::unexpected(stringify!($variant))),
        }
    };
}
pub(crate) use answer_of;
