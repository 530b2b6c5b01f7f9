//! Cluster operations behind the admin credential: list, add and remove group members. HTTP and
//! gRPC both call these. Each reaches every named group's leader wherever it is
//! (`Node::member_call` forwards over the peer port) and is idempotent.

use std::collections::BTreeSet;
use std::time::Duration;

use lockd_raft::{GroupId, MemberCall, MemberError, Membership, NodeId, Zones, META_GROUP};

use crate::ask::{answer_of, Query};
use crate::error::{ApiError, ErrorCode};
use crate::service::{Credentials, Service};

/// One group's membership, as its leader answered, the nodes marked draining and every
/// node's zone.
pub struct GroupMembers {
    pub group: GroupId,
    pub membership: Membership,
    pub draining: BTreeSet<NodeId>,
    pub zones: Zones,
}

/// How long a drain call waits for the node to lead no group.
const DRAIN_WAIT: Duration = Duration::from_secs(20);

impl From<MemberError> for ApiError {
    fn from(e: MemberError) -> ApiError {
        match e {
            MemberError::Refused(why) => ApiError::new(ErrorCode::MemberChangeRefused, why),
            e @ MemberError::NotLeader { .. } => {
                ApiError::new(ErrorCode::Unavailable, format!("no leader answered: {e}"))
                    .retry_after(1_000)
            }
            e @ MemberError::Unavailable(_) => {
                ApiError::new(ErrorCode::Unavailable, e.to_string()).retry_after(1_000)
            }
        }
    }
}

impl Service {
    /// The meta group's record of each node's zone (`lockd-core/src/cluster.rs`).
    pub(crate) async fn zones(&self) -> Result<Zones, ApiError> {
        let meta = self.route_of(META_GROUP)?;
        answer_of!(self, &meta, Query::Zones, Zones)
    }

    /// The groups a member call names: `groups`, or every group if it is empty. A group the
    /// cluster does not have is a 404 naming it (it depends on the cluster, not on the input's
    /// shape).
    fn member_groups(&self, groups: &[GroupId]) -> Result<Vec<GroupId>, ApiError> {
        let hosted = self.node.all_group_ids();
        if groups.is_empty() {
            return Ok(hosted);
        }
        let mut out = Vec::new();
        for g in groups {
            if !hosted.contains(g) {
                return Err(ApiError::new(
                    ErrorCode::GroupNotFound,
                    format!("groups: there is no group {g} (groups are {hosted:?})"),
                ));
            }
            if !out.contains(g) {
                out.push(*g);
            }
        }
        Ok(out)
    }

    /// The zones a member change is checked against, read once per call: a change is refused
    /// while the meta group cannot say them, unless `allow` (no check is made then).
    pub(crate) async fn change_zones(&self, allow: bool) -> Result<Zones, ApiError> {
        match self.zones().await {
            Ok(zones) => Ok(zones),
            Err(_) if allow => Ok(Zones::new()),
            Err(e) => Err(e),
        }
    }

    /// Runs `call` on each of `groups`; the answers show `zones`, or the meta group's record
    /// when `None` (for display: left out when the meta group cannot answer).
    async fn member_calls(
        &self,
        groups: &[GroupId],
        call: MemberCall,
        zones: Option<&Zones>,
    ) -> Result<Vec<GroupMembers>, ApiError> {
        let mut out = Vec::new();
        // One group at a time: an add waits for the new member to catch up, and doing every
        // group at once would send every snapshot to it at the same moment.
        let draining = self.node.draining();
        for &group in groups {
            let membership = self.node.member_call(group, call.clone()).await?;
            out.push(GroupMembers {
                group,
                membership,
                draining: draining.clone(),
                zones: Zones::new(),
            });
        }
        let zones = match zones {
            Some(z) => Some(z.clone()),
            None => self.zones().await.ok(),
        };
        if let Some(zones) = zones {
            for g in &mut out {
                g.zones = zones.clone();
            }
        }
        Ok(out)
    }

    /// Marks node `id` draining (or not) in the meta group. Draining: leader balancing hands
    /// it no group, and the groups it leads go to other voters; the call waits (up to
    /// `DRAIN_WAIT`) until it leads none that another voter could take, and answers every
    /// group's membership. The node keeps its replicas and keeps serving clients. Idempotent.
    pub async fn set_draining(
        &self,
        creds: &Credentials,
        id: NodeId,
        draining: bool,
    ) -> Result<Vec<GroupMembers>, ApiError> {
        self.require_admin(
            creds,
            if draining {
                "draining a member"
            } else {
                "undraining a member"
            },
        )?;
        check_node_id(id)?;
        let all = self.member_groups(&[])?;
        if draining {
            let now = self.member_calls(&all, MemberCall::Describe, None).await?;
            if !now.iter().any(|g| g.membership.members().contains(&id)) {
                return Err(ApiError::new(
                    ErrorCode::NotFound,
                    format!("node_id: node {id} is not a member of any group"),
                ));
            }
        }
        let meta = self.route_of(META_GROUP)?;
        self.propose(&meta, lockd_core::Op::SetDraining { node: id, draining })
            .await?;
        let marked: BTreeSet<NodeId> = answer_of!(self, &meta, Query::Draining, Draining)?
            .into_iter()
            .collect();
        self.node.set_draining(marked);
        tracing::info!(node = id, draining, "draining mark set");
        let started = tokio::time::Instant::now();
        loop {
            let out = self.member_calls(&all, MemberCall::Describe, None).await?;
            // A group whose only voter is `id` has no one to hand over to: not waited for.
            let leads = out.iter().any(|g| {
                g.membership.leader == Some(id) && g.membership.voters.iter().any(|v| *v != id)
            });
            if !draining || !leads || started.elapsed() >= DRAIN_WAIT {
                return Ok(out);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Every group's membership, from its leader.
    pub async fn list_members(&self, creds: &Credentials) -> Result<Vec<GroupMembers>, ApiError> {
        self.require_admin(creds, "listing members")?;
        let groups = self.member_groups(&[])?;
        self.member_calls(&groups, MemberCall::Describe, None).await
    }

    /// Adds node `id` at `peer_addr` to `groups` (empty = all), each as a learner first.
    /// Refused if a group's voters would then hold a zone majority (`lockd_raft::zone_majority`), unless
    /// `allow_zone_majority`.
    pub async fn add_member(
        &self,
        creds: &Credentials,
        id: NodeId,
        peer_addr: &str,
        groups: &[GroupId],
        allow_zone_majority: bool,
    ) -> Result<Vec<GroupMembers>, ApiError> {
        self.require_admin(creds, "adding a member")?;
        check_node_id(id)?;
        if let Err(e) = lockd_raft::check_peer_addr(peer_addr) {
            return Err(ApiError::bad_request(format!(
                "peer_addr: {e}; an IP address or a DNS name"
            )));
        }
        let groups = self.member_groups(groups)?;
        // A node id is never reused: one that left every group is retired in the meta group.
        let meta = self.route_of(META_GROUP)?;
        if answer_of!(self, &meta, Query::IsRetired { node: id }, IsRetired)? {
            return Err(lockd_core::Rejection::NodeRetired { node: id }.into());
        }
        // An address another node already has would send the new member's Raft traffic to
        // that node (the peer port refuses it too, `lockd-to`): say so now, not by a learner
        // that never catches up.
        let all = self.member_groups(&[])?;
        let zones = self.change_zones(allow_zone_majority).await?;
        let now = self
            .member_calls(&all, MemberCall::Describe, Some(&zones))
            .await?;
        let after: Vec<_> = now
            .iter()
            .filter(|g| groups.contains(&g.group))
            .map(|g| {
                let mut voters = g.membership.voters.clone();
                let stays_learner =
                    g.group == META_GROUP && voters.len() >= lockd_raft::META_MAX_VOTERS;
                if !voters.contains(&id) && !stays_learner {
                    voters.push(id);
                }
                (g.group, voters)
            })
            .collect();
        keep_zones(&zones, Some(id), &after, allow_zone_majority)?;
        for g in now {
            if let Some((other, _)) = g
                .membership
                .addrs
                .iter()
                .find(|(n, a)| **n != id && a.as_str() == peer_addr)
            {
                return Err(ApiError::new(
                    ErrorCode::MemberChangeRefused,
                    format!(
                        "peer_addr: {peer_addr} is node {other}'s peer address (group {}); \
                         give node {id} its own",
                        g.group
                    ),
                ));
            }
        }
        // The new member hosts a replica of each group the meta group places on it.
        for &g in &groups {
            self.place_member(g, id, true).await?;
        }
        let call = MemberCall::Add {
            id,
            addr: peer_addr.to_string(),
        };
        self.member_calls(&groups, call, Some(&zones)).await
    }

    /// Removes node `id` from `groups` (empty = all). Removing an absent node changes nothing.
    /// Refused if a group's remaining voters would hold a zone majority, unless
    /// `allow_zone_majority`.
    pub async fn remove_member(
        &self,
        creds: &Credentials,
        id: NodeId,
        groups: &[GroupId],
        allow_zone_majority: bool,
    ) -> Result<Vec<GroupMembers>, ApiError> {
        self.require_admin(creds, "removing a member")?;
        check_node_id(id)?;
        let groups = self.member_groups(groups)?;
        let all = self.member_groups(&[])?;
        let zones = self.change_zones(allow_zone_majority).await?;
        let before = self
            .member_calls(&all, MemberCall::Describe, Some(&zones))
            .await?;
        let was = before.iter().any(|g| g.membership.members().contains(&id));
        let stays = before
            .iter()
            .any(|g| !groups.contains(&g.group) && g.membership.members().contains(&id));
        // Refused before anything changes (the id is retired first, below).
        if let Some(g) = before
            .iter()
            .find(|g| groups.contains(&g.group) && g.membership.voters == [id])
        {
            return Err(ApiError::new(
                ErrorCode::MemberChangeRefused,
                format!("node {id} is group {}'s only voter", g.group),
            ));
        }
        let after = voters_after_remove(&before, groups.as_slice(), id, &zones);
        keep_zones(&zones, None, &after, allow_zone_majority)?;
        // Leaving every group: retire the id for good, so that no later add can bring it back
        // (a wiped node rejoins under a new id). First, not last: a call that fails half-way
        // is retried when the node may be in no group any more, and must not leave the id
        // reusable then.
        if was && !stays {
            let meta = self.route_of(META_GROUP)?;
            self.propose(&meta, lockd_core::Op::RetireNode { node: id })
                .await?;
            tracing::info!(
                node = id,
                "node id retired: the call removes it from every group"
            );
        }
        let out = self
            .member_calls(&groups, MemberCall::Remove { id }, Some(&zones))
            .await?;
        for g in &out {
            if !g.membership.members().contains(&id) {
                self.place_member(g.group, id, false).await?;
            }
        }
        Ok(out)
    }
}

/// Each group's voters once node `id` leaves the `groups` it votes in: the meta group promotes
/// a learner in its place, one that keeps the zones (`Node::remove_member`).
fn voters_after_remove(
    before: &[GroupMembers],
    groups: &[GroupId],
    id: NodeId,
    zones: &Zones,
) -> Vec<(GroupId, Vec<NodeId>)> {
    before
        .iter()
        .filter(|g| groups.contains(&g.group) && g.membership.voters.contains(&id))
        .map(|g| {
            let mut voters = g.membership.voters.clone();
            voters.retain(|v| *v != id);
            if g.group == META_GROUP {
                let best = g.membership.learners.iter().find(|l| {
                    let mut v = voters.clone();
                    v.push(**l);
                    lockd_raft::zone_majority(&v, zones).is_none()
                });
                voters.extend(best);
            }
            (g.group, voters)
        })
        .collect()
}

/// Refuses, unless `allow`, a change that would leave a group with voters in a zone majority
/// (`lockd_raft::zone_majority`: losing that one zone would lose the group), or that adds node
/// `new` with no zone recorded to a cluster whose nodes have zones (`zones`: the meta group's
/// record, `Service::change_zones`).
pub(crate) fn keep_zones(
    zones: &Zones,
    new: Option<NodeId>,
    changes: &[(GroupId, Vec<NodeId>)],
    allow: bool,
) -> Result<(), ApiError> {
    if allow || changes.is_empty() {
        return Ok(());
    }
    let refused = |why: String| Err(ApiError::new(ErrorCode::MemberChangeRefused, why));
    if let Some(id) = new.filter(|id| !zones.is_empty() && !zones.contains_key(id)) {
        return refused(format!(
            "node_id: node {id} has no zone recorded, and this cluster's nodes are in zones: \
             start it with --zone (it records its zone as it starts), or say \
             allow_zone_majority"
        ));
    }
    for (group, voters) in changes {
        if let Some(m) = lockd_raft::zone_majority(voters, zones) {
            let group = match *group {
                META_GROUP => "the meta group".to_string(),
                g => format!("group {g}"),
            };
            return refused(format!(
                "zones: in {group}, {m}. Use a node of another zone, or say \
                 allow_zone_majority"
            ));
        }
    }
    Ok(())
}

fn check_node_id(id: NodeId) -> Result<(), ApiError> {
    if id == 0 {
        return Err(ApiError::bad_request(
            "node_id must be at least 1 (node ids start at 1)",
        ));
    }
    Ok(())
}

/// A member's role in a membership.
pub fn role(m: &Membership, id: NodeId) -> &'static str {
    if m.voters.contains(&id) {
        "voter"
    } else {
        "learner"
    }
}
