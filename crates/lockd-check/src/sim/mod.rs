//! `lockd-check sim`: a deterministic in-process simulation of a real lockd cluster.
//!
//! Per seed, one current-thread tokio runtime with paused (virtual) time runs 3 or 5 real
//! `lockd_raft::Node`s (openraft + lockd-core) of two lock groups (plus the meta group), wired
//! through lockd-raft's seams: a simulated network (`net`), in-memory storage with a modelled
//! fsync (`lockd_raft::MemStorage`), a per-node clock rate and a seeded openraft RNG. On each
//! node runs lockd-server's own `Service`, the code behind its HTTP and gRPC ports: session
//! fan-out to every group, routing by the shard map (re-read on `wrong_group` /
//! `bucket_moving`), waits parked until the committed log ends them, forwarded waits from nodes
//! without a replica, and the janitor that gives back grants nobody waits for any more. Its
//! clock is tokio's (so virtual here) and its ids come from the seed. Only the network, the
//! disk and the clock are simulated (`nodes`).
//!
//! Simulated clients (`clients`) open sessions through a home node, keep them alive every
//! TTL/3, take and release names (try and wait), keep lockd-client's own lease rule
//! (`lockd_client::lease`) and write to a fenced store only while they believe they hold the
//! lock. A seeded nemesis (`nemesis`, `topology`) injects message loss and delay bursts,
//! partitions (also isolating the leader), crashes with restart, node and client pauses longer
//! than the TTL, and clock-rate skew within ±5 %, and topology faults: a name's bucket moves to
//! the other group while in use (lockd-server's own mover, which finishes what an earlier
//! interrupted move left), or a move is aborted after the freeze; and membership changes of any
//! group (meta included): a node joins (learner, then voter) and a voter leaves, the leader
//! too. A spare node, started as a joiner, gives the changes somewhere to go, so replica sets
//! wander over the nodes. A draining mark (lockd-server's `Service::set_draining`, with the
//! admin credential) is set on a node and cleared later, under all of the above: leader
//! balancing then hands the node's groups to other voters.
//!
//! What is checked, one file per invariant, is listed in `checks`. The recorded [`History`]
//! then goes through the regular checker.

mod checks;
mod clients;
mod nemesis;
mod net;
mod nodes;
mod topology;
mod world;

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use lockd_client::lease::{default_margin, GroupAnswer, GroupLeases, HoldLease};
use lockd_core::{Applied, Command, Effect, LockMode, LockTable, Op, Reply, SessionId};
use lockd_raft::{EffectSink, GroupError, GroupId, MemStorage, Node, NodeConfig, NodeId, Storage};
use lockd_server::error::{ApiError, ErrorCode};
use lockd_server::service::{AcquireOutcome, AcquireRequest, Credentials, GroupLease, Service};
use lockd_server::waits::Waits;
use tokio::time::Instant;

use crate::checker::{self, Budget, Report, Signature};
use crate::history::{Call, History, Outcome, ProcessId, Record, StoreOp};
use checks::final_checks;
use checks::store_fence::Store;
use clients::*;
use nemesis::*;
use net::SimNet;
use nodes::*;
use topology::*;
use world::*;

/// The lock groups. Names start where the initial shard map puts them and move between the
/// groups (nemesis `move`), so S1 and S2 are checked per name across groups.
const GROUPS: [GroupId; 2] = [1, 2];
/// The group of the service records (`SvcGrant`, ...) the checker reads: one for every group,
/// so that its per-(group, name) checks follow a name across groups.
const NAME_VIEW: u64 = 1;
/// Session TTL of every client.
const TTL: Duration = Duration::from_secs(5);
/// Names the clients contend for.
const NAMES: [&str; 2] = ["a", "b"];
/// Clients per seed.
const CLIENTS: u64 = 4;
/// Tasks doing linearizable reads (next to the clients), so reads overlap.
const READERS: u64 = 2;
/// Bound on one client call (propose, keepalive) before its outcome is unknown.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Nodes beyond the founding replicas: started as joiners (members of no group), they enter
/// groups by the nemesis' member changes, as others leave.
const SPARE_NODES: u64 = 1;
/// Every simulated node's admin bearer token (the nemesis' drain faults present it).
const ADMIN_TOKEN: &str = "lockd-sim-admin";

/// A deliberate bug, to show the simulation catches it (negative control).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sabotage {
    /// Clients ignore their local deadline (and a lost session) while they hold a lock.
    ClientDeadline,
    /// Leaders acknowledge keepalives without their leader-lease check.
    LeaderLease,
    /// The store accepts writes with stale tokens.
    StoreFence,
    /// Reads answer from the local replica without a ReadIndex round.
    StaleRead,
    /// Leaders answer reads from their belief that they lead, with no lease: a deposed leader
    /// that has not heard of its successor answers from its old state.
    ReadLease,
    /// The mover does not carry the sending group's revision to the receiving one, so the
    /// receiving group mints tokens of moved names from its own, lower revision (S2).
    RevisionFloor,
    /// Lock groups serve names of buckets they do not own (no ownership check), so a node
    /// with a stale map sends a name to a group that has given it away (S1).
    Ownership,
}

impl Sabotage {
    /// The violation this sabotage must cause for a seed to count as caught.
    pub fn signature(self) -> Signature {
        match self {
            Sabotage::ClientDeadline => Signature::BeliefOverlap,
            Sabotage::LeaderLease => Signature::GrantWhileBelieved,
            Sabotage::StoreFence => Signature::StaleWrite,
            Sabotage::StaleRead | Sabotage::ReadLease => Signature::StaleRead,
            Sabotage::RevisionFloor => Signature::TokenRegression,
            Sabotage::Ownership => Signature::DoubleGrant,
        }
    }

    /// The `--sabotage` spelling.
    pub fn name(self) -> &'static str {
        match self {
            Sabotage::ClientDeadline => "client-deadline",
            Sabotage::LeaderLease => "leader-lease",
            Sabotage::StoreFence => "store-fence",
            Sabotage::StaleRead => "stale-read",
            Sabotage::ReadLease => "read-lease",
            Sabotage::RevisionFloor => "revision-floor",
            Sabotage::Ownership => "ownership",
        }
    }

    /// Parses the `--sabotage` spelling.
    pub fn parse(s: &str) -> Option<Sabotage> {
        [
            Sabotage::ClientDeadline,
            Sabotage::LeaderLease,
            Sabotage::StoreFence,
            Sabotage::StaleRead,
            Sabotage::ReadLease,
            Sabotage::RevisionFloor,
            Sabotage::Ownership,
        ]
        .into_iter()
        .find(|k| k.name() == s)
    }
}

/// One seed's setup.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub seed: u64,
    /// 3 or 5.
    pub replicas: u64,
    pub sabotage: Option<Sabotage>,
    /// Simulated time the clients and the nemesis run (healing and checks come after).
    pub run_for: Duration,
}

impl SimConfig {
    /// Defaults: 3 replicas, 20 s of faults, no sabotage.
    pub fn new(seed: u64) -> SimConfig {
        SimConfig {
            seed,
            replicas: 3,
            sabotage: None,
            run_for: Duration::from_secs(20),
        }
    }

    /// The command that replays this seed.
    pub fn replay_command(&self) -> String {
        let mut s = format!(
            "lockd-check sim --seed {} --replicas {}",
            self.seed, self.replicas
        );
        if let Some(k) = self.sabotage {
            s.push_str(&format!(" --sabotage {}", k.name()));
        }
        s
    }
}

/// What one seed produced.
#[derive(Debug)]
pub struct SeedOutcome {
    pub seed: u64,
    /// Client operations recorded (acquires, releases, writes).
    pub ops: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, u64>,
    /// Violations found by the simulator's own checks.
    pub violations: Vec<String>,
    /// The kinds of violation found (the simulator's own and the checker's), sorted.
    pub signatures: Vec<Signature>,
    /// Hash of every applied entry (per replica) and every client event, with its time.
    pub digest: u64,
    /// The regular checker's report on the recorded history.
    pub report: Report,
    pub history: History,
    /// Entries applied, summed over replicas.
    pub applies: u64,
    /// Linearizable reads that answered (each checked against the grants acknowledged before
    /// it began).
    pub reads: u64,
    /// Reads the leaders answered from their lease, with no round (counted by each node's
    /// replicas since their last start: a lower bound).
    pub lease_reads: u64,
}

impl SeedOutcome {
    /// Whether the seed failed (own checks or the checker).
    pub fn failed(&self) -> bool {
        !self.violations.is_empty() || self.report.has_violations()
    }

    /// Whether the seed passed but a linearizability verdict is unknown.
    pub fn unknown(&self) -> bool {
        !self.failed() && self.report.is_unknown()
    }

    /// Whether the seed shows the signature violation of `sabotage`.
    pub fn caught(&self, sabotage: Sabotage) -> bool {
        self.signatures.contains(&sabotage.signature())
    }
}

thread_local! {
    /// When this thread's seed started, on its runtime's (paused) clock.
    static SIM_T0: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

/// Stamps `SIM_LOG` lines with the simulated time of the seed running on the thread.
pub struct SimTime;

impl tracing_subscriber::fmt::time::FormatTime for SimTime {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        match SIM_T0.get() {
            Some(t0) => write!(w, "t={:.3}s", t0.elapsed().as_secs_f64()),
            None => write!(w, "t=?"),
        }
    }
}

/// Runs one seed on a fresh current-thread runtime with paused time.
pub fn run_seed(cfg: &SimConfig) -> anyhow::Result<SeedOutcome> {
    anyhow::ensure!(
        cfg.replicas == 3 || cfg.replicas == 5,
        "--replicas must be 3 or 5"
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?;
    lockd_raft::seed_thread_rng(Some(cfg.seed ^ 0x0005_eed0_f0a5_70ad));
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.block_on(simulate(cfg.clone()))
    }));
    lockd_raft::seed_thread_rng(None);
    // Dropping the runtime cancels whatever is left (tasks of stopped nodes).
    drop(rt);
    match out {
        Ok(out) => out,
        // A panic is a failed seed, not the end of the run (a sabotage can corrupt a replica's
        // state past what the core's own assertions allow).
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            let history = History {
                records: Vec::new(),
            };
            let report = checker::check(&history, Budget::default())?;
            Ok(SeedOutcome {
                seed: cfg.seed,
                ops: 0,
                faults: BTreeMap::new(),
                violations: vec![format!("the simulation panicked: {what}")],
                signatures: Vec::new(),
                digest: 0,
                report,
                history,
                applies: 0,
                reads: 0,
                lease_reads: 0,
            })
        }
    }
}

async fn simulate(cfg: SimConfig) -> anyhow::Result<SeedOutcome> {
    let seed = cfg.seed;
    let disks = (1..=cfg.replicas + SPARE_NODES)
        .map(|id| {
            let d = MemStorage::new(
                seed.wrapping_mul(31).wrapping_add(id),
                (Duration::from_micros(100), Duration::from_millis(4)),
            );
            (id, d)
        })
        .collect();
    SIM_T0.set(Some(Instant::now()));
    let w = Arc::new(World {
        t0: Instant::now(),
        rng: Mutex::new(fastrand::Rng::with_seed(seed)),
        net: SimNet::new(seed ^ 0x006e_6574_776f_726b),
        disks,
        records: Mutex::new(Vec::new()),
        digest: Mutex::new(DefaultHasher::new()),
        audit: Mutex::new(Audit::default()),
        services: Mutex::new(BTreeMap::new()),
        store: Mutex::new(Store::default()),
        violations: Mutex::new(Vec::new()),
        signatures: Mutex::default(),
        holds: Mutex::new(Vec::new()),
        acked_grants: Mutex::new(Vec::new()),
        faults: Mutex::new(BTreeMap::new()),
        ops: AtomicU64::new(0),
        reads: AtomicU64::new(0),
        next_op: AtomicU64::new(1),
        stop: AtomicBool::new(false),
        client_pause: Mutex::new(BTreeMap::new()),
        pending_pause: Mutex::new(BTreeMap::new()),
        trace: Mutex::new(std::env::var_os("SIM_TRACE").map(|_| Vec::new())),
        sessions: Mutex::new(BTreeMap::new()),
        cfg,
    });
    w.push(Record::Meta {
        version: crate::history::FORMAT_VERSION,
        workload: "sim".into(),
        notes: w.cfg.replay_command(),
    });
    for name in NAMES {
        w.push(Record::StoreInit {
            key: name.into(),
            value: String::new(),
        });
    }
    // The lowest id initialises the groups, so start it last (the spares first).
    for id in (1..=w.node_count()).rev() {
        start_node(&w, id).await?;
    }
    bootstrap(&w).await?;
    let nem = tokio::spawn(nemesis(w.clone()));
    let janitor = tokio::spawn(move_janitor(w.clone()));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| tokio::spawn(client(w.clone(), i)))
        .chain((0..READERS).map(|i| tokio::spawn(reader(w.clone(), i))))
        .collect();
    tokio::time::sleep(w.cfg.run_for).await;
    w.stop.store(true, Ordering::Relaxed);
    let _ = nem.await;
    let _ = janitor.await;
    for c in clients {
        if tokio::time::timeout(Duration::from_secs(30), c)
            .await
            .is_err()
        {
            w.violation("a client did not stop within 30 s".into());
        }
    }
    // Heal: no partitions, pauses or loss; every node up.
    w.net.heal();
    lock(&w.client_pause).clear();
    lock(&w.pending_pause).clear();
    tokio::time::sleep(Duration::from_secs(5)).await;
    for id in 1..=w.node_count() {
        if w.net.node(id).is_none() {
            start_node(&w, id).await?;
        }
    }
    let converged = converge(&w).await;
    final_checks(&w, converged);
    every_node_serves(&w).await;
    let history = History {
        records: std::mem::take(&mut *lock(&w.records)),
    };
    // Outside the history (its names are its own): a release wakes a waiter on another node.
    every_node_wakes(&w).await;
    let lease_reads = lease_reads(&w);
    for id in 1..=w.node_count() {
        stop_service(&w, id);
        if let Some(node) = w.net.down(id) {
            node.shutdown().await;
        }
    }
    let report = checker::check(
        &history,
        Budget {
            max_steps: 5_000_000,
            max_time: Duration::from_secs(20),
        },
    )?;
    let digest = lock(&w.digest).finish();
    if let (Some(path), Some(t)) = (std::env::var_os("SIM_TRACE"), lock(&w.trace).take()) {
        let path = format!("{}.{seed}.{digest:016x}", path.to_string_lossy());
        std::fs::write(&path, t.join("\n"))?;
        if let Some(l) = w.net.lock().log.take() {
            std::fs::write(format!("{path}.net"), l.join("\n"))?;
        }
    }
    let violations = std::mem::take(&mut *lock(&w.violations));
    let mut signatures = std::mem::take(&mut *lock(&w.signatures));
    signatures.extend(report.signatures());
    let faults = std::mem::take(&mut *lock(&w.faults));
    let applies = lock(&w.audit).applies;
    Ok(SeedOutcome {
        seed,
        ops: w.ops.load(Ordering::Relaxed),
        reads: w.reads.load(Ordering::Relaxed),
        lease_reads,
        faults,
        violations,
        signatures: signatures.into_iter().collect(),
        digest,
        report,
        history,
        applies,
    })
}

/// Reads the nodes' replicas answered from their leader lease since each last started (reads
/// forwarded by followers included: the leader answers those).
fn lease_reads(w: &World) -> u64 {
    (1..=w.node_count())
        .filter_map(|id| w.net.node(id))
        .map(|(_, node)| {
            node.group_ids()
                .into_iter()
                .filter_map(|g| node.group(g))
                .map(|g| g.status().lease_reads)
                .sum::<u64>()
        })
        .sum()
}

/// Aggregates of a multi-seed run.
#[derive(Debug, Default)]
pub struct RunSummary {
    pub seeds: u64,
    pub failed_seeds: Vec<u64>,
    /// Seeds with no violation but an unknown linearizability verdict.
    pub unknown_seeds: Vec<u64>,
    pub ops: u64,
    pub reads: u64,
    pub lease_reads: u64,
    pub applies: u64,
    pub faults: BTreeMap<String, u64>,
    pub violations: u64,
    pub checker_violations: u64,
    pub double_grants: u64,
    pub token_regressions: u64,
    pub grants_to_expired_sessions: u64,
    pub stale_writes_accepted: u64,
    pub writes_rejected_stale: u64,
    pub not_linearizable: u64,
    pub secs: f64,
}

impl RunSummary {
    /// Adds one seed's outcome.
    pub fn add(&mut self, o: &SeedOutcome) {
        self.seeds += 1;
        if o.failed() {
            self.failed_seeds.push(o.seed);
        }
        if o.unknown() {
            self.unknown_seeds.push(o.seed);
        }
        self.ops += o.ops;
        self.reads += o.reads;
        self.lease_reads += o.lease_reads;
        self.applies += o.applies;
        for (k, n) in &o.faults {
            *self.faults.entry(k.clone()).or_insert(0) += n;
        }
        self.violations += o.violations.len() as u64;
        if o.report.has_violations() {
            self.checker_violations += 1;
        }
        let d = &o.report.direct;
        self.double_grants += d.double_grants;
        self.token_regressions += d.token_regressions;
        self.grants_to_expired_sessions += d.grants_to_expired_sessions;
        self.stale_writes_accepted += d.stale_writes_accepted;
        self.writes_rejected_stale += d.writes_rejected_stale;
        self.not_linearizable += o.report.objects_not_linearizable as u64;
    }

    /// The one `RESULT` line of a run.
    pub fn result_line(&self) -> String {
        let mut s = format!(
            "RESULT sim seeds={} failed_seeds={} unknown_seeds={} ops={} reads={} lease_reads={} \
             applies={} seeds_per_s={:.2}",
            self.seeds,
            self.failed_seeds.len(),
            self.unknown_seeds.len(),
            self.ops,
            self.reads,
            self.lease_reads,
            self.applies,
            self.seeds as f64 / self.secs.max(1e-9)
        );
        let total: u64 = self.faults.values().sum();
        s.push_str(&format!(" faults={total}"));
        for (k, n) in &self.faults {
            s.push_str(&format!(" faults_{k}={n}"));
        }
        s.push_str(&format!(
            " sim_violations={} checker_failed_seeds={} objects_not_linearizable={} \
             double_grants={} token_regressions={} grants_to_expired_sessions={} \
             stale_writes_accepted={} writes_rejected_stale={} unknown={} violations={}",
            self.violations,
            self.checker_violations,
            self.not_linearizable,
            self.double_grants,
            self.token_regressions,
            self.grants_to_expired_sessions,
            self.stale_writes_accepted,
            self.writes_rejected_stale,
            self.unknown_seeds.len(),
            !self.failed_seeds.is_empty()
        ));
        s
    }
}

// ------------------------------------------------------------------------------------------
// Command line

/// Arguments of `lockd-check sim`.
#[derive(clap::Args, Clone, Debug)]
pub struct SimArgs {
    /// Number of seeds to run (from --seed on).
    #[arg(long, default_value_t = 20)]
    pub seeds: u64,
    /// First seed (alone, with --seeds 1, it replays that seed).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Replicas of each lock group: 3 or 5.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(3..=5))]
    pub replicas: u64,
    /// NEGATIVE CONTROL: client-deadline (signature: two clients believed they held a name at
    /// once), leader-lease (a session expired while its client still believed, within the
    /// deadline the service had extended), store-fence (the store accepted a stale write) or
    /// stale-read (a read missed an acknowledged grant), revision-floor (a bucket move does not
    /// carry the sending group's revision: a name's token falls) or ownership (groups serve
    /// names they do not own: two groups grant one name). The run then passes only if some
    /// seed shows that signature violation; other failures do not count.
    #[arg(long, value_parser = ["client-deadline", "leader-lease", "store-fence", "stale-read", "read-lease", "revision-floor", "ownership"])]
    pub sabotage: Option<String>,
    /// Simulated seconds of faults per seed.
    #[arg(long, default_value_t = 20)]
    pub sim_secs: u64,
    /// Run each seed twice and compare the trace digests.
    #[arg(long)]
    pub check_determinism: bool,
    /// Print every seed's line, not just failures.
    #[arg(long)]
    pub verbose: bool,
    /// Exit 0, not 3, when a seed's verdict is unknown (still counted in `unknown_seeds=`).
    #[arg(long)]
    pub allow_unknown: bool,
}

/// `lockd-check sim`: runs the seeds, prints failures with their replay command and one
/// `RESULT` line. Exit code 1 if a seed failed (under sabotage: if no seed showed the
/// sabotage's signature), else 3 if a seed's verdict was unknown (0 with `--allow-unknown`).
pub fn main(args: SimArgs) -> anyhow::Result<std::process::ExitCode> {
    let sabotage = match args.sabotage.as_deref() {
        Some(s) => Some(Sabotage::parse(s).ok_or_else(|| anyhow::anyhow!("bad --sabotage {s}"))?),
        None => None,
    };
    let started = std::time::Instant::now();
    let mut sum = RunSummary::default();
    let mut nondeterministic = Vec::new();
    let mut sabotage_first_fail = None;
    let mut caught = 0u64;
    for seed in args.seed..args.seed.saturating_add(args.seeds) {
        let cfg = SimConfig {
            seed,
            replicas: args.replicas,
            sabotage,
            run_for: Duration::from_secs(args.sim_secs.max(5)),
        };
        let o = run_seed(&cfg)?;
        if args.check_determinism {
            let again = run_seed(&cfg)?;
            if again.digest != o.digest {
                println!(
                    "seed {seed}: NOT DETERMINISTIC: digest {:016x} then {:016x}; replay: {} \
                     --check-determinism",
                    o.digest,
                    again.digest,
                    cfg.replay_command()
                );
                nondeterministic.push(seed);
            }
        }
        if sabotage.is_some_and(|k| o.caught(k)) {
            caught += 1;
            sabotage_first_fail.get_or_insert(sum.seeds + 1);
        }
        if o.unknown() {
            println!(
                "seed {seed}: UNKNOWN (linearizability search out of budget); replay: {}",
                cfg.replay_command()
            );
        }
        if o.failed() {
            println!(
                "seed {seed}: FAILED ({} sim violations, checker violations: {}); replay: {}",
                o.violations.len(),
                o.report.has_violations(),
                cfg.replay_command()
            );
            for v in o.violations.iter().take(5) {
                println!("  {v}");
            }
            for d in o.report.details.iter().take(5) {
                println!("  checker: {d}");
            }
        } else if args.verbose {
            println!(
                "seed {seed}: ok ops={} applies={} faults={} digest={:016x}",
                o.ops,
                o.applies,
                o.faults.values().sum::<u64>(),
                o.digest
            );
        }
        sum.add(&o);
    }
    sum.secs = started.elapsed().as_secs_f64();
    let mut line = sum.result_line();
    if args.check_determinism {
        line.push_str(&format!(
            " nondeterministic_seeds={}",
            nondeterministic.len()
        ));
    }
    if let Some(k) = sabotage {
        line.push_str(&format!(
            " sabotage={} signature={} caught_seeds={caught} first_caught_seed_no={}",
            k.name(),
            k.signature(),
            sabotage_first_fail.map_or("none".into(), |n: u64| n.to_string())
        ));
    }
    println!("{line}");
    let violation = !nondeterministic.is_empty()
        || if sabotage.is_some() {
            caught == 0
        } else {
            !sum.failed_seeds.is_empty()
        };
    Ok(checker::exit_code(
        violation,
        !sum.unknown_seeds.is_empty(),
        args.allow_unknown,
    ))
}
