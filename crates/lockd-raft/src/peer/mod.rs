//! Node-to-node gRPC: one service, `lockd.peer.v1.Peer`, carrying openraft's RPCs and the calls
//! a follower forwards to its group's leader (propose, keepalive, read index).
//!
//! Every request names its group; payloads are postcard bytes in a prost `bytes` field, so the
//! service needs no .proto mapping of openraft or lockd-core types. The client side is a pool
//! with one lazily connected HTTP/2 channel per peer node, shared by every group.

pub(crate) mod pb;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

use crate::raft::RaftRpc;
use crate::{GroupError, GroupId, Node, NodeId};
pub use pb::peer_server::PeerServer;
use pb::{peer_client::PeerClient, PeerReply, PeerRequest};

/// Largest peer message (a snapshot travels in one message).
pub(crate) const MAX_MESSAGE_BYTES: usize = 256 << 20;

/// The calls of the peer service.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Method {
    Append,
    Vote,
    PreVote,
    Snapshot,
    Propose,
    Keepalive,
    ReadIndex,
}

/// One channel per peer node, connected on first use.
pub(crate) struct PeerPool {
    addrs: RwLock<HashMap<NodeId, String>>,
    channels: Mutex<HashMap<NodeId, (String, Channel)>>,
}

impl PeerPool {
    pub(crate) fn new(peers: &BTreeMap<NodeId, String>) -> PeerPool {
        PeerPool {
            addrs: RwLock::new(peers.iter().map(|(id, a)| (*id, a.clone())).collect()),
            channels: Mutex::new(HashMap::new()),
        }
    }

    /// Records a node's address as the Raft membership knows it, unless this node's own
    /// configuration names it: the membership holds the initialising node's view of the
    /// addresses, and another node may reach that peer another way (a proxy, NAT, a fault
    /// injector), so the local configuration wins.
    pub(crate) fn learn_addr(&self, id: NodeId, addr: &str) {
        let mut addrs = self.addrs.write().expect("peer addrs poisoned");
        addrs.entry(id).or_insert_with(|| addr.to_string());
    }

    fn client(&self, target: NodeId) -> Result<PeerClient<Channel>, tonic::Status> {
        let addr = self
            .addrs
            .read()
            .expect("peer addrs poisoned")
            .get(&target)
            .cloned()
            .ok_or_else(|| tonic::Status::unavailable(format!("no address for node {target}")))?;
        let mut channels = self.channels.lock().expect("peer channels poisoned");
        let channel = match channels.get(&target) {
            Some((a, ch)) if *a == addr => ch.clone(),
            _ => {
                let ch = Endpoint::from_shared(format!("http://{addr}"))
                    .map_err(|e| tonic::Status::unavailable(format!("bad address {addr}: {e}")))?
                    .connect_timeout(Duration::from_millis(500))
                    .tcp_nodelay(true)
                    .http2_keep_alive_interval(Duration::from_secs(5))
                    .keep_alive_timeout(Duration::from_secs(5))
                    .connect_lazy();
                channels.insert(target, (addr, ch.clone()));
                ch
            }
        };
        Ok(PeerClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES))
    }

    /// Sends one request and returns the reply payload.
    pub(crate) async fn call(
        &self,
        target: NodeId,
        method: Method,
        group: GroupId,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, tonic::Status> {
        let mut client = self.client(target)?;
        let mut req = tonic::Request::new(PeerRequest {
            group_id: group,
            payload,
        });
        req.set_timeout(timeout);
        let res = match method {
            Method::Append => client.append(req).await,
            Method::Vote => client.vote(req).await,
            Method::PreVote => client.pre_vote(req).await,
            Method::Snapshot => client.snapshot(req).await,
            Method::Propose => client.propose(req).await,
            Method::Keepalive => client.keepalive(req).await,
            Method::ReadIndex => client.read_index(req).await,
        };
        Ok(res?.into_inner().payload)
    }

    /// A forwarded call: typed request, typed `Result<_, GroupError>` reply. A transport
    /// failure is reported as `Err(status)`; the caller decides what it means.
    pub(crate) async fn forward<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        target: NodeId,
        method: Method,
        group: GroupId,
        req: &Req,
        timeout: Duration,
    ) -> Result<Result<Resp, GroupError>, tonic::Status> {
        let payload =
            postcard::to_allocvec(req).map_err(|e| tonic::Status::internal(e.to_string()))?;
        let reply = self.call(target, method, group, payload, timeout).await?;
        postcard::from_bytes(&reply)
            .map_err(|e| tonic::Status::internal(format!("bad reply from node {target}: {e}")))
    }
}

/// The server half of the peer service; build it with [`Node::peer_service`].
pub struct PeerService {
    node: Arc<Node>,
}

impl PeerService {
    pub(crate) fn server(node: Arc<Node>) -> PeerServer<PeerService> {
        PeerServer::new(PeerService { node })
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    fn group(&self, req: &PeerRequest) -> Result<Arc<crate::Group>, tonic::Status> {
        if self.node.is_shutting_down() {
            return Err(tonic::Status::unavailable("node is shutting down"));
        }
        self.node.group(req.group_id).ok_or_else(|| {
            tonic::Status::not_found(format!("group {} is not hosted here", req.group_id))
        })
    }

    async fn raft(
        &self,
        req: tonic::Request<PeerRequest>,
        rpc: RaftRpc,
    ) -> Result<tonic::Response<PeerReply>, tonic::Status> {
        let req = req.into_inner();
        let group = self.group(&req)?;
        let payload = group.raft().serve(rpc, &req.payload).await?;
        Ok(tonic::Response::new(PeerReply { payload }))
    }
}

fn decode<T: DeserializeOwned>(req: &PeerRequest) -> Result<T, tonic::Status> {
    postcard::from_bytes(&req.payload).map_err(|e| tonic::Status::invalid_argument(e.to_string()))
}

fn reply<T: Serialize>(v: &T) -> Result<tonic::Response<PeerReply>, tonic::Status> {
    let payload = postcard::to_allocvec(v).map_err(|e| tonic::Status::internal(e.to_string()))?;
    Ok(tonic::Response::new(PeerReply { payload }))
}

#[tonic::async_trait]
impl pb::peer_server::Peer for PeerService {
    async fn append(
        &self,
        req: tonic::Request<PeerRequest>,
    ) -> Result<tonic::Response<PeerReply>, tonic::Status> {
        self.raft(req, RaftRpc::Append).await
    }

    async fn vote(
        &self,
        req: tonic::Request<PeerRequest>,
    ) -> Result<tonic::Response<PeerReply>, tonic::Status> {
        self.raft(req, RaftRpc::Vote).await
    }

    async fn pre_vote(
        &self,
        req: tonic::Request<PeerRequest>,
    ) -> Result<tonic::Response<PeerReply>, tonic::Status> {
        self.raft(req, RaftRpc::PreVote).await
    }

    async fn snapshot(
        &self,
        req: tonic::Request<PeerRequest>,
    ) -> Result<tonic::Response<PeerReply>, tonic::Status> {
        self.raft(req, RaftRpc::Snapshot).await
    }

    /// A proposal forwarded by a follower; answered only if this node leads (no re-forwarding).
    async fn propose(
        &self,
        req: tonic::Request<PeerRequest>,
    ) -> Result<tonic::Response<PeerReply>, tonic::Status> {
        let req = req.into_inner();
        let group = self.group(&req)?;
        let op: lockd_core::Op = decode(&req)?;
        reply(
            &group
                .propose_on_leader(op)
                .await
                .map(crate::wire::WireReply),
        )
    }

    async fn keepalive(
        &self,
        req: tonic::Request<PeerRequest>,
    ) -> Result<tonic::Response<PeerReply>, tonic::Status> {
        let req = req.into_inner();
        let group = self.group(&req)?;
        let session: lockd_core::SessionId = decode(&req)?;
        reply(&group.keepalive_on_leader(session))
    }

    async fn read_index(
        &self,
        req: tonic::Request<PeerRequest>,
    ) -> Result<tonic::Response<PeerReply>, tonic::Status> {
        let req = req.into_inner();
        let group = self.group(&req)?;
        reply(&group.read_index_on_leader().await)
    }
}
