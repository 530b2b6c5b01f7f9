//! The entities of the lock state machine: a lock and its holders and waiters, a session, and
//! the mint that numbers grants (the one place a fencing token is made). Plain records with the
//! rules that touch one record only; the machine (`machine.rs`) applies commands over them.

mod holders;

pub(crate) use holders::Holders;

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use hashbrown::HashMap;
use serde::{Deserialize, Serialize};

use crate::limits;
use crate::types::*;

/// A held grant of a lock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Holder {
    pub session: SessionId,
    pub token: Token,
    pub mode: LockMode,
    pub granted_at_ms: u64,
    pub reentry: u32,
    pub reentrant: bool,
    pub owner: Box<str>,
}

/// A queued acquire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Waiter {
    pub id: WaiterId,
    pub session: SessionId,
    pub mode: LockMode,
    pub enqueued_at_ms: u64,
    pub deadline_ms: u64,
    pub reentrant: bool,
    pub owner: Box<str>,
}

/// One name's record. It exists only while it has holders, waiters or a pending lock-delay.
///
/// Most locks are held by one holder without contention: that holder is stored inline (see
/// [`Holders`]), and the waiter queue and the lock-delay live in a box that exists only while
/// there is one. [`LockMap`] boxes each record with its name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Lock {
    pub holders: Holders,
    contention: Option<Box<Contention>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Contention {
    waiters: VecDeque<Waiter>,
    /// Group time until which nothing is granted (0 = no delay). Cleared only by a tick.
    delay_until_ms: u64,
}

static NO_WAITERS: VecDeque<Waiter> = VecDeque::new();

impl Lock {
    pub fn waiters(&self) -> &VecDeque<Waiter> {
        self.contention.as_ref().map_or(&NO_WAITERS, |c| &c.waiters)
    }

    pub fn waiters_mut(&mut self) -> &mut VecDeque<Waiter> {
        &mut self.contention.get_or_insert_with(Default::default).waiters
    }

    pub fn delay_until_ms(&self) -> u64 {
        self.contention.as_ref().map_or(0, |c| c.delay_until_ms)
    }

    pub fn set_delay_until(&mut self, until_ms: u64) {
        if until_ms != 0 || self.contention.is_some() {
            self.contention
                .get_or_insert_with(Default::default)
                .delay_until_ms = until_ms;
        }
    }

    /// Drops the contention box once it holds nothing, so equal states have equal bytes.
    pub(crate) fn tidy(&mut self) {
        if self
            .contention
            .as_ref()
            .is_some_and(|c| c.waiters.is_empty() && c.delay_until_ms == 0)
        {
            self.contention = None;
        }
    }

    /// Whether the contention box is present but empty (an invariant says it never is).
    pub fn has_empty_contention(&self) -> bool {
        self.contention
            .as_ref()
            .is_some_and(|c| c.waiters.is_empty() && c.delay_until_ms == 0)
    }

    pub(crate) fn is_idle(&self) -> bool {
        self.holders.is_empty() && self.contention.is_none()
    }

    /// The mode that the name is in use with, if any (a semaphore's limit must match it).
    pub(crate) fn mode_in_use(&self) -> Option<LockMode> {
        self.holders
            .first()
            .map(|h| h.mode)
            .or_else(|| self.waiters().front().map(|w| w.mode))
    }

    pub(crate) fn holder_view(&self) -> Option<HolderView> {
        self.holders.first().map(|h| HolderView {
            session: h.session,
            owner: h.owner.to_string(),
            token: h.token,
        })
    }
}

/// Whether a grant in `mode` can join the current `holders`.
pub(crate) fn compatible(holders: &[Holder], mode: LockMode) -> bool {
    match mode {
        LockMode::Exclusive => holders.is_empty(),
        LockMode::Shared => holders.iter().all(|h| h.mode == LockMode::Shared),
        LockMode::Semaphore { limit } => holders.len() < limit as usize,
    }
}

/// Exclusive and shared mix on one name; a semaphore only with itself at the same limit.
pub(crate) fn modes_conflict(in_use: LockMode, requested: LockMode) -> bool {
    let in_use_sem = matches!(in_use, LockMode::Semaphore { .. });
    let requested_sem = matches!(requested, LockMode::Semaphore { .. });
    (in_use_sem || requested_sem) && in_use != requested
}

/// A client's session. Its lease timer lives on the leader, not here: the log only learns that a
/// session ended (closed or expired).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Session {
    pub ttl_ms: u64,
    pub opened_at_ms: u64,
    pub client: Box<str>,
    /// The name of the namespace the session was opened in: it may take only that namespace's
    /// names. Empty only for a session restored from a format-1 snapshot (taken before sessions
    /// recorded it), which keeps the old unrestricted behaviour until it ends.
    pub namespace: Box<str>,
    /// (name, token) of every hold. Derived from the locks; rebuilt on restore.
    #[serde(skip)]
    pub held: BTreeSet<(Arc<str>, Token)>,
    /// (name, waiter) of every queued acquire. Derived; rebuilt on restore.
    #[serde(skip)]
    pub waits: BTreeSet<(Arc<str>, WaiterId)>,
}

impl Session {
    pub(crate) fn load(&self) -> usize {
        self.held.len() + self.waits.len()
    }
}

/// The counters a grant moves, apart from the maps so a grant can borrow a lock mutably.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Mint {
    /// The fencing counter: bumped by every grant, raised by `RaiseRevision`, never lowered.
    pub revision: u64,
    /// The next waiter id; ids grow in enqueue order.
    pub next_waiter: WaiterId,
    /// Number of holds (not counting re-entries) across all locks.
    pub holds: u64,
}

/// Who asks for a hold and how; `waiter`: the queued acquire the grant ends and when it was
/// queued, if any.
pub(crate) struct HoldRequest<'a> {
    pub(crate) session: SessionId,
    pub(crate) owner: &'a str,
    pub(crate) mode: LockMode,
    pub(crate) reentrant: bool,
    pub(crate) waiter: Option<(WaiterId, u64)>,
}

impl Mint {
    /// Whether the revision is at [`limits::MAX_REVISION`]: no further token can be minted.
    pub(crate) fn exhausted(&self) -> bool {
        self.revision >= limits::MAX_REVISION
    }

    /// Refuses a command that needs a new token once none is left. Checked before anything
    /// changes, so the refusal leaves the state as it was.
    pub(crate) fn check_can_grant(&self) -> Result<(), Rejection> {
        if self.exhausted() {
            return Err(Rejection::CounterLimit {
                field: "revision".into(),
                value: self.revision.saturating_add(1),
                max: limits::MAX_REVISION,
            });
        }
        Ok(())
    }

    /// Records a new hold on `lock`: the one place a token is minted. The caller has checked
    /// that a token is left ([`Mint::exhausted`]).
    pub(crate) fn grant(
        &mut self,
        now: u64,
        name: &Arc<str>,
        lock: &mut Lock,
        req: HoldRequest<'_>,
        sessions: &mut HashMap<SessionId, Session>,
        ev: &mut Vec<LockEvent>,
    ) -> Token {
        debug_assert!(compatible(&lock.holders, req.mode));
        let token = self
            .revision
            .checked_add(1)
            .filter(|t| *t <= limits::MAX_REVISION)
            .expect("the caller checked that a token is left");
        self.revision = token;
        lock.holders.push(Holder {
            session: req.session,
            token,
            mode: req.mode,
            granted_at_ms: now,
            reentry: 1,
            reentrant: req.reentrant,
            owner: req.owner.into(),
        });
        self.holds += 1;
        let sess = sessions
            .get_mut(&req.session)
            .expect("a grant goes to a live session");
        sess.held.insert((name.clone(), token));
        ev.push(LockEvent::HoldStarted {
            name: name.clone(),
            session: req.session,
            owner: req.owner.into(),
            token,
            mode: req.mode,
            waiter: req.waiter.map(|(id, _)| id),
            waited_ms: req.waiter.map_or(0, |(_, since)| now.saturating_sub(since)),
            lease_ttl_ms: sess.ttl_ms,
        });
        token
    }
}

/// A shared holder of token `token`, its other fields made from the token (for tests).
#[cfg(test)]
pub(crate) fn test_holder(token: u64) -> Holder {
    Holder {
        session: SessionId(token % 3 + 1),
        token,
        mode: LockMode::Shared,
        granted_at_ms: token * 10,
        reentry: 1,
        reentrant: token.is_multiple_of(2),
        owner: format!("owner-{token}").into(),
    }
}
