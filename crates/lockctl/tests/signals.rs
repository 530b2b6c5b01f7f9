//! `lockctl` keeps its promise under signals: SIGTERM, SIGHUP, SIGQUIT and SIGINT stop CMD's
//! whole process group and release the lock before lockctl exits 128 + N; SIGKILL of lockctl
//! still stops CMD (its supervisor's parent-death signal); a signal during a wait leaves the
//! queue. Against a real 3-node cluster.
//!
//! Needs `target/debug/lockd`: `cargo build -p lockd-server --bin lockd` first.

mod common;
mod support;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use lockd_client::Client;
use nix::sys::signal::Signal;
use serde_json::Value;
use support::{alive, signal_and_wait};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::ChildStderr;
use tokio::time::{timeout, Instant};

/// lockctl with its JSON events readable on stderr (stdout belongs to CMD).
fn lockctl(c: &Cluster) -> tokio::process::Command {
    let mut cmd = support::lockctl(c);
    cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    cmd
}

async fn next_event(events: &mut Lines<BufReader<ChildStderr>>) -> Value {
    let line = timeout(Duration::from_secs(30), events.next_line())
        .await
        .expect("an event within 30 s")
        .unwrap()
        .expect("a line");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"))
}

/// CMD: a shell that leaves a grandchild (`sleep`) and writes its pid, so a test can tell that
/// the whole group stopped, not only the direct child.
fn script(pidfile: &Path, trap_term: bool) -> String {
    let p = pidfile.display();
    let trap = if trap_term { "trap '' TERM; " } else { "" };
    format!("{trap}sleep 600 & echo $! > {p}.tmp; mv {p}.tmp {p}; wait")
}

async fn read_pid(pidfile: &Path) -> i32 {
    eventually(Duration::from_secs(10), "the grandchild's pid", || {
        let p = pidfile.to_path_buf();
        async move { p.exists() }
    })
    .await;
    std::fs::read_to_string(pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

async fn holders(c: &Cluster, name: &str) -> usize {
    let probe = Client::lazy(&c.grpc, quick()).unwrap();
    probe.inspect(name).await.unwrap().holders.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_terminating_signal_stops_the_group_releases_and_exits_128_plus_n() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(3, 1).await;
    let dir = tempfile::tempdir().unwrap();
    for sig in [
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGINT,
    ] {
        let name = format!("fast/sig-{}", sig as i32);
        let pidfile = dir.path().join(format!("pid-{}", sig as i32));
        let mut child = lockctl(&c)
            .args(["run", &name, "--ttl", "10s", "--kill-grace", "2s", "--"])
            .args(["sh", "-c", &script(&pidfile, false)])
            .spawn()
            .unwrap();
        let mut events = BufReader::new(child.stderr.take().unwrap()).lines();
        let acquired = next_event(&mut events).await;
        assert_eq!(acquired["event"], "acquired", "{acquired}");
        let group = acquired["pid"].as_i64().unwrap() as i32;
        let grandchild = read_pid(&pidfile).await;
        assert_eq!(holders(&c, &name).await, 1);

        let sent = Instant::now();
        let status = signal_and_wait(&mut child, sig).await;
        let exited = sent.elapsed();
        assert_eq!(status.code(), Some(128 + sig as i32), "{sig}");
        assert!(!alive(group), "{sig}: CMD's supervisor outlived lockctl");
        assert!(
            !alive(grandchild),
            "{sig}: CMD's grandchild outlived lockctl"
        );
        let signalled = next_event(&mut events).await;
        assert_eq!(signalled["event"], "signalled", "{signalled}");
        assert_eq!(signalled["signal"], sig as i32);
        let released = next_event(&mut events).await;
        assert_eq!(released["event"], "released", "{released}");
        // Released by lockctl, not by expiry: the 10 s session is still far from its end.
        assert_eq!(holders(&c, &name).await, 0, "{sig}: the lock is still held");
        eprintln!(
            "lockctl run, {sig}: child stopped in {:.1} ms, lockctl exited (lock released) {:?} after the signal",
            signalled["child_stopped_ms"].as_f64().unwrap(),
            exited
        );
        assert!(exited < Duration::from_secs(5), "{sig}: {exited:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_ignores_sigterm_is_killed_after_the_grace() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(3, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let mut child = lockctl(&c)
        .args([
            "run",
            "fast/stubborn",
            "--ttl",
            "10s",
            "--kill-grace",
            "700ms",
        ])
        .args(["--", "sh", "-c", &script(&pidfile, true)])
        .spawn()
        .unwrap();
    let mut events = BufReader::new(child.stderr.take().unwrap()).lines();
    let acquired = next_event(&mut events).await;
    let group = acquired["pid"].as_i64().unwrap() as i32;
    let grandchild = read_pid(&pidfile).await;
    let status = signal_and_wait(&mut child, Signal::SIGTERM).await;
    assert_eq!(status.code(), Some(143));
    let signalled = next_event(&mut events).await;
    let ms = signalled["child_stopped_ms"].as_f64().unwrap();
    assert!(
        ms >= 650.0,
        "SIGKILL came before the grace: {ms} ms ({signalled})"
    );
    assert!(!alive(group) && !alive(grandchild));
    assert_eq!(holders(&c, "fast/stubborn").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_lockctl_still_stops_its_command() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(3, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let mut child = lockctl(&c)
        .args(["run", "fast/orphan", "--ttl", "10s", "--"])
        .args(["sh", "-c", &script(&pidfile, false)])
        .spawn()
        .unwrap();
    let mut events = BufReader::new(child.stderr.take().unwrap()).lines();
    let acquired = next_event(&mut events).await;
    let group = acquired["pid"].as_i64().unwrap() as i32;
    let grandchild = read_pid(&pidfile).await;
    let sent = Instant::now();
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    let mut gone = None;
    while sent.elapsed() < Duration::from_secs(5) {
        if !alive(group) && !alive(grandchild) {
            gone = Some(sent.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let gone = gone.expect("CMD's group outlived a SIGKILLed lockctl by 5 s");
    eprintln!("lockctl run, SIGKILL: CMD's group gone {gone:?} after lockctl was killed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_while_waiting_leaves_the_queue_and_acquire_releases_on_sigterm() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(3, 1).await;

    // `lockctl acquire` holds until a signal, then releases.
    let mut holder = lockctl(&c)
        .args(["acquire", "fast/queue", "--ttl", "10s"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(holder.stdout.take().unwrap()).lines();
    let line = timeout(Duration::from_secs(30), out.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let got: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(got["acquired"], true);

    // A second lockctl queues behind it for up to 1m30s ...
    let mut waiter = lockctl(&c)
        .args(["run", "fast/queue", "--ttl", "10s", "--wait", "1m30s"])
        .args(["--", "true"])
        .spawn()
        .unwrap();
    let probe = Client::lazy(&c.grpc, quick()).unwrap();
    eventually(Duration::from_secs(10), "the waiter in the queue", || {
        let p = probe.clone();
        async move {
            p.inspect("fast/queue")
                .await
                .is_ok_and(|s| s.waiters.len() == 1)
        }
    })
    .await;
    // ... and leaves the queue on SIGINT.
    let st = signal_and_wait(&mut waiter, Signal::SIGINT).await;
    assert_eq!(st.code(), Some(130));
    let s = probe.inspect("fast/queue").await.unwrap();
    assert!(s.waiters.is_empty(), "the waiter is still queued: {s:?}");
    assert_eq!(s.holders.len(), 1);

    let st = signal_and_wait(&mut holder, Signal::SIGTERM).await;
    assert_eq!(st.code(), Some(143));
    assert_eq!(
        holders(&c, "fast/queue").await,
        0,
        "acquire did not release"
    );
}
