//! Generates the peer gRPC client/server stubs without protoc: `tonic_build::manual` emits only
//! the service plumbing; the two messages are hand-written prost structs in `src/peer/pb.rs`.
fn main() {
    let method = |name: &str, route: &str| {
        tonic_build::manual::Method::builder()
            .name(name)
            .route_name(route)
            .input_type("crate::peer::pb::PeerRequest")
            .output_type("crate::peer::pb::PeerReply")
            .codec_path("tonic_prost::ProstCodec")
            .build()
    };
    let service = tonic_build::manual::Service::builder()
        .name("Peer")
        .package("lockd.peer.v1")
        .method(method("append", "Append"))
        .method(method("vote", "Vote"))
        .method(method("pre_vote", "PreVote"))
        .method(method("snapshot", "Snapshot"))
        .method(method("propose", "Propose"))
        .method(method("keepalive", "Keepalive"))
        .method(method("read_index", "ReadIndex"))
        .method(method("batch", "Batch"))
        .method(method("transfer_leader", "TransferLeader"))
        .method(method("member", "Member"))
        .method(method("app", "App"))
        .method(
            tonic_build::manual::Method::builder()
                .name("pipe")
                .route_name("Pipe")
                .input_type("crate::peer::pb::PipeRequest")
                .output_type("crate::peer::pb::PipeReply")
                .codec_path("tonic_prost::ProstCodec")
                .client_streaming()
                .server_streaming()
                .build(),
        )
        .build();
    tonic_build::manual::Builder::new().compile(&[service]);
}
