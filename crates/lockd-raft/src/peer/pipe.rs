//! One long-lived HTTP/2 stream per peer node carries every small peer call: openraft's
//! AppendEntries, votes, and the forwarded batches.
//!
//! **Why.** As unary gRPC calls, each Raft message opened an HTTP/2 stream: request headers,
//! response headers and trailers (HPACK on both sides), a tower stack and a task per request on
//! the receiver. At one client op per entry that work is paid about six times per entry (an
//! append and a commit notice to each follower, both answered). In a `perf` profile of an
//! uncontended acquire loop the peer RPC layer was a third of every replica's scheduler thread.
//! On the pipe a call is one length-prefixed message each way inside the open stream, and
//! messages queued together go out in one write.
//!
//! **Meaning is unchanged.** Each call carries an id, its method, its group and its timeout; the
//! receiver serves it exactly as the unary service would (`dispatch`), concurrently with the
//! others, and drops it at its timeout as tonic drops a unary call past its deadline. If the
//! stream cannot be opened, every call on it fails with the channel's status (a connect failure
//! is `Unavailable` "tcp connect error": certainly never sent); if it breaks, every call still
//! waiting fails with the break's status (it may have been delivered). The next call opens a new
//! stream. The channel's HTTP/2 keepalive finds a dead peer as it did for unary calls.
//!
//! Snapshots and any payload above [`MAX_PIPE_PAYLOAD`] still go as unary calls, so one large
//! message never holds up the heartbeats and votes behind it.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::Stream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use super::pb::{peer_client::PeerClient, PipeReply, PipeRequest};
use super::Method;
use crate::GroupId;

/// Largest payload sent on the pipe; larger ones (snapshots, a follower's catch-up) go unary.
pub(crate) const MAX_PIPE_PAYLOAD: usize = 1 << 20;

type Reply = Result<Vec<u8>, tonic::Status>;

/// A copy of `st` (code, message and metadata: a refusal's reason, `book.rs`; tonic's
/// `Status` is not `Clone`).
fn copy(st: &tonic::Status) -> tonic::Status {
    tonic::Status::with_metadata(st.code(), st.message().to_string(), st.metadata().clone())
}

/// What tonic answers for a call past its deadline, on either side.
fn timed_out() -> tonic::Status {
    tonic::Status::cancelled("Timeout expired")
}

/// The calls waiting for a reply, and once the stream has ended, the status they failed with.
#[derive(Default)]
struct Pending {
    calls: HashMap<u64, oneshot::Sender<Reply>>,
    closed: Option<tonic::Status>,
}

/// The sending side of one pipe to one peer node.
pub(crate) struct Pipe {
    tx: mpsc::UnboundedSender<PipeRequest>,
    pending: Arc<Mutex<Pending>>,
    next_id: AtomicU64,
}

impl Pipe {
    /// Opens a pipe on `client`'s channel. The stream is set up in the background; calls made
    /// meanwhile queue behind it.
    pub(crate) fn open(client: PeerClient<super::PeerChannel>) -> Pipe {
        let (tx, rx) = mpsc::unbounded_channel();
        let pending = Arc::new(Mutex::new(Pending::default()));
        tokio::spawn(drive(client, rx, pending.clone()));
        Pipe {
            tx,
            pending,
            next_id: AtomicU64::new(0),
        }
    }

    /// Whether the stream has ended (a new call needs a new pipe).
    pub(crate) fn is_closed(&self) -> bool {
        self.pending.lock().expect("pipe poisoned").closed.is_some()
    }

    /// Sends one call and waits up to `timeout` for its reply.
    pub(crate) async fn call(
        &self,
        method: Method,
        group: GroupId,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Reply {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut p = self.pending.lock().expect("pipe poisoned");
            if let Some(st) = &p.closed {
                return Err(copy(st));
            }
            p.calls.insert(id, tx);
        }
        let req = PipeRequest {
            id,
            method: method.code(),
            group_id: group,
            // Rounded up: a sub-millisecond timeout must not reach the peer as zero.
            timeout_ms: u64::try_from(timeout.as_micros().div_ceil(1000)).unwrap_or(u64::MAX),
            payload,
        };
        // A send that fails found the stream ended: the drive task fails every call it finds
        // waiting, this one included (it was recorded before `closed` was set), with the
        // stream's own status (a refusal says why).
        let _ = self.tx.send(req);
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => Err(tonic::Status::unavailable("peer pipe dropped the call")),
            Err(_) => {
                self.forget(id);
                Err(timed_out())
            }
        }
    }

    fn forget(&self, id: u64) {
        self.pending
            .lock()
            .expect("pipe poisoned")
            .calls
            .remove(&id);
    }
}

/// Runs one pipe's stream: sends what the callers queue, hands each reply to its caller, and
/// when the stream ends fails every call still waiting with the reason.
async fn drive(
    mut client: PeerClient<super::PeerChannel>,
    rx: mpsc::UnboundedReceiver<PipeRequest>,
    pending: Arc<Mutex<Pending>>,
) {
    let outbound =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
    let end = match client.pipe(outbound).await {
        Ok(resp) => {
            let mut inbound = resp.into_inner();
            loop {
                match inbound.message().await {
                    Ok(Some(r)) => {
                        let waiter = pending.lock().expect("pipe poisoned").calls.remove(&r.id);
                        // A caller that timed out is gone; its late reply is dropped.
                        if let Some(tx) = waiter {
                            let _ = tx.send(reply_of(r));
                        }
                    }
                    Ok(None) => break tonic::Status::unavailable("the peer closed the pipe"),
                    Err(st) => break st,
                }
            }
        }
        Err(st) => st,
    };
    let calls = {
        let mut p = pending.lock().expect("pipe poisoned");
        p.closed = Some(copy(&end));
        std::mem::take(&mut p.calls)
    };
    for (_, tx) in calls {
        let _ = tx.send(Err(copy(&end)));
    }
}

fn reply_of(r: PipeReply) -> Reply {
    if r.code == 0 {
        Ok(r.payload)
    } else {
        Err(tonic::Status::new(r.code.into(), r.message))
    }
}

fn reply_frame(id: u64, r: Reply) -> PipeReply {
    match r {
        Ok(payload) => PipeReply {
            id,
            code: 0,
            message: String::new(),
            payload,
        },
        Err(st) => PipeReply {
            id,
            code: st.code() as i32,
            message: st.message().to_string(),
            payload: Vec::new(),
        },
    }
}

/// The reply stream the server returns for one pipe.
pub(crate) type ReplyStream = Pin<Box<dyn Stream<Item = Result<PipeReply, tonic::Status>> + Send>>;

/// Serves one pipe: every incoming call runs as its own task through `handle`, bounded by the
/// call's timeout, and its reply goes back on the stream as soon as it is ready. When the caller
/// goes away the calls still running are dropped, as a unary call is when its client resets it.
/// When `closed` resolves (the server is stopping) the stream ends the same way.
pub(crate) fn serve<H, F>(
    mut inbound: tonic::Streaming<PipeRequest>,
    handle: H,
    closed: impl Future<Output = ()> + Send + 'static,
) -> ReplyStream
where
    H: Fn(Method, GroupId, Vec<u8>) -> F + Send + Sync + 'static,
    F: Future<Output = Reply> + Send + 'static,
{
    let (tx, mut rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut running = JoinSet::new();
        tokio::pin!(closed);
        loop {
            tokio::select! {
                () = &mut closed => break,
                next = inbound.message() => match next {
                    Ok(Some(req)) => {
                        let tx = tx.clone();
                        let call = Method::from_code(req.method).map(|m| handle(m, req.group_id, req.payload));
                        let timeout = Duration::from_millis(req.timeout_ms);
                        running.spawn(async move {
                            let r = match call {
                                Some(call) => tokio::time::timeout(timeout, call)
                                    .await
                                    .unwrap_or_else(|_| Err(timed_out())),
                                None => Err(tonic::Status::invalid_argument(format!(
                                    "unknown peer method code {}",
                                    req.method
                                ))),
                            };
                            let _ = tx.send(Ok(reply_frame(req.id, r)));
                        });
                    }
                    Ok(None) | Err(_) => break,
                },
                Some(_) = running.join_next(), if !running.is_empty() => {}
            }
        }
        running.abort_all();
    });
    Box::pin(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::net::SocketAddr;
    use std::sync::atomic::AtomicBool;

    use tokio::net::TcpListener;

    use super::*;
    use crate::peer::pb::peer_server::{Peer, PeerServer};
    use crate::peer::pb::{PeerReply, PeerRequest};
    use crate::peer::{PeerPool, PeerTransport};

    /// A peer whose pipe answers `Append` after `payload[0]` ms with the group id and the
    /// payload, never answers `Vote` (and records when that call is dropped), and whose unary
    /// calls all fail.
    struct Echo {
        vote_dropped: Arc<AtomicBool>,
        stop: Arc<tokio::sync::Notify>,
    }

    struct SetOnDrop(Arc<AtomicBool>);

    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    type Unary = Result<tonic::Response<PeerReply>, tonic::Status>;

    fn refuse() -> Unary {
        Err(tonic::Status::unimplemented(
            "test peer serves only the pipe",
        ))
    }

    #[tonic::async_trait]
    impl Peer for Echo {
        async fn append(&self, _: tonic::Request<PeerRequest>) -> Unary {
            refuse()
        }
        async fn vote(&self, _: tonic::Request<PeerRequest>) -> Unary {
            refuse()
        }
        async fn pre_vote(&self, _: tonic::Request<PeerRequest>) -> Unary {
            refuse()
        }
        async fn snapshot(&self, _: tonic::Request<PeerRequest>) -> Unary {
            refuse()
        }
        async fn propose(&self, _: tonic::Request<PeerRequest>) -> Unary {
            refuse()
        }
        async fn keepalive(&self, _: tonic::Request<PeerRequest>) -> Unary {
            refuse()
        }
        async fn read_index(&self, _: tonic::Request<PeerRequest>) -> Unary {
            refuse()
        }
        async fn batch(&self, _: tonic::Request<PeerRequest>) -> Unary {
            refuse()
        }
        async fn transfer_leader(&self, _: tonic::Request<PeerRequest>) -> Unary {
            refuse()
        }

        async fn member(&self, _: tonic::Request<PeerRequest>) -> Unary {
            refuse()
        }

        async fn app(&self, _: tonic::Request<PeerRequest>) -> Unary {
            refuse()
        }

        type PipeStream = ReplyStream;

        async fn pipe(
            &self,
            req: tonic::Request<tonic::Streaming<PipeRequest>>,
        ) -> Result<tonic::Response<ReplyStream>, tonic::Status> {
            let dropped = self.vote_dropped.clone();
            let stop = self.stop.clone();
            Ok(tonic::Response::new(serve(
                req.into_inner(),
                move |method, group, payload| {
                    let dropped = dropped.clone();
                    async move {
                        match method {
                            Method::Append => {
                                let ms = u64::from(payload[0]);
                                tokio::time::sleep(Duration::from_millis(ms)).await;
                                Ok([vec![group as u8], payload].concat())
                            }
                            Method::Vote => {
                                let _guard = SetOnDrop(dropped);
                                std::future::pending().await
                            }
                            _ => Err(tonic::Status::invalid_argument("not in this test")),
                        }
                    }
                },
                async move { stop.notified().await },
            )))
        }
    }

    struct Server {
        addr: SocketAddr,
        vote_dropped: Arc<AtomicBool>,
        stop: Arc<tokio::sync::Notify>,
        task: tokio::task::JoinHandle<()>,
    }

    async fn start(addr: SocketAddr) -> Server {
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let vote_dropped = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(tokio::sync::Notify::new());
        let svc = PeerServer::new(Echo {
            vote_dropped: vote_dropped.clone(),
            stop: stop.clone(),
        });
        let shutdown = stop.clone();
        let task = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    async move { shutdown.notified().await },
                )
                .await
                .unwrap();
        });
        Server {
            addr,
            vote_dropped,
            stop,
            task,
        }
    }

    impl Server {
        /// Ends the pipes and the server, as `Running::stop` does.
        async fn stop(self) {
            self.stop.notify_waiters();
            tokio::time::timeout(Duration::from_secs(5), self.task)
                .await
                .expect("the server waited for its pipes")
                .unwrap();
        }
    }

    fn pool(addr: SocketAddr) -> PeerPool {
        PeerPool::new(
            &BTreeMap::from([(2, addr.to_string())]),
            "lockd",
            1,
            None,
            Arc::new(crate::PeerBook::new(0, None)),
        )
        .unwrap()
    }

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn method_numbers_round_trip_and_unknown_ones_are_refused() {
        for m in Method::BY_CODE {
            assert_eq!(Method::from_code(m.code()), Some(m));
        }
        assert_eq!(Method::from_code(0), None);
        assert_eq!(Method::from_code(Method::BY_CODE.len() as u32 + 1), None);
    }

    #[tokio::test]
    async fn calls_share_one_pipe_and_each_gets_its_own_reply() {
        let server = start("127.0.0.1:0".parse().unwrap()).await;
        let pool = Arc::new(pool(server.addr));
        // The first call is answered last.
        let calls: Vec<_> = [(60u8, 1u32), (30, 2), (0, 3)]
            .into_iter()
            .map(|(ms, group)| {
                let pool = pool.clone();
                tokio::spawn(async move {
                    let r = pool
                        .call(2, Method::Append, group, vec![ms, 7], SECOND)
                        .await;
                    (r, tokio::time::Instant::now())
                })
            })
            .collect();
        let mut done = Vec::new();
        for c in calls {
            done.push(c.await.unwrap());
        }
        assert_eq!(done[0].0.as_ref().unwrap(), &vec![1, 60, 7]);
        assert_eq!(done[1].0.as_ref().unwrap(), &vec![2, 30, 7]);
        assert_eq!(done[2].0.as_ref().unwrap(), &vec![3, 0, 7]);
        assert!(done[2].1 < done[0].1, "replies wait for each other");
        assert_eq!(pool.pipes.lock().unwrap().len(), 1);
        server.stop().await;
    }

    #[tokio::test]
    async fn a_call_past_its_timeout_fails_and_is_dropped_by_the_peer() {
        let server = start("127.0.0.1:0".parse().unwrap()).await;
        let pool = pool(server.addr);
        let t = Duration::from_millis(100);
        let st = pool.call(2, Method::Vote, 1, vec![], t).await.unwrap_err();
        assert_eq!(st.code(), tonic::Code::Cancelled, "{st:?}");
        let deadline = tokio::time::Instant::now() + SECOND;
        while !server.vote_dropped.load(Ordering::SeqCst) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the peer kept the call"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The pipe still works.
        let r = pool.call(2, Method::Append, 4, vec![0], SECOND).await;
        assert_eq!(r.unwrap(), vec![4, 0]);
        server.stop().await;
    }

    #[tokio::test]
    async fn a_stopped_peer_fails_waiting_calls_at_once_and_a_restarted_one_gets_a_new_pipe() {
        let server = start("127.0.0.1:0".parse().unwrap()).await;
        let addr = server.addr;
        let pool = Arc::new(pool(addr));
        assert_eq!(
            pool.call(2, Method::Append, 1, vec![0], SECOND)
                .await
                .unwrap(),
            vec![1, 0]
        );
        let slow = {
            let pool = pool.clone();
            tokio::spawn(async move {
                pool.call(2, Method::Append, 1, vec![250], 10 * SECOND)
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let stopped = tokio::time::Instant::now();
        server.stop().await;
        let st = slow.await.unwrap().unwrap_err();
        assert_ne!(
            st.code(),
            tonic::Code::Cancelled,
            "it waited for its timeout: {st:?}"
        );
        assert!(stopped.elapsed() < 5 * SECOND);

        // Nothing listens: the call certainly never left.
        let st = pool
            .call(2, Method::Append, 1, vec![0], SECOND)
            .await
            .unwrap_err();
        assert_eq!(st.code(), tonic::Code::Unavailable, "{st:?}");
        assert!(st.message().contains("tcp connect error"), "{st:?}");

        let server = start(addr).await;
        let deadline = tokio::time::Instant::now() + 5 * SECOND;
        loop {
            match pool.call(2, Method::Append, 5, vec![0], SECOND).await {
                Ok(r) => {
                    assert_eq!(r, vec![5, 0]);
                    break;
                }
                Err(st) => assert!(tokio::time::Instant::now() < deadline, "{st:?}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        server.stop().await;
    }
}
