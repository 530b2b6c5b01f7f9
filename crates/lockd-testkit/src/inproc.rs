//! Real lockd nodes on port 0 in the test's own process (`lockd_server::start`), with the test
//! namespaces and the admin token: for tests that look inside a node (its `Service`, its
//! groups' state hashes) or stop one without a process. lockd-server's API tests use it.

use std::collections::BTreeMap;
use std::time::Duration;

use lockd_core::{Namespace, SafetyClass};
use lockd_raft::NodeConfig;
use lockd_server::config::token_digest;
use lockd_server::{Running, ServerConfig};
use serde_json::{json, Value};
use tokio::net::TcpListener;

pub const SECURE_TOKEN: &str = "secure-token-1";
pub const OTHER_TOKEN: &str = "other-token-12";
/// The admin credential every test node has (the same as the process clusters').
pub use crate::ports::{low_tokio_listener, rebind};
pub use crate::ADMIN_TOKEN;

fn ns(name: &str, f: impl FnOnce(&mut Namespace)) -> Namespace {
    let mut n = Namespace::default_namespace();
    n.name = name.into();
    n.prefix = format!("{name}/");
    f(&mut n);
    n
}

/// The namespaces every test node has.
pub fn namespaces() -> Vec<Namespace> {
    vec![
        Namespace::default_namespace(),
        // Short leases and a lock-delay, to watch expiry within a test.
        ns("fast", |n| {
            n.min_ttl_ms = 1_000;
            n.default_ttl_ms = 2_000;
            n.max_ttl_ms = 3_000;
            n.lock_delay_ms = 1_500;
        }),
        ns("tight", |n| {
            n.max_waiters_per_name = 1;
            n.max_locks_per_session = 2;
        }),
        ns("limited", |n| n.ops_per_s = 3),
        ns("secure", |n| {
            n.token_sha256 = Some(token_digest(SECURE_TOKEN));
            n.safety = SafetyClass::Correctness {
                fenced_resource: "test store".into(),
            };
        }),
        ns("other", |n| {
            n.token_sha256 = Some(token_digest(OTHER_TOKEN))
        }),
    ]
}

pub struct Cluster {
    pub nodes: Vec<Option<Running>>,
    pub dirs: Vec<tempfile::TempDir>,
    /// Its client ports speak TLS.
    pub tls: bool,
}

/// `n` nodes of one cluster, each hosting every group, on loopback port 0.
pub async fn cluster(n: usize, lock_groups: u32) -> Cluster {
    placed_cluster(n, lock_groups, 0).await
}

/// `n` nodes with each lock group placed on `replicas` of them (`lockd_raft::initial_placement`).
/// In TLS mode ([`tls_mode`]) every port speaks TLS, the peers' mutually.
pub async fn placed_cluster(n: usize, lock_groups: u32, replicas: usize) -> Cluster {
    let tls = tls_mode().then(|| TlsSetup {
        pki: test_pki(),
        client_certs: false,
    });
    cluster_with(n, lock_groups, replicas, tls).await
}

/// A reqwest client builder that trusts the test CA in TLS mode.
pub fn http_client() -> reqwest::ClientBuilder {
    let b = reqwest::Client::builder();
    if !tls_mode() {
        return b;
    }
    let ca = std::fs::read(&test_pki().ca).unwrap();
    b.add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
}

/// Whether this test process runs its in-process clusters over TLS (`LOCKD_TEST_TLS=1`):
/// `scripts/verify` runs the API suites a second time that way. [`Cluster::url`],
/// [`Cluster::grpc_channel`] and [`Http`] follow it.
pub fn tls_mode() -> bool {
    std::env::var("LOCKD_TEST_TLS").is_ok_and(|v| v == "1")
}

/// The one CA and node certificates (ids 1..=9) of a TLS-mode test process.
pub fn test_pki() -> &'static Pki {
    static PKI: std::sync::OnceLock<Pki> = std::sync::OnceLock::new();
    PKI.get_or_init(|| pki(9))
}

/// A throwaway CA and one certificate per node (`lockd dev --tls`'s), for localhost and
/// 127.0.0.1, each naming `node-<id>.lockd` and usable as server and client.
pub struct Pki {
    pub dir: tempfile::TempDir,
    pub ca: std::path::PathBuf,
    pub certs: Vec<lockd_server::tls::DevCert>,
}

pub fn pki(n: usize) -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<u64> = (1..=n as u64).collect();
    let (ca, certs) = lockd_server::tls::dev_certificates(
        &dir.path().join("tls"),
        &ids,
        &["127.0.0.1".parse().unwrap()],
    )
    .unwrap();
    Pki { dir, ca, certs }
}

/// How a test cluster speaks TLS: mutual TLS between the nodes from `pki`, TLS on the client
/// ports, and client certificates of the same CA required there if `client_certs`.
pub struct TlsSetup<'a> {
    pub pki: &'a Pki,
    pub client_certs: bool,
}

/// `n` nodes as [`placed_cluster`] makes them, over TLS if `tls` says so.
pub async fn cluster_with(
    n: usize,
    lock_groups: u32,
    replicas: usize,
    tls: Option<TlsSetup<'_>>,
) -> Cluster {
    zoned_cluster_with(n, lock_groups, replicas, 0, tls).await
}

/// [`placed_cluster`] over `zones` zones, `z1`..: node i in zone `z((i-1) mod zones + 1)`, as
/// `lockd dev --nodes N --zones Z` lays them out (`--initial-zones` on every founder).
pub async fn zoned_cluster(n: usize, lock_groups: u32, replicas: usize, zones: usize) -> Cluster {
    zoned_cluster_with(n, lock_groups, replicas, zones, None).await
}

async fn zoned_cluster_with(
    n: usize,
    lock_groups: u32,
    replicas: usize,
    zones: usize,
    tls: Option<TlsSetup<'_>>,
) -> Cluster {
    let zone_of = |i: usize| format!("z{}", i % zones.max(1) + 1);
    let founder_zones: lockd_raft::Zones = match zones {
        0 => Default::default(),
        _ => (0..n).map(|i| (i as u64 + 1, zone_of(i))).collect(),
    };
    let mut https = Vec::new();
    let mut grpcs = Vec::new();
    let mut peer_listeners = Vec::new();
    let mut peers = BTreeMap::new();
    for i in 0..n {
        https.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
        grpcs.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
        // Below the ephemeral range: a restarted node binds its peer address again.
        let p = low_tokio_listener();
        peers.insert(i as u64 + 1, p.local_addr().unwrap().to_string());
        peer_listeners.push(p);
    }
    let mut dirs = Vec::new();
    let mut starts = Vec::new();
    let listeners = https.into_iter().zip(grpcs).zip(peer_listeners);
    for (i, ((http, grpc), peer)) in listeners.enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let mut node = NodeConfig::new(i as u64 + 1, dir.path(), peers.clone());
        node.lock_groups = lock_groups;
        node.replicas = replicas;
        node.founder_zones = founder_zones.clone();
        node.zone = founder_zones
            .get(&(i as u64 + 1))
            .cloned()
            .unwrap_or_default();
        let mut client_tls = None;
        if let Some(t) = &tls {
            let files = &t.pki.certs[i];
            let read = |p: &std::path::Path| std::fs::read(p).unwrap();
            node.peer_tls = Some(lockd_raft::PeerTls {
                ca_pem: read(&t.pki.ca),
                cert_pem: read(&files.cert),
                key_pem: read(&files.key),
            });
            let ca = t.client_certs.then_some(t.pki.ca.as_path());
            client_tls =
                Some(lockd_server::tls::ClientTls::load(&files.cert, &files.key, ca).unwrap());
        }
        dirs.push(dir);
        starts.push(start_node_tls(node, http, grpc, peer, client_tls));
    }
    let nodes = futures::future::join_all(starts)
        .await
        .into_iter()
        .map(Some)
        .collect();
    let c = Cluster {
        nodes,
        dirs,
        tls: tls.is_some(),
    };
    c.wait_ready().await;
    c
}

/// One node with the test namespaces and the admin token, on the given listeners.
pub async fn start_node(
    node: NodeConfig,
    http: TcpListener,
    grpc: TcpListener,
    peer: TcpListener,
) -> Running {
    start_node_tls(node, http, grpc, peer, None).await
}

/// [`start_node`] with TLS on the client ports.
pub async fn start_node_tls(
    node: NodeConfig,
    http: TcpListener,
    grpc: TcpListener,
    peer: TcpListener,
    tls: Option<lockd_server::tls::ClientTls>,
) -> Running {
    start_node_with(node, [http, grpc, peer], tls, namespaces()).await
}

/// The peer secret of every in-process test node whose peer port is plain text, as
/// `lockd dev` gives its nodes one: a forger on the peer port needs it (`tests/ports.rs`).
pub const TEST_PEER_SECRET: &str = "test-peer-secret-0123456789abcdef";

/// One node with `namespaces` as its config file and the admin token, on the given
/// listeners (HTTP, gRPC, peer); a plain-text peer port gets [`TEST_PEER_SECRET`].
pub async fn start_node_with(
    mut node: NodeConfig,
    [http, grpc, peer]: [TcpListener; 3],
    tls: Option<lockd_server::tls::ClientTls>,
    namespaces: Vec<Namespace>,
) -> Running {
    if node.peer_tls.is_none() && node.peer_secret.is_none() {
        node.peer_secret = Some(TEST_PEER_SECRET.into());
    }
    lockd_server::start(ServerConfig {
        node,
        http,
        grpc,
        peer,
        namespaces,
        audit_log: None,
        admin_token: Some(ADMIN_TOKEN.into()),
        tls,
        max_client_connections: lockd_server::conns::DEFAULT_MAX_CLIENT_CONNECTIONS,
        client_idle_timeout: lockd_server::conns::IDLE_TIMEOUT,
        auth_failure_burst: lockd_server::authfail::BURST,
        session_opens_per_address: lockd_server::opens::PER_S,
        probes: None,
    })
    .await
    .unwrap()
}

/// A one-node cluster whose client ports each hold at most `max_client_connections`
/// connections at once, serving names, with a probes port (`Running::probes_addr`).
pub async fn single_node_capped(max_client_connections: u32) -> (Running, tempfile::TempDir) {
    single_node_capped_tls(max_client_connections, None).await
}

/// [`single_node_capped`] with TLS on the client ports when `tls` is given.
pub async fn single_node_capped_tls(
    max_client_connections: u32,
    tls: Option<lockd_server::tls::ClientTls>,
) -> (Running, tempfile::TempDir) {
    let limits = Limits {
        max_client_connections,
        ..Limits::default()
    };
    single_node_limited(limits, tls).await
}

/// A test node's client-port limits (the `ServerConfig` fields of the same names).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_client_connections: u32,
    pub session_opens_per_address: u32,
    pub client_idle_timeout: Duration,
}

impl Default for Limits {
    /// The defaults of `lockd`.
    fn default() -> Limits {
        Limits {
            max_client_connections: lockd_server::conns::DEFAULT_MAX_CLIENT_CONNECTIONS,
            session_opens_per_address: lockd_server::opens::PER_S,
            client_idle_timeout: lockd_server::conns::IDLE_TIMEOUT,
        }
    }
}

/// [`single_node_capped_tls`] under `limits`.
pub async fn single_node_limited(
    limits: Limits,
    tls: Option<lockd_server::tls::ClientTls>,
) -> (Running, tempfile::TempDir) {
    let bind = || TcpListener::bind("127.0.0.1:0");
    let (http, grpc, peer, probes) = (
        bind().await.unwrap(),
        bind().await.unwrap(),
        low_tokio_listener(),
        bind().await.unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    let peers = BTreeMap::from([(1, peer.local_addr().unwrap().to_string())]);
    let mut node = NodeConfig::new(1, dir.path(), peers);
    node.peer_secret = Some(TEST_PEER_SECRET.into());
    let r = lockd_server::start(ServerConfig {
        node,
        http,
        grpc,
        peer,
        namespaces: namespaces(),
        audit_log: None,
        admin_token: Some(ADMIN_TOKEN.into()),
        tls,
        max_client_connections: limits.max_client_connections,
        client_idle_timeout: limits.client_idle_timeout,
        auth_failure_burst: lockd_server::authfail::BURST,
        session_opens_per_address: limits.session_opens_per_address,
        probes: Some(probes),
    })
    .await
    .unwrap();
    wait_serving(&r).await;
    (r, dir)
}

/// Waits (up to 20 s) until `r` serves names: its meta replica has caught up since it started
/// (until then every name and session call is a 503, by design).
pub async fn wait_serving(r: &Running) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !r.service.meta_caught_up() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "node {} does not serve names 20 s after its start",
            r.service.node.node_id()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts node `id` as a joiner of `c` (`--initial-cluster-state existing`, one lock group),
/// with Raft timing `(heartbeat, election min, election max)`.
pub async fn joiner(c: &Cluster, id: u64, timing: (u64, u64, u64)) -> (Running, tempfile::TempDir) {
    let bind = || TcpListener::bind("127.0.0.1:0");
    let (http, grpc, peer) = (
        bind().await.unwrap(),
        bind().await.unwrap(),
        low_tokio_listener(),
    );
    let mut peers: BTreeMap<u64, String> = c
        .nodes
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, r)| (i as u64 + 1, r.peer_addr.to_string()))
        .collect();
    peers.insert(id, peer.local_addr().unwrap().to_string());
    let dir = tempfile::tempdir().unwrap();
    let mut node = NodeConfig::new(id, dir.path(), peers);
    node.join_existing = true;
    node.heartbeat_ms = timing.0;
    node.election_timeout_ms = (timing.1, timing.2);
    (start_node(node, http, grpc, peer).await, dir)
}

impl Cluster {
    pub fn url(&self, i: usize, path: &str) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!(
            "{scheme}://{}{}",
            self.nodes[i].as_ref().unwrap().http_addr,
            path
        )
    }

    /// A gRPC channel to node `i`'s client port (over TLS, trusting the test CA, if the
    /// cluster speaks it).
    pub async fn grpc_channel(&self, i: usize) -> tonic::transport::Channel {
        self.grpc_endpoint(i).connect().await.unwrap()
    }

    /// [`Cluster::grpc_channel`]'s endpoint, to set more options on.
    pub fn grpc_endpoint(&self, i: usize) -> tonic::transport::Endpoint {
        let addr = self.node(i).grpc_addr;
        if self.tls {
            let ca = std::fs::read(&test_pki().ca).unwrap();
            let tls = tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(ca))
                .domain_name("localhost");
            tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
                .unwrap()
                .tls_config(tls)
                .unwrap()
        } else {
            tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap()
        }
    }

    pub fn node(&self, i: usize) -> &Running {
        self.nodes[i].as_ref().unwrap()
    }

    /// Every group has a leader and the namespaces are in place everywhere.
    pub async fn wait_ready(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let mut ready = true;
            for r in self.nodes.iter().flatten() {
                // A node serves names once its meta replica has caught up (fail closed).
                ready &= r.service.meta_caught_up();
                let node = &r.service.node;
                for g in node.group_ids() {
                    let group = node.group(g).unwrap();
                    let has_ns = group.read_local(|t| t.namespaces().count() == namespaces().len());
                    let meta_map = g != 0 || group.read_local(|t| t.shard_map().is_some());
                    ready &= group.status().leader.is_some() && has_ns && meta_map;
                }
            }
            if ready {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "cluster not ready in 30 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// State hashes of every group on node `i`.
    pub fn hashes(&self, i: usize) -> Vec<u64> {
        let node = &self.node(i).service.node;
        node.group_ids()
            .into_iter()
            .map(|g| node.group(g).unwrap().state_hash())
            .collect()
    }

    pub async fn stop(&mut self, i: usize) {
        if let Some(r) = self.nodes[i].take() {
            r.stop().await;
        }
    }

    pub async fn stop_all(&mut self) {
        for i in 0..self.nodes.len() {
            self.stop(i).await;
        }
    }
}

/// A tiny HTTP client that returns (status, JSON body, Retry-After).
#[derive(Clone)]
pub struct Http {
    client: reqwest::Client,
    pub base: String,
    pub token: Option<String>,
}

pub struct Resp {
    pub status: u16,
    pub body: Value,
    pub retry_after: Option<String>,
}

impl Http {
    /// A client of `base`; an `https://` base is trusted through the test CA ([`test_pki`]).
    pub fn new(base: String) -> Http {
        // A bound on every call: a request the server never answers fails naming itself,
        // instead of hanging the test until the runner kills it.
        let limit = Duration::from_secs(90);
        let client = if base.starts_with("https://") {
            http_client().timeout(limit).build().unwrap()
        } else {
            reqwest::Client::builder().timeout(limit).build().unwrap()
        };
        Http {
            client,
            base,
            token: None,
        }
    }

    /// The same client, presenting the admin token.
    pub fn admin(&self) -> Http {
        self.with_token(ADMIN_TOKEN)
    }

    pub fn with_token(&self, token: &str) -> Http {
        Http {
            token: Some(token.into()),
            ..self.clone()
        }
    }

    async fn send(&self, rb: reqwest::RequestBuilder) -> Resp {
        let rb = match &self.token {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        };
        let r = rb.send().await.unwrap_or_else(|e| panic!("{e}"));
        let status = r.status().as_u16();
        let retry_after = r
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string());
        let text = r.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Resp {
            status,
            body,
            retry_after,
        }
    }

    pub async fn post(&self, path: &str, body: Value) -> Resp {
        self.send(
            self.client
                .post(format!("{}{}", self.base, path))
                .json(&body),
        )
        .await
    }

    pub async fn post_raw(&self, path: &str, body: Vec<u8>) -> Resp {
        self.send(
            self.client
                .post(format!("{}{}", self.base, path))
                .body(body),
        )
        .await
    }

    pub async fn get(&self, path: &str) -> Resp {
        self.send(self.client.get(format!("{}{}", self.base, path)))
            .await
    }

    pub async fn delete(&self, path: &str) -> Resp {
        self.send(self.client.delete(format!("{}{}", self.base, path)))
            .await
    }

    /// Opens a session; panics unless 200.
    pub async fn session(&self, client: &str, ttl_s: u64) -> String {
        self.session_in(client, ttl_s, "").await
    }

    pub async fn session_in(&self, client: &str, ttl_s: u64, namespace: &str) -> String {
        let r = self
            .post(
                "/v1/sessions",
                json!({"client": client, "ttl_s": ttl_s, "namespace": namespace}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        r.body["session_id"].as_str().unwrap().to_string()
    }

    pub async fn acquire(&self, name: &str, body: Value) -> Resp {
        self.post(&format!("/v1/locks/{}:acquire", enc(name)), body)
            .await
    }

    pub async fn release(&self, name: &str, session: &str, token: u64) -> Resp {
        self.post(
            &format!("/v1/locks/{}:release", enc(name)),
            json!({"session_id": session, "token": token}),
        )
        .await
    }

    pub async fn inspect_status(&self, name: &str) -> u16 {
        self.get(&format!("/v1/locks/{}", enc(name))).await.status
    }

    pub async fn inspect(&self, name: &str) -> Value {
        let r = self.get(&format!("/v1/locks/{}", enc(name))).await;
        assert_eq!(r.status, 200, "{}", r.body);
        r.body
    }
}

/// Waits (up to 10 s) until `name` has a queued waiter, as `admin` (an admin client) sees it.
pub async fn wait_until_queued(admin: &Http, name: &str) {
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    while admin.inspect(name).await["waiters"]
        .as_array()
        .map_or(0, Vec::len)
        == 0
    {
        assert!(
            std::time::Instant::now() < give_up,
            "no waiter of {name} queued in 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Percent-encodes a lock name for a path segment.
pub fn enc(name: &str) -> String {
    let mut out = String::new();
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
