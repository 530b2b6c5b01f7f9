//! The service's view of who holds what, across groups, and the records the history checker
//! reads (`SvcGrant`, `SvcRelease`, `SvcSessionExpired`), all under one group (`NAME_VIEW`) so
//! that the checker follows a name that moves between groups. Built from the first replica to
//! apply each command, in first-apply order (each group's log order). Not a check itself: the
//! checks above and the history checker read it.

use super::*;

/// Everything a command does to the view before its grants: sessions opened, holds frozen,
/// thawed or imported with a bucket move, released, or ended with their session.
pub(super) fn before_grants(
    a: &mut Audit,
    group: GroupId,
    cmd: &Command,
    applied: &Applied,
    t: &LockTable,
) -> Vec<Record> {
    let mut recs = Vec::new();
    let time_ms = cmd.now_ms;
    match (&cmd.op, &applied.reply) {
        (Op::OpenSession { session, .. }, Ok(Reply::SessionOpened { .. })) => {
            a.open_in.entry(*session).or_default().insert(group);
        }
        (
            Op::FreezeBuckets {
                move_id, buckets, ..
            },
            Ok(Reply::BucketsFrozen { .. }),
        ) => {
            // The holds leave this group's table for the move's export.
            for (n, h) in a.holds.iter_mut() {
                if h.2 == group && buckets.contains(lockd_core::bucket_of(n)) {
                    h.2 = 0;
                }
            }
            a.moves
                .entry(*move_id)
                .or_insert_with(|| (group, buckets.clone()));
        }
        (Op::ThawBuckets { move_id }, Ok(Reply::BucketsThawed { .. })) => {
            // The holds come back, but a holder whose session ended meanwhile does not.
            if let Some((from, buckets)) = a.moves.remove(move_id) {
                let back: Vec<String> = a
                    .holds
                    .iter()
                    .filter(|(n, h)| h.2 == 0 && buckets.contains(lockd_core::bucket_of(n)))
                    .map(|(n, _)| n.clone())
                    .collect();
                for n in back {
                    let token = a.holds[&n].0;
                    let kept = t
                        .lock_info(&n, cmd.now_ms)
                        .is_some_and(|i| i.holders.iter().any(|h| h.token == token));
                    if kept {
                        if let Some(h) = a.holds.get_mut(&n) {
                            h.2 = from;
                        }
                    } else {
                        a.holds.remove(&n);
                        recs.push(Record::SvcRelease {
                            seq: 0,
                            group: NAME_VIEW,
                            name: n,
                            token,
                            cause: "thaw-dropped".into(),
                            time_ms,
                        });
                    }
                }
            }
        }
        (
            Op::ImportBuckets {
                move_id, export, ..
            },
            Ok(Reply::BucketsImported { .. }),
        ) if a.imported.insert(*move_id) => {
            // The first import only: a repeat (a second mover finishing the same move) is a
            // no-op in the group, and the holds may have changed hands since.
            a.moves.remove(move_id);
            for l in &export.locks {
                for h in &l.holders {
                    a.holds
                        .insert(l.name.to_string(), (h.token, h.session, group));
                    a.open_in.entry(h.session).or_default().insert(group);
                }
            }
        }
        _ => {}
    }
    if let (Op::Release { name, token, .. }, Ok(Reply::Released { remaining: 0 })) =
        (&cmd.op, &applied.reply)
    {
        a.holds.remove(name);
        recs.push(Record::SvcRelease {
            seq: 0,
            group: NAME_VIEW,
            name: name.clone(),
            token: *token,
            cause: "release".into(),
            time_ms,
        });
    }
    for e in &applied.effects {
        let Effect::SessionEnded {
            session, reason, ..
        } = e
        else {
            continue;
        };
        let ended: Vec<String> = a
            .holds
            .iter()
            .filter(|(_, (_, s, g))| s == session && *g == group)
            .map(|(n, _)| n.clone())
            .collect();
        for n in ended {
            let token = a.holds.remove(&n).map_or(0, |h| h.0);
            recs.push(Record::SvcRelease {
                seq: 0,
                group: NAME_VIEW,
                name: n,
                token,
                cause: format!("{reason:?}").to_lowercase(),
                time_ms,
            });
        }
        // Expired in its last group: from now on no group may grant to it.
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
    recs
}

/// The grants a command made: a direct grant, and waiters granted by its effects.
pub(super) fn grants(cmd: &Command, applied: &Applied) -> Vec<(String, u64, SessionId)> {
    let mut grants = Vec::new();
    if let (Op::Acquire { session, name, .. }, Ok(Reply::Acquired { token, .. })) =
        (&cmd.op, &applied.reply)
    {
        grants.push((name.clone(), *token, *session));
    }
    for e in &applied.effects {
        if let Effect::Granted {
            session,
            name,
            token,
            ..
        } = e
        {
            grants.push((name.to_string(), *token, *session));
        }
    }
    grants
}

/// `group` granted `name` to `session` with `token` at `index` (after the checks looked).
pub(super) fn granted(
    a: &mut Audit,
    group: GroupId,
    index: u64,
    name: String,
    token: u64,
    session: SessionId,
    time_ms: u64,
) -> Record {
    a.holds.insert(name.clone(), (token, session, group));
    a.grants.insert((name.clone(), token), (group, index));
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
            | Record::SvcSessionExpired { seq, .. } => *seq = a.seq,
            _ => {}
        }
    }
}
