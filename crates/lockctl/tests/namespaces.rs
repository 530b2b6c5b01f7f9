//! `lockctl namespace` against a real 3-node cluster: put a namespace with a token, change one
//! setting (the rest kept), see a stale `--expected-version` refused, and delete it. Over gRPC,
//! through lockd-client, as an operator would.
//!
//! Needs `target/debug/lockd`: `cargo build -p lockd-server --bin lockd` first.

mod common;
mod support;

use common::*;
use serde_json::Value;
use support::{admin_json, lockctl};

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
