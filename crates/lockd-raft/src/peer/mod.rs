//! Node-to-node gRPC: one service, `lockd.peer.v1.Peer`, carrying openraft's RPCs and the calls
//! a follower forwards to its group's leader (propose, keepalive, read index).
//!
//! Every request names its group; payloads are postcard bytes in a prost `bytes` field, so the
//! service needs no .proto mapping of openraft or lockd-core types. The client side is a pool
//! with one lazily connected HTTP/2 channel per peer node, shared by every group; every call but
//! a snapshot or a large payload rides one long-lived stream on it (`pipe.rs`).
//!
//! **Transport seam.** Outbound calls go through the [`PeerTransport`] trait; [`PeerPool`]
//! (tonic) is the production implementation. Inbound, the service admits a call and hands it to
//! the node behind it through the [`Inbound`] trait (`node/inbound.rs`); `Node::serve_peer` makes
//! the same call without tonic, so a simulated network can route calls between in-process nodes
//! without sockets. This folder is the bottom layer: it knows no group, no `Node`, no openraft.

pub(crate) mod batch;
pub(crate) mod book;
pub(crate) mod pb;
mod pipe;
pub(crate) mod tls;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::{GroupError, GroupId, NodeId};
pub use book::PeerBook;
use book::{parse_incarnation, INCARNATION_HEADER, SECRET_HEADER, TO_INCARNATION_HEADER};
pub use pb::peer_server::PeerServer;
use pb::{peer_client::PeerClient, PeerReply, PeerRequest};

/// Largest peer message (a snapshot travels in one message).
pub(crate) const MAX_MESSAGE_BYTES: usize = 256 << 20;

/// The calls of the peer service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    /// openraft AppendEntries (also heartbeats).
    Append,
    /// openraft RequestVote.
    Vote,
    /// openraft pre-vote.
    PreVote,
    /// openraft full snapshot install.
    Snapshot,
    /// A proposal forwarded to the leader.
    Propose,
    /// A keepalive forwarded to the leader.
    Keepalive,
    /// A read-index request forwarded to the leader.
    ReadIndex,
    /// Several forwarded calls (propose, keepalive, read index) for one leader node in one
    /// request; see `batch.rs`.
    Batch,
    /// openraft TransferLeader: the leader hands the group to a caught-up voter (`node/balance.rs`).
    TransferLeader,
    /// A membership call (`Node::member_call`) forwarded to the group's leader.
    Member,
    /// A call of the embedding server (`crate::AppHandler`), served by a node that hosts a
    /// replica of the group for one that hosts none (`group/remote.rs`).
    App,
    /// A node with a new data dir asks whether the cluster knows its id by another one
    /// (`Node::start`): answered by the admission checks alone, from any caller of the cluster.
    Hello,
}

impl Method {
    /// Every method, in the order of its number on a pipe (`pipe.rs`): the one place that
    /// numbering is written.
    const BY_CODE: [Method; 12] = [
        Method::Append,
        Method::Vote,
        Method::PreVote,
        Method::Snapshot,
        Method::Propose,
        Method::Keepalive,
        Method::ReadIndex,
        Method::Batch,
        Method::TransferLeader,
        Method::Member,
        Method::App,
        Method::Hello,
    ];

    /// The method's number on a pipe (1-based; 0 is never sent).
    fn code(self) -> u32 {
        let i = Method::BY_CODE.iter().position(|m| *m == self);
        1 + i.expect("every method is numbered") as u32
    }

    fn from_code(code: u32) -> Option<Method> {
        let i = usize::try_from(code.checked_sub(1)?).ok()?;
        Method::BY_CODE.get(i).copied()
    }
}

/// How a node sends peer calls: one request with a postcard payload for one group on `target`,
/// answered by the reply payload or a gRPC status. Errors follow tonic's conventions:
/// `Unavailable` with "tcp connect error" means the request certainly never left; anything else
/// may have been delivered.
pub trait PeerTransport: Send + Sync + 'static {
    /// Sends one request and returns the reply payload.
    fn call(
        &self,
        target: NodeId,
        method: Method,
        group: GroupId,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<Vec<u8>, tonic::Status>>;

    /// Records a node's address as the Raft membership knows it (default: ignored).
    fn learn_addr(&self, id: NodeId, addr: &str) {
        let _ = (id, addr);
    }

    /// Every node this transport can reach by id (default: none beyond those it is asked for).
    fn known_nodes(&self) -> Vec<NodeId> {
        Vec::new()
    }

    /// Whether this transport has an address for node `id` (a cheap form of
    /// [`PeerTransport::known_nodes`], asked on every inbound call).
    fn knows(&self, id: NodeId) -> bool {
        self.known_nodes().contains(&id)
    }
}

/// The node's handle on its transport, with the typed forwarding helper (forwarded calls go
/// through the batcher).
#[derive(Clone)]
pub(crate) struct Peers {
    transport: Arc<dyn PeerTransport>,
    batcher: Arc<batch::Batcher>,
}

impl Peers {
    pub(crate) fn new(transport: Arc<dyn PeerTransport>) -> Peers {
        Peers {
            batcher: batch::Batcher::new(transport.clone()),
            transport,
        }
    }

    pub(crate) async fn call(
        &self,
        target: NodeId,
        method: Method,
        group: GroupId,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, tonic::Status> {
        self.transport
            .call(target, method, group, payload, timeout)
            .await
    }

    pub(crate) fn learn_addr(&self, id: NodeId, addr: &str) {
        self.transport.learn_addr(id, addr)
    }

    pub(crate) fn known_nodes(&self) -> Vec<NodeId> {
        self.transport.known_nodes()
    }

    pub(crate) fn knows(&self, id: NodeId) -> bool {
        self.transport.knows(id)
    }

    /// A forwarded call: typed request, typed `Result<_, GroupError>` reply, sent in a batch
    /// with the other calls queued for `target`. A transport failure is reported as
    /// `Err(status)`; the caller decides what it means.
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
        let reply = match batch::Forwarded::of(method) {
            Some(f) => {
                self.batcher
                    .call(target, f, group, payload, timeout)
                    .await?
            }
            None => self.call(target, method, group, payload, timeout).await?,
        };
        postcard::from_bytes(&reply)
            .map_err(|e| tonic::Status::internal(format!("bad reply from node {target}: {e}")))
    }
}

/// The metadata key naming the caller's cluster on every peer call.
pub(crate) const CLUSTER_HEADER: &str = "lockd-cluster";
/// The metadata key naming the calling node's id on every peer call.
pub(crate) const NODE_HEADER: &str = "lockd-node";
/// The metadata key naming the node a peer call is meant for (etcd's `X-Raft-To`): a call that
/// reaches another node, because an address was given for the wrong node, is refused instead
/// of being taken as a message from a group's member to itself.
pub(crate) const TO_HEADER: &str = "lockd-to";

/// Stamps every outbound peer call with who sends it (the cluster's name, this node's id and
/// data dir incarnation, the cluster's peer secret) and, on a channel to one node, whom it is
/// for (its id, and its incarnation as the meta group recorded it). The receiver refuses
/// another cluster, a call meant for another node, a wrong secret or incarnation, and with TLS
/// checks the sender's id against its certificate ([`PeerService::admit`]).
#[derive(Clone)]
pub struct PeerHeaders {
    cluster: tonic::metadata::AsciiMetadataValue,
    node: tonic::metadata::AsciiMetadataValue,
    incarnation: Option<tonic::metadata::AsciiMetadataValue>,
    secret: Option<tonic::metadata::AsciiMetadataValue>,
    to: Option<(NodeId, tonic::metadata::AsciiMetadataValue)>,
    book: Arc<PeerBook>,
}

impl PeerHeaders {
    /// The same headers, addressed to node `to`.
    fn to(&self, to: NodeId) -> PeerHeaders {
        PeerHeaders {
            to: Some((to, tonic::metadata::AsciiMetadataValue::from(to))),
            ..self.clone()
        }
    }
}

fn hex_value(v: u64) -> tonic::metadata::AsciiMetadataValue {
    format!("{v:016x}")
        .parse()
        .expect("hex digits are valid metadata")
}

impl tonic::service::Interceptor for PeerHeaders {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let md = req.metadata_mut();
        md.insert(CLUSTER_HEADER, self.cluster.clone());
        md.insert(NODE_HEADER, self.node.clone());
        if let Some(i) = &self.incarnation {
            md.insert(INCARNATION_HEADER, i.clone());
        }
        if let Some(s) = &self.secret {
            md.insert(SECRET_HEADER, s.clone());
        }
        if let Some((id, to)) = &self.to {
            md.insert(TO_HEADER, to.clone());
            // Read per call (a pipe: per stream), so a record learnt later is sent from then on.
            if let Some(i) = self.book.incarnation_of(*id) {
                md.insert(TO_INCARNATION_HEADER, hex_value(i));
            }
        }
        Ok(req)
    }
}

/// A channel to one peer node, every call on it stamped by [`PeerHeaders`].
pub(crate) type PeerChannel = InterceptedService<Channel, PeerHeaders>;

/// A peer's pipe, with the address and the recorded incarnation it was opened with.
struct OpenPipe {
    addr: String,
    pipe: Arc<pipe::Pipe>,
    incarnation: Option<u64>,
}

/// The production transport: one tonic channel per peer node, connected on first use, with a
/// pipe (`pipe.rs`) on it for every call but snapshots and large payloads.
pub struct PeerPool {
    addrs: RwLock<HashMap<NodeId, String>>,
    channels: Mutex<HashMap<NodeId, (String, Channel)>>,
    pipes: Mutex<HashMap<NodeId, OpenPipe>>,
    headers: PeerHeaders,
    /// The CA and this node's identity; each channel adds the name of the node it dials.
    tls: Option<ClientTlsConfig>,
}

impl PeerPool {
    /// A pool for `peers` (node id -> peer address), sending as node `me` of `cluster`, over
    /// mutual TLS when `tls` is given, with `book`'s incarnation and secret.
    pub fn new(
        peers: &BTreeMap<NodeId, String>,
        cluster: &str,
        me: NodeId,
        tls: Option<&tls::PeerTls>,
        book: Arc<PeerBook>,
    ) -> Result<PeerPool, String> {
        let value = |v: String| {
            v.parse()
                .map_err(|_| format!("'{v}' cannot be sent as gRPC metadata"))
        };
        let tls = tls.map(|t| {
            ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(&t.ca_pem))
                .identity(tonic::transport::Identity::from_pem(
                    &t.cert_pem,
                    &t.key_pem,
                ))
        });
        Ok(PeerPool {
            addrs: RwLock::new(peers.iter().map(|(id, a)| (*id, a.clone())).collect()),
            channels: Mutex::new(HashMap::new()),
            pipes: Mutex::new(HashMap::new()),
            headers: PeerHeaders {
                cluster: value(cluster.to_string())?,
                node: value(me.to_string())?,
                incarnation: (book.incarnation() != 0).then(|| hex_value(book.incarnation())),
                secret: book.secret().map(|s| value(s.to_string())).transpose()?,
                to: None,
                book,
            },
            tls,
        })
    }

    /// Records a node's address as the Raft membership knows it, unless this node's own
    /// configuration names it: the membership holds the initialising node's view of the
    /// addresses, and another node may reach that peer another way (a proxy, NAT, a fault
    /// injector), so the local configuration wins.
    fn set_addr(&self, id: NodeId, addr: &str) {
        let mut addrs = self.addrs.write().expect("peer addrs poisoned");
        addrs.entry(id).or_insert_with(|| addr.to_string());
    }

    fn addr(&self, target: NodeId) -> Result<String, tonic::Status> {
        self.addrs
            .read()
            .expect("peer addrs poisoned")
            .get(&target)
            .cloned()
            .ok_or_else(|| tonic::Status::unavailable(format!("no address for node {target}")))
    }

    /// The open pipe to `target`, or a new one if there is none, it has ended, or it was
    /// opened before the meta group recorded `target`'s incarnation (its headers, sent once per
    /// pipe, must name it: `book.rs`). Every peer call but a snapshot comes here, so the common
    /// case allocates nothing.
    fn pipe(&self, target: NodeId) -> Result<Arc<pipe::Pipe>, tonic::Status> {
        let mut pipes = self.pipes.lock().expect("peer pipes poisoned");
        let known = self.headers.book.incarnation_of(target);
        if let Some(o) = pipes.get(&target) {
            let addrs = self.addrs.read().expect("peer addrs poisoned");
            if addrs.get(&target) == Some(&o.addr) && !o.pipe.is_closed() && o.incarnation == known
            {
                return Ok(o.pipe.clone());
            }
        }
        let addr = self.addr(target)?;
        let pipe = Arc::new(pipe::Pipe::open(self.client(target)?));
        let open = OpenPipe {
            addr,
            pipe: pipe.clone(),
            incarnation: known,
        };
        pipes.insert(target, open);
        Ok(pipe)
    }

    fn client(&self, target: NodeId) -> Result<PeerClient<PeerChannel>, tonic::Status> {
        let addr = self.addr(target)?;
        let mut channels = self.channels.lock().expect("peer channels poisoned");
        let channel = match channels.get(&target) {
            Some((a, ch)) if *a == addr => ch.clone(),
            _ => {
                let bad = |e: tonic::transport::Error| {
                    tonic::Status::unavailable(format!("bad address {addr}: {e}"))
                };
                let scheme = if self.tls.is_some() { "https" } else { "http" };
                let mut endpoint =
                    Endpoint::from_shared(format!("{scheme}://{addr}")).map_err(bad)?;
                if let Some(tls) = &self.tls {
                    // The node dialled must prove it is `target`, whatever address it has.
                    let tls = tls.clone().domain_name(tls::peer_dns_name(target));
                    endpoint = endpoint.tls_config(tls).map_err(bad)?;
                }
                let ch = endpoint
                    .connect_timeout(Duration::from_millis(500))
                    .tcp_nodelay(true)
                    .http2_keep_alive_interval(Duration::from_secs(5))
                    .keep_alive_timeout(Duration::from_secs(5))
                    .connect_lazy();
                channels.insert(target, (addr, ch.clone()));
                ch
            }
        };
        Ok(
            PeerClient::with_interceptor(channel, self.headers.to(target))
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
    }

    /// Sends one request over tonic and returns the reply payload.
    async fn send(
        &self,
        target: NodeId,
        method: Method,
        group: GroupId,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, tonic::Status> {
        if method != Method::Snapshot && payload.len() <= pipe::MAX_PIPE_PAYLOAD {
            let pipe = self.pipe(target)?;
            return pipe.call(method, group, payload, timeout).await;
        }
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
            Method::Batch => client.batch(req).await,
            Method::TransferLeader => client.transfer_leader(req).await,
            Method::Member => client.member(req).await,
            Method::App => client.app(req).await,
            Method::Hello => {
                return Err(tonic::Status::internal("a hello travels on a pipe"));
            }
        };
        Ok(res?.into_inner().payload)
    }
}

impl PeerTransport for PeerPool {
    fn call(
        &self,
        target: NodeId,
        method: Method,
        group: GroupId,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<Vec<u8>, tonic::Status>> {
        Box::pin(self.send(target, method, group, payload, timeout))
    }

    fn learn_addr(&self, id: NodeId, addr: &str) {
        self.set_addr(id, addr)
    }

    fn knows(&self, id: NodeId) -> bool {
        self.addrs
            .read()
            .expect("peer addrs poisoned")
            .contains_key(&id)
    }

    fn known_nodes(&self) -> Vec<NodeId> {
        let mut ids: Vec<NodeId> = self
            .addrs
            .read()
            .expect("peer addrs poisoned")
            .keys()
            .copied()
            .collect();
        ids.sort_unstable();
        ids
    }
}

/// The node behind the peer port, as the transport sees it. The service admits a call (its
/// cluster, secret, incarnation and certificate) and hands it over; what a call does to a group
/// is the node's business (`node/inbound.rs`), so this folder knows no group and no openraft.
pub(crate) trait Inbound: Send + Sync + 'static {
    fn node_id(&self) -> NodeId;
    fn book(&self) -> &PeerBook;
    /// Told by the cluster that this node's data dir is not the one it knows: stop serving.
    fn stop_for(&self, why: String);
    /// Resolves when the node ends its inbound pipes (its server is stopping).
    fn pipes_closed(&self) -> BoxFuture<'static, ()>;
    /// Serves one admitted call: `from` is the caller as admitted (`None`: an in-process
    /// network).
    fn serve<'a>(
        &'a self,
        method: Method,
        group: GroupId,
        payload: &'a [u8],
        from: Option<NodeId>,
    ) -> BoxFuture<'a, Result<Vec<u8>, tonic::Status>>;
}

/// The server half of the peer service; build it with `Node::peer_service`.
pub struct PeerService {
    node: Arc<dyn Inbound>,
    cluster: String,
    /// Whether the peer port is served over mutual TLS: then every caller must have presented
    /// a certificate of the cluster's CA (the TLS layer checked that) naming the node it claims.
    tls: bool,
}

impl PeerService {
    pub(crate) fn server(
        node: Arc<dyn Inbound>,
        cluster: String,
        tls: bool,
    ) -> PeerServer<PeerService> {
        PeerServer::new(PeerService { node, cluster, tls })
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// Admits a peer call, or says why not: it must come from this cluster (by name), carry the
    /// cluster's secret (a plain-text port that has one), come from the data dir incarnation
    /// the meta group recorded for its id (never a retired id), and under TLS from a node whose
    /// certificate names the id it claims. A call that knows this node by another incarnation
    /// stops this node: its own data dir is the new one (`book.rs`). Every method and the pipe
    /// pass here first; membership is checked per call (`dispatch`).
    fn admit<T>(&self, req: &tonic::Request<T>) -> Result<NodeId, tonic::Status> {
        let md = req.metadata();
        let header = |key: &str| md.get(key).and_then(|v| v.to_str().ok());
        match header(CLUSTER_HEADER) {
            Some(c) if c == self.cluster => {}
            Some(c) => {
                return Err(tonic::Status::permission_denied(format!(
                    "a peer of cluster '{c}' called cluster '{}'",
                    self.cluster
                )))
            }
            None => {
                return Err(tonic::Status::unauthenticated(format!(
                    "a peer call must name its cluster in '{CLUSTER_HEADER}'"
                )))
            }
        }
        let Some(from) = header(NODE_HEADER).and_then(|v| v.parse::<NodeId>().ok()) else {
            return Err(tonic::Status::unauthenticated(format!(
                "a peer call must name its node id in '{NODE_HEADER}'"
            )));
        };
        // Absent from callers older than the header; present, it must name this node.
        let me = self.node.node_id();
        if let Some(to) = header(TO_HEADER) {
            if to.parse::<NodeId>().ok() != Some(me) {
                return Err(tonic::Status::failed_precondition(format!(
                    "this is node {me}, not node {to}: node {from} has this node's peer \
                     address for node {to}"
                )));
            }
        }
        if self.tls {
            let certs = req.peer_certs().ok_or_else(|| {
                tonic::Status::unauthenticated("the peer port needs a client certificate")
            })?;
            let leaf = certs.first().ok_or_else(|| {
                tonic::Status::unauthenticated("the peer port needs a client certificate")
            })?;
            if !tls::names(leaf, &tls::peer_dns_name(from)) {
                return Err(tonic::Status::permission_denied(format!(
                    "the caller's certificate does not name {} (it claims node {from})",
                    tls::peer_dns_name(from)
                )));
            }
        }
        let book = self.node.book();
        book.check_secret(header(SECRET_HEADER))?;
        let given = header(INCARNATION_HEADER)
            .and_then(parse_incarnation)
            .unwrap_or(0);
        book.check_caller(from, given)?;
        // Told by a node the meta group recorded (not by anyone holding the secret; by any
        // caller only while this node knows no record, as a wiped one does) that it knows
        // this node by another incarnation: this node's data dir is the new one.
        if let Some(known) = header(TO_INCARNATION_HEADER).and_then(parse_incarnation) {
            let mine = book.incarnation();
            let vouched = book.incarnation_of(from) == Some(given) || book.knows_none();
            if mine != 0 && known != mine && vouched {
                let why = lockd_core::wiped_disk_message(me, known, mine);
                self.node.stop_for(why.clone());
                return Err(tonic::Status::failed_precondition(format!(
                    "node {me} is stopping: {why}"
                )));
            }
        }
        Ok(from)
    }

    async fn serve(
        &self,
        req: tonic::Request<PeerRequest>,
        method: Method,
    ) -> Result<tonic::Response<PeerReply>, tonic::Status> {
        let from = self.admit(&req)?;
        let req = req.into_inner();
        let payload = self
            .node
            .serve(method, req.group_id, &req.payload, Some(from))
            .await?;
        Ok(tonic::Response::new(PeerReply { payload }))
    }
}

#[tonic::async_trait]
impl pb::peer_server::Peer for PeerService {
    async fn append(
        &self,
        req: tonic::Request<PeerRequest>,
    ) -> Result<tonic::Response<PeerReply>, tonic::Status> {
        self.serve(req, Method::Append).await
    }

    async fn vote(
        &self,
        req: tonic::Request<PeerRequest>,
    ) -> Result<tonic::Response<PeerReply>, tonic::Status> {
        self.serve(req, Method::Vote).await
    }

    async fn pre_vote(
        &self,
        req: tonic::Request<PeerRequest>,
    ) -> Result<tonic::Response<PeerReply>, tonic::Status> {
        self.serve(req, Method::PreVote).await
    }

    async fn snapshot(
        &self,
        req: tonic::Request<PeerRequest>,
    ) -> Result<tonic::Response<PeerReply>, tonic::Status> {
        self.serve(req, Method::Snapshot).await
    }

    async fn propose(
        &self,
        req: tonic::Request<PeerRequest>,
    ) -> Result<tonic::Response<PeerReply>, tonic::Status> {
        self.serve(req, Method::Propose).await
    }

    async fn keepalive(
        &self,
        req: tonic::Request<PeerRequest>,
    ) -> Result<tonic::Response<PeerReply>, tonic::Status> {
        self.serve(req, Method::Keepalive).await
    }

    async fn read_index(
        &self,
        req: tonic::Request<PeerRequest>,
    ) -> Result<tonic::Response<PeerReply>, tonic::Status> {
        self.serve(req, Method::ReadIndex).await
    }

    async fn batch(
        &self,
        req: tonic::Request<PeerRequest>,
    ) -> Result<tonic::Response<PeerReply>, tonic::Status> {
        self.serve(req, Method::Batch).await
    }

    async fn transfer_leader(
        &self,
        req: tonic::Request<PeerRequest>,
    ) -> Result<tonic::Response<PeerReply>, tonic::Status> {
        self.serve(req, Method::TransferLeader).await
    }

    async fn member(
        &self,
        req: tonic::Request<PeerRequest>,
    ) -> Result<tonic::Response<PeerReply>, tonic::Status> {
        self.serve(req, Method::Member).await
    }

    async fn app(
        &self,
        req: tonic::Request<PeerRequest>,
    ) -> Result<tonic::Response<PeerReply>, tonic::Status> {
        self.serve(req, Method::App).await
    }

    type PipeStream = pipe::ReplyStream;

    async fn pipe(
        &self,
        req: tonic::Request<tonic::Streaming<pb::PipeRequest>>,
    ) -> Result<tonic::Response<Self::PipeStream>, tonic::Status> {
        let from = self.admit(&req)?;
        let node = self.node.clone();
        let closed = node.pipes_closed();
        Ok(tonic::Response::new(pipe::serve(
            req.into_inner(),
            move |method, group, payload| {
                let node = node.clone();
                async move { node.serve(method, group, &payload, Some(from)).await }
            },
            closed,
        )))
    }
}
