//! # lockd-server: one lockd node
//!
//! Hosts a replica of the groups placed on it (lockd-raft) and reaches the others over the peer
//! port, serves the client APIs (HTTP/JSON and gRPC),
//! serves the node-to-node service on a listener of its own (never on a client port), routes
//! names to groups, checks auth and budgets, and wakes waiters from applied effects. [`start`] takes already-bound listeners, so tests bind
//! port 0 and a cluster's peers know each other's addresses before any node starts.

pub mod admin;
mod ask;
pub mod audit;
pub mod authfail;
pub mod backup;
pub mod cli;
pub mod config;
pub mod conns;
pub mod contention;
pub mod duties;
pub mod error;
pub mod grpc;
pub mod http;
pub mod inspect;
pub mod metrics;
pub mod moves;
pub mod namespaces;
pub mod opens;
mod route;
mod servers;
pub mod service;
pub mod status;
pub mod systemd;
pub mod tls;
pub mod topology;
pub mod waits;
pub mod watches;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lockd_core::Namespace;
use lockd_raft::{Node, NodeConfig};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::metrics::Metrics;
use crate::service::Service;
use crate::waits::Waits;

/// Everything a node needs to start.
pub struct ServerConfig {
    pub node: NodeConfig,
    pub http: TcpListener,
    /// The client gRPC API; it never serves the peer service.
    pub grpc: TcpListener,
    /// The node-to-node service (Raft, forwarded calls); its address is this node's entry in
    /// `node.peers`. It never serves the client API.
    pub peer: TcpListener,
    /// Namespaces to make sure exist (the default one is built in).
    pub namespaces: Vec<Namespace>,
    /// Append every applied grant and end of a hold or session here (JSON lines).
    pub audit_log: Option<std::path::PathBuf>,
    /// The admin bearer token (only its digest is kept); `None` refuses every admin call.
    pub admin_token: Option<String>,
    /// TLS on the client ports (HTTP and gRPC); `None` serves them in plain text. The peer
    /// port's mutual TLS is `node.peer_tls`.
    pub tls: Option<tls::ClientTls>,
    /// At most this many connections open at once on each client port (`conns.rs`).
    pub max_client_connections: u32,
    /// A client connection with no request in flight this long is closed
    /// (`conns::IDLE_TIMEOUT` by default; zero keeps idle ones).
    pub client_idle_timeout: std::time::Duration,
    /// Failed authentications an address may make in a row (`authfail.rs`); 0: no budget.
    pub auth_failure_burst: u32,
    /// Session opens per second per client address (`opens.rs`; 0: no budget).
    pub session_opens_per_address: u32,
    /// `GET /livez`, `/readyz` and `/metrics` only, in plain HTTP, outside the client cap and
    /// client TLS (`servers::probes`); `None`: on the client ports only.
    pub probes: Option<TcpListener>,
}

/// A running node. Dropping it does not stop it: call [`Running::stop`].
pub struct Running {
    pub http_addr: SocketAddr,
    pub grpc_addr: SocketAddr,
    pub peer_addr: SocketAddr,
    /// The probes port (`ServerConfig::probes`), if any.
    pub probes_addr: Option<SocketAddr>,
    pub service: Arc<Service>,
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
    /// The standard gRPC health service's statuses: SERVING while `/readyz` would say ready,
    /// NOT_SERVING otherwise and for good once the node is leaving.
    health: tonic_health::server::HealthReporter,
    /// Set when the node starts leaving: the readiness task stops touching `health`. A lock,
    /// so that no update of the task's can land after the leaving node's NOT_SERVING.
    leaving: Arc<tokio::sync::Mutex<bool>>,
}

impl Running {
    /// Hands the groups this node leads to other voters (graceful leave, up to two election
    /// timeouts), stops serving, then shuts the node's groups down.
    pub async fn stop(mut self) {
        // Load balancers and health checks stop sending new calls first.
        {
            let mut leaving = self.leaving.lock().await;
            *leaving = true;
            for name in ["", LOCK_SERVICE, ADMIN_SERVICE] {
                self.health
                    .set_service_status(name, tonic_health::ServingStatus::NotServing)
                    .await;
            }
        }
        let limit = Duration::from_millis(2 * self.service.election_timeout_max_ms.max(100));
        self.service.node.hand_over(limit).await;
        // Session streams end now (their clients attach elsewhere), so the servers' graceful
        // stop does not wait on them.
        self.service.leave();
        let _ = self.stop.send(true);
        self.service.node.close_peer_pipes();
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        self.tasks.abort_all();
        self.service.node.shutdown().await;
    }
}

/// The gRPC services' full names, as health checks ask for them.
pub const LOCK_SERVICE: &str = "lockd.v1.Lock";
pub const ADMIN_SERVICE: &str = "lockd.v1.Admin";

async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// The three ports' addresses: (HTTP, gRPC, peer). The peer port is never a client port.
fn addrs(cfg: &ServerConfig) -> anyhow::Result<(SocketAddr, SocketAddr, SocketAddr)> {
    let http_addr = cfg.http.local_addr()?;
    let grpc_addr = cfg.grpc.local_addr()?;
    let peer_addr = cfg.peer.local_addr()?;
    if peer_addr == grpc_addr || peer_addr == http_addr {
        anyhow::bail!("the peer listener {peer_addr} must not be a client port");
    }
    Ok((http_addr, grpc_addr, peer_addr))
}

/// The node's effect sink (`waits.rs`) with the receiver of its orphaned grants, and the
/// metrics; the sink writes the audit log at `audit_log`, if asked for.
fn sink(
    audit_log: Option<&std::path::Path>,
) -> anyhow::Result<(
    Arc<Waits>,
    tokio::sync::mpsc::UnboundedReceiver<waits::Orphan>,
    Arc<Metrics>,
)> {
    use anyhow::Context as _;
    let (waits, orphans) = Waits::new();
    let metrics = Arc::new(Metrics::new());
    waits.observe_log_sync(metrics.log_sync.clone());
    waits.observe_snapshots(metrics.snapshot_seconds.clone());
    if let Some(path) = audit_log {
        let log = audit::AuditLog::open(path)
            .with_context(|| format!("opening audit log {}", path.display()))?;
        waits.write_audit_log(log);
    }
    Ok((waits, orphans, metrics))
}

/// The expiry of every certificate file the node serves with, as metrics.
fn record_certs(metrics: &Metrics, cfg: &ServerConfig) {
    if let Some(t) = &cfg.tls {
        metrics.record_cert("client", &t.cert_pem);
        if let Some(ca) = &t.client_ca_pem {
            metrics.record_cert("client_ca", ca);
        }
    }
    if let Some(t) = &cfg.node.peer_tls {
        metrics.record_cert("peer", &t.cert_pem);
        metrics.record_cert("peer_ca", &t.ca_pem);
    }
}

impl ServerConfig {
    /// The connection cap of client port `port` (`conns.rs`).
    fn client_cap(&self, port: &'static str) -> conns::ConnCap {
        conns::ConnCap::new(port, self.max_client_connections)
            .with_idle_timeout(self.client_idle_timeout)
    }
}

/// Starts a node on the given listeners.
pub async fn start(cfg: ServerConfig) -> anyhow::Result<Running> {
    let (http_addr, grpc_addr, peer_addr) = addrs(&cfg)?;
    let (grpc_cap, http_cap) = (cfg.client_cap("gRPC"), cfg.client_cap("HTTP"));
    let lock_groups = cfg.node.lock_groups;
    // Built before anything starts, so a bad certificate stops the start with its reason.
    let http_tls = cfg.tls.as_ref().map(|t| t.rustls()).transpose()?;
    let grpc_tls = cfg.tls.as_ref().map(|t| t.grpc());
    let peer_tls = cfg.node.peer_tls.as_ref().map(|t| t.server_config());
    let timing = cfg.node.cluster_timing();
    let (waits, orphans, metrics) = sink(cfg.audit_log.as_deref())?;
    record_certs(&metrics, &cfg);
    // A restored data dir (`backup.rs`): read before the node starts, so a damaged seed stops
    // the start with its reason.
    let data_dir = cfg.node.data_dir.clone();
    let restore = backup::load_seed(&data_dir)?;
    let node = Node::start(cfg.node, waits.clone())
        .await
        .map_err(systemd::start_error)?;
    let mut service = Service::new(node.clone(), waits, metrics, lock_groups)
        .with_admin_token(cfg.admin_token.as_deref())
        .with_budgets(cfg.auth_failure_burst, cfg.session_opens_per_address);
    service.election_timeout_max_ms = timing.election_max_ms;
    service.timing = Some(timing);
    if let Some(seed) = restore {
        service.restore_pending(seed);
    }
    let service = Arc::new(service);
    service.count_contention();
    service.serve_peer_questions();
    let (stop, stop_rx) = watch::channel(false);
    let until_stopped = || stopped(stop_rx.clone());
    let mut tasks = JoinSet::new();
    tasks.spawn(servers::peer(&node, cfg.peer, peer_tls, until_stopped())?);
    let (grpc_server, health) =
        servers::grpc(&service, cfg.grpc, grpc_cap, grpc_tls, until_stopped()).await?;
    tasks.spawn(grpc_server);
    let http_server = servers::http(&service, cfg.http, http_cap, http_tls, until_stopped());
    tasks.spawn(http_server?);
    let probes_addr = servers::probes(&service, cfg.probes, &mut tasks, until_stopped())?;

    // The duties (`duties.rs`), each until the node stops.
    let leaving = Arc::new(tokio::sync::Mutex::new(false));
    let (namespaces, reporter) = (cfg.namespaces, health.clone());
    let duties = duties::every_duty(
        &service,
        namespaces,
        data_dir,
        orphans,
        reporter,
        leaving.clone(),
    );
    for duty in duties {
        let stop = until_stopped();
        tasks.spawn(async move {
            tokio::select! { _ = duty => {}, _ = stop => {} }
        });
    }

    Ok(Running {
        http_addr,
        grpc_addr,
        peer_addr,
        probes_addr,
        service,
        stop,
        tasks,
        health,
        leaving,
    })
}
