//! A data dir's identity: which cluster and node it belongs to, and how many lock groups its
//! cluster was created with. Written on the dir's first start, checked on every later one, so
//! a dir is never started as another node, in another cluster, or with another group count
//! (which would route names to groups that hold none of their locks).
//!
//! The file is `identity` in the data dir, plain `key = value` lines, written to a temporary
//! file, fsync'd and renamed (a crash leaves either no file or a whole one), mode 0600.
//!
//! **Incarnation.** The file also carries a random id made when the dir is first created. A
//! node's identity lives and dies with its disk: the meta group records each node's
//! incarnation, peers refuse calls from an incarnation they do not know, and a node that
//! finds the cluster knows its id by another one stops (`peer/`, `lockd-core/src/cluster.rs`).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use crate::NodeId;

/// The file's name inside the data dir.
pub const FILE: &str = "identity";
const FORMAT: u32 = 1;

/// What a data dir belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The cluster's name (`--cluster-name`); two clusters on one network need two names.
    pub cluster: String,
    /// This node's id. Ids are never reused: a wiped node rejoins under a new one.
    pub node_id: NodeId,
    /// Lock groups the cluster was created with.
    pub lock_groups: u32,
    /// Replicas per lock group the cluster was created with (0: every node; a dir from before
    /// this key reads as 0).
    pub replicas: usize,
}

/// What a start found in, or made of, its data dir.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// The dir had no identity: it is new (a first start, or a wiped disk).
    pub fresh: bool,
    /// The dir's incarnation (never 0).
    pub incarnation: u64,
}

/// A new incarnation: random, never 0.
fn new_incarnation() -> u64 {
    rand::random::<u64>().max(1)
}

impl Identity {
    fn encode(&self, incarnation: u64) -> String {
        let mut s = String::from(
            "# lockd data dir identity, written on its first start; do not edit.\n\
             # A dir that lost its data must not be restarted under the same node id.\n",
        );
        let _ = writeln!(s, "format = {FORMAT}");
        let _ = writeln!(s, "cluster = {}", self.cluster);
        let _ = writeln!(s, "node_id = {}", self.node_id);
        let _ = writeln!(s, "lock_groups = {}", self.lock_groups);
        let _ = writeln!(s, "replicas = {}", self.replicas);
        let _ = writeln!(s, "incarnation = {incarnation:016x}");
        s
    }

    /// The identity and, if the file has one (dirs from before it do not), the incarnation.
    fn decode(text: &str) -> Result<(Identity, Option<u64>), String> {
        let mut format = None;
        let (mut cluster, mut node_id, mut lock_groups) = (None, None, None);
        let mut replicas = 0;
        let mut incarnation = None;
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| format!("line '{line}' is not KEY = VALUE"))?;
            let (k, v) = (k.trim(), v.trim());
            let num = |v: &str| {
                v.parse::<u64>()
                    .map_err(|_| format!("{k} = '{v}' is not a number"))
            };
            match k {
                "format" => format = Some(num(v)?),
                "cluster" => cluster = Some(v.to_string()),
                "node_id" => node_id = Some(num(v)?),
                "lock_groups" => lock_groups = Some(num(v)? as u32),
                "replicas" => replicas = num(v)? as usize,
                "incarnation" => {
                    incarnation = Some(
                        u64::from_str_radix(v, 16)
                            .ok()
                            .filter(|i| *i != 0)
                            .ok_or_else(|| format!("incarnation = '{v}' is not a hex id"))?,
                    )
                }
                _ => return Err(format!("unknown key '{k}'")),
            }
        }
        if format != Some(u64::from(FORMAT)) {
            return Err(format!("format {format:?}, this lockd reads {FORMAT}"));
        }
        let identity = Identity {
            cluster: cluster.ok_or("no cluster")?,
            node_id: node_id.ok_or("no node_id")?,
            lock_groups: lock_groups.ok_or("no lock_groups")?,
            replicas,
        };
        Ok((identity, incarnation))
    }

    /// The identity recorded in `dir`, if any (read only; for `lockd inspect-data`).
    pub fn read(dir: &Path) -> Result<Option<Identity>, String> {
        let path = dir.join(FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => Identity::decode(&text)
                .map(|(i, _)| Some(i))
                .map_err(|e| format!("{} is damaged: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("cannot read {}: {e}", path.display())),
        }
    }

    /// Checks `self` against the identity recorded in `dir`, or records it with a new
    /// incarnation if there is none. Returns whether it was recorded now (a first start, a
    /// wiped disk, or a dir from before identities) and the dir's incarnation (a dir from
    /// before incarnations gets one now). The first thing a start does to its data dir, so it
    /// also makes the dir private: created 0700 or tightened to it, its files 0600
    /// (`private.rs`).
    pub fn check_or_record(&self, dir: &Path) -> Result<Recorded, String> {
        crate::private::dir(dir)
            .map_err(|e| format!("cannot make the data dir {} private: {e}", dir.display()))?;
        let path = dir.join(FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let (have, incarnation) = Identity::decode(&text)
                    .map_err(|e| format!("{} is damaged: {e}", path.display()))?;
                self.compare(&have, &path)?;
                let incarnation = match incarnation {
                    Some(i) => i,
                    None => {
                        let i = new_incarnation();
                        self.write(dir, i)
                            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                        i
                    }
                };
                Ok(Recorded {
                    fresh: false,
                    incarnation,
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let incarnation = new_incarnation();
                self.write(dir, incarnation)
                    .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                Ok(Recorded {
                    fresh: true,
                    incarnation,
                })
            }
            Err(e) => Err(format!("cannot read {}: {e}", path.display())),
        }
    }

    fn compare(&self, have: &Identity, path: &Path) -> Result<(), String> {
        let p = path.display();
        if have.cluster != self.cluster {
            return Err(format!(
                "this data dir belongs to cluster '{}' ({p}), not '{}': check --cluster-name and \
                 --data-dir",
                have.cluster, self.cluster
            ));
        }
        if have.node_id != self.node_id {
            return Err(format!(
                "this data dir belongs to node {} ({p}), not node {}: check --node-id and \
                 --data-dir (a node id is never reused; a new node needs an empty dir)",
                have.node_id, self.node_id
            ));
        }
        if have.lock_groups != self.lock_groups {
            return Err(format!(
                "this cluster was created with --groups {} ({p}), not {}: the shard map routes \
                 names to those groups, so the count cannot change by restarting",
                have.lock_groups, self.lock_groups
            ));
        }
        if have.replicas != self.replicas {
            return Err(format!(
                "this cluster was created with --replicas {} ({p}), not {}: the groups were \
                 placed on nodes by it, so it cannot change by restarting",
                have.replicas, self.replicas
            ));
        }
        Ok(())
    }

    fn write(&self, dir: &Path, incarnation: u64) -> std::io::Result<()> {
        let tmp = dir.join(format!("{FILE}.tmp"));
        let mut f = crate::private::create_file(&tmp)?;
        f.write_all(self.encode(incarnation).as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(FILE))?;
        std::fs::File::open(dir)?.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(cluster: &str, node_id: NodeId, lock_groups: u32) -> Identity {
        Identity {
            cluster: cluster.into(),
            node_id,
            lock_groups,
            replicas: 0,
        }
    }

    #[test]
    fn recorded_once_then_checked() {
        let dir = tempfile::tempdir().unwrap();
        let first = id("prod", 2, 4).check_or_record(dir.path()).unwrap();
        assert!(first.fresh && first.incarnation != 0);
        let again = id("prod", 2, 4).check_or_record(dir.path()).unwrap();
        assert_eq!(
            again,
            Recorded {
                fresh: false,
                incarnation: first.incarnation
            }
        );
        let e = id("prod", 3, 4).check_or_record(dir.path()).unwrap_err();
        assert!(
            e.contains("belongs to node 2") && e.contains("not node 3"),
            "{e}"
        );
        let e = id("staging", 2, 4).check_or_record(dir.path()).unwrap_err();
        assert!(e.contains("cluster 'prod'"), "{e}");
        let e = id("prod", 2, 8).check_or_record(dir.path()).unwrap_err();
        assert!(e.contains("--groups 4") && e.contains("not 8"), "{e}");
        let three = Identity {
            replicas: 3,
            ..id("prod", 2, 4)
        };
        let e = three.check_or_record(dir.path()).unwrap_err();
        assert!(e.contains("--replicas 0") && e.contains("not 3"), "{e}");
        // A refused start changes nothing.
        assert_eq!(id("prod", 2, 4).check_or_record(dir.path()), Ok(again));
        // The same identity in a new (wiped) dir is a new incarnation.
        let wiped = tempfile::tempdir().unwrap();
        let other = id("prod", 2, 4).check_or_record(wiped.path()).unwrap();
        assert!(other.fresh && other.incarnation != first.incarnation);
    }

    #[test]
    fn a_dir_from_before_replicas_reads_as_every_node() {
        let dir = tempfile::tempdir().unwrap();
        let old = "format = 1\ncluster = prod\nnode_id = 2\nlock_groups = 4\n";
        std::fs::write(dir.path().join(FILE), old).unwrap();
        let r = id("prod", 2, 4).check_or_record(dir.path()).unwrap();
        assert!(!r.fresh, "a dir with data is not new");
        // It got an incarnation, kept from then on.
        assert_eq!(id("prod", 2, 4).check_or_record(dir.path()), Ok(r));
    }

    #[test]
    fn a_damaged_file_is_an_error_not_a_fresh_start() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), "format = 1\nnode_id = x\n").unwrap();
        let e = id("prod", 1, 1).check_or_record(dir.path()).unwrap_err();
        assert!(e.contains("damaged") && e.contains("node_id"), "{e}");
        std::fs::write(dir.path().join(FILE), "format = 9\n").unwrap();
        assert!(id("prod", 1, 1).check_or_record(dir.path()).is_err());
    }
}
