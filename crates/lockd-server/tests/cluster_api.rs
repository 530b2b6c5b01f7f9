//! The API of a 3-node cluster: any node serves any request.

mod common;

use std::time::{Duration, Instant};

use common::*;
use lockd_core::ShardMap;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_serve_requests_and_a_lost_quorum_answers_503() {
    let mut c = cluster(3, 2).await;
    let name = "payouts/merchant-48213";
    let group = ShardMap::initial(2).group_of(name);
    let leader = c
        .node(0)
        .service
        .node
        .group(group)
        .unwrap()
        .status()
        .leader
        .unwrap();
    let follower = (0..3).find(|i| *i as u64 + 1 != leader).unwrap();
    let other = (0..3)
        .find(|i| *i != follower && *i as u64 + 1 != leader)
        .unwrap();

    // Everything through a follower: the session, a grant, a wait woken by a release.
    let f = Http::new(c.url(follower, ""));
    let s1 = f.session("w1", 15).await;
    let s2 = f.session("w2", 15).await;
    let r = f
        .acquire(name, json!({"session_id": s1, "owner": "w1"}))
        .await;
    assert_eq!(
        (r.status, r.body["acquired"].clone()),
        (200, json!(true)),
        "{}",
        r.body
    );
    let t1 = r.body["token"].as_u64().unwrap();
    let ff = f.clone();
    let s2c = s2.clone();
    let wait = tokio::spawn(async move {
        ff.acquire(name, json!({"session_id": s2c, "wait_ms": 20_000}))
            .await
            .body
    });
    // Another follower sees the same holder (linearizable read), and releases through it work.
    let o = Http::new(c.url(other, ""));
    let deadline = Instant::now() + Duration::from_secs(10);
    while o.inspect(name).await["waiters"]
        .as_array()
        .unwrap()
        .is_empty()
    {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(o.inspect(name).await["token"], t1);
    assert_eq!(o.release(name, &s1, t1).await.status, 200);
    let granted = wait.await.unwrap();
    assert_eq!(granted["acquired"], true, "{granted}");
    assert!(granted["token"].as_u64().unwrap() > t1);
    assert_eq!(
        o.post(&format!("/v1/sessions/{s2}:keepalive"), json!({}))
            .await
            .status,
        200
    );

    // Two of three nodes gone: no quorum, so requests get 503 with Retry-After, never a grant.
    let survivor = follower;
    for i in 0..3 {
        if i != survivor {
            c.stop(i).await;
        }
    }
    let r = f.acquire("payouts/other", json!({"session_id": s1})).await;
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.retry_after.is_some());
    c.stop_all().await;
}

/// Graceful leave: a stopping node first hands every group it leads to a voter that is in
/// touch, so no group waits out an election timeout, and a held lock keeps its holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_node_hands_its_groups_over_first() {
    let mut c = cluster(3, 2).await;
    // Lead every group from node 1, so its leaving moves all of them.
    let node1 = c.node(0).service.node.clone();
    for g in node1.group_ids() {
        let deadline = Instant::now() + Duration::from_secs(20);
        while node1.group(g).unwrap().status().leader != Some(1) {
            let leader = node1.group(g).unwrap().status().leader;
            if let Some(l) = leader {
                // Ask the current leader to step aside for node 1.
                let n = &c.node(l as usize - 1).service.node;
                n.hand_over_group(g, 1).await;
            }
            assert!(Instant::now() < deadline, "group {g} never moved to node 1");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let h = Http::new(c.url(1, ""));
    let s = h.session("holder", 30).await;
    let r = h.acquire("jobs/kept", json!({"session_id": s})).await;
    let token = r.body["token"].as_u64().unwrap();

    let groups = node1.group_ids().len();
    let (handed, left) = node1.hand_over(Duration::from_secs(5)).await;
    assert_eq!((handed, left), (groups, 0));
    // Node 2 learns each new leader from its first heartbeat: on a loaded machine that can
    // come a little after the hand-over returned on node 1.
    for g in node1.group_ids() {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let leader = c.node(1).service.node.group(g).unwrap().status().leader;
            if matches!(leader, Some(2 | 3)) {
                break;
            }
            assert!(Instant::now() < deadline, "group {g} led by {leader:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    c.stop(0).await;
    // The hold is intact on the survivors, and the next grant of its name is larger.
    let info = h.admin().inspect("jobs/kept").await;
    assert_eq!(info["holder"]["session"], s.as_str());
    assert_eq!(h.release("jobs/kept", &s, token).await.status, 200);
    let r = h.acquire("jobs/kept", json!({"session_id": s})).await;
    assert!(r.body["token"].as_u64().unwrap() > token);
    c.stop_all().await;
}

/// Each lock group learns its buckets from the shard map at start and refuses every other
/// name, so a stale route can never make two groups grant one name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_group_serves_only_the_buckets_the_map_gives_it() {
    let mut c = cluster(3, 2).await;
    let map = ShardMap::initial(2);
    let node = &c.node(0).service.node;
    let give_up = Instant::now() + Duration::from_secs(20);
    for g in [1, 2] {
        let group = node.group(g).unwrap();
        loop {
            let own = group.read(|t| t.ownership()).await.unwrap();
            if own.map_version != 0 {
                let want: lockd_core::BucketSet = (0..4096u16)
                    .filter(|b| map.groups[*b as usize] == g)
                    .collect();
                assert_eq!((own.map_version, own.owned), (1, want), "group {g}");
                break;
            }
            assert!(
                Instant::now() < give_up,
                "group {g} was never assigned its buckets"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let name = "payouts/merchant-48213";
    let wrong = 3 - map.group_of(name);
    let op = lockd_core::Op::Acquire {
        session: lockd_core::SessionId(1),
        name: name.into(),
        owner: "stale-router".into(),
        mode: lockd_core::LockMode::Exclusive,
        wait_ms: 0,
        reentrant: false,
    };
    let r = node.group(wrong).unwrap().propose(op).await.unwrap();
    assert_eq!(
        r,
        Err(lockd_core::Rejection::WrongGroup {
            bucket: lockd_core::bucket_of(name),
            map_version: 1
        })
    );
    // Through the API the same name is served by its own group.
    let h = Http::new(c.url(0, ""));
    let s = h.session("w", 15).await;
    let r = h
        .acquire(name, json!({"session_id": s, "owner": "w"}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    c.stop_all().await;
}

/// Peers given by DNS name (as a Kubernetes StatefulSet gives them): every node reaches the
/// others by name, resolved when it connects, and a member added by name joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_named_by_dns_form_a_cluster_and_a_named_member_joins() {
    let bind = || tokio::net::TcpListener::bind("127.0.0.1:0");
    let mut listeners = Vec::new();
    let mut peers = std::collections::BTreeMap::new();
    for id in 1..=3u64 {
        let (http, grpc, peer) = (
            bind().await.unwrap(),
            bind().await.unwrap(),
            bind().await.unwrap(),
        );
        let port = peer.local_addr().unwrap().port();
        peers.insert(id, format!("localhost:{port}"));
        listeners.push((http, grpc, peer));
    }
    let mut dirs = Vec::new();
    let mut starts = Vec::new();
    for (i, (http, grpc, peer)) in listeners.into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = lockd_raft::NodeConfig::new(i as u64 + 1, dir.path(), peers.clone());
        cfg.lock_groups = 1;
        dirs.push(dir);
        starts.push(start_node(cfg, http, grpc, peer));
    }
    let nodes: Vec<_> = futures::future::join_all(starts)
        .await
        .into_iter()
        .map(Some)
        .collect();
    let mut c = Cluster {
        nodes,
        dirs,
        tls: false,
    };
    c.wait_ready().await;
    let members = c.node(0).service.node.memberships()[&0].addrs.clone();
    assert!(
        members.values().all(|a| a.starts_with("localhost:")),
        "{members:?}"
    );

    let http = Http::new(c.url(1, ""));
    let s = http.session("dns", 10).await;
    let r = http
        .acquire("payouts/dns", json!({"session_id": s, "owner": "o"}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);

    // A joiner added under its DNS name; a malformed name is refused, naming the field.
    let (j, _dir) = joiner(&c, 4, (100, 400, 800)).await;
    let admin = Http::new(c.url(0, "")).admin();
    let bad = admin
        .post(
            "/v1/admin/members",
            json!({"node_id": 4, "peer_addr": "not a host:1"}),
        )
        .await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert!(bad.body["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("peer_addr:"));
    let named = format!("localhost:{}", j.peer_addr.port());
    let r = admin
        .post(
            "/v1/admin/members",
            json!({"node_id": 4, "peer_addr": named, "groups": [0]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    // The leader's view, as the call answered it.
    let group0 = &r.body["groups"][0]["members"];
    let four = group0
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["node_id"] == 4);
    assert_eq!(
        four.map(|m| m["peer_addr"].clone()),
        Some(json!(named)),
        "{}",
        r.body
    );
    assert_eq!(
        four.map(|m| m["role"].clone()),
        Some(json!("voter")),
        "{}",
        r.body
    );
    j.stop().await;
    c.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_member_at_another_nodes_peer_address_is_refused_and_the_cluster_keeps_serving() {
    // Found by schemathesis: adding node 400 at node 1's own peer address made group 0's
    // leader replicate to itself, and openraft panicked on its own append.
    let mut c = cluster(1, 1).await;
    let admin = Http::new(c.url(0, "")).admin();
    let own = c.node(0).peer_addr.to_string();
    let r = admin
        .post(
            "/v1/admin/members",
            json!({"node_id": 400, "peer_addr": own}),
        )
        .await;
    assert_eq!(
        (r.status, r.body["error"]["code"].clone()),
        (409, json!("member_change_refused")),
        "{}",
        r.body
    );
    let msg = r.body["error"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("peer_addr:") && msg.contains("node 1's peer address"),
        "{msg}"
    );
    // Nothing changed: node 400 is in no group, and names are still served.
    let m = admin.get("/v1/admin/members").await;
    assert_eq!(m.status, 200, "{}", m.body);
    let ids: Vec<u64> = m.body["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["members"].as_array().unwrap().iter())
        .map(|x| x["node_id"].as_u64().unwrap())
        .collect();
    assert!(!ids.contains(&400), "{}", m.body);
    let http = Http::new(c.url(0, ""));
    let s = http.session("after", 10).await;
    let r = http
        .acquire("payouts/after", json!({"session_id": s, "owner": "o"}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);

    // A member at an address where nothing answers: it is never promoted (openraft's own
    // catch-up wait took a learner that acknowledged nothing for caught up, and the one-voter
    // meta group got a second voter that never votes). The call says so; the node serves on.
    let r = admin
        .post(
            "/v1/admin/members",
            json!({"node_id": 401, "peer_addr": "127.0.0.1:1", "groups": [0]}),
        )
        .await;
    assert_eq!(
        (r.status, r.body["error"]["code"].clone()),
        (409, json!("member_change_refused")),
        "{}",
        r.body
    );
    assert!(
        r.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("node 401 at 127.0.0.1:1 acknowledged nothing"),
        "{}",
        r.body
    );
    let m = admin.get("/v1/admin/members").await;
    let meta = &m.body["groups"][0]["members"];
    let role_of = |id: u64| {
        meta.as_array()
            .unwrap()
            .iter()
            .find(|x| x["node_id"] == id)
            .map(|x| x["role"].clone())
    };
    assert_eq!(
        (role_of(1), role_of(401)),
        (Some(json!("voter")), Some(json!("learner"))),
        "{}",
        m.body
    );
    let s = http.session("after-learner", 10).await;
    let r = http
        .acquire(
            "payouts/after-learner",
            json!({"session_id": s, "owner": "o"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let gone = admin.delete("/v1/admin/members/401").await;
    assert_eq!(gone.status, 200, "{}", gone.body);

    // Draining the only node: no voter could take its groups, so the call does not wait for
    // one (it waited its full 20 s, longer than schemathesis's request timeout).
    let started = Instant::now();
    let d = admin.post("/v1/admin/members/1:drain", json!({})).await;
    assert_eq!(d.status, 200, "{}", d.body);
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    let u = admin.post("/v1/admin/members/1:undrain", json!({})).await;
    assert_eq!(u.status, 200, "{}", u.body);
    c.stop_all().await;
}

/// Every replica applies the same events, so contention is counted where the group's leader
/// applied them: summed over the three nodes, three releases count three, not nine; likewise a
/// granted waiter, a timed-out wait and a closed session count once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_counts_each_event_once_across_replicas() {
    let mut c = cluster(3, 1).await;
    let h = Http::new(c.url(0, ""));
    let s = h.session("counted", 15).await;
    for i in 0..3 {
        let name = format!("counted-{i}");
        let r = h.acquire(&name, json!({"session_id": s})).await;
        let token = r.body["token"].as_u64().expect("granted");
        assert_eq!(h.release(&name, &s, token).await.status, 200);
    }
    // One wait that times out and one that is granted.
    let w = h.session("waiter", 15).await;
    let token = h.acquire("counted-w", json!({"session_id": s})).await.body["token"]
        .as_u64()
        .unwrap();
    let r = h
        .acquire("counted-w", json!({"session_id": w, "wait_ms": 100}))
        .await;
    assert_eq!(r.body["acquired"], false, "{}", r.body);
    let waiting = {
        let (h, w) = (h.clone(), w.clone());
        tokio::spawn(async move {
            h.acquire("counted-w", json!({"session_id": w, "wait_ms": 20_000}))
                .await
        })
    };
    wait_until_queued(&h, "counted-w").await;
    assert_eq!(h.release("counted-w", &s, token).await.status, 200);
    assert_eq!(waiting.await.unwrap().body["acquired"], true);
    assert_eq!(h.delete(&format!("/v1/sessions/{w}")).await.status, 200);
    let want = [
        (
            "lockd_lock_holds_ended_total{namespace=\"default\",cause=\"release\"} ",
            4,
        ),
        ("lockd_waiters_granted_total ", 1),
        ("lockd_waits_timed_out_total ", 1),
        ("lockd_sessions_closed_total ", 1),
    ];
    let sum = |texts: &[String], line: &str| -> u64 {
        texts
            .iter()
            .flat_map(|t| t.lines())
            .filter_map(|l| l.strip_prefix(line))
            .map(|v| v.parse::<u64>().unwrap())
            .sum()
    };
    let scrape = || async {
        let mut texts = Vec::new();
        for i in 0..3 {
            let m = Http::new(c.url(i, "")).admin().get("/metrics").await;
            texts.push(m.body.as_str().unwrap().to_string());
        }
        texts
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let texts = scrape().await;
        if want.iter().all(|(line, n)| sum(&texts, line) >= *n) {
            break;
        }
        assert!(Instant::now() < deadline, "never counted {want:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The followers have applied the same entries by now or soon: still once each.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let texts = scrape().await;
    for (line, n) in want {
        assert_eq!(sum(&texts, line), n, "{line}");
    }
    c.stop_all().await;
}

/// `GET /v1/admin/cluster/status` (what `lockctl status --cluster` shows): one node gathers
/// every member node's own report over the peer port; a stopped node is listed with an error,
/// and the call needs the admin credential.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_status_reports_every_member_and_names_one_that_does_not_answer() {
    let mut c = cluster(3, 2).await;
    let h = Http::new(c.url(0, ""));
    assert_eq!(h.get("/v1/admin/cluster/status").await.status, 401);
    let r = h.admin().get("/v1/admin/cluster/status").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let nodes = r.body["nodes"].as_array().unwrap().clone();
    let ids: Vec<u64> = nodes
        .iter()
        .map(|n| n["node_id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, vec![1, 2, 3], "{}", r.body);
    for n in &nodes {
        let report = &n["report"];
        assert_eq!(report["node_id"], n["node_id"], "{n}");
        assert_eq!(report["version"], env!("CARGO_PKG_VERSION"), "{n}");
        let replicas = report["replicas"].as_array().unwrap();
        let groups: Vec<u64> = replicas
            .iter()
            .map(|x| x["group"].as_u64().unwrap())
            .collect();
        assert_eq!(groups, vec![0, 1, 2], "{n}");
        for x in replicas {
            assert!(x["applied_index"].as_u64().unwrap() > 0, "{n}");
            assert!(
                ["leader", "follower"].contains(&x["role"].as_str().unwrap()),
                "{n}"
            );
        }
    }
    // Each group has exactly one leader among the reports.
    for g in 0..3u64 {
        let leaders = nodes
            .iter()
            .flat_map(|n| n["report"]["replicas"].as_array().unwrap().clone())
            .filter(|x| x["group"] == g && x["role"] == "leader")
            .count();
        assert_eq!(leaders, 1, "group {g}: {}", r.body);
    }

    c.stop(2).await;
    let r = h.admin().get("/v1/admin/cluster/status").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let third = &r.body["nodes"][2];
    assert_eq!(third["node_id"], 3, "{}", r.body);
    assert!(
        third["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{}",
        r.body
    );
    assert!(r.body["nodes"][0]["report"].is_object(), "{}", r.body);
    // With two of three nodes down no group has a leader: the status still comes, at once.
    c.stop(1).await;
    let asked = Instant::now();
    let r = h.admin().get("/v1/admin/cluster/status").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        asked.elapsed() < Duration::from_secs(8),
        "{:?}",
        asked.elapsed()
    );
    let errors = (r.body["nodes"].as_array().unwrap().iter())
        .filter(|n| n["error"].is_string())
        .count();
    assert_eq!(errors, 2, "{}", r.body);
    c.stop_all().await;
}
