//! openraft's network traits over the node's peer gRPC pool.
//!
//! Client side: `openraft_multi::GroupNetworkAdapter` binds (target node, group) to a
//! process-wide router; our router encodes each openraft request with postcard and sends it on
//! the one HTTP/2 channel per peer node that every group shares. Server side: [`serve`] decodes
//! and hands the request to the group's `Raft`.

use std::future::Future;
use std::sync::Mutex;

use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, OptionalSend, RaftNetworkFactory};
use openraft_multi::{GroupNetworkAdapter, GroupRouter};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{dec, enc, Raft, RaftRpc, SnapshotData, SnapshotMeta, TypeConfig, Vote};
use crate::peer::{Method, Peers};
use crate::{GroupId, NodeId};

/// A whole snapshot in one message (openraft's `Snapshot` itself is not serde).
#[derive(Serialize, Deserialize)]
struct SnapshotWire {
    vote: Vote,
    meta: SnapshotMeta,
    data: SnapshotData,
}

/// The voter a leader of this group last named for a leadership transfer, with that leader's
/// term. A vote request's `leadership_transfer` flag lets it past the voters' leader lease
/// (openraft's `handle_vote_req`), so it is the leader's to grant (Raft thesis §3.10): it is
/// honoured only from the named candidate, in the term right after the naming leader's. From
/// any other member (or later) the flag is cleared and the request is an ordinary vote, which a
/// voter under a live leader refuses. A name counts only from the leader this replica follows
/// (its committed vote), as openraft itself acts on a transfer only from that leader.
#[derive(Default)]
pub(crate) struct NamedSuccessor {
    named: Mutex<Option<(NodeId, u64)>>,
    /// Woken at each name: a transfer vote that arrives before its leader's broadcast waits
    /// for it (openraft sends the broadcast to each voter on its own task, and the candidate
    /// elects as soon as its own copy arrives).
    changed: tokio::sync::Notify,
}

/// How long a transfer vote waits for the broadcast that names its candidate. The broadcast
/// left the leader before the candidate's own copy did, so it is late by a scheduling delay,
/// not a round trip; a vote no leader named costs its sender this much, once per request.
const NAME_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

impl NamedSuccessor {
    /// Records that the leader of `term` named `to` (its own trigger, or its broadcast). A
    /// late broadcast of an older term does not replace a newer name.
    pub(crate) fn name(&self, to: NodeId, term: u64) {
        let mut named = self.named.lock().unwrap_or_else(|p| p.into_inner());
        if named.is_none_or(|(_, t)| t <= term) {
            *named = Some((to, term));
        }
        drop(named);
        self.changed.notify_waiters();
    }

    /// Whether a transfer vote from `candidate` for `term` was named by the leader before it.
    fn honours(&self, candidate: NodeId, term: u64) -> bool {
        let named = *self.named.lock().unwrap_or_else(|p| p.into_inner());
        matches!(named, Some((to, t)) if to == candidate && term == t + 1)
    }

    /// [`NamedSuccessor::honours`], waiting up to [`NAME_WAIT`] for the name to arrive.
    async fn honours_soon(&self, candidate: NodeId, term: u64) -> bool {
        let deadline = tokio::time::Instant::now() + NAME_WAIT;
        loop {
            // Made before the check, so a name recorded in between still wakes it.
            let changed = self.changed.notified();
            if self.honours(candidate, term) {
                return true;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.honours(candidate, term);
            }
        }
    }
}

/// The process-wide router handed to every group's network adapter.
#[derive(Clone)]
pub(crate) struct Router(Peers);

impl Router {
    async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        target: NodeId,
        group: GroupId,
        method: Method,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<TypeConfig>> {
        let payload = enc(req).map_err(|e| NetworkError::new(&e))?;
        let reply = self
            .0
            .call(target, method, group, payload, option.soft_ttl())
            .await
            .map_err(|st| status_to_rpc_error(target, st))?;
        dec(&reply).map_err(|e| RPCError::Network(NetworkError::new(&e)))
    }
}

fn status_to_rpc_error(target: NodeId, st: tonic::Status) -> RPCError<TypeConfig> {
    let msg = format!("rpc to node {target}: {:?}: {}", st.code(), st.message());
    match st.code() {
        // Connection refused, peer down or not hosting the group: back off.
        tonic::Code::Unavailable | tonic::Code::NotFound | tonic::Code::Unknown => {
            RPCError::Unreachable(Unreachable::from_string(msg))
        }
        _ => RPCError::Network(NetworkError::from_string(msg)),
    }
}

impl GroupRouter<TypeConfig, GroupId> for Router {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &self,
        target: NodeId,
        group: GroupId,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(target, group, Method::Append, &rpc, &option)
            .await
    }

    async fn vote(
        &self,
        target: NodeId,
        group: GroupId,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(target, group, Method::Vote, &rpc, &option).await
    }

    async fn transfer_leader(
        &self,
        target: NodeId,
        group: GroupId,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(target, group, Method::TransferLeader, &req, &option)
            .await
    }

    async fn pre_vote(
        &self,
        target: NodeId,
        group: GroupId,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(target, group, Method::PreVote, &rpc, &option)
            .await
    }

    async fn full_snapshot(
        &self,
        target: NodeId,
        group: GroupId,
        vote: Vote,
        snapshot: openraft::type_config::alias::SnapshotOf<TypeConfig, SnapshotData>,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let wire = SnapshotWire {
            vote,
            meta: snapshot.meta,
            data: snapshot.snapshot,
        };
        tokio::select! {
            biased;
            closed = cancel => Err(StreamingError::Closed(closed)),
            r = self.call::<_, SnapshotResponse<TypeConfig>>(target, group, Method::Snapshot, &wire, &option) => {
                r.map_err(|e| match e {
                    RPCError::Unreachable(u) => StreamingError::Unreachable(u),
                    RPCError::Timeout(t) => StreamingError::Timeout(t),
                    RPCError::Network(n) => StreamingError::Network(n),
                    RPCError::RemoteError(r) => StreamingError::Network(NetworkError::from_string(r.to_string())),
                })
            }
        }
    }
}

/// One group's `RaftNetworkFactory`: the shared router bound to a group id.
pub(crate) struct GroupNetwork {
    router: Router,
    group: GroupId,
}

impl GroupNetwork {
    pub(crate) fn new(pool: Peers, group: GroupId) -> GroupNetwork {
        GroupNetwork {
            router: Router(pool),
            group,
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for GroupNetwork {
    type Network = GroupNetworkAdapter<TypeConfig, GroupId, Router>;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        self.router.0.learn_addr(target, &node.addr);
        GroupNetworkAdapter::new(self.router.clone(), target, self.group)
    }
}

fn bad_request(e: std::io::Error) -> tonic::Status {
    tonic::Status::invalid_argument(e.to_string())
}

fn encode_reply<T: Serialize>(v: &T) -> Result<Vec<u8>, tonic::Status> {
    enc(v).map_err(|e| tonic::Status::internal(e.to_string()))
}

/// `Raft::{append_entries, vote, ...}` fail only when the node stopped (Fatal).
fn fatal(e: impl std::fmt::Display) -> tonic::Status {
    tonic::Status::unavailable(e.to_string())
}

/// Serves one openraft RPC for `raft`.
/// Refuses a Raft message that speaks for another node than the one that sent it: an append,
/// snapshot or leadership transfer comes from the leader its vote names, a vote request from
/// its candidate. `from`: the caller as the peer port admitted it (under mutual TLS, the node
/// its certificate names); `None` (an in-process network) checks nothing.
fn check_sender(rpc: RaftRpc, vote: &Vote, from: Option<NodeId>) -> Result<(), tonic::Status> {
    use openraft::vote::RaftLeaderId;
    let claimed = *vote.leader_id().node_id();
    match from {
        Some(from) if from != claimed => Err(tonic::Status::permission_denied(format!(
            "node {from} sent a {rpc:?} on behalf of node {claimed}"
        ))),
        _ => Ok(()),
    }
}

/// Serves one Raft RPC; also says whether it was the current leader's replication (an
/// append this replica did not refuse for a higher vote), the sign that the leader still
/// counts this replica among its members.
pub(crate) async fn serve(
    raft: &Raft,
    named: &NamedSuccessor,
    rpc: RaftRpc,
    payload: &[u8],
    from: Option<NodeId>,
) -> Result<(Vec<u8>, bool), tonic::Status> {
    if let RaftRpc::Append = rpc {
        let req: AppendEntriesRequest<TypeConfig> = dec(payload).map_err(bad_request)?;
        check_sender(rpc, &req.vote, from)?;
        let resp = raft.append_entries(req).await.map_err(fatal)?;
        let from_leader = !matches!(resp, openraft::raft::AppendEntriesResponse::HigherVote(_));
        return Ok((encode_reply(&resp)?, from_leader));
    }
    serve_other(raft, named, rpc, payload, from)
        .await
        .map(|b| (b, false))
}

async fn serve_other(
    raft: &Raft,
    named: &NamedSuccessor,
    rpc: RaftRpc,
    payload: &[u8],
    from: Option<NodeId>,
) -> Result<Vec<u8>, tonic::Status> {
    match rpc {
        RaftRpc::Append => unreachable!("served above"),
        RaftRpc::Vote => {
            use openraft::vote::RaftLeaderId;
            let mut req: VoteRequest<TypeConfig> = dec(payload).map_err(bad_request)?;
            check_sender(rpc, &req.vote, from)?;
            let (candidate, term) = (*req.vote.leader_id().node_id(), req.vote.leader_id().term());
            if req.leadership_transfer && !named.honours_soon(candidate, term).await {
                tracing::warn!(
                    candidate,
                    term,
                    "a leadership-transfer vote no leader named: taken as an ordinary vote"
                );
                req.leadership_transfer = false;
            }
            encode_reply(&raft.vote(req).await.map_err(fatal)?)
        }
        RaftRpc::PreVote => {
            let req: VoteRequest<TypeConfig> = dec(payload).map_err(bad_request)?;
            check_sender(rpc, &req.vote, from)?;
            encode_reply(&raft.pre_vote(req).await.map_err(fatal)?)
        }
        RaftRpc::TransferLeader => {
            use openraft::vote::RaftLeaderId;
            let req: TransferLeaderRequest<TypeConfig> = dec(payload).map_err(bad_request)?;
            check_sender(rpc, req.from_leader(), from)?;
            // Only the leader this replica follows names a successor (a member that sends a
            // transfer in its own name is not one), as openraft acts only on that leader's.
            let following = {
                use openraft::async_runtime::watch::WatchReceiver as _;
                let metrics = raft.server_metrics();
                let m = metrics.borrow_watched();
                m.vote == *req.from_leader() && m.vote.is_committed()
            };
            if following {
                named.name(*req.to_node_id(), req.from_leader().leader_id().term());
            }
            encode_reply(&raft.handle_transfer_leader(req).await.map_err(fatal)?)
        }
        RaftRpc::Snapshot => {
            let w: SnapshotWire = dec(payload).map_err(bad_request)?;
            check_sender(rpc, &w.vote, from)?;
            let snap = openraft::type_config::alias::SnapshotOf::<TypeConfig, SnapshotData> {
                meta: w.meta,
                snapshot: w.data,
            };
            encode_reply(
                &raft
                    .install_full_snapshot(w.vote, snap)
                    .await
                    .map_err(fatal)?,
            )
        }
    }
}

#[cfg(test)]
mod sender_tests {
    use super::*;

    /// A vote request from candidate 3 is node 3's to send: from node 2 it is refused, from
    /// node 3 (or an in-process network that names no sender) it is served.
    #[test]
    fn a_raft_message_speaks_only_for_its_sender() {
        let vote: Vote = openraft::impls::Vote::new(7, 3);
        let st = check_sender(RaftRpc::Vote, &vote, Some(2)).unwrap_err();
        assert_eq!(st.code(), tonic::Code::PermissionDenied);
        assert!(st.message().contains("node 2") && st.message().contains("node 3"));
        assert!(check_sender(RaftRpc::Vote, &vote, Some(3)).is_ok());
        assert!(check_sender(RaftRpc::Append, &vote, None).is_ok());
    }
}
