//! A lock group created on a running cluster: three founders with one group, three nodes join,
//! group 2 is created on them, half the buckets move to it. Sessions opened before the group
//! existed keep working (adopted there on first use), sessions opened after carry its epoch,
//! and group 2 is hosted only by the nodes it was placed on, across a restart.

mod common;

use std::time::Duration;

use common::*;
use lockd_core::{bucket_of, SessionId};
use serde_json::json;

fn session_id(s: &str) -> SessionId {
    SessionId::parse(s).expect("a session id")
}

/// The first name `prefix-<i>` whose bucket is below 2048 (one that moves to group 2).
fn moved_name(prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|n| bucket_of(n) < 2048)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_created_on_joined_nodes_takes_half_the_buckets_under_use() {
    let mut c = cluster(3, 1).await;
    let admin = Http::new(c.url(0, "")).admin();
    let near = Http::new(c.url(0, ""));

    // Held before anything changes: names in both halves of the buckets. Neither session is
    // kept alive until well into the test: TTLs that outlast a slow run up to there.
    let old = near.session("old", 60).await;
    let quiet = near.session("quiet", 60).await;
    let names: Vec<String> = (0..40).map(|i| format!("payouts/m-{i}")).collect();
    let mut tokens = Vec::new();
    for n in &names {
        let r = near
            .acquire(n, json!({"session_id": old, "owner": "old"}))
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        tokens.push(r.body["token"].as_u64().unwrap());
    }
    let top = *tokens.iter().max().unwrap();

    // Three nodes join the meta group only.
    let mut joined = Vec::new();
    for id in 4..=6 {
        let (j, dir) = joiner(&c, id, (100, 400, 800)).await;
        let body = json!({"node_id": id, "peer_addr": j.peer_addr.to_string(), "groups": [0]});
        let r = admin.post("/v1/admin/members", body).await;
        assert_eq!(r.status, 200, "{}", r.body);
        joined.push((j, dir));
    }

    // Refusals first: each names the field and changes nothing.
    let r = admin
        .post("/v1/admin/groups", json!({"group": 2, "nodes": [4, 5, 9]}))
        .await;
    // A node the cluster does not have is not found (404), as in every admin call.
    assert_eq!(r.status, 404, "{}", r.body);
    let msg = r.body["error"]["message"].as_str().unwrap();
    assert!(msg.contains("nodes: node 9"), "{msg}");
    let r = admin
        .post("/v1/admin/groups", json!({"group": 0, "nodes": [4]}))
        .await;
    assert_eq!(r.status, 400, "{}", r.body);
    let r = near
        .post("/v1/admin/groups", json!({"group": 2, "nodes": [4, 5, 6]}))
        .await;
    assert_eq!(r.status, 401, "no admin token: {}", r.body);
    let r = admin.get("/v1/admin/groups").await;
    assert_eq!(r.body["groups"].as_array().unwrap().len(), 1, "{}", r.body);

    // Create group 2 on the three new nodes: ready, born at epoch 1.
    let r = admin
        .post("/v1/admin/groups", json!({"group": 2, "nodes": [6, 5, 4]}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.body,
        json!({"group": 2, "nodes": [4, 5, 6], "born_epoch": 1, "ready": true,
               "placed_at": {"term": 0, "index": 0}})
    );
    let again = admin
        .post("/v1/admin/groups", json!({"group": 2, "nodes": [4, 5, 6]}))
        .await;
    assert_eq!(
        (again.status, &again.body),
        (200, &r.body),
        "a repeat is a no-op"
    );
    let r = admin
        .post("/v1/admin/groups", json!({"group": 2, "nodes": [1, 2, 3]}))
        .await;
    assert_eq!(
        (r.status, &r.body["error"]["code"]),
        (409, &json!("group_exists"))
    );
    let r = admin.get("/v1/admin/groups").await;
    assert_eq!(r.body["groups"].as_array().unwrap().len(), 2, "{}", r.body);
    assert_eq!(r.body["groups"][0]["born_epoch"], 0);

    // Only the nodes it was placed on host it.
    for (i, dir) in c.dirs.iter().enumerate() {
        assert!(
            !dir.path().join("group-2").exists(),
            "founder {} hosts group 2",
            i + 1
        );
    }
    // (A majority made the group ready; the third node may start its replica at its next read
    // of the records, a second later, and learn the membership then.)
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    for (j, dir) in &joined {
        let hosted = || {
            let g = j.service.node.group(2);
            g.is_some_and(|g| g.status().members.len() == 3)
        };
        while !hosted() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "group 2 on node {}",
                j.service.node.node_id()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(dir.path().join("group-2").exists());
    }

    // Move half the buckets (0-2047) while the names are held.
    let r = admin
        .post(
            "/v1/admin/buckets:move",
            json!({"buckets": "0-2047", "to_group": 2}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let moved = names.iter().filter(|n| bucket_of(n) < 2048).count();
    assert!(moved > 0 && moved < names.len());
    assert_eq!(r.body["holders"], moved, "{}", r.body);
    // Holders keep their tokens, wherever their name went; every node sees them.
    let far = Http::new(c.url(1, ""));
    for (i, n) in names.iter().enumerate() {
        let v = far.inspect(n).await;
        assert_eq!(v["holders"][0]["token"], tokens[i], "{n}: {v}");
    }

    // The old session keeps living (group 2 knows it from the move), and takes a name of a
    // moved bucket it never held: the group adopts it, with a token above every earlier one.
    let r = near
        .post(&format!("/v1/sessions/{old}:keepalive"), json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let fresh = moved_name("payouts/new");
    let r = far
        .acquire(&fresh, json!({"session_id": old, "owner": "old"}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body["token"].as_u64().unwrap() > top, "{}", r.body);

    // A session older than group 2 that never touched it is not ended by it: keepalives
    // leave the group out.
    // Sessions opened once the node has read the new record are opened in both groups.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let new = Http::new(c.url(2, "")).session("new", 30).await;
    for s in [&old, &quiet, &new] {
        let r = far
            .post(&format!("/v1/sessions/{s}:keepalive"), json!({}))
            .await;
        assert_eq!(r.status, 200, "{s}: {}", r.body);
    }
    let r = near
        .acquire(&fresh, json!({"session_id": new, "owner": "new"}))
        .await;
    assert_eq!(
        r.body["acquired"], false,
        "held by the old session: {}",
        r.body
    );

    // The quiet session's first name in group 2: the group adopts it then.
    let g2 = |s: &str| {
        let n = &joined[0].0.service.node;
        n.group(2)
            .unwrap()
            .read_local(|t| t.session_presence(session_id(s)))
    };
    assert_eq!(g2(&quiet), lockd_core::Presence::NotHere);
    let r = far
        .acquire(
            &moved_name("payouts/quiet"),
            json!({"session_id": quiet, "owner": "q"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while g2(&quiet) != lockd_core::Presence::Live {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not adopted on node 4"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = near.delete(&format!("/v1/sessions/{quiet}")).await;
    assert_eq!(
        (r.status, &r.body["released"]),
        (200, &json!(1)),
        "{}",
        r.body
    );
    let r = far
        .post(&format!("/v1/sessions/{quiet}:keepalive"), json!({}))
        .await;
    assert_eq!(r.status, 404, "closed is closed: {}", r.body);

    // Closing the old session frees its holds in both groups.
    let r = near.delete(&format!("/v1/sessions/{old}")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["released"], names.len() + 1, "{}", r.body);
    let r = near
        .acquire(&fresh, json!({"session_id": new, "owner": "new"}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);

    // A restarted replica hosts group 2 again from its data dir.
    let (five, dir5) = joined.remove(1);
    let peers = five.service.node.memberships()[&0].addrs.clone();
    let peer_addr = five.peer_addr;
    five.stop().await;
    let bind = |a: String| tokio::net::TcpListener::bind(a);
    let peer = rebind(&peer_addr.to_string()).await;
    let http = bind("127.0.0.1:0".into()).await.unwrap();
    let grpc = bind("127.0.0.1:0".into()).await.unwrap();
    let mut cfg = lockd_raft::NodeConfig::new(5, dir5.path(), peers);
    cfg.join_existing = true;
    let five = start_node(cfg, http, grpc, peer).await;
    wait_serving(&five).await;
    assert!(
        five.service.node.group(2).is_some(),
        "group 2 hosted again after a restart"
    );
    let later = moved_name("payouts/later");
    let r = Http::new(format!("http://{}", five.http_addr))
        .acquire(&later, json!({"session_id": new, "owner": "new"}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);

    five.stop().await;
    for (j, _) in joined {
        j.stop().await;
    }
    c.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_with_the_largest_id_is_served_and_counted() {
    // Found by schemathesis: the metrics kept each group's last leader in a Vec indexed by
    // group id, so a scrape after creating group 4294967294 grew the node past 24 GB.
    let mut c = cluster(1, 1).await;
    let admin = Http::new(c.url(0, "")).admin();
    let big = u64::from(u32::MAX - 1);
    let r = admin
        .post("/v1/admin/groups", json!({"group": big, "nodes": [1]}))
        .await;
    assert_eq!(
        (r.status, r.body["ready"].clone()),
        (200, json!(true)),
        "{}",
        r.body
    );
    let http = Http::new(c.url(0, ""));
    for _ in 0..2 {
        let m = http.admin().get("/metrics").await;
        assert_eq!(m.status, 200);
        assert!(
            m.body
                .as_str()
                .unwrap()
                .contains(&format!("group=\"{big}\"")),
            "no series for group {big}"
        );
    }
    let r = admin
        .post(
            "/v1/admin/buckets:move",
            json!({"buckets": "7", "to_group": big}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    c.stop_all().await;
}

/// A founding group gives its buckets away and is removed: refused while it owns any, then
/// closed, removed from the records, no longer hosted (across a restart too), its id never
/// reused; the locks it held keep their tokens in the group they moved to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_that_gave_its_buckets_away_is_removed_for_good() {
    let mut c = cluster(3, 2).await;
    let admin = Http::new(c.url(0, "")).admin();
    let near = Http::new(c.url(1, ""));
    let initial = lockd_core::ShardMap::initial(2);
    let in_two: Vec<String> = (0..)
        .map(|i| format!("payouts/r-{i}"))
        .filter(|n| initial.group_of(n) == 2)
        .take(5)
        .collect();
    // No keepalive until the end: a TTL that outlasts the moves and removal on a loaded machine.
    let s = near.session("holder", 60).await;
    let mut tokens = Vec::new();
    for n in &in_two {
        let r = near
            .acquire(n, json!({"session_id": s, "owner": "o"}))
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        tokens.push(r.body["token"].as_u64().unwrap());
    }

    // Refusals name the field and change nothing.
    let r = admin.delete("/v1/admin/groups/2").await;
    assert_eq!(
        (r.status, &r.body["error"]["code"]),
        (409, &json!("group_not_empty")),
        "{}",
        r.body
    );
    let msg = r.body["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("group 2") && msg.contains("2048 buckets"),
        "{msg}"
    );
    for (path, status) in [
        ("/v1/admin/groups/0", 400),
        ("/v1/admin/groups/x", 400),
        ("/v1/admin/groups/9", 404),
    ] {
        let r = admin.delete(path).await;
        assert_eq!(r.status, status, "{path}: {}", r.body);
        assert!(
            r.body["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("group"),
            "{}",
            r.body
        );
    }
    let r = near.delete("/v1/admin/groups/2").await;
    assert_eq!(r.status, 401, "no admin token: {}", r.body);
    assert!(c.node(0).service.node.group(2).is_some());

    // Every bucket to group 1, then the removal, twice.
    let r = admin
        .post(
            "/v1/admin/buckets:move",
            json!({"buckets": "0-4095", "to_group": 1}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    for _ in 0..2 {
        let r = admin.delete("/v1/admin/groups/2").await;
        assert_eq!(
            (r.status, &r.body),
            (200, &json!({"group": 2, "removed": true}))
        );
    }
    let r = admin.get("/v1/admin/groups").await;
    let ids: Vec<u64> = r.body["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["group"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, vec![1], "{}", r.body);
    let r = admin
        .post("/v1/admin/groups", json!({"group": 2, "nodes": [1, 2, 3]}))
        .await;
    assert_eq!(
        (r.status, &r.body["error"]["code"]),
        (409, &json!("group_removed")),
        "{}",
        r.body
    );

    // Every node stops hosting it (each reads the records every second) and sets its data aside.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    for i in 0..3 {
        let set_aside = |i: usize| {
            c.node(i).service.node.group(2).is_none()
                && c.dirs[i].path().join("group-2.removed").exists()
        };
        while !set_aside(i) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "node {} still hosts group 2",
                i + 1
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(!c.dirs[i].path().join("group-2").exists());
        assert!(c.dirs[i].path().join("group-2.removed").exists());
    }

    // The holds live on in group 1, tokens unchanged; the session lives on; names still work.
    let far = Http::new(c.url(2, ""));
    for (n, t) in in_two.iter().zip(&tokens) {
        let v = far.inspect(n).await;
        assert_eq!(v["holders"][0]["token"], *t, "{n}: {v}");
    }
    let r = far
        .post(&format!("/v1/sessions/{s}:keepalive"), json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = far.release(&in_two[0], &s, tokens[0]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let other = far.session("other", 30).await;
    let r = far
        .acquire(&in_two[0], json!({"session_id": other, "owner": "p"}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body["token"].as_u64().unwrap() > tokens[0], "{}", r.body);

    // A restarted founder does not host (or initialise) the removed group again.
    let peers = c.node(2).service.node.memberships()[&0].addrs.clone();
    let peer_addr = c.node(2).peer_addr;
    c.stop(2).await;
    let bind = |a: String| tokio::net::TcpListener::bind(a);
    let peer = rebind(&peer_addr.to_string()).await;
    let http = bind("127.0.0.1:0".into()).await.unwrap();
    let grpc = bind("127.0.0.1:0".into()).await.unwrap();
    let mut cfg = lockd_raft::NodeConfig::new(3, c.dirs[2].path(), peers);
    cfg.lock_groups = 2;
    let three = start_node(cfg, http, grpc, peer).await;
    wait_serving(&three).await;
    assert!(
        three.service.node.group(2).is_none(),
        "group 2 back after a restart"
    );
    assert!(!c.dirs[2].path().join("group-2").exists());
    let r = Http::new(format!("http://{}", three.http_addr))
        .acquire(&in_two[1], json!({"session_id": other, "owner": "p"}))
        .await;
    assert_eq!(
        (r.status, &r.body["acquired"]),
        (200, &json!(false)),
        "held: {}",
        r.body
    );
    three.stop().await;
    c.stop_all().await;
}

/// A membership change whose admin call stopped before it updated the record (here: made
/// straight on the node, as a crash between the two steps leaves it) is recorded by the
/// group's leader within seconds, with the config it came from; nothing rolls it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_record_catches_up_with_a_change_its_call_never_recorded() {
    let mut c = cluster(3, 1).await;
    let admin = Http::new(c.url(0, "")).admin();
    let record = |b: &serde_json::Value| b["groups"][0].clone();
    let before = record(&admin.get("/v1/admin/groups").await.body);
    assert_eq!(before["nodes"], json!([1, 2, 3]), "{before}");
    assert_eq!(
        before["placed_at"],
        json!({"term": 0, "index": 0}),
        "{before}"
    );

    let call = lockd_raft::MemberCall::Remove { id: 3 };
    let m = c.node(0).service.node.member_call(1, call).await.unwrap();
    assert_eq!(m.members(), vec![1, 2]);

    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let after = loop {
        let r = record(&admin.get("/v1/admin/groups").await.body);
        if r["nodes"] == json!([1, 2]) {
            break r;
        }
        assert!(tokio::time::Instant::now() < deadline, "still {r}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(after["placed_at"]["index"], m.config_id.index, "{after}");
    assert_eq!(after["placed_at"]["term"], m.config_id.term, "{after}");
    // It stays (a second later, after more reconciles on every node).
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(record(&admin.get("/v1/admin/groups").await.body), after);
    c.stop_all().await;
}
