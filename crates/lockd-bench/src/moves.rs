//! `lockd-bench move`: move 1,024 buckets holding many locks from lock group 1 to group 2 of a
//! running 3-node cluster, under a client load that cycles locks on names in those buckets.
//!
//! Why this shape: the question is what a live move costs the clients whose names move. So the
//! held locks all lie in the moving buckets, and the load's names too; the load runs through
//! every node (each routes to the group it finds in its map, and re-routes on `wrong_group` or
//! `bucket_moving`), and is measured in a window before the move and during it, same clients,
//! same names. After the move a sample of the held locks is inspected: each must be held by the
//! same session with the same token, now in group 2.
//!
//! Every loop is bounded by a count and a deadline; the cluster is stopped by pid on return.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use lockd_core::{bucket_of, BucketSet, ShardMap};
use lockd_proto::v1 as pb;
use lockd_proto::v1::admin_client::AdminClient;
use lockd_proto::v1::lock_client::LockClient;
use tokio::task::JoinSet;
use tokio::time::{sleep, timeout, Instant};
use tonic::transport::Channel;

use crate::lockd::{Cluster, ADMIN_TOKEN};
use crate::scenarios::{connect_all, open_sessions, Keepalives};

const TTL: Duration = Duration::from_secs(60);
const OP_TIMEOUT: Duration = Duration::from_secs(10);

pub struct MoveArgs {
    /// Locks to hold in the moving buckets.
    pub held: u64,
    /// Sessions they are spread over.
    pub sessions: usize,
    /// Clients cycling acquire + release on names in the moving buckets.
    pub load: usize,
    /// Length of the window measured before the move, seconds.
    pub before_secs: u64,
}

/// Latencies and errors of the load in one window.
#[derive(Default)]
struct Window {
    cycles: u64,
    errors: u64,
    first_error: Option<String>,
    hist: Option<Histogram<u64>>,
}

impl Window {
    fn record(&mut self, us: u64) {
        self.cycles += 1;
        let h = self
            .hist
            .get_or_insert_with(|| Histogram::new_with_bounds(1, 60_000_000, 3).expect("bounds"));
        let _ = h.record(us.max(1));
    }

    fn line(&self, what: &str, secs: f64) -> String {
        let q = |p: f64| {
            self.hist
                .as_ref()
                .map_or(0.0, |h| h.value_at_quantile(p) as f64 / 1e3)
        };
        format!(
            "{what}: {} cycles in {secs:.1} s ({:.0}/s), {} errors; acquire+release p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms{}",
            self.cycles,
            self.cycles as f64 / secs.max(1e-9),
            self.errors,
            q(0.5),
            q(0.99),
            q(1.0),
            self.first_error
                .as_ref()
                .map_or(String::new(), |e| format!(" (first error: {e})"))
        )
    }
}

fn admin<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert(
        "authorization",
        format!("Bearer {ADMIN_TOKEN}").parse().expect("ascii"),
    );
    r
}

/// Names `prefix-k` whose bucket is in `set`, `n` of them.
fn names_in(set: &BucketSet, prefix: &str, n: u64) -> Vec<String> {
    (0u64..)
        .map(|k| format!("{prefix}-{k}"))
        .filter(|name| set.contains(bucket_of(name)))
        .take(n as usize)
        .collect()
}

pub async fn run(cluster: &Cluster, a: &MoveArgs) -> Result<()> {
    if cluster.groups() < 2 {
        bail!("a move needs at least two lock groups (--groups 2 or more)");
    }
    let map = ShardMap::initial(cluster.groups());
    // The first 1,024 buckets of group 1.
    let moving: BucketSet = (0..lockd_core::BUCKETS)
        .filter(|b| map.groups[*b as usize] == 1)
        .take(1024)
        .collect();
    let clients = connect_all(cluster).await?;
    let sessions = Arc::new(open_sessions(&clients, a.sessions, TTL).await?);
    let deadline = Instant::now() + Duration::from_secs(1800);
    let keepalives = Keepalives::spawn(&clients, sessions.clone(), TTL / 3, 32, deadline);

    // Load the held locks, leader-routed, 256 in flight.
    let names = Arc::new(names_in(&moving, "lockd-bench/move/held", a.held));
    let leader = cluster.leaders().await?[1];
    let tokens: Arc<Mutex<Vec<(usize, u64)>>> = Arc::default();
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut set = JoinSet::new();
    for _ in 0..256 {
        let (names, sessions, tokens, next) = (
            names.clone(),
            sessions.clone(),
            tokens.clone(),
            next.clone(),
        );
        let mut c = clients[leader].clone();
        set.spawn(async move {
            loop {
                let k = next.fetch_add(1, Ordering::Relaxed) as usize;
                if k >= names.len() {
                    return Ok(());
                }
                let s = &sessions[k % sessions.len()].1;
                let req = pb::AcquireRequest {
                    session_id: s.clone(),
                    name: names[k].clone(),
                    owner: format!("held-{k}"),
                    ..Default::default()
                };
                let r = timeout(OP_TIMEOUT, c.acquire(req))
                    .await
                    .context("acquire timed out")??;
                if !r.get_ref().acquired {
                    bail!("{} was not granted", names[k]);
                }
                tokens
                    .lock()
                    .expect("not poisoned")
                    .push((k, r.get_ref().fencing_token));
            }
        });
    }
    while let Some(j) = set.join_next().await {
        j??;
    }
    println!(
        "loaded {} held locks in {} buckets of group 1 in {:.1} s",
        names.len(),
        moving.len(),
        started.elapsed().as_secs_f64()
    );

    // The load: cycle acquire + release on names in the moving buckets, through every node.
    let probe_names = Arc::new(names_in(&moving, "lockd-bench/move/probe", 4096));
    let moving_now = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let windows: Arc<Mutex<[Window; 2]>> = Arc::default();
    let mut load = JoinSet::new();
    for w in 0..a.load {
        let mut c = clients[w % clients.len()].clone();
        let (probe_names, moving_now, stop, windows) = (
            probe_names.clone(),
            moving_now.clone(),
            stop.clone(),
            windows.clone(),
        );
        let session = sessions[w % sessions.len()].1.clone();
        load.spawn(async move {
            for i in 0..1_000_000usize {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let name = probe_names[(i * a_prime() + w * 97) % probe_names.len()].clone();
                let during = moving_now.load(Ordering::Relaxed) as usize;
                let t0 = Instant::now();
                let r = cycle(&mut c, &session, &name, w).await;
                let us = t0.elapsed().as_micros() as u64;
                let mut ws = windows.lock().expect("not poisoned");
                match r {
                    Ok(()) => ws[during].record(us),
                    Err(e) => {
                        ws[during].errors += 1;
                        ws[during].first_error.get_or_insert(e);
                    }
                }
            }
        });
    }
    sleep(Duration::from_secs(a.before_secs)).await;
    moving_now.store(true, Ordering::Relaxed);
    let before_secs = a.before_secs as f64;

    let ch = Channel::from_shared(format!("http://{}", cluster.grpc_addrs()[0]))?
        .connect()
        .await?;
    let mut adm = AdminClient::new(ch);
    let t0 = Instant::now();
    let m = timeout(
        Duration::from_secs(600),
        adm.move_buckets(admin(pb::MoveBucketsRequest {
            buckets: moving.to_string(),
            to_group: 2,
        })),
    )
    .await
    .context("the move took over 600 s")??
    .into_inner();
    let wall = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    while load.join_next().await.is_some() {}
    let ws = std::mem::take(&mut *windows.lock().expect("not poisoned"));
    println!(
        "move: {} buckets in {} chunks from group 1 to group 2 in {:.0} ms (server) / {:.2} s (call); {} locks, {} holders kept their tokens, {} waits re-queued, shard map version {}",
        m.buckets_moved, m.chunks, m.elapsed_ms, wall, m.locks, m.holders, m.waits_requeued, m.map_version
    );
    println!("{}", ws[0].line("load before the move", before_secs));
    println!("{}", ws[1].line("load during the move", wall));

    // A sample of the held locks: same token, now in group 2.
    let toks = tokens.lock().expect("not poisoned").clone();
    let mut c: LockClient<Channel> = clients[0].clone();
    let (mut same, mut checked) = (0, 0);
    for (k, token) in toks.iter().step_by((toks.len() / 1000).max(1)) {
        let r = c
            .inspect(admin(pb::InspectRequest {
                name: names[*k].clone(),
                ..Default::default()
            }))
            .await?
            .into_inner();
        checked += 1;
        if r.holders.first().map(|h| h.fencing_token) == Some(*token) {
            same += 1;
        }
    }
    println!("after the move: {same} of {checked} sampled held locks have their holder and token");
    keepalives.stop();
    if same != checked || m.holders < names.len() as u32 {
        bail!("the move lost holders or changed tokens");
    }
    Ok(())
}

/// A stride coprime with the probe count (4096), so each client walks every probe name.
fn a_prime() -> usize {
    (2_654_435_761 % 4096) | 1
}

async fn cycle(
    c: &mut LockClient<Channel>,
    session: &str,
    name: &str,
    w: usize,
) -> Result<(), String> {
    let req = pb::AcquireRequest {
        session_id: session.to_string(),
        name: name.to_string(),
        owner: format!("probe-{w}"),
        wait_ms: 2_000,
        ..Default::default()
    };
    let r = match timeout(OP_TIMEOUT, c.acquire(req)).await {
        Ok(Ok(r)) => r.into_inner(),
        Ok(Err(e)) => return Err(format!("acquire: {:?}: {}", e.code(), e.message())),
        Err(_) => return Err("acquire: no answer in 10 s".into()),
    };
    if !r.acquired {
        return Err(format!("acquire: not granted (held by {})", r.holder));
    }
    let req = pb::ReleaseRequest {
        session_id: session.to_string(),
        name: name.to_string(),
        fencing_token: r.fencing_token,
        ..Default::default()
    };
    match timeout(OP_TIMEOUT, c.release(req)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("release: {:?}: {}", e.code(), e.message())),
        Err(_) => Err("release: no answer in 10 s".into()),
    }
}
