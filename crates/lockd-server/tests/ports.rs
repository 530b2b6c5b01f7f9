//! Node-to-node traffic has a port of its own: the client gRPC port does not serve the peer
//! service (whose calls take any core op, term, log or snapshot), and the peer port does not
//! serve the client API.

mod common;

use common::*;
use lockd_proto::v1 as pb;
use lockd_proto::v1::lock_client::LockClient;
use tonic::transport::Channel;
use tonic::Code;

/// A unary call to `path` with an empty body: what answers tells whether the port serves it.
async fn call(addr: std::net::SocketAddr, path: &'static str) -> tonic::Status {
    let ch = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(ch);
    grpc.ready().await.unwrap();
    let codec = tonic_prost::ProstCodec::<pb::StatusRequest, pb::StatusResponse>::default();
    grpc.unary(
        tonic::Request::new(pb::StatusRequest::default()),
        tonic::codegen::http::uri::PathAndQuery::from_static(path),
        codec,
    )
    .await
    .expect_err("an empty body is no valid peer call, and an unserved path is unimplemented")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_service_and_the_client_api_never_share_a_port() {
    let c = cluster(1, 1).await;
    let n = c.node(0);
    assert_ne!(n.peer_addr, n.grpc_addr);
    for path in [
        "/lockd.peer.v1.Peer/Propose",
        "/lockd.peer.v1.Peer/Append",
        "/lockd.peer.v1.Peer/Vote",
        "/lockd.peer.v1.Peer/Snapshot",
    ] {
        assert_eq!(
            call(n.grpc_addr, path).await.code(),
            Code::Unimplemented,
            "{path} answers on the client port"
        );
        // The same call reaches the service on the peer port (and fails there for its body).
        assert_ne!(call(n.peer_addr, path).await.code(), Code::Unimplemented);
    }
    let mut on_peer = LockClient::connect(format!("http://{}", n.peer_addr))
        .await
        .unwrap();
    let e = on_peer
        .status(pb::StatusRequest::default())
        .await
        .unwrap_err();
    assert_eq!(
        e.code(),
        Code::Unimplemented,
        "the client API on the peer port"
    );
    let mut on_client = LockClient::connect(format!("http://{}", n.grpc_addr))
        .await
        .unwrap();
    assert!(on_client.status(pb::StatusRequest::default()).await.is_ok());
}
