//! Namespaces have one source of truth: the meta group, changed by the admin with a versioned
//! compare-and-set. A node's config file seeds a brand-new cluster only; restarting a node with
//! a stale file (a namespace missing, a token gone) changes nothing.

mod common;

use std::collections::BTreeMap;

use common::*;
use lockd_raft::NodeConfig;
use serde_json::{json, Value};
use tokio::net::TcpListener;

/// Node 1 of a one-node cluster on `dir`, started with `namespaces` as its config file.
async fn start_with(
    dir: &std::path::Path,
    peer: &str,
    namespaces: Vec<lockd_core::Namespace>,
) -> lockd_server::Running {
    let peer = rebind(peer).await;
    let peers = BTreeMap::from([(1, peer.local_addr().unwrap().to_string())]);
    let mut cfg = NodeConfig::new(1, dir, peers);
    cfg.lock_groups = 2;
    let bind = || TcpListener::bind("127.0.0.1:0");
    let (http, grpc) = (bind().await.unwrap(), bind().await.unwrap());
    start_node_with(cfg, [http, grpc, peer], None, namespaces).await
}

async fn listed(admin: &Http) -> (u64, Vec<Value>) {
    let r = admin.get("/v1/admin/namespaces").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.body["version"].as_u64().unwrap();
    (v, r.body["namespaces"].as_array().unwrap().clone())
}

fn find<'a>(all: &'a [Value], name: &str) -> Option<&'a Value> {
    all.iter().find(|n| n["name"] == name)
}

/// Every lock group of `r` holds the namespace named `name` with a token digest or not.
fn groups_have(r: &lockd_server::Running, name: &str) -> Vec<Option<bool>> {
    let node = &r.service.node;
    node.group_ids()
        .into_iter()
        .map(|g| {
            node.group(g).unwrap().read_local(|t| {
                t.namespaces()
                    .find(|n| n.name == name)
                    .map(|n| n.token_sha256.is_some())
            })
        })
        .collect()
}

async fn wait_serving(r: &lockd_server::Running) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while !(r.service.meta_caught_up()
        && r.service
            .node
            .group_ids()
            .iter()
            .all(|g| r.service.node.group(*g).unwrap().status().leader.is_some()))
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not serving in 20 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_change_by_compare_and_set_and_a_stale_file_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let peer = low_tokio_listener();
    let peer_addr = peer.local_addr().unwrap().to_string();
    drop(peer);
    let node = start_with(dir.path(), &peer_addr, namespaces()).await;
    wait_serving(&node).await;
    let base = format!("http://{}", node.http_addr);
    let anon = Http::new(base.clone());
    let admin = anon.admin();
    // The sync after the seed has run once the file's namespaces are in every group.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while groups_have(&node, "secure").iter().any(Option::is_none) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "seed never reached the lock groups"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    // Listing needs the admin; tokens are never shown, only whether one is required.
    assert_eq!(anon.get("/v1/admin/namespaces").await.status, 401);
    let (v0, all) = listed(&admin).await;
    assert!(v0 >= 1, "seeded: {v0}");
    assert_eq!(find(&all, "secure").unwrap()["token_required"], true);
    assert!(
        !all.iter().any(|n| n.to_string().contains("sha")),
        "{all:?}"
    );

    // Create `ops` with a token at the version read.
    let put = |v: u64, ns: Value, token: Option<&str>| {
        let mut b = json!({"expected_version": v, "namespace": ns});
        if let Some(t) = token {
            b["bearer_token"] = json!(t);
        }
        let admin = admin.clone();
        async move { admin.post("/v1/admin/namespaces", b).await }
    };
    let ops = json!({"name": "ops", "prefix": "ops/", "max_ttl_ms": 30000, "lock_delay_ms": 500});
    let r = put(v0, ops.clone(), Some("ops-token-1")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v1 = r.body["version"].as_u64().unwrap();
    assert_eq!(v1, v0 + 1);
    // Every lock group has it when the call returns.
    assert_eq!(groups_have(&node, "ops"), vec![Some(true); 3]);

    // A second writer with the old version is refused and changes nothing.
    let stale = put(v0, json!({"name": "ops", "prefix": "ops/"}), None).await;
    assert_eq!(stale.status, 409, "{}", stale.body);
    assert_eq!(stale.body["error"]["code"], "namespace_version_conflict");
    let (v, all) = listed(&admin).await;
    assert_eq!(v, v1);
    assert_eq!(find(&all, "ops").unwrap()["max_ttl_ms"], 30000);

    // Bad input: named field, no change.
    for (body, field) in [
        (
            json!({"expected_version": v1, "namespace": {"name": "bad", "prefix": "bad"}}),
            "'/'",
        ),
        (
            json!({"expected_version": v1, "namespace": {"name": "bad", "prefix": "bad/"}, "bearer_token": "short"}),
            "bearer_token",
        ),
        (
            json!({"expected_version": v1, "namespace": {"name": "bad", "prefix": "bad/", "safety": "correctness"}}),
            "fenced_resource",
        ),
        (
            json!({"expected_version": v1, "namespace": {"name": "bad", "prefix": "bad/"}, "bearer_token": "long-enough", "clear_token": true}),
            "clear_token",
        ),
        (
            json!({"expected_version": v1, "namespace": {"name": "bad name", "prefix": "bad/"}}),
            "namespace.name",
        ),
        (
            json!({"expected_version": v1, "namespace": {"name": "bad\u{202e}", "prefix": "bad/"}}),
            "A-Z a-z 0-9 . _ -",
        ),
    ] {
        let r = admin.post("/v1/admin/namespaces", body.clone()).await;
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        let msg = r.body["error"]["message"].as_str().unwrap();
        assert!(msg.contains(field), "{body}: {msg}");
    }
    // Another prefix's name: a conflict with the cluster's state, not a malformed input.
    let taken = put(v1, json!({"name": "ops", "prefix": "other/"}), None).await;
    assert_eq!(
        (taken.status, taken.body["error"]["code"].clone()),
        (409, json!("namespace_name_taken")),
        "{}",
        taken.body
    );
    let del_default = admin
        .post(
            "/v1/admin/namespaces:delete",
            json!({"expected_version": v1, "name": "default"}),
        )
        .await;
    assert_eq!(del_default.status, 400, "{}", del_default.body);
    let del_unknown = admin
        .post(
            "/v1/admin/namespaces:delete",
            json!({"expected_version": v1, "name": "nope"}),
        )
        .await;
    assert_eq!(del_unknown.status, 404, "{}", del_unknown.body);
    assert_eq!(
        listed(&admin).await.0,
        v1,
        "a refused change bumped the version"
    );

    // The token guards the namespace's sessions and names; a rotation retires the old one.
    let with = anon.with_token("ops-token-1");
    let open = json!({"client": "c", "ttl_s": 10, "namespace": "ops"});
    assert_eq!(anon.post("/v1/sessions", open.clone()).await.status, 401);
    assert_eq!(with.post("/v1/sessions", open.clone()).await.status, 200);
    let r = put(v1, ops.clone(), Some("ops-token-2")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v2 = r.body["version"].as_u64().unwrap();
    assert_eq!(with.post("/v1/sessions", open.clone()).await.status, 401);
    let rotated = anon.with_token("ops-token-2");
    assert_eq!(rotated.post("/v1/sessions", open.clone()).await.status, 200);
    // A put without a token keeps it.
    let r = put(v2, ops.clone(), None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v3 = r.body["version"].as_u64().unwrap();
    assert_eq!(anon.post("/v1/sessions", open.clone()).await.status, 401);

    // A restart with a stale config file: `ops` missing, `secure` without its token. The
    // cluster's namespaces stand.
    node.stop().await;
    let stale_file: Vec<_> = namespaces()
        .into_iter()
        .map(|mut n| {
            n.token_sha256 = None;
            n
        })
        .collect();
    let node = start_with(dir.path(), &peer_addr, stale_file).await;
    wait_serving(&node).await;
    let admin = Http::new(format!("http://{}", node.http_addr)).admin();
    let (v, all) = listed(&admin).await;
    assert_eq!(v, v3, "the restart changed the namespaces");
    assert_eq!(find(&all, "ops").unwrap()["token_required"], true);
    assert_eq!(find(&all, "secure").unwrap()["token_required"], true);
    let anon = Http::new(format!("http://{}", node.http_addr));
    let s = anon
        .post(
            "/v1/sessions",
            json!({"client": "c", "ttl_s": 10, "namespace": "secure"}),
        )
        .await;
    assert_eq!(
        s.status, 401,
        "a stale file opened a protected namespace: {}",
        s.body
    );

    // Delete: gone from meta and from every lock group.
    let r = admin
        .post(
            "/v1/admin/namespaces:delete",
            json!({"expected_version": v3, "name": "ops"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(find(&listed(&admin).await.1, "ops").is_none());
    assert_eq!(groups_have(&node, "ops"), vec![None; 3]);
    node.stop().await;
}
