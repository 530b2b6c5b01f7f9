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
use crate::entity::{Lock, Mint, Session};
use crate::machine::LockTable;
use crate::ownership::Ownership;
use crate::types::{Namespace, SessionId};

/// Bumped when the layout changes; restore reads this format and the ones listed below, and
/// refuses any other.
///
/// - 11: the meta group's node zones (`cluster.rs`).
/// - 10: the meta group's node incarnations (`cluster.rs`).
/// - 9: a namespace's `max_sessions`.
/// - 8: group records carry their placement version; removed groups; a closed lock group.
/// - 7: the namespaces' version (`Op::ChangeNamespace`).
/// - 6: the meta group's draining nodes (`cluster.rs`).
/// - 5: group records (meta), a lock group's birth and adopted sessions (`topology.rs`).
/// - 4: the meta group's cluster record (timing, retired node ids).
/// - 3: the group's bucket ownership and its moves.
/// - 2: a session records the namespace it was opened in (restored as owning every bucket).
/// - 1: sessions without a namespace (restored as unrestricted; see `Session::namespace`).
pub const SNAPSHOT_FORMAT: u32 = 11;

/// A session as format 1 wrote it.
#[derive(Deserialize)]
struct SessionV1 {
    ttl_ms: u64,
    opened_at_ms: u64,
    client: Box<str>,
}

impl From<SessionV1> for Session {
    /// A format-1 session recorded no namespace: it keeps the old unrestricted behaviour.
    fn from(s: SessionV1) -> Session {
        Session {
            ttl_ms: s.ttl_ms,
            opened_at_ms: s.opened_at_ms,
            client: s.client,
            namespace: "".into(),
            held: Default::default(),
            waits: Default::default(),
        }
    }
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
    ownership: &'a Ownership,
    cluster: &'a crate::cluster::ClusterRecord,
    topology: &'a crate::topology::Topology,
    draining: &'a std::collections::BTreeSet<u64>,
    namespaces_version: u64,
    incarnations: &'a BTreeMap<u64, u64>,
    zones: &'a BTreeMap<u64, String>,
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
                    "snapshot format {v} is not one this version reads (1..={SNAPSHOT_FORMAT})"
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
            ownership: &self.ownership,
            cluster: &self.cluster,
            topology: &self.topology,
            draining: &self.cluster.draining,
            namespaces_version: self.namespaces_version,
            incarnations: &self.cluster.incarnations,
            zones: &self.cluster.zones,
        }
    }

    /// Rebuilds a state from [`LockTable::snapshot`] bytes, and refuses any image a correct
    /// replica could not have written.
    ///
    /// Decoding refuses a format it does not know, records listed twice or out of order, and
    /// holders or waiters of a session the image does not have; then
    /// [`LockTable::check_invariants`] refuses every state no sequence of commands can reach
    /// (limits, counters, namespaces, shard map, indexes). docs/INVARIANTS.md lists them.
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
        // An older format's adopted sessions that have ended since (`Topology::lease_restarted`).
        let open = &t.sessions;
        t.topology.lease_restarted.retain(|s| open.contains_key(s));
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
    "ownership",
    "cluster",
    "topology",
    "draining",
    "namespaces_version",
    "incarnations",
    "zones",
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
        if !(1..=SNAPSHOT_FORMAT).contains(&format) {
            return Err(self.fail(RestoreError::Format(format)));
        }
        self.t.now_ms = field(&mut seq, 1)?;
        self.t.mint = field::<Mint, _>(&mut seq, 2)?;
        let namespaces: Vec<Namespace> = if format >= 9 {
            field(&mut seq, 3)?
        } else {
            let old: Vec<crate::types::NamespaceV8> = field(&mut seq, 3)?;
            old.into_iter().map(Namespace::from).collect()
        };
        // The image lists each kind of record sorted by its key, once; the maps it is decoded
        // into would silently keep one of two records with the same key.
        if let Err(e) = strictly_sorted("namespace prefix", namespaces.iter().map(|n| &n.prefix)) {
            return Err(self.fail(e));
        }
        self.t.namespaces = BTreeMap::new();
        for ns in namespaces {
            self.t.namespaces.insert(ns.prefix.clone(), ns);
        }
        let sessions: Vec<(SessionId, Session)> = if format == 1 {
            let old: Vec<(SessionId, SessionV1)> = field(&mut seq, 4)?;
            old.into_iter().map(|(id, s)| (id, s.into())).collect()
        } else {
            field(&mut seq, 4)?
        };
        if let Err(e) = strictly_sorted("session id", sessions.iter().map(|(id, _)| id)) {
            return Err(self.fail(e));
        }
        self.t.sessions.reserve(sessions.len());
        for (id, s) in sessions {
            self.t.insert_session(id, s);
        }
        seq.next_element_seed(LocksSeed(&mut self))?
            .ok_or_else(|| de::Error::invalid_length(5, &"a lockd snapshot image"))?;
        self.t.shard_map = field::<Option<ShardMap>, _>(&mut seq, 6)?;
        if format >= 3 {
            self.t.ownership = field::<Ownership, _>(&mut seq, 7)?;
            self.t.ownership.rebuild_frozen();
        }
        if format >= 4 {
            self.t.cluster = field(&mut seq, 8)?;
        }
        if format >= 8 {
            self.t.topology = field(&mut seq, 9)?;
        } else if format >= 5 {
            self.t.topology = field::<crate::topology::TopologyV5, _>(&mut seq, 9)?.into();
        }
        if format >= 6 {
            self.t.cluster.draining = field(&mut seq, 10)?;
        }
        // Before format 7 the version was not kept: an image with namespaces beyond the default
        // one had them set, so it is not a cluster a seed may still configure.
        self.t.namespaces_version = if format >= 7 {
            field(&mut seq, 11)?
        } else {
            u64::from(self.t.namespaces.len() > 1)
        };
        if format >= 10 {
            self.t.cluster.incarnations = field(&mut seq, 12)?;
        }
        if format >= 11 {
            self.t.cluster.zones = field(&mut seq, 13)?;
        }
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
        let mut prev: Option<&'de str> = None;
        while let Some((name, lock)) = seq.next_element::<(&'de str, Lock)>()? {
            if let Some(p) = prev {
                if let Err(e) = in_order("lock name", &p, &name) {
                    return Err(image.fail(e));
                }
            }
            prev = Some(name);
            if let Err(e) = image.insert_lock(name, lock) {
                return Err(image.fail(e));
            }
        }
        Ok(())
    }
}

/// Refuses keys that are not strictly rising (a duplicate, or out of the order `snapshot` writes).
fn strictly_sorted<'k, K: Ord + std::fmt::Debug + 'k>(
    what: &str,
    keys: impl Iterator<Item = &'k K>,
) -> Result<(), RestoreError> {
    let mut prev = None;
    for k in keys {
        if let Some(p) = prev {
            in_order(what, p, k)?;
        }
        prev = Some(k);
    }
    Ok(())
}

fn in_order<K: Ord + std::fmt::Debug + ?Sized>(
    what: &str,
    prev: &K,
    next: &K,
) -> Result<(), RestoreError> {
    match prev.cmp(next) {
        std::cmp::Ordering::Less => Ok(()),
        std::cmp::Ordering::Equal => Err(RestoreError::Inconsistent(format!(
            "duplicate {what} {next:?}"
        ))),
        std::cmp::Ordering::Greater => Err(RestoreError::Inconsistent(format!(
            "{what} {next:?} listed after {prev:?} (the image is sorted)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entity::{Holder, Waiter};
    use crate::limits;
    use crate::types::{Command, LockMode, NamespaceV8, Op};

    /// Namespaces as formats before 9 wrote them (no `max_sessions`).
    fn v8(namespaces: &[&Namespace]) -> Vec<NamespaceV8> {
        namespaces
            .iter()
            .map(|n| n.as_v8().expect("no max_sessions in these tests"))
            .collect()
    }

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
        let next = SNAPSHOT_FORMAT + 1;
        other[0] = next as u8; // the format is the first varint
        assert_eq!(
            LockTable::restore(&other).err(),
            Some(RestoreError::Format(next))
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

    /// The message of an `Inconsistent` refusal, or a panic saying what restore did instead.
    fn refusal(bytes: &[u8]) -> String {
        match LockTable::restore(bytes) {
            Err(RestoreError::Inconsistent(m)) => m,
            Err(e) => panic!("refused, but not as inconsistent: {e}"),
            Ok(_) => panic!("restored an image no correct replica writes"),
        }
    }

    /// Every kind of state that no sequence of commands reaches is refused, saying what is wrong.
    /// Each case breaks one thing in a good table and writes it as a snapshot.
    #[test]
    fn restore_refuses_every_state_commands_cannot_reach() {
        type Break = fn(&mut LockTable);
        fn put(t: &mut LockTable, prefix: &str, name: &str, f: impl FnOnce(&mut Namespace)) {
            let mut n = Namespace {
                name: name.into(),
                prefix: prefix.into(),
                ..Namespace::default_namespace()
            };
            f(&mut n);
            t.namespaces.insert(prefix.into(), n);
        }
        fn holder<'t>(t: &'t mut LockTable, name: &str) -> &'t mut Holder {
            &mut t.locks.get_mut(name).unwrap().holders[0]
        }
        fn waiter(t: &mut LockTable) -> &mut Waiter {
            &mut t.locks.get_mut("a").unwrap().waiters_mut()[0]
        }
        fn session(t: &mut LockTable, id: u64) -> &mut Session {
            t.sessions.get_mut(&SessionId(id)).unwrap()
        }
        let cases: &[(&str, Break)] = &[
            // The shard map: what `ShardMap::validate` promised.
            (
                "shard-map violated: 10 buckets mapped, 4096 required",
                |t| {
                    t.shard_map = Some(ShardMap {
                        version: 1,
                        groups: vec![1; 10],
                    })
                },
            ),
            ("bucket 17 maps to group 0, the meta group", |t| {
                let mut map = ShardMap::initial(4);
                map.groups[17] = 0;
                t.shard_map = Some(map);
            }),
            ("shard-map violated: version 0", |t| {
                t.shard_map = Some(ShardMap {
                    version: 0,
                    ..ShardMap::initial(2)
                })
            }),
            // Namespaces.
            ("namespace violated: no default namespace", |t| {
                t.namespaces.remove("");
            }),
            (
                "namespace violated: 'p': invalid namespace: TTLs must satisfy",
                |t| put(t, "p/", "p", |n| n.min_ttl_ms = 0),
            ),
            (
                "'p': invalid namespace: prefix 'p' must end with '/'",
                |t| put(t, "p", "p", |_| {}),
            ),
            (
                "only the namespace named 'default' has the empty prefix",
                |t| t.namespaces.get_mut("").unwrap().name = "main".into(),
            ),
            (
                "'p': invalid namespace: lock_delay_ms 60001 exceeds 60000",
                |t| put(t, "p/", "p", |n| n.lock_delay_ms = 60_001),
            ),
            ("two namespaces are named 'p'", |t| {
                put(t, "p/", "p", |_| {});
                put(t, "q/", "p", |_| {});
            }),
            // Sessions: what `OpenSession` checked.
            (
                "session s_0000000000000001 TTL 0 ms is outside 1000..=3600000 ms",
                |t| session(t, 1).ttl_ms = 0,
            ),
            (
                "session s_0000000000000002 TTL 3600001 ms is outside",
                |t| session(t, 2).ttl_ms = limits::HARD_MAX_TTL_MS + 1,
            ),
            ("session s_0000000000000003: client is too long", |t| {
                session(t, 3).client = "c".repeat(limits::MAX_CLIENT_BYTES + 1).into()
            }),
            (
                "session s_0000000000000003: client contains a control character",
                |t| session(t, 3).client = "bad\n".into(),
            ),
            ("session s_0000000000000001: namespace is too long", |t| {
                session(t, 1).namespace = "n".repeat(65).into()
            }),
            ("session s_0000000000000001 opened at 99 after now 2", |t| {
                session(t, 1).opened_at_ms = 99
            }),
            // Counters.
            (
                "counter violated: revision 9223372036854775808 is above its limit",
                |t| t.mint.revision = limits::MAX_REVISION + 1,
            ),
            (
                "S2 violated: 'c' token 5 is duplicated or above revision 4",
                |t| t.mint.revision = 4,
            ),
            (
                "'a' waiter 1 is duplicated or not below the next waiter id 1",
                |t| t.mint.next_waiter = 1,
            ),
            ("the next waiter id is 0", |t| t.mint.next_waiter = 0),
            ("waiter 1 is duplicated", |t| {
                // A second waiter, on another name, under the same id.
                let mut w = waiter(t).clone();
                w.session = SessionId(3);
                w.owner = "w".into();
                t.locks.get_mut("b").unwrap().waiters_mut().push_back(w);
            }),
            // Locks.
            ("S1 violated: 'b' semaphore(2) has 3 holders", |t| {
                for h in t.locks.get_mut("b").unwrap().holders.iter_mut() {
                    h.mode = LockMode::Semaphore { limit: 2 };
                }
            }),
            ("S1 violated: 'c' semaphore(0) has 1 holders", |t| {
                holder(t, "c").mode = LockMode::Semaphore { limit: 0 }
            }),
            (
                "'a' holder 1 uses semaphore(10001), outside 1..=10000",
                |t| {
                    holder(t, "a").mode = LockMode::Semaphore { limit: 10_001 };
                    waiter(t).mode = LockMode::Semaphore { limit: 10_001 };
                },
            ),
            ("record violated: 'e' is idle but still stored", |t| {
                t.locks.insert("e".into(), Lock::default());
            }),
            ("'a' holder 1: owner is too long", |t| {
                holder(t, "a").owner = "o".repeat(limits::MAX_OWNER_BYTES + 1).into()
            }),
            ("'a' waiter 1: owner is too long", |t| {
                waiter(t).owner = "o".repeat(limits::MAX_OWNER_BYTES + 1).into()
            }),
            ("lock name '': name is empty", |t| {
                let lock = t.locks.remove("c").unwrap();
                t.locks.insert("".into(), lock);
            }),
            ("'a' holder 1 re-entered 2 times (reentrant: false", |t| {
                holder(t, "a").reentry = 2
            }),
            (
                "'a' holder 1 re-entered 1000001 times (reentrant: true",
                |t| {
                    let h = holder(t, "a");
                    h.reentrant = true;
                    h.reentry = limits::MAX_REENTRY + 1;
                },
            ),
            ("'a' holder 1 granted at 7 after now 2", |t| {
                holder(t, "a").granted_at_ms = 7
            }),
            ("'a' waiter 1 enqueued at 2 with deadline 300003", |t| {
                waiter(t).deadline_ms = 2 + limits::MAX_WAIT_MS + 1
            }),
            (
                "'a' lock-delay until 60003 is more than 60000 ms after now 2",
                |t| t.locks.get_mut("a").unwrap().set_delay_until(60_003),
            ),
        ];
        for (want, break_it) in cases {
            let mut t = table();
            break_it(&mut t);
            let got = match LockTable::restore(&t.snapshot()) {
                Err(RestoreError::Inconsistent(m)) => m,
                other => panic!("want '{want}', got {:?}", other.map(|_| ())),
            };
            assert!(got.contains(want), "want '{want}' in '{got}'");
        }
    }

    /// Records listed twice or out of order are refused while decoding: the maps they are
    /// decoded into would keep only one of two records with the same key.
    #[test]
    fn restore_refuses_records_listed_twice_or_out_of_order() {
        let mut t = table();
        t.namespaces.insert(
            "p/".into(),
            Namespace {
                name: "p".into(),
                prefix: "p/".into(),
                ..Namespace::default_namespace()
            },
        );
        let encode = |image: &ImageRef<'_>| postcard::to_allocvec(image).unwrap();
        let good = t.image();
        assert!(LockTable::restore(&encode(&good)).is_ok());

        let mut image = t.image();
        image.namespaces.push(image.namespaces[1]);
        assert_eq!(
            refusal(&encode(&image)),
            "duplicate namespace prefix \"p/\""
        );
        let mut image = t.image();
        image.namespaces.reverse();
        assert!(refusal(&encode(&image)).contains("listed after"));

        let mut image = t.image();
        image.sessions.insert(1, image.sessions[0]);
        assert_eq!(
            refusal(&encode(&image)),
            "duplicate session id SessionId(1)"
        );
        let mut image = t.image();
        image.sessions.swap(0, 2);
        assert!(
            refusal(&encode(&image)).contains("session id SessionId(2) listed after SessionId(3)")
        );

        let mut image = t.image();
        image.locks.push(image.locks[2]);
        assert_eq!(refusal(&encode(&image)), "duplicate lock name \"c\"");
        let mut image = t.image();
        image.locks.swap(0, 1);
        assert_eq!(
            refusal(&encode(&image)),
            "lock name \"a\" listed after \"b\" (the image is sorted)"
        );
    }

    /// A session outlives the namespace it was opened in (deleting a namespace ends no session),
    /// so a session naming a namespace that no longer exists is a state commands reach: it
    /// restores. So does a format-1 session (no namespace).
    #[test]
    fn a_session_of_a_deleted_namespace_restores() {
        let mut t = table();
        let put = Op::PutNamespace {
            namespace: Namespace {
                name: "p".into(),
                prefix: "p/".into(),
                ..Namespace::default_namespace()
            },
        };
        let open = Op::OpenSession {
            session: SessionId(9),
            client: "p-worker".into(),
            ttl_ms: 0,
            namespace: "p".into(),
        };
        let delete = Op::DeleteNamespace {
            prefix: "p/".into(),
        };
        for op in [put, open, delete] {
            assert!(t.apply(&Command { now_ms: 3, op }).reply.is_ok());
        }
        t.check_invariants().unwrap();
        assert_eq!(&*t.sessions[&SessionId(9)].namespace, "p");
        let r = LockTable::restore(&t.snapshot()).unwrap();
        assert_eq!(r.snapshot(), t.snapshot());
        t.sessions.get_mut(&SessionId(9)).unwrap().namespace = "".into();
        assert!(LockTable::restore(&t.snapshot()).is_ok());
    }

    /// A format-2 image (before bucket ownership) restores as a group that owns every bucket.
    #[test]
    fn a_format_2_image_restores_owning_every_bucket() {
        #[derive(Serialize)]
        struct ImageV2<'a> {
            format: u32,
            now_ms: u64,
            mint: &'a Mint,
            namespaces: Vec<NamespaceV8>,
            sessions: Vec<(SessionId, &'a Session)>,
            locks: Vec<(&'a str, &'a Lock)>,
            shard_map: Option<&'a ShardMap>,
        }
        let t = table();
        let i = t.image();
        let v2 = ImageV2 {
            format: 2,
            now_ms: i.now_ms,
            mint: i.mint,
            namespaces: v8(&i.namespaces),
            sessions: i.sessions.clone(),
            locks: i.locks.clone(),
            shard_map: i.shard_map,
        };
        let r = LockTable::restore(&postcard::to_allocvec(&v2).unwrap()).unwrap();
        assert_eq!(r.snapshot(), t.snapshot());
        assert_eq!(r.ownership().map_version, 0);
        assert_eq!(r.ownership().owned.len(), 4096);
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
            namespaces: Vec<NamespaceV8>,
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
            namespaces: v8(&image.namespaces),
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

    /// A format-8 image (namespaces without `max_sessions`) restores with no namespace cap,
    /// and counts its sessions per namespace as an open would have.
    #[test]
    fn a_format_8_image_restores_without_session_caps() {
        #[derive(Serialize)]
        struct ImageV8<'a> {
            format: u32,
            now_ms: u64,
            mint: &'a Mint,
            namespaces: Vec<NamespaceV8>,
            sessions: Vec<(SessionId, &'a Session)>,
            locks: Vec<(&'a str, &'a Lock)>,
            shard_map: Option<&'a ShardMap>,
            ownership: &'a Ownership,
            cluster: &'a crate::cluster::ClusterRecord,
            topology: &'a crate::topology::Topology,
            draining: &'a std::collections::BTreeSet<u64>,
            namespaces_version: u64,
        }
        let mut t = table();
        let put = Op::PutNamespace {
            namespace: Namespace {
                name: "p".into(),
                prefix: "p/".into(),
                ..Namespace::default_namespace()
            },
        };
        let open = |id| Op::OpenSession {
            session: SessionId(id),
            client: String::new(),
            ttl_ms: 0,
            namespace: "p".into(),
        };
        for op in [put, open(40), open(41)] {
            assert!(t.apply(&Command { now_ms: 3, op }).reply.is_ok());
        }
        let i = t.image();
        let old = ImageV8 {
            format: 8,
            now_ms: i.now_ms,
            mint: i.mint,
            namespaces: v8(&i.namespaces),
            sessions: i.sessions.clone(),
            locks: i.locks.clone(),
            shard_map: i.shard_map,
            ownership: i.ownership,
            cluster: i.cluster,
            topology: i.topology,
            draining: i.draining,
            namespaces_version: i.namespaces_version,
        };
        let r = LockTable::restore(&postcard::to_allocvec(&old).unwrap()).unwrap();
        assert_eq!(r.snapshot(), t.snapshot());
        assert!(r.namespaces.values().all(|n| n.max_sessions == 0));
        assert_eq!(r.namespace_sessions.get("p"), Some(&2));
    }
}
