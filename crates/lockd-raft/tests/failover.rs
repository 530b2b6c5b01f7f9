//! Killing the leader loses no grant, tokens keep rising, and a session kept alive survives.
mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use lockd_core::SessionId;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_keeps_grants_and_sessions() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let mut nodes = start_cluster(tmp.path(), 3, |_| {}).await;
    let l = leader_of(&nodes).await;
    let g = nodes[l].group();

    let s = SessionId(42);
    let ttl_ms = 5_000;
    ok(&g, open_op(s, ttl_ms, "")).await;
    let t0 = Instant::now();
    let t1 = token(&ok(&g, acquire_op(s, "orders/1", 0)).await);
    println!("acquire committed in {:?}", t0.elapsed());

    // Keepalives every second through a node that survives (forwarded to whoever leads).
    let via = nodes.iter().position(|n| n.id != nodes[l].id).unwrap();
    let kg = nodes[via].group();
    let stop = Arc::new(AtomicBool::new(false));
    let keepalives = {
        let stop = stop.clone();
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if let Err(e) = kg.keepalive(s).await {
                    assert!(e.is_retryable(), "keepalive failed for good: {e}");
                }
                tokio::time::sleep(Duration::from_millis(1000)).await;
            }
        })
    };

    let killed = nodes.remove(l);
    let killed_id = killed.id;
    let kill_at = Instant::now();
    killed.stop().await;

    let nl = leader_of(&nodes).await;
    assert_ne!(nodes[nl].id, killed_id);
    println!("new leader {} after {:?}", nodes[nl].id, kill_at.elapsed());

    // The grant survived with its token (linearizable read through either survivor).
    for n in &nodes {
        let holder = n
            .group()
            .read(|t| {
                t.lock_info("orders/1", t.now_ms())
                    .map(|i| (i.holders[0].session, i.holders[0].token))
            })
            .await
            .unwrap();
        assert_eq!(holder, Some((s, t1)));
    }
    // The next grant's token is larger.
    let t2 = token(&ok(&nodes[nl].group(), acquire_op(s, "orders/2", 0)).await);
    assert!(t2 > t1, "{t2} > {t1}");

    // Well past the TTL, the session kept alive still exists and holds both locks.
    tokio::time::sleep(Duration::from_millis(ttl_ms + 2_000)).await;
    let alive = nodes[nl]
        .group()
        .read(move |t| t.has_session(s))
        .await
        .unwrap();
    assert!(alive, "session expired despite keepalives");
    stop.store(true, Ordering::Relaxed);
    keepalives.await.unwrap();

    for n in nodes {
        n.stop().await;
    }
}

/// Group time goes on across a leader change: the new leader's clock starts from its own
/// reckoning of group time (the last command's time plus the time since it applied it), not
/// from the last command's time, so a lock's `held_for_ms` still tells how long it has been
/// held after the cluster was idle and then lost its leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_time_goes_on_across_a_leader_change() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let mut nodes = start_cluster(tmp.path(), 3, |_| {}).await;
    let l = leader_of(&nodes).await;
    let g = nodes[l].group();
    let s = SessionId(7);
    ok(&g, open_op(s, 30_000, "")).await;
    ok(&g, acquire_op(s, "orders/held", 0)).await;
    let granted = Instant::now();
    // Idle: no command for a while (nothing is due, so the leader proposes nothing).
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let killed = nodes.remove(l);
    killed.stop().await;
    let nl = leader_of(&nodes).await;
    let g = nodes[nl].group();
    ok(&g, acquire_op(s, "orders/next", 0)).await;
    let held_for = g
        .read(|t| t.lock_info("orders/held", t.now_ms()).unwrap().holders[0].held_for_ms)
        .await
        .unwrap();
    let real = granted.elapsed().as_millis() as u64;
    println!("held for {real} ms; group time says {held_for} ms");
    assert!(
        held_for + 1_000 >= real,
        "group time lost {} ms",
        real - held_for
    );
    assert!(
        held_for <= real + 200,
        "group time ran ahead: {held_for} > {real}"
    );
    for n in nodes {
        n.stop().await;
    }
}
