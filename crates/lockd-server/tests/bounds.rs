//! Bounds on what a client can make a node hold: a gRPC request is at most 64 KiB, and a
//! session stream whose client stops reading is cut off once its unread events pass the
//! buffer, instead of the node queueing answers without end. The session itself lives on.

mod common;

use std::time::Duration;

use common::*;
use lockd_proto::v1 as pb;
use lockd_proto::v1::lock_client::LockClient;
use lockd_server::grpc::STREAM_BUFFER;
use pb::session_request::Kind;
use serde_json::json;
use tonic::Code;

async fn grpc(c: &Cluster) -> LockClient<tonic::transport::Channel> {
    LockClient::new(c.grpc_channel(0).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_64_kib_is_refused_before_it_is_read() {
    let c = cluster(1, 1).await;
    let mut g = grpc(&c).await;
    let big = g
        .open_session(pb::OpenSessionRequest {
            client: "x".repeat(100 * 1024),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(big.code(), Code::OutOfRange, "{big:?}");
    assert!(big.message().contains("too large"), "{}", big.message());
    // Just under the limit, the request is read and refused for its field, by name.
    let field = g
        .open_session(pb::OpenSessionRequest {
            client: "x".repeat(60 * 1024),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(field.code(), Code::InvalidArgument, "{field:?}");
    assert!(field.message().contains("client"), "{}", field.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_stream_that_is_never_read_is_cut_off_and_its_session_lives_on() {
    let c = cluster(1, 1).await;
    // HTTP/2's smallest windows, so what the client does not read backs up to the node soon.
    let ch = c
        .grpc_endpoint(0)
        .initial_stream_window_size(Some(65_535))
        .initial_connection_window_size(Some(65_535))
        .connect()
        .await
        .unwrap();
    let mut g = LockClient::new(ch);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let send = |id: u64, kind: Kind| {
        tx.send(pb::SessionRequest {
            request_id: id,
            kind: Some(kind),
        })
        .unwrap()
    };
    send(
        1,
        Kind::Open(pb::OpenSessionRequest {
            client: "never-reads".into(),
            ..Default::default()
        }),
    );
    // Far more answers than the HTTP/2 windows and the node's buffer hold together.
    const SENT: u64 = 20_000;
    for id in 2..=SENT {
        send(
            id,
            Kind::Inspect(pb::InspectRequest {
                name: format!("bounds/{}", id % 7),
                ..Default::default()
            }),
        );
    }
    let mut events = g
        .session(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    // Not reading, long enough for the node to answer what it can and fill its buffer.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut answered = 0u64;
    let mut session = String::new();
    let end = loop {
        match tokio::time::timeout(Duration::from_secs(30), events.message()).await {
            Ok(Ok(Some(ev))) => {
                if let Some(pb::session_event::Kind::Opened(o)) = &ev.kind {
                    session = o.session_id.clone();
                }
                answered += 1;
            }
            Ok(Ok(None)) => panic!("the stream ended without an error after {answered} events"),
            Ok(Err(st)) => break st,
            Err(_) => panic!("no cut-off: {answered} events, then nothing for 30 s"),
        }
    };
    // Cut off either by the node (its buffer full: the status says why) or, when the node's
    // many small answers reach the client first, by the client's own HTTP/2 library, which
    // since h2 0.4.20 ends a connection whose unread small DATA frames exceed its budget
    // (GOAWAY ENHANCE_YOUR_CALM "too_many_data_frames"). Both are RESOURCE_EXHAUSTED.
    assert_eq!(end.code(), Code::ResourceExhausted, "{end:?}");
    let by_node = end.message().contains("did not read");
    let by_client_library = format!("{end:?}").contains("too_many_data_frames");
    assert!(by_node || by_client_library, "{end:?}");
    // Never every answer: the node holds a bounded number. Cut by the node, it had filled its
    // buffer; cut by the client's library, as many as reached the client before its budget
    // ran out (765-889 in runs here, which the old bound of one full buffer made flaky).
    assert!(answered < SENT, "answered {answered} of {SENT}");
    if by_node {
        assert!(
            answered >= STREAM_BUFFER as u64,
            "the node cut the stream after only {answered} answers"
        );
    } else {
        assert!(
            answered > 0,
            "the client library cut the stream before any answer"
        );
    }
    // The session is alive: a unary keepalive extends it.
    assert!(session.starts_with("s_"), "{session}");
    let too_many = g
        .keep_alive(pb::KeepAliveRequest {
            session_id: session.clone(),
            groups: (0..=4096).collect(),
        })
        .await
        .expect_err("4097 group ids");
    assert_eq!(too_many.code(), tonic::Code::InvalidArgument);
    assert!(
        too_many.message().contains("groups: at most 4096"),
        "{too_many:?}"
    );
    let kept = g
        .keep_alive(pb::KeepAliveRequest {
            session_id: session,
            ..Default::default()
        })
        .await;
    assert!(kept.is_ok(), "{kept:?}");
    drop(tx);
}

/// A namespace's `max_sessions` caps its live sessions across the cluster: its sessions open in
/// one group, its home, which counts them; the next open is a 429 naming the limit, leaves no
/// session in any group, and other namespaces still open; a closed session makes room. Over
/// gRPC it is RESOURCE_EXHAUSTED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_holds_at_most_max_sessions_live_sessions() {
    let c = cluster(1, 2).await;
    let h = Http::new(c.url(0, ""));
    let admin = h.admin();
    let v = admin.get("/v1/admin/namespaces").await.body["version"]
        .as_u64()
        .unwrap();
    let put = |v: u64, max: u64| {
        let admin = admin.clone();
        async move {
            admin
                .post(
                    "/v1/admin/namespaces",
                    json!({"expected_version": v, "namespace":
                        {"name": "capped", "prefix": "capped/", "max_sessions": max}}),
                )
                .await
        }
    };
    // Above the cluster's own cap: a 400 naming the field, nothing changed.
    let r = put(v, 250_001).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_sessions 250001 exceeds 250000"),
        "{}",
        r.body
    );
    let r = put(v, 2).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let listed = admin.get("/v1/admin/namespaces").await.body;
    let ns = listed["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "capped")
        .unwrap()
        .clone();
    assert_eq!(ns["max_sessions"], 2);

    let first = h.session_in("a", 10, "capped").await;
    h.session_in("b", 10, "capped").await;
    // Sorted: which of the two groups is the namespace's home depends on its name's hash.
    let sessions_per_group = || {
        let node = &c.node(0).service.node;
        let mut n = (node.group_ids().into_iter())
            .filter(|g| *g != lockd_raft::META_GROUP)
            .map(|g| node.group(g).unwrap().read_local(|t| t.stats().sessions))
            .collect::<Vec<_>>();
        n.sort();
        n
    };
    assert_eq!(sessions_per_group(), vec![0, 2]);
    let open = json!({"client": "c", "ttl_s": 10, "namespace": "capped"});
    let r = h.post("/v1/sessions", open.clone()).await;
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(r.body["error"]["code"], "too_many_sessions");
    let msg = r.body["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("namespace 'capped' holds 2 live sessions, its max_sessions"),
        "{msg}"
    );
    assert_eq!(r.retry_after.as_deref(), Some("1"));
    assert_eq!(
        sessions_per_group(),
        vec![0, 2],
        "a refused open left a session"
    );
    // The default namespace is not counted against it.
    h.session("d", 10).await;
    // gRPC says the same.
    let mut g = LockClient::new(c.grpc_channel(0).await);
    let e = g
        .open_session(pb::OpenSessionRequest {
            client: "g".into(),
            ttl_ms: 10_000,
            namespace: "capped".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("max_sessions"), "{}", e.message());
    // A closed session makes room for one.
    assert_eq!(h.delete(&format!("/v1/sessions/{first}")).await.status, 200);
    h.session_in("e", 10, "capped").await;
}

/// An owner or client string over its limit is refused at the front door, before it is
/// proposed: the groups' logs do not grow (a check at apply alone would log it first, in every
/// group for a session, and refuse it there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_strings_are_refused_before_they_reach_the_log() {
    let c = cluster(1, 2).await;
    let h = Http::new(c.url(0, ""));
    let s = h.session("s", 15).await;
    let applied = || {
        let node = &c.node(0).service.node;
        node.group_ids()
            .into_iter()
            .map(|g| node.group(g).unwrap().status().applied_index)
            .collect::<Vec<_>>()
    };
    // Settled: nothing is proposed on an idle node for a while.
    let mut before = applied();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = applied();
        if now == before {
            break;
        }
        before = now;
    }
    let r = h
        .acquire("n", json!({"session_id": s, "owner": "o".repeat(257)}))
        .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("owner"));
    let r = h
        .post("/v1/sessions", json!({"client": "c".repeat(257)}))
        .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("client"));
    let mut g = LockClient::new(c.grpc_channel(0).await);
    let e = g
        .open_session(pb::OpenSessionRequest {
            client: "c".repeat(257),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(applied(), before, "a refused string was logged");
    // The control: a good open is logged, in every lock group.
    h.session("ok", 15).await;
    assert_ne!(applied(), before);
}
