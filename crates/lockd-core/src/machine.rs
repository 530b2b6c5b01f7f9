//! The lock state machine: every rule of the protocol, applied one command at a time.
//!
//! `apply` validates first and mutates second, so a rejected command leaves the state exactly as
//! it was. Iteration that decides an outcome only walks ordered structures (`BTreeSet`s, queues),
//! never a `HashMap`, so every replica that applies the same commands reaches the same state.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use hashbrown::HashMap;

use serde::{Deserialize, Serialize};

use crate::bucket::ShardMap;
use crate::entity::{compatible, modes_conflict, HoldRequest, Lock, Mint, Session, Waiter};
use crate::limits::{self, check_name, check_optional, check_printable};
use crate::lock_map::LockMap;
use crate::ownership::Ownership;
use crate::types::*;

/// The outcome of one command: the proposer's reply, the ownership changes it made (in order),
/// and what of them the shell must push to others ([`Effect::of`] each event).
#[derive(Debug, PartialEq, Eq)]
pub struct Applied {
    pub reply: Result<Reply, Rejection>,
    pub effects: Vec<Effect>,
    pub events: Vec<LockEvent>,
}

/// The replicated state of one lock group.
#[derive(Clone, Debug)]
pub struct LockTable {
    /// Group time of the last applied command.
    pub(crate) now_ms: u64,
    /// Counters: the revision (fencing tokens), waiter ids, holds.
    pub(crate) mint: Mint,
    /// Namespaces by prefix; the default one (prefix "") is always present.
    pub(crate) namespaces: BTreeMap<String, Namespace>,
    /// Bumped by every change of `namespaces`: what an admin's compare-and-set compares
    /// ([`Op::ChangeNamespace`]); 0 until the first change (a seed then applies).
    pub(crate) namespaces_version: u64,
    pub(crate) sessions: HashMap<SessionId, Session>,
    /// Live sessions per namespace name (`Session::namespace`), for `max_sessions`; only
    /// [`LockTable::insert_session`] and [`LockTable::remove_session`] change it.
    pub(crate) namespace_sessions: HashMap<Box<str>, u32>,
    /// Every session id, in order: a listing's page is a range of it (O(log n + page), not a
    /// sort of every session under the replica's lock). Kept with `namespace_sessions`.
    pub(crate) session_ids: BTreeSet<SessionId>,
    pub(crate) locks: LockMap,
    /// (deadline, waiter, name) of every queued acquire: what a tick times out.
    pub(crate) wait_deadlines: BTreeSet<(u64, WaiterId, Arc<str>)>,
    /// (until, name) of every pending lock-delay: what a tick ends.
    pub(crate) delays: BTreeSet<(u64, Arc<str>)>,
    /// Bucket → group map; only the meta group sets one.
    pub(crate) shard_map: Option<ShardMap>,
    /// The buckets this group serves, and the moves it took part in.
    pub(crate) ownership: Ownership,
    /// Meta group only: the cluster's timing and retired node ids (`cluster.rs`).
    pub(crate) cluster: crate::cluster::ClusterRecord,
    /// Group records (meta), or this group's birth and adopted sessions (`topology.rs`).
    pub(crate) topology: crate::topology::Topology,
}

/// The arguments of [`Op::Acquire`].
struct AcquireRequest<'a> {
    session: SessionId,
    name: &'a str,
    owner: &'a str,
    mode: LockMode,
    wait_ms: u64,
    reentrant: bool,
}

impl<'a> AcquireRequest<'a> {
    /// The acquire an [`Op::Acquire`] or [`Op::AdoptAndAcquire`] asks for.
    fn of(op: &'a Op) -> AcquireRequest<'a> {
        match op {
            Op::Acquire {
                session,
                name,
                owner,
                mode,
                wait_ms,
                reentrant,
            }
            | Op::AdoptAndAcquire {
                session,
                name,
                owner,
                mode,
                wait_ms,
                reentrant,
                ..
            } => AcquireRequest {
                session: *session,
                name,
                owner,
                mode: *mode,
                wait_ms: *wait_ms,
                reentrant: *reentrant,
            },
            other => unreachable!("not an acquire: {other:?}"),
        }
    }

    /// The hold this acquire asks for, granted at once (not from a wait).
    fn hold(&self) -> HoldRequest<'a> {
        HoldRequest {
            session: self.session,
            owner: self.owner,
            mode: self.mode,
            reentrant: self.reentrant,
            waiter: None,
        }
    }
}

/// What an acquire does, as [`LockTable::decide_acquire`] decided it before anything changed.
enum AcquireStep {
    /// Grant a new hold on a name that has no record yet.
    GrantFreeName { lease_ttl_ms: u64 },
    /// Grant a new hold on a name whose record exists.
    Grant { lease_ttl_ms: u64 },
    /// Count one more re-entry of the record's holder at index `holder`.
    Reenter { holder: usize, lease_ttl_ms: u64 },
    /// Answer this [`Reply::Busy`]: a try that cannot be granted now.
    Busy(Reply),
    /// Queue the acquire as waiter `waiter`.
    Queue { waiter: WaiterId },
}

/// What an acquire's session may still take in its name's namespace.
struct AcquireRoom {
    /// The session's TTL: the lease a grant reports.
    lease_ttl_ms: u64,
    max_waiters: u32,
    max_locks: u32,
    /// The session holds and waits for `max_locks` names already.
    session_full: bool,
}

impl AcquireRoom {
    /// Refuses a new hold or wait once the session is at its namespace's lock limit.
    fn check_session_room(&self) -> Result<(), Rejection> {
        if self.session_full {
            return Err(Rejection::TooManyLocks {
                limit: self.max_locks,
            });
        }
        Ok(())
    }
}

impl Default for LockTable {
    fn default() -> Self {
        Self::new()
    }
}

/// Counters for status and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    pub now_ms: u64,
    pub revision: u64,
    pub sessions: u64,
    pub locks: u64,
    pub holds: u64,
    pub waiters: u64,
    pub lock_delays: u64,
}

impl LockTable {
    /// An empty group with only the default namespace.
    pub fn new() -> LockTable {
        let mut namespaces = BTreeMap::new();
        namespaces.insert(String::new(), Namespace::default_namespace());
        LockTable {
            now_ms: 0,
            mint: Mint {
                revision: 0,
                next_waiter: 1,
                holds: 0,
            },
            namespaces,
            namespaces_version: 0,
            sessions: HashMap::default(),
            namespace_sessions: HashMap::default(),
            session_ids: BTreeSet::new(),
            locks: LockMap::default(),
            wait_deadlines: BTreeSet::new(),
            delays: BTreeSet::new(),
            shard_map: None,
            ownership: Ownership::default(),
            cluster: Default::default(),
            topology: Default::default(),
        }
    }

    /// Group time of the last applied command.
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// The current revision: every token granted so far is at most this.
    pub fn revision(&self) -> u64 {
        self.mint.revision
    }

    /// The earliest group time at which a `Tick` has work to do (a wait deadline or the end of a
    /// lock-delay), so the leader can propose one then and not poll.
    pub fn next_timer_ms(&self) -> Option<u64> {
        let wait = self.wait_deadlines.first().map(|(d, _, _)| *d);
        let delay = self.delays.first().map(|(d, _)| *d);
        match (wait, delay) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The namespace a name falls into: the longest matching prefix, else the default.
    pub fn namespace_for(&self, name: &str) -> &Namespace {
        // Prefixes end with '/', so only the name's '/' boundaries can match one.
        let mut best = &self.namespaces[""];
        if self.namespaces.len() > 1 {
            for (i, _) in name.match_indices('/') {
                if let Some(ns) = self.namespaces.get(&name[..=i]) {
                    best = ns;
                }
            }
        }
        best
    }

    /// Every namespace, by prefix.
    pub fn namespaces(&self) -> impl Iterator<Item = &Namespace> {
        self.namespaces.values()
    }

    fn namespace_by_name(&self, name: &str) -> Option<&Namespace> {
        let name = if name.is_empty() { "default" } else { name };
        self.namespaces.values().find(|ns| ns.name == name)
    }

    /// The shard map, in the meta group once set.
    pub fn shard_map(&self) -> Option<&ShardMap> {
        self.shard_map.as_ref()
    }

    /// Whether `session` exists (is open and not expired).
    pub fn has_session(&self, session: SessionId) -> bool {
        self.sessions.contains_key(&session)
    }

    /// Every session with its TTL, ordered by id. The leader's tracker starts from this.
    pub fn session_ttls(&self) -> Vec<(SessionId, u64)> {
        let mut v: Vec<_> = self
            .sessions
            .iter()
            .map(|(id, s)| (*id, s.ttl_ms))
            .collect();
        v.sort_unstable();
        v
    }

    pub fn stats(&self) -> Stats {
        Stats {
            now_ms: self.now_ms,
            revision: self.mint.revision,
            sessions: self.sessions.len() as u64,
            locks: self.locks.len() as u64,
            holds: self.mint.holds,
            waiters: self.wait_deadlines.len() as u64,
            lock_delays: self.delays.len() as u64,
        }
    }

    /// Applies one command. The only way the state changes.
    pub fn apply(&mut self, cmd: &Command) -> Applied {
        // Group time never goes backwards, whatever a (buggy or deposed) proposer stamped.
        let now = cmd.now_ms.max(self.now_ms);
        let mut ev = Vec::new();
        let reply = match &cmd.op {
            Op::OpenSession {
                session,
                client,
                ttl_ms,
                namespace,
            } => self
                .admit_session(namespace)
                .and_then(|()| self.open_session(now, *session, client, *ttl_ms, namespace)),
            Op::CloseSession { session } => self.close_session(now, *session, &mut ev),
            Op::ExpireSessions { sessions } => self.expire_sessions(now, sessions, &mut ev),
            op @ Op::Acquire { .. } => self.acquire(now, AcquireRequest::of(op), &mut ev),
            Op::Release {
                session,
                name,
                token,
            } => self.release(now, *session, name, *token, &mut ev),
            Op::Extend {
                session,
                name,
                token,
            } => self.extend(*session, name, *token),
            Op::Tick => Ok(self.tick(now, &mut ev)),
            Op::RaiseRevision { floor } => self.raise_revision(*floor),
            Op::PutNamespace { namespace } => self.put_namespace(namespace),
            Op::PutNamespaceV8 { namespace } => self.put_namespace(&namespace.clone().into()),
            Op::DeleteNamespace { prefix } => self.delete_namespace(prefix),
            Op::SeedNamespaces { namespaces } => self.seed_namespaces(namespaces),
            Op::SeedNamespacesV8 { namespaces } => {
                let namespaces: Vec<Namespace> =
                    namespaces.iter().cloned().map(Namespace::from).collect();
                self.seed_namespaces(&namespaces)
            }
            Op::ChangeNamespace {
                expected_version,
                change,
            } => self.change_namespace(*expected_version, change),
            Op::PutShardMap { map } => map.validate(self.shard_map.as_ref()).map(|()| {
                self.shard_map = Some(map.clone());
                Reply::ShardMapPut {
                    version: map.version,
                }
            }),
            Op::AssignBuckets {
                buckets,
                map_version,
            } => self.assign_buckets(buckets, *map_version),
            Op::FreezeBuckets {
                move_id,
                to_group,
                buckets,
            } => self.freeze_buckets(now, *move_id, *to_group, buckets, &mut ev),
            Op::ImportBuckets {
                move_id,
                from_group,
                buckets,
                map_version,
                export,
            } => self.import_buckets(
                now,
                *move_id,
                *from_group,
                buckets,
                *map_version,
                export,
                &mut ev,
            ),
            Op::CancelImport { move_id } => self.cancel_import(*move_id),
            Op::ThawBuckets { move_id } => self.thaw_buckets(now, *move_id, &mut ev),
            Op::DropBuckets {
                move_id,
                map_version,
            } => self.drop_buckets(*move_id, *map_version),
            Op::RecordGroups { groups } => self.record_groups(groups),
            Op::CreateGroup { group, replicas } => self.create_group(*group, replicas),
            Op::GroupReady { group } => self.group_ready(*group),
            Op::FoundGroup {
                born_epoch,
                map_version,
            } => self.found_group(*born_epoch, *map_version),
            Op::AdoptSession {
                session,
                client,
                ttl_ms,
                namespace,
            } => self.adopt_session(now, *session, client, *ttl_ms, namespace, &mut ev),
            op @ Op::AdoptAndAcquire { .. } => self.adopt_and_acquire(now, op, &mut ev),
            Op::SetGroupReplicas { group, replicas } => self.set_group_replicas(*group, replicas),
            Op::PlaceGroup {
                group,
                replicas,
                placed_at,
            } => self.place_group(*group, replicas, *placed_at),
            Op::CloseGroup => self.close_group(),
            Op::RemoveGroup { group } => self.remove_group(*group),
            op @ (Op::SetClusterTiming { .. }
            | Op::RetireNode { .. }
            | Op::SetDraining { .. }
            | Op::RegisterIncarnation { .. }
            | Op::RegisterZones { .. }) => self.cluster.apply(op),
        };
        if reply.is_ok() {
            self.now_ms = now;
        } else {
            debug_assert!(ev.is_empty(), "a rejection must not change ownership");
        }
        Applied {
            reply,
            effects: self.effects_of(&ev),
            events: ev,
        }
    }

    /// Raises the revision to `floor` (never lowers it); a floor above the ceiling is refused.
    fn raise_revision(&mut self, floor: u64) -> Result<Reply, Rejection> {
        if floor > limits::MAX_REVISION {
            return Err(Rejection::CounterLimit {
                field: "floor".into(),
                value: floor,
                max: limits::MAX_REVISION,
            });
        }
        self.mint.revision = self.mint.revision.max(floor);
        Ok(Reply::RevisionRaised {
            revision: self.mint.revision,
        })
    }

    /// A new session's place in its namespace's `max_sessions` (only [`Op::OpenSession`]
    /// asks: an adopted or imported session was admitted by the cluster already).
    fn admit_session(&self, namespace: &str) -> Result<(), Rejection> {
        let Some(ns) = self.namespace_by_name(namespace) else {
            return Ok(()); // open_session refuses it
        };
        let live = self.namespace_sessions.get(ns.name.as_str()).copied();
        if ns.max_sessions != 0 && live.unwrap_or(0) >= ns.max_sessions {
            return Err(Rejection::NamespaceSessionsFull {
                namespace: ns.name.clone(),
                limit: ns.max_sessions,
            });
        }
        if ns.token_sha256.is_none() {
            // Summed over the namespaces (a few), not kept: a token set or cleared moves a
            // namespace's sessions between the shares without a second count to update.
            let open: usize = self
                .namespaces
                .values()
                .filter(|n| n.token_sha256.is_none())
                .filter_map(|n| self.namespace_sessions.get(n.name.as_str()))
                .map(|&c| c as usize)
                .sum();
            if open >= limits::MAX_OPEN_NAMESPACE_SESSIONS {
                return Err(Rejection::OpenSessionsFull {
                    limit: limits::MAX_OPEN_NAMESPACE_SESSIONS,
                });
            }
        }
        Ok(())
    }

    /// Stores a new session and counts it in its namespace.
    pub(crate) fn insert_session(&mut self, id: SessionId, s: Session) {
        match self.namespace_sessions.get_mut(&*s.namespace) {
            Some(n) => *n += 1,
            None => {
                self.namespace_sessions.insert(s.namespace.clone(), 1);
            }
        }
        self.session_ids.insert(id);
        self.sessions.insert(id, s);
    }

    /// Removes a session and its place in its namespace's count.
    pub(crate) fn remove_session(&mut self, id: SessionId) -> Option<Session> {
        let s = self.sessions.remove(&id)?;
        self.session_ids.remove(&id);
        self.topology.lease_restarted.remove(&id);
        if let Some(n) = self.namespace_sessions.get_mut(&*s.namespace) {
            *n -= 1;
            if *n == 0 {
                self.namespace_sessions.remove(&*s.namespace);
            }
        }
        Some(s)
    }

    fn open_session(
        &mut self,
        now: u64,
        session: SessionId,
        client: &str,
        ttl_ms: u64,
        namespace: &str,
    ) -> Result<Reply, Rejection> {
        check_optional("client", client, limits::MAX_CLIENT_BYTES)?;
        let ns = self
            .namespace_by_name(namespace)
            .ok_or_else(|| Rejection::UnknownNamespace {
                name: namespace.to_string(),
            })?;
        let ttl_ms = if ttl_ms == 0 {
            ns.default_ttl_ms
        } else {
            ttl_ms
        };
        check_ttl(ns, ttl_ms)?;
        if self.sessions.contains_key(&session) {
            return Err(Rejection::SessionExists { session });
        }
        if self.sessions.len() >= limits::MAX_SESSIONS {
            return Err(Rejection::TooManySessions {
                limit: limits::MAX_SESSIONS,
            });
        }
        self.insert_session(
            session,
            Session {
                ttl_ms,
                opened_at_ms: now,
                client: client.into(),
                namespace: ns.name.as_str().into(),
                held: BTreeSet::new(),
                waits: BTreeSet::new(),
            },
        );
        Ok(Reply::SessionOpened { session, ttl_ms })
    }

    /// [`Op::AdoptSession`]: opens an older session here with the values it was opened with.
    fn adopt_session(
        &mut self,
        now: u64,
        session: SessionId,
        client: &str,
        ttl_ms: u64,
        namespace: &str,
        ev: &mut Vec<LockEvent>,
    ) -> Result<Reply, Rejection> {
        match self.session_presence(session) {
            crate::Presence::Live => {
                let ttl_ms = self.sessions[&session].ttl_ms;
                Ok(Reply::SessionOpened { session, ttl_ms })
            }
            crate::Presence::NotHere => {
                let r = self.open_session(now, session, client, ttl_ms, namespace)?;
                if let Reply::SessionOpened { ttl_ms, .. } = r {
                    // Its lease here starts now, as an imported session's does.
                    ev.push(LockEvent::SessionAdopted { session, ttl_ms });
                }
                Ok(r)
            }
        }
    }

    /// [`Op::AdoptAndAcquire`]: adopts the session with the values it was opened with for this
    /// acquire alone, and undoes that unless the acquire was granted or queued. A session with
    /// a lease here already is refused (`SessionExists`), so that a success always means this
    /// command started the lease (the caller then counts it from its request's send).
    fn adopt_and_acquire(
        &mut self,
        now: u64,
        op: &Op,
        ev: &mut Vec<LockEvent>,
    ) -> Result<Reply, Rejection> {
        let Op::AdoptAndAcquire {
            client,
            ttl_ms,
            namespace,
            ..
        } = op
        else {
            unreachable!("apply routes only AdoptAndAcquire here")
        };
        let req = AcquireRequest::of(op);
        let session = req.session;
        if self.sessions.contains_key(&session) {
            return Err(Rejection::SessionExists { session });
        }
        self.open_session(now, session, client, *ttl_ms, namespace)?;
        let mark = ev.len();
        let reply = self.acquire(now, req, ev);
        match reply {
            Ok(Reply::Acquired { .. } | Reply::Queued { .. }) => {
                // Its lease here starts now, before what the acquire did.
                let ttl_ms = self.sessions[&session].ttl_ms;
                ev.insert(mark, LockEvent::SessionAdopted { session, ttl_ms });
            }
            _ => {
                self.remove_session(session);
            }
        }
        reply
    }

    fn close_session(
        &mut self,
        now: u64,
        session: SessionId,
        ev: &mut Vec<LockEvent>,
    ) -> Result<Reply, Rejection> {
        if !self.sessions.contains_key(&session) {
            return Err(Rejection::UnknownSession { session });
        }
        let (released, cancelled_waits) =
            self.end_session(now, session, SessionEndReason::Closed, ev);
        Ok(Reply::SessionClosed {
            released,
            cancelled_waits,
        })
    }

    fn expire_sessions(
        &mut self,
        now: u64,
        sessions: &[SessionId],
        ev: &mut Vec<LockEvent>,
    ) -> Result<Reply, Rejection> {
        // A bucket import restarted these sessions' leases after the leader may have decided
        // this expiry: skipped once (the leader's restarted timer decides again).
        let restarted: BTreeSet<SessionId> = sessions
            .iter()
            .copied()
            .filter(|s| self.topology.lease_restarted.remove(s))
            .collect();
        let sessions: Vec<SessionId> = sessions
            .iter()
            .copied()
            .filter(|s| !restarted.contains(s))
            .collect();
        // Every expiring session's waits go first: a hold freed by one of them must not be
        // granted to another that ends in this same command (it would be granted and freed at
        // once, and the waiting client told it holds a lock whose session is gone).
        let mut touched = BTreeSet::new();
        for &session in &sessions {
            touched.append(&mut self.cancel_waits(now, session, ev).1);
        }
        let mut expired = Vec::new();
        for &session in &sessions {
            // The leader's list may name a session closed meanwhile, or one twice: skip those.
            if self.sessions.contains_key(&session) {
                self.end_session(now, session, SessionEndReason::Expired, ev);
                expired.push(session);
            }
        }
        for name in &touched {
            self.grant_waiters(now, name, ev);
        }
        Ok(Reply::SessionsExpired { expired })
    }

    /// Cancels every wait of `session` (if it exists); returns how many, and the names touched.
    fn cancel_waits(
        &mut self,
        now: u64,
        session: SessionId,
        ev: &mut Vec<LockEvent>,
    ) -> (u32, BTreeSet<Arc<str>>) {
        let mut touched: BTreeSet<Arc<str>> = BTreeSet::new();
        let Some(sess) = self.sessions.get_mut(&session) else {
            return (0, touched);
        };
        let waits = std::mem::take(&mut sess.waits);
        for (name, waiter) in &waits {
            let lock = self
                .locks
                .get_mut(name)
                .expect("a session's wait has a lock");
            let pos = lock
                .waiters()
                .iter()
                .position(|w| w.id == *waiter)
                .expect("wait is queued");
            let w = lock
                .waiters_mut()
                .remove(pos)
                .expect("position is in range");
            self.wait_deadlines
                .remove(&(w.deadline_ms, w.id, name.clone()));
            ev.push(LockEvent::WaitEnded {
                name: name.clone(),
                waiter: w.id,
                session,
                reason: WaitEndReason::SessionEnded,
                waited_ms: now.saturating_sub(w.enqueued_at_ms),
            });
            touched.insert(name.clone());
        }
        (waits.len() as u32, touched)
    }

    /// Removes a session: cancels its waits first (so nothing is granted to it), frees its
    /// holds (with lock-delay if it failed), then grants each touched name to its next waiters.
    fn end_session(
        &mut self,
        now: u64,
        session: SessionId,
        reason: SessionEndReason,
        ev: &mut Vec<LockEvent>,
    ) -> (u32, u32) {
        let (cancelled, mut touched) = self.cancel_waits(now, session, ev);
        let Some(sess) = self.remove_session(session) else {
            return (0, 0);
        };
        for (name, token) in &sess.held {
            let delay_ms = match reason {
                SessionEndReason::Expired => self.namespace_for(name).lock_delay_ms,
                SessionEndReason::Closed => 0,
            };
            let lock = self
                .locks
                .get_mut(name)
                .expect("a session's hold has a lock");
            let held_ms = lock
                .holders
                .iter()
                .find(|h| h.token == *token)
                .map_or(0, |h| now.saturating_sub(h.granted_at_ms));
            lock.holders.retain(|h| h.token != *token);
            self.mint.holds -= 1;
            let mut lock_delay_until_ms = 0;
            if delay_ms > 0 {
                let until = now.saturating_add(delay_ms);
                if lock.delay_until_ms() < until {
                    if lock.delay_until_ms() != 0 {
                        self.delays.remove(&(lock.delay_until_ms(), name.clone()));
                    }
                    lock.set_delay_until(until);
                    self.delays.insert((until, name.clone()));
                }
                lock_delay_until_ms = lock.delay_until_ms();
            }
            ev.push(LockEvent::HoldEnded {
                name: name.clone(),
                session,
                token: *token,
                cause: reason.into(),
                held_ms,
                lock_delay_until_ms,
            });
            touched.insert(name.clone());
        }
        for name in &touched {
            self.grant_waiters(now, name, ev);
        }
        let released = sess.held.len() as u32;
        ev.push(LockEvent::SessionEnded {
            session,
            reason,
            released,
        });
        (released, cancelled)
    }

    /// What of `events` the shell must push to others ([`Effect::of`] each).
    fn effects_of(&self, events: &[LockEvent]) -> Vec<Effect> {
        let moves = self.move_count();
        events.iter().filter_map(|e| Effect::of(e, moves)).collect()
    }

    /// [`Op::Acquire`]: decides what to do from the table as it is, then does it. A refused
    /// acquire changes nothing.
    fn acquire(
        &mut self,
        now: u64,
        req: AcquireRequest<'_>,
        ev: &mut Vec<LockEvent>,
    ) -> Result<Reply, Rejection> {
        let step = self.decide_acquire(&req)?;
        Ok(self.apply_acquire(now, &req, step, ev))
    }

    /// Decides an acquire without changing anything: the first rule it breaks, or the step
    /// that carries it out (grant, re-enter, busy or queue).
    fn decide_acquire(&self, req: &AcquireRequest<'_>) -> Result<AcquireStep, Rejection> {
        // 1. Validate everything before touching anything.
        let room = self.check_acquire(req)?;
        let Some(lock) = self.locks.get(req.name) else {
            // 2a. A free name: grant at once.
            self.mint.check_can_grant()?;
            room.check_session_room()?;
            return Ok(AcquireStep::GrantFreeName {
                lease_ttl_ms: room.lease_ttl_ms,
            });
        };
        if let Some(in_use) = lock.mode_in_use() {
            if modes_conflict(in_use, req.mode) {
                return Err(Rejection::ModeConflict {
                    held: in_use,
                    requested: req.mode,
                });
            }
        }
        // 2b. Re-entry by the same session and owner.
        if let Some(holder) = lock
            .holders
            .iter()
            .position(|h| h.session == req.session && *h.owner == *req.owner)
        {
            return decide_reentry(req, lock, holder, room.lease_ttl_ms);
        }
        if let Some(w) = lock
            .waiters()
            .iter()
            .find(|w| w.session == req.session && *w.owner == *req.owner)
        {
            return Err(Rejection::AlreadyWaiting { waiter: w.id });
        }
        // Every path below needs a new token, now or when the wait is granted: none is left
        // once the revision is at its ceiling, so refuse rather than queue for nothing.
        self.mint.check_can_grant()?;
        // 2c. Granted now only if nothing delays it, nobody queues ahead (FIFO) and it fits.
        let grantable = lock.delay_until_ms() == 0
            && lock.waiters().is_empty()
            && compatible(&lock.holders, req.mode);
        if grantable {
            room.check_session_room()?;
            return Ok(AcquireStep::Grant {
                lease_ttl_ms: room.lease_ttl_ms,
            });
        }
        self.decide_wait(req, lock, &room)
    }

    /// The checks every acquire passes before its name's record is looked at: its arguments,
    /// that this group serves the name, and that the session lives here and may take names of
    /// the name's namespace. Returns the session's room in that namespace.
    fn check_acquire(&self, req: &AcquireRequest<'_>) -> Result<AcquireRoom, Rejection> {
        check_name(req.name)?;
        self.check_serves(req.name)?;
        check_optional("owner", req.owner, limits::MAX_OWNER_BYTES)?;
        limits::check_acquire_args(req.mode, req.wait_ms)?;
        let ns = self.namespace_for(req.name);
        let sess = self
            .sessions
            .get(&req.session)
            .ok_or_else(|| self.absent_session(req.session))?;
        if !sess.namespace.is_empty() && *sess.namespace != *ns.name {
            return Err(Rejection::WrongNamespace {
                session_namespace: sess.namespace.to_string(),
                name_namespace: ns.name.clone(),
            });
        }
        check_ttl(ns, sess.ttl_ms)?;
        Ok(AcquireRoom {
            lease_ttl_ms: sess.ttl_ms,
            max_waiters: ns.max_waiters_per_name,
            max_locks: ns.max_locks_per_session,
            session_full: sess.load() >= ns.max_locks_per_session as usize,
        })
    }

    /// Decides an acquire that cannot be granted now: a try (no wait) is told the name is
    /// busy; a wait is queued if the queue, the session and the waiter ids have room.
    fn decide_wait(
        &self,
        req: &AcquireRequest<'_>,
        lock: &Lock,
        room: &AcquireRoom,
    ) -> Result<AcquireStep, Rejection> {
        if req.wait_ms == 0 {
            return Ok(AcquireStep::Busy(busy(lock)));
        }
        // 2d. Queue.
        if lock.waiters().len() >= room.max_waiters as usize {
            return Err(Rejection::QueueFull {
                limit: room.max_waiters,
                retry_after_ms: limits::QUEUE_FULL_RETRY_AFTER_MS,
            });
        }
        room.check_session_room()?;
        let waiter = self.mint.next_waiter;
        if waiter.checked_add(1).is_none() {
            return Err(Rejection::CounterLimit {
                field: "waiter_id".into(),
                value: waiter,
                max: u64::MAX - 1,
            });
        }
        Ok(AcquireStep::Queue { waiter })
    }

    /// Carries out what [`LockTable::decide_acquire`] decided, and answers the acquire.
    fn apply_acquire(
        &mut self,
        now: u64,
        req: &AcquireRequest<'_>,
        step: AcquireStep,
        ev: &mut Vec<LockEvent>,
    ) -> Reply {
        let group_moves = self.move_count();
        match step {
            AcquireStep::GrantFreeName { lease_ttl_ms } => {
                let name: Arc<str> = req.name.into();
                let mut lock = Lock::default();
                let token =
                    self.mint
                        .grant(now, &name, &mut lock, req.hold(), &mut self.sessions, ev);
                self.locks.insert(name, lock);
                acquired(token, lease_ttl_ms, 1, group_moves)
            }
            AcquireStep::Grant { lease_ttl_ms } => {
                let (key, lock) = self.locks.get_key_value_mut(req.name).expect("decided");
                let token = self
                    .mint
                    .grant(now, key, lock, req.hold(), &mut self.sessions, ev);
                acquired(token, lease_ttl_ms, 1, group_moves)
            }
            AcquireStep::Reenter {
                holder,
                lease_ttl_ms,
            } => {
                let lock = self.locks.get_mut(req.name).expect("decided");
                let h = &mut lock.holders[holder];
                h.reentry += 1;
                acquired(h.token, lease_ttl_ms, h.reentry, group_moves)
            }
            AcquireStep::Busy(reply) => reply,
            AcquireStep::Queue { waiter } => self.enqueue(now, req, waiter, ev),
        }
    }

    /// Queues an acquire as waiter `id` at the back of its name's queue, indexes its deadline
    /// and lists the wait in its session.
    fn enqueue(
        &mut self,
        now: u64,
        req: &AcquireRequest<'_>,
        id: WaiterId,
        ev: &mut Vec<LockEvent>,
    ) -> Reply {
        self.mint.next_waiter = id + 1;
        // Group time is the proposer's stamp: saturate rather than wrap (or panic) at the end
        // of u64, so a deadline is never before its enqueue time.
        let deadline_ms = now.saturating_add(req.wait_ms);
        let (key, lock) = self.locks.get_key_value_mut(req.name).expect("decided");
        lock.waiters_mut().push_back(Waiter {
            id,
            session: req.session,
            mode: req.mode,
            enqueued_at_ms: now,
            deadline_ms,
            reentrant: req.reentrant,
            owner: req.owner.into(),
        });
        let position = lock.waiters().len() as u32;
        ev.push(LockEvent::WaitStarted {
            name: key.clone(),
            waiter: id,
            session: req.session,
            owner: req.owner.into(),
            mode: req.mode,
            position,
            deadline_ms,
        });
        self.wait_deadlines.insert((deadline_ms, id, key.clone()));
        self.sessions
            .get_mut(&req.session)
            .expect("checked")
            .waits
            .insert((key.clone(), id));
        Reply::Queued {
            waiter: id,
            position,
            deadline_ms,
        }
    }

    /// Hands a name to the waiters at the head of its queue that fit, in order, skipping (and
    /// timing out) any past their deadline; removes the record if nothing is left in it.
    fn grant_waiters(&mut self, now: u64, name: &Arc<str>, ev: &mut Vec<LockEvent>) {
        let Some(lock) = self.locks.get_mut(name) else {
            return;
        };
        if lock.delay_until_ms() == 0 {
            while let Some(head) = lock.waiters().front() {
                let expired = head.deadline_ms <= now;
                // With no token left (revision at its ceiling) a head that fits stays queued:
                // it ends at its deadline or with its session, never with a wrapped token.
                if !expired && (!compatible(&lock.holders, head.mode) || self.mint.exhausted()) {
                    break;
                }
                let w = lock.waiters_mut().pop_front().expect("head exists");
                self.wait_deadlines
                    .remove(&(w.deadline_ms, w.id, name.clone()));
                let sess = self
                    .sessions
                    .get_mut(&w.session)
                    .expect("waiters' sessions live");
                sess.waits.remove(&(name.clone(), w.id));
                if expired {
                    ev.push(LockEvent::WaitEnded {
                        name: name.clone(),
                        waiter: w.id,
                        session: w.session,
                        reason: WaitEndReason::TimedOut,
                        waited_ms: now.saturating_sub(w.enqueued_at_ms),
                    });
                    continue;
                }
                let hold = HoldRequest {
                    session: w.session,
                    owner: &w.owner,
                    mode: w.mode,
                    reentrant: w.reentrant,
                    waiter: Some((w.id, w.enqueued_at_ms)),
                };
                self.mint
                    .grant(now, name, lock, hold, &mut self.sessions, ev);
            }
        }
        lock.tidy();
        if lock.is_idle() {
            self.locks.remove(name);
        }
    }

    /// Drops a waiter (already taken out of its queue) from the indexes.
    fn forget_wait(&mut self, name: &Arc<str>, w: &Waiter) {
        self.wait_deadlines
            .remove(&(w.deadline_ms, w.id, name.clone()));
        if let Some(sess) = self.sessions.get_mut(&w.session) {
            sess.waits.remove(&(name.clone(), w.id));
        }
    }

    /// Finds the hold of `session` on `name` with `token`, or says precisely why not.
    fn find_hold(
        &self,
        session: SessionId,
        name: &str,
        token: Token,
    ) -> Result<(&Lock, usize), Rejection> {
        check_name(name)?;
        self.check_serves(name)?;
        let not_holder = || Rejection::NotHolder {
            session,
            name: name.to_string(),
        };
        match self.session_presence(session) {
            crate::Presence::Live => {}
            // No lease here (never brought here, or ended here): it holds nothing here.
            crate::Presence::NotHere => return Err(not_holder()),
        }
        let lock = self.locks.get(name).ok_or_else(not_holder)?;
        match lock
            .holders
            .iter()
            .position(|h| h.token == token && h.session == session)
        {
            Some(i) => Ok((lock, i)),
            None => match lock.holders.iter().find(|h| h.session == session) {
                Some(h) => Err(Rejection::StaleToken {
                    token,
                    current: h.token,
                }),
                None => Err(not_holder()),
            },
        }
    }

    fn release(
        &mut self,
        now: u64,
        session: SessionId,
        name: &str,
        token: Token,
        ev: &mut Vec<LockEvent>,
    ) -> Result<Reply, Rejection> {
        let (_, i) = self.find_hold(session, name, token)?;
        let (key, lock) = self.locks.get_key_value_mut(name).expect("found");
        let name = key.clone();
        let h = &mut lock.holders[i];
        h.reentry -= 1;
        if h.reentry > 0 {
            return Ok(Reply::Released {
                remaining: h.reentry,
            });
        }
        let held = lock.holders.remove(i);
        self.mint.holds -= 1;
        ev.push(LockEvent::HoldEnded {
            name: name.clone(),
            session,
            token,
            cause: HoldEndCause::Released,
            held_ms: now.saturating_sub(held.granted_at_ms),
            lock_delay_until_ms: 0,
        });
        self.sessions
            .get_mut(&session)
            .expect("found")
            .held
            .remove(&(name.clone(), token));
        self.grant_waiters(now, &name, ev);
        Ok(Reply::Released { remaining: 0 })
    }

    fn extend(&self, session: SessionId, name: &str, token: Token) -> Result<Reply, Rejection> {
        self.find_hold(session, name, token)?;
        Ok(Reply::Extended {
            lease_ttl_ms: self.sessions[&session].ttl_ms,
        })
    }

    fn tick(&mut self, now: u64, ev: &mut Vec<LockEvent>) -> Reply {
        let mut touched: BTreeSet<Arc<str>> = BTreeSet::new();
        let mut timed_out = 0;
        while let Some((deadline, id, name)) = self.wait_deadlines.first().cloned() {
            if deadline > now {
                break;
            }
            let lock = self.locks.get_mut(&name).expect("a deadline has a lock");
            let pos = lock
                .waiters()
                .iter()
                .position(|w| w.id == id)
                .expect("deadline is queued");
            let w = lock
                .waiters_mut()
                .remove(pos)
                .expect("position is in range");
            self.forget_wait(&name, &w);
            ev.push(LockEvent::WaitEnded {
                name: name.clone(),
                waiter: id,
                session: w.session,
                reason: WaitEndReason::TimedOut,
                waited_ms: now.saturating_sub(w.enqueued_at_ms),
            });
            timed_out += 1;
            touched.insert(name);
        }
        let mut delays_ended = 0;
        while let Some((until, name)) = self.delays.first().cloned() {
            if until > now {
                break;
            }
            self.delays.pop_first();
            self.locks
                .get_mut(&name)
                .expect("a delay has a lock")
                .set_delay_until(0);
            delays_ended += 1;
            touched.insert(name);
        }
        for name in &touched {
            self.grant_waiters(now, name, ev);
        }
        Reply::Ticked {
            timed_out,
            delays_ended,
        }
    }

    fn put_namespace(&mut self, ns: &Namespace) -> Result<Reply, Rejection> {
        validate_namespace(ns)?;
        check_name_unique(&self.namespaces, ns)?;
        self.namespaces.insert(ns.prefix.clone(), ns.clone());
        self.namespaces_version += 1;
        Ok(Reply::NamespacePut)
    }

    /// The version of the namespace set (see [`Op::ChangeNamespace`]).
    pub fn namespaces_version(&self) -> u64 {
        self.namespaces_version
    }

    fn seed_namespaces(&mut self, namespaces: &[Namespace]) -> Result<Reply, Rejection> {
        if self.namespaces_version != 0 {
            return Ok(Reply::NamespacesAt {
                version: self.namespaces_version,
                changed: false,
            });
        }
        // All or nothing: every namespace is checked before any is put, and as a set (two
        // names for one prefix, or one name for two prefixes, is refused).
        let mut trial = self.namespaces.clone();
        for ns in namespaces {
            validate_namespace(ns)?;
            check_name_unique(&trial, ns)?;
            trial.insert(ns.prefix.clone(), ns.clone());
        }
        self.namespaces = trial;
        self.namespaces_version = 1;
        Ok(Reply::NamespacesAt {
            version: 1,
            changed: true,
        })
    }

    fn change_namespace(
        &mut self,
        expected_version: u64,
        change: &crate::NamespaceChange,
    ) -> Result<Reply, Rejection> {
        if expected_version != self.namespaces_version {
            return Err(Rejection::NamespaceVersionConflict {
                expected: expected_version,
                current: self.namespaces_version,
            });
        }
        match change {
            crate::NamespaceChange::Put(ns) => self.put_namespace(ns)?,
            crate::NamespaceChange::PutV8(ns) => self.put_namespace(&ns.clone().into())?,
            crate::NamespaceChange::Delete { prefix } => self.delete_namespace(prefix)?,
        };
        Ok(Reply::NamespacesAt {
            version: self.namespaces_version,
            changed: true,
        })
    }

    fn delete_namespace(&mut self, prefix: &str) -> Result<Reply, Rejection> {
        if prefix.is_empty() {
            return Err(Rejection::InvalidNamespace {
                reason: "the default namespace cannot be deleted".into(),
            });
        }
        match self.namespaces.remove(prefix) {
            Some(_) => {
                self.namespaces_version += 1;
                Ok(Reply::NamespaceDeleted)
            }
            None => Err(Rejection::UnknownNamespace {
                name: prefix.to_string(),
            }),
        }
    }
}

fn check_ttl(ns: &Namespace, ttl_ms: u64) -> Result<(), Rejection> {
    if ttl_ms < ns.min_ttl_ms || ttl_ms > ns.max_ttl_ms {
        return Err(Rejection::TtlOutOfRange {
            ttl_ms,
            min_ms: ns.min_ttl_ms,
            max_ms: ns.max_ttl_ms,
            namespace: ns.name.clone(),
        });
    }
    Ok(())
}

/// One name per namespace: `ns.name` may not name another prefix's namespace.
fn check_name_unique(
    namespaces: &BTreeMap<String, Namespace>,
    ns: &Namespace,
) -> Result<(), Rejection> {
    match namespaces.values().find(|o| o.name == ns.name) {
        Some(other) if other.prefix != ns.prefix => Err(Rejection::InvalidNamespace {
            reason: format!(
                "name '{}' is already used by prefix '{}'",
                ns.name, other.prefix
            ),
        }),
        _ => Ok(()),
    }
}

/// The rules a namespace definition must follow.
pub fn validate_namespace(ns: &Namespace) -> Result<(), Rejection> {
    let bad = |reason: String| Err(Rejection::InvalidNamespace { reason });
    check_printable("namespace.name", &ns.name, limits::MAX_NAMESPACE_NAME_BYTES)?;
    if ns.prefix.is_empty() != (ns.name == "default") {
        return bad("only the namespace named 'default' has the empty prefix".into());
    }
    if !ns.prefix.is_empty() {
        check_printable("namespace.prefix", &ns.prefix, limits::MAX_NAME_BYTES)?;
        if !ns.prefix.ends_with('/') {
            return bad(format!("prefix '{}' must end with '/'", ns.prefix));
        }
    }
    check_ttl_order(ns)?;
    if ns.max_waiters_per_name > limits::HARD_MAX_WAITERS_PER_NAME {
        return bad(format!(
            "max_waiters_per_name {} exceeds {}",
            ns.max_waiters_per_name,
            limits::HARD_MAX_WAITERS_PER_NAME
        ));
    }
    if ns.max_locks_per_session == 0
        || ns.max_locks_per_session > limits::HARD_MAX_LOCKS_PER_SESSION
    {
        return bad(format!(
            "max_locks_per_session {} must be within 1..={}",
            ns.max_locks_per_session,
            limits::HARD_MAX_LOCKS_PER_SESSION
        ));
    }
    if ns.max_sessions as usize > limits::MAX_SESSIONS {
        return bad(format!(
            "max_sessions {} exceeds {} (0 = no limit but the cluster's)",
            ns.max_sessions,
            limits::MAX_SESSIONS
        ));
    }
    if ns.lock_delay_ms > limits::MAX_LOCK_DELAY_MS {
        return bad(format!(
            "lock_delay_ms {} exceeds {}",
            ns.lock_delay_ms,
            limits::MAX_LOCK_DELAY_MS
        ));
    }
    if let Some(digest) = &ns.token_sha256 {
        check_token_digest(digest)?;
    }
    if let SafetyClass::Correctness { fenced_resource } = &ns.safety {
        if fenced_resource.trim().is_empty() {
            return bad("a correctness namespace must declare its fenced resource".into());
        }
        check_printable(
            "namespace.fenced_resource",
            fenced_resource,
            limits::MAX_OWNER_BYTES,
        )?;
    }
    Ok(())
}

/// A namespace's TTLs: within the hard bounds, and min <= default <= max.
fn check_ttl_order(ns: &Namespace) -> Result<(), Rejection> {
    if limits::HARD_MIN_TTL_MS <= ns.min_ttl_ms
        && ns.min_ttl_ms <= ns.default_ttl_ms
        && ns.default_ttl_ms <= ns.max_ttl_ms
        && ns.max_ttl_ms <= limits::HARD_MAX_TTL_MS
    {
        return Ok(());
    }
    Err(Rejection::InvalidNamespace {
        reason: format!(
            "TTLs must satisfy {} <= min ({}) <= default ({}) <= max ({}) <= {} ms",
            limits::HARD_MIN_TTL_MS,
            ns.min_ttl_ms,
            ns.default_ttl_ms,
            ns.max_ttl_ms,
            limits::HARD_MAX_TTL_MS
        ),
    })
}

/// A namespace's token digest: salted (`s1$SALT$HASH`, 32 and 64 lower-case hex digits) or a
/// bare SHA-256 (64 lower-case hex digits).
fn check_token_digest(digest: &str) -> Result<(), Rejection> {
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let salted = digest
        .strip_prefix(crate::SALTED_DIGEST_PREFIX)
        .and_then(|rest| rest.split_once('$'))
        .is_some_and(|(salt, hash)| hex(salt, 32) && hex(hash, 64));
    if salted || hex(digest, 64) {
        return Ok(());
    }
    Err(Rejection::InvalidNamespace {
        reason: "token_sha256 must be s1$SALT$HASH (32 and 64 lower-case hex digits) or 64 \
                 lower-case hex digits"
            .into(),
    })
}

/// Decides a re-entry of the record's holder at index `holder` (same session and owner): it
/// must be re-entrant on both sides, in the same mode, and under the re-entry limit.
fn decide_reentry(
    req: &AcquireRequest<'_>,
    lock: &Lock,
    holder: usize,
    lease_ttl_ms: u64,
) -> Result<AcquireStep, Rejection> {
    let h = &lock.holders[holder];
    if !(req.reentrant && h.reentrant && h.mode == req.mode) {
        return Err(Rejection::AlreadyHeld { token: h.token });
    }
    if h.reentry >= limits::MAX_REENTRY {
        return Err(Rejection::TooManyReentries {
            max: limits::MAX_REENTRY,
        });
    }
    Ok(AcquireStep::Reenter {
        holder,
        lease_ttl_ms,
    })
}

/// [`Reply::Busy`] for a try on `lock`: its first holder, its queue, and why it waits.
fn busy(lock: &Lock) -> Reply {
    let reason = if lock.delay_until_ms() != 0 {
        BusyReason::LockDelay {
            until_ms: lock.delay_until_ms(),
        }
    } else {
        BusyReason::Held
    };
    Reply::Busy {
        holder: lock.holder_view(),
        queue_len: lock.waiters().len() as u32,
        reason,
    }
}

/// [`Reply::Acquired`], for the acquire paths that grant.
fn acquired(token: Token, lease_ttl_ms: u64, reentry: u32, group_moves: u64) -> Reply {
    Reply::Acquired {
        token,
        lease_ttl_ms,
        reentry,
        group_moves,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(op: Op) -> Command {
        Command { now_ms: 10, op }
    }

    fn acquire(session: u64, wait_ms: u64) -> Op {
        Op::Acquire {
            session: SessionId(session),
            name: "n".into(),
            owner: String::new(),
            mode: LockMode::Exclusive,
            wait_ms,
            reentrant: false,
        }
    }

    /// Waiter ids come from a counter like tokens do: the last one is refused, typed and with
    /// no change, instead of overflowing (a panic in debug builds, a wrap to 0 in release).
    #[test]
    fn waiter_ids_stop_before_the_counter_overflows() {
        let mut t = LockTable::new();
        for s in 1..=3 {
            let open = Op::OpenSession {
                session: SessionId(s),
                client: String::new(),
                ttl_ms: 0,
                namespace: String::new(),
            };
            t.apply(&cmd(open)).reply.unwrap();
        }
        t.apply(&cmd(acquire(1, 0))).reply.unwrap();
        t.mint.next_waiter = u64::MAX - 1;
        let queued = t.apply(&cmd(acquire(2, 1_000))).reply.unwrap();
        assert!(matches!(queued, Reply::Queued { waiter, .. } if waiter == u64::MAX - 1));
        t.check_invariants().unwrap();
        let before = t.snapshot();
        let out = t.apply(&cmd(acquire(3, 1_000)));
        assert_eq!(
            out.reply,
            Err(Rejection::CounterLimit {
                field: "waiter_id".into(),
                value: u64::MAX,
                max: u64::MAX - 1,
            })
        );
        assert!(out.effects.is_empty());
        assert_eq!(t.snapshot(), before);
        t.check_invariants().unwrap();
        // A try-lock needs no waiter id.
        assert!(matches!(
            t.apply(&cmd(acquire(3, 0))).reply,
            Ok(Reply::Busy { .. })
        ));
    }
}
