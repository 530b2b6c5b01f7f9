//! etcd through its JSON gateway: a labelled extra row, not the comparison.
//!
//! etcd 3.4 also serves its gRPC API as JSON over HTTP/1.1 on the client port (grpc-gateway).
//! The gateway runs inside etcd and forwards each call over a loopback gRPC connection, so every
//! request pays JSON, base64 and an extra internal hop. etcd's users call it over gRPC
//! (clientv3), which is what the `etcd` and `etcd-lock` systems do (`etcd.rs`); this row shows
//! what the gateway costs, and lets older runs in the benchmark log be compared.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use base64::prelude::{Engine, BASE64_STANDARD};
use serde::Deserialize;
use serde_json::json;

use crate::etcd::{prefix_end, Flavour};
use crate::http::HttpConn;
use crate::target::{LockTarget, Token};

/// etcd through its JSON gateway as a `LockTarget`. Clients are spread round-robin over the
/// members, as for the gRPC target.
pub struct GatewayTarget {
    members: Vec<SocketAddr>,
    flavour: Flavour,
}

impl GatewayTarget {
    pub fn new(members: &[SocketAddr], flavour: Flavour) -> GatewayTarget {
        GatewayTarget {
            members: members.to_vec(),
            flavour,
        }
    }
}

/// One client: a keep-alive connection to one member and its lease (the gateway prints int64
/// as a JSON string; we pass it back as is).
pub struct GatewayClient {
    conn: HttpConn,
    lease: String,
}

fn b64(s: &str) -> String {
    BASE64_STANDARD.encode(s)
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

impl LockTarget for GatewayTarget {
    type Client = GatewayClient;

    async fn prepare(&self, id: usize, ttl: Duration) -> Result<GatewayClient> {
        let mut conn = HttpConn::connect(self.members[id % self.members.len()]).await?;
        let body = conn
            .post_json("/v3/lease/grant", &json!({ "TTL": ttl.as_secs() }))
            .await?;
        let lease: LeaseResp = serde_json::from_slice(&body).context("lease grant reply")?;
        Ok(GatewayClient {
            conn,
            lease: lease.id,
        })
    }

    async fn acquire(
        &self,
        c: &mut GatewayClient,
        name: &str,
        owner: &str,
    ) -> Result<Option<Token>> {
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

    async fn release(&self, c: &mut GatewayClient, name: &str, token: &str) -> Result<bool> {
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

    async fn keepalive(&self, c: &mut GatewayClient, _held: Option<(&str, &str)>) -> Result<()> {
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

    async fn read(&self, c: &mut GatewayClient, name: &str) -> Result<Option<String>> {
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

    async fn finish(&self, mut c: GatewayClient) -> Result<()> {
        c.conn
            .post_json("/v3/lease/revoke", &json!({ "ID": c.lease }))
            .await?;
        Ok(())
    }
}
