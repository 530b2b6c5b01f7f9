//! A real lockd cluster on loopback: `lockd serve` processes started from the built binary,
//! killed by PID when the guard drops.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use lockd_client::{Client, ClientOptions};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Names under `fast/` may have leases of 1–15 s (the default namespace needs ≥ 5 s).
pub const NAMESPACES: &str = r#"
[[namespace]]
name = "fast"
prefix = "fast/"
min_ttl_ms = 1000
default_ttl_ms = 3000
max_ttl_ms = 15000
"#;

/// The directory cargo builds into (honours `CARGO_TARGET_DIR`).
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"),
    }
}

/// `target/debug/lockd`, which `cargo build -p lockd-server --bin lockd` makes.
pub fn lockd_bin() -> PathBuf {
    let p = target_dir().join("debug/lockd");
    assert!(
        p.exists(),
        "{} is missing: run `cargo build -p lockd-server --bin lockd` first (same CARGO_TARGET_DIR)",
        p.display()
    );
    p
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    free_ports(1)[0]
}

/// `n` distinct ports that were free a moment ago: each stays bound until all are picked, so
/// the kernel cannot hand the same one out twice.
pub fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    held.iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// A child process killed (SIGKILL, by PID) on drop.
pub struct Proc {
    pub child: Option<Child>,
}

impl Proc {
    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().expect("running").id() as i32)
    }

    pub fn signal(&self, s: Signal) {
        if self.child.is_some() {
            kill(self.pid(), s).unwrap();
        }
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The process state letter in /proc/PID/status (`T` = stopped).
    pub fn state(&self) -> char {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix("State:"))
            .and_then(|v| v.trim().chars().next())
            .unwrap_or('?')
    }

    /// Sends SIGSTOP and waits until the kernel reports the process stopped.
    pub fn pause(&self) {
        self.signal(Signal::SIGSTOP);
        for _ in 0..500 {
            if self.state() == 'T' {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("process {} did not stop", self.pid());
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The admin credential of every test cluster (in `DIR/admin-token`).
pub const ADMIN_TOKEN: &str = "admin-token-for-tests";

pub struct Cluster {
    pub nodes: Vec<Proc>,
    pub grpc: Vec<String>,
    pub http: Vec<String>,
    /// `ID=ADDR` of every node's peer port, comma-separated (joiners added).
    pub peers: String,
    pub groups: u32,
    pub dir: tempfile::TempDir,
}

impl Cluster {
    /// `n` nodes with `groups` lock groups; returns once a session opens and every node sees
    /// every group led by its preferred leader.
    pub async fn start(n: usize, groups: u32) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("namespaces.toml");
        std::fs::write(&config, NAMESPACES).unwrap();
        std::fs::write(dir.path().join("admin-token"), ADMIN_TOKEN).unwrap();
        let ports = free_ports(3 * n);
        let addr = |p: &u16| format!("127.0.0.1:{p}");
        let grpc: Vec<String> = ports[..n].iter().map(addr).collect();
        let http: Vec<String> = ports[n..2 * n].iter().map(addr).collect();
        // Node-to-node traffic has ports of its own, apart from the client ports.
        let peers = ports[2 * n..]
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{}={}", i + 1, addr(p)))
            .collect::<Vec<_>>()
            .join(",");
        let mut c = Cluster {
            nodes: Vec::new(),
            grpc,
            http,
            peers,
            groups,
            dir,
        };
        for i in 0..n {
            let node = c.spawn(i as u64 + 1, false);
            c.nodes.push(node);
        }
        c.wait_ready(groups).await;
        c
    }

    /// Starts `lockd serve` for node `id` (index `id - 1` of the address lists).
    fn spawn(&self, id: u64, join_existing: bool) -> Proc {
        let i = id as usize - 1;
        let dir = self.dir.path();
        let log = std::fs::File::create(dir.join(format!("node-{id}.log"))).unwrap();
        let child = Command::new(lockd_bin())
            .arg("serve")
            .args(["--node-id", &id.to_string(), "--peers", &self.peers])
            .args(["--http", &self.http[i]])
            .args(["--grpc", &self.grpc[i]])
            .arg("--data-dir")
            .arg(dir.join(format!("node-{id}")))
            .args(["--groups", &self.groups.to_string()])
            .arg("--config")
            .arg(dir.join("namespaces.toml"))
            .arg("--admin-token-file")
            .arg(dir.join("admin-token"))
            .args([
                "--initial-cluster-state",
                if join_existing { "existing" } else { "new" },
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        Proc { child: Some(child) }
    }

    /// Restarts node `i` as an operator does in a rolling restart: SIGTERM (its graceful leave),
    /// wait for it to exit, start it again on the same data dir, and wait until the cluster is
    /// ready again (every group led by its preferred leader, a session opens).
    pub async fn restart(&mut self, i: usize) {
        self.nodes[i].signal(Signal::SIGTERM);
        let mut child = self.nodes[i].child.take().expect("running");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while child.try_wait().unwrap().is_none() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "node {} did not exit within 20 s of SIGTERM",
                i + 1
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.nodes[i] = self.spawn(i as u64 + 1, false);
        self.wait_ready(self.groups).await;
    }

    /// Starts a new node (the next id) as a joiner: empty data dir, `--initial-cluster-state
    /// existing`, in no group until an admin adds it. Returns its id and peer address.
    pub fn start_joiner(&mut self) -> (u64, String) {
        let id = self.nodes.len() as u64 + 1;
        let ports = free_ports(3);
        let addr = |p: u16| format!("127.0.0.1:{p}");
        self.grpc.push(addr(ports[0]));
        self.http.push(addr(ports[1]));
        let peer = addr(ports[2]);
        self.peers.push_str(&format!(",{id}={peer}"));
        let node = self.spawn(id, true);
        self.nodes.push(node);
        (id, peer)
    }

    /// The file holding [`ADMIN_TOKEN`], for `--admin-token-file`.
    pub fn admin_token_file(&self) -> std::path::PathBuf {
        self.dir.path().join("admin-token")
    }

    async fn wait_ready(&self, groups: u32) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if self.ready(groups).await {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "cluster not ready in 60 s; the nodes' last log lines (the temp dir goes with \
                 the test):\n{}",
                self.log_tails(40)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The last `n` lines of every node's log, for a failure message: a CI run keeps only its
    /// output, not the temp dir.
    fn log_tails(&self, n: usize) -> String {
        (1..=self.nodes.len())
            .map(|i| {
                let text = std::fs::read_to_string(self.dir.path().join(format!("node-{i}.log")))
                    .unwrap_or_else(|e| format!("(unreadable: {e})"));
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(n)..].join("\n");
                format!("--- node-{i}.log (last {n} lines) ---\n{tail}")
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    async fn ready(&self, groups: u32) -> bool {
        for a in &self.grpc {
            let Ok(c) = Client::lazy([a], quick()) else {
                return false;
            };
            let Ok(s) = c.status().await else {
                return false;
            };
            // Settled: every group led, by its preferred leader (leader balance hands groups over
            // a few seconds after start; a test should not run into a hand-off).
            let settled = |g: &lockd_client::proto::GroupStatus| {
                g.leader != 0 && (g.preferred_leader == 0 || g.leader == g.preferred_leader)
            };
            if !s.serving_names
                || s.groups.len() != groups as usize + 1
                || !s.groups.iter().all(settled)
            {
                return false;
            }
        }
        // The namespaces are in place once a session can open in `fast`.
        let Ok(c) = Client::connect_with(&self.grpc, options(Duration::from_secs(3))).await else {
            return false;
        };
        c.close().await.is_ok()
    }

    /// The node id leading lock group `g`, as node `via` sees it (0 = unknown).
    pub async fn leader_of(&self, via: usize, g: u32) -> u64 {
        let c = Client::lazy([&self.grpc[via]], quick()).unwrap();
        c.status()
            .await
            .ok()
            .and_then(|s| s.groups.into_iter().find(|x| x.id == g))
            .map_or(0, |x| x.leader)
    }

    /// Node `i`'s Prometheus text (`GET /metrics` over plain HTTP/1.0).
    pub async fn metrics(&self, i: usize) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(&self.http[i]).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await.unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).await.unwrap();
        assert!(text.starts_with("HTTP/1.0 200"), "GET /metrics: {text}");
        text
    }

    pub fn endpoints(&self) -> String {
        self.grpc.join(",")
    }
}

/// Options for test clients: namespace `fast`, the given TTL.
pub fn options(ttl: Duration) -> ClientOptions {
    ClientOptions {
        client_name: "test".into(),
        ttl,
        namespace: "fast".into(),
        ..Default::default()
    }
}

/// Options that fail fast (for probes).
pub fn quick() -> ClientOptions {
    ClientOptions {
        request_timeout: Duration::from_millis(500),
        retry: lockd_client::RetryPolicy {
            max_attempts: 1,
            ..Default::default()
        },
        ..options(Duration::from_secs(3))
    }
}

/// Polls `f` every 20 ms until it is true or `limit` passes.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + limit;
    while !f().await {
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Cluster tests run one at a time: each starts three nodes on a small shared machine.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
