//! Fenced writes to PostgreSQL: the storage refuses a holder whose token is older than one it
//! has already seen, so a paused or partitioned ex-holder cannot clobber its successor.
//!
//! ```text
//! DATABASE_URL=postgres://localhost/app LOCKD_ENDPOINTS=127.0.0.1:7170 \
//!     cargo run -p lockd-client --example fenced_postgres -- accounts/42 1000
//! ```
//!
//! The write is one statement: it applies only if the row's fence is not newer than our token,
//! and records our token as the new fence. Zero rows updated means a newer holder exists: stop.
//!
//! ```sql
//! UPDATE fenced_kv SET value = $value, fence = $token WHERE key = $key AND fence <= $token;
//! ```
//!
//! To stay free of a database driver dependency this example speaks to PostgreSQL through
//! `psql` (with psql variables, so values are quoted by psql, not spliced by us); a service would
//! run the same statement through its own driver.

use std::time::Duration;

use lockd_client::fence::{write_fenced, FenceError, FencedStore};
use lockd_client::{Client, ClientOptions};
use tokio::io::AsyncWriteExt;

/// A `fenced_kv(key text primary key, value text, fence bigint)` table, via `psql`.
struct Postgres {
    url: String,
}

impl Postgres {
    async fn psql(&self, sql: &str, vars: &[(&str, &str)]) -> Result<String, String> {
        let mut cmd = tokio::process::Command::new("psql");
        cmd.arg(&self.url)
            .args(["-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-f", "-"]);
        for (k, v) in vars {
            cmd.arg("-v").arg(format!("{k}={v}"));
        }
        let mut child = cmd
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("psql: {e}"))?;
        let mut stdin = child.stdin.take().expect("piped");
        stdin
            .write_all(sql.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        drop(stdin);
        let out = child.wait_with_output().await.map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    async fn create(&self) -> Result<(), String> {
        self.psql(
            "CREATE TABLE IF NOT EXISTS fenced_kv \
             (key text PRIMARY KEY, value text NOT NULL, fence bigint NOT NULL DEFAULT 0);",
            &[],
        )
        .await
        .map(|_| ())
    }
}

impl FencedStore for Postgres {
    type Error = String;

    async fn write_fenced(&self, key: &str, value: &str, token: u64) -> Result<bool, String> {
        let token = token.to_string();
        let rows = self
            .psql(
                "INSERT INTO fenced_kv (key, value, fence) VALUES (:'key', '', 0) \
                   ON CONFLICT (key) DO NOTHING;\n\
                 WITH u AS (UPDATE fenced_kv SET value = :'value', fence = :token \
                             WHERE key = :'key' AND fence <= :token RETURNING 1) \
                 SELECT count(*) FROM u;",
                &[("key", key), ("value", value), ("token", &token)],
            )
            .await?;
        Ok(rows == "1")
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let key = args.get(1).map_or("accounts/42", String::as_str);
    let writes: u32 = args.get(2).map_or(Ok(100), |s| s.parse())?;
    let db = Postgres {
        url: std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL")?,
    };
    db.create().await?;
    let endpoints = std::env::var("LOCKD_ENDPOINTS").unwrap_or_else(|_| "127.0.0.1:7170".into());
    let client = Client::connect_with(endpoints.split(','), ClientOptions::default()).await?;
    let guard = client
        .acquire(format!("fenced/{key}"))
        .wait(Duration::from_secs(30))
        .await?;
    println!("holding {} with token {}", guard.name(), guard.token());
    for i in 0..writes {
        match write_fenced(
            &db,
            &guard,
            key,
            &format!("write {i} by token {}", guard.token()),
        )
        .await
        {
            Ok(()) => {}
            Err(FenceError::Superseded) => {
                println!("a newer holder exists; stopping after {i} writes");
                return Ok(());
            }
            Err(FenceError::Lost) => {
                println!("lease lost; stopping after {i} writes");
                return Ok(());
            }
            Err(FenceError::Store(e)) => return Err(e.into()),
        }
    }
    println!("{writes} fenced writes done");
    guard.release().await?;
    client.close().await?;
    Ok(())
}
