//! A damaged last log record (bit flip, or a torn write) is detected on open and cut away;
//! the node then catches up from its peers and never applies the garbage.
mod common;

use std::io::{Read, Seek, SeekFrom, Write};

use common::*;
use lockd_core::SessionId;

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
async fn damaged_log_tail_is_cut_and_recovered_from_peers() {
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

    // One follower gets a bit flip in its last record, the other a torn (short) last record.
    let followers: Vec<usize> = (0..3).filter(|&i| i != l).collect();
    for (k, &f) in followers.iter().enumerate().rev() {
        let cfg = nodes.remove(f).stop().await;
        let chunk = tail_chunk(&cfg.data_dir.join("group-1").join("log"));
        if k == 0 {
            flip_last_byte(&chunk);
        } else {
            chop(&chunk, 3);
        }
        nodes.insert(f, start(cfg).await);
        // More writes while it recovers; it must catch up from the others.
        let l = leader_of(&nodes).await;
        ok(&nodes[l].group(), acquire_op(s, &format!("after/{k}"), 0)).await;
        converged(&nodes).await;
    }
    for n in &nodes {
        assert!(n
            .group()
            .read_local(|t| t.lock_info("after/0", t.now_ms()).is_some()));
    }
    for n in nodes {
        n.stop().await;
    }
}
