//! The node's connections (both client ports and the peer port): how many may be open at once,
//! from one address and in all, and how long a request's first bytes, header and body may take
//! to arrive.
//!
//! Without these a client that opens connections and never finishes a request (or never sends
//! one) holds a task, its buffers and a file descriptor for as long as it likes: enough of them
//! and the node runs out, for every other client too. So:
//! - each client port (HTTP and gRPC) holds at most `--max-client-connections` connections, and
//!   one address at most a quarter of them, at least 64 ([`ConnCap::new`]); the peer port
//!   [`PEER_CONNECTIONS`], [`PEER_CONNECTIONS_PER_ADDR`] from one address. One more is closed at
//!   once (on HTTP after a `503 too_many_connections` that says so);
//! - a gRPC or peer connection must send its first byte (a TLS hello or the HTTP/2 preface)
//!   within [`FIRST_BYTE_TIMEOUT`], or it is closed; it holds its place meanwhile;
//! - gRPC and HTTP/2 connections are pinged every [`H2_KEEPALIVE_INTERVAL`], and closed when a
//!   ping goes unanswered for [`H2_KEEPALIVE_TIMEOUT`] (a peer that vanished);
//! - a connection with no request open for [`IDLE_TIMEOUT`] is closed (`ServerConfig::
//!   client_idle_timeout` on the client ports): a client that answers pings but sends nothing
//!   gives its place back. A session stream, a watch or a long poll is a request open;
//! - an HTTP/1 request's header must arrive within [`HEADER_READ_TIMEOUT`] of the connection
//!   opening or of the previous response (the connection is then closed), and its body within
//!   [`BODY_READ_TIMEOUT`] once the handler reads it (`408 request_timeout`).
//!
//! Long polls and session streams are not bounded by these: they wait on the server's side,
//! after the request has arrived.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::serve::Listener;
use axum::Router;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

/// How long an HTTP/1 request's header may take to arrive.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request's body may take to arrive once its handler reads it.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The default of `--max-client-connections` (per client port).
pub const DEFAULT_MAX_CLIENT_CONNECTIONS: u32 = 4096;
/// How long a new gRPC or peer connection may take to send its first byte.
pub const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections the peer port holds at once: each other node opens one (plus a few while one
/// breaks), so this leaves room for far more nodes than a cluster has.
pub const PEER_CONNECTIONS: u32 = 512;
/// Connections the peer port holds from one address (nodes sharing a host share an address).
pub const PEER_CONNECTIONS_PER_ADDR: u32 = 128;
/// How often an idle HTTP/2 connection is pinged.
pub const H2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// How long a ping may go unanswered before the connection is closed.
pub const H2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection may stay open with no request in flight. gRPC clients keep channels
/// open between calls and dial again when one closes, so this costs an idle client one dial;
/// a lockd client's session stream is a request in flight, so its connection never idles.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Bytes that arrive on an idle connection defer its close this long, for the request they
/// may begin (its handler has not started yet). A ping's answer defers it no longer than this.
const READ_GRACE: Duration = Duration::from_secs(1);
/// The header the HTTP server sets on every request to the client's IP address (one a client
/// sends is removed first), for the budget of failed authentications.
pub const CLIENT_ADDR_HEADER: &str = "x-lockd-client-addr";

/// At most `max` connections of one port open at once, and `per_addr` from one address.
#[derive(Clone)]
pub struct ConnCap {
    port: &'static str,
    max: usize,
    per_addr: usize,
    permits: Arc<Semaphore>,
    by_addr: Arc<Mutex<HashMap<IpAddr, usize>>>,
    refused: Arc<AtomicU64>,
    idle: Duration,
}

/// One connection's place: in the port's cap and in its address's.
pub struct Permit {
    _port: OwnedSemaphorePermit,
    addr: IpAddr,
    by_addr: Arc<Mutex<HashMap<IpAddr, usize>>>,
    idle: Duration,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut m = self.by_addr.lock().expect("connection counts poisoned");
        if let Some(n) = m.get_mut(&self.addr) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.addr);
            }
        }
    }
}

impl ConnCap {
    /// A client port's cap: `max` in all, a quarter of it from one address (at least 64, or
    /// all of a smaller cap).
    pub fn new(port: &'static str, max: u32) -> ConnCap {
        ConnCap::with_per_addr(port, max, (max / 4).max(max.min(64)))
    }

    /// `max` in all, `per_addr` from one address.
    pub fn with_per_addr(port: &'static str, max: u32, per_addr: u32) -> ConnCap {
        let max = max as usize;
        ConnCap {
            port,
            max,
            per_addr: (per_addr as usize).clamp(1, max.max(1)),
            permits: Arc::new(Semaphore::new(max)),
            by_addr: Arc::default(),
            refused: Arc::default(),
            idle: IDLE_TIMEOUT,
        }
    }

    /// The cap, closing a connection once it has had no request in flight for `idle`
    /// ([`IDLE_TIMEOUT`] unless told; `Duration::ZERO` never closes one).
    pub fn with_idle_timeout(mut self, idle: Duration) -> ConnCap {
        self.idle = idle;
        self
    }

    /// A place for one more connection from `addr`, or `None` (and a warning, now and then)
    /// at either cap.
    pub(crate) fn admit(&self, addr: IpAddr) -> Option<Permit> {
        let permit = self.permits.clone().try_acquire_owned().ok().and_then(|p| {
            let mut m = self.by_addr.lock().expect("connection counts poisoned");
            let n = m.entry(addr).or_insert(0);
            if *n >= self.per_addr {
                return None;
            }
            *n += 1;
            Some(Permit {
                _port: p,
                addr,
                by_addr: self.by_addr.clone(),
                idle: self.idle,
            })
        });
        if permit.is_none() {
            let n = self.refused.fetch_add(1, Ordering::Relaxed);
            // The first, then one in 1,000: a flood must not flood the log too.
            if n.is_multiple_of(1000) {
                tracing::warn!(
                    port = self.port,
                    max = self.max,
                    per_addr = self.per_addr,
                    %addr,
                    refused = n + 1,
                    "connection refused: the port holds as many as it allows, in all or from \
                     this address"
                );
            }
        }
        permit
    }

    /// The most connections one address may hold.
    pub fn per_addr(&self) -> usize {
        self.per_addr
    }

    /// The port's name in logs and metrics ("HTTP", "gRPC").
    pub fn port(&self) -> &'static str {
        self.port
    }

    /// Connections open now.
    /// The cap (`--max-client-connections`).
    pub fn max(&self) -> usize {
        self.max
    }

    pub fn open(&self) -> usize {
        self.max - self.permits.available_permits()
    }

    /// Connections refused at the cap since start.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The answer an HTTP client gets at the cap (then the connection closes).
    pub(crate) fn refusal(&self) -> Vec<u8> {
        let body = serde_json::json!({
            "code": "too_many_connections",
            "message": format!(
                "this node's {} port holds at most {} client connections at once \
                 (--max-client-connections), at most {} from one address; retry later, or use \
                 another node",
                self.port, self.max, self.per_addr
            ),
        })
        .to_string();
        format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
             retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }
}

/// A connection's requests in flight, and since when it has had none.
pub struct Activity {
    open: AtomicUsize,
    idle_since: Mutex<tokio::time::Instant>,
}

impl Activity {
    fn new() -> Arc<Activity> {
        Arc::new(Activity {
            open: AtomicUsize::new(0),
            idle_since: Mutex::new(tokio::time::Instant::now()),
        })
    }

    /// One more request in flight until the guard drops (with the request's response body).
    fn busy(self: &Arc<Activity>) -> Busy {
        self.open.fetch_add(1, Ordering::AcqRel);
        Busy(self.clone())
    }

    /// When the connection became idle, or `None` while a request is in flight.
    fn idle_since(&self) -> Option<tokio::time::Instant> {
        if self.open.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(*self.idle_since.lock().expect("idle time poisoned"))
    }
}

/// A request in flight on its connection ([`Activity::busy`]).
struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        // The time first: a reader that sees no request open must not see an older time.
        *self.0.idle_since.lock().expect("idle time poisoned") = tokio::time::Instant::now();
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What an HTTP request learns of its connection ([`with_client_addr`] puts it in the
/// request's extensions): the connection's [`Activity`], which [`TrackRequests`] counts
/// requests in.
#[derive(Clone)]
struct ConnInfo {
    activity: Arc<Activity>,
}

/// A gRPC port's open connections by client address (address and port name one TCP
/// connection), for [`TrackRequests`] to find the one a request came on. tonic hands a request
/// its connection's info as `TcpConnectInfo` (over TLS also `TlsConnectInfo` of it), which the
/// peer port's certificate check and `remote_addr` read, so the activity cannot ride along.
#[derive(Clone, Default)]
pub struct Registry(Arc<Mutex<HashMap<std::net::SocketAddr, Arc<Activity>>>>);

impl Registry {
    fn get(&self, addr: std::net::SocketAddr) -> Option<Arc<Activity>> {
        let m = self.0.lock().expect("connection registry poisoned");
        m.get(&addr).cloned()
    }
}

/// The activity of the connection `ext`'s request came on: an HTTP request's own, or the
/// registered one of a gRPC request's client address.
fn activity_of(ext: &http::Extensions, registry: Option<&Registry>) -> Option<Arc<Activity>> {
    if let Some(c) = ext.get::<ConnInfo>() {
        return Some(c.activity.clone());
    }
    // tonic inserts the TCP info over TLS too (beside its `TlsConnectInfo`).
    let tcp = ext.get::<tonic::transport::server::TcpConnectInfo>()?;
    registry?.get(tcp.remote_addr()?)
}

/// A connection that gives its place back when it closes, and that ends (as if the client
/// closed it) once it has had no request in flight for its cap's idle timeout.
pub struct Capped<Io> {
    io: Io,
    _permit: Permit,
    activity: Arc<Activity>,
    /// `None` when idle connections are kept ([`ConnCap::with_idle_timeout`] zero).
    idle: Option<(Duration, Pin<Box<tokio::time::Sleep>>)>,
    last_read: tokio::time::Instant,
    /// Where a gRPC connection is registered by its client address, until it closes.
    registered: Option<(Registry, std::net::SocketAddr)>,
}

impl<Io> Drop for Capped<Io> {
    fn drop(&mut self) {
        if let Some((registry, addr)) = self.registered.take() {
            registry
                .0
                .lock()
                .expect("connection registry poisoned")
                .remove(&addr);
        }
    }
}

impl<Io> Capped<Io> {
    /// `io` holding the place `permit`.
    pub(crate) fn new(io: Io, permit: Permit) -> Capped<Io> {
        let now = tokio::time::Instant::now();
        let idle = (!permit.idle.is_zero()).then(|| {
            (
                permit.idle,
                Box::pin(tokio::time::sleep_until(now + permit.idle)),
            )
        });
        Capped {
            io,
            _permit: permit,
            activity: Activity::new(),
            idle,
            last_read: now,
            registered: None,
        }
    }

    /// The connection, found by its client address `addr` in `registry` while it is open.
    fn registered(mut self, registry: &Registry, addr: std::net::SocketAddr) -> Capped<Io> {
        let mut m = registry.0.lock().expect("connection registry poisoned");
        m.insert(addr, self.activity.clone());
        drop(m);
        self.registered = Some((registry.clone(), addr));
        self
    }

    /// What an HTTP connection's requests see of it.
    fn info(&self) -> ConnInfo {
        ConnInfo {
            activity: self.activity.clone(),
        }
    }

    /// Whether the connection has been idle past its timeout; if not, sets the timer for
    /// when it might be. Polls the timer, so a `false` leaves a wake-up behind.
    fn idled_out(&mut self, cx: &mut Context<'_>) -> bool {
        let Some((timeout, sleep)) = self.idle.as_mut() else {
            return false;
        };
        while sleep.as_mut().poll(cx).is_ready() {
            let now = tokio::time::Instant::now();
            let at = match self.activity.idle_since() {
                Some(since) => (since + *timeout).max(self.last_read + READ_GRACE),
                None => now + *timeout,
            };
            if at <= now {
                return true;
            }
            sleep.as_mut().reset(at);
        }
        false
    }
}

/// A plain listener under `cap`: a connection over it is answered with the cap's 503 and
/// closed; the ones it hands out hold their place until they close.
pub struct CappedListener<L> {
    inner: L,
    cap: ConnCap,
}

impl<L> CappedListener<L> {
    pub fn new(inner: L, cap: ConnCap) -> CappedListener<L> {
        CappedListener { inner, cap }
    }
}

impl<L> Listener for CappedListener<L>
where
    L: Listener<Addr = std::net::SocketAddr>,
{
    type Io = Capped<L::Io>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (io, addr) = self.inner.accept().await;
            match self.cap.admit(addr.ip()) {
                Some(permit) => return (Capped::new(io, permit), addr),
                None => {
                    tokio::spawn(refuse(io, self.cap.refusal()));
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

impl<Io: AsyncRead + Unpin> AsyncRead for Capped<Io> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let filled = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Pending if self.idled_out(cx) => {
                // As if the client had closed it: the server drops the connection.
                tracing::debug!("closing a connection with no request in flight");
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Ok(())) if buf.filled().len() > filled => {
                self.last_read = tokio::time::Instant::now();
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl<Io: AsyncWrite + Unpin> AsyncWrite for Capped<Io> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for Capped<tokio::net::TcpStream> {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// Counts each request in flight on its connection's [`Activity`], from the call until its
/// response body is dropped (a stream's end), so that [`Capped`] closes only idle ones.
#[derive(Clone, Default)]
pub struct TrackRequests {
    /// A gRPC port's connections ([`capped_grpc`]); `None` on the HTTP port.
    registry: Option<Registry>,
}

impl TrackRequests {
    /// For a gRPC port whose connections `registry` holds.
    pub fn grpc(registry: Registry) -> TrackRequests {
        TrackRequests {
            registry: Some(registry),
        }
    }
}

impl<S> tower::Layer<S> for TrackRequests {
    type Service = Tracked<S>;

    fn layer(&self, inner: S) -> Tracked<S> {
        Tracked {
            inner,
            registry: self.registry.clone(),
        }
    }
}

/// [`TrackRequests`]' service.
#[derive(Clone)]
pub struct Tracked<S> {
    inner: S,
    registry: Option<Registry>,
}

impl<S, ReqB, ResB> tower::Service<http::Request<ReqB>> for Tracked<S>
where
    S: tower::Service<http::Request<ReqB>, Response = http::Response<ResB>>,
{
    type Response = http::Response<TrackedBody<ResB>>;
    type Error = S::Error;
    type Future = TrackedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqB>) -> Self::Future {
        let busy = activity_of(req.extensions(), self.registry.as_ref()).map(|a| a.busy());
        TrackedFuture {
            inner: self.inner.call(req),
            busy,
        }
    }
}

pin_project_lite::pin_project! {
    /// [`Tracked`]'s future: the response, its body holding the request's place.
    pub struct TrackedFuture<F> {
        #[pin]
        inner: F,
        busy: Option<Busy>,
    }
}

impl<F, B, E> Future for TrackedFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<TrackedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let res = std::task::ready!(this.inner.poll(cx));
        let busy = this.busy.take();
        Poll::Ready(res.map(|r| r.map(|body| TrackedBody { body, _busy: busy })))
    }
}

pin_project_lite::pin_project! {
    /// A response body that keeps its request counted in flight until it is dropped.
    pub struct TrackedBody<B> {
        #[pin]
        body: B,
        _busy: Option<Busy>,
    }
}

impl<B: http_body::Body> http_body::Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        self.project().body.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// File descriptors a node needs besides its connections: log segments, snapshots, the
/// runtime's own, with room to spare.
pub const FD_RESERVE: u64 = 512;

/// Checks the process's open-files limit (`RLIMIT_NOFILE`) against what the connection caps
/// let the node hold (both client ports at `max_client_connections`, the peer port, and
/// [`FD_RESERVE`]), raising the soft limit up to the hard one if it is lower, as a shell's
/// default of 1,024 is. Refuses when even the hard limit is too low: a node that runs out of
/// descriptors fails its next snapshot or log segment, which stops it. Returns the limit in
/// force.
pub fn raise_fd_limit(max_client_connections: u32) -> anyhow::Result<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let need = 2 * u64::from(max_client_connections) + u64::from(PEER_CONNECTIONS) + FD_RESERVE;
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft >= need {
        return Ok(soft);
    }
    if hard >= need {
        setrlimit(Resource::RLIMIT_NOFILE, need, hard)?;
        tracing::info!(from = soft, to = need, "raised the open-files limit");
        return Ok(need);
    }
    anyhow::bail!(
        "the open-files limit is {soft} (hard {hard}), and this node may hold {need}: 2 client \
         ports of --max-client-connections {max_client_connections}, {PEER_CONNECTIONS} peer \
         connections and {FD_RESERVE} files. Raise it (`ulimit -n {need}`, systemd's \
         LimitNOFILE=) or lower --max-client-connections to {} or less",
        hard.saturating_sub(u64::from(PEER_CONNECTIONS) + FD_RESERVE) / 2
    )
}

/// A gRPC port's connections (the client gRPC port or the peer port), under `cap`: one over
/// it is closed at once, and one that sends nothing within [`FIRST_BYTE_TIMEOUT`] is closed
/// then. Accepting goes on meanwhile: a connection waits for its first byte on its own task.
/// The accepting ends, and the listener closes, when the server drops the stream.
pub fn capped_grpc(
    listener: tokio::net::TcpListener,
    cap: ConnCap,
    registry: Registry,
) -> impl futures::Stream<Item = std::io::Result<Capped<tokio::net::TcpStream>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let (tcp, addr) = tokio::select! {
                c = listener.accept() => match c {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of file descriptors and the like: back off, as tonic's own does.
                        tracing::warn!(port = cap.port, error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                _ = tx.closed() => break,
            };
            let Some(permit) = cap.admit(addr.ip()) else {
                continue;
            };
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::warn!(error = %e, "could not set TCP_NODELAY");
            }
            let (tx, registry) = (tx.clone(), registry.clone());
            tokio::spawn(async move {
                let mut first = [0u8; 1];
                match tokio::time::timeout(FIRST_BYTE_TIMEOUT, tcp.peek(&mut first)).await {
                    Ok(Ok(n)) if n > 0 => {
                        let capped = Capped::new(tcp, permit).registered(&registry, addr);
                        let _ = tx.send(Ok(capped)).await;
                    }
                    // Closed, failed, or silent past the deadline: dropped, its place freed.
                    _ => {}
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// Serves `app` on `listener` until `stop`, with the HTTP/1 header deadline; then lets the
/// open ones finish their requests and waits for them to close. The listener admits under the
/// port's cap ([`CappedListener`], or [`crate::tls::TlsListener`] before the handshake).
pub async fn serve_http<L, Io>(mut listener: L, app: Router, stop: impl Future<Output = ()>)
where
    L: Listener<Io = Capped<Io>, Addr = std::net::SocketAddr>,
    Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    use hyper_util::rt::TokioIo;
    use tower::ServiceExt;

    let (closing_tx, closing_rx) = watch::channel(false);
    // Every connection task holds a receiver: the sender sees them all gone.
    let (gone_tx, gone_rx) = watch::channel(());
    let mut stop = pin!(stop);
    loop {
        let (io, addr) = tokio::select! {
            c = listener.accept() => c,
            _ = &mut stop => break,
        };
        let info = io.info();
        let io = TokioIo::new(io);
        let service = hyper_util::service::TowerToHyperService::new(
            tower::Layer::layer(&TrackRequests::default(), app.clone()).map_request(
                move |r: http::Request<hyper::body::Incoming>| with_client_addr(r, addr, &info),
            ),
        );
        let mut closing = closing_rx.clone();
        let gone = gone_rx.clone();
        tokio::spawn(async move {
            let builder = http_builder();
            let mut conn = pin!(builder.serve_connection_with_upgrades(io, service));
            let mut closed = false;
            loop {
                tokio::select! {
                    r = conn.as_mut() => {
                        if let Err(e) = r {
                            tracing::trace!(error = %e, "HTTP connection ended");
                        }
                        break;
                    }
                    _ = closing.wait_for(|c| *c), if !closed => {
                        closed = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
            drop(gone);
        });
    }
    drop(listener);
    let _ = closing_tx.send(true);
    drop(gone_rx);
    gone_tx.closed().await;
}

/// Answers a connection over the cap with the cap's refusal, then closes it (1 s at most).
async fn refuse<I: AsyncWrite + Unpin>(mut io: I, refusal: Vec<u8>) {
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        io.write_all(&refusal).await?;
        io.shutdown().await
    })
    .await;
}

/// The request as the router takes it, with the client's address in [`CLIENT_ADDR_HEADER`]
/// (whatever the client sent in that header is dropped) and its connection's [`ConnInfo`].
fn with_client_addr(
    r: http::Request<hyper::body::Incoming>,
    addr: std::net::SocketAddr,
    info: &ConnInfo,
) -> http::Request<axum::body::Body> {
    let mut r = r.map(axum::body::Body::new);
    r.extensions_mut().insert(info.clone());
    let h = r.headers_mut();
    h.remove(CLIENT_ADDR_HEADER);
    if let Ok(v) = http::HeaderValue::from_str(&addr.ip().to_string()) {
        h.insert(CLIENT_ADDR_HEADER, v);
    }
    r
}

/// HTTP/1 with the header deadline and HTTP/2 with keepalive pings, on one port.
fn http_builder() -> hyper_util::server::conn::auto::Builder<hyper_util::rt::TokioExecutor> {
    use hyper_util::rt::{TokioExecutor, TokioTimer};
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(H2_KEEPALIVE_INTERVAL)
        .keep_alive_timeout(H2_KEEPALIVE_TIMEOUT);
    builder
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_holds_at_most_its_share_and_a_closed_place_comes_back() {
        let cap = ConnCap::with_per_addr("test", 4, 2);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let a1 = cap.admit(a).expect("first from a");
        let _a2 = cap.admit(a).expect("second from a");
        assert!(cap.admit(a).is_none(), "a third from one address");
        let _b1 = cap.admit(b).expect("another address has room");
        let _b2 = cap.admit(b).expect("and its own share");
        assert!(
            cap.admit("10.0.0.3".parse().unwrap()).is_none(),
            "the port is full"
        );
        assert_eq!(cap.open(), 4);
        drop(a1);
        assert_eq!(cap.open(), 3);
        assert!(cap.admit(a).is_some(), "a's place came back");
        assert_eq!(cap.refused(), 2);
        // A client port's share: a quarter, at least 64, or all of a small cap.
        assert_eq!(ConnCap::new("t", 4096).per_addr(), 1024);
        assert_eq!(ConnCap::new("t", 100).per_addr(), 64);
        assert_eq!(ConnCap::new("t", 2).per_addr(), 2);
    }
}
