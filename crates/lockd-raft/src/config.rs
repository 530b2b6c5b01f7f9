//! Node configuration: who the peers are, where data lives and the Raft timing.
//!
//! Kept apart from the runtime so the server can build it from flags or a file, and so every
//! timing knob that the protocol rules depend on (lease, expiry slack) is visible in one place.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::{MemStorage, NodeId, PeerTls};

/// Where a node keeps its Raft logs, votes and snapshots.
#[derive(Clone, Debug, Default)]
pub enum Storage {
    /// Files under `NodeConfig::data_dir` (raft-log WAL + snapshot files, fsync'd). Production.
    #[default]
    Disk,
    /// In memory, with a modelled fsync: only what a completed (simulated, delayed) flush made
    /// durable survives a crash. For the deterministic simulator; no threads, no files.
    Memory(Arc<MemStorage>),
}

/// How one node hosts its replicas.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// This node's id; must be a key of `peers`.
    pub node_id: NodeId,
    /// Root of this node's data; each group gets `group-<id>/` with `log/` and `snapshot.bin`.
    pub data_dir: PathBuf,
    /// Every member including this node: node id -> peer gRPC address (`127.0.0.1:7170`).
    pub peers: BTreeMap<NodeId, String>,
    /// The cluster's name, recorded in the data dir on its first start and checked on every
    /// later one ([`crate::Identity`]). Default `lockd`.
    pub cluster_name: String,
    /// Founder (`false`, etcd's `new`): the lowest-id peer initialises groups that have no
    /// membership yet. Joiner (`true`, `existing`): this node never initialises a group; it
    /// waits to be added by the cluster it joins.
    pub join_existing: bool,
    /// Number of lock groups G (1..=G; group 0 is the meta group).
    pub lock_groups: u32,
    /// Replicas per lock group, placed over the founding peers by [`crate::initial_placement`]
    /// (0, or at least the peer count: every node hosts every group). The meta group is on every
    /// founder. A node hosts only its groups and reaches the others over the peer port.
    pub replicas: usize,
    /// This node's zone (`--zone`; "": none declared), recorded with its identity and in the
    /// meta group, which membership changes read to keep every group's voters out of a zone
    /// majority ([`crate::zone_majority`]).
    pub zone: String,
    /// Every founder's zone (`--initial-zones`; empty: none), which the founding placement
    /// spreads each group's replicas over. Ignored on a node that joins an existing cluster.
    pub founder_zones: crate::Zones,
    /// Found the cluster even if a group's founding placement gives a zone a majority of its
    /// voters (`--allow-zone-majority`).
    pub allow_zone_majority: bool,
    /// Leader heartbeat interval.
    pub heartbeat_ms: u64,
    /// A follower calls an election after a random timeout in this range without a heartbeat.
    /// The upper bound is also the leader lease and the slack a new leader adds to every session.
    pub election_timeout_ms: (u64, u64),
    /// Log entries between snapshots; the log up to a snapshot is purged afterwards.
    pub snapshot_every: u64,
    /// Where logs and snapshots live (default: files under `data_dir`).
    pub storage: Storage,
    /// Hand each group to its preferred leader (`node/balance.rs`) so that the groups' leaders
    /// spread over the nodes. On by default.
    pub balance_leaders: bool,
    /// Mutual TLS on the peer port (`None`: plain text, for loopback development only). Every
    /// node then presents a certificate of the cluster's CA naming it ([`peer_dns_name`](crate::peer_dns_name)), and
    /// refuses a caller without one.
    pub peer_tls: Option<PeerTls>,
    /// The cluster's peer secret: every peer call carries it and every node checks it, so a
    /// plain-text peer port answers the cluster's nodes only (`peer/book.rs`). `None`: no
    /// check (mutual TLS, or a port the operator declared open with `--insecure-peer-port`).
    pub peer_secret: Option<String>,
    /// SIMULATION ONLY: rate of this node's clock relative to real (tokio) time, for lockd's own
    /// time reads (group-time stamping, session tracker). 1.0 in production.
    #[doc(hidden)]
    pub clock_rate: f64,
    /// NEGATIVE CONTROL ONLY: the leader acknowledges keepalives without checking its leader
    /// lease (quorum ack), so a deposed leader can extend sessions. Never set in production;
    /// not reachable from configuration files.
    #[doc(hidden)]
    pub skip_leader_lease_check: bool,
    /// NEGATIVE CONTROL ONLY: a leader answers reads from its own belief that it leads, with
    /// no lease (no quorum acknowledgement within the keepalive lease), so a deposed leader can
    /// answer a stale read, for `lockd-check sim --sabotage read-lease`. Never set in production.
    #[doc(hidden)]
    pub skip_read_lease_check: bool,
    /// NEGATIVE CONTROL ONLY: lock groups serve names of buckets they do not own (no
    /// ownership check), for `lockd-check sim --sabotage ownership`. Never set in production.
    #[doc(hidden)]
    pub skip_ownership_check: bool,
}

impl NodeConfig {
    /// The Raft timing every node of the cluster must share, as this node's flags set it (the
    /// meta group records the first node's and refuses a node whose timing differs).
    pub fn cluster_timing(&self) -> lockd_core::ClusterTiming {
        lockd_core::ClusterTiming {
            heartbeat_ms: self.heartbeat_ms,
            election_min_ms: self.election_timeout_ms.0,
            election_max_ms: self.election_timeout_ms.1,
        }
    }

    /// Defaults: heartbeat 100 ms, election timeout 400..800 ms (failover about 1.3 s on loopback),
    /// a snapshot every 20 000 entries, one lock group.
    pub fn new(
        node_id: NodeId,
        data_dir: impl Into<PathBuf>,
        peers: BTreeMap<NodeId, String>,
    ) -> Self {
        NodeConfig {
            node_id,
            data_dir: data_dir.into(),
            peers,
            cluster_name: "lockd".into(),
            peer_tls: None,
            peer_secret: None,
            join_existing: false,
            lock_groups: 1,
            replicas: 0,
            zone: String::new(),
            founder_zones: crate::Zones::new(),
            allow_zone_majority: false,
            heartbeat_ms: 100,
            election_timeout_ms: (400, 800),
            snapshot_every: 20_000,
            storage: Storage::Disk,
            balance_leaders: true,
            clock_rate: 1.0,
            skip_leader_lease_check: false,
            skip_read_lease_check: false,
            skip_ownership_check: false,
        }
    }

    /// A single node hosting every group with one replica (`lockd dev`).
    pub fn single(data_dir: impl Into<PathBuf>, addr: impl Into<String>) -> Self {
        NodeConfig::new(1, data_dir, BTreeMap::from([(1, addr.into())]))
    }
}

/// Checks a peer address: `HOST:PORT`, where HOST is an IPv4 address, a bracketed IPv6 address
/// or a DNS name (resolved each time a connection is made, so a StatefulSet pod's name follows
/// it to a new IP). The error says what is wrong.
pub fn check_peer_addr(addr: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("'{addr}' is not HOST:PORT ({why})"));
    let Some((host, port)) = addr.rsplit_once(':') else {
        return bad("no port");
    };
    // Decimal, no sign, no leading zero: the grammar docs/openapi.yaml states.
    let canonical = port.bytes().all(|b| b.is_ascii_digit()) && !port.starts_with('0');
    if !canonical || port.parse::<u16>().is_err() {
        return bad("the port must be 1-65535");
    }
    if addr.parse::<std::net::SocketAddr>().is_ok() {
        return Ok(());
    }
    if host.starts_with('[') || host.parse::<std::net::Ipv4Addr>().is_ok() {
        return bad("not a valid IP address");
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    let name = host.strip_suffix('.').unwrap_or(host);
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return bad("the host is neither an IP address nor a DNS name");
    }
    // A top-level label starts with a letter (RFC 3696), so "10.0.0.300" is no name.
    if !name
        .rsplit('.')
        .next()
        .is_some_and(|tld| tld.starts_with(|c: char| c.is_ascii_alphabetic()))
    {
        return bad("not a valid IP address, and a DNS name's last label starts with a letter");
    }
    Ok(())
}

#[cfg(test)]
mod addr_tests {
    use super::check_peer_addr;

    #[test]
    fn peer_addresses_are_ips_or_dns_names_with_a_port() {
        for ok in [
            "10.0.0.1:7270",
            "[::1]:7270",
            "localhost:7270",
            "lockd-0.lockd.prod.svc.cluster.local:7270",
            "node-2.:1",
        ] {
            assert_eq!(check_peer_addr(ok), Ok(()), "{ok}");
        }
        for bad in [
            "10.0.0.1",
            "lockd-0",
            "host:0",
            "host:70000",
            ":7270",
            "-host:7270",
            "ho_st:7270",
            "[::1:7270",
            "300.1.1.1:7270",
            "a..b:7270",
            "10.0.0.1:0",
            "10.0.0.1:07270",
            "host:+7270",
            "a.123:7270",
        ] {
            let e = check_peer_addr(bad).unwrap_err();
            assert!(e.contains(bad) && e.contains("HOST:PORT"), "{bad}: {e}");
        }
    }
}
