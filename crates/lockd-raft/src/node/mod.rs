//! A node: the replicas of the groups placed on this process, their leader duties, a handle on
//! every other group, and the peer service.
//!
//! `start` opens each hosted group's data (snapshot + log replay), starts its Raft instance and
//! its leader-duty task, and — on the lowest-id node a group is placed on, for groups that have
//! no membership yet — makes the placed nodes its voters, so a fresh cluster comes up by itself.

mod balance;
pub(crate) mod fatal;
mod inbound;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use crate::watch;
use tokio::task::JoinHandle;
use tracing::info;

use crate::group::remote::RemoteGroup;
use crate::group::{Group, Shared, Timing};
use crate::peer::{Method, PeerBook, PeerPool, PeerServer, PeerService, PeerTransport, Peers};
use crate::raft::replica::Replica;
use crate::raft::{MemberCall, MemberError, Membership, RaftGroup};
use crate::{
    AppHandler, EffectSink, GroupId, NodeClock, NodeConfig, NodeId, StartError, META_GROUP,
};

/// How long [`Node::member_call`] waits for a group to have a leader it can reach.
const MEMBER_CALL_LEADER_WAIT: Duration = Duration::from_secs(10);
/// How long a forwarded membership call may take: adding a member waits for it to catch up,
/// which for a large group means a snapshot.
const MEMBER_CALL_TIMEOUT: Duration = Duration::from_secs(120);
/// A learner that acknowledges nothing new for this long is not promoted (the add is refused,
/// naming why: a state of the cluster to fix, not a fault of the service; it stays a learner,
/// and repeating the call promotes it once it has caught up). While it makes progress (a snapshot, then the log) the wait goes on.
const CATCH_UP_STALL: Duration = Duration::from_secs(5);
/// A learner this close to the leader's last entry has caught up (openraft's default
/// `replication_lag_threshold`).
const CATCH_UP_LAG: u64 = 5_000;

/// Waits on `g`'s leader until learner `id` has acknowledged the log up to [`CATCH_UP_LAG`]
/// entries from its end. openraft's own blocking `add_learner` counts a learner that has
/// acknowledged nothing as caught up while the log is shorter than that threshold: promoting
/// such a node (a wrong address, a node never started) would give a one-voter group a second
/// voter that never votes, and stop it.
async fn caught_up(g: &Group, id: NodeId, addr: &str) -> Result<(), MemberError> {
    let mut best: Option<u64> = None;
    let mut progress_at = tokio::time::Instant::now();
    loop {
        let m = g.raft().membership();
        if m.voters.contains(&id) {
            return Ok(());
        }
        match m.lag.get(&id).copied().flatten() {
            Some(lag) if lag <= CATCH_UP_LAG => return Ok(()),
            Some(lag) if best.is_none_or(|b| lag < b) => {
                best = Some(lag);
                progress_at = tokio::time::Instant::now();
            }
            _ => {}
        }
        if progress_at.elapsed() >= CATCH_UP_STALL {
            let seen = match best {
                None => "acknowledged nothing".to_string(),
                Some(lag) => format!("is {lag} entries behind"),
            };
            return Err(MemberError::Refused(format!(
                "node {id} at {addr} {seen} after {}s: is it running there, joined with \
                 --initial-cluster-state existing? It stays a learner; repeat the call to \
                 promote it once it has caught up",
                CATCH_UP_STALL.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The most voters the meta group takes; further nodes follow it as learners. Five voters
/// survive two failures, and more would only slow every change of the cluster's configuration
/// (every node still needs a replica of it that follows the log: it serves names from it).
pub const META_MAX_VOTERS: usize = 5;
/// How many entries behind the leader a meta learner may be to replace a leaving voter.
const PROMOTE_MAX_LAG: u64 = 1_000;

/// How this node reaches a group: its own replica, or over the peer port.
#[derive(Clone)]
pub enum Route {
    /// This node hosts a replica that is a member of the group (a voter or a learner).
    Local(Arc<Group>),
    /// No member replica here: calls go to the group's leader (`group/remote.rs`).
    Remote(Arc<RemoteGroup>),
}

impl Route {
    pub fn id(&self) -> GroupId {
        match self {
            Route::Local(g) => g.id(),
            Route::Remote(r) => r.id(),
        }
    }

    /// [`Group::propose`], wherever the group is.
    pub async fn propose(&self, op: lockd_core::Op) -> crate::ProposeResult {
        match self {
            Route::Local(g) => g.propose(op).await,
            Route::Remote(r) => r.propose(op).await,
        }
    }

    /// [`Group::propose_full`], wherever the group is.
    pub async fn propose_full(&self, op: lockd_core::Op) -> crate::ProposedResult {
        match self {
            Route::Local(g) => g.propose_full(op).await,
            Route::Remote(r) => r.propose_full(op).await,
        }
    }

    /// [`Group::keepalive`], wherever the group is.
    pub async fn keepalive(
        &self,
        session: lockd_core::SessionId,
    ) -> Result<crate::Renewed, crate::GroupError> {
        match self {
            Route::Local(g) => g.keepalive(session).await,
            Route::Remote(r) => r.keepalive(session).await,
        }
    }
}

/// What opening one more group's replica takes (groups created on a running cluster).
struct Maker {
    cfg: NodeConfig,
    sink: Arc<dyn EffectSink>,
    clock: NodeClock,
    pool: Peers,
    timing: Timing,
    /// One group is opened at a time.
    opening: tokio::sync::Mutex<()>,
}

impl Maker {
    /// Opens the groups this node hosts at start: a founder the groups placed on it, a restart
    /// also every group it has data of (membership calls may have added it since, or the
    /// group was created on the running cluster), a joiner every founding group (empty until
    /// a membership call adds it). A group the cluster removed is never hosted again
    /// (`Node::unhost_group`).
    async fn open_groups(
        &self,
        placement: &BTreeMap<GroupId, Vec<NodeId>>,
        shared: &Shared,
    ) -> Result<BTreeMap<GroupId, Arc<Group>>, StartError> {
        let cfg = &self.cfg;
        let on_disk = matches!(cfg.storage, crate::Storage::Disk);
        let mut ids = Vec::new();
        for (&id, placed) in placement {
            let has_data = on_disk && cfg.data_dir.join(format!("group-{id}")).exists();
            if on_disk && removed_dir(&cfg.data_dir, id).exists() {
                info!(group = id, "not hosting a removed group");
            } else if placed.contains(&cfg.node_id) || has_data || cfg.join_existing {
                ids.push(id);
            }
        }
        if on_disk {
            ids.extend(created_group_dirs(&cfg.data_dir, placement));
        }
        let mut groups = BTreeMap::new();
        for id in ids {
            let (sink, pool) = (&self.sink, &self.pool);
            let g = open_group(cfg, id, sink, self.clock, pool, self.timing, shared).await?;
            groups.insert(id, g);
        }
        Ok(groups)
    }

    /// A handle on every founding group over the peer port, trying the nodes it is placed on
    /// first, then the other founders.
    fn remotes(
        &self,
        placement: &BTreeMap<GroupId, Vec<NodeId>>,
        founders: &[NodeId],
    ) -> BTreeMap<GroupId, Arc<RemoteGroup>> {
        let me = self.cfg.node_id;
        let mut remotes = BTreeMap::new();
        for (&id, placed) in placement {
            let mut candidates = placed.clone();
            candidates.extend(founders.iter().filter(|n| !placed.contains(n)));
            candidates.retain(|n| *n != me);
            if !candidates.is_empty() {
                let remote = RemoteGroup::new(id, me, candidates, self.pool.clone(), self.timing);
                remotes.insert(id, Arc::new(remote));
            }
        }
        remotes
    }
}

/// Every group hosted by this process.
pub struct Node {
    node_id: NodeId,
    groups: RwLock<BTreeMap<GroupId, Arc<Group>>>,
    maker: Maker,
    /// Serves [`crate::PeerMethod::App`] calls (set once by the embedding server).
    app: OnceLock<Arc<dyn AppHandler>>,
    duties: Mutex<Vec<JoinHandle<()>>>,
    stop: watch::Sender<bool>,
    /// Set when the node stops serving peers: ends the inbound pipes (`peer/pipe.rs`), which a
    /// graceful server shutdown would otherwise wait for.
    pipes_closing: watch::Sender<bool>,
    shutting_down: AtomicBool,
    /// The draining marks and remote handles, shared with the groups.
    shared: Shared,
    /// The first group that stopped by itself (`node/fatal.rs`).
    pub(crate) failed: watch::Sender<Option<crate::GroupFailure>>,
    /// Who may call this node's peer port (`peer/book.rs`).
    book: Arc<PeerBook>,
}

/// The retry and timeout budget of every group call, from the Raft timing.
fn timing(cfg: &NodeConfig) -> Timing {
    let election_max = Duration::from_millis(cfg.election_timeout_ms.1);
    Timing {
        election_max,
        retry_budget: (2 * election_max).max(Duration::from_secs(1)),
        retry_pause: Duration::from_millis((cfg.heartbeat_ms / 2).clamp(10, 100)),
        propose_timeout: Duration::from_secs(5).max(4 * election_max),
        skip_leader_lease_check: cfg.skip_leader_lease_check,
        balance_leaders: cfg.balance_leaders && cfg.peers.len() > 1,
    }
}

/// A hosted group's duties: its leader duties, and the watch that stops the node when the
/// group's storage fails.
fn group_duties(
    g: &Arc<Group>,
    stop: &watch::Sender<bool>,
    failed: &watch::Sender<Option<crate::GroupFailure>>,
) -> [JoinHandle<()>; 2] {
    [
        tokio::spawn(crate::group::leader::run(g.clone(), stop.subscribe())),
        tokio::spawn(crate::node::fatal::watch_group(g.clone(), failed.clone())),
    ]
}

/// Initialises the membership of each founding group this node is the lowest-id founder of
/// (a no-op for a group that already has one).
async fn initialise(
    cfg: &NodeConfig,
    placement: &BTreeMap<GroupId, Vec<NodeId>>,
    groups: &BTreeMap<GroupId, Arc<Group>>,
) -> Result<(), StartError> {
    for (id, g) in groups {
        let Some(placed) = placement.get(id) else {
            continue;
        };
        if placed.first() != Some(&cfg.node_id) {
            continue;
        }
        let members: BTreeMap<NodeId, String> = cfg
            .peers
            .iter()
            .filter(|(n, _)| placed.contains(n))
            .map(|(n, a)| (*n, a.clone()))
            .collect();
        let fresh = g
            .raft()
            .initialize(&members)
            .await
            .map_err(|message| StartError::Raft {
                group: *id,
                message,
            })?;
        if fresh {
            info!(group = id, members = ?members.keys(), "initialised group membership");
        }
    }
    Ok(())
}

fn validate(cfg: &NodeConfig) -> Result<(), StartError> {
    let bad = |why: String| Err(StartError::Config(why));
    if (cfg.skip_leader_lease_check || cfg.skip_read_lease_check || cfg.skip_ownership_check)
        && !cfg!(feature = "negative-controls")
    {
        return bad(
            "a negative control (skip_leader_lease_check, skip_read_lease_check, \
             skip_ownership_check) is set, and \
             this build has none (they exist for lockd-check only: feature negative-controls)"
                .into(),
        );
    }
    if !cfg.peers.contains_key(&cfg.node_id) {
        return bad(format!(
            "node_id {} is not among peers {:?}",
            cfg.node_id,
            cfg.peers.keys()
        ));
    }
    let (min, max) = cfg.election_timeout_ms;
    if cfg.heartbeat_ms == 0 || min <= cfg.heartbeat_ms || max <= min {
        return bad(format!(
            "need 0 < heartbeat_ms ({}) < election_timeout_ms.0 ({min}) < election_timeout_ms.1 ({max})",
            cfg.heartbeat_ms
        ));
    }
    if cfg.snapshot_every == 0 {
        return bad("snapshot_every must be positive".into());
    }
    let name_ok = |c: char| c.is_ascii_alphanumeric() || "._-".contains(c);
    if cfg.cluster_name.is_empty()
        || cfg.cluster_name.len() > 64
        || !cfg.cluster_name.chars().all(name_ok)
    {
        return bad(format!(
            "cluster name '{}' must be 1-64 characters of A-Z a-z 0-9 . _ -",
            cfg.cluster_name
        ));
    }
    validate_zones(cfg).map_err(StartError::Config)
}

/// The zones a node is started with: valid names, and on a founder, every founder's zone with
/// its own among them and no group of the founding placement in a zone majority (unless
/// allowed).
fn validate_zones(cfg: &NodeConfig) -> Result<(), String> {
    if !cfg.zone.is_empty() {
        crate::check_zone(&cfg.zone).map_err(|e| format!("--zone: {e}"))?;
    }
    for z in cfg.founder_zones.values() {
        crate::check_zone(z).map_err(|e| format!("--initial-zones: {e}"))?;
    }
    if cfg.join_existing {
        return Ok(());
    }
    let founders: Vec<NodeId> = cfg.peers.keys().copied().collect();
    if cfg.founder_zones.is_empty() {
        if !cfg.zone.is_empty() && founders.len() > 1 {
            return Err(format!(
                "--zone {} on a founder needs every founder's zone, so that the groups are \
                 placed over them: give --initial-zones (the same on every founder, e.g. \
                 {})",
                cfg.zone,
                founders
                    .iter()
                    .map(|n| format!("{n}=ZONE"))
                    .collect::<Vec<_>>()
                    .join(",")
            ));
        }
        return Ok(());
    }
    let named: Vec<NodeId> = cfg.founder_zones.keys().copied().collect();
    if named != founders {
        return Err(format!(
            "--initial-zones names nodes {named:?}; it must name every founder in --peers, \
             {founders:?}, once"
        ));
    }
    let mine = &cfg.founder_zones[&cfg.node_id];
    if !cfg.zone.is_empty() && cfg.zone != *mine {
        return Err(format!(
            "--zone {} and --initial-zones (node {}={mine}) disagree",
            cfg.zone, cfg.node_id
        ));
    }
    if cfg.allow_zone_majority {
        return Ok(());
    }
    let placement =
        crate::initial_placement(&founders, cfg.lock_groups, cfg.replicas, &cfg.founder_zones);
    for (g, voters) in &placement {
        if let Some(m) = crate::zone_majority(voters, &cfg.founder_zones) {
            let group = match *g {
                META_GROUP => "the meta group (on every founder)".to_string(),
                g => format!("lock group {g}"),
            };
            return Err(format!(
                "--initial-zones {}: in {group}, {m}. Spread the founders so that no zone holds \
                 a majority, or say --allow-zone-majority",
                crate::format_zones(&cfg.founder_zones)
            ));
        }
    }
    Ok(())
}

impl Node {
    /// Opens and recovers every group (0..=lock_groups) under `data_dir`, starts Raft for each,
    /// and initialises fresh groups if this node has the lowest id among the peers.
    pub async fn start(
        mut cfg: NodeConfig,
        sink: Arc<dyn EffectSink>,
    ) -> Result<Arc<Node>, StartError> {
        validate(&cfg)?;
        let recorded = record_identity(&mut cfg)?;
        let incarnation = recorded.as_ref().map_or(0, |r| r.incarnation);
        let book = Arc::new(PeerBook::new(incarnation, cfg.peer_secret.clone()));
        let pool = PeerPool::new(
            &cfg.peers,
            &cfg.cluster_name,
            cfg.node_id,
            cfg.peer_tls.as_ref(),
            book.clone(),
        )
        .map_err(StartError::Config)?;
        let pool: Arc<dyn PeerTransport> = Arc::new(pool);
        if recorded.as_ref().is_some_and(|r| r.fresh) {
            if let Err(e) = ask_peers_first(&cfg, &*pool).await {
                // Forget the new identity, so that a supervisor's restart asks again.
                let _ = std::fs::remove_file(cfg.data_dir.join(crate::identity::FILE));
                return Err(e);
            }
        }
        Node::start_inner(cfg, sink, pool, book).await
    }

    /// [`Node::start`] with peer calls sent through `transport` instead of the gRPC pool (the
    /// simulator's in-process network; inbound calls then arrive through [`Node::serve_peer`]).
    pub async fn start_with_transport(
        mut cfg: NodeConfig,
        sink: Arc<dyn EffectSink>,
        transport: Arc<dyn PeerTransport>,
    ) -> Result<Arc<Node>, StartError> {
        validate(&cfg)?;
        let incarnation = record_identity(&mut cfg)?.map_or(0, |r| r.incarnation);
        let book = Arc::new(PeerBook::new(incarnation, cfg.peer_secret.clone()));
        Node::start_inner(cfg, sink, transport, book).await
    }

    async fn start_inner(
        cfg: NodeConfig,
        sink: Arc<dyn EffectSink>,
        transport: Arc<dyn PeerTransport>,
        book: Arc<PeerBook>,
    ) -> Result<Arc<Node>, StartError> {
        let timing = timing(&cfg);
        let pool = Peers::new(transport);
        let clock = NodeClock::new(cfg.clock_rate);
        let shared = Shared {
            book: Some(book.clone()),
            ..Shared::default()
        };
        let maker = Maker {
            cfg,
            sink,
            clock,
            pool,
            timing,
            opening: tokio::sync::Mutex::new(()),
        };
        let founders: Vec<NodeId> = maker.cfg.peers.keys().copied().collect();
        let placement = crate::initial_placement(
            &founders,
            maker.cfg.lock_groups,
            maker.cfg.replicas,
            &maker.cfg.founder_zones,
        );
        let groups = maker.open_groups(&placement, &shared).await?;
        *shared.remotes.write().expect("remotes poisoned") = maker.remotes(&placement, &founders);
        if !maker.cfg.join_existing {
            initialise(&maker.cfg, &placement, &groups).await?;
        }
        let (stop, _) = watch::channel(false);
        let (failed, _) = watch::channel(None);
        let duties = groups
            .values()
            .flat_map(|g| group_duties(g, &stop, &failed))
            .collect();
        info!(
            node = maker.cfg.node_id,
            groups = groups.len(),
            "node started"
        );
        let node = Arc::new(Node {
            node_id: maker.cfg.node_id,
            groups: RwLock::new(groups),
            maker,
            app: OnceLock::new(),
            duties: Mutex::new(duties),
            stop,
            pipes_closing: watch::channel(false).0,
            shutting_down: AtomicBool::new(false),
            shared,
            failed,
            book,
        });
        if timing.balance_leaders {
            // Over the groups hosted at each check, so groups created later are balanced too.
            let balancer = crate::node::balance::run(Arc::downgrade(&node), node.stop.subscribe());
            node.duties
                .lock()
                .expect("duties poisoned")
                .push(tokio::spawn(balancer));
        }
        Ok(node)
    }

    /// This node's zone ("": none declared), as its data dir records it.
    pub fn zone(&self) -> &str {
        &self.maker.cfg.zone
    }

    /// Every founder's zone as the founding placement used them (empty: zone-blind, or a node
    /// that joined an existing cluster).
    pub fn founder_zones(&self) -> &crate::Zones {
        &self.maker.cfg.founder_zones
    }

    /// This node's data dir incarnation (0: storage in memory, not tracked).
    pub fn incarnation(&self) -> u64 {
        self.book.incarnation()
    }

    pub(crate) fn peer_book(&self) -> &PeerBook {
        &self.book
    }

    /// Admits a peer call of `method` on group `group` from node `from` by membership, or says
    /// why not. Raft's elections (vote, pre-vote, leadership transfer) only from a member of
    /// the group as this node's replica knows it. Every other call from a node of the cluster
    /// (a member of a group this node hosts, or a peer it has an address for): `Ok(true)`. A
    /// caller that is neither is a *stranger* (`Ok(false)`): a joiner waiting to be added, or
    /// not a node at all; `dispatch_one` takes from it only what a joiner needs before its add
    /// (`Op::stranger_may_propose`). A node none of whose replicas has a membership yet (a
    /// joiner itself) knows nobody, and takes every caller as a node: it holds nothing yet.
    pub(crate) fn admit_member(
        &self,
        from: NodeId,
        method: Method,
        group: GroupId,
    ) -> Result<bool, tonic::Status> {
        let election = matches!(
            method,
            Method::Vote | Method::PreVote | Method::TransferLeader
        );
        if election {
            if let Some(g) = self.group(group) {
                let m = g.raft().membership();
                let member = m.voters.contains(&from) || m.learners.contains(&from);
                if member || (m.voters.is_empty() && m.learners.is_empty()) {
                    return Ok(true);
                }
                return Err(tonic::Status::permission_denied(format!(
                    "node {from} is not a member of group {group}: it may not call elections"
                )));
            }
        }
        if from == self.node_id || self.maker.pool.knows(from) {
            return Ok(true);
        }
        let memberships = self.memberships();
        if memberships.values().any(|m| m.addrs.contains_key(&from)) {
            return Ok(true);
        }
        Ok(memberships
            .values()
            .all(|m| m.voters.is_empty() && m.learners.is_empty()))
    }

    /// Records the nodes marked draining (the meta group's mark, as the server last read it).
    pub fn set_draining(&self, nodes: BTreeSet<NodeId>) {
        let mut d = self.shared.draining.write().expect("draining poisoned");
        if *d != nodes {
            info!(node = self.node_id, draining = ?nodes, "draining nodes changed");
            *d = nodes;
        }
    }

    /// The nodes marked draining, as last recorded by [`Node::set_draining`].
    pub fn draining(&self) -> BTreeSet<NodeId> {
        self.shared
            .draining
            .read()
            .expect("draining poisoned")
            .clone()
    }

    /// Every group replica this node hosts now.
    pub(crate) fn hosted_groups(&self) -> Vec<Arc<Group>> {
        self.hosted().values().cloned().collect()
    }

    /// The tonic service carrying peer traffic (Raft RPCs and forwarded proposals, keepalives
    /// and reads). Add it to the node's gRPC server next to the client API:
    /// `Server::builder().add_service(node.peer_service())`. Its address must be the one the
    /// other nodes have for this node in `peers`.
    pub fn peer_service(self: &Arc<Self>) -> PeerServer<PeerService> {
        let cfg = &self.maker.cfg;
        PeerService::server(
            self.clone(),
            cfg.cluster_name.clone(),
            cfg.peer_tls.is_some(),
        )
    }

    /// Serves one inbound peer call (`method` for group `group`, postcard `payload`) exactly as
    /// the gRPC peer service would: the entry point of an in-process (simulated) network.
    pub async fn serve_peer(
        &self,
        method: Method,
        group: GroupId,
        payload: &[u8],
    ) -> Result<Vec<u8>, tonic::Status> {
        inbound::dispatch(self, method, group, payload, None).await
    }

    /// This node's replica of group `id`, if it hosts one (it may not be a member yet: a
    /// joiner's empty replica; [`Node::route`] tells).
    pub fn group(&self, id: GroupId) -> Option<Arc<Group>> {
        self.hosted().get(&id).cloned()
    }

    fn hosted(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<GroupId, Arc<Group>>> {
        self.groups.read().expect("groups poisoned")
    }

    /// Hosts a replica of group `id` (a group created on the running cluster and placed here),
    /// if it does not yet: opens its data, starts Raft and the leader duties. With
    /// `initialise`, makes `members` (node id → peer address) its voters if it has no
    /// membership yet. Idempotent.
    pub async fn host_group(
        &self,
        id: GroupId,
        members: &BTreeMap<NodeId, String>,
        initialise: bool,
    ) -> Result<(), StartError> {
        let _one = self.maker.opening.lock().await;
        if self.is_shutting_down() {
            return Err(StartError::Config("the node is stopping".into()));
        }
        let g = match self.group(id) {
            Some(g) => g,
            None => {
                let m = &self.maker;
                let g = open_group(
                    &m.cfg,
                    id,
                    &m.sink,
                    m.clock,
                    &m.pool,
                    m.timing,
                    &self.shared,
                )
                .await?;
                self.duties
                    .lock()
                    .expect("duties poisoned")
                    .extend(group_duties(&g, &self.stop, &self.failed));
                self.groups
                    .write()
                    .expect("groups poisoned")
                    .insert(id, g.clone());
                info!(
                    node = self.node_id,
                    group = id,
                    "hosting a replica of a new group"
                );
                g
            }
        };
        if initialise {
            for (n, addr) in members {
                self.maker.pool.learn_addr(*n, addr);
            }
            let fresh = g
                .raft()
                .initialize(members)
                .await
                .map_err(|message| StartError::Raft { group: id, message })?;
            if fresh {
                info!(group = id, members = ?members.keys(), "initialised group membership");
            }
        }
        Ok(())
    }

    /// Stops hosting group `id`, a group the cluster removed: shuts its replica down, forgets
    /// where the group is, and (on disk) renames its data dir to `group-<id>.removed`, so no
    /// later start of this node hosts it again (a founding group above all, which a founder
    /// would otherwise start and initialise afresh). Returns whether it hosted the group.
    /// Idempotent.
    pub async fn unhost_group(&self, id: GroupId) -> std::io::Result<bool> {
        let _one = self.maker.opening.lock().await;
        self.shared
            .remotes
            .write()
            .expect("remotes poisoned")
            .remove(&id);
        let g = self.groups.write().expect("groups poisoned").remove(&id);
        if let Some(g) = &g {
            g.shutdown().await;
        }
        if matches!(self.maker.cfg.storage, crate::Storage::Disk) {
            let dir = self.maker.cfg.data_dir.join(format!("group-{id}"));
            if dir.exists() {
                std::fs::rename(&dir, removed_dir(&self.maker.cfg.data_dir, id))?;
                std::fs::File::open(&self.maker.cfg.data_dir)?.sync_all()?;
            }
        }
        if g.is_some() {
            info!(
                node = self.node_id,
                group = id,
                "stopped hosting a removed group"
            );
        }
        Ok(g.is_some())
    }

    /// The lock groups this cluster was founded with and the nodes each was placed on; `None`
    /// on a node that joined an existing cluster (it does not know how that was founded).
    pub fn founding_placement(&self) -> Option<BTreeMap<GroupId, Vec<NodeId>>> {
        let cfg = &self.maker.cfg;
        if cfg.join_existing {
            return None;
        }
        let founders: Vec<NodeId> = cfg.peers.keys().copied().collect();
        let mut p =
            crate::initial_placement(&founders, cfg.lock_groups, cfg.replicas, &cfg.founder_zones);
        p.remove(&META_GROUP);
        Some(p)
    }

    /// Records node `id`'s peer address (as a membership has it), unless one is known.
    pub fn learn_addr(&self, id: NodeId, addr: &str) {
        self.maker.pool.learn_addr(id, addr);
    }

    /// Knows group `id` as placed on `candidates` (tried first, in order, then `others`), for
    /// when this node has no member replica of it. Replaces what it knew.
    pub fn know_group(&self, id: GroupId, candidates: &[NodeId], others: &[NodeId]) {
        let mut order: Vec<NodeId> = candidates.to_vec();
        order.extend(others.iter().filter(|n| !candidates.contains(n)));
        order.retain(|n| *n != self.node_id);
        if order.is_empty() {
            return;
        }
        let mut remotes = self.shared.remotes.write().expect("remotes poisoned");
        if remotes.get(&id).is_some_and(|r| r.candidates() == order) {
            return;
        }
        let r = RemoteGroup::new(
            id,
            self.node_id,
            order,
            self.maker.pool.clone(),
            self.maker.timing,
        );
        remotes.insert(id, Arc::new(r));
    }

    /// How to reach group `id`: the local replica if it is a member, else the remote handle.
    /// `None` for a group the cluster does not have (or a one-node cluster's missing group).
    pub fn route(&self, id: GroupId) -> Option<Route> {
        let remote = || {
            self.shared
                .remotes
                .read()
                .expect("remotes poisoned")
                .get(&id)
                .map(|r| Route::Remote(r.clone()))
        };
        match self.group(id) {
            // A stranded replica (`Group::is_stranded`) sends its calls to the other nodes.
            Some(g) if g.raft().is_member(self.node_id) => match g.is_stranded() {
                true => remote().or(Some(Route::Local(g))),
                false => Some(Route::Local(g)),
            },
            _ => remote(),
        }
    }

    /// Sets the handler of [`crate::PeerMethod::App`] calls. Once; later calls are ignored.
    pub fn set_app_handler(&self, handler: Arc<dyn AppHandler>) {
        let _ = self.app.set(handler);
    }

    /// An app call addressed to node `target` itself ([`crate::NODE_CALL`]), at `addr` if this
    /// node has no address for it yet. Only a member of the cluster is served there.
    pub async fn app_call_node(
        &self,
        target: NodeId,
        addr: &str,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, tonic::Status> {
        if !self.maker.pool.knows(target) {
            self.maker.pool.learn_addr(target, addr);
        }
        (self.maker.pool)
            .call(target, Method::App, crate::NODE_CALL, payload, timeout)
            .await
    }

    pub(crate) async fn serve_app(
        &self,
        group: GroupId,
        payload: Vec<u8>,
    ) -> Result<Vec<u8>, tonic::Status> {
        match self.app.get() {
            Some(h) => h.serve(group, payload).await,
            None => Err(tonic::Status::unavailable(
                "this node serves no app calls yet",
            )),
        }
    }

    /// The groups this node hosts a replica of (a joiner's may not be members yet).
    pub fn group_ids(&self) -> Vec<GroupId> {
        self.hosted().keys().copied().collect()
    }

    /// Every group of the cluster, hosted here or not.
    pub fn all_group_ids(&self) -> Vec<GroupId> {
        let remotes = self.shared.remotes.read().expect("remotes poisoned");
        let mut ids: Vec<GroupId> = self
            .hosted()
            .keys()
            .chain(remotes.keys())
            .copied()
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    /// What this node's replica of `group` keeps on disk: its log's files and its snapshot
    /// (`None` on memory storage or with no replica of the group here).
    pub fn disk_usage(&self, group: GroupId) -> Option<DiskUsage> {
        let cfg = &self.maker.cfg;
        if !matches!(cfg.storage, crate::Storage::Disk) || self.group(group).is_none() {
            return None;
        }
        let dir = cfg.data_dir.join(format!("group-{group}"));
        let log_bytes = std::fs::read_dir(dir.join("log"))
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.metadata().ok())
            .filter(|m| m.is_file())
            .map(|m| m.len())
            .sum();
        let snapshot_bytes =
            std::fs::metadata(dir.join(crate::raft::SNAPSHOT_FILE)).map_or(0, |m| m.len());
        Some(DiskUsage {
            log_bytes,
            snapshot_bytes,
        })
    }

    /// The negative controls this node runs with (lockd-check's sabotage; empty in any
    /// normal node): status, `/readyz` and `/metrics` name them, since such a node is unsafe.
    pub fn negative_controls(&self) -> Vec<&'static str> {
        let cfg = &self.maker.cfg;
        let on = [
            (cfg.skip_leader_lease_check, "skip-leader-lease-check"),
            (cfg.skip_read_lease_check, "skip-read-lease-check"),
            (cfg.skip_ownership_check, "skip-ownership-check"),
        ];
        on.into_iter()
            .filter(|(set, _)| *set)
            .map(|(_, n)| n)
            .collect()
    }

    /// Every hosted group's membership, as this node's replica sees it.
    pub fn memberships(&self) -> BTreeMap<GroupId, Membership> {
        self.hosted()
            .iter()
            .map(|(id, g)| (*id, g.raft().membership()))
            .collect()
    }

    fn member_group(&self, group: GroupId) -> Result<Arc<Group>, MemberError> {
        self.group(group)
            .ok_or_else(|| MemberError::Refused(format!("this node hosts no group {group}")))
    }

    /// A membership call on group `group`, sent to its leader wherever it is: this node serves
    /// it if it leads, else forwards it over the peer port to the leader it knows of (following
    /// a hand-over, waiting out an election, repeating a forward that failed: every call is
    /// idempotent). Answers the membership after
    /// the call, as the leader sees it (with each member's lag).
    pub async fn member_call(
        &self,
        group: GroupId,
        call: MemberCall,
    ) -> Result<Membership, MemberError> {
        let g = match self.route(group) {
            Some(Route::Local(g)) => g,
            Some(Route::Remote(r)) => {
                return r
                    .member_call(&call, MEMBER_CALL_LEADER_WAIT, MEMBER_CALL_TIMEOUT)
                    .await
            }
            None => {
                return Err(self
                    .member_group(group)
                    .err()
                    .unwrap_or_else(|| MemberError::Refused(format!("there is no group {group}"))))
            }
        };
        let g = &g;
        let deadline = tokio::time::Instant::now() + MEMBER_CALL_LEADER_WAIT;
        let mut last = MemberError::NotLeader { leader: None };
        while tokio::time::Instant::now() < deadline {
            let r = match g.raft().role().leader {
                Some(l) if l == self.node_id => self.member_call_local(group, &call).await,
                Some(l) => {
                    let payload = postcard::to_allocvec(&call)
                        .map_err(|e| MemberError::Unavailable(e.to_string()))?;
                    match g
                        .peers()
                        .call(l, Method::Member, group, payload, MEMBER_CALL_TIMEOUT)
                        .await
                    {
                        Ok(bytes) => postcard::from_bytes(&bytes).map_err(|e| {
                            MemberError::Unavailable(format!("bad reply from node {l}: {e}"))
                        })?,
                        // Every member call is idempotent, so a failed forward is simply
                        // repeated (the leader may have died: wait for the next one).
                        Err(st) => {
                            if let Some(addr) = g.raft().membership().addrs.get(&l) {
                                self.learn_addr(l, addr);
                            }
                            last = MemberError::Unavailable(format!(
                                "forwarding to leader node {l} failed ({}: {})",
                                st.code(),
                                st.message()
                            ));
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    }
                }
                None => Err(MemberError::NotLeader { leader: None }),
            };
            match r {
                // A hand-over or an election is under way: ask again shortly.
                Err(e @ MemberError::NotLeader { .. }) => last = e,
                other => return other,
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(last)
    }

    /// Serves a membership call on this node only (the leader's side of [`Node::member_call`]).
    pub(crate) async fn member_call_local(
        &self,
        group: GroupId,
        call: &MemberCall,
    ) -> Result<Membership, MemberError> {
        let g = self.member_group(group)?;
        if !g.raft().role().is_leader {
            return Err(MemberError::NotLeader {
                leader: g.raft().role().leader,
            });
        }
        match call {
            MemberCall::Describe => {}
            MemberCall::Add { id, addr } => self.add_member(group, *id, addr).await?,
            MemberCall::Remove { id } => self.remove_member(group, *id).await?,
        }
        Ok(g.raft().membership())
    }

    /// On group `group`'s leader: makes node `id` (peer address `addr`) a voter. It joins as a
    /// learner first and is promoted only once it has caught up (by log or snapshot), so the
    /// group never counts on a voter that cannot vote yet. Idempotent: repeating a finished or
    /// interrupted call completes it. The new node must run with `--initial-cluster-state
    /// existing` and an empty data dir; a node id is never reused.
    ///
    /// The meta group takes at most [`META_MAX_VOTERS`] voters: a node added past that stays a
    /// learner of it (it follows the cluster's configuration and serves names; it does not
    /// vote), and is promoted when a voter leaves.
    pub async fn add_member(
        &self,
        group: GroupId,
        id: NodeId,
        addr: &str,
    ) -> Result<(), MemberError> {
        let g = self.member_group(group)?;
        let m = g.raft().membership();
        if !m.voters.contains(&id) || m.joint {
            g.raft().add_learner(id, addr).await?;
        }
        if group == crate::META_GROUP
            && !m.voters.contains(&id)
            && m.voters.len() >= META_MAX_VOTERS
        {
            return Ok(());
        }
        if !m.voters.contains(&id) {
            caught_up(&g, id, addr).await?;
        }
        g.raft().promote(id).await
    }

    /// On group `group`'s leader: removes node `id` from it. If `id` is this leader, the group
    /// is first handed to a voter that has the whole log and the call answers
    /// [`MemberError::NotLeader`] naming it: repeat the call there. Idempotent.
    pub async fn remove_member(&self, group: GroupId, id: NodeId) -> Result<(), MemberError> {
        let g = self.member_group(group)?;
        let raft = g.raft();
        let role = raft.role();
        if role.is_leader && id == self.node_id {
            if raft.membership().voters == [id] {
                return Err(MemberError::Refused(format!(
                    "node {id} is the group's only voter"
                )));
            }
            let to = raft
                .membership()
                .voters
                .into_iter()
                .find(|v| *v != id && raft.has_whole_log(*v))
                .ok_or_else(|| {
                    MemberError::Unavailable(
                        "no other voter has the whole log yet to take the group over".into(),
                    )
                })?;
            raft.transfer_leader(to).await;
            return Err(MemberError::NotLeader { leader: Some(to) });
        }
        raft.remove(id).await?;
        // The meta group keeps its voters while it has learners to promote (the one furthest
        // along the log, which the leader replicates to like any member): a leaving voter is
        // replaced, not just lost.
        if group == crate::META_GROUP {
            let m = raft.membership();
            if m.voters.len() < META_MAX_VOTERS && !m.joint {
                let lag = |l: &NodeId| m.lag.get(l).copied().flatten().unwrap_or(u64::MAX);
                // Never one that would give a zone a majority of the voters (fewer voters
                // lose less when that zone fails).
                let zones = g.read_local(|t| t.zones().clone());
                let keeps_zones = |l: NodeId| {
                    let mut v = m.voters.clone();
                    v.push(l);
                    crate::zone_majority(&v, &zones).is_none()
                };
                let next = m
                    .learners
                    .iter()
                    .filter(|l| **l != id && lag(l) <= PROMOTE_MAX_LAG && keeps_zones(**l))
                    .min_by_key(|l| (lag(l), **l));
                if let Some(&l) = next {
                    raft.promote(l).await?;
                }
            }
        }
        Ok(())
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    /// Ends every peer's inbound pipe to this node. Call it when the gRPC server stops: a
    /// graceful shutdown waits for open streams, and a pipe stays open as long as its peer runs.
    /// Peers reopen theirs on their next call, and reach this node again if it still serves.
    pub fn close_peer_pipes(&self) {
        self.pipes_closing.send_replace(true);
    }

    /// Resolves once [`Node::close_peer_pipes`] has been called.
    pub(crate) fn pipes_closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.pipes_closing.subscribe();
        async move {
            let _ = rx.wait_for(|c| *c).await;
        }
    }

    /// Stops leader duties and every Raft instance; calls then fail with `ShuttingDown` and
    /// peers see this node as unreachable. The data directories are released, so the node can
    /// be started again in the same process.
    /// Graceful leave: hands every group this node leads to an up-to-date voter that is in
    /// touch, and waits (up to `limit`) until each has a new leader, so that stopping this node
    /// costs the groups a hand-over (no proposals for a moment) instead of an election timeout.
    /// Groups with no voter to take them are left as they are. Returns (handed over, left).
    pub async fn hand_over(&self, limit: Duration) -> (usize, usize) {
        let started = tokio::time::Instant::now();
        let mut moving = Vec::new();
        let mut left = 0;
        let hosted = self.hosted_groups();
        let draining = self.draining();
        for g in &hosted {
            let raft = g.raft();
            // A follower has nothing to hand over, nor a leader that is the only voter.
            if !raft.role().is_leader || raft.membership().voters.len() < 2 {
                continue;
            }
            match raft.handover_target(g.election_timeout_max(), &draining) {
                Some(to) => {
                    raft.transfer_leader(to).await;
                    moving.push(g.clone());
                }
                None => left += 1,
            }
        }
        let mut handed = 0;
        while !moving.is_empty() && started.elapsed() < limit {
            moving.retain(|g| {
                let leader = g.raft().role().leader;
                let done = leader.is_some() && leader != Some(self.node_id);
                handed += usize::from(done);
                !done
            });
            if !moving.is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        left += moving.len();
        if handed + left == 0 {
            return (0, 0);
        }
        info!(
            node = self.node_id,
            handed,
            left,
            took_ms = started.elapsed().as_millis() as u64,
            "handed over led groups before stopping"
        );
        (handed, left)
    }

    /// On group `group`'s leader: hands it to voter `to` (openraft's TransferLeader). Ignored
    /// on a follower; the outcome shows as the next role change.
    pub async fn hand_over_group(&self, group: GroupId, to: NodeId) {
        if let Some(g) = self.group(group) {
            g.raft().transfer_leader(to).await;
        }
    }

    pub async fn shutdown(&self) {
        if self.shutting_down.swap(true, Ordering::AcqRel) {
            return;
        }
        self.stop.send_replace(true);
        self.close_peer_pipes();
        let duties: Vec<_> = std::mem::take(&mut *self.duties.lock().expect("duties poisoned"));
        for d in duties {
            d.abort();
            let _ = d.await;
        }
        let _one = self.maker.opening.lock().await;
        let hosted: Vec<Arc<Group>> = self.hosted().values().cloned().collect();
        for g in hosted {
            g.shutdown().await;
        }
        info!(node = self.node_id, "node stopped");
    }
}

async fn open_group(
    cfg: &NodeConfig,
    id: GroupId,
    sink: &Arc<dyn EffectSink>,
    clock: NodeClock,
    pool: &Peers,
    timing: Timing,
    shared: &Shared,
) -> Result<Arc<Group>, StartError> {
    let dir = cfg.data_dir.join(format!("group-{id}"));
    let book = (id == META_GROUP).then(|| shared.book.clone()).flatten();
    let replica = Arc::new(Replica::new(
        id,
        sink.clone(),
        clock,
        cfg.skip_ownership_check,
        book,
    ));
    let raft = RaftGroup::start(
        cfg,
        id,
        &dir,
        replica.clone(),
        pool.clone(),
        shared.entry_slots.clone(),
    )
    .await?;
    Ok(Arc::new(Group::new(
        id,
        raft,
        replica,
        pool.clone(),
        timing,
        shared.clone(),
    )))
}

/// Bytes a replica keeps on disk ([`Node::disk_usage`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskUsage {
    /// The log's files: segments not yet compacted into a snapshot, and the vote.
    pub log_bytes: u64,
    /// The last snapshot (0 before the first).
    pub snapshot_bytes: u64,
}

/// Where a removed group's data goes.
fn removed_dir(data_dir: &std::path::Path, id: GroupId) -> std::path::PathBuf {
    data_dir.join(format!("group-{id}.removed"))
}

/// The `group-<id>` dirs under `data_dir` of groups outside the founding placement.
fn created_group_dirs(
    data_dir: &std::path::Path,
    placement: &BTreeMap<GroupId, Vec<NodeId>>,
) -> Vec<GroupId> {
    let Ok(entries) = std::fs::read_dir(data_dir) else {
        return Vec::new();
    };
    let mut ids: Vec<GroupId> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("group-")?.parse().ok())
        .filter(|id| !placement.contains_key(id))
        .collect();
    ids.sort_unstable();
    ids
}

/// Checks (or records, on a first start) the data dir's identity; `None` for storage in memory.
/// Checks or records the data dir's identity ([`crate::Identity`]) and takes the zones it
/// records into `cfg`: those are the ones the node serves with (a founder's later start that
/// omits the flags, or a dir founded before zones).
fn record_identity(cfg: &mut NodeConfig) -> Result<Option<crate::identity::Recorded>, StartError> {
    if cfg.join_existing {
        cfg.founder_zones.clear();
    }
    if !matches!(cfg.storage, crate::Storage::Disk) {
        return Ok(None);
    }
    let me = crate::Identity {
        cluster: cfg.cluster_name.clone(),
        node_id: cfg.node_id,
        lock_groups: cfg.lock_groups,
        replicas: cfg.replicas,
        zone: cfg.zone.clone(),
        founder_zones: cfg.founder_zones.clone(),
    };
    let r = me
        .check_or_record(&cfg.data_dir)
        .map_err(StartError::Identity)?;
    if !r.fresh && r.founder_zones.is_empty() && !cfg.founder_zones.is_empty() {
        tracing::warn!(
            node = cfg.node_id,
            "this data dir was founded without zones: its founding placement stays as it was \
             (--initial-zones is not used for it); move replicas with membership calls"
        );
    }
    cfg.zone = r.zone.clone();
    cfg.founder_zones = r.founder_zones.clone();
    if r.fresh {
        info!(node = cfg.node_id, cluster = %cfg.cluster_name, incarnation = %format!("{:016x}", r.incarnation), "recorded the data dir's identity");
    }
    Ok(Some(r))
}

/// How long a node with a new data dir waits for each peer's answer before it starts.
const HELLO_TIMEOUT: Duration = Duration::from_secs(2);

/// A node whose data dir is new asks every other peer, before it opens a group, whether the
/// cluster knows its id by another data dir (as etcd's "member has already been
/// bootstrapped"): a wiped disk restarted under its old id is refused here, with the fix,
/// before it can initialise a group or vote. A peer that cannot be reached says nothing: a
/// new cluster's founders start in any order. If every peer is down, the peers' own checks
/// (`peer/book.rs`) refuse the node and stop it when they come back.
async fn ask_peers_first(cfg: &NodeConfig, pool: &dyn PeerTransport) -> Result<(), StartError> {
    let others: Vec<NodeId> = cfg
        .peers
        .keys()
        .copied()
        .filter(|n| *n != cfg.node_id)
        .collect();
    let asks = others.iter().map(|&n| async move {
        let got = pool
            .call(n, Method::Hello, META_GROUP, Vec::new(), HELLO_TIMEOUT)
            .await;
        (n, got)
    });
    for (n, got) in futures_util::future::join_all(asks).await {
        match got {
            Ok(_) => {}
            Err(st) if crate::peer::book::refused_why(&st).is_some() => {
                return Err(StartError::Identity(format!(
                    "node {n} refused this node: {}",
                    st.message()
                )));
            }
            Err(st) => {
                tracing::debug!(peer = n, error = %st.message(), "no answer to the start-up hello");
            }
        }
    }
    Ok(())
}
