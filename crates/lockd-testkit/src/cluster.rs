//! A cluster of `lockd serve` processes on loopback.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lockd_server::cli::ServeArgs;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{free_ports, lockd_bin, Proc};

/// The admin credential of every kit cluster (in `DIR/admin-token`).
pub const ADMIN_TOKEN: &str = "admin-token-for-tests";

/// How long a start or restart may take to be ready (every group led, a session opens).
const READY: Duration = Duration::from_secs(60);

/// Real nodes; dropping the cluster SIGKILLs every node by pid, then removes the data.
pub struct Cluster {
    /// Each node's process, index `id - 1`.
    pub nodes: Vec<Proc>,
    /// Each node's `lockd serve` arguments, as it was (and will again be) started.
    pub args: Vec<ServeArgs>,
    /// Each node's client gRPC address.
    pub grpc: Vec<String>,
    /// Each node's HTTP address.
    pub http: Vec<String>,
    /// `ID=ADDR` of every node's peer port, comma-separated (joiners added).
    pub peers: String,
    pub groups: u32,
    /// Namespace that readiness opens a session in (one a test config defines, or `default`).
    ready_namespace: String,
    bin: PathBuf,
    // Last: the nodes stop before their data dir goes.
    pub dir: tempfile::TempDir,
}

impl Cluster {
    /// `n` nodes of the debug `lockd` with `groups` lock groups and the test namespaces
    /// ([`crate::client::NAMESPACES`]: `fast/` takes leases of 1-15 s). The usual test cluster.
    pub async fn start(n: usize, groups: u32) -> Cluster {
        Self::launch(n, groups, crate::client::NAMESPACES, "fast", |_| {}).await
    }

    /// `n` nodes of the debug `lockd` with `groups` lock groups, the namespaces in `namespaces`
    /// (TOML, as `--config` reads it; empty for the built-in default) and [`ADMIN_TOKEN`].
    /// `configure` may change any node's arguments before it starts. Returns once every node
    /// sees every group led by its preferred leader and a session opens in `ready_namespace`.
    pub async fn launch(
        n: usize,
        groups: u32,
        namespaces: &str,
        ready_namespace: &str,
        configure: impl Fn(&mut ServeArgs),
    ) -> Cluster {
        Self::launch_bin(
            &lockd_bin(),
            n,
            groups,
            namespaces,
            ready_namespace,
            configure,
        )
        .await
    }

    /// [`Cluster::launch`] with another `lockd` binary.
    pub async fn launch_bin(
        bin: &Path,
        n: usize,
        groups: u32,
        namespaces: &str,
        ready_namespace: &str,
        configure: impl Fn(&mut ServeArgs),
    ) -> Cluster {
        let dir = tempfile::tempdir().expect("a temp dir");
        std::fs::write(dir.path().join("admin-token"), ADMIN_TOKEN).expect("write the token");
        if !namespaces.is_empty() {
            std::fs::write(dir.path().join("namespaces.toml"), namespaces).expect("write config");
        }
        let ports = free_ports(3 * n);
        let addr = |p: &u16| format!("127.0.0.1:{p}");
        let peers = ports[2 * n..]
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{}={}", i + 1, addr(p)))
            .collect::<Vec<_>>()
            .join(",");
        let mut c = Cluster {
            nodes: Vec::new(),
            args: Vec::new(),
            grpc: ports[..n].iter().map(addr).collect(),
            http: ports[n..2 * n].iter().map(addr).collect(),
            peers,
            groups,
            ready_namespace: ready_namespace.to_string(),
            bin: bin.to_owned(),
            dir,
        };
        for i in 0..n {
            let mut a = c.node_args(i as u64 + 1, !namespaces.is_empty());
            configure(&mut a);
            c.args.push(a);
            let p = c.spawn(i);
            c.nodes.push(p);
        }
        c.wait_ready().await;
        c
    }

    /// Node `id`'s arguments: its ports, its data dir, the cluster's groups, config and token.
    fn node_args(&self, id: u64, config: bool) -> ServeArgs {
        let i = id as usize - 1;
        let dir = self.dir.path();
        let mut a = ServeArgs::new(
            id,
            self.peers.clone(),
            self.http[i].parse().expect("an address"),
            self.grpc[i].parse().expect("an address"),
            dir.join(format!("node-{id}")),
        );
        a.common.groups = Some(self.groups);
        a.common.admin_token_file = Some(self.admin_token_file());
        if config {
            a.common.config = Some(dir.join("namespaces.toml"));
        }
        a
    }

    /// Starts node index `i` from `self.args[i]`, its output appended to `DIR/node-<id>.log`.
    fn spawn(&self, i: usize) -> Proc {
        let log = self.log_file(i);
        Proc::spawn(&self.bin, &self.args[i].to_args(), &log)
            .unwrap_or_else(|e| panic!("start {}: {e}", self.bin.display()))
    }

    fn log_file(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("node-{}.log", i + 1))
    }

    /// SIGKILLs node index `i`.
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// Starts node index `i` again on its data dir (after [`Cluster::kill`]), without waiting.
    pub fn start_again(&mut self, i: usize) {
        assert!(!self.nodes[i].is_running(), "node {} is running", i + 1);
        self.nodes[i] = self.spawn(i);
    }

    /// Restarts node `i` as an operator does in a rolling restart: SIGTERM (its graceful leave),
    /// wait for it to exit, start it again on the same data dir, and wait until the cluster is
    /// ready again.
    pub async fn restart(&mut self, i: usize) {
        self.nodes[i].terminate(Duration::from_secs(20));
        self.nodes[i] = self.spawn(i);
        self.wait_ready().await;
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
        let config = self.dir.path().join("namespaces.toml").exists();
        let mut a = self.node_args(id, config);
        a.initial_cluster_state = "existing".into();
        self.args.push(a);
        let p = self.spawn(id as usize - 1);
        self.nodes.push(p);
        (id, peer)
    }

    /// The file holding [`ADMIN_TOKEN`], for `--admin-token-file`.
    pub fn admin_token_file(&self) -> PathBuf {
        self.dir.path().join("admin-token")
    }

    /// Every node's gRPC address, comma-separated (lockctl's `--endpoints`).
    pub fn endpoints(&self) -> String {
        self.grpc.join(",")
    }

    /// Waits until every running node serves names, sees every group led by its preferred
    /// leader (leader balance hands groups over a few seconds after start; a test should not
    /// run into a hand-off), and a session opens and closes in the ready namespace.
    pub async fn wait_ready(&self) {
        let deadline = tokio::time::Instant::now() + READY;
        loop {
            if self.ready().await {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "cluster not ready in {READY:?}; the nodes' last log lines (the temp dir goes \
                 with the test):\n{}",
                self.log_tails(40)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn ready(&self) -> bool {
        let running: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].is_running())
            .collect();
        // Every group (and the meta group) hosted somewhere: with `--replicas` below the node
        // count a node lists only the groups it hosts.
        let mut hosted = std::collections::BTreeSet::new();
        for &i in &running {
            let Some(s) = self.status(i).await else {
                return false;
            };
            let settled = |g: &Value| {
                let leader = g["leader"].as_u64().unwrap_or(0);
                let preferred = g["preferred_leader"].as_u64().unwrap_or(0);
                leader != 0 && (preferred == 0 || leader == preferred)
            };
            let groups = s["groups"].as_array().cloned().unwrap_or_default();
            if s["serving_names"] != Value::Bool(true) || !groups.iter().all(settled) {
                return false;
            }
            hosted.extend(groups.iter().filter_map(|g| g["id"].as_u64()));
        }
        if !running.is_empty() && hosted.len() != self.groups as usize + 1 {
            return false;
        }
        // The namespaces are in place once a session can open in the ready namespace.
        let Some(&i) = running.first() else {
            return true;
        };
        let body = serde_json::json!({
            "client": "lockd-testkit", "namespace": self.ready_namespace,
        });
        let Some((200, opened)) = self.http_call(i, "POST", "/v1/sessions", Some(body)).await
        else {
            return false;
        };
        let Some(id) = opened["session_id"].as_str() else {
            return false;
        };
        let path = format!("/v1/sessions/{id}");
        matches!(
            self.http_call(i, "DELETE", &path, None).await,
            Some((200, _))
        )
    }

    /// Node `i`'s `GET /v1/status`, if it answers 200.
    pub async fn status(&self, i: usize) -> Option<Value> {
        match self.http_call(i, "GET", "/v1/status", None).await {
            Some((200, v)) => Some(v),
            _ => None,
        }
    }

    /// The node id leading lock group `g`, as node `via` sees it (0 = unknown).
    pub async fn leader_of(&self, via: usize, g: u32) -> u64 {
        let Some(s) = self.status(via).await else {
            return 0;
        };
        s["groups"]
            .as_array()
            .and_then(|gs| gs.iter().find(|x| x["id"].as_u64() == Some(u64::from(g))))
            .and_then(|x| x["leader"].as_u64())
            .unwrap_or(0)
    }

    /// Node `i`'s Prometheus text (`GET /metrics`).
    pub async fn metrics(&self, i: usize) -> String {
        let (code, text) = self
            .http_raw(i, "GET", "/metrics", None)
            .await
            .expect("metrics");
        assert_eq!(code, 200, "GET /metrics: {text}");
        text
    }

    /// One HTTP/1.0 request to node `i` with the admin token; its status and JSON body.
    pub async fn http_call(
        &self,
        i: usize,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Option<(u16, Value)> {
        let (code, text) = self.http_raw(i, method, path, body).await?;
        let v = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).ok()?
        };
        Some((code, v))
    }

    async fn http_raw(
        &self,
        i: usize,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Option<(u16, String)> {
        let call = async {
            let mut s = tokio::net::TcpStream::connect(&self.http[i]).await.ok()?;
            let body = body.map(|b| b.to_string()).unwrap_or_default();
            let req = format!(
                "{method} {path} HTTP/1.0\r\nauthorization: Bearer {ADMIN_TOKEN}\r\n\
                 content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            s.write_all(req.as_bytes()).await.ok()?;
            let mut text = String::new();
            s.read_to_string(&mut text).await.ok()?;
            let (head, body) = text.split_once("\r\n\r\n")?;
            let code = head.split(' ').nth(1)?.parse().ok()?;
            Some((code, body.to_string()))
        };
        tokio::time::timeout(Duration::from_secs(2), call)
            .await
            .ok()?
    }

    /// The last `n` lines of every node's log, for a failure message: a CI run keeps only its
    /// output, not the temp dir.
    pub fn log_tails(&self, n: usize) -> String {
        (0..self.nodes.len())
            .map(|i| {
                let text = std::fs::read_to_string(self.log_file(i))
                    .unwrap_or_else(|e| format!("(unreadable: {e})"));
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(n)..].join("\n");
                format!("--- node-{}.log (last {n} lines) ---\n{tail}", i + 1)
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}
