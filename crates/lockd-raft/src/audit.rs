//! The service's own record of who holds what: one [`AuditEvent`] per grant, per hold that ends
//! and per session that ends, tagged with the log index that caused it.
//!
//! Derived on every replica from the committed command, the core's reply and its effects, so
//! replicas that applied the same prefix emit the same events (S9). An `EffectSink` opts in with
//! [`EffectSink::wants_audit`](crate::EffectSink::wants_audit); otherwise nothing is computed.
//! lockd-check reads these records to find double grants and grants to expired sessions on the
//! service's side, independently of what clients observed.

use lockd_core::{Command, Effect, LockMode, LockTable, Op, Reply, SessionEndReason, SessionId};
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

/// Holds that `op` may end, read before it is applied: `(session, [(name, token)])`.
pub(crate) type EndingHolds = Vec<(SessionId, Vec<(String, u64)>)>;

/// Before applying `op`: the holds of every session it may end.
pub(crate) fn ending_holds(table: &LockTable, op: &Op) -> EndingHolds {
    let sessions: &[SessionId] = match op {
        Op::CloseSession { session } => std::slice::from_ref(session),
        Op::ExpireSessions { sessions } => sessions,
        _ => &[],
    };
    sessions
        .iter()
        .filter_map(|s| table.session_info(*s).map(|i| (*s, i.held)))
        .collect()
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
