//! Forwarded calls travel in batches: one peer RPC carries every proposal, keepalive or read
//! index that a follower has queued for the same leader node.
//!
//! Without this a follower sends one HTTP/2 request per forwarded call, and the leader pays
//! header decoding, a stream and a tower stack for each: measured, forwarding cost a third of the
//! cluster's throughput, and 20,000 sessions' keepalives (fanned out to every group) cost the
//! leader half a core.
//!
//! **How a batch forms.** Calls queue per (target node, lane). A call that finds one of the
//! lane's slots free starts a sender, which first lets the scheduler run once: every call made
//! in the same turn (one keepalive fans out to every group; a burst of requests is decoded
//! together) leaves in the same batch. While every slot is busy, calls wait and leave together
//! with the next free slot. On the quorum lane batches grow with load, never with a timer.
//!
//! **Lanes.** A batch is answered when its slowest member is, so calls that are answered at once
//! (keepalives, from the leader's memory) never share a batch with calls that wait for a quorum
//! round (proposals, read indexes): a slow commit must not delay a keepalive.
//!
//! **Keepalives are paced.** The immediate lane has one slot and its batches leave at least
//! [`KEEPALIVE_PACE`] apart, so one node sends at most 200 keepalive RPCs a second to another
//! whatever the session count. A keepalive that arrives after a quiet spell leaves at once; under
//! load one waits at most the pace. That delay is safe: a client measures its lease from when it
//! sent the keepalive, so a later answer only makes it more cautious, and 5 ms is 1.5% of the
//! shortest keepalive interval a 1 s TTL gives. Measured with 20,000 sessions (4,000
//! keepalives/s, each fanned out to 4 groups), the leader's CPU by pace: none 23.5% of a core,
//! 2 ms 16.1–17.4%, 5 ms 12.9–14.0%, 10 ms 12.0–12.9% (docs/BENCHMARKS.md).
//!
//! **Meaning is unchanged.** The leader serves each member exactly as it serves a single
//! forwarded call (`dispatch_one`), concurrently. A member's reply is its own; if the batch RPC
//! fails, every member gets that failure, with the same meaning as for a lone call (a connect
//! failure was never sent; anything else may have been delivered). Each member keeps its own
//! timeout.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{Method, PeerTransport};
use crate::{GroupId, NodeId};

/// Batches outstanding per target on the quorum lane. More than one, so one slow batch does not
/// stall a lane; few, so that under load calls pile up into large batches.
const MAX_IN_FLIGHT: usize = 4;

/// Least time between two keepalive batches to the same node (see the module doc).
const KEEPALIVE_PACE: Duration = Duration::from_millis(5);

/// Largest number of calls in one batch (bounds one RPC's size and its join on the leader).
const MAX_BATCH: usize = 1024;

/// A forwarded call inside a batch.
#[derive(Serialize, Deserialize)]
pub(crate) struct Call {
    pub(crate) method: Forwarded,
    pub(crate) group: GroupId,
    pub(crate) payload: Vec<u8>,
}

/// The methods that may be batched: the forwarded ones (Raft's own RPCs never are).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) enum Forwarded {
    Propose,
    Keepalive,
    ReadIndex,
}

impl Forwarded {
    pub(crate) fn of(method: Method) -> Option<Forwarded> {
        match method {
            Method::Propose => Some(Forwarded::Propose),
            Method::Keepalive => Some(Forwarded::Keepalive),
            Method::ReadIndex => Some(Forwarded::ReadIndex),
            _ => None,
        }
    }

    pub(crate) fn method(self) -> Method {
        match self {
            Forwarded::Propose => Method::Propose,
            Forwarded::Keepalive => Method::Keepalive,
            Forwarded::ReadIndex => Method::ReadIndex,
        }
    }

    fn lane(self) -> Lane {
        match self {
            Forwarded::Keepalive => Lane::Immediate,
            Forwarded::Propose | Forwarded::ReadIndex => Lane::Quorum,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Lane {
    /// Answered from the leader's memory.
    Immediate,
    /// Answered after a quorum round.
    Quorum,
}

impl Lane {
    /// Batches outstanding at once.
    fn slots(self) -> usize {
        match self {
            Lane::Immediate => 1,
            Lane::Quorum => MAX_IN_FLIGHT,
        }
    }

    /// Least time between two batches' departures.
    fn pace(self) -> Duration {
        match self {
            Lane::Immediate => KEEPALIVE_PACE,
            Lane::Quorum => Duration::ZERO,
        }
    }
}

/// One member's answer: the reply payload, or the status a lone call would have failed with.
#[derive(Serialize, Deserialize)]
pub(crate) enum Answer {
    Ok(Vec<u8>),
    Err { code: i32, message: String },
}

impl From<Result<Vec<u8>, tonic::Status>> for Answer {
    fn from(r: Result<Vec<u8>, tonic::Status>) -> Answer {
        match r {
            Ok(p) => Answer::Ok(p),
            Err(st) => Answer::Err {
                code: st.code() as i32,
                message: st.message().to_string(),
            },
        }
    }
}

impl From<Answer> for Result<Vec<u8>, tonic::Status> {
    fn from(a: Answer) -> Self {
        match a {
            Answer::Ok(p) => Ok(p),
            Answer::Err { code, message } => Err(tonic::Status::new(code.into(), message)),
        }
    }
}

type Reply = Result<Vec<u8>, tonic::Status>;

struct Pending {
    call: Call,
    timeout: Duration,
    tx: oneshot::Sender<Reply>,
}

#[derive(Default)]
struct Queue {
    pending: Vec<Pending>,
    /// Senders running (each sends one batch at a time).
    in_flight: usize,
    /// When the last batch left.
    last_sent: Option<Instant>,
}

/// The sending side: per (target, lane) queues sharing the node's transport.
pub(crate) struct Batcher {
    transport: Arc<dyn PeerTransport>,
    queues: Mutex<HashMap<(NodeId, Lane), Queue>>,
}

impl Batcher {
    pub(crate) fn new(transport: Arc<dyn PeerTransport>) -> Arc<Batcher> {
        Arc::new(Batcher {
            transport,
            queues: Mutex::new(HashMap::new()),
        })
    }

    /// Sends one forwarded call as part of a batch and returns its own reply.
    pub(crate) async fn call(
        self: &Arc<Self>,
        target: NodeId,
        method: Forwarded,
        group: GroupId,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Reply {
        let (tx, rx) = oneshot::channel();
        let key = (target, method.lane());
        let start_sender = {
            let mut queues = self.queues.lock().expect("batch queues poisoned");
            let q = queues.entry(key).or_default();
            q.pending.push(Pending {
                call: Call {
                    method,
                    group,
                    payload,
                },
                timeout,
                tx,
            });
            let free = q.in_flight < key.1.slots();
            if free {
                q.in_flight += 1;
            }
            free
        };
        if start_sender {
            tokio::spawn(self.clone().send_until_empty(key));
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => Err(tonic::Status::unavailable(
                "the batch carrying this call was dropped; the outcome is unknown",
            )),
            Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                "no answer from node {target} within {timeout:?}"
            ))),
        }
    }

    /// One sender: takes what has queued (after one scheduler turn, or once the lane's pace
    /// allows), sends it, and goes on until the queue is empty.
    async fn send_until_empty(self: Arc<Self>, key: (NodeId, Lane)) {
        loop {
            let not_before = {
                let queues = self.queues.lock().expect("batch queues poisoned");
                let q = queues.get(&key).expect("queue of a running sender");
                q.last_sent.map(|t| t + key.1.pace())
            };
            match not_before {
                Some(t) if t > Instant::now() => tokio::time::sleep_until(t).await,
                _ => tokio::task::yield_now().await,
            }
            let batch = {
                let mut queues = self.queues.lock().expect("batch queues poisoned");
                let q = queues.get_mut(&key).expect("queue of a running sender");
                if q.pending.is_empty() {
                    // Another sender took them, or the last batch emptied the queue.
                    q.in_flight -= 1;
                    return;
                }
                q.last_sent = Some(Instant::now());
                take_batch(&mut q.pending)
            };
            self.send(key.0, batch).await;
        }
    }

    async fn send(&self, target: NodeId, batch: Vec<Pending>) {
        let timeout = batch.iter().map(|p| p.timeout).max().unwrap_or_default();
        // A member whose caller already gave up (its timeout, or its request dropped) was never
        // sent: leave it out rather than run a proposal nobody waits for.
        let (calls, txs): (Vec<Call>, Vec<_>) = batch
            .into_iter()
            .filter(|p| !p.tx.is_closed())
            .map(|p| (p.call, p.tx))
            .unzip();
        if calls.is_empty() {
            return;
        }
        let result = match postcard::to_allocvec(&calls) {
            Ok(payload) => {
                self.transport
                    .call(target, Method::Batch, 0, payload, timeout)
                    .await
            }
            Err(e) => Err(tonic::Status::internal(e.to_string())),
        };
        let answers = result.and_then(|reply| {
            let answers: Vec<Answer> = postcard::from_bytes(&reply).map_err(|e| {
                tonic::Status::internal(format!("bad batch reply from node {target}: {e}"))
            })?;
            if answers.len() == txs.len() {
                Ok(answers)
            } else {
                Err(tonic::Status::internal(format!(
                    "node {target} answered {} of {} batched calls",
                    answers.len(),
                    txs.len()
                )))
            }
        });
        match answers {
            Ok(answers) => {
                for (tx, a) in txs.into_iter().zip(answers) {
                    let _ = tx.send(a.into());
                }
            }
            Err(st) => {
                for tx in txs {
                    let _ = tx.send(Err(st.clone()));
                }
            }
        }
    }
}

/// Takes up to [`MAX_BATCH`] calls from the front of the queue, in arrival order.
fn take_batch(pending: &mut Vec<Pending>) -> Vec<Pending> {
    if pending.len() <= MAX_BATCH {
        std::mem::take(pending)
    } else {
        pending.drain(..MAX_BATCH).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::future::BoxFuture;
    use tokio::sync::Semaphore;

    /// Holds every batch until the test adds permits, records batch sizes, and answers each
    /// member with its own payload (or fails the whole batch if told to).
    struct Gate {
        open: Semaphore,
        sizes: Mutex<Vec<usize>>,
        fail: bool,
    }

    impl PeerTransport for Gate {
        fn call(
            &self,
            _target: NodeId,
            method: Method,
            _group: GroupId,
            payload: Vec<u8>,
            _timeout: Duration,
        ) -> BoxFuture<'_, Result<Vec<u8>, tonic::Status>> {
            Box::pin(async move {
                assert_eq!(method, Method::Batch);
                let calls: Vec<Call> = postcard::from_bytes(&payload).unwrap();
                self.sizes.lock().unwrap().push(calls.len());
                self.open.acquire().await.unwrap().forget();
                if self.fail {
                    return Err(tonic::Status::unavailable("connection reset"));
                }
                let answers: Vec<Answer> = calls
                    .into_iter()
                    .map(|c| Answer::Ok([vec![c.group as u8], c.payload].concat()))
                    .collect();
                Ok(postcard::to_allocvec(&answers).unwrap())
            })
        }
    }

    fn gate(fail: bool) -> Arc<Gate> {
        Arc::new(Gate {
            open: Semaphore::new(0),
            sizes: Mutex::new(Vec::new()),
            fail,
        })
    }

    fn spawn_call(
        b: &Arc<Batcher>,
        method: Forwarded,
        i: u8,
        timeout: Duration,
    ) -> tokio::task::JoinHandle<Reply> {
        let b = b.clone();
        tokio::spawn(async move { b.call(2, method, i as GroupId, vec![i], timeout).await })
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    /// Senders still running once a keepalive sender has waited out its pace.
    async fn in_flight_when_idle(b: &Batcher) -> usize {
        tokio::time::sleep(KEEPALIVE_PACE).await;
        settle().await;
        b.queues.lock().unwrap().values().map(|q| q.in_flight).sum()
    }

    #[tokio::test]
    async fn calls_beyond_the_in_flight_limit_leave_together_and_get_their_own_answers() {
        let t = gate(false);
        let b = Batcher::new(t.clone());
        let long = Duration::from_secs(60);
        let mut calls = Vec::new();
        // Calls a scheduler turn apart each take a slot of their own.
        for i in 0..MAX_IN_FLIGHT as u8 {
            calls.push(spawn_call(&b, Forwarded::Propose, i, long));
            settle().await;
        }
        // A call in the other lane is not held behind the busy one.
        let keepalive = spawn_call(&b, Forwarded::Keepalive, 100, long);
        for i in 10..20 {
            calls.push(spawn_call(&b, Forwarded::Propose, i, long));
        }
        settle().await;
        assert_eq!(*t.sizes.lock().unwrap(), vec![1, 1, 1, 1, 1]);
        t.open.add_permits(100);
        for (k, c) in calls.into_iter().enumerate() {
            let i = if k < MAX_IN_FLIGHT {
                k as u8
            } else {
                k as u8 + 6
            };
            assert_eq!(c.await.unwrap().unwrap(), vec![i, i]);
        }
        assert_eq!(keepalive.await.unwrap().unwrap(), vec![100, 100]);
        assert_eq!(*t.sizes.lock().unwrap(), vec![1, 1, 1, 1, 1, 10]);
        assert_eq!(in_flight_when_idle(&b).await, 0);
    }

    #[tokio::test]
    async fn calls_made_in_the_same_turn_share_one_batch() {
        let t = gate(false);
        t.open.add_permits(100);
        let b = Batcher::new(t.clone());
        let long = Duration::from_secs(60);
        // One keepalive fanned out to four groups, as `Service::keepalive` does.
        let replies = futures_util::future::join_all(
            (0..4u8).map(|i| b.call(2, Forwarded::Keepalive, i as GroupId, vec![i], long)),
        )
        .await;
        for (i, r) in replies.into_iter().enumerate() {
            assert_eq!(r.unwrap(), vec![i as u8, i as u8]);
        }
        assert_eq!(*t.sizes.lock().unwrap(), vec![4]);
        assert_eq!(in_flight_when_idle(&b).await, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn keepalive_batches_leave_a_pace_apart_but_a_lone_one_at_once() {
        let t = gate(false);
        t.open.add_permits(100);
        let b = Batcher::new(t.clone());
        let long = Duration::from_secs(60);
        let t0 = Instant::now();
        let first = spawn_call(&b, Forwarded::Keepalive, 1, long);
        assert_eq!(first.await.unwrap().unwrap(), vec![1, 1]);
        assert_eq!(
            Instant::now(),
            t0,
            "a keepalive after a quiet spell waits for nothing"
        );
        // Three more, a scheduler turn apart: they wait out the pace and leave together.
        let later: Vec<_> = (2..5u8)
            .map(|i| spawn_call(&b, Forwarded::Keepalive, i, long))
            .collect();
        for (c, i) in later.into_iter().zip(2..5u8) {
            assert_eq!(c.await.unwrap().unwrap(), vec![i, i]);
        }
        assert_eq!(Instant::now(), t0 + KEEPALIVE_PACE);
        assert_eq!(*t.sizes.lock().unwrap(), vec![1, 3]);
        // Proposals are not paced.
        let p = spawn_call(&b, Forwarded::Propose, 9, long);
        assert_eq!(p.await.unwrap().unwrap(), vec![9, 9]);
        assert_eq!(Instant::now(), t0 + KEEPALIVE_PACE);
        // Once the pace has passed, a keepalive leaves at once again.
        tokio::time::sleep(KEEPALIVE_PACE).await;
        let t1 = Instant::now();
        let again = spawn_call(&b, Forwarded::Keepalive, 7, long);
        assert_eq!(again.await.unwrap().unwrap(), vec![7, 7]);
        assert_eq!(Instant::now(), t1);
        assert_eq!(in_flight_when_idle(&b).await, 0);
    }

    #[tokio::test]
    async fn a_failed_batch_fails_every_member_with_its_status() {
        let t = gate(true);
        let b = Batcher::new(t.clone());
        let long = Duration::from_secs(60);
        let calls: Vec<_> = (0..6)
            .map(|i| spawn_call(&b, Forwarded::ReadIndex, i, long))
            .collect();
        settle().await;
        t.open.add_permits(100);
        for c in calls {
            let st = c.await.unwrap().unwrap_err();
            assert_eq!(st.code(), tonic::Code::Unavailable);
            assert_eq!(st.message(), "connection reset");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_whose_caller_gave_up_while_queued_is_never_sent() {
        let t = gate(false);
        let b = Batcher::new(t.clone());
        let long = Duration::from_secs(60);
        let mut busy = Vec::new();
        for i in 0..MAX_IN_FLIGHT as u8 {
            busy.push(spawn_call(&b, Forwarded::Propose, i, long));
            settle().await;
        }
        let abandoned = spawn_call(&b, Forwarded::Propose, 50, Duration::from_millis(10));
        let kept = spawn_call(&b, Forwarded::Propose, 51, long);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let st = abandoned.await.unwrap().unwrap_err();
        assert_eq!(st.code(), tonic::Code::DeadlineExceeded);
        t.open.add_permits(100);
        for c in busy {
            c.await.unwrap().unwrap();
        }
        assert_eq!(kept.await.unwrap().unwrap(), vec![51, 51]);
        // The abandoned call left no trace: the last batch held only the one still wanted.
        assert_eq!(*t.sizes.lock().unwrap(), vec![1, 1, 1, 1, 1]);
    }
}
