//! In-memory Raft storage with a modelled fsync, for the deterministic simulator.
//!
//! [`MemStorage`] is one node's "disk": per group, the vote, commit index, log and snapshot that
//! a *completed* flush made durable. A [`MemLogStore`] serves openraft from its own volatile
//! view (what the process has written, like the page cache) and queues every write to a single
//! flusher task that sleeps a seeded delay (`tokio::time::sleep`: virtual time in the
//! simulator) before copying it to the durable state, in order, and only then completes
//! openraft's callback — so an entry counts as durable exactly when raft-log's fdatasync would
//! have returned. [`MemStorage::crash`] starts a new incarnation: flushes still queued or in
//! their delay are dropped, and a restarted node sees only the durable state. No threads, no
//! `spawn_blocking`, no files.

use std::collections::BTreeMap;
use std::fmt::{self, Debug};
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::{LogState, OptionalSend, RaftLogReader};
use tokio::sync::{mpsc, oneshot};

use super::{Entry, LogId, SnapshotData, SnapshotMeta, TypeConfig, Vote};
use crate::GroupId;

/// What survived on one group's simulated disk.
#[derive(Clone, Default)]
struct Durable {
    vote: Option<Vote>,
    committed: Option<LogId>,
    purged: Option<LogId>,
    log: BTreeMap<u64, Entry>,
    snapshot: Option<(SnapshotMeta, SnapshotData)>,
}

struct Disk {
    /// Bumped by a crash: writes of an older incarnation never become durable.
    generation: u64,
    groups: BTreeMap<GroupId, Durable>,
    /// SplitMix64 state for flush delays.
    rng: u64,
    flush_delay: (Duration, Duration),
    flushes: u64,
    dropped: u64,
    /// Set by [`MemStorage::fail`]: every later write fails.
    failed: bool,
}

/// One node's simulated disk (see the module docs). Shared by the node's groups; survives the
/// node's crash and restart.
pub struct MemStorage {
    disk: Mutex<Disk>,
}

impl Debug for MemStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.lock();
        f.debug_struct("MemStorage")
            .field("generation", &d.generation)
            .field("groups", &d.groups.len())
            .field("flushes", &d.flushes)
            .finish()
    }
}

impl MemStorage {
    /// An empty disk whose flushes take a delay drawn (from `seed`) uniformly in
    /// `flush_delay`.
    pub fn new(seed: u64, flush_delay: (Duration, Duration)) -> Arc<MemStorage> {
        Arc::new(MemStorage {
            disk: Mutex::new(Disk {
                generation: 0,
                groups: BTreeMap::new(),
                rng: seed,
                flush_delay,
                flushes: 0,
                dropped: 0,
                failed: false,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Disk> {
        self.disk.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The process died: everything written but not yet flushed is lost. Call before stopping
    /// the node's tasks; a node started afterwards sees only the durable state.
    pub fn crash(&self) {
        self.lock().generation += 1;
    }

    /// The disk fails: every write from now on returns an I/O error and becomes durable
    /// nowhere, as a dying disk's fsync would (openraft then stops the group: `node/fatal.rs`).
    pub fn fail(&self) {
        self.lock().failed = true;
    }

    /// (completed flushes, flushes dropped by a crash) so far.
    pub fn flush_counts(&self) -> (u64, u64) {
        let d = self.lock();
        (d.flushes, d.dropped)
    }

    /// The durable log's last index of `group` (0 if none).
    pub fn durable_last_index(&self, group: GroupId) -> u64 {
        let d = self.lock();
        d.groups
            .get(&group)
            .and_then(|g| g.log.keys().next_back().copied())
            .unwrap_or(0)
    }

    pub(crate) fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// The next flush delay.
    pub(crate) fn delay(&self) -> Duration {
        let mut d = self.lock();
        d.rng = d.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = d.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let (lo, hi) = d.flush_delay;
        let span = hi.saturating_sub(lo).as_nanos() as u64;
        lo + Duration::from_nanos(if span == 0 { 0 } else { z % span })
    }

    /// Applies `f` to `group`'s durable state if incarnation `gen` is still alive.
    fn persist(&self, gen: u64, group: GroupId, f: impl FnOnce(&mut Durable)) -> io::Result<()> {
        let mut d = self.lock();
        if d.generation != gen {
            d.dropped += 1;
            return Err(io::Error::other("simulated crash: write lost"));
        }
        if d.failed {
            return Err(io::Error::other("simulated disk failure"));
        }
        d.flushes += 1;
        f(d.groups.entry(group).or_default());
        Ok(())
    }

    fn durable(&self, group: GroupId) -> Durable {
        self.lock().groups.get(&group).cloned().unwrap_or_default()
    }

    /// The durable snapshot of `group`.
    pub(crate) fn load_snapshot(&self, group: GroupId) -> Option<(SnapshotMeta, SnapshotData)> {
        self.lock()
            .groups
            .get(&group)
            .and_then(|g| g.snapshot.clone())
    }

    /// Writes a snapshot durably after a flush delay (unless a newer one is stored).
    pub(crate) async fn save_snapshot(
        &self,
        gen: u64,
        group: GroupId,
        meta: &SnapshotMeta,
        data: &SnapshotData,
    ) -> io::Result<()> {
        tokio::time::sleep(self.delay()).await;
        self.persist(gen, group, |g| {
            if g.snapshot
                .as_ref()
                .is_none_or(|(cur, _)| cur.last_log_id < meta.last_log_id)
            {
                g.snapshot = Some((meta.clone(), data.clone()));
            }
        })
    }
}

/// The process's own (not necessarily durable) view of a group's log.
#[derive(Default)]
struct Volatile {
    vote: Option<Vote>,
    committed: Option<LogId>,
    purged: Option<LogId>,
    log: BTreeMap<u64, Entry>,
}

enum FlushOp {
    Append(Vec<Entry>, IOFlushed<TypeConfig>),
    Vote(Vote, oneshot::Sender<io::Result<()>>),
    Truncate(u64, oneshot::Sender<io::Result<()>>),
    Purge(LogId),
    Committed(LogId),
}

/// openraft's log storage over a [`MemStorage`]; a clone is its log reader.
#[derive(Clone)]
pub(crate) struct MemLogStore {
    vol: Arc<Mutex<Volatile>>,
    flush: mpsc::UnboundedSender<FlushOp>,
}

impl MemLogStore {
    /// Opens `group`'s log from what is durable on `disk` for incarnation `gen`, and starts
    /// its flusher task.
    pub(crate) fn open(disk: Arc<MemStorage>, gen: u64, group: GroupId) -> MemLogStore {
        let d = disk.durable(group);
        let vol = Volatile {
            vote: d.vote,
            committed: d.committed,
            purged: d.purged,
            log: d.log,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(flusher(disk, gen, group, rx));
        MemLogStore {
            vol: Arc::new(Mutex::new(vol)),
            flush: tx,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Volatile> {
        self.vol.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn send(&self, op: FlushOp) -> io::Result<()> {
        self.flush
            .send(op)
            .map_err(|_| io::Error::other("flusher is gone"))
    }

    async fn send_and_wait(
        &self,
        op: impl FnOnce(oneshot::Sender<io::Result<()>>) -> FlushOp,
    ) -> io::Result<()> {
        let (tx, rx) = oneshot::channel();
        self.send(op(tx))?;
        rx.await.map_err(|_| io::Error::other("flusher is gone"))?
    }
}

/// Copies queued writes to the durable state, in order, each after a flush delay.
async fn flusher(
    disk: Arc<MemStorage>,
    gen: u64,
    group: GroupId,
    mut rx: mpsc::UnboundedReceiver<FlushOp>,
) {
    while let Some(op) = rx.recv().await {
        match op {
            FlushOp::Append(entries, cb) => {
                tokio::time::sleep(disk.delay()).await;
                let res = disk.persist(gen, group, |g| {
                    for e in entries {
                        g.log.insert(e.log_id.index, e);
                    }
                });
                cb.io_completed(res);
            }
            FlushOp::Vote(v, tx) => {
                tokio::time::sleep(disk.delay()).await;
                let _ = tx.send(disk.persist(gen, group, |g| g.vote = Some(v)));
            }
            FlushOp::Truncate(from, tx) => {
                tokio::time::sleep(disk.delay()).await;
                let _ = tx.send(disk.persist(gen, group, |g| {
                    g.log.split_off(&from);
                }));
            }
            FlushOp::Purge(upto) => {
                let _ = disk.persist(gen, group, |g| {
                    g.log = g.log.split_off(&(upto.index + 1));
                    g.purged = Some(upto);
                });
            }
            FlushOp::Committed(c) => {
                let _ = disk.persist(gen, group, |g| g.committed = Some(c));
            }
        }
    }
}

impl RaftLogReader<TypeConfig> for MemLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let start = match range.start_bound() {
            Bound::Included(x) => Bound::Included(*x),
            Bound::Excluded(x) => Bound::Excluded(*x),
            Bound::Unbounded => Bound::Unbounded,
        };
        let end = match range.end_bound() {
            Bound::Included(x) => Bound::Included(*x),
            Bound::Excluded(x) => Bound::Excluded(*x),
            Bound::Unbounded => Bound::Unbounded,
        };
        Ok(self
            .lock()
            .log
            .range((start, end))
            .map(|(_, e)| e.clone())
            .collect())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(self.lock().vote)
    }
}

impl RaftLogStorage<TypeConfig> for MemLogStore {
    type LogReader = MemLogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let v = self.lock();
        let last = v.log.values().next_back().map(|e| e.log_id).or(v.purged);
        Ok(LogState {
            last_purged_log_id: v.purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        self.lock().vote = Some(*vote);
        let v = *vote;
        self.send_and_wait(|tx| FlushOp::Vote(v, tx)).await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        if let Some(c) = committed {
            self.lock().committed = Some(c);
            self.send(FlushOp::Committed(c))?;
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(self.lock().committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        {
            let mut v = self.lock();
            for e in &entries {
                v.log.insert(e.log_id.index, e.clone());
            }
        }
        self.send(FlushOp::Append(entries, callback))
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let from = last_log_id.map(|l| l.index + 1).unwrap_or(0);
        self.lock().log.split_off(&from);
        self.send_and_wait(|tx| FlushOp::Truncate(from, tx)).await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        {
            let mut v = self.lock();
            v.log = v.log.split_off(&(log_id.index + 1));
            v.purged = Some(log_id);
        }
        self.send(FlushOp::Purge(log_id))
    }
}
