//! `lockctl` against a real 3-node cluster (`lockd serve` processes on loopback).
//!
//! Needs `target/debug/lockd`: `cargo build -p lockd-server --bin lockd` first.

mod common;
mod support;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use lockd_client::Client;
use serde_json::Value;
use support::{alive, lockctl};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::time::{timeout, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_stops_its_command_within_a_second_of_the_deadline_when_every_node_dies() {
    let _serial = SERIAL.lock().await;
    let mut c = Cluster::start(3, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    // CMD ignores SIGTERM and leaves a grandchild: only SIGKILL to the whole group stops both.
    let script = format!(
        "trap '' TERM; echo \"$LOCKD_LOCK $LOCKD_TOKEN\"; sleep 600 & echo $! > {}; wait",
        pidfile.display()
    );
    let mut child = lockctl(&c)
        .args(["run", "fast/job", "--ttl", "3s", "--", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut events = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let next = |l: Option<String>| -> Value { serde_json::from_str(&l.expect("a line")).unwrap() };
    let acquired = next(
        timeout(Duration::from_secs(30), events.next_line())
            .await
            .unwrap()
            .unwrap(),
    );
    assert_eq!(acquired["event"], "acquired", "{acquired}");
    let cmd_pid = acquired["pid"].as_i64().unwrap() as i32;
    let printed = timeout(Duration::from_secs(10), stdout.next_line())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(printed, Some(format!("fast/job {}", acquired["token"])));
    let probe = Client::lazy(&c.grpc, quick()).unwrap();
    let held = probe.inspect("fast/job").await.unwrap();
    assert_eq!(
        held.holders[0].fencing_token,
        acquired["token"].as_u64().unwrap()
    );
    eventually(Duration::from_secs(10), "the grandchild's pid", || {
        let p = pidfile.clone();
        async move { std::fs::read_to_string(p).is_ok_and(|s| s.ends_with('\n')) }
    })
    .await;
    let grandchild: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();

    tokio::time::sleep(Duration::from_millis(1200)).await;
    let killed_at = Instant::now();
    for n in &mut c.nodes {
        n.kill();
    }
    let mut gone_at = None;
    let end = Instant::now() + Duration::from_secs(15);
    while Instant::now() < end {
        if !alive(cmd_pid) && !alive(grandchild) {
            gone_at = Some(Instant::now());
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let gone_at = gone_at.expect("the command's process group was not stopped");
    let lost = next(
        timeout(Duration::from_secs(10), events.next_line())
            .await
            .unwrap()
            .unwrap(),
    );
    assert_eq!(lost["event"], "lost", "{lost}");
    let after_ms = lost["child_stopped_after_deadline_ms"].as_f64().unwrap();
    let status = timeout(Duration::from_secs(10), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        status.code(),
        Some(76),
        "lockctl exits 76 when the lease is lost"
    );
    // Every acknowledged keepalive was sent before the kill, so the deadline is at most
    // TTL − margin (3 s − 0.6 s) after it; the group must be gone within 1 s of that.
    let since_kill = gone_at - killed_at;
    eprintln!(
        "lockctl run: command stopped {after_ms:.1} ms after the local deadline ({since_kill:?} after every node was killed)"
    );
    assert!(
        after_ms < 1000.0,
        "stopped {after_ms} ms after the deadline"
    );
    assert!(
        since_kill < Duration::from_millis(2400 + 1000),
        "{since_kill:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_passes_the_exit_code_and_refuses_a_held_lock() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(3, 1).await;
    let out = lockctl(&c)
        .args([
            "run",
            "fast/exit",
            "--ttl",
            "3s",
            "--",
            "sh",
            "-c",
            "exit 7",
        ])
        .output()
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let holder = Client::connect_with(&c.grpc, options(Duration::from_secs(3)))
        .await
        .unwrap();
    let g = holder.acquire("fast/exit").await.unwrap();
    let out = lockctl(&c)
        .args([
            "run",
            "fast/exit",
            "--ttl",
            "3s",
            "--wait",
            "300ms",
            "--",
            "true",
        ])
        .output()
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err: Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(err["error"]["code"], "not_acquired");

    let out = lockctl(&c)
        .args(["inspect", "fast/exit"])
        .output()
        .await
        .unwrap();
    let state: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(state["holders"][0]["token"], g.token());
    // Listing sessions is the admin's.
    let out = lockctl(&c).args(["sessions"]).output().await.unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err: Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(err["error"]["code"], "unauthenticated");
    let out = lockctl(&c)
        .arg("--admin-token-file")
        .arg(c.admin_token_file())
        .args(["sessions"])
        .output()
        .await
        .unwrap();
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let me = listed["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["session_id"] == g.session_id())
        .cloned();
    assert_eq!(me.expect("the holder's session is listed")["held"], 1);
    let out = lockctl(&c)
        .args(["sessions", "--session", g.session_id()])
        .output()
        .await
        .unwrap();
    let detail: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(detail["held"][0]["name"], "fast/exit");
    assert_eq!(detail["held"][0]["token"], g.token());
    let out = lockctl(&c).arg("status").output().await.unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 3);
    let out = lockctl(&c)
        .args([
            "release",
            "fast/exit",
            "--session",
            g.session_id(),
            "--token",
        ])
        .arg(g.token().to_string())
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(g.release().await.is_err(), "already released by lockctl");

    // Without --namespace, lockctl opens its session in the namespace NAME falls into (a
    // session takes only its own namespace's names); with a wrong one it says so.
    let bare = |args: &[&str]| {
        let mut cmd = support::lockctl_at(&c.endpoints());
        cmd.args(args);
        cmd
    };
    for name in ["fast/inferred", "plain/default"] {
        let out = bare(&["run", name, "--", "true"]).output().await.unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = bare(&["--namespace", "fast", "run", "plain/x", "--", "true"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err: Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(err["error"]["code"], "wrong_namespace", "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_run_says_who_holds_the_lock_and_where_it_queues() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(1, 1).await;
    let holder = Client::connect_with(&c.grpc, options(Duration::from_secs(10)))
        .await
        .unwrap();
    let g = holder
        .acquire("fast/progress")
        .owner("nightly-report")
        .await
        .unwrap();
    let mut child = lockctl(&c)
        .args([
            "run",
            "fast/progress",
            "--ttl",
            "3s",
            "--wait",
            "30s",
            "--owner",
            "waiter-1",
            "--",
            "true",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let waiting: Value = loop {
        let line = timeout(Duration::from_secs(15), lines.next_line())
            .await
            .expect("a progress event while waiting")
            .unwrap()
            .expect("lockctl still runs");
        let v: Value = serde_json::from_str(&line).unwrap();
        if v["event"] == "waiting" {
            break v;
        }
    };
    assert_eq!(waiting["name"], "fast/progress");
    assert_eq!(
        (waiting["position"].clone(), waiting["queue_length"].clone()),
        (1.into(), 1.into()),
        "{waiting}"
    );
    assert_eq!(
        waiting["holders"][0]["owner"], "nightly-report",
        "{waiting}"
    );
    assert_eq!(waiting["holders"][0]["token"], g.token());
    g.release().await.unwrap();
    let status = timeout(Duration::from_secs(15), child.wait())
        .await
        .expect("run goes on once the holder leaves")
        .unwrap();
    assert!(status.success(), "{status:?}");
}

/// The namespace's bearer token is lockctl's: the command it runs does not inherit it, and
/// a token read from a file never appears on a command line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_keeps_the_auth_token_from_its_command() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(1, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "run-test-token-0123456789\n").unwrap();
    for how in ["env", "file"] {
        let mut cmd = lockctl(&c);
        match how {
            "env" => cmd.env("LOCKD_AUTH_TOKEN", "run-test-token-0123456789"),
            _ => cmd.arg("--auth-token-file").arg(&file),
        };
        let out = cmd
            .args([
                "run",
                "fast/env",
                "--",
                "sh",
                "-c",
                "echo \"[${LOCKD_AUTH_TOKEN:-unset}] token=$LOCKD_TOKEN\"",
            ])
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("[unset] token="),
            "{how}: {stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // A missing file is a usage error, said at once.
    let out = lockctl(&c)
        .arg("--auth-token-file")
        .arg(dir.path().join("missing"))
        .arg("status")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("token file"));
}
