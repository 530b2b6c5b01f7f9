//! Fuzz command sequences: any sequence must keep the invariants, mint rising tokens per name,
//! leave the state untouched on rejection, and survive snapshot → restore with the same hash.
#![no_main]

use std::collections::HashMap;

use arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use lockd_core::*;

const NAMES: [&str; 5] = ["a", "b", "d/a", "d/b", ""];

fn mode(u: &mut Unstructured) -> Result<LockMode> {
    Ok(match u.int_in_range(0..=4)? {
        0 | 1 => LockMode::Exclusive,
        2 => LockMode::Shared,
        n => LockMode::Semaphore { limit: n - 1 },
    })
}

fn op(u: &mut Unstructured) -> Result<Op> {
    let session = SessionId(u.int_in_range(1..=5)?);
    let name = NAMES[u.choose_index(NAMES.len())?].to_string();
    Ok(match u.int_in_range(0..=12)? {
        0 => Op::OpenSession { session, client: "c".into(), ttl_ms: *u.choose(&[0, 4_000, 15_000])?, namespace: String::new() },
        1 => Op::CloseSession { session },
        2 => Op::ExpireSessions { sessions: vec![session] },
        3 | 4 => Op::Acquire {
            session,
            name,
            owner: (*u.choose(&["o1", "o2"])?).to_string(),
            mode: mode(u)?,
            wait_ms: *u.choose(&[0, 300, 2_000])?,
            reentrant: u.arbitrary()?,
        },
        5 | 6 => Op::Release { session, name, token: u.int_in_range(0..=30)? },
        7 => Op::Extend { session, name, token: u.int_in_range(0..=30)? },
        8 => Op::Tick,
        9 => Op::RaiseRevision { floor: u.int_in_range(0..=50)? },
        // Moves out of this group: freeze the buckets of a name (or of all five), then abort
        // (thaw) or finish (drop). The move id picks among three, so steps repeat and clash.
        10 => {
            let buckets: BucketSet = if u.arbitrary()? {
                std::iter::once(bucket_of(&name)).collect()
            } else {
                NAMES.iter().map(|n| bucket_of(n)).collect()
            };
            Op::FreezeBuckets { move_id: u.int_in_range(1..=3)?, to_group: 2, buckets }
        }
        11 => Op::ThawBuckets { move_id: u.int_in_range(1..=3)? },
        _ => Op::DropBuckets { move_id: u.int_in_range(1..=3)?, map_version: 2 },
    })
}

fn run(u: &mut Unstructured) -> Result<()> {
    let mut t = LockTable::new();
    let ns = Namespace {
        name: "d".into(),
        prefix: "d/".into(),
        lock_delay_ms: 500,
        max_waiters_per_name: 3,
        max_locks_per_session: 4,
        ..Namespace::default_namespace()
    };
    t.apply(&Command { now_ms: 0, op: Op::PutNamespace { namespace: ns } }).reply.unwrap();
    let mut now = 0u64;
    let mut last: HashMap<String, u64> = HashMap::new();
    for _ in 0..200 {
        if u.is_empty() {
            break;
        }
        now += u.int_in_range(0..=400)?;
        let op = op(u)?;
        let before = t.snapshot();
        let out = t.apply(&Command { now_ms: now, op: op.clone() });
        if out.reply.is_err() {
            assert_eq!(before, t.snapshot(), "rejection changed state: {op:?}");
        }
        t.check_invariants().unwrap();
        let mut grants: Vec<(String, u64)> = out.effects.iter().filter_map(|e| match e {
            Effect::Granted { name, token, .. } => Some((name.to_string(), *token)),
            _ => None,
        }).collect();
        if let (Op::Acquire { name, .. }, Ok(Reply::Acquired { token, reentry: 1, .. })) = (&op, &out.reply) {
            grants.push((name.clone(), *token));
        }
        for (name, token) in grants {
            let prev = last.insert(name, token).unwrap_or(0);
            assert!(token > prev, "token went from {prev} to {token}");
        }
    }
    let restored = LockTable::restore(&t.snapshot()).unwrap();
    assert_eq!(restored.state_hash(), t.state_hash());
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});
