//! # lockd-core: the lock state machine
//!
//! The replicated heart of lockd. Every rule of the lock protocol lives here and nowhere else:
//! sessions, acquire (try or wait), exclusive / shared / semaphore modes, re-entrancy, FIFO
//! queues, fencing tokens, lock-delay, namespaces and their limits.
//!
//! It is *sans-IO*: no clock, no randomness, no threads, no IO. Time arrives inside each
//! [`Command`] as the leader-stamped group time `now_ms`; session ids arrive chosen by the
//! proposer. So every replica that applies the same log reaches the same state (invariant S9),
//! which [`LockTable::state_hash`] lets replicas compare.
//!
//! ```
//! use lockd_core::*;
//!
//! let mut t = LockTable::new();
//! let s = SessionId(7);
//! let open = Op::OpenSession { session: s, client: "worker".into(), ttl_ms: 0, namespace: String::new() };
//! t.apply(&Command { now_ms: 1, op: open });
//! let acquire = Op::Acquire {
//!     session: s, name: "payouts/merchant-48213".into(), owner: "batch-2210".into(),
//!     mode: LockMode::Exclusive, wait_ms: 0, reentrant: false,
//! };
//! let out = t.apply(&Command { now_ms: 2, op: acquire });
//! assert_eq!(out.reply, Ok(Reply::Acquired { token: 1, lease_ttl_ms: 15_000, reentry: 1, group_moves: 0 }));
//! t.check_invariants().unwrap();
//! ```

mod bucket;
mod cluster;
mod entity;
mod invariants;
pub mod limits;
mod lock_map;
mod machine;
mod ownership;
mod ownership_commands;
mod query;
mod snapshot;
mod topology;
mod topology_commands;
mod types;

pub use bucket::{bucket_of, ShardMap, BUCKETS};
pub use invariants::Violation;
pub use machine::{validate_namespace, Applied, LockTable, Stats};
pub use ownership::{
    BucketSet, Export, ExportedHolder, ExportedLock, ExportedSession, MoveId, MoveRecord,
    OwnershipView,
};
pub use query::{
    Contended, ContentionScan, HolderInfo, LockInfo, SessionInfo, SessionSummary, WaiterInfo,
};
pub use snapshot::{RestoreError, SNAPSHOT_FORMAT};
pub use topology::{ConfigId, GroupRecord, Presence, MAX_EPOCH, MAX_GROUP_REPLICAS};
pub use types::*;
