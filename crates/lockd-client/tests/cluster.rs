//! The client against a real 3-node cluster (`lockd serve` processes on loopback).
//!
//! Needs `target/debug/lockd`: `cargo build -p lockd-server --bin lockd` first.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use lockd_client::Client;
use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::ChildStdout;
use tokio::time::{timeout, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_keeps_its_lock_while_the_leader_is_killed() {
    let _serial = SERIAL.lock().await;
    let mut c = Cluster::start(3, 1).await;
    let ttl = Duration::from_secs(10);
    let client = Client::connect_with(&c.grpc, options(ttl)).await.unwrap();
    let guard = client.acquire("fast/failover").try_once().await.unwrap();

    let leader = c.leader_of(0, 1).await;
    assert!(leader > 0, "group 1 has a leader");
    let killed_at = Instant::now();
    c.nodes[leader as usize - 1].kill();
    eprintln!("killed node {leader} (leader of group 1)");

    // Past a whole TTL after the kill, only keepalives acknowledged by the new leader can have
    // kept the guard alive.
    while killed_at.elapsed() < ttl + Duration::from_secs(2) {
        assert!(
            !guard.is_lost(),
            "lost the lock {:?} after the kill",
            killed_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        guard.deadline() > killed_at + ttl / 2,
        "keepalives were acknowledged after the kill"
    );
    let survivor = (0..3).find(|&i| i != leader as usize - 1).unwrap();
    let new_leader = c.leader_of(survivor, 1).await;
    assert!(
        new_leader != 0 && new_leader != leader,
        "a new leader was elected"
    );
    let state = client.inspect("fast/failover").await.unwrap();
    assert_eq!(state.holders.len(), 1);
    assert_eq!(state.holders[0].fencing_token, guard.token());
    guard.release().await.unwrap();
    client.close().await.unwrap();
}

async fn line(lines: &mut Lines<BufReader<ChildStdout>>) -> String {
    timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the child printed nothing for 60 s")
        .unwrap()
        .expect("the child closed stdout")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_client_finds_its_lock_lost_and_its_release_refused() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(3, 1).await;
    let hold = target_dir().join("debug/examples/hold");
    assert!(
        hold.exists(),
        "{} missing (cargo test builds examples)",
        hold.display()
    );
    let ttl_ms = 2_000u64;
    let mut child = tokio::process::Command::new(&hold)
        .args([&c.endpoints(), "fast/paused", &ttl_ms.to_string(), "fast"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = line(&mut lines).await;
    let parts: Vec<&str> = first.split_whitespace().collect();
    assert_eq!(parts[0], "acquired", "{first}");
    let token: u64 = parts[1].parse().unwrap();

    nix::sys::signal::kill(pid, Signal::SIGSTOP).unwrap();
    let state = || {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("State:").map(|s| s.trim().to_string()))
            .unwrap()
    };
    eventually(Duration::from_secs(5), "the child to stop", || {
        let s = state();
        async move { s.starts_with('T') }
    })
    .await;
    let paused_at = Instant::now();

    // While it sleeps, the service expires its session and the next holder gets a larger token.
    let other = Client::connect_with(&c.grpc, options(Duration::from_secs(3)))
        .await
        .unwrap();
    let next = other
        .acquire("fast/paused")
        .wait(Duration::from_secs(30))
        .await
        .unwrap();
    assert!(
        next.token() > token,
        "next token {} > paused holder's {token}",
        next.token()
    );
    while paused_at.elapsed() < Duration::from_millis(ttl_ms + 500) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        state().starts_with('T'),
        "still paused after more than a TTL"
    );
    eprintln!("paused for {:?}", paused_at.elapsed());
    nix::sys::signal::kill(pid, Signal::SIGCONT).unwrap();

    let lost = line(&mut lines).await;
    assert!(lost.starts_with("lost "), "{lost}");
    let release = line(&mut lines).await;
    assert!(release.starts_with("release refused "), "{release}");
    let count = line(&mut lines).await;
    assert_eq!(count, "lease_expired_count 1");
    eprintln!("paused client: {lost}; {release}; {count}");
    assert!(timeout(Duration::from_secs(20), child.wait())
        .await
        .unwrap()
        .unwrap()
        .success());
    // The new holder is untouched by the stale one.
    assert_eq!(
        other.inspect("fast/paused").await.unwrap().holders[0].fencing_token,
        next.token()
    );
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_before_the_service_can_expire_the_session() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(3, 1).await;
    let ttl = Duration::from_secs(3);
    let client = Client::connect_with(&c.grpc, options(ttl)).await.unwrap();
    let margin = ttl / 5;
    let guard = client.acquire("fast/c1").try_once().await.unwrap();
    // Let a few keepalives go by, then make every node unreachable.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for n in &c.nodes {
        n.pause();
    }
    let stopped_at = Instant::now();
    let lost = guard.lost();
    timeout(ttl * 2, lost).await.expect("lost() fired");
    let lost_at = Instant::now();
    // The last acknowledged keepalive was sent at deadline + margin − TTL; the service expires
    // the session no earlier than TTL after it received that keepalive (S6).
    let earliest_expiry = guard.deadline() + margin;
    assert!(
        guard.deadline() <= stopped_at + ttl - margin,
        "no ack after the stop"
    );
    assert!(
        lost_at < earliest_expiry,
        "lost() fired before the service's earliest expiry"
    );
    for n in &c.nodes {
        n.signal(Signal::SIGCONT);
    }
    let probe = Client::lazy(&c.grpc, quick()).unwrap();
    let end = Instant::now() + Duration::from_secs(30);
    let free_at = loop {
        let r = probe.inspect("fast/c1").await;
        if r.as_ref().is_ok_and(|s| s.holders.is_empty()) {
            break Instant::now();
        }
        assert!(
            Instant::now() < end,
            "the lock is still held 30 s after the nodes resumed: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(lost_at < free_at);
    eprintln!(
        "C1: lost() fired {:?} after the stop, {:?} before the earliest possible expiry, {:?} before the lock was free again",
        lost_at - stopped_at,
        earliest_expiry - lost_at,
        free_at - lost_at
    );
    assert_eq!(client.lease_expired_count(), 1);
    assert!(
        guard.release().await.is_err(),
        "a lost guard's release is refused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sorted_multi_acquire_of_overlapping_sets_never_deadlocks() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(3, 2).await;
    let names = ["fast/m/a", "fast/m/b", "fast/m/c", "fast/m/d", "fast/m/e"];
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..8usize {
        let client = Client::connect_with(&c.grpc, options(Duration::from_secs(5)))
            .await
            .unwrap();
        tasks.push(tokio::spawn(async move {
            for round in 0..10usize {
                // Overlapping sets, listed in different orders by different tasks.
                let mut set: Vec<&str> = (0..3).map(|k| names[(t + round + 2 * k) % 5]).collect();
                if t % 2 == 1 {
                    set.reverse();
                }
                let guards = client
                    .acquire_all(set, Duration::from_secs(60))
                    .await
                    .unwrap();
                let mut sorted: Vec<&str> = guards.iter().map(|g| g.name()).collect();
                sorted.sort();
                assert_eq!(sorted, guards.iter().map(|g| g.name()).collect::<Vec<_>>());
                tokio::time::sleep(Duration::from_millis(2)).await;
                for g in guards {
                    g.release().await.unwrap();
                }
            }
            client.close().await.unwrap();
        }));
    }
    timeout(
        Duration::from_secs(120),
        futures_util::future::join_all(tasks),
    )
    .await
    .expect("deadlock: multi-acquires did not finish")
    .into_iter()
    .for_each(|r| r.unwrap());
    eprintln!(
        "8 tasks × 10 rounds of 3-name sets in {:?}",
        started.elapsed()
    );
}

/// How many `op` requests node `i` recorded as done by `api`, from its `lockd_ops_total`.
async fn ops(c: &Cluster, i: usize, op: &str, api: &str) -> u64 {
    let text = c.metrics(i).await;
    let series = format!("lockd_ops_total{{op=\"{op}\",result=\"ok\",api=\"{api}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0, |n| n.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_ride_the_session_stream() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(3, 2).await;
    // One endpoint: every request of this client lands on node 1, whichever node leads.
    let client = Client::connect_with(&c.grpc[..1], options(Duration::from_secs(10)))
        .await
        .unwrap();
    for i in 0..4 {
        let g = client.acquire(format!("fast/ride-{i}")).await.unwrap();
        g.release().await.unwrap();
    }
    // A dropped guard is given back in the background, on the stream too.
    let dropped = client.acquire("fast/ride-dropped").await.unwrap();
    drop(dropped);
    eventually(
        Duration::from_secs(10),
        "the dropped guard's release",
        || {
            let client = client.clone();
            async move {
                client
                    .inspect("fast/ride-dropped")
                    .await
                    .is_ok_and(|s| s.holders.is_empty())
            }
        },
    )
    .await;
    assert_eq!(ops(&c, 0, "acquire", "stream").await, 5);
    assert_eq!(ops(&c, 0, "release", "stream").await, 5);
    assert_eq!(ops(&c, 0, "release", "grpc").await, 0);

    // Another session's hold is not the stream's: released by a unary call.
    let other = Client::connect_with(&c.grpc[..1], options(Duration::from_secs(10)))
        .await
        .unwrap();
    let theirs = other.acquire("fast/ride-theirs").await.unwrap();
    let remaining = client
        .release_token(theirs.session_id(), "fast/ride-theirs", theirs.token())
        .await
        .unwrap();
    assert_eq!(remaining, 0);
    assert_eq!(ops(&c, 0, "release", "grpc").await, 1);
    assert_eq!(ops(&c, 0, "release", "stream").await, 5);
    // The stream refuses a stale token as the unary call would: an error, no state change.
    let g = client.acquire("fast/ride-stale").await.unwrap();
    let stale = client
        .release_token(g.session_id(), "fast/ride-stale", g.token() + 1)
        .await;
    assert!(
        stale.is_err(),
        "a wrong token's release is refused: {stale:?}"
    );
    assert_eq!(
        client
            .inspect("fast/ride-stale")
            .await
            .unwrap()
            .holders
            .len(),
        1
    );
    g.release().await.unwrap();
    drop(theirs);
    client.close().await.unwrap();
    other.close().await.unwrap();
}

/// A rolling restart (SIGTERM, start again, wait until ready; node after node) under a client
/// cycling locks: the graceful leave hands each node's groups over, so the caller sees no failed
/// call (the client's own retries included), a lock held throughout stays held, and every name's
/// tokens keep rising.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_load_fails_no_call() {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let _serial = SERIAL.lock().await;
    let mut c = Cluster::start(3, 2).await;
    // A client with a short retry budget (~0.4 s in all): a node's leaving must not need the
    // client's patience. (The service waits out a leader change inside its own propose timeout,
    // so this holds even without the hand-over: measured 710-915 cycles per roll with it and
    // 722-751 without, within this machine's noise. a_stopping_node_hands_its_groups_over_first
    // in lockd-server checks the hand-over itself.)
    let opts = lockd_client::ClientOptions {
        retry: lockd_client::RetryPolicy {
            max_attempts: 4,
            base: Duration::from_millis(25),
            cap: Duration::from_millis(200),
        },
        ..options(Duration::from_secs(10))
    };
    let client = Client::connect_with(&c.grpc, opts).await.unwrap();
    let kept = client.acquire("fast/kept").try_once().await.unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (client, stop) = (client.clone(), stop.clone());
        tokio::spawn(async move {
            let mut last: BTreeMap<String, u64> = BTreeMap::new();
            let mut errors = Vec::new();
            let mut ok = 0u64;
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) && errors.len() < 20 {
                let name = format!("fast/roll-{}", i % 8);
                i += 1;
                match client.acquire(&name).wait(Duration::from_secs(5)).await {
                    Ok(g) => {
                        let prev = last.insert(name.clone(), g.token()).unwrap_or(0);
                        assert!(g.token() > prev, "{name}: token {} after {prev}", g.token());
                        match g.release().await {
                            Ok(_) => ok += 1,
                            Err(e) => errors.push(format!("release {name}: {e}")),
                        }
                    }
                    Err(e) => errors.push(format!("acquire {name}: {e}")),
                }
            }
            (ok, errors)
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    for i in 0..3 {
        let at = Instant::now();
        c.restart(i).await;
        eprintln!("restarted node {} in {:?}", i + 1, at.elapsed());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, errors) = load.await.unwrap();
    eprintln!("{ok} acquire/release cycles during the roll; errors {errors:?}");
    assert!(
        errors.is_empty(),
        "calls failed during the roll: {errors:?}"
    );
    assert!(ok > 0, "the load made progress");
    assert!(!kept.is_lost(), "the lock held through the roll was lost");
    let state = client.inspect("fast/kept").await.unwrap();
    assert_eq!(state.holders[0].fencing_token, kept.token());
    kept.release().await.unwrap();
    client.close().await.unwrap();
}
