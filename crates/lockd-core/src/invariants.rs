//! The safety invariants of docs/INVARIANTS.md that can be seen in one state, checked exhaustively.
//!
//! Tests and the simulator call [`LockTable::check_invariants`] after every step. Invariants about
//! histories (S2 tokens rising per name, S3 commit before acknowledgement, S6 expiry timing) need
//! more than one state; the property tests and the fault checker assert those.

use std::collections::{BTreeSet, HashSet};
use std::fmt;

use crate::machine::{Lock, LockTable};
use crate::types::LockMode;

/// An invariant that does not hold, with the rule's number from docs/INVARIANTS.md.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub invariant: &'static str,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} violated: {}", self.invariant, self.detail)
    }
}

impl std::error::Error for Violation {}

fn fail(invariant: &'static str, detail: String) -> Result<(), Violation> {
    Err(Violation { invariant, detail })
}

impl LockTable {
    /// Asserts every single-state invariant; O(state size).
    pub fn check_invariants(&self) -> Result<(), Violation> {
        let mut tokens = HashSet::new();
        let mut holds = 0u64;
        let mut waiter_count = 0usize;
        for (name, lock) in self.locks.iter() {
            if lock.holders.is_empty() && lock.waiters().is_empty() && lock.delay_until_ms() == 0 {
                return fail("record", format!("'{name}' is idle but still stored"));
            }
            if lock.has_empty_contention() {
                return fail("record", format!("'{name}' keeps an empty waiter box"));
            }
            check_modes(name, lock)?;
            let mut parties = BTreeSet::new();
            for h in &lock.holders {
                holds += 1;
                // S2 (local part): a token is unique and never above the revision.
                if h.token == 0 || h.token > self.mint.revision || !tokens.insert(h.token) {
                    return fail(
                        "S2",
                        format!(
                            "'{name}' token {} is duplicated or above revision {}",
                            h.token, self.mint.revision
                        ),
                    );
                }
                if h.reentry == 0 {
                    return fail("S5", format!("'{name}' holder with re-entry count 0"));
                }
                // S4: holds belong to live sessions, and the session knows it.
                match self.sessions.get(&h.session) {
                    Some(s) if s.held.contains(&(name.clone(), h.token)) => {}
                    _ => {
                        return fail(
                            "S4",
                            format!(
                                "'{name}' held by {} which is not a live session holding it",
                                h.session
                            ),
                        )
                    }
                }
                if !parties.insert((h.session, &*h.owner)) {
                    return fail(
                        "S5",
                        format!("'{name}' held twice by {} / '{}'", h.session, h.owner),
                    );
                }
            }
            let mut prev_id = 0;
            for w in lock.waiters() {
                waiter_count += 1;
                // S7: the queue is in arrival order.
                if w.id <= prev_id {
                    return fail(
                        "S7",
                        format!("'{name}' queue out of order at waiter {}", w.id),
                    );
                }
                prev_id = w.id;
                match self.sessions.get(&w.session) {
                    Some(s) if s.waits.contains(&(name.clone(), w.id)) => {}
                    _ => return fail("S4", format!("'{name}' waiter {} of a dead session", w.id)),
                }
                if !self
                    .wait_deadlines
                    .contains(&(w.deadline_ms, w.id, name.clone()))
                {
                    return fail(
                        "index",
                        format!("'{name}' waiter {} missing its deadline", w.id),
                    );
                }
                if !parties.insert((w.session, &*w.owner)) {
                    return fail(
                        "S5",
                        format!(
                            "'{name}' session {} / '{}' both holds and waits",
                            w.session, w.owner
                        ),
                    );
                }
            }
            // S7/S8: a queue head that fits is granted at once, unless a lock-delay holds it back,
            // its deadline passed (a tick will time it out) or no token is left to grant it.
            if let Some(head) = lock.waiters().front() {
                let fits = match head.mode {
                    LockMode::Exclusive => lock.holders.is_empty(),
                    LockMode::Shared => lock.holders.iter().all(|h| h.mode == LockMode::Shared),
                    LockMode::Semaphore { limit } => lock.holders.len() < limit as usize,
                };
                if fits
                    && lock.delay_until_ms() == 0
                    && head.deadline_ms > self.now_ms
                    && !self.mint.exhausted()
                {
                    return fail(
                        "S7",
                        format!("'{name}' head waiter {} fits but waits", head.id),
                    );
                }
            }
            if lock.delay_until_ms() != 0
                && !self.delays.contains(&(lock.delay_until_ms(), name.clone()))
            {
                return fail("S8", format!("'{name}' lock-delay missing from the index"));
            }
        }
        if holds != self.mint.holds {
            return fail(
                "index",
                format!("hold count {} but {} holders", self.mint.holds, holds),
            );
        }
        if waiter_count != self.wait_deadlines.len() {
            return fail(
                "index",
                format!(
                    "{} deadlines for {} waiters",
                    self.wait_deadlines.len(),
                    waiter_count
                ),
            );
        }
        for (until, name) in &self.delays {
            match self.locks.get(name) {
                Some(l) if l.delay_until_ms() == *until => {}
                _ => {
                    return fail(
                        "S8",
                        format!("delay index names '{name}' without that delay"),
                    )
                }
            }
        }
        for (id, s) in &self.sessions {
            for (name, token) in &s.held {
                let ok = self.locks.get(name).is_some_and(|l| {
                    l.holders
                        .iter()
                        .any(|h| h.token == *token && h.session == *id)
                });
                if !ok {
                    return fail(
                        "S4",
                        format!("session {id} lists '{name}' token {token} it does not hold"),
                    );
                }
            }
            for (name, wid) in &s.waits {
                let ok = self
                    .locks
                    .get(name)
                    .is_some_and(|l| l.waiters().iter().any(|w| w.id == *wid && w.session == *id));
                if !ok {
                    return fail(
                        "S4",
                        format!("session {id} lists a wait on '{name}' that is not queued"),
                    );
                }
            }
        }
        Ok(())
    }
}

/// S1: at most one exclusive holder, never beside shared ones; a semaphore within its limit, and
/// every user of a semaphore name agrees on the limit.
fn check_modes(name: &str, lock: &Lock) -> Result<(), Violation> {
    let modes = lock
        .holders
        .iter()
        .map(|h| h.mode)
        .chain(lock.waiters().iter().map(|w| w.mode));
    let mut sem = None;
    let mut plain = false;
    for m in modes {
        match m {
            LockMode::Semaphore { limit } => {
                if sem.is_some_and(|l| l != limit) {
                    return fail("S1", format!("'{name}' semaphore limits disagree"));
                }
                sem = Some(limit);
            }
            _ => plain = true,
        }
    }
    if sem.is_some() && plain {
        return fail("S1", format!("'{name}' mixes a semaphore with other modes"));
    }
    let exclusive = lock
        .holders
        .iter()
        .filter(|h| h.mode == LockMode::Exclusive)
        .count();
    if exclusive > 0 && lock.holders.len() > 1 {
        return fail(
            "S1",
            format!(
                "'{name}' has an exclusive holder beside {} others",
                lock.holders.len() - 1
            ),
        );
    }
    if let Some(limit) = sem {
        if lock.holders.len() > limit as usize {
            return fail(
                "S1",
                format!(
                    "'{name}' semaphore({limit}) has {} holders",
                    lock.holders.len()
                ),
            );
        }
    }
    Ok(())
}
