//! Groups placed on some nodes only: 4 nodes, 2 lock groups of 3 replicas (group 1 on nodes
//! 1-3, group 2 on nodes 4, 1 and 2). Every node still serves every name: a node with no
//! replica of a name's group sends proposals and keepalives to that group's leader, asks a
//! member for reads, and has a member park its waits — over HTTP and on the session stream.

mod common;

use std::time::Duration;

use common::*;
use lockd_core::ShardMap;
use lockd_proto::v1 as pb;
use lockd_proto::v1::lock_client::LockClient;
use lockd_raft::Route;
use pb::session_event::Kind as Ev;
use pb::session_request::Kind as Req;
use serde_json::json;
use tokio::sync::mpsc;

/// `count` names whose bucket the initial map gives to group `g` of 2.
fn names_of(prefix: &str, g: u32, count: usize) -> Vec<String> {
    let map = ShardMap::initial(2);
    (0..)
        .map(|i| format!("{prefix}/shard-{i}"))
        .filter(|n| map.group_of(n) == g)
        .take(count)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_serves_names_of_groups_it_does_not_host() {
    let mut c = placed_cluster(4, 2, 3).await;
    // Where the replicas are: node 3 (index 2) has none of group 2, node 4 none of group 1.
    let hosts = |i: usize, g: u32| c.dirs[i].path().join(format!("group-{g}")).exists();
    assert!(hosts(0, 1) && hosts(0, 2) && hosts(1, 1) && hosts(1, 2));
    assert!(hosts(2, 1) && !hosts(2, 2), "node 3 hosts group 1 only");
    assert!(hosts(3, 2) && !hosts(3, 1), "node 4 hosts group 2 only");
    assert!(
        (0..4).all(|i| hosts(i, 0)),
        "the meta group is on every founder"
    );
    let route = |i: usize, g: u32| c.node(i).service.node.route(g).unwrap();
    assert!(matches!(route(3, 1), Route::Remote(_)));
    assert!(matches!(route(3, 2), Route::Local(_)));
    for (node, g) in [(0, 1), (1, 2), (2, 1), (3, 2)] {
        let status = c.node(node).service.node.group(g).unwrap().status();
        assert_eq!(status.members.len(), 3, "group {g}: {status:?}");
    }

    let g1 = names_of("search", 1, 2);
    let fast = names_of("fast", 1, 1).remove(0);
    let far = Http::new(c.url(3, "")); // node 4: no replica of group 1
    let near = Http::new(c.url(0, ""));

    // A session opened on node 4 spans group 1 too: it takes a group-1 name there.
    let s = far.session_in("far", 2, "fast").await;
    let r = far
        .acquire(&fast, json!({"session_id": s, "owner": "far"}))
        .await;
    assert_eq!(
        (r.status, &r.body["acquired"]),
        (200, &json!(true)),
        "{}",
        r.body
    );
    let t1 = r.body["token"].as_u64().unwrap();
    // A read of group 1's state, asked of a member by node 4, is the leader's state.
    let seen = far.admin().inspect(&fast).await;
    assert_eq!(seen["holders"][0]["token"], t1, "{seen}");
    assert_eq!(near.admin().inspect(&fast).await["holders"][0]["token"], t1);

    // Keepalives through node 4 reach group 1's leader: the hold outlives three TTLs.
    for _ in 0..12 {
        let k = far
            .post(&format!("/v1/sessions/{s}:keepalive"), json!({}))
            .await;
        assert_eq!(k.status, 200, "{}", k.body);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(near.admin().inspect(&fast).await["holders"][0]["token"], t1);
    let info = far.admin().get(&format!("/v1/sessions/{s}")).await;
    assert_eq!(info.status, 200, "{}", info.body);
    assert_eq!(
        info.body["held"].as_array().map(Vec::len),
        Some(1),
        "{}",
        info.body
    );

    // A long poll on node 4 for a group-1 name waits on a member and is granted on release.
    let holder = near.session("holder", 30).await;
    let r = near
        .acquire(&g1[1], json!({"session_id": holder, "owner": "holder"}))
        .await;
    let t2 = r.body["token"].as_u64().unwrap();
    let waiter = {
        let (far, name, s) = (far.clone(), g1[1].clone(), far.session("waiter", 30).await);
        tokio::spawn(async move {
            far.acquire(
                &name,
                json!({"session_id": s, "owner": "waiter", "wait_ms": 20_000}),
            )
            .await
        })
    };
    wait_until_queued(&near.admin(), &g1[1]).await;
    assert_eq!(near.release(&g1[1], &holder, t2).await.status, 200);
    let got = waiter.await.unwrap();
    assert_eq!(
        (got.status, &got.body["acquired"]),
        (200, &json!(true)),
        "{}",
        got.body
    );
    assert!(got.body["token"].as_u64().unwrap() > t2);

    // Node 4's contention report has group 1's part from a member: the hand-off is there.
    let hot = far.admin().get("/v1/contention").await;
    assert_eq!(hot.status, 200, "{}", hot.body);
    let handed = &hot.body["most_handoffs"][0];
    assert_eq!(
        (&handed["name"], &handed["group"]),
        (&json!(g1[1]), &json!(1)),
        "{}",
        hot.body
    );
    assert!(hot.body["longest_held"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == json!(fast)));

    // A wait that times out on a member says so, naming the holder.
    let r = far
        .acquire(
            &g1[1],
            json!({"session_id": holder, "owner": "late", "wait_ms": 300}),
        )
        .await;
    assert_eq!(
        (r.status, &r.body["acquired"]),
        (200, &json!(false)),
        "{}",
        r.body
    );
    assert_eq!(r.body["holder"], "waiter", "{}", r.body);
    c.stop_all().await;
}

async fn next(down: &mut tonic::Streaming<pb::SessionEvent>) -> pb::SessionEvent {
    tokio::time::timeout(Duration::from_secs(20), down.message())
        .await
        .expect("an event in 20 s")
        .unwrap()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_on_a_node_without_the_group_gets_its_grant_pushed() {
    let mut c = placed_cluster(4, 2, 3).await;
    let g1 = names_of("search", 1, 1).remove(0);
    let near = Http::new(c.url(0, ""));
    let holder = near.session("holder", 30).await;
    let t = near
        .acquire(&g1, json!({"session_id": holder, "owner": "holder"}))
        .await
        .body["token"]
        .as_u64()
        .unwrap();

    let mut cl = LockClient::connect(format!("http://{}", c.node(3).grpc_addr))
        .await
        .unwrap();
    let (up, rx) = mpsc::unbounded_channel();
    let mut down = cl
        .session(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let send = |id, kind| {
        up.send(pb::SessionRequest {
            request_id: id,
            kind: Some(kind),
        })
        .unwrap()
    };
    send(
        1,
        Req::Open(pb::OpenSessionRequest {
            client: "streamer".into(),
            ..Default::default()
        }),
    );
    let Some(Ev::Opened(_)) = next(&mut down).await.kind else {
        panic!("not opened")
    };
    send(
        2,
        Req::Acquire(pb::AcquireRequest {
            name: g1.clone(),
            owner: "me".into(),
            wait_ms: 20_000,
            ..Default::default()
        }),
    );
    let ev = next(&mut down).await;
    let Some(Ev::Queued(q)) = ev.kind else {
        panic!("{ev:?}")
    };
    assert_eq!((q.group, q.position), (1, 1));
    assert_eq!(near.release(&g1, &holder, t).await.status, 200);
    let ev = next(&mut down).await;
    let Some(Ev::Granted(g)) = ev.kind else {
        panic!("{ev:?}")
    };
    assert_eq!((ev.request_id, g.group, g.waiter), (0, 1, q.waiter));
    assert!(g.fencing_token > t);
    let seen = near.admin().inspect(&g1).await;
    assert_eq!(seen["holders"][0]["token"], g.fencing_token, "{seen}");
    drop(up);
    c.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joiner_with_other_raft_timing_is_refused_naming_both() {
    let mut c = cluster(3, 1).await;
    // The cluster runs lockd's defaults (heartbeat 100 ms, election 400..800 ms).
    let (j, _dir) = joiner(&c, 4, (100, 300, 600)).await;
    let failure = tokio::time::timeout(Duration::from_secs(20), j.service.node.fatal())
        .await
        .expect("the joiner was not refused within 20 s");
    let msg = failure.to_string();
    assert!(
        msg.contains("300..600") && msg.contains("400..800"),
        "{msg}"
    );
    j.stop().await;
    // The same timing is accepted: the joiner keeps running.
    let (ok, _dir) = joiner(&c, 5, (100, 400, 800)).await;
    let refused = tokio::time::timeout(Duration::from_secs(3), ok.service.node.fatal()).await;
    assert!(
        refused.is_err(),
        "a joiner with the cluster's timing was refused: {refused:?}"
    );
    ok.stop().await;
    c.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_id_that_left_every_group_is_never_added_again() {
    let mut c = cluster(3, 1).await;
    let (j, _dir) = joiner(&c, 4, (100, 400, 800)).await;
    let admin = Http::new(c.url(0, "")).admin();
    let add = json!({"node_id": 4, "peer_addr": j.peer_addr.to_string()});
    let r = admin.post("/v1/admin/members", add.clone()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    // Leaving one group of two does not retire it; leaving the last one does.
    let r = admin.delete("/v1/admin/members/4?groups=1").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = admin
        .post(
            "/v1/admin/members",
            json!({"node_id": 4, "peer_addr": j.peer_addr.to_string(), "groups": [1]}),
        )
        .await;
    assert_eq!(
        r.status, 200,
        "not retired while still in group 0: {}",
        r.body
    );
    let r = admin.delete("/v1/admin/members/4").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = admin.post("/v1/admin/members", add).await;
    assert_eq!(
        (r.status, &r.body["error"]["code"]),
        (409, &json!("node_retired")),
        "{}",
        r.body
    );
    let msg = r.body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("node id 4") && msg.contains("new --node-id"),
        "{msg}"
    );
    j.stop().await;
    // Removing an id that never was a member retires nothing: node 9 joins afterwards.
    let r = admin.delete("/v1/admin/members/9").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let (nine, _dir9) = joiner(&c, 9, (100, 400, 800)).await;
    let body = json!({"node_id": 9, "peer_addr": nine.peer_addr.to_string()});
    let r = admin.post("/v1/admin/members", body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    nine.stop().await;
    c.stop_all().await;
}

/// A 503 whose message names the meta group.
fn refused_naming_meta(r: &Resp) -> bool {
    r.status == 503
        && r.body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("meta group"))
}

/// A node serves names only while its meta replica is a member of the meta group: a joiner
/// added to a lock group alone, and a node removed from group 0, say so (503, naming the meta
/// group) instead of serving from a replica that no longer follows the namespaces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_outside_the_meta_group_serves_no_names_and_says_why() {
    let mut c = cluster(3, 1).await;
    let (j, _dir) = joiner(&c, 4, (100, 400, 800)).await;
    let admin = Http::new(c.url(0, "")).admin();
    let h = Http::new(format!("http://{}", j.http_addr));
    // Opens a session through node 4 until `want` holds (every answer is a 200 or a 503).
    let open_until = |want: fn(&Resp) -> bool, what: &'static str| {
        let h = &h;
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            loop {
                let r = h
                    .post("/v1/sessions", json!({"client": "outsider", "ttl_s": 15}))
                    .await;
                if want(&r) {
                    return;
                }
                assert!([200, 503].contains(&r.status), "{what}: {}", r.body);
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{what}: {} {}",
                    r.status,
                    r.body
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let peer = j.peer_addr.to_string();
    let add =
        |groups: serde_json::Value| json!({"node_id": 4, "peer_addr": peer, "groups": groups});
    let r = admin.post("/v1/admin/members", add(json!([1]))).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = h
        .post("/v1/sessions", json!({"client": "outsider", "ttl_s": 15}))
        .await;
    assert!(
        refused_naming_meta(&r),
        "in group 1 only: {} {}",
        r.status,
        r.body
    );

    // In the meta group too: it catches up and serves.
    let r = admin.post("/v1/admin/members", add(json!([0]))).await;
    assert_eq!(r.status, 200, "{}", r.body);
    open_until(|r| r.status == 200, "added to group 0").await;

    // Out of the meta group again: once its replica has applied the removal (a moment after
    // the leader committed it), it stops serving names, and says why.
    let r = admin.delete("/v1/admin/members/4?groups=0").await;
    assert_eq!(r.status, 200, "{}", r.body);
    open_until(refused_naming_meta, "removed from group 0").await;
    assert_eq!(h.get("/v1/status").await.body["serving_names"], false);
    j.stop().await;
    c.stop_all().await;
}
