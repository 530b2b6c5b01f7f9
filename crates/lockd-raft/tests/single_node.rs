//! `lockd dev` shape: one node, every group with one replica.
mod common;

use std::time::Duration;

use common::*;
use lockd_core::{BusyReason, Op, Reply, SessionId};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_release_and_wait_grant_on_one_node() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let mut nodes = start_cluster(tmp.path(), 1, |c| c.lock_groups = 2).await;
    let n = &nodes[0];
    assert_eq!(n.node.group_ids(), vec![0, 1, 2]);
    leader_of(&nodes).await;
    let g = n.group();

    let (a, b) = (SessionId(1), SessionId(2));
    ok(&g, open_op(a, 0, "")).await;
    ok(&g, open_op(b, 0, "")).await;
    let t1 = token(&ok(&g, acquire_op(a, "jobs/x", 0)).await);

    // Try-lock by b is busy; a waiting acquire queues.
    match ok(&g, acquire_op(b, "jobs/x", 0)).await {
        Reply::Busy {
            reason: BusyReason::Held,
            ..
        } => {}
        other => panic!("expected Busy, got {other:?}"),
    }
    assert!(matches!(
        ok(&g, acquire_op(b, "jobs/x", 10_000)).await,
        Reply::Queued { position: 1, .. }
    ));

    // Releasing hands the lock to b, announced by a committed Granted effect.
    let released = ok(
        &g,
        Op::Release {
            session: a,
            name: "jobs/x".into(),
            token: t1,
        },
    )
    .await;
    assert_eq!(released, Reply::Released { remaining: 0 });
    let (t2, _) = eventually("grant to b", Duration::from_secs(5), || {
        n.sink.granted(b, "jobs/x")
    })
    .await;
    assert!(t2 > t1);

    let holder = g
        .read(|t| {
            t.lock_info("jobs/x", t.now_ms())
                .map(|i| i.holders[0].token)
        })
        .await
        .unwrap();
    assert_eq!(holder, Some(t2));
    assert_eq!(g.keepalive(b).await.map(|r| r.ttl_ms), Ok(15_000));
    ok(&g, Op::CloseSession { session: b }).await;
    assert_eq!(
        g.keepalive(b).await,
        Err(lockd_raft::GroupError::SessionNotFound)
    );

    // A waiting acquire that is never granted is ended by a committed tick at its deadline.
    ok(&g, open_op(SessionId(3), 0, "")).await;
    ok(&g, acquire_op(SessionId(3), "jobs/y", 0)).await;
    assert!(matches!(
        ok(&g, acquire_op(a, "jobs/y", 300)).await,
        Reply::Queued { .. }
    ));
    eventually("wait to time out", Duration::from_secs(5), || {
        g.read_local(|t| {
            t.lock_info("jobs/y", t.now_ms())
                .is_some_and(|i| i.waiters.is_empty())
        })
        .then_some(())
    })
    .await;

    // The meta group works too.
    let meta = n.node.group(0).unwrap();
    ok(&meta, open_op(SessionId(9), 0, "")).await;

    nodes.pop().unwrap().stop().await;
}
