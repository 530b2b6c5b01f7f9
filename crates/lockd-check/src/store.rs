//! The fenced store: a real PostgreSQL table, as a user of lockd would protect their data.
//!
//! Each run gets its own schema (`ns`) with two tables:
//! * `kv(key, value, fence)`: one row per key. A fenced write is
//!   `UPDATE kv SET value = $v, fence = $token WHERE key = $k AND fence <= $token`; zero rows
//!   updated means rejected (a newer holder has written). The unfenced variant, for the control
//!   run, drops the `fence <= $token` condition. A fenced read raises the fence to the reader's
//!   token the same way, so that an older holder who read earlier can no longer write back
//!   (without it a read-modify-write still loses updates: A reads, B reads, A writes, B writes).
//! * `log(seq, key, op, token, fenced, accepted, fence_before, value)`: the store's own record of
//!   every write and fenced read, accepted or rejected, inserted in the same transaction as the
//!   update. The key's row is locked (`SELECT ... FOR UPDATE`) first, so per key the log's `seq`
//!   order is the order the updates took effect.

use anyhow::{bail, Context};
use tokio_postgres::{Client, NoTls};

use crate::history::{Outcome, Record, StoreOp};

/// Environment variable holding the PostgreSQL connection string for tests and the demo.
pub const PG_ENV: &str = "LOCKD_CHECK_PG";

/// How a write treats the fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fencing {
    Fenced,
    Unfenced,
    /// NEGATIVE CONTROL: behaves as [`Fencing::Unfenced`] but logs its writes as fenced, like a
    /// store whose fence check was removed by mistake. A run using it must fail the checker.
    SabotagedNoCheck,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    Accepted,
    /// The store has seen a newer token for the key.
    RejectedStale,
}

/// One connection to the store. Not shared between tasks: each worker opens its own.
pub struct Store {
    client: Client,
    ns: String,
    conn_task: tokio::task::JoinHandle<()>,
}

fn check_ns(ns: &str) -> anyhow::Result<()> {
    let ok = !ns.is_empty()
        && ns.len() <= 48
        && ns.starts_with(|c: char| c.is_ascii_lowercase())
        && ns
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !ok {
        bail!("store namespace {ns:?} must be 1-48 chars of [a-z0-9_], starting with a letter");
    }
    Ok(())
}

impl Store {
    /// Connects to the store `ns` (see [`Store::setup`] to create it).
    pub async fn connect(conn: &str, ns: &str) -> anyhow::Result<Self> {
        check_ns(ns)?;
        let (client, connection) = tokio_postgres::connect(conn, NoTls)
            .await
            .with_context(|| format!("connect to PostgreSQL ({conn})"))?;
        let conn_task = tokio::spawn(async move {
            if let Err(e) = connection.await {
                eprintln!("lockd-check store: connection ended: {e}");
            }
        });
        Ok(Self {
            client,
            ns: ns.to_owned(),
            conn_task,
        })
    }

    /// Creates the schema and its tables if missing. Call once per run, before workers connect.
    pub async fn setup(&self) -> anyhow::Result<()> {
        let ns = &self.ns;
        self.client
            .batch_execute(&format!(
                "CREATE SCHEMA IF NOT EXISTS {ns};
                 CREATE TABLE IF NOT EXISTS {ns}.kv (
                     key   TEXT PRIMARY KEY,
                     value TEXT NOT NULL,
                     fence BIGINT NOT NULL DEFAULT 0);
                 CREATE TABLE IF NOT EXISTS {ns}.log (
                     seq          BIGSERIAL PRIMARY KEY,
                     key          TEXT NOT NULL,
                     op           TEXT NOT NULL,
                     token        BIGINT,
                     fenced       BOOLEAN NOT NULL,
                     accepted     BOOLEAN NOT NULL,
                     fence_before BIGINT NOT NULL,
                     value        TEXT,
                     at           TIMESTAMPTZ NOT NULL DEFAULT now());"
            ))
            .await
            .context("create store tables")?;
        Ok(())
    }

    pub fn namespace(&self) -> &str {
        &self.ns
    }

    /// Sets `key` to `value` with fence 0 (starting a run).
    pub async fn init_key(&self, key: &str, value: &str) -> anyhow::Result<()> {
        self.client
            .execute(
                &format!(
                    "INSERT INTO {}.kv (key, value, fence) VALUES ($1, $2, 0)
                     ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, fence = 0",
                    self.ns
                ),
                &[&key, &value],
            )
            .await?;
        Ok(())
    }

    /// Writes `value` under `token`. Fenced: accepted only if no newer token was seen.
    pub async fn write(
        &mut self,
        key: &str,
        token: u64,
        value: &str,
        fencing: Fencing,
    ) -> anyhow::Result<WriteOutcome> {
        let ns = self.ns.clone();
        let t = i64::try_from(token).context("token beyond i64")?;
        let fenced = fencing != Fencing::Unfenced;
        let tx = self.client.transaction().await?;
        let row = tx
            .query_opt(
                &format!("SELECT fence FROM {ns}.kv WHERE key = $1 FOR UPDATE"),
                &[&key],
            )
            .await?;
        let Some(row) = row else {
            bail!("store key {key:?} was never initialised");
        };
        let fence_before: i64 = row.get(0);
        let n = if fencing == Fencing::Fenced {
            tx.execute(
                &format!(
                    "UPDATE {ns}.kv SET value = $1, fence = $2 WHERE key = $3 AND fence <= $2"
                ),
                &[&value, &t, &key],
            )
            .await?
        } else {
            tx.execute(
                &format!("UPDATE {ns}.kv SET value = $1, fence = $2 WHERE key = $3"),
                &[&value, &t, &key],
            )
            .await?
        };
        let accepted = n == 1;
        tx.execute(
            &format!(
                "INSERT INTO {ns}.log (key, op, token, fenced, accepted, fence_before, value)
                 VALUES ($1, 'write', $2, $3, $4, $5, $6)"
            ),
            &[&key, &t, &fenced, &accepted, &fence_before, &value],
        )
        .await?;
        tx.commit().await?;
        Ok(if accepted {
            WriteOutcome::Accepted
        } else {
            WriteOutcome::RejectedStale
        })
    }

    /// A plain read (not logged: it changes nothing).
    pub async fn read(&self, key: &str) -> anyhow::Result<String> {
        let row = self
            .client
            .query_one(
                &format!("SELECT value FROM {}.kv WHERE key = $1", self.ns),
                &[&key],
            )
            .await?;
        Ok(row.get(0))
    }

    /// A fenced read: raises the key's fence to `token` and returns the value, or `None` (rejected,
    /// logged) if the store has seen a newer token.
    pub async fn read_fenced(&mut self, key: &str, token: u64) -> anyhow::Result<Option<String>> {
        let ns = self.ns.clone();
        let t = i64::try_from(token).context("token beyond i64")?;
        let tx = self.client.transaction().await?;
        let Some(row) = tx
            .query_opt(
                &format!("SELECT fence, value FROM {ns}.kv WHERE key = $1 FOR UPDATE"),
                &[&key],
            )
            .await?
        else {
            bail!("store key {key:?} was never initialised");
        };
        let fence_before: i64 = row.get(0);
        let value: String = row.get(1);
        let n = tx
            .execute(
                &format!("UPDATE {ns}.kv SET fence = $1 WHERE key = $2 AND fence <= $1"),
                &[&t, &key],
            )
            .await?;
        let accepted = n == 1;
        let logged: Option<&str> = accepted.then_some(value.as_str());
        tx.execute(
            &format!(
                "INSERT INTO {ns}.log (key, op, token, fenced, accepted, fence_before, value)
                 VALUES ($1, 'read', $2, true, $3, $4, $5)"
            ),
            &[&key, &t, &accepted, &fence_before, &logged],
        )
        .await?;
        tx.commit().await?;
        Ok(accepted.then_some(value))
    }

    /// The store's log as history records, in `seq` order.
    pub async fn log_records(&self) -> anyhow::Result<Vec<Record>> {
        let rows = self
            .client
            .query(
                &format!(
                    "SELECT seq, key, op, token, fenced, accepted, fence_before, value
                     FROM {}.log ORDER BY seq",
                    self.ns
                ),
                &[],
            )
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let seq: i64 = r.get(0);
            let op: String = r.get(2);
            let token: Option<i64> = r.get(3);
            let fence_before: i64 = r.get(6);
            out.push(Record::StoreLog {
                seq: seq as u64,
                key: r.get(1),
                op: if op == "read" {
                    StoreOp::Read
                } else {
                    StoreOp::Write
                },
                token: token.map(|t| t as u64),
                fenced: r.get(4),
                accepted: r.get(5),
                fence_before: fence_before as u64,
                value: r.get(7),
            });
        }
        Ok(out)
    }

    /// Drops the schema and everything in it.
    pub async fn drop_namespace(&self) -> anyhow::Result<()> {
        self.client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.ns))
            .await?;
        Ok(())
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.conn_task.abort();
    }
}

impl From<WriteOutcome> for Outcome {
    fn from(w: WriteOutcome) -> Outcome {
        match w {
            WriteOutcome::Accepted => Outcome::Accepted,
            WriteOutcome::RejectedStale => Outcome::RejectedStale,
        }
    }
}

/// The lock-set workload's value: a JSON array of integers.
pub fn encode_set(set: &std::collections::BTreeSet<u64>) -> String {
    serde_json::to_string(set).expect("a set of integers serializes")
}

/// Reads a lock-set value back.
pub fn decode_set(s: &str) -> anyhow::Result<std::collections::BTreeSet<u64>> {
    serde_json::from_str(s).with_context(|| format!("store value {s:?} is not a set"))
}
