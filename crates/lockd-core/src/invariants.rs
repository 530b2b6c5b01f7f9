//! The safety invariants of docs/INVARIANTS.md that can be seen in one state, checked exhaustively.
//!
//! Tests and the simulator call [`LockTable::check_invariants`] after every step. Invariants about
//! histories (S2 tokens rising per name, S3 commit before acknowledgement, S6 expiry timing) need
//! more than one state; the property tests and the fault checker assert those.

use std::collections::{BTreeSet, HashSet};
use std::fmt;
use std::sync::Arc;

use crate::bucket::{bucket_of, BUCKETS};
use crate::entity::{Holder, Lock, Session, Waiter};
use crate::limits::{self, check_name, check_optional};
use crate::machine::{validate_namespace, LockTable};
use crate::ownership::{BucketSet, MoveRecord};
use crate::ownership_commands::validate_export;
use crate::types::{LockMode, SessionId, Token, WaiterId};

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

fn fail<T>(invariant: &'static str, detail: String) -> Result<T, Violation> {
    Err(Violation { invariant, detail })
}

impl LockTable {
    /// Asserts every single-state invariant; O(state size).
    ///
    /// Besides the numbered rules it checks what every command validates before it changes
    /// anything (the limits on strings, TTLs and counters, the namespaces, the shard map), so a
    /// state no correct sequence of commands can reach is refused. `restore` runs it on every
    /// snapshot it loads, which is the one production caller: keep it linear in the state.
    pub fn check_invariants(&self) -> Result<(), Violation> {
        self.check_config()?;
        self.check_ownership()?;
        self.check_topology()?;
        self.check_locks()?;
        self.check_delay_index()?;
        self.check_sessions()
    }

    /// Every lock record, name by name: the record as a whole, S1 its modes, its holders, its
    /// queue and its head, S8 its lock-delay in the index. Then the hold count and the deadline
    /// index against what the records hold and queue.
    fn check_locks(&self) -> Result<(), Violation> {
        let mut waiter_ids = HashSet::new();
        let mut holds = 0u64;
        let mut waiter_count = 0usize;
        for (name, lock) in self.locks.iter() {
            self.check_lock_record(name, lock)?;
            check_modes(name, lock)?;
            let mut parties = BTreeSet::new();
            holds += self.check_holders(name, lock, &mut parties)?;
            waiter_count += self.check_waiters(name, lock, &mut parties, &mut waiter_ids)?;
            self.check_head_is_blocked(name, lock)?;
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
        Ok(())
    }

    /// A record as a whole: stored only while in use, a valid name, a queue within the hard
    /// limit, a lock-delay no further ahead than the longest one (S8), no empty waiter box.
    fn check_lock_record(&self, name: &str, lock: &Lock) -> Result<(), Violation> {
        if lock.holders.is_empty() && lock.waiters().is_empty() && lock.delay_until_ms() == 0 {
            return fail("record", format!("'{name}' is idle but still stored"));
        }
        if let Err(e) = check_name(name) {
            return fail("limit", format!("lock name '{name}': {e}"));
        }
        if lock.waiters().len() > limits::HARD_MAX_WAITERS_PER_NAME as usize {
            return fail(
                "limit",
                format!(
                    "'{name}' queues {} waiters, above {}",
                    lock.waiters().len(),
                    limits::HARD_MAX_WAITERS_PER_NAME
                ),
            );
        }
        // A lock-delay is set at most MAX_LOCK_DELAY_MS after the group time of its expiry.
        if lock.delay_until_ms() > self.now_ms.saturating_add(limits::MAX_LOCK_DELAY_MS) {
            return fail(
                "S8",
                format!(
                    "'{name}' lock-delay until {} is more than {} ms after now {}",
                    lock.delay_until_ms(),
                    limits::MAX_LOCK_DELAY_MS,
                    self.now_ms
                ),
            );
        }
        if lock.has_empty_contention() {
            return fail("record", format!("'{name}' keeps an empty waiter box"));
        }
        Ok(())
    }

    /// The holders of `name` ([`LockTable::check_holder`] each); S4: each is of a live session
    /// that lists the hold; S5: one hold per session and owner (noted in `parties`). Returns
    /// how many there are.
    fn check_holders<'a>(
        &self,
        name: &Arc<str>,
        lock: &'a Lock,
        parties: &mut BTreeSet<(SessionId, &'a str)>,
    ) -> Result<u64, Violation> {
        // Unique per name, not per group: a bucket import brings holders whose tokens the
        // sending group minted, and they may equal tokens this group gave other names.
        let mut tokens = BTreeSet::new();
        for h in &lock.holders {
            self.check_holder(name, h, &mut tokens)?;
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
        Ok(lock.holders.len() as u64)
    }

    /// One holder of `name` on its own: S2, its token is unique for the name (noted in
    /// `tokens`) and not above the revision; S5, its re-entry count is within its limit; what
    /// `Acquire` checked of it; and it was granted no later than now.
    fn check_holder(
        &self,
        name: &str,
        h: &Holder,
        tokens: &mut BTreeSet<Token>,
    ) -> Result<(), Violation> {
        // S2 (local part): a token is unique for its name and never above the revision.
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
        if h.reentry > limits::MAX_REENTRY || (h.reentry > 1 && !h.reentrant) {
            return fail(
                "S5",
                format!(
                    "'{name}' holder {} re-entered {} times (reentrant: {}, limit {})",
                    h.token,
                    h.reentry,
                    h.reentrant,
                    limits::MAX_REENTRY
                ),
            );
        }
        check_party(name, "holder", h.token, &h.owner, h.mode)?;
        if h.granted_at_ms > self.now_ms {
            return fail(
                "time",
                format!(
                    "'{name}' holder {} granted at {} after now {}",
                    h.token, h.granted_at_ms, self.now_ms
                ),
            );
        }
        Ok(())
    }

    /// The queue of `name`: S7, in arrival order; each waiter valid on its own
    /// ([`LockTable::check_waiter`]); S4, of a live session that lists the wait; its deadline
    /// indexed; S5, no session and owner both holds and waits (`parties`). Returns its length.
    fn check_waiters<'a>(
        &self,
        name: &Arc<str>,
        lock: &'a Lock,
        parties: &mut BTreeSet<(SessionId, &'a str)>,
        waiter_ids: &mut HashSet<WaiterId>,
    ) -> Result<usize, Violation> {
        let mut prev_id = 0;
        for w in lock.waiters() {
            // S7: the queue is in arrival order.
            if w.id <= prev_id {
                return fail(
                    "S7",
                    format!("'{name}' queue out of order at waiter {}", w.id),
                );
            }
            prev_id = w.id;
            self.check_waiter(name, w, waiter_ids)?;
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
        Ok(lock.waiters().len())
    }

    /// One waiter of `name` on its own: its id minted once (noted in `waiter_ids`) and below
    /// the next one; what `Acquire` checked of it; enqueued no later than now, with a deadline
    /// at most the longest wait after that.
    fn check_waiter(
        &self,
        name: &str,
        w: &Waiter,
        waiter_ids: &mut HashSet<WaiterId>,
    ) -> Result<(), Violation> {
        // Waiter ids are minted once each, below the next one.
        if w.id >= self.mint.next_waiter || !waiter_ids.insert(w.id) {
            return fail(
                "counter",
                format!(
                    "'{name}' waiter {} is duplicated or not below the next waiter id {}",
                    w.id, self.mint.next_waiter
                ),
            );
        }
        check_party(name, "waiter", w.id, &w.owner, w.mode)?;
        if w.enqueued_at_ms > self.now_ms
            || w.deadline_ms < w.enqueued_at_ms
            || w.deadline_ms > w.enqueued_at_ms.saturating_add(limits::MAX_WAIT_MS)
        {
            return fail(
                "time",
                format!(
                    "'{name}' waiter {} enqueued at {} with deadline {} (now {}, wait at \
                     most {} ms)",
                    w.id,
                    w.enqueued_at_ms,
                    w.deadline_ms,
                    self.now_ms,
                    limits::MAX_WAIT_MS
                ),
            );
        }
        Ok(())
    }

    /// S7/S8: a queue head that fits is granted at once, unless a lock-delay holds it back,
    /// its deadline passed (a tick will time it out) or no token is left to grant it.
    fn check_head_is_blocked(&self, name: &str, lock: &Lock) -> Result<(), Violation> {
        let Some(head) = lock.waiters().front() else {
            return Ok(());
        };
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
        Ok(())
    }

    /// S8: every entry of the lock-delay index is a lock's current lock-delay.
    fn check_delay_index(&self) -> Result<(), Violation> {
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
        Ok(())
    }

    /// Every session ([`LockTable::check_session`] and [`LockTable::check_session_lists`]),
    /// then the session id index and the per-namespace counts `max_sessions` is checked
    /// against.
    fn check_sessions(&self) -> Result<(), Violation> {
        let mut per_namespace: hashbrown::HashMap<&str, u32> = Default::default();
        for (id, s) in &self.sessions {
            *per_namespace.entry(&*s.namespace).or_default() += 1;
            self.check_session(*id, s)?;
            self.check_session_lists(*id, s)?;
        }
        // The per-namespace counts `max_sessions` is checked against are the sessions'.
        if self.session_ids.len() != self.sessions.len()
            || !self
                .session_ids
                .iter()
                .all(|id| self.sessions.contains_key(id))
        {
            return fail(
                "limit",
                format!(
                    "the session id index lists {} ids for {} sessions",
                    self.session_ids.len(),
                    self.sessions.len()
                ),
            );
        }
        let counted = self.namespace_sessions.len() == per_namespace.len()
            && per_namespace
                .iter()
                .all(|(ns, n)| self.namespace_sessions.get(*ns) == Some(n));
        if !counted {
            return fail(
                "limit",
                format!(
                    "sessions per namespace {:?}, counted as {:?}",
                    per_namespace, self.namespace_sessions
                ),
            );
        }
        Ok(())
    }

    /// What `OpenSession` checked of session `id`: its TTL and strings; and that it opened no
    /// later than now and holds and waits for no more names than the hard limit.
    fn check_session(&self, id: SessionId, s: &Session) -> Result<(), Violation> {
        // The namespace is the name of the one it was opened in (empty: restored from a
        // format-1 snapshot); that namespace may since have been deleted, and the session
        // lives on, so the name need not be a current namespace.
        if !(limits::HARD_MIN_TTL_MS..=limits::HARD_MAX_TTL_MS).contains(&s.ttl_ms) {
            return fail(
                "limit",
                format!(
                    "session {id} TTL {} ms is outside {}..={} ms",
                    s.ttl_ms,
                    limits::HARD_MIN_TTL_MS,
                    limits::HARD_MAX_TTL_MS
                ),
            );
        }
        let strings =
            check_optional("client", &s.client, limits::MAX_CLIENT_BYTES).and_then(|()| {
                check_optional("namespace", &s.namespace, limits::MAX_NAMESPACE_NAME_BYTES)
            });
        if let Err(e) = strings {
            return fail("limit", format!("session {id}: {e}"));
        }
        if s.opened_at_ms > self.now_ms {
            return fail(
                "time",
                format!(
                    "session {id} opened at {} after now {}",
                    s.opened_at_ms, self.now_ms
                ),
            );
        }
        if s.held.len() + s.waits.len() > limits::HARD_MAX_LOCKS_PER_SESSION as usize {
            return fail(
                "limit",
                format!(
                    "session {id} holds and waits for {} names, above {}",
                    s.held.len() + s.waits.len(),
                    limits::HARD_MAX_LOCKS_PER_SESSION
                ),
            );
        }
        Ok(())
    }

    /// S4 from the session's side: every hold and wait session `id` lists is in the table.
    fn check_session_lists(&self, id: SessionId, s: &Session) -> Result<(), Violation> {
        for (name, token) in &s.held {
            let ok = self.locks.get(name).is_some_and(|l| {
                l.holders
                    .iter()
                    .any(|h| h.token == *token && h.session == id)
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
                .is_some_and(|l| l.waiters().iter().any(|w| w.id == *wid && w.session == id));
            if !ok {
                return fail(
                    "S4",
                    format!("session {id} lists a wait on '{name}' that is not queued"),
                );
            }
        }
        Ok(())
    }
}

impl LockTable {
    /// S10: a group stores only names it serves; frozen buckets are owned and frozen once.
    fn check_ownership(&self) -> Result<(), Violation> {
        let own = &self.ownership;
        if own.map_version == 0 && own.owned != BucketSet::full() {
            return fail(
                "S10",
                format!(
                    "buckets never assigned, yet only {} are owned",
                    own.owned.len()
                ),
            );
        }
        let mut frozen = BucketSet::empty();
        for (id, r) in &own.moves {
            if let MoveRecord::Outgoing {
                buckets, export, ..
            } = r
            {
                if buckets.is_empty()
                    || !buckets.is_subset(&own.owned)
                    || buckets.intersects(&frozen)
                {
                    return fail(
                        "S10",
                        format!("move {id} freezes buckets {buckets} that are empty, not owned or frozen twice"),
                    );
                }
                frozen.union_with(buckets);
                if let Err(e) = validate_export(*id, buckets, export) {
                    return fail("S10", e.to_string());
                }
                if export.revision > self.mint.revision {
                    return fail(
                        "S10",
                        format!(
                            "move {id} exported revision {} above the group's {}",
                            export.revision, self.mint.revision
                        ),
                    );
                }
            }
        }
        if own.frozen != frozen {
            return fail(
                "record",
                format!("the frozen index {} is not the moves' {frozen}", own.frozen),
            );
        }
        if own.map_version == 0 && own.moves.is_empty() {
            return Ok(());
        }
        for (name, _) in self.locks.iter() {
            let b = bucket_of(name);
            if !own.owned.contains(b) || frozen.contains(b) {
                return fail(
                    "S10",
                    format!("'{name}' is stored, but its bucket {b} is not served here"),
                );
            }
        }
        Ok(())
    }

    /// Group records: one group at most is being created, epochs are distinct and founding
    /// groups ready; every session whose lease an import restarted is open here.
    fn check_topology(&self) -> Result<(), Violation> {
        let t = &self.topology;
        let mut epochs = BTreeSet::new();
        let mut creating = 0;
        for (g, r) in &t.groups {
            let sorted = r.replicas.windows(2).all(|w| w[0] < w[1]);
            if *g == 0 || r.replicas.is_empty() || !sorted || r.replicas.len() > 7 {
                return fail(
                    "topology",
                    format!("group {g}'s record {r:?} breaks a rule"),
                );
            }
            if r.born_epoch > 0 && !epochs.insert(r.born_epoch) {
                return fail("topology", format!("epoch {} recorded twice", r.born_epoch));
            }
            creating += usize::from(!r.ready);
            if r.born_epoch == 0 && !r.ready {
                return fail("topology", format!("founding group {g} is not ready"));
            }
        }
        if creating > 1 {
            return fail(
                "topology",
                format!("{creating} groups are being created at once"),
            );
        }
        if let Some(s) = t
            .lease_restarted
            .iter()
            .find(|s| !self.sessions.contains_key(*s))
        {
            return fail(
                "topology",
                format!("session {s} is recorded as restarted by an import but is not open here"),
            );
        }
        Ok(())
    }

    /// The group's configuration and counters: namespaces, shard map, the mint.
    fn check_config(&self) -> Result<(), Violation> {
        if self.mint.revision > limits::MAX_REVISION {
            return fail(
                "counter",
                format!(
                    "revision {} is above its limit of {}",
                    self.mint.revision,
                    limits::MAX_REVISION
                ),
            );
        }
        if self.mint.next_waiter == 0 {
            return fail("counter", "the next waiter id is 0 (ids start at 1)".into());
        }
        if !self.namespaces.contains_key("") {
            return fail("namespace", "no default namespace".into());
        }
        let mut names = BTreeSet::new();
        for (prefix, ns) in &self.namespaces {
            if *prefix != ns.prefix {
                return fail(
                    "namespace",
                    format!("'{}' is filed under prefix '{prefix}'", ns.prefix),
                );
            }
            if let Err(e) = validate_namespace(ns) {
                return fail("namespace", format!("'{}': {e}", ns.name));
            }
            if !names.insert(&*ns.name) {
                return fail(
                    "namespace",
                    format!("two namespaces are named '{}'", ns.name),
                );
            }
        }
        if let Some(map) = &self.shard_map {
            // What `ShardMap::validate` promised when the map was put.
            if map.groups.len() != BUCKETS as usize {
                return fail(
                    "shard-map",
                    format!("{} buckets mapped, {} required", map.groups.len(), BUCKETS),
                );
            }
            if let Some(b) = map.groups.iter().position(|g| *g == 0) {
                return fail(
                    "shard-map",
                    format!("bucket {b} maps to group 0, the meta group, which owns no bucket"),
                );
            }
            if map.version == 0 {
                return fail("shard-map", "version 0 (versions start at 1)".into());
            }
        }
        Ok(())
    }
}

/// What `Acquire` checked about a holder or waiter: its owner string and its semaphore limit.
fn check_party(
    name: &str,
    what: &str,
    id: u64,
    owner: &str,
    mode: LockMode,
) -> Result<(), Violation> {
    if let Err(e) = check_optional("owner", owner, limits::MAX_OWNER_BYTES) {
        return fail("limit", format!("'{name}' {what} {id}: {e}"));
    }
    if let LockMode::Semaphore { limit } = mode {
        if limit == 0 || limit > limits::MAX_SEMAPHORE_LIMIT {
            return fail(
                "S1",
                format!(
                    "'{name}' {what} {id} uses semaphore({limit}), outside 1..={}",
                    limits::MAX_SEMAPHORE_LIMIT
                ),
            );
        }
    }
    Ok(())
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
