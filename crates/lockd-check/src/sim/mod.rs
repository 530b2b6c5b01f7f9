//! `lockd-check sim`: a deterministic in-process simulation of a real lockd cluster.
//!
//! Per seed, one current-thread tokio runtime with paused (virtual) time runs 3 or 5 real
//! `lockd_raft::Node`s (openraft + lockd-core) of two lock groups (plus the meta group), wired
//! through lockd-raft's seams: a simulated network (`net`), in-memory storage with a modelled
//! fsync (`lockd_raft::MemStorage`), a per-node clock rate and a seeded openraft RNG. Only the
//! network, the disk and the clock are simulated.
//!
//! Simulated clients open sessions, keep them alive every TTL/3, take and release names (try
//! and wait), keep lockd-client's local deadline (send time of the last acknowledged open or
//! keepalive + TTL − TTL/5) and write to a fenced store only while they believe they hold the
//! lock. A seeded nemesis injects message loss and delay bursts, partitions (also isolating the
//! leader), crashes with restart, node and client pauses longer than the TTL, and clock-rate
//! skew within ±5 %, and topology faults: a name's bucket moves to the other group while in
//! use (lockd-server's own mover, which finishes what an earlier interrupted move left), or a
//! move is aborted after the freeze; and membership changes of any group (meta included): a
//! node joins (learner, then voter) and a voter leaves, the leader too. A spare node, started
//! as a joiner, gives the changes somewhere to go, so replica sets wander over the nodes. Clients route as a node does (the home node's shard map,
//! re-read on `wrong_group` / `bucket_moving`).
//!
//! Checked online: lockd-core's invariants after every apply on every replica (S1, ...), tokens
//! per name strictly rising (S2), identical entry and state hash for every replica at the same
//! log index (S9); at the end, after healing: every acknowledged grant is in the committed log
//! and applied on every replica (S3), no two clients believed they held a name at the same time
//! (C1 / mutual exclusion), and the store never accepted a stale write. The recorded
//! [`History`] then goes through the regular checker.

mod net;

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use lockd_core::{
    Applied, Command, Effect, LockMode, LockTable, Op, Reply, SessionId, WaitEndReason,
};
use lockd_raft::{EffectSink, GroupError, GroupId, MemStorage, Node, NodeConfig, NodeId, Storage};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::checker::{self, Budget, Report, Signature};
use crate::history::{Call, History, Outcome, ProcessId, Record, StoreOp};
use net::SimNet;

/// The lock groups. Names start where the initial shard map puts them and move between the
/// groups (nemesis `move`), so S1 and S2 are checked per name across groups.
const GROUPS: [GroupId; 2] = [1, 2];
/// The group of the service records (`SvcGrant`, ...) the checker reads: one for every group,
/// so that its per-(group, name) checks follow a name across groups.
const NAME_VIEW: u64 = 1;
/// Session TTL of every client.
const TTL: Duration = Duration::from_secs(5);
/// Names the clients contend for.
const NAMES: [&str; 2] = ["a", "b"];
/// Clients per seed.
const CLIENTS: u64 = 4;
/// Tasks doing linearizable reads (next to the clients), so reads overlap.
const READERS: u64 = 2;
/// Bound on one client call (propose, keepalive) before its outcome is unknown.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Nodes beyond the founding replicas: started as joiners (members of no group), they enter
/// groups by the nemesis' member changes, as others leave.
const SPARE_NODES: u64 = 1;

/// A deliberate bug, to show the simulation catches it (negative control).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sabotage {
    /// Clients ignore their local deadline (and a lost session) while they hold a lock.
    ClientDeadline,
    /// Leaders acknowledge keepalives without their leader-lease check.
    LeaderLease,
    /// The store accepts writes with stale tokens.
    StoreFence,
    /// Reads answer from the local replica without a ReadIndex round.
    StaleRead,
    /// The mover does not carry the sending group's revision to the receiving one, so the
    /// receiving group mints tokens of moved names from its own, lower revision (S2).
    RevisionFloor,
    /// Lock groups serve names of buckets they do not own (no ownership check), so a node
    /// with a stale map sends a name to a group that has given it away (S1).
    Ownership,
}

impl Sabotage {
    /// The violation this sabotage must cause for a seed to count as caught.
    pub fn signature(self) -> Signature {
        match self {
            Sabotage::ClientDeadline => Signature::BeliefOverlap,
            Sabotage::LeaderLease => Signature::GrantWhileBelieved,
            Sabotage::StoreFence => Signature::StaleWrite,
            Sabotage::StaleRead => Signature::StaleRead,
            Sabotage::RevisionFloor => Signature::TokenRegression,
            Sabotage::Ownership => Signature::DoubleGrant,
        }
    }

    /// The `--sabotage` spelling.
    pub fn name(self) -> &'static str {
        match self {
            Sabotage::ClientDeadline => "client-deadline",
            Sabotage::LeaderLease => "leader-lease",
            Sabotage::StoreFence => "store-fence",
            Sabotage::StaleRead => "stale-read",
            Sabotage::RevisionFloor => "revision-floor",
            Sabotage::Ownership => "ownership",
        }
    }

    /// Parses the `--sabotage` spelling.
    pub fn parse(s: &str) -> Option<Sabotage> {
        [
            Sabotage::ClientDeadline,
            Sabotage::LeaderLease,
            Sabotage::StoreFence,
            Sabotage::StaleRead,
            Sabotage::RevisionFloor,
            Sabotage::Ownership,
        ]
        .into_iter()
        .find(|k| k.name() == s)
    }
}

/// One seed's setup.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub seed: u64,
    /// 3 or 5.
    pub replicas: u64,
    pub sabotage: Option<Sabotage>,
    /// Simulated time the clients and the nemesis run (healing and checks come after).
    pub run_for: Duration,
}

impl SimConfig {
    /// Defaults: 3 replicas, 20 s of faults, no sabotage.
    pub fn new(seed: u64) -> SimConfig {
        SimConfig {
            seed,
            replicas: 3,
            sabotage: None,
            run_for: Duration::from_secs(20),
        }
    }

    /// The command that replays this seed.
    pub fn replay_command(&self) -> String {
        let mut s = format!(
            "lockd-check sim --seed {} --replicas {}",
            self.seed, self.replicas
        );
        if let Some(k) = self.sabotage {
            s.push_str(&format!(" --sabotage {}", k.name()));
        }
        s
    }
}

/// What one seed produced.
#[derive(Debug)]
pub struct SeedOutcome {
    pub seed: u64,
    /// Client operations recorded (acquires, releases, writes).
    pub ops: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, u64>,
    /// Violations found by the simulator's own checks.
    pub violations: Vec<String>,
    /// The kinds of violation found (the simulator's own and the checker's), sorted.
    pub signatures: Vec<Signature>,
    /// Hash of every applied entry (per replica) and every client event, with its time.
    pub digest: u64,
    /// The regular checker's report on the recorded history.
    pub report: Report,
    pub history: History,
    /// Entries applied, summed over replicas.
    pub applies: u64,
    /// Linearizable reads that answered (each checked against the grants acknowledged before
    /// it began).
    pub reads: u64,
}

impl SeedOutcome {
    /// Whether the seed failed (own checks or the checker).
    pub fn failed(&self) -> bool {
        !self.violations.is_empty() || self.report.has_violations()
    }

    /// Whether the seed passed but a linearizability verdict is unknown.
    pub fn unknown(&self) -> bool {
        !self.failed() && self.report.is_unknown()
    }

    /// Whether the seed shows the signature violation of `sabotage`.
    pub fn caught(&self, sabotage: Sabotage) -> bool {
        self.signatures.contains(&sabotage.signature())
    }
}

/// Runs one seed on a fresh current-thread runtime with paused time.
pub fn run_seed(cfg: &SimConfig) -> anyhow::Result<SeedOutcome> {
    anyhow::ensure!(
        cfg.replicas == 3 || cfg.replicas == 5,
        "--replicas must be 3 or 5"
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?;
    lockd_raft::seed_thread_rng(Some(cfg.seed ^ 0x0005_eed0_f0a5_70ad));
    let out = rt.block_on(simulate(cfg.clone()));
    lockd_raft::seed_thread_rng(None);
    // Dropping the runtime cancels whatever is left (tasks of stopped nodes).
    drop(rt);
    out
}

// ------------------------------------------------------------------------------------------
// The world: shared state of one seed.

struct Hold {
    name: String,
    process: ProcessId,
    token: u64,
    from: Instant,
    to: Instant,
}

/// The fenced store: per key, the highest token seen.
#[derive(Default)]
struct Store {
    keys: BTreeMap<String, u64>,
    seq: u64,
}

/// What the first replica to apply each command saw, by (index, slot); the others must see the
/// same (S9).
#[derive(Default)]
struct Audit {
    first: BTreeMap<(GroupId, u64, usize), (u64, u64)>,
    /// Current holder of each name: (token, session, group), from the service's view. The
    /// group is 0 while a move carries the hold from one group to another.
    holds: BTreeMap<String, (u64, SessionId, GroupId)>,
    last_token: BTreeMap<String, u64>,
    /// Every grant in the committed log: (name, token) -> (group, index).
    grants: BTreeMap<(String, u64), (GroupId, u64)>,
    /// Sessions by the groups that have them open (a session expired in every group is gone).
    open_in: BTreeMap<SessionId, std::collections::BTreeSet<GroupId>>,
    /// Frozen moves: id -> (sending group, buckets).
    moves: BTreeMap<lockd_core::MoveId, (GroupId, lockd_core::BucketSet)>,
    /// Moves already imported (a repeated import changes nothing).
    imported: std::collections::BTreeSet<lockd_core::MoveId>,
    /// Service records in first-apply order (log order within each group).
    seq: u64,
    applies: u64,
}

struct World {
    cfg: SimConfig,
    t0: Instant,
    rng: Mutex<fastrand::Rng>,
    net: Arc<SimNet>,
    disks: BTreeMap<NodeId, Arc<MemStorage>>,
    records: Mutex<Vec<Record>>,
    digest: Mutex<DefaultHasher>,
    audit: Mutex<Audit>,
    /// Ended waits seen by each node's sink: (node, group, waiter) -> token if granted.
    waits: Mutex<BTreeMap<(NodeId, GroupId, u64), Option<u64>>>,
    wait_notify: Notify,
    store: Mutex<Store>,
    violations: Mutex<Vec<String>>,
    signatures: Mutex<std::collections::BTreeSet<Signature>>,
    holds: Mutex<Vec<Hold>>,
    /// Acknowledged grants: (name, token, group that granted it).
    acked_grants: Mutex<Vec<(String, u64, GroupId)>>,
    faults: Mutex<BTreeMap<String, u64>>,
    ops: AtomicU64,
    reads: AtomicU64,
    next_op: AtomicU64,
    stop: AtomicBool,
    /// Client index -> paused until.
    client_pause: Mutex<BTreeMap<u64, Instant>>,
    /// Client index -> a pause that starts at its next store write, right after the deadline
    /// check (the GC pause fencing exists for).
    pending_pause: Mutex<BTreeMap<u64, Duration>>,
    /// With `SIM_TRACE=path`, every digested event as text (to find where two runs diverge).
    trace: Mutex<Option<Vec<String>>>,
    /// Every session a client opened, with its local deadline (checked when it expires: C1).
    sessions: Mutex<BTreeMap<SessionId, Arc<Session>>>,
}

impl World {
    /// Every node of the simulation: the founders, then the spares.
    fn node_count(&self) -> u64 {
        self.cfg.replicas + SPARE_NODES
    }

    /// A random node id.
    fn any_node(&self) -> NodeId {
        self.rand_u64(1..self.node_count() + 1)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn hash_of(v: &impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

impl World {
    fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.t0).as_nanos() as u64
    }

    fn now_ns(&self) -> u64 {
        self.ns(Instant::now())
    }

    fn trace(&self, line: String) {
        if let Some(t) = lock(&self.trace).as_mut() {
            t.push(line);
        }
    }

    fn push(&self, rec: Record) {
        lock(&self.digest).write(format!("{rec:?}").as_bytes());
        self.trace(format!("{rec:?}"));
        lock(&self.records).push(rec);
    }

    fn violation(&self, what: String) {
        let mut v = lock(&self.violations);
        if v.len() < 50 {
            v.push(format!("{what} (t={:.3}s)", self.now_ns() as f64 / 1e9));
        }
    }

    /// A violation of a known kind (a negative control's signature).
    fn violation_of(&self, kind: Signature, what: String) {
        lock(&self.signatures).insert(kind);
        self.violation(what);
    }

    fn fault(&self, kind: &str, target: String) {
        *lock(&self.faults).entry(kind.to_string()).or_insert(0) += 1;
        self.push(Record::Fault {
            kind: kind.into(),
            at_ns: self.now_ns(),
            target,
            verified: true,
        });
    }

    fn rand_u64(&self, r: std::ops::Range<u64>) -> u64 {
        lock(&self.rng).u64(r)
    }

    fn rand_ms(&self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.rand_u64(lo..hi))
    }

    fn chance(&self, p: f64) -> bool {
        lock(&self.rng).f64() < p
    }

    fn invoke(&self, process: ProcessId, call: Call) -> u64 {
        let op = self.next_op.fetch_add(1, Ordering::Relaxed);
        self.ops.fetch_add(1, Ordering::Relaxed);
        self.push(Record::Invoke {
            process,
            op,
            at_ns: self.now_ns(),
            call,
        });
        op
    }

    fn complete(&self, process: ProcessId, op: u64, outcome: Outcome) {
        self.push(Record::Complete {
            process,
            op,
            at_ns: self.now_ns(),
            outcome,
        });
    }

    /// One command applied on `node` to group `group` at `(index, slot)`: the `slot`th command
    /// of the log entry at `index` (the audit hook of its sink).
    fn audited(
        &self,
        node: NodeId,
        group: GroupId,
        (index, slot): (u64, usize),
        cmd: &Command,
        applied: &Applied,
        t: &LockTable,
    ) {
        if let Err(v) = t.check_invariants() {
            self.violation(format!(
                "invariant broken on node {node} group {group} at index {index}: {v:?}"
            ));
        }
        if slot >= 256 {
            self.violation(format!("entry {index} carries more than 256 commands"));
        }
        let entry = hash_of(&format!(
            "{cmd:?}|{:?}|{:?}",
            applied.reply, applied.effects
        ));
        let state = t.state_hash();
        lock(&self.digest).write_u64(hash_of(&(
            node,
            group,
            index,
            slot,
            entry,
            state,
            self.now_ns(),
        )));
        self.trace(format!(
            "{} node {node} group {group} applied {index}.{slot}: {cmd:?} -> {:?} state {state:x}",
            self.now_ns(),
            applied.reply
        ));
        let mut a = lock(&self.audit);
        a.applies += 1;
        if let Some(&(e0, s0)) = a.first.get(&(group, index, slot)) {
            if (e0, s0) != (entry, state) {
                drop(a);
                self.violation(format!(
                    "S9: node {node} applied a different command or reached a different state \
                     in group {group} at index {index} slot {slot}"
                ));
            }
            return;
        }
        a.first.insert((group, index, slot), (entry, state));
        if group == lockd_raft::META_GROUP {
            return;
        }
        // Service records, from the first replica to apply this command, in first-apply order
        // over every group (each group's log order), all under one group (NAME_VIEW) so that
        // the checker follows a name that moves between groups.
        let mut recs = Vec::new();
        let time_ms = cmd.now_ms;
        let mut s2 = Vec::new();
        let mut s1 = Vec::new();
        match (&cmd.op, &applied.reply) {
            (Op::OpenSession { session, .. }, Ok(Reply::SessionOpened { .. })) => {
                a.open_in.entry(*session).or_default().insert(group);
            }
            (
                Op::FreezeBuckets {
                    move_id, buckets, ..
                },
                Ok(Reply::BucketsFrozen { .. }),
            ) => {
                // The holds leave this group's table for the move's export.
                for (n, h) in a.holds.iter_mut() {
                    if h.2 == group && buckets.contains(lockd_core::bucket_of(n)) {
                        h.2 = 0;
                    }
                }
                a.moves
                    .entry(*move_id)
                    .or_insert_with(|| (group, buckets.clone()));
            }
            (Op::ThawBuckets { move_id }, Ok(Reply::BucketsThawed { .. })) => {
                // The holds come back, but a holder whose session ended meanwhile does not.
                if let Some((from, buckets)) = a.moves.remove(move_id) {
                    let back: Vec<String> = a
                        .holds
                        .iter()
                        .filter(|(n, h)| h.2 == 0 && buckets.contains(lockd_core::bucket_of(n)))
                        .map(|(n, _)| n.clone())
                        .collect();
                    for n in back {
                        let token = a.holds[&n].0;
                        let kept = t
                            .lock_info(&n, cmd.now_ms)
                            .is_some_and(|i| i.holders.iter().any(|h| h.token == token));
                        if kept {
                            if let Some(h) = a.holds.get_mut(&n) {
                                h.2 = from;
                            }
                        } else {
                            a.holds.remove(&n);
                            recs.push(Record::SvcRelease {
                                seq: 0,
                                group: NAME_VIEW,
                                name: n,
                                token,
                                cause: "thaw-dropped".into(),
                                time_ms,
                            });
                        }
                    }
                }
            }
            (
                Op::ImportBuckets {
                    move_id, export, ..
                },
                Ok(Reply::BucketsImported { .. }),
            ) if a.imported.insert(*move_id) => {
                // The first import only: a repeat (a second mover finishing the same move) is
                // a no-op in the group, and the holds may have changed hands since.
                a.moves.remove(move_id);
                for l in &export.locks {
                    for h in &l.holders {
                        a.holds
                            .insert(l.name.to_string(), (h.token, h.session, group));
                        a.open_in.entry(h.session).or_default().insert(group);
                    }
                }
            }
            _ => {}
        }
        if let Ok(Reply::SessionsExpired { expired }) = &applied.reply {
            // C1 directly: a session must not expire while its client's own deadline, set by
            // the keepalives a leader acknowledged, still runs.
            for s in expired {
                let deadline = lock(&self.sessions).get(s).map(|c| *lock(&c.deadline));
                if let Some(d) = deadline.filter(|d| *d > Instant::now()) {
                    self.violation_of(
                        Signature::GrantWhileBelieved,
                        format!(
                            "C1: session {s} expired in group {group} at {:.3}s while its \
                             client's deadline ran to {:.3}s",
                            self.now_ns() as f64 / 1e9,
                            self.ns(d) as f64 / 1e9
                        ),
                    );
                }
            }
        }
        if let (Op::Release { name, token, .. }, Ok(Reply::Released { remaining: 0 })) =
            (&cmd.op, &applied.reply)
        {
            a.holds.remove(name);
            recs.push(Record::SvcRelease {
                seq: 0,
                group: NAME_VIEW,
                name: name.clone(),
                token: *token,
                cause: "release".into(),
                time_ms,
            });
        }
        for e in &applied.effects {
            if let Effect::SessionEnded {
                session, reason, ..
            } = e
            {
                let ended: Vec<String> = a
                    .holds
                    .iter()
                    .filter(|(_, (_, s, g))| s == session && *g == group)
                    .map(|(n, _)| n.clone())
                    .collect();
                for n in ended {
                    let token = a.holds.remove(&n).map_or(0, |h| h.0);
                    recs.push(Record::SvcRelease {
                        seq: 0,
                        group: NAME_VIEW,
                        name: n,
                        token,
                        cause: format!("{reason:?}").to_lowercase(),
                        time_ms,
                    });
                }
                // Expired in its last group: from now on no group may grant to it.
                let gone = a.open_in.get_mut(session).is_some_and(|gs| {
                    gs.remove(&group);
                    gs.is_empty()
                });
                if gone && *reason == lockd_core::SessionEndReason::Expired {
                    recs.push(Record::SvcSessionExpired {
                        seq: 0,
                        group: NAME_VIEW,
                        session: session.to_string(),
                        time_ms,
                    });
                }
            }
        }
        let mut grants = Vec::new();
        if let (Op::Acquire { session, name, .. }, Ok(Reply::Acquired { token, .. })) =
            (&cmd.op, &applied.reply)
        {
            grants.push((name.clone(), *token, *session));
        }
        for e in &applied.effects {
            if let Effect::Granted {
                session,
                name,
                token,
                ..
            } = e
            {
                grants.push((name.to_string(), *token, *session));
            }
        }
        for (name, token, session) in grants {
            let last = a.last_token.get(&name).copied().unwrap_or(0);
            if token <= last {
                s2.push(format!(
                    "S2: group {group} granted {name} token {token} at index {index} after token \
                     {last}"
                ));
            }
            if let Some((held, _, g)) = a.holds.get(&name).filter(|h| h.2 != group) {
                s1.push(format!(
                    "S1: group {group} granted {name} token {token} at index {index} while \
                     group {g} held it with token {held}"
                ));
            }
            a.last_token.insert(name.clone(), token);
            a.holds.insert(name.clone(), (token, session, group));
            a.grants.insert((name.clone(), token), (group, index));
            recs.push(Record::SvcGrant {
                seq: 0,
                group: NAME_VIEW,
                name,
                token,
                session: session.to_string(),
                limit: 1,
                time_ms,
            });
        }
        for r in &mut recs {
            a.seq += 1;
            match r {
                Record::SvcGrant { seq, .. }
                | Record::SvcRelease { seq, .. }
                | Record::SvcSessionExpired { seq, .. } => *seq = a.seq,
                _ => {}
            }
        }
        drop(a);
        for v in s2 {
            self.violation_of(Signature::TokenRegression, v);
        }
        for v in s1 {
            self.violation_of(Signature::DoubleGrant, v);
        }
        for r in recs {
            self.push(r);
        }
    }

    /// A write to the fenced store.
    fn store_write(&self, process: ProcessId, key: &str, token: u64, value: String) -> bool {
        let op = self.invoke(
            process,
            Call::Write {
                key: key.into(),
                token: Some(token),
                fenced: true,
                value: value.clone(),
                add: None,
            },
        );
        let (accepted, fence_before, seq) = {
            let mut st = lock(&self.store);
            st.seq += 1;
            let seq = st.seq;
            let fence = st.keys.entry(key.to_string()).or_insert(0);
            let before = *fence;
            let ok = token >= before || self.cfg.sabotage == Some(Sabotage::StoreFence);
            if ok {
                *fence = before.max(token);
            }
            (ok, before, seq)
        };
        if accepted && token < fence_before {
            self.violation_of(
                Signature::StaleWrite,
                format!(
                    "store accepted a stale write to {key}: token {token} < fence {fence_before}"
                ),
            );
        }
        self.push(Record::StoreLog {
            seq,
            key: key.into(),
            op: StoreOp::Write,
            token: Some(token),
            fenced: true,
            accepted,
            fence_before,
            value: Some(value),
        });
        self.complete(
            process,
            op,
            if accepted {
                Outcome::Accepted
            } else {
                Outcome::RejectedStale
            },
        );
        accepted
    }

    /// Starts client `idx`'s pending pause, if any, then sleeps through it.
    async fn write_pause_point(&self, idx: u64) {
        if let Some(d) = lock(&self.pending_pause).remove(&idx) {
            let until = Instant::now() + d;
            lock(&self.client_pause).insert(idx, until);
        }
        self.pause_point(idx).await
    }

    /// Sleeps while client `idx` is paused (its process is stopped).
    async fn pause_point(&self, idx: u64) {
        loop {
            let until = lock(&self.client_pause).get(&idx).copied();
            match until {
                Some(u) if u > Instant::now() => tokio::time::sleep_until(u).await,
                _ => return,
            }
        }
    }
}

/// Each replica's effect sink: routes wait results to the waiting client, feeds the audit.
struct SimSink {
    node: NodeId,
    world: Weak<World>,
}

impl EffectSink for SimSink {
    fn applied(&self, group: GroupId, effects: &[Effect]) {
        let Some(w) = self.world.upgrade() else {
            return;
        };
        if group == lockd_raft::META_GROUP {
            return;
        }
        let mut any = false;
        for e in effects {
            let (waiter, token) = match e {
                Effect::Granted { waiter, token, .. } => (waiter, Some(*token)),
                Effect::WaitEnded { waiter, reason, .. } => {
                    let _: &WaitEndReason = reason;
                    (waiter, None)
                }
                Effect::SessionEnded { .. } | Effect::SessionAdopted { .. } => continue,
            };
            lock(&w.waits).insert((self.node, group, *waiter), token);
            any = true;
        }
        if any {
            w.wait_notify.notify_waiters();
        }
    }

    fn applied_entry(
        &self,
        group: GroupId,
        index: u64,
        slot: usize,
        cmd: &Command,
        applied: &Applied,
        table: &LockTable,
    ) {
        if let Some(w) = self.world.upgrade() {
            w.audited(self.node, group, (index, slot), cmd, applied, table);
        }
    }
}

// ------------------------------------------------------------------------------------------
// Nodes

async fn start_node(w: &Arc<World>, id: NodeId) -> anyhow::Result<()> {
    // The founders know each other; a spare knows them and itself, and joins no group by
    // itself (`--initial-cluster-state existing`).
    let peers: BTreeMap<NodeId, String> = (1..=w.cfg.replicas)
        .chain((id > w.cfg.replicas).then_some(id))
        .map(|i| (i, format!("sim-node-{i}")))
        .collect();
    let mut cfg = NodeConfig::new(id, "/nonexistent/lockd-sim", peers);
    cfg.join_existing = id > w.cfg.replicas;
    cfg.storage = Storage::Memory(w.disks[&id].clone());
    cfg.snapshot_every = 200;
    cfg.lock_groups = GROUPS.len() as u32;
    cfg.skip_leader_lease_check = w.cfg.sabotage == Some(Sabotage::LeaderLease);
    cfg.skip_ownership_check = w.cfg.sabotage == Some(Sabotage::Ownership);
    // Clock-rate skew within ±5 %, drawn per incarnation.
    let skew = (w.rand_u64(0..10_001) as f64 - 5_000.0) / 100_000.0;
    cfg.clock_rate = 1.0 + skew;
    if skew.abs() >= 0.01 {
        w.fault(
            "clock_skew",
            format!("node {id} rate {:.4}", cfg.clock_rate),
        );
    }
    let sink = Arc::new(SimSink {
        node: id,
        world: Arc::downgrade(w),
    });
    let node = Node::start_with_transport(cfg, sink, w.net.link(id))
        .await
        .map_err(|e| anyhow::anyhow!("node {id} failed to start: {e}"))?;
    w.net.up(id, node);
    Ok(())
}

async fn crash_node(w: &Arc<World>, id: NodeId) {
    w.disks[&id].crash();
    if let Some(node) = w.net.down(id) {
        node.shutdown().await;
    }
}

/// The leader of `group`: of the replicas that think they lead, the one of the newest term (a
/// replica cut off, or removed from the group while cut off, may still think it leads).
fn leader_of(w: &World, group: GroupId) -> Option<NodeId> {
    (1..=w.node_count())
        .filter_map(|id| {
            let g = w.net.node(id)?.1.group(group)?;
            let st = g.status();
            st.is_leader.then_some((st.term, id))
        })
        .max()
        .map(|(_, id)| id)
}

// ------------------------------------------------------------------------------------------
// Clients

/// One call on `group` through a client's home node; `None` if it did not answer in time.
async fn client_call<T, F, Fut>(
    w: &World,
    home: NodeId,
    group: GroupId,
    f: F,
) -> Option<Result<T, GroupError>>
where
    F: FnOnce(Arc<lockd_raft::Group>) -> Fut,
    Fut: std::future::Future<Output = Result<T, GroupError>>,
{
    let deadline = Instant::now() + CALL_TIMEOUT;
    // The client's request reaches a paused node only when it resumes.
    while w.net.is_paused(home) {
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let Some((_, node)) = w.net.node(home) else {
        return Some(Err(GroupError::Unavailable("node down".into())));
    };
    let group = node.group(group)?;
    drop(node);
    tokio::time::timeout_at(deadline, f(group)).await.ok()
}

/// The group `name` routes to by `home`'s replica of the meta group (the node's own view, as
/// a lockd node routes); `fresh`: by the meta leader's map (after a refusal). Falls back to
/// the initial map while none is set.
async fn route(w: &World, home: NodeId, name: &str, fresh: bool) -> GroupId {
    let initial = || lockd_core::ShardMap::initial(GROUPS.len() as u32).group_of(name);
    let Some((_, node)) = w.net.node(home) else {
        return initial();
    };
    let Some(mut meta) = node.group(lockd_raft::META_GROUP) else {
        return initial();
    };
    drop(node);
    // A stranded replica sends its reads elsewhere, as a node's route does: here, the leader's.
    if fresh && meta.is_stranded() {
        if let Some(g) = leader_of(w, lockd_raft::META_GROUP)
            .and_then(|l| w.net.node(l))
            .and_then(|(_, n)| n.group(lockd_raft::META_GROUP))
        {
            meta = g;
        }
    }
    let owned = name.to_string();
    let g = if fresh {
        let read = meta.read(move |t| t.shard_map().map(|m| m.group_of(&owned)));
        tokio::time::timeout(CALL_TIMEOUT, read)
            .await
            .ok()
            .and_then(Result::ok)
            .flatten()
    } else {
        meta.read_local(|t| t.shard_map().map(|m| m.group_of(&owned)))
    };
    g.unwrap_or_else(initial)
}

/// Proposes `op` on `name` to the group that serves it, re-routing (with a fresh map) while
/// groups answer `wrong_group` or `bucket_moving`, as a lockd node does. Returns the group
/// last asked and its answer.
async fn propose_on_name(
    w: &World,
    home: NodeId,
    name: &str,
    op: Op,
) -> (GroupId, Option<lockd_raft::ProposeResult>) {
    let mut group = route(w, home, name, false).await;
    for round in 1..=20u64 {
        let attempt = op.clone();
        let r = client_call(w, home, group, |g| async move { g.propose(attempt).await }).await;
        match &r {
            Some(Ok(Err(
                lockd_core::Rejection::WrongGroup { .. }
                | lockd_core::Rejection::BucketMoving { .. },
            ))) if round < 20 => {
                tokio::time::sleep(Duration::from_millis(10 * round)).await;
                group = route(w, home, name, true).await;
            }
            _ => return (group, r),
        }
    }
    unreachable!("the last round returns")
}

struct Session {
    id: SessionId,
    /// Local deadline (lockd-client's rule).
    deadline: Mutex<Instant>,
    /// The service said the session is gone.
    gone: AtomicBool,
    abandoned: AtomicBool,
}

fn margin() -> Duration {
    TTL / 5
}

async fn keepalive_loop(w: Arc<World>, idx: u64, s: Arc<Session>, mut home: NodeId) {
    loop {
        tokio::time::sleep(TTL / 3).await;
        w.pause_point(idx).await;
        if s.abandoned.load(Ordering::Relaxed) || w.stop.load(Ordering::Relaxed) {
            return;
        }
        let sent = Instant::now();
        let sid = s.id;
        // The session lives in every group; a keepalive counts once every group took it
        // (lockd's rule: the lease is the shortest of the groups').
        let answers =
            futures_util::future::join_all(
                GROUPS.iter().map(|&g| {
                    let w = &w;
                    async move {
                        client_call(w, home, g, |g| async move { g.keepalive(sid).await }).await
                    }
                }),
            )
            .await;
        if answers
            .iter()
            .any(|a| matches!(a, Some(Err(GroupError::SessionNotFound))))
        {
            s.gone.store(true, Ordering::Relaxed);
            return;
        }
        let ttls: Option<Vec<u64>> = answers
            .into_iter()
            .map(|a| a.and_then(Result::ok))
            .collect();
        match ttls.and_then(|t| t.into_iter().min()) {
            Some(ttl_ms) => {
                let d = sent + Duration::from_millis(ttl_ms) - margin();
                let mut cur = lock(&s.deadline);
                *cur = (*cur).max(d);
            }
            None => home = w.any_node(),
        }
    }
}

async fn client(w: Arc<World>, idx: u64) {
    let sabotage = w.cfg.sabotage == Some(Sabotage::ClientDeadline);
    let mut pid: ProcessId = idx * 100_000;
    let mut home = 1 + idx % w.node_count();
    while !w.stop.load(Ordering::Relaxed) {
        pid += 1;
        w.pause_point(idx).await;
        let sid = SessionId(w.rand_u64(1..u64::MAX));
        let sent = Instant::now();
        let open = Op::OpenSession {
            session: sid,
            client: format!("c{idx}"),
            ttl_ms: TTL.as_millis() as u64,
            namespace: String::new(),
        };
        let opens =
            futures_util::future::join_all(
                GROUPS.iter().map(|&g| {
                    let (w, open) = (&w, open.clone());
                    async move {
                        client_call(w, home, g, |g| async move { g.propose(open).await }).await
                    }
                }),
            )
            .await;
        let ttls: Option<Vec<u64>> = opens
            .into_iter()
            .map(|r| match r {
                Some(Ok(Ok(Reply::SessionOpened { ttl_ms, .. }))) => Some(ttl_ms),
                _ => None,
            })
            .collect();
        // Opened in every group, or given up (a half-open session just expires).
        let Some(ttl) = ttls.and_then(|t| t.into_iter().min()) else {
            home = w.any_node();
            tokio::time::sleep(w.rand_ms(50, 300)).await;
            continue;
        };
        let ttl = Duration::from_millis(ttl);
        let s = Arc::new(Session {
            id: sid,
            deadline: Mutex::new(sent + ttl - margin()),
            gone: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
        });
        lock(&w.sessions).insert(sid, s.clone());
        tokio::spawn(keepalive_loop(w.clone(), idx, s.clone(), home));
        session_ops(&w, idx, &s, &mut pid, &mut home, sabotage).await;
        s.abandoned.store(true, Ordering::Relaxed);
        w.push(Record::ProcessEnd {
            process: pid,
            at_ns: w.now_ns(),
        });
    }
}

/// Operations on one session until it is lost, an outcome is unknown, or the run stops.
async fn session_ops(
    w: &Arc<World>,
    idx: u64,
    s: &Arc<Session>,
    pid: &mut ProcessId,
    home: &mut NodeId,
    sabotage: bool,
) {
    let expired = |s: &Session| {
        !sabotage && (Instant::now() >= *lock(&s.deadline) || s.gone.load(Ordering::Relaxed))
    };
    loop {
        if w.stop.load(Ordering::Relaxed) {
            return;
        }
        w.pause_point(idx).await;
        if expired(s) {
            return;
        }
        let name = NAMES[w.rand_u64(0..NAMES.len() as u64) as usize].to_string();
        let wait_ms = if w.chance(0.5) { 1_500 } else { 0 };
        let op = w.invoke(*pid, Call::Acquire { name: name.clone() });
        let acquire = Op::Acquire {
            session: s.id,
            name: name.clone(),
            owner: format!("c{idx}"),
            mode: LockMode::Exclusive,
            wait_ms,
            reentrant: false,
        };
        let node = *home;
        let (group, r) = propose_on_name(w, node, &name, acquire).await;
        let outcome = match r {
            Some(Ok(Ok(Reply::Acquired { token, .. }))) => Outcome::Granted { token },
            Some(Ok(Ok(Reply::Queued { waiter, .. }))) => {
                wait_for(
                    w,
                    node,
                    group,
                    waiter,
                    Duration::from_millis(wait_ms) + CALL_TIMEOUT,
                )
                .await
            }
            Some(Ok(Ok(Reply::Busy { .. }))) | Some(Ok(Err(_))) => Outcome::NotGranted,
            Some(Err(GroupError::NoLeader { .. })) => Outcome::NotGranted,
            _ => Outcome::Unknown,
        };
        w.complete(*pid, op, outcome.clone());
        let token = match outcome {
            Outcome::Granted { token } => token,
            Outcome::Unknown => return,
            _ => {
                if !matches!(r, Some(Ok(_))) {
                    *home = w.any_node();
                }
                tokio::time::sleep(w.rand_ms(20, 300)).await;
                continue;
            }
        };
        lock(&w.acked_grants).push((name.clone(), token, group));
        let from = Instant::now();
        let mut lost = None;
        // Mostly short holds; some long ones (a holder that outlives a leader change).
        let writes = if w.chance(0.3) {
            w.rand_u64(8..25)
        } else {
            w.rand_u64(1..4)
        };
        for n in 0..writes {
            tokio::time::sleep(w.rand_ms(50, 700)).await;
            w.pause_point(idx).await;
            if expired(s) {
                let d = (*lock(&s.deadline)).min(Instant::now());
                lost = Some(d);
                break;
            }
            // A stop here (GC pause) between the check and the write is what fencing is for.
            w.write_pause_point(idx).await;
            w.store_write(*pid, &name, token, format!("{}:{token}:{n}", *pid));
        }
        // The guard reports the lock lost at the deadline, also after the last write (a pause
        // may have carried the client past it): then it does not release either.
        if lost.is_none() && expired(s) {
            lost = Some((*lock(&s.deadline)).min(Instant::now()));
        }
        let to = match lost {
            Some(d) => {
                w.push(Record::LeaseLost {
                    process: *pid,
                    name: name.clone(),
                    token,
                    deadline_ns: w.ns(d),
                    at_ns: w.now_ns(),
                });
                d
            }
            None => Instant::now(),
        };
        lock(&w.holds).push(Hold {
            name: name.clone(),
            process: *pid,
            token,
            from,
            to,
        });
        if lost.is_some() {
            return;
        }
        let op = w.invoke(
            *pid,
            Call::Release {
                name: name.clone(),
                token,
            },
        );
        let sid = s.id;
        let name_for_lost = name.clone();
        let release = Op::Release {
            session: sid,
            name,
            token,
        };
        let (_, r) = propose_on_name(w, *home, &name_for_lost, release).await;
        let outcome = match r {
            Some(Ok(Ok(Reply::Released { .. }))) => Outcome::Ok,
            // Still routing after its budget (a move under way): the service did nothing, but
            // it did not say the hold is gone either; the client gives the session up.
            Some(Ok(Err(
                lockd_core::Rejection::WrongGroup { .. }
                | lockd_core::Rejection::BucketMoving { .. },
            ))) => Outcome::Unknown,
            Some(Ok(Err(_))) => Outcome::Refused,
            _ => Outcome::Unknown,
        };
        let unknown = outcome == Outcome::Unknown;
        let released = outcome == Outcome::Ok;
        w.complete(*pid, op, outcome);
        // The deadline may pass while the release is in flight (the leader is unreachable, the
        // session then expires and the release is refused): the guard reports the lock lost at
        // its deadline, which is when this client's belief ended.
        if !released && expired(s) {
            w.push(Record::LeaseLost {
                process: *pid,
                name: name_for_lost,
                token,
                deadline_ns: w.ns(*lock(&s.deadline)),
                at_ns: w.now_ns(),
            });
        }
        if unknown {
            return;
        }
        tokio::time::sleep(w.rand_ms(20, 300)).await;
    }
}

/// Linearizable reads of the group's revision through a node that changes after each failure.
/// Each read must see every grant acknowledged before it began: a read served by a deposed
/// leader, or answered from a ReadIndex round that started before the read, would not.
/// Readers run often and side by side, so reads share rounds and batches.
async fn reader(w: Arc<World>, idx: u64) {
    let sabotage = w.cfg.sabotage == Some(Sabotage::StaleRead);
    let mut home = 1 + idx % w.node_count();
    while !w.stop.load(Ordering::Relaxed) {
        tokio::time::sleep(w.rand_ms(5, 150)).await;
        let group = GROUPS[w.rand_u64(0..GROUPS.len() as u64) as usize];
        let floor = lock(&w.acked_grants)
            .iter()
            .filter(|(_, _, g)| *g == group)
            .map(|(_, t, _)| *t)
            .max()
            .unwrap_or(0);
        let r = client_call(&w, home, group, |g| async move {
            if sabotage {
                Ok(g.read_local(|t| t.revision()))
            } else {
                g.read(|t| t.revision()).await
            }
        })
        .await;
        match r {
            Some(Ok(revision)) => {
                w.reads.fetch_add(1, Ordering::Relaxed);
                if revision < floor {
                    w.violation_of(
                        Signature::StaleRead,
                        format!(
                            "stale read: node {home} answered group {group}'s revision \
                             {revision} after token {floor} was acknowledged"
                        ),
                    );
                }
            }
            _ => home = w.any_node(),
        }
    }
}

/// Waits for a queued acquire's end as seen by `node`'s applies.
async fn wait_for(w: &World, node: NodeId, group: GroupId, waiter: u64, max: Duration) -> Outcome {
    let deadline = Instant::now() + max;
    loop {
        let notified = w.wait_notify.notified();
        if let Some(r) = lock(&w.waits).remove(&(node, group, waiter)) {
            return match r {
                Some(token) => Outcome::Granted { token },
                None => Outcome::NotGranted,
            };
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return Outcome::Unknown;
        }
    }
}

// ------------------------------------------------------------------------------------------
// Nemesis

async fn nemesis(w: Arc<World>) {
    let end = w.t0 + w.cfg.run_for;
    let n = w.node_count();
    let crashed = Arc::new(Mutex::new(Vec::<NodeId>::new()));
    loop {
        tokio::time::sleep(w.rand_ms(500, 2_500)).await;
        if Instant::now() + Duration::from_secs(1) >= end {
            return;
        }
        match w.rand_u64(0..11) {
            8 | 9 => {
                // A topology change: move a name's bucket to the other group while it is in
                // use (sometimes aborted after the freeze), concurrent with every other fault.
                let w2 = w.clone();
                tokio::spawn(async move { move_fault(&w2).await });
            }
            10 => {
                // A membership change: a node joins a group, or one leaves (replace).
                let w2 = w.clone();
                tokio::spawn(async move { member_fault(&w2).await });
            }
            0 | 1 => {
                // Isolate the leader (or a random node) from every other node.
                let g = GROUPS[w.rand_u64(0..GROUPS.len() as u64) as usize];
                let target = leader_of(&w, g).unwrap_or_else(|| w.rand_u64(1..n + 1));
                let pairs: Vec<_> = (1..=n)
                    .filter(|o| *o != target)
                    .flat_map(|o| [(o, target), (target, o)])
                    .collect();
                w.net.block(&pairs);
                // Half of them outlast a session's TTL plus an election, so the majority side
                // expires sessions whose clients still talk to the isolated (deposed) leader.
                let ttl_ms = TTL.as_millis() as u64;
                let dur = if w.chance(0.5) {
                    w.rand_ms(ttl_ms + 2_000, 3 * ttl_ms)
                } else {
                    w.rand_ms(1_000, 3 * ttl_ms)
                };
                w.fault("partition_leader", format!("node {target} for {dur:?}"));
                let w2 = w.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(dur).await;
                    w2.net.unblock(&pairs);
                });
            }
            2 => {
                // A random split: a minority on one side.
                let k = w.rand_u64(1..n.div_ceil(2));
                let mut side = Vec::new();
                while (side.len() as u64) < k {
                    let c = w.rand_u64(1..n + 1);
                    if !side.contains(&c) {
                        side.push(c);
                    }
                }
                let pairs: Vec<_> = side
                    .iter()
                    .flat_map(|a| (1..=n).filter(|b| !side.contains(b)).map(move |b| (*a, b)))
                    .flat_map(|(a, b)| [(a, b), (b, a)])
                    .collect();
                w.net.block(&pairs);
                let dur = w.rand_ms(1_000, 6_000);
                w.fault("partition", format!("{side:?} for {dur:?}"));
                let w2 = w.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(dur).await;
                    w2.net.unblock(&pairs);
                });
            }
            3 => {
                if !lock(&crashed).is_empty() {
                    continue;
                }
                let target = if w.chance(0.5) {
                    leader_of(&w, GROUPS[0]).unwrap_or(1)
                } else {
                    w.rand_u64(1..n + 1)
                };
                lock(&crashed).push(target);
                crash_node(&w, target).await;
                let dur = w.rand_ms(300, 4_000);
                w.fault("crash", format!("node {target}, restart after {dur:?}"));
                let (w2, c2) = (w.clone(), crashed.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(dur).await;
                    if let Err(e) = start_node(&w2, target).await {
                        w2.violation(format!("restart failed: {e:#}"));
                    }
                    lock(&c2).retain(|c| *c != target);
                });
            }
            4 => {
                let target = if w.chance(0.5) {
                    leader_of(&w, GROUPS[1]).unwrap_or(1)
                } else {
                    w.rand_u64(1..n + 1)
                };
                let dur = TTL + w.rand_ms(300, 3_000);
                w.net.pause(target, true);
                w.fault("pause_node", format!("node {target} for {dur:?}"));
                let w2 = w.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(dur).await;
                    w2.net.pause(target, false);
                });
            }
            5 | 6 => {
                let c = w.rand_u64(0..CLIENTS);
                let dur = TTL + w.rand_ms(300, 4_000);
                if w.chance(0.5) {
                    lock(&w.pending_pause).insert(c, dur);
                    w.fault(
                        "pause_client",
                        format!("client {c} for {dur:?} at its next write"),
                    );
                } else {
                    let until = Instant::now() + dur;
                    let mut p = lock(&w.client_pause);
                    let e = p.entry(c).or_insert(until);
                    *e = (*e).max(until);
                    drop(p);
                    w.fault("pause_client", format!("client {c} for {dur:?}"));
                }
            }
            _ => {
                let loss = w.rand_u64(5..30) as f64 / 100.0;
                let max_us = w.rand_u64(20_000..150_000);
                {
                    let mut st = w.net.lock();
                    st.loss = loss;
                    st.delay_us = (200, max_us);
                }
                let dur = w.rand_ms(1_000, 5_000);
                w.fault(
                    "loss_delay",
                    format!("loss {loss} delay<={max_us}us for {dur:?}"),
                );
                let w2 = w.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(dur).await;
                    let mut st = w2.net.lock();
                    st.loss = 0.0;
                    st.delay_us = (200, 3_000);
                });
            }
        }
    }
}

// ------------------------------------------------------------------------------------------
// Topology: the shard map, bucket ownership and moves, driven by lockd-server's own mover.

/// The mover's view of the simulated cluster: each call goes to a live node and is retried
/// there while no leader answers, as a node's service would.
struct SimMover<'a> {
    w: &'a Arc<World>,
}

fn api_error(e: GroupError) -> lockd_server::error::ApiError {
    e.into()
}

impl SimMover<'_> {
    async fn on_group<T, F, Fut>(
        &self,
        group: GroupId,
        f: F,
    ) -> Result<T, lockd_server::error::ApiError>
    where
        F: Fn(Arc<lockd_raft::Group>) -> Fut,
        Fut: std::future::Future<Output = Result<T, GroupError>>,
    {
        let give_up = Instant::now() + Duration::from_secs(10);
        let mut last = GroupError::NoLeader { retry_after_ms: 0 };
        while Instant::now() < give_up {
            let home = leader_of(self.w, group).unwrap_or_else(|| self.w.any_node());
            match client_call(self.w, home, group, &f).await {
                Some(Ok(v)) => return Ok(v),
                Some(Err(e @ (GroupError::NoLeader { .. } | GroupError::ShuttingDown))) => last = e,
                Some(Err(e)) => return Err(api_error(e)),
                None => last = GroupError::Timeout,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(api_error(last))
    }
}

impl lockd_server::moves::MoveHost for SimMover<'_> {
    fn lock_groups(&self) -> Vec<GroupId> {
        GROUPS.to_vec()
    }

    async fn propose_on(
        &self,
        group: GroupId,
        op: Op,
    ) -> Result<Reply, lockd_server::error::ApiError> {
        let mut op = op;
        if let (Some(Sabotage::RevisionFloor), Op::ImportBuckets { export, .. }) =
            (self.w.cfg.sabotage, &mut op)
        {
            export.revision = 0; // SABOTAGE: the floor is not carried over
        }
        let r = self
            .on_group(group, |g| {
                let op = op.clone();
                async move { g.propose(op).await }
            })
            .await?;
        Ok(r?)
    }

    async fn move_record(
        &self,
        group: GroupId,
        id: lockd_core::MoveId,
    ) -> Result<Option<lockd_core::MoveRecord>, lockd_server::error::ApiError> {
        self.on_group(group, |g| async move {
            g.read(move |t| t.move_record(id).cloned()).await
        })
        .await
    }

    async fn outgoing_moves(
        &self,
        group: GroupId,
    ) -> Result<Vec<(lockd_core::MoveId, u32, lockd_core::BucketSet)>, lockd_server::error::ApiError>
    {
        self.on_group(
            group,
            |g| async move { g.read(|t| t.outgoing_moves()).await },
        )
        .await
    }

    async fn shard_map(&self) -> Result<lockd_core::ShardMap, lockd_server::error::ApiError> {
        let map = self
            .on_group(lockd_raft::META_GROUP, |g| async move {
                g.read(|t| t.shard_map().cloned()).await
            })
            .await?;
        map.ok_or_else(|| {
            lockd_server::error::ApiError::new(
                lockd_server::error::ErrorCode::Unavailable,
                "the shard map is not set",
            )
        })
    }

    fn new_move_id(&self) -> lockd_core::MoveId {
        self.w.rand_u64(1..u64::MAX >> 1)
    }
}

/// Sets the shard map and each group's buckets, as `lockd_server`'s bootstrap does.
async fn bootstrap(w: &Arc<World>) -> anyhow::Result<()> {
    let mover = SimMover { w };
    let map = lockd_core::ShardMap::initial(GROUPS.len() as u32);
    let put = Op::PutShardMap { map: map.clone() };
    let r = mover
        .on_group(lockd_raft::META_GROUP, |g| {
            let put = put.clone();
            async move { g.propose(put).await }
        })
        .await;
    anyhow::ensure!(
        matches!(r, Ok(Ok(_))),
        "setting the shard map failed: {r:?}"
    );
    for g in GROUPS {
        let buckets: lockd_core::BucketSet = (0..lockd_core::BUCKETS)
            .filter(|b| map.groups[*b as usize] == g)
            .collect();
        let op = Op::AssignBuckets {
            buckets,
            map_version: map.version,
        };
        let r = mover
            .on_group(g, |grp| {
                let op = op.clone();
                async move { grp.propose(op).await }
            })
            .await;
        anyhow::ensure!(
            matches!(r, Ok(Ok(_))),
            "assigning group {g}'s buckets failed: {r:?}"
        );
    }
    Ok(())
}

/// What every lockd node runs (`lockd_server::moves::resume_janitor`): a move left half done by
/// a crash is finished (or rolled back) without waiting for the next move call, so its buckets
/// do not stay frozen.
async fn move_janitor(w: Arc<World>) {
    let mut seen = Vec::new();
    while !w.stop.load(Ordering::Relaxed) {
        tokio::time::sleep(lockd_server::moves::RESUME_EVERY).await;
        let r = lockd_server::moves::resume_round(&SimMover { w: &w }, &mut seen).await;
        if let Ok(n @ 1..) = r {
            w.fault("move_resumed", format!("{n} move(s)"));
        }
    }
}

/// One topology fault: a name's bucket moves to the other group, through lockd-server's mover
/// (which first finishes any move an earlier fault left half done). One in four is aborted
/// after the freeze instead: the receiving group refuses the import for good, and the next
/// move call thaws the bucket in the sending group.
async fn move_fault(w: &Arc<World>) {
    use lockd_server::moves::MoveHost;
    let mover = SimMover { w };
    let name = NAMES[w.rand_u64(0..NAMES.len() as u64) as usize];
    let bucket = lockd_core::bucket_of(name);
    let Ok(map) = mover.shard_map().await else {
        return;
    };
    let from = map.groups[bucket as usize];
    let to = GROUPS.into_iter().find(|g| *g != from).unwrap_or(GROUPS[0]);
    let buckets: lockd_core::BucketSet = [bucket].into_iter().collect();
    if w.chance(0.25) {
        let id = mover.new_move_id();
        let freeze = Op::FreezeBuckets {
            move_id: id,
            to_group: to,
            buckets,
        };
        if matches!(
            mover.propose_on(from, freeze).await,
            Ok(Reply::BucketsFrozen { .. })
        ) {
            let cancel = mover.propose_on(to, Op::CancelImport { move_id: id }).await;
            w.fault(
                "move_abort",
                format!("{name} {from}->{to}: {:?}", cancel.map(|_| ())),
            );
            let mut sum = lockd_server::moves::MoveSummary::default();
            let _ = lockd_server::moves::resume_moves(&mover, &mut sum).await;
        }
        return;
    }
    let r = lockd_server::moves::move_buckets(&mover, &buckets, to).await;
    let what = match &r {
        Ok(s) => format!(
            "{} bucket(s), {} holder(s), {} resumed",
            s.buckets, s.holders, s.resumed
        ),
        Err(e) => format!("stopped: {}", e.message),
    };
    w.fault("move", format!("{name} {from}->{to}: {what}"));
}

// ------------------------------------------------------------------------------------------
// One seed

/// A membership change through a random live node (which sends it to the group's leader): in
/// a group of no more voters than founders, a node that is not a member joins (learner, then
/// voter) and then a voter leaves (a replace); in one with an extra voter, a voter leaves. The
/// leader itself may be the one to leave (it hands the group over first). Under every other
/// fault, so a change may stop half-way; the next one, or the leader, finishes it.
async fn member_fault(w: &Arc<World>) {
    use lockd_raft::MemberCall;
    let groups: Vec<GroupId> = std::iter::once(lockd_raft::META_GROUP)
        .chain(GROUPS)
        .collect();
    let group = groups[w.rand_u64(0..groups.len() as u64) as usize];
    let Some(m) = leader_of(w, group)
        .and_then(|l| w.net.node(l))
        .and_then(|(_, n)| n.memberships().remove(&group))
    else {
        return;
    };
    if m.joint {
        return; // a change is half done: leave it to its leader
    }
    let mut calls = Vec::new();
    if m.voters.len() as u64 <= w.cfg.replicas {
        let outside: Vec<NodeId> = (1..=w.node_count())
            .filter(|n| !m.voters.contains(n))
            .collect();
        if outside.is_empty() {
            return;
        }
        let id = outside[w.rand_u64(0..outside.len() as u64) as usize];
        calls.push(MemberCall::Add {
            id,
            addr: format!("sim-node-{id}"),
        });
        let stay: Vec<NodeId> = m.voters.clone();
        calls.push(MemberCall::Remove {
            id: stay[w.rand_u64(0..stay.len() as u64) as usize],
        });
    } else {
        calls.push(MemberCall::Remove {
            id: m.voters[w.rand_u64(0..m.voters.len() as u64) as usize],
        });
    }
    for call in calls {
        let via = w.any_node();
        let Some((_, node)) = w.net.node(via) else {
            w.fault(
                "member_change",
                format!("group {group} {call:?}: node {via} is down"),
            );
            return;
        };
        let kind = match call {
            MemberCall::Add { .. } => "member_add",
            _ => "member_remove",
        };
        let r = tokio::time::timeout(
            Duration::from_secs(15),
            node.member_call(group, call.clone()),
        )
        .await;
        let outcome = match &r {
            Ok(Ok(m)) => format!("ok, voters {:?}", m.voters),
            Ok(Err(e)) => format!("refused: {e}"),
            Err(_) => "no answer in 15 s".into(),
        };
        w.fault(
            kind,
            format!("group {group} {call:?} via node {via}: {outcome}"),
        );
        if !matches!(r, Ok(Ok(_))) {
            return;
        }
    }
}

async fn simulate(cfg: SimConfig) -> anyhow::Result<SeedOutcome> {
    let seed = cfg.seed;
    let disks = (1..=cfg.replicas + SPARE_NODES)
        .map(|id| {
            let d = MemStorage::new(
                seed.wrapping_mul(31).wrapping_add(id),
                (Duration::from_micros(100), Duration::from_millis(4)),
            );
            (id, d)
        })
        .collect();
    let w = Arc::new(World {
        t0: Instant::now(),
        rng: Mutex::new(fastrand::Rng::with_seed(seed)),
        net: SimNet::new(seed ^ 0x006e_6574_776f_726b),
        disks,
        records: Mutex::new(Vec::new()),
        digest: Mutex::new(DefaultHasher::new()),
        audit: Mutex::new(Audit::default()),
        waits: Mutex::new(BTreeMap::new()),
        wait_notify: Notify::new(),
        store: Mutex::new(Store::default()),
        violations: Mutex::new(Vec::new()),
        signatures: Mutex::default(),
        holds: Mutex::new(Vec::new()),
        acked_grants: Mutex::new(Vec::new()),
        faults: Mutex::new(BTreeMap::new()),
        ops: AtomicU64::new(0),
        reads: AtomicU64::new(0),
        next_op: AtomicU64::new(1),
        stop: AtomicBool::new(false),
        client_pause: Mutex::new(BTreeMap::new()),
        pending_pause: Mutex::new(BTreeMap::new()),
        trace: Mutex::new(std::env::var_os("SIM_TRACE").map(|_| Vec::new())),
        sessions: Mutex::new(BTreeMap::new()),
        cfg,
    });
    w.push(Record::Meta {
        version: crate::history::FORMAT_VERSION,
        workload: "sim".into(),
        notes: w.cfg.replay_command(),
    });
    for name in NAMES {
        w.push(Record::StoreInit {
            key: name.into(),
            value: String::new(),
        });
    }
    // The lowest id initialises the groups, so start it last (the spares first).
    for id in (1..=w.node_count()).rev() {
        start_node(&w, id).await?;
    }
    bootstrap(&w).await?;
    let nem = tokio::spawn(nemesis(w.clone()));
    let janitor = tokio::spawn(move_janitor(w.clone()));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| tokio::spawn(client(w.clone(), i)))
        .chain((0..READERS).map(|i| tokio::spawn(reader(w.clone(), i))))
        .collect();
    tokio::time::sleep(w.cfg.run_for).await;
    w.stop.store(true, Ordering::Relaxed);
    let _ = nem.await;
    let _ = janitor.await;
    for c in clients {
        if tokio::time::timeout(Duration::from_secs(30), c)
            .await
            .is_err()
        {
            w.violation("a client did not stop within 30 s".into());
        }
    }
    // Heal: no partitions, pauses or loss; every node up.
    w.net.heal();
    lock(&w.client_pause).clear();
    lock(&w.pending_pause).clear();
    tokio::time::sleep(Duration::from_secs(5)).await;
    for id in 1..=w.node_count() {
        if w.net.node(id).is_none() {
            start_node(&w, id).await?;
        }
    }
    let converged = converge(&w).await;
    final_checks(&w, converged);
    every_node_serves(&w).await;
    for id in 1..=w.node_count() {
        if let Some(node) = w.net.down(id) {
            node.shutdown().await;
        }
    }
    let history = History {
        records: std::mem::take(&mut *lock(&w.records)),
    };
    let report = checker::check(
        &history,
        Budget {
            max_steps: 5_000_000,
            max_time: Duration::from_secs(20),
        },
    )?;
    let digest = lock(&w.digest).finish();
    if let (Some(path), Some(t)) = (std::env::var_os("SIM_TRACE"), lock(&w.trace).take()) {
        let path = format!("{}.{seed}.{digest:016x}", path.to_string_lossy());
        std::fs::write(&path, t.join("\n"))?;
        if let Some(l) = w.net.lock().log.take() {
            std::fs::write(format!("{path}.net"), l.join("\n"))?;
        }
    }
    let violations = std::mem::take(&mut *lock(&w.violations));
    let mut signatures = std::mem::take(&mut *lock(&w.signatures));
    signatures.extend(report.signatures());
    let faults = std::mem::take(&mut *lock(&w.faults));
    let applies = lock(&w.audit).applies;
    Ok(SeedOutcome {
        seed,
        ops: w.ops.load(Ordering::Relaxed),
        reads: w.reads.load(Ordering::Relaxed),
        faults,
        violations,
        signatures: signatures.into_iter().collect(),
        digest,
        report,
        history,
        applies,
    })
}

/// Waits until, in every group, every replica applied the same index (a write on each leader
/// first, so the last entries commit). Returns per (group, node): (applied index, state hash).
/// Per (group, node): (applied index, state hash), once every member agrees.
type Converged = BTreeMap<(GroupId, NodeId), (u64, u64)>;

async fn converge(w: &World) -> Result<Converged, String> {
    let give_up = Instant::now() + Duration::from_secs(30);
    let mut out = BTreeMap::new();
    for group in std::iter::once(lockd_raft::META_GROUP).chain(GROUPS) {
        // Commit something of the current term so every earlier entry is committed too.
        loop {
            if let Some(l) = leader_of(w, group) {
                if let Some((_, node)) = w.net.node(l) {
                    if let Some(g) = node.group(group) {
                        if g.propose(Op::Tick).await.is_ok() {
                            break;
                        }
                    }
                }
            }
            if Instant::now() >= give_up {
                let views: Vec<String> = (1..=w.node_count())
                    .filter_map(|id| {
                        let (_, n) = w.net.node(id)?;
                        let st = n.group(group)?.status();
                        Some(format!(
                            "node {id}: leader {:?} term {} members {:?}",
                            st.leader, st.term, st.members
                        ))
                    })
                    .collect();
                return Err(format!(
                    "group {group}: no leader committed an entry; {views:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        loop {
            // The members as the leader has them (member changes moved replicas around).
            let members: Vec<NodeId> = leader_of(w, group)
                .and_then(|l| w.net.node(l))
                .and_then(|(_, n)| n.memberships().remove(&group))
                .map(|m| m.voters.into_iter().chain(m.learners).collect())
                .unwrap_or_default();
            let mut seen = BTreeMap::new();
            for &id in &members {
                if let Some((_, n)) = w.net.node(id) {
                    if let Some(g) = n.group(group) {
                        seen.insert(id, (g.status().applied_index, g.state_hash()));
                    }
                }
            }
            let first = seen.values().next().copied();
            if !members.is_empty()
                && seen.len() == members.len()
                && seen.values().all(|v| Some(*v) == first)
            {
                out.extend(seen.into_iter().map(|(id, v)| ((group, id), v)));
                break;
            }
            if Instant::now() >= give_up {
                return Err(format!(
                    "group {group}: members {members:?} (leader {:?}), (applied, hash) {seen:?}",
                    leader_of(w, group)
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(out)
}

/// After healing, a call through any node reaches every group, whatever replica that node
/// holds of it (none, a member's, or a stranded one left behind by a member change).
async fn every_node_serves(w: &World) {
    for id in 1..=w.node_count() {
        let Some((_, node)) = w.net.node(id) else {
            continue;
        };
        for group in std::iter::once(lockd_raft::META_GROUP).chain(GROUPS) {
            let served = async {
                loop {
                    if let Some(route) = node.route(group) {
                        // A forwardable command that changes nothing (ticks are the leader's
                        // own, never taken from a peer): closing a session that cannot exist.
                        // Any committed answer shows the call got through.
                        let probe = Op::CloseSession {
                            session: lockd_core::SessionId(0),
                        };
                        if route.propose(probe).await.is_ok() {
                            return;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            };
            if tokio::time::timeout(Duration::from_secs(20), served)
                .await
                .is_err()
            {
                let route = match node.route(group) {
                    Some(lockd_raft::Route::Local(_)) => "local",
                    Some(lockd_raft::Route::Remote(_)) => "remote",
                    None => "none",
                };
                let here = node.group(group).map(|g| {
                    let st = g.status();
                    format!(
                        "leader {:?} term {} members {:?} stranded {} lease {}",
                        st.leader,
                        st.term,
                        st.members,
                        g.is_stranded(),
                        g.lease_held()
                    )
                });
                let real = leader_of(w, group).and_then(|l| {
                    let m = w.net.node(l)?.1.memberships().remove(&group)?;
                    Some(format!(
                        "node {l}: voters {:?} learners {:?}",
                        m.voters, m.learners
                    ))
                });
                w.violation(format!(
                    "liveness: node {id} could not reach group {group} 20 s after healing \
                     (route {route}; its replica: {here:?}; leader {real:?})"
                ));
            }
        }
    }
}

fn final_checks(w: &World, converged: Result<Converged, String>) {
    let final_state = match converged {
        Ok(s) => s,
        Err(why) => {
            w.violation(format!(
                "replicas did not converge within 30 s after healing: {why}"
            ));
            return;
        }
    };
    let applied = |group: GroupId| {
        final_state
            .iter()
            .find(|((g, _), _)| *g == group)
            .map_or(0, |(_, v)| v.0)
    };
    // S3: every acknowledged grant is in the committed log of the group that granted it,
    // applied on every replica.
    let acked = lock(&w.acked_grants).clone();
    let audit = lock(&w.audit);
    for (name, token, group) in &acked {
        match audit.grants.get(&(name.clone(), *token)) {
            Some((g, index)) if g == group && *index <= applied(*g) => {}
            Some((g, index)) => w.violation(format!(
                "S3: acknowledged grant {name}/{token} of group {group} is at group {g} index \
                 {index}, beyond its final applied index {}",
                applied(*g)
            )),
            None => w.violation(format!(
                "S3: acknowledged grant {name}/{token} is not in the committed log"
            )),
        }
    }
    drop(audit);
    // C1 / mutual exclusion from the clients' view.
    let holds = lock(&w.holds);
    for (i, a) in holds.iter().enumerate() {
        for b in &holds[i + 1..] {
            if a.name == b.name && a.process != b.process && a.from < b.to && b.from < a.to {
                w.violation_of(
                    Signature::BeliefOverlap,
                    format!(
                    "C1: {} believed held by process {} (token {}) during [{:.3}s, {:.3}s] and \
                     by process {} (token {}) during [{:.3}s, {:.3}s]",
                    a.name,
                    a.process,
                    a.token,
                    w.ns(a.from) as f64 / 1e9,
                    w.ns(a.to) as f64 / 1e9,
                    b.process,
                    b.token,
                    w.ns(b.from) as f64 / 1e9,
                    w.ns(b.to) as f64 / 1e9
                ),
                );
            }
        }
    }
}

/// Aggregates of a multi-seed run.
#[derive(Debug, Default)]
pub struct RunSummary {
    pub seeds: u64,
    pub failed_seeds: Vec<u64>,
    /// Seeds with no violation but an unknown linearizability verdict.
    pub unknown_seeds: Vec<u64>,
    pub ops: u64,
    pub reads: u64,
    pub applies: u64,
    pub faults: BTreeMap<String, u64>,
    pub violations: u64,
    pub checker_violations: u64,
    pub double_grants: u64,
    pub token_regressions: u64,
    pub grants_to_expired_sessions: u64,
    pub stale_writes_accepted: u64,
    pub writes_rejected_stale: u64,
    pub not_linearizable: u64,
    pub secs: f64,
}

impl RunSummary {
    /// Adds one seed's outcome.
    pub fn add(&mut self, o: &SeedOutcome) {
        self.seeds += 1;
        if o.failed() {
            self.failed_seeds.push(o.seed);
        }
        if o.unknown() {
            self.unknown_seeds.push(o.seed);
        }
        self.ops += o.ops;
        self.reads += o.reads;
        self.applies += o.applies;
        for (k, n) in &o.faults {
            *self.faults.entry(k.clone()).or_insert(0) += n;
        }
        self.violations += o.violations.len() as u64;
        if o.report.has_violations() {
            self.checker_violations += 1;
        }
        let d = &o.report.direct;
        self.double_grants += d.double_grants;
        self.token_regressions += d.token_regressions;
        self.grants_to_expired_sessions += d.grants_to_expired_sessions;
        self.stale_writes_accepted += d.stale_writes_accepted;
        self.writes_rejected_stale += d.writes_rejected_stale;
        self.not_linearizable += o.report.objects_not_linearizable as u64;
    }

    /// The one `RESULT` line of a run.
    pub fn result_line(&self) -> String {
        let mut s = format!(
            "RESULT sim seeds={} failed_seeds={} unknown_seeds={} ops={} reads={} applies={} \
             seeds_per_s={:.2}",
            self.seeds,
            self.failed_seeds.len(),
            self.unknown_seeds.len(),
            self.ops,
            self.reads,
            self.applies,
            self.seeds as f64 / self.secs.max(1e-9)
        );
        let total: u64 = self.faults.values().sum();
        s.push_str(&format!(" faults={total}"));
        for (k, n) in &self.faults {
            s.push_str(&format!(" faults_{k}={n}"));
        }
        s.push_str(&format!(
            " sim_violations={} checker_failed_seeds={} objects_not_linearizable={} \
             double_grants={} token_regressions={} grants_to_expired_sessions={} \
             stale_writes_accepted={} writes_rejected_stale={} unknown={} violations={}",
            self.violations,
            self.checker_violations,
            self.not_linearizable,
            self.double_grants,
            self.token_regressions,
            self.grants_to_expired_sessions,
            self.stale_writes_accepted,
            self.writes_rejected_stale,
            self.unknown_seeds.len(),
            !self.failed_seeds.is_empty()
        ));
        s
    }
}

// ------------------------------------------------------------------------------------------
// Command line

/// Arguments of `lockd-check sim`.
#[derive(clap::Args, Clone, Debug)]
pub struct SimArgs {
    /// Number of seeds to run (from --seed on).
    #[arg(long, default_value_t = 20)]
    pub seeds: u64,
    /// First seed (alone, with --seeds 1, it replays that seed).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Replicas of each lock group: 3 or 5.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(3..=5))]
    pub replicas: u64,
    /// NEGATIVE CONTROL: client-deadline (signature: two clients believed they held a name at
    /// once), leader-lease (a session expired while its client still believed, within the
    /// deadline the service had extended), store-fence (the store accepted a stale write) or
    /// stale-read (a read missed an acknowledged grant), revision-floor (a bucket move does not
    /// carry the sending group's revision: a name's token falls) or ownership (groups serve
    /// names they do not own: two groups grant one name). The run then passes only if some
    /// seed shows that signature violation; other failures do not count.
    #[arg(long, value_parser = ["client-deadline", "leader-lease", "store-fence", "stale-read", "revision-floor", "ownership"])]
    pub sabotage: Option<String>,
    /// Simulated seconds of faults per seed.
    #[arg(long, default_value_t = 20)]
    pub sim_secs: u64,
    /// Run each seed twice and compare the trace digests.
    #[arg(long)]
    pub check_determinism: bool,
    /// Print every seed's line, not just failures.
    #[arg(long)]
    pub verbose: bool,
    /// Exit 0, not 3, when a seed's verdict is unknown (still counted in `unknown_seeds=`).
    #[arg(long)]
    pub allow_unknown: bool,
}

/// `lockd-check sim`: runs the seeds, prints failures with their replay command and one
/// `RESULT` line. Exit code 1 if a seed failed (under sabotage: if no seed showed the
/// sabotage's signature), else 3 if a seed's verdict was unknown (0 with `--allow-unknown`).
pub fn main(args: SimArgs) -> anyhow::Result<std::process::ExitCode> {
    let sabotage = match args.sabotage.as_deref() {
        Some(s) => Some(Sabotage::parse(s).ok_or_else(|| anyhow::anyhow!("bad --sabotage {s}"))?),
        None => None,
    };
    let started = std::time::Instant::now();
    let mut sum = RunSummary::default();
    let mut nondeterministic = Vec::new();
    let mut sabotage_first_fail = None;
    let mut caught = 0u64;
    for seed in args.seed..args.seed.saturating_add(args.seeds) {
        let cfg = SimConfig {
            seed,
            replicas: args.replicas,
            sabotage,
            run_for: Duration::from_secs(args.sim_secs.max(5)),
        };
        let o = run_seed(&cfg)?;
        if args.check_determinism {
            let again = run_seed(&cfg)?;
            if again.digest != o.digest {
                println!(
                    "seed {seed}: NOT DETERMINISTIC: digest {:016x} then {:016x}; replay: {} \
                     --check-determinism",
                    o.digest,
                    again.digest,
                    cfg.replay_command()
                );
                nondeterministic.push(seed);
            }
        }
        if sabotage.is_some_and(|k| o.caught(k)) {
            caught += 1;
            sabotage_first_fail.get_or_insert(sum.seeds + 1);
        }
        if o.unknown() {
            println!(
                "seed {seed}: UNKNOWN (linearizability search out of budget); replay: {}",
                cfg.replay_command()
            );
        }
        if o.failed() {
            println!(
                "seed {seed}: FAILED ({} sim violations, checker violations: {}); replay: {}",
                o.violations.len(),
                o.report.has_violations(),
                cfg.replay_command()
            );
            for v in o.violations.iter().take(5) {
                println!("  {v}");
            }
            for d in o.report.details.iter().take(5) {
                println!("  checker: {d}");
            }
        } else if args.verbose {
            println!(
                "seed {seed}: ok ops={} applies={} faults={} digest={:016x}",
                o.ops,
                o.applies,
                o.faults.values().sum::<u64>(),
                o.digest
            );
        }
        sum.add(&o);
    }
    sum.secs = started.elapsed().as_secs_f64();
    let mut line = sum.result_line();
    if args.check_determinism {
        line.push_str(&format!(
            " nondeterministic_seeds={}",
            nondeterministic.len()
        ));
    }
    if let Some(k) = sabotage {
        line.push_str(&format!(
            " sabotage={} signature={} caught_seeds={caught} first_caught_seed_no={}",
            k.name(),
            k.signature(),
            sabotage_first_fail.map_or("none".into(), |n: u64| n.to_string())
        ));
    }
    println!("{line}");
    let violation = !nondeterministic.is_empty()
        || if sabotage.is_some() {
            caught == 0
        } else {
            !sum.failed_seeds.is_empty()
        };
    Ok(checker::exit_code(
        violation,
        !sum.unknown_seeds.is_empty(),
        args.allow_unknown,
    ))
}
