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

/// The peer port answers the cluster's nodes only, and takes from them only what a node
/// forwards. Against a live node holding a victim's lock, each forgery is refused and changes
/// nothing: a call without the cluster's peer secret; a made-up node 9 with the secret (a
/// proposal, a session sweep through `App`, a vote storm); the node's own id from another data
/// dir incarnation; and, with the real identity, a leader's own duty (expiry, tick, revision
/// raise) or a namespace copy sent to the meta group (which skips its compare-and-set). The
/// positive control: the real identity's forwarded extend is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_port_answers_members_only_and_only_what_a_node_forwards() {
    use lockd_core::{Op, SessionId};
    use lockd_raft::{PeerBook, PeerMethod, PeerPool, PeerTransport};
    use std::sync::Arc;
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
    let node = c.node(0).service.node.clone();
    let real = node.incarnation();
    assert_ne!(real, 0, "a node on disk has an incarnation");
    // The node has recorded its incarnation and read the records back (once a second).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = c.hashes(0);

    let peers = std::collections::BTreeMap::from([(1, c.node(0).peer_addr.to_string())]);
    let forger = |me: u64, incarnation: u64, secret: Option<&str>| {
        let book = Arc::new(PeerBook::new(incarnation, secret.map(String::from)));
        PeerPool::new(&peers, "lockd", me, None, book).unwrap()
    };
    let group = c.node(0).service.route("held").unwrap().id();
    let session = SessionId::parse(&sid).unwrap();
    let token = got.body["token"].as_u64().unwrap();
    let extend = Op::Extend {
        session,
        name: "held".into(),
        token,
    };
    let close = Op::CloseSession { session };
    async fn send(
        p: &PeerPool,
        method: PeerMethod,
        group: u32,
        op: &Op,
    ) -> Result<Vec<u8>, tonic::Status> {
        let payload = postcard::to_allocvec(op).unwrap();
        p.call(1, method, group, payload, Duration::from_secs(2))
            .await
    }

    // No secret, or a wrong one: not a node of this cluster.
    for secret in [None, Some("not-the-secret-not-the-secret-00")] {
        let p = forger(1, real, secret);
        let st = send(&p, PeerMethod::Propose, group, &close)
            .await
            .expect_err("a call without the peer secret was served");
        assert_eq!(st.code(), Code::Unauthenticated, "{st:?}");
    }

    // A made-up node 9 with the secret: no group has it as a member.
    let nine = forger(9, 0x99, Some(TEST_PEER_SECRET));
    for (method, g) in [
        (PeerMethod::Propose, group),
        (PeerMethod::Propose, 0),
        (PeerMethod::App, group),
        (PeerMethod::Vote, group),
        (PeerMethod::Vote, 0),
        (PeerMethod::Append, group),
    ] {
        let st = send(&nine, method, g, &close)
            .await
            .expect_err("a non-member's call was served");
        assert_eq!(st.code(), Code::PermissionDenied, "{method:?}: {st:?}");
    }

    // Node 1's id from another data dir (a wiped disk): refused, and the node keeps serving.
    let wiped = forger(1, real ^ 0xffff, Some(TEST_PEER_SECRET));
    let st = send(&wiped, PeerMethod::Propose, group, &extend)
        .await
        .expect_err("another incarnation was served");
    assert_eq!(st.code(), Code::PermissionDenied, "{st:?}");
    assert!(st.message().contains("members replace 1 "), "{st:?}");

    // The real identity: never a leader's own duty, never a namespace copy in the meta group.
    let member = forger(1, real, Some(TEST_PEER_SECRET));
    for (g, op) in [
        (
            group,
            Op::ExpireSessions {
                sessions: vec![session],
            },
        ),
        (group, Op::Tick),
        (group, Op::RaiseRevision { floor: u64::MAX }),
        (
            0,
            Op::DeleteNamespace {
                prefix: "secure/".into(),
            },
        ),
        (group, Op::RetireNode { node: 1 }),
    ] {
        let st = send(&member, PeerMethod::Propose, g, &op)
            .await
            .expect_err("a command no node forwards was served");
        assert_eq!(st.code(), Code::PermissionDenied, "{op:?}: {st:?}");
    }
    assert_eq!(c.hashes(0), before, "a refused forgery changed state");
    let still = h.get("/v1/locks/held").await;
    assert_eq!(
        still.body["holders"][0]["owner"], "victim",
        "{}",
        still.body
    );
    let ready = h.get("/readyz").await;
    assert_eq!(ready.status, 200, "{}", ready.body);

    // The positive control: a forwardable command with the real identity is served.
    assert!(
        send(&member, PeerMethod::Propose, group, &extend)
            .await
            .is_ok(),
        "a forwarded extend was refused"
    );
}
