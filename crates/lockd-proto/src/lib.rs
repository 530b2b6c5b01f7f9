//! # lockd-proto: the gRPC client API
//!
//! Generated from `proto/lockd/v1/lockd.proto`, where every message and field is documented.
//! The server implements [`v1::lock_server::Lock`]; clients use [`v1::lock_client::LockClient`].

/// lockd.v1: sessions, locks, the session stream.
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("lockd.v1");
}

/// The encoded `FileDescriptorSet` of lockd.proto, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/lockd_descriptor.bin"));
