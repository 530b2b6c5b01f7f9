//! The simulated clients: lockd-client's lease rule over calls to a node's lockd-server
//! `Service`, a fenced store written only while the lock is believed held, and readers.

use super::*;

/// One call on `group` through a client's home node; `None` if it did not answer in time.
pub(crate) async fn client_call<T, F, Fut>(
    w: &World,
    home: NodeId,
    group: GroupId,
    f: F,
) -> Option<Result<T, GroupError>>
where
    F: FnOnce(Arc<lockd_raft::Group>) -> Fut,
    Fut: std::future::Future<Output = Result<T, GroupError>>,
{
    let deadline = Instant::now() + CALL_TIMEOUT;
    // The client's request reaches a paused node only when it resumes.
    while w.net.is_paused(home) {
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let Some((_, node)) = w.net.node(home) else {
        return Some(Err(GroupError::Unavailable("node down".into())));
    };
    let group = node.group(group)?;
    drop(node);
    tokio::time::timeout_at(deadline, f(group)).await.ok()
}

/// What became of a call a client made through its home node's client API.
pub(crate) enum Answer<T> {
    /// The node is down: the call never reached it.
    Down,
    /// No answer within the client's own limit: its effect is unknown.
    TimedOut,
    Answered(T),
}

/// One call to `home`'s lockd-server [`Service`] (the code behind its HTTP and gRPC ports),
/// bounded by `limit` on the client's side.
pub(crate) async fn call_service<T, F, Fut>(
    w: &World,
    home: NodeId,
    limit: Duration,
    f: F,
) -> Answer<T>
where
    F: FnOnce(Arc<Service>) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let deadline = Instant::now() + limit;
    // The client's request reaches a paused node only when it resumes.
    while w.net.is_paused(home) {
        if Instant::now() >= deadline {
            return Answer::TimedOut;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let Some(svc) = w.service(home) else {
        return Answer::Down;
    };
    match tokio::time::timeout_at(deadline, f(svc)).await {
        Ok(v) => Answer::Answered(v),
        Err(_) => Answer::TimedOut,
    }
}

/// Whether an error says the service did nothing: a rejection by the state machine (4xx), or
/// no leader took the command (lockd-server answers `no_leader` only for a proposal that was
/// never accepted), or the name's group refused it (`wrong_group`, `bucket_moving`,
/// `session_not_here`). Anything else (`unavailable`, `wait_outcome_unknown`) may have been
/// applied.
pub(crate) fn refused(e: &ApiError) -> bool {
    e.status < 500
        || matches!(
            e.code,
            ErrorCode::NoLeader
                | ErrorCode::WrongGroup
                | ErrorCode::BucketMoving
                | ErrorCode::SessionNotHere
        )
}

pub(crate) struct Session {
    pub(crate) id: SessionId,
    /// The local deadlines, per group and session-wide, by lockd-client's own rule.
    pub(crate) lease: Mutex<GroupLeases>,
    /// The hold the client works under now, if any (one at a time): the lease it follows, its
    /// name and its token.
    pub(crate) hold: Mutex<Option<(HoldLease, String, u64)>>,
    /// The service said the session is gone, or a renewal came too late.
    pub(crate) gone: AtomicBool,
    pub(crate) abandoned: AtomicBool,
}

/// Keeps the session alive through the home node every TTL/3, naming the groups lockd-client
/// would (the session's home group and its hold's, or every group once the hold may have
/// moved), feeding each group's answer to the local leases.
pub(crate) async fn keepalive_loop(w: Arc<World>, idx: u64, s: Arc<Session>, mut home: NodeId) {
    loop {
        tokio::time::sleep(TTL / 3).await;
        w.pause_point(idx).await;
        if s.abandoned.load(Ordering::Relaxed) || w.stop.load(Ordering::Relaxed) {
            return;
        }
        let sent = Instant::now();
        let sid = s.id;
        let hold = lock(&s.hold).as_ref().map(|h| h.0);
        let named = lock(&s.lease).keepalive_groups(hold, [], false, sent);
        let asked = named.clone();
        let r = call_service(&w, home, CALL_TIMEOUT, |svc| async move {
            svc.keepalive(sid, &asked, &Credentials::default()).await
        })
        .await;
        match r {
            Answer::Answered(Ok(report)) => {
                let groups: Vec<_> = report.groups.iter().map(group_answer).collect();
                let now = Instant::now();
                let mut leases = lock(&s.lease);
                leases.renewed(sent, report.ttl_ms, &groups, !named.is_empty(), now);
                // As lockd-client: lost once no lease of the session may still be alive.
                if leases.session_deadline() <= now {
                    s.gone.store(true, Ordering::Relaxed);
                    return;
                }
            }
            Answer::Answered(Err(e)) if e.code == ErrorCode::SessionNotFound => {
                s.gone.store(true, Ordering::Relaxed);
                return;
            }
            _ => home = w.any_node(),
        }
    }
}

pub(crate) async fn client(w: Arc<World>, idx: u64) {
    let sabotage = w.cfg.sabotage == Some(Sabotage::ClientDeadline);
    let mut pid: ProcessId = idx * 100_000;
    let mut home = 1 + idx % w.node_count();
    while !w.stop.load(Ordering::Relaxed) {
        pid += 1;
        w.pause_point(idx).await;
        let sent = Instant::now();
        // The home node opens the session in one group, its home (the next one up while that
        // group cannot answer).
        let opened = call_service(&w, home, CALL_TIMEOUT, |svc| async move {
            let ttl_ms = TTL.as_millis() as u64;
            svc.open_session(&format!("c{idx}"), ttl_ms, "", &Credentials::default())
                .await
        })
        .await;
        let Answer::Answered(Ok(opened)) = opened else {
            home = w.any_node();
            tokio::time::sleep(w.rand_ms(50, 300)).await;
            continue;
        };
        let ttl = Duration::from_millis(opened.ttl_ms);
        let mut leases = GroupLeases::opened(sent, ttl, default_margin(TTL));
        leases.homed(opened.group, sent, Instant::now());
        let s = Arc::new(Session {
            id: opened.session,
            lease: Mutex::new(leases),
            hold: Mutex::new(None),
            gone: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
        });
        lock(&w.sessions).insert(s.id, s.clone());
        tokio::spawn(keepalive_loop(w.clone(), idx, s.clone(), home));
        session_ops(&w, idx, &s, &mut pid, &mut home, sabotage).await;
        s.abandoned.store(true, Ordering::Relaxed);
        w.push(Record::ProcessEnd {
            process: pid,
            at_ns: w.now_ns(),
        });
    }
}

/// Operations on one session until it is lost, an outcome is unknown, or the run stops.
pub(crate) async fn session_ops(
    w: &Arc<World>,
    idx: u64,
    s: &Arc<Session>,
    pid: &mut ProcessId,
    home: &mut NodeId,
    sabotage: bool,
) {
    // The session as a whole, before an acquire; then the hold, by the lease it follows.
    let session_over = |s: &Session| {
        !sabotage
            && (lock(&s.lease).session_deadline() <= Instant::now()
                || s.gone.load(Ordering::Relaxed))
    };
    // As lockd-client's guard: a hold whose lease is known to have ended was lost when it
    // ended, not when the client learnt of it.
    let deadline = |s: &Session, hold: &HoldLease| {
        let leases = lock(&s.lease);
        (leases.deadline_of(hold))
            .or_else(|| leases.ended_at(hold))
            .unwrap_or_else(Instant::now)
    };
    let expired = |s: &Session, hold: &HoldLease| {
        session_over(s) || (!sabotage && deadline(s, hold) <= Instant::now())
    };
    loop {
        if w.stop.load(Ordering::Relaxed) {
            return;
        }
        w.pause_point(idx).await;
        if session_over(s) {
            return;
        }
        let name = NAMES[w.rand_u64(0..NAMES.len() as u64) as usize].to_string();
        let wait_ms = if w.chance(0.5) { 1_500 } else { 0 };
        let op = w.invoke(*pid, Call::Acquire { name: name.clone() });
        let req = AcquireRequest {
            session: s.id,
            name: name.clone(),
            owner: format!("c{idx}"),
            mode: LockMode::Exclusive,
            wait_ms,
            reentrant: false,
        };
        // lockd-server routes the name, re-routes it while groups refuse it, parks a queued
        // acquire until the committed log ends its wait, and gives back a grant that comes
        // after this client stopped waiting (the client's limit is shorter than the server's).
        let limit = Duration::from_millis(wait_ms) + CALL_TIMEOUT;
        let sent = Instant::now();
        let r = call_service(w, *home, limit, |svc| async move {
            svc.acquire(req, &Credentials::default()).await
        })
        .await;
        // The groups the acquire brought the session into (granted or not; a wait that moved
        // with its bucket queued again elsewhere): leases there count from this send
        // (lockd-client learns them from its stream's answers).
        if let Answer::Answered(Ok(
            AcquireOutcome::Acquired { adopted_in, .. }
            | AcquireOutcome::NotAcquired { adopted_in, .. },
        )) = &r
        {
            let mut leases = lock(&s.lease);
            for g in adopted_in {
                leases.started(*g, sent, 0, Instant::now());
            }
        }
        // The grant renewed the session's lease in its group, as a keepalive sent with it.
        if let Answer::Answered(Ok(AcquireOutcome::Acquired {
            group,
            renewed: Some(r),
            ..
        })) = &r
        {
            (lock(&s.lease)).renewed_in(*group, sent, r.ttl_ms, r.group_moves, Instant::now());
        }
        let outcome = match &r {
            Answer::Answered(Ok(AcquireOutcome::Acquired { token, .. })) => {
                Outcome::Granted { token: *token }
            }
            Answer::Answered(Ok(AcquireOutcome::NotAcquired { .. })) | Answer::Down => {
                Outcome::NotGranted
            }
            Answer::Answered(Err(e)) if refused(e) => Outcome::NotGranted,
            Answer::Answered(Err(_)) | Answer::TimedOut => Outcome::Unknown,
        };
        w.complete(*pid, op, outcome.clone());
        let token = match outcome {
            Outcome::Granted { token } => token,
            Outcome::Unknown => return,
            _ => {
                if !matches!(r, Answer::Answered(Ok(_))) {
                    *home = w.any_node();
                }
                tokio::time::sleep(w.rand_ms(20, 300)).await;
                continue;
            }
        };
        if checks::acknowledged_group(w, &name, token).is_none() {
            return;
        }
        let Answer::Answered(Ok(AcquireOutcome::Acquired {
            group,
            group_moves,
            lease_ttl_ms,
            ..
        })) = r
        else {
            unreachable!("granted")
        };
        let hold = {
            let mut leases = lock(&s.lease);
            let now = Instant::now();
            // One acquire at a time: no other may have brought the session anywhere.
            leases.granted(sent, now, group, group_moves, lease_ttl_ms, None)
        };
        *lock(&s.hold) = Some((hold, name.clone(), token));
        let from = Instant::now();
        let mut lost = None;
        // Mostly short holds; some long ones (a holder that outlives a leader change).
        let writes = if w.chance(0.3) {
            w.rand_u64(8..25)
        } else {
            w.rand_u64(1..4)
        };
        for n in 0..writes {
            tokio::time::sleep(w.rand_ms(50, 700)).await;
            w.pause_point(idx).await;
            if expired(s, &hold) {
                lost = Some(deadline(s, &hold).min(Instant::now()));
                break;
            }
            // A stop here (GC pause) between the check and the write is what fencing is for.
            w.write_pause_point(idx).await;
            w.store_write(*pid, &name, token, format!("{}:{token}:{n}", *pid));
        }
        // The guard reports the lock lost at the deadline, also after the last write (a pause
        // may have carried the client past it): then it does not release either.
        if lost.is_none() && expired(s, &hold) {
            lost = Some(deadline(s, &hold).min(Instant::now()));
        }
        let to = match lost {
            Some(d) => {
                w.push(Record::LeaseLost {
                    process: *pid,
                    name: name.clone(),
                    token,
                    deadline_ns: w.ns(d),
                    at_ns: w.now_ns(),
                });
                d
            }
            None => Instant::now(),
        };
        lock(&w.holds).push(Hold {
            name: name.clone(),
            process: *pid,
            token,
            from,
            to,
        });
        if lost.is_some() {
            *lock(&s.hold) = None;
            return;
        }
        let op = w.invoke(
            *pid,
            Call::Release {
                name: name.clone(),
                token,
            },
        );
        let sid = s.id;
        let release_name = name.clone();
        let r = call_service(w, *home, CALL_TIMEOUT, |svc| async move {
            svc.release(sid, &release_name, token, &Credentials::default())
                .await
        })
        .await;
        let outcome = match r {
            Answer::Answered(Ok(_)) => Outcome::Ok,
            // A rejection by the state machine: the hold was already gone.
            Answer::Answered(Err(e)) if e.status < 500 => Outcome::Refused,
            // Still routing after its budget (a move under way), no leader, no answer: the
            // service did not say the hold is gone; the client gives the session up.
            _ => Outcome::Unknown,
        };
        let unknown = outcome == Outcome::Unknown;
        let released = outcome == Outcome::Ok;
        // Released, refused (gone already) or unknown: the client works under it no more.
        *lock(&s.hold) = None;
        w.complete(*pid, op, outcome);
        // The deadline may pass while the release is in flight (the leader is unreachable, the
        // session then expires and the release is refused): the guard reports the lock lost at
        // its deadline, which is when this client's belief ended.
        if !released && expired(s, &hold) {
            w.push(Record::LeaseLost {
                process: *pid,
                name,
                token,
                deadline_ns: w.ns(deadline(s, &hold)),
                at_ns: w.now_ns(),
            });
        }
        if unknown {
            return;
        }
        tokio::time::sleep(w.rand_ms(20, 300)).await;
    }
}

/// Linearizable reads of the group's revision through a node that changes after each failure.
/// Each read must see every grant acknowledged before it began: a read served by a deposed
/// leader, or answered from a ReadIndex round that started before the read, would not.
/// Readers run often and side by side, so reads share rounds and batches.
pub(crate) async fn reader(w: Arc<World>, idx: u64) {
    let sabotage = w.cfg.sabotage == Some(Sabotage::StaleRead);
    let mut home = 1 + idx % w.node_count();
    while !w.stop.load(Ordering::Relaxed) {
        tokio::time::sleep(w.rand_ms(5, 150)).await;
        let group = GROUPS[w.rand_u64(0..GROUPS.len() as u64) as usize];
        let floor = checks::stale_read::floor(&w, group);
        let r = client_call(&w, home, group, |g| async move {
            if sabotage {
                Ok(g.read_local(|t| t.revision()))
            } else {
                g.read(|t| t.revision()).await
            }
        })
        .await;
        match r {
            Some(Ok(revision)) => {
                w.reads.fetch_add(1, Ordering::Relaxed);
                checks::check_read(&w, home, group, floor, revision);
            }
            _ => home = w.any_node(),
        }
    }
}

/// A group's answer to a keepalive as lockd-client's rule takes it.
fn group_answer((g, lease): &(u32, GroupLease)) -> (u32, GroupAnswer) {
    let answer = match lease {
        GroupLease::Extended {
            ttl_ms,
            group_moves,
        } => GroupAnswer::Extended {
            ttl_ms: *ttl_ms,
            group_moves: *group_moves,
        },
        GroupLease::NotHere => GroupAnswer::NotHere,
        GroupLease::Unreachable { .. } => GroupAnswer::Other,
    };
    (*g, answer)
}
