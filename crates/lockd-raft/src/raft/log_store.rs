//! The durable Raft log: raft-log (chunked WAL, one flush thread, fdatasync per batch) behind
//! openraft's `RaftLogStorage`.
//!
//! An appended entry counts only once raft-log's flush worker has fdatasync'd it and fired the
//! callback (openraft then acks it / counts the leader in the quorum). Votes and truncations
//! wait for their fsync before returning.
//!
//! **Damaged tail.** Every record is checksummed, but framed without a length of its own: a
//! record is its type, its fields (each a length-prefixed value) and a crc32. Before raft-log
//! opens the log, [`repair_tail`] scans the newest chunk and tells two kinds of damage apart:
//!
//! * a *torn write*: the last record is incomplete (the file ends before the lengths it
//!   declares) and no whole record follows it, or the file ends in zeros (space whose length
//!   reached the disk before its data, as on ext4 `data=writeback`). Nothing there was ever
//!   fsync'd, so nothing there was acknowledged: the chunk is cut before it, fsync'd, and the
//!   cut is logged loudly. Raft then restores whatever the leader has from the leader;
//! * *corruption*: a complete record with a bad checksum or undecodable fields (bit rot, a
//!   misdirected write), or a record whose length runs past the end of the file while a whole
//!   record follows it (a damaged length field). That record may be an entry this node
//!   acknowledged, so dropping it could lose a committed write: the log is refused with an
//!   error naming the file and the byte offset, and the node does not start. The recovery is
//!   to wipe the data dir and rejoin the cluster as a new node id (docs/INVARIANTS.md,
//!   *Storage*).
//!
//! raft-log's own truncation is off (`truncate_incomplete_record = false`): it would also cut
//! a record whose damaged length runs past the end, and everything after it. (Caveat of a
//! legitimate cut: a cut record could be a vote; a node that lost an unsynced vote could vote
//! again in that term. That is the same exposure as any torn write and needs a second damaged
//! node to matter.)

use std::fmt::Debug;
use std::fs::OpenOptions;
use std::io::{self, Read, Write};
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::{LogState, OptionalSend, RaftLogReader};
use raft_log::api::raft_log_writer::RaftLogWriter;
use raft_log::codeq::Decode;
use raft_log::{RaftLog, RaftLogRecord};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tracing::{error, warn};

use super::{Entry, LogId, TypeConfig, Vote};

/// Chunk size: purge frees disk per closed chunk, so keep chunks small.
const CHUNK_MAX_BYTES: usize = 4 << 20;
/// Entries cached in memory per group, for replication reads. A follower within a few seconds
/// of the leader reads from here; one further behind reads the chunk files (raft-log falls back
/// to disk on a miss), and one behind the purge point gets a snapshot. An entry carries 1 to 256
/// decoded commands with their strings, so the byte cap (on [`RlTypes::payload_size`]'s
/// estimate) binds under load, when entries are batches, and the count cap when they are single
/// commands. 8 MiB holds tens of thousands of commands, seconds of a busy group.
const CACHE_MAX_ITEMS: usize = 8_192;
const CACHE_MAX_BYTES: usize = 8 << 20;

/// `codeq` codec for a serde type: u32 length (big-endian) + postcard bytes. raft-log frames
/// and checksums each record around it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Pc<T>(pub(crate) T);

impl<T: Serialize> codeq::Encode for Pc<T> {
    fn encode<W: Write>(&self, mut w: W) -> Result<usize, io::Error> {
        let b = postcard::to_allocvec(&self.0).map_err(io::Error::other)?;
        let len = u32::try_from(b.len()).map_err(|_| io::Error::other("log record over 4 GiB"))?;
        w.write_all(&len.to_be_bytes())?;
        w.write_all(&b)?;
        Ok(4 + b.len())
    }
}

impl<T: DeserializeOwned> codeq::Decode for Pc<T> {
    fn decode<R: Read>(mut r: R) -> Result<Self, io::Error> {
        let mut len = [0u8; 4];
        r.read_exact(&mut len)?;
        let len = u32::from_be_bytes(len) as u64;
        let mut b = Vec::new();
        // `take` so a corrupt length cannot make us allocate gigabytes up front.
        r.take(len).read_to_end(&mut b)?;
        if b.len() as u64 != len {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        postcard::from_bytes(&b)
            .map(Pc)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }
}

/// Where append-to-durable times are reported.
#[derive(Clone)]
pub(crate) struct SyncTiming {
    pub(crate) group: crate::GroupId,
    pub(crate) sink: Arc<dyn crate::EffectSink>,
}

/// Completion handed to raft-log's flush worker thread, fired after fdatasync.
pub(crate) enum FlushCb {
    /// openraft's append callback: the entries are durable.
    Raft(
        IOFlushed<TypeConfig>,
        Option<(std::time::Instant, SyncTiming)>,
    ),
    /// A caller waiting for its vote or truncation to be durable.
    Wait(tokio::sync::oneshot::Sender<io::Result<()>>),
}

impl raft_log::Callback for FlushCb {
    fn send(self, res: Result<(), io::Error>) {
        match self {
            FlushCb::Raft(cb, timing) => {
                if let Some((start, t)) = timing {
                    t.sink.log_synced(t.group, start.elapsed());
                }
                cb.io_completed(res)
            }
            FlushCb::Wait(tx) => {
                let _ = tx.send(res);
            }
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RlTypes;

impl raft_log::Types for RlTypes {
    type LogId = Pc<LogId>;
    type LogPayload = Pc<openraft::type_config::alias::PayloadOf<TypeConfig>>;
    type Vote = Pc<Vote>;
    type Callback = FlushCb;
    type UserData = Pc<()>;

    fn log_index(log_id: &Self::LogId) -> u64 {
        log_id.0.index
    }

    fn payload_size(payload: &Self::LogPayload) -> u64 {
        match &payload.0 {
            openraft::EntryPayload::Normal(p) => p.approx_bytes(),
            _ => 128,
        }
    }
}

/// Cheap to clone; a clone is also the log reader used by replication tasks.
#[derive(Clone)]
pub(crate) struct LogStore {
    rl: Arc<Mutex<RaftLog<RlTypes>>>,
    timing: Option<SyncTiming>,
}

fn raft_log_config(dir: &Path) -> raft_log::Config {
    let mut cfg = raft_log::Config::new(dir.display());
    cfg.wal.chunk_max_size = Some(CHUNK_MAX_BYTES);
    // Only `repair_tail` decides what may be cut (module docs).
    cfg.wal.truncate_incomplete_record = Some(false);
    // The flush worker waits this long for more writes before each fdatasync. Its 1 ms default
    // put a millisecond on every commit of an idle group (twice: leader, then follower). Zero:
    // group commit comes from the entries, not from here. One append (one entry of up to 256
    // commands) is one flush request, and a group has one entry in flight, so there is rarely a
    // second request to wait for; a 50 µs wait cost every sync a timed sleep and a wake-up.
    // Measured against 50 µs, one binary each, alternating (2026-12-01): C=1 acquire p50 0.41–
    // 0.56 ms against 0.49–0.73 ms (median 0.48 against 0.59 over six pairs); mix max unchanged
    // within the noise (mean 23.5k against 21.8k ops/s).
    cfg.wal.flush_batch_wait = Some(std::time::Duration::ZERO);
    cfg.log_cache_max_items = Some(CACHE_MAX_ITEMS);
    cfg.log_cache_capacity = Some(CACHE_MAX_BYTES);
    cfg
}

/// How long an open waits for the log's lock file (see [`LogStore::open`]).
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl LogStore {
    /// Opens (or creates) the log in `dir`, cutting a torn tail record if there is one and
    /// refusing a corrupt one (module docs).
    pub(crate) fn open(dir: &Path, timing: Option<SyncTiming>) -> io::Result<Self> {
        crate::private::dir(dir)?;
        if let Some(cut) = repair_tail(dir)? {
            error!(dir = %dir.display(), "log tail torn by a crash: {cut}");
        }
        let cfg = Arc::new(raft_log_config(dir));
        // The log's lock file is held by another process on this dir, or by this process's
        // previous instance of the group while it finishes stopping (a restart in place): wait
        // a little for it before calling it taken.
        let lock_wait = std::time::Instant::now() + LOCK_WAIT;
        let opened = loop {
            match RaftLog::<RlTypes>::open(cfg.clone()) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if std::time::Instant::now() >= lock_wait {
                        break Err(io::Error::new(
                            e.kind(),
                            format!(
                                "{e} (waited {}s: is another lockd running on this data dir?)",
                                LOCK_WAIT.as_secs()
                            ),
                        ));
                    }
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                other => break other,
            }
        };
        let rl = opened.map_err(|e| {
            if matches!(
                e.kind(),
                io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof
            ) {
                io::Error::new(
                    e.kind(),
                    format!("the log in {} is damaged: {e}; {RECOVERY}", dir.display()),
                )
            } else {
                e
            }
        })?;
        // raft-log made its chunk and lock files under the process umask.
        crate::private::files_quietly(dir)?;
        Ok(LogStore {
            rl: Arc::new(Mutex::new(rl)),
            timing,
        })
    }

    fn lock(&self) -> MutexGuard<'_, RaftLog<RlTypes>> {
        self.rl.lock().expect("raft-log lock poisoned")
    }

    /// Flush with fsync and wait for it.
    pub(crate) async fn flush_and_wait(&self) -> io::Result<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.lock().flush(true, Some(FlushCb::Wait(tx)))?;
        rx.await
            .map_err(|_| io::Error::other("raft-log flush worker is gone"))?
    }
}

/// What the operator does about a damaged log; part of every refusal.
const RECOVERY: &str = "lockd refuses to start rather than drop records this node may have \
     acknowledged. Recovery: move this node's data dir aside (or wipe it) and add the node back \
     to the cluster under a new --node-id with an empty data dir (--initial-cluster-state \
     existing); never restart it under the same node id (docs/INVARIANTS.md, Storage)";

/// The newest chunk file of the log in `dir`, if any.
fn newest_chunk(dir: &Path) -> io::Result<Option<PathBuf>> {
    let mut tail: Option<(u64, PathBuf)> = None;
    for ent in std::fs::read_dir(dir)? {
        let ent = ent?;
        let name = ent.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Ok(id) = raft_log::chunked_wal::Config::parse_chunk_file_name(name) {
            if tail.as_ref().is_none_or(|(t, _)| id > *t) {
                tail = Some((id, ent.path()));
            }
        }
    }
    Ok(tail.map(|(_, p)| p))
}

/// Decodes one record from the start of `b`; its length on success.
fn decode_record(b: &[u8]) -> io::Result<usize> {
    let mut r = b;
    RaftLogRecord::<RlTypes>::decode(&mut r)?;
    Ok(b.len() - r.len())
}

/// Cheap filter for [`whole_record_after`]: could a record start at `b`? Every record begins
/// with its type (0..=5, big-endian u32); the first field of types 0-4 is a small log id or
/// vote (3: an option tag first). Keeps the scan from decoding garbage lengths at every byte.
fn may_start_record(b: &[u8]) -> bool {
    if b.len() < 16 || b[..3] != [0, 0, 0] {
        return false;
    }
    let first_len = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
    match b[3] {
        0 | 1 | 2 | 4 => (1..=64).contains(&first_len),
        3 => b[4] <= 1,
        5 => true,
        _ => false,
    }
}

/// The offset (from the start of `rest`, past its first byte) of a record that decodes whole
/// and passes its checksum, if any: a bad record followed by a good one was not the torn end
/// of a write.
fn whole_record_after(rest: &[u8]) -> Option<usize> {
    (1..rest.len())
        .find(|&off| may_start_record(&rest[off..]) && decode_record(&rest[off..]).is_ok())
}

/// Scans the newest chunk of the log in `dir`. A torn tail (an incomplete last record, or
/// trailing zeros) is cut and described in the returned string; `None` if the tail is intact.
/// Any other bad record is corruption: an `InvalidData` error naming the file, the byte offset
/// and the recovery, and the file is left as it is.
pub(crate) fn repair_tail(dir: &Path) -> io::Result<Option<String>> {
    let Some(path) = newest_chunk(dir)? else {
        return Ok(None);
    };
    let data = std::fs::read(&path)?;
    let (mut at, mut records) = (0usize, 0u64);
    let err = loop {
        if at == data.len() {
            return Ok(None);
        }
        match decode_record(&data[at..]) {
            Ok(n) => {
                at += n;
                records += 1;
            }
            Err(e) => break e,
        }
    };
    let rest = &data[at..];
    let corrupt = |why: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "corrupt log record in {} at byte {at} (after {records} good records, {} bytes \
                 before the end of the file): {why}; {RECOVERY}",
                path.display(),
                rest.len()
            ),
        )
    };
    let torn = if err.kind() == io::ErrorKind::UnexpectedEof {
        if let Some(off) = whole_record_after(rest) {
            return Err(corrupt(format!(
                "it runs past the end of the file ({err}), yet a whole record starts at byte {}, \
                 so its length is damaged, not torn",
                at + off
            )));
        }
        "an incomplete last record"
    } else if rest.iter().all(|&b| b == 0) {
        "zeros where the last records were never written"
    } else {
        return Err(corrupt(format!(
            "a complete record that fails to decode: {err}"
        )));
    };
    warn!(file = %path.display(), offset = at, error = %err, "torn log tail: {torn}");
    let f = OpenOptions::new().write(true).open(&path)?;
    f.set_len(at as u64)?;
    f.sync_all()?;
    Ok(Some(format!(
        "cut {} after {records} good records at byte {at}, dropping {} bytes of {torn}",
        path.display(),
        rest.len()
    )))
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let from = match range.start_bound() {
            Bound::Included(x) => *x,
            Bound::Excluded(x) => *x + 1,
            Bound::Unbounded => 0,
        };
        let to = match range.end_bound() {
            Bound::Included(x) => *x + 1,
            Bound::Excluded(x) => *x,
            Bound::Unbounded => u64::MAX,
        };
        let rl = self.lock();
        rl.read(from, to)
            .map(|r| {
                r.map(|(log_id, payload)| Entry {
                    log_id: log_id.0,
                    payload: payload.0,
                })
            })
            .collect()
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(self.lock().log_state().vote().map(|v| v.0))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let rl = self.lock();
        let st = rl.log_state();
        let purged = st.purged().map(|x| x.0);
        let last = st.last().map(|x| x.0).or(purged);
        Ok(LogState {
            last_purged_log_id: purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        self.lock().save_vote(Pc(*vote))?;
        self.flush_and_wait().await
    }

    /// Lets a restarted node re-apply up to `committed` at once. The record stays in raft-log's
    /// buffer and goes out with the next flush (the next append's, on a busy group): flushing
    /// it on its own cost every replica a wake-up of the flush thread and a write per entry,
    /// about a fifth of the context switches of an uncontended acquire. A clean stop writes it
    /// (`RaftGroup::shutdown`). Losing the newest record in a crash only makes a restarted replica apply its tail once it hears the
    /// leader's commit index; every read lockd serves is a ReadIndex read, which waits for that
    /// anyway (openraft's `save_committed` docs), and a replica that leads has applied its
    /// whole log first.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        if let Some(c) = committed {
            self.lock().commit(Pc(c))?;
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(self.lock().log_state().committed().map(|x| x.0))
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
        let timing = self.timing.clone().map(|t| (std::time::Instant::now(), t));
        let mut rl = self.lock();
        rl.append(entries.into_iter().map(|e| (Pc(e.log_id), Pc(e.payload))))?;
        rl.flush(true, Some(FlushCb::Raft(callback, timing)))?;
        Ok(())
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let first_removed = last_log_id.map(|l| l.index + 1).unwrap_or(0);
        self.lock().truncate(first_removed)?;
        self.flush_and_wait().await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        let mut rl = self.lock();
        rl.purge(Pc(log_id))?;
        // Only a synced flush lets raft-log delete purged chunks.
        rl.flush(true, None)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Seek, SeekFrom};

    use raft_log::Types;

    use super::*;

    fn vote(term: u64) -> Vote {
        openraft::impls::Vote::new(term, 1)
    }

    /// The cache's byte cap must see a batched entry as the many commands it holds: with a
    /// flat estimate per entry, 8,192 cached batches held ~120 MiB per node at 1M locks.
    #[test]
    fn cache_size_estimate_grows_with_the_commands_in_an_entry() {
        let acquire = |i: usize| lockd_core::Op::Acquire {
            session: lockd_core::SessionId(1),
            name: format!("jobs/{i}"),
            owner: "worker-7".into(),
            mode: lockd_core::LockMode::Exclusive,
            wait_ms: 0,
            reentrant: false,
        };
        let size = |n: usize| {
            let p = super::super::Proposal {
                now_ms: 1,
                ops: (0..n).map(acquire).collect(),
            };
            RlTypes::payload_size(&Pc(openraft::EntryPayload::Normal(p)))
        };
        let one = size(1);
        assert!((100..1_000).contains(&one), "one command: {one} B");
        assert!(size(256) >= 128 * one, "256 commands: {} B", size(256));
        let blank = RlTypes::payload_size(&Pc(openraft::EntryPayload::Blank));
        assert!(blank < one);
    }

    /// A log in `dir` holding the votes of terms 1..=4, one record each; the chunk file and
    /// the byte offset where each record starts (and the file's end).
    fn log_of_four_votes(dir: &Path) -> (PathBuf, Vec<u64>) {
        {
            let store = LogStore::open(dir, None).unwrap();
            let mut rl = store.lock();
            for term in 1..=4 {
                rl.save_vote(Pc(vote(term))).unwrap();
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            rl.flush(true, Some(FlushCb::Wait(tx))).unwrap();
            rx.blocking_recv().unwrap().unwrap();
        }
        let chunk = newest_chunk(dir).unwrap().unwrap();
        let data = std::fs::read(&chunk).unwrap();
        let mut offsets = vec![0u64];
        let mut at = 0;
        while at < data.len() {
            at += decode_record(&data[at..]).unwrap();
            offsets.push(at as u64);
        }
        // The chunk's initial checkpoint, then the four votes.
        assert_eq!(offsets.len(), 6, "{offsets:?}");
        (chunk, offsets)
    }

    fn xor_byte(path: &Path, at: u64, mask: u8) {
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        let mut b = [0u8; 1];
        f.seek(SeekFrom::Start(at)).unwrap();
        f.read_exact(&mut b).unwrap();
        f.seek(SeekFrom::Start(at)).unwrap();
        f.write_all(&[b[0] ^ mask]).unwrap();
    }

    fn last_vote(dir: &Path) -> Option<Vote> {
        let store = LogStore::open(dir, None).unwrap();
        let v = store.lock().log_state().vote().map(|v| v.0);
        v
    }

    #[test]
    fn a_torn_last_record_is_cut_on_open() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("log");
        let (chunk, offsets) = log_of_four_votes(&dir);
        let len = offsets[5];
        // The crash tore the last write: the file ends 3 bytes short of the last vote's end.
        OpenOptions::new()
            .write(true)
            .open(&chunk)
            .unwrap()
            .set_len(len - 3)
            .unwrap();
        assert_eq!(last_vote(&dir), Some(vote(3)));
        assert_eq!(std::fs::metadata(&chunk).unwrap().len(), offsets[4]);
    }

    #[test]
    fn trailing_zeros_are_cut_on_open() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("log");
        let (chunk, offsets) = log_of_four_votes(&dir);
        // The file's length reached the disk before its data (ext4 data=writeback).
        let mut f = OpenOptions::new().append(true).open(&chunk).unwrap();
        f.write_all(&[0u8; 100]).unwrap();
        drop(f);
        assert_eq!(last_vote(&dir), Some(vote(4)));
        assert_eq!(std::fs::metadata(&chunk).unwrap().len(), offsets[5]);
    }

    /// Before: the record was cut (with every record after it) and the log opened without it.
    #[test]
    fn a_complete_record_with_a_bad_checksum_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("log");
        let (chunk, offsets) = log_of_four_votes(&dir);
        let len = offsets[5];
        // Bit rot in the last record's checksum: complete, and wrong.
        xor_byte(&chunk, len - 1, 1);
        let e = LogStore::open(&dir, None)
            .err()
            .expect("a corrupt record is refused");
        let msg = e.to_string();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(msg.contains(&chunk.display().to_string()), "{msg}");
        assert!(msg.contains(&format!("at byte {}", offsets[4])), "{msg}");
        assert!(msg.contains("new --node-id"), "{msg}");
        // Nothing was cut: an operator (or a tool) can still look at the record.
        assert_eq!(std::fs::metadata(&chunk).unwrap().len(), len);

        // The same in a record that has others after it.
        xor_byte(&chunk, len - 1, 1);
        xor_byte(&chunk, offsets[3] - 1, 0x10);
        let msg = LogStore::open(&dir, None).err().unwrap().to_string();
        assert!(msg.contains(&format!("at byte {}", offsets[2])), "{msg}");
    }

    /// A damaged length field makes a complete record look as if it ran past the end of the
    /// file. Before: raft-log itself cut it and every record after it, silently.
    #[test]
    fn a_damaged_length_followed_by_records_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("log");
        let (chunk, offsets) = log_of_four_votes(&dir);
        // The second vote's length prefix (after its 4-byte type) grows by 2^24.
        xor_byte(&chunk, offsets[2] + 4, 1);
        let msg = LogStore::open(&dir, None)
            .err()
            .expect("refused")
            .to_string();
        assert!(msg.contains(&format!("at byte {}", offsets[2])), "{msg}");
        assert!(
            msg.contains(&format!("a whole record starts at byte {}", offsets[3])),
            "{msg}"
        );
        assert_eq!(std::fs::metadata(&chunk).unwrap().len(), offsets[5]);
    }
}
