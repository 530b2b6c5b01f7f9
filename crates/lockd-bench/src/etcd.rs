//! etcd as a comparison target: a 3-member cluster on loopback and two lock protocols.
//!
//! Why the JSON gateway: etcd 3.4 serves its gRPC API as JSON over HTTP/1.1 on the client port
//! (grpc-gateway), so we need no second tonic/prost next to lockd's. The gateway runs inside
//! etcd and forwards each call over a loopback gRPC connection, so it costs etcd some CPU; the
//! "read C=64" row (a linearizable range, no disk write) shows how fast that path alone can go.
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
use base64::prelude::{Engine, BASE64_STANDARD};
use hyper::{Method, StatusCode};
use serde::Deserialize;
use serde_json::json;
use tempfile::TempDir;

use crate::http::HttpConn;
use crate::procs::{free_ports, loopback, wait_ready, Server};
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
        let ports = free_ports(2 * MEMBERS)?;
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

    /// The members' client (gateway) addresses.
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

/// etcd as a `LockTarget`. Clients are spread round-robin over the members (followers forward
/// writes to the leader, as with clientv3 pinned to a follower).
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

/// One client: a keep-alive connection to one member and its lease (the gateway prints int64
/// as a JSON string; we pass it back as is).
pub struct EtcdClient {
    conn: HttpConn,
    lease: String,
}

fn b64(s: &str) -> String {
    BASE64_STANDARD.encode(s)
}

/// The key range end that covers every key starting with `prefix` (etcd's prefix convention).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            break;
        }
    }
    end
}

#[derive(Deserialize)]
struct TxnResp {
    #[serde(default)]
    succeeded: bool,
}

#[derive(Deserialize)]
struct LeaseResp {
    #[serde(rename = "ID")]
    id: String,
}

#[derive(Deserialize)]
struct KeepAliveResp {
    result: KeepAliveResult,
}

#[derive(Deserialize)]
struct KeepAliveResult {
    #[serde(rename = "TTL", default)]
    ttl: Option<String>,
}

#[derive(Deserialize)]
struct LockResp {
    key: String,
}

#[derive(Deserialize)]
struct RangeResp {
    #[serde(default)]
    kvs: Vec<Kv>,
}

#[derive(Deserialize)]
struct Kv {
    key: String,
    #[serde(default)]
    value: String,
}

fn decode(s: &str) -> Result<String> {
    Ok(String::from_utf8_lossy(&BASE64_STANDARD.decode(s)?).into_owned())
}

impl LockTarget for EtcdTarget {
    type Client = EtcdClient;

    async fn prepare(&self, id: usize, ttl: Duration) -> Result<EtcdClient> {
        let mut conn = HttpConn::connect(self.members[id % self.members.len()]).await?;
        let body = conn
            .post_json("/v3/lease/grant", &json!({ "TTL": ttl.as_secs() }))
            .await?;
        let lease: LeaseResp = serde_json::from_slice(&body).context("lease grant reply")?;
        Ok(EtcdClient {
            conn,
            lease: lease.id,
        })
    }

    async fn acquire(&self, c: &mut EtcdClient, name: &str, owner: &str) -> Result<Option<Token>> {
        match self.flavour {
            Flavour::Txn => {
                let key = b64(name);
                let req = json!({
                    "compare": [{"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
                    "success": [{"request_put": {"key": key, "value": b64(owner), "lease": c.lease}}],
                });
                let body = c.conn.post_json("/v3/kv/txn", &req).await?;
                let r: TxnResp = serde_json::from_slice(&body)?;
                Ok(r.succeeded.then(|| owner.to_owned()))
            }
            Flavour::LockRpc => {
                let req = json!({ "name": b64(name), "lease": c.lease });
                let body = c.conn.post_json("/v3/lock/lock", &req).await?;
                let r: LockResp = serde_json::from_slice(&body)?;
                // The token is the lock key (`name/<lease hex>`), kept readable.
                Ok(Some(decode(&r.key)?))
            }
        }
    }

    async fn release(&self, c: &mut EtcdClient, name: &str, token: &str) -> Result<bool> {
        match self.flavour {
            Flavour::Txn => {
                let key = b64(name);
                let req = json!({
                    "compare": [{"key": key, "target": "VALUE", "result": "EQUAL", "value": b64(token)}],
                    "success": [{"request_delete_range": {"key": key}}],
                });
                let body = c.conn.post_json("/v3/kv/txn", &req).await?;
                Ok(serde_json::from_slice::<TxnResp>(&body)?.succeeded)
            }
            Flavour::LockRpc => {
                // Unlock deletes the lock key; a token that holds nothing deletes nothing.
                c.conn
                    .post_json("/v3/lock/unlock", &json!({ "key": b64(token) }))
                    .await?;
                Ok(true)
            }
        }
    }

    async fn keepalive(&self, c: &mut EtcdClient, _held: Option<(&str, &str)>) -> Result<()> {
        let body = c
            .conn
            .post_json("/v3/lease/keepalive", &json!({ "ID": c.lease }))
            .await?;
        let r: KeepAliveResp = serde_json::from_slice(&body).context("keepalive reply")?;
        match r.result.ttl.as_deref() {
            Some(ttl) if ttl != "0" => Ok(()),
            _ => bail!("lease {} expired", c.lease),
        }
    }

    async fn read(&self, c: &mut EtcdClient, name: &str) -> Result<Option<String>> {
        let req = match self.flavour {
            Flavour::Txn => json!({ "key": b64(name) }),
            // v3lock keys are `name/<lease hex>`; the holder is the oldest one.
            Flavour::LockRpc => {
                let prefix = format!("{name}/");
                json!({
                    "key": b64(&prefix),
                    "range_end": BASE64_STANDARD.encode(prefix_end(&prefix)),
                    "limit": 1, "sort_order": "ASCEND", "sort_target": "CREATE",
                })
            }
        };
        let body = c.conn.post_json("/v3/kv/range", &req).await?;
        let r: RangeResp = serde_json::from_slice(&body)?;
        match (r.kvs.first(), self.flavour) {
            (None, _) => Ok(None),
            (Some(kv), Flavour::Txn) => Ok(Some(decode(&kv.value)?)),
            (Some(kv), Flavour::LockRpc) => Ok(Some(decode(&kv.key)?)),
        }
    }

    async fn finish(&self, mut c: EtcdClient) -> Result<()> {
        c.conn
            .post_json("/v3/lease/revoke", &json!({ "ID": c.lease }))
            .await?;
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
