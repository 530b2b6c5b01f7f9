//! Snapshot and restore: deterministic bytes, and a hash to compare replicas.
//!
//! The image holds only primary data, sorted (sessions by id, locks by name); every index
//! (a session's holds and waits, deadlines, delays, counters) is rebuilt on restore. So two
//! replicas that applied the same log produce the same bytes, whatever their hash-map layout.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::bucket::ShardMap;
use crate::machine::{Lock, LockTable, Mint, Session};
use crate::types::{Namespace, SessionId};

/// Bumped when the layout changes; restore refuses images of another format.
pub const SNAPSHOT_FORMAT: u32 = 1;

#[derive(Serialize)]
struct ImageRef<'a> {
    format: u32,
    now_ms: u64,
    mint: &'a Mint,
    namespaces: Vec<&'a Namespace>,
    sessions: Vec<(SessionId, &'a Session)>,
    locks: Vec<(&'a str, &'a Lock)>,
    shard_map: Option<&'a ShardMap>,
}

#[derive(Deserialize)]
struct Image {
    format: u32,
    now_ms: u64,
    mint: Mint,
    namespaces: Vec<Namespace>,
    sessions: Vec<(SessionId, Session)>,
    locks: Vec<(String, Lock)>,
    shard_map: Option<ShardMap>,
}

/// Why a snapshot could not be restored.
#[derive(Debug, PartialEq, Eq)]
pub enum RestoreError {
    Decode(String),
    Format(u32),
    Inconsistent(String),
}

impl std::fmt::Display for RestoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RestoreError::Decode(e) => write!(f, "snapshot does not decode: {e}"),
            RestoreError::Format(v) => {
                write!(
                    f,
                    "snapshot format {v} is not the supported {SNAPSHOT_FORMAT}"
                )
            }
            RestoreError::Inconsistent(e) => write!(f, "snapshot is inconsistent: {e}"),
        }
    }
}

impl std::error::Error for RestoreError {}

impl LockTable {
    /// The state as deterministic bytes.
    pub fn snapshot(&self) -> Vec<u8> {
        let mut sessions: Vec<_> = self.sessions.iter().map(|(id, s)| (*id, s)).collect();
        sessions.sort_unstable_by_key(|(id, _)| *id);
        let mut locks: Vec<_> = self.locks.iter().map(|(n, l)| (&**n, l)).collect();
        locks.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let image = ImageRef {
            format: SNAPSHOT_FORMAT,
            now_ms: self.now_ms,
            mint: &self.mint,
            namespaces: self.namespaces.values().collect(),
            sessions,
            locks,
            shard_map: self.shard_map.as_ref(),
        };
        postcard::to_allocvec(&image).expect("serialising to memory cannot fail")
    }

    /// Rebuilds a state from [`LockTable::snapshot`] bytes, checking the invariants.
    pub fn restore(bytes: &[u8]) -> Result<LockTable, RestoreError> {
        let image: Image =
            postcard::from_bytes(bytes).map_err(|e| RestoreError::Decode(e.to_string()))?;
        if image.format != SNAPSHOT_FORMAT {
            return Err(RestoreError::Format(image.format));
        }
        let mut t = LockTable::new();
        t.now_ms = image.now_ms;
        t.mint = image.mint;
        t.shard_map = image.shard_map;
        t.namespaces = BTreeMap::new();
        for ns in image.namespaces {
            t.namespaces.insert(ns.prefix.clone(), ns);
        }
        if !t.namespaces.contains_key("") {
            return Err(RestoreError::Inconsistent("no default namespace".into()));
        }
        t.sessions.reserve(image.sessions.len());
        for (id, s) in image.sessions {
            t.sessions.insert(id, s);
        }
        t.locks.reserve(image.locks.len());
        for (name, lock) in image.locks {
            let name: Arc<str> = name.into();
            for h in &lock.holders {
                let s = t.sessions.get_mut(&h.session).ok_or_else(|| {
                    RestoreError::Inconsistent(format!("holder of '{name}' has no session"))
                })?;
                s.held.insert((name.clone(), h.token));
            }
            for w in lock.waiters() {
                let s = t.sessions.get_mut(&w.session).ok_or_else(|| {
                    RestoreError::Inconsistent(format!("waiter of '{name}' has no session"))
                })?;
                s.waits.insert((name.clone(), w.id));
                t.wait_deadlines.insert((w.deadline_ms, w.id, name.clone()));
            }
            if lock.delay_until_ms() != 0 {
                t.delays.insert((lock.delay_until_ms(), name.clone()));
            }
            t.locks.insert(name, lock);
        }
        t.check_invariants()
            .map_err(|v| RestoreError::Inconsistent(v.to_string()))?;
        Ok(t)
    }

    /// A 64-bit hash of the snapshot bytes (xxh3): equal for replicas that applied the same log.
    pub fn state_hash(&self) -> u64 {
        xxhash_rust::xxh3::xxh3_64(&self.snapshot())
    }
}
