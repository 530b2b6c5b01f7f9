//! The openraft glue: the only module that names openraft types.
//!
//! * [`RaftGroup`] wraps one `openraft::Raft` behind a small lockd-shaped API (write a
//!   `Command`, get a read index, status, role changes, serve a peer RPC);
//! * `log_store`: the raft-log WAL behind `RaftLogStorage`;
//! * `state_machine`: applies entries to the group's [`Replica`], persists snapshots;
//! * `network`: openraft's network traits over the peer gRPC pool.
//!
//! Pinned to openraft `=0.10.0-alpha.37`; an upgrade should only touch this directory.

pub(crate) mod leadership;
mod log_store;
mod mem_store;
mod network;
pub(crate) mod replica;
mod runtime;
mod state_machine;
pub(crate) mod tracker;

pub use mem_store::MemStorage;
pub use runtime::seed_thread_rng;
pub(crate) use state_machine::SNAPSHOT_FILE;
pub use state_machine::{inspect_snapshot, SnapshotReport};

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

use lockd_core::Op;
use openraft::async_runtime::watch::WatchReceiver;
use openraft::error::{ClientWriteError, InitializeError, LinearizableReadError, RaftError};
use openraft::{BasicNode, Config, Instant as _, ReadPolicy, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use tracing::info;

use crate::peer::Peers;
use crate::raft::replica::Replica;
use crate::wire::Proposed;
use crate::{GroupId, NodeConfig, NodeId, StartError, Storage};

/// A log entry's payload (`AppData`): lockd-core ops, applied in order as commands stamped with
/// the same group time. One entry carries every proposal that queued on the leader while the
/// previous entries were being committed (see [`WriteQueue`]). openraft needs `Display`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Proposal {
    pub(crate) now_ms: u64,
    pub(crate) ops: Vec<Op>,
}

impl Proposal {
    /// Roughly what the entry takes in memory once decoded: the log cache's measure. Its
    /// encoded size plus each op's inline size; strings count once, as encoded.
    pub(crate) fn approx_bytes(&self) -> u64 {
        let size = postcard::ser_flavors::Size::default();
        let encoded = postcard::serialize_with_flavor(self, size).unwrap_or(0);
        (64 + encoded + self.ops.len() * std::mem::size_of::<Op>()) as u64
    }
}

impl fmt::Display for Proposal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ops.as_slice() {
            [op] => write!(f, "{op:?}@{}", self.now_ms),
            ops => write!(f, "{} ops@{}", ops.len(), self.now_ms),
        }
    }
}

/// What applying an entry returns to the leader that proposed it: the core's reply to each op,
/// in order (none for an entry without ops: blank, membership). openraft keeps it in memory
/// (the responder of a local write); it is never read from bytes, which matters because
/// [`Proposed`]'s lenient reading of its tail holds only for the last value of a message.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct Outcome(pub(crate) Vec<Proposed>);

openraft::declare_raft_types!(
    pub(crate) TypeConfig:
        D = Proposal,
        R = Outcome,
        NodeId = NodeId,
        Node = BasicNode,
        AsyncRuntime = runtime::LockdRuntime,
);

type Raft = openraft::Raft<TypeConfig, state_machine::StateMachine>;
type LogId = openraft::type_config::alias::LogIdOf<TypeConfig>;
type Vote = openraft::type_config::alias::VoteOf<TypeConfig>;
type Entry = openraft::type_config::alias::EntryOf<TypeConfig>;
type SnapshotMeta = openraft::type_config::alias::SnapshotMetaOf<TypeConfig>;
type StoredMembership = openraft::type_config::alias::StoredMembershipOf<TypeConfig>;
type SnapshotData = Vec<u8>;

/// The peer RPCs openraft itself needs.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RaftRpc {
    Append,
    Vote,
    PreVote,
    Snapshot,
    TransferLeader,
}

/// Why a write did not commit.
#[derive(Clone, Debug)]
pub(crate) enum WriteError {
    /// Not the leader (nothing appended); the known leader, if any.
    NotLeader { leader: Option<NodeId> },
    /// Appended, then truncated by a new leader: the outcome is unknown.
    Discarded(String),
    /// The node stopped or storage failed.
    Fatal(String),
}

/// What the rest of the crate needs to know about the Raft role, read from the metrics watch.
#[derive(Clone, Debug)]
pub(crate) struct RaftStatus {
    pub(crate) role: Role,
    pub(crate) voters: Vec<NodeId>,
}

/// Who leads, as this replica knows it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Role {
    pub(crate) is_leader: bool,
    pub(crate) leader: Option<NodeId>,
    pub(crate) term: u64,
}

fn role_of(m: &openraft::metrics::RaftServerMetrics<TypeConfig>) -> Role {
    Role {
        is_leader: m.state.is_leader() && m.current_leader == Some(m.id),
        leader: m.current_leader,
        term: m.vote.leader_id().term,
    }
}

/// Wakes when the role, leader, term or membership changes.
pub(crate) struct RoleChanges(
    openraft::type_config::alias::WatchReceiverOf<
        TypeConfig,
        openraft::metrics::RaftServerMetrics<TypeConfig>,
    >,
);

impl RoleChanges {
    /// Errors once the Raft instance has shut down.
    pub(crate) async fn changed(&mut self) -> Result<(), ()> {
        self.0.changed().await.map_err(|_| ())
    }
}

/// One group's Raft instance.
pub(crate) struct RaftGroup {
    raft: Raft,
    /// Stamps each entry with group time as it is proposed.
    replica: Arc<Replica>,
    /// Reads waiting for the next batch, and how batches are answered.
    reads: ReadPath,
    /// Proposals waiting for a free entry slot.
    writes: Arc<Mutex<WriteQueue>>,
    /// The node's entry slots, shared with its other groups.
    slots: EntrySlots,
    /// The on-disk log (None in memory), kept to persist its buffered tail on shutdown and
    /// released there, so the directory can be opened again.
    log: Mutex<Option<log_store::LogStore>>,
    /// Whose leadership-transfer vote this replica honours (`network::NamedSuccessor`).
    named: network::NamedSuccessor,
}

/// Entries being committed at once per group. Every proposal that arrives while all of them are
/// out waits, and the next entry carries all that waited (up to [`MAX_ENTRY_OPS`]). A lone
/// proposal on an idle group leaves at once, so batching adds no latency; under load, entries
/// grow with the queue instead of multiplying, and the per-entry work (append, replicate, apply,
/// openraft's bookkeeping, on every replica) is paid once per batch.
///
/// One, measured: on two shared cores the per-entry work is what saturates first, so a second
/// entry in flight costs more than the overlap gains. Mix, closed loop over gRPC, alternating
/// runs of one binary: 1 slot 14,456 / 13,501 ops/s, 2 slots 12,141 / 11,960, 4 slots 10,885
/// (2026-12-01 04:08); again at 06:00, 12,523 / 10,103 against 9,570 / 9,711. Uncontended
/// acquire p50 at C=1 is unchanged: a lone proposal leaves at once either way.
const MAX_ENTRIES_IN_FLIGHT: usize = 1;

/// Entries in flight at once on one node, across every group it leads, handed out in the order
/// the groups asked ([`EntrySlots`]).
const NODE_ENTRIES_IN_FLIGHT: usize = 1;

/// How long one group's entry may keep its node slot: past this it gives the slot up (and keeps
/// waiting for its own commit), so a group that lost its quorum, or a slow disk under one group,
/// delays the node's other groups once by this much, never stops them.
const SLOT_HOLD_MAX: Duration = Duration::from_millis(20);

/// The entry slots one node's groups share. Every group's entry carries every proposal waiting
/// when it is formed; with a slot per group, G groups on a node keep G entries in flight, each
/// carrying 1/G of the proposals, and pay the per-entry work (append, fsync, replication, apply
/// and openraft's bookkeeping on every replica) G times as often as one group does. Sharing the
/// slot makes a group whose entry waits for the slot gather the proposals that arrive meanwhile,
/// as one group does. A lone proposal on an idle node leaves at once.
#[derive(Clone)]
pub(crate) struct EntrySlots(Arc<tokio::sync::Semaphore>);

impl Default for EntrySlots {
    fn default() -> Self {
        EntrySlots(Arc::new(tokio::sync::Semaphore::new(
            NODE_ENTRIES_IN_FLIGHT,
        )))
    }
}

impl EntrySlots {
    /// Waits for a slot; groups are served in the order they asked.
    async fn take(&self) -> tokio::sync::OwnedSemaphorePermit {
        self.0
            .clone()
            .acquire_owned()
            .await
            .expect("entry slots are never closed")
    }
}

/// Runs `entry` holding `slot`, which goes back when the entry is done or after
/// [`SLOT_HOLD_MAX`], whichever comes first.
async fn holding<T>(
    slot: tokio::sync::OwnedSemaphorePermit,
    entry: impl std::future::Future<Output = T>,
) -> T {
    tokio::pin!(entry);
    tokio::select! {
        r = &mut entry => r,
        () = tokio::time::sleep(SLOT_HOLD_MAX) => {
            drop(slot);
            entry.await
        }
    }
}

/// Most ops in one entry: bounds the entry's size and how long applying it holds the replica.
const MAX_ENTRY_OPS: usize = 256;

/// About the most bytes of ops in one entry ([`Op::approx_bytes`]): client commands are small
/// (a few hundred bytes at most), so this bounds entries that batch a bucket move's export
/// with others. One op always goes, whatever its size.
const MAX_ENTRY_BYTES: usize = 1 << 20;

/// How many of the waiting `ops`, from the front, the next entry takes: at most
/// [`MAX_ENTRY_OPS`], and no more than fit in [`MAX_ENTRY_BYTES`] (at least one).
fn batch_len<'a>(ops: impl Iterator<Item = &'a Op>) -> usize {
    let (mut n, mut bytes) = (0, 0);
    for op in ops.take(MAX_ENTRY_OPS) {
        bytes += op.approx_bytes();
        if n > 0 && bytes > MAX_ENTRY_BYTES {
            break;
        }
        n += 1;
    }
    n
}

type WriteResult = Result<Proposed, WriteError>;

struct PendingWrite {
    op: Op,
    tx: oneshot::Sender<WriteResult>,
}

/// The leader's proposals not yet in an entry.
#[derive(Default)]
struct WriteQueue {
    in_flight: usize,
    waiting: Vec<PendingWrite>,
}

/// Concurrent linearizable reads are answered in batches: one batch (one lease check, else one
/// quorum round) runs at a time, and every read that arrives meanwhile waits for the next, which
/// starts after it arrived, so each read still sees every write acknowledged before it began.
/// Without this each read cost its own message to openraft's core (and, past the lease, its own
/// heartbeat broadcast to every follower).
#[derive(Default)]
struct ReadQueue {
    running: bool,
    waiting: Vec<oneshot::Sender<Result<u64, WriteError>>>,
}

/// What a batch of reads needs: the queue, and how to get a read index (lease or round).
#[derive(Clone)]
struct ReadPath {
    raft: Raft,
    queue: Arc<Mutex<ReadQueue>>,
    /// The leader lease: a quorum acknowledgement younger than this lets the leader answer
    /// reads (here) and keepalives (`RaftGroup::lease_valid`) from its own state.
    lease: Duration,
    /// Negative control (`NodeConfig::skip_read_lease_check`): lease reads without the lease.
    unchecked: bool,
    /// Reads this replica led: `[from the lease, through a ReadIndex round]`.
    counts: Arc<[AtomicU64; 2]>,
}

/// Timing and snapshot policy for every group of a node.
fn raft_config(cfg: &NodeConfig) -> Result<Config, StartError> {
    let keep = (cfg.snapshot_every / 2).min(1000);
    let c = Config {
        cluster_name: "lockd".into(),
        heartbeat_interval: cfg.heartbeat_ms,
        election_timeout_min: cfg.election_timeout_ms.0,
        election_timeout_max: cfg.election_timeout_ms.1,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(cfg.snapshot_every),
        max_in_snapshot_log_to_keep: keep,
        // A whole LockTable goes in one message; give it time on a busy machine.
        install_snapshot_timeout: 10_000,
        enable_pre_vote: Some(true),
        // A restarted leader must win a new election (a new term), never resume its old one.
        // openraft restores leadership by default, and a leader replicates entries before its
        // own fsync completes; if it crashes in between, it comes back without entries a
        // follower already holds and would write different entries at the same (index, term).
        // The follower keeps its own ("same log id, same entry") and the replicas diverge.
        // Found by `lockd-check sim --seed 1552` (S9).
        enable_leader_restore: Some(false),
        ..Default::default()
    };
    c.validate()
        .map_err(|e| StartError::Config(format!("raft timing: {e}")))
}

impl RaftGroup {
    /// Opens the group's log and snapshot under `dir` and starts its Raft instance.
    pub(crate) async fn start(
        cfg: &NodeConfig,
        group: GroupId,
        dir: &Path,
        replica: Arc<Replica>,
        pool: Peers,
        slots: EntrySlots,
    ) -> Result<RaftGroup, StartError> {
        let storage = |source| StartError::Storage { group, source };
        let config = Arc::new(raft_config(cfg)?);
        let timing = log_store::SyncTiming {
            group,
            sink: replica.sink(),
        };
        let net = network::GroupNetwork::new(pool, group);
        let stamps = replica.clone();
        let raft_err = |e: openraft::error::Fatal<TypeConfig>| StartError::Raft {
            group,
            message: e.to_string(),
        };
        let mut disk_log = None;
        let raft = match &cfg.storage {
            Storage::Disk => {
                let log =
                    log_store::LogStore::open(&dir.join("log"), Some(timing)).map_err(storage)?;
                disk_log = Some(log.clone());
                let backend = state_machine::SnapshotBackend::Disk(dir.to_path_buf());
                let sm = state_machine::StateMachine::open(backend, replica).map_err(storage)?;
                Raft::new(cfg.node_id, config, net, log, sm)
                    .await
                    .map_err(raft_err)?
            }
            Storage::Memory(disk) => {
                let gen = disk.generation();
                let log = mem_store::MemLogStore::open(disk.clone(), gen, group);
                let backend = state_machine::SnapshotBackend::Memory {
                    disk: disk.clone(),
                    gen,
                    group,
                };
                let sm = state_machine::StateMachine::open(backend, replica).map_err(storage)?;
                Raft::new(cfg.node_id, config, net, log, sm)
                    .await
                    .map_err(raft_err)?
            }
        };
        Ok(RaftGroup {
            raft: raft.clone(),
            replica: stamps,
            reads: ReadPath {
                raft,
                queue: Arc::default(),
                lease: Duration::from_millis(cfg.election_timeout_ms.0),
                unchecked: cfg.skip_read_lease_check,
                counts: Arc::default(),
            },
            writes: Arc::default(),
            slots,
            log: Mutex::new(disk_log),
            named: network::NamedSuccessor::default(),
        })
    }

    /// Makes `peers` the voters of a fresh group; a group that has a membership already is
    /// left alone.
    pub(crate) async fn initialize(
        &self,
        peers: &BTreeMap<NodeId, String>,
    ) -> Result<bool, String> {
        let members: BTreeMap<NodeId, BasicNode> = peers
            .iter()
            .map(|(id, addr)| (*id, BasicNode::new(addr.clone())))
            .collect();
        match self.raft.initialize(members).await {
            Ok(()) => Ok(true),
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(false),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Proposes `op` on this leader: it goes into the next entry (stamped with group
    /// time when the entry is proposed), which is committed (durable on a majority) and applied;
    /// returns the core's reply to `op`. A caller that gives up before its op is in an entry
    /// takes the op out: nothing is proposed that nobody waits for.
    pub(crate) async fn write(&self, op: Op) -> WriteResult {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut q = self.writes.lock().expect("write queue poisoned");
            q.waiting.push(PendingWrite { op, tx });
            let free = q.in_flight < MAX_ENTRIES_IN_FLIGHT;
            q.in_flight += usize::from(free);
            free
        };
        if start {
            tokio::spawn(write_entries(
                self.raft.clone(),
                self.replica.clone(),
                self.writes.clone(),
                self.slots.clone(),
            ));
        }
        rx.await
            .unwrap_or_else(|_| Err(WriteError::Fatal("the proposal was dropped".into())))
    }

    /// The index a linearizable read must wait for (the local state machine applying it).
    /// Reads queue and are answered in batches, one batch at a time: each batch's index comes
    /// from the leader lease when it holds (no round trip, [`ReadPath::lease_index`]), else
    /// from a ReadIndex round. A read that arrives while a batch is being answered waits for
    /// the next, whose lease check or round starts after it arrived, so it still sees every
    /// write acknowledged before it began; a burst costs one message to openraft's core (and
    /// at most one heartbeat broadcast) instead of one each.
    pub(crate) async fn read_index(&self) -> Result<u64, WriteError> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut q = self.reads.queue.lock().expect("read queue poisoned");
            q.waiting.push(tx);
            !std::mem::replace(&mut q.running, true)
        };
        if start {
            tokio::spawn(read_batches(self.reads.clone()));
        }
        rx.await
            .unwrap_or_else(|_| Err(WriteError::Fatal("the read batch was dropped".into())))
    }

    /// The negative control `NodeConfig::skip_read_lease_check` is on (it also skips the
    /// silent-leader refusal before reads, `LockGroup::cut_off_leader`, itself a lease).
    pub(crate) fn unchecked_read_lease(&self) -> bool {
        self.reads.unchecked
    }

    /// Reads this replica answered as leader: `(from the lease, through a ReadIndex round)`
    /// (a round that failed counts too).
    pub(crate) fn reads(&self) -> (u64, u64) {
        let [lease, round] = &*self.reads.counts;
        (lease.load(Ordering::Relaxed), round.load(Ordering::Relaxed))
    }

    pub(crate) fn status(&self) -> RaftStatus {
        let metrics = self.raft.server_metrics();
        let m = metrics.borrow_watched();
        RaftStatus {
            role: role_of(&m),
            voters: m.membership_config.membership().voter_ids().collect(),
        }
    }

    /// On the leader: whether voter `node` has acknowledged every entry this leader has
    /// appended (false on a follower, or while an entry is in flight to it).
    pub(crate) fn has_whole_log(&self, node: NodeId) -> bool {
        let metrics = self.raft.data_metrics();
        let m = metrics.borrow_watched();
        let last = m.last_log.as_ref().map(|l| l.index);
        m.replication
            .as_ref()
            .and_then(|r| r.get(&node))
            .is_some_and(|matched| matched.as_ref().map(|l| l.index) == last)
    }

    /// On the leader: the voter to hand the group to when this node leaves: one that has
    /// acknowledged the leader within `fresh` (so it is alive), with the least lag. `None` on a
    /// follower or when no other voter is in touch.
    pub(crate) fn handover_target(
        &self,
        fresh: Duration,
        draining: &std::collections::BTreeSet<NodeId>,
    ) -> Option<NodeId> {
        let metrics = self.raft.data_metrics();
        let d = metrics.borrow_watched();
        let me = self.raft.server_metrics().borrow_watched().id;
        let last = d.last_log.as_ref().map_or(0, |l| l.index);
        let voters: Vec<NodeId> = self.membership().voters;
        let heard = d.heartbeat.as_ref()?;
        let replicated = d.replication.as_ref()?;
        voters
            .into_iter()
            .filter(|v| *v != me)
            .filter(|v| {
                heard
                    .get(v)
                    .and_then(|t| t.as_ref())
                    .is_some_and(|t| t.elapsed() < fresh)
            })
            .min_by_key(|v| {
                let at = replicated
                    .get(v)
                    .and_then(|m| m.as_ref())
                    .map_or(0, |l| l.index);
                // A draining voter only if no other is in touch.
                (draining.contains(v), last.saturating_sub(at))
            })
    }

    /// Asks this leader to hand the group to `to` (openraft's TransferLeader; `node/balance.rs`).
    /// Ignored on a follower; the outcome shows as the next role change.
    pub(crate) async fn transfer_leader(&self, to: NodeId) {
        use openraft::vote::RaftLeaderId;
        let leading = {
            let metrics = self.raft.server_metrics();
            let m = metrics.borrow_watched();
            (m.state == openraft::ServerState::Leader).then(|| m.vote.leader_id().term())
        };
        if let Some(term) = leading {
            self.named.name(to, term);
        }
        if let Err(e) = self.raft.trigger().transfer_leader(to).await {
            info!(error = %e, "transfer leader");
        }
    }

    /// The role part of [`RaftGroup::status`], without allocating: every call checks it.
    pub(crate) fn role(&self) -> Role {
        role_of(&self.raft.server_metrics().borrow_watched())
    }

    /// Whether this node is the leader and a quorum acknowledged it within the leader lease
    /// (shorter than openraft's own lease, which is `election_timeout_max`).
    pub(crate) fn lease_valid(&self) -> bool {
        matches!(self.quorum_ack_age(), Some(Some(age)) if age < self.reads.lease)
    }

    /// Whether this node leads but no quorum has acknowledged it for `silence` (it was cut off
    /// from its followers, or they stopped): writes and reads it took would only wait out
    /// their timeout. A leader no quorum has acknowledged yet (a fresh one) is not silent.
    pub(crate) fn quorum_silent_for(&self, silence: Duration) -> bool {
        matches!(self.quorum_ack_age(), Some(Some(age)) if age >= silence)
    }

    /// How long ago a quorum last acknowledged this node as leader: `None` if it does not
    /// lead, `Some(None)` if no quorum has yet; zero for a sole voter, its own quorum
    /// (openraft does not refresh the ack time of an idle one).
    fn quorum_ack_age(&self) -> Option<Option<Duration>> {
        let leader = self.raft.as_leader().ok()?;
        let sole_voter = {
            let metrics = self.raft.server_metrics();
            let m = metrics.borrow_watched();
            m.membership_config.membership().voter_ids().count() == 1
        };
        if sole_voter {
            return Some(Some(Duration::ZERO));
        }
        Some(leader.last_quorum_acked().map(|t| t.elapsed()))
    }

    pub(crate) fn role_changes(&self) -> RoleChanges {
        RoleChanges(self.raft.server_metrics())
    }

    /// Resolves once this group's Raft core has ended: with openraft's reason if it stopped
    /// by itself (a storage error, a panic), `None` after [`RaftGroup::shutdown`]. Wakes on
    /// role changes only (the server metrics), never per entry; the core drops that channel
    /// when it ends, after recording why in the full metrics.
    pub(crate) async fn stopped(&self) -> Option<String> {
        let mut roles = self.role_changes();
        while roles.changed().await.is_ok() {}
        let metrics = self.raft.metrics();
        let running = metrics.borrow_watched().running_state.clone();
        match running {
            Err(openraft::error::Fatal::Stopped) => None,
            Err(e) => Some(e.to_string()),
            Ok(()) => Some("its Raft core ended without saying why".into()),
        }
    }

    /// `(the group's commit as its leader last reported it, the index applied here)`; the
    /// first is `None` before this replica has heard of any.
    pub(crate) fn commit_progress(&self) -> (Option<u64>, u64) {
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        (
            m.cluster_committed.as_ref().map(|l| l.index),
            m.last_applied.as_ref().map_or(0, |l| l.index),
        )
    }

    /// Serves one openraft RPC from a peer (postcard in, postcard out).
    /// `from`: the calling node as the peer port admitted it (`None`: not known, nothing to
    /// check); a message speaking for another node is refused.
    pub(crate) async fn serve(
        &self,
        rpc: RaftRpc,
        payload: &[u8],
        from: Option<NodeId>,
    ) -> Result<(Vec<u8>, bool), tonic::Status> {
        network::serve(&self.raft, &self.named, rpc, payload, from).await
    }

    pub(crate) async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            info!(error = %e, "raft shutdown");
        }
        // The committed index waits in the log's buffer for the next append; a clean stop
        // writes it, so a restarted replica re-applies its whole committed log at once.
        let log = self.log.lock().expect("log handle poisoned").take();
        if let Some(log) = log {
            if let Err(e) = log.flush_and_wait().await {
                info!(error = %e, "log flush at shutdown");
            }
        }
    }
}

/// Proposes entries while proposals are waiting, one at a time; each entry carries every
/// proposal waiting when it is formed, once a node slot is free ([`EntrySlots`]). One of the
/// group's [`MAX_ENTRIES_IN_FLIGHT`] slots.
async fn write_entries(
    raft: Raft,
    replica: Arc<Replica>,
    writes: Arc<Mutex<WriteQueue>>,
    slots: EntrySlots,
) {
    loop {
        let slot = slots.take().await;
        let batch: Vec<PendingWrite> = {
            let mut q = writes.lock().expect("write queue poisoned");
            q.waiting.retain(|w| !w.tx.is_closed());
            if q.waiting.is_empty() {
                q.in_flight -= 1;
                return;
            }
            let n = batch_len(q.waiting.iter().map(|w| &w.op));
            q.waiting.drain(..n).collect()
        };
        let (ops, txs): (Vec<Op>, Vec<_>) = batch.into_iter().map(|w| (w.op, w.tx)).unzip();
        match holding(slot, write_entry(&raft, &replica, ops)).await {
            Ok(replies) => {
                for (tx, r) in txs.into_iter().zip(replies) {
                    let _ = tx.send(Ok(r));
                }
            }
            Err(e) => {
                for tx in txs {
                    let _ = tx.send(Err(e.clone()));
                }
            }
        }
    }
}

/// Stamps and commits one entry of `ops` if this node leads; the replies are in the order of
/// `ops`.
async fn write_entry(
    raft: &Raft,
    replica: &Replica,
    ops: Vec<Op>,
) -> Result<Vec<Proposed>, WriteError> {
    let n = ops.len();
    let role = role_of(&raft.server_metrics().borrow_watched());
    if !role.is_leader {
        return Err(WriteError::NotLeader {
            leader: role.leader,
        });
    }
    // None until this term's leader duties are active: they start once its first entry is
    // applied, with every earlier term's entries in the table.
    let Some(now_ms) = replica.stamp(role.term) else {
        return Err(WriteError::NotLeader { leader: None });
    };
    let replies = match raft.client_write(Proposal { now_ms, ops }).await {
        Ok(resp) => resp.data.0,
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
            return Err(WriteError::NotLeader {
                leader: f.leader_id,
            })
        }
        Err(RaftError::APIError(ClientWriteError::LogEntryDiscarded(f))) => {
            return Err(WriteError::Discarded(format!(
                "the entry was appended and then discarded by a new leader ({:?})",
                f.leader_id
            )))
        }
        Err(RaftError::APIError(e)) => return Err(WriteError::Fatal(e.to_string())),
        Err(RaftError::Fatal(e)) => return Err(WriteError::Fatal(e.to_string())),
    };
    if replies.len() != n {
        return Err(WriteError::Fatal(format!(
            "an entry of {n} ops applied with {} replies",
            replies.len()
        )));
    }
    Ok(replies)
}

/// Answers batches of reads while reads are waiting; each batch answers the reads that were
/// waiting when it started.
async fn read_batches(p: ReadPath) {
    loop {
        let waiting = {
            let mut q = p.queue.lock().expect("read queue poisoned");
            if q.waiting.is_empty() {
                q.running = false;
                return;
            }
            std::mem::take(&mut q.waiting)
        };
        let n = waiting.len() as u64;
        // Boxed: openraft's linearizer future is deep, and every handler that reads nests it.
        let r = match Box::pin(p.lease_index()).await {
            Some(index) => {
                p.counts[0].fetch_add(n, Ordering::Relaxed);
                Ok(index)
            }
            None => {
                p.counts[1].fetch_add(n, Ordering::Relaxed);
                read_index_round(&p.raft).await
            }
        };
        for w in waiting {
            let _ = w.send(r.clone());
        }
    }
}

impl ReadPath {
    /// A lease read: the read index without a round, when a quorum acknowledged a message this
    /// leader sent less than the keepalive lease before openraft takes the request. The voters
    /// of that quorum refuse any other candidate for `election_timeout_max` after they received
    /// it (`raft/network.rs` honours a transfer vote only from the named successor), so no
    /// newer leader can have committed anything by then: openraft's read index (its commit
    /// index, at least its own first entry of the term) covers every write acknowledged
    /// before the read began. The lease is `election_timeout_min`, half the voters': that
    /// margin absorbs clock rate differences between nodes (INVARIANTS.md, S13). `None` when
    /// the lease does not hold (or on a follower): the caller runs a round.
    async fn lease_index(&self) -> Option<u64> {
        if self.unchecked && role_of(&self.raft.server_metrics().borrow_watched()).is_leader {
            let m = self.raft.data_metrics();
            let committed = m.borrow_watched().local_committed.as_ref().map(|c| c.index);
            return Some(committed.unwrap_or(0));
        }
        let lease = openraft::LinearizerOption::new(Some(self.lease), false)
            .with_wait_timeout(Duration::ZERO);
        let (read, _) = self.raft.get_read_log_id(lease).await.ok()?;
        Some(read.index())
    }
}

async fn read_index_round(raft: &Raft) -> Result<u64, WriteError> {
    match raft.ensure_linearizable(ReadPolicy::ReadIndex).await {
        Ok(read) => Ok(read.index()),
        Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(f))) => {
            Err(WriteError::NotLeader {
                leader: f.leader_id,
            })
        }
        Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(_))) => {
            Err(WriteError::NotLeader { leader: None })
        }
        Err(RaftError::Fatal(e)) => Err(WriteError::Fatal(e.to_string())),
    }
}

fn enc<T: Serialize>(v: &T) -> std::io::Result<Vec<u8>> {
    postcard::to_allocvec(v).map_err(std::io::Error::other)
}

fn dec<T: serde::de::DeserializeOwned>(b: &[u8]) -> std::io::Result<T> {
    postcard::from_bytes(b).map_err(std::io::Error::other)
}

/// A membership call an operator makes on a group (through the admin API).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum MemberCall {
    /// Only read the membership, as the leader sees it.
    Describe,
    /// Add node `id` at peer address `addr` as a learner, wait for it to catch up, promote it.
    Add { id: NodeId, addr: String },
    /// Remove node `id` (handing leadership away first if it leads).
    Remove { id: NodeId },
}

/// A group's membership as one replica sees it.
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
pub struct Membership {
    /// Voting members (in a joint configuration: of every part).
    pub voters: Vec<NodeId>,
    /// Members that receive the log but do not vote.
    pub learners: Vec<NodeId>,
    /// A change is half done: the old and new voter sets both decide (openraft's joint
    /// consensus). A leader that takes over finishes or repeats it by the next change.
    pub joint: bool,
    /// Every member's peer address, as the membership records it.
    pub addrs: BTreeMap<NodeId, String>,
    /// The leader this replica knows of.
    pub leader: Option<NodeId>,
    /// Filled in only by the leader: how many entries each other member is behind the
    /// leader's last log entry (`None` for one that has acknowledged nothing yet).
    pub lag: BTreeMap<NodeId, Option<u64>>,
    /// Filled in only by the leader: how long ago each other member last acknowledged a
    /// heartbeat or an append (`None` for one that never has since this leader took over).
    pub last_contact: BTreeMap<NodeId, Option<std::time::Duration>>,
    /// The log id of the entry that set this membership (zero for none): a later membership
    /// of the group has a larger one.
    pub config_id: lockd_core::ConfigId,
}

/// A member the leader has not heard from for this long counts as unreachable (ten
/// heartbeats at the default 100 ms).
pub const UNREACHABLE_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

impl Membership {
    /// Whether the leader heard from member `id` within [`UNREACHABLE_AFTER`] (the leader
    /// itself, which answers for the view: yes). `None` when this view was not read on the
    /// leader.
    pub fn reachable(&self, id: NodeId) -> Option<bool> {
        if self.leader == Some(id) {
            return Some(true);
        }
        let contact = self.last_contact.get(&id)?;
        Some(contact.is_some_and(|d| d < UNREACHABLE_AFTER))
    }

    /// Milliseconds since the leader last heard from member `id`, if known.
    pub fn last_contact_ms(&self, id: NodeId) -> Option<u64> {
        let d = (*self.last_contact.get(&id)?)?;
        Some(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    /// Every member, voters and learners, ascending.
    pub fn members(&self) -> Vec<NodeId> {
        let mut all: Vec<NodeId> = self.voters.iter().chain(&self.learners).copied().collect();
        all.sort_unstable();
        all.dedup();
        all
    }
}

/// Why a membership change was not made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum MemberError {
    /// Only the group's leader changes its membership; ask this one (if known).
    NotLeader { leader: Option<NodeId> },
    /// The change makes no sense for this membership (the message says why); nothing changed.
    Refused(String),
    /// The group could not finish the change; it may be half done, and repeating it is safe.
    Unavailable(String),
}

impl fmt::Display for MemberError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemberError::NotLeader { leader: Some(l) } => write!(f, "not the leader; node {l} is"),
            MemberError::NotLeader { leader: None } => f.write_str("not the leader; none known"),
            MemberError::Refused(why) => write!(f, "refused: {why}"),
            MemberError::Unavailable(why) => write!(f, "unavailable (repeat to resume): {why}"),
        }
    }
}

impl std::error::Error for MemberError {}

fn member_error(e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> MemberError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => MemberError::NotLeader {
            leader: f.leader_id,
        },
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            MemberError::Refused(e.to_string())
        }
        other => MemberError::Unavailable(other.to_string()),
    }
}

impl RaftGroup {
    /// The membership this replica has (the last one in its log, committed or not).
    /// Whether node `id` is a member (voter or learner) of the membership this replica knows:
    /// cheap (no copy), for routing on every call.
    /// This replica's node id.
    pub(crate) fn node_id(&self) -> crate::NodeId {
        self.raft.server_metrics().borrow_watched().id
    }

    pub(crate) fn is_member(&self, id: crate::NodeId) -> bool {
        let metrics = self.raft.server_metrics();
        let m = metrics.borrow_watched();
        m.membership_config.membership().get_node(&id).is_some()
    }

    pub(crate) fn membership(&self) -> Membership {
        let metrics = self.raft.server_metrics();
        let m = metrics.borrow_watched();
        let mem = m.membership_config.membership();
        let data = self.raft.data_metrics();
        let d = data.borrow_watched();
        let last = d.last_log.as_ref().map_or(0, |l| l.index);
        let lag = match (&d.replication, m.current_leader == Some(m.id)) {
            (Some(r), true) => r
                .iter()
                .filter(|(id, _)| **id != m.id)
                .map(|(id, matched)| {
                    let at = matched.as_ref().map(|l| l.index);
                    (*id, at.map(|i| last.saturating_sub(i)))
                })
                .collect(),
            _ => BTreeMap::new(),
        };
        let last_contact = match (&d.heartbeat, m.current_leader == Some(m.id)) {
            (Some(h), true) => h
                .iter()
                .filter(|(id, _)| **id != m.id)
                .map(|(id, at)| (*id, at.as_ref().map(|t| t.elapsed())))
                .collect(),
            _ => BTreeMap::new(),
        };
        Membership {
            voters: mem.voter_ids().collect(),
            learners: mem.learner_ids().collect(),
            joint: mem.get_joint_config().len() > 1,
            addrs: mem.nodes().map(|(id, n)| (*id, n.addr.clone())).collect(),
            leader: m.current_leader,
            lag,
            last_contact,
            config_id: m.membership_config.log_id().as_ref().map_or_else(
                lockd_core::ConfigId::default,
                |l| lockd_core::ConfigId {
                    term: l.leader_id.term,
                    index: l.index,
                },
            ),
        }
    }

    fn leader_or_refuse(&self) -> Result<(), MemberError> {
        let r = self.role();
        if r.is_leader {
            Ok(())
        } else {
            Err(MemberError::NotLeader { leader: r.leader })
        }
    }

    /// On the leader: adds node `id` (at peer address `addr`) as a learner and waits until it
    /// has caught up, by log or by snapshot. Repeating it for a present member changes nothing
    /// but its recorded address.
    pub(crate) async fn add_learner(&self, id: NodeId, addr: &str) -> Result<(), MemberError> {
        self.leader_or_refuse()?;
        // Not blocking: openraft's wait takes a learner that acknowledged nothing for caught up
        // on a short log, and waits forever on a long one. `Node::add_member` waits itself.
        self.raft
            .add_learner(id, BasicNode::new(addr), false)
            .await
            .map(|_| ())
            .map_err(member_error)
    }

    /// On the leader: makes learner `id` a voter (a no-op for a voter).
    pub(crate) async fn promote(&self, id: NodeId) -> Result<(), MemberError> {
        self.leader_or_refuse()?;
        let m = self.membership();
        if m.voters.contains(&id) && !m.joint {
            return Ok(());
        }
        if !m.learners.contains(&id) && !m.voters.contains(&id) {
            return Err(MemberError::Refused(format!(
                "node {id} is not a learner of this group; add it first"
            )));
        }
        let ids = std::collections::BTreeSet::from([id]);
        self.raft
            .change_membership(openraft::ChangeMembers::AddVoterIds(ids), false)
            .await
            .map(|_| ())
            .map_err(member_error)
    }

    /// On the leader: removes node `id` (voter or learner) from the group. A voter is refused
    /// if it is the last one, and the leader itself is refused: hand leadership away first
    /// ([`RaftGroup::transfer_leader`]), so the change never waits on an election.
    pub(crate) async fn remove(&self, id: NodeId) -> Result<(), MemberError> {
        self.leader_or_refuse()?;
        let m = self.membership();
        let ids = std::collections::BTreeSet::from([id]);
        if m.voters.contains(&id) {
            if m.voters.len() == 1 {
                return Err(MemberError::Refused(format!(
                    "node {id} is the group's only voter"
                )));
            }
            if self.role().leader == Some(id) {
                return Err(MemberError::Refused(format!(
                    "node {id} leads the group; transfer leadership first"
                )));
            }
            self.raft
                .change_membership(openraft::ChangeMembers::RemoveVoters(ids.clone()), false)
                .await
                .map_err(member_error)?;
        }
        if self.membership().learners.contains(&id) {
            self.raft
                .change_membership(openraft::ChangeMembers::RemoveNodes(ids), false)
                .await
                .map_err(member_error)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod batch_tests {
    use super::*;
    use lockd_core::{LockMode, SessionId};

    fn acquire(owner_bytes: usize) -> Op {
        Op::Acquire {
            session: SessionId(1),
            name: "n".into(),
            owner: "o".repeat(owner_bytes),
            mode: LockMode::Exclusive,
            wait_ms: 0,
            reentrant: false,
        }
    }

    /// A node's groups share its entry slot: an entry that cannot commit (its group lost its
    /// quorum) gives the slot up after SLOT_HOLD_MAX and keeps waiting; one that commits gives
    /// it back at once.
    #[tokio::test(start_paused = true)]
    async fn a_stuck_entry_gives_the_node_slot_up_and_a_done_one_at_once() {
        let slots = EntrySlots::default();
        let stuck = tokio::spawn(holding(slots.take().await, std::future::pending::<()>()));
        let early = tokio::time::timeout(SLOT_HOLD_MAX / 2, slots.take()).await;
        assert!(early.is_err(), "the slot went before SLOT_HOLD_MAX");
        let later = tokio::time::timeout(SLOT_HOLD_MAX, slots.take()).await;
        let slot = later.expect("the stuck entry kept the node's slot");
        assert!(!stuck.is_finished(), "the stuck entry stopped waiting");
        assert_eq!(holding(slot, async { 7 }).await, 7);
        let again = tokio::time::timeout(std::time::Duration::from_millis(1), slots.take()).await;
        assert!(again.is_ok(), "a finished entry kept the slot");
    }

    #[test]
    fn an_entry_is_bounded_in_ops_and_in_bytes_and_takes_at_least_one() {
        let small: Vec<Op> = (0..300).map(|_| acquire(10)).collect();
        assert_eq!(batch_len(small.iter()), MAX_ENTRY_OPS);
        assert_eq!(batch_len(small[..3].iter()), 3);
        assert_eq!(batch_len(std::iter::empty()), 0);
        // Ops of ~400 KiB each (bigger than any client sends; a move's export can be): two fit.
        let big: Vec<Op> = (0..5).map(|_| acquire(400 << 10)).collect();
        assert_eq!(batch_len(big.iter()), 2);
        // One op over the bound still goes, alone.
        let huge = [acquire(2 << 20), acquire(10)];
        assert_eq!(batch_len(huge.iter()), 1);
    }
}
