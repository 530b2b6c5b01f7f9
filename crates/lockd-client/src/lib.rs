//! # lockd-client: the Rust client of lockd
//!
//! Take a lock, do the work under its fencing token, stop the moment the lease may be gone.
//!
//! ```no_run
//! use std::time::Duration;
//! use lockd_client::{Client, ClientOptions, Error};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Error> {
//!     let opts = ClientOptions { client_name: "payout-worker-17".into(), ..Default::default() };
//!     let client =
//!         Client::connect_with(["127.0.0.1:7170", "127.0.0.1:7171", "127.0.0.1:7172"], opts).await?;
//!
//!     // Wait up to 10 s in the lock's queue; the pushed grant wakes us.
//!     let guard = client
//!         .acquire("payouts/merchant-48213")
//!         .owner("payout-worker-17/batch-2210")
//!         .wait(Duration::from_secs(10))
//!         .await?;
//!     println!("holding {} with fencing token {}", guard.name(), guard.token());
//!
//!     tokio::select! {
//!         // Pass guard.token() to the storage with every write (see `fence`).
//!         _ = tokio::time::sleep(Duration::from_secs(1)) => guard.release().await?,
//!         // The local deadline passed without a renewal: stop at once.
//!         _ = guard.lost() => eprintln!("lease lost; stopped"),
//!     }
//!     client.close().await
//! }
//! ```
//!
//! ## Model
//! - One [`Client`] per process holds **one session** over **one** gRPC `Session` stream. The
//!   service opens a session in every lock group at once and a node fans keepalives out to each
//!   group's leader, so one session covers every name (a deliberate simplification of GUIDE §2's
//!   "one session per group, opened lazily": fewer streams, one lease to reason about).
//! - Keepalives go every TTL/3. When the stream breaks or a node stops answering a keepalive
//!   for a whole interval, the stream moves to the next endpoint and re-`attach`es the session.
//! - A [`LockGuard`]'s local deadline is `send time of the last acknowledged open, attach or
//!   keepalive + TTL − margin` on the monotonic clock (margin TTL/5: 3 s at 15 s). The service
//!   expires a session no earlier than TTL after a keepalive it acknowledged, which it received
//!   after we sent it, so the guard gives up first (C1). Acquire replies do not renew: on this
//!   service an acquire does not restart the session's lease.
//! - Waiting acquires park in the lock's FIFO queue and are woken by the pushed grant.
//! - Retryable errors ([`Error::is_retryable`]) are retried with exponential backoff and full
//!   jitter ([`RetryPolicy`]); the rest come back typed.
//! - Locks are fenced: hand [`LockGuard::token`] to the storage, which refuses older tokens
//!   ([`fence`]).
//! - The API speaks this crate's own types, never the generated protobuf ones: the lock API
//!   (acquire, guards, [`RwLock`], [`Semaphore`], [`Election`], [`Client::inspect`],
//!   [`Client::check_token`]) and the operators' calls ([`admin`]: status, sessions, members,
//!   buckets, groups, namespaces). [`proto`] is there for those who want to speak gRPC
//!   themselves.
#![warn(missing_docs)]

pub mod admin;
mod client;
mod election;
mod error;
mod facades;
pub mod fence;
mod info;
pub mod lease;
mod pushes;
mod retry;
mod session;
mod watch;

pub use client::{host_pid, AcquireBuilder, Client, ClientOptions, LockGuard, Mode, TlsOptions};
pub use election::{Election, Leader, Leaders, Leadership, Term};
pub use error::Error;
pub use facades::{RwLock, Semaphore};
pub use info::{HoldMode, HolderInfo, LockInfo, WaiterInfo};
pub use lease::LeaseReport;
pub use lockd_proto::v1 as proto;
pub use retry::RetryPolicy;
pub use watch::{WatchEvent, Watcher};
