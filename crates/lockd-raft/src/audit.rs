//! The service's own record of who holds what: one [`AuditEvent`] per grant, per hold that ends
//! and per session that ends, tagged with the log index that caused it.
//!
//! Derived on every replica from the committed command, the core's reply and its effects, so
//! replicas that applied the same prefix emit the same events (S9). An `EffectSink` opts in with
//! [`EffectSink::wants_audit`](crate::EffectSink::wants_audit); otherwise nothing is computed.
//! lockd-check reads these records to find double grants and grants to expired sessions on the
//! service's side, independently of what clients observed.

use lockd_core::{
    Command, Effect, Export, LockMode, LockTable, MoveRecord, Op, Reply, SessionEndReason,
    SessionId,
};
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
    /// The hold `(name, token)` of `session` ended; `cause` is `release`, `close` or `expire`.
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

fn cause(reason: SessionEndReason) -> &'static str {
    match reason {
        SessionEndReason::Closed => "close",
        SessionEndReason::Expired => "expire",
    }
}

/// What an op may change, read before it is applied.
#[derive(Default)]
pub(crate) struct EndingHolds {
    /// The holds of every session it may end: `(session, [(name, token)])`.
    sessions: Vec<(SessionId, Vec<(String, u64)>)>,
    /// A freeze or import of a move this group has no record of yet (a repeat changes nothing).
    fresh_move: bool,
    /// A thaw's export, which the thaw consumes.
    thawed: Option<Export>,
}

/// Before applying `op`: the holds of every session it may end, and what a move step finds.
pub(crate) fn ending_holds(table: &LockTable, op: &Op) -> EndingHolds {
    let sessions: &[SessionId] = match op {
        Op::CloseSession { session } => std::slice::from_ref(session),
        Op::ExpireSessions { sessions } => sessions,
        _ => &[],
    };
    let (fresh_move, thawed) = match op {
        Op::FreezeBuckets { move_id, .. } | Op::ImportBuckets { move_id, .. } => {
            (table.move_record(*move_id).is_none(), None)
        }
        Op::ThawBuckets { move_id } => match table.move_record(*move_id) {
            Some(MoveRecord::Outgoing { export, .. }) => (false, Some(export.clone())),
            _ => (false, None),
        },
        _ => (false, None),
    };
    EndingHolds {
        sessions: sessions
            .iter()
            .filter_map(|s| table.session_info(*s).map(|i| (*s, i.held)))
            .collect(),
        fresh_move,
        thawed,
    }
}

/// The holds of `export` that `table` holds now, as `MovedIn` events.
fn moved_in(table: &LockTable, now_ms: u64, export: &Export, out: &mut Vec<AuditEvent>) {
    for l in &export.locks {
        let Some(info) = table.lock_info(&l.name, now_ms) else {
            continue;
        };
        for h in &l.holders {
            if info
                .holders
                .iter()
                .any(|x| x.token == h.token && x.session == h.session)
            {
                out.push(AuditEvent::MovedIn {
                    name: l.name.to_string(),
                    session: h.session,
                    token: h.token,
                    limit: limit_of(h.mode),
                });
            }
        }
    }
}

/// After applying `cmd`: what it changed in ownership. `table` is the state after the apply.
pub(crate) fn events(
    table: &LockTable,
    cmd: &Command,
    reply: &Result<Reply, lockd_core::Rejection>,
    effects: &[Effect],
    ending: EndingHolds,
) -> Vec<AuditEvent> {
    let mut out = Vec::new();
    match (&cmd.op, reply) {
        (
            Op::Acquire {
                session,
                name,
                mode,
                ..
            },
            Ok(Reply::Acquired { token, reentry, .. }),
        ) if *reentry == 1 => out.push(AuditEvent::Grant {
            name: name.clone(),
            session: *session,
            token: *token,
            limit: limit_of(*mode),
        }),
        (
            Op::Release {
                session,
                name,
                token,
            },
            Ok(Reply::Released { remaining: 0 }),
        ) => out.push(AuditEvent::Release {
            name: name.clone(),
            session: *session,
            token: *token,
            cause: "release",
        }),
        (Op::FreezeBuckets { move_id, .. }, Ok(Reply::BucketsFrozen { .. }))
            if ending.fresh_move =>
        {
            if let Some(MoveRecord::Outgoing { export, .. }) = table.move_record(*move_id) {
                for l in &export.locks {
                    for h in &l.holders {
                        out.push(AuditEvent::MovedOut {
                            name: l.name.to_string(),
                            session: h.session,
                            token: h.token,
                        });
                    }
                }
            }
        }
        (Op::ImportBuckets { export, .. }, Ok(Reply::BucketsImported { .. }))
            if ending.fresh_move =>
        {
            moved_in(table, cmd.now_ms, export, &mut out)
        }
        (Op::ThawBuckets { .. }, Ok(Reply::BucketsThawed { .. })) => {
            if let Some(export) = &ending.thawed {
                moved_in(table, cmd.now_ms, export, &mut out)
            }
        }
        _ => {}
    }
    // Sessions end first in the core (their holds free, then waiters are granted), so the
    // releases and session ends come before the grants they made possible.
    for e in effects {
        if let Effect::SessionEnded {
            session, reason, ..
        } = e
        {
            let held = ending
                .sessions
                .iter()
                .find(|(s, _)| s == session)
                .map(|(_, h)| h.as_slice())
                .unwrap_or_default();
            for (name, token) in held {
                out.push(AuditEvent::Release {
                    name: name.clone(),
                    session: *session,
                    token: *token,
                    cause: cause(*reason),
                });
            }
            out.push(AuditEvent::SessionEnded {
                session: *session,
                cause: cause(*reason),
            });
        }
    }
    for e in effects {
        if let Effect::Granted {
            session,
            name,
            token,
            ..
        } = e
        {
            let limit = table
                .lock_info(name, cmd.now_ms)
                .and_then(|l| l.holders.iter().find(|h| h.token == *token).map(|h| h.mode))
                .map_or(1, limit_of);
            out.push(AuditEvent::Grant {
                name: name.to_string(),
                session: *session,
                token: *token,
                limit,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockd_core::{bucket_of, BucketSet, BUCKETS};

    fn run(t: &mut LockTable, op: Op) -> Vec<AuditEvent> {
        let cmd = Command { now_ms: 10, op };
        let before = ending_holds(t, &cmd.op);
        let applied = t.apply(&cmd);
        assert!(applied.reply.is_ok(), "{:?}: {:?}", cmd.op, applied.reply);
        events(t, &cmd, &applied.reply, &applied.effects, before)
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
        assert_eq!(run(&mut b, import.clone()), vec![into]);
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
