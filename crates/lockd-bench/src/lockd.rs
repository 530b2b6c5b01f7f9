//! lockd as a target: a cluster of the real `lockd serve` release binary, and three client
//! flavours (the gRPC session stream, gRPC unary calls, and the HTTP/JSON API).
//!
//! Why separate processes on loopback, fsync on: that is how users deploy it (3 replicas), and
//! how etcd runs beside it in the same table. Any node accepts any request and forwards
//! proposals to the group's leader; `Routing::Leader` instead sends each lock request straight
//! to the leader of the name's group, which shows what the forwarding hop costs.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hyper::{Method, StatusCode};
use lockd_core::ShardMap;
use lockd_proto::v1 as pb;
use lockd_proto::v1::lock_client::LockClient;
use serde::Deserialize;
use serde_json::json;
use tempfile::TempDir;
use tonic::transport::{Channel, Endpoint};

use crate::http::HttpConn;
use lockd_server::cli::ServeArgs;
use lockd_testkit::free_ports;

use crate::procs::{loopback, Server};
use crate::target::{LockTarget, Token};

/// How long a cluster gets to elect every group's leader (and a restarted node to catch up).
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The `lockd` binary: `--lockd-bin`/`LOCKD_BIN`, else next to this executable (the same
/// target dir and profile), else `$CARGO_TARGET_DIR/release/lockd`, else the workspace's
/// `target/release/lockd`.
pub fn find_binary(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        if p.is_file() {
            return Ok(p.to_owned());
        }
        bail!("lockd binary {} does not exist", p.display());
    }
    let mut tried = Vec::new();
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_owned))
    {
        tried.push(dir.join("lockd"));
    }
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        tried.push(PathBuf::from(t).join("release/lockd"));
    }
    tried.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/release/lockd"));
    for p in &tried {
        if p.is_file() {
            if p.components().any(|c| c.as_os_str() == "debug") {
                eprintln!(
                    "warning: {} is a debug build; numbers will be meaningless",
                    p.display()
                );
            }
            return Ok(p.clone());
        }
    }
    let tried: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
    bail!(
        "the lockd binary was not found (looked at {}); build it with \
         `cargo build --release -p lockd-server` (CARGO_TARGET_DIR is honoured) or pass --lockd-bin",
        tried.join(", ")
    )
}

/// One `lockd serve` process and how to start it again.
struct Node {
    id: u64,
    http: SocketAddr,
    grpc: SocketAddr,
    args: Vec<String>,
    server: Option<Server>,
}

/// A running cluster; dropping it stops every node by pid, then removes the data.
/// The admin bearer token of every bench cluster.
pub const ADMIN_TOKEN: &str = "lockd-bench-admin-token";

pub struct Cluster {
    // Field order matters: nodes stop before their data dir is removed.
    nodes: Vec<Node>,
    bin: PathBuf,
    groups: u32,
    starts: usize,
    /// A command that node `.0` runs under, its program first (e.g. valgrind and its flags).
    wrap: Option<(usize, Vec<String>)>,
    dir: TempDir,
}

/// `GET /v1/status`, the fields we use.
#[derive(Deserialize, Debug)]
pub struct Status {
    pub groups: Vec<GroupStatus>,
    /// Whether the node serves names yet (its meta replica caught up since it started).
    #[serde(default)]
    pub serving_names: bool,
}

#[derive(Deserialize, Debug)]
pub struct GroupStatus {
    pub id: u32,
    pub leader: u64,
    pub members: Vec<u64>,
    pub applied_index: u64,
    /// Where leader balance moves the group (`None`: balance off).
    #[serde(default)]
    pub preferred_leader: Option<u64>,
}

async fn status(addr: SocketAddr) -> Result<Status> {
    let mut c = HttpConn::connect(addr).await?;
    let (code, body) = c.request(Method::GET, "/v1/status", None).await?;
    if code != StatusCode::OK {
        bail!("{addr}: GET /v1/status: {code}");
    }
    Ok(serde_json::from_slice(&body)?)
}

/// How every node of a cluster is started.
#[derive(Clone, Copy, Debug, Default)]
pub struct ServerOpts {
    /// `--worker-threads` (`None`: lockd's default).
    pub threads: Option<u16>,
    /// `false` passes `--no-leader-balance`.
    pub leader_balance: bool,
    /// `--replicas` (0: every group on every node).
    pub replicas: usize,
    /// TLS on every port: client ports over TLS, mutual TLS between the nodes (certificates as
    /// `lockd dev --tls` makes them).
    pub tls: bool,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let addrs: Vec<SocketAddr> = self.nodes.iter().flat_map(|n| [n.http, n.grpc]).collect();
        crate::tls::unregister(&addrs);
    }
}

impl Cluster {
    /// Starts `n` nodes with `groups` lock groups (fsync is always on in lockd) and waits until
    /// every node sees the same leader for every group, the meta group included, and (with
    /// leader balance) each group is led by its preferred leader.
    pub async fn start(
        bin: &Path,
        data_root: &Path,
        n: usize,
        groups: u32,
        opts: ServerOpts,
    ) -> Result<Cluster> {
        Self::start_wrapped(bin, data_root, n, groups, opts, None).await
    }

    /// `start`, with node index `wrap.0` run under the command `wrap.1` (program first), the
    /// lockd binary and its arguments appended.
    pub async fn start_wrapped(
        bin: &Path,
        data_root: &Path,
        n: usize,
        groups: u32,
        opts: ServerOpts,
        wrap: Option<(usize, Vec<String>)>,
    ) -> Result<Cluster> {
        let dir = tempfile::Builder::new()
            .prefix("lockd-bench-lockd-")
            .tempdir_in(data_root)?;
        let ports = free_ports(3 * n);
        let (http, rest) = ports.split_at(n);
        let (grpc, peer) = rest.split_at(n);
        let peers: Vec<String> = (0..n)
            .map(|i| format!("{}=127.0.0.1:{}", i + 1, peer[i]))
            .collect();
        // An admin credential, for scenarios that call the admin API (bucket moves).
        let token_file = dir.path().join("admin-token");
        std::fs::write(&token_file, ADMIN_TOKEN)?;
        let certs = if opts.tls {
            let ids: Vec<u64> = (1..=n as u64).collect();
            let ips = [std::net::IpAddr::from([127, 0, 0, 1])];
            let (ca, certs) =
                lockd_server::tls::dev_certificates(&dir.path().join("tls"), &ids, &ips)?;
            let addrs: Vec<SocketAddr> = http.iter().chain(grpc).map(|p| loopback(*p)).collect();
            crate::tls::register(&addrs, std::fs::read(&ca)?)?;
            Some((ca, certs))
        } else {
            None
        };
        let mut cluster = Cluster {
            nodes: Vec::new(),
            bin: bin.to_owned(),
            groups,
            starts: 0,
            wrap,
            dir,
        };
        for i in 0..n {
            let id = i as u64 + 1;
            let mut serve = ServeArgs::new(
                id,
                peers.join(","),
                loopback(http[i]),
                loopback(grpc[i]),
                cluster.dir.path().join(format!("node-{id}")),
            );
            serve.common.groups = Some(groups);
            serve.common.admin_token_file = Some(token_file.clone());
            serve.common.worker_threads = opts.threads;
            serve.common.no_leader_balance = !opts.leader_balance;
            serve.common.replicas = opts.replicas;
            // The bench's clients stand for many hosts from one address (the scale bench
            // opens 20,000 sessions at once): no per-address open budget.
            serve.common.session_opens_per_address = 0;
            if let Some((ca, certs)) = &certs {
                let c = &mut serve.common;
                c.tls_cert_file = Some(certs[i].cert.clone());
                c.tls_key_file = Some(certs[i].key.clone());
                c.peer_cert_file = Some(certs[i].cert.clone());
                c.peer_key_file = Some(certs[i].key.clone());
                c.peer_ca_file = Some(ca.clone());
            }
            let args: Vec<String> = serve
                .to_args()
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            cluster.nodes.push(Node {
                id,
                http: loopback(http[i]),
                grpc: loopback(grpc[i]),
                args,
                server: None,
            });
            cluster.launch(i)?;
        }
        cluster.wait_leaders().await?;
        cluster.wait_balanced().await;
        Ok(cluster)
    }

    fn launch(&mut self, i: usize) -> Result<()> {
        self.starts += 1;
        let node = &mut self.nodes[i];
        let name = format!("lockd-n{}-{}", node.id, self.starts);
        let bin = self.bin.display().to_string();
        node.server = Some(match &self.wrap {
            Some((w, cmd)) if *w == i && !cmd.is_empty() => {
                let mut args = cmd[1..].to_vec();
                args.push(bin);
                args.extend(node.args.iter().cloned());
                Server::start(&name, &cmd[0], &args, self.dir.path())?
            }
            _ => Server::start(&name, &bin, &node.args, self.dir.path())?,
        });
        Ok(())
    }

    pub fn size(&self) -> usize {
        self.nodes.len()
    }

    pub fn groups(&self) -> u32 {
        self.groups
    }

    pub fn http_addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(|n| n.http).collect()
    }

    pub fn grpc_addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(|n| n.grpc).collect()
    }

    /// The running nodes' pids, for CPU accounting.
    pub fn pids(&self) -> Vec<u32> {
        self.nodes
            .iter()
            .filter_map(|n| n.server.as_ref().map(Server::pid))
            .collect()
    }

    /// Fails if a running node died.
    pub fn check_alive(&mut self) -> Result<()> {
        self.nodes
            .iter_mut()
            .filter_map(|n| n.server.as_mut())
            .try_for_each(Server::check_alive)
    }

    fn live(&self) -> impl Iterator<Item = (usize, &Node)> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.server.is_some())
    }

    /// Polls every 50 ms until `ready` holds for the live nodes' statuses, a node dies, or
    /// `READY_TIMEOUT` passes.
    async fn wait_until<F>(&mut self, what: &str, mut ready: F) -> Result<()>
    where
        F: FnMut(&[(usize, Status)]) -> Result<()>,
    {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            self.check_alive()?;
            let mut all = Vec::new();
            let mut err = None;
            for (i, n) in self.live() {
                match status(n.http).await {
                    Ok(s) => all.push((i, s)),
                    Err(e) => err = Some(e),
                }
            }
            let r = match err {
                Some(e) => Err(e),
                None => ready(&all),
            };
            match r {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(e.context(format!("{what}: not after {READY_TIMEOUT:?}")))
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// Waits until every live node names the same leader for every group (0..=G).
    pub async fn wait_leaders(&mut self) -> Result<()> {
        let groups = self.groups;
        self.wait_until("every group has a leader", |all| {
            if let Some((i, _)) = all.iter().find(|(_, s)| !s.serving_names) {
                bail!("node index {i} does not serve names yet");
            }
            leaders_of(all, groups).map(|_| ())
        })
        .await
    }

    /// Waits until every group is led by its preferred leader (lockd moves each group there
    /// once the node has the whole log, a few seconds after start or restart), so that
    /// leader-routed clients see the leaders a running cluster has. Not reaching it is
    /// printed, not fatal: the cluster still serves, with the leaders less spread.
    pub async fn wait_balanced(&mut self) {
        let groups = self.groups;
        let r = self
            .wait_until("every group led by its preferred leader", |all| {
                let leaders = leaders_of(all, groups)?;
                for (_, s) in all {
                    for g in &s.groups {
                        let Some(p) = g.preferred_leader else {
                            continue;
                        };
                        if leaders.get(g.id as usize) != Some(&(p as usize - 1)) {
                            bail!("group {} is led by node {}, not {p}", g.id, g.leader);
                        }
                    }
                }
                Ok(())
            })
            .await;
        if let Err(e) = r {
            eprintln!("  warning: {e:#}");
        }
    }

    /// The leader's node index for every group id (0..=G), as the live nodes agree on it.
    pub async fn leaders(&self) -> Result<Vec<usize>> {
        let mut all = Vec::new();
        for (i, n) in self.live() {
            all.push((i, status(n.http).await?));
        }
        leaders_of(&all, self.groups)
    }

    /// SIGKILLs node `i` (no grace); returns when the process is gone.
    pub fn kill(&mut self, i: usize) -> Result<()> {
        let mut s = self.nodes[i].server.take().context("node already down")?;
        s.kill_now()
    }

    /// SIGTERMs node `i` (its graceful leave) and hands back its process to reap later.
    pub fn terminate(&mut self, i: usize) -> Result<Server> {
        let mut s = self.nodes[i].server.take().context("node already down")?;
        s.terminate()?;
        Ok(s)
    }

    /// Node `i`'s pid, if it is running.
    pub fn pid_of(&self, i: usize) -> Option<u32> {
        self.nodes[i].server.as_ref().map(Server::pid)
    }

    /// Node `i`'s data dir (`group-<id>/` with `log/` and `snapshot.bin` inside).
    pub fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("node-{}", self.nodes[i].id))
    }

    /// Node `i`'s `GET /v1/status`.
    pub async fn status_of(&self, i: usize) -> Result<Status> {
        status(self.nodes[i].http).await
    }

    /// Node `i`'s `GET /metrics` text.
    pub async fn metrics_text(&self, i: usize) -> Result<String> {
        let mut c = HttpConn::connect(self.nodes[i].http).await?;
        let (code, body) = c.request(Method::GET, "/metrics", None).await?;
        if code != StatusCode::OK {
            bail!("node {}: GET /metrics: {code}", self.nodes[i].id);
        }
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    /// The sum of every sample of metric `name` (e.g. `lockd_held_locks`, over its groups) in
    /// node `i`'s `GET /metrics`.
    pub async fn metric_sum(&self, i: usize, name: &str) -> Result<f64> {
        Ok(sum_metric(&self.metrics_text(i).await?, name))
    }

    /// Starts node `i` again from its data dir (after `kill`) and waits until every group has a
    /// leader and the node has applied, in every group id `g`, at least `at_least[g]`.
    pub async fn restart_to(&mut self, i: usize, at_least: &[u64]) -> Result<()> {
        self.launch(i)?;
        let groups = self.groups;
        self.wait_until("the restarted node caught up", |all| {
            leaders_of(all, groups)?;
            let mine = &all.iter().find(|(j, _)| *j == i).context("no status")?.1;
            for (g, &want) in at_least.iter().enumerate() {
                let got = mine.groups.iter().find(|x| x.id as usize == g);
                let got = got.map_or(0, |x| x.applied_index);
                if got < want {
                    bail!("group {g}: applied {got} of {want}");
                }
            }
            Ok(())
        })
        .await
    }

    /// Restarts node `i` from its data dir and waits until every group has a leader and, in
    /// every group, the node's applied index is within `slack` of the most advanced replica's.
    pub async fn restart(&mut self, i: usize, slack: u64) -> Result<()> {
        self.launch(i)?;
        let groups = self.groups;
        let id = self.nodes[i].id;
        self.wait_until("the restarted node caught up", |all| {
            leaders_of(all, groups)?;
            let mine = &all.iter().find(|(j, _)| *j == i).context("no status")?.1;
            for g in &mine.groups {
                let best = all
                    .iter()
                    .flat_map(|(_, s)| s.groups.iter().filter(|o| o.id == g.id))
                    .map(|o| o.applied_index)
                    .max()
                    .unwrap_or(0);
                if !g.members.contains(&id) || g.applied_index + slack < best {
                    bail!("group {}: applied {} of {best}", g.id, g.applied_index);
                }
            }
            Ok(())
        })
        .await
    }
}

/// The leader's node index per group id, if every node hosting the group sees one and they
/// agree (with `--replicas`, a node reports only the groups placed on it).
fn leaders_of(all: &[(usize, Status)], groups: u32) -> Result<Vec<usize>> {
    let mut leaders = vec![0u64; groups as usize + 1];
    for (i, s) in all {
        for g in 0..=groups {
            let Some(st) = s.groups.iter().find(|x| x.id == g) else {
                continue;
            };
            let leader = st.leader;
            if leader == 0 {
                bail!("node index {i}: group {g} has no leader");
            }
            if leaders[g as usize] != 0 && leaders[g as usize] != leader {
                bail!("group {g}: nodes disagree on the leader");
            }
            leaders[g as usize] = leader;
        }
    }
    if let Some(g) = leaders.iter().position(|l| *l == 0) {
        bail!("no node reports group {g}");
    }
    // Node ids are 1-based indexes.
    Ok(leaders.into_iter().map(|id| id as usize - 1).collect())
}

/// The sum of the samples of `name` (with or without labels) in OpenMetrics text.
pub fn sum_metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            if !(rest.starts_with('{') || rest.starts_with(' ')) {
                return None;
            }
            l.rsplit(' ').next()?.parse::<f64>().ok()
        })
        .sum()
}

/// Where a client sends each request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routing {
    /// Client `id` talks to node `id % n` only; followers forward to leaders.
    Spread,
    /// Lock requests go to the leader of the name's group (as the status showed it at start);
    /// session requests to node `id % n`.
    Leader,
}

/// Picks the connection for a request: a client holds one connection (spread) or one per node.
#[derive(Clone)]
struct Picker {
    routing: Routing,
    nodes: usize,
    shards: ShardMap,
    leaders: Vec<usize>,
}

impl Picker {
    async fn new(cluster: &Cluster, routing: Routing) -> Result<Picker> {
        Ok(Picker {
            routing,
            nodes: cluster.size(),
            shards: ShardMap::initial(cluster.groups()),
            leaders: cluster.leaders().await?,
        })
    }

    /// The nodes client `id` connects to, in connection order.
    fn nodes_of(&self, id: usize) -> Vec<usize> {
        match self.routing {
            Routing::Spread => vec![id % self.nodes],
            Routing::Leader => (0..self.nodes).collect(),
        }
    }

    /// The connection index for session requests of client `id`.
    fn home(&self, id: usize) -> usize {
        match self.routing {
            Routing::Spread => 0,
            Routing::Leader => id % self.nodes,
        }
    }

    /// The connection index for a lock request on `name`.
    fn for_name(&self, name: &str) -> usize {
        match self.routing {
            Routing::Spread => 0,
            Routing::Leader => self.leaders[self.shards.group_of(name) as usize],
        }
    }
}

/// A fencing token as the trait carries it; anything else (the mix's release of a lock it does
/// not hold) becomes token 0, which holds nothing.
fn fencing(token: &str) -> u64 {
    token.parse().unwrap_or(0)
}

/// lockd over its gRPC session stream, as `lockd-client` talks to it: one bidirectional stream
/// per client and node carries the session and every request on it, so a request is one
/// HTTP/2 DATA frame each way instead of a new HTTP/2 stream with headers and trailers.
pub struct GrpcTarget {
    addrs: Vec<SocketAddr>,
    picker: Picker,
}

pub struct GrpcClient {
    id: usize,
    streams: Vec<SessionStream>,
    /// The session's home group (0: the service did not say).
    home_group: u32,
    /// The group of each lock held, so that a keepalive names the groups lockd-client would.
    held_groups: std::collections::HashMap<String, u32>,
}

/// One session stream. The bench client has at most one request out at a time, so a call
/// sends and reads events until its answer; pushes (request id 0) and the late answers of
/// calls the workload gave up on (lower ids) are skipped.
struct SessionStream {
    tx: tokio::sync::mpsc::UnboundedSender<pb::SessionRequest>,
    events: tonic::Streaming<pb::SessionEvent>,
    last_id: u64,
}

type StreamReq = pb::session_request::Kind;
type StreamEv = pb::session_event::Kind;

impl SessionStream {
    /// Starts a stream on `addr` whose first request is `first` (open or attach).
    async fn start(addr: SocketAddr, first: StreamReq) -> Result<(SessionStream, StreamEv)> {
        let mut c = grpc_connect(addr).await?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tx.send(pb::SessionRequest {
            request_id: 1,
            kind: Some(first),
        })?;
        let events = c
            .session(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
            .await?
            .into_inner();
        let mut s = SessionStream {
            tx,
            events,
            last_id: 1,
        };
        let ev = s.answer().await?;
        Ok((s, ev))
    }

    async fn call(&mut self, kind: StreamReq) -> Result<StreamEv> {
        self.last_id += 1;
        self.tx.send(pb::SessionRequest {
            request_id: self.last_id,
            kind: Some(kind),
        })?;
        self.answer().await
    }

    async fn answer(&mut self) -> Result<StreamEv> {
        loop {
            let Some(ev) = self.events.message().await? else {
                bail!("the session stream ended");
            };
            if ev.request_id == self.last_id {
                return ev.kind.context("an event without a kind");
            }
            if ev.request_id > self.last_id {
                bail!("an answer to request {} never sent", ev.request_id);
            }
        }
    }
}

/// A stream error event as an error, naming the request.
fn stream_error(what: &str, ev: StreamEv) -> anyhow::Error {
    match ev {
        StreamEv::Error(e) => anyhow::anyhow!("{what}: {} {}: {}", e.status, e.code, e.message),
        other => anyhow::anyhow!("{what}: unexpected answer {other:?}"),
    }
}

impl GrpcTarget {
    pub async fn new(cluster: &Cluster, routing: Routing) -> Result<GrpcTarget> {
        Ok(GrpcTarget {
            addrs: cluster.grpc_addrs(),
            picker: Picker::new(cluster, routing).await?,
        })
    }
}

impl LockTarget for GrpcTarget {
    type Client = GrpcClient;

    /// Opens the session on the home node's stream; the other nodes' streams (leader routing)
    /// attach to it.
    async fn prepare(&self, id: usize, ttl: Duration) -> Result<GrpcClient> {
        let nodes = self.picker.nodes_of(id);
        let home = self.picker.home(id);
        let open = StreamReq::Open(pb::OpenSessionRequest {
            client: format!("lockd-bench-{id}"),
            ttl_ms: ttl.as_millis() as u64,
            ..Default::default()
        });
        let (home_stream, ev) = SessionStream::start(self.addrs[nodes[home]], open).await?;
        let (session, home_group) = match ev {
            StreamEv::Opened(o) => (o.session_id, o.group),
            other => return Err(stream_error("open", other)),
        };
        let mut streams = Vec::with_capacity(nodes.len());
        let mut home_stream = Some(home_stream);
        for (k, &node) in nodes.iter().enumerate() {
            if k == home {
                streams.extend(home_stream.take());
                continue;
            }
            let attach = StreamReq::Attach(session.clone());
            match SessionStream::start(self.addrs[node], attach).await? {
                (s, StreamEv::Keepalive(_)) => streams.push(s),
                (_, other) => return Err(stream_error("attach", other)),
            }
        }
        Ok(GrpcClient {
            id,
            streams,
            home_group,
            held_groups: Default::default(),
        })
    }

    async fn acquire(&self, c: &mut GrpcClient, name: &str, owner: &str) -> Result<Option<Token>> {
        let i = self.picker.for_name(name);
        let req = StreamReq::Acquire(pb::AcquireRequest {
            name: name.to_owned(),
            owner: owner.to_owned(),
            ..Default::default()
        });
        match c.streams[i].call(req).await? {
            StreamEv::Acquired(r) => {
                if r.acquired {
                    c.held_groups.insert(name.to_owned(), r.group);
                }
                Ok(r.acquired.then(|| r.fencing_token.to_string()))
            }
            other => Err(stream_error("acquire", other)),
        }
    }

    async fn release(&self, c: &mut GrpcClient, name: &str, token: &str) -> Result<bool> {
        let i = self.picker.for_name(name);
        let req = StreamReq::Release(pb::ReleaseRequest {
            name: name.to_owned(),
            fencing_token: fencing(token),
            ..Default::default()
        });
        c.held_groups.remove(name);
        match c.streams[i].call(req).await? {
            StreamEv::Released(_) => Ok(true),
            StreamEv::Error(e) if e.status == 409 => Ok(false),
            other => Err(stream_error("release", other)),
        }
    }

    /// Names the groups lockd-client would: the home group and those of the locks held.
    async fn keepalive(&self, c: &mut GrpcClient, _held: Option<(&str, &str)>) -> Result<()> {
        let home = self.picker.home(c.id);
        let mut groups: Vec<u32> = c.held_groups.values().copied().collect();
        if c.home_group != 0 {
            groups.push(c.home_group);
        } else {
            groups.clear();
        }
        groups.sort_unstable();
        groups.dedup();
        let req = StreamReq::Keepalive(pb::KeepAliveRequest {
            groups,
            ..Default::default()
        });
        match c.streams[home].call(req).await? {
            StreamEv::Keepalive(_) => Ok(()),
            other => Err(stream_error("keepalive", other)),
        }
    }

    async fn read(&self, c: &mut GrpcClient, name: &str) -> Result<Option<String>> {
        let i = self.picker.for_name(name);
        let req = StreamReq::Inspect(pb::InspectRequest {
            name: name.to_owned(),
            ..Default::default()
        });
        match c.streams[i].call(req).await? {
            StreamEv::State(s) => Ok(s.holders.first().map(|h| h.owner.clone())),
            other => Err(stream_error("inspect", other)),
        }
    }

    async fn finish(&self, mut c: GrpcClient) -> Result<()> {
        let home = self.picker.home(c.id);
        let req = StreamReq::Close(pb::CloseSessionRequest::default());
        match c.streams[home].call(req).await? {
            StreamEv::Closed(_) => Ok(()),
            other => Err(stream_error("close", other)),
        }
    }
}

/// lockd over gRPC unary calls (tonic, one HTTP/2 connection per client and node): every
/// request is a new HTTP/2 stream with its own headers and trailers.
pub struct UnaryTarget {
    addrs: Vec<SocketAddr>,
    picker: Picker,
}

pub struct UnaryClient {
    id: usize,
    conns: Vec<LockClient<Channel>>,
    session: String,
}

pub async fn grpc_connect(addr: SocketAddr) -> Result<LockClient<Channel>> {
    let tls = crate::tls::of(addr);
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut ep = Endpoint::from_shared(format!("{scheme}://{addr}"))?.tcp_nodelay(true);
    if let Some(t) = tls {
        let cfg = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&*t.ca_pem));
        ep = ep.tls_config(cfg)?;
    }
    let ch = ep
        .connect()
        .await
        .with_context(|| format!("connect gRPC {addr}"))?;
    Ok(LockClient::new(ch))
}

/// Opens a session of `ttl` through `c`.
pub async fn grpc_session(c: &mut LockClient<Channel>, who: &str, ttl: Duration) -> Result<String> {
    let r = c
        .open_session(pb::OpenSessionRequest {
            client: who.to_owned(),
            ttl_ms: ttl.as_millis() as u64,
            ..Default::default()
        })
        .await?;
    Ok(r.into_inner().session_id)
}

impl UnaryTarget {
    pub async fn new(cluster: &Cluster, routing: Routing) -> Result<UnaryTarget> {
        Ok(UnaryTarget {
            addrs: cluster.grpc_addrs(),
            picker: Picker::new(cluster, routing).await?,
        })
    }
}

impl LockTarget for UnaryTarget {
    type Client = UnaryClient;

    async fn prepare(&self, id: usize, ttl: Duration) -> Result<UnaryClient> {
        let mut conns = Vec::new();
        for i in self.picker.nodes_of(id) {
            conns.push(grpc_connect(self.addrs[i]).await?);
        }
        let home = self.picker.home(id);
        let session = grpc_session(&mut conns[home], &format!("lockd-bench-{id}"), ttl).await?;
        Ok(UnaryClient { id, conns, session })
    }

    async fn acquire(&self, c: &mut UnaryClient, name: &str, owner: &str) -> Result<Option<Token>> {
        let i = self.picker.for_name(name);
        let r = c.conns[i]
            .acquire(pb::AcquireRequest {
                session_id: c.session.clone(),
                name: name.to_owned(),
                owner: owner.to_owned(),
                ..Default::default()
            })
            .await?
            .into_inner();
        Ok(r.acquired.then(|| r.fencing_token.to_string()))
    }

    async fn release(&self, c: &mut UnaryClient, name: &str, token: &str) -> Result<bool> {
        let i = self.picker.for_name(name);
        let r = c.conns[i]
            .release(pb::ReleaseRequest {
                session_id: c.session.clone(),
                name: name.to_owned(),
                fencing_token: fencing(token),
                ..Default::default()
            })
            .await;
        match r {
            Ok(_) => Ok(true),
            Err(s) if s.code() == tonic::Code::FailedPrecondition => Ok(false),
            Err(s) => Err(s.into()),
        }
    }

    async fn keepalive(&self, c: &mut UnaryClient, _held: Option<(&str, &str)>) -> Result<()> {
        let home = self.picker.home(c.id);
        let session_id = c.session.clone();
        c.conns[home]
            .keep_alive(pb::KeepAliveRequest {
                session_id,
                ..Default::default()
            })
            .await?;
        Ok(())
    }

    async fn read(&self, c: &mut UnaryClient, name: &str) -> Result<Option<String>> {
        let i = self.picker.for_name(name);
        let r = c.conns[i]
            .inspect(pb::InspectRequest {
                name: name.to_owned(),
                ..Default::default()
            })
            .await?
            .into_inner();
        Ok(r.holders.first().map(|h| h.owner.clone()))
    }

    async fn finish(&self, mut c: UnaryClient) -> Result<()> {
        let home = self.picker.home(c.id);
        let session_id = c.session.clone();
        c.conns[home]
            .close_session(pb::CloseSessionRequest { session_id })
            .await?;
        Ok(())
    }
}

/// lockd over its HTTP/JSON API (one keep-alive HTTP/1.1 connection per client and node).
pub struct HttpTarget {
    addrs: Vec<SocketAddr>,
    picker: Picker,
}

pub struct HttpClient {
    id: usize,
    conns: Vec<HttpConn>,
    session: String,
}

/// Percent-encodes everything but RFC 3986's unreserved characters (so `/` and `:` in a name
/// cannot be mistaken for path structure or the verb).
fn encode(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[derive(Deserialize)]
struct SessionResp {
    session_id: String,
}

#[derive(Deserialize)]
struct AcquireResp {
    acquired: bool,
    #[serde(default)]
    token: Option<u64>,
}

#[derive(Deserialize)]
struct InspectResp {
    #[serde(default)]
    holder: Option<HolderResp>,
}

#[derive(Deserialize)]
struct HolderResp {
    owner: String,
}

impl HttpTarget {
    pub async fn new(cluster: &Cluster, routing: Routing) -> Result<HttpTarget> {
        Ok(HttpTarget {
            addrs: cluster.http_addrs(),
            picker: Picker::new(cluster, routing).await?,
        })
    }
}

impl LockTarget for HttpTarget {
    type Client = HttpClient;

    async fn prepare(&self, id: usize, ttl: Duration) -> Result<HttpClient> {
        let mut conns = Vec::new();
        for i in self.picker.nodes_of(id) {
            conns.push(HttpConn::connect(self.addrs[i]).await?);
        }
        let home = self.picker.home(id);
        let body = json!({"client": format!("lockd-bench-{id}"), "ttl_s": ttl.as_secs()});
        let r = conns[home].post_json("/v1/sessions", &body).await?;
        let session = serde_json::from_slice::<SessionResp>(&r)?.session_id;
        Ok(HttpClient { id, conns, session })
    }

    async fn acquire(&self, c: &mut HttpClient, name: &str, owner: &str) -> Result<Option<Token>> {
        let i = self.picker.for_name(name);
        let body = json!({"session_id": c.session, "owner": owner, "wait_ms": 0});
        let path = format!("/v1/locks/{}:acquire", encode(name));
        let r: AcquireResp = serde_json::from_slice(&c.conns[i].post_json(&path, &body).await?)?;
        match (r.acquired, r.token) {
            (true, Some(t)) => Ok(Some(t.to_string())),
            (true, None) => bail!("acquired without a token"),
            (false, _) => Ok(None),
        }
    }

    async fn release(&self, c: &mut HttpClient, name: &str, token: &str) -> Result<bool> {
        let i = self.picker.for_name(name);
        let body = json!({"session_id": c.session, "token": fencing(token)});
        let path = format!("/v1/locks/{}:release", encode(name));
        let (code, bytes) = c.conns[i]
            .request(Method::POST, &path, Some(serde_json::to_vec(&body)?))
            .await?;
        match code {
            StatusCode::OK => Ok(true),
            StatusCode::CONFLICT => Ok(false),
            _ => bail!("POST {path}: {code}: {}", String::from_utf8_lossy(&bytes)),
        }
    }

    async fn keepalive(&self, c: &mut HttpClient, _held: Option<(&str, &str)>) -> Result<()> {
        let home = self.picker.home(c.id);
        let path = format!("/v1/sessions/{}:keepalive", c.session);
        let (code, bytes) = c.conns[home].request(Method::POST, &path, None).await?;
        if code != StatusCode::OK {
            bail!("POST {path}: {code}: {}", String::from_utf8_lossy(&bytes));
        }
        Ok(())
    }

    async fn read(&self, c: &mut HttpClient, name: &str) -> Result<Option<String>> {
        let i = self.picker.for_name(name);
        let path = format!("/v1/locks/{}", encode(name));
        let (code, bytes) = c.conns[i].request(Method::GET, &path, None).await?;
        if code != StatusCode::OK {
            bail!("GET {path}: {code}: {}", String::from_utf8_lossy(&bytes));
        }
        let r: InspectResp = serde_json::from_slice(&bytes)?;
        Ok(r.holder.map(|h| h.owner))
    }

    async fn finish(&self, mut c: HttpClient) -> Result<()> {
        let home = self.picker.home(c.id);
        let path = format!("/v1/sessions/{}", c.session);
        c.conns[home].request(Method::DELETE, &path, None).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_percent_encoded() {
        assert_eq!(encode("a/b:c d"), "a%2Fb%3Ac%20d");
        assert_eq!(encode("plain-1.x~"), "plain-1.x~");
    }

    #[test]
    fn metric_samples_are_summed() {
        let text = "# TYPE lockd_held_locks gauge\nlockd_held_locks{group=\"1\"} 3\n\
                    lockd_held_locks{group=\"2\"} 4\nlockd_held_locks_x 9\nlockd_held_locks 1\n";
        assert_eq!(sum_metric(text, "lockd_held_locks"), 8.0);
    }

    #[test]
    fn leaders_need_agreement() {
        let st = |leader| Status {
            groups: (0..=1)
                .map(|id| GroupStatus {
                    id,
                    leader,
                    members: vec![1, 2],
                    applied_index: 0,
                    preferred_leader: None,
                })
                .collect(),
            serving_names: true,
        };
        assert_eq!(
            leaders_of(&[(0, st(2)), (1, st(2))], 1).unwrap(),
            vec![1, 1]
        );
        assert!(leaders_of(&[(0, st(2)), (1, st(1))], 1).is_err());
        assert!(leaders_of(&[(0, st(0))], 1).is_err());
    }
}
