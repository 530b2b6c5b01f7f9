//! Random command sequences against a naive model of the protocol.
//!
//! The model keeps everything in plain vectors and scans them; it shares no code with the real
//! state machine. After every step the replies and effects must match exactly, the invariants
//! must hold, tokens must rise per name, and snapshot → restore must give the same hash.

use std::collections::BTreeMap;
use std::sync::Arc;

use lockd_core::*;
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct MHolder {
    session: u64,
    owner: String,
    token: u64,
    mode: LockMode,
    reentry: u32,
    reentrant: bool,
}

#[derive(Clone, Debug)]
struct MWaiter {
    id: u64,
    session: u64,
    owner: String,
    mode: LockMode,
    deadline: u64,
    reentrant: bool,
}

#[derive(Clone, Debug, Default)]
struct MLock {
    holders: Vec<MHolder>,
    waiters: Vec<MWaiter>,
    delay_until: u64,
}

/// Namespace `d/`: lock-delay 500 ms, 3 waiters per name, 4 locks per session.
const DELAY_NS: &str = "d/";

#[derive(Default)]
struct Model {
    now: u64,
    revision: u64,
    next_waiter: u64,
    sessions: BTreeMap<u64, u64>, // id -> ttl
    /// id -> the namespace the session was opened in (it may take only that one's names).
    session_ns: BTreeMap<u64, &'static str>,
    locks: BTreeMap<String, MLock>,
}

fn fits(holders: &[MHolder], mode: LockMode) -> bool {
    match mode {
        LockMode::Exclusive => holders.is_empty(),
        LockMode::Shared => holders.iter().all(|h| h.mode == LockMode::Shared),
        LockMode::Semaphore { limit } => holders.len() < limit as usize,
    }
}

impl Model {
    fn limits(name: &str) -> (u32, u32, u64) {
        if name.starts_with(DELAY_NS) {
            (3, 4, 500)
        } else {
            (500, 10_000, 0)
        }
    }

    fn load(&self, s: u64) -> usize {
        self.locks
            .values()
            .map(|l| {
                l.holders.iter().filter(|h| h.session == s).count()
                    + l.waiters.iter().filter(|w| w.session == s).count()
            })
            .sum()
    }

    fn grant_waiters(&mut self, name: &str, now: u64, fx: &mut Vec<Effect>) {
        // A lock left with no holders, waiters or delay is gone.
        let Some(l) = self.locks.get_mut(name) else {
            return;
        };
        if l.delay_until == 0 {
            while !l.waiters.is_empty() {
                let w = l.waiters[0].clone();
                if w.deadline <= now {
                    l.waiters.remove(0);
                    fx.push(Effect::WaitEnded {
                        waiter: w.id,
                        session: SessionId(w.session),
                        name: Arc::from(name),
                        reason: WaitEndReason::TimedOut,
                    });
                    continue;
                }
                // No token left at the ceiling: the head stays queued.
                if !fits(&l.holders, w.mode) || self.revision >= limits::MAX_REVISION {
                    break;
                }
                l.waiters.remove(0);
                self.revision += 1;
                l.holders.push(MHolder {
                    session: w.session,
                    owner: w.owner,
                    token: self.revision,
                    mode: w.mode,
                    reentry: 1,
                    reentrant: w.reentrant,
                });
                fx.push(Effect::Granted {
                    waiter: w.id,
                    session: SessionId(w.session),
                    name: Arc::from(name),
                    token: self.revision,
                    lease_ttl_ms: self.sessions[&w.session],
                    // The model makes no bucket moves.
                    group_moves: 0,
                });
            }
        }
        if l.holders.is_empty() && l.waiters.is_empty() && l.delay_until == 0 {
            self.locks.remove(name);
        }
    }

    /// Ends every wait of session `s`, by name then waiter id; returns how many and the names.
    fn cancel_waits(&mut self, s: u64, fx: &mut Vec<Effect>) -> (u32, Vec<String>) {
        let names: Vec<String> = self.locks.keys().cloned().collect();
        let mut touched = Vec::new();
        let mut waits = 0;
        for n in &names {
            let l = self.locks.get_mut(n).unwrap();
            let mut i = 0;
            while i < l.waiters.len() {
                if l.waiters[i].session == s {
                    let w = l.waiters.remove(i);
                    fx.push(Effect::WaitEnded {
                        waiter: w.id,
                        session: SessionId(s),
                        name: Arc::from(n.as_str()),
                        reason: WaitEndReason::SessionEnded,
                    });
                    waits += 1;
                    touched.push(n.clone());
                } else {
                    i += 1;
                }
            }
        }
        (waits, touched)
    }

    fn end_session(&mut self, s: u64, expired: bool, now: u64, fx: &mut Vec<Effect>) -> (u32, u32) {
        // Waits first; then holds, by name then token.
        let (waits, mut touched) = self.cancel_waits(s, fx);
        self.sessions.remove(&s).unwrap();
        self.session_ns.remove(&s);
        let names: Vec<String> = self.locks.keys().cloned().collect();
        let mut released = 0;
        for n in &names {
            let delay = Self::limits(n).2;
            let l = self.locks.get_mut(n).unwrap();
            let before = l.holders.len();
            l.holders.retain(|h| h.session != s);
            let freed = before - l.holders.len();
            if freed > 0 {
                released += freed as u32;
                if expired && delay > 0 {
                    l.delay_until = l.delay_until.max(now + delay);
                }
                touched.push(n.clone());
            }
        }
        touched.sort();
        touched.dedup();
        for n in touched {
            self.grant_waiters(&n, now, fx);
        }
        fx.push(Effect::SessionEnded {
            session: SessionId(s),
            reason: if expired {
                SessionEndReason::Expired
            } else {
                SessionEndReason::Closed
            },
            released,
        });
        (released, waits)
    }

    fn apply(&mut self, cmd: &Command) -> (Result<Reply, Rejection>, Vec<Effect>) {
        let now = cmd.now_ms.max(self.now);
        let mut fx = Vec::new();
        let r = self.apply_op(now, &cmd.op, &mut fx);
        if r.is_ok() {
            self.now = now;
        }
        (r, fx)
    }

    fn apply_op(&mut self, now: u64, op: &Op, fx: &mut Vec<Effect>) -> Result<Reply, Rejection> {
        match op {
            Op::OpenSession {
                session,
                ttl_ms,
                namespace,
                ..
            } => {
                let ns = if namespace == "d" { "d" } else { "default" };
                let ttl = if *ttl_ms == 0 { 15_000 } else { *ttl_ms };
                if !(5_000..=60_000).contains(&ttl) {
                    return Err(Rejection::TtlOutOfRange {
                        ttl_ms: ttl,
                        min_ms: 5_000,
                        max_ms: 60_000,
                        namespace: ns.into(),
                    });
                }
                if self.sessions.contains_key(&session.0) {
                    return Err(Rejection::SessionExists { session: *session });
                }
                self.sessions.insert(session.0, ttl);
                self.session_ns.insert(session.0, ns);
                Ok(Reply::SessionOpened {
                    session: *session,
                    ttl_ms: ttl,
                })
            }
            Op::CloseSession { session } => {
                if !self.sessions.contains_key(&session.0) {
                    return Err(Rejection::UnknownSession { session: *session });
                }
                let (released, cancelled_waits) = self.end_session(session.0, false, now, fx);
                Ok(Reply::SessionClosed {
                    released,
                    cancelled_waits,
                })
            }
            Op::ExpireSessions { sessions } => {
                // The waits of every listed session end before any of them frees a hold, so
                // nothing freed here is granted to a session ending in the same command.
                let mut touched = Vec::new();
                for s in sessions {
                    if self.sessions.contains_key(&s.0) {
                        touched.extend(self.cancel_waits(s.0, fx).1);
                    }
                }
                let mut expired = Vec::new();
                for s in sessions {
                    if self.sessions.contains_key(&s.0) {
                        self.end_session(s.0, true, now, fx);
                        expired.push(*s);
                    }
                }
                touched.sort();
                touched.dedup();
                for n in touched {
                    self.grant_waiters(&n, now, fx);
                }
                Ok(Reply::SessionsExpired { expired })
            }
            Op::Acquire {
                session,
                name,
                owner,
                mode,
                wait_ms,
                reentrant,
            } => self.acquire(now, session.0, name, owner, *mode, *wait_ms, *reentrant),
            Op::Release {
                session,
                name,
                token,
            } => {
                let (li, hi) = self.find(session.0, name, *token)?;
                let _ = li;
                let l = self.locks.get_mut(name).unwrap();
                l.holders[hi].reentry -= 1;
                if l.holders[hi].reentry > 0 {
                    return Ok(Reply::Released {
                        remaining: l.holders[hi].reentry,
                    });
                }
                l.holders.remove(hi);
                self.grant_waiters(name, now, fx);
                Ok(Reply::Released { remaining: 0 })
            }
            Op::Extend {
                session,
                name,
                token,
            } => {
                self.find(session.0, name, *token)?;
                Ok(Reply::Extended {
                    lease_ttl_ms: self.sessions[&session.0],
                })
            }
            Op::Tick => {
                // Deadlines in (deadline, waiter id) order, then delays in (until, name) order.
                let mut due: Vec<(u64, u64, String)> = self
                    .locks
                    .iter()
                    .flat_map(|(n, l)| {
                        l.waiters
                            .iter()
                            .filter(|w| w.deadline <= now)
                            .map(|w| (w.deadline, w.id, n.clone()))
                    })
                    .collect();
                due.sort();
                let mut touched = Vec::new();
                for (_, id, n) in &due {
                    let l = self.locks.get_mut(n).unwrap();
                    let i = l.waiters.iter().position(|w| w.id == *id).unwrap();
                    let w = l.waiters.remove(i);
                    fx.push(Effect::WaitEnded {
                        waiter: w.id,
                        session: SessionId(w.session),
                        name: Arc::from(n.as_str()),
                        reason: WaitEndReason::TimedOut,
                    });
                    touched.push(n.clone());
                }
                let mut delays_ended = 0;
                for (n, l) in self.locks.iter_mut() {
                    if l.delay_until != 0 && l.delay_until <= now {
                        l.delay_until = 0;
                        delays_ended += 1;
                        touched.push(n.clone());
                    }
                }
                touched.sort();
                touched.dedup();
                for n in touched {
                    self.grant_waiters(&n, now, fx);
                }
                Ok(Reply::Ticked {
                    timed_out: due.len() as u32,
                    delays_ended,
                })
            }
            Op::RaiseRevision { floor } => {
                if *floor > limits::MAX_REVISION {
                    return Err(Rejection::CounterLimit {
                        field: "floor".into(),
                        value: *floor,
                        max: limits::MAX_REVISION,
                    });
                }
                self.revision = self.revision.max(*floor);
                Ok(Reply::RevisionRaised {
                    revision: self.revision,
                })
            }
            Op::PutNamespace { .. }
            | Op::PutNamespaceV8 { .. }
            | Op::SeedNamespacesV8 { .. }
            | Op::DeleteNamespace { .. }
            | Op::SeedNamespaces { .. }
            | Op::ChangeNamespace { .. }
            | Op::PutShardMap { .. }
            | Op::AssignBuckets { .. }
            | Op::FreezeBuckets { .. }
            | Op::ImportBuckets { .. }
            | Op::CancelImport { .. }
            | Op::ThawBuckets { .. }
            | Op::DropBuckets { .. }
            | Op::SetClusterTiming { .. }
            | Op::RetireNode { .. }
            | Op::RecordGroups { .. }
            | Op::CreateGroup { .. }
            | Op::GroupReady { .. }
            | Op::FoundGroup { .. }
            | Op::AdoptSession { .. }
            | Op::AdoptAndAcquire { .. }
            | Op::SetGroupReplicas { .. }
            | Op::PlaceGroup { .. }
            | Op::CloseGroup
            | Op::RemoveGroup { .. }
            | Op::SetDraining { .. }
            | Op::RegisterIncarnation { .. }
            | Op::RegisterZones { .. } => {
                unreachable!("not generated (tests/moves.rs covers moves, cluster.rs the rest)")
            }
        }
    }

    fn find(&self, s: u64, name: &str, token: u64) -> Result<(usize, usize), Rejection> {
        if name.is_empty() {
            return Err(Rejection::InvalidString {
                field: "name".into(),
                reason: "is empty".into(),
                max_bytes: 512,
            });
        }
        let nh = Rejection::NotHolder {
            session: SessionId(s),
            name: name.to_string(),
        };
        // No lease here for the session: it holds nothing here (leases are per group).
        if !self.sessions.contains_key(&s) {
            return Err(nh);
        }
        let l = self.locks.get(name).ok_or(nh.clone())?;
        if let Some(i) = l
            .holders
            .iter()
            .position(|h| h.token == token && h.session == s)
        {
            return Ok((0, i));
        }
        match l.holders.iter().find(|h| h.session == s) {
            Some(h) => Err(Rejection::StaleToken {
                token,
                current: h.token,
            }),
            None => Err(nh),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn acquire(
        &mut self,
        now: u64,
        s: u64,
        name: &str,
        owner: &str,
        mode: LockMode,
        wait_ms: u64,
        reentrant: bool,
    ) -> Result<Reply, Rejection> {
        if name.is_empty() {
            return Err(Rejection::InvalidString {
                field: "name".into(),
                reason: "is empty".into(),
                max_bytes: 512,
            });
        }
        if let LockMode::Semaphore { limit: 0 } = mode {
            return Err(Rejection::InvalidSemaphoreLimit {
                limit: 0,
                max: limits::MAX_SEMAPHORE_LIMIT,
            });
        }
        // No lease here: the caller may bring the session here (`AdoptSession`).
        let Some(&ttl) = self.sessions.get(&s) else {
            return Err(Rejection::SessionNotHere {
                session: SessionId(s),
            });
        };
        let name_ns = if name.starts_with(DELAY_NS) {
            "d"
        } else {
            "default"
        };
        if self.session_ns[&s] != name_ns {
            return Err(Rejection::WrongNamespace {
                session_namespace: self.session_ns[&s].into(),
                name_namespace: name_ns.into(),
            });
        }
        let (max_waiters, max_locks, _) = Self::limits(name);
        let full = self.load(s) >= max_locks as usize;
        let l = self.locks.entry(name.to_string()).or_default();
        let in_use = l
            .holders
            .first()
            .map(|h| h.mode)
            .or(l.waiters.first().map(|w| w.mode));
        if let Some(m) = in_use {
            let sem = |m: LockMode| matches!(m, LockMode::Semaphore { .. });
            if (sem(m) || sem(mode)) && m != mode {
                return Err(Rejection::ModeConflict {
                    held: m,
                    requested: mode,
                });
            }
        }
        if let Some(h) = l
            .holders
            .iter_mut()
            .find(|h| h.session == s && h.owner == owner)
        {
            if !(reentrant && h.reentrant && h.mode == mode) {
                return Err(Rejection::AlreadyHeld { token: h.token });
            }
            h.reentry += 1;
            return Ok(Reply::Acquired {
                token: h.token,
                lease_ttl_ms: ttl,
                reentry: h.reentry,
                group_moves: 0,
            });
        }
        if let Some(w) = l
            .waiters
            .iter()
            .find(|w| w.session == s && w.owner == owner)
        {
            return Err(Rejection::AlreadyWaiting { waiter: w.id });
        }
        let result = if self.revision >= limits::MAX_REVISION {
            // Anything but a re-entry needs a token, now or later; none is left.
            Err(Rejection::CounterLimit {
                field: "revision".into(),
                value: self.revision + 1,
                max: limits::MAX_REVISION,
            })
        } else if l.delay_until == 0 && l.waiters.is_empty() && fits(&l.holders, mode) {
            if full {
                Err(Rejection::TooManyLocks { limit: max_locks })
            } else {
                self.revision += 1;
                l.holders.push(MHolder {
                    session: s,
                    owner: owner.into(),
                    token: self.revision,
                    mode,
                    reentry: 1,
                    reentrant,
                });
                Ok(Reply::Acquired {
                    token: self.revision,
                    lease_ttl_ms: ttl,
                    reentry: 1,
                    group_moves: 0,
                })
            }
        } else if wait_ms == 0 {
            let reason = if l.delay_until != 0 {
                BusyReason::LockDelay {
                    until_ms: l.delay_until,
                }
            } else {
                BusyReason::Held
            };
            let holder = l.holders.first().map(|h| HolderView {
                session: SessionId(h.session),
                owner: h.owner.clone(),
                token: h.token,
            });
            Ok(Reply::Busy {
                holder,
                queue_len: l.waiters.len() as u32,
                reason,
            })
        } else if l.waiters.len() >= max_waiters as usize {
            Err(Rejection::QueueFull {
                limit: max_waiters,
                retry_after_ms: limits::QUEUE_FULL_RETRY_AFTER_MS,
            })
        } else if full {
            Err(Rejection::TooManyLocks { limit: max_locks })
        } else {
            self.next_waiter += 1;
            let id = self.next_waiter;
            l.waiters.push(MWaiter {
                id,
                session: s,
                owner: owner.into(),
                mode,
                deadline: now + wait_ms,
                reentrant,
            });
            Ok(Reply::Queued {
                waiter: id,
                position: l.waiters.len() as u32,
                deadline_ms: now + wait_ms,
            })
        };
        if l.holders.is_empty() && l.waiters.is_empty() && l.delay_until == 0 {
            self.locks.remove(name);
        }
        result
    }
}

/// Who holds and waits, as the core's events alone tell it: each event must pair with the ones
/// before it (a hold or wait starts once and ends once), and after every command the ledger must
/// equal the model's table. So the audit log, the pushes and the metrics derived from events see
/// exactly the holds and waits there are.
#[derive(Default)]
struct Ledger {
    /// (name, token) -> (session, owner, mode)
    holds: BTreeMap<(String, u64), (u64, String, LockMode)>,
    /// waiter -> (name, session, owner, mode)
    waits: BTreeMap<u64, (String, u64, String, LockMode)>,
}

impl Ledger {
    fn apply(&mut self, events: &[LockEvent], m: &Model) -> Result<(), String> {
        let mut released: BTreeMap<u64, u32> = BTreeMap::new();
        for e in events {
            match e {
                LockEvent::HoldStarted {
                    name,
                    session,
                    owner,
                    token,
                    mode,
                    waiter,
                    lease_ttl_ms,
                    ..
                } => {
                    if let Some(w) = waiter {
                        let (n, s, o, md) =
                            self.waits.remove(w).ok_or(format!("{e:?}: no such wait"))?;
                        if (n.as_str(), s, o.as_str(), md) != (&**name, session.0, &**owner, *mode)
                        {
                            return Err(format!("{e:?} grants another wait"));
                        }
                    }
                    if m.sessions.get(&session.0) != Some(lease_ttl_ms) {
                        return Err(format!("{e:?}: lease is not the session's TTL"));
                    }
                    let old = self.holds.insert(
                        (name.to_string(), *token),
                        (session.0, owner.to_string(), *mode),
                    );
                    if old.is_some() {
                        return Err(format!("{e:?}: the hold started twice"));
                    }
                }
                LockEvent::HoldMovedIn { .. } | LockEvent::HoldMovedOut { .. } => {
                    return Err(format!("{e:?}: no move was asked for"))
                }
                LockEvent::HoldEnded {
                    name,
                    session,
                    token,
                    cause,
                    lock_delay_until_ms,
                    ..
                } => {
                    match self.holds.remove(&(name.to_string(), *token)) {
                        Some((s, _, _)) if s == session.0 => {}
                        other => return Err(format!("{e:?} ends {other:?}")),
                    }
                    if *cause != HoldEndCause::Released {
                        *released.entry(session.0).or_default() += 1;
                    }
                    let want_delay = *cause == HoldEndCause::Expired && name.starts_with(DELAY_NS);
                    if want_delay != (*lock_delay_until_ms != 0) {
                        return Err(format!("{e:?}: a lock-delay is owed iff expired under d/"));
                    }
                    if want_delay
                        && m.locks.get(&**name).map(|l| l.delay_until) != Some(*lock_delay_until_ms)
                    {
                        return Err(format!("{e:?}: the name's lock-delay differs"));
                    }
                }
                LockEvent::WaitStarted {
                    name,
                    waiter,
                    session,
                    owner,
                    mode,
                    position,
                    ..
                } => {
                    let ahead = self.waits.values().filter(|w| w.0 == **name).count();
                    if *position as usize != ahead + 1 {
                        return Err(format!("{e:?}: {ahead} waits ahead of it"));
                    }
                    let w = (name.to_string(), session.0, owner.to_string(), *mode);
                    if self.waits.insert(*waiter, w).is_some() {
                        return Err(format!("{e:?}: the wait started twice"));
                    }
                }
                LockEvent::WaitEnded {
                    name,
                    waiter,
                    session,
                    ..
                } => match self.waits.remove(waiter) {
                    Some((n, s, _, _)) if n == **name && s == session.0 => {}
                    other => return Err(format!("{e:?} ends {other:?}")),
                },
                LockEvent::SessionEnded {
                    session,
                    released: r,
                    ..
                } => {
                    let left = self.holds.values().filter(|h| h.0 == session.0).count()
                        + self.waits.values().filter(|w| w.1 == session.0).count();
                    if left != 0 {
                        return Err(format!("{e:?} with {left} holds or waits left"));
                    }
                    if released.get(&session.0).copied().unwrap_or(0) != *r {
                        return Err(format!("{e:?}: released differs from its holds' ends"));
                    }
                }
                LockEvent::SessionAdopted { .. } => {
                    return Err(format!("{e:?}: no session was adopted"))
                }
            }
        }
        // The ledger is the model's table.
        let mut holds = BTreeMap::new();
        let mut waits = BTreeMap::new();
        for (name, l) in &m.locks {
            for h in &l.holders {
                holds.insert(
                    (name.clone(), h.token),
                    (h.session, h.owner.clone(), h.mode),
                );
            }
            for w in &l.waiters {
                waits.insert(w.id, (name.clone(), w.session, w.owner.clone(), w.mode));
            }
        }
        if holds != self.holds {
            return Err(format!(
                "holds: events say {:?}, the table {holds:?}",
                self.holds
            ));
        }
        if waits != self.waits {
            return Err(format!(
                "waits: events say {:?}, the table {waits:?}",
                self.waits
            ));
        }
        Ok(())
    }
}

fn arb_mode() -> impl Strategy<Value = LockMode> {
    prop_oneof![
        4 => Just(LockMode::Exclusive),
        3 => Just(LockMode::Shared),
        2 => Just(LockMode::Semaphore { limit: 2 }),
        1 => Just(LockMode::Semaphore { limit: 3 }),
        1 => Just(LockMode::Semaphore { limit: 0 }),
    ]
}

fn arb_op() -> impl Strategy<Value = Op> {
    let session = (1u64..6).prop_map(SessionId);
    let name = prop_oneof![Just("a"), Just("b"), Just("d/a"), Just("d/b"), Just("")]
        .prop_map(String::from);
    let owner = prop_oneof![Just("o1"), Just("o2")].prop_map(String::from);
    prop_oneof![
        3 => (session.clone(), prop_oneof![Just(0u64), Just(15_000), Just(4_000)])
            .prop_map(|(session, ttl_ms)| Op::OpenSession { session, client: "c".into(), ttl_ms, namespace: String::new() }),
        3 => (session.clone(), prop_oneof![Just("default"), Just("d"), Just("d")])
            .prop_map(|(session, ns)| Op::OpenSession { session, client: "c".into(), ttl_ms: 0, namespace: ns.into() }),
        1 => session.clone().prop_map(|session| Op::CloseSession { session }),
        1 => prop::collection::vec(session.clone(), 0..3).prop_map(|sessions| Op::ExpireSessions { sessions }),
        10 => (session.clone(), name.clone(), owner, arb_mode(), prop_oneof![Just(0u64), Just(300), Just(2_000)], any::<bool>())
            .prop_map(|(session, name, owner, mode, wait_ms, reentrant)| Op::Acquire { session, name, owner, mode, wait_ms, reentrant }),
        6 => (session.clone(), name.clone(), 0u64..25).prop_map(|(session, name, token)| Op::Release { session, name, token }),
        1 => (session, name, 0u64..25).prop_map(|(session, name, token)| Op::Extend { session, name, token }),
        3 => Just(Op::Tick),
        1 => (0u64..40).prop_map(|floor| Op::RaiseRevision { floor }),
        // Near, at and past the ceiling of the revision (S2: no token may wrap).
        1 => (0u64..4).prop_map(|d| Op::RaiseRevision { floor: limits::MAX_REVISION - 2 + d }),
    ]
}

fn delay_namespace() -> Namespace {
    Namespace {
        name: "d".into(),
        prefix: DELAY_NS.into(),
        lock_delay_ms: 500,
        max_waiters_per_name: 3,
        max_locks_per_session: 4,
        ..Namespace::default_namespace()
    }
}

/// Runs `steps` on the machine and the model side by side, both starting with the revision at
/// `start_revision`.
fn run(steps: &[(u64, Op)], start_revision: u64) -> Result<(), TestCaseError> {
    let mut t = LockTable::new();
    t.apply(&Command {
        now_ms: 0,
        op: Op::PutNamespace {
            namespace: delay_namespace(),
        },
    })
    .reply
    .unwrap();
    let raise = Command {
        now_ms: 0,
        op: Op::RaiseRevision {
            floor: start_revision,
        },
    };
    t.apply(&raise).reply.unwrap();
    let mut m = Model {
        revision: start_revision,
        ..Model::default()
    };
    let mut ledger = Ledger::default();
    let mut now = 0;
    // Highest token granted per name so far: S2 says the next must be higher.
    let mut last_token: BTreeMap<Arc<str>, u64> = BTreeMap::new();
    for (i, (advance, op)) in steps.iter().enumerate() {
        now += advance;
        // Generated tokens count from 0; shift them to where this run's tokens are.
        let mut op = op.clone();
        if let Op::Release { token, .. } | Op::Extend { token, .. } = &mut op {
            *token += start_revision;
        }
        let op = &op;
        let cmd = Command {
            now_ms: now,
            op: op.clone(),
        };
        let before = t.snapshot();
        let got = t.apply(&cmd);
        let want = m.apply(&cmd);
        prop_assert_eq!(&got.reply, &want.0, "step {} reply for {:?}", i, op);
        prop_assert_eq!(&got.effects, &want.1, "step {} effects for {:?}", i, op);
        if got.reply.is_err() {
            prop_assert_eq!(&before, &t.snapshot(), "a rejection changed the state");
            prop_assert!(got.events.is_empty(), "a rejection has events");
        }
        let derived: Vec<Effect> = got
            .events
            .iter()
            .filter_map(|e| Effect::of(e, t.move_count()))
            .collect();
        prop_assert_eq!(
            &got.effects,
            &derived,
            "step {} effects are not the events'",
            i
        );
        if let Err(e) = ledger.apply(&got.events, &m) {
            return Err(TestCaseError::fail(format!("step {i} ({op:?}): {e}")));
        }
        if let Err(v) = t.check_invariants() {
            return Err(TestCaseError::fail(format!("step {i}: {v}")));
        }
        let mut grants: Vec<(Arc<str>, u64)> = got
            .effects
            .iter()
            .filter_map(|e| match e {
                Effect::Granted { name, token, .. } => Some((name.clone(), *token)),
                _ => None,
            })
            .collect();
        if let (
            Op::Acquire { name, .. },
            Ok(Reply::Acquired {
                token, reentry: 1, ..
            }),
        ) = (op, &got.reply)
        {
            grants.push((Arc::from(name.as_str()), *token));
        }
        for (name, token) in grants {
            let prev = last_token.insert(name.clone(), token).unwrap_or(0);
            prop_assert!(
                token > prev,
                "S2: token {} for {} after {}",
                token,
                name,
                prev
            );
            prop_assert!(
                token <= limits::MAX_REVISION,
                "S2: token {} above the ceiling",
                token
            );
        }
    }
    let restored = LockTable::restore(&t.snapshot()).unwrap();
    prop_assert_eq!(restored.state_hash(), t.state_hash());
    prop_assert_eq!(restored.stats(), t.stats());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn machine_matches_the_model(steps in prop::collection::vec((0u64..400, arb_op()), 1..120)) {
        run(&steps, 0)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// A few grants below the ceiling of the revision: the group runs out of tokens with
    /// holders and waiters in place, and must refuse, never wrap.
    #[test]
    fn machine_matches_the_model_at_the_revision_ceiling(
        steps in prop::collection::vec((0u64..400, arb_op()), 1..120),
        left in 0u64..12,
    ) {
        run(&steps, limits::MAX_REVISION - left)?;
    }
}
