//! Names to buckets: the stable hash that decides which group owns a name.
//!
//! `bucket = xxh3_64(name as UTF-8 bytes, seed 0) mod 4096`. XXH3 is a published, frozen
//! algorithm, so every node, client and version computes the same bucket for a name. The meta
//! group's shard map then maps the bucket to a lock group.

/// The number of buckets names hash into.
pub const BUCKETS: u16 = 4096;

/// The bucket of a lock name.
pub fn bucket_of(name: &str) -> u16 {
    (xxhash_rust::xxh3::xxh3_64(name.as_bytes()) % BUCKETS as u64) as u16
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
