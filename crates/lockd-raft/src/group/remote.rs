//! A group this node hosts no replica of, reached over the peer port (placement, `placement.rs`).
//!
//! A call goes straight to the node this handle last found leading the group. A node that does
//! not lead it (a follower, a fresh leader whose lease is not valid yet, or a node that hosts no
//! replica of it) refuses without doing anything, and the call moves on to the next candidate:
//! the group's placed nodes first, then every other peer, so a group whose members changed since
//! the cluster was founded is still found. After a full round without a leader the call pauses
//! as a local group's would, and gives up after the same retry budget.
//!
//! A leader never re-forwards, so a remote call takes one hop once the leader is known, the
//! same as a follower's forward.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lockd_core::{Op, SessionId};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::time::Instant;

use crate::group::{never_sent, Outage, Timing};
use crate::peer::{Method, Peers};
use crate::raft::{MemberError, Membership};
use crate::wire::Proposed;
use crate::{GroupError, GroupId, MemberCall, NodeId, ProposeResult};

/// What one attempt at a candidate came to.
enum Attempt<T> {
    /// The answer (or a failure that must not be repeated).
    Done(Result<T, GroupError>),
    /// The call reached this candidate, or may have, and failed there: report it (the call
    /// must not be repeated), but start the next call at another candidate, so a dead node
    /// whose failure looks ambiguous (a proxy or a mesh sidecar in front of it accepts the
    /// connection, then drops it) cannot pin every later call to itself.
    Failed(GroupError),
    /// This candidate did nothing: try the next.
    Next,
}

/// A group hosted elsewhere.
pub struct RemoteGroup {
    id: GroupId,
    /// This node (never asked).
    me: NodeId,
    /// Asked first, in order; then every other node the transport knows of (a member added
    /// since this handle was made: a replacement, a joiner).
    candidates: Vec<NodeId>,
    /// Index into `candidates` of the node tried first: the last one that answered as leader.
    next: AtomicUsize,
    peers: Peers,
    timing: Timing,
    /// Whether calls fail fast for want of a leader (`outage.rs`).
    outage: Outage,
}

/// Whether a failed call certainly did nothing at its target: it was never sent, or the target
/// hosts no replica of the group or is stopping.
fn not_served(st: &tonic::Status) -> bool {
    never_sent(st)
        || st.code() == tonic::Code::NotFound
        || (st.code() == tonic::Code::Unavailable && st.message().contains("shutting down"))
}

impl RemoteGroup {
    pub(crate) fn new(
        id: GroupId,
        me: NodeId,
        candidates: Vec<NodeId>,
        peers: Peers,
        timing: Timing,
    ) -> RemoteGroup {
        assert!(!candidates.is_empty(), "a remote group needs a node to ask");
        RemoteGroup {
            id,
            me,
            candidates,
            next: AtomicUsize::new(0),
            peers,
            timing,
            outage: Outage::default(),
        }
    }

    pub fn id(&self) -> GroupId {
        self.id
    }

    /// The node a call goes to first (the group's leader, as far as this node knows).
    pub fn leader_hint(&self) -> NodeId {
        let order = self.order();
        order[self.next.load(Ordering::Relaxed) % order.len()]
    }

    /// The nodes to ask, in order: the candidates, then every other node the transport knows.
    fn order(&self) -> Vec<NodeId> {
        let mut order = self.candidates.clone();
        for n in self.peers.known_nodes() {
            if n != self.me && !order.contains(&n) {
                order.push(n);
            }
        }
        order
    }

    fn no_leader(&self) -> GroupError {
        GroupError::NoLeader {
            retry_after_ms: self.timing.election_max.as_millis() as u64 / 2,
        }
    }

    /// Moves past candidate `i` (unless another call already did); pauses after a full round.
    async fn rotate(&self, i: usize, tried: &mut usize, of: usize) {
        let _ = self
            .next
            .compare_exchange(i, i + 1, Ordering::Relaxed, Ordering::Relaxed);
        *tried += 1;
        if (*tried).is_multiple_of(of) {
            tokio::time::sleep(self.timing.retry_pause).await;
        }
    }

    /// The nodes this handle asks, in order.
    pub fn candidates(&self) -> &[NodeId] {
        &self.candidates
    }

    /// Tries the candidates, starting with the last one that answered, moving on while
    /// `attempt` says [`Attempt::Next`] and pausing after each full round, until the retry
    /// budget is spent: then `NoLeader`. While the group is out (`outage.rs`), one round.
    async fn over_candidates<T, F, Fut>(&self, attempt: F) -> Result<T, GroupError>
    where
        F: FnMut(NodeId) -> Fut,
        Fut: std::future::Future<Output = Attempt<T>>,
    {
        let (give_up, out) = self.outage.give_up_at(self.timing.retry_budget);
        let r = self.rounds(attempt, give_up, out).await;
        self.outage.settle(self.id, &r, !out);
        r
    }

    /// [`RemoteGroup::over_candidates`] for a call any member serves (not only the leader):
    /// its answer says nothing of a leader, so it neither ends an outage nor fails fast.
    async fn over_members<T, F, Fut>(&self, attempt: F) -> Result<T, GroupError>
    where
        F: FnMut(NodeId) -> Fut,
        Fut: std::future::Future<Output = Attempt<T>>,
    {
        let give_up = Instant::now() + self.timing.retry_budget;
        self.rounds(attempt, give_up, false).await
    }

    async fn rounds<T, F, Fut>(
        &self,
        mut attempt: F,
        give_up: Instant,
        out: bool,
    ) -> Result<T, GroupError>
    where
        F: FnMut(NodeId) -> Fut,
        Fut: std::future::Future<Output = Attempt<T>>,
    {
        let mut tried = 0;
        loop {
            let i = self.next.load(Ordering::Relaxed);
            let order = self.order();
            let target = order[i % order.len()];
            let got = attempt(target).await;
            tracing::debug!(
                node = self.me,
                group = self.id,
                target,
                outcome = match &got {
                    Attempt::Done(Ok(_)) => "done",
                    Attempt::Done(Err(_)) => "done with an error",
                    Attempt::Failed(_) => "failed",
                    Attempt::Next => "next",
                },
                "remote call attempt"
            );
            match got {
                Attempt::Done(r) => return r,
                Attempt::Failed(e) => {
                    let _ =
                        self.next
                            .compare_exchange(i, i + 1, Ordering::Relaxed, Ordering::Relaxed);
                    return Err(e);
                }
                Attempt::Next => {}
            }
            // Out: one round, without the pause that ends it.
            if Instant::now() >= give_up && (!out || tried + 1 >= order.len()) {
                return Err(self.no_leader());
            }
            self.rotate(i, &mut tried, order.len()).await;
        }
    }

    /// Sends `req` to the group's leader. `idempotent`: a call whose delivery is unknown may be
    /// repeated (a keepalive); otherwise its outcome is reported as unknown (a proposal).
    async fn on_leader<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        method: Method,
        req: &Req,
        idempotent: bool,
    ) -> Result<Resp, GroupError> {
        let timeout = self.timing.propose_timeout;
        self.over_candidates(|target| async move {
            match self
                .peers
                .forward::<Req, Resp>(target, method, self.id, req, timeout)
                .await
            {
                Ok(Err(GroupError::NoLeader { .. } | GroupError::ShuttingDown)) => Attempt::Next,
                Ok(r) => Attempt::Done(r),
                Err(st) if not_served(&st) || idempotent => Attempt::Next,
                Err(st) => Attempt::Failed(GroupError::Unavailable(format!(
                    "forwarding to node {target}, leader of group {}, failed ({}: {}); the \
                     outcome is unknown",
                    self.id,
                    st.code(),
                    st.message()
                ))),
            }
        })
        .await
    }

    /// [`crate::Group::propose`] for a group hosted elsewhere: sent to its leader.
    pub async fn propose(&self, op: Op) -> ProposeResult {
        self.propose_full(op).await.map(|p| p.reply)
    }

    /// [`crate::Group::propose_full`] for a group hosted elsewhere.
    pub async fn propose_full(&self, op: Op) -> crate::group::ProposedResult {
        let deadline = Instant::now() + self.timing.propose_timeout;
        let call = self.on_leader::<Op, Proposed>(Method::Propose, &op, false);
        match tokio::time::timeout_at(deadline, call).await {
            Ok(r) => r,
            Err(_) => Err(GroupError::Timeout),
        }
    }

    /// [`crate::Group::keepalive`] for a group hosted elsewhere.
    pub async fn keepalive(&self, session: SessionId) -> Result<crate::Renewed, GroupError> {
        self.on_leader(Method::Keepalive, &session, true).await
    }

    /// A call of the embedding application (`crate::AppHandler`) served by a node that hosts a
    /// replica of this group: the leader if known, else any member. Answers the handler's
    /// reply. A call that reached a member and failed there is not repeated (its outcome is the
    /// handler's business); one that no member took is retried within the retry budget.
    pub async fn app_call(
        &self,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, GroupError> {
        let payload = &payload;
        self.over_members(|target| async move {
            match self
                .peers
                .call(target, Method::App, self.id, payload.clone(), timeout)
                .await
            {
                Ok(reply) => Attempt::Done(Ok(reply)),
                Err(st) if not_served(&st) => Attempt::Next,
                Err(st) => Attempt::Failed(GroupError::Unavailable(format!(
                    "the call to node {target} for group {} failed ({}: {})",
                    self.id,
                    st.code(),
                    st.message()
                ))),
            }
        })
        .await
    }

    /// A membership call on this group's leader (every one is idempotent, so a call whose
    /// delivery is unknown is simply repeated), following `NotLeader` hints, for up to `wait`.
    pub(crate) async fn member_call(
        &self,
        call: &MemberCall,
        wait: Duration,
        timeout: Duration,
    ) -> Result<Membership, MemberError> {
        let payload =
            postcard::to_allocvec(call).map_err(|e| MemberError::Unavailable(e.to_string()))?;
        let give_up = Instant::now() + wait;
        let mut tried = 0;
        let mut last;
        loop {
            let i = self.next.load(Ordering::Relaxed);
            let order = self.order();
            let target = order[i % order.len()];
            match self
                .peers
                .call(target, Method::Member, self.id, payload.clone(), timeout)
                .await
            {
                Ok(bytes) => {
                    let r: Result<Membership, MemberError> =
                        postcard::from_bytes(&bytes).map_err(|e| {
                            MemberError::Unavailable(format!("bad reply from node {target}: {e}"))
                        })?;
                    match r {
                        Err(MemberError::NotLeader { leader: Some(l) })
                            if order.contains(&l) && l != target =>
                        {
                            let at = order.iter().position(|c| *c == l);
                            self.next.store(at.unwrap_or(0), Ordering::Relaxed);
                            continue;
                        }
                        Err(e @ MemberError::NotLeader { .. }) => last = e,
                        other => return other,
                    }
                }
                Err(st) => {
                    last = MemberError::Unavailable(format!(
                        "node {target} did not answer for group {} ({}: {})",
                        self.id,
                        st.code(),
                        st.message()
                    ))
                }
            }
            if Instant::now() >= give_up {
                return Err(last);
            }
            self.rotate(i, &mut tried, order.len()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use futures_util::future::BoxFuture;

    use super::*;
    use crate::peer::PeerTransport;

    /// Node 1 is dead behind a proxy (the connection is taken, then dropped: an ambiguous
    /// failure); node 2 answers. Records whom each call reached.
    struct DeadBehindProxy {
        asked: Mutex<Vec<NodeId>>,
    }

    impl PeerTransport for DeadBehindProxy {
        fn call(
            &self,
            target: NodeId,
            _method: Method,
            _group: GroupId,
            _payload: Vec<u8>,
            _timeout: Duration,
        ) -> BoxFuture<'_, Result<Vec<u8>, tonic::Status>> {
            self.asked.lock().unwrap().push(target);
            Box::pin(async move {
                match target {
                    1 => Err(tonic::Status::unknown("transport error")),
                    _ => Ok(b"answer".to_vec()),
                }
            })
        }
    }

    #[tokio::test]
    async fn an_ambiguous_failure_is_reported_once_and_the_next_call_goes_elsewhere() {
        let t = Arc::new(DeadBehindProxy {
            asked: Mutex::new(Vec::new()),
        });
        let timing = Timing {
            election_max: Duration::from_millis(300),
            retry_budget: Duration::from_secs(1),
            retry_pause: Duration::from_millis(10),
            propose_timeout: Duration::from_secs(1),
            skip_leader_lease_check: false,
            balance_leaders: false,
        };
        let g = RemoteGroup::new(0, 3, vec![1, 2], Peers::new(t.clone()), timing);
        // The first call reached node 1 and may have done something there: not repeated.
        let first = g.app_call(Vec::new(), Duration::from_secs(1)).await;
        assert!(
            matches!(first, Err(GroupError::Unavailable(_))),
            "{first:?}"
        );
        // The next one starts at node 2 instead of being pinned to the dead node.
        let second = g.app_call(Vec::new(), Duration::from_secs(1)).await;
        assert_eq!(second.unwrap(), b"answer");
        assert_eq!(*t.asked.lock().unwrap(), vec![1, 2]);
        assert_eq!(g.leader_hint(), 2);
    }
}
