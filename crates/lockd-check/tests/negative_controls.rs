//! A node that runs one of lockd-check's negative controls is unsafe, and says so wherever it
//! is looked at: `/v1/status`, the body of `/readyz` and `/metrics` (issue 42 item 7). Only
//! here, since only lockd-check's build has the controls; lockd-server's `http_api.rs` checks
//! that a normal node shows none.

use std::collections::BTreeMap;
use std::time::Duration;

use lockd_testkit::inproc::{start_node, Http};
use tokio::net::TcpListener;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sabotaged_node_names_its_control_in_status_readiness_and_metrics() {
    let bind = || TcpListener::bind("127.0.0.1:0");
    let (http, grpc, peer) = (
        bind().await.unwrap(),
        bind().await.unwrap(),
        bind().await.unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    let peers = BTreeMap::from([(1, peer.local_addr().unwrap().to_string())]);
    let mut node = lockd_raft::NodeConfig::new(1, dir.path(), peers);
    node.skip_leader_lease_check = true;
    let r = start_node(node, http, grpc, peer).await;
    let h = Http::new(format!("http://{}", r.http_addr));
    let give_up = tokio::time::Instant::now() + Duration::from_secs(20);
    let ready = loop {
        let ready = h.get("/readyz").await;
        if ready.status == 200 {
            break ready;
        }
        assert!(tokio::time::Instant::now() < give_up, "{}", ready.body);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let want = serde_json::json!(["skip-leader-lease-check"]);
    assert_eq!(
        ready.body["unsafe_negative_controls"], want,
        "{}",
        ready.body
    );
    let status = h.get("/v1/status").await;
    assert_eq!(
        status.body["unsafe_negative_controls"], want,
        "{}",
        status.body
    );
    // The test namespaces include one with a token: once the node has put them (a moment
    // after it is ready), /metrics on the client port needs the admin token.
    let metrics = h.admin().get("/metrics").await;
    let text = metrics
        .body
        .as_str()
        .unwrap_or_else(|| panic!("/metrics answered {}: {}", metrics.status, metrics.body));
    assert!(
        text.contains("lockd_unsafe_negative_control{control=\"skip-leader-lease-check\"} 1"),
        "{text}"
    );
    r.stop().await;
}
