//! Test harness: in-process nodes, each serving the peer service on a real loopback socket.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockd_core::{Effect, LockMode, Op, Rejection, Reply, SessionId};
use lockd_raft::{EffectSink, Group, GroupError, GroupId, Node, NodeConfig, NodeId};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const G: GroupId = 1;

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// Every effect applied on one node, with the local time it was seen.
#[derive(Default)]
pub struct Recorder {
    pub events: Mutex<Vec<(GroupId, Effect, Instant)>>,
}

impl EffectSink for Recorder {
    fn applied(&self, group: GroupId, effects: &[Effect]) {
        let now = Instant::now();
        let mut ev = self.events.lock().unwrap();
        ev.extend(effects.iter().map(|e| (group, e.clone(), now)));
    }
}

impl Recorder {
    pub fn granted(&self, session: SessionId, name: &str) -> Option<(u64, Instant)> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .find_map(|(_, e, at)| match e {
                Effect::Granted {
                    session: s,
                    name: n,
                    token,
                    ..
                } if *s == session && &**n == name => Some((*token, *at)),
                _ => None,
            })
    }
}

pub struct TestNode {
    pub id: NodeId,
    pub node: Arc<Node>,
    pub sink: Arc<Recorder>,
    pub cfg: NodeConfig,
    stop_server: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<()>>,
}

impl TestNode {
    pub fn group(&self) -> Arc<Group> {
        self.node.group(G).unwrap()
    }

    /// As close to SIGKILL as in-process allows: Raft stopped, listener and connections gone.
    pub async fn stop(mut self) -> NodeConfig {
        self.node.shutdown().await;
        if let Some(tx) = self.stop_server.take() {
            let _ = tx.send(());
        }
        if let Some(mut h) = self.server.take() {
            if tokio::time::timeout(Duration::from_secs(2), &mut h)
                .await
                .is_err()
            {
                h.abort();
            }
        }
        self.cfg.clone()
    }
}

/// Reserves `n` loopback addresses, below Linux's ephemeral range (32768+): a node restarted
/// on its address must not find it taken by some client's outgoing connection meanwhile.
pub async fn free_addrs(n: usize) -> Vec<String> {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
        ^ std::process::id();
    let mut ls = Vec::new();
    let mut i = 0u32;
    while ls.len() < n {
        assert!(i < 12_000, "no free loopback port in 20000..32000");
        let port = 20_000 + (seed.wrapping_add(i.wrapping_mul(7919)) % 12_000) as u16;
        i += 1;
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            ls.push(l);
        }
    }
    ls.iter()
        .map(|l| l.local_addr().unwrap().to_string())
        .collect()
}

pub fn configs(dir: &Path, addrs: &[String], tweak: impl Fn(&mut NodeConfig)) -> Vec<NodeConfig> {
    let peers: BTreeMap<NodeId, String> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| (i as NodeId + 1, a.clone()))
        .collect();
    peers
        .keys()
        .map(|&id| {
            let mut c = NodeConfig::new(id, dir.join(format!("node-{id}")), peers.clone());
            tweak(&mut c);
            c
        })
        .collect()
}

pub async fn start(cfg: NodeConfig) -> TestNode {
    let addr = cfg.peers[&cfg.node_id].clone();
    // The address was just released (or the node is restarting on it): retry briefly.
    let deadline = Instant::now() + Duration::from_secs(5);
    let listener = loop {
        match TcpListener::bind(&addr).await {
            Ok(l) => break l,
            Err(e) if Instant::now() < deadline => {
                eprintln!("bind {addr}: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("bind {addr}: {e}"),
        }
    };
    let sink = Arc::new(Recorder::default());
    let node = Node::start(cfg.clone(), sink.clone())
        .await
        .expect("node starts");
    let (tx, rx) = oneshot::channel::<()>();
    let svc = node.peer_service();
    let server = tokio::spawn(async move {
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let _ = tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming_shutdown(incoming, async {
                let _ = rx.await;
            })
            .await;
    });
    TestNode {
        id: cfg.node_id,
        node,
        sink,
        cfg,
        stop_server: Some(tx),
        server: Some(server),
    }
}

pub async fn start_cluster(dir: &Path, n: usize, tweak: impl Fn(&mut NodeConfig)) -> Vec<TestNode> {
    let addrs = free_addrs(n).await;
    let mut nodes = Vec::new();
    for cfg in configs(dir, &addrs, tweak) {
        nodes.push(start(cfg).await);
    }
    if nodes[0].cfg.balance_leaders {
        balanced(&nodes).await;
    }
    nodes
}

/// Waits until every group is led, with duties, by its preferred leader (as a cluster settles a
/// few seconds after start), so that a test's leader stays put unless the test moves it.
pub async fn balanced(nodes: &[TestNode]) {
    let groups = nodes[0].cfg.lock_groups;
    eventually("balanced leaders", Duration::from_secs(30), || {
        (0..=groups)
            .all(|g| {
                let st: Vec<_> = nodes
                    .iter()
                    .map(|n| n.node.group(g).unwrap().status())
                    .collect();
                let want = st[0].preferred_leader.or(st[0].leader);
                want.is_some()
                    && st.iter().all(|s| s.leader == want)
                    && st
                        .iter()
                        .any(|s| s.is_leader && s.tracked_sessions.is_some())
            })
            .then_some(())
    })
    .await
}

/// Polls `f` until it returns `Some`, or panics after `timeout`.
pub async fn eventually<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The index (into `nodes`) of the group's leader, once one has working leader duties.
pub async fn leader_of(nodes: &[TestNode]) -> usize {
    eventually("a leader", Duration::from_secs(20), || {
        nodes.iter().position(|n| {
            let s = n.group().status();
            s.is_leader && s.tracked_sessions.is_some()
        })
    })
    .await
}

/// Waits until every node has applied the same index and holds the same state.
pub async fn converged(nodes: &[TestNode]) -> u64 {
    eventually("replicas to converge", Duration::from_secs(30), || {
        let st: Vec<_> = nodes
            .iter()
            .map(|n| (n.group().status().applied_index, n.group().state_hash()))
            .collect();
        st.windows(2).all(|w| w[0] == w[1]).then(|| st[0].0)
    })
    .await
}

pub fn open_op(session: SessionId, ttl_ms: u64, namespace: &str) -> Op {
    Op::OpenSession {
        session,
        client: format!("test-{}", session.0),
        ttl_ms,
        namespace: namespace.into(),
    }
}

pub fn acquire_op(session: SessionId, name: &str, wait_ms: u64) -> Op {
    Op::Acquire {
        session,
        name: name.into(),
        owner: format!("owner-{}", session.0),
        mode: LockMode::Exclusive,
        wait_ms,
        reentrant: false,
    }
}

/// Proposes and insists on a committed, non-rejected reply.
pub async fn ok(group: &Group, op: Op) -> Reply {
    match group.propose(op.clone()).await {
        Ok(Ok(r)) => r,
        other => panic!("{op:?} -> {other:?}"),
    }
}

pub async fn try_propose(group: &Group, op: Op) -> Result<Result<Reply, Rejection>, GroupError> {
    group.propose(op).await
}

pub fn token(r: &Reply) -> u64 {
    match r {
        Reply::Acquired { token, .. } => *token,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

pub fn tail_chunk(log_dir: &Path) -> PathBuf {
    let mut files: Vec<_> = std::fs::read_dir(log_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .collect();
    files.sort();
    files.pop().expect("a wal chunk")
}
