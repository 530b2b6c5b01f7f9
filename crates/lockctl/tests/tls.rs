//! The TLS path a user takes: `lockd dev --tls` makes a throwaway CA and serves every port over
//! TLS; `lockctl --ca-file` then holds a lock, and lockctl without the CA is refused.
//!
//! Needs `target/debug/lockd`: `cargo build -p lockd-server --bin lockd` first.

mod common;
mod support;

use std::process::Stdio;
use std::time::Duration;

use common::{free_ports, lockd_bin};
use nix::sys::signal::Signal;
use support::{lockctl_at, signal_and_wait};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockd_dev_tls_and_lockctl_with_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ports = free_ports(3);
    let at = |p: u16| format!("127.0.0.1:{p}");
    let log = dir.path().join("lockd.log");
    let mut dev = tokio::process::Command::new(lockd_bin())
        .args(["dev", "--tls", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["--http", &at(ports[0]), "--grpc", &at(ports[1])])
        .args(["--peer", &at(ports[2])])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let ca = dir.path().join("data/tls/ca.pem");
    let grpc = at(ports[1]);
    let with_ca = || {
        let mut cmd = lockctl_at(&grpc);
        cmd.arg("--ca-file").arg(&ca);
        cmd
    };
    // Ready once a status over TLS answers.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if ca.exists() && with_ca().arg("status").status().await.unwrap().success() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "lockd dev --tls not ready in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let out = with_ca()
        .args([
            "run",
            "tls/job",
            "--",
            "sh",
            "-c",
            "echo \"token=$LOCKD_TOKEN\"",
        ])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("token="),
        "lockctl run over TLS: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Plain text to a TLS port, and TLS without the CA (the public roots do not know it).
    let plain = lockctl_at(&grpc).arg("status").output().await.unwrap();
    assert!(!plain.status.success(), "plain text answered");
    // Each says what to do (issue 44 item 7), not just "transport error".
    let said = String::from_utf8_lossy(&plain.stdout);
    assert!(said.contains("use an https:// endpoint"), "{said}");
    let https = format!("https://{grpc}");
    let unknown = lockctl_at(&https).arg("status").output().await.unwrap();
    assert!(!unknown.status.success(), "an unknown CA was trusted");
    let said = String::from_utf8_lossy(&unknown.stdout);
    assert!(said.contains("UnknownIssuer"), "{said}");
    assert!(said.contains("give its CA (lockctl --ca-file"), "{said}");

    // A reader that goes away early (`lockctl status | head -1`) is no error and no panic.
    let mut early = with_ca()
        .arg("status")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(early.stdout.take());
    let early = early.wait_with_output().await.unwrap();
    let said = String::from_utf8_lossy(&early.stderr);
    assert!(
        early.status.success() && !said.contains("panicked"),
        "{said}"
    );

    // The dev node says it serves TLS, and stops cleanly on SIGTERM.
    let status = signal_and_wait(&mut dev, Signal::SIGTERM).await;
    assert!(status.success(), "{status:?}");
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(stderr.contains("client ports over TLS"), "{stderr}");
    assert!(!stderr.contains("PLAIN TEXT"), "{stderr}");
}
