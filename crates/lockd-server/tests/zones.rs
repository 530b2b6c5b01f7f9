//! Zones (issue 41 item 4): founders spread each group over the zones, every node's zone is
//! recorded and shown, and membership changes that would give one zone a majority of a
//! group's voters are refused (409 naming the group and the zone) unless allowed.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use serde_json::{json, Value};

/// Group id → [(node, zone)] of its voters, from `GET /v1/admin/members`.
fn voters(members: &Value) -> BTreeMap<u64, Vec<(u64, String)>> {
    members["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            let v = g["members"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["role"] == "voter")
                .map(|m| {
                    let zone = m["zone"].as_str().unwrap_or("").to_string();
                    (m["node_id"].as_u64().unwrap(), zone)
                })
                .collect();
            (g["group"].as_u64().unwrap(), v)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_are_spread_over_zones_and_changes_that_give_a_zone_a_majority_are_refused() {
    // 6 nodes in zones z1 z2 z3 z1 z2 z3; 2 lock groups of 3 replicas.
    let c = zoned_cluster(6, 2, 3, 3).await;
    let admin = Http::new(c.url(0, "")).admin();
    let members = admin.get("/v1/admin/members").await;
    assert_eq!(members.status, 200, "{}", members.body);
    let by_group = voters(&members.body);
    for g in [1, 2] {
        let zones: BTreeSet<&str> = by_group[&g].iter().map(|(_, z)| z.as_str()).collect();
        assert_eq!(
            zones.len(),
            3,
            "group {g} one replica per zone: {:?}",
            by_group[&g]
        );
    }
    assert_eq!(
        by_group[&1].iter().map(|v| v.0).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    // Every member of every group shows its zone, and each node's status says its own.
    for (n, zone) in by_group.values().flatten() {
        assert_eq!(*zone, format!("z{}", (n - 1) % 3 + 1), "node {n}");
    }
    let status = Http::new(c.url(4, "")).get("/v1/status").await;
    assert_eq!(status.body["zone"], "z2", "{}", status.body);

    // A new group with two of three voters in z1 (nodes 1 and 4): refused, nothing created.
    let body = json!({"group": 3, "nodes": [1, 4, 2]});
    let r = admin.post("/v1/admin/groups", body).await;
    assert_eq!(r.status, 409, "{}", r.body);
    assert_eq!(
        r.body["error"]["code"], "member_change_refused",
        "{}",
        r.body
    );
    let msg = r.body["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("group 3") && msg.contains("zone z1") && msg.contains("[1, 4]"),
        "{msg}"
    );
    let groups = admin.get("/v1/admin/groups").await;
    assert_eq!(
        groups.body["groups"].as_array().unwrap().len(),
        2,
        "{}",
        groups.body
    );

    // Node 4 (z1) joins group 1: 2 of 4 voters in z1 is no majority.
    let peer4 = members.body["groups"][0]["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["node_id"] == 4)
        .unwrap()["peer_addr"]
        .clone();
    let add = json!({"node_id": 4, "peer_addr": peer4, "groups": [1]});
    let r = admin.post("/v1/admin/members", add).await;
    assert_eq!(r.status, 200, "{}", r.body);
    // Removing node 2 (z2) would leave nodes 1 and 4 of z1 a majority of three: refused, and
    // node 2 stays a voter.
    let r = admin.delete("/v1/admin/members/2?groups=1").await;
    assert_eq!(r.status, 409, "{}", r.body);
    let msg = r.body["error"]["message"].as_str().unwrap();
    assert!(msg.contains("group 1") && msg.contains("zone z1"), "{msg}");
    let now = voters(&admin.get("/v1/admin/members").await.body);
    assert!(now[&1].iter().any(|v| v.0 == 2), "{:?}", now[&1]);
    // Removing node 1 instead (z1 for z1: a replacement) keeps one voter per zone.
    let r = admin.delete("/v1/admin/members/1?groups=1").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let now = voters(&r.body);
    let ids: Vec<u64> = now[&1].iter().map(|v| v.0).collect();
    assert_eq!(ids, [2, 3, 4]);
    let r = admin
        .delete("/v1/admin/members/2?allow_zone_majority=maybe")
        .await;
    assert_eq!(r.status, 400, "{}", r.body);
    // Said with allow_zone_majority, the operator's choice stands.
    let body = json!({"group": 3, "nodes": [1, 4, 2], "allow_zone_majority": true});
    let r = admin.post("/v1/admin/groups", body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["nodes"], json!([1, 2, 4]), "{}", r.body);
}
