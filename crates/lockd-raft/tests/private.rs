//! A data dir is private to the service user: directories 0700, files 0600, whatever the
//! umask; a dir made wider by hand (or by an older lockd) is tightened at start.
mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::*;
use lockd_core::SessionId;

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// Every dir and file under `root`, with its mode.
fn tree(root: &Path) -> Vec<(std::path::PathBuf, bool, u32)> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        out.push((d.clone(), true, mode(&d)));
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push((p.clone(), false, mode(&p)));
            }
        }
    }
    out
}

fn assert_private(root: &Path) {
    for (path, is_dir, m) in tree(root) {
        let want = if is_dir { 0o700 } else { 0o600 };
        assert_eq!(m, want, "{} is {m:o}", path.display());
    }
}

/// Before: the data dir and its files were made under the umask (0755 / 0644 with the usual
/// 022), so any local user could read every lock's owner and session id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_dir_and_its_files_are_private() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    // A snapshot on every few entries, so snapshot files exist too.
    let mut nodes = start_cluster(tmp.path(), 1, |c| c.snapshot_every = 5).await;
    let n = nodes.pop().unwrap();
    let s = SessionId(3);
    ok(&n.group(), open_op(s, 60_000, "")).await;
    for i in 0..12 {
        ok(&n.group(), acquire_op(s, &format!("p/{i}"), 0)).await;
    }
    let dir = n.cfg.data_dir.clone();
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join("identity")), 0o600);
    let cfg = n.stop().await;
    assert!(dir.join("group-1").join("snapshot.bin").exists());
    assert_private(&dir);

    // Opened up by hand: the next start tightens every dir and file.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    for (path, is_dir, _) in tree(&dir) {
        let m = if is_dir { 0o755 } else { 0o644 };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(m)).unwrap();
    }
    let n = start(cfg).await;
    assert_private(&dir);
    n.stop().await;
}
