//! Three real `lockd serve` processes on loopback, wired through fault-injecting proxies, each
//! under libfaketime so its wall clock can jump (its monotonic clock, which lockd uses for
//! leases, is left alone with `FAKETIME_DONT_FAKE_MONOTONIC=1`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use lockd_client::{Client, ClientOptions};
use lockd_server::cli::ServeArgs;
use rustix::process::{kill_process, Pid, Signal};

use super::proxy::Link;

/// Debian's libfaketime (package `libfaketime`).
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// How the nodes are started.
/// The admin bearer token of the nodes the nemesis starts.
pub const ADMIN_TOKEN: &str = "lockd-check-nemesis-admin";

#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub lockd_bin: PathBuf,
    pub dir: PathBuf,
    pub nodes: u64,
    pub lock_groups: u32,
    /// Namespaces file passed with `--config`.
    pub config_toml: String,
    /// `lockd serve --snapshot-every`.
    pub snapshot_every: u64,
    /// `lockd serve --unsafe-negative-control` (a sabotaged run).
    pub negative_control: Option<String>,
    pub faketime: bool,
    /// The founders' zones, node 1's first (`lockd serve --initial-zones`, and each founder's
    /// `--zone`); empty: no zones.
    pub zones: Vec<String>,
    /// `lockd serve --replicas` (0: every node hosts every group).
    pub replicas: usize,
    /// Each way on every peer link between nodes of different zones (`proxy.rs`); such links
    /// cannot be cut. Zero: no delay.
    pub zone_delay: Duration,
    /// `lockd serve --audit-log` on every node (the nemesis checks them).
    pub audit: bool,
}

impl ClusterConfig {
    /// `--initial-zones`: `1=z1,2=z2,...`, or `None` without zones.
    fn initial_zones(&self) -> Option<String> {
        (!self.zones.is_empty()).then(|| {
            self.zones
                .iter()
                .enumerate()
                .map(|(i, z)| format!("{}={z}", i + 1))
                .collect::<Vec<_>>()
                .join(",")
        })
    }
}

struct NodeProc {
    id: u64,
    http: SocketAddr,
    grpc: SocketAddr,
    /// Its own peer listener (the others reach a founder through proxies).
    peer: SocketAddr,
    /// Replaced for good (`Cluster::retire`): never restarted, not counted as dead.
    retired: bool,
    args: Vec<String>,
    child: Option<tokio::process::Child>,
    pid: u32,
    faketime_file: PathBuf,
    log: PathBuf,
    audit: PathBuf,
}

/// A running cluster. Stop it with [`Cluster::shutdown`]; children are also killed on drop.
pub struct Cluster {
    cfg: ClusterConfig,
    nodes: Vec<NodeProc>,
    links: BTreeMap<(u64, u64), Link>,
    /// A cluster someone else runs: its gRPC endpoints and the audit logs it writes.
    external: Option<(Vec<String>, Vec<PathBuf>)>,
}

/// A free loopback port for a node to bind later. Drawn below Linux's ephemeral range
/// (32768+), so the proxies' and clients' own ports, taken meanwhile, cannot collide with it.
fn free_port(rng: &mut fastrand::Rng) -> anyhow::Result<SocketAddr> {
    for _ in 0..1000 {
        let addr = SocketAddr::from(([127, 0, 0, 1], rng.u16(20_000..32_000)));
        if std::net::TcpListener::bind(addr).is_ok() {
            return Ok(addr);
        }
    }
    bail!("no free port in 20000..32000")
}

fn signal(pid: u32, sig: Signal) -> anyhow::Result<()> {
    let pid = Pid::from_raw(pid as i32).context("pid 0")?;
    kill_process(pid, sig).with_context(|| format!("signal {sig:?} to pid {pid:?}"))
}

/// The `State:` letter of `/proc/PID/status` (`T` = stopped).
pub fn proc_state(pid: u32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("State:"))
        .and_then(|v| v.trim().chars().next())
}

/// SIGSTOPs `pid` and waits (up to 2 s) until `/proc` shows it stopped; `true` if it did.
pub async fn pause(pid: u32) -> anyhow::Result<bool> {
    signal(pid, Signal::STOP)?;
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        if proc_state(pid) == Some('T') {
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(false)
}

pub fn resume(pid: u32) -> anyhow::Result<()> {
    signal(pid, Signal::CONT)
}

/// Node `id`'s `lockd serve` command line, built as the server's own argument type: its ports,
/// its data dir and audit log under the run's dir, the run's namespaces, token and settings.
fn serve_args(
    cfg: &ClusterConfig,
    id: u64,
    peers: String,
    http: SocketAddr,
    grpc: SocketAddr,
    joiner: bool,
) -> Vec<String> {
    let mut a = ServeArgs::new(id, peers, http, grpc, cfg.dir.join(format!("node{id}")));
    if cfg.audit {
        a.audit_log = Some(cfg.dir.join(format!("node{id}.audit.jsonl")));
    }
    a.unsafe_negative_control = cfg.negative_control.clone();
    if joiner {
        a.initial_cluster_state = "existing".into();
    } else {
        // A founder's zone, the same flags on every start (the data dir records them).
        a.initial_zones = cfg.initial_zones();
        a.zone = cfg.zones.get(id as usize - 1).cloned();
    }
    a.common.replicas = cfg.replicas;
    a.common.groups = Some(cfg.lock_groups);
    a.common.config = Some(cfg.dir.join("namespaces.toml"));
    a.common.admin_token_file = Some(cfg.dir.join("admin-token"));
    a.common.snapshot_every = cfg.snapshot_every;
    a.to_args()
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect()
}

impl Cluster {
    /// Starts every node and waits until every group has a leader.
    pub async fn start(cfg: ClusterConfig) -> anyhow::Result<Cluster> {
        if cfg.faketime && !Path::new(LIBFAKETIME).exists() {
            bail!("{LIBFAKETIME} is missing: apt-get install libfaketime (or pass --no-faketime)");
        }
        // A fresh cluster every run: data, logs and audit logs of an earlier run would carry
        // its state (sessions, tokens) and its records into this one.
        if cfg.dir.exists() {
            std::fs::remove_dir_all(&cfg.dir)
                .with_context(|| format!("clearing {}", cfg.dir.display()))?;
        }
        std::fs::create_dir_all(&cfg.dir)?;
        let config_path = cfg.dir.join("namespaces.toml");
        std::fs::write(&config_path, &cfg.config_toml)?;
        // The admin credential, for the topology faults (bucket moves).
        let admin_path = cfg.dir.join("admin-token");
        std::fs::write(&admin_path, ADMIN_TOKEN)?;
        let ids: Vec<u64> = (1..=cfg.nodes).collect();
        let mut grpc = BTreeMap::new();
        let mut http = BTreeMap::new();
        let mut peer = BTreeMap::new();
        let mut rng = fastrand::Rng::new();
        let mut taken = Vec::new();
        for &id in &ids {
            // Three ports per node, distinct from every port picked so far.
            let mut pick = || loop {
                let a = free_port(&mut rng)?;
                if !taken.contains(&a) {
                    taken.push(a);
                    return anyhow::Ok(a);
                }
            };
            let (g, h, p) = (pick()?, pick()?, pick()?);
            grpc.insert(id, g);
            http.insert(id, h);
            peer.insert(id, p);
        }
        // Each node's peer port is reached through a proxy per directed link (`proxy.rs`).
        let mut links = BTreeMap::new();
        for &a in &ids {
            for &b in &ids {
                if a != b {
                    let zone = |id: u64| cfg.zones.get(id as usize - 1);
                    let delay = if zone(a) != zone(b) {
                        cfg.zone_delay
                    } else {
                        Duration::ZERO
                    };
                    links.insert((a, b), Link::start(peer[&b], delay).await?);
                }
            }
        }
        let mut nodes = Vec::new();
        for &id in &ids {
            let peers: Vec<String> = ids
                .iter()
                .map(|&p| {
                    let addr = if p == id {
                        peer[&p]
                    } else {
                        links[&(id, p)].listen
                    };
                    format!("{p}={addr}")
                })
                .collect();
            let audit = cfg.dir.join(format!("node{id}.audit.jsonl"));
            let args = serve_args(&cfg, id, peers.join(","), http[&id], grpc[&id], false);
            let faketime_file = cfg.dir.join(format!("node{id}.faketime"));
            std::fs::write(&faketime_file, "+0\n")?;
            nodes.push(NodeProc {
                id,
                http: http[&id],
                grpc: grpc[&id],
                peer: peer[&id],
                retired: false,
                args,
                child: None,
                pid: 0,
                faketime_file,
                log: cfg.dir.join(format!("node{id}.log")),
                audit,
            });
        }
        let mut c = Cluster {
            cfg,
            nodes,
            links,
            external: None,
        };
        for i in 0..c.nodes.len() {
            c.spawn(i)?;
        }
        c.wait_ready(Duration::from_secs(60)).await?;
        Ok(c)
    }

    /// A cluster this process did not start (no node faults possible): its endpoints, and the
    /// `--audit-log` files of its nodes if the caller can read them (may be empty).
    pub fn external(endpoints: Vec<String>, audit_logs: Vec<PathBuf>) -> Cluster {
        Cluster {
            cfg: ClusterConfig {
                lockd_bin: PathBuf::new(),
                dir: PathBuf::new(),
                nodes: 0,
                lock_groups: 0,
                config_toml: String::new(),
                snapshot_every: 0,
                negative_control: None,
                faketime: false,
                zones: Vec::new(),
                replicas: 0,
                zone_delay: Duration::ZERO,
                audit: false,
            },
            nodes: Vec::new(),
            links: BTreeMap::new(),
            external: Some((endpoints, audit_logs)),
        }
    }

    pub fn is_external(&self) -> bool {
        self.external.is_some()
    }

    fn spawn(&mut self, i: usize) -> anyhow::Result<()> {
        let n = &mut self.nodes[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&n.log)?;
        let mut cmd = tokio::process::Command::new(&self.cfg.lockd_bin);
        cmd.args(&n.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .env("RUST_LOG", "warn")
            .kill_on_drop(true);
        if self.cfg.faketime {
            cmd.env("LD_PRELOAD", LIBFAKETIME)
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                .env("FAKETIME_TIMESTAMP_FILE", &n.faketime_file)
                .env("FAKETIME_NO_CACHE", "1");
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", self.cfg.lockd_bin.display()))?;
        n.pid = child.id().context("child has no pid")?;
        n.child = Some(child);
        Ok(())
    }

    /// The nodes of the cluster (not the retired ones).
    pub fn ids(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .filter(|n| !n.retired)
            .map(|n| n.id)
            .collect()
    }

    /// The id a new node gets (ids are never reused).
    pub fn next_id(&self) -> u64 {
        self.nodes.len() as u64 + 1
    }

    /// Starts node `id` (the next id) as a joiner of the running cluster: `--initial-cluster-state
    /// existing`. With `in_place_of`, it takes that (dead) node's client ports, as a replacement
    /// machine behind the same name would, so clients' endpoint lists stay valid.
    ///
    /// It reaches the others through a proxy per directed link, as the founders do; the others
    /// reach it through one inbound proxy (the address they learn from the Raft membership is
    /// one address for all), so isolating the joiner cuts both ways, while isolating another
    /// node leaves that node's calls to the joiner up (a partial partition).
    /// Returns the address the others dial, for the admin call that adds it.
    pub async fn add_joiner(
        &mut self,
        id: u64,
        in_place_of: Option<u64>,
    ) -> anyhow::Result<SocketAddr> {
        anyhow::ensure!(id == self.next_id(), "node ids are added in order");
        let mut rng = fastrand::Rng::new();
        let taken: Vec<SocketAddr> = self
            .nodes
            .iter()
            .flat_map(|n| [n.http, n.grpc, n.peer])
            .collect();
        let mut pick = || loop {
            let a = free_port(&mut rng)?;
            if !taken.contains(&a) {
                return anyhow::Ok(a);
            }
        };
        let (mut grpc, mut http, mut peer) = (pick()?, pick()?, pick()?);
        while http == grpc {
            http = pick()?;
        }
        while peer == grpc || peer == http {
            peer = pick()?;
        }
        if let Some(old) = in_place_of {
            let old = self.node(old);
            (grpc, http) = (old.grpc, old.http);
        }
        let inbound = Link::start(peer, Duration::ZERO).await?;
        let dial = inbound.listen;
        self.links.insert((0, id), inbound);
        let mut peers = vec![format!("{id}={peer}")];
        let others: Vec<(u64, SocketAddr)> = self
            .nodes
            .iter()
            .filter(|n| !n.retired)
            .map(|n| (n.id, n.peer))
            .collect();
        for (other, addr) in others {
            let link = Link::start(addr, Duration::ZERO).await?;
            peers.push(format!("{other}={}", link.listen));
            self.links.insert((id, other), link);
        }
        let audit = self.cfg.dir.join(format!("node{id}.audit.jsonl"));
        let args = serve_args(&self.cfg, id, peers.join(","), http, grpc, true);
        let faketime_file = self.cfg.dir.join(format!("node{id}.faketime"));
        std::fs::write(&faketime_file, "+0\n")?;
        self.nodes.push(NodeProc {
            id,
            http,
            grpc,
            peer,
            retired: false,
            args,
            child: None,
            pid: 0,
            faketime_file,
            log: self.cfg.dir.join(format!("node{id}.log")),
            audit,
        });
        self.spawn(self.nodes.len() - 1)?;
        // Up once its HTTP port answers.
        let until = Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(http).await.is_err() {
            anyhow::ensure!(Instant::now() < until, "joiner {id} did not come up");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(dial)
    }

    /// Marks a node (killed, and removed from every group) as gone for good.
    pub fn retire(&mut self, id: u64) {
        self.nodes[(id - 1) as usize].retired = true;
    }

    /// SIGTERM (the graceful leave), then wait for the process to exit (SIGKILL after 30 s).
    pub async fn terminate(&mut self, id: u64) -> anyhow::Result<()> {
        let n = &mut self.nodes[(id - 1) as usize];
        if let Some(mut child) = n.child.take() {
            signal(n.pid, Signal::TERM)?;
            if tokio::time::timeout(Duration::from_secs(30), child.wait())
                .await
                .is_err()
            {
                signal(n.pid, Signal::KILL)?;
                let _ = child.wait().await;
                bail!("node {id} did not stop within 30 s of SIGTERM");
            }
        }
        Ok(())
    }

    fn node(&self, id: u64) -> &NodeProc {
        &self.nodes[(id - 1) as usize]
    }

    pub fn pid(&self, id: u64) -> u32 {
        self.node(id).pid
    }

    /// gRPC endpoints of all nodes, starting at `first` (so workers spread over nodes).
    pub fn endpoints_from(&self, first: usize) -> Vec<String> {
        let all: Vec<String> = match &self.external {
            Some((e, _)) => e.clone(),
            None => self
                .nodes
                .iter()
                .filter(|n| !n.retired)
                .map(|n| n.grpc.to_string())
                .collect(),
        };
        let n = all.len().max(1);
        (0..all.len())
            .map(|k| all[(first + k) % n].clone())
            .collect()
    }

    pub fn endpoints_except(&self, id: u64) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.id != id && !n.retired)
            .map(|n| n.grpc.to_string())
            .collect()
    }

    pub fn audit_logs(&self) -> Vec<PathBuf> {
        match &self.external {
            Some((_, logs)) => logs.clone(),
            None => self.nodes.iter().map(|n| n.audit.clone()).collect(),
        }
    }

    /// Snapshots written and installed from a leader, counted in the nodes' logs over every
    /// incarnation (`None` for an external cluster).
    pub fn snapshot_counts(&self) -> Option<(usize, usize)> {
        if self.external.is_some() {
            return None;
        }
        let (mut written, mut installed) = (0, 0);
        for n in &self.nodes {
            let log = std::fs::read_to_string(&n.log).unwrap_or_default();
            written += log.matches("snapshot written").count();
            installed += log.matches("installed snapshot from leader").count();
        }
        Some((written, installed))
    }

    pub fn http_addr(&self, id: u64) -> SocketAddr {
        self.node(id).http
    }

    pub fn grpc_addr(&self, id: u64) -> SocketAddr {
        self.node(id).grpc
    }

    /// SIGKILL, then reap.
    pub async fn kill(&mut self, id: u64) -> anyhow::Result<()> {
        let n = &mut self.nodes[(id - 1) as usize];
        if let Some(mut child) = n.child.take() {
            signal(n.pid, Signal::KILL)?;
            let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
        }
        Ok(())
    }

    /// SIGKILL every node of `ids` at once (all signalled before any is reaped), then reap.
    pub async fn kill_all(&mut self, ids: &[u64]) -> anyhow::Result<()> {
        let mut children = Vec::new();
        for &id in ids {
            let n = &mut self.nodes[(id - 1) as usize];
            if let Some(child) = n.child.take() {
                signal(n.pid, Signal::KILL)?;
                children.push(child);
            }
        }
        for mut child in children {
            let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
        }
        Ok(())
    }

    pub fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        self.spawn((id - 1) as usize)
    }

    /// A node dies with its disk and is started again under its old id with the same flags,
    /// as a supervisor would after a disk swap. It must refuse to start (a voter that forgot
    /// its log and its vote could lose a commit): it must exit non-zero within 15 s, naming the
    /// fix. Returns that line of its log; an error if it started or said nothing of the kind.
    pub async fn wipe_and_restart(&mut self, id: u64) -> anyhow::Result<String> {
        self.kill(id).await?;
        let dir = self.cfg.dir.join(format!("node{id}"));
        std::fs::remove_dir_all(&dir).with_context(|| format!("wiping {}", dir.display()))?;
        let log = self.node(id).log.clone();
        let seen = std::fs::read_to_string(&log).unwrap_or_default().len();
        self.restart(id)?;
        let n = &mut self.nodes[(id - 1) as usize];
        let mut child = n.child.take().context("the wiped node did not start")?;
        let Ok(status) = tokio::time::timeout(Duration::from_secs(15), child.wait()).await else {
            n.child = Some(child);
            bail!("node{id} restarted on a wiped disk under its old id and was not refused within 15 s");
        };
        let status = status?;
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let said = text.get(seen..).unwrap_or_default();
        let refusal = said.lines().find(|l| l.contains("members replace"));
        match refusal {
            Some(line) if !status.success() => Ok(line.trim().to_string()),
            _ => bail!(
                "node{id} on a wiped disk exited with {status} without naming the fix; it said: {}",
                said.trim()
            ),
        }
    }

    pub fn is_running(&self, id: u64) -> bool {
        self.node(id).child.is_some()
    }

    /// Nodes not running at the end: never restarted, or exited on their own.
    pub fn dead_nodes(&mut self) -> Vec<u64> {
        let mut dead = Vec::new();
        for n in self.nodes.iter_mut().filter(|n| !n.retired) {
            let alive = n
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(None)));
            if !alive {
                dead.push(n.id);
            }
        }
        dead
    }

    /// Panics in the nodes' logs, over every incarnation.
    pub fn panics(&self) -> usize {
        self.nodes
            .iter()
            .map(|n| {
                let log = std::fs::read_to_string(&n.log).unwrap_or_default();
                log.matches("panicked at").count()
            })
            .sum()
    }

    /// The largest gap, over groups and nodes, between a node's applied index and the highest
    /// applied index of that group; `None` if a node did not answer its status call.
    pub async fn max_apply_lag(&self) -> Option<u64> {
        let mut applied: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        // How many nodes are members of each group (placement: not every node hosts every
        // group, and a joiner's replica of a group it was not added to is empty).
        let mut members: BTreeMap<u32, usize> = BTreeMap::new();
        for n in self.nodes.iter().filter(|n| !n.retired) {
            let c = Client::lazy(
                [n.grpc.to_string()],
                ClientOptions {
                    request_timeout: Duration::from_secs(1),
                    ..ClientOptions::default()
                },
            )
            .ok()?;
            let st = tokio::time::timeout(Duration::from_secs(2), c.status())
                .await
                .ok()?
                .ok()?;
            for g in st.groups.iter().filter(|g| g.members.contains(&n.id)) {
                applied.entry(g.id).or_default().push(g.applied_index);
                members.insert(g.id, g.members.len());
            }
        }
        applied
            .iter()
            .map(|(g, v)| {
                let n = members[g];
                let max = v.iter().copied().max().unwrap_or(0);
                // A node missing a group lags by all of it.
                let min = if v.len() < n {
                    0
                } else {
                    v.iter().copied().min().unwrap_or(0)
                };
                max - min
            })
            .max()
    }

    /// Cuts (or heals) every link to and from `id`.
    pub fn isolate(&self, id: u64, cut: bool) {
        for ((a, b), link) in &self.links {
            if *a == id || *b == id {
                link.set_cut(cut);
            }
        }
    }

    /// Cuts (or heals) every link between a node of `ids` and a node outside them, both ways;
    /// the links among `ids`, and among the others, stay up.
    pub fn isolate_set(&self, ids: &[u64], cut: bool) {
        for ((a, b), link) in &self.links {
            if ids.contains(a) != ids.contains(b) {
                link.set_cut(cut);
            }
        }
    }

    pub fn heal_all(&self) {
        for link in self.links.values() {
            link.set_cut(false);
        }
    }

    /// Sets `id`'s wall-clock offset (libfaketime relative format, seconds).
    pub fn set_clock_offset(&self, id: u64, offset_s: i64) -> anyhow::Result<()> {
        let spec = if offset_s >= 0 {
            format!("+{offset_s}\n")
        } else {
            format!("{offset_s}\n")
        };
        std::fs::write(&self.node(id).faketime_file, spec)?;
        Ok(())
    }

    /// The node's wall clock as its HTTP `Date` header shows it, minus ours, in seconds.
    /// (hyper caches the header for a second and only refreshes it forwards, so this sees
    /// forward jumps only.)
    pub async fn observed_clock_offset(&self, id: u64) -> Option<i64> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = self.node(id).http;
        let fut = async {
            let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
            s.write_all(b"GET /v1/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .await
                .ok()?;
            let mut buf = Vec::new();
            s.read_to_end(&mut buf).await.ok()?;
            let text = String::from_utf8_lossy(&buf);
            let date = text.lines().find_map(|l| {
                l.strip_prefix("date: ")
                    .or_else(|| l.strip_prefix("Date: "))
            })?;
            let t = httpdate_secs(date.trim())?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .ok()?
                .as_secs() as i64;
            Some(t - now)
        };
        tokio::time::timeout(Duration::from_secs(2), fut)
            .await
            .ok()
            .flatten()
    }

    /// Who leads each lock group (group 0, the meta group, included), asking any live node.
    pub async fn leaders(&self) -> BTreeMap<u32, u64> {
        self.leader_terms()
            .await
            .into_iter()
            .map(|(g, (leader, _))| (g, leader))
            .collect()
    }

    /// Each group's (leader, term) as the first live node that answers sees them.
    pub async fn leader_terms(&self) -> BTreeMap<u32, (u64, u64)> {
        for n in &self.nodes {
            if n.retired || n.child.is_none() || proc_state(n.pid) == Some('T') {
                continue;
            }
            let Ok(c) = Client::lazy(
                [n.grpc.to_string()],
                ClientOptions {
                    request_timeout: Duration::from_millis(500),
                    ..ClientOptions::default()
                },
            ) else {
                continue;
            };
            let Ok(Ok(st)) = tokio::time::timeout(Duration::from_secs(1), c.status()).await else {
                continue;
            };
            let leaders: BTreeMap<u32, (u64, u64)> = st
                .groups
                .iter()
                .filter(|g| g.leader != 0)
                .map(|g| (g.id, (g.leader, g.term)))
                .collect();
            if !leaders.is_empty() {
                return leaders;
            }
        }
        BTreeMap::new()
    }

    /// Waits until every group (meta included) has a leader.
    pub async fn wait_ready(&self, within: Duration) -> anyhow::Result<()> {
        if self.external.is_some() {
            return Ok(());
        }
        let until = Instant::now() + within;
        let want = self.cfg.lock_groups as usize + 1;
        while Instant::now() < until {
            if self.leaders().await.len() >= want {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        bail!(
            "cluster not ready within {within:?} (see {})",
            self.cfg.dir.display()
        )
    }

    /// Resumes, heals and restarts everything (the end of the fault schedule).
    pub fn restore(&mut self) -> anyhow::Result<()> {
        self.heal_all();
        for i in 0..self.nodes.len() {
            let id = self.nodes[i].id;
            if self.nodes[i].retired {
                continue;
            }
            self.set_clock_offset(id, 0)?;
            if self.nodes[i].child.is_some() {
                let _ = resume(self.nodes[i].pid);
            } else {
                self.spawn(i)?;
            }
        }
        Ok(())
    }

    /// SIGTERM every node, then SIGKILL what is left after 5 s.
    pub async fn shutdown(mut self) {
        for n in &mut self.nodes {
            if n.child.is_some() {
                let _ = resume(n.pid);
                let _ = signal(n.pid, Signal::TERM);
            }
        }
        for n in &mut self.nodes {
            if let Some(mut child) = n.child.take() {
                if tokio::time::timeout(Duration::from_secs(5), child.wait())
                    .await
                    .is_err()
                {
                    let _ = signal(n.pid, Signal::KILL);
                    let _ = child.wait().await;
                }
            }
        }
    }
}

/// Parses an IMF-fixdate (`Mon, 30 Nov 2026 19:50:45 GMT`) to Unix seconds.
fn httpdate_secs(s: &str) -> Option<i64> {
    let parts: Vec<&str> = s.split_whitespace().collect();
    if parts.len() != 6 {
        return None;
    }
    let day: i64 = parts[1].parse().ok()?;
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| *m == parts[2])? as i64
        + 1;
    let year: i64 = parts[3].parse().ok()?;
    let hms: Vec<i64> = parts[4]
        .split(':')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    if hms.len() != 3 {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hms[0] * 3600 + hms[1] * 60 + hms[2])
}

#[cfg(test)]
mod tests {
    use super::httpdate_secs;

    #[test]
    fn parses_http_dates() {
        assert_eq!(httpdate_secs("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(
            httpdate_secs("Mon, 30 Nov 2026 19:50:45 GMT"),
            Some(1_796_068_245)
        );
        assert_eq!(httpdate_secs("garbage"), None);
    }
}
