//! `lockd inspect-data DIR`: what a data dir holds, read without starting anything on it.
//!
//! It reads the identity, a restore's seed, and each group's newest snapshot (checksum checked,
//! image decoded in memory); it writes nothing and opens no Raft log (opening one may cut a
//! torn tail, a write). Entries after a group's snapshot are in its log and counted only as
//! bytes on disk.

use std::fmt::Write as _;
use std::path::Path;

use lockd_raft::{inspect_snapshot, Identity};

use crate::backup;

/// The report, as text lines.
pub fn inspect_data(dir: &Path) -> anyhow::Result<String> {
    let mut out = String::new();
    if !dir.is_dir() {
        anyhow::bail!("{} is not a directory", dir.display());
    }
    let _ = writeln!(out, "data dir {}", dir.display());
    identity(dir, &mut out)?;
    restore(dir, &mut out)?;
    let mut groups: Vec<(u32, std::path::PathBuf)> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let id = e
                .file_name()
                .to_str()?
                .strip_prefix("group-")?
                .parse()
                .ok()?;
            Some((id, e.path()))
        })
        .collect();
    groups.sort();
    if groups.is_empty() {
        let _ = writeln!(out, "groups: none");
    }
    for (id, path) in groups {
        group(id, &path, &mut out)?;
    }
    Ok(out)
}

/// The data dir's identity line.
fn identity(dir: &Path, out: &mut String) -> anyhow::Result<()> {
    match Identity::read(dir).map_err(anyhow::Error::msg)? {
        Some(id) => {
            let replicas = if id.replicas == 0 {
                "every node".to_string()
            } else {
                id.replicas.to_string()
            };
            let _ = writeln!(
                out,
                "identity: cluster '{}', node {}, created with {} lock groups, replicas per group: {}",
                id.cluster, id.node_id, id.lock_groups, replicas
            );
        }
        None => {
            let _ = writeln!(out, "identity: none (never started)");
        }
    }
    Ok(())
}

/// A restore's line, pending or applied, if the dir was restored.
fn restore(dir: &Path, out: &mut String) -> anyhow::Result<()> {
    if let Some(seed) = backup::load_seed(dir)? {
        let _ = writeln!(
            out,
            "restore: PENDING, floor {} (backup revision {} + bump {}); applied at the next start",
            seed.floor, seed.backup_max_revision, seed.bump
        );
    } else if let Ok(bytes) = std::fs::read(dir.join(backup::APPLIED_FILE)) {
        if let Ok(seed) = serde_json::from_slice::<backup::RestoreSeed>(&bytes) {
            let _ = writeln!(
                out,
                "restore: applied, floor {} (backup revision {} + bump {})",
                seed.floor, seed.backup_max_revision, seed.bump
            );
        }
    }
    Ok(())
}

/// Group `id`'s line: its newest snapshot, and its log's files.
fn group(id: u32, path: &Path, out: &mut String) -> anyhow::Result<()> {
    let what = if id == 0 { "meta group" } else { "lock group" };
    let (files, bytes) = log_files(path)?;
    let _ = write!(out, "group {id} ({what}): ");
    match inspect_snapshot(path)? {
        Some(s) => {
            let st = s.stats;
            let _ = writeln!(
                out,
                "snapshot at log index {} (term {}), voters {:?}, learners {:?}, {} bytes: \
                 revision {}, sessions {}, locks {}, holds {}, waiters {}; log after it: {} \
                 files, {} bytes",
                s.last_log.0,
                s.last_log.1,
                s.voters,
                s.learners,
                s.bytes,
                st.revision,
                st.sessions,
                st.locks,
                st.holds,
                st.waiters,
                files,
                bytes
            );
        }
        None => {
            let _ = writeln!(
                out,
                "no snapshot yet (all state is in the log): {files} files, {bytes} bytes"
            );
        }
    }
    Ok(())
}

/// The group's files other than its snapshot: the Raft log's chunks and lock file.
fn log_files(group_dir: &Path) -> std::io::Result<(usize, u64)> {
    let (mut n, mut bytes) = (0, 0);
    for e in walk(group_dir)? {
        if e.file_name().is_some_and(|f| f != "snapshot.bin") {
            n += 1;
            bytes += std::fs::metadata(&e)?.len();
        }
    }
    Ok((n, bytes))
}

fn walk(dir: &Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            files.extend(walk(&e.path())?);
        } else {
            files.push(e.path());
        }
    }
    Ok(files)
}
