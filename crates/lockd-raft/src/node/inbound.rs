//! The node's side of the peer port: what an admitted call does here. The transport
//! (`peer/`) checks who is calling; this file checks what a node of the cluster, or a
//! stranger, may ask of a group this node hosts, and serves it.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::peer::{batch, Inbound, Method, PeerBook};
use crate::raft::RaftRpc;
use crate::{GroupId, Node, NodeId};

impl Inbound for Node {
    fn node_id(&self) -> NodeId {
        Node::node_id(self)
    }

    fn book(&self) -> &PeerBook {
        self.peer_book()
    }

    fn stop_for(&self, why: String) {
        self.refuse_to_serve(crate::META_GROUP, why);
    }

    fn pipes_closed(&self) -> BoxFuture<'static, ()> {
        Box::pin(Node::pipes_closed(self))
    }

    fn serve<'a>(
        &'a self,
        method: Method,
        group: GroupId,
        payload: &'a [u8],
        from: Option<NodeId>,
    ) -> BoxFuture<'a, Result<Vec<u8>, tonic::Status>> {
        Box::pin(dispatch(self, method, group, payload, from))
    }
}

/// Serves one peer call on `node`: what the tonic service does for a request, without tonic.
/// `from`: the caller as the peer port admitted it (`None`: an in-process network).
pub(crate) async fn dispatch(
    node: &Node,
    method: Method,
    group_id: GroupId,
    payload: &[u8],
    from: Option<NodeId>,
) -> Result<Vec<u8>, tonic::Status> {
    if node.is_shutting_down() {
        return Err(tonic::Status::unavailable("node is shutting down"));
    }
    if method == Method::Hello {
        // Admitted means known: the caller's id is not retired, and not recorded with another
        // incarnation (`PeerService::admit`).
        return Ok(Vec::new());
    }
    let known = match from {
        Some(from) => node.admit_member(from, method, group_id)?,
        None => true,
    };
    let caller = Caller { from, known };
    if method != Method::Batch {
        return dispatch_one(node, method, group_id, payload, caller).await;
    }
    // Every member is served as a lone call would be, concurrently; answers keep their order.
    // Keepalives travel in batches of their own (their lane) and are answered from memory, so
    // such a batch needs no futures at all.
    let calls: Vec<batch::Call> = decode(payload)?;
    let answers: Vec<batch::Answer> = if known
        && calls
            .iter()
            .all(|c| c.method == batch::Forwarded::Keepalive)
    {
        calls
            .iter()
            .map(|c| keepalive(node, c.group, &c.payload).into())
            .collect()
    } else {
        futures_util::future::join_all(
            calls
                .iter()
                .map(|c| dispatch_one(node, c.method.method(), c.group, &c.payload, caller)),
        )
        .await
        .into_iter()
        .map(batch::Answer::from)
        .collect()
    };
    reply(&answers)
}

/// A forwarded keepalive: answered at once from the leader's tracker.
fn keepalive(node: &Node, group_id: GroupId, payload: &[u8]) -> Result<Vec<u8>, tonic::Status> {
    let group = hosted(node, group_id)?;
    let session: lockd_core::SessionId = decode(payload)?;
    reply(&group.keepalive_on_leader(session))
}

fn hosted(node: &Node, group_id: GroupId) -> Result<Arc<crate::Group>, tonic::Status> {
    node.group(group_id)
        .ok_or_else(|| tonic::Status::not_found(format!("group {group_id} is not hosted here")))
}

/// Who made a peer call: its node id as admitted (`None`: an in-process network), and whether
/// it is a node of the cluster (`false`: a stranger, `Node::admit_member`).
#[derive(Clone, Copy)]
struct Caller {
    from: Option<NodeId>,
    known: bool,
}

fn stranger(from: Option<NodeId>, what: &str) -> tonic::Status {
    let from = from.map_or_else(|| "?".to_string(), |n| n.to_string());
    tonic::Status::permission_denied(format!(
        "node {from} is no node of this cluster (no group this node hosts has it as a member): \
         {what}; a node waiting to be added may forward nothing else until `lockctl members \
         add`"
    ))
}

/// The command in a forwarded proposal, if a node may forward it to group `group_id` from
/// `caller`: never a leader's own duty, never one no node forwards to a group of that kind,
/// and from a stranger only its own start-up records.
fn forwarded_op(
    payload: &[u8],
    group_id: GroupId,
    caller: Caller,
) -> Result<lockd_core::Op, tonic::Status> {
    let op: lockd_core::Op = decode(payload)?;
    if op.leader_only() {
        return Err(tonic::Status::permission_denied(
            "a leader-only command (tick, session expiry, revision raise) is never taken from \
             a peer",
        ));
    }
    if !caller.known && !op.stranger_may_propose(caller.from.unwrap_or(0)) {
        return Err(stranger(
            caller.from,
            "this command is not one it may propose",
        ));
    }
    if !op.forwarded_to(group_id == crate::META_GROUP) {
        return Err(tonic::Status::permission_denied(format!(
            "no node forwards this command to group {group_id}, so the peer port refuses it"
        )));
    }
    Ok(op)
}

/// Serves one call that is not a batch.
async fn dispatch_one(
    node: &Node,
    method: Method,
    group_id: GroupId,
    payload: &[u8],
    caller: Caller,
) -> Result<Vec<u8>, tonic::Status> {
    let from = caller.from;
    if !caller.known && method != Method::Propose {
        return Err(stranger(
            from,
            "it may propose its own start-up records only",
        ));
    }
    if method == Method::App {
        if group_id == crate::NODE_CALL {
            return node.serve_app(group_id, payload.to_vec()).await;
        }
        return match node.route(group_id) {
            Some(crate::Route::Local(_)) => node.serve_app(group_id, payload.to_vec()).await,
            _ => Err(tonic::Status::not_found(format!(
                "group {group_id} has no replica here"
            ))),
        };
    }
    let group = hosted(node, group_id)?;
    let raft = group.raft();
    match method {
        Method::Append => {
            let (reply, from_leader) = raft.serve(RaftRpc::Append, payload, from).await?;
            if from_leader {
                group.note_leader_contact();
            }
            Ok(reply)
        }
        Method::Vote => Ok(raft.serve(RaftRpc::Vote, payload, from).await?.0),
        Method::PreVote => Ok(raft.serve(RaftRpc::PreVote, payload, from).await?.0),
        Method::Snapshot => Ok(raft.serve(RaftRpc::Snapshot, payload, from).await?.0),
        Method::TransferLeader => Ok(raft.serve(RaftRpc::TransferLeader, payload, from).await?.0),
        // A proposal forwarded by a follower; answered only if this node leads (no
        // re-forwarding).
        Method::Propose => {
            let op = forwarded_op(payload, group_id, caller)?;
            reply(&group.propose_on_leader(op).await)
        }
        Method::Keepalive => keepalive(node, group_id, payload),
        Method::ReadIndex => reply(&group.read_index_for_peer().await),
        // Served only if this node leads (no re-forwarding).
        Method::Member => {
            let call: crate::MemberCall = decode(payload)?;
            reply(&node.member_call_local(group_id, &call).await)
        }
        Method::Batch => Err(tonic::Status::invalid_argument(
            "a batch may not contain a batch",
        )),
        Method::Hello => Err(tonic::Status::invalid_argument(
            "a hello is not a call of a group",
        )),
        Method::App => unreachable!("served above"),
    }
}

fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, tonic::Status> {
    postcard::from_bytes(payload).map_err(|e| tonic::Status::invalid_argument(e.to_string()))
}

fn reply<T: Serialize>(v: &T) -> Result<Vec<u8>, tonic::Status> {
    postcard::to_allocvec(v).map_err(|e| tonic::Status::internal(e.to_string()))
}
