//! [`Client`], the [`acquire`](Client::acquire) builder and [`LockGuard`].

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use lockd_proto::v1 as pb;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::session::{Cmd, Core, Driver, Lease, StreamRelease};
use crate::{Error, RetryPolicy};

/// The longest wait the service accepts for one acquire (`wait_ms` ≤ 300 000).
const MAX_WAIT: Duration = Duration::from_secs(300);

/// How a [`Client`] behaves. `ClientOptions::default()` suits most workers.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Names this process in the service's views, e.g. `payout-worker-17`; also the default
    /// owner of its locks. Default: `HOST/PID` (e.g. `web-3/4242`).
    pub client_name: String,
    /// The session TTL to ask for, within the namespace's bounds (the service refuses one
    /// outside them: `ttl_out_of_range`). Default 15 s.
    pub ttl: Duration,
    /// How long before the lease's end a guard reports it lost. Default `ttl / 5` (3 s at 15 s).
    pub margin: Option<Duration>,
    /// The namespace whose TTL bounds (and bearer token) the session uses; empty = `default`.
    pub namespace: String,
    /// Bearer token for namespaces that require one.
    pub auth_token: Option<String>,
    /// How long one request may take before the node counts as unreachable. Default 2 s.
    pub request_timeout: Duration,
    /// Backoff for retryable errors.
    pub retry: RetryPolicy,
    /// TLS for the endpoints: with it, an endpoint without a scheme is dialled as `https://`.
    /// An `https://` endpoint without it trusts the public web roots (webpki-roots).
    pub tls: Option<TlsOptions>,
}

/// How to speak TLS to the nodes: the CA to trust, and a client certificate for clusters that
/// require one (`lockd serve --tls-client-ca-file`).
#[derive(Clone, Default)]
pub struct TlsOptions {
    /// The CA (PEM) that signed the nodes' certificates; `None`: the public web roots.
    pub ca_pem: Option<Vec<u8>>,
    /// This client's certificate chain and private key (PEM), both or neither.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The name to check the node's certificate against, when the endpoint's host is not it
    /// (an IP address behind a load balancer, say).
    pub domain: Option<String>,
}

impl std::fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("TlsOptions")
            .field("custom_ca", &self.ca_pem.is_some())
            .field("client_certificate", &self.identity.is_some())
            .field("domain", &self.domain)
            .finish()
    }
}

impl TlsOptions {
    fn tonic(&self) -> tonic::transport::ClientTlsConfig {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let mut c = match &self.ca_pem {
            Some(ca) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)),
            None => ClientTlsConfig::new().with_webpki_roots(),
        };
        if let Some((cert, key)) = &self.identity {
            c = c.identity(Identity::from_pem(cert, key));
        }
        if let Some(d) = &self.domain {
            c = c.domain_name(d.clone());
        }
        c
    }
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            client_name: host_pid(),
            ttl: Duration::from_secs(15),
            margin: None,
            namespace: String::new(),
            auth_token: None,
            request_timeout: Duration::from_secs(2),
            retry: RetryPolicy::default(),
            tls: None,
        }
    }
}

/// `HOST/PID` of this process: the default client name and owner, so a holder can be found.
pub fn host_pid() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("{host}/{}", std::process::id())
}

/// A connection to a lockd cluster, carrying one session for the whole process.
///
/// The session is opened by [`Client::connect`] and kept alive every TTL/3 over one `Session`
/// stream. Any node accepts any request (it forwards to the lock groups' leaders), and one
/// session id serves every lock group: it opens in a home group, the first acquire in another
/// group adopts it there, and each keepalive names the groups the session uses (its home and
/// the groups of its holds and waits; docs/API.md). So the client keeps **one** session and
/// **one** stream, not one per group as GUIDE §2 sketches, with a lease per group; when
/// the stream breaks or a node stops answering, the stream moves to the next endpoint and
/// `attach`es the same session while its lease lasts.
///
/// If the lease's local deadline passes without a renewal, every [`LockGuard`] reports
/// [`lost`](LockGuard::lost), the service is told ("lease expired while still working", counted
/// by [`Client::lease_expired_count`]) and the next acquire opens a fresh session.
///
/// `Client` is cheap to clone; the session is closed by [`Client::close`], or in the background
/// once every clone and every guard is dropped.
#[derive(Clone)]
pub struct Client {
    core: Arc<Core>,
    cmds: mpsc::UnboundedSender<Cmd>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("endpoints", &self.endpoints())
            .field("session", &self.core.lease.borrow().session_id)
            .finish()
    }
}

/// `host:port` (`https://` with TLS options, else `http://`), `http://host:port` or
/// `https://host:port`.
fn endpoint(addr: &str, tls: Option<&TlsOptions>) -> Result<tonic::transport::Endpoint, Error> {
    let uri = match (addr.contains("://"), tls) {
        (true, _) => addr.to_string(),
        (false, Some(_)) => format!("https://{addr}"),
        (false, None) => format!("http://{addr}"),
    };
    let bad =
        |e: tonic::transport::Error| Error::InvalidArgument(format!("endpoint '{addr}': {e}"));
    let mut ep = tonic::transport::Endpoint::from_shared(uri.clone())
        .map_err(bad)?
        .connect_timeout(Duration::from_secs(1))
        .tcp_nodelay(true);
    if uri.starts_with("https://") {
        let tls = tls.cloned().unwrap_or_default();
        ep = ep.tls_config(tls.tonic()).map_err(bad)?;
    }
    Ok(ep)
}

impl Client {
    /// Connects to a cluster given some of its nodes' gRPC addresses (`127.0.0.1:7170` or
    /// `http://…`) with default options, and opens the session. Errors a retry may cure (no
    /// leader yet, a node down, load shed) are retried with backoff; a namespace or cluster at
    /// its session cap (`too_many_sessions`, 429) is returned at once ([`Error::is_retryable`]).
    pub async fn connect<I, S>(endpoints: I) -> Result<Client, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Client::connect_with(endpoints, ClientOptions::default()).await
    }

    /// [`Client::connect`] with options.
    pub async fn connect_with<I, S>(endpoints: I, opts: ClientOptions) -> Result<Client, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let client = Client::lazy(endpoints, opts)?;
        let (tx, rx) = oneshot::channel();
        client.cmds.send(Cmd::Open(tx)).map_err(|_| Error::Closed)?;
        rx.await.map_err(|_| Error::Closed)??;
        Ok(client)
    }

    /// A client that opens its session on first use (the first acquire). Unary calls such as
    /// [`Client::inspect`] need no session. Must be called within a Tokio runtime.
    pub fn lazy<I, S>(endpoints: I, opts: ClientOptions) -> Result<Client, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let channels = endpoints
            .into_iter()
            .map(|a| {
                let a = a.as_ref().trim().to_string();
                endpoint(&a, opts.tls.as_ref()).map(|e| (a, e.connect_lazy()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if channels.is_empty() {
            return Err(Error::InvalidArgument("no endpoints given".into()));
        }
        if opts.ttl.is_zero() {
            return Err(Error::InvalidArgument("ttl must be positive".into()));
        }
        let core = Arc::new(Core::new(opts, channels)?);
        let (cmds, rx) = mpsc::unbounded_channel();
        tokio::spawn(Driver::new(core.clone(), rx).run());
        Ok(Client { core, cmds })
    }

    /// The endpoints this client was given.
    pub fn endpoints(&self) -> Vec<String> {
        self.core.channels.iter().map(|(a, _)| a.clone()).collect()
    }

    /// The current session's id, if one is open and not lost.
    pub fn session_id(&self) -> Option<String> {
        let l = self.core.lease.borrow();
        (!l.lost).then(|| l.session_id.clone())
    }

    /// The options this client runs with.
    pub fn options(&self) -> &ClientOptions {
        &self.core.opts
    }

    /// How many times a lease ran out while the application still held a lock (each is also
    /// reported to the service's `lockd_lease_expired_while_holding` metric).
    pub fn lease_expired_count(&self) -> u64 {
        self.core.lease_expired.load(Relaxed)
    }

    /// How many times a group's new leader extended this client's lease and told it so (each
    /// with the exact time left, [`Client::lease_extension`]).
    pub fn lease_extended_count(&self) -> u64 {
        self.core.lease_extended.load(Relaxed)
    }

    /// What the last keepalive reply said this client's lease has left (counted from its send
    /// time; the least over the session's groups). `None` before the first. The local deadline
    /// the guards watch keeps its own, shorter rule (send time + TTL - margin); this is the
    /// server's side, for logs and dashboards.
    pub fn lease_report(&self) -> Option<crate::LeaseReport> {
        self.core
            .lease_report
            .lock()
            .expect("lease report lock")
            .clone()
    }

    /// The last notice from a group's new leader of what the lease has left there
    /// (`extended_by_new_leader_of` names the group). `None` before the first.
    pub fn lease_extension(&self) -> Option<crate::LeaseReport> {
        self.core
            .lease_extension
            .lock()
            .expect("lease report lock")
            .clone()
    }

    /// Starts an acquire of `name`: exclusive, try-once, owned by the client name, unless the
    /// builder says otherwise. `.await` it.
    ///
    /// ```no_run
    /// # async fn f(client: lockd_client::Client) -> Result<(), lockd_client::Error> {
    /// use std::time::Duration;
    /// use lockd_client::Mode;
    /// let guard = client
    ///     .acquire("reports/daily")
    ///     .wait(Duration::from_secs(10))
    ///     .mode(Mode::Shared)
    ///     .owner("report-builder/7")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn acquire(&self, name: impl Into<String>) -> AcquireBuilder {
        AcquireBuilder {
            client: self.clone(),
            name: name.into(),
            owner: None,
            mode: Mode::Exclusive,
            wait: None,
            reentrant: false,
        }
    }

    /// Acquires every name, in sorted order (duplicates once), within one overall `wait` for
    /// all of them (zero = try each once). Processes that take overlapping sets this way cannot
    /// deadlock: every one of them takes a shared name in the same order. On failure the names
    /// already taken are released and the error returned. The guards come back in sorted order.
    pub async fn acquire_all<I, S>(&self, names: I, wait: Duration) -> Result<Vec<LockGuard>, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut names: Vec<String> = names.into_iter().map(Into::into).collect();
        names.sort();
        names.dedup();
        let mut guards = Vec::with_capacity(names.len());
        let start = Instant::now();
        for name in names {
            let b = self.acquire(name);
            // What is left of the one deadline; a name reached after it is tried once.
            let left = wait.saturating_sub(start.elapsed());
            let b = if left.is_zero() {
                b.try_once()
            } else {
                b.wait(left)
            };
            match b.await {
                Ok(g) => guards.push(g),
                Err(e) => {
                    for g in guards.into_iter().rev() {
                        let _ = g.release().await;
                    }
                    return Err(e);
                }
            }
        }
        Ok(guards)
    }

    /// Watches `name`: every change of who holds or waits for it, as it happens (no session
    /// needed; authorised like a read of its namespace).
    pub fn watch(&self, name: &str) -> crate::Watcher {
        crate::Watcher::new(self.core.clone(), name.to_string(), String::new())
    }

    /// Watches every name under `prefix` (one that spans namespaces needs the admin token).
    pub fn watch_prefix(&self, prefix: &str) -> crate::Watcher {
        crate::Watcher::new(self.core.clone(), String::new(), prefix.to_string())
    }

    /// A linearizable view of `name`: holders, token, queue (no session needed).
    pub async fn inspect(&self, name: &str) -> Result<crate::LockInfo, Error> {
        let req = pb::InspectRequest {
            name: name.to_string(),
            ..Default::default()
        };
        self.core
            .unary(|mut c| {
                let req = req.clone();
                async move { c.inspect(req).await }
            })
            .await
            .map(crate::LockInfo::from)
    }

    /// The `top` hottest names (1 to 100) by waiters, longest wait, hand-offs per second and
    /// longest hold, of `namespace` (which the credential must open) or, with `""`, of every
    /// namespace the credential may read. Never a listing of all locks.
    pub async fn contention(
        &self,
        top: u32,
        namespace: &str,
    ) -> Result<crate::admin::Contention, Error> {
        let req = pb::ContentionRequest {
            top,
            namespace: namespace.to_string(),
        };
        self.core
            .unary(|mut c| {
                let req = req.clone();
                async move { c.contention(req).await }
            })
            .await
            .map(Into::into)
    }

    /// Whether `token` is a current holder's fencing token of `name` (Chubby's
    /// CheckSequencer), as a linearizable read: `(valid, newest)`, `newest` being the largest
    /// token among the current holders (0 when free). For a resource that asks lockd before it
    /// acts; one that can keep the largest token it has seen should fence instead ([`crate::fence`]).
    pub async fn check_token(&self, name: &str, token: u64) -> Result<(bool, u64), Error> {
        let req = pb::CheckTokenRequest {
            name: name.to_string(),
            fencing_token: token,
        };
        let r = self
            .core
            .unary(|mut c| {
                let req = req.clone();
                async move { c.check_token(req).await }
            })
            .await?;
        Ok((r.valid, r.newest_token))
    }

    /// One session's holds and waits in every group.
    pub async fn get_session(
        &self,
        session_id: &str,
    ) -> Result<crate::admin::SessionDetail, Error> {
        let req = pb::GetSessionRequest {
            session_id: session_id.to_string(),
        };
        self.core
            .unary(|mut c| {
                let req = req.clone();
                async move { c.get_session(req).await }
            })
            .await
            .map(Into::into)
    }

    /// A page of live sessions with ids above `after` (empty = from the first), at most `limit`
    /// (0 = 100; at most 1000).
    pub async fn list_sessions(
        &self,
        after: &str,
        limit: u32,
    ) -> Result<Vec<crate::admin::SessionSummary>, Error> {
        let req = pb::ListSessionsRequest {
            after: after.to_string(),
            limit,
        };
        self.core
            .unary(|mut c| {
                let req = req.clone();
                async move { c.list_sessions(req).await }
            })
            .await
            .map(|r| r.sessions.into_iter().map(Into::into).collect())
    }

    /// Every group's members (addresses, roles, lag) as each group's leader sees them. Needs
    /// the admin token as [`ClientOptions::auth_token`].
    pub async fn list_members(&self) -> Result<crate::admin::Members, Error> {
        self.core
            .admin(|mut c| async move { c.list_members(pb::ListMembersRequest {}).await })
            .await
            .map(Into::into)
    }

    /// Every member node's own report (version, readiness, each replica's role, indices and
    /// bytes on disk), gathered by the node called over the peer port; a node that did not
    /// answer has `error`. Needs the admin token.
    pub async fn cluster_status(&self) -> Result<Vec<crate::admin::NodeReport>, Error> {
        self.core
            .admin(|mut c| async move { c.cluster_status(pb::ClusterStatusRequest {}).await })
            .await
            .map(|r| r.nodes.into_iter().map(Into::into).collect())
    }

    /// The shard map beside what each lock group's own record owns and has frozen. Needs the
    /// admin token.
    pub async fn shard_map(&self) -> Result<crate::admin::ShardMap, Error> {
        self.core
            .admin(|mut c| async move { c.shard_map(pb::ShardMapRequest {}).await })
            .await
            .map(Into::into)
    }

    /// Moves `buckets` (e.g. `"0-63,100"`) to lock group `to_group` while their locks are in
    /// use; finishes any interrupted move first. Idempotent; needs the admin token. A large
    /// move takes a while: give the client a request timeout to match.
    pub async fn move_buckets(
        &self,
        buckets: &str,
        to_group: u32,
    ) -> Result<crate::admin::MoveReport, Error> {
        let req = pb::MoveBucketsRequest {
            buckets: buckets.to_string(),
            to_group,
        };
        self.core
            .admin(|mut c| {
                let req = req.clone();
                async move { c.move_buckets(req).await }
            })
            .await
            .map(Into::into)
    }

    /// Creates lock group `group` on `nodes` (each already in the meta group) and waits until
    /// it is ready; it owns no bucket until buckets move to it. Refused if a zone would hold a
    /// majority of its voters, unless `allow_zone_majority`. Idempotent; needs the admin token.
    pub async fn create_group(
        &self,
        group: u32,
        nodes: &[u64],
        allow_zone_majority: bool,
    ) -> Result<crate::admin::LockGroup, Error> {
        let req = pb::CreateGroupRequest {
            group,
            nodes: nodes.to_vec(),
            allow_zone_majority,
        };
        self.core
            .admin(|mut c| {
                let req = req.clone();
                async move { c.create_group(req).await }
            })
            .await
            .map(Into::into)
    }

    /// A backup document (JSON bytes, for `lockd restore`): every lock group's revision, read
    /// linearizably from its leader, and the namespaces. Needs the admin token.
    pub async fn backup(&self) -> Result<Vec<u8>, Error> {
        self.core
            .admin(|mut c| async move { c.backup(pb::BackupRequest {}).await })
            .await
            .map(|r| r.document)
    }

    /// Removes lock group `group`, which must own no bucket (move them away first); its id is
    /// never used again. Idempotent; needs the admin token.
    pub async fn remove_group(&self, group: u32) -> Result<(), Error> {
        let req = pb::RemoveGroupRequest { group };
        self.core
            .admin(|mut c| async move { c.remove_group(req).await })
            .await
            .map(|_| ())
    }

    /// Every lock group as the meta group records it; needs the admin token.
    pub async fn list_groups(&self) -> Result<Vec<crate::admin::LockGroup>, Error> {
        self.core
            .admin(|mut c| async move { c.list_groups(pb::ListGroupsRequest {}).await })
            .await
            .map(|r| r.groups.into_iter().map(Into::into).collect())
    }

    /// Adds node `node_id` (peer address `peer_addr`) to `groups` (empty = every group): a
    /// learner first, promoted once caught up. Refused if a zone would then hold a majority of
    /// a group's voters, unless `allow_zone_majority`. Idempotent; needs the admin token.
    pub async fn add_member(
        &self,
        node_id: u64,
        peer_addr: &str,
        groups: &[u32],
        allow_zone_majority: bool,
    ) -> Result<crate::admin::Members, Error> {
        let req = pb::AddMemberRequest {
            node_id,
            peer_addr: peer_addr.to_string(),
            groups: groups.to_vec(),
            allow_zone_majority,
        };
        self.core
            .admin(|mut c| {
                let req = req.clone();
                async move { c.add_member(req).await }
            })
            .await
            .map(Into::into)
    }

    /// Removes node `node_id` from `groups` (empty = every group). Refused if a zone would
    /// then hold a majority of a group's voters, unless `allow_zone_majority`. Idempotent;
    /// needs the admin token.
    pub async fn remove_member(
        &self,
        node_id: u64,
        groups: &[u32],
        allow_zone_majority: bool,
    ) -> Result<crate::admin::Members, Error> {
        let req = pb::RemoveMemberRequest {
            node_id,
            groups: groups.to_vec(),
            allow_zone_majority,
        };
        self.core
            .admin(|mut c| {
                let req = req.clone();
                async move { c.remove_member(req).await }
            })
            .await
            .map(Into::into)
    }

    /// Marks node `node_id` draining (`true`) or not: leader balancing hands it no group, and
    /// the groups it leads move to other voters (a drain waits up to 20 s for that). It keeps
    /// its replicas and keeps serving. Idempotent; needs the admin token.
    pub async fn set_draining(
        &self,
        node_id: u64,
        draining: bool,
    ) -> Result<crate::admin::Members, Error> {
        let req = pb::SetDrainingRequest { node_id, draining };
        self.core
            .admin(|mut c| async move { c.set_draining(req).await })
            .await
            .map(Into::into)
    }

    /// Every namespace and the namespaces' version (the meta group's); needs the admin token.
    pub async fn list_namespaces(&self) -> Result<crate::admin::Namespaces, Error> {
        self.core
            .admin(|mut c| async move { c.list_namespaces(pb::ListNamespacesRequest {}).await })
            .await
            .map(Into::into)
    }

    /// Creates or replaces a namespace if the namespaces are still at `req.expected_version`
    /// (else `namespace_version_conflict`: read them again). Returns the new version. A retry
    /// after a lost answer may report a conflict for a change that landed: list to see.
    pub async fn put_namespace(&self, req: crate::admin::PutNamespace) -> Result<u64, Error> {
        let req: pb::PutNamespaceRequest = req.into();
        let r = self
            .core
            .admin(|mut c| {
                let req = req.clone();
                async move { c.put_namespace(req).await }
            })
            .await?;
        Ok(r.version)
    }

    /// Deletes namespace `name` if the namespaces are still at `expected_version`.
    pub async fn delete_namespace(&self, expected_version: u64, name: &str) -> Result<u64, Error> {
        let req = pb::DeleteNamespaceRequest {
            expected_version,
            name: name.to_string(),
        };
        let r = self
            .core
            .admin(|mut c| {
                let req = req.clone();
                async move { c.delete_namespace(req).await }
            })
            .await?;
        Ok(r.version)
    }

    /// Tells the service that a fenced resource refused a write under `name` because a newer
    /// holder's token had reached it: the service counts these per namespace
    /// (`lockd_fencing_rejections_total`), the stale holders fencing stopped. Best effort: a
    /// failure to report is logged, not returned. [`fence::write_fenced`](crate::fence::write_fenced) reports
    /// its own refusals; call this where another fence refuses (e.g. `fence::postgres`).
    pub async fn report_fencing_rejected(&self, name: &str) {
        let req = pb::ReportFencingRejectedRequest {
            name: name.to_string(),
        };
        let r = self
            .core
            .unary(|mut c| {
                let req = req.clone();
                async move { c.report_fencing_rejected(req).await }
            })
            .await;
        if let Err(e) = r {
            tracing::debug!(%e, name, "could not report a fencing rejection");
        }
    }

    /// The status of the node the client currently talks to: its groups, leaders, terms.
    pub async fn status(&self) -> Result<crate::admin::NodeStatus, Error> {
        self.core
            .unary(|mut c| async move { c.status(pb::StatusRequest {}).await })
            .await
            .map(Into::into)
    }

    /// Releases a hold given its session and token, e.g. one taken by another process
    /// (`lockctl release`). Returns the re-entries still held (0 = released).
    pub async fn release_token(
        &self,
        session_id: &str,
        name: &str,
        token: u64,
    ) -> Result<u32, Error> {
        self.release(session_id, name, token).await
    }

    /// Gives back one hold: on the session stream when it carries the hold's session, else (or
    /// when the stream's answer does not come) by unary calls with the retry rule of
    /// `Core::release`. A stream attempt that broke or timed out may have landed, and the retry knows it.
    async fn release(&self, session_id: &str, name: &str, token: u64) -> Result<u32, Error> {
        let req = self.core.release_request(session_id, name, token);
        let (tx, rx) = oneshot::channel();
        if self.cmds.send(Cmd::Release(req.clone(), tx)).is_err() {
            return self.core.release(req, false).await;
        }
        let opts = &self.core.opts;
        let maybe_landed = match tokio::time::timeout(opts.request_timeout, rx).await {
            Ok(Ok(StreamRelease::Answered(Ok(remaining)))) => return Ok(remaining),
            Ok(Ok(StreamRelease::Answered(Err(e)))) => {
                if !e.is_retryable() {
                    return Err(e);
                }
                tokio::time::sleep(opts.retry.delay(0, e.retry_after())).await;
                // "No leader" is refused before proposing, but "outcome unknown" is also 503.
                matches!(e, Error::Api { status: 503, .. })
            }
            Ok(Ok(StreamRelease::NotSent)) | Ok(Err(_)) => false,
            Ok(Ok(StreamRelease::Unsure)) => true,
            Err(_) => {
                // The stream's node did not answer in time; the unary retry starts elsewhere.
                self.core.rotate_preferred();
                true
            }
        };
        self.core.release(req, maybe_landed).await
    }

    /// Closes the session: every lock it holds is released at once and every guard reports lost.
    /// Further acquires fail with [`Error::Closed`].
    pub async fn close(&self) -> Result<(), Error> {
        let (tx, rx) = oneshot::channel();
        self.cmds.send(Cmd::Close(tx)).map_err(|_| Error::Closed)?;
        rx.await.map_err(|_| Error::Closed)?
    }

    async fn acquire_once(&self, req: pb::AcquireRequest) -> Result<crate::session::Grant, Error> {
        let (tx, rx) = oneshot::channel();
        self.cmds
            .send(Cmd::Acquire(req, tx))
            .map_err(|_| Error::Closed)?;
        rx.await.map_err(|_| Error::Closed)?
    }
}

/// How a lock may be shared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// One holder.
    #[default]
    Exclusive,
    /// Any number of shared holders, never beside an exclusive one.
    Shared,
    /// Up to `n` holders (1..=10 000), each with its own token.
    Semaphore(u32),
}

/// An acquire being built; `.await` it for a [`LockGuard`].
///
/// Retryable errors (no leader, node down, 429/503) are retried with backoff inside the wait
/// (or, for a try-lock, up to [`RetryPolicy::max_attempts`]). A waiting acquire parks in the
/// lock's FIFO queue on the service and is woken by the pushed grant, never by polling.
#[must_use = "an acquire does nothing until it is awaited"]
#[derive(Debug)]
pub struct AcquireBuilder {
    client: Client,
    name: String,
    owner: Option<String>,
    mode: Mode,
    wait: Option<Duration>,
    reentrant: bool,
}

impl AcquireBuilder {
    /// Try once: fail with [`Error::NotAcquired`] if the lock is taken (the default).
    pub fn try_once(mut self) -> Self {
        self.wait = None;
        self
    }

    /// Wait in the lock's queue up to `d` for a grant.
    pub fn wait(mut self, d: Duration) -> Self {
        self.wait = Some(d);
        self
    }

    /// Exclusive (default), shared, or semaphore.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Who within the process holds it (default: the client name).
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// Opt in to re-entry: the same session and owner may take it again and must release as
    /// often.
    pub fn reentrant(mut self, yes: bool) -> Self {
        self.reentrant = yes;
        self
    }

    async fn run(self) -> Result<LockGuard, Error> {
        let c = &self.client;
        let (mode, limit) = match self.mode {
            Mode::Exclusive => (pb::Mode::Exclusive, 0),
            Mode::Shared => (pb::Mode::Shared, 0),
            Mode::Semaphore(n) => (pb::Mode::Semaphore, n),
        };
        let owner = self
            .owner
            .unwrap_or_else(|| c.core.opts.client_name.clone());
        // A wait of any length (`Duration::MAX` is "forever"); the service takes at most
        // MAX_WAIT per request, so a longer one queues again, round after round, to the deadline.
        let until = self.wait.map(|w| {
            let now = Instant::now();
            now.checked_add(w)
                .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400))
        });
        let policy = &c.core.opts.retry;
        let mut attempt = 0;
        loop {
            let left = until.map(|u| u.saturating_duration_since(Instant::now()));
            let capped = left.is_some_and(|l| l > MAX_WAIT);
            let wait_ms = left.map_or(0, |l| l.min(MAX_WAIT).as_millis() as u64);
            let req = pb::AcquireRequest {
                session_id: String::new(),
                name: self.name.clone(),
                owner: owner.clone(),
                mode: mode as i32,
                limit,
                wait_ms,
                reentrant: self.reentrant,
                ..Default::default()
            };
            let e = match c.acquire_once(req).await {
                Ok(g) => return Ok(LockGuard::new(c.clone(), self.name, g)),
                Err(e) => e,
            };
            if capped && matches!(e, Error::NotAcquired { .. }) {
                // One round of a longer wait ran out: queue again at the back (the service
                // cannot hold a waiter longer than MAX_WAIT, so the FIFO place is not kept).
                continue;
            }
            attempt += 1;
            // A session lost mid-wait is replaced by a new one on the next attempt.
            let retry = e.is_retryable() || e == Error::SessionLost;
            let time_left = until.is_some_and(|u| Instant::now() < u);
            if !retry || !(time_left || attempt < policy.max_attempts) {
                return Err(e);
            }
            let mut pause = policy.delay(attempt - 1, e.retry_after());
            if let Some(u) = until {
                pause = pause.min(u.saturating_duration_since(Instant::now()));
            }
            tokio::time::sleep(pause).await;
        }
    }
}

impl IntoFuture for AcquireBuilder {
    type Output = Result<LockGuard, Error>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.run())
    }
}

/// A held lock. Attach [`token`](LockGuard::token) to every write made under it, and stop
/// working when [`lost`](LockGuard::lost) fires.
///
/// Dropping the guard releases the lock in the background; [`release`](LockGuard::release)
/// does it and says whether the service agreed.
#[must_use = "dropping a guard releases the lock"]
pub struct LockGuard {
    client: Client,
    name: String,
    token: u64,
    session_id: String,
    gen: u64,
    /// The lease the hold follows (its group's, while it provably stays there).
    hold: crate::lease::HoldLease,
    id: u64,
    lease: watch::Receiver<Lease>,
    released: bool,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.name)
            .field("token", &self.token)
            .field("session_id", &self.session_id)
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl LockGuard {
    fn new(client: Client, name: String, mut g: crate::session::Grant) -> LockGuard {
        // The driver registered the hold in `Core::held` before it answered.
        g.claim();
        let lease = client.core.lease.subscribe();
        LockGuard {
            client,
            name,
            token: g.token,
            session_id: std::mem::take(&mut g.session_id),
            gen: g.gen,
            hold: g.hold,
            id: g.id,
            lease,
            released: false,
        }
    }

    /// The fencing token: unique to this grant and larger than every earlier grant's token for
    /// the name. Storage that checks it (`... WHERE fence <= $token`) refuses a stale holder.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The session holding the lock.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// The lock group that granted the lock.
    pub fn group(&self) -> u32 {
        self.hold.group
    }

    /// The local deadline: when [`lost`](LockGuard::lost) fires unless a keepalive sent before
    /// then is acknowledged. It is `send time of the last keepalive its group acknowledged + TTL
    /// − margin` on the monotonic clock, so it falls before that group can expire the lease
    /// (C1). Once a bucket moved in or out of that group it is the session-wide deadline (every
    /// group acknowledged), since the hold may live elsewhere (docs/API.md, leases per group).
    /// A lock already lost reads as the deadline it was lost at.
    pub fn deadline(&self) -> Instant {
        let l = self.lease.borrow();
        if l.gen != self.gen {
            return l.deadline.min(Instant::now());
        }
        let own = l.leases.deadline_of(&self.hold);
        let own = own
            .or_else(|| l.leases.ended_at(&self.hold))
            .unwrap_or(l.deadline);
        // A lost session's guards were lost by its session-wide deadline at the latest.
        if l.lost {
            own.min(l.deadline)
        } else {
            own
        }
    }

    /// Whether the lock is lost: its deadline passed, its group's lease ended, or the session
    /// ended.
    pub fn is_lost(&self) -> bool {
        guard_deadline(&self.lease.borrow(), self.gen, &self.hold)
            .is_none_or(|d| d <= Instant::now())
    }

    /// Completes when the lock is lost: at the local deadline if no renewal moved it, or when
    /// the session ends. Stop working under the lock at once; do not "finish one last write".
    /// The future owns what it needs, so it can be spawned or raced against the work.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.lease.clone();
        let (gen, hold) = (self.gen, self.hold);
        async move {
            loop {
                let deadline = {
                    let l = rx.borrow_and_update();
                    match guard_deadline(&l, gen, &hold) {
                        Some(d) if d > Instant::now() => d,
                        _ => return,
                    }
                };
                tokio::select! {
                    _ = tokio::time::sleep_until(deadline) => {}
                    r = rx.changed() => if r.is_err() { return },
                }
            }
        }
    }

    /// Runs `work` under the lock, then releases it. The work is raced against
    /// [`lost`](LockGuard::lost): the moment the lock is lost the work is dropped (cancelled at
    /// its next `.await`, so it makes no further write) and `Err(Error::SessionLost)` is
    /// returned; the release is then left to the session's end. Otherwise the work's output is
    /// returned once the release has been sent; a release that fails (a node went away) is
    /// logged, and the hold ends with the session at the latest. Like client-go's `RunOrDie`.
    ///
    /// A write the work has already sent may still land after the loss: fence it with
    /// [`token`](LockGuard::token) ([`crate::fence`]).
    pub async fn run<F: Future>(self, work: F) -> Result<F::Output, Error> {
        let lost = self.lost();
        tokio::select! {
            biased;
            () = lost => Err(Error::SessionLost),
            out = work => {
                let name = self.name.clone();
                if let Err(e) = self.release().await {
                    tracing::debug!(%e, name, "release after run failed");
                }
                Ok(out)
            }
        }
    }

    /// Reports that a fenced resource refused this holder's write
    /// ([`Client::report_fencing_rejected`]).
    pub async fn report_fencing_rejected(&self) {
        self.client.report_fencing_rejected(&self.name).await
    }

    /// [`report_fencing_rejected`](LockGuard::report_fencing_rejected) on a task of its own
    /// (nothing is sent without a runtime).
    pub(crate) fn report_fencing_rejected_in_background(&self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (client, name) = (self.client.clone(), self.name.clone());
        rt.spawn(async move { client.report_fencing_rejected(&name).await });
    }

    /// Gives the lock back (one level of re-entry) and says whether the service agreed: a lost
    /// lock's release is refused (`session_not_found`, `not_holder` or `stale_token`), unless an
    /// earlier attempt of this same call may have landed (its connection failed): then those
    /// answers mean the hold is gone, and the release returns `Ok`.
    pub async fn release(mut self) -> Result<(), Error> {
        self.released = true;
        self.forget();
        self.client
            .release(&self.session_id, &self.name, self.token)
            .await
            .map(|_| ())
    }

    fn forget(&self) {
        self.client
            .core
            .held
            .lock()
            .expect("held lock")
            .remove(&self.id);
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.forget();
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return; // no runtime: the session's close or expiry frees it
        };
        let client = self.client.clone();
        let (session, name, token) = (self.session_id.clone(), self.name.clone(), self.token);
        rt.spawn(async move {
            if let Err(e) = client.release(&session, &name, token).await {
                tracing::debug!(%e, name, "background release failed");
            }
        });
    }
}

/// When a guard of session generation `gen` following `hold` is lost (`None`: it is already).
fn guard_deadline(l: &Lease, gen: u64, hold: &crate::lease::HoldLease) -> Option<Instant> {
    if l.gen != gen || l.lost {
        return None;
    }
    l.leases.deadline_of(hold)
}
