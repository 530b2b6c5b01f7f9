//! The session driver: one task per [`Client`](crate::Client) that owns the `Session` stream.
//!
//! It opens the session, sends a keepalive every TTL/3, moves the stream to another node (and
//! `attach`es the same session) when the stream breaks or stops answering, matches pushed grants
//! to waiting acquires, and keeps the local lease deadlines every [`LockGuard`] watches:
//! `send time of the last acknowledged open/attach/keepalive + TTL − margin`, on the monotonic
//! clock, one per lock group and one session-wide (`lease.rs`). A guard follows its group's
//! while its hold provably stays in that group. When the session-wide deadline passes without
//! a renewal, or the service says the session ended, the session is *lost*: every guard of it
//! reports lost, and the next acquire opens a new one.
//!
//! [`LockGuard`]: crate::LockGuard

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockd_proto::v1 as pb;
use lockd_proto::v1::lock_client::LockClient;
use pb::session_event::Kind as Ev;
use pb::session_request::Kind as Req;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{sleep_until, timeout, Instant};
use tonic::codegen::InterceptedService;
use tonic::transport::Channel;

use crate::lease::{GroupAnswer, GroupLeases, HoldLease};
use crate::pushes::{Pushed, Pushes};
use crate::{ClientOptions, Error};

/// What every guard of the client watches: the current session and its local deadline.
#[derive(Clone, Debug)]
pub(crate) struct Lease {
    /// Bumped for every new session; a guard of an older generation is lost.
    pub gen: u64,
    pub session_id: String,
    /// The session-wide local deadline: last send every group acknowledged + TTL − margin.
    pub deadline: Instant,
    /// Each group's lease, which a guard follows while its hold provably stays in the group
    /// (`lease.rs`).
    pub leases: GroupLeases,
    /// The session ended (deadline passed, service expired or closed it, client closed).
    pub lost: bool,
}

/// A lock the application holds, for "lease expired while still working" reports.
#[derive(Clone, Debug)]
pub(crate) struct Held {
    pub name: String,
    pub gen: u64,
    pub token: u64,
    /// The lease it follows: its group is named in every keepalive while it is held.
    pub hold: HoldLease,
}

/// What the driver and the handles share (not the command sender: when the last handle goes,
/// the driver sees its command channel close and closes the session).
/// Adds the client's bearer token (`authorization: Bearer ...`) to every call, so the calls
/// that name only a session (keepalive, close, attach, get) carry the namespace's credential.
#[derive(Clone)]
pub(crate) struct Bearer(Option<tonic::metadata::AsciiMetadataValue>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut r: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            r.metadata_mut().insert("authorization", v.clone());
        }
        Ok(r)
    }
}

/// A gRPC client of one endpoint that presents the bearer token.
pub(crate) type Rpc = LockClient<InterceptedService<Channel, Bearer>>;
/// The same for the `Admin` service.
pub(crate) type AdminRpc =
    lockd_proto::v1::admin_client::AdminClient<InterceptedService<Channel, Bearer>>;

pub(crate) struct Core {
    pub opts: ClientOptions,
    pub channels: Vec<(String, Channel)>,
    bearer: Bearer,
    preferred: AtomicUsize,
    pub lease: watch::Sender<Lease>,
    pub held: Mutex<HashMap<u64, Held>>,
    pub next_guard: AtomicU64,
    pub lease_expired: AtomicU64,
    /// Leader changes that extended this client's lease, as the new leaders told it.
    pub lease_extended: AtomicU64,
    /// What the last keepalive reply said the lease has left.
    pub lease_report: Mutex<Option<crate::LeaseReport>>,
    /// The last new leader's notice of what the lease has left.
    pub lease_extension: Mutex<Option<crate::LeaseReport>>,
}

impl Core {
    fn report_lease(&self, r: crate::LeaseReport) {
        let slot = match r.extended_by_new_leader_of {
            None => &self.lease_report,
            Some(_) => &self.lease_extension,
        };
        *slot.lock().expect("lease report lock") = Some(r);
    }

    /// Fails if the bearer token cannot be sent as a header value.
    pub fn new(opts: ClientOptions, channels: Vec<(String, Channel)>) -> Result<Core, Error> {
        let bearer = match &opts.auth_token {
            Some(t) => Some(format!("Bearer {t}").parse().map_err(|_| {
                Error::InvalidArgument(
                    "auth_token must be printable ASCII (it is sent as a header)".into(),
                )
            })?),
            None => None,
        };
        let now = Instant::now();
        let (lease, _) = watch::channel(Lease {
            gen: 0,
            session_id: String::new(),
            deadline: now,
            leases: GroupLeases::opened(now, Duration::ZERO, Duration::ZERO),
            lost: true,
        });
        Ok(Core {
            opts,
            channels,
            bearer: Bearer(bearer),
            preferred: AtomicUsize::new(0),
            lease,
            held: Mutex::default(),
            next_guard: AtomicU64::new(1),
            lease_expired: AtomicU64::new(0),
            lease_extended: AtomicU64::new(0),
            lease_report: Mutex::default(),
            lease_extension: Mutex::default(),
        })
    }

    /// A client of endpoint `i` that presents the bearer token.
    pub fn rpc(&self, i: usize) -> Rpc {
        LockClient::with_interceptor(self.channels[i].1.clone(), self.bearer.clone())
    }

    /// An `Admin` client of endpoint `i` that presents the bearer token (the admin's).
    pub fn admin_rpc(&self, i: usize) -> AdminRpc {
        lockd_proto::v1::admin_client::AdminClient::with_interceptor(
            self.channels[i].1.clone(),
            self.bearer.clone(),
        )
    }

    /// An admin call on the preferred node, moving on to the next node while one does not
    /// answer. Not retried otherwise: the service makes each admin call idempotent and waits for
    /// leaders itself, so a caller that sees a failure repeats the whole call.
    pub async fn admin<T, F, Fut>(&self, mut call: F) -> Result<T, Error>
    where
        F: FnMut(AdminRpc) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut last = None;
        for _ in 0..self.channels.len() {
            let i = self.preferred();
            match call(self.admin_rpc(i)).await {
                Ok(r) => return Ok(r.into_inner()),
                Err(s) => {
                    let e = Error::from(s);
                    if !matches!(e, Error::Unavailable(_)) {
                        return Err(e);
                    }
                    self.rotate(i);
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| Error::Unavailable("no endpoints".into())))
    }

    /// Opens a watch on the preferred node; a node that does not answer, or cannot serve the
    /// watch (503), is rotated away from.
    pub async fn watch(
        &self,
        req: pb::WatchRequest,
    ) -> Result<tonic::Streaming<pb::WatchEvent>, Error> {
        let i = self.preferred();
        match timeout(self.opts.request_timeout, self.rpc(i).watch(req)).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(s)) => {
                let e = Error::from(s);
                if matches!(e, Error::Unavailable(_) | Error::Api { status: 503, .. }) {
                    self.rotate(i);
                }
                Err(e)
            }
            Err(_) => {
                self.rotate(i);
                Err(Error::Unavailable(format!(
                    "{} did not answer in {:?}",
                    self.channels[i].0, self.opts.request_timeout
                )))
            }
        }
    }

    /// How many endpoints the client knows.
    pub fn endpoints(&self) -> usize {
        self.channels.len()
    }

    /// How long to wait before attempt `attempt` (from 1) of a call that failed.
    pub fn retry_delay(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        self.opts
            .retry
            .delay(attempt.saturating_sub(1), retry_after)
    }

    fn preferred(&self) -> usize {
        self.preferred.load(Relaxed) % self.channels.len()
    }

    /// Moves on to the next endpoint after `failed` did not answer.
    fn rotate(&self, failed: usize) {
        let _ = self.preferred.compare_exchange(
            failed,
            (failed + 1) % self.channels.len(),
            Relaxed,
            Relaxed,
        );
    }

    /// Moves on from the preferred endpoint, which did not answer.
    pub fn rotate_preferred(&self) {
        self.rotate(self.preferred());
    }

    pub fn margin(&self) -> Duration {
        self.opts
            .margin
            .unwrap_or_else(|| crate::lease::default_margin(self.opts.ttl))
    }

    /// A unary call on the preferred node, retried with backoff on retryable errors (moving to
    /// the next node when one does not answer).
    pub async fn unary<T, F, Fut>(&self, call: F) -> Result<T, Error>
    where
        F: FnMut(Rpc) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.unary_noting(call, &mut false).await
    }

    /// [`Core::unary`], setting `maybe_landed` if an attempt failed in a way that may have
    /// reached the service (no answer, a broken connection, an unknown outcome).
    async fn unary_noting<T, F, Fut>(
        &self,
        mut call: F,
        maybe_landed: &mut bool,
    ) -> Result<T, Error>
    where
        F: FnMut(Rpc) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let policy = &self.opts.retry;
        let mut attempt = 0;
        loop {
            let i = self.preferred();
            let rpc = self.rpc(i);
            let e = match timeout(self.opts.request_timeout, call(rpc)).await {
                Ok(Ok(r)) => return Ok(r.into_inner()),
                Ok(Err(s)) => Error::from(s),
                Err(_) => Error::Unavailable(format!(
                    "{} did not answer in {:?}",
                    self.channels[i].0, self.opts.request_timeout
                )),
            };
            if matches!(e, Error::Unavailable(_)) {
                self.rotate(i);
                *maybe_landed = true;
            }
            if matches!(e, Error::Api { status: 503, .. }) {
                // "No leader" is refused before proposing, but "outcome unknown" is also 503.
                *maybe_landed = true;
            }
            attempt += 1;
            if !e.is_retryable() || attempt >= policy.max_attempts {
                return Err(e);
            }
            tokio::time::sleep(policy.delay(attempt - 1, e.retry_after())).await;
        }
    }

    /// A release request for one hold, with the client's bearer token.
    pub fn release_request(&self, session_id: &str, name: &str, token: u64) -> pb::ReleaseRequest {
        pb::ReleaseRequest {
            session_id: session_id.to_string(),
            name: name.to_string(),
            fencing_token: token,
            ..Default::default()
        }
    }

    /// Gives back one hold (unary, retried). After a transport failure the first attempt may
    /// have landed, so a later "not the holder", "stale token" or "session not found" counts as
    /// done: the hold is gone either way. `maybe_landed` says an earlier attempt (on the
    /// session stream) may already have landed.
    pub async fn release(
        &self,
        req: pb::ReleaseRequest,
        mut maybe_landed: bool,
    ) -> Result<u32, Error> {
        let r = self
            .unary_noting(
                |mut c| {
                    let req = req.clone();
                    async move { c.release(req).await }
                },
                &mut maybe_landed,
            )
            .await;
        match r {
            Ok(r) => Ok(r.remaining),
            // The hold is gone and an earlier attempt may have ended it: the session is alive
            // but no longer holds this token (only this session, or an operator's release by
            // token, can end a live hold), or the session has ended since, which frees every
            // hold it had. Found by the nemesis: the leader committed the release, handed the
            // lock to the next waiter and was killed before answering; the client's deadline ran
            // out during the failover, and the retry's `session_not_found` was reported as a
            // refused release, i.e. a lock still held, overlapping the next holder.
            Err(Error::Api {
                status: 404 | 409,
                code,
                ..
            }) if maybe_landed
                && matches!(
                    code.as_str(),
                    "not_holder" | "stale_token" | "session_not_found"
                ) =>
            {
                Ok(0)
            }
            Err(e) => Err(e),
        }
    }

    /// Tells the service a lease ran out while the application still held the lock.
    async fn report_lease_expired(&self, name: String) {
        let r = self
            .unary(|mut c| {
                let name = name.clone();
                async move {
                    c.report_lease_expired(pb::ReportLeaseExpiredRequest { name })
                        .await
                }
            })
            .await;
        if let Err(e) = r {
            tracing::debug!(%e, "could not report an expired lease");
        }
    }
}

/// A grant, as the driver hands it to an acquire. The driver registers the hold in
/// [`Core::held`] before it answers, so that nothing that gives back holds no guard knows
/// (`give_back`, `settle_unsure`) can take it for an orphan while the caller's task has not run
/// yet. A grant dropped before a guard claims it (the acquire was cancelled) gives the hold
/// back.
pub(crate) struct Grant {
    pub token: u64,
    pub session_id: String,
    pub gen: u64,
    /// The lease the hold follows.
    pub hold: HoldLease,
    /// The guard id the hold is registered under in [`Core::held`].
    pub id: u64,
    name: String,
    /// Set until a guard claims the grant.
    unclaimed: Option<Arc<Core>>,
}

impl Grant {
    /// A guard takes the hold over: from now on the guard releases it.
    pub fn claim(&mut self) {
        self.unclaimed = None;
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        let Some(core) = self.unclaimed.take() else {
            return;
        };
        core.held.lock().expect("held lock").remove(&self.id);
        give_back_later(core, &self.session_id, &self.name, self.token);
    }
}

/// Releases one hold in the background (unary, retried), where nothing waits for the answer:
/// a grant nobody claims. Without a runtime, the session's end frees it.
fn give_back_later(core: Arc<Core>, session_id: &str, name: &str, token: u64) {
    let req = core.release_request(session_id, name, token);
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(async move {
            let _ = core.release(req, false).await;
        });
    }
}

/// How a release sent on the session stream ended.
#[derive(Debug)]
pub(crate) enum StreamRelease {
    /// The service answered.
    Answered(Result<u32, Error>),
    /// The stream broke (or the session ended here) before the answer: it may have landed.
    Unsure,
    /// Not sent: no stream, or the hold belongs to another session than the stream's.
    NotSent,
}

pub(crate) enum Cmd {
    /// Open the session now if there is none (used by `Client::connect`).
    Open(oneshot::Sender<Result<(), Error>>),
    Acquire(pb::AcquireRequest, oneshot::Sender<Result<Grant, Error>>),
    Release(pb::ReleaseRequest, oneshot::Sender<StreamRelease>),
    Close(oneshot::Sender<Result<(), Error>>),
}

struct Sess {
    id: String,
    gen: u64,
    /// The local deadlines' rule (`lease.rs`).
    leases: GroupLeases,
    every: Duration,
    next_keepalive: Instant,
    reconnect_at: Instant,
    reconnect_attempt: u32,
}

struct Conn {
    tx: mpsc::UnboundedSender<pb::SessionRequest>,
    rx: tonic::Streaming<pb::SessionEvent>,
    endpoint: usize,
}

struct Acq {
    name: String,
    owner: String,
    /// When the acquire was sent: a lease that a grant starts in a group starts later.
    sent: Instant,
    /// When its wait ends on the service (send time + `wait_ms`): an adopted wait whose
    /// outcome is never pushed gives up a little after it (`Driver::keepalive`).
    wait_until: Instant,
    reply: oneshot::Sender<Result<Grant, Error>>,
}

/// How long past its wait an adopted wait's acquire waits for a push before it gives up.
const ADOPTED_SLACK: Duration = Duration::from_secs(2);

/// A grant as the stream said it: token, group, the group's move count, the lease's TTL,
/// whether the request started the session's lease in the group, and the lease there as the
/// group's leader renewed it when it granted (`(ttl_ms, group_moves)`).
struct Granted {
    token: u64,
    group: u32,
    group_moves: u64,
    lease_ttl_ms: u64,
    lease_started: bool,
    renewed: Option<(u64, u64)>,
}

/// A lease renewal an acquire's answer carries, if it is one (`AcquireResponse.renewed`).
fn renewal(lease: Option<&pb::GroupLease>) -> Option<(u64, u64)> {
    lease
        .filter(|l| l.state == pb::GroupLeaseState::Extended as i32)
        .map(|l| (l.ttl_ms, l.group_moves))
}

enum Pending {
    /// A keepalive sent then; `true` when it named its groups.
    KeepAlive(Instant, bool),
    Acquire(Acq),
    Release(oneshot::Sender<StreamRelease>),
}

pub(crate) struct Driver {
    core: Arc<Core>,
    cmds: mpsc::UnboundedReceiver<Cmd>,
    sess: Option<Sess>,
    conn: Option<Conn>,
    gen: u64,
    next_rid: u64,
    pending: HashMap<u64, Pending>,
    /// Queued waits and the pushes that answer them (`pushes.rs`).
    pushes: Pushes<Acq>,
    /// (name, owner) of acquires whose outcome a broken stream took with it.
    unsure: Vec<(String, String)>,
    /// When to give back the holds of `unsure` acquires (a retry met its own first attempt).
    settle_at: Option<Instant>,
}

async fn at(t: Option<Instant>) {
    match t {
        Some(t) => sleep_until(t).await,
        None => std::future::pending().await,
    }
}

async fn next_event(conn: &mut Option<Conn>) -> Result<Option<pb::SessionEvent>, tonic::Status> {
    match conn {
        Some(c) => c.rx.message().await,
        None => std::future::pending().await,
    }
}

impl Driver {
    pub fn new(core: Arc<Core>, cmds: mpsc::UnboundedReceiver<Cmd>) -> Driver {
        Driver {
            core,
            cmds,
            sess: None,
            conn: None,
            gen: 0,
            next_rid: 1,
            pending: HashMap::new(),
            pushes: Pushes::default(),
            unsure: Vec::new(),
            settle_at: None,
        }
    }

    pub async fn run(mut self) {
        loop {
            let deadline = self.sess.as_ref().map(|s| s.leases.session_deadline());
            let keepalive = self
                .sess
                .as_ref()
                .filter(|_| self.conn.is_some())
                .map(|s| s.next_keepalive);
            let reconnect = self
                .sess
                .as_ref()
                .filter(|_| self.conn.is_none())
                .map(|s| s.reconnect_at);
            let settle = self.settle_at.filter(|_| self.conn.is_some());
            tokio::select! {
                biased;
                _ = at(deadline) => {
                    // A renewal may have raced the timer: only a deadline still in the past counts.
                    if self.sess.as_ref().is_some_and(|s| s.leases.session_deadline() <= Instant::now()) {
                        self.lose("the local lease deadline passed without a renewal", true);
                    }
                }
                // Before commands: a retry must not be sent while its first attempt's hold is
                // still to be given back.
                _ = at(settle) => {
                    self.settle_at = None;
                    if let Some(id) = self.sess.as_ref().map(|s| s.id.clone()) {
                        self.settle_unsure(&id).await;
                    }
                }
                cmd = self.cmds.recv() => match cmd {
                    None => {
                        let _ = self.close().await;
                        return;
                    }
                    Some(Cmd::Close(reply)) => {
                        let _ = reply.send(self.close().await);
                        return;
                    }
                    Some(Cmd::Open(reply)) => {
                        let r = self.ensure_session().await;
                        let _ = reply.send(r);
                    }
                    Some(Cmd::Acquire(req, reply)) => self.acquire(req, reply).await,
                    Some(Cmd::Release(req, reply)) => self.release(req, reply),
                },
                ev = next_event(&mut self.conn) => match ev {
                    Ok(Some(ev)) => self.event(ev),
                    Ok(None) => self.disconnected("the node ended the session stream"),
                    Err(s) => self.disconnected(&format!("session stream failed: {}", s.message())),
                },
                _ = at(keepalive) => self.keepalive(),
                _ = at(reconnect) => self.reconnect().await,
            }
        }
    }

    fn rid(&mut self) -> u64 {
        self.next_rid += 1;
        self.next_rid
    }

    /// Opens a stream to endpoint `i` whose first message is `first`; returns the stream, the
    /// first answer and when the request was sent.
    async fn handshake(&mut self, i: usize, first: Req) -> Result<(Conn, Ev, Instant), Error> {
        let rid = self.rid();
        let (tx, rx) = mpsc::unbounded_channel();
        let sent = Instant::now();
        let _ = tx.send(pb::SessionRequest {
            request_id: rid,
            kind: Some(first),
        });
        let mut rpc = self.core.rpc(i);
        let handshake = async {
            let mut stream = rpc
                .session(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
                .await?
                .into_inner();
            loop {
                match stream.message().await? {
                    Some(ev) if ev.request_id == rid => match ev.kind {
                        Some(Ev::Error(e)) => return Err(Error::from_event(e)),
                        Some(k) => return Ok((stream, k)),
                        None => return Err(Error::Unavailable("an empty reply".into())),
                    },
                    Some(_) => continue,
                    None => return Err(Error::Unavailable("the node closed the stream".into())),
                }
            }
        };
        match timeout(self.core.opts.request_timeout, handshake).await {
            Ok(Ok((rx, k))) => Ok((
                Conn {
                    tx,
                    rx,
                    endpoint: i,
                },
                k,
                sent,
            )),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::Unavailable(format!(
                "{} did not answer in {:?}",
                self.core.channels[i].0, self.core.opts.request_timeout
            ))),
        }
    }

    async fn ensure_session(&mut self) -> Result<(), Error> {
        if self.sess.is_some() {
            return Ok(());
        }
        let core = self.core.clone();
        let o = &core.opts;
        let open = pb::OpenSessionRequest {
            client: o.client_name.clone(),
            ttl_ms: o.ttl.as_millis() as u64,
            namespace: o.namespace.clone(),
            ..Default::default()
        };
        let mut attempt = 0;
        loop {
            let i = self.core.preferred();
            let e = match self.handshake(i, Req::Open(open.clone())).await {
                Ok((conn, Ev::Opened(r), sent)) => {
                    self.gen += 1;
                    let ttl = Duration::from_millis(r.ttl_ms);
                    let every = Duration::from_millis(r.keepalive_every_ms.max(1));
                    let mut leases = GroupLeases::opened(sent, ttl, self.core.margin());
                    leases.homed(r.group, sent, Instant::now());
                    let deadline = leases.session().deadline();
                    self.sess = Some(Sess {
                        id: r.session_id.clone(),
                        gen: self.gen,
                        leases: leases.clone(),
                        every,
                        next_keepalive: sent + every,
                        reconnect_at: sent,
                        reconnect_attempt: 0,
                    });
                    self.conn = Some(conn);
                    self.core.lease.send_replace(Lease {
                        gen: self.gen,
                        session_id: r.session_id,
                        deadline,
                        leases,
                        lost: false,
                    });
                    return Ok(());
                }
                Ok((_, other, _)) => {
                    Error::Unavailable(format!("unexpected answer to open: {other:?}"))
                }
                Err(e) => e,
            };
            if matches!(e, Error::Unavailable(_)) {
                self.core.rotate(i);
            }
            attempt += 1;
            if !e.is_retryable() || attempt >= o.retry.max_attempts {
                return Err(e);
            }
            tokio::time::sleep(o.retry.delay(attempt - 1, e.retry_after())).await;
        }
    }

    /// A renewal sent at `sent` (`named`: naming its groups) was acknowledged with `k`.
    fn renewed(&mut self, sent: Instant, k: &pb::KeepAliveResponse, named: bool) {
        let Some(s) = &mut self.sess else { return };
        self.core.report_lease(crate::LeaseReport {
            remaining: Duration::from_millis(k.ttl_ms),
            at: sent,
            extended_by_new_leader_of: None,
        });
        let groups: Vec<(u32, GroupAnswer)> = k.groups.iter().map(group_answer).collect();
        let now = Instant::now();
        // Too late for some lease: its guards are lost (`lease.rs`), the others go on. Only
        // when no lease of the session may still be alive is the session lost.
        let _ = s.leases.renewed(sent, k.ttl_ms, &groups, named, now);
        if s.leases.session_deadline() <= now {
            self.lose("the local lease deadline passed without a renewal", true)
        } else {
            self.publish();
        }
    }

    /// Tells every guard the session's leases as they are now.
    fn publish(&self) {
        let Some(s) = &self.sess else { return };
        let gen = s.gen;
        self.core.lease.send_if_modified(|l| {
            let changed = l.gen == gen && !l.lost && l.leases != s.leases;
            if changed {
                l.leases = s.leases.clone();
                l.deadline = s.leases.session().deadline();
            }
            changed
        });
    }

    fn keepalive(&mut self) {
        let (Some(s), Some(c)) = (&mut self.sess, &self.conn) else {
            return;
        };
        let now = Instant::now();
        s.next_keepalive = now + s.every;
        // An adopted wait whose outcome no node pushes (it was queued in a group this node
        // does not host, and the node that relayed it is gone): the caller decides again.
        for a in self
            .pushes
            .give_up_adopters(|a| a.wait_until + ADOPTED_SLACK <= now)
        {
            let _ = a.reply.send(Err(Error::Unavailable(format!(
                "the wait for '{}' queued before the session stream broke was not answered on \
                 the new stream",
                a.name
            ))));
        }
        // The previous keepalive went unanswered for a whole interval: the node is stuck or gone.
        let stale = self.pending.values().any(|p| match p {
            Pending::KeepAlive(sent, _) => now.duration_since(*sent) >= s.every,
            Pending::Acquire(_) | Pending::Release(_) => false,
        });
        if stale {
            self.core.rotate(c.endpoint);
            self.disconnected("a keepalive went unanswered for a whole interval");
            return;
        }
        let id = s.id.clone();
        let groups = self.keepalive_groups();
        let rid = self.rid();
        let named = !groups.is_empty();
        self.pending.insert(rid, Pending::KeepAlive(now, named));
        self.send(
            rid,
            Req::Keepalive(pb::KeepAliveRequest {
                session_id: id,
                groups,
            }),
        );
    }

    /// The groups the next keepalive renews (empty: every group; `lease.rs`): the home, the
    /// groups of this session's holds and queued waits, and those it used within one TTL.
    fn keepalive_groups(&mut self) -> Vec<u32> {
        let Some(s) = &mut self.sess else {
            return Vec::new();
        };
        let holds: Vec<HoldLease> = {
            let held = self.core.held.lock().expect("held lock");
            (held.values().filter(|h| h.gen == s.gen))
                .map(|h| h.hold)
                .collect()
        };
        let unsure = !self.unsure.is_empty() || self.pushes.has_strays();
        s.leases
            .keepalive_groups(holds, self.pushes.wait_groups(), unsure, Instant::now())
    }

    fn send(&mut self, rid: u64, kind: Req) {
        if let Some(c) = &self.conn {
            let _ = c.tx.send(pb::SessionRequest {
                request_id: rid,
                kind: Some(kind),
            });
        }
    }

    async fn acquire(
        &mut self,
        req: pb::AcquireRequest,
        reply: oneshot::Sender<Result<Grant, Error>>,
    ) {
        if let Err(e) = self.ensure_session().await {
            let _ = reply.send(Err(e));
            return;
        }
        if self.conn.is_none() {
            let _ = reply.send(Err(Error::Unavailable(
                "the session stream is reconnecting".into(),
            )));
            return;
        }
        let rid = self.rid();
        self.pending.insert(
            rid,
            Pending::Acquire(Acq {
                name: req.name.clone(),
                owner: req.owner.clone(),
                sent: Instant::now(),
                wait_until: Instant::now() + Duration::from_millis(req.wait_ms),
                reply,
            }),
        );
        self.send(rid, Req::Acquire(req));
    }

    /// Sends a release on the stream when the stream carries the hold's session.
    fn release(&mut self, req: pb::ReleaseRequest, reply: oneshot::Sender<StreamRelease>) {
        let ours = self.sess.as_ref().is_some_and(|s| s.id == req.session_id);
        if !ours || self.conn.is_none() {
            let _ = reply.send(StreamRelease::NotSent);
            return;
        }
        let rid = self.rid();
        self.pending.insert(rid, Pending::Release(reply));
        self.send(rid, Req::Release(req));
    }

    fn event(&mut self, ev: pb::SessionEvent) {
        let Some(kind) = ev.kind else { return };
        let pending = (ev.request_id != 0)
            .then(|| self.pending.remove(&ev.request_id))
            .flatten();
        match (kind, pending) {
            (Ev::Keepalive(k), Some(Pending::KeepAlive(sent, named))) => {
                self.renewed(sent, &k, named)
            }
            (Ev::Error(e), Some(Pending::KeepAlive(..))) => {
                if e.status == 404 {
                    self.lose("the service no longer knows the session", true);
                }
            }
            (Ev::Acquired(r), Some(Pending::Acquire(a))) => {
                let name = a.name.clone();
                self.pushes.settled(&a.name, &a.owner);
                let out = if r.acquired {
                    Ok(Granted {
                        token: r.fencing_token,
                        group: r.group,
                        group_moves: r.group_moves,
                        lease_ttl_ms: r.lease_ttl_ms,
                        lease_started: r.lease_started,
                        renewed: renewal(r.renewed.as_ref()),
                    })
                } else {
                    Err(Error::NotAcquired {
                        holder: (!r.holder.is_empty()).then_some(r.holder),
                        queue_position: r.queue_position,
                        wait_estimate_ms: r.wait_estimate_ms,
                    })
                };
                self.answer(a, out);
                self.unclaimed(&name);
            }
            (Ev::Queued(q), Some(Pending::Acquire(a))) => {
                let name = a.name.clone();
                self.pushes.settled(&a.name, &a.owner);
                // The wait's group adopted the session for it: the lease there counts from
                // the acquire's send (its grant is pushed later).
                if let (true, Some(s)) = (q.lease_started, &mut self.sess) {
                    s.leases.started(q.group, a.sent, 0, Instant::now());
                }
                // Queueing renewed the session's lease there, as a keepalive sent with the
                // acquire would have.
                if let (Some((ttl_ms, moves)), Some(s)) =
                    (renewal(q.renewed.as_ref()), &mut self.sess)
                {
                    (s.leases).renewed_in(q.group, a.sent, ttl_ms, moves, Instant::now());
                }
                if let Some((a, push)) = self.pushes.queued((q.group, q.waiter), a) {
                    self.outcome(a, push);
                }
                self.unclaimed(&name);
            }
            // Refused by its own first attempt, whose answer a broken stream took: the wait is
            // queued for the session, and this retry adopts it (`pushes.rs`).
            (Ev::Error(e), Some(Pending::Acquire(mut a))) if e.code == "already_waiting" => {
                let (name, owner) = (a.name.clone(), a.owner.clone());
                // The wait it adopts was queued by the first attempt and may have been granted
                // before this retry was sent: its lease counts from the first send.
                if let Some(first) = self.pushes.stray_since(&name, &owner) {
                    a.sent = a.sent.min(first);
                }
                match self.pushes.refused_waiting(&name, &owner, a) {
                    Ok(Some((a, push))) => self.outcome(a, push),
                    Ok(None) => {}
                    Err(a) => {
                        let _ = a.reply.send(Err(Error::from_event(e)));
                    }
                }
                self.unclaimed(&name);
            }
            (Ev::Error(e), Some(Pending::Acquire(a))) => {
                let name = a.name.clone();
                let err = if e.code == "already_held" && self.first_attempt_held(&a) {
                    // Its own first attempt landed as a hold no guard knows: give that back
                    // (`settle_unsure`), and the caller's retry starts clean.
                    self.unsure.push((a.name.clone(), a.owner.clone()));
                    self.settle_at = Some(Instant::now());
                    Error::Unavailable(format!(
                        "the first attempt at '{name}' landed after its stream broke; that hold \
                         is given back before the retry"
                    ))
                } else {
                    self.pushes.settled(&a.name, &a.owner);
                    Error::from_event(e)
                };
                let _ = a.reply.send(Err(err));
                self.unclaimed(&name);
            }
            (Ev::Released(r), Some(Pending::Release(reply))) => {
                let _ = reply.send(StreamRelease::Answered(Ok(r.remaining)));
            }
            (Ev::Error(e), Some(Pending::Release(reply))) => {
                let _ = reply.send(StreamRelease::Answered(Err(Error::from_event(e))));
            }
            // Expired in one group: only that group's lease ended (its guards are lost); the
            // session goes on in its other groups.
            (Ev::SessionEnded(e), _) if e.group != 0 && e.reason == "expired" => {
                if let Some(s) = &mut self.sess {
                    s.leases.ended(e.group, Instant::now());
                }
                self.publish();
            }
            (Ev::SessionEnded(e), _) => {
                let why = format!("the service ended the session ({})", e.reason);
                self.lose(&why, e.reason != "closed");
            }
            (push @ (Ev::Granted(_) | Ev::WaitEnded(_)), _) => {
                let pending = &self.pending;
                let pushed = self.pushes.pushed(push, |n| unanswered(pending, n));
                self.pushed(pushed);
            }
            (Ev::LeaseExtended(l), _) => {
                self.core.lease_extended.fetch_add(1, Relaxed);
                // A server without `remaining_ms` (older) says only the grace it added.
                if l.remaining_ms > 0 {
                    self.core.report_lease(crate::LeaseReport {
                        remaining: Duration::from_millis(l.remaining_ms),
                        at: Instant::now(),
                        extended_by_new_leader_of: Some(l.group),
                    });
                }
                tracing::info!(
                    group = l.group,
                    by_ms = l.extended_by_ms,
                    remaining_ms = l.remaining_ms,
                    "a new leader extended the lease; the local deadline keeps its own rule \
                     (send time + TTL - margin), which is shorter"
                )
            }
            (other, _) => tracing::debug!(?other, "unexpected session event"),
        }
    }

    /// Whether an `already_held` answer to `a` is its own first attempt's hold: the acquire
    /// is a stray (its outcome went with a broken stream) and no guard of this session holds
    /// the name.
    fn first_attempt_held(&self, a: &Acq) -> bool {
        let Some(s) = &self.sess else { return false };
        let guarded = {
            let held = self.core.held.lock().expect("held lock");
            held.values().any(|h| h.name == a.name && h.gen == s.gen)
        };
        !guarded && self.pushes.is_stray(&a.name, &a.owner)
    }

    /// Acts on what `pushes.rs` made of a push.
    fn pushed(&mut self, pushed: Pushed<Acq>) {
        match pushed {
            Pushed::Answer(a, push) => self.outcome(a, push),
            Pushed::Orphan { name, token } => self.give_back(name, token),
            Pushed::Kept | Pushed::Dropped => {}
        }
    }

    /// Pushes of `name` kept for a reply that did not claim them: an adopter's, or orphans.
    fn unclaimed(&mut self, name: &str) {
        let pending = &self.pending;
        for p in self.pushes.unclaimed(name, |n| unanswered(pending, n)) {
            self.pushed(p);
        }
    }

    /// A grant nobody waits for (its acquire gave up after the stream broke): give it back,
    /// unless a guard holds it (a second push of a grant already answered).
    fn give_back(&mut self, name: String, token: u64) {
        let Some(s) = &self.sess else { return };
        let known = {
            let held = self.core.held.lock().expect("held lock");
            held.values().any(|h| h.name == name && h.token == token)
        };
        if known {
            return;
        }
        tracing::debug!(name, token, "giving back a grant nobody waits for");
        give_back_later(self.core.clone(), &s.id, &name, token);
    }

    /// A `granted` or `wait_ended` push answers the acquire `a`.
    fn outcome(&mut self, a: Acq, push: Ev) {
        let out = match push {
            Ev::Granted(g) => Ok(Granted {
                token: g.fencing_token,
                group: g.group,
                group_moves: g.group_moves,
                lease_ttl_ms: g.lease_ttl_ms,
                // Its `queued` answer said so, if it did (`event`).
                lease_started: false,
                renewed: None,
            }),
            Ev::WaitEnded(w) if w.reason == "session_ended" => Err(Error::SessionLost),
            // The name's bucket moved to another group: the acquire loop queues again there.
            Ev::WaitEnded(w) if w.reason == "moved" => Err(Error::Unavailable(format!(
                "the bucket of '{}' moved to another group; queueing again",
                w.name
            ))),
            _ => Err(Error::NotAcquired {
                holder: None,
                queue_position: 0,
                wait_estimate_ms: None,
            }),
        };
        self.answer(a, out);
    }

    fn answer(&mut self, a: Acq, out: Result<Granted, Error>) {
        let Some(s) = &mut self.sess else {
            let _ = a.reply.send(Err(Error::SessionLost));
            return;
        };
        // Other acquires still unanswered may have brought the session into the group.
        let others = (self.pending.values())
            .filter_map(|p| match p {
                Pending::Acquire(o) => Some(o.sent),
                _ => None,
            })
            .min();
        let out = out.map(|g| {
            let now = Instant::now();
            if g.lease_started {
                s.leases.started(g.group, a.sent, g.lease_ttl_ms, now);
            }
            if let Some((ttl_ms, moves)) = g.renewed {
                (s.leases).renewed_in(g.group, a.sent, ttl_ms, moves, now);
            }
            let hold =
                (s.leases).granted(a.sent, now, g.group, g.group_moves, g.lease_ttl_ms, others);
            let id = self.core.next_guard.fetch_add(1, Relaxed);
            self.core.held.lock().expect("held lock").insert(
                id,
                Held {
                    name: a.name.clone(),
                    gen: s.gen,
                    token: g.token,
                    hold,
                },
            );
            Grant {
                token: g.token,
                session_id: s.id.clone(),
                gen: s.gen,
                hold,
                id,
                name: a.name.clone(),
                unclaimed: Some(self.core.clone()),
            }
        });
        self.publish();
        // A grant nobody waits for any more (the acquire was dropped) comes back here and is
        // dropped: it gives the hold back.
        let _ = a.reply.send(out);
    }

    /// The stream broke: fail what was in flight (their outcome is unknown), and reconnect.
    fn disconnected(&mut self, why: &str) {
        let Some(c) = self.conn.take() else { return };
        tracing::debug!(endpoint = %self.core.channels[c.endpoint].0, why, "session stream lost");
        self.core.rotate(c.endpoint);
        let waits = self.pushes.broke();
        let pending: Vec<_> = self.pending.drain().map(|(_, p)| p).collect();
        for p in pending {
            match p {
                Pending::Acquire(a) => self.fail_unsure(a),
                Pending::Release(reply) => {
                    let _ = reply.send(StreamRelease::Unsure);
                }
                Pending::KeepAlive(..) => {}
            }
        }
        for a in waits {
            self.fail_unsure(a);
        }
        if let Some(s) = &mut self.sess {
            s.reconnect_at = Instant::now();
            s.reconnect_attempt = 0;
        }
    }

    fn fail_unsure(&mut self, a: Acq) {
        if let Some(s) = &mut self.sess {
            s.leases.unsure_since(a.sent);
        }
        self.pushes.stray(a.name.clone(), a.owner.clone(), a.sent);
        self.unsure.push((a.name, a.owner));
        let _ = a.reply.send(Err(Error::Unavailable(
            "the session stream broke before the acquire was answered".into(),
        )));
    }

    /// Moves the session to the next node (`attach`), within the local deadline.
    async fn reconnect(&mut self) {
        let Some(s) = &self.sess else { return };
        let (id, deadline) = (s.id.clone(), s.leases.session_deadline());
        let i = self.core.preferred();
        let attach = self.handshake(i, Req::Attach(id.clone()));
        // An attach answered after the local deadline could not save the lease anyway.
        let Ok(attached) = tokio::time::timeout_at(deadline, attach).await else {
            self.lose("the local lease deadline passed while reconnecting", true);
            return;
        };
        match attached {
            Ok((conn, Ev::Keepalive(k), sent)) => {
                tracing::debug!(endpoint = %self.core.channels[i].0, "session stream moved");
                self.conn = Some(conn);
                // An attach renews every group.
                self.renewed(sent, &k, false);
                if let Some(s) = &mut self.sess {
                    s.next_keepalive = sent + s.every;
                }
                self.settle_unsure(&id).await;
            }
            Ok((_, other, _)) => {
                tracing::debug!(?other, "unexpected answer to attach");
                self.retry_reconnect(i);
            }
            Err(e) if e.code() == "session_not_found" => {
                self.lose("the service no longer knows the session", true)
            }
            Err(e) => {
                tracing::debug!(%e, endpoint = %self.core.channels[i].0, "attach failed");
                self.retry_reconnect(i);
            }
        }
    }

    fn retry_reconnect(&mut self, failed: usize) {
        self.core.rotate(failed);
        if let Some(s) = &mut self.sess {
            let d = self.core.opts.retry.delay(s.reconnect_attempt.min(4), None);
            s.reconnect_attempt += 1;
            s.reconnect_at = Instant::now() + d;
        }
    }

    /// Acquires whose answer the broken stream lost may have been granted: a hold of ours that no
    /// guard knows is given back, so the caller's retry starts clean (`pushes::settle`). A name
    /// with an acquire or a wait still open is settled later.
    async fn settle_unsure(&mut self, session_id: &str) {
        let unsure = std::mem::take(&mut self.unsure);
        let Some(every) = self.sess.as_ref().map(|s| s.every) else {
            return;
        };
        if unsure.is_empty() {
            return;
        }
        let end = Instant::now() + every;
        // Our own session's holds (inspect does not show other sessions' ids, and need not).
        let req = pb::GetSessionRequest {
            session_id: session_id.to_string(),
        };
        let mut rpc = self.core.rpc(self.core.preferred());
        let Ok(Ok(detail)) = tokio::time::timeout_at(end, rpc.get_session(req)).await else {
            return;
        };
        let listed: Vec<(String, u64)> = detail
            .into_inner()
            .held
            .into_iter()
            .map(|h| (h.name, h.fencing_token))
            .collect();
        let (give_back, later) = {
            let held = self.core.held.lock().expect("held lock");
            let (pending, pushes) = (&self.pending, &self.pushes);
            crate::pushes::settle(
                unsure,
                &listed,
                |name, token| held.values().any(|h| h.name == name && h.token == token),
                |name| unanswered(pending, name) || pushes.waiting(|a| a.name == name),
            )
        };
        if !later.is_empty() {
            self.unsure.extend(later);
            self.settle_at = Some(Instant::now() + every);
        }
        let release = async {
            for (name, token) in give_back {
                let req = self.core.release_request(session_id, &name, token);
                let _ = self.core.release(req, false).await;
            }
        };
        let _ = tokio::time::timeout_at(end, release).await;
    }

    /// Ends the session on this side: drops the stream, marks generation `gen` lost for every
    /// guard, and fails every acquire still in flight or waiting with `err`.
    fn end_locally(&mut self, gen: u64, err: impl Fn() -> Error) {
        self.conn = None;
        self.core.lease.send_modify(|l| {
            if l.gen == gen {
                l.lost = true;
            }
        });
        for p in std::mem::take(&mut self.pending).into_values() {
            match p {
                Pending::Acquire(a) => {
                    let _ = a.reply.send(Err(err()));
                }
                // The session is ending, which frees its holds; the caller settles it.
                Pending::Release(reply) => {
                    let _ = reply.send(StreamRelease::Unsure);
                }
                Pending::KeepAlive(..) => {}
            }
        }
        for a in self.pushes.end() {
            let _ = a.reply.send(Err(err()));
        }
    }

    /// The session is over for this client: every guard of it is lost.
    fn lose(&mut self, why: &str, report: bool) {
        let Some(s) = self.sess.take() else { return };
        // Not the session id: it is the session's capability, and logs travel.
        tracing::warn!(client = %self.core.opts.client_name, why, "lockd session lost");
        self.end_locally(s.gen, || Error::SessionLost);
        self.unsure.clear();
        let held: Vec<String> = {
            let held = self.core.held.lock().expect("held lock");
            held.values()
                .filter(|h| h.gen == s.gen)
                .map(|h| h.name.clone())
                .collect()
        };
        let held = if report { held } else { Vec::new() };
        self.core
            .lease_expired
            .fetch_add(held.len() as u64, Relaxed);
        let core = self.core.clone();
        let id = s.id;
        tokio::spawn(async move {
            for name in held {
                core.report_lease_expired(name).await;
            }
            // The guards are lost; free their locks now rather than at the service's expiry.
            let _ = core
                .unary(|mut c| {
                    let session_id = id.clone();
                    async move {
                        c.close_session(pb::CloseSessionRequest { session_id })
                            .await
                    }
                })
                .await;
        });
    }

    async fn close(&mut self) -> Result<(), Error> {
        let Some(s) = self.sess.take() else {
            return Ok(());
        };
        self.end_locally(s.gen, || Error::Closed);
        let id = s.id;
        self.core
            .unary(|mut c| {
                let session_id = id.clone();
                async move {
                    c.close_session(pb::CloseSessionRequest { session_id })
                        .await
                }
            })
            .await
            .map(|_| ())
    }
}

/// Whether an acquire of `name` is still unanswered on the stream.
fn unanswered(pending: &HashMap<u64, Pending>, name: &str) -> bool {
    pending
        .values()
        .any(|p| matches!(p, Pending::Acquire(a) if a.name == name))
}

/// A group's answer to a keepalive as `lease.rs` takes it.
fn group_answer(g: &pb::GroupLease) -> (u32, GroupAnswer) {
    let answer = match g.state() {
        pb::GroupLeaseState::Extended => GroupAnswer::Extended {
            ttl_ms: g.ttl_ms,
            group_moves: g.group_moves,
        },
        pb::GroupLeaseState::NotHere => GroupAnswer::NotHere,
        pb::GroupLeaseState::Unreachable | pb::GroupLeaseState::Unspecified => GroupAnswer::Other,
    };
    (g.group, answer)
}
