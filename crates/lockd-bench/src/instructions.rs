//! The per-operation cost model: instructions (a figure the shared machine's noise does not
//! move) and µs of CPU under load, for each of acquire, release, keepalive and read, on a
//! group's leader and on its followers.
//!
//! **Instructions.** Hardware counters (`perf stat`) are not exposed to this VM, so one node of
//! an otherwise normal 3-node cluster runs under valgrind's callgrind, which counts the
//! instructions every thread of the process executes. `callgrind_control` zeroes the counters
//! before a phase and dumps them after it; the phase's count, less the idle rate (heartbeats,
//! ticks) over its duration, divided by its operations, is the cost of one operation. One
//! client at a time, closed loop, fresh names of lock group 1. Leader balance (lockd's default)
//! hands group g to voter `g mod 3` in id order, so node 2 leads group 1 and node 1 follows it,
//! whatever the group count. Two clusters, so the callgrind node has each role:
//! - node 2 under callgrind, `leader`: the client's stream is on node 2, which leads group 1;
//! - node 1 under callgrind, `follower, forwarding`: the client's stream is on node 1, which
//!   forwards to node 2 and also replicates the entries;
//! - the same cluster, `follower, replica only`: the client's stream is on node 2; node 1 only
//!   receives, fsyncs and applies the entries (a keepalive or a read never reaches it).
//!
//! **CPU under load.** A plain cluster (no valgrind, the shape asked for), `concurrency` clients
//! spread over the nodes, each op kind in its own closed-loop phase on names of every group: the
//! CPU time each process used over the phase (`/proc/<pid>/stat`), per operation done, with the
//! groups each node leads. A last phase runs `compare`'s mix (`workload::MixClient`), beside the
//! mix weighted from the single kinds. This is the regime the peak rate is made in, where
//! many requests share one Raft entry, one fsync and one peer batch.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use lockd_core::ShardMap;
use tokio::task::JoinSet;

use crate::lockd::{sum_metric, Cluster, GrpcTarget, Routing, ServerOpts};
use crate::procs::cpu_secs;
use crate::target::{LockTarget, Token};
use crate::workload::MixClient;

/// The operations of the cost model, in the order each phase runs them.
pub const OPS: [&str; 4] = ["acquire", "release", "keepalive", "read"];

/// The load phases, in order: each op kind, then the seed's mix of them.
const LOAD_PHASES: [&str; 5] = ["acquire", "release", "keepalive", "read", "mix"];

/// The node (index) that leader balance makes group 1's leader: voter `1 mod 3` in id order.
const GROUP1_LEADER: usize = 1;
/// A node that follows group 1 (and leads the meta group).
const GROUP1_FOLLOWER: usize = 0;

/// One role's instructions per operation, in [`OPS`] order, and each phase's idle share (the
/// larger it is, the less the figure can be trusted).
pub struct RoleCost {
    pub role: &'static str,
    pub per_op: [f64; 4],
    pub idle_share: [f64; 4],
}

/// CPU per operation under load, µs, in [`OPS`] order.
pub struct LoadCost {
    pub op: &'static str,
    pub ops_per_s: f64,
    /// Each node's, in node order.
    pub nodes_us: Vec<f64>,
    pub bench_us: f64,
}

/// What one run measured.
pub struct Report {
    pub ops: u64,
    pub groups: u32,
    /// The idle instructions/s subtracted, per callgrind cluster (leader run, follower run).
    pub idle_per_s: [f64; 2],
    pub roles: Vec<RoleCost>,
    pub concurrency: usize,
    pub load: Vec<LoadCost>,
    /// The load cluster's leader of each group, meta group first: node indexes.
    pub load_leaders: Vec<usize>,
    pub breakdown: Vec<Breakdown>,
}

/// Where one uncontended acquire's time goes (C=1, a client on one node), from the client's
/// clock and the nodes' own histograms (`lockd_op_duration_seconds`, measured from the request's
/// arrival at the node to its reply, and `lockd_log_sync_seconds`, a log append to its
/// fdatasync's end), as means over the phase.
pub struct Breakdown {
    pub at: &'static str,
    pub pairs: usize,
    pub client_p50_ms: f64,
    pub client_mean_ms: f64,
    pub server_mean_ms: f64,
    pub sync_leader_ms: f64,
    pub sync_followers_ms: f64,
}

impl Report {
    /// The seed mix's CPU per op (three replicas, lockd-bench) as the weighted sum of the
    /// single-kind load rows, by the mix's shares (40/40/8/12).
    fn mix_from_parts(&self) -> Option<(f64, f64)> {
        let (mut servers, mut bench) = (0.0, 0.0);
        for (op, w) in OPS.iter().zip(crate::workload::mix_shares()) {
            let l = self.load.iter().find(|l| l.op == *op)?;
            servers += w * l.nodes_us.iter().sum::<f64>();
            bench += w * l.bench_us;
        }
        Some((servers, bench))
    }

    pub fn render(&self) -> String {
        let mut out = format!(
            "instructions per operation (valgrind --tool=callgrind on the measured node), {} of each op per role, one client, fresh names of group 1 ({} lock groups); idle subtracted: {:.0} (leader run), {:.0} (follower run) instructions/s\n\n| role | acquire | release | keepalive | read | acquire+release |\n|---|---:|---:|---:|---:|---:|\n",
            self.ops, self.groups, self.idle_per_s[0], self.idle_per_s[1]
        );
        for r in &self.roles {
            out.push_str(&format!(
                "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |\n",
                r.role,
                r.per_op[0],
                r.per_op[1],
                r.per_op[2],
                r.per_op[3],
                r.per_op[0] + r.per_op[1]
            ));
        }
        out.push_str("\nidle share of each phase's count (acquire / release / keepalive / read):");
        for r in &self.roles {
            let s: Vec<String> = r
                .idle_share
                .iter()
                .map(|x| format!("{:.0}%", x * 100.0))
                .collect();
            out.push_str(&format!(" {}: {};", r.role, s.join(" / ")));
        }
        out.push('\n');
        if !self.load.is_empty() {
            let led: Vec<String> = (1..=3)
                .map(|n| {
                    let g: Vec<String> = (0..self.load_leaders.len())
                        .filter(|&g| self.load_leaders[g] + 1 == n)
                        .map(|g| g.to_string())
                        .collect();
                    format!("node {n} leads [{}]", g.join(", "))
                })
                .collect();
            out.push_str(&format!(
                "\nCPU per operation under load: {} clients spread over the nodes, closed loop, one op kind per phase, names over every group; µs of CPU time per op done ({}; group 0 is the meta group)\n\n| op | ops/s | node 1 µs | node 2 µs | node 3 µs | three replicas µs | lockd-bench µs |\n|---|---:|---:|---:|---:|---:|---:|\n",
                self.concurrency,
                led.join(", ")
            ));
            for l in &self.load {
                let n: Vec<String> = l.nodes_us.iter().map(|x| format!("{x:.1}")).collect();
                out.push_str(&format!(
                    "| {} | {:.0} | {} | {:.1} | {:.1} |\n",
                    l.op,
                    l.ops_per_s,
                    n.join(" | "),
                    l.nodes_us.iter().sum::<f64>(),
                    l.bench_us
                ));
            }
            if let Some((servers, bench)) = self.mix_from_parts() {
                let mix = self.load.iter().find(|l| l.op == "mix");
                out.push_str(&format!(
                    "\nthe mix weighted from the single-kind rows (40/40/8/12): three replicas {servers:.1} µs, lockd-bench {bench:.1} µs{}\n",
                    mix.map_or(String::new(), |m| format!(
                        "; measured: {:.1} µs and {:.1} µs",
                        m.nodes_us.iter().sum::<f64>(),
                        m.bench_us
                    ))
                ));
            }
        }
        if !self.breakdown.is_empty() {
            out.push_str("\nwhere an uncontended acquire's time goes (C=1, acquire+release pairs, one client; means unless named; server = the node the client talks to, from the request's arrival to its reply; log sync = a log append to its fdatasync's end, acquires' and releases' entries alike)\n\n| client on | pairs | client p50 ms | client mean ms | server mean ms | client − server ms | log sync, leader ms | log sync, followers ms |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
            for b in &self.breakdown {
                out.push_str(&format!(
                    "| {} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |\n",
                    b.at,
                    b.pairs,
                    b.client_p50_ms,
                    b.client_mean_ms,
                    b.server_mean_ms,
                    b.client_mean_ms - b.server_mean_ms,
                    b.sync_leader_ms,
                    b.sync_followers_ms
                ));
            }
        }
        out
    }
}

/// The callgrind-run node's output files: `cg.<pid>.<dump number>`.
struct Callgrind {
    pid: u32,
    dir: PathBuf,
}

impl Callgrind {
    fn control(&self, flag: &str) -> Result<()> {
        let out = Command::new("callgrind_control")
            .args([flag, &self.pid.to_string()])
            .output()
            .context("run callgrind_control (Debian's valgrind)")?;
        if !out.status.success() {
            bail!(
                "callgrind_control {flag} {}: {}",
                self.pid,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// Instructions counted since the last zero: dumps, then reads the newest dump's summary.
    async fn take(&self) -> Result<u64> {
        let before = self.dumps()?.len();
        self.control("--dump")?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let dumps = self.dumps()?;
            if dumps.len() > before {
                let text = std::fs::read_to_string(dumps.last().context("no dump")?)?;
                if let Some(n) = summary(&text) {
                    return Ok(n);
                }
            }
            if Instant::now() > deadline {
                bail!("callgrind wrote no dump in {}", self.dir.display());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The numbered dump files, oldest first.
    fn dumps(&self) -> Result<Vec<PathBuf>> {
        let prefix = format!("cg.{}.", self.pid);
        let mut v: Vec<(u32, PathBuf)> = std::fs::read_dir(&self.dir)?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let n = name.strip_prefix(&prefix)?.parse().ok()?;
                Some((n, e.path()))
            })
            .collect();
        v.sort();
        Ok(v.into_iter().map(|(_, p)| p).collect())
    }

    /// `zero`, then `run` (a future does nothing until awaited), then its output, the
    /// instructions it took and its duration.
    async fn measure<T>(&self, run: impl Future<Output = Result<T>>) -> Result<(T, u64, Duration)> {
        self.control("--zero")?;
        let t = Instant::now();
        let out = run.await?;
        let took = t.elapsed();
        Ok((out, self.take().await?, took))
    }
}

/// The `summary:` line of a callgrind dump: the event total (instructions, `Ir`).
fn summary(dump: &str) -> Option<u64> {
    dump.lines()
        .find_map(|l| l.strip_prefix("summary:"))
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
}

/// Names of group `g`, from `prefix`: the `n` first that hash there.
fn names_in(shards: &ShardMap, g: u32, prefix: &str, n: usize) -> Vec<String> {
    (0..)
        .map(|k| format!("{prefix}-{k}"))
        .filter(|name| shards.group_of(name) == g)
        .take(n)
        .collect()
}

async fn acquire_all(
    t: &GrpcTarget,
    c: &mut <GrpcTarget as LockTarget>::Client,
    names: &[String],
    owner: &str,
) -> Result<Vec<Token>> {
    let mut tokens = Vec::with_capacity(names.len());
    for (k, name) in names.iter().enumerate() {
        let token = t
            .acquire(c, name, &format!("{owner}-{k}"))
            .await?
            .with_context(|| format!("{name} was taken"))?;
        tokens.push(token);
    }
    Ok(tokens)
}

async fn release_all(
    t: &GrpcTarget,
    c: &mut <GrpcTarget as LockTarget>::Client,
    names: &[String],
    tokens: &[Token],
) -> Result<()> {
    for (name, token) in names.iter().zip(tokens) {
        if !t.release(c, name, token).await? {
            bail!("release of {name} refused");
        }
    }
    Ok(())
}

async fn keepalive_n(
    t: &GrpcTarget,
    c: &mut <GrpcTarget as LockTarget>::Client,
    n: usize,
) -> Result<()> {
    for _ in 0..n {
        t.keepalive(c, None).await?;
    }
    Ok(())
}

async fn read_all(
    t: &GrpcTarget,
    c: &mut <GrpcTarget as LockTarget>::Client,
    names: &[String],
) -> Result<()> {
    for name in names {
        t.read(c, name).await?;
    }
    Ok(())
}

/// A 3-node cluster whose node `wrap` runs under callgrind, group 1 led by node 2.
async fn callgrind_cluster(
    bin: &Path,
    data_root: &Path,
    dir: &Path,
    groups: u32,
    wrap: usize,
) -> Result<(Cluster, Callgrind)> {
    let cmd = vec![
        "valgrind".to_string(),
        "--tool=callgrind".into(),
        format!("--callgrind-out-file={}/cg.%p", dir.display()),
        "--dump-instr=no".into(),
        "--compress-strings=no".into(),
    ];
    let opts = ServerOpts {
        threads: Some(1),
        leader_balance: true,
        ..Default::default()
    };
    let cluster =
        Cluster::start_wrapped(bin, data_root, 3, groups, opts, Some((wrap, cmd))).await?;
    let pid = cluster
        .pid_of(wrap)
        .context("the callgrind node is not running")?;
    let cg = Callgrind {
        pid,
        dir: dir.to_owned(),
    };
    // Leader balance may still be moving group 1 to its preferred leader.
    let deadline = Instant::now() + Duration::from_secs(60);
    while cluster.leaders().await?[1] != GROUP1_LEADER {
        if Instant::now() > deadline {
            bail!(
                "group 1 is led by node index {} after 60 s, not by its preferred leader (index {GROUP1_LEADER})",
                cluster.leaders().await?[1]
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok((cluster, cg))
}

/// One role's four phases: `ops` acquires of fresh names, their releases, `ops` keepalives
/// and `ops` reads, from a client on node `client`.
async fn role_phases(
    cg: &Callgrind,
    target: &GrpcTarget,
    shards: &ShardMap,
    role: &'static str,
    client: usize,
    ops: usize,
    idle_per_s: f64,
) -> Result<RoleCost> {
    eprintln!("[instructions] {role}: {ops} of each op");
    let tag = role.replace([',', ' '], "");
    let names = names_in(shards, 1, &format!("ins-{tag}"), ops);
    let mut c = target.prepare(client, Duration::from_secs(60)).await?;
    let mut counts = [(0u64, Duration::ZERO); 4];
    let (tokens, n, took) = cg
        .measure(acquire_all(target, &mut c, &names, &tag))
        .await?;
    counts[0] = (n, took);
    let ((), n, took) = cg
        .measure(release_all(target, &mut c, &names, &tokens))
        .await?;
    counts[1] = (n, took);
    let ((), n, took) = cg.measure(keepalive_n(target, &mut c, ops)).await?;
    counts[2] = (n, took);
    let ((), n, took) = cg.measure(read_all(target, &mut c, &names)).await?;
    counts[3] = (n, took);
    target.finish(c).await?;
    let mut per_op = [0.0; 4];
    let mut idle_share = [0.0; 4];
    for (k, (n, took)) in counts.iter().enumerate() {
        let idle = idle_per_s * took.as_secs_f64();
        per_op[k] = (*n as f64 - idle) / ops as f64;
        idle_share[k] = idle / (*n).max(1) as f64;
    }
    Ok(RoleCost {
        role,
        per_op,
        idle_share,
    })
}

/// Warms a cluster up (a few of each op from every client node used), then counts its idle
/// instructions per second over 5 s.
async fn warm_and_idle(
    cg: &Callgrind,
    target: &GrpcTarget,
    shards: &ShardMap,
    clients: &[usize],
) -> Result<f64> {
    eprintln!("[instructions] warm-up");
    for &client in clients {
        let names = names_in(shards, 1, &format!("warm{client}"), 50);
        let mut c = target.prepare(client, Duration::from_secs(60)).await?;
        let tokens = acquire_all(target, &mut c, &names, "warm").await?;
        release_all(target, &mut c, &names, &tokens).await?;
        keepalive_n(target, &mut c, 50).await?;
        read_all(target, &mut c, &names).await?;
        target.finish(c).await?;
    }
    eprintln!("[instructions] idle, 5 s");
    let ((), idle, took) = cg
        .measure(async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok(())
        })
        .await?;
    Ok(idle as f64 / took.as_secs_f64())
}

/// Runs the callgrind roles on two clusters (node 2, then node 1 under callgrind), then the
/// CPU-under-load phases on a plain cluster of the same shape (`load` threads per node and
/// `concurrency` clients; no load phases when `concurrency` is 0).
pub async fn run(
    bin: &Path,
    data_root: &Path,
    groups: u32,
    ops: usize,
    load: ServerOpts,
    concurrency: usize,
    secs: u64,
) -> Result<Report> {
    let shards = ShardMap::initial(groups);
    let dir = tempfile::Builder::new()
        .prefix("lockd-bench-callgrind-")
        .tempdir_in(data_root)?;
    let mut roles = Vec::new();
    let mut idle_per_s = [0.0; 2];
    for (run, wrap) in [GROUP1_LEADER, GROUP1_FOLLOWER].into_iter().enumerate() {
        let (mut cluster, cg) = callgrind_cluster(bin, data_root, dir.path(), groups, wrap).await?;
        let leaders = cluster.leaders().await?;
        // Spread routing: client id i talks to node i % 3.
        let target = GrpcTarget::new(&cluster, Routing::Spread).await?;
        let phases: &[(&'static str, usize)] = if wrap == GROUP1_LEADER {
            &[("leader", GROUP1_LEADER)]
        } else {
            &[
                ("follower, forwarding", GROUP1_FOLLOWER),
                ("follower, replica only", GROUP1_LEADER),
            ]
        };
        let clients: Vec<usize> = phases.iter().map(|p| p.1).collect();
        idle_per_s[run] = warm_and_idle(&cg, &target, &shards, &clients).await?;
        for &(role, client) in phases {
            roles.push(
                role_phases(&cg, &target, &shards, role, client, ops, idle_per_s[run]).await?,
            );
        }
        if cluster.leaders().await? != leaders {
            bail!("a leader changed during the run; the phases measured mixed roles");
        }
        cluster.check_alive()?;
    }
    let (load, load_leaders, breakdown) = if concurrency == 0 {
        (Vec::new(), Vec::new(), Vec::new())
    } else {
        load_costs(bin, data_root, groups, load, concurrency, secs).await?
    };
    Ok(Report {
        ops: ops as u64,
        groups,
        idle_per_s,
        roles,
        concurrency,
        load,
        load_leaders,
        breakdown,
    })
}

/// The most operations one client does in one load phase (the phase also ends at its time).
const LOAD_MAX_PER_CLIENT: usize = 50_000;

/// What one client does in a load phase, from its state.
#[derive(Clone, Copy)]
enum LoadOp {
    Acquire,
    Release,
    Keepalive,
    Read,
    /// The seed's mix, as `compare`'s mix rows send it (`workload::MixClient`).
    Mix,
}

/// One client's state across the load phases: its names and the tokens it holds.
struct Loader {
    id: usize,
    client: <GrpcTarget as LockTarget>::Client,
    held: Vec<(String, Token)>,
    names: Vec<String>,
    next: usize,
    mix: MixClient,
}

impl Loader {
    /// The next fresh name for this client (any group, as a real workload's names are).
    fn fresh(&mut self) -> String {
        let name = format!("load-{}-{}", self.id, self.next);
        self.next += 1;
        name
    }

    /// Runs `op` in a closed loop until `end` or the per-client bound; returns the count.
    async fn phase(&mut self, t: &GrpcTarget, op: LoadOp, end: Instant) -> Result<usize> {
        let mut done = 0;
        while done < LOAD_MAX_PER_CLIENT && Instant::now() < end {
            if let LoadOp::Mix = op {
                self.mix.step(t, &mut self.client).await;
            } else if !self.one(t, op, done).await? {
                break;
            }
            done += 1;
        }
        if let (errors @ 1.., first) = self.mix.errors() {
            bail!("{errors} requests of the mix failed, the first: {first:?}");
        }
        Ok(done)
    }

    /// One op of kind `op` (not `Mix`); false when there was nothing to do (no lock to release).
    async fn one(&mut self, t: &GrpcTarget, op: LoadOp, done: usize) -> Result<bool> {
        match op {
            LoadOp::Acquire => {
                let name = self.fresh();
                let owner = format!("load-{}-{}", self.id, self.next);
                let token = t
                    .acquire(&mut self.client, &name, &owner)
                    .await?
                    .with_context(|| format!("{name} was taken"))?;
                self.held.push((name, token));
            }
            LoadOp::Release => {
                let Some((name, token)) = self.held.pop() else {
                    return Ok(false);
                };
                if !t.release(&mut self.client, &name, &token).await? {
                    bail!("release of {name} refused");
                }
                self.names.push(name);
            }
            LoadOp::Keepalive => t.keepalive(&mut self.client, None).await?,
            LoadOp::Read => {
                if self.names.is_empty() {
                    let name = self.fresh();
                    self.names.push(name);
                }
                let name = &self.names[done % self.names.len()];
                t.read(&mut self.client, name).await?;
            }
            LoadOp::Mix => unreachable!("the mix runs through MixClient"),
        }
        Ok(true)
    }
}

/// CPU per operation under load on a plain cluster: every client runs one op kind at a time.
async fn load_costs(
    bin: &Path,
    data_root: &Path,
    groups: u32,
    opts: ServerOpts,
    concurrency: usize,
    secs: u64,
) -> Result<(Vec<LoadCost>, Vec<usize>, Vec<Breakdown>)> {
    eprintln!("[load] a plain cluster, {concurrency} clients, {secs} s per op kind");
    let mut cluster = Cluster::start(bin, data_root, 3, groups, opts).await?;
    let leaders = cluster.leaders().await?;
    let leader = leaders[1];
    let pids = cluster.pids();
    let target = Arc::new(GrpcTarget::new(&cluster, Routing::Spread).await?);
    let shards = ShardMap::initial(groups);
    let follower = (0..3).find(|&i| i != leader).context("no follower")?;
    let mut breakdown = Vec::new();
    for (at, node) in [("leader", leader), ("follower", follower)] {
        eprintln!("[load] C=1 breakdown, client on the {at}");
        breakdown.push(uncontended(&cluster, &target, &shards, at, node, leader).await?);
    }
    let mut set = JoinSet::new();
    for id in 0..concurrency {
        let t = target.clone();
        set.spawn(async move { (id, t.prepare(id, Duration::from_secs(60)).await) });
    }
    let mut loaders = Vec::with_capacity(concurrency);
    while let Some(j) = set.join_next().await {
        let (id, c) = j?;
        loaders.push(Loader {
            id,
            client: c?,
            held: Vec::new(),
            names: Vec::new(),
            next: 0,
            mix: MixClient::new(id, "lockd-bench/mixload".into()),
        });
    }
    let kinds = [
        LoadOp::Acquire,
        LoadOp::Release,
        LoadOp::Keepalive,
        LoadOp::Read,
        LoadOp::Mix,
    ];
    let mut out = Vec::new();
    for (k, op) in kinds.into_iter().enumerate() {
        eprintln!("[load] {}", LOAD_PHASES[k]);
        let start = Instant::now() + Duration::from_millis(50);
        let end = start + Duration::from_secs(secs);
        tokio::time::sleep_until(start.into()).await;
        let cpu0: Vec<f64> = pids.iter().map(|&p| cpu_secs(Some(p))).collect();
        let self0 = cpu_secs(None);
        let mut set = JoinSet::new();
        for mut l in loaders.drain(..) {
            let t = target.clone();
            set.spawn(async move {
                let r = l.phase(&t, op, end).await;
                (l, r)
            });
        }
        let mut done = 0;
        while let Some(j) = set.join_next().await {
            let (l, r) = j?;
            done += r?;
            loaders.push(l);
        }
        let took = start.elapsed().as_secs_f64();
        let cpu: Vec<f64> = pids
            .iter()
            .zip(&cpu0)
            .map(|(&p, c0)| cpu_secs(Some(p)) - c0)
            .collect();
        let us = |secs: f64| secs * 1e6 / done.max(1) as f64;
        out.push(LoadCost {
            op: LOAD_PHASES[k],
            ops_per_s: done as f64 / took,
            nodes_us: cpu.iter().map(|&c| us(c)).collect(),
            bench_us: us(cpu_secs(None) - self0),
        });
    }
    for l in loaders {
        target.finish(l.client).await?;
    }
    if cluster.leaders().await? != leaders {
        bail!("a leader changed during the load phases");
    }
    cluster.check_alive()?;
    Ok((out, leaders, breakdown))
}

/// The most acquire+release pairs of one C=1 breakdown (it also ends after 5 s).
const BREAKDOWN_PAIRS: usize = 3000;

/// Acquire+release pairs at C=1 on fresh names of group 1, from a client on node `node`; the
/// nodes' histograms are read before and after.
async fn uncontended(
    cluster: &Cluster,
    t: &GrpcTarget,
    shards: &ShardMap,
    at: &'static str,
    node: usize,
    leader: usize,
) -> Result<Breakdown> {
    // (sum, count) of a histogram on each node.
    async fn hist(cluster: &Cluster, name: &str) -> Result<Vec<(f64, f64)>> {
        let mut v = Vec::new();
        for i in 0..cluster.size() {
            let text = cluster.metrics_text(i).await?;
            v.push((
                sum_metric(&text, &format!("{name}_sum")),
                sum_metric(&text, &format!("{name}_count")),
            ));
        }
        Ok(v)
    }
    let op = "lockd_op_duration_seconds";
    let acquire = |s: &str| format!("{s}{{op=\"acquire\"}}");
    let sync = "lockd_log_sync_seconds";
    let names = names_in(shards, 1, &format!("c1-{at}"), BREAKDOWN_PAIRS);
    let mut c = t.prepare(node, Duration::from_secs(60)).await?;
    // A few pairs first, so connections and caches are warm.
    for name in names.iter().take(50) {
        let token = t.acquire(&mut c, name, "warm").await?.context("taken")?;
        t.release(&mut c, name, &token).await?;
    }
    let text = cluster.metrics_text(node).await?;
    let s0 = (
        sum_metric(&text, &acquire(&format!("{op}_sum"))),
        sum_metric(&text, &acquire(&format!("{op}_count"))),
    );
    let y0 = hist(cluster, sync).await?;
    let end = Instant::now() + Duration::from_secs(5);
    let mut lat = Vec::with_capacity(names.len());
    for (k, name) in names.iter().enumerate().skip(50) {
        if Instant::now() > end {
            break;
        }
        let sent = Instant::now();
        let token = t
            .acquire(&mut c, name, &format!("c1-{k}"))
            .await?
            .with_context(|| format!("{name} was taken"))?;
        lat.push(sent.elapsed());
        if !t.release(&mut c, name, &token).await? {
            bail!("release of {name} refused");
        }
    }
    let text = cluster.metrics_text(node).await?;
    let s1 = (
        sum_metric(&text, &acquire(&format!("{op}_sum"))),
        sum_metric(&text, &acquire(&format!("{op}_count"))),
    );
    let y1 = hist(cluster, sync).await?;
    t.finish(c).await?;
    let mean = |d: (f64, f64)| if d.1 > 0.0 { d.0 / d.1 * 1e3 } else { f64::NAN };
    let delta = |i: usize| (y1[i].0 - y0[i].0, y1[i].1 - y0[i].1);
    let (mut fs, mut fc) = (0.0, 0.0);
    for i in (0..y0.len()).filter(|&i| i != leader) {
        fs += delta(i).0;
        fc += delta(i).1;
    }
    let pairs = lat.len();
    let client_mean_ms =
        lat.iter().map(Duration::as_secs_f64).sum::<f64>() * 1e3 / pairs.max(1) as f64;
    lat.sort();
    Ok(Breakdown {
        at,
        pairs,
        client_p50_ms: lat
            .get(pairs / 2)
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3),
        client_mean_ms,
        server_mean_ms: mean((s1.0 - s0.0, s1.1 - s0.1)),
        sync_leader_ms: mean(delta(leader)),
        sync_followers_ms: mean((fs, fc)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_line_is_the_instruction_total() {
        let dump =
            "version: 1\ncreator: callgrind-3.19.0\nevents: Ir\nsummary: 114467\n\nfn=main\n";
        assert_eq!(summary(dump), Some(114467));
        assert_eq!(summary("events: Ir\n"), None);
    }

    #[test]
    fn names_land_in_the_group_asked_for() {
        let shards = ShardMap::initial(4);
        let names = names_in(&shards, 3, "x", 20);
        assert_eq!(names.len(), 20);
        assert!(names.iter().all(|n| shards.group_of(n) == 3));
    }
}
