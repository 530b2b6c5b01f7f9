//! The simulated network between in-process lockd nodes.
//!
//! Every peer call of a node goes through a [`Link`] (lockd-raft's `PeerTransport` seam) and is
//! delivered to the target with `Node::serve_peer`, the same dispatch the gRPC service uses.
//! Each leg (request, reply) gets a seeded delay — so concurrent calls overtake each other
//! (reordering) — and may be lost; a lost leg or a partitioned pair costs the caller its full
//! timeout, as a silent network does. A paused node's traffic is held until it resumes. A down
//! node refuses connections ("tcp connect error": certainly never delivered), and a reply from
//! an incarnation that crashed meanwhile is dropped.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::future::BoxFuture;
use lockd_raft::{GroupId, Node, NodeId, PeerMethod, PeerTransport};
use tokio::time::Instant;

/// Mutable network state; all draws come from one seeded RNG.
pub(crate) struct NetState {
    /// node -> (incarnation, the running node if up).
    nodes: BTreeMap<NodeId, (u64, Option<Arc<Node>>)>,
    /// Directed pairs that cannot talk, with how many partitions block them.
    blocked: BTreeMap<(NodeId, NodeId), u32>,
    /// Nodes whose traffic is held (a paused process).
    paused: BTreeMap<NodeId, u32>,
    /// Probability that one leg is lost.
    pub(crate) loss: f64,
    /// One-way delay range, microseconds.
    pub(crate) delay_us: (u64, u64),
    rng: fastrand::Rng,
    pub(crate) legs: u64,
    pub(crate) lost: u64,
    /// With `SIM_TRACE`, every leg drawn (to find where two runs diverge).
    pub(crate) log: Option<Vec<String>>,
}

/// The simulated network.
pub(crate) struct SimNet {
    st: Mutex<NetState>,
}

impl SimNet {
    pub(crate) fn new(seed: u64) -> Arc<SimNet> {
        Arc::new(SimNet {
            st: Mutex::new(NetState {
                nodes: BTreeMap::new(),
                blocked: BTreeMap::new(),
                paused: BTreeMap::new(),
                loss: 0.0,
                delay_us: (200, 3_000),
                rng: fastrand::Rng::with_seed(seed),
                legs: 0,
                lost: 0,
                log: std::env::var_os("SIM_TRACE").map(|_| Vec::new()),
            }),
        })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, NetState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The transport handed to node `from`.
    pub(crate) fn link(self: &Arc<Self>, from: NodeId) -> Arc<dyn PeerTransport> {
        Arc::new(Link {
            from,
            net: self.clone(),
        })
    }

    /// Node `id` is up as `node` (a new incarnation).
    pub(crate) fn up(&self, id: NodeId, node: Arc<Node>) {
        let mut st = self.lock();
        let e = st.nodes.entry(id).or_insert((0, None));
        e.0 += 1;
        e.1 = Some(node);
    }

    /// Node `id` crashed: it refuses connections and its pending replies are dropped.
    pub(crate) fn down(&self, id: NodeId) -> Option<Arc<Node>> {
        let mut st = self.lock();
        let e = st.nodes.entry(id).or_insert((0, None));
        e.0 += 1;
        e.1.take()
    }

    pub(crate) fn node(&self, id: NodeId) -> Option<(u64, Arc<Node>)> {
        let st = self.lock();
        st.nodes
            .get(&id)
            .and_then(|(inc, n)| n.clone().map(|n| (*inc, n)))
    }

    pub(crate) fn block(&self, pairs: &[(NodeId, NodeId)]) {
        let mut st = self.lock();
        for p in pairs {
            *st.blocked.entry(*p).or_insert(0) += 1;
        }
    }

    pub(crate) fn unblock(&self, pairs: &[(NodeId, NodeId)]) {
        let mut st = self.lock();
        for p in pairs {
            if let Some(n) = st.blocked.get_mut(p) {
                *n -= 1;
                if *n == 0 {
                    st.blocked.remove(p);
                }
            }
        }
    }

    pub(crate) fn pause(&self, id: NodeId, on: bool) {
        let mut st = self.lock();
        let n = st.paused.entry(id).or_insert(0);
        if on {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
        }
        if *n == 0 {
            st.paused.remove(&id);
        }
    }

    /// Ends every partition and pause.
    pub(crate) fn heal(&self) {
        let mut st = self.lock();
        st.blocked.clear();
        st.paused.clear();
        st.loss = 0.0;
    }

    pub(crate) fn is_paused(&self, id: NodeId) -> bool {
        self.lock().paused.contains_key(&id)
    }

    fn blocked(&self, from: NodeId, to: NodeId) -> bool {
        self.lock().blocked.contains_key(&(from, to))
    }

    /// Draws one leg: `None` if it is lost (or the pair is partitioned), else its delay.
    fn leg(&self, from: NodeId, to: NodeId, what: &str) -> Option<Duration> {
        let mut st = self.lock();
        if let Some(l) = st.log.as_mut() {
            l.push(format!("{:?} leg {from}->{to} {what}", Instant::now()));
        }
        st.legs += 1;
        let lost = st.rng.f64() < st.loss;
        let (lo, hi) = st.delay_us;
        let us = st.rng.u64(lo..=hi.max(lo));
        if lost || st.blocked.contains_key(&(from, to)) {
            st.lost += 1;
            return None;
        }
        Some(Duration::from_micros(us))
    }

    /// Waits while either end is paused; false if `deadline` passed first.
    async fn wait_unpaused(&self, a: NodeId, b: NodeId, deadline: Instant) -> bool {
        loop {
            if !self.is_paused(a) && !self.is_paused(b) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn deliver(
        self: Arc<Self>,
        from: NodeId,
        to: NodeId,
        method: PeerMethod,
        group: GroupId,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, tonic::Status> {
        let deadline = Instant::now() + timeout;
        let lost = || async move {
            tokio::time::sleep_until(deadline).await;
            Err(tonic::Status::deadline_exceeded("simulated: no answer"))
        };
        let Some(delay) = self.leg(from, to, &format!("{method:?} g{group} req")) else {
            return lost().await;
        };
        tokio::time::sleep(delay).await;
        if !self.wait_unpaused(from, to, deadline).await || self.blocked(from, to) {
            return lost().await;
        }
        let Some((inc, node)) = self.node(to) else {
            return Err(tonic::Status::unavailable(
                "tcp connect error (simulated: node down)",
            ));
        };
        let reply =
            match tokio::time::timeout_at(deadline, node.serve_peer(method, group, &payload)).await
            {
                Ok(r) => r?,
                Err(_) => return Err(tonic::Status::deadline_exceeded("simulated: timeout")),
            };
        drop(node);
        let Some(delay) = self.leg(to, from, &format!("{method:?} g{group} reply")) else {
            return lost().await;
        };
        tokio::time::sleep(delay).await;
        if !self.wait_unpaused(from, to, deadline).await || self.blocked(to, from) {
            return lost().await;
        }
        if self.node(to).map(|(i, _)| i) != Some(inc) {
            return Err(tonic::Status::unavailable(
                "simulated: connection reset (peer crashed)",
            ));
        }
        Ok(reply)
    }
}

/// One node's outbound side of the simulated network.
struct Link {
    from: NodeId,
    net: Arc<SimNet>,
}

impl PeerTransport for Link {
    fn call(
        &self,
        target: NodeId,
        method: PeerMethod,
        group: GroupId,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<Vec<u8>, tonic::Status>> {
        Box::pin(
            self.net
                .clone()
                .deliver(self.from, target, method, group, payload, timeout),
        )
    }

    fn known_nodes(&self) -> Vec<NodeId> {
        self.net.lock().nodes.keys().copied().collect()
    }
}
