//! Moving buckets between lock groups while their locks are in use. The protocol (freeze,
//! import above the sender's revision, drop, abort) and its rules are lockd-core's
//! `ownership.rs`; this drives its steps from the admin API, one chunk of buckets at a time.
//!
//! Nothing about a move is kept outside the groups: each step is recorded in the replicated
//! state of the group it changes, under the move's id. So a mover that dies half-way (its node
//! stopped, the call timed out) leaves moves that the next move call, on any node, finds (every
//! group's `Outgoing` records) and finishes first: import (idempotent), flip the map, drop. A
//! move whose import was cancelled is thawed instead. No retry order leaves two owners.

use tokio::time::Instant;

use lockd_core::{BucketSet, MoveId, MoveRecord, Op, Reply, ShardMap, BUCKETS};
use lockd_raft::{GroupId, META_GROUP};

use crate::ask::{answer_of, Query};
use crate::error::{ApiError, ErrorCode};
use crate::service::{Credentials, Service};

/// How often a node that leads the meta group looks for moves left half done.
pub const RESUME_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// One look for moves a mover left half done (its node crashed, its call timed out): those
/// already under way at the previous look (`seen`, updated here) are finished or rolled back,
/// so that their buckets do not stay frozen until someone moves buckets again. A move is left
/// alone at its first sighting, so a live mover is not raced without need (and if it is, every
/// step is idempotent). Returns how many were finished.
pub async fn resume_round<H: MoveHost>(h: &H, seen: &mut Vec<MoveId>) -> Result<u32, ApiError> {
    let mut pending = Vec::new();
    for g in h.lock_groups() {
        pending.extend(h.outgoing_moves(g).await?.into_iter().map(|(id, ..)| id));
    }
    let stale = pending.iter().any(|id| seen.contains(id));
    *seen = pending;
    if !stale {
        return Ok(0);
    }
    let mut sum = MoveSummary::default();
    resume_moves(h, &mut sum).await?;
    seen.clear();
    Ok(sum.resumed)
}

/// Every node runs this; it acts only while the node leads the meta group, so a healthy
/// cluster has one janitor at a time.
pub async fn resume_janitor(svc: std::sync::Arc<Service>) {
    let mut seen = Vec::new();
    loop {
        tokio::time::sleep(RESUME_EVERY).await;
        let leads_meta = svc
            .node
            .group(META_GROUP)
            .is_some_and(|g| g.status().is_leader);
        if !leads_meta {
            seen.clear();
            continue;
        }
        match resume_round(&*svc, &mut seen).await {
            Ok(0) => {}
            Ok(n) => tracing::warn!(resumed = n, "finished bucket moves left half done"),
            Err(e) => {
                tracing::warn!(error = %e, "a bucket move left half done is not finished yet")
            }
        }
    }
}

/// Buckets per move step: a step freezes its buckets for about three commits (import, map,
/// drop), and its export rides one log entry (~100 bytes per held lock).
pub const CHUNK_BUCKETS: usize = 16;

/// One lock group's buckets, by the map and by its own replicated record.
#[derive(Clone, Debug)]
pub struct GroupBuckets {
    pub group: GroupId,
    /// The buckets the shard map sends to this group.
    pub in_map: BucketSet,
    /// The buckets the group itself says it owns (equal to `in_map` unless a move is under way).
    pub owned: BucketSet,
    /// Buckets frozen here for a move under way.
    pub frozen: BucketSet,
}

/// The shard map and every group's ownership.
#[derive(Clone, Debug)]
pub struct ShardView {
    pub map_version: u64,
    pub groups: Vec<GroupBuckets>,
}

/// What a move call did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MoveSummary {
    /// Move steps (chunks of at most [`CHUNK_BUCKETS`] buckets) run by this call.
    pub chunks: u32,
    /// Buckets that changed group.
    pub buckets: u32,
    /// Names with holders or a lock-delay carried over, and their holders.
    pub locks: u32,
    pub holders: u32,
    /// Waits ended in the sending group, re-queued by their nodes at the new owner.
    pub waits_requeued: u32,
    /// Interrupted moves found and finished (or thawed, if their import had been cancelled).
    pub resumed: u32,
    /// The shard map version after the move.
    pub map_version: u64,
    pub elapsed_ms: u64,
}

/// What a mover needs from where it runs: a node's service (the admin API) or the simulator,
/// which drives the same steps through its in-process nodes. Every method reaches the group's
/// leader (or, for reads, is linearizable).
pub trait MoveHost: Sync {
    /// The lock groups (1..=G).
    fn lock_groups(&self) -> Vec<GroupId>;
    /// Proposes `op` on group `group`.
    fn propose_on(
        &self,
        group: GroupId,
        op: Op,
    ) -> impl std::future::Future<Output = Result<Reply, ApiError>> + Send;
    /// Group `group`'s record of move `id`.
    fn move_record(
        &self,
        group: GroupId,
        id: MoveId,
    ) -> impl std::future::Future<Output = Result<Option<MoveRecord>, ApiError>> + Send;
    /// Group `group`'s moves under way out of it: (id, receiving group, buckets).
    fn outgoing_moves(
        &self,
        group: GroupId,
    ) -> impl std::future::Future<Output = Result<Vec<(MoveId, u32, BucketSet)>, ApiError>> + Send;
    /// The shard map as the meta group's leader has it.
    fn shard_map(&self) -> impl std::future::Future<Output = Result<ShardMap, ApiError>> + Send;
    /// A fresh move id (random; the simulator draws it from its seed).
    fn new_move_id(&self) -> MoveId {
        (rand::random::<u64>() >> 1).max(1)
    }
    /// Whether the meta group (its leader) says lock group `group` was removed.
    fn group_removed(
        &self,
        group: GroupId,
    ) -> impl std::future::Future<Output = Result<bool, ApiError>> + Send {
        let _ = group;
        async { Ok(false) }
    }
}

impl MoveHost for Service {
    fn lock_groups(&self) -> Vec<GroupId> {
        self.lock_group_ids()
    }

    fn new_move_id(&self) -> MoveId {
        (self.new_id() >> 1).max(1)
    }

    async fn propose_on(&self, group: GroupId, op: Op) -> Result<Reply, ApiError> {
        self.propose(&self.route_of(group)?, op).await
    }

    async fn move_record(
        &self,
        group: GroupId,
        id: MoveId,
    ) -> Result<Option<MoveRecord>, ApiError> {
        let r = self.route_of(group)?;
        Ok(answer_of!(self, &r, Query::MoveRecord { move_id: id }, MoveRecord)?.map(|r| *r))
    }

    async fn outgoing_moves(
        &self,
        group: GroupId,
    ) -> Result<Vec<(MoveId, u32, BucketSet)>, ApiError> {
        answer_of!(
            self,
            &self.route_of(group)?,
            Query::OutgoingMoves,
            OutgoingMoves
        )
    }

    async fn group_removed(&self, group: GroupId) -> Result<bool, ApiError> {
        let meta = self.route_of(META_GROUP)?;
        let removed = answer_of!(self, &meta, Query::RemovedGroups, RemovedGroups)?;
        Ok(removed.contains_key(&group))
    }

    async fn shard_map(&self) -> Result<ShardMap, ApiError> {
        let meta = self.route_of(META_GROUP)?;
        let r = self.query(&meta, Query::ShardMap).await?;
        match r {
            crate::ask::Answer::ShardMap(Some(m)) => Ok(*m),
            crate::ask::Answer::ShardMap(None) => Err(ApiError::new(
                ErrorCode::Unavailable,
                "the shard map is not set yet",
            )),
            _ => Err(crate::ask::unexpected("ShardMap")),
        }
    }
}

impl Service {
    /// The shard map and each group's ownership, read from their leaders.
    pub async fn shard_view(&self, creds: &Credentials) -> Result<ShardView, ApiError> {
        self.require_admin(creds, "reading the shard map")?;
        let map = self.shard_map().await?;
        let mut groups = Vec::new();
        for g in self.lock_group_ids() {
            let own = answer_of!(self, &self.route_of(g)?, Query::Ownership, Ownership)?;
            groups.push(GroupBuckets {
                group: g,
                in_map: (0..BUCKETS)
                    .filter(|b| map.groups[*b as usize] == g)
                    .collect(),
                owned: own.owned,
                frozen: own.frozen,
            });
        }
        Ok(ShardView {
            map_version: map.version,
            groups,
        })
    }

    /// Moves `buckets` to lock group `to`, in chunks, while they are in use; finishes any
    /// interrupted move first. Buckets already in `to` are skipped, so the same call again
    /// does nothing more: it is idempotent.
    pub async fn move_buckets(
        &self,
        creds: &Credentials,
        buckets: &BucketSet,
        to: GroupId,
    ) -> Result<MoveSummary, ApiError> {
        self.require_admin(creds, "moving buckets")?;
        let mut groups = self.lock_group_ids();
        if !groups.contains(&to) {
            // A group created a moment ago, through another node: read the records first.
            let _ = self.reconcile_topology().await;
            groups = self.lock_group_ids();
        }
        if !groups.contains(&to) {
            return Err(ApiError::new(
                crate::error::ErrorCode::GroupNotFound,
                format!("to_group: there is no lock group {to} (lock groups are {groups:?})"),
            ));
        }
        if buckets.is_empty() {
            return Err(ApiError::bad_request("buckets: no bucket given"));
        }
        move_buckets(self, buckets, to).await
    }
}

/// Moves `buckets` to lock group `to` (which must exist), in chunks of [`CHUNK_BUCKETS`],
/// finishing any interrupted move first; buckets already in `to` are skipped.
pub async fn move_buckets<H: MoveHost>(
    h: &H,
    buckets: &BucketSet,
    to: GroupId,
) -> Result<MoveSummary, ApiError> {
    let started = Instant::now();
    let mut sum = MoveSummary::default();
    resume_moves(h, &mut sum).await?;
    let map = h.shard_map().await?;
    for from in h.lock_groups().into_iter().filter(|g| *g != to) {
        let mine: Vec<u16> = buckets
            .iter()
            .filter(|b| map.groups[*b as usize] == from)
            .collect();
        for chunk in mine.chunks(CHUNK_BUCKETS) {
            let chunk: BucketSet = chunk.iter().copied().collect();
            let id = h.new_move_id();
            let freeze = Op::FreezeBuckets {
                move_id: id,
                to_group: to,
                buckets: chunk.clone(),
            };
            let Reply::BucketsFrozen {
                locks,
                holders,
                waits_ended,
            } = h.propose_on(from, freeze).await?
            else {
                return Err(unexpected("freeze"));
            };
            tracing::info!(move_id = id, from, to, buckets = %chunk, locks, "buckets frozen");
            sum.chunks += 1;
            sum.locks += locks;
            sum.holders += holders;
            sum.waits_requeued += waits_ended;
            if finish_move(h, from, id, to, &chunk).await? {
                sum.buckets += chunk.len() as u32;
            }
        }
    }
    sum.map_version = h.shard_map().await?.version;
    sum.elapsed_ms = started.elapsed().as_millis() as u64;
    Ok(sum)
}

/// Finishes every move some group still has frozen (a mover that stopped half-way).
pub async fn resume_moves<H: MoveHost>(h: &H, sum: &mut MoveSummary) -> Result<(), ApiError> {
    for from in h.lock_groups() {
        for (id, to, buckets) in h.outgoing_moves(from).await? {
            tracing::warn!(move_id = id, from, to, %buckets, "finishing an interrupted bucket move");
            finish_move(h, from, id, to, &buckets).await?;
            sum.resumed += 1;
        }
    }
    Ok(())
}

/// Steps 2–4 of move `id` (frozen in `from`): import into `to`, flip the map, drop from
/// `from`. Each is idempotent. Returns false if the import had been cancelled, in which case
/// the buckets are thawed in `from` instead (the abort rolls back, never forward).
pub async fn finish_move<H: MoveHost>(
    h: &H,
    from: GroupId,
    id: MoveId,
    to: GroupId,
    buckets: &BucketSet,
) -> Result<bool, ApiError> {
    let export = match h.move_record(from, id).await? {
        Some(MoveRecord::Outgoing { export, .. }) => export,
        Some(MoveRecord::Dropped { .. }) => return Ok(true),
        other => {
            return Err(ApiError::new(
                ErrorCode::MoveConflict,
                format!("bucket move {id}: group {from} records it as {other:?}"),
            ))
        }
    };
    let next_version = h.shard_map().await?.version + 1;
    let import = Op::ImportBuckets {
        move_id: id,
        from_group: from,
        buckets: buckets.clone(),
        map_version: next_version,
        export,
    };
    match h.propose_on(to, import).await {
        Ok(_) => {}
        Err(e) if e.code == ErrorCode::MoveConflict && e.message.contains("cancelled") => {
            h.propose_on(from, Op::ThawBuckets { move_id: id }).await?;
            tracing::warn!(move_id = id, "the import was cancelled: buckets thawed");
            return Ok(false);
        }
        // A removed group was closed before it was removed, and every move toward it frozen
        // before the close was rolled back then (`Service::remove_group`): this one was frozen
        // after, so the group never took it.
        Err(e) if h.group_removed(to).await.unwrap_or(false) => {
            h.propose_on(from, Op::ThawBuckets { move_id: id }).await?;
            tracing::warn!(move_id = id, to, error = %e, "the receiving group was removed: buckets thawed");
            return Ok(false);
        }
        Err(e) => return Err(e),
    }
    let version = flip_map(h, buckets, to).await?;
    let drop = Op::DropBuckets {
        move_id: id,
        map_version: version,
    };
    h.propose_on(from, drop).await?;
    Ok(true)
}

/// Points `buckets` at `to` in the shard map (a compare-and-set on the map's version, retried
/// if another change got in first). Returns the map version that does.
async fn flip_map<H: MoveHost>(h: &H, buckets: &BucketSet, to: GroupId) -> Result<u64, ApiError> {
    for _ in 0..20 {
        let mut map = h.shard_map().await?;
        if buckets.iter().all(|b| map.groups[b as usize] == to) {
            return Ok(map.version);
        }
        for b in buckets.iter() {
            map.groups[b as usize] = to;
        }
        map.version += 1;
        let version = map.version;
        match h.propose_on(META_GROUP, Op::PutShardMap { map }).await {
            Ok(_) => return Ok(version),
            Err(e) if e.code == ErrorCode::InvalidShardMap => continue, // another change first
            Err(e) => return Err(e),
        }
    }
    Err(ApiError::new(
        ErrorCode::Unavailable,
        "the shard map kept changing under the move; retry",
    )
    .retry_after(1_000))
}

fn unexpected(step: &str) -> ApiError {
    ApiError::unexpected(step, None)
}
