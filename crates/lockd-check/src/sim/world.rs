//! The world: what one seed shares between its nodes, clients, nemesis and checks.

use super::*;

pub(crate) struct Hold {
    pub(crate) name: String,
    pub(crate) process: ProcessId,
    pub(crate) token: u64,
    pub(crate) from: Instant,
    pub(crate) to: Instant,
}

/// What the first replica to apply each command saw, by (index, slot); the others must see the
/// same (S9).
#[derive(Default)]
pub(crate) struct Audit {
    pub(crate) first: BTreeMap<(GroupId, u64, usize), (u64, u64)>,
    /// Current holder of each name: (token, session, group), from the service's view. The
    /// group is 0 while a move carries the hold from one group to another.
    pub(crate) holds: BTreeMap<String, (u64, SessionId, GroupId)>,
    pub(crate) last_token: BTreeMap<String, u64>,
    /// Every grant in the committed log: (name, token) -> (group, index).
    pub(crate) grants: BTreeMap<(String, u64), (GroupId, u64)>,
    /// Sessions by the groups that have them open (a session expired in every group is gone).
    pub(crate) open_in: BTreeMap<SessionId, std::collections::BTreeSet<GroupId>>,
    /// Service records in first-apply order (log order within each group).
    pub(crate) seq: u64,
    pub(crate) applies: u64,
}

/// A node's client API and the background tasks a node runs for it.
pub(crate) type NodeService = (Arc<Service>, Vec<tokio::task::AbortHandle>);

pub(crate) struct World {
    pub(crate) cfg: SimConfig,
    pub(crate) t0: Instant,
    pub(crate) rng: Mutex<fastrand::Rng>,
    pub(crate) net: Arc<SimNet>,
    pub(crate) disks: BTreeMap<NodeId, Arc<MemStorage>>,
    pub(crate) records: Mutex<Vec<Record>>,
    pub(crate) digest: Mutex<DefaultHasher>,
    pub(crate) audit: Mutex<Audit>,
    /// Each running node's lockd-server `Service` (what its client ports serve), with the
    /// background tasks a node runs for it (meta catch-up, the orphan janitor).
    pub(crate) services: Mutex<BTreeMap<NodeId, NodeService>>,
    pub(crate) store: Mutex<Store>,
    pub(crate) violations: Mutex<Vec<String>>,
    pub(crate) signatures: Mutex<std::collections::BTreeSet<Signature>>,
    pub(crate) holds: Mutex<Vec<Hold>>,
    /// Acknowledged grants: (name, token, group that granted it).
    pub(crate) acked_grants: Mutex<Vec<(String, u64, GroupId)>>,
    pub(crate) faults: Mutex<BTreeMap<String, u64>>,
    pub(crate) ops: AtomicU64,
    pub(crate) reads: AtomicU64,
    pub(crate) next_op: AtomicU64,
    pub(crate) stop: AtomicBool,
    /// Client index -> paused until.
    pub(crate) client_pause: Mutex<BTreeMap<u64, Instant>>,
    /// Client index -> a pause that starts at its next store write, right after the deadline
    /// check (the GC pause fencing exists for).
    pub(crate) pending_pause: Mutex<BTreeMap<u64, Duration>>,
    /// With `SIM_TRACE=path`, every digested event as text (to find where two runs diverge).
    pub(crate) trace: Mutex<Option<Vec<String>>>,
    /// Every session a client opened, with its local deadline (checked when it expires: C1).
    pub(crate) sessions: Mutex<BTreeMap<SessionId, Arc<Session>>>,
}

impl World {
    /// Every node of the simulation: the founders, then the spares.
    pub(crate) fn node_count(&self) -> u64 {
        self.cfg.replicas + SPARE_NODES
    }

    /// Node `id`'s client API, if it is running.
    pub(crate) fn service(&self, id: NodeId) -> Option<Arc<Service>> {
        lock(&self.services).get(&id).map(|(s, _)| s.clone())
    }

    /// A random node id.
    pub(crate) fn any_node(&self) -> NodeId {
        self.rand_u64(1..self.node_count() + 1)
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn hash_of(v: &impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

impl World {
    pub(crate) fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.t0).as_nanos() as u64
    }

    pub(crate) fn now_ns(&self) -> u64 {
        self.ns(Instant::now())
    }

    pub(crate) fn trace(&self, line: String) {
        if let Some(t) = lock(&self.trace).as_mut() {
            t.push(line);
        }
    }

    pub(crate) fn push(&self, rec: Record) {
        lock(&self.digest).write(format!("{rec:?}").as_bytes());
        self.trace(format!("{rec:?}"));
        lock(&self.records).push(rec);
    }

    pub(crate) fn violation(&self, what: String) {
        let mut v = lock(&self.violations);
        if v.len() < 50 {
            v.push(format!("{what} (t={:.3}s)", self.now_ns() as f64 / 1e9));
        }
    }

    /// A violation of a known kind (a negative control's signature).
    pub(crate) fn violation_of(&self, kind: Signature, what: String) {
        lock(&self.signatures).insert(kind);
        self.violation(what);
    }

    pub(crate) fn fault(&self, kind: &str, target: String) {
        *lock(&self.faults).entry(kind.to_string()).or_insert(0) += 1;
        self.push(Record::Fault {
            kind: kind.into(),
            at_ns: self.now_ns(),
            target,
            verified: true,
            hold_ms: 0,
        });
    }

    pub(crate) fn rand_u64(&self, r: std::ops::Range<u64>) -> u64 {
        lock(&self.rng).u64(r)
    }

    pub(crate) fn rand_ms(&self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.rand_u64(lo..hi))
    }

    pub(crate) fn chance(&self, p: f64) -> bool {
        lock(&self.rng).f64() < p
    }

    pub(crate) fn invoke(&self, process: ProcessId, call: Call) -> u64 {
        let op = self.next_op.fetch_add(1, Ordering::Relaxed);
        self.ops.fetch_add(1, Ordering::Relaxed);
        self.push(Record::Invoke {
            process,
            op,
            at_ns: self.now_ns(),
            call,
        });
        op
    }

    pub(crate) fn complete(&self, process: ProcessId, op: u64, outcome: Outcome) {
        self.push(Record::Complete {
            process,
            op,
            at_ns: self.now_ns(),
            outcome,
        });
    }

    /// Starts client `idx`'s pending pause, if any, then sleeps through it.
    pub(crate) async fn write_pause_point(&self, idx: u64) {
        if let Some(d) = lock(&self.pending_pause).remove(&idx) {
            let until = Instant::now() + d;
            lock(&self.client_pause).insert(idx, until);
        }
        self.pause_point(idx).await
    }

    /// Sleeps while client `idx` is paused (its process is stopped).
    pub(crate) async fn pause_point(&self, idx: u64) {
        loop {
            let until = lock(&self.client_pause).get(&idx).copied();
            match until {
                Some(u) if u > Instant::now() => tokio::time::sleep_until(u).await,
                _ => return,
            }
        }
    }
}
