//! Topology in the simulation: the shard map, bucket ownership and moves, driven by
//! lockd-server's own mover over the simulated nodes.

use super::*;

/// The mover's view of the simulated cluster: each call goes to a live node and is retried
/// there while no leader answers, as a node's service would.
pub(crate) struct SimMover<'a> {
    w: &'a Arc<World>,
}

pub(crate) fn api_error(e: GroupError) -> lockd_server::error::ApiError {
    e.into()
}

impl SimMover<'_> {
    async fn on_group<T, F, Fut>(
        &self,
        group: GroupId,
        f: F,
    ) -> Result<T, lockd_server::error::ApiError>
    where
        F: Fn(Arc<lockd_raft::Group>) -> Fut,
        Fut: std::future::Future<Output = Result<T, GroupError>>,
    {
        let give_up = Instant::now() + Duration::from_secs(10);
        let mut last = GroupError::NoLeader { retry_after_ms: 0 };
        while Instant::now() < give_up {
            let home = leader_of(self.w, group).unwrap_or_else(|| self.w.any_node());
            match client_call(self.w, home, group, &f).await {
                Some(Ok(v)) => return Ok(v),
                Some(Err(e @ (GroupError::NoLeader { .. } | GroupError::ShuttingDown))) => last = e,
                Some(Err(e)) => return Err(api_error(e)),
                None => last = GroupError::Timeout,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(api_error(last))
    }
}

impl lockd_server::moves::MoveHost for SimMover<'_> {
    fn lock_groups(&self) -> Vec<GroupId> {
        GROUPS.to_vec()
    }

    async fn propose_on(
        &self,
        group: GroupId,
        op: Op,
    ) -> Result<Reply, lockd_server::error::ApiError> {
        let mut op = op;
        if let (Some(Sabotage::RevisionFloor), Op::ImportBuckets { export, .. }) =
            (self.w.cfg.sabotage, &mut op)
        {
            export.revision = 0; // SABOTAGE: the floor is not carried over
        }
        let r = self
            .on_group(group, |g| {
                let op = op.clone();
                async move { g.propose(op).await }
            })
            .await?;
        Ok(r?)
    }

    async fn move_record(
        &self,
        group: GroupId,
        id: lockd_core::MoveId,
    ) -> Result<Option<lockd_core::MoveRecord>, lockd_server::error::ApiError> {
        self.on_group(group, |g| async move {
            g.read(move |t| t.move_record(id).cloned()).await
        })
        .await
    }

    async fn outgoing_moves(
        &self,
        group: GroupId,
    ) -> Result<Vec<(lockd_core::MoveId, u32, lockd_core::BucketSet)>, lockd_server::error::ApiError>
    {
        self.on_group(
            group,
            |g| async move { g.read(|t| t.outgoing_moves()).await },
        )
        .await
    }

    async fn shard_map(&self) -> Result<lockd_core::ShardMap, lockd_server::error::ApiError> {
        let map = self
            .on_group(lockd_raft::META_GROUP, |g| async move {
                g.read(|t| t.shard_map().cloned()).await
            })
            .await?;
        map.ok_or_else(|| {
            lockd_server::error::ApiError::new(
                lockd_server::error::ErrorCode::Unavailable,
                "the shard map is not set",
            )
        })
    }

    fn new_move_id(&self) -> lockd_core::MoveId {
        self.w.rand_u64(1..u64::MAX >> 1)
    }
}

/// Sets the shard map and each group's buckets, as `lockd_server`'s bootstrap does.
pub(crate) async fn bootstrap(w: &Arc<World>) -> anyhow::Result<()> {
    let mover = SimMover { w };
    let map = lockd_core::ShardMap::initial(GROUPS.len() as u32);
    let put = Op::PutShardMap { map: map.clone() };
    let r = mover
        .on_group(lockd_raft::META_GROUP, |g| {
            let put = put.clone();
            async move { g.propose(put).await }
        })
        .await;
    anyhow::ensure!(
        matches!(r, Ok(Ok(_))),
        "setting the shard map failed: {r:?}"
    );
    for g in GROUPS {
        let buckets: lockd_core::BucketSet = (0..lockd_core::BUCKETS)
            .filter(|b| map.groups[*b as usize] == g)
            .collect();
        let op = Op::AssignBuckets {
            buckets,
            map_version: map.version,
        };
        let r = mover
            .on_group(g, |grp| {
                let op = op.clone();
                async move { grp.propose(op).await }
            })
            .await;
        anyhow::ensure!(
            matches!(r, Ok(Ok(_))),
            "assigning group {g}'s buckets failed: {r:?}"
        );
    }
    Ok(())
}

/// What every lockd node runs (`lockd_server::moves::resume_janitor`): a move left half done by
/// a crash is finished (or rolled back) without waiting for the next move call, so its buckets
/// do not stay frozen.
pub(crate) async fn move_janitor(w: Arc<World>) {
    let mut seen = Vec::new();
    while !w.stop.load(Ordering::Relaxed) {
        tokio::time::sleep(lockd_server::moves::RESUME_EVERY).await;
        let r = lockd_server::moves::resume_round(&SimMover { w: &w }, &mut seen).await;
        if let Ok(n @ 1..) = r {
            w.fault("move_resumed", format!("{n} move(s)"));
        }
    }
}

/// One topology fault: a name's bucket moves to the other group, through lockd-server's mover
/// (which first finishes any move an earlier fault left half done). One in four is aborted
/// after the freeze instead: the receiving group refuses the import for good, and the next
/// move call thaws the bucket in the sending group.
pub(crate) async fn move_fault(w: &Arc<World>) {
    use lockd_server::moves::MoveHost;
    let mover = SimMover { w };
    let name = NAMES[w.rand_u64(0..NAMES.len() as u64) as usize];
    let bucket = lockd_core::bucket_of(name);
    let Ok(map) = mover.shard_map().await else {
        return;
    };
    let from = map.groups[bucket as usize];
    let to = GROUPS.into_iter().find(|g| *g != from).unwrap_or(GROUPS[0]);
    let buckets: lockd_core::BucketSet = [bucket].into_iter().collect();
    if w.chance(0.25) {
        let id = mover.new_move_id();
        let freeze = Op::FreezeBuckets {
            move_id: id,
            to_group: to,
            buckets,
        };
        if matches!(
            mover.propose_on(from, freeze).await,
            Ok(Reply::BucketsFrozen { .. })
        ) {
            let cancel = mover.propose_on(to, Op::CancelImport { move_id: id }).await;
            w.fault(
                "move_abort",
                format!("{name} {from}->{to}: {:?}", cancel.map(|_| ())),
            );
            let mut sum = lockd_server::moves::MoveSummary::default();
            let _ = lockd_server::moves::resume_moves(&mover, &mut sum).await;
        }
        return;
    }
    let r = lockd_server::moves::move_buckets(&mover, &buckets, to).await;
    let what = match &r {
        Ok(s) => format!(
            "{} bucket(s), {} holder(s), {} resumed",
            s.buckets, s.holders, s.resumed
        ),
        Err(e) => format!("stopped: {}", e.message),
    };
    w.fault("move", format!("{name} {from}->{to}: {what}"));
}
