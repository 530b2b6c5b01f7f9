//! A follower that misses more than a snapshot interval of entries catches up by snapshot
//! install over gRPC.
mod common;

use common::*;
use lockd_core::{Op, SessionId};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lagging_follower_catches_up_by_snapshot() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let mut nodes = start_cluster(tmp.path(), 3, |c| c.snapshot_every = 30).await;
    let l = leader_of(&nodes).await;
    let s = SessionId(5);
    ok(&nodes[l].group(), open_op(s, 60_000, "")).await;

    let f = nodes.iter().position(|n| n.id != nodes[l].id).unwrap();
    let cfg = nodes.remove(f).stop().await;

    let l = leader_of(&nodes).await;
    let g = nodes[l].group();
    for i in 0..200 {
        // The leader purges its log when a snapshot is taken, unless the dead follower's
        // stream still has entries in flight then; in a release build the first hundred
        // writes can all finish before that stream fails. A pause lets it fail first, so the
        // snapshots after it purge (and the follower must catch up by snapshot).
        if i == 100 {
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        }
        let name = format!("snap/{}", i % 20);
        let t = token(&ok(&g, acquire_op(s, &name, 0)).await);
        ok(
            &g,
            Op::Release {
                session: s,
                name,
                token: t,
            },
        )
        .await;
    }

    nodes.insert(f, start(cfg).await);
    converged(&nodes).await;
    let st = nodes[f].group().status();
    assert!(
        st.snapshots_installed >= 1,
        "follower caught up without a snapshot: {st:?}"
    );
    let follower_rev = nodes[f].group().read_local(|t| t.revision());
    assert_eq!(follower_rev, 200);
    for n in nodes {
        n.stop().await;
    }
}
