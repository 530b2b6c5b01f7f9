//! What the operators' calls answer (status, sessions, members, buckets, groups, namespaces), in
//! this crate's own types: the generated protobuf types stay behind the client, so a change of
//! the wire format is not a change of this API. Field names follow the proto's.

use lockd_proto::v1 as pb;

/// One node's view ([`Client::status`](crate::Client::status)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeStatus {
    /// The node answering.
    pub node_id: u64,
    /// Its process id.
    pub pid: u32,
    /// Every group it hosts.
    pub groups: Vec<GroupStatus>,
    /// Whether it serves names and sessions (false until its meta replica has caught up).
    pub serving_names: bool,
}

/// One group as a node sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupStatus {
    /// 0 = the meta group; 1.. = lock groups.
    pub id: u32,
    /// The leader's node id (0 = unknown).
    pub leader: u64,
    /// The Raft term.
    pub term: u64,
    /// The voters.
    pub members: Vec<u64>,
    /// The last log index applied here.
    pub applied_index: u64,
    /// The latest fencing token the group minted.
    pub revision: u64,
    /// The voter leadership is handed to (0 = leader balance is off).
    pub preferred_leader: u64,
}

/// One member node's own report in a cluster status
/// ([`Client::cluster_status`](crate::Client::cluster_status)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeReport {
    /// The node's id.
    pub node_id: u64,
    /// Its peer address, as the group memberships record it.
    pub peer_addr: String,
    /// Why it gave no report (unreachable, no answer in time, a version that cannot report);
    /// the fields below are then empty.
    pub error: Option<String>,
    /// Its zone (empty: none declared).
    pub zone: String,
    /// The lockd version it runs.
    pub version: String,
    /// Its process id.
    pub pid: u32,
    /// Seconds since it started.
    pub uptime_s: u64,
    /// What its `/readyz` says, and why not.
    pub ready: bool,
    /// Why it is not ready (empty when it is).
    pub not_ready: Vec<String>,
    /// Every group replica it hosts.
    pub replicas: Vec<ReplicaReport>,
}

/// One replica of one group, as its node reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaReport {
    /// 0 = the meta group; 1.. = lock groups.
    pub group: u32,
    /// `leader`, `follower` or `learner`.
    pub role: String,
    /// The leader it knows of (0 = none).
    pub leader: u64,
    /// The Raft term it knows.
    pub term: u64,
    /// The group's commit index as it last heard it.
    pub committed_index: Option<u64>,
    /// The last log index applied there.
    pub applied_index: u64,
    /// The group's fencing-token revision as applied there.
    pub revision: u64,
    /// Its log on disk (`None`: in-memory storage).
    pub log_bytes: Option<u64>,
    /// Its last snapshot on disk (`None`: in-memory storage).
    pub snapshot_bytes: Option<u64>,
}

impl From<pb::NodeStatusReport> for NodeReport {
    fn from(r: pb::NodeStatusReport) -> Self {
        NodeReport {
            node_id: r.node_id,
            peer_addr: r.peer_addr,
            error: (!r.error.is_empty()).then_some(r.error),
            zone: r.zone,
            version: r.version,
            pid: r.pid,
            uptime_s: r.uptime_s,
            ready: r.ready,
            not_ready: r.not_ready,
            replicas: (r.replicas.into_iter())
                .map(|x| ReplicaReport {
                    group: x.group,
                    role: x.role,
                    leader: x.leader,
                    term: x.term,
                    committed_index: x.committed_index,
                    applied_index: x.applied_index,
                    revision: x.revision,
                    log_bytes: x.log_bytes,
                    snapshot_bytes: x.snapshot_bytes,
                })
                .collect(),
        }
    }
}

/// One session's holds and waits ([`Client::get_session`](crate::Client::get_session)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionDetail {
    /// The session's id.
    pub session_id: String,
    /// The client name it was opened with.
    pub client: String,
    /// Its TTL.
    pub ttl_ms: u64,
    /// Its holds, by group, then name.
    pub held: Vec<HeldLock>,
    /// Its queued acquires.
    pub waits: Vec<QueuedWait>,
    /// Lock groups that could not answer (no quorum): holds and waits there are not listed.
    pub unavailable_groups: Vec<u32>,
}

/// A hold of a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldLock {
    /// The lock's name.
    pub name: String,
    /// The hold's fencing token.
    pub fencing_token: u64,
    /// The lock group holding it.
    pub group: u32,
}

/// A queued acquire of a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedWait {
    /// The lock's name.
    pub name: String,
    /// 1 = the head of the queue.
    pub queue_position: u32,
    /// The lock group queueing it.
    pub group: u32,
}

/// A session in a listing ([`Client::list_sessions`](crate::Client::list_sessions)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionSummary {
    /// The session's id.
    pub session_id: String,
    /// The client name it was opened with.
    pub client: String,
    /// Its TTL.
    pub ttl_ms: u64,
    /// Locks held, over every group.
    pub held: u32,
    /// Waits queued, over every group.
    pub waits: u32,
}

/// Every group's members ([`Client::list_members`](crate::Client::list_members)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Members {
    /// By group.
    pub groups: Vec<GroupMembers>,
}

/// One group's members.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupMembers {
    /// The group.
    pub group: u32,
    /// Its leader (0 when none is known).
    pub leader: u64,
    /// A change is half done (joint consensus); repeating the change finishes it.
    pub joint: bool,
    /// Its members.
    pub members: Vec<Member>,
}

/// One member of a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its node id.
    pub node_id: u64,
    /// The node-to-node address the membership records.
    pub peer_addr: String,
    /// `voter` or `learner`.
    pub role: String,
    /// Whether it leads the group.
    pub leader: bool,
    /// Entries behind the leader's last one (`None` for the leader, or unknown).
    pub lag: Option<u64>,
    /// Marked draining: handed no group by leader balancing.
    pub draining: bool,
    /// The zone the node declared (`lockd serve --zone`); empty when none.
    pub zone: String,
    /// Milliseconds since the group's leader last heard from it (`None` for the leader, or
    /// unknown).
    pub last_contact_ms: Option<u64>,
    /// Whether the leader heard from it within the last second (`None`: unknown).
    pub reachable: Option<bool>,
}

/// The shard map ([`Client::shard_map`](crate::Client::shard_map)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardMap {
    /// Bumped by every change.
    pub map_version: u64,
    /// Each group's buckets.
    pub groups: Vec<GroupBuckets>,
}

/// One group's buckets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupBuckets {
    /// The group.
    pub group: u32,
    /// Its buckets in the map, as ranges (`0-63,100`; `(none)` for none).
    pub buckets: String,
    /// How many.
    pub bucket_count: u32,
    /// The buckets the group itself says it owns.
    pub owned: String,
    /// Buckets frozen by a move in progress.
    pub frozen: String,
}

/// What a bucket move did ([`Client::move_buckets`](crate::Client::move_buckets)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoveReport {
    /// Steps it took.
    pub chunks: u32,
    /// Buckets moved.
    pub buckets_moved: u32,
    /// Names with holders or a lock-delay carried over.
    pub locks: u32,
    /// Their holders.
    pub holders: u32,
    /// Waits queued again at the new group.
    pub waits_requeued: u32,
    /// Interrupted moves finished first.
    pub resumed: u32,
    /// The shard map's version after it.
    pub map_version: u64,
    /// How long it took.
    pub elapsed_ms: u64,
}

/// A lock group's record ([`Client::list_groups`](crate::Client::list_groups)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockGroup {
    /// The group's id.
    pub group: u32,
    /// The nodes it is placed on: its members as of membership config `placed_at`.
    pub nodes: Vec<u64>,
    /// 0 for a founding group; one more for each group created since.
    pub born_epoch: u64,
    /// Founded and served.
    pub ready: bool,
    /// The version of `nodes`: the Raft log id (term, index) of the group's membership config
    /// they were read from; (0, 0) for the placement it was founded or created with.
    pub placed_at: (u64, u64),
}

/// The namespaces and their version ([`Client::list_namespaces`](crate::Client::list_namespaces)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Namespaces {
    /// Bumped by every change; what a put or delete compares.
    pub version: u64,
    /// Every namespace.
    pub namespaces: Vec<NamespaceSpec>,
}

/// A namespace as the admin API shows and takes it (its bearer token is never shown).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceSpec {
    /// 1-64 characters; `default` is the namespace of prefix "".
    pub name: String,
    /// Names starting with this belong here.
    pub prefix: String,
    /// Session TTL bounds and default (0 in a put: the built-in default).
    pub min_ttl_ms: u64,
    /// See `min_ttl_ms`.
    pub max_ttl_ms: u64,
    /// See `min_ttl_ms`.
    pub default_ttl_ms: u64,
    /// Waiters one name may queue (0 in a put: the built-in default).
    pub max_waiters_per_name: u32,
    /// Locks held plus waits queued by one session (0 in a put: the built-in default).
    pub max_locks_per_session: u32,
    /// How long a name stays ungranted after its holder failed.
    pub lock_delay_ms: u64,
    /// Requests per second each node accepts for the namespace's names (0 = unlimited).
    pub ops_per_s: u32,
    /// Live sessions the namespace may hold at once, cluster-wide (0 = only the cluster's
    /// limit).
    pub max_sessions: u32,
    /// `efficiency` (or empty) or `correctness`.
    pub safety: String,
    /// Required with `correctness`: the resource that checks fencing tokens, and how.
    pub fenced_resource: String,
    /// Shown only: whether callers must present a bearer token.
    pub token_required: bool,
}

/// A namespace put ([`Client::put_namespace`](crate::Client::put_namespace)). Its `Debug` does
/// not show the bearer token.
#[derive(Clone, PartialEq, Eq)]
pub struct PutNamespace {
    /// The version the namespaces were read at.
    pub expected_version: u64,
    /// The namespace, whole.
    pub namespace: NamespaceSpec,
    /// The bearer token callers must present from now on (`None`: a replaced namespace keeps
    /// its token, a new one has none).
    pub bearer_token: Option<String>,
    /// The namespace is open from now on. Not together with `bearer_token`.
    pub clear_token: bool,
}

impl std::fmt::Debug for PutNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PutNamespace")
            .field("expected_version", &self.expected_version)
            .field("namespace", &self.namespace)
            .field(
                "bearer_token",
                &self.bearer_token.as_ref().map(|_| "(hidden)"),
            )
            .field("clear_token", &self.clear_token)
            .finish()
    }
}

impl From<pb::StatusResponse> for NodeStatus {
    fn from(s: pb::StatusResponse) -> Self {
        NodeStatus {
            node_id: s.node_id,
            pid: s.pid,
            serving_names: s.serving_names,
            groups: s
                .groups
                .into_iter()
                .map(|g| GroupStatus {
                    id: g.id,
                    leader: g.leader,
                    term: g.term,
                    members: g.members,
                    applied_index: g.applied_index,
                    revision: g.revision,
                    preferred_leader: g.preferred_leader,
                })
                .collect(),
        }
    }
}

impl From<pb::SessionDetail> for SessionDetail {
    fn from(d: pb::SessionDetail) -> Self {
        SessionDetail {
            session_id: d.session_id,
            client: d.client,
            ttl_ms: d.ttl_ms,
            held: d
                .held
                .into_iter()
                .map(|h| HeldLock {
                    name: h.name,
                    fencing_token: h.fencing_token,
                    group: h.group,
                })
                .collect(),
            waits: d
                .waits
                .into_iter()
                .map(|w| QueuedWait {
                    name: w.name,
                    queue_position: w.queue_position,
                    group: w.group,
                })
                .collect(),
            unavailable_groups: d.unavailable_groups,
        }
    }
}

/// The hottest names ([`Client::contention`](crate::Client::contention)), each list largest
/// first.
#[derive(Clone, Debug, PartialEq)]
pub struct Contention {
    /// Names per list.
    pub top: u32,
    /// The namespaces the lists cover (those the credential may read).
    pub namespaces: Vec<String>,
    /// Records the server's scans read.
    pub scanned: u64,
    /// By waiters queued.
    pub most_waiters: Vec<HotName>,
    /// By how long the first waiter has waited.
    pub longest_waits: Vec<HotName>,
    /// By grants to waiters per second (over about the last 10 s).
    pub most_handoffs: Vec<HotName>,
    /// By how long the oldest current hold has lasted.
    pub longest_held: Vec<HotName>,
}

/// One name of a [`Contention`] list.
#[derive(Clone, Debug, PartialEq)]
pub struct HotName {
    /// The lock's name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// Its lock group.
    pub group: u32,
    /// Current holders.
    pub holders: u32,
    /// Queued acquires.
    pub waiters: u32,
    /// How long the oldest current hold has lasted (0: free).
    pub held_for_ms: u64,
    /// How long the first waiter has waited (0: nobody waits).
    pub longest_wait_ms: u64,
    /// Grants to waiters per second.
    pub handoffs_per_s: f64,
    /// What a new acquire would wait, from the name's hand-offs (`None`: no history).
    pub wait_estimate_ms: Option<u64>,
}

impl From<pb::HotName> for HotName {
    fn from(h: pb::HotName) -> Self {
        HotName {
            name: h.name,
            namespace: h.namespace,
            group: h.group,
            holders: h.holders,
            waiters: h.waiters,
            held_for_ms: h.held_for_ms,
            longest_wait_ms: h.longest_wait_ms,
            handoffs_per_s: h.handoffs_per_s,
            wait_estimate_ms: h.wait_estimate_ms,
        }
    }
}

impl From<pb::ContentionResponse> for Contention {
    fn from(r: pb::ContentionResponse) -> Self {
        let list = |v: Vec<pb::HotName>| v.into_iter().map(Into::into).collect();
        Contention {
            top: r.top,
            namespaces: r.namespaces,
            scanned: r.scanned,
            most_waiters: list(r.most_waiters),
            longest_waits: list(r.longest_waits),
            most_handoffs: list(r.most_handoffs),
            longest_held: list(r.longest_held),
        }
    }
}

impl From<pb::SessionSummary> for SessionSummary {
    fn from(s: pb::SessionSummary) -> Self {
        SessionSummary {
            session_id: s.session_id,
            client: s.client,
            ttl_ms: s.ttl_ms,
            held: s.held,
            waits: s.waits,
        }
    }
}

impl From<pb::ListMembersResponse> for Members {
    fn from(r: pb::ListMembersResponse) -> Self {
        Members {
            groups: r
                .groups
                .into_iter()
                .map(|g| GroupMembers {
                    group: g.group,
                    leader: g.leader,
                    joint: g.joint,
                    members: g
                        .members
                        .into_iter()
                        .map(|m| Member {
                            node_id: m.node_id,
                            peer_addr: m.peer_addr,
                            role: m.role,
                            leader: m.leader,
                            lag: m.lag,
                            draining: m.draining,
                            zone: m.zone,
                            last_contact_ms: m.last_contact_ms,
                            reachable: m.reachable,
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

impl From<pb::ShardMapResponse> for ShardMap {
    fn from(r: pb::ShardMapResponse) -> Self {
        ShardMap {
            map_version: r.map_version,
            groups: r
                .groups
                .into_iter()
                .map(|g| GroupBuckets {
                    group: g.group,
                    buckets: g.buckets,
                    bucket_count: g.bucket_count,
                    owned: g.owned,
                    frozen: g.frozen,
                })
                .collect(),
        }
    }
}

impl From<pb::MoveBucketsResponse> for MoveReport {
    fn from(m: pb::MoveBucketsResponse) -> Self {
        MoveReport {
            chunks: m.chunks,
            buckets_moved: m.buckets_moved,
            locks: m.locks,
            holders: m.holders,
            waits_requeued: m.waits_requeued,
            resumed: m.resumed,
            map_version: m.map_version,
            elapsed_ms: m.elapsed_ms,
        }
    }
}

impl From<pb::LockGroup> for LockGroup {
    fn from(g: pb::LockGroup) -> Self {
        LockGroup {
            group: g.group,
            nodes: g.nodes,
            born_epoch: g.born_epoch,
            ready: g.ready,
            placed_at: (g.placed_at_term, g.placed_at_index),
        }
    }
}

impl From<pb::NamespaceSpec> for NamespaceSpec {
    fn from(n: pb::NamespaceSpec) -> Self {
        NamespaceSpec {
            name: n.name,
            prefix: n.prefix,
            min_ttl_ms: n.min_ttl_ms,
            max_ttl_ms: n.max_ttl_ms,
            default_ttl_ms: n.default_ttl_ms,
            max_waiters_per_name: n.max_waiters_per_name,
            max_locks_per_session: n.max_locks_per_session,
            lock_delay_ms: n.lock_delay_ms,
            ops_per_s: n.ops_per_s,
            max_sessions: n.max_sessions,
            safety: n.safety,
            fenced_resource: n.fenced_resource,
            token_required: n.token_required,
        }
    }
}

impl From<NamespaceSpec> for pb::NamespaceSpec {
    fn from(n: NamespaceSpec) -> Self {
        pb::NamespaceSpec {
            name: n.name,
            prefix: n.prefix,
            min_ttl_ms: n.min_ttl_ms,
            max_ttl_ms: n.max_ttl_ms,
            default_ttl_ms: n.default_ttl_ms,
            max_waiters_per_name: n.max_waiters_per_name,
            max_locks_per_session: n.max_locks_per_session,
            lock_delay_ms: n.lock_delay_ms,
            ops_per_s: n.ops_per_s,
            max_sessions: n.max_sessions,
            safety: n.safety,
            fenced_resource: n.fenced_resource,
            token_required: n.token_required,
        }
    }
}

impl From<pb::ListNamespacesResponse> for Namespaces {
    fn from(r: pb::ListNamespacesResponse) -> Self {
        Namespaces {
            version: r.version,
            namespaces: r.namespaces.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<PutNamespace> for pb::PutNamespaceRequest {
    fn from(p: PutNamespace) -> Self {
        pb::PutNamespaceRequest {
            expected_version: p.expected_version,
            namespace: Some(p.namespace.into()),
            bearer_token: p.bearer_token,
            clear_token: p.clear_token,
        }
    }
}
