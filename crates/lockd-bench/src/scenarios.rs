//! lockd-only workloads that need more than the `LockTarget` trait: one hot lock with a queue
//! of blocking waiters, and failover (SIGKILL a group leader, time to the next acquire).
//!
//! Both speak gRPC unary calls, the way users deploy lockd. Every loop is bounded by a deadline
//! and an iteration count.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use lockd_core::ShardMap;
use lockd_proto::v1 as pb;
use lockd_proto::v1::lock_client::LockClient;
use tokio::task::JoinSet;
use tokio::time::{sleep, sleep_until, timeout, Instant};
use tonic::transport::Channel;

use crate::lockd::{grpc_connect, grpc_session, Cluster, Routing};
use crate::procs::cpu_secs;

const TTL: Duration = Duration::from_secs(15);
/// How long one blocking acquire of the hot lock may wait in the queue.
const HOT_WAIT_MS: u64 = 20_000;
/// What a client allows one request in a failover before it gives up and retries: short, so
/// the measured gap is the cluster's, not a client's patience (an idle acquire takes ~ms).
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(250);
/// Pause between failed attempts (lockd suggests 1 s in Retry-After; we measure the cluster,
/// not a client's back-off policy).
const RETRY_PAUSE: Duration = Duration::from_millis(10);
/// Under load, how long the load runs on a healthy cluster before each kill.
const LOAD_SETTLE: Duration = Duration::from_secs(2);
/// A restarted replica counts as caught up within this many entries of the best one.
const CATCH_UP_SLACK: u64 = 100;

fn servers_cpu(cluster: &Cluster) -> f64 {
    cluster.pids().iter().map(|&p| cpu_secs(Some(p))).sum()
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// What the hot-lock run measured.
pub struct HotLock {
    pub routing: Routing,
    pub waiters: usize,
    pub handoffs_per_s: f64,
    /// Release sent by the holder → grant received by the next waiter, in µs.
    pub overhead: Histogram<u64>,
    pub errors: u64,
    pub cpu_servers_pct: f64,
}

impl HotLock {
    pub fn line(&self) -> String {
        let h = &self.overhead;
        format!(
            "hot lock, {} blocking waiters ({:?}): {:.0} hand-offs/s; overhead per hand-off \
             (release sent -> next grant received) p50 {:.2} ms, p99 {:.2} ms, p999 {:.2} ms \
             over {} hand-offs; {} errors; servers cpu {:.0}%",
            self.waiters,
            self.routing,
            self.handoffs_per_s,
            ms(h.value_at_quantile(0.5)),
            ms(h.value_at_quantile(0.99)),
            ms(h.value_at_quantile(0.999)),
            h.len(),
            self.errors,
            self.cpu_servers_pct,
        )
    }
}

/// `waiters` clients (spread over the nodes, or all on the name's group leader) each loop:
/// acquire the one name with a long wait, and release as soon as it is granted.
pub async fn hot_lock(
    cluster: &Cluster,
    routing: Routing,
    waiters: usize,
    dur: Duration,
) -> Result<HotLock> {
    let name = "lockd-bench/hot";
    let addrs = cluster.grpc_addrs();
    let leader =
        cluster.leaders().await?[ShardMap::initial(cluster.groups()).group_of(name) as usize];
    let mut clients = Vec::new();
    for id in 0..waiters {
        let node = match routing {
            Routing::Spread => id % addrs.len(),
            Routing::Leader => leader,
        };
        let mut c = grpc_connect(addrs[node]).await?;
        let session = grpc_session(&mut c, &format!("hot-{id}"), TTL).await?;
        clients.push((c, session));
    }
    let released_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let start = Instant::now() + Duration::from_millis(50);
    let end = start + dur;
    sleep_until(start).await;
    let cpu0 = servers_cpu(cluster);
    let mut set = JoinSet::new();
    for (id, (mut c, session)) in clients.into_iter().enumerate() {
        let released_at = released_at.clone();
        set.spawn(async move {
            let (mut h, mut grants, mut errors) = (hist(), 0u64, 0u64);
            for _ in 0..1_000_000 {
                let req = pb::AcquireRequest {
                    session_id: session.clone(),
                    name: name.into(),
                    owner: format!("hot-{id}"),
                    wait_ms: HOT_WAIT_MS,
                    ..Default::default()
                };
                let r = match c.acquire(req).await {
                    Ok(r) => r.into_inner(),
                    Err(_) => {
                        errors += 1;
                        sleep(RETRY_PAUSE).await;
                        continue;
                    }
                };
                let now = Instant::now();
                if !r.acquired {
                    errors += 1; // the wait ran out: the queue did not move for 20 s
                    continue;
                }
                let prev = released_at.lock().expect("not poisoned").take();
                if now <= end {
                    grants += 1;
                    if let Some(t) = prev {
                        h.saturating_record(now.duration_since(t).as_micros().max(1) as u64);
                    }
                }
                *released_at.lock().expect("not poisoned") = Some(Instant::now());
                let rel = pb::ReleaseRequest {
                    session_id: session.clone(),
                    name: name.into(),
                    fencing_token: r.fencing_token,
                    ..Default::default()
                };
                if c.release(rel).await.is_err() {
                    errors += 1;
                }
                if Instant::now() >= end {
                    break;
                }
            }
            let _ = c
                .close_session(pb::CloseSessionRequest {
                    session_id: session,
                })
                .await;
            (h, grants, errors)
        });
    }
    let (mut overhead, mut grants, mut errors) = (hist(), 0, 0);
    while let Some(j) = set.join_next().await {
        let (h, g, e) = j?;
        overhead.add(&h).expect("same bounds");
        grants += g;
        errors += e;
    }
    let cpu1 = servers_cpu(cluster);
    let secs = dur.as_secs_f64();
    Ok(HotLock {
        routing,
        waiters,
        handoffs_per_s: grants as f64 / secs,
        overhead,
        errors,
        cpu_servers_pct: 100.0 * (cpu1 - cpu0) / start.elapsed().as_secs_f64(),
    })
}

/// What the failover run measured.
pub struct Failover {
    /// How the leader was stopped: SIGKILL (a crash) or SIGTERM (a graceful leave).
    pub graceful: bool,
    /// Stopping the probe group's leader → the next successful acquire in that group.
    pub times: Vec<Duration>,
    /// Restart of the killed node → it has caught up in every group.
    pub catch_up: Vec<Duration>,
    /// Background load: clients, successful ops, failed ops, seconds.
    pub load: Option<(usize, u64, u64, f64)>,
}

/// The nearest-rank quantile of `v` (sorted here).
fn quantile(v: &[Duration], q: f64) -> Duration {
    let mut s = v.to_vec();
    s.sort();
    let i = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len().max(1)) - 1;
    s.get(i).copied().unwrap_or_default()
}

impl Failover {
    pub fn line(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let load = match self.load {
            Some((c, ok, err, secs)) => format!(
                "under load ({c} clients cycling, 2 s healthy before each kill: {:.0} ok ops/s \
                 averaged over the run, outages included; {err} failed requests)",
                ok as f64 / secs
            ),
            None => "idle cluster".into(),
        };
        format!(
            "failover, {load}, {} trials: {} leader -> next acquire p50 {:.0} ms, \
             p99 {:.0} ms, max {:.0} ms; restart -> caught up p50 {:.0} ms, max {:.0} ms",
            self.times.len(),
            if self.graceful { "SIGTERM" } else { "SIGKILL" },
            ms(quantile(&self.times, 0.5)),
            ms(quantile(&self.times, 0.99)),
            ms(quantile(&self.times, 1.0)),
            ms(quantile(&self.catch_up, 0.5)),
            ms(quantile(&self.catch_up, 1.0)),
        )
    }
}

/// Fresh names that all fall into one group.
struct NamesIn {
    shards: ShardMap,
    group: u32,
    prefix: String,
    next: u64,
}

impl Iterator for NamesIn {
    type Item = String;
    fn next(&mut self) -> Option<String> {
        loop {
            self.next += 1;
            let n = format!("{}/{}", self.prefix, self.next);
            if self.shards.group_of(&n) == self.group {
                return Some(n);
            }
        }
    }
}

/// Try-locks fresh names through `c` until one is acquired (and released), retrying after
/// errors. Returns the attempts and why the first one failed, if it did. Bounded by `deadline`.
async fn acquire_once(
    c: &mut LockClient<Channel>,
    session: &str,
    names: &mut NamesIn,
    deadline: Instant,
) -> Result<(u32, Option<String>)> {
    let mut first_error = None;
    for attempt in 1.. {
        if Instant::now() >= deadline {
            bail!("no acquire succeeded in {attempt} attempts");
        }
        let name = names.next().expect("endless");
        let req = pb::AcquireRequest {
            session_id: session.to_owned(),
            name: name.clone(),
            owner: "failover-probe".into(),
            ..Default::default()
        };
        let t = Instant::now();
        let err = match timeout(ATTEMPT_TIMEOUT, c.acquire(req)).await {
            Ok(Ok(r)) if r.get_ref().acquired => {
                let rel = pb::ReleaseRequest {
                    session_id: session.to_owned(),
                    name,
                    fencing_token: r.get_ref().fencing_token,
                    ..Default::default()
                };
                let _ = timeout(ATTEMPT_TIMEOUT, c.release(rel)).await;
                return Ok((attempt, first_error));
            }
            Ok(Ok(_)) => bail!("a fresh name was taken"),
            Ok(Err(s)) => format!(
                "{:?} after {:.0} ms: {}",
                s.code(),
                ms_since(t),
                s.message()
            ),
            Err(_) => format!("no reply in {ATTEMPT_TIMEOUT:?}"),
        };
        first_error.get_or_insert(err);
        sleep(RETRY_PAUSE).await;
    }
    unreachable!("the loop returns")
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

/// Background load for a failover: each client cycles acquire/release on fresh names through
/// its node, retrying on errors, until `stop`.
fn spawn_load(
    cluster: &Cluster,
    clients: usize,
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
) -> JoinSet<()> {
    let addrs = cluster.grpc_addrs();
    let mut set = JoinSet::new();
    for id in 0..clients {
        let addr = addrs[id % addrs.len()];
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        set.spawn(async move {
            let mut c = None;
            let mut session = None;
            let mut kept = Instant::now();
            for i in 0..u64::MAX {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                // (Re)connect, (re)open the session, keep it alive every TTL/3.
                let r = timeout(ATTEMPT_TIMEOUT * 2, async {
                    if c.is_none() {
                        c = Some(grpc_connect(addr).await?);
                    }
                    let c = c.as_mut().expect("connected");
                    if session.is_none() {
                        session = Some(grpc_session(c, &format!("load-{id}"), TTL).await?);
                        kept = Instant::now();
                    }
                    let s = session.clone().expect("opened");
                    if kept.elapsed() > TTL / 3 {
                        let ka = c.keep_alive(pb::KeepAliveRequest {
                            session_id: s.clone(),
                            ..Default::default()
                        });
                        if let Err(e) = ka.await {
                            if e.code() == tonic::Code::NotFound {
                                session = None;
                            }
                            bail!(e);
                        }
                        kept = Instant::now();
                    }
                    let req = pb::AcquireRequest {
                        session_id: s.clone(),
                        name: format!("lockd-bench/load/{id}/{i}"),
                        owner: "load".into(),
                        ..Default::default()
                    };
                    let r = c.acquire(req).await?.into_inner();
                    if !r.acquired {
                        return Ok(1);
                    }
                    let rel = pb::ReleaseRequest {
                        session_id: s,
                        name: format!("lockd-bench/load/{id}/{i}"),
                        fencing_token: r.fencing_token,
                        ..Default::default()
                    };
                    c.release(rel).await?;
                    Ok::<u64, anyhow::Error>(2)
                })
                .await;
                match r {
                    Ok(Ok(n)) => {
                        ok.fetch_add(n, Ordering::Relaxed);
                    }
                    other => {
                        if failed.load(Ordering::Relaxed) < 3 {
                            let why = match other {
                                Ok(Err(e)) => format!("{e:#}"),
                                _ => "timed out".into(),
                            };
                            eprintln!(
                                "  load client {id} (errors expected while a node is down): {why}"
                            );
                        }
                        failed.fetch_add(1, Ordering::Relaxed);
                        sleep(RETRY_PAUSE).await;
                    }
                }
            }
        });
    }
    set
}

/// `trials` times: SIGKILL (or with `graceful`, SIGTERM) the leader of the probe name's group, time the next successful
/// acquire in that group through a surviving node, restart the killed node and wait until it
/// has caught up. With `load_clients > 0`, a background load runs throughout.
pub async fn failover(
    cluster: &mut Cluster,
    trials: usize,
    load_clients: usize,
    graceful: bool,
) -> Result<Failover> {
    if cluster.size() < 3 {
        bail!("failover needs at least 3 nodes");
    }
    let shards = ShardMap::initial(cluster.groups());
    let group = shards.group_of("lockd-bench/failover/probe");
    let addrs = cluster.grpc_addrs();
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut load = spawn_load(
        cluster,
        load_clients,
        stop.clone(),
        ok.clone(),
        failed.clone(),
    );
    let started = Instant::now();
    let mut out = Failover {
        graceful,
        times: Vec::new(),
        catch_up: Vec::new(),
        load: None,
    };
    let result: Result<()> = async {
        for trial in 0..trials {
            let victim = cluster.leaders().await?[group as usize];
            let survivor = (victim + 1) % cluster.size();
            let mut c = grpc_connect(addrs[survivor]).await?;
            let session = grpc_session(&mut c, "failover-probe", TTL).await?;
            let mut names = NamesIn {
                shards: shards.clone(),
                group,
                prefix: format!("lockd-bench/failover/{trial}"),
                next: 0,
            };
            // The path works before the crash.
            acquire_once(
                &mut c,
                &session,
                &mut names,
                Instant::now() + Duration::from_secs(10),
            )
            .await
            .context("acquire before the kill")?;
            if load_clients > 0 {
                sleep(LOAD_SETTLE).await; // the load runs on a healthy cluster before each kill
            }
            let t0 = Instant::now();
            let leaving = if graceful {
                Some(cluster.terminate(victim)?)
            } else {
                cluster.kill(victim)?;
                None
            };
            let (attempts, why) =
                acquire_once(&mut c, &session, &mut names, t0 + Duration::from_secs(60)).await?;
            let took = t0.elapsed();
            if let Some(s) = leaving {
                s.wait_exit();
            }
            let _ = c
                .close_session(pb::CloseSessionRequest {
                    session_id: session,
                })
                .await;
            let t1 = Instant::now();
            cluster.restart(victim, CATCH_UP_SLACK).await?;
            let caught = t1.elapsed();
            eprintln!(
                "  trial {}/{trials}: stopped node {} (leader of group {group}): next acquire after \
                 {:.0} ms ({attempts} attempts; first failed: {}); caught up {:.0} ms after \
                 restart",
                trial + 1,
                victim + 1,
                took.as_secs_f64() * 1000.0,
                why.as_deref().unwrap_or("-"),
                caught.as_secs_f64() * 1000.0
            );
            out.times.push(took);
            out.catch_up.push(caught);
            // The group goes back to its preferred leader once the restarted node has the
            // whole log; the next trial starts from that state, not during the hand-off.
            cluster.wait_balanced().await;
        }
        Ok(())
    }
    .await;
    stop.store(true, Ordering::Relaxed);
    while load.join_next().await.is_some() {}
    result?;
    if load_clients > 0 {
        out.load = Some((
            load_clients,
            ok.load(Ordering::Relaxed),
            failed.load(Ordering::Relaxed),
            started.elapsed().as_secs_f64(),
        ));
    }
    Ok(out)
}

/// What keeping many sessions alive costs: CPU per node and bytes written to disk.
pub struct SessionLoad {
    /// How the keepalives travelled.
    pub via: KeepaliveVia,
    pub sessions: usize,
    pub open_secs: f64,
    pub keepalives: u64,
    pub errors: u64,
    pub window_secs: f64,
    /// Per node: (node index, % of one core idle, % of one core during keepalives, bytes written
    /// to storage during keepalives).
    pub nodes: Vec<(usize, f64, f64, u64)>,
    /// The node that leads every lock group (all of them do, today, on a fresh cluster).
    pub leaders: Vec<usize>,
    pub bench_cpu_pct: f64,
}

impl SessionLoad {
    pub fn line(&self) -> String {
        let per_node: Vec<String> = self
            .nodes
            .iter()
            .map(|(i, idle, busy, w)| {
                let role = if self.leaders.contains(i) {
                    " (leader)"
                } else {
                    ""
                };
                format!(
                    "node {}{role}: cpu {busy:.1}% of a core (idle {idle:.1}%), disk writes {w} B",
                    i + 1
                )
            })
            .collect();
        format!(
            "{} sessions opened in {:.1} s; {} keepalives {} over {:.0} s ({:.0}/s, each fanned out to every group's leader), {} errors; {}; load generator cpu {:.0}%",
            self.sessions,
            self.open_secs,
            self.keepalives,
            self.via.describe(),
            self.window_secs,
            self.keepalives as f64 / self.window_secs,
            self.errors,
            per_node.join("; "),
            self.bench_cpu_pct,
        )
    }
}

/// Bytes a process has caused to be written to storage (`/proc/PID/io` write_bytes; root).
fn write_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("write_bytes:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// One gRPC client per node, in node order.
pub async fn connect_all(cluster: &Cluster) -> Result<Vec<LockClient<Channel>>> {
    let mut clients = Vec::new();
    for a in cluster.grpc_addrs() {
        clients.push(grpc_connect(a).await?);
    }
    Ok(clients)
}

/// Opens `n` sessions of `ttl`, session `i` through node `i % nodes` (`clients` holds one client
/// per node), 64 requests in flight. Returns `(node index, session id)` in session order.
pub async fn open_sessions(
    clients: &[LockClient<Channel>],
    n: usize,
    ttl: Duration,
) -> Result<Vec<(usize, String)>> {
    let mut sessions: Vec<(usize, (usize, String))> = Vec::with_capacity(n);
    let mut set = JoinSet::new();
    for i in 0..n {
        if set.len() >= 64 {
            if let Some(r) = set.join_next().await {
                sessions.push(r??);
            }
        }
        let node = i % clients.len();
        let mut c = clients[node].clone();
        set.spawn(async move {
            let id = grpc_session(&mut c, &format!("s{i}"), ttl).await?;
            Ok::<_, anyhow::Error>((i, (node, id)))
        });
    }
    while let Some(r) = set.join_next().await {
        sessions.push(r??);
    }
    sessions.sort_by_key(|(i, _)| *i);
    Ok(sessions.into_iter().map(|(_, s)| s).collect())
}

/// Keepalives for many sessions: each session once per `period`, spread evenly over it, sent
/// through the node it was opened on, by `lanes` concurrent senders. Runs until `stop` or its
/// deadline.
pub struct Keepalives {
    pub sent: Arc<AtomicU64>,
    pub errors: Arc<AtomicU64>,
    /// Keepalives answered NotFound: the session had expired (its locks are gone).
    pub expired: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    senders: JoinSet<()>,
}

impl Keepalives {
    pub fn spawn(
        clients: &[LockClient<Channel>],
        sessions: Arc<Vec<(usize, String)>>,
        period: Duration,
        lanes: usize,
        deadline: Instant,
    ) -> Keepalives {
        let sent = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let expired = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let mut senders = JoinSet::new();
        for lane in 0..lanes {
            let (sessions, clients, sent, errors, expired, stop) = (
                sessions.clone(),
                clients.to_vec(),
                sent.clone(),
                errors.clone(),
                expired.clone(),
                stop.clone(),
            );
            senders.spawn(async move {
                let mine: Vec<usize> = (lane..sessions.len()).step_by(lanes).collect();
                let gap = period / mine.len().max(1) as u32;
                // Lanes start a fraction of a gap apart, so keepalives arrive evenly, as from
                // unsynchronised clients, not in bursts of one per lane.
                let mut next = Instant::now() + gap.mul_f64(lane as f64 / lanes as f64);
                // Bounded by the deadline; the round count only guards against a zero period.
                let rounds = 1 + deadline.saturating_duration_since(next).as_millis() as u64
                    / period.as_millis().max(1) as u64;
                'outer: for _ in 0..rounds {
                    for &k in &mine {
                        if stop.load(Ordering::Relaxed) || Instant::now() >= deadline {
                            break 'outer;
                        }
                        sleep_until(next).await;
                        next += gap;
                        let (node, id) = &sessions[k];
                        let mut c = clients[*node].clone();
                        let r = timeout(
                            Duration::from_secs(5),
                            c.keep_alive(pb::KeepAliveRequest {
                                session_id: id.clone(),
                                ..Default::default()
                            }),
                        )
                        .await;
                        sent.fetch_add(1, Ordering::Relaxed);
                        match r {
                            Ok(Ok(_)) => {}
                            Ok(Err(s)) if s.code() == tonic::Code::NotFound => {
                                expired.fetch_add(1, Ordering::Relaxed);
                                errors.fetch_add(1, Ordering::Relaxed);
                            }
                            _ => {
                                errors.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
            });
        }
        Keepalives {
            sent,
            errors,
            expired,
            stop,
            senders,
        }
    }

    /// Stops every sender now.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.senders.abort_all();
    }
}

/// Opens `n` sessions (TTL `ttl`, spread over the nodes), then sends each a keepalive every
/// TTL/3 for `window`, and compares every node's CPU and disk writes with an idle window of the
/// same length taken before the sessions existed. Keepalives must cost CPU on the group leaders
/// and write nothing to the log.
/// How a session load sends its keepalives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeepaliveVia {
    /// One `Session` stream per session, as lockd-client keeps a process's session (the open
    /// and every keepalive are messages on it), `per_conn` streams sharing a connection.
    Stream { per_conn: usize },
    /// A unary `KeepAlive` call each, over one connection per node (what the HTTP API and a
    /// stream-less client pay per call).
    Unary,
}

impl KeepaliveVia {
    fn describe(self) -> String {
        match self {
            KeepaliveVia::Stream { per_conn } => {
                format!("on session streams ({per_conn} per connection)")
            }
            KeepaliveVia::Unary => "as unary calls (one connection per node)".into(),
        }
    }
}

/// Sessions each carried by its own `Session` stream, kept alive every `period` (spread evenly
/// over it) until stopped or past the deadline.
struct StreamSessions {
    sent: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    tasks: JoinSet<()>,
}

impl StreamSessions {
    /// Opens `n` sessions of `ttl`, session `i` through node `i % nodes`, on new connections of
    /// `per_conn` streams each; returns once every open was answered.
    async fn open(
        cluster: &Cluster,
        n: usize,
        per_conn: usize,
        ttl: Duration,
        period: Duration,
        deadline: Instant,
    ) -> Result<StreamSessions> {
        let addrs = cluster.grpc_addrs();
        // Per node, enough connections for its share of the sessions.
        let mut channels: Vec<Vec<LockClient<Channel>>> = Vec::new();
        for (node, addr) in addrs.iter().enumerate() {
            let share = n / addrs.len() + usize::from(node < n % addrs.len());
            let mut conns = Vec::new();
            for _ in 0..share.div_ceil(per_conn) {
                conns.push(grpc_connect(*addr).await?);
            }
            channels.push(conns);
        }
        let sent = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = JoinSet::new();
        let mut opened = JoinSet::new();
        let start = Instant::now();
        for i in 0..n {
            let (node, j) = (i % addrs.len(), i / addrs.len());
            let c = channels[node][j / per_conn].clone();
            let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
            let first = start + period.mul_f64(i as f64 / n.max(1) as f64);
            let (sent, errors, stop) = (sent.clone(), errors.clone(), stop.clone());
            tasks.spawn(async move {
                let run =
                    stream_session(c, i, ttl, first, period, deadline, ready_tx, &sent, &stop);
                if run.await.is_err() {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            });
            opened.spawn(ready_rx);
            // Bound the opens in flight, as the unary path does.
            if opened.len() >= 256 {
                if let Some(r) = opened.join_next().await {
                    r?.context("a session stream ended before its open was answered")??;
                }
            }
        }
        while let Some(r) = opened.join_next().await {
            r?.context("a session stream ended before its open was answered")??;
        }
        Ok(StreamSessions {
            sent,
            errors,
            stop,
            tasks,
        })
    }

    async fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.tasks.shutdown().await;
    }
}

/// One session on its own stream: open, then a keepalive every `period` from `first`, each
/// answer awaited before the next is sent. `ready` gets the open's outcome.
#[allow(clippy::too_many_arguments)]
async fn stream_session(
    mut c: LockClient<Channel>,
    i: usize,
    ttl: Duration,
    first: Instant,
    period: Duration,
    deadline: Instant,
    ready: tokio::sync::oneshot::Sender<Result<()>>,
    sent: &AtomicU64,
    stop: &AtomicBool,
) -> Result<()> {
    use pb::session_event::Kind as Ev;
    use pb::session_request::Kind;
    let (tx, rx) = tokio::sync::mpsc::channel::<pb::SessionRequest>(4);
    tx.send(pb::SessionRequest {
        request_id: 1,
        kind: Some(Kind::Open(pb::OpenSessionRequest {
            client: format!("s{i}"),
            ttl_ms: ttl.as_millis() as u64,
            ..Default::default()
        })),
    })
    .await?;
    let opening = async {
        let mut events = c
            .session(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await?
            .into_inner();
        match events.message().await? {
            Some(pb::SessionEvent {
                kind: Some(Ev::Opened(_)),
                ..
            }) => Ok(events),
            other => bail!("session {i}: open answered {other:?}"),
        }
    };
    let opened = timeout(Duration::from_secs(30), opening)
        .await
        .unwrap_or_else(|_| Err(anyhow::anyhow!("session {i}: no answer to open in 30 s")));
    let _ = ready.send(
        opened
            .as_ref()
            .map(|_| ())
            .map_err(|e| anyhow::anyhow!("{e:#}")),
    );
    let mut events = opened?;
    let mut next = first;
    // Bounded by the deadline; the round count only guards against a zero period.
    let rounds = 1 + deadline.saturating_duration_since(next).as_millis() as u64
        / period.as_millis().max(1) as u64;
    for id in 2..rounds + 2 {
        sleep_until(next).await;
        next += period;
        if stop.load(Ordering::Relaxed) || Instant::now() >= deadline {
            break;
        }
        tx.send(pb::SessionRequest {
            request_id: id,
            kind: Some(Kind::Keepalive(pb::KeepAliveRequest::default())),
        })
        .await?;
        sent.fetch_add(1, Ordering::Relaxed);
        match timeout(Duration::from_secs(5), events.message()).await {
            Ok(Ok(Some(pb::SessionEvent {
                kind: Some(Ev::Keepalive(_)),
                ..
            }))) => {}
            other => bail!("session {i}: keepalive answered {other:?}"),
        }
    }
    Ok(())
}

pub async fn session_load(
    cluster: &Cluster,
    n: usize,
    ttl: Duration,
    window: Duration,
    via: KeepaliveVia,
) -> Result<SessionLoad> {
    let pids = cluster.pids();
    let cpu = |pids: &[u32]| {
        pids.iter()
            .map(|p| cpu_secs(Some(*p)))
            .collect::<Vec<f64>>()
    };
    let pct = |a: &[f64], b: &[f64], secs: f64| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (y - x) / secs * 100.0)
            .collect::<Vec<f64>>()
    };

    // Idle baseline: heartbeats and nothing else.
    let c0 = cpu(&pids);
    sleep(window).await;
    let idle = pct(&c0, &cpu(&pids), window.as_secs_f64());

    // Open the sessions, spread over the nodes, then keep each alive every TTL/3.
    let period = ttl / 3;
    let deadline = Instant::now() + period + window + Duration::from_secs(60);
    let started = Instant::now();
    let (count, sent, errors, keep) = match via {
        KeepaliveVia::Unary => {
            let clients = connect_all(cluster).await?;
            let sessions = Arc::new(open_sessions(&clients, n, ttl).await?);
            let keep = Keepalives::spawn(&clients, sessions.clone(), period, 32, deadline);
            let (sent, errors) = (keep.sent.clone(), keep.errors.clone());
            (sessions.len(), sent, errors, Either::Unary(keep))
        }
        KeepaliveVia::Stream { per_conn } => {
            let keep =
                StreamSessions::open(cluster, n, per_conn.max(1), ttl, period, deadline).await?;
            let (sent, errors) = (keep.sent.clone(), keep.errors.clone());
            (n, sent, errors, Either::Stream(keep))
        }
    };
    let open_secs = started.elapsed().as_secs_f64();
    // One period to reach a steady rate, then measure.
    sleep(period).await;
    let (c1, w1, k1, b1) = (
        cpu(&pids),
        pids.iter().map(|p| write_bytes(*p)).collect::<Vec<_>>(),
        sent.load(Ordering::Relaxed),
        cpu_secs(None),
    );
    sleep(window).await;
    let (c2, w2, k2, b2) = (
        cpu(&pids),
        pids.iter().map(|p| write_bytes(*p)).collect::<Vec<_>>(),
        sent.load(Ordering::Relaxed),
        cpu_secs(None),
    );
    match keep {
        Either::Unary(k) => k.stop(),
        Either::Stream(k) => k.stop().await,
    }
    let secs = window.as_secs_f64();
    let busy = pct(&c1, &c2, secs);
    let leaders = cluster.leaders().await.unwrap_or_default();
    Ok(SessionLoad {
        via,
        sessions: count,
        open_secs,
        keepalives: k2 - k1,
        errors: errors.load(Ordering::Relaxed),
        window_secs: secs,
        nodes: (0..pids.len())
            .map(|i| (i, idle[i], busy[i], w2[i].saturating_sub(w1[i])))
            .collect(),
        leaders,
        bench_cpu_pct: (b2 - b1) / secs * 100.0,
    })
}

/// The keepalive senders of either kind.
enum Either {
    Unary(Keepalives),
    Stream(StreamSessions),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let v: Vec<Duration> = (1..=20).map(Duration::from_millis).collect();
        assert_eq!(quantile(&v, 0.5), Duration::from_millis(10));
        assert_eq!(quantile(&v, 0.99), Duration::from_millis(20));
        assert_eq!(quantile(&[], 0.5), Duration::ZERO);
    }

    #[test]
    fn names_stay_in_their_group() {
        let shards = ShardMap::initial(4);
        let names = NamesIn {
            shards: shards.clone(),
            group: 3,
            prefix: "p".into(),
            next: 0,
        };
        assert!(names.take(50).all(|n| shards.group_of(&n) == 3));
    }
}
