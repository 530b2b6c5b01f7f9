//! TLS doors: the client ports speak TLS (with client certificates when required), and the
//! peer port lets in only nodes of this cluster, each holding a certificate of the cluster's CA
//! that names the node id it claims. Certificates are made in the test (rcgen, as `lockd dev
//! --tls` makes them).

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use common::*;
use lockd_proto::v1 as pb;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::Code;

fn pem(path: &std::path::Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

/// A rustls client trusting `pki`'s CA, presenting node `as_node`'s certificate if given.
fn rustls_client(pki: &Pki, as_node: Option<usize>) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&pki.ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let b = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let cfg = match as_node {
        None => b.with_no_client_auth(),
        Some(i) => {
            let f = &pki.certs[i];
            let chain = CertificateDer::pem_file_iter(&f.cert)
                .unwrap()
                .map(Result::unwrap)
                .collect();
            let key = PrivateKeyDer::from_pem_file(&f.key).unwrap();
            b.with_client_auth_cert(chain, key).unwrap()
        }
    };
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

/// One HTTP/1.1 request over TLS: `(status, JSON body)`, or the I/O error that ended it.
async fn https(
    tls: &tokio_rustls::TlsConnector,
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> std::io::Result<(u16, Value)> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::try_from("localhost").unwrap();
    let mut s = tls.connect(name, tcp).await?;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await?;
    let text = String::from_utf8_lossy(&out);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status line in {text:?}")))?;
    let json = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| serde_json::from_str(b).unwrap_or(Value::Null))
        .unwrap_or(Value::Null);
    Ok((status, json))
}

/// A gRPC channel over TLS trusting `ca`, as `identity` (cert, key) if given, checking the
/// server's certificate for `domain`.
async fn tls_channel(
    addr: SocketAddr,
    ca: &[u8],
    identity: Option<(Vec<u8>, Vec<u8>)>,
    domain: &str,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name(domain);
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Channel::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)?
        .connect()
        .await
}

fn identity_of(pki: &Pki, i: usize) -> Option<(Vec<u8>, Vec<u8>)> {
    Some((pem(&pki.certs[i].cert), pem(&pki.certs[i].key)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_ports_speak_tls_and_the_nodes_mutual_tls() {
    let pki = pki(3);
    let tls = TlsSetup {
        pki: &pki,
        client_certs: true,
    };
    // Two lock groups, leaders spread over the nodes: opening a session and taking names in
    // both groups through one node forwards over the peer port, so this passes only if the
    // nodes' mutual TLS works.
    let c = cluster_with(3, 2, 0, Some(tls)).await;
    let with_cert = rustls_client(&pki, Some(0));
    let (code, opened) = https(
        &with_cert,
        c.node(2).http_addr,
        "POST",
        "/v1/sessions",
        Some(json!({"client": "tls-test", "ttl_s": 15})),
    )
    .await
    .unwrap();
    assert_eq!(code, 200, "{opened}");
    let session = opened["session_id"].as_str().unwrap().to_string();
    let mut groups = std::collections::BTreeSet::new();
    for i in 0..8 {
        let name = format!("tls-{i}");
        let (code, got) = https(
            &with_cert,
            c.node(2).http_addr,
            "POST",
            &format!("/v1/locks/{name}:acquire"),
            Some(json!({"session_id": session, "wait_ms": 0})),
        )
        .await
        .unwrap();
        assert_eq!(
            (code, got["acquired"].as_bool()),
            (200, Some(true)),
            "{got}"
        );
        groups.insert(c.node(0).service.route(&name).unwrap().id());
    }
    assert_eq!(groups.len(), 2, "the names fell in both lock groups");

    // Without a client certificate the HTTPS port refuses (the handshake, or the first read).
    let no_cert = rustls_client(&pki, None);
    let refused = https(&no_cert, c.node(0).http_addr, "GET", "/v1/status", None).await;
    assert!(
        refused.is_err(),
        "served without a client certificate: {refused:?}"
    );

    // gRPC: with the CA and a client certificate, served; without the certificate, or in plain
    // text, not.
    let ca = pem(&pki.ca);
    let ch = tls_channel(c.node(1).grpc_addr, &ca, identity_of(&pki, 1), "localhost")
        .await
        .unwrap();
    let status = pb::lock_client::LockClient::new(ch)
        .status(pb::StatusRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.node_id, 2);
    let without = match tls_channel(c.node(1).grpc_addr, &ca, None, "localhost").await {
        Err(_) => true,
        Ok(ch) => pb::lock_client::LockClient::new(ch)
            .status(pb::StatusRequest::default())
            .await
            .is_err(),
    };
    assert!(without, "gRPC served a client without a certificate");
    let plain = Channel::from_shared(format!("http://{}", c.node(1).grpc_addr))
        .unwrap()
        .connect()
        .await;
    if let Ok(ch) = plain {
        let r = pb::lock_client::LockClient::new(ch)
            .status(pb::StatusRequest::default())
            .await;
        assert!(r.is_err(), "gRPC answered plain text on a TLS port");
    }
}

/// One unary peer call with a body no method accepts, stamped with `cluster` and `node` if
/// given: its status tells how far the call got (`InvalidArgument`: admitted, then the body
/// was refused).
async fn peer_call(ch: Channel, cluster: Option<&str>, node: Option<&str>) -> tonic::Status {
    peer_call_to(ch, cluster, node, None).await
}

/// [`peer_call`], addressed to node `to` (the `lockd-to` header) if given.
async fn peer_call_to(
    ch: Channel,
    cluster: Option<&str>,
    node: Option<&str>,
    to: Option<&str>,
) -> tonic::Status {
    peer_call_with(ch, cluster, node, to, Some(TEST_PEER_SECRET)).await
}

/// [`peer_call_with`] from data dir `incarnation` (the `lockd-incarnation` header) if given.
async fn peer_call_with(
    ch: Channel,
    cluster: Option<&str>,
    node: Option<&str>,
    to: Option<&str>,
    secret: Option<&str>,
) -> tonic::Status {
    peer_call_full(ch, cluster, node, to, secret, None).await
}

/// [`peer_call_to`] with the peer secret `secret` (the test clusters' plain-text peer ports
/// have [`TEST_PEER_SECRET`]; a TLS port ignores it) and the caller's `incarnation`.
async fn peer_call_full(
    ch: Channel,
    cluster: Option<&str>,
    node: Option<&str>,
    to: Option<&str>,
    secret: Option<&str>,
    incarnation: Option<u64>,
) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(ch);
    if let Err(e) = grpc.ready().await {
        return tonic::Status::unavailable(e.to_string());
    }
    let mut req = tonic::Request::new(pb::StatusRequest {});
    if let Some(c) = cluster {
        req.metadata_mut()
            .insert("lockd-cluster", c.parse().unwrap());
    }
    if let Some(n) = node {
        req.metadata_mut().insert("lockd-node", n.parse().unwrap());
    }
    if let Some(t) = to {
        req.metadata_mut().insert("lockd-to", t.parse().unwrap());
    }
    if let Some(s) = secret {
        req.metadata_mut()
            .insert("lockd-peer-secret", s.parse().unwrap());
    }
    if let Some(i) = incarnation {
        req.metadata_mut()
            .insert("lockd-incarnation", format!("{i:016x}").parse().unwrap());
    }
    let codec = tonic_prost::ProstCodec::<pb::StatusRequest, pb::StatusResponse>::default();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/lockd.peer.v1.Peer/Propose");
    grpc.unary(req, path, codec)
        .await
        .expect_err("an empty body is no proposal")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_port_admits_only_nodes_of_this_cluster_by_their_certificates() {
    let pki = pki(3);
    let tls = TlsSetup {
        pki: &pki,
        client_certs: false,
    };
    let c = cluster_with(3, 1, 0, Some(tls)).await;
    let peer = c.node(0).peer_addr;
    let ca = pem(&pki.ca);
    let as_node = |i: usize| tls_channel(peer, &ca, identity_of(&pki, i), "node-1.lockd");

    // The positive control: node 2's certificate, claiming node 2 of cluster "lockd", from
    // the data dir the cluster recorded for it.
    let two = c.node(1).service.node.incarnation();
    let st = peer_call_full(
        as_node(1).await.unwrap(),
        Some("lockd"),
        Some("2"),
        None,
        None,
        Some(two),
    )
    .await;
    assert_eq!(
        st.code(),
        Code::InvalidArgument,
        "node 2 not admitted: {st:?}"
    );

    // Node 2's certificate claiming to be node 3: the certificate speaks for node 2 only.
    let st = peer_call(as_node(1).await.unwrap(), Some("lockd"), Some("3")).await;
    assert_eq!(st.code(), Code::PermissionDenied, "{st:?}");
    assert!(st.message().contains("node-3.lockd"), "{}", st.message());

    // The right certificate, another cluster's name.
    let st = peer_call(as_node(1).await.unwrap(), Some("other"), Some("2")).await;
    assert_eq!(st.code(), Code::PermissionDenied, "{st:?}");

    // No client certificate at all: the TLS layer refuses before any method runs.
    let refused = match tls_channel(peer, &ca, None, "node-1.lockd").await {
        Err(_) => true,
        Ok(ch) => peer_call(ch, Some("lockd"), Some("2")).await.code() != Code::InvalidArgument,
    };
    assert!(
        refused,
        "the peer port admitted a caller without a certificate"
    );

    // A certificate of another CA (another cluster's, or anyone's): refused likewise.
    let stranger = common::pki(2);
    let refused = match tls_channel(peer, &ca, identity_of(&stranger, 1), "node-1.lockd").await {
        Err(_) => true,
        Ok(ch) => peer_call(ch, Some("lockd"), Some("2")).await.code() != Code::InvalidArgument,
    };
    assert!(refused, "the peer port admitted another CA's certificate");

    // Plain text on the peer port: refused.
    let plain = Channel::from_shared(format!("http://{peer}"))
        .unwrap()
        .connect()
        .await;
    if let Ok(ch) = plain {
        let st = peer_call(ch, Some("lockd"), Some("2")).await;
        assert_ne!(st.code(), Code::InvalidArgument, "plain text admitted");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tls_the_peer_port_still_refuses_another_cluster_and_unnamed_callers() {
    let c = cluster(1, 1).await;
    let ch = || async {
        Channel::from_shared(format!("http://{}", c.node(0).peer_addr))
            .unwrap()
            .connect()
            .await
            .unwrap()
    };
    let st = peer_call(ch().await, None, None).await;
    assert_eq!(st.code(), Code::Unauthenticated, "{st:?}");
    let st = peer_call(ch().await, Some("lockd"), None).await;
    assert_eq!(st.code(), Code::Unauthenticated, "{st:?}");
    let st = peer_call(ch().await, Some("payments-prod"), Some("2")).await;
    assert_eq!(st.code(), Code::PermissionDenied, "{st:?}");
    assert!(st.message().contains("payments-prod"), "{}", st.message());
    // Without the cluster's peer secret, or with another: refused before anything is read.
    for secret in [None, Some("another-secret-another-secret-00")] {
        let st = peer_call_with(ch().await, Some("lockd"), Some("2"), None, secret).await;
        assert_eq!(st.code(), Code::Unauthenticated, "{secret:?}: {st:?}");
    }
    let st = peer_call(ch().await, Some("lockd"), Some("2")).await;
    assert_eq!(
        st.code(),
        Code::InvalidArgument,
        "admitted, body refused: {st:?}"
    );
    // Addressed to this node: admitted. Addressed to another (its address given for node 1's
    // port by mistake): refused, or a leader would take its own messages as a member's.
    let st = peer_call_to(ch().await, Some("lockd"), Some("2"), Some("1")).await;
    assert_eq!(st.code(), Code::InvalidArgument, "{st:?}");
    let st = peer_call_to(ch().await, Some("lockd"), Some("2"), Some("400")).await;
    assert_eq!(st.code(), Code::FailedPrecondition, "{st:?}");
    assert!(
        st.message().contains("this is node 1, not node 400"),
        "{}",
        st.message()
    );
}

/// The HTTPS port takes a connection's place under `--max-client-connections` *before* its TLS
/// handshake: hellos that never come hold no more than the cap, and one over it is closed at
/// once rather than held for the handshake's deadline (issue 42 item 3). Places come back as
/// the silent sockets close, and an honest client is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_handshakes_wait_inside_the_connection_cap() {
    let pki = pki(1);
    let files = &pki.certs[0];
    let tls = lockd_server::tls::ClientTls::load(&files.cert, &files.key, None).unwrap();
    let (r, _dir) = single_node_capped_tls(2, Some(tls)).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(tokio::net::TcpStream::connect(r.http_addr).await.unwrap());
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let mut third = tokio::net::TcpStream::connect(r.http_addr).await.unwrap();
    let mut byte = [0u8; 1];
    let closed = tokio::time::timeout(std::time::Duration::from_secs(2), third.read(&mut byte))
        .await
        .expect(
            "the connection over the cap is closed at once, not after the handshake's deadline",
        );
    assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
    for s in &mut held {
        let open = tokio::time::timeout(std::time::Duration::from_millis(300), s.read(&mut byte));
        assert!(
            open.await.is_err(),
            "a silent socket inside the cap waits for its hello"
        );
    }
    drop(held);
    let client = rustls_client(&pki, None);
    let mut served = None;
    for _ in 0..50 {
        if let Ok((code, _)) = https(&client, r.http_addr, "GET", "/livez", None).await {
            served = Some(code);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(served, Some(200));
    r.stop().await;
}

/// The metrics say when each certificate file the node serves with expires (issue 44 item 4),
/// on the probes port, which needs no client certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_say_when_each_served_certificate_expires() {
    let pki = pki(1);
    let files = &pki.certs[0];
    let tls = lockd_server::tls::ClientTls::load(&files.cert, &files.key, Some(pki.ca.as_path()))
        .unwrap();
    let (r, _dir) = single_node_capped_tls(64, Some(tls)).await;
    let h = Http::new(format!("http://{}", r.probes_addr.expect("a probes port")));
    let m = h.get("/metrics").await;
    assert_eq!(m.status, 200);
    let text = m.body.as_str().unwrap();
    let expiry = |cert: &str| {
        let prefix = format!("lockd_tls_cert_not_after_timestamp_seconds{{cert=\"{cert}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .map(|v| v.trim().parse::<i64>().unwrap())
    };
    // The test certificates are rcgen's default: valid until 4096-01-01T00:00:00Z.
    assert_eq!(expiry("client"), Some(67_090_118_400), "{text}");
    assert_eq!(expiry("client_ca"), Some(67_090_118_400), "{text}");
    // This node's peer port is plain text: no peer certificate, no series.
    assert_eq!(expiry("peer"), None, "{text}");
    r.stop().await;
}

/// The idle timeout over TLS (`conns.rs`): tonic hands a gRPC request its connection as
/// `TlsConnectInfo`, and the request is still found and counted in flight. A watch opened over
/// gRPC with TLS outlives three idle timeouts and gets its event, on the same connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_stream_over_tls_counts_as_in_flight_for_the_idle_timeout() {
    let pki = pki(1);
    let files = &pki.certs[0];
    let tls = lockd_server::tls::ClientTls::load(&files.cert, &files.key, None).unwrap();
    let idle = std::time::Duration::from_millis(700);
    let limits = Limits {
        client_idle_timeout: idle,
        ..Limits::default()
    };
    let (r, _dir) = single_node_limited(limits, Some(tls)).await;
    let ch = tls_channel(r.grpc_addr, &pem(&pki.ca), None, "localhost")
        .await
        .unwrap();
    let mut events = lockd_proto::v1::lock_client::LockClient::new(ch)
        .watch(pb::WatchRequest {
            name: "idle/tls".into(),
            prefix: String::new(),
            after: vec![],
        })
        .await
        .unwrap()
        .into_inner();
    tokio::time::sleep(idle * 3).await;
    let client = rustls_client(&pki, None);
    let body = json!({"client": "idle", "ttl_s": 30});
    let (status, opened) = https(&client, r.http_addr, "POST", "/v1/sessions", Some(body))
        .await
        .unwrap();
    assert_eq!(status, 200, "{opened}");
    let body = json!({"session_id": opened["session_id"]});
    let (status, got) = https(
        &client,
        r.http_addr,
        "POST",
        "/v1/locks/idle%2Ftls:acquire",
        Some(body),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{got}");
    let event = tokio::time::timeout(std::time::Duration::from_secs(5), events.message())
        .await
        .expect("the event within 5 s")
        .expect("the watch's TLS connection stayed open")
        .expect("an event");
    assert_eq!(event.fencing_token, got["token"].as_u64().unwrap());
    r.stop().await;
}
