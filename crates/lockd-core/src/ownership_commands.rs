//! Bucket ownership: which of the 4,096 buckets a lock group serves, and the replicated steps
//! that move buckets from one group to another without ever giving a name two owners or a
//! token smaller than one already granted for it.
//!
//! A group checks, in its replicated state, that it owns a name's bucket before it grants,
//! releases or extends; a stale router then meets `WrongGroup` and never makes two groups grant
//! one name. A move of buckets `S` from group A to group B is four commands, each idempotent:
//!
//! 1. A `FreezeBuckets`: A stops serving `S` (their names are refused with `BucketMoving`, which
//!    callers retry), ends their waits (reason `Moved`: the node that queued each re-queues it
//!    at the new owner), and takes their holders and lock-delays out of its table into the
//!    move's export, together with its revision and the sessions the holders belong to.
//! 2. B `ImportBuckets`: B raises its revision to at least the export's (so every later token
//!    for a moved name is larger than any earlier one), adopts the sessions it lacks (their
//!    lease starts anew there: never shorter), takes the holders with their tokens verbatim and
//!    the lock-delays, and serves `S`.
//! 3. meta `PutShardMap`: the map sends `S` to B.
//! 4. A `DropBuckets`: A forgets the export and no longer owns `S`.
//!
//! An abort is possible only before step 2: B `CancelImport` (refused once B imported; after
//! it B refuses that import for good), then A `ThawBuckets` puts the holders back. Whatever
//! order the steps are retried in, at most one group serves a bucket at any time.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::bucket::bucket_of;
use crate::entity::{Lock, Session};
use crate::limits::{self, check_name, check_optional};
use crate::machine::LockTable;
use crate::ownership::*;
use crate::types::*;

fn conflict(move_id: MoveId, reason: impl Into<String>) -> Rejection {
    Rejection::MoveConflict {
        move_id,
        reason: reason.into(),
    }
}

impl LockTable {
    /// NEGATIVE CONTROL ONLY: this table serves names of buckets it does not own (a group
    /// without the ownership check), so that the simulator can show it catches two groups
    /// granting one name. Not part of the state; never set in production.
    #[doc(hidden)]
    pub fn sabotage_skip_ownership_check(&mut self) {
        self.ownership.skip_check = true;
    }

    /// What this group owns.
    pub fn ownership(&self) -> OwnershipView {
        OwnershipView {
            map_version: self.ownership.map_version,
            owned: self.ownership.owned.clone(),
            frozen: self.ownership.frozen.clone(),
        }
    }

    /// How many bucket moves this group has taken part in (as source or destination). It only
    /// grows, and a hold can leave the group only by a move, which raises it first (the freeze
    /// records the move): a client that sees the count it was granted at knows its hold is
    /// still here (docs/API.md, per-group leases).
    pub fn move_count(&self) -> u64 {
        self.ownership.moves.len() as u64
    }

    /// A move's record here, if this group took part in it.
    pub fn move_record(&self, move_id: MoveId) -> Option<&MoveRecord> {
        self.ownership.moves.get(&move_id)
    }

    /// Moves under way out of this group: (id, receiving group, buckets), by id.
    pub fn outgoing_moves(&self) -> Vec<(MoveId, u32, BucketSet)> {
        self.ownership
            .moves
            .iter()
            .filter_map(|(id, r)| match r {
                MoveRecord::Outgoing {
                    to_group, buckets, ..
                } => Some((*id, *to_group, buckets.clone())),
                _ => None,
            })
            .collect()
    }

    /// Refuses a name this group does not serve now: its bucket is another group's, or frozen
    /// for a move. Every grant, release and extend passes here.
    pub fn check_serves(&self, name: &str) -> Result<(), Rejection> {
        let own = &self.ownership;
        if (own.map_version == 0 && own.moves.is_empty()) || own.skip_check {
            return Ok(());
        }
        let bucket = bucket_of(name);
        if !own.owned.contains(bucket) {
            return Err(Rejection::WrongGroup {
                bucket,
                map_version: own.map_version,
            });
        }
        if own.frozen.contains(bucket) {
            return Err(Rejection::BucketMoving { bucket });
        }
        Ok(())
    }

    /// The first assignment of buckets (from the shard map, when the cluster starts); the same
    /// assignment again is a no-op. Every name already held must fall in it.
    pub(crate) fn assign_buckets(
        &mut self,
        buckets: &BucketSet,
        map_version: u64,
    ) -> Result<Reply, Rejection> {
        let own = &self.ownership;
        if own.map_version != 0 {
            if own.owned == *buckets && own.moves.is_empty() {
                return Ok(Reply::BucketsAssigned {
                    buckets: buckets.len() as u32,
                });
            }
            return Err(conflict(
                0,
                format!(
                    "the buckets were assigned already (map version {}); change them by moves",
                    own.map_version
                ),
            ));
        }
        if map_version == 0 {
            return Err(conflict(0, "map_version must be at least 1"));
        }
        if let Some((name, _)) = self
            .locks
            .iter()
            .find(|(n, _)| !buckets.contains(bucket_of(n)))
        {
            return Err(conflict(
                0,
                format!(
                    "'{name}' is in use here but its bucket {} is not in the assignment",
                    bucket_of(name)
                ),
            ));
        }
        self.ownership.owned = buckets.clone();
        self.ownership.map_version = map_version;
        Ok(Reply::BucketsAssigned {
            buckets: buckets.len() as u32,
        })
    }

    /// Step 1 (sending group): freeze `buckets` and export their holders.
    pub(crate) fn freeze_buckets(
        &mut self,
        now: u64,
        move_id: MoveId,
        to_group: u32,
        buckets: &BucketSet,
        ev: &mut Vec<LockEvent>,
    ) -> Result<Reply, Rejection> {
        if let Some(again) = self.check_freeze(move_id, to_group, buckets)? {
            return Ok(again);
        }
        // Validation done; now take the buckets' names out of the table, in name order.
        let mut export = Export {
            revision: self.mint.revision,
            ..Export::default()
        };
        let mut sessions = BTreeMap::new();
        let mut waits_ended = 0;
        let mut holders = 0;
        for name in self.names_in(buckets) {
            let lock = self.locks.remove(&name).expect("listed");
            waits_ended += self.end_waits_for_move(now, &name, &lock, ev);
            if lock.delay_until_ms() != 0 {
                self.delays.remove(&(lock.delay_until_ms(), name.clone()));
            }
            let out = ExportedLock {
                name: name.to_string(),
                holders: self.export_holders(now, &name, &lock, &mut sessions, ev),
                delay_left_ms: lock.delay_until_ms().saturating_sub(now),
            };
            holders += out.holders.len() as u32;
            if !out.holders.is_empty() || out.delay_left_ms > 0 {
                export.locks.push(out);
            }
        }
        export.sessions = sessions.into_values().collect();
        let locks = export.locks.len() as u32;
        self.ownership.record(
            move_id,
            MoveRecord::Outgoing {
                to_group,
                buckets: buckets.clone(),
                export,
            },
        );
        Ok(Reply::BucketsFrozen {
            locks,
            holders,
            waits_ended,
        })
    }

    /// Decides whether a freeze may go ahead, changing nothing: the same freeze again answers
    /// as the first one did (`Some`); a move recorded here otherwise, or buckets this group
    /// cannot hand over, are refused; `None` means go ahead.
    fn check_freeze(
        &self,
        move_id: MoveId,
        to_group: u32,
        buckets: &BucketSet,
    ) -> Result<Option<Reply>, Rejection> {
        match self.ownership.moves.get(&move_id) {
            Some(MoveRecord::Outgoing {
                to_group: t,
                buckets: b,
                export,
            }) if *t == to_group && b == buckets => {
                return Ok(Some(Reply::BucketsFrozen {
                    locks: export.locks.len() as u32,
                    holders: export.locks.iter().map(|l| l.holders.len() as u32).sum(),
                    waits_ended: 0,
                }));
            }
            Some(r) => {
                return Err(conflict(
                    move_id,
                    format!("this move is already recorded here as {}", record_kind(r)),
                ))
            }
            None => {}
        }
        if buckets.is_empty() {
            return Err(conflict(move_id, "no buckets given"));
        }
        if to_group == 0 {
            return Err(conflict(
                move_id,
                "group 0 is the meta group and owns no bucket",
            ));
        }
        if !buckets.is_subset(&self.ownership.owned) {
            let mut missing = buckets.clone();
            missing.subtract(&self.ownership.owned);
            return Err(conflict(
                move_id,
                format!("buckets {missing} are not owned by this group"),
            ));
        }
        if buckets.intersects(&self.ownership.frozen) {
            return Err(conflict(
                move_id,
                "some buckets are already frozen for another move",
            ));
        }
        Ok(None)
    }

    /// The stored names whose bucket is in `buckets`, in name order.
    fn names_in(&self, buckets: &BucketSet) -> Vec<Arc<str>> {
        let mut names: Vec<Arc<str>> = self
            .locks
            .iter()
            .filter(|(n, _)| buckets.contains(bucket_of(n)))
            .map(|(n, _)| n.clone())
            .collect();
        names.sort_unstable();
        names
    }

    /// Ends the waits of `lock` (taken out of the table) for a move: drops them from the
    /// deadline index and their sessions, with reason `Moved`. Returns how many ended.
    fn end_waits_for_move(
        &mut self,
        now: u64,
        name: &Arc<str>,
        lock: &Lock,
        ev: &mut Vec<LockEvent>,
    ) -> u32 {
        let mut ended = 0;
        for w in lock.waiters() {
            self.wait_deadlines
                .remove(&(w.deadline_ms, w.id, name.clone()));
            if let Some(s) = self.sessions.get_mut(&w.session) {
                s.waits.remove(&(name.clone(), w.id));
            }
            ev.push(LockEvent::WaitEnded {
                name: name.clone(),
                waiter: w.id,
                session: w.session,
                reason: WaitEndReason::Moved,
                waited_ms: now.saturating_sub(w.enqueued_at_ms),
            });
            ended += 1;
        }
        ended
    }

    /// Moves the holders of `lock` (taken out of the table) out of this group: takes each off
    /// its session's list and the hold count, and adds its session to `sessions` (by id).
    /// Returns them as exported, in order.
    fn export_holders(
        &mut self,
        now: u64,
        name: &Arc<str>,
        lock: &Lock,
        sessions: &mut BTreeMap<SessionId, ExportedSession>,
        ev: &mut Vec<LockEvent>,
    ) -> Vec<ExportedHolder> {
        let mut out = Vec::new();
        for h in &lock.holders {
            let s = self
                .sessions
                .get_mut(&h.session)
                .expect("a holder's session lives");
            s.held.remove(&(name.clone(), h.token));
            sessions
                .entry(h.session)
                .or_insert_with(|| ExportedSession {
                    id: h.session,
                    ttl_ms: s.ttl_ms,
                    client: s.client.to_string(),
                    namespace: s.namespace.to_string(),
                });
            self.mint.holds -= 1;
            ev.push(LockEvent::HoldMovedOut {
                name: name.clone(),
                session: h.session,
                token: h.token,
            });
            out.push(ExportedHolder {
                session: h.session,
                token: h.token,
                mode: h.mode,
                held_ms: now.saturating_sub(h.granted_at_ms),
                reentry: h.reentry,
                reentrant: h.reentrant,
                owner: h.owner.to_string(),
            });
        }
        out
    }

    /// The sessions an import names: one this group lacks is adopted (its lease starts now); one
    /// it has gets its lease restarted, since it may be older than the one its moved holds
    /// followed in the sending group (clients follow that group's deadline until they see the
    /// move; C2). Returns how many were adopted.
    fn bring_sessions(
        &mut self,
        now: u64,
        sessions: &[ExportedSession],
        ev: &mut Vec<LockEvent>,
    ) -> u32 {
        let mut adopted = 0;
        for s in sessions {
            if let Some(have) = self.sessions.get(&s.id) {
                let ttl_ms = have.ttl_ms;
                self.topology.lease_restarted.insert(s.id);
                ev.push(LockEvent::SessionAdopted {
                    session: s.id,
                    ttl_ms,
                });
                continue;
            }
            self.insert_session(
                s.id,
                Session {
                    ttl_ms: s.ttl_ms,
                    opened_at_ms: now,
                    client: s.client.as_str().into(),
                    namespace: s.namespace.as_str().into(),
                    held: Default::default(),
                    waits: Default::default(),
                },
            );
            ev.push(LockEvent::SessionAdopted {
                session: s.id,
                ttl_ms: s.ttl_ms,
            });
            adopted += 1;
        }
        adopted
    }

    /// Step 2 (receiving group): take the export and serve the buckets.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn import_buckets(
        &mut self,
        now: u64,
        move_id: MoveId,
        from_group: u32,
        buckets: &BucketSet,
        map_version: u64,
        export: &Export,
        ev: &mut Vec<LockEvent>,
    ) -> Result<Reply, Rejection> {
        if let Some(again) = self.check_import(move_id, from_group, buckets, export)? {
            return Ok(again);
        }
        // Validation done.
        self.mint.revision = self.mint.revision.max(export.revision);
        let adopted = self.bring_sessions(now, &export.sessions, ev);
        self.store_imported_locks(now, &export.locks, ev);
        self.ownership.owned.union_with(buckets);
        self.ownership.map_version = self.ownership.map_version.max(map_version);
        self.ownership.record(
            move_id,
            MoveRecord::Imported {
                from_group,
                buckets: buckets.clone(),
            },
        );
        Ok(Reply::BucketsImported {
            locks: export.locks.len() as u32,
            sessions_adopted: adopted,
            revision: self.mint.revision,
        })
    }

    /// Decides whether an import may go ahead, changing nothing: the same import again answers
    /// as the first one did (`Some`); a move recorded here otherwise, a group that cannot take
    /// buckets, buckets it owns already or an export it could not take are refused; `None`
    /// means go ahead.
    fn check_import(
        &self,
        move_id: MoveId,
        from_group: u32,
        buckets: &BucketSet,
        export: &Export,
    ) -> Result<Option<Reply>, Rejection> {
        match self.ownership.moves.get(&move_id) {
            Some(MoveRecord::Imported {
                from_group: f,
                buckets: b,
            }) if *f == from_group && b == buckets => {
                return Ok(Some(Reply::BucketsImported {
                    locks: export.locks.len() as u32,
                    sessions_adopted: 0,
                    revision: self.mint.revision,
                }))
            }
            Some(r) => {
                return Err(conflict(
                    move_id,
                    format!("this move is already recorded here as {}", record_kind(r)),
                ))
            }
            None => {}
        }
        if buckets.is_empty() {
            return Err(conflict(move_id, "no buckets given"));
        }
        if self.topology.closed {
            // The mover reads "cancelled" as the abort it is: it thaws the sender.
            return Err(conflict(
                move_id,
                "this group is closed for removal and takes no bucket: the import is cancelled",
            ));
        }
        if self.ownership.map_version == 0 {
            return Err(conflict(
                move_id,
                "this group's buckets were never assigned, so it owns every bucket already",
            ));
        }
        if buckets.intersects(&self.ownership.owned) {
            return Err(conflict(
                move_id,
                "some buckets are owned by this group already",
            ));
        }
        validate_export(move_id, buckets, export)?;
        Ok(None)
    }

    /// Stores the exported locks, in the export's order: each holder with its token verbatim
    /// (listed in its session, counted), and each lock-delay as the time it had left.
    fn store_imported_locks(&mut self, now: u64, locks: &[ExportedLock], ev: &mut Vec<LockEvent>) {
        for l in locks {
            let name: Arc<str> = l.name.as_str().into();
            let mut lock = Lock::default();
            for h in &l.holders {
                lock.holders.push(h.to_holder(now));
                self.sessions
                    .get_mut(&h.session)
                    .expect("adopted before its locks")
                    .held
                    .insert((name.clone(), h.token));
                self.mint.holds += 1;
                ev.push(h.moved_in(&name));
            }
            if l.delay_left_ms > 0 {
                let until = now.saturating_add(l.delay_left_ms);
                lock.set_delay_until(until);
                self.delays.insert((until, name.clone()));
            }
            self.locks.insert(name, lock);
        }
    }

    /// Abort, receiving side: refuse this move's import for good (refused once imported).
    pub(crate) fn cancel_import(&mut self, move_id: MoveId) -> Result<Reply, Rejection> {
        match self.ownership.moves.get(&move_id) {
            None => {
                self.ownership.record(move_id, MoveRecord::Cancelled);
                Ok(Reply::ImportCancelled)
            }
            Some(MoveRecord::Cancelled) => Ok(Reply::ImportCancelled),
            Some(r) => Err(conflict(
                move_id,
                format!(
                    "this move is recorded here as {}; only one not yet imported can be cancelled",
                    record_kind(r)
                ),
            )),
        }
    }

    /// Abort, sending side: put the export back and serve the buckets again. Holders whose
    /// session ended meanwhile are not put back; their names get the namespace's lock-delay,
    /// as if the session had expired with them here.
    pub(crate) fn thaw_buckets(
        &mut self,
        now: u64,
        move_id: MoveId,
        ev: &mut Vec<LockEvent>,
    ) -> Result<Reply, Rejection> {
        let Some((to_group, buckets, export)) = self.frozen_move(move_id)? else {
            // Thawed already: nothing to do again.
            return Ok(Reply::BucketsThawed {
                restored: 0,
                dropped: 0,
            });
        };
        let (mut restored, mut dropped) = (0, 0);
        for l in &export.locks {
            let name: Arc<str> = l.name.as_str().into();
            let mut lock = Lock::default();
            let mut delay_until = if l.delay_left_ms > 0 {
                now.saturating_add(l.delay_left_ms)
            } else {
                0
            };
            for h in &l.holders {
                let Some(s) = self.sessions.get_mut(&h.session) else {
                    dropped += 1;
                    let d = self.namespace_for(&name).lock_delay_ms;
                    if d > 0 {
                        delay_until = delay_until.max(now.saturating_add(d));
                    }
                    ev.push(h.moved_in(&name));
                    ev.push(LockEvent::HoldEnded {
                        name: name.clone(),
                        session: h.session,
                        token: h.token,
                        cause: HoldEndCause::Dropped,
                        held_ms: h.held_ms,
                        lock_delay_until_ms: if d > 0 { now.saturating_add(d) } else { 0 },
                    });
                    continue;
                };
                s.held.insert((name.clone(), h.token));
                lock.holders.push(h.to_holder(now));
                self.mint.holds += 1;
                restored += 1;
                ev.push(h.moved_in(&name));
            }
            if delay_until > 0 {
                lock.set_delay_until(delay_until);
                self.delays.insert((delay_until, name.clone()));
            }
            if !lock.holders.is_empty() || delay_until > 0 {
                self.locks.insert(name, lock);
            }
        }
        self.ownership
            .record(move_id, MoveRecord::Thawed { to_group, buckets });
        Ok(Reply::BucketsThawed { restored, dropped })
    }

    /// The move `move_id` this group froze, to thaw it: its target, buckets and export; `None`
    /// if it was thawed already. Any other record refuses the thaw.
    fn frozen_move(&self, move_id: MoveId) -> Result<Option<(u32, BucketSet, Export)>, Rejection> {
        match self.ownership.moves.get(&move_id) {
            Some(MoveRecord::Outgoing {
                to_group,
                buckets,
                export,
            }) => Ok(Some((*to_group, buckets.clone(), export.clone()))),
            Some(MoveRecord::Thawed { .. }) => Ok(None),
            Some(r) => Err(conflict(
                move_id,
                format!(
                    "this move is recorded here as {}; only a frozen one can be thawed",
                    record_kind(r)
                ),
            )),
            None => Err(Rejection::UnknownMove { move_id }),
        }
    }

    /// Step 4 (sending group): forget the export; the buckets are no longer this group's.
    pub(crate) fn drop_buckets(
        &mut self,
        move_id: MoveId,
        map_version: u64,
    ) -> Result<Reply, Rejection> {
        let (to_group, buckets) = match self.ownership.moves.get(&move_id) {
            Some(MoveRecord::Outgoing {
                to_group, buckets, ..
            }) => (*to_group, buckets.clone()),
            Some(MoveRecord::Dropped { .. }) => return Ok(Reply::BucketsDropped),
            Some(r) => {
                return Err(conflict(
                    move_id,
                    format!(
                        "this move is recorded here as {}; only a frozen one can be dropped",
                        record_kind(r)
                    ),
                ))
            }
            None => return Err(Rejection::UnknownMove { move_id }),
        };
        if self.ownership.map_version == 0 {
            // A group that owned every bucket now owns every bucket but these.
            self.ownership.owned = BucketSet::full();
        }
        self.ownership.owned.subtract(&buckets);
        self.ownership.map_version = self.ownership.map_version.max(map_version).max(1);
        self.ownership
            .record(move_id, MoveRecord::Dropped { to_group, buckets });
        Ok(Reply::BucketsDropped)
    }
}

fn record_kind(r: &MoveRecord) -> &'static str {
    match r {
        MoveRecord::Outgoing { .. } => "frozen (outgoing)",
        MoveRecord::Dropped { .. } => "dropped (sent)",
        MoveRecord::Thawed { .. } => "thawed (aborted)",
        MoveRecord::Imported { .. } => "imported",
        MoveRecord::Cancelled => "cancelled",
    }
}

/// Every rule an export must follow for its import to leave a state commands could reach.
pub(crate) fn validate_export(
    move_id: MoveId,
    buckets: &BucketSet,
    e: &Export,
) -> Result<(), Rejection> {
    let bad = |reason: String| Err(export_refused(move_id, reason));
    if e.revision > limits::MAX_REVISION {
        return bad(format!(
            "revision {} is above the limit {}",
            e.revision,
            limits::MAX_REVISION
        ));
    }
    if !e.sessions.windows(2).all(|w| w[0].id < w[1].id) {
        return bad("sessions are not sorted by id, or one is listed twice".into());
    }
    for s in &e.sessions {
        if !(limits::HARD_MIN_TTL_MS..=limits::HARD_MAX_TTL_MS).contains(&s.ttl_ms) {
            return bad(format!(
                "session {} has ttl {} ms, outside {}..={} ms",
                s.id,
                s.ttl_ms,
                limits::HARD_MIN_TTL_MS,
                limits::HARD_MAX_TTL_MS
            ));
        }
        check_optional("client", &s.client, limits::MAX_CLIENT_BYTES)?;
        check_optional("namespace", &s.namespace, limits::MAX_NAMESPACE_NAME_BYTES)?;
    }
    if !e.locks.windows(2).all(|w| w[0].name < w[1].name) {
        return bad("locks are not sorted by name, or one is listed twice".into());
    }
    for l in &e.locks {
        validate_exported_lock(move_id, buckets, e, l)?;
    }
    Ok(())
}

/// The refusal of an export that breaks a rule, saying which.
fn export_refused(move_id: MoveId, reason: String) -> Rejection {
    conflict(move_id, format!("export refused: {reason}"))
}

/// The rules for one lock of export `e`: a valid name in one of the move's buckets, holders or
/// a lock-delay (within its limit), valid holders ([`validate_exported_holders`]) that fit
/// their modes.
fn validate_exported_lock(
    move_id: MoveId,
    buckets: &BucketSet,
    e: &Export,
    l: &ExportedLock,
) -> Result<(), Rejection> {
    let bad = |reason: String| Err(export_refused(move_id, reason));
    check_name(&l.name)?;
    if !buckets.contains(bucket_of(&l.name)) {
        return bad(format!(
            "'{}' is in bucket {}, not one of the move's",
            l.name,
            bucket_of(&l.name)
        ));
    }
    if l.holders.is_empty() && l.delay_left_ms == 0 {
        return bad(format!("'{}' has neither holders nor a lock-delay", l.name));
    }
    if l.delay_left_ms > limits::MAX_LOCK_DELAY_MS {
        return bad(format!(
            "'{}' has a lock-delay of {} ms, above {}",
            l.name,
            l.delay_left_ms,
            limits::MAX_LOCK_DELAY_MS
        ));
    }
    validate_exported_holders(move_id, e, l)?;
    if !holders_fit_modes(&l.holders) {
        return bad(format!(
            "the holders of '{}' do not fit their modes",
            l.name
        ));
    }
    Ok(())
}

/// The rules for the holders of lock `l` of export `e`: tokens unique, not zero and at most
/// the export's revision; each of a session the export lists, at most once per session and
/// owner; re-entry counts within their limit (above 1 only if re-entrant); valid owners.
fn validate_exported_holders(
    move_id: MoveId,
    e: &Export,
    l: &ExportedLock,
) -> Result<(), Rejection> {
    let bad = |reason: String| Err(export_refused(move_id, reason));
    let known = |id: SessionId| e.sessions.binary_search_by_key(&id, |s| s.id).is_ok();
    let mut tokens = std::collections::BTreeSet::new();
    let mut sessions = std::collections::BTreeSet::new();
    for h in &l.holders {
        if h.token == 0 || h.token > e.revision || !tokens.insert(h.token) {
            return bad(format!(
                "'{}' has token {} twice, zero or above the export's revision {}",
                l.name, h.token, e.revision
            ));
        }
        if !known(h.session) || !sessions.insert((h.session, h.owner.as_str())) {
            return bad(format!(
                "a holder of '{}' belongs to a session the export does not list, or holds twice",
                l.name
            ));
        }
        if h.reentry == 0 || h.reentry > limits::MAX_REENTRY || (h.reentry > 1 && !h.reentrant) {
            return bad(format!(
                "a holder of '{}' has re-entry count {} (1..={}, above 1 only if re-entrant)",
                l.name,
                h.reentry,
                limits::MAX_REENTRY
            ));
        }
        check_optional("owner", &h.owner, limits::MAX_OWNER_BYTES)?;
    }
    Ok(())
}

/// Whether exported holders could hold one name together: one exclusive holder, shared ones
/// only, or a valid semaphore's users within its limit, all at that limit.
fn holders_fit_modes(holders: &[ExportedHolder]) -> bool {
    match holders.first().map(|h| h.mode) {
        None => true,
        Some(LockMode::Exclusive) => holders.len() == 1,
        Some(LockMode::Shared) => holders.iter().all(|h| h.mode == LockMode::Shared),
        Some(m @ LockMode::Semaphore { limit }) => {
            (1..=limits::MAX_SEMAPHORE_LIMIT).contains(&limit)
                && holders.len() <= limit as usize
                && holders.iter().all(|h| h.mode == m)
        }
    }
}
