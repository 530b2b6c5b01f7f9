//! Backup and restore that keep fencing safe.
//!
//! A lock service's state is mostly short-lived: sessions live a TTL past their client, holds
//! live with their session. What must outlive a disaster is what the protected resources
//! remember: the **fencing tokens** they have seen. A cluster rebuilt from nothing would mint
//! tokens from 1 again, and every fence that stored a larger token would refuse the new
//! holders, or worse, a fence keyed by a fresh resource would take an old holder's write.
//!
//! So a backup records, read linearizably from every lock group, each group's revision (the
//! last token it minted), with the namespaces (their limits and token digests). A restore
//! seeds a new cluster so that, before it serves one name, every lock group's revision is
//! raised above the backup's largest by a bump that covers the tokens minted after the backup
//! was taken (etcd's `snapshot restore --bump-revision`):
//!
//! 1. `lockctl snapshot save FILE` (admin) writes [`Backup`] as JSON, mode 0600.
//! 2. `lockd restore FILE --data-dir D` on every founding node writes [`SEED_FILE`] into the
//!    empty dir `D` (floor = largest revision + bump).
//! 3. `lockd serve --data-dir D --join new ...`: the node serves no name (503 `unavailable`,
//!    `/readyz` not ready) until it has proposed `RaiseRevision { floor }` to every lock group
//!    and seeded the namespaces; then it renames the seed to [`APPLIED_FILE`].
//!
//! Held locks and sessions are not restored: after every node was lost, every session's
//! lease has run out at its client (the client's local deadline passed while nothing
//! answered), so a restored hold would only block its name for a TTL. A hold still working
//! somewhere is fenced off by the bump: its token is below every new one.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use lockd_core::{limits, Namespace};
use lockd_raft::GroupId;
use serde::{Deserialize, Serialize};

/// The backup document's format; a restore reads only this one.
pub const BACKUP_FORMAT: u32 = 1;
/// A restored data dir's pending seed, applied by the node's first start.
pub const SEED_FILE: &str = "restore-seed.json";
/// The seed once applied (kept: it says where the cluster's tokens started).
pub const APPLIED_FILE: &str = "restore-seed.applied.json";
/// The bump when none is given: this many tokens per millisecond since the backup was taken
/// (1M grants/s in one group, 20x the design's whole-cluster rate) ...
const BUMP_PER_MS: u64 = 1_000;
/// ... plus this margin (a wrong wall clock, a backup older than it says).
const BUMP_MARGIN: u64 = 1_000_000_000;
/// How far ahead of this machine's clock a backup's timestamp may be and still count as just
/// taken (clocks of two machines disagree by this much at most, or the margin covers it).
const FUTURE_TOLERANCE_MS: u64 = 60_000;

/// What `lockctl snapshot save` writes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backup {
    pub format: u32,
    /// The lockd version that took it.
    pub lockd_version: String,
    /// Wall-clock time on the node that took it (milliseconds since 1970).
    pub taken_at_unix_ms: u64,
    /// The largest revision of any lock group: every token minted before the backup is at most
    /// this.
    pub max_revision: u64,
    /// Every lock group, read linearizably from its leader.
    pub groups: Vec<GroupBackup>,
    pub namespaces_version: u64,
    /// The namespaces as the meta group has them (bearer tokens as SHA-256 digests only).
    pub namespaces: Vec<Namespace>,
}

/// One lock group in a [`Backup`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupBackup {
    pub group: GroupId,
    /// The last fencing token the group minted.
    pub revision: u64,
    pub sessions: u64,
    pub locks: u64,
    pub holds: u64,
    pub waiters: u64,
}

/// What `lockd restore` writes into a new data dir.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestoreSeed {
    pub format: u32,
    /// The groups this node leads are raised to this.
    pub floor: u64,
    /// A group led by another node is done once its revision is at least this: the smallest
    /// floor a node restored from the same backup raises to. With an explicit bump it is the
    /// floor; with the default one (time-based, so each node's differs by when its restore
    /// ran) it is the backup's revision plus the default's fixed margin. Every default floor
    /// was computed after the old cluster was gone, so each covers all it ever minted.
    pub min_floor: u64,
    pub backup_max_revision: u64,
    pub backup_taken_at_unix_ms: u64,
    pub bump: u64,
    /// Seeded instead of the config file's (the file still only seeds a brand-new cluster).
    pub namespaces: Vec<Namespace>,
}

pub(crate) fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Backup {
    /// Parses and checks a backup file's bytes.
    pub fn parse(bytes: &[u8]) -> Result<Backup, String> {
        let b: Backup =
            serde_json::from_slice(bytes).map_err(|e| format!("not a lockd backup: {e}"))?;
        if b.format != BACKUP_FORMAT {
            return Err(format!(
                "backup format {} is not one this lockd reads ({BACKUP_FORMAT})",
                b.format
            ));
        }
        let max = b.groups.iter().map(|g| g.revision).max().unwrap_or(0);
        if max != b.max_revision {
            return Err(format!(
                "the backup is inconsistent: max_revision {} but its groups' largest is {max}",
                b.max_revision
            ));
        }
        if b.groups.is_empty() {
            return Err("the backup holds no lock group".into());
        }
        Ok(b)
    }

    /// The bump a restore adds when none is given, at wall-clock time `now_unix_ms`. A
    /// backup that says it was taken more than a minute after `now_unix_ms` is refused: one of
    /// the two clocks is wrong, so the time since the backup (and so the tokens minted since)
    /// is unknown, and a bump sized from it could leave the floor below tokens already issued.
    pub fn default_bump(&self, now_unix_ms: u64) -> Result<u64, String> {
        let ahead = self.taken_at_unix_ms.saturating_sub(now_unix_ms);
        if ahead > FUTURE_TOLERANCE_MS {
            return Err(format!(
                "the backup says it was taken {} s after this machine's clock reads now, so \
                 how long ago it was taken, and how many tokens the cluster minted since, is \
                 unknown; fix the clock, or give --bump-revision N with N at least the tokens \
                 the cluster can have minted since the backup (1000 per millisecond is the \
                 default's rate)",
                ahead / 1000
            ));
        }
        let elapsed = now_unix_ms.saturating_sub(self.taken_at_unix_ms);
        Ok(elapsed
            .saturating_mul(BUMP_PER_MS)
            .saturating_add(BUMP_MARGIN))
    }
}

/// `lockd restore`: checks `backup` and writes the seed into `data_dir`, which must be empty
/// (or not exist). Returns the seed written.
pub fn restore_into(
    backup: &[u8],
    data_dir: &Path,
    bump: Option<u64>,
) -> Result<RestoreSeed, String> {
    let b = Backup::parse(backup)?;
    let min_bump = bump.unwrap_or(BUMP_MARGIN);
    let bump = match bump {
        Some(b) => b,
        None => b.default_bump(unix_ms_now())?,
    };
    let floor = b
        .max_revision
        .checked_add(bump)
        .filter(|f| *f <= limits::MAX_REVISION)
        .ok_or_else(|| {
            format!(
                "--bump-revision {bump} on top of the backup's revision {} exceeds the largest \
                 token ({}); give a smaller bump",
                b.max_revision,
                limits::MAX_REVISION
            )
        })?;
    match std::fs::read_dir(data_dir) {
        Ok(mut entries) => {
            if let Some(e) = entries.next() {
                let name = e.map(|e| e.file_name()).unwrap_or_default();
                return Err(format!(
                    "{} is not empty (it holds {name:?}): a restore seeds a new node; give it an \
                     empty or new directory",
                    data_dir.display()
                ));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("cannot read {}: {e}", data_dir.display())),
    }
    lockd_raft::make_private_dir(data_dir)
        .map_err(|e| format!("cannot create {}: {e}", data_dir.display()))?;
    let seed = RestoreSeed {
        format: BACKUP_FORMAT,
        floor,
        min_floor: b.max_revision + min_bump.min(bump),
        backup_max_revision: b.max_revision,
        backup_taken_at_unix_ms: b.taken_at_unix_ms,
        bump,
        namespaces: b.namespaces,
    };
    let text = serde_json::to_vec_pretty(&seed).map_err(|e| e.to_string())?;
    lockd_raft::write_private_file(&data_dir.join(SEED_FILE), &text)
        .map_err(|e| format!("cannot write the seed into {}: {e}", data_dir.display()))?;
    Ok(seed)
}

/// The pending seed in `data_dir`, if a restore left one there.
pub fn load_seed(data_dir: &Path) -> anyhow::Result<Option<RestoreSeed>> {
    let path = data_dir.join(SEED_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => {
            let seed: RestoreSeed = serde_json::from_slice(&bytes)
                .map_err(|e| anyhow::anyhow!("{} is damaged: {e}", path.display()))?;
            if seed.format != BACKUP_FORMAT {
                anyhow::bail!(
                    "{}: seed format {} is not one this lockd reads",
                    path.display(),
                    seed.format
                );
            }
            Ok(Some(seed))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
    }
}

/// Marks the seed in `data_dir` applied (renamed, the dir fsync'd).
pub fn mark_applied(data_dir: &Path) -> std::io::Result<PathBuf> {
    let to = data_dir.join(APPLIED_FILE);
    std::fs::rename(data_dir.join(SEED_FILE), &to)?;
    std::fs::File::open(data_dir)?.sync_all()?;
    Ok(to)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backup(revisions: &[u64]) -> Backup {
        Backup {
            format: BACKUP_FORMAT,
            lockd_version: "test".into(),
            taken_at_unix_ms: 1_000_000,
            max_revision: revisions.iter().copied().max().unwrap_or(0),
            groups: revisions
                .iter()
                .enumerate()
                .map(|(i, r)| GroupBackup {
                    group: i as u32 + 1,
                    revision: *r,
                    sessions: 0,
                    locks: 0,
                    holds: 0,
                    waiters: 0,
                })
                .collect(),
            namespaces_version: 1,
            namespaces: vec![Namespace::default_namespace()],
        }
    }

    #[test]
    fn a_restore_seeds_an_empty_dir_above_the_largest_revision() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("node-1");
        let bytes = serde_json::to_vec(&backup(&[10, 700, 3])).unwrap();
        let seed = restore_into(&bytes, &d, Some(1_000)).unwrap();
        assert_eq!(
            (seed.floor, seed.bump, seed.min_floor),
            (1_700, 1_000, 1_700)
        );
        assert_eq!(load_seed(&d).unwrap(), Some(seed.clone()));
        // The default bump covers 1M tokens/s since the backup was taken, plus a margin.
        let b = backup(&[5]);
        assert_eq!(b.default_bump(1_000_000), Ok(BUMP_MARGIN));
        assert_eq!(
            b.default_bump(1_010_000),
            Ok(10_000 * BUMP_PER_MS + BUMP_MARGIN)
        );
        // A clock a little behind the backup's: just taken.
        assert_eq!(
            b.default_bump(1_000_000 - FUTURE_TOLERANCE_MS),
            Ok(BUMP_MARGIN)
        );
        // A backup "from the future": the time since it is unknown, so no default bump.
        let e = b.default_bump(0).unwrap_err();
        assert!(e.contains("--bump-revision"), "{e}");
        let future = serde_json::to_vec(&Backup {
            taken_at_unix_ms: unix_ms_now() + 3_600_000,
            ..backup(&[5])
        })
        .unwrap();
        let d3 = dir.path().join("node-3");
        let e = restore_into(&future, &d3, None).unwrap_err();
        assert!(e.contains(" s after this machine's clock"), "{e}");
        assert!(!d3.exists(), "a refused restore writes nothing");
        // An explicit bump is the operator's answer.
        assert!(restore_into(&future, &d3, Some(5_000_000_000)).is_ok());
        // With the default bump another node's floor may be smaller than this one's (its
        // restore ran earlier), never below the revision plus the margin.
        let d2 = dir.path().join("node-2");
        let seed2 = restore_into(&bytes, &d2, None).unwrap();
        assert!(seed2.floor >= 700 + BUMP_MARGIN, "{seed2:?}");
        assert_eq!(seed2.min_floor, 700 + BUMP_MARGIN);

        // Not twice into one dir, never into a used one.
        let e = restore_into(&bytes, &d, Some(1)).unwrap_err();
        assert!(e.contains("is not empty"), "{e}");
        assert_eq!(load_seed(&d).unwrap(), Some(seed));
        mark_applied(&d).unwrap();
        assert_eq!(load_seed(&d).unwrap(), None);
    }

    #[test]
    fn a_damaged_or_inconsistent_backup_is_refused_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("n");
        let good = serde_json::to_vec(&backup(&[10])).unwrap();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (good[..good.len() / 2].to_vec(), "not a lockd backup"),
            (
                serde_json::to_vec(&Backup {
                    max_revision: 9,
                    ..backup(&[10])
                })
                .unwrap(),
                "inconsistent",
            ),
            (
                serde_json::to_vec(&Backup {
                    format: 2,
                    ..backup(&[10])
                })
                .unwrap(),
                "format 2",
            ),
            (serde_json::to_vec(&backup(&[])).unwrap(), "no lock group"),
        ];
        for (bytes, want) in cases {
            let e = restore_into(&bytes, &d, Some(1)).unwrap_err();
            assert!(e.contains(want), "{e}");
            assert!(!d.exists(), "a refused restore left {}", d.display());
        }
        let e = restore_into(&good, &d, Some(limits::MAX_REVISION)).unwrap_err();
        assert!(e.contains("exceeds the largest token"), "{e}");
    }
}
