//! `lockctl watch` against a real 3-node cluster: every change, in order, across a restart of
//! the node it watches through.
//!
//! Needs `target/debug/lockd`: `cargo build -p lockd-server --bin lockd` first.

mod common;
mod support;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use lockd_client::Client;
use serde_json::Value;
use support::lockctl;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::ChildStdout;
use tokio::time::timeout;

async fn line(out: &mut Lines<BufReader<ChildStdout>>) -> Value {
    let l = timeout(Duration::from_secs(30), out.next_line())
        .await
        .expect("a change within 30 s")
        .unwrap()
        .expect("lockctl watch ended early");
    serde_json::from_str(&l).unwrap()
}

/// Takes and gives back `name` once; returns its token.
async fn cycle(c: &Client, name: &str) -> u64 {
    let g = c.acquire(name).await.unwrap();
    let t = g.token();
    g.release().await.unwrap();
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_every_change_in_order_across_a_restart_of_its_node() {
    let _serial = SERIAL.lock().await;
    let mut c = Cluster::start(3, 1).await;
    let probe = Client::lazy(&c.grpc, quick()).unwrap();
    let mut child = lockctl(&c)
        .args(["watch", "fast/w", "--count", "6"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // What lockctl says on stderr, shown if the test fails.
    let mut errs = BufReader::new(child.stderr.take().unwrap()).lines();
    tokio::spawn(async move {
        while let Ok(Some(l)) = errs.next_line().await {
            eprintln!("lockctl watch: {l}");
        }
    });
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    // The watch starts from the moment it opens: cycle until it shows the first change.
    let mut first = None;
    for _ in 0..60 {
        cycle(&probe, "fast/w").await;
        if let Ok(l) = timeout(Duration::from_millis(500), out.next_line()).await {
            first = Some(serde_json::from_str::<Value>(&l.unwrap().unwrap()).unwrap());
            break;
        }
    }
    let first = first.expect("lockctl watch showed no change in 30 s");
    assert_eq!(first["name"], "fast/w", "{first}");
    // Drain to the end of a cycle (the first line shown may have been a start or an end).
    let mut seen = vec![first];
    if seen[0]["kind"] == "hold_started" {
        seen.push(line(&mut out).await);
    }
    // The node lockctl watches through (the first endpoint) restarts; it resumes elsewhere or
    // there, and shows the next cycles once each.
    c.restart(0).await;
    let mut tokens = Vec::new();
    while seen.len() + 2 <= 6 {
        tokens.push(cycle(&probe, "fast/w").await);
        seen.push(line(&mut out).await);
        seen.push(line(&mut out).await);
    }
    let pairs_end = seen.len();
    // The first line shown ended a cycle (the watch opened mid-cycle): one more start makes
    // the sixth change, and lockctl exits after it. Reading a whole pair would wait for a
    // seventh line that never comes.
    if seen.len() < 6 {
        let token = cycle(&probe, "fast/w").await;
        let last = line(&mut out).await;
        assert_eq!(last["kind"], "hold_started", "{last}");
        assert_eq!(last["fencing_token"], Value::from(token), "{last}");
        seen.push(last);
    }
    let status = timeout(Duration::from_secs(10), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
    let after_restart = &seen[pairs_end - 2 * tokens.len()..pairs_end];
    for (pair, token) in after_restart.chunks(2).zip(&tokens) {
        assert_eq!(pair[0]["kind"], "hold_started", "{pair:?}");
        assert_eq!(pair[1]["kind"], "hold_ended", "{pair:?}");
        assert_eq!(pair[1]["cause"], "release", "{pair:?}");
        assert_eq!(
            (&pair[0]["fencing_token"], &pair[1]["fencing_token"]),
            (&Value::from(*token), &Value::from(*token))
        );
    }
    // In log order, each change once.
    let idx: Vec<u64> = seen.iter().map(|e| e["index"].as_u64().unwrap()).collect();
    assert!(idx.windows(2).all(|w| w[0] < w[1]), "{idx:?}");
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_listen_follows_a_candidate_that_leads_then_leaves() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(3, 1).await;
    let mut listen = lockctl(&c)
        .args(["elect", "--listen", "fast/leader"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut heard = BufReader::new(listen.stdout.take().unwrap()).lines();
    let now = line(&mut heard).await;
    assert_eq!(now["leader"], Value::Null, "{now}");
    let mut candidate = lockctl(&c)
        .args([
            "elect",
            "fast/leader",
            "node-a 10.0.0.7:9000",
            "--",
            "sleep",
            "60",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut notes = BufReader::new(candidate.stderr.take().unwrap()).lines();
    let elected = line_of(&mut notes).await;
    assert_eq!(elected["event"], "acquired", "{elected}");
    let leads = line(&mut heard).await;
    assert_eq!(leads["leader"], "node-a 10.0.0.7:9000", "{leads}");
    assert_eq!(leads["token"], elected["token"]);
    // The candidate is stopped: it stops its command, resigns, and exits 128 + SIGTERM.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(candidate.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let gone = line(&mut heard).await;
    assert_eq!(gone["leader"], Value::Null, "{gone}");
    let status = timeout(Duration::from_secs(20), candidate.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(128 + 15));
    drop(c);
}

async fn line_of(out: &mut Lines<BufReader<tokio::process::ChildStderr>>) -> Value {
    let l = timeout(Duration::from_secs(30), out.next_line())
        .await
        .expect("a line within 30 s")
        .unwrap()
        .expect("ended early");
    serde_json::from_str(&l).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_shows_the_hot_name_and_how_long_a_wait_would_take() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(3, 1).await;
    let holder = Client::lazy(&c.grpc, quick()).unwrap();
    let waiter = Client::lazy(&c.grpc, quick()).unwrap();
    // Two hand-offs of fast/hot between two clients, then one holds it with the other queued.
    let mut held = holder.acquire("fast/hot").await.unwrap();
    for round in 0..3 {
        let next = if round % 2 == 0 { &waiter } else { &holder };
        let queued = {
            let next = next.clone();
            tokio::spawn(
                async move { next.acquire("fast/hot").wait(Duration::from_secs(20)).await },
            )
        };
        wait_for_waiter(&holder, "fast/hot").await;
        if round == 2 {
            let out = lockctl(&c)
                .args(["top", "--top", "3"])
                .output()
                .await
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let t: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(t["top"], 3);
            let first = &t["most_waiters"][0];
            assert_eq!(
                (&first["name"], &first["waiters"]),
                (&Value::from("fast/hot"), &Value::from(1)),
                "{t}"
            );
            assert_eq!(t["most_handoffs"][0]["name"], "fast/hot", "{t}");
            assert!(
                t["most_handoffs"][0]["wait_estimate_ms"].as_u64().is_some(),
                "{t}"
            );
            // The human form: one table per list, the name in each that has it.
            let human = tokio::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
                .args(["--endpoints", &c.endpoints(), "top", "--namespace", "fast"])
                .output()
                .await
                .unwrap();
            let text = String::from_utf8_lossy(&human.stdout);
            assert!(
                human.status.success(),
                "{}",
                String::from_utf8_lossy(&human.stderr)
            );
            assert!(
                text.contains("most hand-offs:") && text.contains("fast/hot"),
                "{text}"
            );
        }
        held.release().await.unwrap();
        held = queued.await.unwrap().unwrap();
    }
    held.release().await.unwrap();
    // A list size out of range is refused before anything is sent, naming the flag.
    let out = lockctl(&c)
        .args(["top", "--top", "0"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--top"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A namespace that does not exist is a clear error.
    let out = lockctl(&c)
        .args(["top", "--namespace", "nope"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("namespace 'nope' does not exist"));
    drop(c);
}

async fn wait_for_waiter(c: &Client, name: &str) {
    for _ in 0..500 {
        if !c.inspect(name).await.unwrap().waiters.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("nobody queued on {name} in 10 s");
}
