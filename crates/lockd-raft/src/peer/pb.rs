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

include!(concat!(env!("OUT_DIR"), "/lockd.peer.v1.Peer.rs"));
