//! `lockctl buckets` against a real 3-node cluster with two lock groups: a held lock's bucket
//! moves to the other group under a client that holds it and one that waits for it over its
//! session stream; the holder keeps its token and lease, the waiter is granted after the
//! release with a larger token.
//!
//! Needs `target/debug/lockd`: `cargo build -p lockd-server --bin lockd` first.

mod common;
mod support;

use std::time::Duration;

use common::*;
use lockd_client::Client;
use lockd_core::{bucket_of, ShardMap};
use serde_json::Value;
use support::{admin_json, lockctl};

/// `lockctl --admin-token-file … buckets ARGS`; the parsed JSON on success.
async fn buckets(c: &Cluster, args: &[&str]) -> Value {
    admin_json(c, &[&["buckets"], args].concat()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_and_awaited_lock_moves_to_another_group() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(3, 2).await;
    let name = (0..)
        .map(|i| format!("fast/rebuild-shard-{i}"))
        .find(|n| ShardMap::initial(2).group_of(n) == 1)
        .unwrap();
    let bucket = bucket_of(&name).to_string();

    // Without the admin token: refused, nothing moves.
    let out = lockctl(&c)
        .args(["buckets", "move", &bucket, "--to", "2"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("admin"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = buckets(&c, &["show"]).await;
    assert_eq!(before["map_version"], 1, "{before}");
    assert_eq!(before["groups"][0]["bucket_count"], 2048);

    let holder = Client::connect_with(c.grpc.clone(), options(Duration::from_secs(10)))
        .await
        .unwrap();
    let guard = holder.acquire(&name).await.unwrap();
    let token = guard.token();
    let waiter = Client::connect_with(c.grpc.clone(), options(Duration::from_secs(10)))
        .await
        .unwrap();
    let wait = {
        let (w, n) = (waiter.clone(), name.clone());
        tokio::spawn(async move { w.acquire(&n).wait(Duration::from_secs(30)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await; // let it queue in group 1

    let m = buckets(&c, &["move", &bucket, "--to", "2"]).await;
    assert_eq!(m["buckets_moved"], 1, "{m}");
    assert_eq!(m["holders"], 1, "{m}");
    assert_eq!(m["waits_requeued"], 1, "{m}");
    let after = buckets(&c, &["show"]).await;
    assert_eq!(after["map_version"], 2, "{after}");
    assert_eq!(after["groups"][1]["bucket_count"], 2049, "{after}");

    // The holder still holds, with its token, past a whole TTL of keepalives.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!guard.is_lost(), "the move cost the holder its lock");
    assert_eq!(guard.token(), token);
    guard.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(20), wait)
        .await
        .expect("the waiter was answered")
        .unwrap()
        .expect("the waiter was granted at the new group");
    assert!(next.token() > token, "{} after {token}", next.token());
    next.release().await.unwrap();
    holder.close().await.unwrap();
    waiter.close().await.unwrap();
}

/// `lockctl groups remove`: refused (naming why) while the group owns buckets, done once they
/// moved away, and the same again; the group is gone from `groups list`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_is_removed_once_its_buckets_moved_away() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(3, 2).await;
    let refused = lockctl(&c)
        .arg("--admin-token-file")
        .arg(c.admin_token_file())
        .args(["groups", "remove", "2"])
        .output()
        .await
        .unwrap();
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("group_not_empty") && err.contains("2048 buckets"),
        "{err}"
    );

    let m = buckets(&c, &["move", "0-4095", "--to", "1"]).await;
    assert_eq!(m["buckets_moved"], 2048, "{m}");
    for _ in 0..2 {
        let r = admin_json(&c, &["groups", "remove", "2"]).await;
        assert_eq!(r, serde_json::json!({"group": 2, "removed": true}));
    }
    let list = admin_json(&c, &["groups", "list"]).await;
    let ids: Vec<u64> = list["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["group"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, vec![1], "{list}");
}
