//! lockd-check: the correctness harness of lockd.
//!
//! * [`history`]: the record of a run (client operations with invoke/complete times, the service's
//!   own records, the store's own log, faults), as JSON lines.
//! * [`checker`]: per-object linearizability (a WGL/porcupine-style search, cross-checked against
//!   brute force) and direct checks (double grants, token regressions, grants to expired sessions,
//!   stale writes accepted, lost updates), summarised in a `RESULT key=value ...` line.
//! * [`store`]: the fenced store on PostgreSQL, with its own log of accepted and rejected writes.
//! * [`nemesis`]: real `lockd serve` processes and worker processes under seeded kills, pauses,
//!   partitions and clock jumps.
//! * [`sim`]: a deterministic in-process simulation of a real lockd Raft group with seeded
//!   faults (`lockd-check sim`).
//! * [`demo`]: a checker self-test (a toy lease lock, not lockd) showing an unfenced run losing
//!   updates and a fenced one losing none.

pub mod checker;
pub mod demo;
pub mod history;
pub mod latency;
pub mod nemesis;
pub mod sim;
pub mod store;
