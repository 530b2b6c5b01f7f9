//! The service's view of who holds what, across groups, and the records the history checker
//! reads (`SvcGrant`, `SvcRelease`, `SvcSessionExpired`, `SvcSessionAdopted`), all under one
//! group (`NAME_VIEW`) so
//! that the checker follows a name that moves between groups. Built from the first replica to
//! apply each command, in first-apply order (each group's log order). Not a check itself: the
//! checks above and the history checker read it.

use super::*;
use lockd_core::LockEvent;

/// What one command did to the view, from the core's events alone, in the order the core made
/// them: holds started (each checked by `check_grant` before it enters the view), ended, moved
/// out with a bucket (group 0: in transit) or in; sessions ended. Opening a session is not an
/// ownership change, so that one comes from the reply.
pub(super) fn apply(
    a: &mut Audit,
    group: GroupId,
    cmd: &Command,
    applied: &Applied,
    mut check_grant: impl FnMut(&mut Audit, &str, u64),
) -> Vec<Record> {
    let mut recs = Vec::new();
    let time_ms = cmd.now_ms;
    if let (Op::OpenSession { session, .. }, Ok(Reply::SessionOpened { .. })) =
        (&cmd.op, &applied.reply)
    {
        a.open_in.entry(*session).or_default().insert(group);
    }
    for e in &applied.events {
        match e {
            LockEvent::HoldStarted {
                name,
                session,
                token,
                ..
            } => {
                check_grant(a, name, *token);
                recs.push(granted(
                    a,
                    group,
                    name.to_string(),
                    *token,
                    *session,
                    time_ms,
                ));
            }
            LockEvent::HoldEnded {
                name, token, cause, ..
            } => {
                if a.holds.get(&**name).is_some_and(|h| h.0 == *token) {
                    a.holds.remove(&**name);
                }
                let cause = cause.as_str();
                recs.push(Record::SvcRelease {
                    seq: 0,
                    group: NAME_VIEW,
                    name: name.to_string(),
                    token: *token,
                    cause: cause.into(),
                    time_ms,
                });
            }
            LockEvent::HoldMovedOut { name, token, .. } => {
                if let Some(h) = a.holds.get_mut(&**name).filter(|h| h.0 == *token) {
                    h.2 = 0;
                }
            }
            LockEvent::HoldMovedIn {
                name,
                session,
                token,
                ..
            } => {
                a.holds.insert(name.to_string(), (*token, *session, group));
                a.open_in.entry(*session).or_default().insert(group);
            }
            LockEvent::SessionAdopted { session, .. } => {
                let groups = a.open_in.entry(*session).or_default();
                // Back after it had ended everywhere (an acquire that read its opening from a
                // group just before that group expired it): a new lease, so grants to it are
                // allowed again (leases are per group; clients stop by their own deadlines).
                if groups.is_empty() {
                    recs.push(Record::SvcSessionAdopted {
                        seq: 0,
                        group: NAME_VIEW,
                        session: session.to_string(),
                        time_ms,
                    });
                }
                groups.insert(group);
            }
            LockEvent::SessionEnded {
                session, reason, ..
            } => {
                // Ended in its last group: from now on no group may grant to it.
                let gone = a.open_in.get_mut(session).is_some_and(|gs| {
                    gs.remove(&group);
                    gs.is_empty()
                });
                if gone && *reason == lockd_core::SessionEndReason::Expired {
                    recs.push(Record::SvcSessionExpired {
                        seq: 0,
                        group: NAME_VIEW,
                        session: session.to_string(),
                        time_ms,
                    });
                }
            }
            LockEvent::WaitStarted { .. } | LockEvent::WaitEnded { .. } => {}
        }
    }
    recs
}

/// `group` granted `name` to `session` with `token` at `index` (after the checks looked).
fn granted(
    a: &mut Audit,
    group: GroupId,
    name: String,
    token: u64,
    session: SessionId,
    time_ms: u64,
) -> Record {
    a.holds.insert(name.clone(), (token, session, group));
    Record::SvcGrant {
        seq: 0,
        group: NAME_VIEW,
        name,
        token,
        session: session.to_string(),
        limit: 1,
        time_ms,
    }
}

/// Numbers the records in first-apply order.
pub(super) fn sequence(a: &mut Audit, recs: &mut [Record]) {
    for r in recs {
        a.seq += 1;
        match r {
            Record::SvcGrant { seq, .. }
            | Record::SvcRelease { seq, .. }
            | Record::SvcSessionExpired { seq, .. }
            | Record::SvcSessionAdopted { seq, .. } => *seq = a.seq,
            _ => {}
        }
    }
}
