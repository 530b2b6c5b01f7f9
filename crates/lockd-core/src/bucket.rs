//! Names to buckets: the stable hash that decides which group owns a name.
//!
//! `bucket = xxh3_64(name as UTF-8 bytes, seed 0) mod 4096`. XXH3 is a published, frozen
//! algorithm, so every node, client and version computes the same bucket for a name. The meta
//! group's shard map then maps the bucket to a lock group.

use serde::{Deserialize, Serialize};

use crate::types::Rejection;

/// The number of buckets names hash into.
pub const BUCKETS: u16 = 4096;

/// The bucket of a lock name.
pub fn bucket_of(name: &str) -> u16 {
    (xxhash_rust::xxh3::xxh3_64(name.as_bytes()) % BUCKETS as u64) as u16
}

/// Which lock group owns each bucket. Kept in the meta group (group 0); versioned so nodes and
/// clients can tell a stale cached copy from the current one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardMap {
    /// Rises by one with every change.
    pub version: u64,
    /// `groups[bucket]` is the lock group (1..) that owns the bucket; exactly 4096 entries.
    pub groups: Vec<u32>,
}

impl ShardMap {
    /// The initial map for `lock_groups` groups: bucket `b` goes to group `1 + b mod lock_groups`.
    pub fn initial(lock_groups: u32) -> ShardMap {
        assert!(lock_groups >= 1, "at least one lock group");
        ShardMap {
            version: 1,
            groups: (0..BUCKETS as u32).map(|b| 1 + b % lock_groups).collect(),
        }
    }

    /// The lock group that owns `name`.
    pub fn group_of(&self, name: &str) -> u32 {
        self.groups[bucket_of(name) as usize]
    }

    /// The rules a new map must follow, given the current one.
    pub fn validate(&self, current: Option<&ShardMap>) -> Result<(), Rejection> {
        let bad = |reason: String| Err(Rejection::InvalidShardMap { reason });
        if self.groups.len() != BUCKETS as usize {
            return bad(format!(
                "{} buckets given, {} required",
                self.groups.len(),
                BUCKETS
            ));
        }
        if self.groups.contains(&0) {
            return bad("group 0 is the meta group and owns no bucket".into());
        }
        let expected = current.map_or(1, |c| c.version + 1);
        if self.version != expected {
            return bad(format!(
                "version {} given, {} expected",
                self.version, expected
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_stable_and_spread() {
        // Pinned values: changing them would move every lock to another group.
        assert_eq!(
            bucket_of("payouts/merchant-48213"),
            bucket_of("payouts/merchant-48213")
        );
        let pinned = [
            bucket_of("a"),
            bucket_of("search/shard-17"),
            bucket_of("leader/orders-stream/9"),
        ];
        assert_eq!(pinned, PINNED);
        let mut seen = std::collections::HashSet::new();
        for i in 0..20_000 {
            let b = bucket_of(&format!("name-{i}"));
            assert!(b < BUCKETS);
            seen.insert(b);
        }
        assert!(
            seen.len() > 4000,
            "20k names cover {} of 4096 buckets",
            seen.len()
        );
    }

    // Cross-checked with an independent XXH3 (Python `xxhash.xxh3_64_intdigest(name) % 4096`).
    const PINNED: [u16; 3] = [3615, 515, 537];
}
