//! `lockd-check`: judge a recorded history, or run the checker's self-test against PostgreSQL.
//!
//! Exit codes of `check`, `nemesis` and `sim`:
//! * 0: pass;
//! * 1: a violation (or, under `--sabotage`, the sabotage's signature violation was NOT found;
//!   for `nemesis`, also a failed progress check);
//! * 2: bad input or a harness error;
//! * 3: no violation, but at least one linearizability verdict is unknown (the search ran out
//!   of budget). `--allow-unknown` makes that 0 (long exploratory runs); unknown verdicts are
//!   still counted (`unknown=N` in the RESULT line) and printed.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use lockd_check::checker::{self, exit_code, Budget, Report};
use lockd_check::demo::{run_lockset, LocksetConfig};
use lockd_check::history::History;
use lockd_check::nemesis;
use lockd_check::store::{Fencing, PG_ENV};

#[derive(Parser)]
#[command(name = "lockd-check", about = "Correctness harness for lockd", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Clone, Copy)]
struct BudgetArgs {
    /// Search steps allowed per object before its verdict is "unknown".
    #[arg(long, default_value_t = 50_000_000)]
    max_steps: u64,
    /// Seconds allowed per object before its verdict is "unknown".
    #[arg(long, default_value_t = 60)]
    max_seconds: u64,
}

impl BudgetArgs {
    fn budget(self) -> Budget {
        Budget {
            max_steps: self.max_steps,
            max_time: Duration::from_secs(self.max_seconds),
        }
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Check saved histories (JSON lines; several files are merged, e.g. one per process).
    /// Exits 0 on a pass, 1 on a violation, 3 if no violation but a verdict is unknown.
    Check {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Exit 0, not 3, when a verdict is unknown (still counted in `unknown=`).
        #[arg(long)]
        allow_unknown: bool,
        #[command(flatten)]
        budget: BudgetArgs,
    },
    /// CHECKER SELF-TEST (a toy in-memory lease lock, not lockd): the lock-set workload against
    /// the PostgreSQL store with deliberate pauses past the lease. Unfenced must lose updates;
    /// fenced must lose none. Exits 1 if that does not hold.
    DemoLockset {
        /// Fenced reads and writes (`WHERE fence <= $token`).
        #[arg(
            long,
            conflicts_with = "unfenced",
            required_unless_present = "unfenced"
        )]
        fenced: bool,
        /// No fence check (the control run).
        #[arg(long)]
        unfenced: bool,
        /// PostgreSQL connection string.
        #[arg(long, env = PG_ENV)]
        pg: String,
        #[arg(long, default_value_t = 5)]
        workers: u64,
        #[arg(long, default_value_t = 12)]
        adds_per_worker: u64,
        #[arg(long, default_value_t = 150)]
        ttl_ms: u64,
        #[arg(long, default_value_t = 450)]
        pause_ms: u64,
        #[arg(long, default_value_t = 0.2)]
        pause_probability: f64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// NEGATIVE CONTROL: "store-fence" (the store claims fencing but checks nothing; needs
        /// --fenced) or "client-deadline" (clients believe they hold the lock past the lease).
        /// The self-test then passes only if the checker FAILS the run.
        #[arg(long, value_parser = ["store-fence", "client-deadline"])]
        sabotage: Option<String>,
        /// Save the history here (re-check it with `lockd-check check FILE`).
        #[arg(long)]
        history: Option<PathBuf>,
        /// Keep the store's schema for inspection instead of dropping it.
        #[arg(long)]
        keep_tables: bool,
        #[command(flatten)]
        budget: BudgetArgs,
    },
    /// Real processes under faults: three `lockd serve` nodes, worker processes using
    /// lockd-client, a fenced PostgreSQL store, and seeded kills, pauses, partitions and clock
    /// jumps. Prints a RESULT line; exits 0 on a pass, 1 on a violation or a failed progress
    /// check (with --sabotage: 0 only if the sabotage's signature violation was found), 3 if no
    /// violation but a verdict is unknown.
    Nemesis(NemesisArgs),
    /// The design's latency across zones: real nodes over zones whose peer links between zones
    /// run through a delay proxy; an uncontended acquire's and a keepalive's p50/p99 from a
    /// client in the leader's zone and from one in another. Prints a table and a RESULT line.
    Latency(LatencyArgs),
    /// One worker process of `nemesis` (started by it).
    #[command(hide = true)]
    NemesisWorker(WorkerArgs),
    /// Deterministic simulation of a real lockd Raft group (in-process nodes, simulated
    /// network, disk and clocks) with seeded faults. A failing seed prints its replay command;
    /// exits 1 if any seed fails (with --sabotage: unless some seed shows the sabotage's
    /// signature violation), 3 if none fails but a seed's verdict is unknown.
    Sim(lockd_check::sim::SimArgs),
}

#[derive(clap::Args)]
struct LatencyArgs {
    /// The lockd binary to run as `lockd serve`.
    #[arg(long, env = "LOCKD_BIN", default_value = "target/debug/lockd")]
    lockd_bin: PathBuf,
    /// Where node data and logs go (cleared first).
    #[arg(long, default_value = "target/latency")]
    dir: PathBuf,
    /// Nodes, laid over the zones round-robin (5 over 3: 2+2+1, the design's shape).
    #[arg(long, default_value_t = 5)]
    nodes: u64,
    #[arg(long, default_value_t = 3)]
    zones: u64,
    /// Lock groups; every node hosts every group. A keepalive reaches every group's leader.
    #[arg(long, default_value_t = 1)]
    groups: u32,
    /// Microseconds each way on every peer link between zones (500: the design's 1 ms round
    /// trip between zones).
    #[arg(long, default_value_t = 500)]
    delay_us: u64,
    /// Timed calls per client and kind.
    #[arg(long, default_value_t = 2000)]
    ops: usize,
}

#[derive(clap::Args)]
struct NemesisArgs {
    /// Seconds of faults (the run takes longer: start, heal, check).
    #[arg(long, default_value_t = 60)]
    duration: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The lockd binary to run as `lockd serve`.
    #[arg(long, env = "LOCKD_BIN", default_value = "target/debug/lockd")]
    lockd_bin: PathBuf,
    /// PostgreSQL connection string for the fenced store.
    #[arg(long, env = PG_ENV)]
    pg: String,
    /// Where node data, logs and histories go (re-check with `lockd-check check DIR/*.jsonl`).
    #[arg(long, default_value = "target/nemesis")]
    dir: PathBuf,
    /// Session TTL of the workers (pauses and partitions last 2-5 TTLs).
    #[arg(long, default_value_t = 2000)]
    ttl_ms: u64,
    #[arg(long, default_value_t = 3)]
    mutex_workers: u64,
    #[arg(long, default_value_t = 2)]
    lockset_workers: u64,
    #[arg(long, default_value_t = 2)]
    groups: u32,
    /// Log entries between snapshots on the nodes (`lockd serve --snapshot-every`): small, so
    /// snapshots, log purges and snapshot catch-up of a killed or cut-off node happen under the
    /// faults.
    #[arg(long, default_value_t = 50)]
    snapshot_every: u64,
    /// Fault kinds to draw from (comma-separated).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "kill,pause-node,pause-client,partition,clock,move,restart,replace,wipe,drain"
    )]
    faults: Vec<nemesis::FaultKind>,
    /// Run a scripted topology scenario instead of the random faults (`grow`: 3 nodes and one
    /// lock group; join 3 nodes, create group 2 on them, move half the buckets, replace a
    /// SIGKILLed node by a new id, restart every node in turn. Needs --groups 1 and a
    /// --duration long enough for the script (90 s or more). `zones`: 5 nodes in 3 zones
    /// (z1: 1,4; z2: 2,5; z3: 3), every group on all 5; lose a whole zone, another, then cut a
    /// zone off, in turn until the duration is used up; needs --groups 2 or more, and 60 s or
    /// more for one cycle).
    #[arg(long, value_enum)]
    scenario: Option<nemesis::Scenario>,
    /// NEGATIVE CONTROL: break one safety mechanism; the run then passes only if its signature
    /// violation is found: store-fence -> a stale write accepted / fenced update lost;
    /// client-deadline and leader-lease -> a belief overlap (a grant while another worker
    /// still believed it held the lock). Other violations do not count.
    #[arg(long, value_enum)]
    sabotage: Option<nemesis::Sabotage>,
    /// Chance per lock-set round that a worker stops itself (SIGSTOP) between its read and
    /// its write, the place where a pause loses updates; the nemesis resumes it 2-5 TTLs later.
    #[arg(long, default_value_t = 0.03)]
    self_pause: f64,
    /// Do not run nodes under libfaketime (drops the clock fault).
    #[arg(long)]
    no_faketime: bool,
    /// Use YOUR running cluster instead of starting one: its gRPC endpoints (comma-separated).
    /// Its namespace config needs the `nemesis/` namespace (see README). Only worker pauses
    /// are injected; kill, pause or partition your nodes by hand meanwhile.
    #[arg(long, value_delimiter = ',')]
    endpoints: Vec<String>,
    /// With --endpoints: your nodes' `--audit-log` files, for the service-side checks.
    #[arg(long, value_delimiter = ',', requires = "endpoints")]
    audit_logs: Vec<PathBuf>,
    /// Exit 0, not 3, when a verdict is unknown (still counted in `unknown=`).
    #[arg(long)]
    allow_unknown: bool,
    #[command(flatten)]
    budget: BudgetArgs,
}

#[derive(clap::Args)]
struct WorkerArgs {
    #[arg(long)]
    id: u64,
    #[arg(long, value_delimiter = ',')]
    endpoints: Vec<String>,
    #[arg(long)]
    ttl_ms: u64,
    #[arg(long)]
    pg: String,
    #[arg(long)]
    store_ns: String,
    #[arg(long)]
    history: PathBuf,
    #[arg(long)]
    origin_ns: u64,
    #[arg(long)]
    run_for_s: u64,
    #[arg(long)]
    seed: u64,
    #[arg(long)]
    lockset: bool,
    #[arg(long)]
    sabotage_client_deadline: bool,
    #[arg(long)]
    sabotage_store_fence: bool,
    #[arg(long, default_value_t = 0.0)]
    self_pause: f64,
}

fn run_nemesis(a: NemesisArgs) -> anyhow::Result<ExitCode> {
    let mut faults = a.faults.clone();
    if a.no_faketime {
        faults.retain(|f| *f != nemesis::FaultKind::Clock);
    }
    faults.sort();
    faults.dedup();
    let cfg = nemesis::NemesisConfig {
        lockd_bin: a.lockd_bin.clone(),
        self_exe: std::env::current_exe()?,
        dir: a.dir.clone(),
        duration: Duration::from_secs(a.duration.max(1)),
        seed: a.seed,
        pg: a.pg.clone(),
        ttl: Duration::from_millis(a.ttl_ms.clamp(1000, 60_000)),
        mutex_workers: a.mutex_workers.clamp(1, 32),
        lockset_workers: a.lockset_workers.clamp(0, 32),
        lock_groups: a.groups.clamp(1, 16),
        snapshot_every: a.snapshot_every.max(10),
        faults,
        scenario: a.scenario,
        sabotage: a.sabotage,
        faketime: !a.no_faketime,
        budget: a.budget.budget(),
        self_pause: a.self_pause.clamp(0.0, 1.0),
        external: (!a.endpoints.is_empty()).then(|| (a.endpoints.clone(), a.audit_logs.clone())),
    };
    if cfg.external.is_none() && !cfg.lockd_bin.exists() {
        anyhow::bail!(
            "--lockd-bin {} does not exist (build it: cargo build -p lockd-server)",
            cfg.lockd_bin.display()
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let out = rt.block_on(nemesis::run(&cfg))?;
    for d in &out.report.details {
        println!("  {d}");
    }
    for l in out.availability.lines() {
        println!("{l}");
    }
    println!("{}", out.result_line(&cfg));
    println!(
        "history: {} and {}/worker-*.jsonl (re-check: lockd-check check {}/*.jsonl)",
        out.history_file.display(),
        cfg.dir.display(),
        cfg.dir.display()
    );
    for p in &out.progress_failures {
        println!("nemesis: progress check failed: {p}");
    }
    let violation = match cfg.sabotage {
        Some(s) => {
            let want = s.signature();
            let caught = out.report.signatures().contains(&want);
            println!(
                "negative control {s:?}: {} (its signature: {want})",
                if caught {
                    "CAUGHT (good)"
                } else {
                    "signature NOT found"
                }
            );
            !caught
        }
        None => out.has_violations(),
    };
    let failed = violation || !out.progress_failures.is_empty();
    Ok(exit_code(failed, out.report.is_unknown(), a.allow_unknown))
}

fn run_worker(a: WorkerArgs) -> anyhow::Result<ExitCode> {
    let cfg = nemesis::worker::WorkerConfig {
        id: a.id,
        endpoints: a.endpoints,
        namespace: nemesis::NAMESPACE.into(),
        ttl: Duration::from_millis(a.ttl_ms),
        lockset: a.lockset,
        pg: a.pg,
        store_ns: a.store_ns,
        history: a.history,
        origin_ns: a.origin_ns,
        run_for: Duration::from_secs(a.run_for_s),
        seed: a.seed,
        sabotage_client_deadline: a.sabotage_client_deadline,
        sabotage_store_fence: a.sabotage_store_fence,
        self_pause: a.self_pause.clamp(0.0, 1.0),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(nemesis::worker::run(cfg))?;
    Ok(ExitCode::SUCCESS)
}

fn print_report(r: &Report) {
    for d in &r.details {
        println!("  {d}");
    }
    println!(
        "checked {} objects in {} ms ({} search steps)",
        r.objects_checked, r.check_ms, r.search_steps
    );
    println!("{}", r.result_line());
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("lockd-check: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run() -> anyhow::Result<ExitCode> {
    match Cli::parse().cmd {
        Cmd::Nemesis(a) => run_nemesis(a),
        Cmd::Latency(a) => {
            anyhow::ensure!(
                a.lockd_bin.exists(),
                "--lockd-bin {} does not exist (build it: cargo build -p lockd-server)",
                a.lockd_bin.display()
            );
            let cfg = lockd_check::latency::LatencyConfig {
                lockd_bin: a.lockd_bin,
                dir: a.dir,
                nodes: a.nodes.clamp(2, 9),
                zones: a.zones,
                groups: a.groups.clamp(1, 16),
                delay: Duration::from_micros(a.delay_us.min(100_000)),
                ops: a.ops.min(1_000_000),
            };
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            rt.block_on(lockd_check::latency::run(cfg))?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::NemesisWorker(a) => run_worker(a),
        Cmd::Sim(args) => {
            // `SIM_LOG=lockd_server=debug,...`: the nodes' logs, stamped with simulated time.
            if let Ok(filter) = std::env::var("SIM_LOG") {
                tracing_subscriber::fmt()
                    .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                    .with_timer(lockd_check::sim::SimTime)
                    .with_writer(std::io::stderr)
                    .init();
            }
            lockd_check::sim::main(args)
        }
        Cmd::Check {
            files,
            allow_unknown,
            budget,
        } => {
            let h = History::load(&files)?;
            let r = checker::check(&h, budget.budget())?;
            print_report(&r);
            Ok(exit_code(r.has_violations(), r.is_unknown(), allow_unknown))
        }
        Cmd::DemoLockset {
            fenced,
            unfenced: _,
            pg,
            workers,
            adds_per_worker,
            ttl_ms,
            pause_ms,
            pause_probability,
            seed,
            sabotage,
            history,
            keep_tables,
            budget,
        } => {
            let fencing = match (fenced, sabotage.as_deref()) {
                (true, Some("store-fence")) => Fencing::SabotagedNoCheck,
                (false, Some("store-fence")) => {
                    anyhow::bail!("--sabotage store-fence needs --fenced")
                }
                (true, _) => Fencing::Fenced,
                (false, _) => Fencing::Unfenced,
            };
            let mut cfg = LocksetConfig::new(pg, fencing);
            cfg.workers = workers.clamp(1, 64);
            cfg.adds_per_worker = adds_per_worker.clamp(1, 10_000);
            cfg.ttl = Duration::from_millis(ttl_ms.max(10));
            cfg.margin = cfg.ttl / 5;
            cfg.pause = Duration::from_millis(pause_ms);
            cfg.pause_probability = pause_probability.clamp(0.0, 1.0);
            cfg.seed = seed;
            cfg.sabotage_client_deadline = sabotage.as_deref() == Some("client-deadline");
            cfg.drop_tables = !keep_tables;
            println!(
                "lock-set self-test ({}; toy in-memory lease lock, NOT lockd): {} workers x {} adds, \
                 ttl {} ms, pauses of {} ms with p={}",
                if fenced { "fenced" } else { "unfenced" },
                cfg.workers,
                cfg.adds_per_worker,
                ttl_ms,
                pause_ms,
                cfg.pause_probability
            );
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            let rec = rt.block_on(run_lockset(&cfg))?;
            let h = rec.history();
            if let Some(p) = &history {
                h.save(p)
                    .with_context(|| format!("save history to {}", p.display()))?;
                println!("history saved to {}", p.display());
            }
            let r = checker::check(&h, budget.budget())?;
            print_report(&r);
            let d = &r.direct;
            let ok = if let Some(what) = &sabotage {
                println!("negative control ({what}): the checker must fail this run");
                r.has_violations()
            } else if fenced {
                !r.has_violations() && d.lost_updates_fenced == Some(0)
            } else {
                // The control must show losses, or the harness cannot see overlap.
                !r.has_violations() && d.lost_updates_unfenced.unwrap_or(0) > 0
            };
            println!(
                "self-test {}: {}",
                if ok { "PASSED" } else { "FAILED" },
                if sabotage.is_some() {
                    "a sabotaged run must be reported as a violation"
                } else if fenced {
                    "the fenced run must lose no acknowledged update"
                } else {
                    "the unfenced control run must lose acknowledged updates"
                }
            );
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}
