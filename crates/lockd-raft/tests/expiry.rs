//! Expiry is proposed by the leader within TTL + 1 s of the last keepalive, and the freed lock
//! goes to the next waiter; a session kept alive is never expired across a leader change.
mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use lockd_core::{Namespace, Op, Reply, SessionId};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_hands_lock_to_waiter_and_kept_sessions_survive_failover() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let mut nodes = start_cluster(tmp.path(), 3, |_| {}).await;
    let l = leader_of(&nodes).await;
    let g = nodes[l].group();
    let ns = Namespace {
        name: "fast".into(),
        prefix: "fast/".into(),
        min_ttl_ms: 1_000,
        max_ttl_ms: 10_000,
        default_ttl_ms: 2_000,
        lock_delay_ms: 0,
        ..Namespace::default_namespace()
    };
    assert_eq!(
        ok(&g, Op::PutNamespace { namespace: ns }).await,
        Reply::NamespacePut
    );

    let ttl_ms = 2_000;
    let (holder, waiter) = (SessionId(100), SessionId(200));
    ok(&g, open_op(holder, ttl_ms, "fast")).await;
    ok(&g, open_op(waiter, ttl_ms, "fast")).await;
    ok(&g, acquire_op(holder, "fast/x", 0)).await;
    assert!(matches!(
        ok(&g, acquire_op(waiter, "fast/x", 60_000)).await,
        Reply::Queued { .. }
    ));

    // The waiter is kept alive through a follower for the whole test.
    let via = nodes.iter().position(|n| n.id != nodes[l].id).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let kg = nodes[via].group();
    let keepalives = {
        let stop = stop.clone();
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if let Err(e) = kg.keepalive(waiter).await {
                    assert!(e.is_retryable(), "waiter's keepalive failed for good: {e}");
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };

    // The holder sends a few keepalives, then stops.
    let mut last_send = Instant::now();
    for _ in 0..3 {
        last_send = Instant::now();
        assert_eq!(g.keepalive(holder).await.map(|r| r.ttl_ms), Ok(ttl_ms));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let sink = nodes[l].sink.clone();
    let (_, granted_at) = eventually("grant to waiter", Duration::from_secs(10), || {
        sink.granted(waiter, "fast/x")
    })
    .await;
    let after = granted_at - last_send;
    println!(
        "holder expired and lock re-granted {after:?} after its last keepalive (TTL {ttl_ms} ms)"
    );
    assert!(
        after >= Duration::from_millis(ttl_ms),
        "expired early: {after:?}"
    );
    assert!(
        after <= Duration::from_millis(ttl_ms + 1_000),
        "expired late: {after:?}"
    );
    assert_eq!(
        g.keepalive(holder).await,
        Err(lockd_raft::GroupError::SessionNotFound)
    );

    // Kill the leader; the waiter (now holder) is kept alive across the change and past 2 TTLs.
    let killed = nodes.remove(l);
    killed.stop().await;
    let nl = leader_of(&nodes).await;
    tokio::time::sleep(Duration::from_millis(2 * ttl_ms + 500)).await;
    let g = nodes[nl].group();
    let state = g
        .read(move |t| {
            (
                t.has_session(waiter),
                t.lock_info("fast/x", t.now_ms())
                    .map(|i| i.holders[0].session),
            )
        })
        .await
        .unwrap();
    assert_eq!(state, (true, Some(waiter)));
    stop.store(true, Ordering::Relaxed);
    keepalives.await.unwrap();
    for n in nodes {
        n.stop().await;
    }
}

/// An acquire the leader grants or queues renews its session's lease in the group, as a
/// keepalive would, and says so; one it refuses (busy) renews nothing. Proposed through a
/// follower, so the renewal also crosses the forward.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_granted_or_queued_acquire_renews_the_sessions_lease_and_a_busy_one_does_not() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let nodes = start_cluster(tmp.path(), 3, |_| {}).await;
    let l = leader_of(&nodes).await;
    let via = nodes.iter().position(|n| n.id != nodes[l].id).unwrap();
    let g = nodes[via].group();
    let ns = Namespace {
        name: "fast".into(),
        prefix: "fast/".into(),
        min_ttl_ms: 1_000,
        max_ttl_ms: 10_000,
        default_ttl_ms: 4_000,
        lock_delay_ms: 0,
        ..Namespace::default_namespace()
    };
    ok(&g, Op::PutNamespace { namespace: ns }).await;
    let ttl_ms = 4_000;
    let (a, b, holder) = (SessionId(1), SessionId(2), SessionId(3));
    for s in [a, b, holder] {
        ok(&g, open_op(s, ttl_ms, "fast")).await;
    }
    // The holder is kept alive throughout; a and b never send a keepalive.
    ok(&g, acquire_op(holder, "fast/held", 0)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let keepalives = {
        let (stop, kg) = (stop.clone(), g.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let _ = kg.keepalive(holder).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(3_000)).await;

    let granted = g.propose_full(acquire_op(a, "fast/free", 0)).await.unwrap();
    assert!(
        matches!(granted.reply, Ok(Reply::Acquired { .. })),
        "{granted:?}"
    );
    let renewed = granted.renewed.expect("a grant renews the session's lease");
    assert!(
        renewed.ttl_ms > ttl_ms - 1_000 && renewed.ttl_ms <= ttl_ms,
        "renewed for {} ms, TTL {ttl_ms}",
        renewed.ttl_ms
    );
    let queued = g.propose_full(acquire_op(a, "fast/held", 60_000)).await;
    let queued = queued.unwrap();
    assert!(
        matches!(queued.reply, Ok(Reply::Queued { .. })),
        "{queued:?}"
    );
    assert!(queued.renewed.is_some(), "a queued acquire renews too");
    let busy = g.propose_full(acquire_op(b, "fast/held", 0)).await.unwrap();
    assert!(matches!(busy.reply, Ok(Reply::Busy { .. })), "{busy:?}");
    assert_eq!(busy.renewed, None, "a busy acquire renews nothing");

    // b's lease ends one TTL after it opened; a's runs one TTL from its acquires.
    let reads = g.clone();
    eventually("b expired", Duration::from_secs(15), || {
        reads.read_local(move |t| !t.has_session(b)).then_some(())
    })
    .await;
    assert!(
        g.read_local(move |t| t.has_session(a)),
        "a's acquires renewed its lease past b's expiry"
    );
    stop.store(true, Ordering::Relaxed);
    keepalives.await.unwrap();
    for n in nodes {
        n.stop().await;
    }
}
