//! The vocabulary of the lock protocol: commands in, replies and effects out.
//!
//! Commands are what the Raft log carries, so they are serialisable and own their data. Replies go
//! back to the one caller that proposed the command; effects go to *other* parties the shell must
//! tell (a waiter that was granted, a wait that timed out, a session that ended).

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A session, chosen by the proposer (random, 64-bit) so one id can name the same client's
/// session in every group. The core only insists it is unique within the group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SessionId(pub u64);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s_{:016x}", self.0)
    }
}

impl SessionId {
    /// Parses the `s_<16 hex digits>` form produced by `Display`.
    pub fn parse(s: &str) -> Option<SessionId> {
        let hex = s.strip_prefix("s_")?;
        if hex.is_empty() || hex.len() > 16 {
            return None;
        }
        u64::from_str_radix(hex, 16).ok().map(SessionId)
    }
}

/// A fencing token: the group's revision at the moment of a grant. Unique per grant and rising.
pub type Token = u64;

/// Identifies one queued acquire, so the shell can answer the request that is waiting for it.
/// Assigned by the state machine in enqueue order, so it also encodes FIFO position.
pub type WaiterId = u64;

/// How a lock may be shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LockMode {
    /// One holder.
    Exclusive,
    /// Any number of shared holders, never beside an exclusive one.
    Shared,
    /// Up to `limit` holders, each with its own token. Every user of a name must agree on `limit`.
    Semaphore { limit: u32 },
}

impl LockMode {
    /// A short name for messages and APIs.
    pub fn as_str(&self) -> &'static str {
        match self {
            LockMode::Exclusive => "exclusive",
            LockMode::Shared => "shared",
            LockMode::Semaphore { .. } => "semaphore",
        }
    }
}

impl fmt::Display for LockMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockMode::Semaphore { limit } => write!(f, "semaphore({limit})"),
            other => f.write_str(other.as_str()),
        }
    }
}

/// What a namespace's locks protect, declared up front (seed: "a declared safety class").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SafetyClass {
    /// Two holders at once only cost duplicate work; tokens may be ignored.
    Efficiency,
    /// Two holders would corrupt data; the named resource checks fencing tokens.
    Correctness { fenced_resource: String },
}

/// A team's slice of lock names and the limits the state machine enforces for it.
///
/// Shell-only settings (ops/s budget, auth token) live in the server's namespace config; the core
/// only holds what changes the outcome of a command, so replicas agree on it through the log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespace {
    /// Human name, e.g. `payouts`. The default namespace is called `default`.
    pub name: String,
    /// Names starting with this prefix belong here. Empty for the default namespace, otherwise it
    /// ends with `/` (e.g. `payouts/`). The longest matching prefix wins.
    pub prefix: String,
    /// Smallest session TTL allowed for locks in this namespace.
    pub min_ttl_ms: u64,
    /// Largest session TTL allowed for locks in this namespace.
    pub max_ttl_ms: u64,
    /// TTL given to a session opened for this namespace without one.
    pub default_ttl_ms: u64,
    /// Waiters one name may queue; the next acquire gets `QueueFull`.
    pub max_waiters_per_name: u32,
    /// Locks held plus waits queued by one session in this namespace's names.
    pub max_locks_per_session: u32,
    /// After a holder fails (its session expires) the name stays ungranted this long.
    pub lock_delay_ms: u64,
    /// What the locks protect.
    pub safety: SafetyClass,
    /// Requests per second each node accepts for this namespace's names (0 = unlimited). The
    /// core stores it so every node enforces the same budget; the node's token bucket applies it.
    pub ops_per_s: u32,
    /// The digest of the bearer token callers must present; `None` = open. Only the digest is
    /// replicated, never the token: `s1$SALT$HASH` (the SHA-256 of a random salt and the token,
    /// [`SALTED_DIGEST_PREFIX`]) or, as versions before salting stored it, the token's plain
    /// SHA-256, both lower-case hex.
    pub token_sha256: Option<String>,
    /// Live sessions opened in this namespace a group holds at once (0 = only the group's own
    /// [`crate::limits::MAX_SESSIONS`]). A namespace's sessions open in its home group, so it
    /// is the cluster's cap while that group answers. Only opens count against it: a session
    /// adopted or imported by a group is one the cluster admitted already. (Absent from JSON
    /// written before it: 0.)
    #[serde(default)]
    pub max_sessions: u32,
}

/// A namespace as the log and snapshots stored it before `max_sessions` (snapshot format 8 and
/// older; the `*V8` commands). Postcard is not self-describing, so the old layout keeps its
/// own type.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceV8 {
    pub name: String,
    pub prefix: String,
    pub min_ttl_ms: u64,
    pub max_ttl_ms: u64,
    pub default_ttl_ms: u64,
    pub max_waiters_per_name: u32,
    pub max_locks_per_session: u32,
    pub lock_delay_ms: u64,
    pub safety: SafetyClass,
    pub ops_per_s: u32,
    pub token_sha256: Option<String>,
}

impl Namespace {
    /// The namespace in the layout logs before `max_sessions` used, if it sets no
    /// `max_sessions`: what a command writes then, so replicas of an older version still read
    /// it during a rolling upgrade.
    pub fn as_v8(&self) -> Option<NamespaceV8> {
        (self.max_sessions == 0).then(|| NamespaceV8 {
            name: self.name.clone(),
            prefix: self.prefix.clone(),
            min_ttl_ms: self.min_ttl_ms,
            max_ttl_ms: self.max_ttl_ms,
            default_ttl_ms: self.default_ttl_ms,
            max_waiters_per_name: self.max_waiters_per_name,
            max_locks_per_session: self.max_locks_per_session,
            lock_delay_ms: self.lock_delay_ms,
            safety: self.safety.clone(),
            ops_per_s: self.ops_per_s,
            token_sha256: self.token_sha256.clone(),
        })
    }
}

impl From<NamespaceV8> for Namespace {
    fn from(n: NamespaceV8) -> Namespace {
        Namespace {
            name: n.name,
            prefix: n.prefix,
            min_ttl_ms: n.min_ttl_ms,
            max_ttl_ms: n.max_ttl_ms,
            default_ttl_ms: n.default_ttl_ms,
            max_waiters_per_name: n.max_waiters_per_name,
            max_locks_per_session: n.max_locks_per_session,
            lock_delay_ms: n.lock_delay_ms,
            safety: n.safety,
            ops_per_s: n.ops_per_s,
            token_sha256: n.token_sha256,
            max_sessions: 0,
        }
    }
}

/// How a salted token digest starts (see [`Namespace::token_sha256`]).
pub const SALTED_DIGEST_PREFIX: &str = "s1$";

/// One entry of the replicated log: an operation and the group time at which it applies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command {
    /// Group time stamped by the leader: the last applied `now_ms` advanced by the leader's
    /// monotonic clock. The machine never reads a clock; it clamps this to never go backwards.
    pub now_ms: u64,
    pub op: Op,
}

/// The operations of the lock protocol.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// Start a session. `ttl_ms == 0` takes the namespace's default. `namespace` is a namespace
    /// name (empty = `default`) whose TTL bounds apply.
    OpenSession {
        session: SessionId,
        client: String,
        ttl_ms: u64,
        namespace: String,
    },
    /// Clean shutdown: release every lock and cancel every wait at once, with no lock-delay.
    CloseSession { session: SessionId },
    /// Proposed by the leader for sessions that missed their TTL on its monotonic clock. Frees
    /// their locks (applying lock-delay) and cancels their waits. Unknown ids are ignored.
    ExpireSessions { sessions: Vec<SessionId> },
    /// Take `name`, or queue for it for up to `wait_ms` (0 = try once).
    Acquire {
        session: SessionId,
        name: String,
        owner: String,
        mode: LockMode,
        wait_ms: u64,
        /// Opt-in: the same session and owner may take the lock again and must release as often.
        reentrant: bool,
    },
    /// Give up one hold (one level of re-entry) of `name`; only the holder with this token may.
    Release {
        session: SessionId,
        name: String,
        token: Token,
    },
    /// Confirm that `session` still holds `name` with `token`; the shell then refreshes the
    /// session's lease. The lease itself is the session's, so nothing in the state changes.
    Extend {
        session: SessionId,
        name: String,
        token: Token,
    },
    /// Leader-proposed: drop waiters past their deadline, end lock-delays, grant what is free.
    Tick,
    /// Raise the revision to at least `floor` (a bucket moving in from another group).
    RaiseRevision { floor: u64 },
    /// [`Op::PutNamespace`] as logs before `max_sessions` carry it.
    PutNamespaceV8 { namespace: NamespaceV8 },
    /// Remove the namespace with this prefix (not the default one).
    DeleteNamespace { prefix: String },
    /// Replace the shard map (meta group only); the version must be the current one plus one.
    PutShardMap { map: crate::ShardMap },
    // New variants go last: the log encodes a variant by its index.
    /// The group's first assignment of buckets (from the shard map at `map_version`).
    AssignBuckets {
        buckets: crate::BucketSet,
        map_version: u64,
    },
    /// Move step 1, in the sending group: stop serving `buckets` and export their holders.
    FreezeBuckets {
        move_id: crate::MoveId,
        to_group: u32,
        buckets: crate::BucketSet,
    },
    /// Move step 2, in the receiving group: raise the revision, take the export, serve.
    ImportBuckets {
        move_id: crate::MoveId,
        from_group: u32,
        buckets: crate::BucketSet,
        /// The shard map version that will send the buckets here.
        map_version: u64,
        export: crate::Export,
    },
    /// Abort, receiving side: refuse this move's import for good.
    CancelImport { move_id: crate::MoveId },
    /// Abort, sending side: put the export back and serve the buckets again.
    ThawBuckets { move_id: crate::MoveId },
    /// Move step 4, in the sending group: forget the export and the buckets.
    DropBuckets {
        move_id: crate::MoveId,
        map_version: u64,
    },
    /// Meta group: record the cluster's Raft timing (the first one stands).
    SetClusterTiming { timing: crate::ClusterTiming },
    /// Meta group: node `node` has left every group; its id may never come back.
    RetireNode { node: u64 },
    /// Meta group: the founding lock groups and the nodes each is placed on (once; later a
    /// no-op). See `topology.rs`.
    RecordGroups {
        groups: std::collections::BTreeMap<u32, Vec<u64>>,
    },
    /// Meta group: a lock group created on a running cluster, placed on `replicas`.
    CreateGroup { group: u32, replicas: Vec<u64> },
    /// Meta group: a created group has been founded; it is served from now on.
    GroupReady { group: u32 },
    /// Lock group, first command of one created on a running cluster: born at `born_epoch`,
    /// owning no bucket as of shard map `map_version`.
    FoundGroup { born_epoch: u64, map_version: u64 },
    /// A session opened before this group was born, first used here: open it with the values
    /// it was opened with elsewhere. A no-op if it is open here; refused if it ended here.
    AdoptSession {
        session: SessionId,
        client: String,
        ttl_ms: u64,
        namespace: String,
    },
    /// Meta group: lock group `group` is now on `replicas` (a member was added or removed).
    SetGroupReplicas { group: u32, replicas: Vec<u64> },
    /// Meta group: mark node `node` draining (or not): leader balancing hands it no group,
    /// and the groups it leads go to other voters. See `cluster.rs`.
    SetDraining { node: u64, draining: bool },
    /// [`Op::SeedNamespaces`] as logs before `max_sessions` carry it.
    SeedNamespacesV8 { namespaces: Vec<NamespaceV8> },
    /// Meta group: the admin's change of one namespace, applied only if the namespaces'
    /// version is still `expected_version` (compare-and-set); every change bumps the version.
    ChangeNamespace {
        expected_version: u64,
        change: NamespaceChange,
    },
    /// Meta group: lock group `group` is on `replicas`, as the group's own membership had it at
    /// membership config `placed_at` (or as an admin call is about to make it). Applied only if
    /// `placed_at` is at least the recorded one, so a stale view never overwrites a newer one.
    /// Replaces `SetGroupReplicas`, which stays for logs written before it.
    PlaceGroup {
        group: u32,
        replicas: Vec<u64>,
        placed_at: crate::ConfigId,
    },
    /// Lock group: closed for removal. Refused while the group owns a bucket or a move out of
    /// it is under way; from then on it takes no bucket (an import is refused as cancelled).
    CloseGroup,
    /// Meta group: lock group `group`, closed and owning no bucket, is removed; its id is never
    /// used again.
    RemoveGroup { group: u32 },
    /// Create or replace the namespace with this prefix (a lock group's copy of the meta
    /// group's namespaces).
    PutNamespace { namespace: Namespace },
    /// Meta group: the namespaces a brand-new cluster starts with (a founder's config file).
    /// Applied only while the namespaces were never changed (version 0); later a no-op, so a
    /// node's file never overwrites what the admin API set since.
    SeedNamespaces { namespaces: Vec<Namespace> },
    /// Meta group: node `node` runs on the data dir with this incarnation (a random id made
    /// when the dir was first created). The first one recorded stands; another is refused,
    /// because a node that comes back with another incarnation lost its disk (`cluster.rs`).
    RegisterIncarnation { node: u64, incarnation: u64 },
    /// Meta group: each node's zone (`--zone`), registered by the node at start (a founder
    /// also registers every founder's, from `--initial-zones`). A recorded zone never changes;
    /// a retired id is skipped (`cluster.rs`).
    RegisterZones {
        zones: std::collections::BTreeMap<u64, String>,
    },
    /// [`Op::Acquire`] by a session this group has no lease for: adopt it with the values it
    /// was opened with (`client`, `ttl_ms`, `namespace`, as [`Op::AdoptSession`]) and acquire,
    /// in one step. Unless the acquire is granted or queued the adoption is undone, so a
    /// refused or busy acquire leaves no trace. A session with a lease here already is refused
    /// (`SessionExists`) and nothing changes: a success means this command started the lease.
    AdoptAndAcquire {
        session: SessionId,
        name: String,
        owner: String,
        mode: LockMode,
        wait_ms: u64,
        reentrant: bool,
        client: String,
        ttl_ms: u64,
        namespace: String,
    },
}

impl Op {
    /// An [`Op::Acquire`] as [`Op::AdoptAndAcquire`] with the session's opening values; any
    /// other command unchanged.
    pub fn adopting(self, client: String, ttl_ms: u64, namespace: String) -> Op {
        match self {
            Op::Acquire {
                session,
                name,
                owner,
                mode,
                wait_ms,
                reentrant,
            } => Op::AdoptAndAcquire {
                session,
                name,
                owner,
                mode,
                wait_ms,
                reentrant,
                client,
                ttl_ms,
                namespace,
            },
            other => other,
        }
    }

    /// About how many bytes the command takes in an entry: its strings and lists, plus a
    /// fixed allowance. Cheap (no encoding), for bounding entries in bytes as well as commands.
    pub fn approx_bytes(&self) -> usize {
        const FIXED: usize = 64;
        let strings = match self {
            Op::OpenSession {
                client, namespace, ..
            }
            | Op::AdoptSession {
                client, namespace, ..
            } => client.len() + namespace.len(),
            Op::Acquire { name, owner, .. } => name.len() + owner.len(),
            Op::AdoptAndAcquire {
                name,
                owner,
                client,
                namespace,
                ..
            } => name.len() + owner.len() + client.len() + namespace.len(),
            Op::Release { name, .. } | Op::Extend { name, .. } => name.len(),
            Op::ExpireSessions { sessions } => 8 * sessions.len(),
            Op::PutShardMap { map } => 4 * map.groups.len(),
            Op::ImportBuckets { export, .. } => {
                let sessions: usize = export
                    .sessions
                    .iter()
                    .map(|s| 32 + s.client.len() + s.namespace.len())
                    .sum();
                let locks: usize = export
                    .locks
                    .iter()
                    .map(|l| {
                        let holders: usize = l.holders.iter().map(|h| 48 + h.owner.len()).sum();
                        16 + l.name.len() + holders
                    })
                    .sum();
                crate::BUCKETS as usize / 8 + sessions + locks
            }
            Op::PutNamespace { namespace } => namespace.name.len() + namespace.prefix.len() + 256,
            Op::SeedNamespaces { namespaces } => namespaces.len() * 384,
            Op::SeedNamespacesV8 { namespaces } => namespaces.len() * 384,
            Op::RecordGroups { groups } => groups.values().map(|r| 12 + 8 * r.len()).sum(),
            Op::RegisterZones { zones } => zones.values().map(|z| 8 + z.len()).sum(),
            _ => 0,
        };
        FIXED + strings
    }

    /// [`Op::PutNamespace`], or its older layout when that says the same (see
    /// [`Namespace::as_v8`]).
    pub fn put_namespace(namespace: Namespace) -> Op {
        match namespace.as_v8() {
            Some(namespace) => Op::PutNamespaceV8 { namespace },
            None => Op::PutNamespace { namespace },
        }
    }

    /// [`Op::SeedNamespaces`], or its older layout when that says the same.
    pub fn seed_namespaces(namespaces: Vec<Namespace>) -> Op {
        match namespaces.iter().map(Namespace::as_v8).collect() {
            Some(namespaces) => Op::SeedNamespacesV8 { namespaces },
            None => Op::SeedNamespaces { namespaces },
        }
    }

    /// Commands only a group's leader proposes, from its own duties (expiry, ticks, a restored
    /// node raising the groups it leads to the backup's floor): a peer may forward every other command
    /// to the leader, never one of these. A node that took them from the peer port would let
    /// anyone who reaches it expire others' sessions or push the revision to wrap.
    pub fn leader_only(&self) -> bool {
        matches!(
            self,
            Op::Tick | Op::ExpireSessions { .. } | Op::RaiseRevision { .. }
        )
    }

    /// Whether node `from`, not a member of any group yet (a joiner waiting to be added), may
    /// propose this command through a member's peer port: only the records a node's start
    /// writes about itself, so that a joiner with the wrong Raft timing or a wiped disk is
    /// refused before it is added. The first timing recorded stands, and an incarnation is
    /// recorded once, so neither can be changed this way.
    pub fn stranger_may_propose(&self, from: u64) -> bool {
        match self {
            Op::SetClusterTiming { .. } => true,
            Op::RegisterIncarnation { node, .. } => *node == from,
            Op::RegisterZones { zones } => zones.len() == 1 && zones.contains_key(&from),
            _ => false,
        }
    }

    /// Whether a node ever forwards this command to a group of this kind (`meta`: the meta
    /// group), so that the peer port may take it. The meta group takes no copy of a namespace
    /// (its namespaces change by compare-and-set, [`Op::ChangeNamespace`]), and a lock group
    /// takes none of the meta group's records. [`Op::SetGroupReplicas`] is written by no node
    /// any more (only replayed from old logs).
    pub fn forwarded_to(&self, meta: bool) -> bool {
        let meta_only = matches!(
            self,
            Op::PutShardMap { .. }
                | Op::SetClusterTiming { .. }
                | Op::RetireNode { .. }
                | Op::RecordGroups { .. }
                | Op::CreateGroup { .. }
                | Op::GroupReady { .. }
                | Op::SetDraining { .. }
                | Op::SeedNamespacesV8 { .. }
                | Op::SeedNamespaces { .. }
                | Op::ChangeNamespace { .. }
                | Op::PlaceGroup { .. }
                | Op::RemoveGroup { .. }
                | Op::RegisterIncarnation { .. }
                | Op::RegisterZones { .. }
        );
        let copies = matches!(
            self,
            Op::PutNamespaceV8 { .. } | Op::PutNamespace { .. } | Op::DeleteNamespace { .. }
        );
        let retired = matches!(self, Op::SetGroupReplicas { .. });
        !retired && if meta { !copies } else { !meta_only }
    }
}

/// One change of the namespace set ([`Op::ChangeNamespace`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NamespaceChange {
    /// [`NamespaceChange::Put`] as logs before `max_sessions` carry it.
    PutV8(NamespaceV8),
    /// Remove the namespace with this prefix (not the default one).
    Delete { prefix: String },
    /// Create or replace the namespace with this prefix.
    Put(Namespace),
}

impl NamespaceChange {
    /// [`NamespaceChange::Put`], or its older layout when that says the same.
    pub fn put(namespace: Namespace) -> NamespaceChange {
        match namespace.as_v8() {
            Some(old) => NamespaceChange::PutV8(old),
            None => NamespaceChange::Put(namespace),
        }
    }
}

/// The holder of a lock as callers see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderView {
    pub session: SessionId,
    pub owner: String,
    pub token: Token,
}

/// Why a try-lock did not get the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BusyReason {
    /// Held in an incompatible mode, or others queue ahead.
    Held,
    /// The last holder failed; the name is ungranted until `until_ms` (group time).
    LockDelay { until_ms: u64 },
}

/// The successful outcome of a command, for the caller that proposed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    SessionOpened {
        session: SessionId,
        ttl_ms: u64,
    },
    SessionClosed {
        released: u32,
        cancelled_waits: u32,
    },
    /// The sessions that existed and are now gone (unknown ids are left out).
    SessionsExpired {
        expired: Vec<SessionId>,
    },
    /// Granted now. `reentry` is the hold count (1 for a first grant). `group_moves` is the
    /// group's [`LockTable::move_count`](crate::LockTable::move_count) at the grant: while the
    /// group still reports that count, the hold has not left it (docs/API.md, per-group leases).
    Acquired {
        token: Token,
        lease_ttl_ms: u64,
        reentry: u32,
        group_moves: u64,
    },
    /// Queued; `position` counts from 1 at the head. A `Granted` or `WaitEnded` effect follows.
    Queued {
        waiter: WaiterId,
        position: u32,
        deadline_ms: u64,
    },
    /// A try-lock (`wait_ms == 0`) that could not be granted now.
    Busy {
        holder: Option<HolderView>,
        queue_len: u32,
        reason: BusyReason,
    },
    /// One hold given up; `remaining` re-entries are still held (0 = the lock is released).
    Released {
        remaining: u32,
    },
    Extended {
        lease_ttl_ms: u64,
    },
    Ticked {
        timed_out: u32,
        delays_ended: u32,
    },
    RevisionRaised {
        revision: u64,
    },
    NamespacePut,
    NamespaceDeleted,
    ShardMapPut {
        version: u64,
    },
    BucketsAssigned {
        buckets: u32,
    },
    /// `locks` names with `holders` holders went into the export; `waits_ended` waits were
    /// ended with reason `Moved` (to re-queue at the new owner).
    BucketsFrozen {
        locks: u32,
        holders: u32,
        waits_ended: u32,
    },
    /// `revision` is the group's revision after the import (at least the export's).
    BucketsImported {
        locks: u32,
        sessions_adopted: u32,
        revision: u64,
    },
    ImportCancelled,
    /// `dropped` holders were not put back: their session ended during the freeze.
    BucketsThawed {
        restored: u32,
        dropped: u32,
    },
    BucketsDropped,
    ClusterTimingSet {
        timing: crate::ClusterTiming,
    },
    NodeRetired {
        node: u64,
    },
    GroupsRecorded {
        groups: u32,
    },
    GroupRecorded {
        group: u32,
        record: crate::GroupRecord,
    },
    GroupFounded {
        born_epoch: u64,
    },
    DrainingSet {
        node: u64,
        draining: bool,
    },
    /// The namespaces are at `version` now; `changed`: this command changed them (a seed of a
    /// cluster whose namespaces were set already changes nothing).
    NamespacesAt {
        version: u64,
        changed: bool,
    },
    /// This lock group is closed for removal.
    GroupClosed,
    /// Lock group `group` is removed (or was already).
    GroupRemoved {
        group: u32,
    },
    /// The node's incarnation is the recorded one (recorded now or before).
    IncarnationRegistered {
        node: u64,
        incarnation: u64,
    },
    /// The zones given are recorded (now or before); retired ids among them were skipped.
    ZonesRegistered,
}

/// Why a wait ended without a grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitEndReason {
    /// A committed tick found it past its deadline.
    TimedOut,
    /// Its session was closed or expired.
    SessionEnded,
    /// The name's bucket moved to another group: queue again there.
    Moved,
}

/// Why a session ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionEndReason {
    Closed,
    Expired,
}

/// Why a hold ended (moves aside: see [`LockEvent::HoldMovedOut`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldEndCause {
    /// Its holder released it (the last re-entry).
    Released,
    /// Its session was closed.
    Closed,
    /// Its session's lease ran out (the name may take a lock-delay).
    Expired,
    /// Its session ended while the hold was away with a bucket move that was then aborted: the
    /// thaw brings it back (`HoldMovedIn`) and ends it at once, with the namespace's lock-delay.
    Dropped,
}

impl HoldEndCause {
    /// The cause as one word, the same in the audit log, watch events, metrics labels and the
    /// checkers: `release`, `close`, `expire` or `dropped`.
    pub fn as_str(self) -> &'static str {
        match self {
            HoldEndCause::Released => "release",
            HoldEndCause::Closed => "close",
            HoldEndCause::Expired => "expire",
            HoldEndCause::Dropped => "dropped",
        }
    }
}

impl SessionEndReason {
    /// The reason as one word, as [`HoldEndCause::as_str`] spells it: `close` or `expire`.
    pub fn as_str(self) -> &'static str {
        HoldEndCause::from(self).as_str()
    }
}

impl From<SessionEndReason> for HoldEndCause {
    fn from(r: SessionEndReason) -> HoldEndCause {
        match r {
            SessionEndReason::Closed => HoldEndCause::Closed,
            SessionEndReason::Expired => HoldEndCause::Expired,
        }
    }
}

/// One change of who holds or waits for a name, emitted by the core at the one place that makes
/// it, in the order it makes them. The audit log, the push to waiting clients ([`Effect`]),
/// metrics and the simulator's checks are all derived from these alone.
///
/// They pair up (checked by `tests/events.rs` against the table after every command):
/// - a hold, keyed by (name, token), starts with `HoldStarted` or `HoldMovedIn` and ends with
///   exactly one `HoldEnded` or `HoldMovedOut`; re-entries and extends are not events;
/// - a wait, keyed by its `WaiterId`, starts with `WaitStarted` and ends with exactly one
///   `WaitEnded` or the `HoldStarted` that names it in `waiter`;
/// - a session's `SessionEnded` comes after the ends of all its holds and waits.
///
/// A waiter's queue position is not an event of its own: it is its `WaitStarted` position less
/// the waits ahead of it that ended since, which a watcher of the name sees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockEvent {
    /// `session` holds `name` with `token` from now. `waiter` names the queued acquire that this
    /// grant ends (None: granted at once) and `waited_ms` how long it was queued (group time);
    /// `lease_ttl_ms` is the session's TTL.
    HoldStarted {
        name: Arc<str>,
        session: SessionId,
        owner: Box<str>,
        token: Token,
        mode: LockMode,
        waiter: Option<WaiterId>,
        waited_ms: u64,
        lease_ttl_ms: u64,
    },
    /// The hold `(name, token)` ended after `held_ms` of group time (its time in other groups
    /// included, for a hold that moved). `lock_delay_until_ms` is the group time until which
    /// the name is granted to nobody because of this end (0: no lock-delay).
    HoldEnded {
        name: Arc<str>,
        session: SessionId,
        token: Token,
        cause: HoldEndCause,
        held_ms: u64,
        lock_delay_until_ms: u64,
    },
    /// The hold left this group with its bucket (a move's freeze): it lives on in the receiving
    /// group, token verbatim.
    HoldMovedOut {
        name: Arc<str>,
        session: SessionId,
        token: Token,
    },
    /// The hold arrived with a bucket move (import) or came back when the move was aborted
    /// (thaw): the same hold, not a new grant.
    HoldMovedIn {
        name: Arc<str>,
        session: SessionId,
        owner: Box<str>,
        token: Token,
        mode: LockMode,
    },
    /// A queued acquire, `position` in the queue (1 = next), until group time `deadline_ms`.
    WaitStarted {
        name: Arc<str>,
        waiter: WaiterId,
        session: SessionId,
        owner: Box<str>,
        mode: LockMode,
        position: u32,
        deadline_ms: u64,
    },
    /// A queued acquire ended without a grant, after `waited_ms` of group time.
    WaitEnded {
        name: Arc<str>,
        waiter: WaiterId,
        session: SessionId,
        reason: WaitEndReason,
        waited_ms: u64,
    },
    /// A session ended, after its holds (`released` of them) and waits.
    SessionEnded {
        session: SessionId,
        reason: SessionEndReason,
        released: u32,
    },
    /// A bucket import (or an adopt) brought a session this group did not have, or an import
    /// restarted the lease of one it had: its lease here runs `ttl_ms` from now.
    SessionAdopted { session: SessionId, ttl_ms: u64 },
}

impl Effect {
    /// What of `event` the shell must push to a party other than the proposer, if anything;
    /// `group_moves` is the group's move count after the command.
    pub fn of(event: &LockEvent, group_moves: u64) -> Option<Effect> {
        Some(match event {
            LockEvent::HoldStarted {
                name,
                session,
                token,
                waiter: Some(waiter),
                lease_ttl_ms,
                ..
            } => Effect::Granted {
                waiter: *waiter,
                session: *session,
                name: name.clone(),
                token: *token,
                lease_ttl_ms: *lease_ttl_ms,
                group_moves,
            },
            LockEvent::WaitEnded {
                name,
                waiter,
                session,
                reason,
                ..
            } => Effect::WaitEnded {
                waiter: *waiter,
                session: *session,
                name: name.clone(),
                reason: *reason,
            },
            LockEvent::SessionEnded {
                session,
                reason,
                released,
            } => Effect::SessionEnded {
                session: *session,
                reason: *reason,
                released: *released,
            },
            LockEvent::SessionAdopted { session, ttl_ms } => Effect::SessionAdopted {
                session: *session,
                ttl_ms: *ttl_ms,
            },
            _ => return None,
        })
    }
}

/// Something the shell must tell a party other than the proposer of the command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// A queued acquire was granted: push it to the waiting request or stream.
    Granted {
        waiter: WaiterId,
        session: SessionId,
        name: Arc<str>,
        token: Token,
        lease_ttl_ms: u64,
        /// The group's move count at the grant (see [`Reply::Acquired`]).
        group_moves: u64,
    },
    /// A queued acquire ended without a grant.
    WaitEnded {
        waiter: WaiterId,
        session: SessionId,
        name: Arc<str>,
        reason: WaitEndReason,
    },
    /// A session is gone, with the number of locks it held.
    SessionEnded {
        session: SessionId,
        reason: SessionEndReason,
        released: u32,
    },
    /// A bucket import brought a session this group did not have: its leader starts its lease.
    SessionAdopted { session: SessionId, ttl_ms: u64 },
}

/// A command refused. The state is exactly as before the command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Rejection {
    /// `field` is empty, too long, or not printable UTF-8.
    InvalidString {
        field: String,
        reason: String,
        max_bytes: usize,
    },
    /// A TTL outside the namespace's bounds.
    TtlOutOfRange {
        ttl_ms: u64,
        min_ms: u64,
        max_ms: u64,
        namespace: String,
    },
    /// `wait_ms` above the limit.
    WaitTooLong {
        wait_ms: u64,
        max_ms: u64,
    },
    /// A semaphore limit of 0 or above the limit.
    InvalidSemaphoreLimit {
        limit: u32,
        max: u32,
    },
    /// A semaphore name used with another mode or limit, or the other way round.
    ModeConflict {
        held: LockMode,
        requested: LockMode,
    },
    UnknownSession {
        session: SessionId,
    },
    SessionExists {
        session: SessionId,
    },
    UnknownNamespace {
        name: String,
    },
    /// The session does not hold this name (release/extend).
    NotHolder {
        session: SessionId,
        name: String,
    },
    /// The session holds the name, but under another token: this token is stale.
    StaleToken {
        token: Token,
        current: Token,
    },
    /// Held already by this session and owner, and re-entry was not asked for (or not allowed).
    AlreadyHeld {
        token: Token,
    },
    /// This session and owner already wait for the name.
    AlreadyWaiting {
        waiter: WaiterId,
    },
    /// The name's queue is full.
    QueueFull {
        limit: u32,
        retry_after_ms: u64,
    },
    /// The session holds or waits for as many names as the namespace allows.
    TooManyLocks {
        limit: u32,
    },
    /// Re-entry count at its limit.
    TooManyReentries {
        max: u32,
    },
    /// A namespace definition that breaks a rule.
    InvalidNamespace {
        reason: String,
    },
    /// A shard map that breaks a rule.
    InvalidShardMap {
        reason: String,
    },
    // New variants go last: the wire and the log encode a variant by its index.
    /// The name lies in another namespace than the one the session was opened in.
    WrongNamespace {
        session_namespace: String,
        name_namespace: String,
    },
    /// A counter of the group would pass its limit: a grant needs `revision` (the source of
    /// fencing tokens) `value` or a queued acquire needs `waiter_id` `value`, above `max`; or a
    /// `RaiseRevision` `floor` is above [`crate::limits::MAX_REVISION`]. Nothing changed, and
    /// retrying the same command does not help.
    CounterLimit {
        field: String,
        value: u64,
        max: u64,
    },
    /// The name's bucket is not this group's (at shard map `map_version`): route again.
    WrongGroup {
        bucket: u16,
        map_version: u64,
    },
    /// The name's bucket is frozen for a move to another group: retry shortly.
    BucketMoving {
        bucket: u16,
    },
    /// A bucket move step that does not fit the move's state here.
    MoveConflict {
        move_id: u64,
        reason: String,
    },
    /// No move with this id took place here.
    UnknownMove {
        move_id: u64,
    },
    /// A node's Raft timing is not the cluster's (recorded by the first node to start).
    ClusterTimingMismatch {
        cluster: crate::ClusterTiming,
        given: crate::ClusterTiming,
    },
    /// Not 0 < heartbeat < election minimum < election maximum.
    InvalidClusterTiming {
        given: crate::ClusterTiming,
    },
    /// The node id left the cluster for good; ids are never reused.
    NodeRetired {
        node: u64,
    },
    /// The session was opened before this group was born and never came here: adopt it here
    /// (`Op::AdoptSession`) and repeat the command. The service does this by itself.
    SessionNotHere {
        session: SessionId,
    },
    /// The group exists already with another placement.
    GroupExists {
        group: u32,
        replicas: Vec<u64>,
    },
    /// Another group's creation is not finished: groups are created one at a time.
    GroupBeingCreated {
        group: u32,
    },
    /// No lock group has this id.
    UnknownGroup {
        group: u32,
    },
    /// A group creation or founding that breaks a rule.
    InvalidGroup {
        reason: String,
    },
    /// A namespace change read another version of the namespaces than the current one.
    NamespaceVersionConflict {
        expected: u64,
        current: u64,
    },
    /// The group holds as many live sessions as it may ([`crate::limits::MAX_SESSIONS`]).
    TooManySessions {
        limit: usize,
    },
    /// The namespace holds as many live sessions as its `max_sessions` allows.
    NamespaceSessionsFull {
        namespace: String,
        limit: u32,
    },
    /// The group still owns buckets (or is moving some out), so it cannot be removed.
    GroupNotEmpty {
        reason: String,
    },
    /// The group was removed; group ids are never reused.
    GroupRemoved {
        group: u32,
    },
    /// The cluster knows node `node` by another data dir: this one is new (a wiped or
    /// replaced disk), and a voter that forgot its log and its vote must not come back.
    IncarnationMismatch {
        node: u64,
        known: u64,
        given: u64,
    },
    /// Node `node` is recorded in zone `known`: a node never changes zone.
    ZoneMismatch {
        node: u64,
        known: String,
        given: String,
    },
    /// A zone name that is empty or longer than `max` bytes.
    InvalidZone {
        node: u64,
        max: usize,
    },
    /// The namespaces without a token hold as many live sessions together as they may
    /// ([`crate::limits::MAX_OPEN_NAMESPACE_SESSIONS`]); the rest are kept for namespaces with one.
    OpenSessionsFull {
        limit: usize,
    },
}

impl Rejection {
    /// A stable machine-readable code, used by the APIs.
    pub fn code(&self) -> &'static str {
        match self {
            Rejection::InvalidString { .. } => "invalid_argument",
            Rejection::TtlOutOfRange { .. } => "ttl_out_of_range",
            Rejection::WaitTooLong { .. } => "wait_too_long",
            Rejection::InvalidSemaphoreLimit { .. } => "invalid_semaphore_limit",
            Rejection::ModeConflict { .. } => "mode_conflict",
            Rejection::UnknownSession { .. } => "session_not_found",
            Rejection::SessionExists { .. } => "session_exists",
            Rejection::UnknownNamespace { .. } => "namespace_not_found",
            Rejection::WrongNamespace { .. } => "wrong_namespace",
            Rejection::NotHolder { .. } => "not_holder",
            Rejection::StaleToken { .. } => "stale_token",
            Rejection::AlreadyHeld { .. } => "already_held",
            Rejection::AlreadyWaiting { .. } => "already_waiting",
            Rejection::QueueFull { .. } => "queue_full",
            Rejection::TooManyLocks { .. } => "too_many_locks",
            Rejection::TooManyReentries { .. } => "too_many_reentries",
            Rejection::InvalidNamespace { .. } => "invalid_namespace",
            Rejection::InvalidShardMap { .. } => "invalid_shard_map",
            Rejection::CounterLimit { .. } => "counter_limit",
            Rejection::WrongGroup { .. } => "wrong_group",
            Rejection::BucketMoving { .. } => "bucket_moving",
            Rejection::MoveConflict { .. } => "move_conflict",
            Rejection::UnknownMove { .. } => "move_not_found",
            Rejection::ClusterTimingMismatch { .. } => "cluster_timing_mismatch",
            Rejection::InvalidClusterTiming { .. } => "invalid_cluster_timing",
            Rejection::NodeRetired { .. } => "node_retired",
            Rejection::IncarnationMismatch { .. } => "member_change_refused",
            Rejection::ZoneMismatch { .. } => "member_change_refused",
            Rejection::InvalidZone { .. } => "invalid_argument",
            Rejection::SessionNotHere { .. } => "session_not_here",
            Rejection::GroupExists { .. } => "group_exists",
            Rejection::GroupBeingCreated { .. } => "group_creation_in_progress",
            Rejection::UnknownGroup { .. } => "group_not_found",
            Rejection::InvalidGroup { .. } => "invalid_group",
            Rejection::GroupNotEmpty { .. } => "group_not_empty",
            Rejection::GroupRemoved { .. } => "group_removed",
            Rejection::NamespaceVersionConflict { .. } => "namespace_version_conflict",
            Rejection::TooManySessions { .. } => "too_many_sessions",
            Rejection::NamespaceSessionsFull { .. } => "too_many_sessions",
            Rejection::OpenSessionsFull { .. } => "too_many_sessions",
        }
    }
}

/// "1 live session", "250000 live sessions": a session count in an error message.
fn live_sessions(n: u64) -> String {
    if n == 1 {
        "1 live session".to_string()
    } else {
        format!("{n} live sessions")
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::InvalidString {
                field,
                reason,
                max_bytes,
            } => {
                write!(
                    f,
                    "{field} {reason} (must be 1..={max_bytes} bytes of printable UTF-8)"
                )
            }
            Rejection::TtlOutOfRange {
                ttl_ms,
                min_ms,
                max_ms,
                namespace,
            } => write!(
                f,
                "ttl {ttl_ms} ms is outside namespace '{namespace}' bounds {min_ms}..={max_ms} ms"
            ),
            Rejection::WaitTooLong { wait_ms, max_ms } => {
                write!(f, "wait_ms {wait_ms} exceeds the limit of {max_ms}")
            }
            Rejection::InvalidSemaphoreLimit { limit, max } => {
                write!(f, "semaphore limit {limit} must be within 1..={max}")
            }
            Rejection::ModeConflict { held, requested } => {
                write!(
                    f,
                    "mode {requested} conflicts with mode {held} already in use on this name"
                )
            }
            Rejection::UnknownSession { session } => {
                write!(f, "session {session} does not exist or has expired")
            }
            Rejection::SessionExists { session } => write!(f, "session {session} already exists"),
            Rejection::UnknownNamespace { name } => write!(f, "namespace '{name}' does not exist"),
            Rejection::WrongNamespace {
                session_namespace,
                name_namespace,
            } => write!(
                f,
                "the session belongs to namespace '{session_namespace}' and cannot take names of \
                 namespace '{name_namespace}'; open a session in that namespace"
            ),
            Rejection::NotHolder { session, name } => {
                write!(f, "session {session} does not hold '{name}'")
            }
            Rejection::StaleToken { token, current } => {
                write!(
                    f,
                    "token {token} is stale; the session holds this name with token {current}"
                )
            }
            Rejection::AlreadyHeld { token } => write!(
                f,
                "this session and owner already hold the lock (token {token}); ask for reentrant"
            ),
            Rejection::AlreadyWaiting { waiter } => {
                write!(
                    f,
                    "this session and owner already wait for the lock (waiter {waiter})"
                )
            }
            Rejection::QueueFull {
                limit,
                retry_after_ms,
            } => write!(
                f,
                "the queue for this name is full ({limit} waiters); retry after {retry_after_ms} ms"
            ),
            Rejection::TooManyLocks { limit } => {
                write!(
                    f,
                    "the session holds or waits for {limit} locks, the namespace's limit"
                )
            }
            Rejection::TooManyReentries { max } => {
                write!(f, "re-entry count is at its limit of {max}")
            }
            Rejection::InvalidNamespace { reason } => write!(f, "invalid namespace: {reason}"),
            Rejection::InvalidShardMap { reason } => write!(f, "invalid shard map: {reason}"),
            Rejection::CounterLimit { field, value, max } => write!(
                f,
                "{field} {value} exceeds its limit of {max}; nothing changed"
            ),
            Rejection::WrongGroup {
                bucket,
                map_version,
            } => write!(
                f,
                "bucket {bucket} is not served by this group (its buckets are as of shard map \
                 version {map_version}); route by the current shard map"
            ),
            Rejection::BucketMoving { bucket } => write!(
                f,
                "bucket {bucket} is moving to another group; retry in a moment"
            ),
            Rejection::MoveConflict { move_id, reason } => {
                write!(f, "bucket move {move_id} refused: {reason}")
            }
            Rejection::UnknownMove { move_id } => {
                write!(f, "no bucket move {move_id} took place in this group")
            }
            Rejection::ClusterTimingMismatch { cluster, given } => write!(
                f,
                "this node's Raft timing ({given}) is not the cluster's ({cluster}): the lease \
                 hand-over needs every node to use the same; start it with the cluster's \
                 --heartbeat-ms and --election-timeout-ms"
            ),
            Rejection::InvalidClusterTiming { given } => write!(
                f,
                "timing {given} is invalid: need 0 < heartbeat < election minimum < maximum"
            ),
            Rejection::NodeRetired { node } => write!(
                f,
                "node id {node} left this cluster for good, and a node id is never reused: start \
                 the node with a new --node-id and an empty data dir"
            ),
            r @ (Rejection::IncarnationMismatch { .. }
            | Rejection::ZoneMismatch { .. }
            | Rejection::InvalidZone { .. }) => f.write_str(&r.node_record_message()),
            Rejection::SessionNotHere { session } => write!(
                f,
                "session {session} is older than this group and has not been used here yet"
            ),
            Rejection::GroupExists { group, replicas } => write!(
                f,
                "group {group} exists already, placed on nodes {replicas:?}"
            ),
            Rejection::GroupBeingCreated { group } => write!(
                f,
                "group {group} is still being created (groups are created one at a time): \
                 finish it by repeating its create call, then create the next"
            ),
            Rejection::UnknownGroup { group } => write!(f, "there is no lock group {group}"),
            Rejection::InvalidGroup { reason } => write!(f, "invalid group: {reason}"),
            Rejection::GroupNotEmpty { reason } => write!(f, "group: {reason}"),
            Rejection::GroupRemoved { group } => write!(
                f,
                "group: lock group {group} was removed, and a group id is never reused; \
                 create the group under a new id"
            ),
            Rejection::TooManySessions { limit } => write!(
                f,
                "session: the cluster holds {}, its limit; close idle ones \
                 (one per process is enough) or retry later",
                live_sessions(*limit as u64)
            ),
            Rejection::NamespaceSessionsFull { namespace, limit } => write!(
                f,
                "session: namespace '{namespace}' holds {}, its max_sessions; close idle \
                 ones (one per process is enough), ask the admin for more, or retry later",
                live_sessions(u64::from(*limit))
            ),
            Rejection::OpenSessionsFull { limit } => write!(
                f,
                "session: the namespaces without a token hold {} together, their share of the \
                 cluster's (the rest is kept for namespaces with a token); close idle ones (one \
                 per process is enough), use a namespace with a token, or retry later",
                live_sessions(*limit as u64)
            ),
            Rejection::NamespaceVersionConflict { expected, current } => write!(
                f,
                "expected_version: the namespaces are at version {current}, not {expected}; \
                 read them again and retry"
            ),
        }
    }
}

impl std::error::Error for Rejection {}

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

impl Rejection {
    /// The message of a refused record of a node (its incarnation or its zone).
    fn node_record_message(&self) -> String {
        match self {
            Rejection::IncarnationMismatch { node, known, given } => {
                wiped_disk_message(*node, *known, *given)
            }
            Rejection::ZoneMismatch { node, known, given } => format!(
                "node {node} is recorded in zone '{known}', not '{given}': a node never changes \
                 zone (one that moved joins as a new node: `lockctl members replace`)"
            ),
            Rejection::InvalidZone { node, max } => {
                format!("zones: node {node}'s zone must be 1-{max} characters")
            }
            _ => self.to_string(),
        }
    }
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
