//! Bucket ownership, as records: the set of 4,096 buckets a lock group serves, the moves it took
//! part in, and what a move exports. The rules that change them are the move commands
//! (`ownership_commands.rs`).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::bucket::BUCKETS;
use crate::entity::Holder;
use crate::types::*;

/// Identifies one move of buckets; chosen by the mover, unique in the cluster.
pub type MoveId = u64;

const WORDS: usize = BUCKETS as usize / 64;

/// A set of buckets. On the wire and in snapshots: sorted, disjoint inclusive ranges.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct BucketSet {
    words: [u64; WORDS],
}

impl BucketSet {
    pub fn empty() -> BucketSet {
        BucketSet { words: [0; WORDS] }
    }

    pub fn full() -> BucketSet {
        BucketSet {
            words: [u64::MAX; WORDS],
        }
    }

    /// The buckets in `start..=end` (clamped to the last bucket).
    pub fn range(start: u16, end: u16) -> BucketSet {
        (start..=end.min(BUCKETS - 1)).collect()
    }

    pub fn contains(&self, b: u16) -> bool {
        b < BUCKETS && self.words[b as usize / 64] & (1 << (b % 64)) != 0
    }

    /// Adds `b`; buckets past the last one are ignored.
    pub fn insert(&mut self, b: u16) {
        if b < BUCKETS {
            self.words[b as usize / 64] |= 1 << (b % 64);
        }
    }

    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|w| *w == 0)
    }

    pub fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        (0..BUCKETS).filter(|b| self.contains(*b))
    }

    pub fn is_subset(&self, other: &BucketSet) -> bool {
        self.words
            .iter()
            .zip(&other.words)
            .all(|(a, b)| a & !b == 0)
    }

    pub fn intersects(&self, other: &BucketSet) -> bool {
        self.words.iter().zip(&other.words).any(|(a, b)| a & b != 0)
    }

    pub fn union_with(&mut self, other: &BucketSet) {
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a |= b;
        }
    }

    pub fn subtract(&mut self, other: &BucketSet) {
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a &= !b;
        }
    }

    /// Sorted, disjoint, inclusive ranges.
    pub fn ranges(&self) -> Vec<(u16, u16)> {
        let mut out: Vec<(u16, u16)> = Vec::new();
        for b in self.iter() {
            match out.last_mut() {
                Some((_, end)) if *end + 1 == b => *end = b,
                _ => out.push((b, b)),
            }
        }
        out
    }

    /// The set of `ranges`, which must be sorted, disjoint, not adjacent and within the buckets.
    pub fn from_ranges(ranges: &[(u16, u16)]) -> Result<BucketSet, String> {
        let mut s = BucketSet::empty();
        let mut prev: Option<u16> = None;
        for &(start, end) in ranges {
            if start > end || end >= BUCKETS {
                return Err(format!(
                    "bucket range {start}-{end} is not within 0-{}",
                    BUCKETS - 1
                ));
            }
            if prev.is_some_and(|p| start <= p.saturating_add(1)) {
                return Err(format!(
                    "bucket range {start}-{end} overlaps, touches or precedes the one before"
                ));
            }
            prev = Some(end);
            for b in start..=end {
                s.insert(b);
            }
        }
        Ok(s)
    }
}

impl std::str::FromStr for BucketSet {
    type Err = String;

    /// `"0-63, 100,200-201"`: comma-separated buckets and inclusive ranges, in any order, with
    /// spaces around the items and dashes allowed; overlaps are merged. A bucket is a decimal
    /// number within 0-4095 without sign or leading zero, and a range's ends may come in either
    /// order ("63-0" is "0-63"). docs/openapi.yaml states this grammar as a pattern. The error
    /// names the part that is wrong.
    fn from_str(s: &str) -> Result<BucketSet, String> {
        let mut out = BucketSet::empty();
        for part in s.split(',') {
            let num = |t: &str| -> Result<u16, String> {
                let t = t.trim_matches(' ');
                let canonical = !t.is_empty()
                    && t.bytes().all(|b| b.is_ascii_digit())
                    && (t == "0" || !t.starts_with('0'));
                match t.parse::<u16>() {
                    Ok(b) if canonical && b < BUCKETS => Ok(b),
                    _ => Err(format!(
                        "'{}' is not a bucket or range of buckets within 0-{}",
                        part.trim_matches(' '),
                        BUCKETS - 1
                    )),
                }
            };
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (num(a)?, num(b)?),
                None => (num(part)?, num(part)?),
            };
            for x in a.min(b)..=a.max(b) {
                out.insert(x);
            }
        }
        Ok(out)
    }
}

impl Default for BucketSet {
    /// The empty set.
    fn default() -> BucketSet {
        BucketSet::empty()
    }
}

impl FromIterator<u16> for BucketSet {
    fn from_iter<I: IntoIterator<Item = u16>>(iter: I) -> BucketSet {
        let mut s = BucketSet::empty();
        for b in iter {
            s.insert(b);
        }
        s
    }
}

impl fmt::Display for BucketSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ranges = self.ranges();
        if ranges.is_empty() {
            return f.write_str("(none)");
        }
        for (i, (a, b)) in ranges.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            if a == b {
                write!(f, "{sep}{a}")?;
            } else {
                write!(f, "{sep}{a}-{b}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for BucketSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BucketSet({self})")
    }
}

impl Serialize for BucketSet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.ranges().serialize(s)
    }
}

impl<'de> Deserialize<'de> for BucketSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<BucketSet, D::Error> {
        let ranges = Vec::<(u16, u16)>::deserialize(d)?;
        BucketSet::from_ranges(&ranges).map_err(serde::de::Error::custom)
    }
}

/// What one group owns, and the moves it took part in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Ownership {
    /// The shard map version this group's buckets were last set for; 0 = never assigned, and
    /// then the group owns every bucket (a lone group, or one from before ownership existed).
    pub map_version: u64,
    pub owned: BucketSet,
    /// Every move this group took part in, by id: what makes each step idempotent.
    pub moves: BTreeMap<MoveId, MoveRecord>,
    /// The buckets of the `Outgoing` records: derived (see [`Ownership::record`]), so the check
    /// every grant makes never walks the move history, which only grows.
    #[serde(skip)]
    pub frozen: BucketSet,
    /// NEGATIVE CONTROL ONLY (`lockd-check sim --sabotage ownership`): serve every name,
    /// owned or not. Never set in production; not part of the state.
    #[serde(skip)]
    pub skip_check: bool,
}

impl Ownership {
    /// Records move `id`'s new state; the only way a record changes, so `frozen` stays true.
    pub fn record(&mut self, id: MoveId, r: MoveRecord) {
        self.moves.insert(id, r);
        self.rebuild_frozen();
    }

    /// Recomputes `frozen` from the records (after a record changes, and on restore).
    pub fn rebuild_frozen(&mut self) {
        let mut s = BucketSet::empty();
        for r in self.moves.values() {
            if let MoveRecord::Outgoing { buckets, .. } = r {
                s.union_with(buckets);
            }
        }
        self.frozen = s;
    }
}

impl Default for Ownership {
    fn default() -> Self {
        Ownership {
            map_version: 0,
            owned: BucketSet::full(),
            moves: BTreeMap::new(),
            frozen: BucketSet::empty(),
            skip_check: false,
        }
    }
}

/// One move as a group saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MoveRecord {
    /// Sending: the buckets are frozen here and their contents wait in the export.
    Outgoing {
        to_group: u32,
        buckets: BucketSet,
        export: Export,
    },
    /// Sent, and the buckets dropped here.
    Dropped { to_group: u32, buckets: BucketSet },
    /// Aborted: the export was put back.
    Thawed { to_group: u32, buckets: BucketSet },
    /// Received.
    Imported { from_group: u32, buckets: BucketSet },
    /// Cancelled before it was imported: refused here for good.
    Cancelled,
}

/// The contents of frozen buckets, as the receiving group imports them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Export {
    /// The sending group's revision at the freeze: at least every token it ever granted.
    pub revision: u64,
    /// Every session a holder belongs to, by id.
    pub sessions: Vec<ExportedSession>,
    /// Every name in the buckets with holders or a lock-delay, by name.
    pub locks: Vec<ExportedLock>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportedSession {
    pub id: SessionId,
    pub ttl_ms: u64,
    pub client: String,
    pub namespace: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportedLock {
    pub name: String,
    pub holders: Vec<ExportedHolder>,
    /// Group time left of the name's lock-delay (0 = none); group clocks differ, so it is
    /// carried as a duration.
    pub delay_left_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportedHolder {
    pub session: SessionId,
    pub token: Token,
    pub mode: LockMode,
    /// How long it had been held at the freeze.
    pub held_ms: u64,
    pub reentry: u32,
    pub reentrant: bool,
    pub owner: String,
}

impl ExportedHolder {
    /// The holder again, in a group whose clock reads `now` (import, or thaw after an abort).
    pub(crate) fn to_holder(&self, now: u64) -> Holder {
        Holder {
            session: self.session,
            token: self.token,
            mode: self.mode,
            granted_at_ms: now.saturating_sub(self.held_ms),
            reentry: self.reentry,
            reentrant: self.reentrant,
            owner: self.owner.as_str().into(),
        }
    }

    /// The event of this hold arriving in a group as `name`.
    pub(crate) fn moved_in(&self, name: &Arc<str>) -> LockEvent {
        LockEvent::HoldMovedIn {
            name: name.clone(),
            session: self.session,
            owner: self.owner.as_str().into(),
            token: self.token,
            mode: self.mode,
        }
    }
}

/// Ownership as status shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnershipView {
    pub map_version: u64,
    pub owned: BucketSet,
    /// Buckets frozen for moves under way.
    pub frozen: BucketSet,
}
