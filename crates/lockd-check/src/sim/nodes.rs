//! The simulated nodes: each a real lockd-raft `Node` with lockd-server's `Service` on top,
//! started, crashed and restarted by the nemesis, and brought together after healing.

use super::*;

/// Each replica's effect sink: the node's lockd-server wait registry (which answers parked
/// acquires and hands orphaned grants to the janitor), and the audit.
pub(crate) struct SimSink {
    pub(crate) node: NodeId,
    pub(crate) world: Weak<World>,
    pub(crate) waits: Arc<Waits>,
}

impl EffectSink for SimSink {
    fn applied(&self, group: GroupId, effects: &[Effect]) {
        self.waits.applied(group, effects);
    }

    fn reset(&self, group: GroupId) {
        self.waits.reset(group);
    }

    fn applied_entry(
        &self,
        group: GroupId,
        index: u64,
        slot: usize,
        cmd: &Command,
        applied: &Applied,
        table: &LockTable,
    ) {
        if let Some(w) = self.world.upgrade() {
            w.audited(self.node, group, (index, slot), cmd, applied, table);
        }
    }
}

pub(crate) async fn start_node(w: &Arc<World>, id: NodeId) -> anyhow::Result<()> {
    // The founders know each other; a spare knows them and itself, and joins no group by
    // itself (`--initial-cluster-state existing`).
    let peers: BTreeMap<NodeId, String> = (1..=w.cfg.replicas)
        .chain((id > w.cfg.replicas).then_some(id))
        .map(|i| (i, format!("sim-node-{i}")))
        .collect();
    let mut cfg = NodeConfig::new(id, "/nonexistent/lockd-sim", peers);
    cfg.join_existing = id > w.cfg.replicas;
    cfg.storage = Storage::Memory(w.disks[&id].clone());
    cfg.snapshot_every = 200;
    cfg.lock_groups = GROUPS.len() as u32;
    cfg.skip_leader_lease_check = w.cfg.sabotage == Some(Sabotage::LeaderLease);
    cfg.skip_ownership_check = w.cfg.sabotage == Some(Sabotage::Ownership);
    cfg.skip_read_lease_check = w.cfg.sabotage == Some(Sabotage::ReadLease);
    // Clock-rate skew within ±5 %, drawn per incarnation.
    let skew = (w.rand_u64(0..10_001) as f64 - 5_000.0) / 100_000.0;
    cfg.clock_rate = 1.0 + skew;
    if skew.abs() >= 0.01 {
        w.fault(
            "clock_skew",
            format!("node {id} rate {:.4}", cfg.clock_rate),
        );
    }
    let (waits, orphans) = Waits::new();
    let sink = Arc::new(SimSink {
        node: id,
        world: Arc::downgrade(w),
        waits: waits.clone(),
    });
    let node = Node::start_with_transport(cfg, sink, w.net.link(id))
        .await
        .map_err(|e| anyhow::anyhow!("node {id} failed to start: {e}"))?;
    // The node's client API, as `lockd serve` builds it, with ids drawn from the seed.
    let ids = Mutex::new(fastrand::Rng::with_seed(w.rand_u64(0..u64::MAX)));
    let metrics = Arc::new(lockd_server::metrics::Metrics::new());
    let svc = Service::new(node.clone(), waits, metrics, GROUPS.len() as u32)
        .with_id_source(Arc::new(move || lock(&ids).u64(1..u64::MAX)))
        .with_admin_token(Some(ADMIN_TOKEN));
    let svc = Arc::new(svc);
    svc.serve_peer_questions();
    let catch_up = tokio::spawn({
        let svc = svc.clone();
        async move { svc.catch_up_meta().await }
    });
    let janitor = tokio::spawn({
        let svc = svc.clone();
        async move { svc.release_orphans(orphans).await }
    });
    // As `lockd serve` does: read the meta group's records every second, which is how a node
    // learns the draining marks. The rest has nothing to act on here: the sim's groups are the
    // founding ones, set up without group records.
    let reconcile = tokio::spawn(lockd_server::duties::follow_topology(svc.clone()));
    let tasks = vec![
        catch_up.abort_handle(),
        janitor.abort_handle(),
        reconcile.abort_handle(),
    ];
    lock(&w.services).insert(id, (svc, tasks));
    w.net.up(id, node);
    Ok(())
}

/// Stops node `id`'s service tasks (a crash or the end of the run).
pub(crate) fn stop_service(w: &World, id: NodeId) {
    if let Some((_, tasks)) = lock(&w.services).remove(&id) {
        tasks.iter().for_each(tokio::task::AbortHandle::abort);
    }
}

pub(crate) async fn crash_node(w: &Arc<World>, id: NodeId) {
    w.disks[&id].crash();
    stop_service(w, id);
    if let Some(node) = w.net.down(id) {
        node.shutdown().await;
    }
}

/// The leader of `group`: of the replicas that think they lead, the one of the newest term (a
/// replica cut off, or removed from the group while cut off, may still think it leads).
pub(crate) fn leader_of(w: &World, group: GroupId) -> Option<NodeId> {
    (1..=w.node_count())
        .filter_map(|id| {
            let g = w.net.node(id)?.1.group(group)?;
            let st = g.status();
            st.is_leader.then_some((st.term, id))
        })
        .max()
        .map(|(_, id)| id)
}

/// Waits until, in every group, every replica applied the same index (a write on each leader
/// first, so the last entries commit). Returns per (group, node): (applied index, state hash).
/// Per (group, node): (applied index, state hash), once every member agrees.
pub(crate) type Converged = BTreeMap<(GroupId, NodeId), (u64, u64)>;

pub(crate) async fn converge(w: &World) -> Result<Converged, String> {
    let give_up = Instant::now() + Duration::from_secs(30);
    let mut out = BTreeMap::new();
    for group in std::iter::once(lockd_raft::META_GROUP).chain(GROUPS) {
        // Commit something of the current term so every earlier entry is committed too.
        loop {
            if let Some(l) = leader_of(w, group) {
                if let Some((_, node)) = w.net.node(l) {
                    if let Some(g) = node.group(group) {
                        if g.propose(Op::Tick).await.is_ok() {
                            break;
                        }
                    }
                }
            }
            if Instant::now() >= give_up {
                let views: Vec<String> = (1..=w.node_count())
                    .filter_map(|id| {
                        let (_, n) = w.net.node(id)?;
                        let st = n.group(group)?.status();
                        Some(format!(
                            "node {id}: leader {:?} term {} members {:?}",
                            st.leader, st.term, st.members
                        ))
                    })
                    .collect();
                return Err(format!(
                    "group {group}: no leader committed an entry; {views:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        loop {
            // The members as the leader has them (member changes moved replicas around).
            let members: Vec<NodeId> = leader_of(w, group)
                .and_then(|l| w.net.node(l))
                .and_then(|(_, n)| n.memberships().remove(&group))
                .map(|m| m.voters.into_iter().chain(m.learners).collect())
                .unwrap_or_default();
            let mut seen = BTreeMap::new();
            for &id in &members {
                if let Some((_, n)) = w.net.node(id) {
                    if let Some(g) = n.group(group) {
                        seen.insert(id, (g.status().applied_index, g.state_hash()));
                    }
                }
            }
            let first = seen.values().next().copied();
            if !members.is_empty()
                && seen.len() == members.len()
                && seen.values().all(|v| Some(*v) == first)
            {
                out.extend(seen.into_iter().map(|(id, v)| ((group, id), v)));
                break;
            }
            if Instant::now() >= give_up {
                return Err(format!(
                    "group {group}: members {members:?} (leader {:?}), (applied, hash) {seen:?}",
                    leader_of(w, group)
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(out)
}

/// After healing, a call through any node reaches every group, whatever replica that node
/// holds of it (none, a member's, or a stranded one left behind by a member change).
pub(crate) async fn every_node_serves(w: &World) {
    for id in 1..=w.node_count() {
        let Some((_, node)) = w.net.node(id) else {
            continue;
        };
        for group in std::iter::once(lockd_raft::META_GROUP).chain(GROUPS) {
            let served = async {
                loop {
                    if let Some(route) = node.route(group) {
                        // A forwardable command that changes nothing (ticks are the leader's
                        // own, never taken from a peer): closing a session that cannot exist.
                        // Any committed answer shows the call got through.
                        let probe = Op::CloseSession {
                            session: lockd_core::SessionId(0),
                        };
                        if route.propose(probe).await.is_ok() {
                            return;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            };
            if tokio::time::timeout(Duration::from_secs(20), served)
                .await
                .is_err()
            {
                let route = match node.route(group) {
                    Some(lockd_raft::Route::Local(_)) => "local",
                    Some(lockd_raft::Route::Remote(_)) => "remote",
                    None => "none",
                };
                let here = node.group(group).map(|g| {
                    let st = g.status();
                    format!(
                        "leader {:?} term {} members {:?} stranded {} lease {}",
                        st.leader,
                        st.term,
                        st.members,
                        g.is_stranded(),
                        g.lease_held()
                    )
                });
                let real = leader_of(w, group).and_then(|l| {
                    let m = w.net.node(l)?.1.memberships().remove(&group)?;
                    Some(format!(
                        "node {l}: voters {:?} learners {:?}",
                        m.voters, m.learners
                    ))
                });
                w.violation(format!(
                    "liveness: node {id} could not reach group {group} 20 s after healing \
                     (route {route}; its replica: {here:?}; leader {real:?})"
                ));
            }
        }
    }
}

/// After healing, no lost wake-ups: through every node's `Service`, a holder takes a name, a
/// waiter queues for it through the next node, and the holder's release must wake the waiter
/// (a pushed grant, whether the waiter's node has a replica of the name's group or forwards
/// the wait to one that has). Outside the history: these names are only for this check.
pub(crate) async fn every_node_wakes(w: &World) {
    let creds = Credentials::default();
    // A node serves names only as a member of the meta group (it vouches for namespaces and
    // their credentials); the others must say so.
    let mut serving = Vec::new();
    for id in 1..=w.node_count() {
        let Some(svc) = w.service(id) else {
            w.violation(format!("liveness: node {id} is not running after healing"));
            continue;
        };
        // A member's replica catches up within a few rounds of its loop; one that was removed
        // or left behind has been stranded since healing (its leader went silent), and stops
        // serving once the meta group is found answering without it (`catch_up_meta`).
        let mut member = false;
        for _ in 0..50 {
            member = matches!(
                svc.node.route(lockd_raft::META_GROUP),
                Some(lockd_raft::Route::Local(_))
            );
            if member == svc.meta_caught_up() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if member && svc.meta_caught_up() {
            serving.push((id, svc));
            continue;
        }
        if member {
            w.violation(format!(
                "liveness: node {id}, a member of the meta group, has not caught up 5 s after \
                 healing"
            ));
            continue;
        }
        let ttl_ms = TTL.as_millis() as u64;
        match svc.open_session("outsider", ttl_ms, "", &creds).await {
            Err(e) if e.code == ErrorCode::Unavailable && e.message.contains("meta") => {}
            other => w.violation(format!(
                "node {id}, not a member of the meta group, answered an open with {other:?}"
            )),
        }
    }
    let n = serving.len();
    for i in 0..n {
        let ((x, sx), (y, sy)) = (serving[i].clone(), serving[(i + 1) % n].clone());
        let name = format!("wake-{x}");
        let ttl_ms = TTL.as_millis() as u64;
        let round = async {
            let step = |what: &'static str| move |e: ApiError| format!("{what} failed: {e}");
            let a = (sx.open_session("wake-holder", ttl_ms, "", &creds).await)
                .map_err(step("opening the holder's session"))?;
            let b = (sy.open_session("wake-waiter", ttl_ms, "", &creds).await)
                .map_err(step("opening the waiter's session"))?;
            let acquire = |session, wait_ms| AcquireRequest {
                session,
                name: name.clone(),
                owner: "wake".into(),
                mode: LockMode::Exclusive,
                wait_ms,
                reentrant: false,
            };
            let held = (sx.acquire(acquire(a.session, 0), &creds).await)
                .map_err(step("the holder's acquire"))?;
            let AcquireOutcome::Acquired { token, .. } = held else {
                return Ok(format!("the holder did not get {name}: {held:?}"));
            };
            let waiter = sy.acquire(acquire(b.session, 10_000), &creds);
            let release = async {
                // Release once the waiter has had time to queue.
                tokio::time::sleep(Duration::from_millis(500)).await;
                sx.release(a.session, &name, token, &creds).await
            };
            let (woken, released) = tokio::join!(waiter, release);
            released.map_err(step("the release"))?;
            let _ = sx.close_session(a.session, &creds).await;
            let _ = sy.close_session(b.session, &creds).await;
            Ok::<_, String>(match woken.map_err(step("the waiter's acquire"))? {
                AcquireOutcome::Acquired { .. } => String::new(),
                other => format!("the waiter on node {y} was not woken: {other:?}"),
            })
        };
        let what = match tokio::time::timeout(Duration::from_secs(30), round).await {
            Ok(Ok(problem)) if problem.is_empty() => continue,
            Ok(Ok(problem)) => problem,
            Ok(Err(e)) => e,
            Err(_) => "no answer in 30 s".into(),
        };
        let group = sy.route(&name).map(|r| r.id()).ok();
        let views: Vec<String> = std::iter::once(lockd_raft::META_GROUP)
            .chain(GROUPS)
            .map(|g| format!("group {g}: {:?}", group_views(w, g)))
            .collect();
        w.violation(format!(
            "liveness: hand-over of {name} from node {x} to node {y} after healing: {what} \
             (the name's group {group:?}; {views:?})"
        ));
    }
}

/// How every running node sees group `g` (for a liveness violation's message).
fn group_views(w: &World, g: lockd_raft::GroupId) -> Vec<String> {
    (1..=w.node_count())
        .filter_map(|id| {
            let svc = w.service(id)?;
            let Some(grp) = svc.node.group(g) else {
                return Some(format!("node {id}: no replica"));
            };
            let st = grp.status();
            let m = grp_membership(&svc.node, g);
            let route = match svc.node.route(g) {
                Some(lockd_raft::Route::Local(_)) => "local",
                Some(lockd_raft::Route::Remote(_)) => "remote",
                None => "none",
            };
            Some(format!(
                "node {id}: route {route} leader {:?} term {} {m} applied {} stranded {} \
                 serving names {}",
                st.leader,
                st.term,
                st.applied_index,
                grp.is_stranded(),
                svc.meta_caught_up()
            ))
        })
        .collect()
}

fn grp_membership(node: &lockd_raft::Node, g: lockd_raft::GroupId) -> String {
    match node.memberships().remove(&g) {
        Some(m) => format!("voters {:?} learners {:?}", m.voters, m.learners),
        None => "no membership".into(),
    }
}
