//! etcd as a comparison target: a 3-member cluster on loopback, spoken to as its users do.
//!
//! Why the gRPC client: etcd's users call it through clientv3, over gRPC, with one lease kept
//! alive on a bidirectional stream. `etcd-client` (the maintained Rust client, on the same tonic
//! and prost as lockd) does the same, so this row measures etcd as deployed. The JSON gateway
//! stays as a labelled extra row (`etcd_gateway.rs`).
//!
//! Two flavours, both with one lease per client (as clientv3's concurrency.Session does):
//! - `Txn`: lock = `If create_revision(key)==0 Then Put(key, owner, lease)`,
//!   release = `If value(key)==owner Then Delete(key)` (what most etcd lock libraries do);
//! - `LockRpc`: etcd's own v3lock `Lock`/`Unlock` (a blocking lock: uncontended it returns at
//!   once; contended it waits, so its "try-lock" is not a try).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, LeaseKeepAliveStream, LeaseKeeper, LockOptions,
    PutOptions, SortOrder, SortTarget, Txn, TxnOp,
};
use hyper::{Method, StatusCode};
use tempfile::TempDir;

use crate::http::HttpConn;
use lockd_testkit::free_ports;

use crate::procs::{loopback, wait_ready, Server};
use crate::target::{LockTarget, Token};

/// Members in the cluster, as users deploy it.
const MEMBERS: usize = 3;

/// A running 3-member cluster; dropping it stops every member, then removes the data.
pub struct Cluster {
    // Field order matters: members stop before their data dir is removed.
    members: Vec<Server>,
    clients: Vec<SocketAddr>,
    _dir: TempDir,
}

impl Cluster {
    /// Starts the members (fsync on: no `--unsafe-no-fsync`) and waits until all are healthy.
    /// `threads`: GOMAXPROCS for every member (`None`: Go's default, one per core).
    pub async fn start(data_root: &Path, threads: Option<u16>) -> Result<Cluster> {
        let dir = tempfile::Builder::new()
            .prefix("lockd-bench-etcd-")
            .tempdir_in(data_root)?;
        let ports = free_ports(2 * MEMBERS);
        let (client_ports, peer_ports) = ports.split_at(MEMBERS);
        let initial: Vec<String> = peer_ports
            .iter()
            .enumerate()
            .map(|(i, p)| format!("m{i}=http://127.0.0.1:{p}"))
            .collect();
        let mut members = Vec::new();
        for i in 0..MEMBERS {
            let client = format!("http://127.0.0.1:{}", client_ports[i]);
            let peer = format!("http://127.0.0.1:{}", peer_ports[i]);
            let args: Vec<String> = [
                "--name",
                &format!("m{i}"),
                "--data-dir",
                &dir.path().join(format!("m{i}")).display().to_string(),
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
                "--initial-cluster",
                &initial.join(","),
                "--initial-cluster-token",
                "lockd-bench",
                "--initial-cluster-state",
                "new",
                "--logger",
                "zap",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let env: Vec<(&str, String)> = threads
                .map(|t| ("GOMAXPROCS", t.to_string()))
                .into_iter()
                .collect();
            members.push(Server::start_with_env(
                &format!("etcd-m{i}"),
                "etcd",
                &args,
                &env,
                dir.path(),
            )?);
        }
        let clients: Vec<SocketAddr> = client_ports.iter().map(|&p| loopback(p)).collect();
        for &addr in &clients {
            wait_ready(&mut members, Duration::from_secs(30), || health(addr)).await?;
        }
        Ok(Cluster {
            members,
            clients,
            _dir: dir,
        })
    }

    /// The members' client addresses (gRPC, and the JSON gateway on the same port).
    pub fn clients(&self) -> &[SocketAddr] {
        &self.clients
    }

    /// The members' pids, for CPU accounting.
    pub fn pids(&self) -> Vec<u32> {
        self.members.iter().map(Server::pid).collect()
    }

    /// Fails if a member died (e.g. during a run).
    pub fn check_alive(&mut self) -> Result<()> {
        self.members.iter_mut().try_for_each(Server::check_alive)
    }
}

/// `GET /health` answers `{"health":"true"}` once the member has a leader.
async fn health(addr: SocketAddr) -> Result<()> {
    let mut c = HttpConn::connect(addr).await?;
    let (status, body) = c.request(Method::GET, "/health", None).await?;
    let v: serde_json::Value = serde_json::from_slice(&body)?;
    if status != StatusCode::OK || v["health"] != "true" {
        bail!("{addr} not healthy: {status} {v}");
    }
    Ok(())
}

/// Which lock protocol to speak.
#[derive(Clone, Copy, Debug)]
pub enum Flavour {
    Txn,
    LockRpc,
}

/// The key range end that covers every key starting with `prefix` (etcd's prefix convention).
pub fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            break;
        }
    }
    end
}

/// etcd over gRPC as a `LockTarget`. Clients are spread round-robin over the members
/// (followers forward writes to the leader, as with clientv3 pinned to a follower).
pub struct EtcdTarget {
    members: Vec<SocketAddr>,
    flavour: Flavour,
}

impl EtcdTarget {
    pub fn new(members: &[SocketAddr], flavour: Flavour) -> EtcdTarget {
        EtcdTarget {
            members: members.to_vec(),
            flavour,
        }
    }
}

/// One client, as one worker process holds it: a gRPC connection (one HTTP/2 connection) to
/// one member, its lease, and the lease's keepalive stream.
pub struct EtcdClient {
    client: Client,
    lease: i64,
    keeper: LeaseKeeper,
    keepalives: LeaseKeepAliveStream,
}

impl LockTarget for EtcdTarget {
    type Client = EtcdClient;

    async fn prepare(&self, id: usize, ttl: Duration) -> Result<EtcdClient> {
        let addr = self.members[id % self.members.len()];
        let mut client = Client::connect([format!("http://{addr}")], None)
            .await
            .with_context(|| format!("connect etcd {addr}"))?;
        let ttl = i64::try_from(ttl.as_secs()).context("lease ttl")?;
        let lease = client.lease_grant(ttl, None).await?.id();
        let (keeper, keepalives) = client.lease_keep_alive(lease).await?;
        Ok(EtcdClient {
            client,
            lease,
            keeper,
            keepalives,
        })
    }

    async fn acquire(&self, c: &mut EtcdClient, name: &str, owner: &str) -> Result<Option<Token>> {
        match self.flavour {
            Flavour::Txn => {
                let put = PutOptions::new().with_lease(c.lease);
                let txn = Txn::new()
                    .when([Compare::create_revision(name, CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(name, owner, Some(put))]);
                let r = c.client.txn(txn).await?;
                Ok(r.succeeded().then(|| owner.to_owned()))
            }
            Flavour::LockRpc => {
                let opts = LockOptions::new().with_lease(c.lease);
                let r = c.client.lock(name, Some(opts)).await?;
                // The token is the lock key (`name/<lease hex>`), kept readable.
                Ok(Some(String::from_utf8_lossy(r.key()).into_owned()))
            }
        }
    }

    async fn release(&self, c: &mut EtcdClient, name: &str, token: &str) -> Result<bool> {
        match self.flavour {
            Flavour::Txn => {
                let txn = Txn::new()
                    .when([Compare::value(name, CompareOp::Equal, token)])
                    .and_then([TxnOp::delete(name, None)]);
                Ok(c.client.txn(txn).await?.succeeded())
            }
            Flavour::LockRpc => {
                // Unlock deletes the lock key; a token that holds nothing deletes nothing.
                c.client.unlock(token).await?;
                Ok(true)
            }
        }
    }

    async fn keepalive(&self, c: &mut EtcdClient, _held: Option<(&str, &str)>) -> Result<()> {
        // One round trip on the lease's stream, as clientv3's keepalive loop sends it.
        c.keeper.keep_alive().await?;
        match c.keepalives.message().await? {
            Some(r) if r.ttl() > 0 => Ok(()),
            Some(_) => bail!("lease {:x} expired", c.lease),
            None => bail!("lease {:x}: keepalive stream closed", c.lease),
        }
    }

    async fn read(&self, c: &mut EtcdClient, name: &str) -> Result<Option<String>> {
        match self.flavour {
            Flavour::Txn => {
                let r = c.client.get(name, None).await?;
                Ok(r.kvs()
                    .first()
                    .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
            }
            // v3lock keys are `name/<lease hex>`; the holder is the oldest one.
            Flavour::LockRpc => {
                let prefix = format!("{name}/");
                let opts = GetOptions::new()
                    .with_range(prefix_end(&prefix))
                    .with_limit(1)
                    .with_sort(SortTarget::Create, SortOrder::Ascend);
                let r = c.client.get(prefix.as_str(), Some(opts)).await?;
                Ok(r.kvs()
                    .first()
                    .map(|kv| String::from_utf8_lossy(kv.key()).into_owned()))
            }
        }
    }

    async fn finish(&self, mut c: EtcdClient) -> Result<()> {
        c.client.lease_revoke(c.lease).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_bumps_last_byte() {
        assert_eq!(prefix_end("a/"), b"a0".to_vec());
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80".to_vec());
    }
}
