//! Lock groups created on a running cluster (`lockd-core`'s `topology.rs` has the rules).
//!
//! - **The node's view.** Each node reads the meta group's group records every
//!   [`RECONCILE_EVERY`] (and right after a create call it serves): it hosts a replica of each
//!   created group placed on it (the lowest-id node placed on it initialises its membership),
//!   and knows where the others are. Sessions, keepalives and buckets go to *ready* groups only.
//! - **Creating a group** ([`Service::create_group`]): record it in the meta group (not ready),
//!   wait until its replicas have elected a leader, found it (born at its epoch, owning no
//!   bucket, with the meta group's namespaces), then mark it ready. Every step is idempotent,
//!   so repeating the call after a failure finishes it. Buckets then move to it by moves.
//! - **Sessions new to a group** are adopted there by their first acquire
//!   (`Op::AdoptAndAcquire`, with the values `Service::session_opening` reads).

use std::collections::BTreeMap;
use std::time::Duration;

use lockd_core::{GroupRecord, Op, Reply, SessionId};
use lockd_raft::{GroupId, MemberCall, NodeId, Route, META_GROUP};
use tokio::time::Instant;

use crate::ask::{answer_of, unexpected, Query};
use crate::error::{ApiError, ErrorCode};
use crate::service::{Credentials, Service};

/// How often a node reads the meta group's group records.
pub const RECONCILE_EVERY: Duration = Duration::from_secs(1);
/// How long a create call waits for the new group to elect a leader.
const FOUND_WAIT: Duration = Duration::from_secs(60);

impl Service {
    /// The lock groups sessions, keepalives and buckets go to: the ready ones (before the
    /// founding groups are recorded, 1..=G).
    pub(crate) fn lock_group_ids(&self) -> Vec<GroupId> {
        let records = self.records.read().expect("records poisoned");
        if records.is_empty() {
            // Not read yet: the local meta replica's, if it has them (a founding group may
            // have been removed since the cluster was founded).
            let local = self.node.group(META_GROUP).map(|m| {
                m.read_local(|t| {
                    let r = t.group_records();
                    r.iter().filter(|(_, r)| r.ready).map(|(g, _)| *g).collect()
                })
            });
            return match local {
                Some(ids) if !Vec::is_empty(&ids) => ids,
                _ => (1..=self.lock_groups).collect(),
            };
        }
        records
            .iter()
            .filter(|(_, r)| r.ready)
            .map(|(g, _)| *g)
            .collect()
    }

    /// Every node this one knows of in the cluster (the meta group's members), with their
    /// addresses learnt: calls to a created group go to nodes this one may never have called.
    fn cluster_nodes(&self) -> Vec<NodeId> {
        let addrs = self
            .node
            .memberships()
            .remove(&META_GROUP)
            .map(|m| m.addrs)
            .unwrap_or_default();
        for (n, a) in &addrs {
            self.node.learn_addr(*n, a);
        }
        addrs.into_keys().collect()
    }

    /// Learns where group `id` is from the records (the local meta replica's, else the last
    /// ones read), if they have it.
    pub(crate) fn know_recorded_group(&self, id: GroupId) {
        let local = self
            .node
            .group(META_GROUP)
            .and_then(|m| m.read_local(|t| t.group_records().get(&id).cloned()));
        let record = local.or_else(|| {
            self.records
                .read()
                .expect("records poisoned")
                .get(&id)
                .cloned()
        });
        if let Some(r) = record {
            self.node.know_group(id, &r.replicas, &self.cluster_nodes());
        }
    }

    /// Reads the meta group's records and acts on them (see the module doc).
    pub async fn reconcile_topology(&self) -> Result<(), ApiError> {
        let meta = self.route_of(META_GROUP)?;
        let (records, draining, removed) = match &meta {
            Route::Local(g) => g.read_local(|t| {
                let removed = t.removed_groups().clone();
                (t.group_records().clone(), t.draining_nodes(), removed)
            }),
            Route::Remote(_) => (
                answer_of!(self, &meta, Query::Groups, Groups)?,
                answer_of!(self, &meta, Query::Draining, Draining)?,
                answer_of!(self, &meta, Query::RemovedGroups, RemovedGroups)?,
            ),
        };
        self.node.set_draining(draining.into_iter().collect());
        for &id in removed.keys() {
            if self.node.group(id).is_some() || self.node.route(id).is_some() {
                if let Err(e) = self.node.unhost_group(id).await {
                    tracing::warn!(group = id, error = %e, "could not set a removed group's data aside");
                }
            }
        }
        self.heal_placements(&meta, &records).await;
        let me = self.node.node_id();
        for (&id, r) in &records {
            // The founding groups are hosted from the founding placement (`Node::start`), and
            // routed from it unless this node is added to one later: then it hosts it here.
            let hosted = self.node.group(id).is_some();
            if r.born_epoch == 0 && (hosted || !r.replicas.contains(&me)) {
                continue;
            }
            if !r.replicas.contains(&me) {
                self.node.know_group(id, &r.replicas, &self.cluster_nodes());
                continue;
            }
            let initialiser = r.replicas.first() == Some(&me) && !r.ready;
            let member = matches!(self.node.route(id), Some(Route::Local(_)));
            if hosted && (member || !initialiser) {
                continue;
            }
            let members = if initialiser {
                self.addresses(&r.replicas).await?
            } else {
                BTreeMap::new()
            };
            self.node
                .host_group(id, &members, initialiser)
                .await
                .map_err(|e| ApiError::new(ErrorCode::Unavailable, e.to_string()))?;
            // Calls to it from here go to the other replicas until this one is a member.
            self.node.know_group(id, &r.replicas, &self.cluster_nodes());
        }
        *self.records.write().expect("records poisoned") = records;
        Ok(())
    }

    /// For each group this node leads: if its membership changed since the meta group's record
    /// (an admin call interrupted between the change and the record), record the members now.
    /// The record's version makes a stale view harmless, so several leaders may do this at once.
    async fn heal_placements(&self, meta: &Route, records: &BTreeMap<GroupId, GroupRecord>) {
        let me = self.node.node_id();
        for (id, m) in self.node.memberships() {
            let Some(r) = records.get(&id) else {
                continue;
            };
            if m.leader != Some(me) || m.joint || m.config_id <= r.placed_at {
                continue;
            }
            let members = m.members();
            if members == r.replicas || members.is_empty() {
                continue;
            }
            let op = Op::PlaceGroup {
                group: id,
                replicas: members.clone(),
                placed_at: m.config_id,
            };
            match self.propose(meta, op).await {
                Ok(_) => tracing::info!(
                    group = id,
                    recorded = ?r.replicas,
                    members = ?members,
                    config = %m.config_id,
                    "the group's record follows its membership"
                ),
                Err(e) => {
                    tracing::debug!(group = id, error = %e, "could not update a group record")
                }
            }
        }
    }

    /// The peer address of each of `nodes`, from the meta group's membership.
    async fn addresses(&self, nodes: &[NodeId]) -> Result<BTreeMap<NodeId, String>, ApiError> {
        let mut addrs = self
            .node
            .memberships()
            .remove(&META_GROUP)
            .map(|m| m.addrs)
            .unwrap_or_default();
        if nodes.iter().any(|n| !addrs.contains_key(n)) {
            addrs = self
                .node
                .member_call(META_GROUP, MemberCall::Describe)
                .await?
                .addrs;
        }
        nodes
            .iter()
            .map(|n| {
                let a = addrs.get(n).cloned().ok_or_else(|| {
                    ApiError::new(
                        ErrorCode::NotFound,
                        format!(
                            "nodes: node {n} is not in the cluster (add it to the meta group with \
                             `lockctl members add {n} ADDR --groups 0` first); the cluster's nodes \
                             are {:?}",
                            addrs.keys().collect::<Vec<_>>()
                        ),
                    )
                })?;
                Ok((*n, a))
            })
            .collect()
    }

    /// `POST /v1/admin/groups`: creates lock group `group` on `nodes` and waits until it is
    /// ready (module doc). Idempotent: the same call again answers the record, and finishes a
    /// creation an earlier call left half done.
    pub async fn create_group(
        &self,
        creds: &Credentials,
        group: GroupId,
        nodes: &[NodeId],
        allow_zone_majority: bool,
    ) -> Result<GroupRecord, ApiError> {
        self.require_admin(creds, "creating a group")?;
        check_new_group(group, nodes)?;
        // Every node must be in the cluster: the new group's members are reached at the
        // addresses the meta group has for them.
        self.addresses(nodes).await?;
        let placed = [(group, nodes.to_vec())];
        let zones = self.change_zones(allow_zone_majority).await?;
        crate::admin::keep_zones(&zones, None, &placed, allow_zone_majority)?;
        let meta = self.route_of(META_GROUP)?;
        let create = Op::CreateGroup {
            group,
            replicas: nodes.to_vec(),
        };
        let record = recorded(self.propose(&meta, create).await?)?;
        if record.ready {
            return Ok(record);
        }
        let _ = self.reconcile_topology().await;
        let map_version =
            answer_of!(self, &meta, Query::ShardMap, ShardMap)?.map_or(1, |m| m.version);
        let namespaces = answer_of!(self, &meta, Query::Namespaces, Namespaces)?;
        let found = Op::FoundGroup {
            born_epoch: record.born_epoch,
            map_version,
        };
        let deadline = Instant::now() + FOUND_WAIT;
        // The new group elects a leader once its replicas have started it (each node reads
        // the records every second); until then proposals to it are refused as unavailable.
        loop {
            let r = async {
                let g = self.route_of(group)?;
                self.propose(&g, found.clone()).await?;
                for ns in &namespaces {
                    self.propose(&g, Op::put_namespace(ns.clone())).await?;
                }
                Ok::<_, ApiError>(())
            }
            .await;
            match r {
                Ok(()) => break,
                Err(e) if e.status == 503 && Instant::now() < deadline => {
                    tracing::debug!(group, error = %e, "the new group is not up yet");
                    let _ = self.reconcile_topology().await;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(e),
            }
        }
        let record = recorded(self.propose(&meta, Op::GroupReady { group }).await?)?;
        let _ = self.reconcile_topology().await;
        tracing::info!(group, nodes = ?record.replicas, epoch = record.born_epoch, "lock group created");
        Ok(record)
    }

    /// Records in the meta group that node `id` joins (`add`) or leaves lock group `group`, so
    /// that a node added to a created group hosts a replica of it (its reconcile reads the
    /// record) and every node knows where the group is. A no-op when the record already says so.
    pub(crate) async fn place_member(
        &self,
        group: GroupId,
        id: NodeId,
        add: bool,
    ) -> Result<(), ApiError> {
        if group == META_GROUP {
            return Ok(());
        }
        let meta = self.route_of(META_GROUP)?;
        let records = answer_of!(self, &meta, Query::Groups, Groups)?;
        let Some(r) = records.get(&group) else {
            return Ok(());
        };
        let m = self.node.member_call(group, MemberCall::Describe).await?;
        // After a change, the members as they are; before an add (the new node must host the
        // group before it can catch up), the record and the node.
        let mut replicas = if add || m.joint {
            r.replicas.clone()
        } else {
            m.members()
        };
        replicas.retain(|n| *n != id);
        if add {
            replicas.push(id);
        }
        replicas.sort_unstable();
        if replicas == r.replicas || replicas.is_empty() {
            return Ok(());
        }
        let op = Op::PlaceGroup {
            group,
            replicas,
            placed_at: m.config_id.max(r.placed_at),
        };
        self.propose(&meta, op).await?;
        Ok(())
    }

    /// `DELETE /v1/admin/groups/{id}`: removes lock group `group`, which must own no bucket
    /// (move them away first). The group is closed first (from then on it takes no bucket),
    /// moves frozen toward it are rolled back, then the meta group removes it and every node
    /// stops hosting it. Its id is never used again. Idempotent.
    pub async fn remove_group(&self, creds: &Credentials, group: GroupId) -> Result<(), ApiError> {
        self.require_admin(creds, "removing a group")?;
        if group == META_GROUP {
            return Err(ApiError::bad_request(
                "group: 0 is the meta group; it cannot be removed",
            ));
        }
        let meta = self.route_of(META_GROUP)?;
        let removed = answer_of!(self, &meta, Query::RemovedGroups, RemovedGroups)?;
        if !removed.contains_key(&group) {
            let records = answer_of!(self, &meta, Query::Groups, Groups)?;
            let Some(record) = records.get(&group) else {
                return Err(ApiError::new(
                    ErrorCode::GroupNotFound,
                    format!(
                        "group: there is no lock group {group} (lock groups are {:?})",
                        records.keys().collect::<Vec<_>>()
                    ),
                ));
            };
            // A group never made ready was never sent a bucket or a move.
            if record.ready {
                self.close_group(group).await?;
            }
            self.propose(&meta, Op::RemoveGroup { group })
                .await
                .map_err(|e| with_group(group, e))?;
            tracing::info!(group, "lock group removed");
        }
        let _ = self.reconcile_topology().await;
        Ok(())
    }

    /// Closes `group` and rolls back every move frozen toward it, so that once the meta group
    /// removes it no group waits for it: a move frozen before the close is finished or thawed
    /// here; one frozen after it meets a group that refuses it (`moves::finish_move` thaws it).
    async fn close_group(&self, group: GroupId) -> Result<(), ApiError> {
        let g = self.route_of(group)?;
        self.propose(&g, Op::CloseGroup)
            .await
            .map_err(|e| with_group(group, e))?;
        for _ in 0..10 {
            let mut sum = crate::moves::MoveSummary::default();
            crate::moves::resume_moves(self, &mut sum).await?;
            let mut pending = false;
            for from in self.lock_group_ids() {
                let r = self.route_of(from)?;
                let moves = answer_of!(self, &r, Query::OutgoingMoves, OutgoingMoves)?;
                pending |= moves.iter().any(|(_, to, _)| *to == group);
            }
            if !pending {
                return Ok(());
            }
        }
        Err(ApiError::new(
            ErrorCode::Unavailable,
            format!("group: moves toward group {group} kept starting; stop them and retry"),
        )
        .retry_after(1_000))
    }

    /// `GET /v1/admin/groups`: the meta group's record of every lock group.
    pub async fn list_groups(
        &self,
        creds: &Credentials,
    ) -> Result<BTreeMap<GroupId, GroupRecord>, ApiError> {
        self.require_admin(creds, "listing groups")?;
        let meta = self.route_of(META_GROUP)?;
        answer_of!(self, &meta, Query::Groups, Groups)
    }

    /// What `session` was opened with (client, TTL, namespace), read from a group that has
    /// it, to adopt it in a group where it has no lease (`Op::AdoptAndAcquire`). 404 if no
    /// group has it any more.
    pub(crate) async fn session_opening(
        &self,
        session: SessionId,
    ) -> Result<(String, u64, String), ApiError> {
        let q = Query::SessionOpening { session };
        let opening = self
            .session_answer(&q, |a| match a {
                crate::ask::Answer::SessionOpening(o) => o,
                _ => None,
            })
            .await?;
        opening.ok_or_else(|| {
            ApiError::new(
                ErrorCode::SessionNotFound,
                format!("session {session} does not exist or has expired"),
            )
        })
    }
}

/// Names the group in a refusal that came from it.
fn with_group(group: GroupId, e: ApiError) -> ApiError {
    let why = e.message.strip_prefix("group: ").unwrap_or(&e.message);
    ApiError {
        message: format!("group {group}: {why}"),
        ..e
    }
}

fn recorded(reply: Reply) -> Result<GroupRecord, ApiError> {
    match reply {
        Reply::GroupRecorded { record, .. } => Ok(record),
        _ => Err(unexpected("a group record")),
    }
}

/// A new group's id and replica count, as given (before the cluster is asked anything).
fn check_new_group(group: GroupId, nodes: &[NodeId]) -> Result<(), ApiError> {
    if group == 0 {
        return Err(ApiError::bad_request(
            "group: 0 is the meta group; lock groups are 1 and up",
        ));
    }
    if nodes.is_empty() || nodes.len() > lockd_core::MAX_GROUP_REPLICAS {
        return Err(ApiError::bad_request(format!(
            "nodes: a group needs 1..={} nodes (3 or 5 survive a failure), {} given",
            lockd_core::MAX_GROUP_REPLICAS,
            nodes.len()
        )));
    }
    Ok(())
}
