//! # lockd-proto: the gRPC client API
//!
//! Generated from `proto/lockd/v1/lockd.proto`, where every message and field is documented.
//! The server implements [`v1::lock_server::Lock`]; clients use [`v1::lock_client::LockClient`].

/// lockd.v1: sessions, locks, the session stream.
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("lockd.v1");
}
