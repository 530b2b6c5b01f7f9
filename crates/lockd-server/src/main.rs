//! `lockd`: run a node (`serve`), or a local single-node or multi-node setup (`dev`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use lockd_raft::NodeConfig;
use lockd_server::cli::{Common, ServeArgs};
use lockd_server::config::FileConfig;
use lockd_server::ServerConfig;

/// mimalloc, built with `no_thp`: it does not `madvise(MADV_HUGEPAGE)` its arenas. With huge
/// pages a replica's RSS counted whole 2 MiB pages of partly used and freed heap: 169-198 MiB
/// idle with 20k sessions instead of 96-110, and ~30-50 MiB more at 1M held locks
/// (`lockd-bench scale`, BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use tokio::net::TcpListener;

#[derive(Parser)]
#[command(
    name = "lockd",
    version,
    about = "lockd: a distributed lock service with fencing tokens"
)]
struct Cli {
    /// Log lines as `text` (colour only when stderr is a terminal) or `json` (one object per
    /// line, for log shippers). The filter is `LOCKD_LOG` (e.g. `info,lockd_raft=debug`).
    #[arg(
        long,
        global = true,
        value_enum,
        env = "LOCKD_LOG_FORMAT",
        default_value = "text"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Whether logs are JSON lines (`--log-format json`): then the start-up banner is log events
/// too, so that stderr holds nothing a log shipper cannot parse.
static JSON_LOGS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Why the node stops or cannot start: plain on stderr, or an error event in JSON mode.
macro_rules! failure {
    ($($t:tt)*) => {{
        let line = format!($($t)*);
        if JSON_LOGS.load(std::sync::atomic::Ordering::Relaxed) {
            tracing::error!(target: "lockd_server", "{line}");
        } else {
            eprintln!("{line}");
        }
    }};
}

/// A start-up line for the operator: plain on stderr, or an info event in JSON mode.
macro_rules! banner {
    ($($t:tt)*) => {{
        let line = format!($($t)*);
        if JSON_LOGS.load(std::sync::atomic::Ordering::Relaxed) {
            tracing::info!(target: "lockd_server", "{line}");
        } else {
            eprintln!("{line}");
        }
    }};
}

#[derive(Subcommand)]
enum Cmd {
    /// The embedded default: one node holding every group (or `--nodes N` local processes,
    /// with `--replicas R` placing each group on R of them).
    Dev(DevArgs),
    /// One node of a real cluster.
    Serve(ServeArgs),
    /// Seeds an empty data dir from a backup (`lockctl snapshot save`). Run it for every
    /// founding node of the new cluster, then start them with `serve --initial-cluster-state
    /// new`: no name is served until every lock group's revision is above the backup's, so
    /// fencing tokens never go backwards.
    Restore(RestoreArgs),
    /// Prints what a data dir holds: identity, a pending restore, each group's snapshot
    /// (revision, sessions, locks, members). Reads only; best run on a stopped node.
    InspectData(InspectArgs),
}

#[derive(Args)]
struct RestoreArgs {
    /// The backup file (`lockctl snapshot save FILE`).
    file: PathBuf,
    /// The new node's data dir: must be empty or not exist.
    #[arg(long)]
    data_dir: PathBuf,
    /// Added to the backup's largest revision to make the new cluster's first token. It must
    /// exceed every token the old cluster minted after the backup. Default: 1 000 per
    /// millisecond since the backup was taken (1M grants/s) plus 1 000 000 000.
    #[arg(long)]
    bump_revision: Option<u64>,
}

#[derive(Args)]
struct InspectArgs {
    /// The data dir (`--data-dir` of `lockd serve` or `lockd dev`).
    data_dir: PathBuf,
}

/// `lockd restore` and `lockd inspect-data`: offline, no runtime, no logs.
fn offline(cmd: &Cmd) -> ExitCode {
    let fail = |e: String| {
        eprintln!("lockd: {e}");
        ExitCode::FAILURE
    };
    match cmd {
        Cmd::Restore(a) => {
            let bytes = match std::fs::read(&a.file) {
                Ok(b) => b,
                Err(e) => return fail(format!("cannot read {}: {e}", a.file.display())),
            };
            match lockd_server::backup::restore_into(&bytes, &a.data_dir, a.bump_revision) {
                Ok(seed) => {
                    println!(
                        "restored into {}: the backup's largest revision is {}, bump {}; every \
                         lock group starts above {} when the node first starts\n\
                         (restore every founding node's dir, then start them with \
                         --initial-cluster-state new; {} namespaces are seeded)",
                        a.data_dir.display(),
                        seed.backup_max_revision,
                        seed.bump,
                        seed.floor,
                        seed.namespaces.len()
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
        Cmd::InspectData(a) => match lockd_server::inspect::inspect_data(&a.data_dir) {
            Ok(report) => {
                print!("{report}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(format!("{e:#}")),
        },
        Cmd::Dev(_) | Cmd::Serve(_) => fail("not an offline command".into()),
    }
}

#[derive(Args)]
struct DevArgs {
    #[arg(long, env = "LOCKD_HTTP", default_value = "127.0.0.1:7070")]
    http: SocketAddr,
    #[arg(long, env = "LOCKD_GRPC", default_value = "127.0.0.1:7170")]
    grpc: SocketAddr,
    /// The node-to-node port (Raft and forwarded calls), apart from the client ports.
    #[arg(long, env = "LOCKD_PEER", default_value = "127.0.0.1:7270")]
    peer: SocketAddr,
    #[arg(long, env = "LOCKD_DATA_DIR", default_value = "./lockd-data")]
    data_dir: PathBuf,
    /// Start this many nodes as separate OS processes on consecutive ports.
    #[arg(long, env = "LOCKD_NODES", default_value_t = 1)]
    nodes: u32,
    /// With --nodes: put the nodes in this many zones, `z1`..`zZ`, round-robin (node 1 in z1,
    /// node 2 in z2, ...), and place the groups over them (`lockd serve --initial-zones`).
    #[arg(long, env = "LOCKD_ZONES", default_value_t = 0)]
    zones: u32,
    /// Serve every port over TLS with a throwaway CA and certificates made in DATA_DIR/tls (kept
    /// for restarts): HTTPS and gRPC over TLS for clients, mutual TLS between the nodes.
    #[arg(long, conflicts_with_all = ["tls_cert_file", "peer_cert_file"])]
    tls: bool,
    #[command(flatten)]
    common: Common,
}

use lockd_server::systemd::refused;

fn parse_peers(s: &str) -> anyhow::Result<BTreeMap<u64, String>> {
    let mut peers = BTreeMap::new();
    for part in s.split(',').filter(|p| !p.trim().is_empty()) {
        let (id, addr) = part
            .split_once('=')
            .with_context(|| format!("peer '{part}' is not ID=ADDR"))?;
        let id: u64 = id
            .trim()
            .parse()
            .with_context(|| format!("peer id '{id}' is not a number"))?;
        let addr = addr.trim();
        lockd_raft::check_peer_addr(addr).map_err(|e| anyhow::anyhow!("peer address {e}"))?;
        if peers.insert(id, addr.to_string()).is_some() {
            bail!("peer id {id} appears twice");
        }
    }
    if peers.is_empty() {
        bail!("--peers names no member");
    }
    Ok(peers)
}

/// The address to listen on for this node's own `--peers` entry: as given if it is an IP
/// address, else its DNS name resolved (retried for a minute: a pod's name may appear in DNS
/// only once the pod runs).
async fn resolve_own(addr: &str) -> anyhow::Result<SocketAddr> {
    if let Ok(a) = addr.parse::<SocketAddr>() {
        return Ok(a);
    }
    let until = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match tokio::net::lookup_host(addr).await {
            Ok(mut found) => {
                if let Some(a) = found.next() {
                    return Ok(a);
                }
            }
            Err(e) if tokio::time::Instant::now() >= until => {
                return Err(anyhow::anyhow!(
                    "this node's --peers entry '{addr}' does not resolve ({e}); give --peer \
                     IP:PORT to listen on"
                ));
            }
            Err(_) => {}
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// Reads the admin token from `path`: one line, 16-256 printable ASCII characters.
fn read_admin_token(path: &Path) -> anyhow::Result<String> {
    let raw = std::fs::read_to_string(path)
        .with_context(|| format!("reading the admin token file {}", path.display()))?;
    let token = raw.trim();
    if !(16..=256).contains(&token.len()) || !token.bytes().all(|b| b.is_ascii_graphic()) {
        bail!(
            "the admin token in {} must be 16-256 printable ASCII characters without spaces (it has {} bytes)",
            path.display(),
            token.len()
        );
    }
    Ok(token.to_string())
}

/// `lockd dev`'s admin token: `DATA_DIR/admin-token`, made (0600, 32 random bytes as hex) if it
/// is not there yet.
fn dev_admin_token_file(data_dir: &Path) -> anyhow::Result<PathBuf> {
    dev_secret_file(data_dir, "admin-token")
}

/// `lockd dev`'s peer secret, shared by its nodes: `DATA_DIR/peer-secret` (made like the admin
/// token), unless `--peer-secret-file` names one.
fn dev_peer_secret_file(common: &Common, data_dir: &Path) -> anyhow::Result<PathBuf> {
    match &common.peer_secret_file {
        Some(p) => Ok(p.clone()),
        None => dev_secret_file(data_dir, "peer-secret"),
    }
}

/// `DATA_DIR/NAME`, made (0600, 32 random bytes as hex) if it is not there yet.
fn dev_secret_file(data_dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
    use std::io::Write as _;
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    let path = data_dir.join(name);
    if path.exists() {
        return Ok(path);
    }
    // Private from the start, as the node makes it (else the node warns it was open).
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(data_dir)
        .with_context(|| format!("creating the data dir {}", data_dir.display()))?;
    let token: String = (0..32)
        .map(|_| format!("{:02x}", rand::random::<u8>()))
        .collect();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    writeln!(f, "{token}")?;
    f.sync_all()?;
    Ok(path)
}

/// `lockd dev --tls`: the throwaway CA and one certificate per node in DATA_DIR/tls, and each
/// node's `Common` set to serve with them (client ports over TLS, mutual TLS between nodes).
fn dev_tls(args: &DevArgs) -> anyhow::Result<Vec<Common>> {
    let ids: Vec<u64> = (1..=u64::from(args.nodes.max(1))).collect();
    if !args.tls {
        return Ok(ids.iter().map(|_| args.common.clone()).collect());
    }
    let mut ips = vec![
        std::net::IpAddr::from([127, 0, 0, 1]),
        std::net::IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
    ];
    for ip in [args.http.ip(), args.grpc.ip(), args.peer.ip()] {
        if !ips.contains(&ip) && !ip.is_unspecified() {
            ips.push(ip);
        }
    }
    let dir = args.data_dir.join("tls");
    let (ca, certs) = lockd_server::tls::dev_certificates(&dir, &ids, &ips)?;
    println!(
        "TLS: throwaway CA in {} (curl --cacert {0}; lockctl --ca-file {0})",
        ca.display()
    );
    Ok(certs
        .into_iter()
        .map(|c| {
            let mut common = args.common.clone();
            common.tls_cert_file = Some(c.cert.clone());
            common.tls_key_file = Some(c.key.clone());
            common.peer_cert_file = Some(c.cert);
            common.peer_key_file = Some(c.key);
            common.peer_ca_file = Some(ca.clone());
            common
        })
        .collect())
}

/// What only `serve` sets.
#[derive(Default)]
struct ServeExtras {
    /// The admin token file, already resolved (`lockd dev` makes one).
    admin_token_file: Option<PathBuf>,
    audit_log: Option<PathBuf>,
    join_existing: bool,
    skip_leader_lease_check: bool,
    zones: ZoneFlags,
}

/// `--zone`, `--initial-zones` (parsed) and `--allow-zone-majority`.
#[derive(Default)]
struct ZoneFlags {
    zone: Option<String>,
    initial: lockd_raft::Zones,
    allow_majority: bool,
}

impl ZoneFlags {
    fn of(a: &ServeArgs) -> anyhow::Result<ZoneFlags> {
        let initial = lockd_raft::parse_zones(a.initial_zones.as_deref().unwrap_or(""))
            .map_err(|e| anyhow::anyhow!("--initial-zones: {e}"))?;
        Ok(ZoneFlags {
            zone: a.zone.clone(),
            initial,
            allow_majority: a.allow_zone_majority,
        })
    }

    /// Sets `node`'s zones: its --zone defaults to its own entry in --initial-zones.
    fn apply(self, node: &mut NodeConfig) {
        node.zone = self
            .zone
            .or_else(|| self.initial.get(&node.node_id).cloned())
            .unwrap_or_default();
        node.founder_zones = self.initial;
        node.allow_zone_majority = self.allow_majority;
    }
}

/// The addresses a node listens on.
struct Listen {
    http: SocketAddr,
    grpc: SocketAddr,
    peer: SocketAddr,
    /// Probes and metrics only (`--probes`).
    probes: Option<SocketAddr>,
}

/// [`Listen`]'s listeners, bound.
struct Bound {
    http: TcpListener,
    grpc: TcpListener,
    peer: TcpListener,
    probes: Option<TcpListener>,
}

impl Listen {
    fn new(http: SocketAddr, grpc: SocketAddr, peer: SocketAddr) -> Listen {
        Listen {
            http,
            grpc,
            peer,
            probes: None,
        }
    }

    /// Binds every port, each error naming its port; the ports must differ.
    async fn bind(self) -> anyhow::Result<Bound> {
        let Listen {
            http,
            grpc,
            peer,
            probes,
        } = self;
        if peer == grpc || peer == http {
            bail!("the peer address {peer} must differ from the client ports (--http, --grpc)");
        }
        if probes.is_some_and(|p| [http, grpc, peer].contains(&p)) {
            bail!("--probes must differ from --http, --grpc and the peer port");
        }
        let bind = |addr: SocketAddr, what: &'static str| async move {
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding {what} {addr}"))
        };
        let probes = match probes {
            Some(addr) => Some(bind(addr, "the probes port").await?),
            None => None,
        };
        Ok(Bound {
            http: bind(http, "HTTP").await?,
            grpc: bind(grpc, "gRPC").await?,
            peer: bind(peer, "the peer port").await?,
            probes,
        })
    }
}

/// What a started node says on stderr: its ports, and how its doors are guarded.
fn print_banners(
    node_id: u64,
    running: &lockd_server::Running,
    data_dir: &Path,
    tls: Option<&lockd_server::tls::ClientTls>,
    common: &Common,
    admin_token_file: Option<&Path>,
) {
    let scheme = if tls.is_some() { "https" } else { "http" };
    banner!(
        "lockd node {node_id} (pid {}): HTTP {scheme}://{} gRPC {scheme}://{} peer {} data {}",
        std::process::id(),
        running.http_addr,
        running.grpc_addr,
        running.peer_addr,
        data_dir.display()
    );
    if let Some(addr) = running.probes_addr {
        banner!("lockd node {node_id}: probes and metrics at http://{addr} (plain HTTP)");
    }
    match tls {
        Some(t) if t.client_ca_pem.is_some() => {
            banner!("lockd node {node_id}: client ports over TLS; client certificates required")
        }
        Some(_) => banner!("lockd node {node_id}: client ports over TLS"),
        None => banner!(
            "lockd node {node_id}: client ports in PLAIN TEXT (no --tls-cert-file): bearer \
             tokens and session ids cross the network in clear; for loopback development only"
        ),
    }
    match (&common.peer_cert_file, &common.peer_secret_file) {
        (Some(_), _) => {}
        (None, Some(path)) => banner!(
            "lockd node {node_id}: peer port in plain text, open to the cluster's nodes only \
             (the peer secret in {}); it is readable on the wire: keep the port on loopback or \
             a private network, or use --peer-cert-file",
            path.display()
        ),
        (None, None) => banner!(
            "lockd node {node_id}: peer port in PLAIN TEXT with NO peer secret \
             (--peer-secret-file): anything that reaches it can act as a node"
        ),
    }
    match admin_token_file {
        Some(path) => banner!(
            "lockd node {node_id}: admin token in {} (lockctl --admin-token-file)",
            path.display()
        ),
        None => banner!(
            "lockd node {node_id}: no admin token (--admin-token-file): admin calls are refused"
        ),
    }
}

/// Sets `node`'s settings from the shared flags (`peer`: the bound peer port, which decides
/// whether a plain-text peer port needs a secret).
fn configure_node(node: &mut NodeConfig, common: &Common, peer: SocketAddr) -> anyhow::Result<()> {
    node.lock_groups = common.groups_for(&node.data_dir, lockd_server::cli::DEFAULT_GROUPS)?;
    node.replicas = common.replicas;
    node.cluster_name = common.cluster_name.clone();
    node.heartbeat_ms = common.heartbeat_ms;
    node.election_timeout_ms = (
        common.election_timeout_ms,
        common.election_timeout_ms * 3 / 2,
    );
    node.snapshot_every = common.snapshot_every;
    node.balance_leaders = !common.no_leader_balance;
    node.peer_tls = common.peer_tls()?;
    node.peer_secret = common.peer_secret(peer)?;
    Ok(())
}

async fn run_node(
    node_id: u64,
    peers: BTreeMap<u64, String>,
    listen: Listen,
    data_dir: &Path,
    common: &Common,
    extras: ServeExtras,
) -> anyhow::Result<()> {
    if !peers.contains_key(&node_id) {
        return Err(refused(format!(
            "--peers must include this node ({node_id})"
        )));
    }
    let namespaces = match &common.config {
        Some(path) => FileConfig::load(path).and_then(|f| f.namespaces()),
        None => FileConfig::default().namespaces(),
    }
    .map_err(refused)?;
    let admin_token = match &extras.admin_token_file {
        Some(path) => Some(read_admin_token(path)?),
        None => None,
    };
    lockd_server::conns::raise_fd_limit(common.max_client_connections)?;
    let Bound {
        http,
        grpc,
        peer,
        probes,
    } = listen.bind().await?;
    let mut node = NodeConfig::new(node_id, data_dir, peers);
    node.join_existing = extras.join_existing;
    extras.zones.apply(&mut node);
    configure_node(&mut node, common, peer.local_addr()?)?;
    let tls = common.client_tls()?;
    if extras.skip_leader_lease_check {
        tracing::warn!("NEGATIVE CONTROL: skip-leader-lease-check; this node is unsafe");
        eprintln!("lockd node {node_id}: NEGATIVE CONTROL skip-leader-lease-check (unsafe)");
        node.skip_leader_lease_check = true;
    }
    let running = lockd_server::start(ServerConfig {
        node,
        http,
        grpc,
        peer,
        namespaces,
        audit_log: extras.audit_log,
        admin_token,
        tls: tls.clone(),
        max_client_connections: common.max_client_connections,
        client_idle_timeout: lockd_server::conns::IDLE_TIMEOUT,
        auth_failure_burst: common.auth_failure_burst,
        session_opens_per_address: common.session_opens_per_address,
        probes,
    })
    .await?;
    let admin_token_file = extras.admin_token_file.as_deref();
    print_banners(
        node_id,
        &running,
        data_dir,
        tls.as_ref(),
        common,
        admin_token_file,
    );
    serve_until_stopped(node_id, running).await
}

/// Serves until SIGTERM or Ctrl-C (a clean stop) or until a group fails, which stops the node
/// with exit 2 when a restart would be refused again, else 1.
async fn serve_until_stopped(node_id: u64, running: lockd_server::Running) -> anyhow::Result<()> {
    // A group whose storage failed cannot serve again in this process: exit non-zero so that a
    // supervisor restarts the node (which replays its log, or refuses a damaged one).
    let fatal = running.service.node.fatal();
    tokio::spawn(lockd_server::systemd::ready_when_serving(
        running.service.clone(),
    ));
    tokio::select! {
        _ = shutdown_signal() => {
            banner!("lockd node {node_id}: stopping");
            let _ = lockd_server::systemd::notify("STOPPING=1");
            running.stop().await;
            Ok(())
        }
        failure = fatal => {
            let then = match failure.refused {
                true => "stopping, refused (exit 2: a restart as it is would be refused again)",
                false => "stopping with an error so that a supervisor restarts it (exit 1)",
            };
            failure!("lockd node {node_id}: {failure}; {then}");
            let stop = tokio::time::timeout(Duration::from_secs(10), running.stop());
            if stop.await.is_err() {
                failure!("lockd node {node_id}: the stop took over 10 s; exiting anyway");
            }
            let e = anyhow::anyhow!("node {node_id}: {failure}");
            Err(if failure.refused { refused(format!("{e}")) } else { e })
        }
    }
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// What every node of `lockd dev --nodes N` shares.
struct DevShared {
    peers: String,
    admin: PathBuf,
    secret: PathBuf,
    groups: u32,
    threads: u16,
    /// `--initial-zones` for `--zones Z` (node i in zone `z((i-1) mod Z + 1)`).
    initial_zones: Option<String>,
}

/// Node `i`'s (from 0) zone under `lockd dev --zones zones`.
fn dev_zone(i: u32, zones: u32) -> Option<String> {
    (zones > 0).then(|| format!("z{}", i % zones + 1))
}

/// The `i`-th (from 0) node's port: `base`'s plus `i`.
fn dev_port(base: SocketAddr, i: u32) -> SocketAddr {
    SocketAddr::new(base.ip(), base.port() + i as u16)
}

/// Node `i` (from 0) of `lockd dev --nodes N`, as `lockd serve` arguments.
fn dev_serve_args(args: &DevArgs, i: u32, common: &Common, shared: &DevShared) -> ServeArgs {
    let (http, grpc) = (dev_port(args.http, i), dev_port(args.grpc, i));
    let dir = args.data_dir.join(format!("node-{}", i + 1));
    let mut serve = ServeArgs::new(u64::from(i) + 1, shared.peers.clone(), http, grpc, dir);
    serve.peer = Some(dev_port(args.peer, i));
    serve.common = common.clone();
    serve.common.admin_token_file = Some(shared.admin.clone());
    serve.common.peer_secret_file = Some(shared.secret.clone());
    serve.common.groups = Some(shared.groups);
    serve.common.worker_threads = Some(shared.threads);
    serve.initial_zones = shared.initial_zones.clone();
    serve
}

/// Starts `serve` as a child process logging as this one does; answers it and its command
/// line (printed if it exits, to restart it by hand).
fn spawn_node(
    exe: &Path,
    serve: &ServeArgs,
    log_format: LogFormat,
) -> anyhow::Result<(Child, String)> {
    let mut cmd = Command::new(exe);
    cmd.args(serve.to_args());
    if log_format == LogFormat::Json {
        cmd.env("LOCKD_LOG_FORMAT", "json");
    }
    let line = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    let child = cmd
        .spawn()
        .with_context(|| format!("starting node {}", serve.node_id))?;
    Ok((child, line))
}

/// Stops each child: SIGTERM lets a node stop cleanly; SIGKILL after a grace period.
async fn stop_nodes(children: &mut [(u32, Child, String)]) {
    for (id, child, _) in children {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::time::Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if matches!(child.try_wait(), Ok(None)) {
            let _ = child.kill();
        }
        let _ = child.wait();
        println!("node {id} stopped");
    }
}

/// `lockd dev --nodes N`: N child processes of `lockd serve`, stopped together on Ctrl-C.
/// Until Ctrl-C or SIGTERM: says which node exited and how to start it again; fails once
/// every node has exited.
async fn watch_nodes(children: &mut Vec<(u32, Child, String)>) -> anyhow::Result<()> {
    let mut interval = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = shutdown_signal() => break,
            _ = interval.tick() => {
                for (id, child, line) in children.iter_mut() {
                    if let Ok(Some(status)) = child.try_wait() {
                        println!("node {id} (pid {}) exited: {status}; restart it with:\n  {line}", child.id());
                    }
                }
                children.retain_mut(|(_, c, _)| !matches!(c.try_wait(), Ok(Some(_))));
                if children.is_empty() {
                    bail!("every node has exited");
                }
            }
        }
    }
    Ok(())
}

async fn run_cluster(args: &DevArgs, log_format: LogFormat) -> anyhow::Result<()> {
    let n = args.nodes;
    let exe = std::env::current_exe().context("finding the lockd binary")?;
    let list = |f: &dyn Fn(u32) -> String| (0..n).map(f).collect::<Vec<_>>().join(",");
    let admin = match &args.common.admin_token_file {
        Some(p) => p.clone(),
        None => dev_admin_token_file(&args.data_dir)?,
    };
    let commons = dev_tls(args)?;
    // The nodes share this machine's cores: size groups and threads for that, unless told.
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let shared = DevShared {
        peers: list(&|i| format!("{}={}", i + 1, dev_port(args.peer, i))),
        admin,
        secret: dev_peer_secret_file(&args.common, &args.data_dir)?,
        groups: args.common.groups_for(
            &args.data_dir.join("node-1"),
            lockd_server::cli::shared_machine_groups(n, cores),
        )?,
        threads: args
            .common
            .worker_threads
            .unwrap_or_else(|| lockd_server::cli::shared_machine_threads(n, cores)),
        initial_zones: (args.zones > 0).then(|| {
            list(&|i| format!("{}={}", i + 1, dev_zone(i, args.zones).unwrap_or_default()))
        }),
    };
    let mut children: Vec<(u32, Child, String)> = Vec::new();
    for i in 0..n {
        let c = &commons[i as usize];
        let serve = dev_serve_args(args, i, c, &shared);
        let (child, line) = spawn_node(&exe, &serve, log_format)?;
        let scheme = if c.tls_cert_file.is_some() {
            "https"
        } else {
            "http"
        };
        let zone = dev_zone(i, args.zones).map_or(String::new(), |z| format!(" zone {z}"));
        println!(
            "node {}{zone} pid {} http {scheme}://{} grpc {scheme}://{} peer {}",
            i + 1,
            child.id(),
            serve.http,
            serve.grpc,
            dev_port(args.peer, i)
        );
        children.push((i + 1, child, line));
    }
    let (groups, threads) = (shared.groups, shared.threads);
    println!(
        "{n} nodes running on {cores} cores: {groups} lock group(s), {threads} scheduler \
         thread(s) each (--groups, --worker-threads); `kill -9 <pid>` one to watch failover; \
         Ctrl-C stops all"
    );
    println!(
        "admin token in {} (lockctl --admin-token-file)",
        shared.admin.display()
    );
    watch_nodes(&mut children).await?;
    stop_nodes(&mut children).await;
    Ok(())
}

fn main() -> ExitCode {
    lockd_server::status::mark_start();
    // The config file's [server] settings become environment variables before the flags are
    // parsed (only where neither the flag's variable is set), so one parser checks all three
    // ways of setting a value. Done first, while this process has one thread.
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // The subcommand wherever global flags put it (`lockd --log-format json serve ...`); a
    // flag's value that happens to read `serve` only makes this look for a config it would
    // have read anyway.
    let serving = argv
        .iter()
        .skip(1)
        .take_while(|a| *a != "--")
        .any(|a| a == "serve" || a == "dev");
    if serving {
        match lockd_server::cli::config_file_env(&argv, |k| std::env::var(k).ok()) {
            Ok(vars) => {
                for (k, v) in vars {
                    std::env::set_var(k, v);
                }
            }
            Err(e) => {
                eprintln!("lockd: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let cli = Cli::parse();
    let common = match &cli.cmd {
        Cmd::Dev(a) => &a.common,
        Cmd::Serve(a) => &a.common,
        offline_cmd @ (Cmd::Restore(_) | Cmd::InspectData(_)) => return offline(offline_cmd),
    };
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.enable_all();
    if let Some(t) = common.worker_threads {
        rt.worker_threads(usize::from(t));
    }
    match rt.build() {
        Ok(rt) => rt.block_on(run(cli)),
        Err(e) => {
            eprintln!("lockd: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `lockd dev`: one node hosting every group.
async fn run_dev(a: &DevArgs) -> anyhow::Result<()> {
    if a.zones > 0 {
        return Err(refused(
            "--zones spreads nodes over zones: give --nodes N as well",
        ));
    }
    let peers = BTreeMap::from([(1, a.peer.to_string())]);
    let listen = Listen::new(a.http, a.grpc, a.peer);
    let admin = match &a.common.admin_token_file {
        Some(p) => p.clone(),
        None => dev_admin_token_file(&a.data_dir)?,
    };
    let secret = dev_peer_secret_file(&a.common, &a.data_dir)?;
    let extras = ServeExtras {
        admin_token_file: Some(admin),
        ..ServeExtras::default()
    };
    let mut common = dev_tls(a)?.swap_remove(0);
    common.peer_secret_file = Some(secret);
    run_node(1, peers, listen, &a.data_dir, &common, extras).await
}

/// `lockd serve`.
async fn run_serve(a: &ServeArgs) -> anyhow::Result<()> {
    let peers = parse_peers(&a.peers).map_err(|e| refused(format!("{e:#}")))?;
    let extras = ServeExtras {
        zones: ZoneFlags::of(a).map_err(refused)?,
        admin_token_file: a.common.admin_token_file.clone(),
        audit_log: a.audit_log.clone(),
        join_existing: a.initial_cluster_state == "existing",
        #[cfg(feature = "negative-controls")]
        skip_leader_lease_check: a.unsafe_negative_control.is_some(),
        #[cfg(not(feature = "negative-controls"))]
        skip_leader_lease_check: false,
    };
    let own = match (a.peer, peers.get(&a.node_id)) {
        (Some(_), _) | (None, None) => None,
        (None, Some(p)) => Some(resolve_own(p).await?),
    };
    let Some(peer) = a.peer.or(own) else {
        return Err(refused(format!(
            "--peers has no entry for node {} to listen on (or give --peer)",
            a.node_id
        )));
    };
    let listen = Listen {
        probes: a.probes,
        ..Listen::new(a.http, a.grpc, peer)
    };
    run_node(a.node_id, peers, listen, &a.data_dir, &a.common, extras).await
}

async fn run(cli: Cli) -> ExitCode {
    use std::io::IsTerminal as _;
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LOCKD_LOG")
                .unwrap_or_else(|_| "warn,openraft=error,lockd_server=info,lockd_raft=info".into()),
        )
        .with_writer(std::io::stderr);
    match cli.log_format {
        // Escape codes only where a terminal renders them, never into a file or a journal.
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => {
            JSON_LOGS.store(true, std::sync::atomic::Ordering::Relaxed);
            logs.json().init()
        }
    }
    let result = match &cli.cmd {
        offline_cmd @ (Cmd::Restore(_) | Cmd::InspectData(_)) => return offline(offline_cmd),
        Cmd::Dev(a) if a.nodes > 1 => run_cluster(a, cli.log_format).await,
        Cmd::Dev(a) => run_dev(a).await,
        Cmd::Serve(a) => run_serve(a).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            failure!("lockd: {e:#}");
            ExitCode::from(lockd_server::systemd::exit_code(&e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_parse_and_complain_clearly() {
        let p = parse_peers("1=127.0.0.1:7170, 2=127.0.0.1:7171").unwrap();
        assert_eq!(p[&2], "127.0.0.1:7171");
        assert!(parse_peers("1=x")
            .unwrap_err()
            .to_string()
            .contains("HOST:PORT"));
        assert!(parse_peers("a=127.0.0.1:1")
            .unwrap_err()
            .to_string()
            .contains("not a number"));
        assert!(parse_peers("1=127.0.0.1:1,1=127.0.0.1:2")
            .unwrap_err()
            .to_string()
            .contains("twice"));
        assert!(parse_peers("").is_err());
    }
}
