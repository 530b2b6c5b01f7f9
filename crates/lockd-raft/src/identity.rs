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
//!
//! **Zones.** The node's zone (`--zone`) and, on a founder, every founder's zone
//! (`--initial-zones`, which the founding placement spreads the groups over) are recorded too.
//! A node never changes zone (one that moved is a new node: `lockctl members replace`), and the
//! founding placement never changes, so neither may differ on a later start. A later start may
//! omit the founders' zones (it gets the recorded ones), but not the node's own: a start whose
//! zone is none is refused, naming the zone to give. A dir from before zones takes a zone on
//! its next start, but keeps its zone-blind founding placement (the groups it hosts are where
//! they are).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use crate::{NodeId, Zones};

/// The file's name inside the data dir.
pub const FILE: &str = "identity";
const FORMAT: u32 = 1;

/// What a data dir belongs to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
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
    /// This node's zone ("": none declared).
    pub zone: String,
    /// Every founder's zone, as the founding placement used them (empty: zone-blind; always
    /// empty for a node that joined an existing cluster).
    pub founder_zones: Zones,
}

/// What a start found in, or made of, its data dir.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// The dir had no identity: it is new (a first start, or a wiped disk).
    pub fresh: bool,
    /// The dir's incarnation (never 0).
    pub incarnation: u64,
    /// The node's zone as recorded ("": none).
    pub zone: String,
    /// The founders' zones the founding placement uses: the recorded ones.
    pub founder_zones: Zones,
}

/// `1=a,2=b,3=c`, the form `--initial-zones` takes.
pub fn format_zones(zones: &Zones) -> String {
    let parts: Vec<String> = zones.iter().map(|(n, z)| format!("{n}={z}")).collect();
    parts.join(",")
}

/// Parses `1=a,2=b,3=c` (`--initial-zones`); each zone as [`check_zone`] has it.
pub fn parse_zones(text: &str) -> Result<Zones, String> {
    let mut out = Zones::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (n, z) = part
            .split_once('=')
            .ok_or_else(|| format!("'{part}' is not NODE_ID=ZONE"))?;
        let n: NodeId = n
            .trim()
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("'{part}': the node id must be a number from 1"))?;
        let z = z.trim();
        check_zone(z)?;
        if out.insert(n, z.to_string()).is_some() {
            return Err(format!("node {n} is given twice"));
        }
    }
    Ok(out)
}

/// A zone name: 1-64 characters of A-Z a-z 0-9 . _ -.
pub fn check_zone(zone: &str) -> Result<(), String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || "._-".contains(c);
    if zone.is_empty() || zone.len() > 64 || !zone.chars().all(ok) {
        return Err(format!(
            "zone '{zone}' must be 1-64 characters of A-Z a-z 0-9 . _ -"
        ));
    }
    Ok(())
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
        if !self.zone.is_empty() {
            let _ = writeln!(s, "zone = {}", self.zone);
        }
        if !self.founder_zones.is_empty() {
            let _ = writeln!(s, "founder_zones = {}", format_zones(&self.founder_zones));
        }
        s
    }

    /// The identity and, if the file has one (dirs from before it do not), the incarnation.
    fn decode(text: &str) -> Result<(Identity, Option<u64>), String> {
        let mut format = None;
        let (mut cluster, mut node_id, mut lock_groups) = (None, None, None);
        let mut replicas = 0;
        let mut incarnation = None;
        let (mut zone, mut founder_zones) = (String::new(), Zones::new());
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
                "zone" => {
                    check_zone(v)?;
                    zone = v.to_string();
                }
                "founder_zones" => founder_zones = parse_zones(v)?,
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
            zone,
            founder_zones,
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
    /// wiped disk, or a dir from before identities), the dir's incarnation (a dir from
    /// before incarnations gets one now) and the zones as recorded (module doc). The first
    /// thing a start does to its data dir, so it also makes the dir private: created 0700 or
    /// tightened to it, its files 0600 (`private.rs`).
    pub fn check_or_record(&self, dir: &Path) -> Result<Recorded, String> {
        crate::private::dir(dir)
            .map_err(|e| format!("cannot make the data dir {} private: {e}", dir.display()))?;
        let path = dir.join(FILE);
        let write = |id: &Identity, incarnation| {
            id.write(dir, incarnation)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let (have, incarnation) = Identity::decode(&text)
                    .map_err(|e| format!("{} is damaged: {e}", path.display()))?;
                self.compare(&have, &path)?;
                // What the dir says from now on: the recorded zones, or a first zone given.
                let now = Identity {
                    zone: if have.zone.is_empty() {
                        self.zone.clone()
                    } else {
                        have.zone.clone()
                    },
                    ..have.clone()
                };
                let incarnation = match incarnation {
                    Some(i) if now == have => i,
                    Some(i) => {
                        write(&now, i)?;
                        i
                    }
                    None => {
                        let i = new_incarnation();
                        write(&now, i)?;
                        i
                    }
                };
                Ok(Recorded {
                    fresh: false,
                    incarnation,
                    zone: now.zone,
                    founder_zones: now.founder_zones,
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let incarnation = new_incarnation();
                write(self, incarnation)?;
                Ok(Recorded {
                    fresh: true,
                    incarnation,
                    zone: self.zone.clone(),
                    founder_zones: self.founder_zones.clone(),
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
        if !have.zone.is_empty() && self.zone != have.zone {
            let given = match self.zone.as_str() {
                "" => "without --zone".to_string(),
                z => format!("with --zone '{z}'"),
            };
            return Err(format!(
                "this node was recorded in zone '{}' ({p}), and is started {given}: a node \
                 never changes zone (give --zone {}; a node that moved zone joins as a new \
                 node, `lockctl members replace`)",
                have.zone, have.zone
            ));
        }
        let given = &self.founder_zones;
        if !have.founder_zones.is_empty() && !given.is_empty() && *given != have.founder_zones {
            return Err(format!(
                "this cluster was founded with --initial-zones {} ({p}), not {}: the groups were \
                 placed over those zones, so they cannot change by restarting",
                format_zones(&have.founder_zones),
                format_zones(given)
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
            ..Identity::default()
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
                incarnation: first.incarnation,
                zone: String::new(),
                founder_zones: Zones::new(),
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
    fn zones_are_recorded_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let founders = parse_zones("1=a, 2=b,3=c").unwrap();
        let zoned = Identity {
            zone: "b".into(),
            founder_zones: founders.clone(),
            ..id("prod", 2, 4)
        };
        let first = zoned.check_or_record(dir.path()).unwrap();
        assert_eq!(
            (first.zone.as_str(), &first.founder_zones),
            ("b", &founders)
        );
        // A start without the flags gets the recorded zones; the same flags are the same.
        let first = Recorded {
            fresh: false,
            ..first
        };
        let bare = Identity {
            zone: "b".into(),
            ..id("prod", 2, 4)
        };
        assert_eq!(bare.check_or_record(dir.path()).unwrap(), first);
        assert_eq!(zoned.check_or_record(dir.path()).unwrap(), first);
        let e = Identity {
            zone: "c".into(),
            ..zoned.clone()
        }
        .check_or_record(dir.path())
        .unwrap_err();
        assert!(
            e.contains("zone 'b'") && e.contains("never changes zone"),
            "{e}"
        );
        let e = id("prod", 2, 4).check_or_record(dir.path()).unwrap_err();
        assert!(
            e.contains("without --zone") && e.contains("give --zone b"),
            "{e}"
        );
        let moved = Identity {
            founder_zones: parse_zones("1=a,2=b,3=a").unwrap(),
            ..zoned.clone()
        };
        let e = moved.check_or_record(dir.path()).unwrap_err();
        assert!(
            e.contains("--initial-zones 1=a,2=b,3=c") && e.contains("not 1=a,2=b,3=a"),
            "{e}"
        );
        assert_eq!(
            zoned.check_or_record(dir.path()).unwrap(),
            first,
            "refusals change nothing"
        );
    }

    #[test]
    fn a_dir_from_before_zones_takes_a_zone_but_keeps_its_zone_blind_placement() {
        let dir = tempfile::tempdir().unwrap();
        let old = id("prod", 2, 4).check_or_record(dir.path()).unwrap();
        let zoned = Identity {
            zone: "b".into(),
            founder_zones: parse_zones("1=a,2=b,3=c").unwrap(),
            ..id("prod", 2, 4)
        };
        let r = zoned.check_or_record(dir.path()).unwrap();
        assert_eq!(r.incarnation, old.incarnation);
        assert_eq!((r.zone.as_str(), r.founder_zones.len()), ("b", 0));
        let text = std::fs::read_to_string(dir.path().join(FILE)).unwrap();
        assert!(
            text.contains("zone = b") && !text.contains("founder_zones"),
            "{text}"
        );
    }

    #[test]
    fn zone_lists_parse_and_name_what_is_wrong() {
        let z = parse_zones("3=eu-west-1c,1=eu-west-1a").unwrap();
        assert_eq!(format_zones(&z), "1=eu-west-1a,3=eu-west-1c");
        assert!(parse_zones("").unwrap().is_empty());
        for (bad, says) in [
            ("1=a,1=b", "given twice"),
            ("1", "NODE_ID=ZONE"),
            ("0=a", "from 1"),
            ("x=a", "from 1"),
            ("1=a b", "1-64 characters"),
            ("1=", "1-64 characters"),
        ] {
            let e = parse_zones(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
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
