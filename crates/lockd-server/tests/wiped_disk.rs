//! A node's identity lives and dies with its disk. A voter that lost its data dir and comes
//! back under its old id has forgotten its log and its vote: it could vote twice in one term,
//! or help elect a leader that lacks a commit. The cluster records every node's data dir
//! incarnation in the meta group; such a node is refused at its start, with the fix, and its
//! peers refuse its calls.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use lockd_raft::NodeConfig;
use lockd_server::ServerConfig;
use tokio::net::TcpListener;

/// Waits (up to 20 s) until node `i`'s meta replica has recorded `n` incarnations.
async fn incarnations_recorded(c: &Cluster, i: usize, n: usize) -> BTreeMap<u64, u64> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let meta = c
            .node(i)
            .service
            .node
            .group(0)
            .expect("every node hosts the meta group");
        let known = meta.read_local(|t| t.incarnations().clone());
        if known.len() >= n {
            return known;
        }
        assert!(
            Instant::now() < deadline,
            "only {known:?} recorded after 20 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_disk_under_its_old_id_is_refused_with_the_fix_and_nothing_is_lost() {
    let mut c = cluster(3, 1).await;
    let h = Http::new(c.url(1, ""));
    let s = h.session("holder", 15).await;
    let got = h
        .acquire(
            "kept",
            serde_json::json!({"session_id": s, "owner": "holder", "wait_ms": 0}),
        )
        .await;
    assert_eq!(got.body["acquired"], true, "{}", got.body);
    let known = incarnations_recorded(&c, 1, 3).await;
    let old = c.node(0).service.node.incarnation();
    assert_eq!(known.get(&1), Some(&old), "{known:?}");

    // Node 1 dies and its disk is replaced; it is started again with the same flags.
    let peers: BTreeMap<u64, String> = (0..3)
        .map(|i| (i as u64 + 1, c.node(i).peer_addr.to_string()))
        .collect();
    let peer_addr = c.node(0).peer_addr;
    c.stop(0).await;
    let dir = c.dirs[0].path().to_path_buf();
    std::fs::remove_dir_all(&dir).unwrap();
    let bind = || TcpListener::bind("127.0.0.1:0");
    let start = |peers: BTreeMap<u64, String>| {
        let dir = dir.clone();
        async move {
            let mut node = NodeConfig::new(1, &dir, peers);
            node.peer_secret = Some(TEST_PEER_SECRET.into());
            lockd_server::start(ServerConfig {
                node,
                http: bind().await.unwrap(),
                grpc: bind().await.unwrap(),
                peer: TcpListener::bind(peer_addr).await.unwrap(),
                namespaces: namespaces(),
                audit_log: None,
                admin_token: Some(ADMIN_TOKEN.into()),
                tls: None,
                max_client_connections: lockd_server::conns::DEFAULT_MAX_CLIENT_CONNECTIONS,
                client_idle_timeout: lockd_server::conns::IDLE_TIMEOUT,
                auth_failure_burst: lockd_server::authfail::BURST,
                session_opens_per_address: lockd_server::opens::PER_S,
                probes: None,
            })
            .await
        }
    };
    // Twice: a supervisor's restart is refused as the first start was.
    for _ in 0..2 {
        let started = Instant::now();
        let refused =
            match tokio::time::timeout(Duration::from_secs(15), start(peers.clone())).await {
                Ok(Err(e)) => format!("{e:#}"),
                Ok(Ok(_)) => panic!("a wiped disk under its old id started"),
                Err(_) => panic!("no refusal within 15 s"),
            };
        assert!(
            refused.contains("members replace 1 ") && refused.contains("lost its data"),
            "{refused}"
        );
        eprintln!("refused after {:?}: {refused}", started.elapsed());
        assert!(
            !dir.join("group-0").exists(),
            "the refused node opened a group"
        );
    }

    // Had the start-up question been missed (every peer down at the time), the peers stop the
    // node once they reach it: a dir that claims to be no new one, but is another incarnation.
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("identity"),
        "format = 1\ncluster = lockd\nnode_id = 1\nlock_groups = 1\nreplicas = 0\n\
         incarnation = 00000000000000ab\n",
    )
    .unwrap();
    let r = start(peers.clone())
        .await
        .expect("the dir's identity looks old: it starts");
    let stopped = tokio::time::timeout(Duration::from_secs(15), r.service.node.fatal())
        .await
        .expect("the wiped node was not stopped within 15 s");
    assert!(stopped.error.contains("members replace 1 "), "{stopped}");
    r.stop().await;

    // The two others serve on, with the lock kept.
    let still = h.get(&format!("/v1/locks/{}", enc("kept"))).await;
    assert_eq!(
        still.body["holders"][0]["owner"], "holder",
        "{}",
        still.body
    );
    let ready = Http::new(c.url(2, "")).get("/readyz").await;
    assert_eq!(ready.status, 200, "{}", ready.body);
}
