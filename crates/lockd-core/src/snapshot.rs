//! Snapshot and restore: deterministic bytes, and a hash to compare replicas.
//!
//! The image holds only primary data, sorted (sessions by id, locks by name); every index
//! (a session's holds and waits, deadlines, delays, counters) is rebuilt on restore. So two
//! replicas that applied the same log produce the same bytes, whatever their hash-map layout.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::de::{self, DeserializeSeed, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use crate::bucket::ShardMap;
use crate::machine::{Lock, LockTable, Mint, Session};
use crate::types::{Namespace, SessionId};

/// Bumped when the layout changes; restore reads this format and the ones listed below, and
/// refuses any other.
///
/// - 2: a session records the namespace it was opened in.
/// - 1: sessions without a namespace (restored as unrestricted; see `Session::namespace`).
pub const SNAPSHOT_FORMAT: u32 = 2;

/// A session as format 1 wrote it.
#[derive(Deserialize)]
struct SessionV1 {
    ttl_ms: u64,
    opened_at_ms: u64,
    client: Box<str>,
}

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
        self.snapshot_with_capacity(0)
    }

    /// [`LockTable::snapshot`] into a buffer that starts with room for `capacity` bytes.
    ///
    /// A replica passes a bit more than its previous snapshot's size: the image of 250k locks
    /// is ~15 MiB, and growing a buffer to that by doubling holds up to twice the image (plus
    /// the copy during each move) while every group snapshots at about the same time.
    pub fn snapshot_with_capacity(&self, capacity: usize) -> Vec<u8> {
        postcard::to_extend(&self.image(), Vec::with_capacity(capacity))
            .expect("serialising to memory cannot fail")
    }

    /// The image: primary data only, sessions by id, locks by name.
    fn image(&self) -> ImageRef<'_> {
        let mut sessions: Vec<_> = self.sessions.iter().map(|(id, s)| (*id, s)).collect();
        sessions.sort_unstable_by_key(|(id, _)| *id);
        let mut locks: Vec<_> = self.locks.iter().map(|(n, l)| (&**n, l)).collect();
        locks.sort_unstable_by(|a, b| a.0.cmp(b.0));
        ImageRef {
            format: SNAPSHOT_FORMAT,
            now_ms: self.now_ms,
            mint: &self.mint,
            namespaces: self.namespaces.values().collect(),
            sessions,
            locks,
            shard_map: self.shard_map.as_ref(),
        }
    }

    /// Rebuilds a state from [`LockTable::snapshot`] bytes, checking the invariants.
    ///
    /// Each lock goes straight from the bytes into the table (its name borrowed, then
    /// allocated once as its `Arc<str>`): no intermediate list of a million records.
    pub fn restore(bytes: &[u8]) -> Result<LockTable, RestoreError> {
        let mut t = LockTable::new();
        let mut failure = None;
        let seed = ImageSeed {
            t: &mut t,
            failure: &mut failure,
            max_locks: bytes.len() / MIN_LOCK_BYTES,
        };
        let mut de = postcard::Deserializer::from_bytes(bytes);
        if let Err(e) = seed.deserialize(&mut de) {
            return Err(failure.unwrap_or_else(|| RestoreError::Decode(e.to_string())));
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

/// No lock encodes in fewer bytes (name length, holder count, contention flag): bounds what a
/// corrupt length prefix can make `restore` reserve.
const MIN_LOCK_BYTES: usize = 3;

/// Decodes an image (the fields of [`ImageRef`], in order) into `t`.
struct ImageSeed<'t> {
    t: &'t mut LockTable,
    /// Set when the bytes decode but describe an impossible state.
    failure: &'t mut Option<RestoreError>,
    max_locks: usize,
}

impl ImageSeed<'_> {
    fn fail<E: de::Error>(&mut self, e: RestoreError) -> E {
        let msg = e.to_string();
        *self.failure = Some(e);
        E::custom(msg)
    }

    /// Stores one lock and indexes its holders, waiters and delay.
    fn insert_lock(&mut self, name: &str, lock: Lock) -> Result<(), RestoreError> {
        let t = &mut *self.t;
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
        Ok(())
    }
}

const IMAGE_FIELDS: &[&str] = &[
    "format",
    "now_ms",
    "mint",
    "namespaces",
    "sessions",
    "locks",
    "shard_map",
];

impl<'de> DeserializeSeed<'de> for ImageSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_struct("ImageRef", IMAGE_FIELDS, self)
    }
}

fn field<'de, T: Deserialize<'de>, A: SeqAccess<'de>>(
    seq: &mut A,
    index: usize,
) -> Result<T, A::Error> {
    seq.next_element()?
        .ok_or_else(|| de::Error::invalid_length(index, &"a lockd snapshot image"))
}

impl<'de> Visitor<'de> for ImageSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a lockd snapshot image")
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        let format: u32 = field(&mut seq, 0)?;
        if format != SNAPSHOT_FORMAT && format != 1 {
            return Err(self.fail(RestoreError::Format(format)));
        }
        self.t.now_ms = field(&mut seq, 1)?;
        self.t.mint = field::<Mint, _>(&mut seq, 2)?;
        let namespaces: Vec<Namespace> = field(&mut seq, 3)?;
        self.t.namespaces = BTreeMap::new();
        for ns in namespaces {
            self.t.namespaces.insert(ns.prefix.clone(), ns);
        }
        if !self.t.namespaces.contains_key("") {
            return Err(self.fail(RestoreError::Inconsistent("no default namespace".into())));
        }
        let sessions: Vec<(SessionId, Session)> = if format == 1 {
            let old: Vec<(SessionId, SessionV1)> = field(&mut seq, 4)?;
            old.into_iter()
                .map(|(id, s)| {
                    let s = Session {
                        ttl_ms: s.ttl_ms,
                        opened_at_ms: s.opened_at_ms,
                        client: s.client,
                        namespace: "".into(),
                        held: Default::default(),
                        waits: Default::default(),
                    };
                    (id, s)
                })
                .collect()
        } else {
            field(&mut seq, 4)?
        };
        self.t.sessions.reserve(sessions.len());
        for (id, s) in sessions {
            self.t.sessions.insert(id, s);
        }
        seq.next_element_seed(LocksSeed(&mut self))?
            .ok_or_else(|| de::Error::invalid_length(5, &"a lockd snapshot image"))?;
        self.t.shard_map = field::<Option<ShardMap>, _>(&mut seq, 6)?;
        Ok(())
    }
}

/// The image's `locks`: `(name, lock)` pairs, each stored as soon as it is decoded.
struct LocksSeed<'s, 't>(&'s mut ImageSeed<'t>);

impl<'de> DeserializeSeed<'de> for LocksSeed<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for LocksSeed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a sequence of (name, lock)")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let image = self.0;
        let hint = seq.size_hint().unwrap_or(0).min(image.max_locks);
        image.t.locks.reserve(hint);
        while let Some((name, lock)) = seq.next_element::<(&'de str, Lock)>()? {
            if let Err(e) = image.insert_lock(name, lock) {
                return Err(image.fail(e));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Command, LockMode, Op};

    fn table() -> LockTable {
        let mut t = LockTable::new();
        for s in 1..=3 {
            let open = Op::OpenSession {
                session: SessionId(s),
                client: format!("c{s}"),
                ttl_ms: 0,
                namespace: String::new(),
            };
            assert!(t
                .apply(&Command {
                    now_ms: 1,
                    op: open
                })
                .reply
                .is_ok());
        }
        for (i, (s, name, mode, wait_ms)) in [
            (1, "a", LockMode::Exclusive, 0),
            (2, "a", LockMode::Exclusive, 5_000),
            (1, "b", LockMode::Shared, 0),
            (2, "b", LockMode::Shared, 0),
            (3, "b", LockMode::Shared, 0),
            (3, "c", LockMode::Semaphore { limit: 2 }, 0),
        ]
        .into_iter()
        .enumerate()
        {
            let acquire = Op::Acquire {
                session: SessionId(s),
                name: name.into(),
                owner: format!("o{i}"),
                mode,
                wait_ms,
                reentrant: false,
            };
            let out = t.apply(&Command {
                now_ms: 2,
                op: acquire,
            });
            assert!(out.reply.is_ok(), "{:?}", out.reply);
        }
        t
    }

    #[test]
    fn restore_streams_every_record_back() {
        let t = table();
        let bytes = t.snapshot();
        for cap in [0, 1, bytes.len(), bytes.len() * 3] {
            assert_eq!(t.snapshot_with_capacity(cap), bytes);
        }
        assert_eq!(bytes, postcard::to_allocvec(&t.image()).unwrap());
        let r = LockTable::restore(&bytes).unwrap();
        assert_eq!(r.snapshot(), bytes);
        assert_eq!(r.stats(), t.stats());
        assert_eq!(r.session_info(SessionId(2)), t.session_info(SessionId(2)));
        assert_eq!(r.lock_info("b", 3), t.lock_info("b", 3));
        assert_eq!(r.next_timer_ms(), t.next_timer_ms());
    }

    #[test]
    fn restore_says_why_it_refuses() {
        let t = table();
        let bytes = t.snapshot();
        for cut in [0, 1, bytes.len() / 2, bytes.len() - 1] {
            assert!(
                matches!(
                    LockTable::restore(&bytes[..cut]),
                    Err(RestoreError::Decode(_))
                ),
                "cut at {cut}"
            );
        }
        let mut other = bytes.clone();
        other[0] = 9; // the format is the first varint
        assert_eq!(
            LockTable::restore(&other).err(),
            Some(RestoreError::Format(9))
        );

        // A holder whose session is not in the image.
        let mut image = t.image();
        image.sessions.retain(|(id, _)| *id != SessionId(3));
        let broken = postcard::to_allocvec(&image).unwrap();
        assert!(matches!(
            LockTable::restore(&broken),
            Err(RestoreError::Inconsistent(m)) if m.contains("has no session")
        ));
    }

    /// A format-1 image (sessions without their namespace) still restores: its sessions keep
    /// their holds and stay unrestricted, while new sessions are bound to their namespace.
    #[test]
    fn a_format_1_image_restores_with_unrestricted_sessions() {
        #[derive(Serialize)]
        struct SessionV1Ref<'a> {
            ttl_ms: u64,
            opened_at_ms: u64,
            client: &'a str,
        }
        #[derive(Serialize)]
        struct ImageV1<'a> {
            format: u32,
            now_ms: u64,
            mint: &'a Mint,
            namespaces: Vec<&'a Namespace>,
            sessions: Vec<(SessionId, SessionV1Ref<'a>)>,
            locks: Vec<(&'a str, &'a Lock)>,
            shard_map: Option<&'a ShardMap>,
        }
        let t = table();
        let image = t.image();
        let v1 = ImageV1 {
            format: 1,
            now_ms: image.now_ms,
            mint: image.mint,
            namespaces: image.namespaces.clone(),
            sessions: image
                .sessions
                .iter()
                .map(|(id, s)| {
                    let s = SessionV1Ref {
                        ttl_ms: s.ttl_ms,
                        opened_at_ms: s.opened_at_ms,
                        client: &s.client,
                    };
                    (*id, s)
                })
                .collect(),
            locks: image.locks.clone(),
            shard_map: image.shard_map,
        };
        let bytes = postcard::to_allocvec(&v1).unwrap();
        let r = LockTable::restore(&bytes).unwrap();
        assert_eq!(r.stats(), t.stats());
        assert_eq!(r.session_info(SessionId(2)), t.session_info(SessionId(2)));
        assert!(r.sessions.values().all(|s| s.namespace.is_empty()));
        // Written back, it is the current format, and restores to the same state.
        let again = LockTable::restore(&r.snapshot()).unwrap();
        assert_eq!(again.snapshot(), r.snapshot());
    }
}
