//! `lockd-check`: judge a recorded history, or run the checker's self-test against PostgreSQL.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use lockd_check::checker::{self, Budget, Report};
use lockd_check::demo::{run_lockset, LocksetConfig};
use lockd_check::history::History;
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
    /// Exits 1 if the run shows a violation.
    Check {
        #[arg(required = true)]
        files: Vec<PathBuf>,
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
    /// Deterministic simulation of a real lockd Raft group (in-process nodes, simulated
    /// network, disk and clocks) with seeded faults. A failing seed prints its replay command;
    /// exits 1 if any seed fails.
    Sim(lockd_check::sim::SimArgs),
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
        Cmd::Sim(args) => lockd_check::sim::main(args),
        Cmd::Check { files, budget } => {
            let h = History::load(&files)?;
            let r = checker::check(&h, budget.budget())?;
            print_report(&r);
            Ok(if r.has_violations() {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            })
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
