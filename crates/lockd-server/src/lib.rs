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
pub mod error;
pub mod grpc;
pub mod http;
pub mod inspect;
pub mod metrics;
pub mod moves;
pub mod namespaces;
mod route;
pub mod service;
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
    /// Failed authentications an address may make in a row (`authfail.rs`); 0: no budget.
    pub auth_failure_burst: u32,
}

/// A running node. Dropping it does not stop it: call [`Running::stop`].
pub struct Running {
    pub http_addr: SocketAddr,
    pub grpc_addr: SocketAddr,
    pub peer_addr: SocketAddr,
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

/// Starts a node on the given listeners.
pub async fn start(cfg: ServerConfig) -> anyhow::Result<Running> {
    use anyhow::Context as _;
    let http_addr = cfg.http.local_addr()?;
    let grpc_addr = cfg.grpc.local_addr()?;
    let peer_addr = cfg.peer.local_addr()?;
    if peer_addr == grpc_addr || peer_addr == http_addr {
        anyhow::bail!("the peer listener {peer_addr} must not be a client port");
    }
    let lock_groups = cfg.node.lock_groups;
    // Built before anything starts, so a bad certificate stops the start with its reason.
    let http_tls = cfg.tls.as_ref().map(|t| t.rustls()).transpose()?;
    let grpc_tls = cfg.tls.as_ref().map(|t| t.grpc());
    let peer_tls = cfg.node.peer_tls.as_ref().map(|t| t.server_config());
    let election_timeout_max_ms = cfg.node.election_timeout_ms.1;
    let timing = lockd_core::ClusterTiming {
        heartbeat_ms: cfg.node.heartbeat_ms,
        election_min_ms: cfg.node.election_timeout_ms.0,
        election_max_ms: cfg.node.election_timeout_ms.1,
    };
    let (waits, orphans) = Waits::new();
    let metrics = Arc::new(Metrics::new());
    waits.observe_log_sync(metrics.log_sync.clone());
    if let Some(path) = &cfg.audit_log {
        let log = audit::AuditLog::open(path)
            .with_context(|| format!("opening audit log {}", path.display()))?;
        waits.write_audit_log(log);
    }
    // A restored data dir (`backup.rs`): read before the node starts, so a damaged seed stops
    // the start with its reason.
    let data_dir = cfg.node.data_dir.clone();
    let restore = backup::load_seed(&data_dir)?;
    // StartError's message already carries its cause; as an anyhow chain, `{:#}` repeated it.
    let node = Node::start(cfg.node, waits.clone())
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut service = Service::new(node.clone(), waits, metrics, lock_groups)
        .with_admin_token(cfg.admin_token.as_deref());
    service.election_timeout_max_ms = election_timeout_max_ms;
    service.timing = Some(timing);
    service.auth_failures = authfail::AuthFailures::new(cfg.auth_failure_burst);
    if let Some(seed) = restore {
        tracing::info!(
            floor = seed.floor,
            backup_max_revision = seed.backup_max_revision,
            bump = seed.bump,
            "restored from a backup: no name is served until every lock group's revision is \
             raised to the floor"
        );
        service.restore = std::sync::Mutex::new(Some(seed));
    }
    let service = Arc::new(service);
    service.count_contention();
    service.serve_peer_questions();
    let (stop, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();

    // Node-to-node traffic (Raft, forwarded proposals) on its own port, apart from clients,
    // under a connection cap of its own (`conns.rs`; it sets TCP_NODELAY, which serving from
    // a pre-bound listener skips: without it every small reply, Raft acks above all, waits out
    // Nagle against the peer's delayed ACK, ~40 ms).
    let peer = node.peer_service();
    let peer_cap = conns::ConnCap::with_per_addr(
        "peer",
        conns::PEER_CONNECTIONS,
        conns::PEER_CONNECTIONS_PER_ADDR,
    );
    let incoming = conns::capped_grpc(cfg.peer, peer_cap);
    let rx = stop_rx.clone();
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(conns::H2_KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(conns::H2_KEEPALIVE_TIMEOUT));
    if let Some(t) = peer_tls {
        builder = builder.tls_config(t).context("the peer port's TLS")?;
    }
    tasks.spawn(async move {
        let served = builder
            .add_service(peer)
            .serve_with_incoming_shutdown(incoming, stopped(rx))
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "peer gRPC server failed");
        }
    });

    // The client gRPC API.
    // A request message is at most what an HTTP body may be (64 KiB): no valid request comes
    // near it, and tonic's default (4 MiB) would let one call make the node buffer that much.
    let api = lockd_proto::v1::lock_server::LockServer::new(grpc::GrpcApi::new(service.clone()))
        .max_decoding_message_size(http::MAX_BODY_BYTES);
    let admin =
        lockd_proto::v1::admin_server::AdminServer::new(grpc::AdminApi::new(service.clone()))
            .max_decoding_message_size(http::MAX_BODY_BYTES);
    let grpc_cap = conns::ConnCap::new("gRPC", cfg.max_client_connections);
    service.metrics.watch_connections(&grpc_cap);
    let incoming = conns::capped_grpc(cfg.grpc, grpc_cap);
    // grpc.health.v1 and server reflection (v1 and v1alpha), so grpcurl, Postman and load
    // balancers work without the .proto file.
    // NOT_SERVING until the node is ready (the readiness task below keeps it in step with
    // `/readyz`), so a gRPC load balancer's health check means what the HTTP probe means.
    let (health, health_service) = tonic_health::server::health_reporter();
    for name in ["", LOCK_SERVICE, ADMIN_SERVICE] {
        health
            .set_service_status(name, tonic_health::ServingStatus::NotServing)
            .await;
    }
    let leaving = Arc::new(tokio::sync::Mutex::new(false));
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(lockd_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(lockd_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let rx = stop_rx.clone();
    // Streams at once on one client connection: what one connection can make the node hold
    // (each session, watch or call a task and its buffers). A client opening more waits for
    // one to end (HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS); a lockd client needs one.
    let mut builder = tonic::transport::Server::builder()
        .max_concurrent_streams(Some(grpc::MAX_STREAMS_PER_CONNECTION))
        .http2_keepalive_interval(Some(conns::H2_KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(conns::H2_KEEPALIVE_TIMEOUT));
    if let Some(t) = grpc_tls {
        builder = builder.tls_config(t).context("the gRPC port's TLS")?;
    }
    tasks.spawn(async move {
        let served = builder
            .add_service(api)
            .add_service(admin)
            .add_service(health_service)
            .add_service(reflection)
            .add_service(reflection_alpha)
            .serve_with_incoming_shutdown(incoming, stopped(rx))
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "gRPC server failed");
        }
    });

    // HTTP/JSON.
    let app = http::router(service.clone());
    let cap = conns::ConnCap::new("HTTP", cfg.max_client_connections);
    service.metrics.watch_connections(&cap);
    let rx = stop_rx.clone();
    match http_tls {
        Some(t) => {
            let listener = tls::TlsListener::new(cfg.http, t)?;
            tasks.spawn(conns::serve_http(listener, app, cap, stopped(rx)));
        }
        None => {
            use axum::serve::ListenerExt;
            let listener = cfg.http.tap_io(|tcp| {
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::warn!(error = %e, "could not set TCP_NODELAY");
                }
            });
            tasks.spawn(conns::serve_http(listener, app, cap, stopped(rx)));
        }
    }

    // Fail closed: no name or session is served until the meta replica has caught up.
    let svc = service.clone();
    let rx = stop_rx.clone();
    tasks.spawn(async move {
        tokio::select! {
            _ = svc.catch_up_meta() => {}
            _ = stopped(rx) => {}
        }
    });

    // Replicated configuration: shard map and namespaces, retried until a leader takes them.
    let svc = service.clone();
    let namespaces = cfg.namespaces;
    let rx = stop_rx.clone();
    tasks.spawn(async move {
        let work = async {
            let mut delay = Duration::from_millis(50);
            let started = tokio::time::Instant::now();
            let mut warned = started;
            loop {
                match svc.bootstrap(&namespaces).await {
                    Ok(()) => break,
                    // A restore that does not finish keeps the node closed: say why, now and then.
                    Err(e) if svc.pending_restore().is_some() && warned.elapsed() > Duration::from_secs(10) => {
                        warned = tokio::time::Instant::now();
                        tracing::warn!(error = %e, waited_s = started.elapsed().as_secs(), "the restore is not applied yet; serving no name");
                    }
                    Err(e) => tracing::debug!(error = %e, "bootstrap not done yet"),
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
            tracing::info!("shard map and namespaces are in place");
            if let Some(seed) = svc.pending_restore() {
                match backup::mark_applied(&data_dir) {
                    Ok(path) => tracing::info!(
                        floor = seed.floor,
                        file = %path.display(),
                        "the restore is applied: every lock group's revision is at least the floor"
                    ),
                    // Applied all the same; the next start raises the floor again (a no-op).
                    Err(e) => tracing::warn!(error = %e, "could not mark the restore applied"),
                }
                svc.restore_applied();
            }
        };
        tokio::select! { _ = work => {}, _ = stopped(rx) => {} }
    });

    // Groups created on the running cluster: host those placed here, know where the others are.
    let svc = service.clone();
    let rx = stop_rx.clone();
    tasks.spawn(async move {
        let work = async {
            loop {
                if let Err(e) = svc.reconcile_topology().await {
                    tracing::debug!(error = %e, "could not read the group records yet");
                }
                tokio::time::sleep(topology::RECONCILE_EVERY).await;
            }
        };
        tokio::select! { _ = work => {}, _ = stopped(rx) => {} }
    });

    // The lock groups' copies of the namespaces follow the meta group's.
    let svc = service.clone();
    let rx = stop_rx.clone();
    tasks.spawn(async move {
        tokio::select! { _ = namespaces::sync_loop(svc) => {}, _ = stopped(rx) => {} }
    });

    // Moves a crashed mover left half done are finished, so their buckets do not stay frozen.
    let svc = service.clone();
    let rx = stop_rx.clone();
    tasks.spawn(async move {
        tokio::select! { _ = moves::resume_janitor(svc) => {}, _ = stopped(rx) => {} }
    });

    // Grants nobody waits for any more go back.
    let svc = service.clone();
    let rx = stop_rx.clone();
    tasks.spawn(async move {
        tokio::select! { _ = svc.release_orphans(orphans) => {}, _ = stopped(rx) => {} }
    });

    // The gRPC health statuses follow readiness (`Service::not_ready`).
    let svc = service.clone();
    let rx = stop_rx.clone();
    let reporter = health.clone();
    let gone = leaving.clone();
    tasks.spawn(async move {
        let work = async {
            let mut serving = None;
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            loop {
                tick.tick().await;
                let ready = svc.not_ready().is_empty();
                let gone = gone.lock().await;
                if *gone {
                    break;
                }
                if serving != Some(ready) {
                    let status = if ready {
                        tonic_health::ServingStatus::Serving
                    } else {
                        tonic_health::ServingStatus::NotServing
                    };
                    for name in ["", LOCK_SERVICE, ADMIN_SERVICE] {
                        reporter.set_service_status(name, status).await;
                    }
                    serving = Some(ready);
                }
            }
        };
        tokio::select! { _ = work => {}, _ = stopped(rx) => {} }
    });

    // Count leader changes between scrapes.
    let svc = service.clone();
    let rx = stop_rx;
    tasks.spawn(async move {
        let work = async {
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            loop {
                tick.tick().await;
                for group in svc.metrics.observe_leaders(&svc.node) {
                    tokio::spawn(svc.clone().tell_lease_extended(group));
                }
            }
        };
        tokio::select! { _ = work => {}, _ = stopped(rx) => {} }
    });

    Ok(Running {
        http_addr,
        grpc_addr,
        peer_addr,
        service,
        stop,
        tasks,
        health,
        leaving,
    })
}
