//! The one interface every measured system implements, and the list of systems.
//!
//! Why a trait with a per-client type: every workload (lock cycles, the seed's mix) is written
//! once against `LockTarget`, so lockd, etcd and Redis run the very same request sequence and
//! only the wire protocol differs. A `Client` is what one worker process would hold: its
//! connection and its session (an etcd lease, a lockd session; Redis has none and puts the TTL
//! on each lock instead).

use std::future::Future;
use std::time::Duration;

use anyhow::Result;

/// What a successful acquire returns and a release must present: opaque per system
/// (Redis: the random value; etcd Txn: the owner value; etcd Lock: the lock key; lockd: the
/// fencing token).
pub type Token = String;

/// A lock service under test. Every method is one request on the wire (one round trip), so an
/// "op" means the same thing for every system.
pub trait LockTarget: Send + Sync + 'static {
    /// One benchmark client, owned by one worker task.
    type Client: Send + 'static;

    /// Opens client `id`: its connection and a session of `ttl` (not measured).
    fn prepare(
        &self,
        id: usize,
        ttl: Duration,
    ) -> impl Future<Output = Result<Self::Client>> + Send;

    /// Try-lock `name` for `owner` (unique per attempt). `Ok(None)`: someone else holds it.
    fn acquire(
        &self,
        c: &mut Self::Client,
        name: &str,
        owner: &str,
    ) -> impl Future<Output = Result<Option<Token>>> + Send;

    /// Releases `name` if `token` still holds it. `Ok(false)`: not the holder.
    fn release(
        &self,
        c: &mut Self::Client,
        name: &str,
        token: &str,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Extends the client's session. Systems whose locks carry their own TTL (Redis) extend
    /// `held`, the lock the client holds now, if any.
    fn keepalive(
        &self,
        c: &mut Self::Client,
        held: Option<(&str, &str)>,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Reads who holds `name` (a status read), `None` if free.
    fn read(
        &self,
        c: &mut Self::Client,
        name: &str,
    ) -> impl Future<Output = Result<Option<String>>> + Send;

    /// Ends the client's session (not measured), so that leftovers never expire during a
    /// later measurement.
    fn finish(&self, c: Self::Client) -> impl Future<Output = Result<()>> + Send;
}

/// The systems `compare` knows. Each names one server setup plus one lock protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SystemKind {
    /// lockd, 3 replicas, fsync on; requests on each client's gRPC session stream, clients
    /// spread over the nodes.
    Lockd,
    /// The same cluster setup; one gRPC unary call per request, clients spread over the nodes.
    LockdUnary,
    /// The same cluster setup; the HTTP/JSON API, clients spread over the nodes.
    LockdHttp,
    /// The same cluster setup; session streams to every node, each lock request sent on the
    /// stream to its group's leader (no forward).
    LockdLeader,
    /// `lockd` with 4 lock groups (`--groups 4`), `lockd serve`'s default for a new cluster,
    /// where `lockd dev --nodes 3` (the `lockd` row) sizes groups to the cores each replica
    /// gets: the same cluster otherwise, gRPC session streams spread over the nodes.
    #[value(name = "lockd-4g")]
    Lockd4g,
    /// `lockd` with 8 lock groups (`--groups 8`), the design's shape (names hash to 4096
    /// buckets over 8 groups): the same cluster otherwise. What the per-group costs of more
    /// groups come to on these shared cores.
    #[value(name = "lockd-8g")]
    Lockd8g,
    /// `lockd` (the default configuration, gRPC session streams spread over the nodes) with TLS
    /// on every port: client ports over TLS, mutual TLS between the nodes.
    LockdTls,
    /// etcd 3.4, 3 members, fsync on, over gRPC (`etcd-client`, as clientv3 users call it);
    /// lock = Txn on create_revision with a lease kept alive on a stream.
    Etcd,
    /// The same cluster and client; lock = etcd's own v3lock Lock/Unlock RPC.
    EtcdLock,
    /// The same cluster; the `Etcd` protocol through etcd's JSON gateway (HTTP/1.1, base64, an
    /// internal gRPC hop): a labelled extra row, not how etcd's users call it.
    #[value(name = "etcd-gw")]
    EtcdGw,
    /// Redis with `appendonly yes`, `appendfsync always`; SET NX PX + Lua compare-and-delete.
    RedisAof,
    /// Redis in memory only (no AOF, no RDB); same protocol.
    RedisMem,
    /// ZooKeeper 3.8 (Debian), 3 members, `forceSync=yes`; lock = Apache Curator's
    /// `InterProcessMutex` recipe (an ephemeral sequential node, the lowest holds), one session
    /// per client (`zookeeper.rs`).
    Zookeeper,
}

impl SystemKind {
    pub fn is_lockd(self) -> bool {
        matches!(
            self,
            SystemKind::Lockd
                | SystemKind::LockdUnary
                | SystemKind::LockdHttp
                | SystemKind::LockdLeader
                | SystemKind::Lockd4g
                | SystemKind::Lockd8g
                | SystemKind::LockdTls
        )
    }

    /// The name printed in the table, as given on the command line.
    pub fn label(self) -> &'static str {
        match self {
            SystemKind::Lockd => "lockd",
            SystemKind::LockdUnary => "lockd-unary",
            SystemKind::LockdHttp => "lockd-http",
            SystemKind::LockdLeader => "lockd-leader",
            SystemKind::Lockd4g => "lockd-4g",
            SystemKind::Lockd8g => "lockd-8g",
            SystemKind::LockdTls => "lockd-tls",
            SystemKind::Etcd => "etcd",
            SystemKind::EtcdLock => "etcd-lock",
            SystemKind::EtcdGw => "etcd-gw",
            SystemKind::RedisAof => "redis-aof",
            SystemKind::RedisMem => "redis-mem",
            SystemKind::Zookeeper => "zookeeper",
        }
    }
}
