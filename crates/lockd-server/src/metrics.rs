//! Prometheus metrics. Counters are bumped where things happen; gauges of replicated state
//! (sessions, held locks, waiters, leaders) are read from the local replicas at scrape time.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

use lockd_core::{LockEvent, WaitEndReason};
use lockd_raft::Node;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    pub op: &'static str,
    pub result: &'static str,
    /// How the request came: `http`, `grpc` (a unary call) or `stream` (the session stream).
    pub api: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpKind {
    pub op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupLabel {
    pub group: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplicaLabel {
    pub group: u32,
    pub node: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReadLabel {
    pub group: u32,
    /// `lease` (answered from the leader lease) or `round` (through a ReadIndex round).
    pub path: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StorageLabel {
    pub group: u32,
    /// `log` or `snapshot`.
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    /// `capture` (the apply task serialises the state) or `write` (to disk, fsync'd).
    pub phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertLabel {
    /// `client`, `client_ca`, `peer` or `peer_ca`: the file given by the matching flag.
    pub cert: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabel {
    pub version: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControlLabel {
    pub control: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PortLabel {
    pub port: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceLabel {
    pub namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NsCause {
    pub namespace: String,
    pub cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NsOutcome {
    pub namespace: String,
    pub outcome: &'static str,
}

/// Counters of what the local replica applied, for metrics.
#[derive(Default, Debug)]
pub struct EffectCounters {
    pub granted_waiters: std::sync::atomic::AtomicU64,
    pub waits_timed_out: std::sync::atomic::AtomicU64,
    pub sessions_expired: std::sync::atomic::AtomicU64,
    pub sessions_closed: std::sync::atomic::AtomicU64,
}

impl EffectCounters {
    /// Counts one applied entry's events. Called on the replica that led the group when it
    /// applied them only, like the contention metrics: every replica applies the same events,
    /// and a per-replica count would be multiplied by the replica count in a cluster-wide sum.
    pub(crate) fn count(&self, events: &[lockd_core::LockEvent]) {
        use lockd_core::LockEvent;
        use std::sync::atomic::Ordering::Relaxed;
        for e in events {
            let counter = match e {
                LockEvent::HoldStarted {
                    waiter: Some(_), ..
                } => &self.granted_waiters,
                LockEvent::WaitEnded {
                    reason: lockd_core::WaitEndReason::TimedOut,
                    ..
                } => &self.waits_timed_out,
                LockEvent::SessionEnded {
                    reason: lockd_core::SessionEndReason::Expired,
                    ..
                } => &self.sessions_expired,
                LockEvent::SessionEnded {
                    reason: lockd_core::SessionEndReason::Closed,
                    ..
                } => &self.sessions_closed,
                _ => continue,
            };
            counter.fetch_add(1, Relaxed);
        }
    }
}

pub struct Metrics {
    registry: Mutex<Registry>,
    /// Contention per namespace, counted from the core's events by each group's leader replica
    /// only (so a cluster's sum over nodes counts each event once; see `lock_events`).
    hold_seconds: Family<NamespaceLabel, Histogram>,
    holds_ended: Family<NsCause, Counter>,
    wait_seconds: Family<NsOutcome, Histogram>,
    lock_delays: Family<NamespaceLabel, Counter>,
    busy: Family<NamespaceLabel, Counter>,
    pub ops: Family<OpLabels, Counter>,
    pub latency: Family<OpKind, Histogram>,
    pub keepalives: Counter,
    /// Time from a log append to its fdatasync completing, all groups.
    pub log_sync: Histogram,
    /// Snapshot making, by phase, all groups.
    pub snapshot_seconds: Family<PhaseLabel, Histogram>,
    /// Each hosted replica's log and snapshot bytes on disk, read at each scrape.
    storage_bytes: Family<StorageLabel, Gauge>,
    /// When each TLS file's first certificate to expire does (Unix seconds), read at start.
    cert_not_after: Family<CertLabel, Gauge>,
    lease_expired: Family<NamespaceLabel, Counter>,
    fencing_rejected: Family<NamespaceLabel, Counter>,
    sessions: Family<GroupLabel, Gauge>,
    held: Family<GroupLabel, Gauge>,
    waiters: Family<GroupLabel, Gauge>,
    revision: Family<GroupLabel, Gauge>,
    is_leader: Family<GroupLabel, Gauge>,
    term: Family<GroupLabel, Gauge>,
    applied_index: Family<GroupLabel, Gauge>,
    /// Linearizable reads each group's replica here answered as leader, by path.
    reads: Family<ReadLabel, Counter>,
    /// On each group's leader: every other member's lag and time since its last contact.
    replica_lag: Family<ReplicaLabel, Gauge>,
    replica_contact: Family<ReplicaLabel, Gauge<f64, AtomicU64>>,
    open_fds: Gauge,
    max_fds: Gauge,
    resident_memory: Gauge,
    leader_changes: Family<GroupLabel, Counter>,
    expired: Counter,
    closed: Counter,
    waits_timed_out: Counter,
    auth_failures: Counter,
    waiters_granted: Counter,
    watches: Gauge,
    watches_too_slow: Counter,
    last_leaders: Mutex<std::collections::HashMap<u32, u64>>,
    client_connections: Family<PortLabel, Gauge>,
    client_connections_max: Family<PortLabel, Gauge>,
    ready: Gauge,
    build_info: Family<BuildLabel, Gauge>,
    negative_controls: Family<ControlLabel, Gauge>,
    client_connections_refused: Family<PortLabel, Counter>,
    /// The client ports' connection caps, read at each scrape.
    caps: Mutex<Vec<crate::conns::ConnCap>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        // 1 ms .. ~9 h: holds last from a blink to a nightly batch.
        let hold = || histogram(0.001, 4.0, 13);
        // 1 ms .. ~262 s: a wait is at most 300 s.
        let wait = || histogram(0.001, 2.0, 19);
        let m = Metrics {
            registry: Mutex::new(Registry::default()),
            hold_seconds: Family::new_with_constructor(hold),
            holds_ended: Family::default(),
            wait_seconds: Family::new_with_constructor(wait),
            lock_delays: Family::default(),
            busy: Family::default(),
            ops: Family::default(),
            // 50 µs .. ~3.3 s
            latency: Family::new_with_constructor(|| histogram(0.000_05, 2.0, 17)),
            keepalives: Counter::default(),
            // 20 µs .. ~1.3 s
            log_sync: histogram(0.000_02, 2.0, 17),
            // 1 ms .. ~65 s
            snapshot_seconds: Family::new_with_constructor(|| histogram(0.001, 2.0, 17)),
            storage_bytes: Family::default(),
            cert_not_after: Family::default(),
            lease_expired: Family::default(),
            fencing_rejected: Family::default(),
            sessions: Family::default(),
            held: Family::default(),
            waiters: Family::default(),
            revision: Family::default(),
            is_leader: Family::default(),
            term: Family::default(),
            applied_index: Family::default(),
            reads: Family::default(),
            replica_lag: Family::default(),
            replica_contact: Family::default(),
            open_fds: Gauge::default(),
            max_fds: Gauge::default(),
            resident_memory: Gauge::default(),
            leader_changes: Family::default(),
            expired: Counter::default(),
            closed: Counter::default(),
            waits_timed_out: Counter::default(),
            auth_failures: Counter::default(),
            waiters_granted: Counter::default(),
            watches: Gauge::default(),
            watches_too_slow: Counter::default(),
            last_leaders: Mutex::default(),
            client_connections: Family::default(),
            client_connections_max: Family::default(),
            ready: Gauge::default(),
            build_info: Family::default(),
            negative_controls: Family::default(),
            client_connections_refused: Family::default(),
            caps: Mutex::default(),
        };
        m.register_all();
        m
    }

    /// Every series in the registry: the process's under their usual names, the rest under
    /// `lockd_`.
    fn register_all(&self) {
        let mut root = self.registry.lock().expect("registry lock");
        self.register_process(&mut root);
        let r = root.sub_registry_with_prefix("lockd");
        self.register_ops(r);
        self.register_outcomes(r);
        self.register_node(r);
        self.register_replication(r);
    }

    /// The process's descriptors and memory, under the names Prometheus's own process
    /// collectors use (`process_open_fds` ...), so the usual panels and alerts apply.
    fn register_process(&self, r: &mut Registry) {
        r.register(
            "process_open_fds",
            "Open file descriptors",
            self.open_fds.clone(),
        );
        r.register(
            "process_max_fds",
            "The open-files limit (RLIMIT_NOFILE, soft)",
            self.max_fds.clone(),
        );
        r.register_with_unit(
            "process_resident_memory",
            "Resident memory",
            prometheus_client::registry::Unit::Bytes,
            self.resident_memory.clone(),
        );
    }

    /// Replication as each group's leader sees it, and how far each replica here applied.
    fn register_replication(&self, r: &mut Registry) {
        r.register(
            "group_applied_index",
            "Index of the last log entry this node's replica of the group applied",
            self.applied_index.clone(),
        );
        r.register(
            "group_reads",
            "Linearizable reads (inspect, check-token, session details) this node answered as \
             the group's leader, for itself or a follower, by path: `lease` (from its leader \
             lease, no round trip) or `round` (a ReadIndex round to a quorum)",
            self.reads.clone(),
        );
        r.register(
            "group_replica_lag_entries",
            "On the group's leader: log entries each other member is behind its last one",
            self.replica_lag.clone(),
        );
        r.register_with_unit(
            "snapshot",
            "Time to make a snapshot, by phase: `capture` (the apply task serialises the \
             state; applies wait meanwhile) and `write` (to disk and fsync'd)",
            prometheus_client::registry::Unit::Seconds,
            self.snapshot_seconds.clone(),
        );
        r.register_with_unit(
            "storage",
            "What each replica on this node keeps on disk: `log` (its log's files, not yet \
             compacted into a snapshot) and `snapshot` (the last one)",
            prometheus_client::registry::Unit::Bytes,
            self.storage_bytes.clone(),
        );
        r.register_with_unit(
            "group_replica_last_contact",
            "On the group's leader: time since each other member answered a heartbeat or an \
             append (a member that never answered this leader is absent)",
            prometheus_client::registry::Unit::Seconds,
            self.replica_contact.clone(),
        );
    }

    /// The operations: their counts, latency, the log's fdatasync, and how holds and waits went.
    fn register_ops(&self, r: &mut Registry) {
        r.register(
            "log_sync_seconds",
            "Time from a Raft log append to its fdatasync completing (queueing included)",
            self.log_sync.clone(),
        );
        r.register(
            "ops",
            "Client operations by kind and result",
            self.ops.clone(),
        );
        r.register(
            "lock_hold_seconds",
            "How long holds lasted, by namespace (group time, at each hold's end)",
            self.hold_seconds.clone(),
        );
        r.register(
            "lock_holds_ended",
            "Holds ended, by namespace and cause (release, close, expire, dropped)",
            self.holds_ended.clone(),
        );
        r.register(
            "lock_wait_seconds",
            "How long queued acquires waited, by namespace and outcome (granted, timed_out, session_ended, moved)",
            self.wait_seconds.clone(),
        );
        r.register(
            "lock_delays_applied",
            "Lock-delays set on a name because its holder's session expired, by namespace",
            self.lock_delays.clone(),
        );
        r.register(
            "acquire_busy",
            "Try-locks (and waits of 0) that found the name taken or in lock-delay, by namespace",
            self.busy.clone(),
        );
        r.register(
            "op_duration_seconds",
            "Client operation latency",
            self.latency.clone(),
        );
        r.register(
            "keepalives",
            "Session keepalives received",
            self.keepalives.clone(),
        );
    }

    /// What clients and leaders report: leases run out, fencing rejections, sessions and waits ended.
    fn register_outcomes(&self, r: &mut Registry) {
        r.register(
            "lease_expired_while_holding",
            "Clients reporting that a lease ran out while they still worked (each one is a fencing check that saved you)",
            self.lease_expired.clone(),
        );
        r.register(
            "fencing_rejections",
            "Writes a fenced resource refused because a newer holder's token had reached it, as clients report them: stale holders that fencing stopped",
            self.fencing_rejected.clone(),
        );
        r.register(
            "sessions",
            "Live sessions per group (local replica)",
            self.sessions.clone(),
        );
        r.register(
            "held_locks",
            "Held locks per group (local replica)",
            self.held.clone(),
        );
        r.register(
            "waiters",
            "Queued acquires per group (local replica)",
            self.waiters.clone(),
        );
        r.register(
            "revision",
            "Revision (latest fencing token) per group",
            self.revision.clone(),
        );
        r.register(
            "group_is_leader",
            "1 if this node leads the group",
            self.is_leader.clone(),
        );
        r.register("group_term", "Raft term per group", self.term.clone());
        r.register(
            "leader_changes",
            "Leader changes seen per group",
            self.leader_changes.clone(),
        );
        r.register(
            "sessions_expired",
            "Sessions expired, counted by the leader of each group that expired them",
            self.expired.clone(),
        );
        r.register(
            "sessions_closed",
            "Sessions closed, counted by the leader of each group the session was in",
            self.closed.clone(),
        );
        r.register(
            "waits_timed_out",
            "Queued acquires that timed out, counted by their group's leader",
            self.waits_timed_out.clone(),
        );
        r.register(
            "waiters_granted",
            "Queued acquires granted, counted by their group's leader",
            self.waiters_granted.clone(),
        );
    }

    /// This node: watches, connections, readiness and version.
    fn register_node(&self, r: &mut Registry) {
        r.register(
            "watches",
            "Watches open on this node (SSE and gRPC)",
            self.watches.clone(),
        );
        r.register(
            "watches_too_slow",
            "Watches this node cut off for falling more than 4096 entries behind",
            self.watches_too_slow.clone(),
        );
        r.register(
            "client_connections",
            "Connections open on each client port (--max-client-connections caps it)",
            self.client_connections.clone(),
        );
        r.register(
            "auth_failures",
            "Calls refused for a missing or wrong bearer token (401 or 403); an address \
             that fails too often is answered 429 before its token is checked",
            self.auth_failures.clone(),
        );
        r.register(
            "client_connections_max",
            "The cap on each client port's open connections (--max-client-connections)",
            self.client_connections_max.clone(),
        );
        r.register(
            "ready",
            "1 while the node is ready (what GET /readyz and gRPC health say), else 0",
            self.ready.clone(),
        );
        self.build_info
            .get_or_create(&BuildLabel {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        r.register(
            "tls_cert_not_after_timestamp_seconds",
            "When the first certificate to expire in each TLS file this node serves with \
             does (Unix time; read at start, so a renewed file counts after a restart)",
            self.cert_not_after.clone(),
        );
        r.register(
            "build_info",
            "Always 1; the lockd version as a label",
            self.build_info.clone(),
        );
        r.register(
            "unsafe_negative_control",
            "1 for each negative control (lockd-check's sabotage) this node runs with: such a \
             node is UNSAFE; no series in any normal node",
            self.negative_controls.clone(),
        );
        r.register(
            "client_connections_refused",
            "Connections refused at a client port's cap",
            self.client_connections_refused.clone(),
        );
    }

    /// Records when the certificates of the TLS file `cert` (PEM) expire: the earliest
    /// `notAfter` among them. A file that holds no certificate records nothing.
    pub fn record_cert(&self, cert: &'static str, pem: &[u8]) {
        if let Some(t) = crate::tls::earliest_not_after(pem) {
            self.cert_not_after
                .get_or_create(&CertLabel { cert })
                .set(t);
        }
    }

    /// Records one finished operation that came by `api` (`http`, `grpc`, `stream`).
    pub fn record(
        &self,
        api: &'static str,
        op: &'static str,
        result: &'static str,
        took: Duration,
    ) {
        self.ops.get_or_create(&OpLabels { op, result, api }).inc();
        self.latency
            .get_or_create(&OpKind { op })
            .observe(took.as_secs_f64());
    }

    /// Exports `cap`'s open and refused connections from now on (both at 0 until used, so
    /// `rate()` and alerts work from the start).
    pub fn watch_connections(&self, cap: &crate::conns::ConnCap) {
        let l = PortLabel { port: cap.port() };
        let _ = self.client_connections.get_or_create(&l);
        self.client_connections_max
            .get_or_create(&l)
            .set(cap.max() as i64);
        let _ = self.client_connections_refused.get_or_create(&l);
        self.caps.lock().expect("caps lock").push(cap.clone());
    }

    /// Counts contention from the events of one applied entry. Called only on the replica that
    /// led the group when it applied the entry: every replica applies the same events, and a
    /// per-replica count would be multiplied by the replica count in a cluster-wide sum.
    pub fn lock_events(&self, namespace_of: impl Fn(&str) -> String, events: &[LockEvent]) {
        let ns = |name: &str| NamespaceLabel {
            namespace: namespace_of(name),
        };
        for e in events {
            match e {
                LockEvent::HoldStarted {
                    name,
                    waiter: Some(_),
                    waited_ms,
                    ..
                } => self
                    .wait_seconds
                    .get_or_create(&NsOutcome {
                        namespace: namespace_of(name),
                        outcome: "granted",
                    })
                    .observe(*waited_ms as f64 / 1000.0),
                LockEvent::HoldEnded {
                    name,
                    cause,
                    held_ms,
                    lock_delay_until_ms,
                    ..
                } => {
                    let l = ns(name);
                    self.hold_seconds
                        .get_or_create(&l)
                        .observe(*held_ms as f64 / 1000.0);
                    let cause = cause.as_str();
                    if *lock_delay_until_ms != 0 {
                        self.lock_delays.get_or_create(&l).inc();
                    }
                    self.holds_ended
                        .get_or_create(&NsCause {
                            namespace: l.namespace,
                            cause,
                        })
                        .inc();
                }
                LockEvent::WaitEnded {
                    name,
                    reason,
                    waited_ms,
                    ..
                } => {
                    let outcome = match reason {
                        WaitEndReason::TimedOut => "timed_out",
                        WaitEndReason::SessionEnded => "session_ended",
                        WaitEndReason::Moved => "moved",
                    };
                    self.wait_seconds
                        .get_or_create(&NsOutcome {
                            namespace: namespace_of(name),
                            outcome,
                        })
                        .observe(*waited_ms as f64 / 1000.0);
                }
                _ => {}
            }
        }
    }

    /// A try-lock (or a wait of 0) found `namespace`'s name taken or in lock-delay.
    pub fn acquire_busy(&self, namespace: String) {
        self.busy.get_or_create(&NamespaceLabel { namespace }).inc();
    }

    /// A credential check failed (401 or 403).
    pub fn auth_failed(&self) {
        self.auth_failures.inc();
    }

    pub fn fencing_rejected(&self, namespace: &str) {
        self.fencing_rejected
            .get_or_create(&NamespaceLabel {
                namespace: namespace.to_string(),
            })
            .inc();
    }

    pub fn lease_expired_while_holding(&self, namespace: &str) {
        self.lease_expired
            .get_or_create(&NamespaceLabel {
                namespace: namespace.to_string(),
            })
            .inc();
    }

    /// Watches leaders so changes are counted even between scrapes; returns the groups whose
    /// leader changed since the last call.
    pub fn observe_leaders(&self, node: &Node) -> Vec<u32> {
        let mut changed = Vec::new();
        let mut last = self.last_leaders.lock().expect("leaders lock");
        for id in node.group_ids() {
            let Some(g) = node.group(id) else { continue };
            let Some(leader) = g.status().leader else {
                continue;
            };
            // Keyed by group id, not indexed by it: ids are sparse and up to u32::MAX.
            if last
                .insert(id, leader)
                .is_some_and(|before| before != leader)
            {
                self.leader_changes
                    .get_or_create(&GroupLabel { group: id })
                    .inc();
                changed.push(id);
            }
        }
        changed
    }

    /// Whether the node is ready (`Service::not_ready`), for `lockd_ready`.
    pub fn set_ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    /// The text exposition, with gauges refreshed from the local replicas, the applied-effect
    /// `counters` and the watch hub.
    pub fn render(
        &self,
        node: &Node,
        counters: &EffectCounters,
        watch: &crate::watches::Hub,
    ) -> String {
        self.observe_leaders(node);
        for control in node.negative_controls() {
            self.negative_controls
                .get_or_create(&ControlLabel { control })
                .set(1);
        }
        for id in node.group_ids() {
            let Some(g) = node.group(id) else { continue };
            let l = GroupLabel { group: id };
            let stats = g.read_local(|t| t.stats());
            let status = g.status();
            self.sessions.get_or_create(&l).set(stats.sessions as i64);
            self.held.get_or_create(&l).set(stats.holds as i64);
            self.waiters.get_or_create(&l).set(stats.waiters as i64);
            self.revision.get_or_create(&l).set(stats.revision as i64);
            self.is_leader.get_or_create(&l).set(g.is_leader() as i64);
            self.term.get_or_create(&l).set(status.term as i64);
            self.applied_index
                .get_or_create(&l)
                .set(status.applied_index as i64);
            for (path, n) in [("lease", status.lease_reads), ("round", status.round_reads)] {
                sync(&self.reads.get_or_create(&ReadLabel { group: id, path }), n);
            }
            if let Some(disk) = node.disk_usage(id) {
                for (kind, bytes) in [("log", disk.log_bytes), ("snapshot", disk.snapshot_bytes)] {
                    self.storage_bytes
                        .get_or_create(&StorageLabel { group: id, kind })
                        .set(i64::try_from(bytes).unwrap_or(i64::MAX));
                }
            }
        }
        self.observe_replication(node);
        self.observe_process();
        for cap in self.caps.lock().expect("caps lock").iter() {
            let l = PortLabel { port: cap.port() };
            self.client_connections
                .get_or_create(&l)
                .set(cap.open() as i64);
            sync(
                &self.client_connections_refused.get_or_create(&l),
                cap.refused(),
            );
        }
        let c = counters;
        sync(&self.expired, c.sessions_expired.load(Relaxed));
        sync(&self.closed, c.sessions_closed.load(Relaxed));
        sync(&self.waits_timed_out, c.waits_timed_out.load(Relaxed));
        sync(&self.waiters_granted, c.granted_waiters.load(Relaxed));
        self.watches.set(watch.open_watches() as i64);
        sync(&self.watches_too_slow, watch.cut_off_too_slow());
        let mut out = String::new();
        encode(&mut out, &self.registry.lock().expect("registry lock"))
            .expect("encoding to a String cannot fail");
        out
    }
}

impl Metrics {
    /// Each group this node leads: every other member's lag and last contact. A group it no
    /// longer leads leaves no series behind (its new leader reports them).
    fn observe_replication(&self, node: &Node) {
        self.replica_lag.clear();
        self.replica_contact.clear();
        for id in node.group_ids() {
            let Some(g) = node.group(id).filter(|g| g.is_leader()) else {
                continue;
            };
            let m = g.membership();
            for (&member, lag) in &m.lag {
                let l = ReplicaLabel {
                    group: id,
                    node: member,
                };
                if let Some(lag) = lag {
                    self.replica_lag.get_or_create(&l).set(*lag as i64);
                }
                if let Some(Some(d)) = m.last_contact.get(&member) {
                    self.replica_contact.get_or_create(&l).set(d.as_secs_f64());
                }
            }
        }
    }

    /// Open descriptors, their limit and resident memory (Linux's /proc; absent elsewhere).
    fn observe_process(&self) {
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            self.open_fds.set(dir.count() as i64);
        }
        if let Ok((soft, _)) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        {
            self.max_fds.set(i64::try_from(soft).unwrap_or(i64::MAX));
        }
        // "VmRSS:   123456 kB"
        let rss_kb = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
                line.split_whitespace().nth(1)?.parse::<i64>().ok()
            });
        if let Some(kb) = rss_kb {
            self.resident_memory.set(kb * 1024);
        }
    }
}

/// A histogram of `n` buckets from `start`, each `factor` times the one before.
fn histogram(start: f64, factor: f64, n: u16) -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        start, factor, n,
    ))
}

/// Brings a counter up to a total kept elsewhere.
fn sync(counter: &Counter, total: u64) {
    let now = counter.get();
    if total > now {
        counter.inc_by(total - now);
    }
}
