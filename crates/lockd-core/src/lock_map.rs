//! Compact storage for the lock records, tuned for a million held locks per replica.
//!
//! * [`LockMap`] keeps each record (name and [`Lock`]) in its own box and the hash table holds
//!   only the pointers: 8 bytes per bucket instead of 48. A power-of-two table is between 44%
//!   and 88% full, so the inline layout cost up to ~110 bytes of buckets per lock
//!   (4 groups × 250k locks sit just past a doubling).
//! * [`Holders`] stores the usual single holder inline in the record; only a shared or
//!   semaphore name with two or more holders allocates a `Vec`.
//!
//! Neither changes what is replicated: [`Holders`] serialises exactly as a `Vec<Holder>`, and
//! nothing iterates the table to decide an outcome (the snapshot sorts by name).

use std::fmt;
use std::hash::BuildHasher;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use hashbrown::hash_table::{Entry as TableEntry, HashTable};
use hashbrown::DefaultHashBuilder;
use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::machine::{Holder, Lock};

/// The holders of one name: none, one inline, or two or more in a `Vec`.
///
/// Canonical: a `Vec` never holds exactly one holder, so equal contents compare equal.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Holders(Repr);

#[derive(Clone, PartialEq, Eq)]
enum Repr {
    One(Holder),
    /// Zero, or two and more.
    Many(Vec<Holder>),
}

impl Default for Holders {
    fn default() -> Self {
        Holders(Repr::Many(Vec::new()))
    }
}

impl Holders {
    fn from_vec(mut v: Vec<Holder>) -> Holders {
        if v.len() == 1 {
            Holders(Repr::One(v.pop().expect("one element")))
        } else {
            Holders(Repr::Many(v))
        }
    }

    /// Back to the canonical form after a removal.
    fn normalize(&mut self) {
        if let Repr::Many(v) = &mut self.0 {
            if v.len() <= 1 {
                *self = Holders::from_vec(std::mem::take(v));
            }
        }
    }

    pub(crate) fn push(&mut self, h: Holder) {
        match &mut self.0 {
            Repr::Many(v) if v.is_empty() => self.0 = Repr::One(h),
            Repr::Many(v) => v.push(h),
            Repr::One(_) => {
                let Repr::One(first) = std::mem::take(self).0 else {
                    unreachable!("matched One")
                };
                self.0 = Repr::Many(vec![first, h]);
            }
        }
    }

    /// Removes and returns the holder at `i`, keeping the order of the others.
    pub(crate) fn remove(&mut self, i: usize) -> Holder {
        let h = match &mut self.0 {
            Repr::Many(v) => v.remove(i),
            Repr::One(_) => {
                assert_eq!(i, 0, "holder index out of range");
                let Repr::One(h) = std::mem::take(self).0 else {
                    unreachable!("matched One")
                };
                h
            }
        };
        self.normalize();
        h
    }

    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&Holder) -> bool) {
        match &mut self.0 {
            Repr::Many(v) => v.retain(keep),
            Repr::One(h) => {
                if !keep(h) {
                    *self = Holders::default();
                }
            }
        }
        self.normalize();
    }
}

impl Deref for Holders {
    type Target = [Holder];
    fn deref(&self) -> &[Holder] {
        match &self.0 {
            Repr::One(h) => std::slice::from_ref(h),
            Repr::Many(v) => v,
        }
    }
}

impl DerefMut for Holders {
    fn deref_mut(&mut self) -> &mut [Holder] {
        match &mut self.0 {
            Repr::One(h) => std::slice::from_mut(h),
            Repr::Many(v) => v,
        }
    }
}

impl<'a> IntoIterator for &'a Holders {
    type Item = &'a Holder;
    type IntoIter = std::slice::Iter<'a, Holder>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl fmt::Debug for Holders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Serialize for Holders {
    /// The same bytes as a `Vec<Holder>` (the snapshot format does not change).
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for Holders {
    /// Decodes a `Vec<Holder>`'s bytes straight into the inline form (restoring a million
    /// locks would otherwise allocate and free a million one-element `Vec`s).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Seq;
        impl<'de> Visitor<'de> for Seq {
            type Value = Holders;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sequence of holders")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Holders, A::Error> {
                let Some(first) = seq.next_element::<Holder>()? else {
                    return Ok(Holders::default());
                };
                let Some(second) = seq.next_element::<Holder>()? else {
                    return Ok(Holders(Repr::One(first)));
                };
                let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024) + 2);
                v.push(first);
                v.push(second);
                while let Some(h) = seq.next_element::<Holder>()? {
                    v.push(h);
                }
                Ok(Holders(Repr::Many(v)))
            }
        }
        d.deserialize_seq(Seq)
    }
}

/// One boxed record of the table.
#[derive(Clone)]
struct Record {
    name: Arc<str>,
    lock: Lock,
}

/// Name → [`Lock`], a hash table of boxed records.
#[derive(Clone, Default)]
pub(crate) struct LockMap {
    table: HashTable<Box<Record>>,
    hasher: DefaultHashBuilder,
}

impl LockMap {
    fn hash(&self, name: &str) -> u64 {
        self.hasher.hash_one(name)
    }

    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    pub(crate) fn reserve(&mut self, additional: usize) {
        let hasher = &self.hasher;
        self.table
            .reserve(additional, |r| hasher.hash_one(&*r.name));
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Lock> {
        self.table
            .find(self.hash(name), |r| *r.name == *name)
            .map(|r| &r.lock)
    }

    pub(crate) fn get_mut(&mut self, name: &str) -> Option<&mut Lock> {
        self.get_key_value_mut(name).map(|(_, lock)| lock)
    }

    /// The stored name (to share its allocation) and the record.
    pub(crate) fn get_key_value_mut(&mut self, name: &str) -> Option<(&Arc<str>, &mut Lock)> {
        let hash = self.hash(name);
        self.table.find_mut(hash, |r| *r.name == *name).map(|r| {
            let r = &mut **r;
            (&r.name, &mut r.lock)
        })
    }

    /// Stores `lock` under `name`, returning the record it replaced, like `HashMap::insert`.
    pub(crate) fn insert(&mut self, name: Arc<str>, lock: Lock) -> Option<Lock> {
        let hash = self.hash(&name);
        let hasher = &self.hasher;
        match self
            .table
            .entry(hash, |r| *r.name == *name, |r| hasher.hash_one(&*r.name))
        {
            TableEntry::Occupied(mut e) => Some(std::mem::replace(&mut e.get_mut().lock, lock)),
            TableEntry::Vacant(e) => {
                e.insert(Box::new(Record { name, lock }));
                None
            }
        }
    }

    pub(crate) fn remove(&mut self, name: &str) -> Option<Lock> {
        let hash = self.hash(name);
        match self.table.find_entry(hash, |r| *r.name == *name) {
            Ok(e) => Some(e.remove().0.lock),
            Err(_) => None,
        }
    }

    /// Every record, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &Lock)> {
        self.table.iter().map(|r| (&r.name, &r.lock))
    }

    /// The records from the `skip`th on, in the order of [`LockMap::iter`] (which holds while
    /// the table is not changed). Skipping reads the table's slots, not the records.
    pub(crate) fn iter_from(&self, skip: usize) -> impl Iterator<Item = (&Arc<str>, &Lock)> {
        self.table.iter().skip(skip).map(|r| (&r.name, &r.lock))
    }
}

impl fmt::Debug for LockMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::LockMode;

    fn holder(token: u64) -> Holder {
        Holder {
            session: crate::types::SessionId(token % 3 + 1),
            token,
            mode: LockMode::Shared,
            granted_at_ms: token * 10,
            reentry: 1,
            reentrant: token.is_multiple_of(2),
            owner: format!("owner-{token}").into(),
        }
    }

    #[test]
    fn holders_behave_like_a_vec_and_serialise_as_one() {
        let mut h = Holders::default();
        let mut v: Vec<Holder> = Vec::new();
        let same = |h: &Holders, v: &Vec<Holder>| {
            assert_eq!(&**h, v.as_slice());
            assert_eq!(
                postcard::to_allocvec(h).unwrap(),
                postcard::to_allocvec(v).unwrap()
            );
            let back: Holders = postcard::from_bytes(&postcard::to_allocvec(v).unwrap()).unwrap();
            assert_eq!(&back, h, "decoded form is canonical");
            assert_eq!(matches!(h.0, Repr::One(_)), v.len() == 1);
        };
        same(&h, &v);
        for t in 1..=4 {
            h.push(holder(t));
            v.push(holder(t));
            same(&h, &v);
        }
        h[2].reentry += 1;
        v[2].reentry += 1;
        same(&h, &v);
        assert_eq!(h.remove(1), v.remove(1));
        same(&h, &v);
        h.retain(|x| x.token != 4);
        v.retain(|x| x.token != 4);
        same(&h, &v);
        assert_eq!(h.remove(0), v.remove(0));
        same(&h, &v);
        h.retain(|x| x.token == 3);
        v.retain(|x| x.token == 3);
        same(&h, &v);
        h.retain(|_| false);
        v.retain(|_| false);
        same(&h, &v);
        h.push(holder(9));
        v.push(holder(9));
        same(&h, &v);
        assert_eq!(h.remove(0), v.remove(0));
        same(&h, &v);
    }

    #[test]
    fn lock_map_is_a_map() {
        let mut m = LockMap::default();
        let mut reference = std::collections::BTreeMap::new();
        for i in 0..2000u64 {
            let name: Arc<str> = format!("n/{}", i % 700).into();
            let mut lock = Lock::default();
            lock.holders.push(holder(i + 1));
            let old = m.insert(name.clone(), lock.clone());
            assert_eq!(old, reference.insert(name.clone(), lock));
            if i.is_multiple_of(3) {
                let gone: &str = &format!("n/{}", (i * 7) % 700);
                assert_eq!(m.remove(gone), reference.remove(gone));
            }
            assert_eq!(m.len(), reference.len());
        }
        for (name, lock) in &reference {
            assert_eq!(m.get(name), Some(lock));
            let (k, l) = m.get_key_value_mut(name).unwrap();
            assert!(Arc::ptr_eq(k, reference.get_key_value(name).unwrap().0) || **k == **name);
            assert_eq!(&*l, lock);
        }
        let mut listed: Vec<_> = m.iter().map(|(n, l)| (n.clone(), l.clone())).collect();
        listed.sort_by(|a, b| a.0.cmp(&b.0));
        let expected: Vec<_> = reference.into_iter().collect();
        assert_eq!(listed, expected);
        assert!(m.get("absent").is_none());
        assert!(m.remove("absent").is_none());
    }

    #[test]
    fn records_stay_small() {
        // The inline holder must not make every record bigger than holder + pointers.
        assert!(std::mem::size_of::<Holders>() <= std::mem::size_of::<Holder>() + 8);
        assert_eq!(std::mem::size_of::<Box<Record>>(), 8);
    }
}
