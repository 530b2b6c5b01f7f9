//! A torn last log record (the crash cut the write short) is cut away on open and the node
//! catches up from its peers; a complete record with a bad checksum (bit rot) is corruption:
//! the node refuses to start, naming the file and the byte offset, and cuts nothing.
mod common;

use std::io::{Read, Seek, SeekFrom, Write};

use std::sync::Arc;

use common::*;
use lockd_core::SessionId;
use lockd_raft::{NoEffects, Node};

fn flip_last_byte(path: &std::path::Path) {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let len = f.metadata().unwrap().len();
    f.seek(SeekFrom::Start(len - 1)).unwrap();
    let mut b = [0u8; 1];
    f.read_exact(&mut b).unwrap();
    f.seek(SeekFrom::Start(len - 1)).unwrap();
    f.write_all(&[b[0] ^ 0x5a]).unwrap();
    f.sync_all().unwrap();
}

fn chop(path: &std::path::Path, bytes: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len - bytes).unwrap();
    f.sync_all().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_log_tail_is_cut_and_recovered_from_peers() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let mut nodes = start_cluster(tmp.path(), 3, |_| {}).await;
    let l = leader_of(&nodes).await;
    let s = SessionId(3);
    ok(&nodes[l].group(), open_op(s, 60_000, "")).await;
    for i in 0..20 {
        ok(&nodes[l].group(), acquire_op(s, &format!("t/{i}"), 0)).await;
    }
    converged(&nodes).await;

    // A follower's last record is torn (short).
    let f = (0..3).find(|&i| i != l).unwrap();
    let cfg = nodes.remove(f).stop().await;
    let chunk = tail_chunk(&cfg.data_dir.join("group-1").join("log"));
    chop(&chunk, 3);
    nodes.insert(f, start(cfg).await);
    // More writes while it recovers; it must catch up from the others.
    let l = leader_of(&nodes).await;
    ok(&nodes[l].group(), acquire_op(s, "after", 0)).await;
    converged(&nodes).await;
    for n in &nodes {
        assert!(n
            .group()
            .read_local(|t| t.lock_info("after", t.now_ms()).is_some()));
    }
    for n in nodes {
        n.stop().await;
    }
}

/// Before: the corrupt record was cut like a torn one and the node started without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_complete_log_record_refuses_to_start() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let mut nodes = start_cluster(tmp.path(), 3, |_| {}).await;
    let l = leader_of(&nodes).await;
    let s = SessionId(3);
    ok(&nodes[l].group(), open_op(s, 60_000, "")).await;
    for i in 0..20 {
        ok(&nodes[l].group(), acquire_op(s, &format!("t/{i}"), 0)).await;
    }
    converged(&nodes).await;

    // A follower's last record gets a bit flip in its checksum: complete, and wrong.
    let f = (0..3).find(|&i| i != l).unwrap();
    let cfg = nodes.remove(f).stop().await;
    let chunk = tail_chunk(&cfg.data_dir.join("group-1").join("log"));
    flip_last_byte(&chunk);
    let len = std::fs::metadata(&chunk).unwrap().len();
    let err = match Node::start(cfg, Arc::new(NoEffects)).await {
        Ok(_) => panic!("a node with a corrupt log record started"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("group 1"), "{err}");
    assert!(err.contains(&chunk.display().to_string()), "{err}");
    assert!(err.contains("at byte "), "{err}");
    assert!(err.contains("new --node-id"), "{err}");
    assert_eq!(
        std::fs::metadata(&chunk).unwrap().len(),
        len,
        "nothing is cut"
    );

    // The other two go on.
    let l = leader_of(&nodes).await;
    ok(&nodes[l].group(), acquire_op(s, "after", 0)).await;
    for n in nodes {
        n.stop().await;
    }
}
