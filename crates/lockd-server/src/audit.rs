//! `--audit-log FILE`: every grant, end of a hold and end of a session this replica applies, as
//! JSON lines in log order (see `lockd_raft::AuditEvent`).
//!
//! Each line is one write(2) to a file opened for appending, so a killed process loses at most
//! the line being written and the file can be read while the node runs. Every replica writes
//! the same events for the same log index (all but `unix_ms`, its own wall clock); lockd-check merges several nodes' files by
//! `(group, index)` and treats a disagreement as a violation of S9.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use lockd_core::LockEvent;
use lockd_raft::{AuditEvent, GroupId};
use serde::Serialize;

/// An open audit log.
pub struct AuditLog {
    file: Mutex<File>,
}

/// One line: where in the log, then the event's own fields.
#[derive(Serialize)]
struct Line<'a> {
    group: GroupId,
    index: u64,
    time_ms: u64,
    /// This node's wall clock as it applied the entry (replicas differ here, and only here).
    unix_ms: u64,
    #[serde(flatten)]
    event: &'a AuditEvent,
}

impl AuditLog {
    /// Opens (creating or appending to) `path`; a new file is 0600 (it names sessions and
    /// owners), like the data dir's files.
    pub fn open(path: &Path) -> std::io::Result<AuditLog> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)?;
        Ok(AuditLog {
            file: Mutex::new(file),
        })
    }

    /// Appends the events of one applied entry. A write error is logged, not fatal: the audit
    /// log is a record, and serving locks must not depend on it.
    pub fn write(&self, group: GroupId, index: u64, time_ms: u64, events: &[LockEvent]) {
        let mut buf = Vec::with_capacity(128 * events.len());
        let unix_ms = crate::backup::unix_ms_now();
        for event in events.iter().filter_map(AuditEvent::of) {
            let line = Line {
                group,
                index,
                time_ms,
                unix_ms,
                event: &event,
            };
            if serde_json::to_writer(&mut buf, &line).is_ok() {
                buf.push(b'\n');
            }
        }
        if buf.is_empty() {
            return;
        }
        let mut file = self.file.lock().expect("audit log lock");
        if let Err(e) = file.write_all(&buf) {
            tracing::warn!(error = %e, "audit log write failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockd_core::{LockMode, SessionId};

    /// A line names its entry by group time and by this node's wall clock, then the event.
    #[test]
    fn a_line_carries_group_time_and_the_wall_clock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path).unwrap();
        let before = crate::backup::unix_ms_now();
        let grant = LockEvent::HoldStarted {
            name: "jobs/1".into(),
            session: SessionId(7),
            owner: "o".into(),
            token: 42,
            mode: LockMode::Exclusive,
            waiter: None,
            waited_ms: 0,
            lease_ttl_ms: 10_000,
        };
        log.write(3, 9, 1_234, &[grant]);
        let text = std::fs::read_to_string(&path).unwrap();
        let line: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(
            (&line["group"], &line["index"], &line["time_ms"]),
            (&3.into(), &9.into(), &1_234.into())
        );
        let unix_ms = line["unix_ms"].as_u64().unwrap();
        assert!(
            (before..=crate::backup::unix_ms_now()).contains(&unix_ms),
            "{line}"
        );
        assert_eq!(
            (&line["event"], &line["token"]),
            (&"grant".into(), &42.into())
        );
    }
}
