//! Groups created on a running cluster, and where a session has a lease.
//!
//! **The meta group's records.** Every lock group has a record: the nodes it is placed on and
//! its *birth epoch*. The founding groups are recorded at epoch 0. A group created later gets
//! the next epoch, and is *ready* once it has been founded (its first command, below); nodes
//! send it sessions, keepalives and buckets only when it is ready. One group is created at a
//! time, so groups become ready in the order of their epochs.
//!
//! **Sessions: a lease per group.** A session is opened in one lock group (its home) and
//! brought into another group by the first acquire there ([`crate::Op::AdoptSession`], with
//! the values it was opened with). Each group keeps its own lease for the session, renewed by
//! keepalives sent to it and ended by its own leader's expiry, so a group's outage ends no
//! lease in another group. A group that has no lease for a session cannot tell "never here"
//! from "ended here": both are [`Presence::NotHere`]. An acquire adopts such a session afresh
//! (a new lease that holds nothing), which is safe because a client counts a group's locks
//! lost once its own deadline for that group passes, before the group can have expired it
//! (docs/INVARIANTS.md, per-group leases).

use std::collections::BTreeMap;

use crate::machine::LockTable;
use crate::topology::*;
use crate::types::{Rejection, Reply, SessionId};

impl LockTable {
    /// Meta group: every lock group's record (empty until the founding groups are recorded).
    pub fn group_records(&self) -> &BTreeMap<u32, GroupRecord> {
        &self.topology.groups
    }

    /// Lock group: the epoch this group was born at (0 for a founding group).
    pub fn birth_epoch(&self) -> u64 {
        self.topology.birth.unwrap_or(0)
    }

    /// Whether this group has a lease for `session` (see the module doc).
    pub fn session_presence(&self, session: SessionId) -> Presence {
        if self.sessions.contains_key(&session) {
            Presence::Live
        } else {
            Presence::NotHere
        }
    }

    /// The rejection for a session this group has no lease for: the caller may adopt it here.
    pub(crate) fn absent_session(&self, session: SessionId) -> Rejection {
        Rejection::SessionNotHere { session }
    }

    /// Meta group: records the founding groups, once (a no-op when any group is recorded).
    pub(crate) fn record_groups(
        &mut self,
        groups: &BTreeMap<u32, Vec<u64>>,
    ) -> Result<Reply, Rejection> {
        if !self.topology.groups.is_empty() {
            return Ok(Reply::GroupsRecorded {
                groups: self.topology.groups.len() as u32,
            });
        }
        for (g, replicas) in groups {
            check_record(*g, replicas)?;
        }
        for (g, replicas) in groups {
            let record = GroupRecord {
                replicas: sorted(replicas),
                born_epoch: 0,
                ready: true,
                placed_at: ConfigId::default(),
            };
            self.topology.groups.insert(*g, record);
        }
        Ok(Reply::GroupsRecorded {
            groups: groups.len() as u32,
        })
    }

    /// Meta group: records a new group placed on `replicas`, not ready yet. Repeating it is a
    /// no-op; another placement for the group, or a second group while one is not ready, is
    /// refused.
    pub(crate) fn create_group(
        &mut self,
        group: u32,
        replicas: &[u64],
    ) -> Result<Reply, Rejection> {
        check_record(group, replicas)?;
        let replicas = sorted(replicas);
        if self.topology.removed.contains_key(&group) {
            return Err(Rejection::GroupRemoved { group });
        }
        if let Some(r) = self.topology.groups.get(&group) {
            if r.replicas == replicas {
                return Ok(Reply::GroupRecorded {
                    group,
                    record: r.clone(),
                });
            }
            return Err(Rejection::GroupExists {
                group,
                replicas: r.replicas.clone(),
            });
        }
        if self.topology.groups.is_empty() {
            return Err(Rejection::InvalidGroup {
                reason: "the founding groups are not recorded yet; retry once the cluster is up"
                    .into(),
            });
        }
        if let Some((g, _)) = self.topology.groups.iter().find(|(_, r)| !r.ready) {
            return Err(Rejection::GroupBeingCreated { group: *g });
        }
        if let Some(n) = replicas.iter().find(|n| self.cluster.retired.contains(n)) {
            return Err(Rejection::NodeRetired { node: *n });
        }
        // A removed group's epoch counts: sessions that carry it must not look older than
        // the next group.
        let newest = (self.topology.groups.values().map(|r| r.born_epoch))
            .chain(self.topology.removed.values().copied())
            .max()
            .unwrap_or(0);
        if newest >= MAX_EPOCH {
            return Err(Rejection::InvalidGroup {
                reason: format!("this cluster has created {MAX_EPOCH} groups, the most it can"),
            });
        }
        let record = GroupRecord {
            replicas,
            born_epoch: newest + 1,
            ready: false,
            placed_at: ConfigId::default(),
        };
        self.topology.groups.insert(group, record.clone());
        Ok(Reply::GroupRecorded { group, record })
    }

    /// Meta group: records that a group's members changed to `replicas`. Idempotent.
    pub(crate) fn set_group_replicas(
        &mut self,
        group: u32,
        replicas: &[u64],
    ) -> Result<Reply, Rejection> {
        check_record(group, replicas)?;
        let r = self
            .topology
            .groups
            .get_mut(&group)
            .ok_or(Rejection::UnknownGroup { group })?;
        r.replicas = sorted(replicas);
        Ok(Reply::GroupRecorded {
            group,
            record: r.clone(),
        })
    }

    /// Meta group: records that group `group` is on `replicas` as of membership config
    /// `placed_at`; a view older than the recorded one changes nothing (see [`Op::PlaceGroup`]).
    ///
    /// [`Op::PlaceGroup`]: crate::Op::PlaceGroup
    pub(crate) fn place_group(
        &mut self,
        group: u32,
        replicas: &[u64],
        placed_at: ConfigId,
    ) -> Result<Reply, Rejection> {
        check_record(group, replicas)?;
        if self.topology.removed.contains_key(&group) {
            return Err(Rejection::GroupRemoved { group });
        }
        let r = self
            .topology
            .groups
            .get_mut(&group)
            .ok_or(Rejection::UnknownGroup { group })?;
        if placed_at >= r.placed_at {
            r.replicas = sorted(replicas);
            r.placed_at = placed_at;
        }
        Ok(Reply::GroupRecorded {
            group,
            record: r.clone(),
        })
    }

    /// Lock group: closes this group for removal (see [`Op::CloseGroup`]). Idempotent.
    ///
    /// [`Op::CloseGroup`]: crate::Op::CloseGroup
    pub(crate) fn close_group(&mut self) -> Result<Reply, Rejection> {
        if self.topology.closed {
            return Ok(Reply::GroupClosed);
        }
        let own = &self.ownership;
        let refuse = |reason: String| Err(Rejection::GroupNotEmpty { reason });
        if own.map_version == 0 {
            return refuse(
                "its buckets were never assigned, so it owns every bucket; move them to other \
                 groups first"
                    .into(),
            );
        }
        if !own.owned.is_empty() {
            return refuse(format!(
                "it owns {} buckets (`lockctl buckets show` lists them); move them to other \
                 groups first",
                own.owned.len(),
            ));
        }
        let outgoing = own.moves.iter().find_map(|(id, m)| match m {
            crate::MoveRecord::Outgoing { to_group, .. } => Some((*id, *to_group)),
            _ => None,
        });
        if let Some((id, to)) = outgoing {
            return refuse(format!(
                "move {id} out of it to group {to} is under way; let it finish (any move call \
                 finishes it) and retry"
            ));
        }
        self.topology.closed = true;
        Ok(Reply::GroupClosed)
    }

    /// Lock group: closed for removal.
    pub fn is_closed(&self) -> bool {
        self.topology.closed
    }

    /// Meta group: removes lock group `group`, which must own no bucket by the shard map
    /// (the server closes the group itself first). Idempotent.
    pub(crate) fn remove_group(&mut self, group: u32) -> Result<Reply, Rejection> {
        if group == 0 {
            return Err(Rejection::InvalidGroup {
                reason: "group 0 is the meta group; it cannot be removed".into(),
            });
        }
        if self.topology.removed.contains_key(&group) {
            return Ok(Reply::GroupRemoved { group });
        }
        let r = self
            .topology
            .groups
            .get(&group)
            .ok_or(Rejection::UnknownGroup { group })?;
        let in_map = match &self.shard_map {
            Some(map) => map.groups.iter().filter(|g| **g == group).count(),
            // Never changed: the founding groups own the initial map's buckets.
            None if r.born_epoch == 0 => 1,
            None => 0,
        };
        if in_map > 0 {
            return Err(Rejection::GroupNotEmpty {
                reason: format!(
                    "the shard map sends {in_map} buckets to group {group}; move them to other \
                     groups first"
                ),
            });
        }
        let born = r.born_epoch;
        self.topology.groups.remove(&group);
        self.topology.removed.insert(group, born);
        Ok(Reply::GroupRemoved { group })
    }

    /// Meta group: the removed lock groups.
    pub fn removed_groups(&self) -> &BTreeMap<u32, u64> {
        &self.topology.removed
    }

    /// Meta group: marks a created group ready (founded). Idempotent.
    pub(crate) fn group_ready(&mut self, group: u32) -> Result<Reply, Rejection> {
        let r = self
            .topology
            .groups
            .get_mut(&group)
            .ok_or(Rejection::UnknownGroup { group })?;
        r.ready = true;
        Ok(Reply::GroupRecorded {
            group,
            record: r.clone(),
        })
    }

    /// Lock group, its first command when created on a running cluster: born at `born_epoch`,
    /// owning no bucket yet (buckets come by moves) as of shard map `map_version`. Repeating it
    /// is a no-op; it is refused in a group that is in use or was founded otherwise.
    pub(crate) fn found_group(
        &mut self,
        born_epoch: u64,
        map_version: u64,
    ) -> Result<Reply, Rejection> {
        let refuse = |reason: String| Err(Rejection::InvalidGroup { reason });
        match self.topology.birth {
            Some(b) if b == born_epoch => return Ok(Reply::GroupFounded { born_epoch }),
            Some(b) => return refuse(format!("this group was founded at epoch {b} already")),
            None => {}
        }
        if born_epoch == 0 || born_epoch > MAX_EPOCH {
            return refuse(format!(
                "born_epoch {born_epoch} must be within 1..={MAX_EPOCH}"
            ));
        }
        if map_version == 0 {
            return refuse("map_version must be at least 1".into());
        }
        if !self.sessions.is_empty() || self.locks.len() != 0 || self.ownership.map_version != 0 {
            return refuse("this group is in use already: only a new group is founded".into());
        }
        self.ownership.map_version = map_version;
        self.ownership.owned = crate::BucketSet::empty();
        self.topology.birth = Some(born_epoch);
        Ok(Reply::GroupFounded { born_epoch })
    }
}

fn check_record(group: u32, replicas: &[u64]) -> Result<(), Rejection> {
    let bad = |reason: String| Err(Rejection::InvalidGroup { reason });
    if group == 0 {
        return bad("group 0 is the meta group; lock groups are 1 and up".into());
    }
    if replicas.is_empty() || replicas.len() > MAX_GROUP_REPLICAS {
        return bad(format!(
            "a group needs 1..={MAX_GROUP_REPLICAS} replicas (3 or 5 for fault tolerance), {} given",
            replicas.len()
        ));
    }
    if replicas.contains(&0) {
        return bad("node ids start at 1".into());
    }
    if sorted(replicas).len() != replicas.len() {
        return bad(format!("replicas {replicas:?} name a node twice"));
    }
    Ok(())
}

fn sorted(v: &[u64]) -> Vec<u64> {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Command, LockMode, Op};

    fn apply(t: &mut LockTable, op: Op) -> Result<Reply, Rejection> {
        t.apply(&Command { now_ms: 1, op }).reply
    }

    fn adopt(session: SessionId) -> Op {
        Op::AdoptSession {
            session,
            client: "c".into(),
            ttl_ms: 0,
            namespace: String::new(),
        }
    }

    fn open(session: SessionId) -> Op {
        Op::OpenSession {
            session,
            client: "c".into(),
            ttl_ms: 0,
            namespace: String::new(),
        }
    }

    fn acquire(session: SessionId, name: &str) -> Op {
        Op::Acquire {
            session,
            name: name.into(),
            owner: "o".into(),
            mode: LockMode::Exclusive,
            wait_ms: 0,
            reentrant: false,
        }
    }

    #[test]
    fn session_ids_keep_63_random_bits_and_are_never_0() {
        assert_eq!(SessionId::random(0), SessionId(1));
        assert_eq!(SessionId::random(u64::MAX), SessionId(u64::MAX));
        assert_eq!(
            SessionId::random(0x8000_0000_0000_0002).0,
            0x8000_0000_0000_0003
        );
    }

    #[test]
    fn groups_are_created_one_at_a_time_with_rising_epochs() {
        let mut t = LockTable::new();
        let create = |g, r: &[u64]| Op::CreateGroup {
            group: g,
            replicas: r.to_vec(),
        };
        assert_eq!(
            apply(&mut t, create(2, &[4])).unwrap_err().code(),
            "invalid_group"
        );
        let founding = BTreeMap::from([(1, vec![3, 1, 2])]);
        assert!(apply(
            &mut t,
            Op::RecordGroups {
                groups: founding.clone()
            }
        )
        .is_ok());
        assert_eq!(t.group_records()[&1].replicas, vec![1, 2, 3]);
        // Recording again (a restart, another founder) changes nothing.
        let other = BTreeMap::from([(1, vec![9])]);
        assert!(apply(&mut t, Op::RecordGroups { groups: other }).is_ok());
        assert_eq!(t.group_records()[&1].replicas, vec![1, 2, 3]);

        let Ok(Reply::GroupRecorded { record, .. }) = apply(&mut t, create(2, &[6, 5, 4])) else {
            panic!("create refused")
        };
        assert_eq!((record.born_epoch, record.ready), (1, false));
        assert!(
            apply(&mut t, create(2, &[4, 5, 6])).is_ok(),
            "a repeat is a no-op"
        );
        assert_eq!(
            apply(&mut t, create(2, &[4, 5])).unwrap_err().code(),
            "group_exists"
        );
        let e = apply(&mut t, create(3, &[4, 5, 6])).unwrap_err();
        assert_eq!(e.code(), "group_creation_in_progress", "{e}");
        assert!(apply(&mut t, Op::GroupReady { group: 2 }).is_ok());
        let Ok(Reply::GroupRecorded { record, .. }) = apply(&mut t, create(3, &[1, 4, 7])) else {
            panic!("create refused")
        };
        assert_eq!(record.born_epoch, 2);
        assert_eq!(
            apply(&mut t, Op::GroupReady { group: 9 })
                .unwrap_err()
                .code(),
            "group_not_found"
        );
        for bad in [
            create(0, &[1]),
            create(4, &[]),
            create(4, &[1, 1]),
            create(4, &[0]),
        ] {
            assert_eq!(apply(&mut t, bad).unwrap_err().code(), "invalid_group");
        }
        let place = |g, r: &[u64]| Op::SetGroupReplicas {
            group: g,
            replicas: r.to_vec(),
        };
        assert!(apply(&mut t, place(2, &[7, 4, 6])).is_ok());
        assert_eq!(t.group_records()[&2].replicas, vec![4, 6, 7]);
        assert_eq!(t.group_records()[&2].born_epoch, 1, "the epoch stays");
        assert_eq!(
            apply(&mut t, place(9, &[1])).unwrap_err().code(),
            "group_not_found"
        );
        assert_eq!(
            apply(&mut t, place(2, &[])).unwrap_err().code(),
            "invalid_group"
        );
        assert!(apply(&mut t, Op::RetireNode { node: 8 }).is_ok());
        assert!(apply(&mut t, Op::GroupReady { group: 3 }).is_ok());
        assert_eq!(
            apply(&mut t, create(4, &[8])).unwrap_err().code(),
            "node_retired"
        );
        let restored = LockTable::restore(&t.snapshot()).unwrap();
        assert_eq!(restored.group_records(), t.group_records());
    }

    #[test]
    fn a_new_group_adopts_older_sessions_and_ends_them_for_good() {
        let mut g = LockTable::new();
        assert!(apply(
            &mut g,
            Op::FoundGroup {
                born_epoch: 2,
                map_version: 5
            }
        )
        .is_ok());
        assert!(apply(
            &mut g,
            Op::FoundGroup {
                born_epoch: 2,
                map_version: 5
            }
        )
        .is_ok());
        assert_eq!(
            apply(
                &mut g,
                Op::FoundGroup {
                    born_epoch: 3,
                    map_version: 5
                }
            )
            .unwrap_err()
            .code(),
            "invalid_group"
        );
        assert_eq!(g.ownership().map_version, 5);
        // A founded group owns no bucket until one moves in.
        let old = SessionId(0xabc1);
        let new = SessionId(0xdef1);
        assert_eq!(g.session_presence(old), Presence::NotHere);
        assert_eq!(g.session_presence(new), Presence::NotHere);
        assert_eq!(
            apply(&mut g, acquire(old, "a")).unwrap_err().code(),
            "wrong_group"
        );

        // Any session may be brought here, once at a time: a lease per group.
        let adopt_old = adopt(old);
        assert!(apply(&mut g, adopt_old.clone()).is_ok());
        assert_eq!(g.session_presence(old), Presence::Live);
        assert!(
            apply(&mut g, adopt_old.clone()).is_ok(),
            "adopting a live session is a no-op"
        );
        assert!(apply(&mut g, Op::CloseSession { session: old }).is_ok());
        assert_eq!(g.session_presence(old), Presence::NotHere);
        assert!(
            apply(&mut g, adopt(new)).is_ok(),
            "a session newer than the group that missed its open is brought here too"
        );
        let restored = LockTable::restore(&g.snapshot()).unwrap();
        assert_eq!(restored.session_presence(old), Presence::NotHere);
        assert_eq!(restored.session_presence(new), Presence::Live);
        assert_eq!(restored.birth_epoch(), 2);

        // A founding group: a session it does not have is not here.
        let mut f = LockTable::new();
        assert_eq!(f.session_presence(old), Presence::NotHere);
        assert!(apply(&mut f, open(new)).is_ok());
        assert_eq!(
            apply(
                &mut f,
                Op::FoundGroup {
                    born_epoch: 1,
                    map_version: 1
                }
            )
            .unwrap_err()
            .code(),
            "invalid_group",
            "a group in use is never founded"
        );
    }

    #[test]
    fn placements_follow_the_newest_config_and_removed_groups_stay_removed() {
        let mut t = LockTable::new();
        let founding = BTreeMap::from([(1, vec![1, 2, 3]), (2, vec![1, 2, 3])]);
        assert!(apply(&mut t, Op::RecordGroups { groups: founding }).is_ok());
        let at = |term, index| ConfigId { term, index };
        let place = |g, r: &[u64], c| Op::PlaceGroup {
            group: g,
            replicas: r.to_vec(),
            placed_at: c,
        };
        assert!(apply(&mut t, place(1, &[4, 2, 3], at(2, 9))).is_ok());
        assert_eq!(t.group_records()[&1].replicas, vec![2, 3, 4]);
        // An older view (a lagging replica, an interrupted call) changes nothing.
        let Ok(Reply::GroupRecorded { record, .. }) =
            apply(&mut t, place(1, &[1, 2, 3], at(1, 40)))
        else {
            panic!("refused")
        };
        assert_eq!(
            (record.replicas, record.placed_at),
            (vec![2, 3, 4], at(2, 9))
        );
        // The same config again may correct it (an admin call placing a node ahead of its add).
        assert!(apply(&mut t, place(1, &[2, 3, 4, 5], at(2, 9))).is_ok());
        assert!(apply(&mut t, place(1, &[2, 3, 5], at(3, 1))).is_ok());
        assert_eq!(t.group_records()[&1].replicas, vec![2, 3, 5]);

        // Removal: refused while the initial map (never changed) gives the group buckets.
        let e = apply(&mut t, Op::RemoveGroup { group: 2 }).unwrap_err();
        assert_eq!(e.code(), "group_not_empty", "{e}");
        let mut map = crate::ShardMap::initial(2);
        map.groups.iter_mut().for_each(|g| *g = 1);
        assert!(apply(&mut t, Op::PutShardMap { map: map.clone() }).is_ok());
        assert!(apply(
            &mut t,
            Op::CreateGroup {
                group: 3,
                replicas: vec![7]
            }
        )
        .is_ok());
        assert!(apply(&mut t, Op::GroupReady { group: 3 }).is_ok());
        let born_3 = t.group_records()[&3].born_epoch;
        for g in [2, 3] {
            let r = apply(&mut t, Op::RemoveGroup { group: g });
            assert_eq!(r, Ok(Reply::GroupRemoved { group: g }));
            let again = apply(&mut t, Op::RemoveGroup { group: g });
            assert_eq!(again, Ok(Reply::GroupRemoved { group: g }), "idempotent");
        }
        assert_eq!(t.group_records().keys().collect::<Vec<_>>(), vec![&1]);
        let e = apply(&mut t, Op::RemoveGroup { group: 1 }).unwrap_err();
        assert_eq!(
            e.code(),
            "group_not_empty",
            "the map sends group 1 every bucket"
        );
        assert_eq!(
            apply(&mut t, Op::RemoveGroup { group: 0 })
                .unwrap_err()
                .code(),
            "invalid_group"
        );
        assert_eq!(
            apply(&mut t, Op::RemoveGroup { group: 8 })
                .unwrap_err()
                .code(),
            "group_not_found"
        );
        // An id is never used again, and the next group is born after the removed one.
        let create = Op::CreateGroup {
            group: 3,
            replicas: vec![7],
        };
        assert_eq!(apply(&mut t, create).unwrap_err().code(), "group_removed");
        assert_eq!(
            apply(&mut t, place(3, &[7], at(9, 9))).unwrap_err().code(),
            "group_removed"
        );
        let Ok(Reply::GroupRecorded { record, .. }) = apply(
            &mut t,
            Op::CreateGroup {
                group: 4,
                replicas: vec![7],
            },
        ) else {
            panic!("refused")
        };
        assert_eq!(record.born_epoch, born_3 + 1);

        let restored = LockTable::restore(&t.snapshot()).unwrap();
        assert_eq!(restored.group_records(), t.group_records());
        assert_eq!(restored.removed_groups(), t.removed_groups());
    }

    #[test]
    fn an_older_session_in_a_new_group_is_not_here_until_adopted() {
        let mut g = LockTable::new();
        assert!(apply(
            &mut g,
            Op::FoundGroup {
                born_epoch: 1,
                map_version: 1
            }
        )
        .is_ok());
        let old = SessionId(0x77);
        let e = apply(
            &mut g,
            Op::Release {
                session: old,
                name: "x".into(),
                token: 1,
            },
        );
        assert_eq!(e.unwrap_err().code(), "wrong_group");
        assert_eq!(g.absent_session(old).code(), "session_not_here");
    }

    /// An acquire that adopts its session (`AdoptAndAcquire`) keeps the adoption only when it
    /// is granted or queued: a busy or refused one leaves the group as it was.
    #[test]
    fn an_adopting_acquire_keeps_the_session_only_if_granted_or_queued() {
        use crate::LockEvent;
        let adopting = |session: SessionId, name: &str, wait_ms: u64| {
            let acquire = Op::Acquire {
                session,
                name: name.into(),
                owner: "o".into(),
                mode: LockMode::Exclusive,
                wait_ms,
                reentrant: false,
            };
            acquire.adopting("c".into(), 0, String::new())
        };
        let mut g = LockTable::new();
        let (holder, other, third) = (SessionId(0x11), SessionId(0x21), SessionId(0x31));
        assert!(apply(&mut g, open(holder)).is_ok());
        assert!(matches!(
            apply(&mut g, acquire(holder, "a")),
            Ok(Reply::Acquired { .. })
        ));
        let before = g.snapshot();
        // Busy (a try-lock of a held name), refused (a bad owner): no trace.
        assert!(matches!(
            apply(&mut g, adopting(other, "a", 0)),
            Ok(Reply::Busy { .. })
        ));
        assert_eq!(g.session_presence(other), Presence::NotHere);
        let mut bad = adopting(other, "b", 0);
        if let Op::AdoptAndAcquire { owner, .. } = &mut bad {
            *owner = "o".repeat(crate::limits::MAX_OWNER_BYTES + 1);
        }
        assert!(apply(&mut g, bad).is_err());
        assert_eq!(
            g.snapshot(),
            before,
            "a busy or refused adopting acquire changed the state"
        );
        // Granted: adopted, and its lease starts before the grant's events.
        let out = g.apply(&Command {
            now_ms: 1,
            op: adopting(other, "b", 0),
        });
        assert!(matches!(out.reply, Ok(Reply::Acquired { .. })));
        assert!(matches!(
            out.events.first(),
            Some(LockEvent::SessionAdopted { session, .. }) if *session == other
        ));
        assert_eq!(g.session_presence(other), Presence::Live);
        // Queued: adopted too (the wait needs a lease to live under).
        assert!(matches!(
            apply(&mut g, adopting(third, "a", 5_000)),
            Ok(Reply::Queued { .. })
        ));
        assert_eq!(g.session_presence(third), Presence::Live);
        // A session that has a lease here already is refused, and nothing changes: a success
        // means this very command started the session's lease here, which the service tells
        // the client (it counts that lease from the request's send).
        let before = g.snapshot();
        assert_eq!(
            apply(&mut g, adopting(holder, "c", 0)),
            Err(Rejection::SessionExists { session: holder })
        );
        assert_eq!(g.snapshot(), before);
    }
}
