//! `lockctl namespace` against a real 3-node cluster: put a namespace with a token, change one
//! setting (the rest kept), see a stale `--expected-version` refused, and delete it. Over gRPC,
//! through lockd-client, as an operator would.
//!
//! Needs `target/debug/lockd`: `cargo build -p lockd-server --bin lockd` first.

mod common;
mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::Signal;
use serde_json::Value;
use support::{admin_json, lockctl, lockctl_at, signal_and_wait};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::time::timeout;

async fn namespace(c: &Cluster, args: &[&str]) -> Value {
    admin_json(c, &[&["namespace"], args].concat()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockctl_puts_changes_and_deletes_a_namespace() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(3, 1).await;
    let before = namespace(&c, &["list"]).await;
    let v0 = before["version"].as_u64().unwrap();

    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "search-token-1\n").unwrap();
    let put = namespace(
        &c,
        &[
            "put",
            "search",
            "--prefix",
            "search/",
            "--max-ttl",
            "30s",
            "--lock-delay",
            "2s",
            "--token-file",
            token.to_str().unwrap(),
        ],
    )
    .await;
    let v1 = put["version"].as_u64().unwrap();
    assert_eq!(v1, v0 + 1);

    // One setting changed; the others, and the token, kept.
    let changed = namespace(
        &c,
        &[
            "put",
            "search",
            "--ops-per-s",
            "500",
            "--max-sessions",
            "40",
        ],
    )
    .await;
    let v2 = changed["version"].as_u64().unwrap();
    let got = namespace(&c, &["get", "search"]).await;
    assert_eq!(got["prefix"], "search/");
    assert_eq!(got["max_ttl_ms"], 30000);
    assert_eq!(got["lock_delay_ms"], 2000);
    assert_eq!(got["ops_per_s"], 500);
    assert_eq!(got["max_sessions"], 40);
    assert_eq!(got["token_required"], true);
    assert_eq!(got["version"], v2);

    // Someone changed the namespaces since version v1: refused, nothing changes.
    let stale = lockctl(&c)
        .arg("--admin-token-file")
        .arg(c.admin_token_file())
        .args(["namespace", "put", "search", "--clear-token"])
        .args(["--expected-version", &v1.to_string()])
        .output()
        .await
        .unwrap();
    assert!(!stale.status.success());
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&stale.stdout),
        String::from_utf8_lossy(&stale.stderr)
    );
    assert!(said.contains("namespace_version_conflict"), "{said}");
    assert_eq!(
        namespace(&c, &["get", "search"]).await["token_required"],
        true
    );

    // Without the admin token: refused.
    let anon = lockctl(&c)
        .args(["namespace", "list"])
        .output()
        .await
        .unwrap();
    assert!(!anon.status.success());

    let deleted = namespace(&c, &["delete", "search"]).await;
    assert_eq!(deleted["version"], v2 + 1);
    let after = namespace(&c, &["list"]).await;
    let names: Vec<&str> = after["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert!(!names.contains(&"search"), "{names:?}");
}

/// A namespace at its `max_sessions`: the next `lockctl run` fails at once with the service's
/// answer (429 `too_many_sessions`, naming the cap), where it used to retry until
/// `--connect-timeout` and then say that no node answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_past_max_sessions_fails_at_once_with_the_cap() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(3, 1).await;
    let args = ["put", "solo", "--prefix", "solo/", "--max-sessions", "1"];
    namespace(&c, &args).await;

    // The first run holds the namespace's one session while its command sleeps.
    let mut first = lockctl_at(&c.endpoints())
        .args(["run", "solo/a", "--", "sleep", "60"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut events = BufReader::new(first.stderr.take().unwrap()).lines();
    let line = timeout(Duration::from_secs(30), events.next_line())
        .await
        .unwrap()
        .unwrap()
        .expect("an event");
    let acquired: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(acquired["event"], "acquired", "{acquired}");

    let started = Instant::now();
    let second = lockctl_at(&c.endpoints())
        .args(["--connect-timeout", "30s", "run", "solo/b", "--", "true"])
        .output()
        .await
        .unwrap();
    let took = started.elapsed();
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "{said}");
    assert!(said.contains("too_many_sessions"), "{said}");
    assert!(
        said.contains("holds 1 live session, its max_sessions"),
        "{said}"
    );
    // Not retried: the service asks for 1 s between tries, and the client's 8 attempts took
    // 7 s and more when it retried this answer.
    assert!(took < Duration::from_secs(4), "{took:?}: {said}");

    // Once the first run stops (SIGTERM: it releases and closes its session), the namespace
    // takes a new session.
    signal_and_wait(&mut first, Signal::SIGTERM).await;
    let third = lockctl_at(&c.endpoints())
        .args(["--connect-timeout", "30s", "run", "solo/c", "--", "true"])
        .output()
        .await
        .unwrap();
    assert!(
        third.status.success(),
        "{}",
        String::from_utf8_lossy(&third.stderr)
    );
}
