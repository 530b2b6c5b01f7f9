//! Membership changes online: a 3-replica cluster grows to 5 (each new node a learner first,
//! caught up, then a voter) and shrinks back to 3 on other nodes, the removed nodes are stopped,
//! and every grant survives with tokens still rising.
mod common;

use std::time::Duration;

use common::*;
use lockd_core::SessionId;
use lockd_raft::{GroupId, MemberCall, MemberError, NodeId};

/// Runs a membership call on group `g`'s leader, following `NotLeader` hints (and waiting out
/// elections and hand-offs) until it succeeds.
async fn on_leader<F, Fut>(nodes: &[TestNode], g: GroupId, what: &str, mut call: F)
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<(), MemberError>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut last = None;
    while tokio::time::Instant::now() < deadline {
        let leader = nodes
            .iter()
            .position(|n| n.node.group(g).unwrap().status().is_leader);
        if let Some(i) = leader {
            match call(i).await {
                Ok(()) => return,
                Err(e @ MemberError::Refused(_)) => panic!("{what} on group {g}: {e}"),
                Err(e) => last = Some(e),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what} on group {g}: no success in 60 s; last error {last:?}");
}

fn voters_everywhere(nodes: &[TestNode], groups: &[GroupId], want: &[NodeId]) -> bool {
    nodes.iter().all(|n| {
        let m = n.node.memberships();
        groups
            .iter()
            .all(|g| m[g].voters == want && m[g].learners.is_empty() && !m[g].joint)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grow_from_three_to_five_replicas_and_shrink_onto_other_nodes() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let mut nodes = start_cluster(tmp.path(), 3, |c| c.lock_groups = 1).await;
    let groups: Vec<GroupId> = nodes[0].node.group_ids();
    let l = leader_of(&nodes).await;
    let a = SessionId(1);
    ok(&nodes[l].group(), open_op(a, 60_000, "")).await;
    let t1 = token(&ok(&nodes[l].group(), acquire_op(a, "jobs/kept", 0)).await);

    // Nodes 4 and 5 start as joiners with empty dirs; they host every group but are in none.
    let mut addrs: Vec<String> = nodes.iter().map(|n| n.cfg.peers[&n.id].clone()).collect();
    addrs.extend(free_addrs(2).await);
    for id in [4u64, 5] {
        let mut cfg = configs(tmp.path(), &addrs, |c| c.lock_groups = 1).remove(id as usize - 1);
        cfg.join_existing = true;
        nodes.push(start(cfg).await);
    }
    // Through the admin path: a member that does not lead the group forwards the call to the
    // leader over the peer port.
    for &g in &groups {
        let follower = nodes[..3]
            .iter()
            .find(|n| !n.node.group(g).unwrap().status().is_leader)
            .unwrap();
        for id in [4u64, 5] {
            let addr = addrs[id as usize - 1].clone();
            let m = follower
                .node
                .member_call(
                    g,
                    MemberCall::Add {
                        id,
                        addr: addr.clone(),
                    },
                )
                .await
                .unwrap_or_else(|e| panic!("add {id} to group {g}: {e}"));
            assert!(m.voters.contains(&id), "{m:?}");
            assert_eq!(m.addrs.get(&id), Some(&addr));
        }
        let m = follower
            .node
            .member_call(g, MemberCall::Describe)
            .await
            .unwrap();
        assert_eq!(m.voters, vec![1, 2, 3, 4, 5]);
        assert_eq!(
            m.lag.len(),
            4,
            "the leader reports every other member's lag: {m:?}"
        );
    }
    eventually("5 voters on every node", Duration::from_secs(30), || {
        voters_everywhere(&nodes, &groups, &[1, 2, 3, 4, 5]).then_some(())
    })
    .await;
    converged(&nodes).await;
    let seen = nodes[4].group().read_local(|t| {
        t.lock_info("jobs/kept", t.now_ms())
            .map(|i| i.holders[0].token)
    });
    assert_eq!(
        seen,
        Some(t1),
        "the new replica holds the grant made before it joined"
    );

    // A five-replica group takes writes with two of its nodes stopped: three of five are a
    // quorum. Then the two come back.
    let mut stopped = Vec::new();
    for n in nodes.drain(0..2) {
        stopped.push(n.stop().await);
    }
    let l = leader_of(&nodes).await;
    let b = SessionId(2);
    ok(&nodes[l].group(), open_op(b, 60_000, "")).await;
    let t2 = token(&ok(&nodes[l].group(), acquire_op(b, "jobs/five", 0)).await);
    assert!(t2 > t1);
    for cfg in stopped.into_iter().rev() {
        nodes.insert(0, start(cfg).await);
    }
    converged(&nodes).await;

    // Shrink onto 3, 4, 5: remove 1 and 2, wherever the leaders are (a leader being removed
    // hands its group over first).
    for &g in &groups {
        for id in [1u64, 2] {
            if id == 1 {
                on_leader(&nodes, g, "remove", |i| {
                    let node = nodes[i].node.clone();
                    async move { node.remove_member(g, id).await }
                })
                .await;
            } else {
                // From node 5, wherever the leader is (and if node 2 leads, after it hands over).
                let m = nodes[4]
                    .node
                    .member_call(g, MemberCall::Remove { id })
                    .await
                    .unwrap_or_else(|e| panic!("remove {id} from group {g}: {e}"));
                assert!(!m.voters.contains(&id), "{m:?}");
            }
        }
    }
    let rest: Vec<TestNode> = nodes.split_off(2);
    for n in nodes {
        n.stop().await;
    }
    eventually("3 voters on the rest", Duration::from_secs(30), || {
        voters_everywhere(&rest, &groups, &[3, 4, 5]).then_some(())
    })
    .await;
    let l = leader_of(&rest).await;
    let c = SessionId(3);
    ok(&rest[l].group(), open_op(c, 60_000, "")).await;
    let t3 = token(&ok(&rest[l].group(), acquire_op(c, "jobs/three", 0)).await);
    assert!(t3 > t2, "tokens keep rising after the membership changes");
    converged(&rest).await;
    for n in &rest {
        let held = n.group().read_local(|t| {
            t.lock_info("jobs/kept", t.now_ms())
                .map(|i| i.holders[0].token)
        });
        assert_eq!(held, Some(t1), "node {}: the first grant survived", n.id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_calls_refuse_what_makes_no_sense() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let nodes = start_cluster(tmp.path(), 1, |c| c.lock_groups = 1).await;
    leader_of(&nodes).await;
    let n = &nodes[0].node;
    // The only voter cannot go, and a group the node does not host is named as such.
    let e = n.remove_member(1, 1).await.unwrap_err();
    assert!(
        matches!(&e, MemberError::Unavailable(_) | MemberError::Refused(_)),
        "{e}"
    );
    assert!(matches!(
        n.add_member(9, 2, "127.0.0.1:1").await,
        Err(MemberError::Refused(_))
    ));
    // Removing a node that is not a member changes nothing.
    n.remove_member(1, 7).await.unwrap();
    assert_eq!(n.memberships()[&1].voters, vec![1]);
}

/// The meta group takes five voters: a sixth node follows it as a learner (a member: it routes
/// the group locally and can serve names from it), and is promoted when a voter leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_meta_group_keeps_five_voters_and_a_sixth_node_follows_as_a_learner() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let mut nodes = start_cluster(tmp.path(), 5, |c| c.lock_groups = 1).await;
    leader_of(&nodes).await;
    let meta = lockd_raft::META_GROUP;
    let mut addrs: Vec<String> = nodes.iter().map(|n| n.cfg.peers[&n.id].clone()).collect();
    addrs.extend(free_addrs(1).await);
    let mut cfg = configs(tmp.path(), &addrs, |c| c.lock_groups = 1).remove(5);
    cfg.join_existing = true;
    nodes.push(start(cfg).await);
    let add = MemberCall::Add {
        id: 6,
        addr: addrs[5].clone(),
    };
    let m = nodes[0].node.member_call(meta, add).await.unwrap();
    assert_eq!(
        (m.voters.as_slice(), m.learners.as_slice()),
        ([1, 2, 3, 4, 5].as_slice(), [6].as_slice()),
        "{m:?}"
    );
    assert_eq!(lockd_raft::META_MAX_VOTERS, 5);
    eventually(
        "node 6 routes the meta group locally",
        Duration::from_secs(30),
        || matches!(nodes[5].node.route(meta), Some(lockd_raft::Route::Local(_))).then_some(()),
    )
    .await;

    // A voter leaves (node 2, wherever the leader is): the learner takes its place.
    let m = nodes[5]
        .node
        .member_call(meta, MemberCall::Remove { id: 2 })
        .await
        .unwrap_or_else(|e| panic!("remove 2 from the meta group: {e}"));
    assert_eq!(
        (m.voters.as_slice(), m.learners.as_slice()),
        ([1, 3, 4, 5, 6].as_slice(), [].as_slice()),
        "{m:?}"
    );
    for n in nodes {
        n.stop().await;
    }
}

/// A replica removed while its node was down restarts naming the leader of its saved vote, and
/// that leader never replicates to it again. A learner never starts an election, so it never
/// gives that leader up: only the leader's silence shows it is cut off. Once that has lasted
/// four election timeouts the replica is stranded and the node sends the group's calls to the
/// members. Before, the silence was counted only from a first append after the restart, which
/// never came: the node kept the group local forever, and a wait parked there was never woken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_removed_while_its_node_was_down_is_stranded_after_the_restart() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let mut nodes = start_cluster(tmp.path(), 5, |c| c.lock_groups = 1).await;
    leader_of(&nodes).await;
    let meta = lockd_raft::META_GROUP;
    let mut addrs: Vec<String> = nodes.iter().map(|n| n.cfg.peers[&n.id].clone()).collect();
    addrs.extend(free_addrs(1).await);
    let mut cfg = configs(tmp.path(), &addrs, |c| c.lock_groups = 1).remove(5);
    cfg.join_existing = true;
    nodes.push(start(cfg).await);
    let add = MemberCall::Add {
        id: 6,
        addr: addrs[5].clone(),
    };
    let m = nodes[0].node.member_call(meta, add).await.unwrap();
    assert_eq!(m.learners, [6], "{m:?}");
    eventually(
        "node 6 applies the meta group's log",
        Duration::from_secs(30),
        || {
            let st = nodes[5].node.group(meta).unwrap().status();
            (st.leader.is_some()
                && matches!(nodes[5].node.route(meta), Some(lockd_raft::Route::Local(_))))
            .then_some(())
        },
    )
    .await;

    let cfg = nodes.pop().unwrap().stop().await;
    let m = nodes[0]
        .node
        .member_call(meta, MemberCall::Remove { id: 6 })
        .await
        .unwrap_or_else(|e| panic!("remove 6 from the meta group: {e}"));
    assert!(m.learners.is_empty() && !m.voters.contains(&6), "{m:?}");

    let limit = 4 * Duration::from_millis(cfg.election_timeout_ms.1);
    let back = start(cfg).await;
    eventually(
        "the restarted learner to name the leader of its saved vote",
        Duration::from_secs(5),
        || back.node.group(meta).unwrap().status().leader,
    )
    .await;
    eventually(
        "the restarted learner to count as stranded",
        limit + Duration::from_secs(10),
        || matches!(back.node.route(meta), Some(lockd_raft::Route::Remote(_))).then_some(()),
    )
    .await;
    back.stop().await;
    for n in nodes {
        n.stop().await;
    }
}
