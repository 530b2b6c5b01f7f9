//! `lockd-bench`: measures lockd side by side with what users would otherwise run for locks
//! (a 3-member etcd, Redis with and without an fsync'd AOF), on the same machine in one run.
//!
//! `lockd-bench compare [--quick] [--systems lockd,etcd,redis-aof,...]` installs missing Debian
//! packages, starts each system on loopback in a temp dir (lockd: 3 `lockd serve` processes of
//! the release binary), runs the same workloads against it (see `workload`), stops it by pid,
//! and prints one table with ratios to etcd and Redis-AOF; then lockd's hot lock and failover
//! (see `scenarios`). `lockd-bench scale` holds 1M locks on a running cluster (see `scale`);
//! `lockd-bench smoke` is the seconds-long CI check against lockd alone.

mod etcd;
mod etcd_gateway;
mod http;
mod instructions;
mod lockd;
mod moves;
mod placement;
mod procs;
mod redis_target;
mod report;
mod scale;
mod scenarios;
mod target;
mod tls;
mod workload;
mod zookeeper;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, Parser, Subcommand};

use crate::lockd::Routing;
use crate::target::SystemKind;
use crate::workload::{Ctx, Plan, Row};

#[derive(Parser)]
#[command(version, about = "Benchmarks lockd against etcd and Redis")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// Where lockd comes from and how its cluster is shaped.
#[derive(Args, Clone)]
struct LockdArgs {
    /// The `lockd` binary (default: next to lockd-bench, then $CARGO_TARGET_DIR/release, then
    /// the workspace's target/release). Build it with `cargo build --release -p lockd-server`.
    #[arg(long, env = "LOCKD_BIN")]
    lockd_bin: Option<PathBuf>,
    /// Lock groups per lockd cluster (`lockd serve --groups`). Default: what `lockd dev
    /// --nodes 3` picks on this machine (one per core each node gets, 1..=4).
    #[arg(long = "groups")]
    groups_flag: Option<u32>,
    /// Where the servers' temp data dirs go (must be a real disk for fsync to mean anything).
    #[arg(long)]
    data_root: Option<PathBuf>,
    /// Scheduler threads per replica: `lockd serve --worker-threads` and etcd's GOMAXPROCS
    /// (0 = each server's default, one per core). Every replica of a cluster shares this one
    /// machine, so by default each gets its share, as `lockd dev --nodes 3` gives it (cores /
    /// 3, at least 1).
    #[arg(long)]
    server_threads: Option<u16>,
    /// Turn off lockd's leader balance (`lockd serve --no-leader-balance`). It is on by
    /// default, as in `lockd serve`, so the headline measures lockd's default configuration.
    /// On shared cores spreading the leaders gained nothing in earlier runs and cost ~0.15 ms
    /// at C=1 (docs/benchmarks-log.md); this flag measures that again.
    #[arg(long)]
    no_leader_balance: bool,
}

impl LockdArgs {
    fn threads(&self) -> Option<u16> {
        let t = self.server_threads.unwrap_or_else(|| {
            lockd_server::cli::shared_machine_threads(
                3,
                std::thread::available_parallelism().map_or(1, |c| c.get()),
            )
        });
        (t > 0).then_some(t)
    }

    /// Lock groups: `--groups`, else `lockd dev --nodes 3`'s default on this machine.
    fn groups(&self) -> u32 {
        self.groups_flag.unwrap_or_else(|| {
            lockd_server::cli::shared_machine_groups(
                3,
                std::thread::available_parallelism().map_or(1, |c| c.get()),
            )
        })
    }

    fn opts(&self) -> lockd::ServerOpts {
        lockd::ServerOpts {
            threads: self.threads(),
            leader_balance: !self.no_leader_balance,
            replicas: 0,
            tls: false,
        }
    }

    fn data_root(&self) -> PathBuf {
        self.data_root.clone().unwrap_or_else(std::env::temp_dir)
    }

    /// The data root for a measurement: refused on a memory file system, where fsync costs
    /// nothing and every figure would flatter lockd, etcd and Redis-AOF alike.
    fn measured_root(&self) -> Result<PathBuf> {
        let root = self.data_root();
        if let Some(fs) = memory_fs(&root) {
            anyhow::bail!(
                "{} is on {fs}: fsync is free there, so nothing measured would mean anything; \
                 pass --data-root on a real disk",
                root.display()
            );
        }
        Ok(root)
    }
}

/// The memory file system (`tmpfs`, `ramfs`) that `path` lives on, if it does, from the
/// longest matching mount point in /proc/self/mountinfo.
fn memory_fs(path: &std::path::Path) -> Option<String> {
    let path = std::fs::canonicalize(path).ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mount_fs_type(&info, &path).filter(|t| t == "tmpfs" || t == "ramfs")
}

/// The file system type of the mount holding `path`, per a mountinfo text.
fn mount_fs_type(mountinfo: &str, path: &std::path::Path) -> Option<String> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let mount_point = f.nth(4)?;
            let fs_type = l.split(" - ").nth(1)?.split(' ').next()?;
            Some((std::path::PathBuf::from(mount_point), fs_type.to_string()))
        })
        .filter(|(m, _)| path.starts_with(m))
        .max_by_key(|(m, _)| m.components().count())
        .map(|(_, t)| t)
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
            default_value = "lockd,lockd-http,lockd-leader,lockd-4g,lockd-8g,etcd,etcd-lock,etcd-gw,zookeeper,redis-aof,redis-mem"
        )]
        systems: Vec<SystemKind>,
        /// The systems the ratio columns divide by.
        #[arg(
            long,
            value_enum,
            value_delimiter = ',',
            default_value = "etcd,redis-aof"
        )]
        baselines: Vec<SystemKind>,
        /// Waiters in the hot-lock run (after the `lockd` system's workloads; 0 skips it).
        #[arg(long, default_value_t = 50)]
        hot_waiters: usize,
        /// Failover trials (after the `lockd` system's workloads; 0 skips them).
        #[arg(long, default_value_t = 20)]
        failover_trials: usize,
        /// Rounds: every system runs once per round, in turn, so that each ratio divides two
        /// runs minutes apart; the headline shows every round's figure and ratio.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=5))]
        rounds: u32,
        #[command(flatten)]
        lockd: LockdArgs,
    },
    /// Failover alone: SIGKILL the leader of a probe name's group, time the next acquire.
    Failover {
        #[arg(long, default_value_t = 20)]
        trials: usize,
        /// Background clients cycling locks throughout (0 = an idle cluster).
        #[arg(long, default_value_t = 0)]
        load: usize,
        /// SIGTERM the leader (its graceful leave hands its groups over) instead of SIGKILL.
        #[arg(long)]
        graceful: bool,
        #[command(flatten)]
        lockd: LockdArgs,
    },
    /// The hot lock alone: one name, N blocking waiters, spread and leader-routed.
    Hotlock {
        #[arg(long, default_value_t = 50)]
        waiters: usize,
        #[arg(long, default_value_t = 5)]
        secs: u64,
        #[command(flatten)]
        lockd: LockdArgs,
    },
    /// Many sessions kept alive at TTL/3: CPU per node and bytes written to disk, against an idle
    /// window of the same length (keepalives are in memory on the leaders, never in the log).
    Sessions {
        #[arg(long, default_value_t = 20_000)]
        count: usize,
        /// Session TTL in seconds (keepalives every TTL/3).
        #[arg(long, default_value_t = 15)]
        ttl_s: u64,
        /// Length of the measured window (and of the idle baseline), seconds.
        #[arg(long, default_value_t = 20)]
        secs: u64,
        /// Send keepalives as unary calls (one connection per node) instead of on one session
        /// stream per session, as lockd-client keeps them.
        #[arg(long)]
        unary: bool,
        /// Session streams sharing one connection (a client process has its own connection, so
        /// fewer is closer to many real clients; each connection costs the servers wake-ups).
        #[arg(long, default_value_t = 100)]
        streams_per_connection: usize,
        /// Nodes in the cluster (`lockd serve` processes on this machine).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=9))]
        nodes: u16,
        /// Replicas per lock group (`lockd serve --replicas`; 0: every group on every node).
        #[arg(long, default_value_t = 0)]
        replicas: usize,
        #[command(flatten)]
        lockd: LockdArgs,
    },
    /// Many held locks (issue 7): cycle throughput with ~1k held and with `--held` held, RSS per
    /// replica and bytes per lock, load rate, and a follower's restart time.
    Scale {
        /// Locks to acquire and keep held.
        #[arg(long, default_value_t = 1_000_000)]
        held: u64,
        /// Sessions the locks are spread over (opened first, kept alive every 20 s throughout).
        #[arg(long, default_value_t = 20_000)]
        sessions: usize,
        /// Closed-loop clients of the cycle measurement (C=1 is measured too).
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// Locks held during the baseline measurement.
        #[arg(long, default_value_t = 1_000)]
        baseline_held: u64,
        /// Acquires in flight while loading.
        #[arg(long, default_value_t = 512)]
        load_inflight: usize,
        /// Give up loading after this many seconds (and report the count reached).
        #[arg(long, default_value_t = 1200)]
        load_timeout_s: u64,
        /// Length of each cycle measurement, seconds.
        #[arg(long, default_value_t = 10)]
        secs: u64,
        /// Keep the loaded cluster up this many seconds (printing its dashboard's URLs) for
        /// outside tools, before the follower restart.
        #[arg(long, default_value_t = 0)]
        hold_for_s: u64,
        #[command(flatten)]
        lockd: LockdArgs,
    },
    /// A live bucket move: 1,024 buckets of group 1 holding `--held` locks move to group 2
    /// while clients cycle locks on names in them; the move's time, the clients' errors and
    /// latency before and during it, and a sample of holders checked for their tokens after.
    Move {
        #[arg(long, default_value_t = 100_000)]
        held: u64,
        #[arg(long, default_value_t = 1_000)]
        sessions: usize,
        /// Clients cycling acquire + release on names in the moving buckets.
        #[arg(long, default_value_t = 8)]
        load: usize,
        /// Seconds of load measured before the move starts.
        #[arg(long, default_value_t = 5)]
        before_secs: u64,
        #[command(flatten)]
        lockd: LockdArgs,
    },
    /// One lock group on 3 nodes against two groups placed on 3 nodes each (6 nodes,
    /// `--replicas 3`), alternating in one run: the closed-loop mix peak and cycles at C=1, with
    /// each node's CPU per request.
    Placement {
        /// Rounds (each runs both shapes once, in turn).
        #[arg(long, default_value_t = 2)]
        rounds: u32,
        /// Seconds per measurement.
        #[arg(long, default_value_t = 10)]
        secs: u64,
        /// Closed-loop clients of the mix.
        #[arg(long, default_value_t = 64)]
        clients: usize,
        #[command(flatten)]
        lockd: LockdArgs,
    },
    /// A few seconds against lockd only (no etcd/Redis): asserts that every operation succeeds,
    /// never a timing. For CI.
    Smoke {
        /// Nodes in the cluster (1 or 3).
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        #[command(flatten)]
        lockd: LockdArgs,
    },
    /// The per-operation cost model: instructions per acquire, release, keepalive and read on
    /// a group's leader and on a follower (one node under valgrind's callgrind; Debian's
    /// valgrind is installed if missing), a figure the machine's noise does not move; then the
    /// µs of CPU each costs every process under load, on a plain cluster. About 5 minutes.
    Instructions {
        /// Operations of each kind per role under callgrind.
        #[arg(long, default_value_t = 1000)]
        ops: usize,
        /// Clients of the load phases (0: skip them).
        #[arg(long, default_value_t = 256)]
        concurrency: usize,
        /// Seconds per load phase.
        #[arg(long, default_value_t = 3)]
        secs: u64,
        #[command(flatten)]
        lockd: LockdArgs,
    },
    /// A few seconds against a 3-member etcd (installed from Debian's packages if missing):
    /// the gRPC client in both lock flavours and the JSON gateway. Asserts that every operation
    /// succeeds, so the comparison's etcd rows cannot be silently broken. For CI.
    SmokeEtcd {
        /// Where etcd's temp data dir goes.
        #[arg(long)]
        data_root: Option<PathBuf>,
    },
    /// A few seconds against a 3-member ZooKeeper (Debian's package, installed if missing)
    /// through the Curator mutex recipe: a held name is refused to another session and taken
    /// once released, then every workload of the smoke plan succeeds. For CI.
    SmokeZookeeper {
        /// Where ZooKeeper's temp data dir goes.
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
    match cli.cmd {
        Cmd::Compare {
            quick,
            systems,
            baselines,
            hot_waiters,
            failover_trials,
            rounds,
            lockd,
        } => {
            let extras = Extras {
                hot_waiters,
                hot_secs: if quick { 3 } else { 10 },
                failover_trials,
            };
            compare(quick, rounds, &systems, &baselines, &lockd, &extras).await
        }
        Cmd::Failover {
            trials,
            load,
            graceful,
            lockd,
        } => {
            let bin = lockd::find_binary(lockd.lockd_bin.as_deref())?;
            let mut cluster = lockd::Cluster::start(
                &bin,
                &lockd.measured_root()?,
                3,
                lockd.groups(),
                lockd.opts(),
            )
            .await?;
            let f = scenarios::failover(&mut cluster, trials, load, graceful).await?;
            println!("lockd ({} groups): {}", lockd.groups(), f.line());
            Ok(())
        }
        Cmd::Hotlock {
            waiters,
            secs,
            lockd,
        } => {
            let bin = lockd::find_binary(lockd.lockd_bin.as_deref())?;
            let cluster = lockd::Cluster::start(
                &bin,
                &lockd.measured_root()?,
                3,
                lockd.groups(),
                lockd.opts(),
            )
            .await?;
            for routing in [Routing::Spread, Routing::Leader] {
                let dur = Duration::from_secs(secs);
                let h = scenarios::hot_lock(&cluster, routing, waiters, dur).await?;
                println!("lockd ({} groups): {}", lockd.groups(), h.line());
            }
            Ok(())
        }
        Cmd::Sessions {
            count,
            ttl_s,
            secs,
            unary,
            streams_per_connection,
            nodes,
            replicas,
            lockd,
        } => {
            let via = if unary {
                scenarios::KeepaliveVia::Unary
            } else {
                scenarios::KeepaliveVia::Stream {
                    per_conn: streams_per_connection,
                }
            };
            let bin = lockd::find_binary(lockd.lockd_bin.as_deref())?;
            let opts = lockd::ServerOpts {
                replicas,
                ..lockd.opts()
            };
            let root = lockd.measured_root()?;
            let cluster =
                lockd::Cluster::start(&bin, &root, nodes.into(), lockd.groups(), opts).await?;
            let ttl = Duration::from_secs(ttl_s);
            let r = scenarios::session_load(&cluster, count, ttl, Duration::from_secs(secs), via)
                .await?;
            let per = if replicas == 0 {
                nodes.into()
            } else {
                replicas
            };
            println!(
                "lockd ({} nodes, {} groups x {per} replicas): {}",
                nodes,
                lockd.groups(),
                r.line()
            );
            Ok(())
        }
        Cmd::Placement {
            rounds,
            secs,
            clients,
            lockd,
        } => {
            let bin = lockd::find_binary(lockd.lockd_bin.as_deref())?;
            let args = placement::PlacementArgs {
                rounds,
                secs,
                clients,
            };
            placement::run(&bin, &lockd.measured_root()?, lockd.opts(), &args).await
        }
        Cmd::Move {
            held,
            sessions,
            load,
            before_secs,
            lockd,
        } => {
            let bin = lockd::find_binary(lockd.lockd_bin.as_deref())?;
            let groups = lockd.groups().max(2);
            let cluster =
                lockd::Cluster::start(&bin, &lockd.measured_root()?, 3, groups, lockd.opts())
                    .await?;
            println!(
                "lockd-bench move --held {held} --sessions {sessions} --load {load}: {} cores, \
                 lockd 3 nodes, {groups} groups, fsync on; load average {}",
                std::thread::available_parallelism().map_or(0, |n| n.get()),
                std::fs::read_to_string("/proc/loadavg")
                    .unwrap_or_default()
                    .trim()
            );
            let args = moves::MoveArgs {
                held,
                sessions,
                load,
                before_secs,
            };
            moves::run(&cluster, &args).await
        }
        Cmd::Scale {
            held,
            sessions,
            concurrency,
            baseline_held,
            load_inflight,
            load_timeout_s,
            secs,
            hold_for_s,
            lockd,
        } => {
            let bin = lockd::find_binary(lockd.lockd_bin.as_deref())?;
            let started = std::time::Instant::now();
            let mut cluster = lockd::Cluster::start(
                &bin,
                &lockd.measured_root()?,
                3,
                lockd.groups(),
                lockd.opts(),
            )
            .await?;
            let args = scale::ScaleArgs {
                held,
                baseline_held,
                sessions,
                concurrency,
                load_inflight,
                load_timeout: Duration::from_secs(load_timeout_s),
                cycle_secs: secs,
                hold_for: Duration::from_secs(hold_for_s),
            };
            let r = scale::run(&mut cluster, &args).await?;
            println!(
                "lockd-bench scale --held {held} --sessions {sessions} --concurrency {concurrency} ({} s)",
                started.elapsed().as_secs()
            );
            println!(
                "machine: {} cores; lockd {} ({} groups, 3 nodes, fsync on, snapshot every {} entries)",
                std::thread::available_parallelism().map_or(0, |n| n.get()),
                bin.display(),
                lockd.groups(),
                scale::SNAPSHOT_EVERY,
            );
            println!("cycle rows: closed-loop acquire+release on fresh names, spread over the nodes; latency = acquires'\n");
            print!("{}", r.render(held));
            Ok(())
        }
        Cmd::Smoke { nodes, lockd } => smoke(nodes, &lockd).await,
        Cmd::SmokeEtcd { data_root } => smoke_etcd(data_root).await,
        Cmd::SmokeZookeeper { data_root } => smoke_zookeeper(data_root).await,
        Cmd::Instructions {
            ops,
            concurrency,
            secs,
            lockd,
        } => {
            procs::ensure_packages(&[("valgrind", "valgrind")])?;
            let bin = lockd::find_binary(lockd.lockd_bin.as_deref())?;
            let groups = lockd.groups();
            let r = instructions::run(
                &bin,
                &lockd.measured_root()?,
                groups,
                ops,
                lockd.opts(),
                concurrency,
                secs,
            )
            .await?;
            println!(
                "lockd-bench instructions: lockd {} ({groups} lock groups, 3 nodes, fsync on, leader balance on; load phases: {} scheduler threads per node)",
                bin.display(),
                lockd.threads().map_or("default".to_string(), |t| t.to_string()),
            );
            print!("{}", r.render());
            Ok(())
        }
    }
}

/// The lockd-only runs that follow the `lockd` system's workloads in `compare`.
struct Extras {
    hot_waiters: usize,
    hot_secs: u64,
    failover_trials: usize,
}

async fn compare(
    quick: bool,
    rounds: u32,
    systems: &[SystemKind],
    baselines: &[SystemKind],
    lockd: &LockdArgs,
    extras: &Extras,
) -> Result<()> {
    let data_root = lockd.measured_root()?;
    let plan = Plan::new(quick);
    let mut needs = Vec::new();
    for s in systems {
        match s {
            SystemKind::Etcd | SystemKind::EtcdLock | SystemKind::EtcdGw => {
                needs.push(("etcd", "etcd-server"))
            }
            SystemKind::RedisAof | SystemKind::RedisMem => {
                needs.push(("redis-server", "redis-server"))
            }
            SystemKind::Zookeeper => needs.push((zookeeper::JAR, "zookeeper")),
            _ => {}
        }
    }
    procs::ensure_packages(&needs)?;
    let bin = match systems.iter().any(|s| s.is_lockd()) {
        true => Some(lockd::find_binary(lockd.lockd_bin.as_deref())?),
        false => None,
    };

    let started = std::time::SystemTime::now();
    let mut by_round: Vec<Vec<Row>> = Vec::new();
    let mut lines = Vec::new();
    let mut failed = Vec::new();
    for round in 1..=rounds {
        let mut rows = Vec::new();
        // The lockd-only extras (hot lock, failover) run once, in the first round.
        let none = Extras {
            hot_waiters: 0,
            hot_secs: 0,
            failover_trials: 0,
        };
        let extras = if round == 1 { extras } else { &none };
        for (i, &s) in systems.iter().enumerate() {
            eprintln!(
                "== round {round}/{rounds} [{}/{}] {}",
                i + 1,
                systems.len(),
                s.label()
            );
            let r = match (s.is_lockd(), &bin) {
                (true, Some(bin)) => run_lockd(s, &plan, bin, lockd, extras).await,
                _ => run_system(s, &plan, &data_root, lockd.threads())
                    .await
                    .map(|r| (r, vec![])),
            };
            match r {
                Ok((r, l)) => {
                    rows.extend(r);
                    lines.extend(l);
                }
                Err(e) => {
                    eprintln!("{}: FAILED: {e:#}", s.label());
                    failed.push(format!("{} (round {round})", s.label()));
                }
            }
        }
        by_round.push(rows);
    }

    let secs = started.elapsed().map(|d| d.as_secs()).unwrap_or(0);
    println!(
        "lockd-bench compare{} --rounds {rounds} ({secs} s)",
        if quick { " --quick" } else { "" }
    );
    println!(
        "machine: {} cores; lockd {} ({} groups, lockd-4g 4, lockd-8g 8; 3 nodes; leader balance {}); scheduler threads per lockd/etcd replica: {}; {}; {}; {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        bin.as_ref().map_or("-".into(), |b| b.display().to_string()),
        lockd.groups(),
        if lockd.no_leader_balance { "off" } else { "on" },
        lockd.threads().map_or("one per core".to_string(), |t| t.to_string()),
        procs::version_of("etcd"),
        procs::version_of("redis-server"),
        zookeeper::version(),
    );
    println!("ops/s counts every request; cycle latencies are the acquires'; open-loop latencies");
    println!("run from the intended send time; cpu = % of one core (servers / lockd-bench)\n");
    let labels: Vec<&str> = baselines.iter().map(|b| b.label()).collect();
    if systems.contains(&SystemKind::Lockd) {
        println!("headline: lockd's default configuration (`lockd`) against each baseline; rounds separated by \" · \"\n");
        print!(
            "{}",
            report::headline(&by_round, SystemKind::Lockd.label(), &labels)
        );
        println!();
    }
    for (i, rows) in by_round.iter().enumerate() {
        if rounds > 1 {
            println!("round {}:\n", i + 1);
        }
        print!("{}", report::table(rows, &labels));
        println!();
    }
    for l in &lines {
        println!("{l}");
    }
    if !failed.is_empty() {
        bail!("failed: {}", failed.join(", "));
    }
    Ok(())
}

/// Starts a 3-node lockd cluster, runs every workload against it with the flavour `s` names,
/// and, for `lockd` itself, the hot lock and the failover trials.
async fn run_lockd(
    s: SystemKind,
    plan: &Plan,
    bin: &Path,
    args: &LockdArgs,
    extras: &Extras,
) -> Result<(Vec<Row>, Vec<String>)> {
    let groups = match s {
        SystemKind::Lockd4g => lockd_server::cli::DEFAULT_GROUPS,
        SystemKind::Lockd8g => 8,
        _ => args.groups(),
    };
    let mut opts = args.opts();
    opts.tls = s == SystemKind::LockdTls;
    let mut cluster = lockd::Cluster::start(bin, &args.data_root(), 3, groups, opts).await?;
    let cx = Ctx {
        system: s.label(),
        plan,
        server_pids: cluster.pids(),
    };
    let rows = match s {
        SystemKind::LockdHttp => {
            let t = lockd::HttpTarget::new(&cluster, Routing::Spread).await?;
            workload::run_all(&cx, t).await?
        }
        SystemKind::LockdLeader => {
            let t = lockd::GrpcTarget::new(&cluster, Routing::Leader).await?;
            workload::run_all(&cx, t).await?
        }
        SystemKind::LockdUnary => {
            let t = lockd::UnaryTarget::new(&cluster, Routing::Spread).await?;
            workload::run_all(&cx, t).await?
        }
        _ => {
            let t = lockd::GrpcTarget::new(&cluster, Routing::Spread).await?;
            workload::run_all(&cx, t).await?
        }
    };
    cluster.check_alive()?;
    let mut lines = Vec::new();
    if s == SystemKind::Lockd {
        if extras.hot_waiters > 0 {
            for routing in [Routing::Spread, Routing::Leader] {
                eprintln!(
                    "[lockd] hot lock, {} waiters, {routing:?}",
                    extras.hot_waiters
                );
                let dur = Duration::from_secs(extras.hot_secs);
                let h = scenarios::hot_lock(&cluster, routing, extras.hot_waiters, dur).await?;
                lines.push(format!("lockd: {}", h.line()));
            }
        }
        if extras.failover_trials > 0 {
            eprintln!("[lockd] failover, {} trials", extras.failover_trials);
            let f = scenarios::failover(&mut cluster, extras.failover_trials, 0, false).await?;
            lines.push(format!("lockd: {}", f.line()));
        }
    }
    Ok((rows, lines))
}

/// CI smoke: every request kind through both APIs and both routings, a tiny hot lock; fails
/// only if an operation fails, never on a timing.
async fn smoke(nodes: usize, args: &LockdArgs) -> Result<()> {
    let bin = lockd::find_binary(args.lockd_bin.as_deref())?;
    let cluster =
        lockd::Cluster::start(&bin, &args.data_root(), nodes, args.groups(), args.opts()).await?;
    let plan = Plan::smoke();
    let cx = |system| Ctx {
        system,
        plan: &plan,
        server_pids: cluster.pids(),
    };
    let mut rows = Vec::new();
    let t = lockd::GrpcTarget::new(&cluster, Routing::Spread).await?;
    rows.extend(workload::run_all(&cx("lockd"), t).await?);
    let t = lockd::UnaryTarget::new(&cluster, Routing::Spread).await?;
    rows.extend(workload::run_all(&cx("lockd-unary"), t).await?);
    let t = lockd::HttpTarget::new(&cluster, Routing::Spread).await?;
    rows.extend(workload::run_all(&cx("lockd-http"), t).await?);
    let t = lockd::GrpcTarget::new(&cluster, Routing::Leader).await?;
    rows.extend(workload::run_all(&cx("lockd-leader"), t).await?);
    print!("{}", report::table(&rows, &[]));
    let hot = scenarios::hot_lock(&cluster, Routing::Spread, 5, Duration::from_secs(1)).await?;
    println!("{}", hot.line());
    smoke_failures(&rows)?;
    if hot.errors > 0 || hot.overhead.is_empty() {
        bail!(
            "smoke failed: hot lock had {} errors, {} hand-offs",
            hot.errors,
            hot.overhead.len()
        );
    }
    println!("smoke ok ({} nodes)", nodes);
    Ok(())
}

/// Fails if a smoke row shows anything but success. A cycle takes a fresh name each time, so
/// "taken" there is as wrong as an error; a refused release of a held lock is wrong everywhere.
fn smoke_failures(rows: &[Row]) -> Result<()> {
    let bad: Vec<String> = rows
        .iter()
        .filter(|r| {
            let fresh = r.workload.starts_with("cycle");
            r.errors > 0 || r.ops_per_s <= 0.0 || r.refused > 0 || (fresh && r.not_acquired > 0)
        })
        .map(|r| {
            format!(
                "{} {}: {} errors, {} refused releases, {} not acquired, {:.0} ops/s",
                r.system, r.workload, r.errors, r.refused, r.not_acquired, r.ops_per_s
            )
        })
        .collect();
    if !bad.is_empty() {
        bail!("smoke failed: {}", bad.join("; "));
    }
    Ok(())
}

/// CI smoke for the etcd rows: one 3-member cluster, each of its clients through the smoke plan.
async fn smoke_etcd(data_root: Option<PathBuf>) -> Result<()> {
    procs::ensure_packages(&[("etcd", "etcd-server")])?;
    let data_root = data_root.unwrap_or_else(std::env::temp_dir);
    let mut cluster = etcd::Cluster::start(&data_root, Some(1)).await?;
    let plan = Plan::smoke();
    let cx = |system| Ctx {
        system,
        plan: &plan,
        server_pids: cluster.pids(),
    };
    let mut rows = Vec::new();
    let members = cluster.clients().to_vec();
    let t = etcd::EtcdTarget::new(&members, etcd::Flavour::Txn);
    rows.extend(workload::run_all(&cx("etcd"), t).await?);
    let t = etcd::EtcdTarget::new(&members, etcd::Flavour::LockRpc);
    rows.extend(workload::run_all(&cx("etcd-lock"), t).await?);
    let t = etcd_gateway::GatewayTarget::new(&members, etcd::Flavour::Txn);
    rows.extend(workload::run_all(&cx("etcd-gw"), t).await?);
    cluster.check_alive()?;
    print!("{}", report::table(&rows, &[]));
    smoke_failures(&rows)?;
    println!("smoke ok (etcd over gRPC and its gateway)");
    Ok(())
}

/// CI smoke for the `zookeeper` row: one 3-member ensemble, the recipe's mutual exclusion, then
/// the smoke plan.
async fn smoke_zookeeper(data_root: Option<PathBuf>) -> Result<()> {
    use target::LockTarget;
    procs::ensure_packages(&[(zookeeper::JAR, "zookeeper")])?;
    let data_root = data_root.unwrap_or_else(std::env::temp_dir);
    let mut ensemble = zookeeper::Ensemble::start(&data_root).await?;
    let t = zookeeper::ZkTarget::new(ensemble.clients());
    let ttl = std::time::Duration::from_secs(10);
    let (mut a, mut b) = (t.prepare(0, ttl).await?, t.prepare(1, ttl).await?);
    let name = "smoke/mutex";
    let Some(held) = t.acquire(&mut a, name, "a").await? else {
        bail!("zookeeper smoke: a free name was refused");
    };
    if t.acquire(&mut b, name, "b").await?.is_some() {
        bail!("zookeeper smoke: a held name was granted to a second session");
    }
    if t.read(&mut b, name).await?.is_none() {
        bail!("zookeeper smoke: a held name reads as free");
    }
    if !t.release(&mut a, name, &held).await? || t.release(&mut a, name, &held).await? {
        bail!("zookeeper smoke: the holder's release must succeed once, then be refused");
    }
    if t.acquire(&mut b, name, "b").await?.is_none() {
        bail!("zookeeper smoke: a released name was refused");
    }
    t.finish(a).await?;
    t.finish(b).await?;
    let plan = Plan::smoke();
    let cx = Ctx {
        system: "zookeeper",
        plan: &plan,
        server_pids: ensemble.pids(),
    };
    let rows = workload::run_all(&cx, t).await?;
    ensemble.check_alive()?;
    print!("{}", report::table(&rows, &[]));
    smoke_failures(&rows)?;
    println!("smoke ok (zookeeper through the Curator mutex recipe)");
    Ok(())
}

/// Starts one etcd or Redis system, runs every workload against it, stops it (the guards' drop).
async fn run_system(
    s: SystemKind,
    plan: &Plan,
    data_root: &std::path::Path,
    threads: Option<u16>,
) -> Result<Vec<Row>> {
    let label = s.label();
    match s {
        SystemKind::Etcd | SystemKind::EtcdLock | SystemKind::EtcdGw => {
            let mut cluster = etcd::Cluster::start(data_root, threads).await?;
            let cx = Ctx {
                system: label,
                plan,
                server_pids: cluster.pids(),
            };
            let rows = match s {
                SystemKind::EtcdGw => {
                    let t = etcd_gateway::GatewayTarget::new(cluster.clients(), etcd::Flavour::Txn);
                    workload::run_all(&cx, t).await?
                }
                SystemKind::EtcdLock => {
                    let t = etcd::EtcdTarget::new(cluster.clients(), etcd::Flavour::LockRpc);
                    workload::run_all(&cx, t).await?
                }
                _ => {
                    let t = etcd::EtcdTarget::new(cluster.clients(), etcd::Flavour::Txn);
                    workload::run_all(&cx, t).await?
                }
            };
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
        SystemKind::Zookeeper => {
            let mut ensemble = zookeeper::Ensemble::start(data_root).await?;
            let cx = Ctx {
                system: label,
                plan,
                server_pids: ensemble.pids(),
            };
            let rows = workload::run_all(&cx, zookeeper::ZkTarget::new(ensemble.clients())).await?;
            ensemble.check_alive()?;
            Ok(rows)
        }
        SystemKind::Lockd
        | SystemKind::LockdUnary
        | SystemKind::LockdHttp
        | SystemKind::LockdLeader
        | SystemKind::Lockd4g
        | SystemKind::Lockd8g
        | SystemKind::LockdTls => {
            bail!("{label} runs through run_lockd")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
25 22 0:21 / /tmp rw,nosuid shared:5 - tmpfs tmpfs rw,size=1024k
26 25 254:1 / /tmp/disk rw,relatime shared:6 - xfs /dev/vdb rw
27 22 0:22 / /dev/shm rw shared:7 - tmpfs tmpfs rw
";

    #[test]
    fn the_longest_mount_point_decides_the_file_system() {
        let t = |p: &str| mount_fs_type(MOUNTINFO, std::path::Path::new(p));
        assert_eq!(t("/tmp/lockd-bench").as_deref(), Some("tmpfs"));
        assert_eq!(t("/tmp/disk/data").as_deref(), Some("xfs"));
        assert_eq!(t("/var/lib/lockd").as_deref(), Some("ext4"));
        assert_eq!(
            t("/tmpfoo").as_deref(),
            Some("ext4"),
            "components, not string prefixes"
        );
        assert_eq!(t("/dev/shm").as_deref(), Some("tmpfs"));
    }

    #[test]
    fn a_measurement_refuses_a_memory_file_system() {
        #[derive(Parser)]
        struct W {
            #[command(flatten)]
            l: LockdArgs,
        }
        // /dev/shm is a tmpfs on every Linux this runs on.
        let shm = W::parse_from(["x", "--data-root", "/dev/shm"]).l;
        let e = shm.measured_root().unwrap_err().to_string();
        assert!(e.contains("fsync is free"), "{e}");
        let disk = W::parse_from(["x", "--data-root", env!("CARGO_MANIFEST_DIR")]).l;
        assert!(disk.measured_root().is_ok());
    }
}
