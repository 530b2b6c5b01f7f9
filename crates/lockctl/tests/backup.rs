//! Backup and restore keep fencing safe: `lockctl snapshot save` under load, every node wiped,
//! `lockd restore` into new dirs, and every token the new cluster grants is larger than any
//! fence the protected store had kept, tokens minted after the backup included.
//!
//! Needs `target/debug/lockd`: `cargo build -p lockd-server --bin lockd` first.

mod common;
mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use lockd_client::Client;
use serde_json::Value;
use support::{admin_json, lockctl_at};

const NAMES: usize = 8;

fn name(i: usize) -> String {
    format!("fast/backup-{i}")
}

/// Takes and gives back the names in turn until `stop`, keeping each name's largest token as
/// the protected store's fence would.
async fn load(
    client: Client,
    worker: usize,
    fences: Arc<Mutex<BTreeMap<String, u64>>>,
    stop: Arc<AtomicBool>,
) {
    let end = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut i = worker;
    while !stop.load(Ordering::Relaxed) {
        assert!(
            tokio::time::Instant::now() < end,
            "the load is bounded in time"
        );
        let g = client
            .acquire(name(i % NAMES))
            .owner(format!("worker-{worker}"))
            .wait(Duration::from_secs(5))
            .await
            .expect("acquire under load");
        {
            let mut f = fences.lock().unwrap();
            let fence = f.entry(g.name().to_string()).or_default();
            assert!(g.token() > *fence, "tokens rise per name");
            *fence = g.token();
        }
        g.release().await.expect("release under load");
        i += 1;
    }
}

fn run(cmd: &mut std::process::Command) -> String {
    let out = cmd.output().expect("run");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_cluster_grants_only_tokens_above_every_stored_fence() {
    let _serial = SERIAL.lock().await;
    let backups = tempfile::tempdir().unwrap();
    let file = backups.path().join("lockd.backup");
    let fences = Arc::new(Mutex::new(BTreeMap::new()));
    let (backup_max, namespaces_before) = {
        let c = Cluster::start(3, 2).await;
        let token = backups.path().join("pay-token");
        std::fs::write(&token, "pay-token-123\n").unwrap();
        admin_json(
            &c,
            &[
                "namespace",
                "put",
                "pay",
                "--prefix",
                "pay/",
                "--token-file",
                token.to_str().unwrap(),
            ],
        )
        .await;

        let client = Client::connect_with(&c.grpc, options(Duration::from_secs(10)))
            .await
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..2)
            .map(|w| tokio::spawn(load(client.clone(), w, fences.clone(), stop.clone())))
            .collect();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let saved = admin_json(&c, &["snapshot", "save", file.to_str().unwrap()]).await;
        // Tokens minted after the backup must be covered by the bump too.
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.await.unwrap();
        }
        let doc: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(doc["groups"].as_array().unwrap().len(), 2, "{doc}");
        assert_eq!(saved["max_revision"], doc["max_revision"]);
        let max = doc["max_revision"].as_u64().unwrap();
        let newest = *fences.lock().unwrap().values().max().unwrap();
        assert!(
            max > 0 && newest > max,
            "load ran on both sides of the backup: {max} {newest}"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the backup holds token digests");

        // What a data dir holds, read while the node runs.
        let report = run(std::process::Command::new(lockd_bin())
            .arg("inspect-data")
            .arg(&c.args[0].data_dir));
        assert!(
            report.contains("identity: cluster 'lockd', node 1"),
            "{report}"
        );
        assert!(report.contains("group 2 (lock group)"), "{report}");
        let listed = admin_json(&c, &["namespace", "list"]).await;
        client.close().await.unwrap();
        (max, listed["namespaces"].as_array().unwrap().len())
        // Dropped: every node SIGKILLed and its data dir removed.
    };
    eprintln!(
        "backup's largest revision {backup_max}; fences {:?}",
        fences.lock().unwrap()
    );

    // A new cluster from the backup: `lockd restore` into every founding node's empty dir.
    let restored = Cluster::launch(3, 2, NAMESPACES, "fast", |a| {
        let out = run(std::process::Command::new(lockd_bin())
            .arg("restore")
            .arg(&file)
            .arg("--data-dir")
            .arg(&a.data_dir));
        assert!(out.contains("every lock group starts above"), "{out}");
    })
    .await;
    // Each node applies the seed on its own start (the cluster was ready once one had).
    let inspect = || {
        run(std::process::Command::new(lockd_bin())
            .arg("inspect-data")
            .arg(&restored.args[1].data_dir))
    };
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    while !inspect().contains("restore: applied, floor") {
        assert!(
            tokio::time::Instant::now() < until,
            "node 2 did not apply its seed: {}",
            restored.log_tails(60)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let client = Client::connect_with(&restored.grpc, options(Duration::from_secs(10)))
        .await
        .unwrap();
    let fences = fences.lock().unwrap().clone();
    for (name, fence) in &fences {
        let g = client.acquire(name.clone()).try_once().await.unwrap();
        assert!(
            g.token() > *fence && g.token() > backup_max + 1_000_000_000,
            "{name}: new token {} against the stored fence {fence}",
            g.token()
        );
        eprintln!(
            "{name}: fence {fence}, first token after the restore {}",
            g.token()
        );
        g.release().await.unwrap();
    }
    // A name nobody took before is above the backup too: every group was raised.
    for i in 0..16 {
        let g = client
            .acquire(format!("fast/never-{i}"))
            .try_once()
            .await
            .unwrap();
        assert!(g.token() > backup_max + 1_000_000_000, "{}", g.token());
        g.release().await.unwrap();
    }

    // The namespaces came back, the token-guarded one still guarded.
    let listed = admin_json(&restored, &["namespace", "list"]).await;
    assert_eq!(
        listed["namespaces"].as_array().unwrap().len(),
        namespaces_before
    );
    let pay = admin_json(&restored, &["namespace", "get", "pay"]).await;
    assert_eq!(pay["token_required"], true, "{pay}");
    let denied = lockctl_at(&restored.endpoints())
        .args(["--namespace", "pay", "acquire", "pay/x"])
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&denied.stderr);
    assert!(
        !denied.status.success() && err.contains("unauthenticated"),
        "an open door after the restore: {err}"
    );
    client.close().await.unwrap();
}
