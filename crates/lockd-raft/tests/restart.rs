//! A node stopped during a stream of acquires and restarted from its data dir recovers every
//! acknowledged grant (snapshot + log replay + catch-up) and converges with its peers.
mod common;

use common::*;
use lockd_core::SessionId;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_recovers_every_acknowledged_grant() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    // Small snapshot interval so recovery exercises snapshot + log replay.
    let mut nodes = start_cluster(tmp.path(), 3, |c| c.snapshot_every = 40).await;
    let l = leader_of(&nodes).await;
    let s = SessionId(7);
    ok(&nodes[l].group(), open_op(s, 60_000, "")).await;

    let victim = nodes.iter().position(|n| n.id != nodes[l].id).unwrap();
    let mut acked = Vec::new();
    let mut victim_cfg = None;
    for i in 0..150 {
        let l = leader_of(&nodes).await;
        let name = format!("stream/{i}");
        if let Ok(Ok(r)) = try_propose(&nodes[l].group(), acquire_op(s, &name, 0)).await {
            acked.push((name, token(&r)));
        }
        if i == 60 {
            victim_cfg = Some(nodes.remove(victim).stop().await);
        }
        if i == 120 {
            nodes.insert(victim, start(victim_cfg.take().unwrap()).await);
        }
    }
    assert_eq!(
        acked.len(),
        150,
        "every acquire on a healthy majority is acknowledged"
    );

    converged(&nodes).await;
    for n in &nodes {
        let g = n.group();
        for (name, tok) in &acked {
            let held = g.read_local(|t| t.lock_info(name, t.now_ms()).map(|i| i.holders[0].token));
            assert_eq!(held, Some(*tok), "node {} lost {name}", n.id);
        }
    }

    // A full restart of every node recovers the same state from disk alone.
    let mut cfgs = Vec::new();
    for n in nodes {
        cfgs.push(n.stop().await);
    }
    let mut nodes = Vec::new();
    for c in cfgs {
        nodes.push(start(c).await);
    }
    leader_of(&nodes).await;
    converged(&nodes).await;
    let g = nodes[0].group();
    let last = acked.last().unwrap().clone();
    let held = g
        .read(move |t| t.lock_info(&last.0, t.now_ms()).map(|i| i.holders[0].token))
        .await
        .unwrap();
    assert_eq!(held, Some(acked.last().unwrap().1));
    // Only the new leaders' blank entries were added; the lock state is the same.
    assert_eq!(g.read_local(|t| t.revision()), acked.last().unwrap().1);
    for n in nodes {
        n.stop().await;
    }
}
