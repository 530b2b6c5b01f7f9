//! Redis as a comparison target: one redis-server on loopback, with or without an fsync'd AOF.
//!
//! Why Redis: it is what many teams use for locks (`SET key token NX PX ttl`, released by a Lua
//! compare-and-delete). It is one node with no replication, so it bounds from above what a
//! lock service that replicates can do; `appendfsync always` is its closest durable setting.
//! Clients share a few multiplexed (pipelined) connections, the way the `redis` crate is meant
//! to be used; this gives Redis the most batching per fsync, i.e. its best case.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use redis::aio::MultiplexedConnection;
use redis::Script;
use tempfile::TempDir;

use lockd_testkit::free_ports;

use crate::procs::{loopback, wait_ready, Server};
use crate::target::{LockTarget, Token};

/// Multiplexed connections shared round-robin by the clients.
const CONNECTIONS: usize = 4;

/// Deletes the key only if it still holds our token (so a late release cannot free the next
/// holder's lock).
const RELEASE_LUA: &str = r#"
if redis.call("GET", KEYS[1]) == ARGV[1] then
    return redis.call("DEL", KEYS[1])
else
    return 0
end"#;

/// Extends the key's TTL only if it still holds our token.
const EXTEND_LUA: &str = r#"
if redis.call("GET", KEYS[1]) == ARGV[1] then
    return redis.call("PEXPIRE", KEYS[1], ARGV[2])
else
    return 0
end"#;

/// How Redis persists.
#[derive(Clone, Copy, Debug)]
pub enum Durability {
    /// `appendonly yes`, `appendfsync always`: fsync before replying to a write.
    AofAlways,
    /// No AOF, no RDB snapshots: memory only.
    Memory,
}

/// A running redis-server; dropping it stops it, then removes its dir.
pub struct RedisServer {
    server: Server,
    addr: SocketAddr,
    _dir: TempDir,
}

impl RedisServer {
    pub async fn start(data_root: &Path, durability: Durability) -> Result<RedisServer> {
        let dir = tempfile::Builder::new()
            .prefix("lockd-bench-redis-")
            .tempdir_in(data_root)?;
        let port = free_ports(1)[0];
        let mut args: Vec<String> = [
            "--bind",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--dir",
            &dir.path().display().to_string(),
            "--save",
            "",
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        match durability {
            Durability::AofAlways => {
                args.extend(["--appendonly", "yes", "--appendfsync", "always"].map(String::from))
            }
            Durability::Memory => args.extend(["--appendonly", "no"].map(String::from)),
        }
        let server = Server::start("redis", "redis-server", &args, dir.path())?;
        let addr = loopback(port);
        let mut servers = [server];
        wait_ready(&mut servers, Duration::from_secs(10), || async {
            let mut c = connect(addr).await?;
            redis::cmd("PING").query_async::<String>(&mut c).await?;
            Ok(())
        })
        .await?;
        let [server] = servers;
        Ok(RedisServer {
            server,
            addr,
            _dir: dir,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn pid(&self) -> u32 {
        self.server.pid()
    }

    /// Fails if the server died.
    pub fn check_alive(&mut self) -> Result<()> {
        self.server.check_alive()
    }
}

async fn connect(addr: SocketAddr) -> Result<MultiplexedConnection> {
    let client = redis::Client::open(format!("redis://{addr}/"))?;
    client
        .get_multiplexed_async_connection()
        .await
        .with_context(|| format!("connect redis {addr}"))
}

/// Redis as a `LockTarget`.
pub struct RedisTarget {
    conns: Vec<MultiplexedConnection>,
    release: Script,
    extend: Script,
}

impl RedisTarget {
    pub async fn connect(addr: SocketAddr) -> Result<RedisTarget> {
        let mut conns = Vec::new();
        for _ in 0..CONNECTIONS {
            conns.push(connect(addr).await?);
        }
        Ok(RedisTarget {
            conns,
            release: Script::new(RELEASE_LUA),
            extend: Script::new(EXTEND_LUA),
        })
    }
}

/// One client: a handle on a shared multiplexed connection, and the TTL each lock gets.
pub struct RedisClient {
    conn: MultiplexedConnection,
    ttl_ms: u64,
}

impl LockTarget for RedisTarget {
    type Client = RedisClient;

    async fn prepare(&self, id: usize, ttl: Duration) -> Result<RedisClient> {
        let conn = self.conns[id % self.conns.len()].clone();
        Ok(RedisClient {
            conn,
            ttl_ms: ttl.as_millis() as u64,
        })
    }

    async fn acquire(&self, c: &mut RedisClient, name: &str, owner: &str) -> Result<Option<Token>> {
        let ok: Option<String> = redis::cmd("SET")
            .arg(name)
            .arg(owner)
            .arg("NX")
            .arg("PX")
            .arg(c.ttl_ms)
            .query_async(&mut c.conn)
            .await?;
        Ok(ok.map(|_| owner.to_owned()))
    }

    async fn release(&self, c: &mut RedisClient, name: &str, token: &str) -> Result<bool> {
        // EVALSHA, with one EVAL fallback if the script cache is empty.
        let n: i64 = self
            .release
            .key(name)
            .arg(token)
            .invoke_async(&mut c.conn)
            .await?;
        Ok(n == 1)
    }

    async fn keepalive(&self, c: &mut RedisClient, held: Option<(&str, &str)>) -> Result<()> {
        // No sessions in Redis: extending the held lock is what a keepalive costs. With nothing
        // held, the script still runs (and extends nothing), so the op mix stays the same.
        let (name, token) = held.unwrap_or(("lockd-bench/none", ""));
        let _: i64 = self
            .extend
            .key(name)
            .arg(token)
            .arg(c.ttl_ms)
            .invoke_async(&mut c.conn)
            .await?;
        Ok(())
    }

    async fn read(&self, c: &mut RedisClient, name: &str) -> Result<Option<String>> {
        Ok(redis::cmd("GET").arg(name).query_async(&mut c.conn).await?)
    }

    async fn finish(&self, _c: RedisClient) -> Result<()> {
        Ok(())
    }
}
