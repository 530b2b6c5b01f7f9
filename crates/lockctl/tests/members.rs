//! `lockctl members` against a real cluster: grow 3 → 4 nodes, SIGKILL one and replace it by a
//! new node id, while a lock stays held; every call needs the admin token.
//!
//! Needs `target/debug/lockd`: `cargo build -p lockd-server --bin lockd` first.

mod common;
mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use lockd_client::Client;
use serde_json::Value;
use support::{admin_json, lockctl};

/// `lockctl --admin-token-file … members ARGS`; the parsed JSON on success.
async fn members(c: &Cluster, args: &[&str]) -> Value {
    admin_json(c, &[&["members"], args].concat()).await
}

/// Each group's voters, from a `members` answer.
fn voters(v: &Value) -> Vec<BTreeSet<u64>> {
    v["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            g["members"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["role"] == "voter")
                .map(|m| m["node_id"].as_u64().unwrap())
                .collect()
        })
        .collect()
}

/// Group `g`'s leader in a `members` answer.
fn leader_of(v: &Value, g: u64) -> Option<u64> {
    v["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["group"] == g)
        .and_then(|x| x["leader"].as_u64())
}

/// Waits (up to 30 s) until node `want` leads group `g`.
async fn wait_leader(c: &Cluster, g: u64, want: u64) {
    for _ in 0..120 {
        if leader_of(&members(c, &["list"]).await, g) == Some(want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("node {want} never led group {g}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_grow_and_a_dead_node_is_replaced_by_a_new_id_under_a_held_lock() {
    let _serial = SERIAL.lock().await;
    let mut c = Cluster::start(3, 2).await;
    let groups = 3; // the meta group and two lock groups

    // Without the admin token, nothing.
    let out = lockctl(&c)
        .args(["members", "list"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err: Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(err["error"]["code"], "unauthenticated", "{err}");

    let listed = members(&c, &["list"]).await;
    assert_eq!(voters(&listed), vec![BTreeSet::from([1, 2, 3]); groups]);
    assert!(listed["groups"][0]["members"][0]["peer_addr"]
        .as_str()
        .unwrap()
        .starts_with("127.0.0.1:"));

    // A lock held through every change, by a client that knows only nodes 1 and 3.
    let client = Client::connect_with(
        [c.grpc[0].clone(), c.grpc[2].clone()],
        options(Duration::from_secs(5)),
    )
    .await
    .unwrap();
    let held = client.acquire("fast/kept").await.unwrap();

    // Grow: node 4 joins as a learner, catches up, becomes a voter of every group.
    let (four, peer4) = c.start_joiner();
    let grown = members(&c, &["add", &four.to_string(), &peer4]).await;
    assert_eq!(voters(&grown), vec![BTreeSet::from([1, 2, 3, 4]); groups]);
    // Adding it again changes nothing.
    let again = members(&c, &["add", &four.to_string(), &peer4]).await;
    assert_eq!(voters(&again), voters(&grown));

    // Node 2's disk dies: SIGKILL it, then replace it by node 5 (a new id, never 2 again).
    c.nodes[1].kill();
    let (five, peer5) = c.start_joiner();
    let replaced = members(&c, &["replace", "2", &five.to_string(), &peer5]).await;
    assert_eq!(
        voters(&replaced),
        vec![BTreeSet::from([1, 3, 4, 5]); groups]
    );
    // The list, asked of the new node, agrees and reports every member's lag from the leader.
    let out = support::lockctl_at(&c.grpc[4])
        .arg("--admin-token-file")
        .arg(c.admin_token_file())
        .args(["members", "list"])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(voters(&listed), vec![BTreeSet::from([1, 3, 4, 5]); groups]);
    for g in listed["groups"].as_array().unwrap() {
        let lagging: Vec<&Value> = g["members"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["leader"] == false)
            .collect();
        assert_eq!(lagging.len(), 3, "{g}");
        assert!(lagging.iter().all(|m| m["lag"].is_u64()), "{g}");
    }

    // The lock outlived it all, and the next grant of its name has a larger token.
    assert!(!held.is_lost(), "the lease survived the membership changes");
    let first = held.token();
    held.release().await.unwrap();
    let next = client.acquire("fast/kept").await.unwrap();
    assert!(next.token() > first, "{} after {first}", next.token());
    next.release().await.unwrap();

    // A third lock group on nodes 3, 4 and 5, and buckets for it; the client's session (older
    // than the group) takes a name there (the group adopts it).
    let created = admin_json(&c, &["groups", "create", "3", "--nodes", "5,4,3"]).await;
    assert_eq!(
        created,
        serde_json::json!({"group": 3, "nodes": [3, 4, 5], "born_epoch": 1, "ready": true,
                           "placed_at": {"term": 0, "index": 0}})
    );
    let listed = admin_json(&c, &["groups", "list"]).await;
    let ids: Vec<u64> = listed["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["group"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, vec![1, 2, 3], "{listed}");
    let moved = admin_json(&c, &["buckets", "move", "0-99", "--to", "3"]).await;
    assert_eq!(moved["buckets_moved"], 100, "{moved}");
    let name = (0..)
        .map(|i| format!("fast/g3-{i}"))
        .find(|n| lockd_core::bucket_of(n) < 100)
        .unwrap();
    let there = client.acquire(&name).await.unwrap();
    assert!(!there.is_lost());
    there.release().await.unwrap();
    client.close().await.unwrap();

    // Draining. Groups 0-2 are on nodes 1, 3, 4, 5 and prefer the (g mod 4)-th: group 2
    // prefers node 4, which the balancer hands it.
    wait_leader(&c, 2, 4).await;
    let drained = members(&c, &["drain", "4"]).await;
    for g in drained["groups"].as_array().unwrap() {
        assert_ne!(g["leader"], 4, "a drained node leads nothing: {g}");
        for m in g["members"].as_array().unwrap() {
            assert_eq!(m["draining"], m["node_id"] == 4, "{m}");
        }
    }
    assert_eq!(
        voters(&drained)[2],
        BTreeSet::from([1, 3, 4, 5]),
        "it stays a voter"
    );
    // It stays drained: group 2's new leader prefers node 5 now, and would have handed the
    // group back to node 4 within a few seconds if the mark were ignored.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let later = members(&c, &["list"]).await;
    for g in later["groups"].as_array().unwrap() {
        assert_ne!(g["leader"], 4, "handed back to a draining node: {g}");
    }
    // Refusals change nothing: a node that is in no group, and node 0.
    // A node in no group is not found (it depends on the cluster); node 0 is malformed.
    for (bad, code) in [
        ("9", "not_found"),
        ("2", "not_found"),
        ("0", "invalid_argument"),
    ] {
        let out = lockctl(&c)
            .arg("--admin-token-file")
            .arg(c.admin_token_file())
            .args(["members", "drain", bad])
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "drain {bad}");
        let err: Value = serde_json::from_slice(&out.stderr).unwrap();
        assert_eq!(err["error"]["code"], code, "{err}");
        assert!(
            err["error"]["message"].as_str().unwrap().contains("node"),
            "{err}"
        );
    }
    // Undrained, it gets its preferred group back.
    let undrained = members(&c, &["undrain", "4"]).await;
    assert!(undrained["groups"][0]["members"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m["draining"] == false));
    wait_leader(&c, 2, 4).await;
}

/// `members list` says which members the leader hears from: every member reachable on a
/// healthy cluster, and a SIGKILLed one unreachable about a second later (issue 44 item 3),
/// with the time since its last contact growing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_member_is_listed_unreachable() {
    let _serial = SERIAL.lock().await;
    let mut c = Cluster::start(3, 1).await;
    let members_of = |v: &Value| -> Vec<Value> {
        v["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["members"].as_array().unwrap().clone())
            .collect()
    };
    let listed = members(&c, &["list"]).await;
    for m in members_of(&listed) {
        assert_eq!(m["reachable"], true, "{m}");
        if m["leader"] == false {
            assert!(m["last_contact_ms"].as_u64().unwrap() < 1000, "{m}");
        }
    }
    // Node 3 leads nothing (the kit's preferred leaders are nodes 1 and 2): no failover.
    for g in listed["groups"].as_array().unwrap() {
        assert_ne!(g["leader"], 3, "{g}");
    }
    c.nodes[2].kill();
    let killed = std::time::Instant::now();
    let seen = loop {
        let now = members(&c, &["list"]).await;
        let third: Vec<Value> = members_of(&now)
            .into_iter()
            .filter(|m| m["node_id"] == 3)
            .collect();
        assert_eq!(third.len(), 2, "node 3 is in both groups: {now}");
        if third.iter().all(|m| m["reachable"] == false) {
            for m in &third {
                assert!(m["last_contact_ms"].as_u64().unwrap() >= 1000, "{m}");
            }
            for m in members_of(&now).iter().filter(|m| m["node_id"] != 3) {
                assert_eq!(m["reachable"], true, "{m}");
            }
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "node 3 still reachable 10 s after SIGKILL: {now}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("node 3 listed unreachable {seen:?} after SIGKILL");
    // The table names it too.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args(["--endpoints", &c.endpoints(), "--admin-token-file"])
        .arg(c.admin_token_file())
        .args(["members", "list"])
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("reachable"), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some("3") && l.contains(" NO ")),
        "{table}"
    );
}
