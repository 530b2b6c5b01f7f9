//! The workloads, written once against `LockTarget`, and their latency statistics.
//!
//! Why these: the targets are stated in them. Lock cycles (acquire + release on
//! distinct names, closed loop) give per-request latency at a given concurrency. The seed's mix
//! (acquire 40%, release 40%, keepalive 8%, read 12%) runs open loop at fixed offered rates,
//! with latency counted from each request's *intended* send time, so a slow server is charged
//! for the queue it causes (no coordinated omission); a closed-loop run of the same mix finds
//! the maximum rate. Every loop is bounded by a request count and by a deadline.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use hdrhistogram::Histogram;
use tokio::task::JoinSet;
use tokio::time::{sleep_until, timeout, Instant};

use crate::procs::cpu_secs;
use crate::target::LockTarget;

/// A request that takes longer than this counts as an error (and its wait as its latency).
const OP_TIMEOUT: Duration = Duration::from_secs(5);
/// Session TTL: the seed's 15 s. Every measurement is shorter, so nothing expires mid-run.
const TTL: Duration = Duration::from_secs(15);
/// Names the mix draws from: large enough that two clients rarely want the same name.
const MIX_NAMES: u64 = 100_000;
/// An open-loop run stops issuing this long after its nominal end; what is left counts missed.
const OPEN_LOOP_GRACE: Duration = Duration::from_secs(2);
/// Upper bound on requests per client per run, whatever the duration.
const MAX_OPS_PER_CLIENT: u64 = 1_000_000;

/// How long and how hard to run; `--quick` shrinks durations, not the shape.
#[derive(Clone, Debug)]
pub struct Plan {
    pub cycle_concurrency: Vec<usize>,
    pub cycle_duration: Duration,
    pub read_concurrency: usize,
    pub max_rate_clients: usize,
    pub mix_rates: Vec<u64>,
    /// Also run the mix open loop at half the rate the closed loop reached (the "p99 at half
    /// the peak" target), each system at half its own peak.
    pub mix_half_max: bool,
    pub mix_clients: usize,
    pub mix_duration: Duration,
    /// Unrecorded lock cycles (C=16) before the first measurement, the same for every system:
    /// a JVM (ZooKeeper) compiles its hot paths in the first seconds, and every server's
    /// caches and connection pools warm up.
    pub warm_up: Duration,
}

impl Plan {
    pub fn new(quick: bool) -> Plan {
        let (cycle, mix) = if quick { (2, 3) } else { (10, 15) };
        Plan {
            warm_up: Duration::from_secs(if quick { 3 } else { 10 }),
            cycle_concurrency: vec![1, 16, 64, 256],
            cycle_duration: Duration::from_secs(cycle),
            read_concurrency: 64,
            max_rate_clients: 256,
            mix_rates: vec![10_000, 25_000, 50_000],
            mix_half_max: true,
            mix_clients: 256,
            mix_duration: Duration::from_secs(mix),
        }
    }
}

impl Plan {
    /// Seconds-long, tiny concurrency, no open loop: the CI smoke (it asserts only success).
    pub fn smoke() -> Plan {
        Plan {
            cycle_concurrency: vec![1, 4],
            cycle_duration: Duration::from_secs(1),
            read_concurrency: 4,
            max_rate_clients: 8,
            mix_rates: vec![],
            mix_half_max: false,
            mix_clients: 8,
            mix_duration: Duration::from_secs(1),
            warm_up: Duration::ZERO,
        }
    }
}

/// What a workload runs in: the system's name, the plan, and the server processes whose CPU
/// each row reports.
pub struct Ctx<'a> {
    pub system: &'a str,
    pub plan: &'a Plan,
    pub server_pids: Vec<u32>,
}

/// CPU used during a measurement, in percent of one core (200% = both cores of this machine).
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu {
    pub servers_pct: f64,
    pub bench_pct: f64,
}

/// One line of the result table.
#[derive(Clone, Debug)]
pub struct Row {
    pub system: String,
    pub workload: String,
    pub ops_per_s: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub errors: u64,
    /// Acquires that found the lock taken (expected in the mix, never on a fresh name).
    pub not_acquired: u64,
    /// Releases of a lock this client held that the server refused: always a failure.
    pub refused: u64,
    pub cpu: Cpu,
    pub note: String,
}

/// What one worker measured; merged across workers.
struct Stats {
    hist: Histogram<u64>,
    ops: u64,
    errors: u64,
    not_acquired: u64,
    refused: u64,
    missed: u64,
    first_error: Option<String>,
}

impl Stats {
    fn new() -> Stats {
        Stats {
            // 1 µs .. 60 s at 3 significant digits.
            hist: Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds"),
            ops: 0,
            errors: 0,
            not_acquired: 0,
            refused: 0,
            missed: 0,
            first_error: None,
        }
    }

    fn record(&mut self, latency: Duration) {
        self.hist
            .saturating_record(latency.as_micros().max(1) as u64);
    }

    /// Counts one finished request; `r` is its outcome (a timeout is an error).
    fn outcome<T>(&mut self, r: Result<Result<T>, tokio::time::error::Elapsed>) -> Option<T> {
        self.ops += 1;
        let err = match r {
            Ok(Ok(v)) => return Some(v),
            Ok(Err(e)) => format!("{e:#}"),
            Err(_) => format!("timed out after {OP_TIMEOUT:?}"),
        };
        self.errors += 1;
        self.first_error.get_or_insert(err);
        None
    }

    fn merge(&mut self, o: Stats) {
        self.hist.add(&o.hist).expect("same histogram bounds");
        self.ops += o.ops;
        self.errors += o.errors;
        self.not_acquired += o.not_acquired;
        self.refused += o.refused;
        self.missed += o.missed;
        if self.first_error.is_none() {
            self.first_error = o.first_error;
        }
    }

    fn row(&self, system: &str, workload: String, run: Run, mut notes: Vec<String>) -> Row {
        if let Some(e) = &self.first_error {
            eprintln!("  {system} {workload}: {} errors, first: {e}", self.errors);
        }
        if self.not_acquired > 0 {
            notes.push(format!(
                "{} acquires found the lock taken",
                self.not_acquired
            ));
        }
        let elapsed = run.elapsed;
        Row {
            system: system.to_owned(),
            workload,
            ops_per_s: (self.ops - self.errors) as f64 / elapsed.as_secs_f64(),
            p50_us: self.hist.value_at_quantile(0.50),
            p99_us: self.hist.value_at_quantile(0.99),
            p999_us: self.hist.value_at_quantile(0.999),
            errors: self.errors,
            not_acquired: self.not_acquired,
            refused: self.refused,
            cpu: run.cpu,
            note: notes.join("; "),
        }
    }
}

/// Opens `n` clients concurrently (not measured).
async fn prepare_clients<T: LockTarget>(t: &Arc<T>, n: usize) -> Result<Vec<T::Client>> {
    let mut set = JoinSet::new();
    for id in 0..n {
        let t = t.clone();
        set.spawn(async move { (id, t.prepare(id, TTL).await) });
    }
    let mut clients: Vec<Option<T::Client>> = (0..n).map(|_| None).collect();
    while let Some(joined) = set.join_next().await {
        let (id, c) = joined?;
        clients[id] = Some(c?);
    }
    Ok(clients
        .into_iter()
        .map(|c| c.expect("every id joined"))
        .collect())
}

/// The wall time and CPU of one measurement (from the common start to the last client's end).
#[derive(Clone, Copy)]
struct Run {
    elapsed: Duration,
    cpu: Cpu,
}

fn cpu_now(pids: &[u32]) -> (f64, f64) {
    (
        pids.iter().map(|&p| cpu_secs(Some(p))).sum(),
        cpu_secs(None),
    )
}

/// Runs `work` once per client in its own task, all starting together; then ends every
/// session and returns the merged stats and the measured run.
async fn run_clients<T, F, Fut>(cx: &Ctx<'_>, t: &Arc<T>, n: usize, work: F) -> Result<(Stats, Run)>
where
    T: LockTarget,
    F: Fn(Arc<T>, T::Client, usize, Instant) -> Fut,
    Fut: std::future::Future<Output = (T::Client, Stats)> + Send + 'static,
{
    let clients = prepare_clients(t, n).await?;
    let start = Instant::now() + Duration::from_millis(50);
    sleep_until(start).await;
    let cpu0 = cpu_now(&cx.server_pids);
    let mut set = JoinSet::new();
    for (id, c) in clients.into_iter().enumerate() {
        set.spawn(work(t.clone(), c, id, start));
    }
    let mut total = Stats::new();
    let mut finished = Vec::with_capacity(n);
    while let Some(joined) = set.join_next().await {
        let (c, st) = joined?;
        total.merge(st);
        finished.push(c);
    }
    let elapsed = start.elapsed();
    let cpu1 = cpu_now(&cx.server_pids);
    let pct = |a: f64, b: f64| 100.0 * (b - a) / elapsed.as_secs_f64();
    let cpu = Cpu {
        servers_pct: pct(cpu0.0, cpu1.0),
        bench_pct: pct(cpu0.1, cpu1.1),
    };
    for c in finished {
        // A session that cannot be ended just expires later; not worth failing the run.
        let _ = timeout(OP_TIMEOUT, t.finish(c)).await;
    }
    Ok((total, Run { elapsed, cpu }))
}

/// Uncontended lock cycles: each of `c` clients acquires and releases its own fresh names in a
/// closed loop. ops/s counts both requests; the latencies are the acquires'.
pub async fn cycles<T: LockTarget>(cx: &Ctx<'_>, t: &Arc<T>, c: usize) -> Result<Row> {
    let dur = cx.plan.cycle_duration;
    let prefix = format!("lockd-bench/cycles{c}");
    let (st, run) = run_clients(cx, t, c, |t, mut cl, id, start| {
        let prefix = prefix.clone();
        async move {
            sleep_until(start).await;
            let deadline = start + dur;
            let mut st = Stats::new();
            for i in 0..MAX_OPS_PER_CLIENT / 2 {
                if Instant::now() >= deadline {
                    break;
                }
                let name = format!("{prefix}/{id}/{i}");
                let owner = format!("bench-{id}-{i}");
                let t0 = Instant::now();
                let r = timeout(OP_TIMEOUT, t.acquire(&mut cl, &name, &owner)).await;
                st.record(t0.elapsed());
                match st.outcome(r) {
                    Some(Some(token)) => {
                        let r = timeout(OP_TIMEOUT, t.release(&mut cl, &name, &token)).await;
                        if st.outcome(r) == Some(false) {
                            st.refused += 1;
                        }
                    }
                    Some(None) => st.not_acquired += 1,
                    None => {}
                }
            }
            (cl, st)
        }
    })
    .await?;
    Ok(st.row(
        cx.system,
        format!("cycle C={c}"),
        run,
        vec!["latency: acquires".into()],
    ))
}

/// Status reads of free names, closed loop: the cheapest request each system has (etcd: a
/// linearizable range through the JSON gateway, no disk write).
pub async fn reads<T: LockTarget>(cx: &Ctx<'_>, t: &Arc<T>) -> Result<Row> {
    let c = cx.plan.read_concurrency;
    let dur = cx.plan.cycle_duration;
    let (st, run) = run_clients(cx, t, c, |t, mut cl, id, start| async move {
        sleep_until(start).await;
        let deadline = start + dur;
        let mut st = Stats::new();
        for i in 0..MAX_OPS_PER_CLIENT {
            if Instant::now() >= deadline {
                break;
            }
            let name = format!("lockd-bench/reads/{id}/{}", i % 64);
            let t0 = Instant::now();
            let r = timeout(OP_TIMEOUT, t.read(&mut cl, &name)).await;
            st.record(t0.elapsed());
            st.outcome(r);
        }
        (cl, st)
    })
    .await?;
    Ok(st.row(cx.system, format!("read C={c}"), run, vec![]))
}

/// One request of the seed's mix.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Acquire,
    Release,
    Keepalive,
    Read,
}

/// The mix as a fixed cycle of 25 requests: 10 acquires, 10 releases, 2 keepalives, 3 reads
/// (40/40/8/12%). Each acquire is followed by the release of the same lock, and keepalives and
/// reads fall while a lock is held, as in a worker's life. Clients start at different offsets.
const MIX: [Op; 25] = {
    use Op::*;
    [
        Acquire, Keepalive, Release, Acquire, Release, Acquire, Read, Release, Acquire, Release,
        Acquire, Read, Release, Acquire, Release, Acquire, Keepalive, Release, Acquire, Release,
        Acquire, Read, Release, Acquire, Release,
    ]
};

/// A mix client's state between requests: the lock it holds, if any.
struct MixState {
    id: usize,
    seq: u64,
    held: Option<(String, String)>,
    rng: fastrand::Rng,
    prefix: String,
}

impl MixState {
    fn new(id: usize, seed: u64, prefix: String) -> MixState {
        MixState {
            id,
            seq: 0,
            held: None,
            rng: fastrand::Rng::with_seed(seed),
            prefix,
        }
    }

    fn random_name(&mut self) -> String {
        format!("{}/{}", self.prefix, self.rng.u64(0..MIX_NAMES))
    }

    /// Issues request number `j` of this client and records its outcome.
    async fn step<T: LockTarget>(&mut self, t: &T, cl: &mut T::Client, j: u64, st: &mut Stats) {
        self.seq += 1;
        match MIX[(self.id + j as usize) % MIX.len()] {
            Op::Acquire => {
                let name = self.random_name();
                let owner = format!("bench-{}-{}", self.id, self.seq);
                let r = timeout(OP_TIMEOUT, t.acquire(cl, &name, &owner)).await;
                match st.outcome(r) {
                    Some(Some(token)) => self.held = Some((name, token)),
                    Some(None) => st.not_acquired += 1,
                    None => {}
                }
            }
            Op::Release => {
                // Without a held lock (the acquire failed) this releases a free name: the same
                // request, refused by the server.
                let (held, (name, token)) = match self.held.take() {
                    Some(h) => (true, h),
                    None => (
                        false,
                        (self.random_name(), format!("bench-{}-none", self.id)),
                    ),
                };
                let r = st.outcome(timeout(OP_TIMEOUT, t.release(cl, &name, &token)).await);
                if held && r == Some(false) {
                    st.refused += 1;
                }
            }
            Op::Keepalive => {
                let held = self.held.as_ref().map(|(n, tk)| (n.as_str(), tk.as_str()));
                st.outcome(timeout(OP_TIMEOUT, t.keepalive(cl, held)).await);
            }
            Op::Read => {
                let name = self.random_name();
                st.outcome(timeout(OP_TIMEOUT, t.read(cl, &name)).await);
            }
        }
    }
}

/// The share of each request kind in the seed's mix (acquire, release, keepalive, read), as
/// [`MIX`] has them.
pub(crate) fn mix_shares() -> [f64; 4] {
    let share = |op: Op| MIX.iter().filter(|o| **o == op).count() as f64 / MIX.len() as f64;
    [
        share(Op::Acquire),
        share(Op::Release),
        share(Op::Keepalive),
        share(Op::Read),
    ]
}

/// One client of the seed's mix for measurements made elsewhere (`instructions.rs`): the same
/// requests, in the same order, as the `mix` rows send.
pub(crate) struct MixClient {
    state: MixState,
    stats: Stats,
    next: u64,
}

impl MixClient {
    pub(crate) fn new(id: usize, prefix: String) -> MixClient {
        MixClient {
            state: MixState::new(id, id as u64, prefix),
            stats: Stats::new(),
            next: 0,
        }
    }

    /// Sends this client's next request of the mix.
    pub(crate) async fn step<T: LockTarget>(&mut self, t: &T, cl: &mut T::Client) {
        self.state.step(t, cl, self.next, &mut self.stats).await;
        self.next += 1;
    }

    /// The requests that failed so far, and the first failure's text.
    pub(crate) fn errors(&self) -> (u64, Option<&str>) {
        (self.stats.errors, self.stats.first_error.as_deref())
    }
}

/// The mix in a closed loop with `plan.max_rate_clients` clients: the maximum rate.
pub async fn mix_max<T: LockTarget>(cx: &Ctx<'_>, t: &Arc<T>) -> Result<Row> {
    let n = cx.plan.max_rate_clients;
    let dur = cx.plan.mix_duration;
    let (st, run) = run_clients(cx, t, n, |t, mut cl, id, start| async move {
        let mut s = MixState::new(id, id as u64, "lockd-bench/mixmax".into());
        sleep_until(start).await;
        let deadline = start + dur;
        let mut st = Stats::new();
        for j in 0..MAX_OPS_PER_CLIENT {
            if Instant::now() >= deadline {
                break;
            }
            let t0 = Instant::now();
            s.step(&*t, &mut cl, j, &mut st).await;
            st.record(t0.elapsed());
        }
        (cl, st)
    })
    .await?;
    Ok(st.row(
        cx.system,
        format!("mix max C={n}"),
        run,
        vec!["closed loop".into()],
    ))
}

/// The mix open loop at `rate` ops/s: each of `plan.mix_clients` clients sends on its own
/// fixed schedule (rate / clients, evenly staggered) and latency runs from the intended send
/// time. Requests still unsent `OPEN_LOOP_GRACE` after the end count as missed.
pub async fn mix_open<T: LockTarget>(cx: &Ctx<'_>, t: &Arc<T>, rate: u64) -> Result<Row> {
    let n = cx.plan.mix_clients;
    let dur = cx.plan.mix_duration;
    let interval = Duration::from_secs_f64(n as f64 / rate as f64);
    let per_client =
        ((rate as f64 * dur.as_secs_f64() / n as f64).ceil() as u64).min(MAX_OPS_PER_CLIENT);
    let (st, run) = run_clients(cx, t, n, |t, mut cl, id, start| async move {
        let mut s = MixState::new(id, id as u64 ^ rate, format!("lockd-bench/mix{rate}"));
        let first = start + interval.mul_f64(id as f64 / n as f64);
        let hard_stop = start + dur + OPEN_LOOP_GRACE;
        let mut st = Stats::new();
        for j in 0..per_client {
            let intended = first + interval * j as u32;
            sleep_until(intended).await;
            if Instant::now() >= hard_stop {
                st.missed += per_client - j;
                break;
            }
            s.step(&*t, &mut cl, j, &mut st).await;
            st.record(intended.elapsed());
        }
        (cl, st)
    })
    .await?;
    // Throughput over the whole run, including the grace period a slow server needed; a
    // server that cannot keep up shows missed requests and a tail from the intended times.
    let done = st.ops - st.errors;
    let mut notes = vec![format!("offered {rate}/s")];
    if st.missed > 0 || (done as f64) < 0.95 * (rate as f64 * dur.as_secs_f64()) {
        notes.push(format!("{SATURATED} ({} never sent)", st.missed));
    }
    let mut row = st.row(
        cx.system,
        format!("mix open {}k/s", rate / 1000),
        run,
        notes,
    );
    row.ops_per_s = row.ops_per_s.min(rate as f64);
    Ok(row)
}

/// The workload label of the open-loop mix at half the closed-loop maximum.
const HALF_MAX: &str = "mix open ½ max";

/// Half a measured rate, rounded down to 100 ops/s (at least 100).
fn half_of(max_ops_per_s: f64) -> u64 {
    ((max_ops_per_s / 2.0) as u64 / 100 * 100).max(100)
}

/// Marks an open-loop row that could not keep up (higher offered rates are then skipped).
const SATURATED: &str = "SATURATED";

pub fn saturated(row: &Row) -> bool {
    row.note.contains(SATURATED)
}

/// Runs every workload of `plan` against one system, printing progress to stderr.
pub async fn run_all<T: LockTarget>(cx: &Ctx<'_>, t: T) -> Result<Vec<Row>> {
    let (system, plan) = (cx.system, cx.plan);
    let t = Arc::new(t);
    let progress = |w: &str| eprintln!("[{system}] {w}");
    let mut rows = Vec::new();
    if !plan.warm_up.is_zero() {
        progress(&format!(
            "warm-up: cycle C=16, not recorded ({:?})",
            plan.warm_up
        ));
        let warm = Plan {
            cycle_duration: plan.warm_up,
            ..plan.clone()
        };
        let wcx = Ctx {
            system,
            plan: &warm,
            server_pids: cx.server_pids.clone(),
        };
        cycles(&wcx, &t, 16).await?;
    }
    for &c in &plan.cycle_concurrency {
        progress(&format!("cycle C={c} ({:?})", plan.cycle_duration));
        rows.push(cycles(cx, &t, c).await?);
    }
    progress(&format!(
        "read C={} ({:?})",
        plan.read_concurrency, plan.cycle_duration
    ));
    rows.push(reads(cx, &t).await?);
    progress(&format!(
        "mix max C={} ({:?})",
        plan.max_rate_clients, plan.mix_duration
    ));
    let max = mix_max(cx, &t).await?;
    let half = half_of(max.ops_per_s);
    rows.push(max);
    if plan.mix_half_max {
        progress(&format!(
            "mix open at half the max, {half}/s ({:?})",
            plan.mix_duration
        ));
        let mut row = mix_open(cx, &t, half).await?;
        row.workload = HALF_MAX.to_string();
        rows.push(row);
    }
    let mut skip = false;
    for &rate in &plan.mix_rates {
        if skip {
            progress(&format!(
                "mix open {rate}/s skipped: saturated at a lower rate"
            ));
            continue;
        }
        progress(&format!("mix open {rate}/s ({:?})", plan.mix_duration));
        let row = mix_open(cx, &t, rate).await?;
        skip = saturated(&row);
        rows.push(row);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix_has_the_seed_shares() {
        let s = mix_shares();
        for (got, want) in s.iter().zip([0.40, 0.40, 0.08, 0.12]) {
            assert!((got - want).abs() < 1e-9, "{s:?}");
        }
    }

    #[test]
    fn half_the_max_is_rounded_down_to_a_hundred() {
        assert_eq!(half_of(10_067.0), 5_000);
        assert_eq!(half_of(143_984.0), 71_900);
        assert_eq!(half_of(150.0), 100);
        assert_eq!(half_of(0.0), 100);
    }

    #[test]
    fn mix_is_the_seeds_40_40_8_12() {
        let count = |op| MIX.iter().filter(|&&o| o == op).count();
        assert_eq!(
            (
                count(Op::Acquire),
                count(Op::Release),
                count(Op::Keepalive),
                count(Op::Read)
            ),
            (10, 10, 2, 3)
        );
        // Every acquire is released before the next acquire.
        let mut held = false;
        for op in MIX {
            match op {
                Op::Acquire => {
                    assert!(!held);
                    held = true;
                }
                Op::Release => {
                    assert!(held);
                    held = false;
                }
                _ => assert!(held),
            }
        }
    }
}
