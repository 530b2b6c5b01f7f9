//! Leader balance: the groups' leaders spread over the nodes, and a hand-off loses nothing.
mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use lockd_core::SessionId;
use lockd_raft::{GroupId, NodeId};

const GROUPS: u32 = 4;

/// Starts 3 nodes without waiting for the leaders to settle (`start_cluster` waits).
async fn start_three(dir: &std::path::Path, balance: bool) -> Vec<TestNode> {
    let addrs = free_addrs(3).await;
    let mut nodes = Vec::new();
    for cfg in configs(dir, &addrs, |c| {
        c.lock_groups = GROUPS;
        c.balance_leaders = balance;
    }) {
        nodes.push(start(cfg).await);
    }
    nodes
}

/// The leader of group `g` as the nodes report it, once they agree and it leads with duties.
fn leader(nodes: &[TestNode], g: GroupId) -> Option<NodeId> {
    let st: Vec<_> = nodes
        .iter()
        .map(|n| n.node.group(g).unwrap().status())
        .collect();
    let l = st[0].leader?;
    let leads = st
        .iter()
        .any(|s| s.is_leader && s.tracked_sessions.is_some());
    (leads && st.iter().all(|s| s.leader == Some(l))).then_some(l)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_move_to_their_preferred_leaders_and_keep_every_grant() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let nodes = start_three(tmp.path(), true).await;

    // Node 1 initialises every group and wins every first election. Grants made then must
    // survive the hand-offs.
    let first = eventually("every group led", Duration::from_secs(20), || {
        (0..=GROUPS)
            .map(|g| leader(&nodes, g))
            .collect::<Option<Vec<_>>>()
    })
    .await;
    let s = SessionId(7);
    let mut held = Vec::new();
    for g in 1..=GROUPS {
        let group = nodes[0].node.group(g).unwrap();
        ok(&group, open_op(s, 30_000, "")).await;
        let name = format!("jobs/{g}");
        held.push((
            g,
            name.clone(),
            token(&ok(&group, acquire_op(s, &name, 0)).await),
        ));
    }
    println!("first leaders {first:?}");

    // Each group ends up led by its preferred voter: (g mod 3)-th of nodes 1, 2, 3.
    let settled = eventually("balanced leaders", Duration::from_secs(30), || {
        let ls: Vec<_> = (0..=GROUPS)
            .map(|g| leader(&nodes, g))
            .collect::<Option<_>>()?;
        let want: Vec<_> = (0..=GROUPS)
            .map(|g| nodes[0].node.group(g).unwrap().status().preferred_leader)
            .collect::<Option<_>>()?;
        (ls == want).then_some(ls)
    })
    .await;
    assert_eq!(settled, [1, 2, 3, 1, 2]);
    let spread: BTreeSet<_> = settled.iter().collect();
    assert_eq!(spread.len(), 3, "every node leads a group");

    for (g, name, t) in held {
        // Every replica still has the grant, with its token, and the session.
        for n in &nodes {
            let group = n.node.group(g).unwrap();
            let name = name.clone();
            let holder = group
                .read(move |tb| {
                    tb.lock_info(&name, tb.now_ms())
                        .map(|i| (i.holders[0].session, i.holders[0].token))
                })
                .await
                .unwrap();
            assert_eq!(holder, Some((s, t)), "group {g} on node {}", n.id);
        }
        // The new leader mints larger tokens and knows the session's lease.
        let at = (settled[g as usize] - 1) as usize;
        let group = nodes[at].node.group(g).unwrap();
        let t2 = token(&ok(&group, acquire_op(s, &format!("{name}-after"), 0)).await);
        assert!(t2 > t, "group {g}: {t2} > {t}");
        group
            .keepalive(s)
            .await
            .expect("the new leader tracks the session");
    }

    // Settled leaders stay put.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let later: Vec<_> = (0..=GROUPS).map(|g| leader(&nodes, g)).collect();
    assert_eq!(later, settled.iter().map(|l| Some(*l)).collect::<Vec<_>>());
    for n in nodes {
        n.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_balance_off_the_first_leaders_stay() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let nodes = start_three(tmp.path(), false).await;
    let first = eventually("every group led", Duration::from_secs(20), || {
        (0..=GROUPS)
            .map(|g| leader(&nodes, g))
            .collect::<Option<Vec<_>>>()
    })
    .await;
    assert_eq!(
        nodes[0].node.group(1).unwrap().status().preferred_leader,
        None
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let later: Vec<_> = (0..=GROUPS).map(|g| leader(&nodes, g)).collect();
    assert_eq!(later, first.iter().map(|l| Some(*l)).collect::<Vec<_>>());
    for n in nodes {
        n.stop().await;
    }
}
