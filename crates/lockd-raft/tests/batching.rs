//! Concurrent proposals share log entries, on the leader and through a follower, and every
//! proposal still gets its own reply; the replicas apply the same commands.
mod common;

use std::collections::BTreeSet;

use common::*;
use futures_util::future::join_all;
use lockd_core::{Rejection, Reply, SessionId};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_proposals_share_entries_and_keep_their_own_replies() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let nodes = start_cluster(tmp.path(), 3, |c| c.lock_groups = 1).await;
    let leader = leader_of(&nodes).await;
    let follower = (leader + 1) % nodes.len();
    let (lg, fg) = (nodes[leader].group(), nodes[follower].group());

    let s = SessionId(7);
    ok(&lg, open_op(s, 0, "")).await;
    let before = converged(&nodes).await;

    // 200 acquires through the leader and 200 through the follower, all at once.
    const EACH: usize = 200;
    let names = |side: &'static str| (0..EACH).map(move |i| format!("batch/{side}/{i}"));
    let calls = names("l")
        .map(|n| (lg.clone(), n))
        .chain(names("f").map(|n| (fg.clone(), n)))
        .map(|(g, n)| async move { (n.clone(), ok(&g, acquire_op(s, &n, 0)).await) });
    let replies = join_all(calls).await;

    let mut tokens = BTreeSet::new();
    for (name, reply) in &replies {
        assert!(
            tokens.insert(token(reply)),
            "{name}: token reused: {reply:?}"
        );
    }
    assert_eq!(tokens.len(), 2 * EACH);
    let after = converged(&nodes).await;
    let entries = after - before;
    eprintln!("{} proposals in {entries} entries", 2 * EACH);
    // One entry per proposal would be 400 (plus the leader's own ticks); queued proposals ride
    // together, so far fewer entries are written.
    assert!(
        entries <= (2 * EACH / 4) as u64,
        "{} proposals took {entries} entries",
        2 * EACH
    );

    // Every hold is in every replica, with the token its acquirer was told.
    for n in &nodes {
        for (name, reply) in &replies {
            let held = n
                .group()
                .read_local(|t| t.lock_info(name, t.now_ms()).map(|i| i.holders[0].token));
            assert_eq!(held, Some(token(reply)), "{name} on node {}", n.id);
        }
    }

    // A rejection stays with its own proposal: re-acquiring a held name in the same batch as
    // a fresh acquire fails alone.
    let (again, fresh) = tokio::join!(
        try_propose(&lg, acquire_op(s, "batch/l/0", 0)),
        try_propose(&lg, acquire_op(s, "batch/new", 0)),
    );
    assert!(
        matches!(again, Ok(Err(Rejection::AlreadyHeld { .. }))),
        "{again:?}"
    );
    assert!(matches!(fresh, Ok(Ok(Reply::Acquired { .. }))), "{fresh:?}");
}
