//! The service's records: every node's `--audit-log`, merged into `Svc*` history records.
//!
//! Every replica writes the events of each applied entry, and a restarted node writes again the
//! entries it replays, so the same `(group, index)` appears several times. They must agree:
//! a disagreement means two replicas applied different things at one index (S9), reported as
//! `replica_divergence`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use serde::Deserialize;

use crate::history::Record;

#[derive(Deserialize, Clone, Debug, PartialEq, Eq)]
struct Line {
    group: u64,
    index: u64,
    time_ms: u64,
    event: String,
    #[serde(default)]
    name: Option<String>,
    session: u64,
    #[serde(default)]
    token: Option<u64>,
    #[serde(default)]
    limit: Option<u32>,
    #[serde(default)]
    cause: Option<String>,
}

/// The merged service records and how many `(group, index)` entries disagreed across files.
pub struct Merged {
    pub records: Vec<Record>,
    pub entries: usize,
    pub divergent: Vec<String>,
}

fn session_name(id: u64) -> String {
    format!("s_{id:016x}")
}

/// Reads and merges the audit logs.
pub fn merge(paths: &[impl AsRef<Path>]) -> anyhow::Result<Merged> {
    // (group, index) -> events of that entry, per source (node file).
    let mut by_entry: BTreeMap<(u64, u64), Vec<Vec<Line>>> = BTreeMap::new();
    for path in paths {
        let path = path.as_ref();
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        // Within one file an entry's events are contiguous; a replay repeats them later, or at
        // once when the node was killed right after writing the entry it replays first. No
        // line repeats within one application of an entry (every grant has its own token, a
        // hold ends once, a session ends once), so a run's first line recurring starts a replay.
        let mut runs: Vec<((u64, u64), Vec<Line>)> = Vec::new();
        for (n, raw) in text.lines().enumerate() {
            if raw.trim().is_empty() {
                continue;
            }
            let Ok(line) = serde_json::from_str::<Line>(raw) else {
                // A node killed mid-write leaves a torn last line; anything else is a bug.
                if n + 1 == text.lines().count() {
                    continue;
                }
                anyhow::bail!("{}:{}: not an audit line: {raw}", path.display(), n + 1);
            };
            let key = (line.group, line.index);
            match runs.last_mut() {
                Some((k, v)) if *k == key && v.first() != Some(&line) => v.push(line),
                _ => runs.push((key, vec![line])),
            }
        }
        for (key, events) in runs {
            by_entry.entry(key).or_default().push(events);
        }
    }
    let mut records = Vec::new();
    let mut divergent = Vec::new();
    let entries = by_entry.len();
    for ((group, index), versions) in by_entry {
        // A torn write can leave a version short; the longest is the whole entry, and every
        // other version must be a prefix of it.
        let longest = versions
            .iter()
            .max_by_key(|v| v.len())
            .cloned()
            .unwrap_or_default();
        if versions.iter().any(|v| longest[..v.len()] != v[..]) {
            divergent.push(format!("group {group} index {index}: {versions:?}"));
        }
        for (k, l) in longest.into_iter().enumerate() {
            // An import's entry carries one event per moved holder: room for 2^20 of them.
            let seq = (index << 20) + k as u64;
            let session = session_name(l.session);
            let rec = match (l.event.as_str(), l.name, l.token) {
                ("grant", Some(name), Some(token)) => Record::SvcGrant {
                    seq,
                    group,
                    name,
                    token,
                    session,
                    limit: l.limit.unwrap_or(1),
                    time_ms: l.time_ms,
                },
                ("moved_in", Some(name), Some(token)) => Record::SvcMovedIn {
                    seq,
                    group,
                    name,
                    token,
                    session,
                    limit: l.limit.unwrap_or(1),
                    time_ms: l.time_ms,
                },
                ("moved_out", Some(name), Some(token)) => Record::SvcRelease {
                    seq,
                    group,
                    name,
                    token,
                    cause: "moved".into(),
                    time_ms: l.time_ms,
                },
                ("release", Some(name), Some(token)) => Record::SvcRelease {
                    seq,
                    group,
                    name,
                    token,
                    cause: l.cause.unwrap_or_default(),
                    time_ms: l.time_ms,
                },
                ("session_ended", _, _) if l.cause.as_deref() == Some("expire") => {
                    Record::SvcSessionExpired {
                        seq,
                        group,
                        session,
                        time_ms: l.time_ms,
                    }
                }
                ("session_ended", _, _) => continue,
                ("session_adopted", _, _) => Record::SvcSessionAdopted {
                    seq,
                    group,
                    session,
                    time_ms: l.time_ms,
                },
                (other, _, _) => anyhow::bail!("unknown audit event {other:?}"),
            };
            records.push(rec);
        }
    }
    Ok(Merged {
        records,
        entries,
        divergent,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_move_ends_a_hold_in_one_group_and_carries_it_into_another() {
        let dir = std::env::temp_dir().join(format!("lockd-check-moves-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = dir.join("a.jsonl");
        let lines = [
            r#"{"group":1,"index":3,"time_ms":5,"event":"grant","name":"x","session":7,"token":3,"limit":1}"#,
            r#"{"group":1,"index":4,"time_ms":6,"event":"moved_out","name":"x","session":7,"token":3}"#,
            r#"{"group":2,"index":9,"time_ms":6,"event":"moved_in","name":"x","session":7,"token":3,"limit":1}"#,
        ];
        std::fs::write(&a, lines.join("\n")).unwrap();
        let m = merge(&[&a]).unwrap();
        assert_eq!(m.records.len(), 3);
        assert!(
            matches!(&m.records[1], Record::SvcRelease { group: 1, token: 3, cause, .. } if cause == "moved")
        );
        assert!(matches!(
            &m.records[2],
            Record::SvcMovedIn {
                group: 2,
                token: 3,
                limit: 1,
                ..
            }
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn merges_replays_and_flags_divergence() {
        let dir = std::env::temp_dir().join(format!("lockd-check-audit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = dir.join("a.jsonl");
        let b = dir.join("b.jsonl");
        let g = |i: u64, t: u64| {
            format!(
                r#"{{"group":1,"index":{i},"time_ms":5,"event":"grant","name":"x","session":7,"token":{t},"limit":1}}"#
            )
        };
        let r = r#"{"group":1,"index":4,"time_ms":6,"event":"release","name":"x","session":7,"token":3,"cause":"expire"}
{"group":1,"index":4,"time_ms":6,"event":"session_ended","session":7,"cause":"expire"}"#;
        // a: entries 3 and 4, then a replay of 3 after a restart, then a torn line.
        std::fs::write(&a, format!("{}\n{r}\n{}\n{{\"group\":1,", g(3, 3), g(3, 3))).unwrap();
        std::fs::write(&b, format!("{}\n", g(3, 3))).unwrap();
        let m = merge(&[&a, &b]).unwrap();
        assert!(m.divergent.is_empty(), "{:?}", m.divergent);
        assert_eq!(m.entries, 2);
        assert_eq!(m.records.len(), 3);
        assert!(matches!(
            m.records[2],
            Record::SvcSessionExpired { seq, .. } if seq == (4 << 20) + 1
        ));
        // A replay right after the entry it repeats (killed just after writing it) is a second
        // version of the entry, not a longer entry with every event twice.
        std::fs::write(&b, format!("{r}\n{r}\n")).unwrap();
        let m = merge(&[&a, &b]).unwrap();
        assert!(m.divergent.is_empty(), "{:?}", m.divergent);
        assert_eq!(m.records.len(), 3);
        // b disagrees at index 3: another token.
        std::fs::write(&b, format!("{}\n", g(3, 9))).unwrap();
        let m = merge(&[&a, &b]).unwrap();
        assert_eq!(m.divergent.len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
