//! The peer port of `lockd dev` as a user runs it (default flags, plain text), tried from
//! outside by someone who can reach it but holds no credential: a forged namespace delete in
//! the meta group, a sweep that closes a victim's session, and a storm of vote requests from a
//! made-up node 9. Each is refused, and nothing changes: the namespace keeps its token, the
//! victim keeps its lock, `/readyz` stays 200. Once for one node and once for `--nodes 3`.
//!
//! Needs `target/debug/lockd`: `cargo build -p lockd-server --bin lockd` first.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use lockd_core::{Op, SessionId};
use lockd_raft::{PeerBook, PeerMethod, PeerPool, PeerTransport};
use serde_json::json;

/// A base port `b` with `b..b+3*n` all free: HTTP from `b`, gRPC from `b+n`, peers from `b+2n`.
fn free_block(n: u16) -> u16 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let mut rng = nanos ^ std::process::id().rotate_left(16);
    for _ in 0..500 {
        rng = rng.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let b = 20_000 + (rng >> 8) as u16 % 10_000;
        let held: Vec<_> = (b..b + 3 * n)
            .map_while(|p| std::net::TcpListener::bind(("127.0.0.1", p)).ok())
            .collect();
        if held.len() == usize::from(3 * n) {
            return b;
        }
    }
    panic!("no block of {} free ports", 3 * n)
}

/// `GET url/readyz`'s status, `None` if nothing answers.
async fn readyz(base: &str) -> Option<u16> {
    let c = http_client().build().unwrap();
    let r = c.get(format!("{base}/readyz")).send().await.ok()?;
    Some(r.status().as_u16())
}

/// One `lockd dev` at a time in this process: the two cases would share two cores (and
/// `lockd dev --nodes` needs blocks of consecutive ports).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn attack_dev(nodes: u16) {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let b = free_block(nodes);
    let at = |p: u16| format!("127.0.0.1:{p}");
    let log = dir.path().join("lockd.log");
    let data = dir.path().join("data");
    let args: Vec<String> = vec![
        "dev".into(),
        "--nodes".into(),
        nodes.to_string(),
        "--data-dir".into(),
        data.display().to_string(),
        "--http".into(),
        at(b),
        "--grpc".into(),
        at(b + nodes),
        "--peer".into(),
        at(b + 2 * nodes),
    ];
    let mut dev = lockd_testkit::Proc::spawn(&lockd_testkit::lockd_bin(), &args, &log).unwrap();
    let said = || std::fs::read_to_string(&log).unwrap_or_default();

    // Ready: every node's /readyz answers 200.
    let deadline = Instant::now() + Duration::from_secs(60);
    for i in 0..nodes {
        while readyz(&format!("http://{}", at(b + i))).await != Some(200) {
            assert!(Instant::now() < deadline, "lockd dev not ready: {}", said());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let token = std::fs::read_to_string(dir.path().join("data/admin-token")).unwrap();
    let anon = Http::new(format!("http://{}", at(b)));
    let admin = anon.with_token(token.trim());

    // A namespace with a token, and a victim holding a lock in the open namespace.
    // (The node seeds its namespaces as it starts: a version read meanwhile may be stale.)
    let mut r = None;
    for _ in 0..20 {
        let v = admin.get("/v1/admin/namespaces").await.body["version"]
            .as_u64()
            .unwrap();
        let put = json!({"expected_version": v,
                         "namespace": {"name": "payouts", "prefix": "payouts/"},
                         "bearer_token": "payouts-token-0123456789"});
        let got = admin.post("/v1/admin/namespaces", put).await;
        if got.status != 409 {
            r = Some(got);
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let r = r.expect("the namespace put kept meeting newer versions");
    assert_eq!(r.status, 200, "{}", r.body);
    let sid = anon.session("victim", 15).await;
    let got = anon
        .acquire(
            "victim/lock",
            json!({"session_id": sid, "owner": "victim", "wait_ms": 0}),
        )
        .await;
    assert_eq!(got.body["acquired"], true, "{}", got.body);
    let session = SessionId::parse(&sid).unwrap();

    // The attacker speaks the real protocol, as node 9 of cluster `lockd`, with no secret.
    let peers: BTreeMap<u64, String> = (0..nodes)
        .map(|i| (u64::from(i) + 1, at(b + 2 * nodes + i)))
        .collect();
    let forger = PeerPool::new(
        &peers,
        "lockd",
        9,
        None,
        std::sync::Arc::new(PeerBook::new(0, None)),
    )
    .unwrap();
    let payload = |op: &Op| postcard::to_allocvec(op).unwrap();
    let delete = payload(&Op::DeleteNamespace {
        prefix: "payouts/".into(),
    });
    let close = payload(&Op::CloseSession { session });
    let until = Instant::now() + Duration::from_secs(3);
    let mut refused = 0;
    while Instant::now() < until && refused < 3000 {
        for target in peers.keys() {
            for (method, group, body) in [
                (PeerMethod::Propose, 0, &delete),
                (PeerMethod::Propose, 1, &close),
                (PeerMethod::Vote, 1, &Vec::new()),
                (PeerMethod::Vote, 0, &Vec::new()),
            ] {
                let r = forger
                    .call(*target, method, group, body.clone(), Duration::from_secs(1))
                    .await;
                let st = r.expect_err("a forged peer call was served");
                assert_eq!(st.code(), tonic::Code::Unauthenticated, "{st:?}");
                refused += 1;
            }
        }
    }
    assert!(refused >= 4 * usize::from(nodes), "{refused}");

    // Nothing changed.
    let listed = admin.get("/v1/admin/namespaces").await.body;
    let payouts = listed["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "payouts")
        .cloned();
    assert_eq!(
        payouts.as_ref().map(|n| &n["token_required"]),
        Some(&json!(true)),
        "{listed}"
    );
    let held = anon.get(&format!("/v1/locks/{}", enc("victim/lock"))).await;
    assert_eq!(held.body["holders"][0]["owner"], "victim", "{}", held.body);
    assert_eq!(
        anon.post(&format!("/v1/sessions/{sid}:keepalive"), json!({}))
            .await
            .status,
        200
    );
    for i in 0..nodes {
        let ready = readyz(&format!("http://{}", at(b + i))).await;
        assert_eq!(ready, Some(200), "node {}", i + 1);
    }
    eprintln!("lockd dev --nodes {nodes}: {refused} forged calls refused, nothing changed");
    // SIGTERM, as Ctrl-C: `lockd dev --nodes N` stops its nodes with it.
    dev.terminate(Duration::from_secs(30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockd_dev_refuses_a_stranger_on_its_peer_port() {
    attack_dev(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockd_dev_with_three_nodes_refuses_a_stranger_on_its_peer_ports() {
    attack_dev(3).await;
}
