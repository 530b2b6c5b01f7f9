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

/// A vote marked as a leadership transfer gets past the voters' leader lease, so only the
/// leader may authorise one, by naming its successor. Here a member the leader never named (a
/// follower's identity, forged) first names itself in a TransferLeader of its own, then asks
/// the leader and the other voter for a transfer vote in the next term, with a log long enough
/// to pass the log check. The name is not the leader's, so both take the vote as an ordinary
/// one under a live leader and refuse it; the group keeps its leader and term. Without the
/// check both grant it, the leader steps down, and the group is leaderless until an election;
/// sent in a loop, forever. The positive control, a named transfer, is the test above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_vote_no_leader_named_is_an_ordinary_vote() {
    use lockd_raft::PeerTransport as _;
    use openraft::raft::{VoteRequest, VoteResponse};
    use openraft::vote::RaftLeaderId;
    use std::sync::Arc;
    // A vote request's encoding needs only the node id's and term's types: any data will do.
    openraft::declare_raft_types!(
        Wire: D = String, R = String, NodeId = u64, Node = openraft::BasicNode
    );
    type LeaderId = openraft::impls::leader_id_adv::LeaderId<u64, u64>;

    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let nodes = start_cluster(tmp.path(), 3, |_| {}).await;
    let l = leader_of(&nodes).await;
    let before = nodes[l].group().status();
    let forger = &nodes[(l + 1) % 3];
    let book = Arc::new(lockd_raft::PeerBook::new(forger.node.incarnation(), None));
    let pool = lockd_raft::PeerPool::new(&forger.cfg.peers, "lockd", forger.id, None, book)
        .expect("a pool");
    let mut req = VoteRequest::<Wire>::new(
        openraft::impls::Vote::new(before.term + 1, forger.id),
        Some(openraft::LogId::new(
            LeaderId::new(before.term, nodes[l].id),
            u64::MAX / 2,
        )),
    );
    req.leadership_transfer = true;
    let payload = postcard::to_allocvec(&req).unwrap();
    let own_name = openraft::raft::TransferLeaderRequest::<Wire>::new(
        openraft::impls::Vote::new_committed(before.term, forger.id),
        forger.id,
        None,
    );
    let naming = postcard::to_allocvec(&own_name).unwrap();
    for n in nodes.iter().filter(|n| n.id != forger.id) {
        // Served (openraft ignores a transfer that is not its leader's), and not recorded.
        pool.call(
            n.id,
            lockd_raft::PeerMethod::TransferLeader,
            G,
            naming.clone(),
            Duration::from_secs(2),
        )
        .await
        .expect("a member's transfer is answered");
    }
    for n in nodes.iter().filter(|n| n.id != forger.id) {
        let reply = pool
            .call(
                n.id,
                lockd_raft::PeerMethod::Vote,
                G,
                payload.clone(),
                Duration::from_secs(2),
            )
            .await
            .expect("a member's vote request is answered");
        let resp: VoteResponse<Wire> = postcard::from_bytes(&reply).unwrap();
        assert!(
            !resp.vote_granted,
            "node {} granted a transfer vote no leader named",
            n.id
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = nodes[l].group().status();
    assert!(after.is_leader, "the leader stepped down");
    assert_eq!(after.term, before.term, "the term moved");
}
