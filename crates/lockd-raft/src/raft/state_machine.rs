//! openraft's state machine over the group's [`Replica`], plus durable snapshots.
//!
//! The lock table lives in memory (in the replica); durability comes from the log plus a
//! snapshot file, `snapshot.bin` in the group directory: postcard `{meta, data}` followed by an
//! xxh3-64 of those bytes, written tmp → fsync → rename → fsync(dir). On start the newest
//! snapshot is restored and openraft replays the log after it (up to the persisted commit
//! index). The snapshot point is captured on the apply task (consistent with `last_applied`);
//! the file is written off it.
//!
//! Memory: on disk, only the newest snapshot's *meta* stays in memory. Its bytes (~61 B per
//! held lock, ~58 MiB at 1M locks) are read back from the file when openraft asks for them,
//! which happens only when a follower is too far behind for the log. The file is written
//! without copying the bytes again (header, data and checksum are streamed).
//!
//! With in-memory storage (the simulator) the snapshot goes to the node's [`MemStorage`]
//! after a simulated flush delay instead, on the calling task (no `spawn_blocking`).

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{Stream, TryStreamExt};
use lockd_core::LockTable;
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::type_config::alias::SnapshotOf;
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use tracing::info;

use super::mem_store::MemStorage;
use super::{enc, LogId, Outcome, SnapshotData, SnapshotMeta, StoredMembership, TypeConfig};
use crate::raft::replica::Replica;

pub(crate) const SNAPSHOT_FILE: &str = "snapshot.bin";

type Snapshot = SnapshotOf<TypeConfig, SnapshotData>;

/// How long a snapshot waits for a file descriptor before its error stops the group.
const FD_WAIT: Duration = Duration::from_secs(60);

/// EMFILE or ENFILE: the process or the system is out of file descriptors.
fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(23 | 24))
}

/// Where snapshots are made durable.
#[derive(Clone)]
pub(crate) enum SnapshotBackend {
    /// `snapshot.bin` in this group directory.
    Disk(PathBuf),
    /// The node's simulated disk, for this incarnation and group.
    Memory {
        disk: Arc<MemStorage>,
        gen: u64,
        group: crate::GroupId,
    },
}

/// The newest snapshot's meta, with its bytes only where they are not on disk.
type Current = Option<(SnapshotMeta, Option<SnapshotData>)>;

/// The newest durable snapshot, shared by the state machine and its builders.
#[derive(Clone)]
struct SnapshotStore {
    backend: SnapshotBackend,
    /// The newest snapshot's meta, and its bytes only with [`SnapshotBackend::Memory`] (the
    /// simulator); on disk the bytes are read back from the file when asked for.
    current: Arc<Mutex<Current>>,
    /// Serialises file writes (a builder and an install can race).
    write: Arc<Mutex<()>>,
}

/// The bytes of `SnapshotFile { meta, data }` as postcard writes them: the meta, then `data`
/// as a length-prefixed byte sequence. Streaming these parts spares a copy of `data`.
fn file_header(meta: &SnapshotMeta, data_len: usize) -> io::Result<Vec<u8>> {
    let mut head = enc(meta)?;
    let mut len = data_len as u64;
    loop {
        let byte = (len & 0x7f) as u8;
        len >>= 7;
        if len == 0 {
            head.push(byte);
            break;
        }
        head.push(byte | 0x80);
    }
    Ok(head)
}

impl SnapshotStore {
    /// Reads `snapshot.bin`; the data is returned in the buffer the file was read into.
    fn load(dir: &Path) -> io::Result<Option<(SnapshotMeta, SnapshotData)>> {
        let path = dir.join(SNAPSHOT_FILE);
        let mut bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let corrupt = |why: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {why}", path.display()),
            )
        };
        if bytes.len() < 8 {
            return Err(corrupt("too short"));
        }
        let (body, sum) = bytes.split_at(bytes.len() - 8);
        if xxhash_rust::xxh3::xxh3_64(body).to_le_bytes() != sum {
            return Err(corrupt("checksum mismatch"));
        }
        // `SnapshotFile` as postcard wrote it: the meta, the data's length, the data.
        let decode = |e: postcard::Error| corrupt(&e.to_string());
        let (meta, rest) = postcard::take_from_bytes::<SnapshotMeta>(body).map_err(decode)?;
        let (len, rest) = postcard::take_from_bytes::<u64>(rest).map_err(decode)?;
        if rest.len() as u64 != len {
            return Err(corrupt("data length does not match the file"));
        }
        let start = body.len() - rest.len();
        bytes.truncate(start + rest.len());
        bytes.drain(..start);
        Ok(Some((meta, bytes)))
    }

    /// Writes the snapshot durably, unless a newer one is already stored.
    fn save(&self, dir: &Path, meta: &SnapshotMeta, data: &SnapshotData) -> io::Result<()> {
        let _w = self.write.lock().expect("snapshot write lock poisoned");
        if let Some((cur, _)) = &*self.current.lock().expect("snapshot lock poisoned") {
            if cur.last_log_id >= meta.last_log_id {
                return Ok(());
            }
        }
        let head = file_header(meta, data.len())?;
        let mut sum = xxhash_rust::xxh3::Xxh3::new();
        sum.update(&head);
        sum.update(data);
        let tmp = dir.join("snapshot.bin.tmp");
        let mut f = crate::private::create_file(&tmp)?;
        f.write_all(&head)?;
        f.write_all(data)?;
        f.write_all(&sum.digest().to_le_bytes())?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, dir.join(SNAPSHOT_FILE))?;
        std::fs::File::open(dir)?.sync_all()?;
        *self.current.lock().expect("snapshot lock poisoned") = Some((meta.clone(), None));
        Ok(())
    }

    /// Makes the snapshot durable on the backend: a blocking file write off the async task,
    /// or a simulated flush.
    async fn persist(&self, meta: &SnapshotMeta, data: SnapshotData) -> io::Result<SnapshotData> {
        match &self.backend {
            SnapshotBackend::Disk(dir) => {
                // Out of file descriptors (a flood of connections, say) is a wait, not a
                // failure: openraft stops the group on an error here, which stops the node,
                // while the descriptors come back as the connection caps and deadlines close
                // what holds them. The log is not purged until the snapshot is written.
                let data = Arc::new(data);
                let mut pause = Duration::from_millis(100);
                let started = tokio::time::Instant::now();
                loop {
                    let (store, dir, m, d) =
                        (self.clone(), dir.clone(), meta.clone(), data.clone());
                    let saved = tokio::task::spawn_blocking(move || store.save(&dir, &m, &d))
                        .await
                        .map_err(io::Error::other)?;
                    match saved {
                        Err(e) if out_of_descriptors(&e) && started.elapsed() < FD_WAIT => {
                            tracing::warn!(error = %e, "no file descriptor for the snapshot; retrying");
                            tokio::time::sleep(pause).await;
                            pause = (pause * 2).min(Duration::from_secs(2));
                        }
                        Err(e) => return Err(e),
                        Ok(()) => break,
                    }
                }
                Ok(Arc::try_unwrap(data).unwrap_or_else(|d| (*d).clone()))
            }
            SnapshotBackend::Memory { disk, gen, group } => {
                disk.save_snapshot(*gen, *group, meta, &data).await?;
                let mut cur = self.current.lock().expect("snapshot lock poisoned");
                if cur
                    .as_ref()
                    .is_none_or(|(c, _)| c.last_log_id < meta.last_log_id)
                {
                    *cur = Some((meta.clone(), Some(data.clone())));
                }
                Ok(data)
            }
        }
    }

    /// The newest snapshot; on disk, read back from its file.
    async fn current(&self) -> io::Result<Option<Snapshot>> {
        let meta = match &*self.current.lock().expect("snapshot lock poisoned") {
            None => return Ok(None),
            Some((meta, Some(data))) => {
                return Ok(Some(Snapshot {
                    meta: meta.clone(),
                    snapshot: data.clone(),
                }))
            }
            Some((meta, None)) => meta.clone(),
        };
        let SnapshotBackend::Disk(dir) = &self.backend else {
            return Err(io::Error::other("an in-memory snapshot without its bytes"));
        };
        let (store, dir) = (self.clone(), dir.clone());
        let loaded = tokio::task::spawn_blocking(move || {
            // Not while a newer file is being written and renamed in.
            let _w = store.write.lock().expect("snapshot write lock poisoned");
            SnapshotStore::load(&dir)
        })
        .await
        .map_err(io::Error::other)??;
        match loaded {
            // The file is never older than the meta recorded after writing it.
            Some((m, data)) if m.last_log_id >= meta.last_log_id => Ok(Some(Snapshot {
                meta: m,
                snapshot: data,
            })),
            _ => Err(io::Error::other(format!(
                "snapshot file is missing or older than {:?}",
                meta.last_log_id
            ))),
        }
    }
}

pub(crate) struct StateMachine {
    replica: Arc<Replica>,
    last_applied: Option<LogId>,
    membership: StoredMembership,
    snapshots: SnapshotStore,
    /// Size of the newest snapshot built, restored or installed: the next one's buffer starts
    /// a little larger, so it does not grow by doubling.
    last_snapshot_len: usize,
}

/// A group directory's newest snapshot, read without starting Raft on it (`lockd
/// inspect-data`): where it stands in the log, who the members were, what the image holds.
#[derive(Clone, Debug)]
pub struct SnapshotReport {
    /// The last log entry the snapshot covers: (index, term).
    pub last_log: (u64, u64),
    pub voters: Vec<u64>,
    pub learners: Vec<u64>,
    /// The image's size in bytes.
    pub bytes: usize,
    /// What the restored image holds (revision, sessions, locks, holds, waiters).
    pub stats: lockd_core::Stats,
}

/// Reads `dir/snapshot.bin` (checksum checked, image restored in memory); `None` if there is
/// none. Writes nothing.
pub fn inspect_snapshot(dir: &Path) -> io::Result<Option<SnapshotReport>> {
    let Some((meta, data)) = SnapshotStore::load(dir)? else {
        return Ok(None);
    };
    let table = restore(&data)?;
    let m = meta.last_membership.membership();
    Ok(Some(SnapshotReport {
        last_log: log_pos(&meta.last_log_id),
        voters: m.voter_ids().collect(),
        learners: m.learner_ids().collect(),
        bytes: data.len(),
        stats: table.stats(),
    }))
}

fn restore(data: &[u8]) -> io::Result<LockTable> {
    LockTable::restore(data)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("snapshot restore: {e}")))
}

impl StateMachine {
    /// Loads the newest durable snapshot into `replica`, if there is one.
    pub(crate) fn open(
        backend: SnapshotBackend,
        replica: Arc<Replica>,
    ) -> io::Result<StateMachine> {
        let current = match &backend {
            SnapshotBackend::Disk(dir) => {
                crate::private::dir(dir)?;
                SnapshotStore::load(dir)?
            }
            SnapshotBackend::Memory { disk, group, .. } => disk.load_snapshot(*group),
        };
        let mut sm = StateMachine {
            replica,
            last_applied: None,
            membership: StoredMembership::default(),
            last_snapshot_len: 0,
            snapshots: SnapshotStore {
                backend,
                current: Arc::new(Mutex::new(None)),
                write: Arc::new(Mutex::new(())),
            },
        };
        if let Some((meta, data)) = current {
            let table = restore(&data)?;
            let (index, term) = log_pos(&meta.last_log_id);
            info!(group = sm.replica.group(), index, "restored snapshot");
            sm.replica.install(table, index, term);
            sm.last_applied = meta.last_log_id;
            sm.membership = meta.last_membership.clone();
            sm.last_snapshot_len = data.len();
            let data = match &sm.snapshots.backend {
                SnapshotBackend::Disk(_) => None,
                SnapshotBackend::Memory { .. } => Some(data),
            };
            *sm.snapshots.current.lock().expect("snapshot lock poisoned") = Some((meta, data));
        }
        Ok(sm)
    }
}

fn log_pos(log_id: &Option<LogId>) -> (u64, u64) {
    log_id
        .as_ref()
        .map_or((0, 0), |l| (l.index, l.leader_id.term))
}

/// Writes a snapshot captured on the apply task.
pub(crate) struct Builder {
    meta: SnapshotMeta,
    data: SnapshotData,
    store: SnapshotStore,
    /// Where the timing goes, with the group and the capture's time.
    sink: Arc<dyn crate::EffectSink>,
    group: crate::GroupId,
    captured: Duration,
}

impl RaftSnapshotBuilder<TypeConfig> for Builder {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let (meta, data) = (self.meta.clone(), std::mem::take(&mut self.data));
        let started = std::time::Instant::now();
        let data = self.store.persist(&meta, data).await?;
        self.sink
            .snapshot_made(self.group, self.captured, started.elapsed(), data.len());
        let snap = Snapshot {
            meta,
            snapshot: data,
        };
        info!(index = ?snap.meta.last_log_id, bytes = snap.snapshot.len(), "snapshot written");
        Ok(snap)
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = Builder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<S>(&mut self, mut entries: S) -> Result<(), io::Error>
    where
        S: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        while let Some((entry, responder)) = entries.try_next().await? {
            let (index, term) = (entry.log_id.index, entry.log_id.leader_id.term);
            let outcome = match entry.payload {
                EntryPayload::Normal(p) => self.replica.apply(index, term, p.now_ms, p.ops),
                EntryPayload::Blank => {
                    self.replica.mark_applied(index, term);
                    Vec::new()
                }
                EntryPayload::Membership(m) => {
                    self.membership = StoredMembership::new(Some(entry.log_id), m);
                    self.replica.mark_applied(index, term);
                    Vec::new()
                }
            };
            self.last_applied = Some(entry.log_id);
            if let Some(r) = responder {
                r.send(Outcome(outcome));
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        let hint = self.last_snapshot_len + self.last_snapshot_len / 8 + 4096;
        let started = std::time::Instant::now();
        let (data, index, _) = self.replica.snapshot(hint);
        let captured = started.elapsed();
        self.last_snapshot_len = data.len();
        debug_assert_eq!(index, self.last_applied.as_ref().map_or(0, |l| l.index));
        Builder {
            meta: SnapshotMeta {
                last_log_id: self.last_applied,
                last_membership: self.membership.clone(),
            },
            data,
            store: self.snapshots.clone(),
            sink: self.replica.sink(),
            group: self.replica.group(),
            captured,
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotData,
    ) -> Result<(), io::Error> {
        let table = restore(&snapshot)?;
        let data = self.snapshots.persist(meta, snapshot).await?;
        let (index, term) = log_pos(&meta.last_log_id);
        info!(
            group = self.replica.group(),
            index,
            bytes = data.len(),
            "installed snapshot from leader"
        );
        self.replica.install(table, index, term);
        self.replica.count_install();
        self.last_snapshot_len = data.len();
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        self.snapshots.current().await
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use super::*;

    /// The file's layout: postcard of this, then an xxh3-64 of those bytes.
    #[derive(Serialize, Deserialize)]
    struct SnapshotFile {
        meta: SnapshotMeta,
        data: SnapshotData,
    }

    fn meta(index: u64) -> SnapshotMeta {
        SnapshotMeta {
            last_log_id: Some(openraft::testing::log_id::<TypeConfig>(3, 1, index)),
            last_membership: StoredMembership::default(),
        }
    }

    fn disk_store(dir: &Path) -> SnapshotStore {
        SnapshotStore {
            backend: SnapshotBackend::Disk(dir.to_path_buf()),
            current: Arc::new(Mutex::new(None)),
            write: Arc::new(Mutex::new(())),
        }
    }

    /// The streamed file is byte for byte what `enc(SnapshotFile)` + checksum wrote before.
    #[test]
    fn streamed_header_matches_postcard() {
        for len in [0usize, 1, 127, 128, 16_383, 16_384, 3_000_000] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let m = meta(len as u64 + 1);
            let whole = enc(&SnapshotFile {
                meta: m.clone(),
                data: data.clone(),
            })
            .unwrap();
            let mut streamed = file_header(&m, data.len()).unwrap();
            streamed.extend_from_slice(&data);
            assert_eq!(streamed, whole, "data length {len}");
        }
    }

    /// On disk only the meta stays in memory; `current` reads the bytes back from the file.
    #[tokio::test]
    async fn disk_snapshot_is_read_back_from_its_file() {
        let tmp = tempfile::tempdir().unwrap();
        let store = disk_store(tmp.path());
        assert!(store.current().await.unwrap().is_none());

        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let kept = store.persist(&meta(10), data.clone()).await.unwrap();
        assert_eq!(kept, data);
        assert!(store.current.lock().unwrap().as_ref().unwrap().1.is_none());

        let snap = store.current().await.unwrap().unwrap();
        assert_eq!(snap.meta, meta(10));
        assert_eq!(snap.snapshot, data);

        // An older snapshot does not replace a newer one; a newer one does.
        store.persist(&meta(5), vec![1, 2, 3]).await.unwrap();
        assert_eq!(store.current().await.unwrap().unwrap().meta, meta(10));
        store.persist(&meta(11), vec![4, 5]).await.unwrap();
        let snap = store.current().await.unwrap().unwrap();
        assert_eq!((snap.meta, snap.snapshot), (meta(11), vec![4, 5]));

        // What a restart loads is what was written.
        let (m, d) = SnapshotStore::load(tmp.path()).unwrap().unwrap();
        assert_eq!((m, d), (meta(11), vec![4, 5]));
    }

    /// `load` reads a file written the original way (postcard of the whole `SnapshotFile`),
    /// and refuses one whose length prefix disagrees with the file.
    #[test]
    fn load_reads_the_original_layout_and_checks_lengths() {
        let tmp = tempfile::tempdir().unwrap();
        let write = |body: &[u8]| {
            let mut b = body.to_vec();
            b.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(body).to_le_bytes());
            std::fs::write(tmp.path().join(SNAPSHOT_FILE), b).unwrap();
        };
        let data: Vec<u8> = (0..70_000u32).map(|i| (i % 253) as u8).collect();
        let body = enc(&SnapshotFile {
            meta: meta(7),
            data: data.clone(),
        })
        .unwrap();
        write(&body);
        let (m, d) = SnapshotStore::load(tmp.path()).unwrap().unwrap();
        assert_eq!((m, d), (meta(7), data));

        let mut longer = body.clone();
        longer.push(0);
        write(&longer);
        assert!(SnapshotStore::load(tmp.path()).is_err());
        write(&body[..body.len() - 1]);
        assert!(SnapshotStore::load(tmp.path()).is_err());
    }
}
