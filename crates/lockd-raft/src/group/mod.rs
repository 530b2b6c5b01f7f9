//! One replicated lock group as the server sees it: propose, keepalive, read, status.
//!
//! Routing lives here: on the leader a call is served locally; on a follower it is forwarded to
//! the leader over the peer service, and the leader never forwards again (it answers
//! `NoLeader` instead), so a call takes at most one hop. While no leader is known, or a fresh
//! leader's lease is not yet valid, calls retry internally for a short bounded time.

pub(crate) mod leader;
mod outage;
pub(crate) mod remote;
mod shared;

pub(crate) use outage::Outage;
pub(crate) use shared::Shared;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use lockd_core::{LockTable, Op, Rejection, Reply, SessionId};
use tracing::debug;

use crate::peer::{Method, Peers};
use crate::raft::leadership::KeepaliveRefused;
use crate::raft::replica::Replica;
use crate::raft::{RaftGroup, WriteError};
use crate::wire::Proposed;
use crate::{GroupError, GroupId, NodeId};

pub use crate::wire::Renewed;

/// Timing of one group's calls, derived from the node config.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    /// The election timeout upper bound: the slack a new leader gives every session.
    pub(crate) election_max: Duration,
    /// How long a call keeps retrying while there is no usable leader.
    pub(crate) retry_budget: Duration,
    /// Pause between such retries.
    pub(crate) retry_pause: Duration,
    /// Bound on one proposal (commit + apply), after which its outcome is unknown.
    pub(crate) propose_timeout: Duration,
    /// Negative control: acknowledge keepalives without the leader-lease check.
    pub(crate) skip_leader_lease_check: bool,
    /// Whether the node hands groups to their preferred leaders (`node/balance.rs`).
    pub(crate) balance_leaders: bool,
}

/// Whether a failed forward certainly never reached the peer (connect failure). Anything else
/// (reset, timeout) may have been delivered, so a proposal's outcome is unknown.
pub(crate) fn never_sent(st: &tonic::Status) -> bool {
    st.code() == tonic::Code::Unavailable
        && (st.message().contains("tcp connect error") || st.message().contains("no address for"))
}

/// A snapshot of a group's state on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupStatus {
    pub id: GroupId,
    /// The leader this replica knows of.
    pub leader: Option<NodeId>,
    pub term: u64,
    /// Voting members.
    pub members: Vec<NodeId>,
    /// Index of the last entry applied here.
    pub applied_index: u64,
    /// The group's commit index as its leader last reported it to this replica (`None`
    /// before it has heard of one).
    pub committed_index: Option<u64>,
    /// The lock table's revision (the last fencing token minted).
    pub revision: u64,
    /// Whether this replica leads the group.
    pub is_leader: bool,
    /// Sessions in the leader's tracker (`None` on a follower or before leader duties start).
    pub tracked_sessions: Option<usize>,
    /// Snapshots this replica received from a leader since start (a lagging follower's catch-up).
    pub snapshots_installed: u64,
    /// The voter this group's leadership is handed to when it has the whole log (`None` when
    /// leader balance is off).
    pub preferred_leader: Option<NodeId>,
    /// Linearizable reads this replica answered as the group's leader since start, for itself
    /// or for a follower: from its leader lease (no round trip), and through a ReadIndex round.
    pub lease_reads: u64,
    pub round_reads: u64,
}

/// A replica of one group on this node.
pub struct Group {
    id: GroupId,
    raft: RaftGroup,
    replica: Arc<Replica>,
    peers: Peers,
    timing: Timing,
    /// The node's draining marks and remote handles.
    shared: Shared,
    stopping: AtomicBool,
    /// What `is_stranded` decides from, behind one lock.
    drift: std::sync::Mutex<Drift>,
    /// Whether calls fail fast for want of a leader (`outage.rs`).
    outage: Outage,
    /// Catching up since start (`catching_up`).
    catch_up: std::sync::Mutex<CatchUp>,
}

/// Whether a replica has caught up with its group since it started: it has applied the
/// commit index its leader first reported. A fixed target, so that a busy group, whose commit
/// always runs a little ahead of a follower's applied index, does not keep it "behind".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CatchUp {
    /// No commit index heard of yet.
    #[default]
    Unknown,
    /// Applying up to this index, the first commit the leader reported.
    To(u64),
    Done,
}

impl CatchUp {
    /// The next state, from the commit the leader reported (if any) and the index applied here.
    pub fn step(self, committed: Option<u64>, applied: u64) -> CatchUp {
        let target = match (self, committed) {
            (CatchUp::Done, _) => return CatchUp::Done,
            (CatchUp::To(t), _) => t,
            (CatchUp::Unknown, Some(c)) => c,
            (CatchUp::Unknown, None) => return CatchUp::Unknown,
        };
        if applied >= target {
            CatchUp::Done
        } else {
            CatchUp::To(target)
        }
    }
}

/// Signs that a replica is cut off from its group, or left behind by it.
#[derive(Default)]
struct Drift {
    /// Since when this replica has known no leader, or led without a quorum.
    adrift_since: Option<Instant>,
    /// Since when the leader this replica names has refused every forwarded call as not
    /// leading (a hint left over from before the replica was cut off or removed).
    hint_refused: Option<(NodeId, Instant)>,
    /// When the leader last said this node is not a member (its forwarded read's answer).
    removed_seen: Option<Instant>,
    /// When the leader's replication last reached this replica (an append it took).
    leader_contact: Option<Instant>,
    /// Since when `is_stranded` has said yes (its changes are logged).
    stranded: Option<Instant>,
}

/// How long a replica may know no usable leader before calls through it go elsewhere.
const STRANDED_AFTER_ELECTIONS: u32 = 4;

/// The answer to a proposal: the core's reply (or rejection), or why there is none.
pub type ProposeResult = Result<Result<Reply, Rejection>, GroupError>;

/// [`ProposeResult`] with what the leader says beside the reply ([`Proposed`]).
pub type ProposedResult = Result<Proposed, GroupError>;

impl Group {
    pub(crate) fn new(
        id: GroupId,
        raft: RaftGroup,
        replica: Arc<Replica>,
        peers: Peers,
        timing: Timing,
        shared: Shared,
    ) -> Group {
        Group {
            id,
            raft,
            replica,
            peers,
            timing,
            shared,
            stopping: AtomicBool::new(false),
            // As if the leader had just been heard from: a replica that restarts naming the
            // leader of its saved vote, and is never replicated to again (it was removed while
            // down), is stranded once that leader stays silent, like any other.
            drift: std::sync::Mutex::new(Drift {
                leader_contact: Some(Instant::now()),
                ..Drift::default()
            }),
            outage: Outage::default(),
            catch_up: std::sync::Mutex::default(),
        }
    }

    pub fn id(&self) -> GroupId {
        self.id
    }

    pub(crate) fn raft(&self) -> &RaftGroup {
        &self.raft
    }

    pub(crate) fn peers(&self) -> &Peers {
        &self.peers
    }

    pub(crate) fn replica(&self) -> &Replica {
        &self.replica
    }

    pub(crate) fn election_timeout_max(&self) -> Duration {
        self.timing.election_max
    }

    fn no_leader(&self) -> GroupError {
        GroupError::NoLeader {
            retry_after_ms: self.timing.election_max.as_millis() as u64 / 2,
        }
    }

    fn check_running(&self) -> Result<(), GroupError> {
        if self.stopping.load(Ordering::Acquire) {
            Err(GroupError::ShuttingDown)
        } else {
            Ok(())
        }
    }

    /// Proposes an op: on the leader it is stamped with group time, committed (fsync'd on a
    /// majority) and applied, and the core's reply is returned; on a follower it is forwarded to
    /// the leader. Never answers before commit.
    pub async fn propose(&self, op: Op) -> ProposeResult {
        self.propose_full(op).await.map(|p| p.reply)
    }

    /// [`Group::propose`], with the session's lease renewal the leader reports for an acquire
    /// it granted or queued.
    pub async fn propose_full(&self, op: Op) -> ProposedResult {
        let deadline = Instant::now() + self.timing.propose_timeout;
        match tokio::time::timeout_at(deadline, self.propose_routed(op)).await {
            Ok(r) => r,
            Err(_) => Err(GroupError::Timeout),
        }
    }

    async fn propose_routed(&self, op: Op) -> ProposedResult {
        let (give_up, out) = self.outage.give_up_at(self.timing.retry_budget);
        loop {
            self.check_running()?;
            let status = self.raft.role();
            let res = match status.leader {
                _ if status.is_leader => self.propose_on_leader(op.clone()).await,
                Some(leader) => self.forward_propose(leader, &op).await,
                None => Err(self.no_leader()),
            };
            match res {
                Err(GroupError::NoLeader { .. }) if Instant::now() < give_up => {
                    // Nothing was appended: the members elsewhere may take it.
                    if let Some(remote) = self.elsewhere() {
                        return remote.propose_full(op).await;
                    }
                    tokio::time::sleep(self.timing.retry_pause).await;
                }
                other => {
                    self.outage.settle(self.id, &other, !out);
                    return other;
                }
            }
        }
    }

    /// The node's handle on this group over the peer port, once this replica is stranded
    /// (`is_stranded`): a call that started here before it was, and is waiting for a leader
    /// this replica will not hear from, goes to the members instead.
    fn elsewhere(&self) -> Option<Arc<crate::RemoteGroup>> {
        if !self.is_stranded() {
            return None;
        }
        let remotes = self.shared.remotes.read().expect("remotes poisoned");
        remotes.get(&self.id).cloned()
    }

    /// After a forward to `leader` failed: a replica that never called it (a member added while
    /// this one followed another leader, then handed the lead) may have no address for it
    /// yet. The membership has it; the next try uses it.
    fn learn_leader_addr(&self, leader: NodeId) {
        if let Some(addr) = self.raft.membership().addrs.get(&leader) {
            self.peers.learn_addr(leader, addr);
        }
    }

    async fn forward_propose(&self, leader: NodeId, op: &Op) -> ProposedResult {
        match self
            .peers
            .forward::<_, Proposed>(
                leader,
                Method::Propose,
                self.id,
                op,
                self.timing.propose_timeout,
            )
            .await
        {
            Ok(r) => {
                self.note_hint(leader, matches!(r, Err(GroupError::NoLeader { .. })));
                r
            }
            // The connection could not be made, so nothing was sent: safe to retry.
            Err(st) if never_sent(&st) => {
                self.learn_leader_addr(leader);
                Err(self.no_leader())
            }
            Err(st) => Err(GroupError::Unavailable(format!(
                "forwarding to leader node {leader} failed ({}: {}); the outcome is unknown",
                st.code(),
                st.message()
            ))),
        }
    }

    /// A leader no quorum has acknowledged for an election timeout (its followers stopped or
    /// are cut off; they elect another leader if they can) takes no call: nothing would be
    /// appended or answered before the call's timeout, so it answers `NoLeader` at once and
    /// the group's outage costs a quick retryable refusal (`outage.rs`), not a timeout with
    /// an unknown outcome.
    fn cut_off_leader(&self) -> bool {
        self.raft.quorum_silent_for(self.timing.election_max)
    }

    /// Serves a proposal on this node only if it leads with active leader duties.
    pub(crate) async fn propose_on_leader(&self, op: Op) -> ProposedResult {
        self.check_running()?;
        let status = self.raft.role();
        if !status.is_leader || self.cut_off_leader() {
            return Err(self.no_leader());
        }
        match self.raft.write(op).await {
            Ok(reply) => Ok(reply),
            // Nothing was appended (not leader, or a fresh leader whose lease is not yet valid):
            // the caller may retry.
            Err(WriteError::NotLeader { leader }) => {
                debug!(group = self.id, ?leader, "write refused: not leader");
                Err(self.no_leader())
            }
            Err(WriteError::Discarded(why)) => Err(GroupError::Unavailable(format!(
                "outcome unknown: {why}; inspect state before retrying"
            ))),
            Err(WriteError::Fatal(why)) => {
                Err(GroupError::Unavailable(format!("raft stopped: {why}")))
            }
        }
    }

    /// A keepalive for `session`, answered by the leader's in-memory tracker (never logged).
    /// `Ok(ttl_ms)` while the session has a lease here; `SessionNotFound` when it has none
    /// (never brought here, or expired or closed here: leases are per group).
    pub async fn keepalive(&self, session: SessionId) -> Result<Renewed, GroupError> {
        let (give_up, out) = self.outage.give_up_at(self.timing.retry_budget);
        loop {
            self.check_running()?;
            let status = self.raft.role();
            let res = match status.leader {
                _ if status.is_leader => self.keepalive_on_leader(session),
                Some(leader) => {
                    let timeout = self.timing.retry_budget;
                    match self
                        .peers
                        .forward(leader, Method::Keepalive, self.id, &session, timeout)
                        .await
                    {
                        Ok(r) => r,
                        // A keepalive is idempotent: a lost one is simply retried.
                        Err(_) => {
                            self.learn_leader_addr(leader);
                            Err(self.no_leader())
                        }
                    }
                }
                None => Err(self.no_leader()),
            };
            match res {
                Err(GroupError::NoLeader { .. }) if Instant::now() < give_up => {
                    if let Some(remote) = self.elsewhere() {
                        return remote.keepalive(session).await;
                    }
                    tokio::time::sleep(self.timing.retry_pause).await;
                }
                other => {
                    self.outage.settle(self.id, &other, !out);
                    return other;
                }
            }
        }
    }

    /// Serves a keepalive on this node only if it leads and its lease holds: a deposed leader
    /// must not promise time it does not own.
    pub(crate) fn keepalive_on_leader(&self, session: SessionId) -> Result<Renewed, GroupError> {
        self.check_running()?;
        let status = self.raft.role();
        let lease_ok = self.timing.skip_leader_lease_check || self.raft.lease_valid();
        if !status.is_leader || !lease_ok {
            return Err(self.no_leader());
        }
        // Read before the lease is extended: a move after this read starts the moved hold's
        // new lease later still, so the count is safe to pair with this renewal.
        let group_moves = self.replica.move_count();
        let now = self.replica.clock().now();
        match self
            .replica
            .with_leadership(|l| l.keepalive(status.term, session, now))
        {
            Ok(ttl_ms) => Ok(Renewed {
                ttl_ms,
                group_moves,
            }),
            Err(KeepaliveRefused::NotActive) => Err(self.no_leader()),
            // No lease here for the session (never brought here, or ended here).
            Err(KeepaliveRefused::NotFound) => Err(GroupError::SessionNotFound),
        }
    }

    /// A linearizable read of the applied state: ReadIndex on the leader; on a follower, the
    /// leader's read index, then wait until this replica has applied it.
    pub async fn read<R: Send + 'static>(
        &self,
        f: impl FnOnce(&LockTable) -> R + Send + 'static,
    ) -> Result<R, GroupError> {
        let deadline = Instant::now() + self.timing.propose_timeout;
        let wait = async {
            let index = self.read_index_routed().await?;
            self.replica.wait_applied(index).await;
            Ok::<_, GroupError>(())
        };
        match tokio::time::timeout_at(deadline, wait).await {
            Ok(Ok(())) => Ok(self.replica.read(f)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(GroupError::Timeout),
        }
    }

    async fn read_index_routed(&self) -> Result<u64, GroupError> {
        let (give_up, out) = self.outage.give_up_at(self.timing.retry_budget);
        loop {
            self.check_running()?;
            let status = self.raft.role();
            let res = match status.leader {
                _ if status.is_leader => self.read_index_on_leader().await,
                Some(leader) => {
                    let timeout = self.timing.retry_budget;
                    let me = self.raft.node_id();
                    match self
                        .peers
                        .forward::<_, (u64, Vec<NodeId>)>(
                            leader,
                            Method::ReadIndex,
                            self.id,
                            &(),
                            timeout,
                        )
                        .await
                    {
                        // The leader's members leave this node out: it was removed, and its
                        // replica would never apply the index. Fail at once; calls through
                        // this node go elsewhere for a while (`is_stranded`).
                        Ok(Ok((_, members))) if !members.contains(&me) => {
                            self.drift().removed_seen = Some(Instant::now());
                            return Err(GroupError::Unavailable(format!(
                                "node {me} is no longer a member of group {}",
                                self.id
                            )));
                        }
                        Ok(r) => r.map(|(index, _)| index),
                        Err(_) => {
                            self.learn_leader_addr(leader);
                            Err(self.no_leader())
                        }
                    }
                }
                None => Err(self.no_leader()),
            };
            match res {
                // A stranded replica would not apply the index: the caller's next try is
                // routed to the members (`Node::route`).
                Err(GroupError::NoLeader { .. }) if self.is_stranded() => {
                    return Err(GroupError::Unavailable(format!(
                        "this node's replica of group {} is cut off from the group; retry \
                         (calls now go to its members)",
                        self.id
                    )));
                }
                Err(GroupError::NoLeader { .. }) if Instant::now() < give_up => {
                    tokio::time::sleep(self.timing.retry_pause).await;
                }
                other => {
                    self.outage.settle(self.id, &other, !out);
                    return other;
                }
            }
        }
    }

    /// The leader's side of a forwarded read: the read index, and the members as this leader
    /// has them (so a removed node learns it).
    pub(crate) async fn read_index_for_peer(&self) -> Result<(u64, Vec<NodeId>), GroupError> {
        let index = self.read_index_on_leader().await?;
        let m = self.raft.membership();
        Ok((index, m.voters.into_iter().chain(m.learners).collect()))
    }

    pub(crate) async fn read_index_on_leader(&self) -> Result<u64, GroupError> {
        self.check_running()?;
        if self.cut_off_leader() && !self.raft.unchecked_read_lease() {
            return Err(self.no_leader());
        }
        match self.raft.read_index().await {
            Ok(index) => Ok(index),
            Err(WriteError::NotLeader { .. }) => Err(self.no_leader()),
            Err(WriteError::Discarded(why) | WriteError::Fatal(why)) => {
                Err(GroupError::Unavailable(why))
            }
        }
    }

    /// The local replica's applied state, without consensus (status, metrics, debugging).
    pub fn read_local<R>(&self, f: impl FnOnce(&LockTable) -> R) -> R {
        self.replica.read(f)
    }

    /// Group time on this node: the leader's stamping clock, or on a follower the last applied
    /// `now_ms` plus the time since it was applied.
    pub fn now_ms(&self) -> u64 {
        self.replica.now_ms()
    }

    pub fn is_leader(&self) -> bool {
        self.raft.role().is_leader
    }

    /// Whether this node is a member of the group as far as it knows: its applied membership
    /// has it, and no leader has said otherwise since it last replicated to it. A stranded
    /// replica that is still a member was cut off (the group lost its quorum, or a partition),
    /// not removed.
    pub fn member_here(&self) -> bool {
        if !self.raft.is_member(self.raft.node_id()) {
            return false;
        }
        let d = self.drift();
        d.removed_seen
            .is_none_or(|told| d.leader_contact.is_some_and(|heard| heard > told))
    }

    /// Whether this replica has known no leader, or has led without a quorum's acknowledgement,
    /// for several election timeouts: an election elsewhere would have ended that by now, so
    /// this replica is cut off from its group, or left behind by it. A replica removed from
    /// its group while unreachable is the lasting case: nobody contacts it again, and a leader
    /// caught half-way through handing the group over (openraft then sends no heartbeats) never
    /// steps down. Calls through such a replica go to the group's other nodes instead
    /// (`Node::route`).
    pub fn is_stranded(&self) -> bool {
        let role = self.raft.role();
        let mut d = self.drift();
        let (stranded, why) = self.stranded_now(&role, &mut d);
        if stranded != d.stranded.is_some() {
            d.stranded = stranded.then(Instant::now);
            if stranded {
                tracing::info!(
                    group = self.id,
                    leader = ?role.leader,
                    term = role.term,
                    why,
                    "this replica is cut off from its group; its calls go to the members"
                );
            } else {
                tracing::info!(
                    group = self.id,
                    leader = ?role.leader,
                    term = role.term,
                    "this replica serves its group again"
                );
            }
        }
        stranded
    }

    fn stranded_now(&self, role: &crate::raft::Role, d: &mut Drift) -> (bool, &'static str) {
        // `lease_valid` counts a sole voter as its own quorum.
        let adrift = role.leader.is_none()
            || (role.is_leader && !self.timing.skip_leader_lease_check && !self.raft.lease_valid());
        let limit = STRANDED_AFTER_ELECTIONS * self.timing.election_max;
        // Once stranded, only a sign of a working group ends it: the leader's replication
        // reached it since, or it leads with a lease. Its reason may change meanwhile (the
        // leader it named went silent, then a vote request made it forget that leader): that
        // must not start the count again.
        if let Some(since) = d.stranded {
            let heard = d.leader_contact.is_some_and(|at| at > since);
            let leads =
                role.is_leader && (self.timing.skip_leader_lease_check || self.raft.lease_valid());
            if !heard && !leads {
                return (true, "no leader has reached it since it was cut off");
            }
        }
        // Told it was removed, recently: at once (a member again is told nothing of the kind).
        if d.removed_seen.is_some_and(|at| at.elapsed() < limit) {
            return (true, "the leader says it is not a member");
        }
        // Only while this replica still names that node as the leader.
        let refused = !role.is_leader
            && d.hint_refused
                .is_some_and(|(l, at)| role.leader == Some(l) && at.elapsed() >= limit);
        if refused {
            return (true, "the leader it names refuses its forwards");
        }
        // Still naming a leader whose replication stopped reaching it: removed without
        // applying its own removal (a learner never starts an election, so it would name that
        // leader forever), or cut off. The leader's heartbeats come every heartbeat interval.
        let silent = !role.is_leader
            && role.leader.is_some()
            && d.leader_contact.is_some_and(|at| at.elapsed() >= limit);
        if !adrift {
            d.adrift_since = None;
            return (silent, "the leader it names has not replicated to it");
        }
        let at = *d.adrift_since.get_or_insert_with(Instant::now);
        (
            at.elapsed() >= limit,
            "no leader, or leading without a quorum",
        )
    }

    /// The leader's replication reached this replica (see `Drift::leader_contact`).
    pub(crate) fn note_leader_contact(&self) {
        self.drift().leader_contact = Some(Instant::now());
    }

    fn drift(&self) -> std::sync::MutexGuard<'_, Drift> {
        self.drift.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this replica leads with a quorum's recent acknowledgement (its keepalive lease).
    pub fn lease_held(&self) -> bool {
        self.raft.lease_valid()
    }

    /// Notes how the leader this replica names answered a forwarded call.
    fn note_hint(&self, leader: NodeId, refused: bool) {
        let mut d = self.drift();
        match (refused, d.hint_refused) {
            (true, Some((l, _))) if l == leader => {}
            (true, _) => d.hint_refused = Some((leader, Instant::now())),
            (false, _) => d.hint_refused = None,
        }
    }

    /// The group's membership as this replica sees it; on the leader, with each other
    /// member's lag and last contact.
    pub fn membership(&self) -> crate::Membership {
        self.raft.membership()
    }

    /// `Some((applied, target))` while this replica has not yet applied the commit index its
    /// leader first reported after the start (a restarted or replaced node replaying or
    /// receiving the log); `None` once it has, for good, or when it leads.
    pub fn catching_up(&self) -> Option<(u64, u64)> {
        let mut c = self.catch_up.lock().expect("catch-up lock");
        if *c == CatchUp::Done {
            return None;
        }
        let (committed, applied) = self.raft.commit_progress();
        *c = if self.is_leader() {
            CatchUp::Done
        } else {
            c.step(committed, applied)
        };
        match *c {
            CatchUp::Done => None,
            CatchUp::To(t) => Some((applied, t)),
            CatchUp::Unknown => Some((applied, 0)),
        }
    }

    pub fn status(&self) -> GroupStatus {
        let s = self.raft.status();
        let (applied_index, _) = self.replica.applied();
        let (lease_reads, round_reads) = self.raft.reads();
        let preferred_leader = self
            .timing
            .balance_leaders
            .then(|| {
                let draining = self.shared.draining.read().expect("draining poisoned");
                crate::placement::preferred_leader(self.id, s.voters.iter().copied(), &draining)
            })
            .flatten();
        GroupStatus {
            id: self.id,
            leader: s.role.leader,
            term: s.role.term,
            members: s.voters,
            applied_index,
            committed_index: self.raft.commit_progress().0,
            revision: self.replica.read(|t| t.revision()),
            is_leader: s.role.is_leader,
            tracked_sessions: self.replica.with_leadership(|l| l.tracked()),
            snapshots_installed: self.replica.installs(),
            preferred_leader,
            lease_reads,
            round_reads,
        }
    }

    /// Hash of the local replica's state; equal on replicas that applied the same log (S9).
    /// Costs a full serialisation of the table.
    pub fn state_hash(&self) -> u64 {
        self.replica.read(|t| t.state_hash())
    }

    /// Resolves once this replica has applied at least `index`.
    pub async fn wait_applied(&self, index: u64) {
        self.replica.wait_applied(index).await
    }

    pub(crate) async fn shutdown(&self) {
        self.stopping.store(true, Ordering::Release);
        self.replica.deactivate();
        self.raft.shutdown().await;
    }
}

#[cfg(test)]
mod catch_up_tests {
    use super::CatchUp;

    #[test]
    fn a_replica_catches_up_to_the_first_commit_it_hears_of_and_stays_caught_up() {
        let c = CatchUp::Unknown.step(None, 0);
        assert_eq!(c, CatchUp::Unknown);
        // A replaced node at 0 hears the group is at 55.
        let c = c.step(Some(55), 0);
        assert_eq!(c, CatchUp::To(55));
        // The group moves on meanwhile: the target stays (a busy group's commit always runs
        // ahead of a follower's applied index).
        let c = c.step(Some(90), 54);
        assert_eq!(c, CatchUp::To(55));
        let c = c.step(Some(95), 55);
        assert_eq!(c, CatchUp::Done);
        assert_eq!(c.step(Some(1_000), 60), CatchUp::Done);
    }
}
