//! `lockd-bench`: measures lockd side by side with what users would otherwise run for locks
//! (a 3-member etcd, Redis with and without an fsync'd AOF), on the same machine in one run.
//!
//! `lockd-bench compare [--quick] [--systems etcd,redis-aof,...]` installs missing Debian
//! packages, starts each system on loopback in a temp dir, runs the same workloads against it
//! (see `workload`), stops it by pid, and prints one table with ratios to a baseline system.

mod etcd;
mod http;
mod procs;
mod redis_target;
mod report;
mod target;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};

use crate::target::SystemKind;
use crate::workload::{Ctx, Plan, Row};

#[derive(Parser)]
#[command(version, about = "Benchmarks lockd against etcd and Redis")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run every workload against each system and print one comparison table.
    Compare {
        /// Short runs (about 25 s per system) instead of the full durations.
        #[arg(long)]
        quick: bool,
        /// Systems to run, in order.
        #[arg(
            long,
            value_enum,
            value_delimiter = ',',
            default_value = "etcd,etcd-lock,redis-aof,redis-mem"
        )]
        systems: Vec<SystemKind>,
        /// The system the ratio column divides by.
        #[arg(long, value_enum, default_value = "etcd")]
        baseline: SystemKind,
        /// Where the servers' temp data dirs go (must be a real disk for fsync to mean anything).
        #[arg(long)]
        data_root: Option<PathBuf>,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // Dropping the run on Ctrl-C drops every server guard it owns, which stops them by pid.
    let result = tokio::select! {
        r = run(cli) => r,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("interrupted: stopped every server started");
            return ExitCode::from(130);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<()> {
    let Cmd::Compare {
        quick,
        systems,
        baseline,
        data_root,
    } = cli.cmd;
    let data_root = data_root.unwrap_or_else(std::env::temp_dir);
    let plan = Plan::new(quick);
    let mut needs = Vec::new();
    for s in &systems {
        match s {
            SystemKind::Etcd | SystemKind::EtcdLock => needs.push(("etcd", "etcd-server")),
            SystemKind::RedisAof | SystemKind::RedisMem => {
                needs.push(("redis-server", "redis-server"))
            }
            SystemKind::Lockd => {}
        }
    }
    procs::ensure_packages(&needs)?;

    let started = std::time::SystemTime::now();
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    for (i, &s) in systems.iter().enumerate() {
        eprintln!("== [{}/{}] {}", i + 1, systems.len(), s.label());
        match run_system(s, &plan, &data_root).await {
            Ok(r) => rows.extend(r),
            Err(e) => {
                eprintln!("{}: FAILED: {e:#}", s.label());
                failed.push(s.label());
            }
        }
    }

    let secs = started.elapsed().map(|d| d.as_secs()).unwrap_or(0);
    println!(
        "lockd-bench compare{} ({secs} s)",
        if quick { " --quick" } else { "" }
    );
    println!(
        "machine: {} cores; {}; {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        procs::version_of("etcd"),
        procs::version_of("redis-server"),
    );
    println!("ops/s counts every request; cycle latencies are the acquires'; open-loop latencies");
    println!("run from the intended send time; cpu = % of one core (servers / lockd-bench)\n");
    print!("{}", report::table(&rows, baseline.label()));
    if !failed.is_empty() {
        bail!("failed: {}", failed.join(", "));
    }
    Ok(())
}

/// Starts one system, runs every workload against it, stops it (the guards' drop).
async fn run_system(s: SystemKind, plan: &Plan, data_root: &std::path::Path) -> Result<Vec<Row>> {
    let label = s.label();
    match s {
        // LOCKD TARGET GOES HERE: start `lockd dev --nodes 3` (3 processes, fsync on) behind a
        // `procs::Server` guard per node, wait for `GET /v1/status` to show leaders, and run
        // `workload::run_all(&Ctx { .. }, lockd::LockdTarget::new(..))`; the target speaks the
        // HTTP API of GUIDE §4 through `http::HttpConn`.
        SystemKind::Lockd => bail!("the lockd target is not implemented yet (waiting for its API)"),
        SystemKind::Etcd | SystemKind::EtcdLock => {
            let mut cluster = etcd::Cluster::start(data_root).await?;
            let flavour = if s == SystemKind::Etcd {
                etcd::Flavour::Txn
            } else {
                etcd::Flavour::LockRpc
            };
            let target = etcd::EtcdTarget::new(cluster.clients(), flavour);
            let cx = Ctx {
                system: label,
                plan,
                server_pids: cluster.pids(),
            };
            let rows = workload::run_all(&cx, target).await?;
            cluster.check_alive()?;
            Ok(rows)
        }
        SystemKind::RedisAof | SystemKind::RedisMem => {
            let durability = if s == SystemKind::RedisAof {
                redis_target::Durability::AofAlways
            } else {
                redis_target::Durability::Memory
            };
            let mut server = redis_target::RedisServer::start(data_root, durability).await?;
            let target = redis_target::RedisTarget::connect(server.addr()).await?;
            let cx = Ctx {
                system: label,
                plan,
                server_pids: vec![server.pid()],
            };
            let rows = workload::run_all(&cx, target).await?;
            server.check_alive()?;
            Ok(rows)
        }
    }
}
