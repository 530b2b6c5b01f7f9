//! Instructions per operation: a cost that the shared machine's noise does not move.
//!
//! Why callgrind: wall-clock figures on a shared 2-core VM swing by ±30% between runs, so a 5%
//! regression hides in them. Hardware counters (`perf stat`) are not exposed to this VM, so node
//! 1 of an otherwise normal 3-node cluster runs under valgrind's callgrind, which counts the
//! instructions every thread of the process executes. `callgrind_control` zeroes the counters
//! before a phase and dumps them after it; the phase's count, less the idle rate (heartbeats,
//! ticks) over its duration, divided by its operations, is the cost of one acquire+release.
//!
//! Three phases, one client at a time (closed loop, fresh names), each from node 1's view:
//! - `leader`: the client's stream is on node 1, which leads the names' group;
//! - `follower, forwarding`: the client's stream is on node 1, another node leads the group,
//!   so node 1 forwards the proposal and also replicates it;
//! - `follower, replica only`: the client's stream is on the group's leader; node 1 only
//!   receives, fsyncs and applies the entries.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use lockd_core::ShardMap;

use crate::lockd::{Cluster, GrpcTarget, Routing, ServerOpts};
use crate::target::LockTarget;

/// What one run measured.
pub struct Report {
    pub ops: u64,
    pub idle_per_s: f64,
    /// (phase, instructions per acquire+release, pairs/s under valgrind, the idle share of
    /// the phase's count: the larger it is, the less the figure can be trusted).
    pub phases: Vec<(&'static str, f64, f64, f64)>,
}

impl Report {
    pub fn render(&self) -> String {
        let mut out = format!(
            "instructions on node 1 (valgrind --tool=callgrind), {} acquire+release pairs per phase, one client, fresh names; idle: {:.0} instructions/s subtracted\n\n| phase | instructions per acquire+release | pairs/s under valgrind | idle share of the count |\n|---|---:|---:|---:|\n",
            self.ops, self.idle_per_s
        );
        for (phase, per_op, rate, idle) in &self.phases {
            out.push_str(&format!(
                "| {phase} | {per_op:.0} | {rate:.0} | {:.0}% |\n",
                idle * 100.0
            ));
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

    /// `zero`, then `run`, then the instructions it took and its duration.
    async fn measure<F, Fut>(&self, run: F) -> Result<(u64, Duration)>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<()>>,
    {
        self.control("--zero")?;
        let t = Instant::now();
        run().await?;
        let took = t.elapsed();
        Ok((self.take().await?, took))
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

/// One client's acquire+release on each name in turn; every acquire must succeed.
async fn cycle(t: &GrpcTarget, client: usize, names: &[String]) -> Result<()> {
    let mut c = t.prepare(client, Duration::from_secs(60)).await?;
    for (k, name) in names.iter().enumerate() {
        let owner = format!("ins-{client}-{k}");
        let token = t
            .acquire(&mut c, name, &owner)
            .await?
            .with_context(|| format!("{name} was taken"))?;
        if !t.release(&mut c, name, &token).await? {
            bail!("release of {name} refused");
        }
    }
    t.finish(c).await
}

/// Runs the three phases against a default-shaped cluster whose node 1 runs under callgrind.
pub async fn run(bin: &Path, data_root: &Path, groups: u32, ops: usize) -> Result<Report> {
    let dir = tempfile::Builder::new()
        .prefix("lockd-bench-callgrind-")
        .tempdir_in(data_root)?;
    let wrap = vec![
        "valgrind".to_string(),
        "--tool=callgrind".into(),
        format!("--callgrind-out-file={}/cg.%p", dir.path().display()),
        "--dump-instr=no".into(),
        "--compress-strings=no".into(),
    ];
    // Leader balance on (lockd's default), so that node 1 leads some groups and not others.
    let opts = ServerOpts {
        threads: Some(1),
        leader_balance: true,
        ..Default::default()
    };
    let mut cluster =
        Cluster::start_wrapped(bin, data_root, 3, groups, opts, Some((0, wrap))).await?;
    let pid = cluster.pid_of(0).context("node 1 is not running")?;
    let cg = Callgrind {
        pid,
        dir: dir.path().to_owned(),
    };
    let leaders = cluster.leaders().await?;
    // Group ids: 0 is meta; lock groups are 1..=groups.
    let led = (1..=groups).find(|&g| leaders[g as usize] == 0);
    let other = (1..=groups).find(|&g| leaders[g as usize] != 0);
    let (Some(led), Some(other)) = (led, other) else {
        bail!("node 1 leads all or none of the lock groups ({leaders:?}); need one of each");
    };
    let other_leader = leaders[other as usize];
    let shards = ShardMap::initial(groups);
    let target = GrpcTarget::new(&cluster, Routing::Spread).await?;
    // Spread routing: client id i talks to node i % 3.
    let phases: [(&'static str, u32, usize); 3] = [
        ("leader", led, 0),
        ("follower, forwarding", other, 0),
        ("follower, replica only", other, other_leader),
    ];

    eprintln!("[instructions] warm-up");
    for (k, &(_, g, client)) in phases.iter().enumerate() {
        let names = names_in(&shards, g, &format!("warm{k}"), 50);
        cycle(&target, client, &names).await?;
    }
    eprintln!("[instructions] idle, 5 s");
    let (idle, idle_for) = cg
        .measure(|| async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok(())
        })
        .await?;
    let idle_per_s = idle as f64 / idle_for.as_secs_f64();
    let mut out = Vec::new();
    for (k, &(phase, g, client)) in phases.iter().enumerate() {
        eprintln!("[instructions] {phase}: {ops} pairs");
        let names = names_in(&shards, g, &format!("ins{k}"), ops);
        let (n, took) = cg.measure(|| cycle(&target, client, &names)).await?;
        let idle = idle_per_s * took.as_secs_f64();
        let net = n as f64 - idle;
        let rate = ops as f64 / took.as_secs_f64();
        out.push((phase, net / ops as f64, rate, idle / n as f64));
    }
    if cluster.leaders().await? != leaders {
        bail!("a leader changed during the run; the phases measured mixed roles");
    }
    cluster.check_alive()?;
    drop(cluster);
    Ok(Report {
        ops: ops as u64,
        idle_per_s,
        phases: out,
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
