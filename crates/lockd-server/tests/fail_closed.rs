//! Fail closed: a node that starts refuses names and sessions (503, Retry-After) until its meta
//! replica has caught up with the meta leader, so a replica that slept through a namespace
//! getting a token never routes that namespace's names into the open default one.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use lockd_raft::NodeConfig;
use serde_json::json;
use tokio::net::TcpListener;

/// Node `id` of the cluster `peers` on its data dir, on its old peer address and fresh client
/// ports.
async fn start(
    id: u64,
    dir: &std::path::Path,
    peers: &BTreeMap<u64, String>,
) -> lockd_server::Running {
    let peer_addr = &peers[&id];
    let peer = rebind(peer_addr).await;
    let bind = || TcpListener::bind("127.0.0.1:0");
    let mut cfg = NodeConfig::new(id, dir, peers.clone());
    cfg.lock_groups = 1;
    start_node(cfg, bind().await.unwrap(), bind().await.unwrap(), peer).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_serves_no_name_until_its_meta_replica_has_caught_up() {
    let mut peers = BTreeMap::new();
    let mut held = Vec::new();
    for id in 1..=3u64 {
        let l = low_tokio_listener();
        peers.insert(id, l.local_addr().unwrap().to_string());
        held.push(l);
    }
    drop(held);
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let nodes = futures::future::join_all(
        (1..=3u64).map(|id| start(id, dirs[id as usize - 1].path(), &peers)),
    )
    .await;
    let mut c = Cluster {
        nodes: nodes.into_iter().map(Some).collect(),
        dirs,
        tls: false,
    };
    c.wait_ready().await;
    for i in 0..3 {
        let h = Http::new(c.url(i, ""));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while h.get("/v1/status").await.body["serving_names"] != true {
            assert!(
                tokio::time::Instant::now() < deadline,
                "node {} never served names",
                i + 1
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let s = Http::new(c.url(2, "")).session("before", 15).await;
    assert!(s.starts_with("s_"), "{s}");
    // Serving names, every group with a leader: ready.
    let ready = Http::new(c.url(2, "")).get("/readyz").await;
    assert_eq!(
        (ready.status, ready.body.clone()),
        (200, json!({"ready": true}))
    );

    // Every node stops; node 3 comes back alone. With no meta leader to confirm it is up to
    // date, it must not answer from what its replica happens to hold.
    c.stop_all().await;
    c.nodes[2] = Some(start(3, c.dirs[2].path(), &peers).await);
    let h = Http::new(c.url(2, ""));
    let status = h.get("/v1/status").await;
    assert_eq!(status.status, 200, "status is no name operation");
    assert_eq!(status.body["serving_names"], false, "{}", status.body);
    // Live, but not ready, and the probe says why.
    let live = h.get("/livez").await;
    assert_eq!(
        (live.status, live.body.clone()),
        (200, json!({"live": true}))
    );
    let ready = h.get("/readyz").await;
    assert_eq!(ready.status, 503, "{}", ready.body);
    // The standard gRPC health check says the same.
    {
        use tonic_health::pb::health_check_response::ServingStatus;
        use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
        let channel =
            tonic::transport::Channel::from_shared(format!("http://{}", c.node(2).grpc_addr))
                .unwrap()
                .connect()
                .await
                .unwrap();
        let mut health = HealthClient::new(channel);
        tokio::time::sleep(Duration::from_millis(600)).await;
        let check = health.check(HealthCheckRequest {
            service: "lockd.v1.Lock".into(),
        });
        let st = tokio::time::timeout(Duration::from_secs(30), check)
            .await
            .expect("the health check answers within 30 s")
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(st, ServingStatus::NotServing as i32);
    }
    assert_eq!(ready.body["error"]["code"], "unavailable", "{}", ready.body);
    let why = ready.body["error"]["message"].as_str().unwrap();
    assert!(why.contains("meta replica has not caught up"), "{why}");
    assert!(why.contains("has no leader"), "{why}");
    assert!(ready.retry_after.is_some(), "503 without Retry-After");
    let opened = h
        .post("/v1/sessions", json!({"client": "too-early", "ttl_s": 15}))
        .await;
    assert_eq!(opened.status, 503, "{}", opened.body);
    assert!(
        opened.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("caught up"),
        "{}",
        opened.body
    );
    assert!(opened.retry_after.is_some(), "503 without Retry-After");
    let inspect = h.get("/v1/locks/payouts%2Fm-1").await;
    assert_eq!(inspect.status, 503, "{}", inspect.body);
    let keepalive = h
        .post(&format!("/v1/sessions/{s}:keepalive"), json!({}))
        .await;
    assert_eq!(keepalive.status, 503, "{}", keepalive.body);

    // A majority again: node 3 catches up and serves.
    c.nodes[0] = Some(start(1, c.dirs[0].path(), &peers).await);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let r = h
            .post("/v1/sessions", json!({"client": "after", "ttl_s": 15}))
            .await;
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 503, "{}", r.body);
        assert!(
            tokio::time::Instant::now() < deadline,
            "never served: {}",
            r.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(h.get("/v1/status").await.body["serving_names"], true);
    c.stop_all().await;
}
