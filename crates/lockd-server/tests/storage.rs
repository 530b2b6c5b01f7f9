//! `lockd serve` and its storage, through the binary as an operator runs it: a corrupt log
//! record is a clear startup failure (non-zero exit, the file and byte offset on stderr, no
//! panic), and a storage error while serving stops the process with a non-zero exit naming the
//! group, so that a supervisor restarts it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use lockd_server::cli::ServeArgs;

/// Three loopback ports (HTTP, gRPC, peer), all held while picked so none repeats.
fn ports() -> [String; 3] {
    let p = lockd_testkit::free_ports(3);
    [0, 1, 2].map(|i| format!("127.0.0.1:{}", p[i]))
}

/// `lockd serve` for a one-node cluster with one lock group, run by `sh -c PREFIX; exec lockd`.
fn serve(dir: &Path, [http, grpc, peer]: &[String; 3], prefix: &str) -> Command {
    let mut args = ServeArgs::new(
        1,
        format!("1={peer}"),
        http.parse().unwrap(),
        grpc.parse().unwrap(),
        dir,
    );
    args.peer = Some(peer.parse().unwrap());
    args.common.groups = Some(1);
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("{prefix} exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_lockd"))
        .args(args.to_args())
        .env("LOCKD_LOG", "warn,lockd_server=info,lockd_raft=info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

/// A `lockd` process, killed if a test gives up on it.
struct Proc(Option<Child>);

impl Proc {
    fn spawn(mut cmd: Command) -> Proc {
        Proc(Some(cmd.spawn().unwrap()))
    }

    fn child(&mut self) -> &mut Child {
        self.0.as_mut().unwrap()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits for the process to exit (at most `limit`), then returns its status and stderr.
fn wait_exit(mut p: Proc, limit: Duration) -> (ExitStatus, String) {
    let mut child = p.0.take().unwrap();
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "lockd did not exit within {limit:?}; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let Output { status, stderr, .. } = child.wait_with_output().unwrap();
    (status, String::from_utf8_lossy(&stderr).into_owned())
}

fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// Opens a session once the node answers; its id.
async fn open_session(http: &str) -> String {
    let c = http_client();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = c
            .post(format!("http://{http}/v1/sessions"))
            .json(&serde_json::json!({"client": "storage-test", "ttl_s": 60}))
            .send()
            .await;
        if let Ok(r) = r {
            if r.status().is_success() {
                let v: serde_json::Value = r.json().await.unwrap();
                return v["session_id"].as_str().unwrap().to_string();
            }
        }
        assert!(Instant::now() < deadline, "no session within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn acquire(http: &str, session: &str, name: &str) -> Result<reqwest::StatusCode, String> {
    http_client()
        .post(format!("http://{http}/v1/locks/{name}:acquire"))
        .json(&serde_json::json!({"session_id": session, "owner": "o".repeat(200)}))
        .send()
        .await
        .map(|r| r.status())
        .map_err(|e| e.to_string())
}

fn sigterm(child: &mut Proc) {
    let child = child.child();
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

fn newest_chunk(log_dir: &Path) -> PathBuf {
    let mut files: Vec<_> = std::fs::read_dir(log_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .collect();
    files.sort();
    files.pop().expect("a wal chunk")
}

/// Before: the corrupt record was cut and the node started without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_log_record_is_a_clear_startup_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("node-1");
    let addrs = ports();
    let mut child = Proc::spawn(serve(&dir, &addrs, ""));
    let session = open_session(&addrs[0]).await;
    for i in 0..5 {
        assert!(acquire(&addrs[0], &session, &format!("jobs/{i}"))
            .await
            .unwrap()
            .is_success());
    }
    sigterm(&mut child);
    let (status, stderr) = wait_exit(child, Duration::from_secs(20));
    assert!(status.success(), "{status}; stderr:\n{stderr}");
    // Served without TLS, the node said so at start, for both kinds of port.
    assert!(stderr.contains("client ports in PLAIN TEXT"), "{stderr}");
    assert!(stderr.contains("peer port in PLAIN TEXT"), "{stderr}");

    // Bit rot in the last byte of group 1's log: a complete record whose checksum fails.
    let chunk = newest_chunk(&dir.join("group-1").join("log"));
    let mut bytes = std::fs::read(&chunk).unwrap();
    *bytes.last_mut().unwrap() ^= 0x20;
    std::fs::write(&chunk, &bytes).unwrap();

    let child = Proc::spawn(serve(&dir, &addrs, ""));
    let (status, stderr) = wait_exit(child, Duration::from_secs(20));
    assert_eq!(status.code(), Some(1), "stderr:\n{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with("lockd: group 1: "), "{stderr}");
    assert_eq!(last.matches("corrupt log record in").count(), 1, "{stderr}");
    assert!(last.contains(&chunk.display().to_string()), "{stderr}");
    assert!(last.contains("at byte "), "{stderr}");
    assert!(last.contains("new --node-id"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(std::fs::read(&chunk).unwrap(), bytes, "nothing was cut");
}

/// A real I/O error on the WAL: `ulimit -f` caps the size of files the process may write
/// (SIGXFSZ ignored, so a write past it fails with EFBIG, as on a full or failing disk).
/// Before: the group's Raft core stopped and the process kept running, answering 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_error_while_serving_exits_non_zero() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("node-1");
    let addrs = ports();
    // 64 blocks: 32 KiB in the 512-byte blocks of POSIX sh, 64 KiB in bash's.
    let mut child = Proc::spawn(serve(&dir, &addrs, "trap '' XFSZ; ulimit -f 64;"));
    let session = open_session(&addrs[0]).await;
    // Fill group 1's log past the cap: each acquire appends a few hundred bytes.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut i = 0;
    while child.child().try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "lockd still running after 60 s of writes"
        );
        let name = format!("fill/{i}/{}", "n".repeat(400));
        let _ = acquire(&addrs[0], &session, &name).await;
        i += 1;
    }
    let (status, stderr) = wait_exit(child, Duration::from_secs(20));
    assert_eq!(status.code(), Some(1), "stderr:\n{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("lockd: node 1: group 1 stopped: "),
        "{stderr}"
    );
    assert!(last.contains("File too large"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_have_no_colour_off_a_terminal_and_are_json_lines_on_request() {
    // Text (the default) into a pipe: no escape codes in a file or a journal.
    let dir = tempfile::tempdir().unwrap();
    let addrs = ports();
    let mut child = Proc::spawn(serve(dir.path(), &addrs, ""));
    open_session(&addrs[0]).await;
    sigterm(&mut child);
    let (status, stderr) = wait_exit(child, Duration::from_secs(20));
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("node started"), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "escape codes off a terminal:\n{stderr}"
    );

    // JSON: every line of stderr is one object, the start-up banner and the stop included.
    let dir = tempfile::tempdir().unwrap();
    let addrs = ports();
    let mut cmd = serve(dir.path(), &addrs, "");
    cmd.env("LOCKD_LOG_FORMAT", "json");
    let mut child = Proc::spawn(cmd);
    open_session(&addrs[0]).await;
    sigterm(&mut child);
    let (status, stderr) = wait_exit(child, Duration::from_secs(20));
    assert!(status.success(), "{stderr}");
    let events: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: not JSON: {l}")))
        .collect();
    let said = |m: &str| {
        events.iter().any(|e| {
            e["fields"]["message"]
                .as_str()
                .is_some_and(|s| s.contains(m))
        })
    };
    assert!(said("node started"), "{stderr}");
    assert!(said("lockd node 1 (pid "), "the banner: {stderr}");
    assert!(said("lockd node 1: stopping"), "{stderr}");
    assert!(events.iter().all(|e| e["level"].is_string()), "{stderr}");
}

/// Every setting is a flag, an environment variable and a `[server]` key of the config file:
/// a node starts from the file alone, a variable overrides the file, a flag overrides both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_starts_from_its_config_files_server_table() {
    let dir = tempfile::tempdir().unwrap();
    let [http, grpc, peer] = ports();
    let cfg = dir.path().join("lockd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nnode_id = 1\npeers = \"1={peer}\"\nhttp = \"127.0.0.1:1\"\n\
             grpc = \"{grpc}\"\ndata_dir = \"{}\"\ngroups = 1\nheartbeat_ms = 60\n\
             cluster_name = \"from-file\"\nno_leader_balance = true\n\n\
             [[namespace]]\nname = \"pay\"\nprefix = \"pay/\"\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lockd"));
    // The file's http (port 1) is overridden by the variable, the variable's cluster name by
    // the flag.
    cmd.args([
        "serve",
        "--config",
        cfg.to_str().unwrap(),
        "--cluster-name",
        "from-flag",
    ])
    .env("LOCKD_HTTP", &http)
    .env("LOCKD_CLUSTER_NAME", "from-env")
    .env("LOCKD_LOG", "warn,lockd_server=info,lockd_raft=info")
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    let mut child = Proc::spawn(cmd);
    open_session(&http).await;
    sigterm(&mut child);
    let (status, stderr) = wait_exit(child, Duration::from_secs(20));
    assert!(status.success(), "{stderr}");
    let identity = std::fs::read_to_string(dir.path().join("data/identity")).unwrap();
    assert!(identity.contains("cluster = from-flag"), "{identity}");
    assert!(identity.contains("lock_groups = 1"), "{identity}");

    // A key that is no setting stops the start, naming it.
    std::fs::write(&cfg, "[server]\nheartbeat = 60\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_lockd"))
        .args(["serve", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no setting 'heartbeat'"), "{err}");
}

/// A start that would be refused again as it is exits 2 (`RestartPreventExitStatus=2` in the
/// unit), a failure a restart may cure exits 1 (the tests above): here, a data dir of another
/// cluster.
#[test]
fn a_refused_start_exits_2_so_that_systemd_does_not_loop_on_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("node-1");
    lockd_raft::Identity {
        cluster: "another".into(),
        node_id: 1,
        lock_groups: 1,
        ..lockd_raft::Identity::default()
    }
    .check_or_record(&dir)
    .unwrap();
    let child = Proc::spawn(serve(&dir, &ports(), ""));
    let (status, stderr) = wait_exit(child, Duration::from_secs(20));
    assert_eq!(status.code(), Some(2), "stderr:\n{stderr}");
    assert!(stderr.contains("cluster 'another'"), "{stderr}");
}

/// Under systemd's `Type=notify` the node says READY=1 once it serves (so `systemctl restart`
/// returns only then) and STOPPING=1 as a SIGTERM's graceful stop begins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_tells_systemd_when_it_is_ready_and_when_it_stops() {
    let tmp = tempfile::tempdir().unwrap();
    let socket_path = tmp.path().join("notify");
    let socket = std::os::unix::net::UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let addrs = ports();
    let mut cmd = serve(&tmp.path().join("node-1"), &addrs, "");
    cmd.env("NOTIFY_SOCKET", &socket_path);
    let mut child = Proc::spawn(cmd);
    let mut buf = [0u8; 512];
    let n = socket.recv(&mut buf).expect("READY=1 within 30 s");
    let ready = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(ready.starts_with("READY=1\n"), "{ready}");
    // Ready means serving: a session opens at once.
    open_session(&addrs[0]).await;
    sigterm(&mut child);
    let n = socket.recv(&mut buf).expect("STOPPING=1");
    assert_eq!(&buf[..n], b"STOPPING=1");
    let (status, stderr) = wait_exit(child, Duration::from_secs(20));
    assert!(status.success(), "{status}; stderr:\n{stderr}");
}
