//! The service's own record of who holds what: one [`AuditEvent`] per grant, per hold that ends
//! and per session that ends or is brought into a group, tagged with the log index that caused
//! it.
//!
//! Mapped one to one from the core's [`LockEvent`]s, which every replica emits alike for the same
//! log prefix (S9); an `EffectSink` gets them through [`EffectSink::events`](crate::EffectSink::events).
//! lockd-check reads these records to find double grants and grants to expired sessions on the
//! service's side, independently of what clients observed.

use lockd_core::{LockEvent, LockMode, SessionId};
use serde::Serialize;

/// One change of ownership, as applied at a log index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum AuditEvent {
    /// `name` was granted to `session` with `token`; `limit` is how many holders the lock
    /// admits (1 = exclusive, `u32::MAX` = shared).
    Grant {
        name: String,
        session: SessionId,
        token: u64,
        limit: u32,
    },
    /// The hold `(name, token)` of `session` ended; `cause` is `release`, `close`, `expire` or
    /// `dropped` (its session ended while a bucket move that was then aborted had it away).
    Release {
        name: String,
        session: SessionId,
        token: u64,
        cause: &'static str,
    },
    /// `session` ended (`close` or `expire`); its holds' `Release` events come first.
    SessionEnded {
        session: SessionId,
        cause: &'static str,
    },
    /// `session` was brought into this group, where it had no lease (an acquire adopted it, or a
    /// bucket import brought it): a lease of its own here starts (leases are per group).
    SessionAdopted { session: SessionId },
    /// The hold `(name, token)` of `session` left this group for a bucket move (the freeze's
    /// export): it lives on in the receiving group.
    MovedOut {
        name: String,
        session: SessionId,
        token: u64,
    },
    /// The hold `(name, token)` of `session` arrived with a bucket move (import), or came back
    /// when the move was aborted (thaw): the same hold, token verbatim, not a new grant.
    MovedIn {
        name: String,
        session: SessionId,
        token: u64,
        limit: u32,
    },
}

fn limit_of(mode: LockMode) -> u32 {
    match mode {
        LockMode::Exclusive => 1,
        LockMode::Shared => u32::MAX,
        LockMode::Semaphore { limit } => limit,
    }
}

impl AuditEvent {
    /// The audit record of one of the core's events, if it is a change of ownership (the core
    /// emits them where they happen, in order; nothing here re-derives them).
    pub fn of(event: &LockEvent) -> Option<AuditEvent> {
        Some(match event {
            LockEvent::HoldStarted {
                name,
                session,
                token,
                mode,
                ..
            } => AuditEvent::Grant {
                name: name.to_string(),
                session: *session,
                token: *token,
                limit: limit_of(*mode),
            },
            LockEvent::HoldEnded {
                name,
                session,
                token,
                cause,
                ..
            } => AuditEvent::Release {
                name: name.to_string(),
                session: *session,
                token: *token,
                cause: cause.as_str(),
            },
            LockEvent::SessionEnded {
                session, reason, ..
            } => AuditEvent::SessionEnded {
                session: *session,
                cause: reason.as_str(),
            },
            LockEvent::HoldMovedOut {
                name,
                session,
                token,
            } => AuditEvent::MovedOut {
                name: name.to_string(),
                session: *session,
                token: *token,
            },
            LockEvent::HoldMovedIn {
                name,
                session,
                token,
                mode,
                ..
            } => AuditEvent::MovedIn {
                name: name.to_string(),
                session: *session,
                token: *token,
                limit: limit_of(*mode),
            },
            LockEvent::SessionAdopted { session, .. } => {
                AuditEvent::SessionAdopted { session: *session }
            }
            LockEvent::WaitStarted { .. } | LockEvent::WaitEnded { .. } => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockd_core::{bucket_of, BucketSet, Command, LockTable, MoveRecord, Op, BUCKETS};

    fn run(t: &mut LockTable, op: Op) -> Vec<AuditEvent> {
        let cmd = Command { now_ms: 10, op };
        let applied = t.apply(&cmd);
        assert!(applied.reply.is_ok(), "{:?}: {:?}", cmd.op, applied.reply);
        applied.events.iter().filter_map(AuditEvent::of).collect()
    }

    fn hold(t: &mut LockTable, s: SessionId, name: &str) -> u64 {
        let op = Op::Acquire {
            session: s,
            name: name.into(),
            owner: "o".into(),
            mode: LockMode::Exclusive,
            wait_ms: 0,
            reentrant: false,
        };
        match &run(t, op)[..] {
            [AuditEvent::Grant { token, .. }] => *token,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_move_ends_holds_in_the_sender_and_starts_them_in_the_receiver_once() {
        let s = SessionId(7);
        let (mut a, mut b) = (LockTable::new(), LockTable::new());
        let (x, y) = (bucket_of("x"), bucket_of("y"));
        assert_ne!(x, y);
        let theirs: BucketSet = [(x + 1) % BUCKETS].into_iter().collect();
        for (t, buckets) in [(&mut a, BucketSet::full()), (&mut b, theirs)] {
            run(
                t,
                Op::AssignBuckets {
                    buckets,
                    map_version: 1,
                },
            );
            let open = Op::OpenSession {
                session: s,
                client: "c".into(),
                ttl_ms: 10_000,
                namespace: String::new(),
            };
            run(t, open);
        }
        let (tx, ty) = (hold(&mut a, s, "x"), hold(&mut a, s, "y"));
        let freeze = |id, bucket| Op::FreezeBuckets {
            move_id: id,
            to_group: 2,
            buckets: [bucket].into_iter().collect(),
        };
        let out = AuditEvent::MovedOut {
            name: "x".into(),
            session: s,
            token: tx,
        };
        assert_eq!(run(&mut a, freeze(1, x)), vec![out]);
        assert_eq!(
            run(&mut a, freeze(1, x)),
            vec![],
            "a repeated freeze moves nothing out"
        );
        let Some(MoveRecord::Outgoing { export, .. }) = a.move_record(1).cloned() else {
            panic!("no export")
        };
        let import = Op::ImportBuckets {
            move_id: 1,
            from_group: 1,
            buckets: [x].into_iter().collect(),
            map_version: 2,
            export,
        };
        let into = AuditEvent::MovedIn {
            name: "x".into(),
            session: s,
            token: tx,
            limit: 1,
        };
        // B had the session: the import restarts its lease there (C2), then brings the hold.
        let restarted = AuditEvent::SessionAdopted { session: s };
        assert_eq!(run(&mut b, import.clone()), vec![restarted, into]);
        assert_eq!(
            run(&mut b, import),
            vec![],
            "a repeated import brings nothing in"
        );
        // An aborted move brings the hold back where it was.
        run(&mut a, freeze(2, y));
        let back = AuditEvent::MovedIn {
            name: "y".into(),
            session: s,
            token: ty,
            limit: 1,
        };
        assert_eq!(run(&mut a, Op::ThawBuckets { move_id: 2 }), vec![back]);
        assert_eq!(run(&mut a, Op::ThawBuckets { move_id: 2 }), vec![]);
    }
}
