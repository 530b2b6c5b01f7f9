//! The client ports' connections: how many may be open at once, and how long a request's
//! header and body may take to arrive.
//!
//! Without these a client that opens connections and never finishes a request (or never sends
//! one) holds a task, its buffers and a file descriptor for as long as it likes: enough of them
//! and the node runs out, for every other client too. So:
//! - each client port (HTTP and gRPC) holds at most `--max-client-connections` connections; one
//!   more is closed at once (on HTTP after a `503 too_many_connections` that says so);
//! - an HTTP/1 request's header must arrive within [`HEADER_READ_TIMEOUT`] of the connection
//!   opening or of the previous response (the connection is then closed), and its body within
//!   [`BODY_READ_TIMEOUT`] once the handler reads it (`408 request_timeout`).
//!
//! Long polls and session streams are not bounded by these: they wait on the server's side,
//! after the request has arrived.

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
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
/// The header the HTTP server sets on every request to the client's IP address (one a client
/// sends is removed first), for the budget of failed authentications.
pub const CLIENT_ADDR_HEADER: &str = "x-lockd-client-addr";

/// At most `max` connections of one client port open at once.
#[derive(Clone)]
pub struct ConnCap {
    port: &'static str,
    max: usize,
    permits: Arc<Semaphore>,
    refused: Arc<AtomicU64>,
}

impl ConnCap {
    pub fn new(port: &'static str, max: u32) -> ConnCap {
        let max = max as usize;
        ConnCap {
            port,
            max,
            permits: Arc::new(Semaphore::new(max)),
            refused: Arc::default(),
        }
    }

    /// A permit for one more connection, or `None` (and a warning, now and then) at the cap.
    fn admit(&self) -> Option<OwnedSemaphorePermit> {
        let permit = self.permits.clone().try_acquire_owned().ok();
        if permit.is_none() {
            let n = self.refused.fetch_add(1, Ordering::Relaxed);
            // The first, then one in 1,000: a flood must not flood the log too.
            if n.is_multiple_of(1000) {
                tracing::warn!(
                    port = self.port,
                    max = self.max,
                    refused = n + 1,
                    "client connection refused: the port holds as many as \
                     --max-client-connections allows"
                );
            }
        }
        permit
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
    fn refusal(&self) -> Vec<u8> {
        let body = serde_json::json!({
            "code": "too_many_connections",
            "message": format!(
                "this node's {} port holds at most {} client connections at once \
                 (--max-client-connections); retry later, or use another node",
                self.port, self.max
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

/// A connection that gives its permit back when it closes.
pub struct Capped<Io> {
    io: Io,
    _permit: OwnedSemaphorePermit,
}

impl<Io: AsyncRead + Unpin> AsyncRead for Capped<Io> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
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

/// The gRPC port's connections, under `cap`: one over it is closed at once.
pub fn capped_grpc(
    listener: tokio::net::TcpListener,
    cap: ConnCap,
) -> impl futures::Stream<Item = std::io::Result<Capped<tokio::net::TcpStream>>> {
    futures::stream::unfold((listener, cap), |(listener, cap)| async move {
        loop {
            let (tcp, _) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: back off, as tonic's own does.
                    tracing::warn!(error = %e, "gRPC accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Some(permit) = cap.admit() else {
                continue;
            };
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::warn!(error = %e, "could not set TCP_NODELAY");
            }
            let io = Capped {
                io: tcp,
                _permit: permit,
            };
            return Some((Ok(io), (listener, cap)));
        }
    })
}

/// Serves `app` on `listener` (plain or TLS) until `stop`, with the HTTP/1 header deadline
/// and at most `cap` connections; then lets the open ones finish their requests and waits for
/// them to close.
pub async fn serve_http<L>(
    mut listener: L,
    app: Router,
    cap: ConnCap,
    stop: impl Future<Output = ()>,
) where
    L: Listener<Addr = std::net::SocketAddr>,
{
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto::Builder;
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
        let Some(permit) = cap.admit() else {
            let refusal = cap.refusal();
            tokio::spawn(async move {
                let mut io = io;
                let _ = tokio::time::timeout(Duration::from_secs(1), async {
                    io.write_all(&refusal).await?;
                    io.shutdown().await
                })
                .await;
            });
            continue;
        };
        let io = TokioIo::new(Capped {
            io,
            _permit: permit,
        });
        let service = hyper_util::service::TowerToHyperService::new(app.clone().map_request(
            move |r: http::Request<hyper::body::Incoming>| {
                let mut r = r.map(axum::body::Body::new);
                let h = r.headers_mut();
                h.remove(CLIENT_ADDR_HEADER);
                if let Ok(v) = http::HeaderValue::from_str(&addr.ip().to_string()) {
                    h.insert(CLIENT_ADDR_HEADER, v);
                }
                r
            },
        ));
        let mut closing = closing_rx.clone();
        let gone = gone_rx.clone();
        tokio::spawn(async move {
            let mut builder = Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT);
            builder.http2().timer(TokioTimer::new());
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
