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

/// A peer may forward a client's command to the leader, never a leader's own duty: a forged
/// session expiry, tick or revision raise sent to the peer port is refused and changes nothing,
/// while an ordinary forwarded command is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_port_refuses_leader_only_commands() {
    use lockd_core::{Op, SessionId};
    use lockd_raft::{PeerMethod, PeerPool, PeerTransport};
    use std::time::Duration;

    let c = cluster(1, 1).await;
    let h = Http::new(c.url(0, ""));
    let opened = h
        .post(
            "/v1/sessions",
            serde_json::json!({"client": "victim", "ttl_s": 15}),
        )
        .await;
    assert_eq!(opened.status, 200, "{}", opened.body);
    let sid = opened.body["session_id"].as_str().unwrap().to_string();
    let got = h
        .post(
            "/v1/locks/held:acquire",
            serde_json::json!({"session_id": sid, "owner": "victim", "wait_ms": 0}),
        )
        .await;
    assert_eq!(got.body["acquired"], true, "{}", got.body);
    let before = c.hashes(0);

    // A stranger on the peer port, speaking the real protocol as "node 2" of this cluster.
    let peers = std::collections::BTreeMap::from([(1, c.node(0).peer_addr.to_string())]);
    let forger = PeerPool::new(&peers, "lockd", 2, None).unwrap();
    let group = c.node(0).service.route("held").unwrap().id();
    let send = |op: Op| {
        let payload = postcard::to_allocvec(&op).unwrap();
        forger.call(
            1,
            PeerMethod::Propose,
            group,
            payload,
            Duration::from_secs(2),
        )
    };
    let session = SessionId::parse(&sid).unwrap();
    for op in [
        Op::ExpireSessions {
            sessions: vec![session],
        },
        Op::Tick,
        Op::RaiseRevision { floor: u64::MAX },
    ] {
        let st = send(op.clone())
            .await
            .expect_err("a leader-only command was served");
        assert_eq!(st.code(), Code::PermissionDenied, "{op:?}: {st:?}");
    }
    assert_eq!(c.hashes(0), before, "a refused forgery changed state");
    let still = h.get("/v1/locks/held").await;
    assert_eq!(
        still.body["holders"][0]["owner"], "victim",
        "{}",
        still.body
    );

    // The positive control: a forwardable command through the same door is served.
    let extend = Op::Extend {
        session,
        name: "held".into(),
        token: got.body["token"].as_u64().unwrap(),
    };
    assert!(send(extend).await.is_ok(), "a forwarded extend was refused");
}
