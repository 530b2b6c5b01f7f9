//! A data dir knows whose it is: started as another node, in another cluster or with another
//! group count, the node refuses (and the dir is unchanged); a joiner never initialises a group.
mod common;

use std::time::Duration;

use common::*;
use lockd_raft::{Node, StartError};

/// Why a node must not start: its data dir is not its own, or its flags contradict.
#[derive(Clone, Copy)]
enum Refusal {
    Identity,
    Config,
}

/// Starts a node that must be refused for `reason`; returns why it was.
async fn refused(cfg: lockd_raft::NodeConfig, reason: Refusal) -> String {
    match (
        Node::start(cfg, std::sync::Arc::new(Recorder::default())).await,
        reason,
    ) {
        (Err(StartError::Identity(why)), Refusal::Identity) => why,
        (Err(StartError::Config(why)), Refusal::Config) => why,
        (Err(e), _) => panic!("refused for the wrong reason: {e}"),
        (Ok(_), _) => panic!("a node started where it must be refused"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_starts_only_as_the_node_and_cluster_it_was_made_for() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let nodes = start_cluster(tmp.path(), 1, |c| c.lock_groups = 2).await;
    leader_of(&nodes).await;
    let cfg = nodes.into_iter().next().unwrap().stop().await;
    let identity = std::fs::read_to_string(cfg.data_dir.join("identity")).unwrap();

    let mut other = cfg.clone();
    other.node_id = 2;
    other.peers = [(2, cfg.peers[&1].clone())].into();
    assert!(refused(other, Refusal::Identity)
        .await
        .contains("belongs to node 1"));
    let mut other = cfg.clone();
    other.lock_groups = 3;
    assert!(refused(other, Refusal::Identity)
        .await
        .contains("--groups 2"));
    let mut other = cfg.clone();
    other.cluster_name = "staging".into();
    assert!(refused(other, Refusal::Identity)
        .await
        .contains("cluster 'lockd'"));
    assert_eq!(
        std::fs::read_to_string(cfg.data_dir.join("identity")).unwrap(),
        identity
    );

    // The same flags start it again, with its data.
    let n = start(cfg).await;
    leader_of(std::slice::from_ref(&n)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joiner_never_initialises_a_group() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let addrs = free_addrs(1).await;
    let mut cfg = configs(tmp.path(), &addrs, |c| c.lock_groups = 1).remove(0);
    cfg.join_existing = true;
    let n = start(cfg.clone()).await;
    // A founder of a one-node cluster leads within about a second; a joiner waits to be
    // added, so it must still have no members and no leader well after that.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for g in n.node.group_ids() {
        let s = n.node.group(g).unwrap().status();
        assert!(
            s.members.is_empty() && s.leader.is_none(),
            "group {g}: a joiner initialised it: {s:?}"
        );
    }
    // The same dir started as the founder initialises (its identity is the same node's).
    let cfg = n.stop().await;
    let mut founder = cfg;
    founder.join_existing = false;
    let n = start(founder).await;
    leader_of(std::slice::from_ref(&n)).await;
}

/// A founder's zones are checked before anything is written: every founder named once, its
/// own zone agreeing, and no group of the founding placement in a zone majority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn founders_zones_that_would_give_a_zone_a_majority_are_refused_before_the_dir_is_touched() {
    let tmp = tempfile::tempdir().unwrap();
    let addrs = free_addrs(5).await;
    let zoned = |spec: &str| {
        let mut cfg = configs(tmp.path(), &addrs, |c| {
            c.lock_groups = 2;
            c.replicas = 3;
        })
        .remove(0);
        cfg.founder_zones = lockd_raft::parse_zones(spec).unwrap();
        cfg
    };
    // 3 of 5 founders in zone a: the meta group (on every founder) has a zone majority.
    let e = refused(zoned("1=a,2=a,3=a,4=b,5=c"), Refusal::Config).await;
    assert!(
        e.contains("the meta group") && e.contains("zone a") && e.contains("--allow-zone-majority"),
        "{e}"
    );
    let e = refused(zoned("1=a,2=b,3=c"), Refusal::Config).await;
    assert!(e.contains("every founder"), "{e}");
    let mut cfg = zoned("1=a,2=b,3=c,4=a,5=b");
    cfg.zone = "c".into();
    assert!(refused(cfg, Refusal::Config).await.contains("disagree"));
    let mut cfg = zoned("");
    cfg.zone = "a".into();
    assert!(refused(cfg, Refusal::Config)
        .await
        .contains("--initial-zones"));
    assert!(
        !tmp.path().join("node-1").join("identity").exists(),
        "nothing was written"
    );
    // Allowed, the same layout starts.
    let mut cfg = zoned("1=a,2=a,3=a,4=b,5=c");
    cfg.allow_zone_majority = true;
    assert!(
        lockd_raft::Node::start(cfg, std::sync::Arc::new(Recorder::default()))
            .await
            .is_ok()
    );
}
