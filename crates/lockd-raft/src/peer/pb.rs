//! The peer service's two wire messages, hand-written so no protoc is needed. Payloads are
//! postcard: openraft's own serde types for Raft RPCs, lockd-core types for forwarded calls.

/// A request for one group on the receiving node.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PeerRequest {
    /// The group the request is for.
    #[prost(uint32, tag = "1")]
    pub group_id: u32,
    /// postcard-encoded request body; its type depends on the method.
    #[prost(bytes = "vec", tag = "2")]
    pub payload: Vec<u8>,
}

/// The answer: a postcard-encoded response body.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PeerReply {
    #[prost(bytes = "vec", tag = "1")]
    pub payload: Vec<u8>,
}

/// One call on a pipe (`pipe.rs`): a [`PeerRequest`] with the id its reply carries back, its
/// method and its timeout.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PipeRequest {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// `Method::code`.
    #[prost(uint32, tag = "2")]
    pub method: u32,
    #[prost(uint32, tag = "3")]
    pub group_id: u32,
    /// The receiver drops the call after this long, as tonic does with `grpc-timeout`.
    #[prost(uint64, tag = "4")]
    pub timeout_ms: u64,
    #[prost(bytes = "vec", tag = "5")]
    pub payload: Vec<u8>,
}

/// The reply to the [`PipeRequest`] with the same id: the payload, or a gRPC status.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PipeReply {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// 0 for OK, else the `tonic::Code` of the failure.
    #[prost(int32, tag = "2")]
    pub code: i32,
    #[prost(string, tag = "3")]
    pub message: String,
    #[prost(bytes = "vec", tag = "4")]
    pub payload: Vec<u8>,
}

include!(concat!(env!("OUT_DIR"), "/lockd.peer.v1.Peer.rs"));
