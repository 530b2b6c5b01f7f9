//! Compact storage for the lock records, tuned for a million held locks per replica.
//!
//! * [`LockMap`] keeps each record (name and [`Lock`]) in its own box and the hash table holds
//!   only the pointers: 8 bytes per bucket instead of 48. A power-of-two table is between 44%
//!   and 88% full, so the inline layout cost up to ~110 bytes of buckets per lock
//!   (4 groups × 250k locks sit just past a doubling).
//! * The holders of a record are compact too (`entity/holders.rs`): the usual single holder is
//!   stored inline.
//!
//! Neither changes what is replicated: nothing iterates the table to decide an outcome (the
//! snapshot sorts by name).

use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::hash_table::{Entry as TableEntry, HashTable};
use hashbrown::DefaultHashBuilder;

use crate::entity::Lock;

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
    use crate::entity::{test_holder as holder, Holder, Holders};

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
