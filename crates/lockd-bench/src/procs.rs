//! Servers the harness starts: Debian packages, free loopback ports, and a process guard.
//!
//! Why a guard: every server is started here, on loopback, in its own temp dir, and must be
//! stopped by its pid whatever happens: normal end, an error (`?` drops the guard), or Ctrl-C
//! (main drops the whole run). Children get their own process group so the terminal's SIGINT
//! reaches only us, and we stop them in order.

use std::fs::File;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// How long a server gets to exit after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Whether `bin` is on PATH.
fn on_path(bin: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
        .unwrap_or(false)
}

/// Installs the Debian packages providing the missing binaries (`(binary, package)` pairs; a
/// binary given as an absolute path is a file the package installs, such as a jar).
pub fn ensure_packages(needs: &[(&str, &str)]) -> Result<()> {
    let present = |bin: &str| match bin.starts_with('/') {
        true => Path::new(bin).is_file(),
        false => on_path(bin),
    };
    let mut missing: Vec<&str> = needs
        .iter()
        .filter(|(bin, _)| !present(bin))
        .map(|(_, pkg)| *pkg)
        .collect();
    missing.dedup();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("installing Debian packages: {}", missing.join(" "));
    let run = |args: &[&str]| -> Result<()> {
        let st = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .status()
            .context("run apt-get")?;
        if !st.success() {
            bail!("apt-get {} failed: {st}", args.join(" "));
        }
        Ok(())
    };
    run(&["update", "-q"])?;
    let mut args = vec!["install", "-y", "-q"];
    args.extend(&missing);
    run(&args)
}

/// The first line of `bin --version`, for the table's machine facts.
pub fn version_of(bin: &str) -> String {
    Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_owned))
        .unwrap_or_else(|| format!("{bin}: not installed"))
}

/// A loopback address.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A running server; dropping it stops it by pid (SIGTERM, then SIGKILL after a grace period).
pub struct Server {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Server {
    /// Starts `bin args` with stdout and stderr going to `<log_dir>/<name>.log`.
    pub fn start(name: &str, bin: &str, args: &[String], log_dir: &Path) -> Result<Server> {
        Server::start_with_env(name, bin, args, &[], log_dir)
    }

    /// [`Server::start`] with extra environment variables.
    pub fn start_with_env(
        name: &str,
        bin: &str,
        args: &[String],
        env: &[(&str, String)],
        log_dir: &Path,
    ) -> Result<Server> {
        let log = log_dir.join(format!("{name}.log"));
        let out = File::create(&log)?;
        let child = Command::new(bin)
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .process_group(0)
            .spawn()
            .with_context(|| format!("start {bin}"))?;
        eprintln!("  started {name} (pid {})", child.id());
        Ok(Server {
            name: name.to_owned(),
            child,
            log,
        })
    }

    /// The server's pid, for CPU accounting.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails with the log's tail if the server has already exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(st) = self.child.try_wait()? {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(10).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!(
                "{} exited early ({st}); log {}:\n{}",
                self.name,
                self.log.display(),
                tail.join("\n")
            );
        }
        Ok(())
    }

    /// SIGKILL now (no grace), and reap it: the failover workload's crash.
    pub fn kill_now(&mut self) -> Result<()> {
        self.child
            .kill()
            .with_context(|| format!("kill {}", self.name))?;
        self.child.wait()?;
        Ok(())
    }

    /// SIGTERM (the node's graceful leave), without waiting: reap it with [`Server::wait_exit`].
    pub fn terminate(&mut self) -> Result<()> {
        let pid = self.child.id().to_string();
        let st = Command::new("kill").args(["-TERM", &pid]).status()?;
        if !st.success() {
            bail!("kill -TERM {pid} ({}) failed", self.name);
        }
        Ok(())
    }

    /// Waits (up to the stop grace, then SIGKILL) for a terminated server to exit.
    pub fn wait_exit(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                eprintln!("  stopped {} (pid {pid})", self.name);
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        eprintln!("  killed {} (pid {pid}) after {STOP_GRACE:?}", self.name);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Polls `probe` every 50 ms until it succeeds, a server dies, or `timeout` passes.
pub async fn wait_ready<F, Fut>(
    servers: &mut [Server],
    timeout: Duration,
    mut probe: F,
) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        for s in servers.iter_mut() {
            s.check_alive()?;
        }
        match probe().await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline => {
                return Err(e.context(format!("not ready after {timeout:?}")))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// CPU time (user + system) used so far by `pid` (`None`: this process), in seconds; 0 if
/// unreadable. Lets each row say whether the servers or the load generator used the cores.
pub fn cpu_secs(pid: Option<u32>) -> f64 {
    let path = match pid {
        Some(p) => format!("/proc/{p}/stat"),
        None => "/proc/self/stat".to_owned(),
    };
    let Ok(stat) = std::fs::read_to_string(path) else {
        return 0.0;
    };
    // Fields after the `(comm)`: state is field 3, utime 14 and stime 15 (clock ticks).
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| f.get(i)?.parse::<u64>().ok())
        .sum();
    ticks as f64 / CLOCK_TICKS_PER_S
}

/// Linux's USER_HZ: 100 on every architecture we run on (`getconf CLK_TCK`).
const CLOCK_TICKS_PER_S: f64 = 100.0;
