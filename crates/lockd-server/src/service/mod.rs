//! The operations of the client API, independent of transport: HTTP and gRPC both call these.
//!
//! A request is checked here in a fixed order — shape limits, auth, rate budget — and only then
//! routed (name → bucket → group) and proposed. The lock rules themselves live in lockd-core; this
//! layer adds only what needs a node: sessions that span groups, waiting for a grant, auth, budgets.

mod restore;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

// tokio's clock, not std's: the simulator runs this code on virtual time.
use tokio::time::Instant;

use lockd_core::{
    limits, BucketSet, BusyReason, LockInfo, LockMode, Namespace, Op, Reply, SessionId,
    SessionSummary, ShardMap, Token,
};
use lockd_raft::{Group, GroupError, GroupId, Node, Renewed, Route, META_GROUP};

use crate::ask::{answer_of, Answer, Query};
use crate::config::{token_digest, token_matches};
use crate::error::{ApiError, ErrorCode};
use crate::metrics::Metrics;
use crate::waits::{Parked, WaitOutcome, Waits};

/// How long past its deadline a parked wait keeps waiting for the committed tick that ends it
/// (covers a leader election) before answering "unknown".
pub(crate) const WAIT_GRACE: Duration = Duration::from_secs(10);
/// How long a call on a name keeps re-routing while groups answer `wrong_group` or
/// `bucket_moving` (a bucket move freezes its buckets for about one commit on each side).
const ROUTE_RETRY: Duration = Duration::from_secs(5);
/// How often a parked wait checks that this node still routes its group to the local replica.
pub(crate) const MEMBERSHIP_CHECK_EVERY: Duration = Duration::from_secs(1);
/// How many times one waiting acquire follows its name's bucket to a new group.
const MAX_REQUEUES: usize = 8;

/// What the caller presented.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    pub bearer: Option<String>,
    /// The client's address, for the budget of failed authentications (`authfail.rs`);
    /// `None` for calls from inside (the simulator), which have none.
    pub from: Option<std::net::IpAddr>,
}

/// What one lock group answered a session's keepalive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupLease {
    /// Its leader extended the lease: `ttl_ms` left from when it answered, at the group's
    /// move count `group_moves` (a hold granted at that count has not left the group).
    Extended { ttl_ms: u64, group_moves: u64 },
    /// The session has no lease in the group (never brought there, or ended there).
    NotHere,
    /// The group could not answer (no leader, its nodes down or cut off): its lease, if any,
    /// was not extended. `error` says why.
    Unreachable { error: String },
}

/// A keepalive's answer: the lease the caller may count on and what each group said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeepaliveReport {
    /// The least lease left over the groups that extended it.
    pub ttl_ms: u64,
    /// Every group asked, in group order.
    pub groups: Vec<(GroupId, GroupLease)>,
}

#[derive(Clone, Debug)]
pub struct SessionOpened {
    pub session: SessionId,
    pub ttl_ms: u64,
    /// The lock group that opened it: its home ([`Service::open_session`]).
    pub group: GroupId,
}

#[derive(Clone, Debug)]
pub struct AcquireRequest {
    pub session: SessionId,
    pub name: String,
    pub owner: String,
    pub mode: LockMode,
    pub wait_ms: u64,
    pub reentrant: bool,
}

impl AcquireRequest {
    /// The command it proposes.
    fn op(&self) -> Op {
        Op::Acquire {
            session: self.session,
            name: self.name.clone(),
            owner: self.owner.clone(),
            mode: self.mode,
            wait_ms: self.wait_ms,
            reentrant: self.reentrant,
        }
    }
}

/// The answer to an acquire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// Granted by `group` at its move count `group_moves` ([`GroupLease::Extended`]).
    Acquired {
        token: Token,
        lease_ttl_ms: u64,
        reentry: u32,
        group: GroupId,
        group_moves: u64,
        /// The groups this request brought the session into (adopted it there: the lease
        /// there started after the request was sent). A long poll's wait that moved with its
        /// bucket queued again elsewhere, so there may be more than `group`.
        adopted_in: Vec<GroupId>,
        /// The session's lease in `group` as its leader renewed it when it granted this
        /// acquire at once (`lockd_raft::Proposed::renewed`); `None` when it did not say.
        renewed: Option<Renewed>,
    },
    /// Not granted: held by `holder` (owner string), the caller was or would be `queue_position`.
    NotAcquired {
        holder: Option<String>,
        queue_position: u32,
        lock_delay_until_ms: Option<u64>,
        /// What a wait at `queue_position` would take, from the name's observed hand-offs
        /// (`contention.rs`); `None` without history, or with no replica of the group here.
        wait_estimate_ms: Option<u64>,
        /// The groups this request brought the session into where it queued (a wait that
        /// ended without a grant keeps that adoption): leases started after the request was
        /// sent, which the caller should know of.
        adopted_in: Vec<GroupId>,
    },
}

/// A session's holds `(group, name, token)` and waits `(group, name, queue position)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionDetail {
    pub session: SessionId,
    pub client: String,
    pub ttl_ms: u64,
    pub held: Vec<(GroupId, String, Token)>,
    pub waits: Vec<(GroupId, String, u32)>,
    /// Groups that could not answer: what the session holds or waits for there is not shown
    /// (a group is a failure domain: its outage does not hide the rest).
    pub unavailable: Vec<GroupId>,
}

/// A contention report and what it covers.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ContentionView {
    pub top: usize,
    /// The namespaces whose names the report ranks.
    pub namespaces: Vec<String>,
    #[serde(flatten)]
    pub report: crate::contention::Report,
}

/// One acquire's proposal as its group answered it.
struct Proposal {
    group: Route,
    reply: Reply,
    /// The proposal adopted the session in `group` (`Op::AdoptAndAcquire`, succeeded).
    lease_started: bool,
    renewed: Option<Renewed>,
}

/// The immediate answer to an acquire.
pub enum AcquireStart {
    Done(AcquireOutcome),
    /// Queued in `group` as `waiter`, at `position`.
    Queued {
        group: Route,
        waiter: lockd_core::WaiterId,
        position: u32,
        /// As [`AcquireOutcome::Acquired`]'s: this request adopted the session in `group`.
        lease_started: bool,
        /// As [`AcquireOutcome::Acquired`]'s: queueing renewed the session's lease there.
        renewed: Option<Renewed>,
    },
}

/// A node-local token bucket: `rate` tokens per second, burst of one second's worth.
struct Bucket {
    rate: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// Takes one token, or says how long until one is there.
    fn take(&mut self, now: Instant) -> Result<(), u64> {
        self.tokens =
            (self.tokens + now.duration_since(self.at).as_secs_f64() * self.rate).min(self.rate);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err((((1.0 - self.tokens) / self.rate) * 1000.0).ceil() as u64)
        }
    }
}

/// The client API of one node.
pub struct Service {
    pub node: Arc<Node>,
    pub waits: Arc<Waits>,
    pub metrics: Arc<Metrics>,
    /// The founding lock groups' count (`--groups`).
    pub(crate) lock_groups: u32,
    /// The meta group's group records as this node last read them (`topology.rs`).
    pub(crate) records:
        std::sync::RwLock<std::collections::BTreeMap<GroupId, lockd_core::GroupRecord>>,
    buckets: Mutex<HashMap<String, Bucket>>,
    /// The grace a new leader adds to every lease (reported to session streams).
    pub election_timeout_max_ms: u64,
    /// SHA-256 of the admin bearer token; `None` = no admin credential, admin calls refused.
    admin_sha256: Option<String>,
    /// This node's Raft timing, checked against the cluster's at start (`None`: not checked).
    pub timing: Option<lockd_core::ClusterTiming>,
    /// Set once this node's meta replica has applied everything the meta leader had committed
    /// when the node started ([`Service::catch_up_meta`]). Until then the node refuses every
    /// call that reads a namespace (names, sessions): a replica that slept through a token being
    /// set would otherwise route a protected name into the open default namespace.
    meta_caught_up: std::sync::atomic::AtomicBool,
    /// Where session and move ids come from (random; the simulator's are seeded).
    ids: IdSource,
    /// A restore's seed not applied yet (`backup.rs`): names are refused until it is.
    pub(crate) restore: Mutex<Option<crate::backup::RestoreSeed>>,
    /// Failed authentications per client address (`authfail.rs`).
    pub auth_failures: crate::authfail::AuthFailures,
    /// Session opens per client address (`opens.rs`).
    pub open_budget: crate::opens::OpenBudget,
    /// True once the node is leaving (SIGTERM): its session streams end, telling their clients
    /// to attach on another node.
    leaving: tokio::sync::watch::Sender<bool>,
}

/// Draws the random part of new session and move ids.
pub type IdSource = Arc<dyn Fn() -> u64 + Send + Sync>;

/// The most group ids a keepalive may name (the most buckets, so more than any cluster has
/// groups).
pub const MAX_KEEPALIVE_GROUPS: usize = lockd_core::BUCKETS as usize;

fn check_keepalive_groups(groups: &[GroupId]) -> Result<(), ApiError> {
    if groups.len() > MAX_KEEPALIVE_GROUPS {
        return Err(ApiError::bad_request(format!(
            "groups: at most {MAX_KEEPALIVE_GROUPS} group ids, {} given",
            groups.len()
        )));
    }
    Ok(())
}

/// The order in which lock groups `groups` are asked to open a session of `namespace`: its
/// home group first (a stable hash of the name, so that one group counts the namespace's
/// `max_sessions`), then the next ones up, wrapping.
fn home_order<'a>(groups: &'a [GroupId], namespace: &str) -> impl Iterator<Item = GroupId> + 'a {
    // FNV-1a: stable across builds and machines, unlike the standard library's hasher.
    let hash = namespace.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let start = if groups.is_empty() {
        0
    } else {
        (hash % groups.len() as u64) as usize
    };
    groups
        .iter()
        .cycle()
        .skip(start)
        .take(groups.len())
        .copied()
}

/// A wait's outcome (with the holder, on a timeout) as the caller gets it; `Ok(None)`: the
/// name's bucket moved and the acquire must queue again at the new owner. `None` in: no
/// committed outcome came in time.
fn wait_outcome(
    got: Option<(WaitOutcome, Option<String>)>,
    group: GroupId,
    position: u32,
) -> Result<Option<AcquireOutcome>, ApiError> {
    match got {
        Some((WaitOutcome::Granted { token, lease_ttl_ms, group_moves }, _)) => Ok(Some(AcquireOutcome::Acquired { token, lease_ttl_ms, reentry: 1, group, group_moves, adopted_in: Vec::new(), renewed: None })),
        Some((WaitOutcome::TimedOut, holder)) => Ok(Some(AcquireOutcome::NotAcquired { holder, queue_position: position, lock_delay_until_ms: None, wait_estimate_ms: None, adopted_in: Vec::new() })),
        Some((WaitOutcome::Moved, _)) => Ok(None),
        Some((WaitOutcome::SessionEnded, _)) => Err(ApiError::new(ErrorCode::SessionNotFound, "the session ended while waiting")),
        None => Err(ApiError::new(ErrorCode::WaitOutcomeUnknown, "no committed outcome for this wait yet (no leader?); the wait was abandoned and a late grant will be released").retry_after(1_000)),
    }
}

/// What [`Service::check_token`] answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenCheck {
    /// The token is a current holder's.
    pub valid: bool,
    /// The largest token among the current holders (0 when the name is free).
    pub newest: u64,
}

impl Service {
    pub fn new(
        node: Arc<Node>,
        waits: Arc<Waits>,
        metrics: Arc<Metrics>,
        lock_groups: u32,
    ) -> Service {
        Service {
            node,
            waits,
            metrics,
            lock_groups,
            records: Default::default(),
            buckets: Mutex::default(),
            election_timeout_max_ms: 0,
            admin_sha256: None,
            timing: None,
            meta_caught_up: std::sync::atomic::AtomicBool::new(false),
            ids: Arc::new(rand::random::<u64>),
            restore: Mutex::new(None),
            auth_failures: Default::default(),
            open_budget: Default::default(),
            leaving: tokio::sync::watch::Sender::new(false),
        }
    }

    /// The node is leaving: every session stream ends now with `unavailable`, so its client
    /// attaches the session on another node at once instead of when the connection drops.
    pub fn leave(&self) {
        self.leaving.send_replace(true);
    }

    /// Resolves once [`Service::leave`] has been called.
    pub(crate) fn left(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.leaving.subscribe();
        async move {
            let _ = rx.wait_for(|l| *l).await;
        }
    }

    /// Draws new session and move ids from `ids` instead of the thread's RNG (the simulator
    /// gives a seeded source, so a seed replays exactly).
    pub fn with_id_source(mut self, ids: IdSource) -> Service {
        self.ids = ids;
        self
    }

    /// A fresh random id.
    pub(crate) fn new_id(&self) -> u64 {
        (self.ids)()
    }

    /// Counts the events this node's group leaders apply as contention in the metrics, by
    /// namespace: install once, right after the service is built.
    pub fn count_contention(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        self.waits.count_contention(Box::new(move |events| {
            if let Some(svc) = weak.upgrade() {
                svc.metrics
                    .lock_events(|name| svc.namespace_name(name), events);
            }
        }));
    }

    /// Gives back every grant `orphans` reports (requests that went away while queued), until
    /// the channel closes: the janitor every node runs.
    pub async fn release_orphans(
        &self,
        mut orphans: tokio::sync::mpsc::UnboundedReceiver<crate::waits::Orphan>,
    ) {
        while let Some(o) = orphans.recv().await {
            self.release_orphan(o).await;
        }
    }

    /// This node serves names and sessions only while its meta replica is a member of the
    /// meta group and has caught up with the meta leader since it last became one (a node
    /// that has not, since it started, serves nothing: it must not vouch for credentials it
    /// may not have). Runs for the node's life: on start, and whenever the replica comes back
    /// after being removed, never added (a joiner), or left behind, a linearizable read
    /// (retried while there is no leader) decides the catch-up.
    ///
    /// A replica cut off for several election timeouts (`Group::is_stranded`) is asked about
    /// here: if the meta group answers without it (through the other nodes), it was removed
    /// or left behind, its namespaces and credentials may be stale, and the node stops serving
    /// names at once; if the meta group cannot answer (it lost its quorum, or this node is on
    /// the minority side of a partition), the node goes on serving names from what it last
    /// applied (`meta_member`, issue 41 item 3).
    pub async fn catch_up_meta(&self) {
        use std::sync::atomic::Ordering;
        loop {
            match self.node.route(META_GROUP) {
                Some(Route::Local(meta)) if !self.caught_up_flag() => {
                    if meta.read(|_| ()).await.is_ok() {
                        // The group records as of now, before any name is served: which groups
                        // sessions go to (a group removed while this node was down is not one).
                        if let Err(e) = self.reconcile_topology().await {
                            tracing::debug!(error = %e, "group records not read at catch-up");
                        }
                        self.meta_caught_up.store(true, Ordering::Release);
                        tracing::info!("caught up with the cluster's configuration; serving names");
                    }
                }
                Some(Route::Local(_)) => {}
                Some(meta) if self.caught_up_flag() && self.meta_member() => {
                    // Cut off, still a member by its own log: does the group work without it?
                    if self.query(&meta, Query::ShardMap).await.is_ok() {
                        self.meta_caught_up.store(false, Ordering::Release);
                        tracing::warn!(
                            "the meta group answers without this node's meta replica (removed, \
                             or left behind); this node serves no name or session until the \
                             replica has caught up"
                        );
                    }
                }
                _ => {
                    if self.meta_caught_up.swap(false, Ordering::AcqRel) {
                        tracing::warn!(
                            "this node's meta replica is no longer a member of the meta group \
                             (removed); it serves no name or session until it is one again and \
                             has caught up"
                        );
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Whether this node serves names now: caught up ([`Service::meta_caught_up`]) and no
    /// restore pending (`backup.rs`).
    pub fn serving(&self) -> bool {
        self.meta_caught_up() && self.pending_restore().is_none()
    }

    /// Whether this node's meta replica is a serving member and has caught up since it became
    /// one (see [`Service::catch_up_meta`]).
    pub fn meta_caught_up(&self) -> bool {
        self.meta_member() && self.caught_up_flag()
    }

    fn caught_up_flag(&self) -> bool {
        self.meta_caught_up
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether this node's meta replica is a member of the meta group. One cut off from the
    /// group (no quorum, a partition: `Group::is_stranded`) still is, by its own log, until
    /// the group is found answering without it ([`Service::catch_up_meta`]): meanwhile the
    /// node keeps serving names from the shard map, namespaces and credentials it last
    /// applied, and a lock group refuses a name it does not own, so a stale map costs a
    /// retry, never a wrong grant (issue 41 item 3). Only what needs the meta group's leader
    /// stops: admin calls, namespace changes, group creation, moves.
    fn meta_member(&self) -> bool {
        match self.node.route(META_GROUP) {
            Some(Route::Local(_)) => true,
            _ => (self.node.group(META_GROUP)).is_some_and(|m| m.member_here()),
        }
    }

    /// Whether the meta replica is cut off from its group while the node serves names from
    /// what it last applied (`meta_member`).
    pub fn meta_cut_off(&self) -> bool {
        self.meta_caught_up() && !matches!(self.node.route(META_GROUP), Some(Route::Local(_)))
    }

    /// 503 unless the meta replica is a serving member that has caught up.
    fn serving_names(&self) -> Result<(), ApiError> {
        let member = self.meta_member();
        if member && self.caught_up_flag() {
            return self.check_not_restoring();
        }
        let cut_off = !matches!(self.node.route(META_GROUP), Some(Route::Local(_)));
        let why = if member && cut_off {
            "this node's meta replica is cut off from the cluster's meta group (the group \
             answers without it: removed or left behind; or the group has had no quorum since \
             this node started), so this node cannot vouch for namespaces and their \
             credentials; it serves no name or session until the replica has caught up (use \
             another node meanwhile)"
        } else if member {
            "this node has not yet caught up with the cluster's configuration (namespaces and \
             their credentials) since its meta replica became a member; it serves no name or \
             session until it has"
        } else {
            "this node is not a member of the cluster's meta group (never added, or removed), \
             so it cannot vouch for namespaces and their credentials; it serves no name or \
             session (use another node, or add this one with `lockctl members add ID ADDR \
             --groups 0`)"
        };
        Err(ApiError::new(ErrorCode::Unavailable, why).retry_after(500))
    }

    /// Sets the admin credential (a bearer token; only its digest is kept).
    /// The per-address budgets: `auth_failure_burst` failed authentications in a row
    /// (`authfail.rs`) and `opens_per_s` session opens a second (`opens.rs`); 0 turns one off.
    pub fn with_budgets(mut self, auth_failure_burst: u32, opens_per_s: u32) -> Service {
        self.auth_failures = crate::authfail::AuthFailures::new(auth_failure_burst);
        self.open_budget = crate::opens::OpenBudget::new(opens_per_s);
        self
    }

    pub fn with_admin_token(mut self, token: Option<&str>) -> Service {
        self.admin_sha256 = token.map(token_digest);
        self
    }

    /// Whether the caller presented the admin token.
    pub fn is_admin(&self, creds: &Credentials) -> bool {
        matches!((&self.admin_sha256, &creds.bearer), (Some(want), Some(got)) if token_matches(want, got))
    }

    /// 429 when the caller's address has no failed authentication left to spend
    /// (`authfail.rs`); checked before a credential is looked at.
    fn auth_budget(&self, creds: &Credentials) -> Result<(), ApiError> {
        let Some(ip) = creds.from else { return Ok(()) };
        self.auth_failures
            .check(ip, std::time::Instant::now())
            .map_err(|wait_ms| {
                ApiError::new(
                    ErrorCode::RateLimited,
                    format!(
                        "too many failed authentications from {ip}: at most {} in a row, then one \
                     per {} s",
                        self.auth_failures.burst(),
                        crate::authfail::REFILL_S
                    ),
                )
                .retry_after(wait_ms)
            })
    }

    /// Runs a credential check within the caller's budget, and spends from the budget when it
    /// fails (401 or 403).
    fn checked_auth(
        &self,
        creds: &Credentials,
        check: impl FnOnce() -> Result<(), ApiError>,
    ) -> Result<(), ApiError> {
        // A token that worked from this address lately is no guess: it skips the pre-check, so
        // good clients behind the same address as a bad one keep working (`authfail.rs`).
        let known = match (creds.from, &creds.bearer) {
            (Some(ip), Some(token)) => self.auth_failures.known_good(ip, token),
            _ => false,
        };
        if !known {
            self.auth_budget(creds)?;
        }
        let r = check();
        if let Some(ip) = creds.from {
            match &r {
                Err(e)
                    if e.code == ErrorCode::Unauthenticated
                        || e.code == ErrorCode::PermissionDenied =>
                {
                    self.auth_failures.failed(ip, std::time::Instant::now());
                    self.metrics.auth_failed();
                    if let Some(token) = &creds.bearer {
                        self.auth_failures.forget(ip, token);
                    }
                }
                Ok(()) => {
                    if let Some(token) = &creds.bearer {
                        self.auth_failures.succeeded(ip, token);
                    }
                }
                Err(_) => {}
            }
        }
        r
    }

    /// 403 when the node has no admin credential, 401 without the admin token, 403 with another.
    pub fn require_admin(&self, creds: &Credentials, what: &str) -> Result<(), ApiError> {
        if self.admin_sha256.is_none() {
            return Err(ApiError::new(ErrorCode::AdminDisabled, format!("{what} needs the admin credential, and this node has none configured (--admin-token-file)"),
            ));
        }
        self.checked_auth(creds, || self.require_admin_token(creds, what))
    }

    fn require_admin_token(&self, creds: &Credentials, what: &str) -> Result<(), ApiError> {
        if self.is_admin(creds) {
            return Ok(());
        }
        match creds.bearer {
            None => Err(ApiError::new(
                ErrorCode::Unauthenticated,
                format!("{what} needs the admin bearer token"),
            )),
            Some(_) => Err(ApiError::new(
                ErrorCode::PermissionDenied,
                format!("{what} needs the admin bearer token; this token is not it"),
            )),
        }
    }

    pub(crate) fn group(&self, id: GroupId) -> Result<Arc<Group>, ApiError> {
        self.node.group(id).ok_or_else(|| {
            ApiError::new(
                ErrorCode::Unavailable,
                format!("group {id} is not hosted here"),
            )
            .retry_after(1_000)
        })
    }

    /// Name → bucket → group, from the meta group's shard map (the initial map until it is set).
    pub fn route(&self, name: &str) -> Result<Route, ApiError> {
        let meta = self.group(META_GROUP)?;
        let g = meta.read_local(|t| t.shard_map().map(|m| m.group_of(name)));
        self.mapped_group(g, name)
    }

    /// The group the map gave (`None`: the map is not set yet, so the initial one decides).
    fn mapped_group(&self, g: Option<GroupId>, name: &str) -> Result<Route, ApiError> {
        self.route_of(g.unwrap_or_else(|| ShardMap::initial(self.lock_groups).group_of(name)))
    }

    /// The namespace of `name` as the meta group stores it.
    fn namespace_for(&self, name: &str) -> Result<Namespace, ApiError> {
        self.serving_names()?;
        Ok(self
            .group(META_GROUP)?
            .read_local(|t| t.namespace_for(name).clone()))
    }

    fn namespace_named(&self, name: &str) -> Result<Namespace, ApiError> {
        self.serving_names()?;
        let want = if name.is_empty() { "default" } else { name };
        self.group(META_GROUP)?
            .read_local(|t| t.namespaces().find(|n| n.name == want).cloned())
            .ok_or_else(|| {
                ApiError::new(
                    ErrorCode::NamespaceNotFound,
                    format!("namespace '{want}' does not exist"),
                )
            })
    }

    /// 401 without a token where one is needed; 403 with another namespace's token; 401 with a
    /// token that matches none.
    fn authorize(&self, ns: &Namespace, creds: &Credentials) -> Result<(), ApiError> {
        let Some(want) = &ns.token_sha256 else {
            return Ok(());
        };
        self.checked_auth(creds, || self.authorize_token(ns, creds, want))
    }

    /// Whether `creds` may read `/metrics` on a client port: anyone while no namespace has a
    /// token (nothing to protect), else the admin only, since the series name every namespace
    /// and count its holds and waits.
    pub fn authorize_metrics(&self, creds: &Credentials) -> Result<(), ApiError> {
        let protected = self
            .node
            .group(META_GROUP)
            .is_none_or(|m| m.read_local(|t| t.namespaces().any(|n| n.token_sha256.is_some())));
        if !protected {
            return Ok(());
        }
        self.require_admin(
            creds,
            "reading /metrics on a client port while a namespace has a token (scrape the \
             --probes port, or send the admin token)",
        )
    }

    fn authorize_token(
        &self,
        ns: &Namespace,
        creds: &Credentials,
        want: &str,
    ) -> Result<(), ApiError> {
        if self.is_admin(creds) {
            return Ok(());
        }
        let Some(bearer) = &creds.bearer else {
            return Err(ApiError::new(
                ErrorCode::Unauthenticated,
                format!("namespace '{}' requires a bearer token", ns.name),
            ));
        };
        if token_matches(want, bearer) {
            return Ok(());
        }
        let other = self.group(META_GROUP)?.read_local(|t| {
            t.namespaces().any(|n| {
                n.token_sha256
                    .as_deref()
                    .is_some_and(|d| token_matches(d, bearer))
            })
        });
        if other {
            Err(ApiError::new(
                ErrorCode::PermissionDenied,
                format!("the token is not valid for namespace '{}'", ns.name),
            ))
        } else {
            Err(ApiError::new(
                ErrorCode::Unauthenticated,
                format!("the token is not valid for namespace '{}'", ns.name),
            ))
        }
    }

    /// The namespace's ops/s budget on this node.
    fn admit(&self, ns: &Namespace) -> Result<(), ApiError> {
        if ns.ops_per_s == 0 {
            return Ok(());
        }
        let rate = ns.ops_per_s as f64;
        let now = Instant::now();
        let mut buckets = self.buckets.lock().expect("buckets lock");
        let b = buckets.entry(ns.prefix.clone()).or_insert(Bucket {
            rate,
            tokens: rate,
            at: now,
        });
        b.rate = rate;
        b.take(now).map_err(|wait_ms| {
            ApiError::new(
                ErrorCode::RateLimited,
                format!(
                    "namespace '{}' is over its budget of {} ops/s",
                    ns.name, ns.ops_per_s
                ),
            )
            .retry_after(wait_ms)
        })
    }

    /// Checks a lock name's shape, auth and budget (routing is `on_owner`'s).
    fn admit_name(&self, name: &str, creds: &Credentials) -> Result<(), ApiError> {
        limits::check_new_name(name).map_err(ApiError::from)?;
        let ns = self.namespace_for(name)?;
        self.authorize(&ns, creds)?;
        self.admit(&ns)
    }

    /// The group of `name` by the shard map as the meta group's leader has it now (a route
    /// found stale by a group's refusal).
    async fn route_fresh(&self, name: &str) -> Result<Route, ApiError> {
        // Through the meta group's route: a stranded local replica (`Group::is_stranded`),
        // one left behind by a member change above all, would never answer.
        let meta = self.route_of(META_GROUP)?;
        let map = answer_of!(self, &meta, crate::ask::Query::ShardMap, ShardMap)?;
        self.mapped_group(map.map(|m| m.group_of(name)), name)
    }

    /// Runs `attempt` on the group that owns `name`'s bucket. Every group refuses a name it
    /// does not serve (`wrong_group`: this node's map is stale; `bucket_moving`: a move is under
    /// way), so a stale route costs a retry, never a wrong answer: the map is read again from
    /// the meta group's leader and the call repeated, for up to [`ROUTE_RETRY`].
    async fn on_owner<T, F, Fut>(&self, name: &str, attempt: F) -> Result<(Route, T), ApiError>
    where
        F: Fn(Route) -> Fut,
        Fut: std::future::Future<Output = Result<T, ApiError>>,
    {
        let give_up = Instant::now() + ROUTE_RETRY;
        let mut group = self.route(name)?;
        for round in 1u64.. {
            match attempt(group.clone()).await {
                Err(e)
                    if (e.code == ErrorCode::WrongGroup || e.code == ErrorCode::BucketMoving)
                        && Instant::now() < give_up =>
                {
                    if e.code == ErrorCode::BucketMoving {
                        tokio::time::sleep(Duration::from_millis((10 * round).min(200))).await;
                    }
                    group = self.route_fresh(name).await?;
                }
                r => return r.map(|v| (group, v)),
            }
        }
        unreachable!("the loop returns")
    }

    /// Proposes a command on `name` to the group that serves it (see [`Service::on_owner`]).
    async fn propose_for_name(&self, name: &str, op: Op) -> Result<(Route, Reply), ApiError> {
        let (group, (reply, _)) = self.propose_full_for_name(name, op).await?;
        Ok((group, reply))
    }

    /// [`Service::propose_for_name`] with the leader's lease renewal ([`Service::propose_full`]).
    async fn propose_full_for_name(
        &self,
        name: &str,
        op: Op,
    ) -> Result<(Route, (Reply, Option<Renewed>)), ApiError> {
        self.on_owner(name, |g| {
            let op = op.clone();
            async move { self.propose_full(&g, op).await }
        })
        .await
    }

    /// A session is a capability of the namespace it was opened in: every operation on it needs
    /// that namespace's credential (or the admin's). 404 if no lock group knows the session.
    /// Returns the namespace, so that a stream carrying the session checks its keepalives
    /// against it again without looking the session up ([`Service::keepalive_in`]).
    pub async fn authorize_session(
        &self,
        session: SessionId,
        creds: &Credentials,
    ) -> Result<String, ApiError> {
        self.serving_names()?;
        // In an open namespace the session id is the only credential, so an id no group knows
        // is a failed guess: budgeted per address like a wrong token (docs/SECURITY.md). An id
        // that worked from this address (or was opened from it) skips the pre-check, so a
        // guesser behind the same address does not stop its neighbours' sessions.
        let id = session.to_string();
        let proven = creds.from.is_some_and(|ip| {
            self.auth_failures.known_good(ip, &id)
                || (creds.bearer.as_deref()).is_some_and(|t| self.auth_failures.known_good(ip, t))
        });
        if !proven {
            self.auth_budget(creds)?;
        }
        let q = Query::SessionNamespace { session };
        let namespace = self
            .session_answer(&q, |a| match a {
                Answer::SessionNamespace(ns) => ns,
                _ => None,
            })
            .await?;
        let Some(namespace) = namespace else {
            if let Some(ip) = creds.from {
                self.auth_failures.failed(ip, std::time::Instant::now());
                self.auth_failures.forget(ip, &id);
                self.metrics.auth_failed();
            }
            return Err(ApiError::new(
                ErrorCode::SessionNotFound,
                format!("session {session} does not exist or has expired"),
            ));
        };
        self.authorize_in(&namespace, creds)?;
        if let (Some(ip), false) = (creds.from, proven) {
            self.auth_failures.succeeded(ip, &id);
        }
        Ok(namespace)
    }

    /// Asks the lock groups about a session with `q` until one knows it (`known` turns its
    /// answer into a value): first the replicas here, from memory; then every group by a
    /// linearizable read (a replica a moment behind must not make a live session a 404).
    /// `Ok(None)`: every group answered and none has the session; otherwise, when some group
    /// could not answer and none had it, that group's failure (a session may live in one
    /// group only while another is down: leases are per group).
    pub(crate) async fn session_answer<T>(
        &self,
        q: &Query,
        known: impl Fn(Answer) -> Option<T>,
    ) -> Result<Option<T>, ApiError> {
        let groups = self.lock_group_ids();
        for g in &groups {
            if let Ok(Route::Local(group)) = self.route_of(*g) {
                let now = group.now_ms();
                if let Some(v) = group.read_local(|t| known(q.answer(t, now))) {
                    return Ok(Some(v));
                }
            }
        }
        let mut failure = None;
        for g in groups {
            let asked = match self.route_of(g) {
                Ok(r) => self.query(&r, q.clone()).await,
                Err(e) => Err(e),
            };
            match asked.map(&known) {
                Ok(Some(v)) => return Ok(Some(v)),
                Ok(None) => {}
                Err(e) => {
                    let message = format!("group {g}: {}", e.message);
                    failure.get_or_insert(ApiError { message, ..e });
                }
            }
        }
        failure.map_or(Ok(None), Err)
    }

    /// Whether `creds` may act on a session of `namespace` now (its token, or the admin's).
    pub fn authorize_in(&self, namespace: &str, creds: &Credentials) -> Result<(), ApiError> {
        // A session restored from a format-1 snapshot has no namespace: the default's rules.
        let ns = match self.namespace_named(namespace) {
            Ok(ns) => ns,
            // Its namespace was deleted: only the admin may still act on it.
            Err(e) if e.code == ErrorCode::NamespaceNotFound => {
                return self.require_admin(creds, "a session of a deleted namespace")
            }
            Err(e) => return Err(e),
        };
        self.authorize(&ns, creds)
    }

    /// Proposes `op` to `group`. A group that cannot take it (no leader, unreachable) is named
    /// in the error: one group's outage is that group's names' alone.
    pub(crate) async fn propose(&self, group: &Route, op: Op) -> Result<Reply, ApiError> {
        self.propose_full(group, op).await.map(|(reply, _)| reply)
    }

    /// [`Service::propose`], with the lease renewal the leader reports beside the reply
    /// (`lockd_raft::Proposed`).
    async fn propose_full(
        &self,
        group: &Route,
        op: Op,
    ) -> Result<(Reply, Option<Renewed>), ApiError> {
        let named = |e: lockd_raft::GroupError| {
            let e = ApiError::from(e);
            ApiError {
                message: format!("group {}: {}", group.id(), e.message),
                ..e
            }
        };
        let p = group.propose_full(op).await.map_err(named)?;
        Ok((p.reply?, p.renewed))
    }

    /// Takes one session open from the caller's address budget (`opens.rs`): `429
    /// rate_limited` with the wait when it has none left.
    fn admit_open(&self, creds: &Credentials) -> Result<(), ApiError> {
        let Some(ip) = creds.from else {
            return Ok(());
        };
        self.open_budget
            .take(ip, std::time::Instant::now())
            .map_err(|ms| {
                let b = &self.open_budget;
                ApiError::new(
                    ErrorCode::RateLimited,
                    format!(
                        "{ip} opened more than {} sessions at once; it may open {} a second \
                     (--session-opens-per-address); retry in {ms} ms",
                        b.burst(),
                        b.per_s()
                    ),
                )
                .retry_after(ms)
            })
    }

    /// Opens the session in one lock group, its home: its namespace's home group, or the next
    /// one up while that group cannot answer (a group's outage must not stop new sessions).
    /// Other groups adopt the session on its first acquire there (`Op::AdoptAndAcquire`);
    /// leases are per group, and keepalives go only to the groups a session names. The home group counts
    /// the namespace's `max_sessions` (while it is down, the group that opens in its place
    /// counts the sessions it has).
    pub async fn open_session(
        &self,
        client: &str,
        ttl_ms: u64,
        namespace: &str,
        creds: &Credentials,
    ) -> Result<SessionOpened, ApiError> {
        // Checked before it is proposed, not only at apply.
        limits::check_optional("client", client, limits::MAX_CLIENT_BYTES)?;
        let ns = self.namespace_named(namespace)?;
        self.authorize(&ns, creds)?;
        self.admit_open(creds)?;
        let groups = self.lock_group_ids();
        let mut unavailable = None;
        for g in home_order(&groups, &ns.name) {
            // 63 random bits: in an open namespace the id is the session's only credential.
            // A fresh one per attempt: an attempt whose outcome is unknown may still open its
            // session in that group, where nobody will name it (it ends within one TTL).
            let session = SessionId::random(self.new_id());
            let op = Op::OpenSession {
                session,
                client: client.to_string(),
                ttl_ms,
                namespace: ns.name.clone(),
            };
            let answer = match self.route_of(g) {
                Ok(route) => self.propose(&route, op).await,
                Err(e) => Err(e),
            };
            match answer {
                Ok(Reply::SessionOpened { ttl_ms, .. }) => {
                    // The opener's own session id is no guess from its address
                    // (`authorize_session`).
                    if let Some(ip) = creds.from {
                        self.auth_failures.succeeded(ip, &session.to_string());
                    }
                    return Ok(SessionOpened {
                        session,
                        ttl_ms,
                        group: g,
                    });
                }
                Ok(other) => return Err(ApiError::unexpected("OpenSession", Some(&other))),
                Err(e) if e.status >= 500 => {
                    tracing::debug!(group = g, %e, "home group could not open a session");
                    unavailable.get_or_insert(e);
                }
                // A refusal (a limit, a bad TTL) is the answer.
                Err(e) => return Err(e),
            }
        }
        Err(unavailable.unwrap_or_else(|| {
            ApiError::new(ErrorCode::Unavailable, "no lock group to open a session in")
                .retry_after(1_000)
        }))
    }

    /// Keeps the session alive in `groups` (empty: every lock group) and says what each group
    /// answered (leases are per group: one group's outage or expiry costs only its holds). The
    /// session is gone (404) only when every group asked says it has no lease; 503 when none
    /// extended it and one could not answer.
    pub async fn keepalive(
        &self,
        session: SessionId,
        groups: &[GroupId],
        creds: &Credentials,
    ) -> Result<KeepaliveReport, ApiError> {
        check_keepalive_groups(groups)?;
        self.authorize_session(session, creds).await?;
        self.keepalive_authorized(session, groups).await
    }

    /// [`Service::keepalive`] on a stream that carries a session of `namespace`: the credential
    /// is checked again every time, so a rotated or newly set token takes effect at once.
    pub async fn keepalive_in(
        &self,
        session: SessionId,
        groups: &[GroupId],
        namespace: &str,
        creds: &Credentials,
    ) -> Result<KeepaliveReport, ApiError> {
        check_keepalive_groups(groups)?;
        self.authorize_in(namespace, creds)?;
        self.keepalive_authorized(session, groups).await
    }

    /// [`Service::keepalive`] for a caller already authorised for the session (an extend of
    /// one of its holds). A named id that is no lock group answers not here.
    pub async fn keepalive_authorized(
        &self,
        session: SessionId,
        named: &[GroupId],
    ) -> Result<KeepaliveReport, ApiError> {
        self.metrics.keepalives.inc();
        let all = self.lock_group_ids();
        let ids: Vec<GroupId> = if named.is_empty() {
            all
        } else {
            let named: std::collections::BTreeSet<GroupId> = named.iter().copied().collect();
            named.into_iter().collect()
        };
        // A named id that is no lock group has no lease for the session.
        let ask = |g: GroupId| async move {
            match self.route_of(g) {
                Ok(route) => route.keepalive(session).await.map_err(ApiError::from),
                Err(_) if !self.lock_group_ids().contains(&g) => {
                    Err(GroupError::SessionNotFound.into())
                }
                Err(e) => Err(e),
            }
        };
        let results = futures::future::join_all(ids.iter().map(|g| ask(*g))).await;
        // The lease is the shortest of the groups' (the client's deadline must come before
        // every group's expiry, not only the most generous one's).
        let mut ttl = u64::MAX;
        let mut report = Vec::with_capacity(ids.len());
        let mut unreachable = None;
        for (g, r) in ids.iter().zip(results) {
            let lease = match r {
                Ok(r) => {
                    ttl = ttl.min(r.ttl_ms);
                    GroupLease::Extended {
                        ttl_ms: r.ttl_ms,
                        group_moves: r.group_moves,
                    }
                }
                // No lease there: never brought there, or ended there.
                Err(e) if e.code == ErrorCode::SessionNotFound => GroupLease::NotHere,
                Err(e) => {
                    let error = format!("group {g}: {}", e.message);
                    unreachable.get_or_insert(ApiError {
                        message: error.clone(),
                        ..e
                    });
                    GroupLease::Unreachable { error }
                }
            };
            report.push((*g, lease));
        }
        // Extended somewhere: the session lives, and the report says where it did not.
        // Nowhere: unknown if a group could not answer (retry); gone if every group said so;
        // and when only the groups named said so, the report as it is, extending nothing
        // (the session lives elsewhere: the caller was authorised for it).
        if ttl == u64::MAX {
            if let Some(e) = unreachable {
                return Err(e);
            }
            if named.is_empty() {
                return Err(GroupError::SessionNotFound.into());
            }
            ttl = 0;
        }
        report.sort_by_key(|(g, _)| *g);
        Ok(KeepaliveReport {
            ttl_ms: ttl,
            groups: report,
        })
    }

    /// A new leader of `group` restarted every lease it knows at TTL + election timeout (a new
    /// leader never shortens a lease). Each session with a stream on this node is told what its
    /// lease has left there, by that leader: one keepalive per session, sent to the new leader,
    /// whose answer is exact, pushed as `LeaseExtended`. A session the group does not know is
    /// not told. At most 64 keepalives are in flight at once.
    pub async fn tell_lease_extended(self: Arc<Self>, group: GroupId) {
        use futures::StreamExt as _;
        let Ok(route) = self.route_of(group) else {
            return;
        };
        let svc = &self;
        futures::stream::iter(self.waits.stream_sessions())
            .for_each_concurrent(64, |session| {
                let route = route.clone();
                async move {
                    if let Ok(renewed) = route.keepalive(session).await {
                        let remaining_ms = renewed.ttl_ms;
                        svc.waits.deliver(
                            session,
                            crate::waits::SessionEvent::LeaseExtended {
                                group,
                                extended_by_ms: svc.election_timeout_max_ms,
                                remaining_ms,
                            },
                        );
                    }
                }
            })
            .await;
    }

    /// Closes the session everywhere, releasing all its locks at once.
    pub async fn close_session(
        &self,
        session: SessionId,
        creds: &Credentials,
    ) -> Result<u32, ApiError> {
        self.authorize_session(session, creds).await?;
        self.end_session(session).await
    }

    /// [`Service::close_session`] without the credential check: for the node's own clean-up and
    /// for a stream that carries the session.
    pub async fn end_session(&self, session: SessionId) -> Result<u32, ApiError> {
        let groups = self.lock_groups_all()?;
        let op = Op::CloseSession { session };
        let results =
            futures::future::join_all(groups.iter().map(|g| self.propose(g, op.clone()))).await;
        let mut released = 0;
        let (mut found, mut failure) = (false, None);
        for r in results {
            match r {
                Ok(Reply::SessionClosed { released: n, .. }) => {
                    found = true;
                    released += n;
                }
                Ok(_) => {}
                Err(e) if e.status == 404 => {}
                Err(e) => failure = Some(e),
            }
        }
        // A group that could not answer keeps its lease until it expires there (within one
        // TTL): the close answers for the groups that closed it, or fails if none did.
        if let Some(e) = failure.filter(|_| !found) {
            return Err(e);
        }
        if found {
            Ok(released)
        } else {
            Err(ApiError::new(
                ErrorCode::SessionNotFound,
                format!("session {session} does not exist or has expired"),
            ))
        }
    }

    /// Proposes an acquire and returns at once: granted, busy, or queued (then the outcome comes
    /// from applied effects: a parked wait, or a session stream's push).
    pub async fn acquire_start(
        &self,
        req: AcquireRequest,
        creds: &Credentials,
    ) -> Result<AcquireStart, ApiError> {
        limits::check_acquire_args(req.mode, req.wait_ms)?;
        // Checked before it is proposed, so a bad owner never reaches the log (the core checks
        // it again at apply).
        limits::check_optional("owner", &req.owner, limits::MAX_OWNER_BYTES)?;
        self.admit_name(&req.name, creds)?;
        let Proposal {
            group,
            reply,
            lease_started,
            renewed,
        } = (self.propose_acquire(&req.name, req.session, req.op())).await?;
        if let Reply::Busy { .. } = reply {
            // Counted at the front door that proposed it: a busy reply changes no state, so
            // the core has no event for it.
            self.metrics.acquire_busy(self.namespace_name(&req.name));
        }
        match reply {
            Reply::Acquired {
                token,
                lease_ttl_ms,
                reentry,
                group_moves,
            } => Ok(AcquireStart::Done(AcquireOutcome::Acquired {
                token,
                lease_ttl_ms,
                reentry,
                group: group.id(),
                group_moves,
                adopted_in: lease_started.then(|| group.id()).into_iter().collect(),
                renewed,
            })),
            Reply::Busy {
                holder,
                queue_len,
                reason,
            } => Ok(AcquireStart::Done(AcquireOutcome::NotAcquired {
                holder: holder.map(|h| h.owner),
                queue_position: queue_len + 1,
                wait_estimate_ms: self.wait_estimate(group.id(), &req.name, queue_len + 1),
                lock_delay_until_ms: match reason {
                    BusyReason::LockDelay { until_ms } => Some(until_ms),
                    BusyReason::Held => None,
                },
                // A busy adopting acquire undid its adoption.
                adopted_in: Vec::new(),
            })),
            Reply::Queued {
                waiter, position, ..
            } => Ok(AcquireStart::Queued {
                group,
                waiter,
                position,
                lease_started,
                renewed,
            }),
            other => Err(ApiError::unexpected("Acquire", Some(&other))),
        }
    }

    /// Proposes an acquire of `name`; a session with no lease in the name's group (never
    /// brought there, or ended there) is adopted there for it (`Op::AdoptAndAcquire`, undone
    /// unless granted or queued, refused if the session has a lease there already). The flag
    /// says whether this request adopted it: the lease there then started after the request
    /// was sent, which the client may count from.
    ///
    /// When this node's replicas can tell (its replica of the name's group lacks the session,
    /// one of another group has it), the adopting acquire is proposed at once: one proposal
    /// and no read. Else, or when that hint was stale, a plain acquire first.
    async fn propose_acquire(
        &self,
        name: &str,
        session: SessionId,
        op: Op,
    ) -> Result<Proposal, ApiError> {
        if let Some((client, ttl_ms, namespace)) = self.local_adoption_hint(name, session) {
            let adopting = op.clone().adopting(client, ttl_ms, namespace);
            match self.propose_acquire_once(name, adopting, true).await {
                // The session had a lease there after all (this replica lagged).
                Err(e) if e.code == ErrorCode::SessionExists => {}
                r => return r,
            }
        }
        match self.propose_acquire_once(name, op.clone(), false).await {
            Err(e) if e.code == ErrorCode::SessionNotHere => {
                let (client, ttl_ms, namespace) = self.session_opening(session).await?;
                let adopting = op.clone().adopting(client, ttl_ms, namespace);
                match self.propose_acquire_once(name, adopting, true).await {
                    // Another request of the session adopted it there meanwhile.
                    Err(e) if e.code == ErrorCode::SessionExists => {
                        self.propose_acquire_once(name, op, false).await
                    }
                    r => r,
                }
            }
            r => r,
        }
    }

    /// One proposal of an acquire (`adopting`: an `Op::AdoptAndAcquire`) on `name`'s group.
    async fn propose_acquire_once(
        &self,
        name: &str,
        op: Op,
        adopting: bool,
    ) -> Result<Proposal, ApiError> {
        let (group, (reply, renewed)) = self.propose_full_for_name(name, op).await?;
        Ok(Proposal {
            group,
            reply,
            lease_started: adopting,
            renewed,
        })
    }

    /// The opening values of `session` when this node's own replicas say it has no lease in
    /// `name`'s group: its replica of that group lacks it, and its replica of another group
    /// has it. A hint only (replicas lag): the adopting acquire it leads to is exact.
    fn local_adoption_hint(&self, name: &str, session: SessionId) -> Option<(String, u64, String)> {
        let Ok(Route::Local(group)) = self.route(name) else {
            return None;
        };
        if group.read_local(|t| t.has_session(session)) {
            return None;
        }
        // The lock groups as the meta group records them, through their routes: a replica
        // left behind here (no longer a member) is never asked.
        self.lock_group_ids()
            .into_iter()
            .find_map(|id| match self.route_of(id) {
                Ok(Route::Local(g)) if id != group.id() => {
                    g.read_local(|t| t.session_opening(session))
                }
                _ => None,
            })
    }

    /// What a wait at `position` of `name` in `group` would take, from this node's hand-off
    /// history of the name (`None` without one, or with no replica of the group here).
    pub fn wait_estimate(&self, group: GroupId, name: &str, position: u32) -> Option<u64> {
        self.waits.handoffs.estimate_ms(group, name, position)
    }

    /// Acquires, waiting (long poll) for the committed outcome if the acquire queued.
    pub async fn acquire(
        &self,
        req: AcquireRequest,
        creds: &Credentials,
    ) -> Result<AcquireOutcome, ApiError> {
        let name = req.name.clone();
        let deadline = Instant::now() + Duration::from_millis(req.wait_ms);
        let mut req = req;
        // A wait ended because the name's bucket moved is queued again at the new owner with
        // the time left (it joins that queue's tail). Moves are rare; the bound is a backstop.
        // Groups an earlier attempt brought the session into (its wait moved with the bucket).
        let mut adopted = Vec::new();
        for _ in 0..MAX_REQUEUES {
            match self.acquire_start(req.clone(), creds).await? {
                AcquireStart::Done(mut outcome) => {
                    let (AcquireOutcome::Acquired { adopted_in, .. }
                    | AcquireOutcome::NotAcquired { adopted_in, .. }) = &mut outcome;
                    adopted.append(adopted_in);
                    *adopted_in = adopted;
                    return Ok(outcome);
                }
                AcquireStart::Queued {
                    group,
                    waiter,
                    position,
                    lease_started,
                    // The grant after the wait comes without one (docs/API.md).
                    renewed: _,
                } => {
                    if lease_started {
                        adopted.push(group.id());
                    }
                    tracing::debug!(
                        node = self.node.node_id(),
                        group = group.id(),
                        waiter,
                        local = matches!(group, Route::Local(_)),
                        "acquire queued; waiting for the outcome"
                    );
                    let outcome = match &group {
                        Route::Local(g) => {
                            let parked = self.waits.park(g.id(), waiter);
                            self.wait_for(g, parked, &req, position).await?
                        }
                        Route::Remote(r) => {
                            let limit = Duration::from_millis(req.wait_ms) + WAIT_GRACE;
                            let got = self
                                .await_remote(r, req.session, waiter, &name, limit)
                                .await?;
                            wait_outcome(got, r.id(), position)?
                        }
                    };
                    if let Some(mut outcome) = outcome {
                        self.waited(&mut outcome, group.id(), &name, adopted);
                        return Ok(outcome);
                    }
                    req.wait_ms = deadline
                        .saturating_duration_since(Instant::now())
                        .as_millis() as u64;
                }
            }
        }
        Err(ApiError::new(
            ErrorCode::BucketMoving,
            format!("the wait was moved {MAX_REQUEUES} times with the name's bucket; retry"),
        )
        .retry_after(100))
    }

    /// Completes the outcome of a wait in `group`: the groups its attempts adopted the session
    /// in stay so, with a grant and with a wait that ended without one.
    fn waited(
        &self,
        outcome: &mut AcquireOutcome,
        group: GroupId,
        name: &str,
        adopted: Vec<GroupId>,
    ) {
        match outcome {
            AcquireOutcome::NotAcquired {
                queue_position,
                wait_estimate_ms,
                adopted_in,
                ..
            } => {
                *wait_estimate_ms = self.wait_estimate(group, name, *queue_position);
                *adopted_in = adopted;
            }
            AcquireOutcome::Acquired { adopted_in, .. } => *adopted_in = adopted,
        }
    }

    /// Waits for the committed outcome of a queued acquire; `None`: the name's bucket moved
    /// and the acquire must queue again at the new owner.
    ///
    /// The outcome comes from this node's replica applying the log. A replica that stops
    /// being a serving member while the wait is parked (removed from the group while cut off
    /// from it, so it never applied its own removal) applies nothing more, and the wait would
    /// end only at its limit, unknown. Such a replica soon counts as stranded (the leader's
    /// replication stopped reaching it: `Group::is_stranded`) and the node routes the group to
    /// its members; the parked wait watches for that and is then handed to a member
    /// (`await_remote`), whose applied effects answer it.
    async fn wait_for(
        &self,
        group: &Group,
        mut parked: Parked,
        req: &AcquireRequest,
        position: u32,
    ) -> Result<Option<AcquireOutcome>, ApiError> {
        let deadline = Instant::now() + Duration::from_millis(req.wait_ms) + WAIT_GRACE;
        let moved_away = async {
            loop {
                tokio::time::sleep(MEMBERSHIP_CHECK_EVERY).await;
                if let Some(Route::Remote(r)) = self.node.route(group.id()) {
                    return r;
                }
            }
        };
        let waited = tokio::select! {
            biased;
            out = tokio::time::timeout_at(deadline, parked.outcome()) => out,
            remote = moved_away => {
                // The member that takes the wait over owns it now: if it times out there, a
                // late grant is released there, not here.
                let waiter = parked.hand_over();
                tracing::debug!(
                    node = self.node.node_id(),
                    group = group.id(),
                    waiter,
                    "this replica stopped serving the group; a member takes the wait over"
                );
                let left = deadline.saturating_duration_since(Instant::now());
                let got = self.await_remote(&remote, req.session, waiter, &req.name, left).await?;
                return wait_outcome(got, group.id(), position);
            }
        };
        match waited {
            Ok(Some(WaitOutcome::TimedOut)) => {
                let holder = group
                    .read_local(|t| t.lock_info(&req.name, 0))
                    .and_then(|i| i.holders.first().map(|h| h.owner.clone()));
                wait_outcome(Some((WaitOutcome::TimedOut, holder)), group.id(), position)
            }
            Ok(Some(o)) => wait_outcome(Some((o, None)), group.id(), position),
            Ok(None) => Err(
                ApiError::new(ErrorCode::Unavailable, "the node is shutting down")
                    .retry_after(1_000),
            ),
            // Dropping `parked` marks the waiter abandoned: a later grant is released for us.
            Err(_) => wait_outcome(None, group.id(), position),
        }
    }

    pub async fn release(
        &self,
        session: SessionId,
        name: &str,
        token: Token,
        creds: &Credentials,
    ) -> Result<u32, ApiError> {
        self.admit_name(name, creds)?;
        let op = Op::Release {
            session,
            name: name.to_string(),
            token,
        };
        match self.propose_for_name(name, op).await?.1 {
            Reply::Released { remaining } => Ok(remaining),
            other => Err(ApiError::unexpected("Release", Some(&other))),
        }
    }

    /// Confirms the hold and refreshes the session's lease (the lease is the session's).
    pub async fn extend(
        &self,
        session: SessionId,
        name: &str,
        token: Token,
        creds: &Credentials,
    ) -> Result<u64, ApiError> {
        self.admit_name(name, creds)?;
        let op = Op::Extend {
            session,
            name: name.to_string(),
            token,
        };
        let (group, reply) = self.propose_for_name(name, op).await?;
        let Reply::Extended { lease_ttl_ms } = reply else {
            return Err(ApiError::unexpected("Extend", Some(&reply)));
        };
        // The hold's lease is its group's (leases are per group).
        self.keepalive_authorized(session, &[group.id()]).await?;
        Ok(lease_ttl_ms)
    }

    /// The name of the namespace `name` falls into (for the view of a free name).
    pub fn namespace_name(&self, name: &str) -> String {
        // Only the name is copied: this runs for every ownership event on a leader.
        self.serving_names()
            .and_then(|()| self.group(META_GROUP))
            .map(|g| g.read_local(|t| t.namespace_for(name).name.clone()))
            .unwrap_or_else(|_| "default".into())
    }

    /// A linearizable view of one name. Session ids of holders and waiters are
    /// [`SessionId(0)`](SessionId) (never a real id) unless the caller is the admin.
    pub async fn inspect(
        &self,
        name: &str,
        creds: &Credentials,
    ) -> Result<Option<LockInfo>, ApiError> {
        self.admit_name(name, creds)?;
        // Whether the caller is the admin decides what it sees, so a presented token is checked
        // here even in an open namespace: inside the budget of failed authentications, or the
        // session ids in the answer would tell an admin-token guess right from wrong unbudgeted.
        let admin = self.inspect_as_admin(creds)?;
        let (_, mut info) = self
            .on_owner(name, |g| {
                let name = name.to_string();
                async move { Ok(answer_of!(self, &g, Query::LockInfo { name }, LockInfo)??) }
            })
            .await?;
        // A session id is the session's capability: only the admin sees another holder's.
        if !admin {
            if let Some(i) = info.as_mut() {
                for h in &mut i.holders {
                    h.session = SessionId(0);
                }
                for w in &mut i.waiters {
                    w.session = SessionId(0);
                }
            }
        }
        Ok(info)
    }

    /// Opens a watch of `name` or of the names under `prefix` (exactly one is non-empty),
    /// resuming after `after`. Authorised like a read of the namespace; a prefix that spans
    /// namespaces needs the admin token. The bool: the caller is the admin (session ids shown).
    /// The credential is checked again before an event goes out, at most once a second, so a
    /// rotated or newly set token ends a watch it no longer opens.
    pub fn watch(
        self: &Arc<Self>,
        name: &str,
        prefix: &str,
        after: &crate::watches::Positions,
        creds: &Credentials,
    ) -> Result<(crate::watches::Watch, bool), ApiError> {
        use crate::watches::Selector;
        let selector = match (name.is_empty(), prefix.is_empty()) {
            (false, true) => Selector::Name(name.to_string()),
            (true, _) => Selector::Prefix(prefix.to_string()),
            (false, false) => {
                return Err(ApiError::bad_request(
                    "name, prefix: give one or the other, not both",
                ))
            }
        };
        if let Selector::Prefix(p) = &selector {
            if !p.is_empty() {
                limits::check_new_name(p)
                    .map_err(ApiError::from)
                    .map_err(|e| ApiError::bad_request(e.message.replacen("name", "prefix", 1)))?;
            }
        }
        let ns = self.authorize_watch(&selector, creds)?;
        self.admit(&ns)?;
        let groups = match &selector {
            Selector::Name(n) => vec![self.route(n)?.id()],
            Selector::Prefix(_) => self.lock_group_ids(),
        };
        let admin = self.inspect_as_admin(creds)?;
        let mut local = Vec::new();
        let mut missing = Vec::new();
        for g in groups {
            match self.node.group(g) {
                Some(r) => local.push((g, r.status().applied_index)),
                None => missing.push(g.to_string()),
            }
        }
        if !missing.is_empty() {
            return Err(ApiError::new(
                ErrorCode::Unavailable,
                format!(
                    "this node hosts no replica of lock group(s) {}, which the watch needs; \
                     watch at a node that hosts them all (lockctl members list)",
                    missing.join(", ")
                ),
            ));
        }
        let mut w = self.waits.watch.open(selector.clone(), &local, after)?;
        let (svc, creds) = (Arc::downgrade(self), creds.clone());
        w.recheck(Box::new(move || {
            let Some(svc) = svc.upgrade() else {
                return Ok(());
            };
            svc.authorize_watch(&selector, &creds)?;
            if admin && !svc.inspect_as_admin(&creds)? {
                return Err(ApiError::new(
                    ErrorCode::PermissionDenied,
                    "the admin token this watch was opened with is no longer the admin's",
                ));
            }
            Ok(())
        }));
        Ok((w, admin))
    }

    /// Whether `creds` may watch what `selector` names: the namespace's credential, or the
    /// admin's for a prefix that spans namespaces. Returns the namespace (for its ops budget).
    fn authorize_watch(
        &self,
        selector: &crate::watches::Selector,
        creds: &Credentials,
    ) -> Result<Namespace, ApiError> {
        use crate::watches::Selector;
        match selector {
            Selector::Name(n) => {
                limits::check_new_name(n).map_err(ApiError::from)?;
                let ns = self.namespace_for(n)?;
                self.authorize(&ns, creds)?;
                Ok(ns)
            }
            Selector::Prefix(p) => {
                let ns = self.namespace_for(p)?;
                let spans = self.group(META_GROUP)?.read_local(|t| {
                    t.namespaces()
                        .any(|o| o.prefix != ns.prefix && o.prefix.starts_with(p.as_str()))
                });
                if spans {
                    let what = format!("a watch of prefix '{p}', which spans namespaces,");
                    self.require_admin(creds, &what)?;
                } else {
                    self.authorize(&ns, creds)?;
                }
                Ok(ns)
            }
        }
    }

    /// The hottest names (`GET /v1/contention`): the `top` names by waiters, longest wait,
    /// hand-off rate and longest hold, across every lock group, from each group's replica here
    /// or at a member. `namespace` narrows it to one namespace, which the caller must be let
    /// into; without it the caller sees every namespace it could read: all of them as the
    /// admin, else the open ones and the one its token opens.
    pub async fn contention(
        &self,
        top: usize,
        namespace: &str,
        creds: &Credentials,
    ) -> Result<ContentionView, ApiError> {
        use crate::contention::{Report, MAX_TOP};
        if top == 0 || top > MAX_TOP {
            return Err(ApiError::bad_request(format!(
                "top: must be 1 to {MAX_TOP}, got {top}"
            )));
        }
        self.serving_names()?;
        let all: Vec<String> = self
            .group(META_GROUP)?
            .read_local(|t| t.namespaces().map(|n| n.name.clone()).collect());
        let shown: Vec<String> = if !namespace.is_empty() {
            let ns = self.namespace_named(namespace)?;
            self.authorize(&ns, creds)?;
            vec![ns.name]
        } else if self.inspect_as_admin(creds)? {
            all.clone()
        } else {
            let opens = |d: &str| creds.bearer.as_deref().is_some_and(|b| token_matches(d, b));
            self.group(META_GROUP)?.read_local(|t| {
                t.namespaces()
                    .filter(|n| n.token_sha256.as_deref().is_none_or(opens))
                    .map(|n| n.name.clone())
                    .collect()
            })
        };
        // Every namespace: no filter, so the scan looks up no record's namespace.
        let filter = (shown.len() != all.len()).then(|| shown.clone());
        let parts = futures::future::try_join_all(self.lock_group_ids().into_iter().map(|g| {
            let filter = filter.clone();
            async move {
                let route = self.route_of(g)?;
                self.contention_of(&route, top, filter).await
            }
        }))
        .await?;
        let mut report = Report::default();
        for part in parts {
            report.merge(part, top);
        }
        Ok(ContentionView {
            top,
            namespaces: shown,
            report,
        })
    }

    /// Whether an inspect's caller is the admin. A token that is neither the admin's nor any
    /// namespace's is a failed authentication (it reads on, without the admin's view); an
    /// address out of budget gets 429 before its token is looked at, unless it proved it.
    fn inspect_as_admin(&self, creds: &Credentials) -> Result<bool, ApiError> {
        let (Some(ip), Some(token)) = (creds.from, &creds.bearer) else {
            return Ok(self.is_admin(creds));
        };
        if !self.auth_failures.known_good(ip, token) {
            self.auth_budget(creds)?;
        }
        if self.is_admin(creds) {
            self.auth_failures.succeeded(ip, token);
            return Ok(true);
        }
        let some_namespace = self.group(META_GROUP)?.read_local(|t| {
            t.namespaces().any(|n| {
                n.token_sha256
                    .as_deref()
                    .is_some_and(|d| token_matches(d, token))
            })
        });
        if !some_namespace {
            self.auth_failures.failed(ip, std::time::Instant::now());
            self.metrics.auth_failed();
        }
        Ok(false)
    }

    /// Chubby's CheckSequencer: whether `token` is the fencing token of a holder of `name` now
    /// (a linearizable read on the name's group), and the newest holder's token (0 when free).
    /// For a resource that can ask lockd before it acts instead of keeping a fence itself;
    /// the answer can be out of date by the time the resource acts, so a resource that can
    /// store the largest token seen should fence instead (`lockd_client::fence`).
    pub async fn check_token(
        &self,
        name: &str,
        token: u64,
        creds: &Credentials,
    ) -> Result<TokenCheck, ApiError> {
        // Tokens start at 1, and the spec bounds them like every token field (int64).
        if token == 0 || token > i64::MAX as u64 {
            return Err(ApiError::bad_request(format!(
                "token: {token} is no fencing token (1..={})",
                i64::MAX
            )));
        }
        let holders = self
            .inspect(name, creds)
            .await?
            .map(|i| i.holders)
            .unwrap_or_default();
        Ok(TokenCheck {
            valid: holders.iter().any(|h| h.token == token),
            newest: holders.iter().map(|h| h.token).max().unwrap_or(0),
        })
    }

    /// A session's holds and waits across every lock group; 404 if no group knows it.
    pub async fn session_info(
        &self,
        session: SessionId,
        creds: &Credentials,
    ) -> Result<SessionDetail, ApiError> {
        self.authorize_session(session, creds).await?;
        let groups = self.lock_groups_all()?;
        let infos = futures::future::join_all(groups.iter().map(|g| async move {
            answer_of!(self, g, Query::SessionInfo { session }, SessionInfo)
        }))
        .await;
        let mut detail: Option<SessionDetail> = None;
        let mut failed = Vec::new();
        for (g, info) in groups.iter().zip(infos) {
            let info = match info {
                Ok(Some(info)) => info,
                Ok(None) => continue,
                Err(e) => {
                    failed.push((g.id(), e));
                    continue;
                }
            };
            let d = detail.get_or_insert_with(|| SessionDetail {
                session,
                client: info.client.clone(),
                ttl_ms: info.ttl_ms,
                held: Vec::new(),
                waits: Vec::new(),
                unavailable: Vec::new(),
            });
            d.held
                .extend(info.held.iter().map(|(n, t)| (g.id(), n.clone(), *t)));
            d.waits
                .extend(info.waits.iter().map(|(n, _, p)| (g.id(), n.clone(), *p)));
        }
        let unavailable = failed.iter().map(|(g, _)| *g).collect();
        match (detail, failed.into_iter().next()) {
            (Some(d), _) => Ok(SessionDetail { unavailable, ..d }),
            // Not found where it was looked for, and unknown where it could not be.
            (None, Some((_, e))) => Err(e),
            (None, None) => Err(ApiError::new(
                ErrorCode::SessionNotFound,
                format!("session {session} does not exist or has expired"),
            )),
        }
    }

    /// A page of live sessions (ids above `after`, at most `limit`, at most 1000), merged over
    /// every lock group.
    /// Sessions per page of `list_sessions`: the default (a limit of 0 or none) and the most.
    pub const DEFAULT_PAGE: usize = 100;
    pub const MAX_PAGE: usize = 1000;

    pub async fn list_sessions(
        &self,
        after: Option<SessionId>,
        limit: usize,
        creds: &Credentials,
    ) -> Result<Vec<SessionSummary>, ApiError> {
        self.require_admin(creds, "listing sessions")?;
        let limit = match limit {
            0 => Self::DEFAULT_PAGE,
            1..=Self::MAX_PAGE => limit,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "limit {limit} is outside 1..={} (0 or absent: {})",
                    Self::MAX_PAGE,
                    Self::DEFAULT_PAGE
                )))
            }
        };
        let groups = self.lock_groups_all()?;
        let pages = futures::future::join_all(groups.iter().map(|g| async move {
            answer_of!(self, g, Query::SessionPage { after, limit }, SessionPage)
        }))
        .await;
        let mut merged: std::collections::BTreeMap<SessionId, SessionSummary> = Default::default();
        for page in pages {
            for s in page? {
                merged
                    .entry(s.session)
                    .and_modify(|m| {
                        m.held += s.held;
                        m.waits += s.waits;
                    })
                    .or_insert(s);
            }
        }
        Ok(merged.into_values().take(limit).collect())
    }

    pub(crate) fn lock_groups_all(&self) -> Result<Vec<Route>, ApiError> {
        self.lock_group_ids()
            .into_iter()
            .map(|g| self.route_of(g))
            .collect()
    }

    /// `GET /v1/status`: this node and every group it hosts.
    /// Why this node should not be sent traffic yet (empty: ready). Ready means it serves
    /// names (its meta replica has caught up with the meta leader since start) and every group
    /// it hosts has a leader it can reach (none is stranded). For `/readyz`: a load balancer or
    /// Kubernetes sends clients elsewhere meanwhile; any node still answers every call.
    pub fn not_ready(&self) -> Vec<String> {
        let mut why = Vec::new();
        if !self.meta_caught_up() {
            why.push("its meta replica has not caught up with the meta leader".to_string());
        }
        if let Some(seed) = self.pending_restore() {
            why.push(format!(
                "it was restored from a backup and has not yet raised every lock group's \
                 revision to {}",
                seed.floor
            ));
        }
        for id in self.node.group_ids() {
            let Some(g) = self.node.group(id) else {
                continue;
            };
            // Groups it votes in (a learner follows; a replica left over from a removal is
            // not this node's to serve).
            let s = g.status();
            if !s.members.contains(&self.node.node_id()) {
                continue;
            }
            // A meta group without a quorum stops no name here (`meta_member`): every node
            // would leave the load balancer's pool over it.
            if id == META_GROUP && self.meta_caught_up() {
                continue;
            }
            if s.leader.is_none() {
                why.push(format!("group {id} has no leader"));
            } else if g.is_stranded() {
                why.push(format!(
                    "its replica of group {id} is cut off from the group"
                ));
            } else if let Some((applied, target)) = g.catching_up() {
                why.push(format!(
                    "its replica of group {id} is catching up (applied {applied} of {target})"
                ));
            }
        }
        why
    }

    pub fn status_json(&self) -> serde_json::Value {
        let groups: Vec<_> = self
            .node
            .group_ids()
            .into_iter()
            .filter_map(|id| self.node.group(id))
            .map(|g| {
                let s = g.status();
                serde_json::json!({
                    "id": g.id(),
                    "role": if g.id() == META_GROUP { "meta" } else { "locks" },
                    "leader": s.leader,
                    "term": s.term,
                    "members": s.members,
                    "applied_index": s.applied_index,
                    "revision": s.revision,
                    "preferred_leader": s.preferred_leader,
                })
            })
            .collect();
        serde_json::json!({
            "node_id": self.node.node_id(),
            "zone": Some(self.node.zone()).filter(|z| !z.is_empty()),
            "pid": std::process::id(),
            "serving_names": self.serving(),
            "meta_cut_off": self.meta_cut_off(),
            "unsafe_negative_controls": self.node.negative_controls(),
            "groups": groups,
        })
    }

    /// Gives back a grant whose requester went away (see waits.rs); retried while no leader.
    pub async fn release_orphan(&self, o: crate::waits::Orphan) {
        let Ok(group) = self.route_of(o.group) else {
            return;
        };
        for attempt in 0..20u64 {
            let op = Op::Release {
                session: o.session,
                name: o.name.clone(),
                token: o.token,
            };
            match group.propose(op).await {
                Ok(_) => return, // released, or already gone (session ended): either way done
                Err(e) if e.is_retryable() => {
                    tokio::time::sleep(Duration::from_millis(100 * (attempt + 1))).await
                }
                Err(_) => return,
            }
        }
        tracing::warn!(group = o.group, name = %o.name, token = o.token, "could not release an orphaned grant; the session's expiry will");
    }

    /// A client reports that a lease ran out while it was still working (the metric that says
    /// TTLs are too short or holders too slow).
    pub fn report_lease_expired(&self, name: &str) {
        let ns = self.namespace_name(name);
        self.metrics.lease_expired_while_holding(&ns);
    }

    /// A client reports that a fenced resource refused its write under `name`: a newer holder's
    /// token had reached it (the metric that counts the stale holders fencing stopped).
    pub fn report_fencing_rejected(&self, name: &str) {
        let ns = self.namespace_name(name);
        self.metrics.fencing_rejected(&ns);
    }

    /// Makes the replicated configuration match this node's: the shard map in the meta group and
    /// every namespace in every group. Idempotent; all nodes may run it at start.
    ///
    /// A restored node (`backup.rs`) seeds the backup's namespaces instead of the file's, and
    /// raises every lock group's revision to the seed's floor before it serves a name.
    pub async fn bootstrap(&self, namespaces: &[Namespace]) -> Result<(), ApiError> {
        let seed = self.pending_restore();
        let namespaces = seed.as_ref().map_or(namespaces, |s| &s.namespaces[..]);
        // A joiner's meta replica is not a member yet: this reaches the meta group wherever it is.
        let meta = self.route_of(META_GROUP)?;
        self.record_this_node(&meta).await?;
        // The founding lock groups, so that groups created later get the next epochs
        // (`topology.rs`); once recorded, this is a no-op.
        if let Some(founding) = self.node.founding_placement() {
            self.propose(&meta, Op::RecordGroups { groups: founding })
                .await?;
        }
        self.place_buckets(&meta).await?;
        if let Some(seed) = &seed {
            self.raise_to_floor(seed).await?;
        }
        // Namespaces: the file seeds a new cluster only; the lock groups copy the meta group's.
        self.seed_namespaces(namespaces).await?;
        self.sync_namespaces().await?;
        Ok(())
    }

    /// Records this node in the meta group: the cluster's Raft timing (the first node's
    /// stands), and this data dir's incarnation (the first one for the id stands). A node the
    /// record refuses stops (`refuse_to_serve`).
    async fn record_this_node(&self, meta: &Route) -> Result<(), ApiError> {
        // The cluster's Raft timing: the first node records its own; any other node, a joiner
        // above all, must match it (the lease hand-over needs one election bound), or it stops
        // (`lockd-core/src/cluster.rs`).
        if let Some(timing) = self.timing {
            match self.propose(meta, Op::SetClusterTiming { timing }).await {
                Ok(_) => {}
                Err(e)
                    if e.code == ErrorCode::ClusterTimingMismatch
                        || e.code == ErrorCode::InvalidClusterTiming =>
                {
                    self.node.refuse_to_serve(META_GROUP, e.message.clone());
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
        }
        // This node's data dir incarnation: the first one recorded for its id stands, and a
        // node that comes back with another (a wiped disk) stops with the fix
        // (`lockd-core/src/cluster.rs`). Its peers refuse it meanwhile (`lockd-raft/src/peer`).
        let incarnation = self.node.incarnation();
        if incarnation != 0 {
            let op = Op::RegisterIncarnation {
                node: self.node.node_id(),
                incarnation,
            };
            match self.propose(meta, op).await {
                Ok(_) => {}
                Err(e) if e.code == ErrorCode::MemberChangeRefused => {
                    self.node.refuse_to_serve(META_GROUP, e.message.clone());
                    return Err(e);
                }
                // A retired id serves nothing new; its refusal is the admin API's to say.
                Err(e) if e.code == ErrorCode::NodeRetired => {
                    tracing::warn!(error = %e, "this node's id is retired");
                }
                Err(e) => return Err(e),
            }
        }
        // Zones, which membership changes read: this node's, and on a founder every
        // founder's, so that the founding placement's zones are known before every founder
        // has started. A recorded zone never changes (`lockd-core/src/cluster.rs`).
        let mut zones = self.node.founder_zones().clone();
        if !self.node.zone().is_empty() {
            zones.insert(self.node.node_id(), self.node.zone().to_string());
        }
        if !zones.is_empty() {
            match self.propose(meta, Op::RegisterZones { zones }).await {
                Ok(_) => {}
                Err(e) if e.code == ErrorCode::MemberChangeRefused => {
                    self.node.refuse_to_serve(META_GROUP, e.message.clone());
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Puts the first shard map in place if none is, and gives each lock group that has none
    /// its buckets from it.
    async fn place_buckets(&self, meta: &Route) -> Result<(), ApiError> {
        let shard_map = || async {
            match self.query(meta, Query::ShardMap).await? {
                crate::ask::Answer::ShardMap(m) => Ok(m.map(|m| *m)),
                _ => Err(crate::ask::unexpected("ShardMap")),
            }
        };
        if shard_map().await?.is_none() {
            let op = Op::PutShardMap {
                map: ShardMap::initial(self.lock_groups),
            };
            match self.propose(meta, op).await {
                Ok(_) => {}
                Err(e) if e.code == ErrorCode::InvalidShardMap => {} // another node set it first
                Err(e) => return Err(e),
            }
        }
        // Each lock group learns its buckets from the map once; from then on it refuses names
        // of other buckets, so no stale route can make two groups grant one name.
        let map = shard_map()
            .await?
            .ok_or_else(|| ApiError::new(ErrorCode::Unavailable, "the shard map is not set yet"))?;
        for g in self.lock_group_ids() {
            let group = self.route_of(g)?;
            if answer_of!(self, &group, Query::Ownership, Ownership)?.map_version != 0 {
                continue;
            }
            let buckets: BucketSet = (0..lockd_core::BUCKETS)
                .filter(|b| map.groups[*b as usize] == g)
                .collect();
            let op = Op::AssignBuckets {
                buckets,
                map_version: map.version,
            };
            match self.propose(&group, op).await {
                Ok(_) => {}
                // Another node assigned them first (the same buckets: that is a no-op).
                Err(e) if e.code == ErrorCode::MoveConflict => {
                    tracing::warn!(group = g, error = %e, "bucket assignment refused");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_bucket_admits_its_rate_and_says_when_to_retry() {
        let t0 = Instant::now();
        let mut b = Bucket {
            rate: 10.0,
            tokens: 10.0,
            at: t0,
        };
        for _ in 0..10 {
            assert_eq!(b.take(t0), Ok(()));
        }
        assert_eq!(b.take(t0), Err(100));
        assert_eq!(b.take(t0 + Duration::from_millis(100)), Ok(()));
        // Idle time refills up to one second's worth, no more.
        let later = t0 + Duration::from_secs(60);
        for _ in 0..10 {
            assert_eq!(b.take(later), Ok(()));
        }
        assert!(b.take(later).is_err());
    }
}
