//! `lockd serve`'s arguments as a type, shared by the binary and every harness that starts
//! nodes.
//!
//! Why here and not in main.rs: test kits, the benchmark, the fault checker and `lockd dev
//! --nodes N` all start `lockd serve` processes. They build a [`ServeArgs`] and render it with
//! [`ServeArgs::to_args`], so a flag is spelled in one place and a renamed or removed flag is a
//! compile error in every harness, not a node that refuses to start.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser};

use crate::tls::ClientTls;

#[derive(Args, Clone, Debug, PartialEq)]
pub struct Common {
    /// A TOML file: `[[namespace]]` entries (docs/API.md) and a `[server]` table with any of
    /// these settings by name (`heartbeat_ms = 100`). A flag beats its LOCKD_* variable, which
    /// beats the file, which beats the default.
    #[arg(long, env = "LOCKD_CONFIG")]
    pub config: Option<PathBuf>,
    /// Lock groups (G); group 0, the meta group, comes on top. Recorded in the data dir on
    /// first start: a later start with another count is refused. Default: the count the data
    /// dir recorded; for a new cluster 4, except under `lockd dev --nodes N`, whose N
    /// replicas share this machine's cores: one group per core each node gets (cores / N,
    /// within 1..=4), since on shared cores extra groups cost more than they spread
    /// (docs/BENCHMARKS.md). Add groups later with `lockctl groups create`.
    #[arg(long, env = "LOCKD_GROUPS")]
    pub groups: Option<u32>,
    /// Replicas per lock group (3 or 5 in production), placed over the founding nodes: group g
    /// on `replicas` consecutive nodes from the ((g-1) × replicas)-th, so 6 nodes with
    /// `--groups 2 --replicas 3` host groups 1 and 2 on disjoint halves. 0 (the default) or at
    /// least the node count: every node hosts every group. The meta group is on every founder.
    /// Recorded in the data dir on first start.
    #[arg(long, env = "LOCKD_REPLICAS", default_value_t = 0)]
    pub replicas: usize,
    /// The cluster's name, recorded in each data dir on its first start; a dir is never started
    /// under another name (1-64 of A-Z a-z 0-9 . _ -).
    #[arg(long, env = "LOCKD_CLUSTER_NAME", default_value = "lockd")]
    pub cluster_name: String,
    /// Raft heartbeat interval.
    #[arg(long, env = "LOCKD_HEARTBEAT_MS", default_value_t = 100)]
    pub heartbeat_ms: u64,
    /// Raft election timeout: a random value in [min, 1.5 × min]. Failover takes about this plus
    /// one election round; keep it well above the heartbeat and the disk's worst fsync.
    #[arg(long, env = "LOCKD_ELECTION_TIMEOUT_MS", default_value_t = 400)]
    pub election_timeout_ms: u64,
    /// Log entries between snapshots.
    #[arg(long, env = "LOCKD_SNAPSHOT_EVERY", default_value_t = 20_000)]
    pub snapshot_every: u64,
    /// Threads running the node's async work (default: one per core). Replicas that share a
    /// machine do better with fewer: three on two cores with one each spend less on
    /// cross-thread wake-ups than extra threads gain (docs/BENCHMARKS.md).
    #[arg(long, env = "LOCKD_WORKER_THREADS", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub worker_threads: Option<u16>,
    /// Leave each group with whichever node won its election, instead of handing it to its
    /// preferred leader (group g: the (g mod n)-th voter) so that leaders spread over nodes.
    #[arg(long, env = "LOCKD_NO_LEADER_BALANCE")]
    pub no_leader_balance: bool,
    /// At most this many connections open at once on each client port (HTTP and gRPC); one
    /// more is closed at once (on HTTP after a 503 `too_many_connections`). Size it with the
    /// process's file descriptor limit (`ulimit -n`).
    #[arg(long, env = "LOCKD_MAX_CLIENT_CONNECTIONS", default_value_t = crate::conns::DEFAULT_MAX_CLIENT_CONNECTIONS,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_client_connections: u32,
    /// Failed authentications (401/403) a client address may make in a row before it is
    /// answered 429 until one more is allowed (one a second); 0 turns the budget off.
    #[arg(long, env = "LOCKD_AUTH_FAILURE_BURST", default_value_t = crate::authfail::BURST)]
    pub auth_failure_burst: u32,
    /// Sessions a client address may open per second, ten seconds' worth at once; past that an
    /// open is answered 429 until one more is allowed. A host of workers opens one per
    /// process; set 0 (no budget) only for a benchmark that stands in for many hosts.
    #[arg(long, env = "LOCKD_SESSION_OPENS_PER_ADDRESS", default_value_t = crate::opens::PER_S)]
    pub session_opens_per_address: u32,
    /// A file holding the admin bearer token (16-256 printable ASCII characters): it opens the
    /// admin calls (listing sessions, other holders' session ids, cluster operations) and every
    /// namespace. Without it they are refused; `lockd dev` makes one in its data dir.
    #[arg(long, env = "LOCKD_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Serve the client ports (HTTP and gRPC) over TLS with this certificate chain (PEM). Without
    /// it they speak plain text: for loopback development only.
    #[arg(long, env = "LOCKD_TLS_CERT_FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert-file.
    #[arg(long, env = "LOCKD_TLS_KEY_FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
    /// Require a client certificate signed by this CA (PEM) on the client ports.
    #[arg(long, env = "LOCKD_TLS_CLIENT_CA_FILE", requires = "tls_cert_file")]
    pub tls_client_ca_file: Option<PathBuf>,
    /// Mutual TLS between nodes: this node's certificate (PEM). It must name `node-<id>.lockd`
    /// among its DNS names and allow server and client authentication. Without the three
    /// --peer-*-file flags the peer port speaks plain text.
    #[arg(long, env = "LOCKD_PEER_CERT_FILE", requires_all = ["peer_key_file", "peer_ca_file"])]
    pub peer_cert_file: Option<PathBuf>,
    /// The private key (PEM) of --peer-cert-file.
    #[arg(long, env = "LOCKD_PEER_KEY_FILE", requires = "peer_cert_file")]
    pub peer_key_file: Option<PathBuf>,
    /// The cluster's CA (PEM): the only issuer whose peers are let in.
    #[arg(long, env = "LOCKD_PEER_CA_FILE", requires = "peer_cert_file")]
    pub peer_ca_file: Option<PathBuf>,
    /// A file holding the cluster's peer secret (32-256 printable ASCII characters), the same on
    /// every node: every peer call carries it and a call without it is refused, so a plain-text
    /// peer port answers the cluster's nodes only. `lockd dev` makes one in its data dir.
    #[arg(long, env = "LOCKD_PEER_SECRET_FILE")]
    pub peer_secret_file: Option<PathBuf>,
    /// Serve a plain-text peer port on a non-loopback address with no --peer-secret-file:
    /// anything that reaches the port can then act as a node (vote, append, propose). Without
    /// this flag such a start is refused.
    #[arg(long, env = "LOCKD_INSECURE_PEER_PORT")]
    pub insecure_peer_port: bool,
}

/// Lock groups of a new cluster when nothing says otherwise (`lockd serve`).
pub const DEFAULT_GROUPS: u32 = 4;

/// The default lock groups for `nodes` replicas that share a machine of `cores` cores: one per
/// core each node gets, within 1..=[`DEFAULT_GROUPS`]. On 2 cores, 3 replicas with 1 group ran
/// the benchmark mix 1.6x as fast as with 4, at a lower tail (docs/benchmarks-log.md).
pub fn shared_machine_groups(nodes: u32, cores: usize) -> u32 {
    let per_node = cores / (nodes.max(1) as usize);
    (per_node as u32).clamp(1, DEFAULT_GROUPS)
}

/// The default scheduler threads for each of `nodes` replicas sharing `cores` cores: the
/// node's share, at least one (one per core each would oversubscribe the machine N times).
pub fn shared_machine_threads(nodes: u32, cores: usize) -> u16 {
    let per_node = cores / (nodes.max(1) as usize);
    per_node.clamp(1, usize::from(u16::MAX)) as u16
}

impl Common {
    /// The lock group count to start with: `--groups`, else what `dir` recorded, else
    /// `fresh` (the default for a new cluster).
    pub fn groups_for(&self, dir: &std::path::Path, fresh: u32) -> anyhow::Result<u32> {
        if let Some(g) = self.groups {
            return Ok(g);
        }
        let recorded = lockd_raft::Identity::read(dir).map_err(anyhow::Error::msg)?;
        Ok(recorded.map_or(fresh, |i| i.lock_groups))
    }

    /// The peer secret every node's calls must carry (`--peer-secret-file`), checked against
    /// how the peer port at `peer` is served: a plain-text port off loopback needs a secret or
    /// `--insecure-peer-port`. `None`: no secret (mutual TLS, loopback, or declared open).
    pub fn peer_secret(&self, peer: std::net::SocketAddr) -> anyhow::Result<Option<String>> {
        if let Some(path) = &self.peer_secret_file {
            return read_secret(path, "peer secret", 32).map(Some);
        }
        if self.peer_cert_file.is_none() && !peer.ip().is_loopback() && !self.insecure_peer_port {
            anyhow::bail!(
                "the peer port {peer} is plain text (no --peer-cert-file) off loopback and has no \
                 --peer-secret-file: anything that reached it could act as a node (vote, append \
                 entries, propose). Give every node the same --peer-secret-file, or mutual TLS \
                 (--peer-cert-file, --peer-key-file, --peer-ca-file), or say \
                 --insecure-peer-port to serve it open on a network you trust"
            );
        }
        Ok(None)
    }

    /// The client ports' TLS, loaded and checked.
    pub fn client_tls(&self) -> anyhow::Result<Option<ClientTls>> {
        match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(cert), Some(key)) => {
                ClientTls::load(cert, key, self.tls_client_ca_file.as_deref()).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// The peer port's mutual TLS, read.
    pub fn peer_tls(&self) -> anyhow::Result<Option<lockd_raft::PeerTls>> {
        use crate::tls::read_pem;
        match (
            &self.peer_cert_file,
            &self.peer_key_file,
            &self.peer_ca_file,
        ) {
            (Some(cert), Some(key), Some(ca)) => Ok(Some(lockd_raft::PeerTls {
                cert_pem: read_pem(cert, "peer certificate")?,
                key_pem: read_pem(key, "peer key")?,
                ca_pem: read_pem(ca, "peer CA")?,
            })),
            _ => Ok(None),
        }
    }
}

#[derive(Args, Clone, Debug, PartialEq)]
pub struct ServeArgs {
    /// This node's id (1..).
    #[arg(long, env = "LOCKD_NODE_ID")]
    pub node_id: u64,
    /// Every member's node-to-node address: `1=10.0.0.1:7270,2=10.0.0.2:7270,3=10.0.0.3:7270`
    /// (the `--peer` ports, never the client ones).
    #[arg(long, env = "LOCKD_PEERS")]
    pub peers: String,
    /// The client HTTP/JSON API.
    #[arg(long, env = "LOCKD_HTTP")]
    pub http: SocketAddr,
    /// The client gRPC API; it does not serve the node-to-node service.
    #[arg(long, env = "LOCKD_GRPC")]
    pub grpc: SocketAddr,
    /// Where this node listens for its peers (default: its own entry in --peers). Only the
    /// other nodes need to reach it; keep it off the clients' network.
    #[arg(long, env = "LOCKD_PEER")]
    pub peer: Option<SocketAddr>,
    /// Also serve `GET /livez`, `/readyz` and `/metrics` here: plain HTTP, outside the client
    /// ports' connection cap and their TLS (a kubelet probe, a plain Prometheus scrape; etcd's
    /// `--listen-metrics-urls`). Nothing else is served there; keep it where only they reach.
    #[arg(long, env = "LOCKD_PROBES")]
    pub probes: Option<SocketAddr>,
    #[arg(long, env = "LOCKD_DATA_DIR")]
    pub data_dir: PathBuf,
    /// `new`: this node founds the cluster with the other --peers (each group is initialised
    /// by the lowest-id node it is placed on). `existing`: it joins a running cluster and never
    /// initialises a group.
    #[arg(long, env = "LOCKD_INITIAL_CLUSTER_STATE", default_value = "new", value_parser = ["new", "existing"])]
    pub initial_cluster_state: String,
    /// This node's zone (a failure domain: an availability zone, a rack; 1-64 of A-Z a-z 0-9 .
    /// _ -). Recorded in the data dir and the meta group; a node never changes zone. Membership
    /// changes keep every group's voters out of a zone majority (docs/OPERATIONS.md).
    #[arg(long, env = "LOCKD_ZONE")]
    pub zone: Option<String>,
    /// Every founder's zone, `1=a,2=b,3=c`, the same on each founder (with `new`): the founding
    /// placement spreads each group's replicas over them, so no zone holds a majority of any
    /// group (5 replicas over 3 zones: 2+2+1). A founder's --zone defaults to its entry here.
    #[arg(long, env = "LOCKD_INITIAL_ZONES")]
    pub initial_zones: Option<String>,
    /// Found the cluster even where the zones leave a group with a zone majority (losing that
    /// zone then loses the group).
    #[arg(long, env = "LOCKD_ALLOW_ZONE_MAJORITY")]
    pub allow_zone_majority: bool,
    /// Append every grant, end of a hold and end of a session this replica applies to this
    /// file (JSON lines, log order; read by `lockd-check`).
    #[arg(long, env = "LOCKD_AUDIT_LOG")]
    pub audit_log: Option<PathBuf>,
    /// NEGATIVE CONTROL for lockd-check; makes the node UNSAFE. `skip-leader-lease-check`: the
    /// leader acknowledges keepalives without its leader lease.
    /// Only in a build with the `negative-controls` feature (lockd-check's).
    #[cfg(feature = "negative-controls")]
    #[arg(long, hide = true, value_parser = ["skip-leader-lease-check"])]
    pub unsafe_negative_control: Option<String>,
    #[command(flatten)]
    pub common: Common,
}

impl ServeArgs {
    /// A node with the required flags and every other at its default, as `lockd serve` would
    /// parse that command line in an empty environment: no `LOCKD_*` variable of the caller's
    /// leaks in (`lockd dev --nodes N` turns its config file into variables, and a harness's
    /// nodes must not pick up whatever its shell has set).
    pub fn new(
        node_id: u64,
        peers: impl Into<String>,
        http: SocketAddr,
        grpc: SocketAddr,
        data_dir: impl Into<PathBuf>,
    ) -> ServeArgs {
        use clap::{CommandFactory, FromArgMatches};
        let data_dir: PathBuf = data_dir.into();
        let cmd = Wrapper::command().mut_args(|a| a.env(None));
        let m = cmd.get_matches_from([
            OsString::from("serve"),
            "--node-id".into(),
            node_id.to_string().into(),
            "--peers".into(),
            peers.into().into(),
            "--http".into(),
            http.to_string().into(),
            "--grpc".into(),
            grpc.to_string().into(),
            "--data-dir".into(),
            data_dir.into_os_string(),
        ]);
        Wrapper::from_arg_matches(&m)
            .expect("the required flags parse")
            .serve
    }

    /// Parses `serve`'s arguments (the first item is the program name, as `std::env::args`).
    pub fn parse_from<I, T>(args: I) -> ServeArgs
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        Wrapper::parse_from(args).serve
    }

    /// Parses, returning clap's error instead of exiting.
    pub fn try_parse_from<I, T>(args: I) -> Result<ServeArgs, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        Wrapper::try_parse_from(args).map(|w| w.serve)
    }

    /// The command line after the binary (`serve` first) that parses back to `self`.
    pub fn to_args(&self) -> Vec<OsString> {
        // Destructured without `..`: a new field is a compile error here until it is rendered.
        let ServeArgs {
            node_id,
            peers,
            http,
            grpc,
            peer,
            probes,
            data_dir,
            initial_cluster_state,
            zone,
            initial_zones,
            allow_zone_majority,
            audit_log,
            #[cfg(feature = "negative-controls")]
            unsafe_negative_control,
            common,
        } = self;
        let mut v: Vec<OsString> = vec!["serve".into()];
        let mut flag = |name: &str, value: OsString| {
            v.push(format!("--{name}").into());
            v.push(value);
        };
        flag("node-id", node_id.to_string().into());
        flag("peers", peers.into());
        flag("http", http.to_string().into());
        flag("grpc", grpc.to_string().into());
        if let Some(p) = peer {
            flag("peer", p.to_string().into());
        }
        if let Some(p) = probes {
            flag("probes", p.to_string().into());
        }
        flag("data-dir", data_dir.into());
        flag("initial-cluster-state", initial_cluster_state.into());
        if let Some(z) = zone {
            flag("zone", z.into());
        }
        if let Some(z) = initial_zones {
            flag("initial-zones", z.into());
        }
        if let Some(f) = audit_log {
            flag("audit-log", f.into());
        }
        #[cfg(feature = "negative-controls")]
        if let Some(c) = unsafe_negative_control {
            flag("unsafe-negative-control", c.into());
        }
        if *allow_zone_majority {
            v.push("--allow-zone-majority".into());
        }
        common.push_args(&mut v);
        v
    }
}

impl Common {
    /// Appends the flags that parse back to `self`.
    fn push_args(&self, v: &mut Vec<OsString>) {
        // Destructured without `..`: a new field is a compile error here until it is rendered.
        let Common {
            config,
            groups,
            replicas,
            cluster_name,
            heartbeat_ms,
            election_timeout_ms,
            snapshot_every,
            worker_threads,
            no_leader_balance,
            max_client_connections,
            auth_failure_burst,
            session_opens_per_address: opens,
            admin_token_file,
            tls_cert_file,
            tls_key_file,
            tls_client_ca_file,
            peer_cert_file,
            peer_key_file,
            peer_ca_file,
            peer_secret_file,
            insecure_peer_port,
        } = self;
        let mut flag = |name: &str, value: OsString| {
            v.push(format!("--{name}").into());
            v.push(value);
        };
        if let Some(f) = config {
            flag("config", f.into());
        }
        if let Some(g) = groups {
            flag("groups", g.to_string().into());
        }
        let values = [
            ("replicas", replicas.to_string()),
            ("cluster-name", cluster_name.to_string()),
            ("heartbeat-ms", heartbeat_ms.to_string()),
            ("election-timeout-ms", election_timeout_ms.to_string()),
            ("snapshot-every", snapshot_every.to_string()),
            ("max-client-connections", max_client_connections.to_string()),
            ("auth-failure-burst", auth_failure_burst.to_string()),
            ("session-opens-per-address", opens.to_string()),
        ];
        (values.into_iter()).for_each(|(name, value)| flag(name, value.into()));
        if let Some(t) = worker_threads {
            flag("worker-threads", t.to_string().into());
        }
        let files = [
            ("admin-token-file", admin_token_file),
            ("tls-cert-file", tls_cert_file),
            ("tls-key-file", tls_key_file),
            ("tls-client-ca-file", tls_client_ca_file),
            ("peer-cert-file", peer_cert_file),
            ("peer-key-file", peer_key_file),
            ("peer-ca-file", peer_ca_file),
            ("peer-secret-file", peer_secret_file),
        ];
        for (name, file) in files {
            if let Some(f) = file {
                flag(name, f.into());
            }
        }
        let switches = [
            ("--no-leader-balance", *no_leader_balance),
            ("--insecure-peer-port", *insecure_peer_port),
        ];
        v.extend(switches.into_iter().filter(|s| s.1).map(|s| s.0.into()));
    }
}

#[derive(Parser)]
struct Wrapper {
    #[command(flatten)]
    serve: ServeArgs,
}

/// Settings from the `[server]` table of the `--config` file (or `LOCKD_CONFIG`), as the
/// environment variables to set: one key per `lockd serve` flag, named as the flag without its
/// dashes (`heartbeat_ms` or `heartbeat-ms`). A flag on the command line wins over its
/// environment variable, which wins over the file, which wins over the built-in default: a key
/// is returned only where `env` has no value for its variable. So every setting is a flag, an
/// environment variable and a config-file key, parsed and checked by one parser (clap's).
///
/// ```toml
/// [server]
/// node_id = 1
/// peers = "1=10.0.0.1:7270,2=10.0.0.2:7270,3=10.0.0.3:7270"
/// http = "0.0.0.0:7070"
/// grpc = "0.0.0.0:7170"
/// data_dir = "/var/lib/lockd"
/// admin_token_file = "/etc/lockd/admin-token"
/// ```
pub fn config_file_env(
    argv: &[OsString],
    env: impl Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, String> {
    let mut path = None;
    let mut args = argv.iter().skip(1);
    while let Some(a) = args.next() {
        let a = a.to_string_lossy();
        if a == "--" {
            break;
        }
        if a == "--config" {
            path = args.next().map(PathBuf::from);
        } else if let Some(v) = a.strip_prefix("--config=") {
            path = Some(PathBuf::from(v));
        }
    }
    let Some(path) = path.or_else(|| env("LOCKD_CONFIG").map(PathBuf::from)) else {
        return Ok(Vec::new());
    };
    let text =
        std::fs::read_to_string(&path).map_err(|e| format!("--config {}: {e}", path.display()))?;
    let table: toml::Table =
        toml::from_str(&text).map_err(|e| format!("--config {}: {e}", path.display()))?;
    let Some(server) = table.get("server") else {
        return Ok(Vec::new());
    };
    let server = server
        .as_table()
        .ok_or_else(|| format!("--config {}: [server] must be a table", path.display()))?;
    let cmd = <Wrapper as clap::CommandFactory>::command();
    let settable: Vec<(String, String)> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| {
            let long = a.get_long()?;
            let env = a.get_env()?.to_str()?;
            (long != "config").then(|| (long.to_string(), env.to_string()))
        })
        .collect();
    let mut out = Vec::new();
    for (key, value) in server {
        let long = key.replace('_', "-");
        let Some((_, var)) = settable.iter().find(|(l, _)| *l == long) else {
            let known: Vec<String> = settable.iter().map(|(l, _)| l.replace('-', "_")).collect();
            return Err(format!(
                "--config {}: [server] has no setting '{key}'; the settings are: {}",
                path.display(),
                known.join(", ")
            ));
        };
        let value = match value {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            other => {
                return Err(format!(
                    "--config {}: [server] {key} must be a string, a number or true/false, not \
                     {}",
                    path.display(),
                    other.type_str()
                ))
            }
        };
        if env(var).is_none() {
            out.push((var.clone(), value));
        }
    }
    Ok(out)
}

/// Reads a secret from `path`: one line of `min`-256 printable ASCII characters.
pub fn read_secret(path: &std::path::Path, what: &str, min: usize) -> anyhow::Result<String> {
    use anyhow::Context as _;
    let raw = std::fs::read_to_string(path)
        .with_context(|| format!("reading the {what} file {}", path.display()))?;
    let secret = raw.trim();
    if !(min..=256).contains(&secret.len()) || !secret.bytes().all(|b| b.is_ascii_graphic()) {
        anyhow::bail!(
            "the {what} in {} must be {min}-256 printable ASCII characters without spaces (it \
             has {} bytes)",
            path.display(),
            secret.len()
        );
    }
    Ok(secret.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_renders_and_parses_back() {
        let mut a = ServeArgs::new(
            3,
            "1=127.0.0.1:7270,2=127.0.0.1:7271,3=127.0.0.1:7272",
            "127.0.0.1:7072".parse().unwrap(),
            "127.0.0.1:7172".parse().unwrap(),
            "/var/lib/lockd/node 3",
        );
        // Every field away from its default, so that a flag rendered wrong cannot hide.
        a.peer = Some("127.0.0.1:7272".parse().unwrap());
        a.probes = Some("127.0.0.1:9372".parse().unwrap());
        a.initial_cluster_state = "existing".into();
        a.audit_log = Some("/tmp/audit.jsonl".into());
        #[cfg(feature = "negative-controls")]
        {
            a.unsafe_negative_control = Some("skip-leader-lease-check".into());
        }
        let c = &mut a.common;
        c.config = Some("/etc/lockd/namespaces.toml".into());
        c.groups = Some(8);
        c.replicas = 5;
        c.cluster_name = "payments-eu".into();
        c.heartbeat_ms = 50;
        c.election_timeout_ms = 900;
        c.snapshot_every = 1234;
        c.worker_threads = Some(2);
        c.no_leader_balance = true;
        c.max_client_connections = 77;
        c.auth_failure_burst = 5;
        c.admin_token_file = Some("/etc/lockd/admin".into());
        c.tls_cert_file = Some("/etc/lockd/tls.crt".into());
        c.tls_key_file = Some("/etc/lockd/tls.key".into());
        c.tls_client_ca_file = Some("/etc/lockd/clients.ca".into());
        c.peer_cert_file = Some("/etc/lockd/peer.crt".into());
        c.peer_key_file = Some("/etc/lockd/peer.key".into());
        c.peer_ca_file = Some("/etc/lockd/peer.ca".into());
        let mut line = vec![OsString::from("lockd")];
        line.extend(a.to_args().into_iter().skip(1));
        assert_eq!(ServeArgs::try_parse_from(line).unwrap(), a);
    }

    #[test]
    fn replicas_sharing_a_machine_get_its_share_of_groups_and_threads() {
        // This 2-core machine with 3 replicas: one of each (measured faster than 4 groups).
        assert_eq!(shared_machine_groups(3, 2), 1);
        assert_eq!(shared_machine_threads(3, 2), 1);
        assert_eq!(shared_machine_groups(3, 8), 2);
        assert_eq!(shared_machine_threads(3, 8), 2);
        assert_eq!(shared_machine_groups(3, 64), DEFAULT_GROUPS);
        assert_eq!(shared_machine_threads(3, 64), 21);
        assert_eq!(shared_machine_groups(0, 0), 1);
        assert_eq!(shared_machine_threads(0, 0), 1);
    }

    #[test]
    fn the_group_count_is_the_flag_else_the_data_dirs_else_the_fresh_default() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = ServeArgs::new(
            1,
            "1=127.0.0.1:7270",
            "127.0.0.1:7070".parse().unwrap(),
            "127.0.0.1:7170".parse().unwrap(),
            "d",
        )
        .common;
        assert_eq!(c.groups_for(dir.path(), 3).unwrap(), 3, "a new dir");
        lockd_raft::Identity {
            cluster: "lockd".into(),
            node_id: 1,
            lock_groups: 6,
            ..lockd_raft::Identity::default()
        }
        .check_or_record(dir.path())
        .unwrap();
        assert_eq!(c.groups_for(dir.path(), 3).unwrap(), 6, "the dir's count");
        c.groups = Some(2);
        assert_eq!(
            c.groups_for(dir.path(), 3).unwrap(),
            2,
            "the flag (the start then refuses it)"
        );
    }

    #[test]
    fn defaults_are_lockd_serves() {
        let a = ServeArgs::new(
            1,
            "1=127.0.0.1:7270",
            "127.0.0.1:7070".parse().unwrap(),
            "127.0.0.1:7170".parse().unwrap(),
            "d",
        );
        assert_eq!(a.common.groups, None, "the data dir's count, else 4");
        assert_eq!(a.common.heartbeat_ms, 100);
        assert_eq!(a.initial_cluster_state, "new");
        assert!(!a.common.no_leader_balance);
        let mut line = vec![OsString::from("lockd")];
        line.extend(a.to_args().into_iter().skip(1));
        assert_eq!(ServeArgs::parse_from(line), a);
    }

    #[test]
    fn the_config_files_server_table_sets_what_no_flag_or_variable_sets() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("lockd.toml");
        std::fs::write(
            &file,
            "[server]\nnode_id = 2\nheartbeat-ms = 150\nno_leader_balance = true\n\
             data_dir = \"/var/lib/lockd\"\n\n[[namespace]]\nname = \"pay\"\nprefix = \"pay/\"\n",
        )
        .unwrap();
        let argv = |extra: &[&str]| -> Vec<OsString> {
            let mut v: Vec<OsString> = vec!["lockd".into(), "serve".into()];
            v.extend(extra.iter().map(OsString::from));
            v
        };
        let f = file.to_str().unwrap();
        let mut got = config_file_env(&argv(&["--config", f]), |_| None).unwrap();
        got.sort();
        let want = [
            ("LOCKD_DATA_DIR", "/var/lib/lockd"),
            ("LOCKD_HEARTBEAT_MS", "150"),
            ("LOCKD_NODE_ID", "2"),
            ("LOCKD_NO_LEADER_BALANCE", "true"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(got, want);
        // `--config=FILE`, and LOCKD_CONFIG, find it too; a set variable wins over the file.
        let by_env = config_file_env(&argv(&[]), |k| match k {
            "LOCKD_CONFIG" => Some(f.to_string()),
            "LOCKD_HEARTBEAT_MS" => Some("90".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(by_env.len(), 3, "{by_env:?}");
        assert!(!by_env.iter().any(|(k, _)| k == "LOCKD_HEARTBEAT_MS"));
        let eq = config_file_env(&argv(&[&format!("--config={f}")]), |_| None).unwrap();
        assert_eq!(eq.len(), 4);
        // No config, or no [server] table: nothing.
        assert!(config_file_env(&argv(&[]), |_| None).unwrap().is_empty());

        // The variables parse as clap parses the flags (the file's values are checked there).
        let a = Wrapper::try_parse_from([
            "lockd",
            "--node-id",
            "2",
            "--peers",
            "2=127.0.0.1:1",
            "--http",
            "127.0.0.1:2",
            "--grpc",
            "127.0.0.1:3",
            "--data-dir",
            "/d",
            "--no-leader-balance",
        ])
        .unwrap();
        assert!(a.serve.common.no_leader_balance);

        for (text, needle) in [
            ("[server]\nheartbeat = 1\n", "no setting 'heartbeat'"),
            ("[server]\nconfig = \"x\"\n", "no setting 'config'"),
            (
                "[server]\npeers = [1, 2]\n",
                "must be a string, a number or true/false",
            ),
            ("server = 3\n", "[server] must be a table"),
            ("[server\n", "--config"),
        ] {
            std::fs::write(&file, text).unwrap();
            let e = config_file_env(&argv(&["--config", f]), |_| None).unwrap_err();
            assert!(e.contains(needle), "{text:?}: {e}");
        }
        let e =
            config_file_env(&argv(&["--config", "/nonexistent/lockd.toml"]), |_| None).unwrap_err();
        assert!(e.contains("/nonexistent/lockd.toml"), "{e}");
    }
}
