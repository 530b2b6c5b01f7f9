//! What lockctl's test files share: the command line against a test cluster, process
//! liveness from /proc, and "signal it, wait for its exit".
#![allow(dead_code)]

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::common::Cluster;

/// `lockctl --endpoints … --namespace fast --json`, stdin from /dev/null, killed on drop.
pub fn lockctl(c: &Cluster) -> tokio::process::Command {
    let mut cmd = lockctl_at(&c.endpoints());
    cmd.args(["--namespace", "fast"]);
    cmd
}

/// `lockctl --endpoints ENDPOINTS --json` (no namespace), stdin from /dev/null, killed on drop.
pub fn lockctl_at(endpoints: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_lockctl"));
    cmd.args(["--endpoints", endpoints, "--json"])
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// `lockctl --admin-token-file DIR/admin-token ARGS` (an admin command); its JSON on success.
pub async fn admin_json(c: &Cluster, args: &[&str]) -> serde_json::Value {
    let out = lockctl(c)
        .arg("--admin-token-file")
        .arg(c.admin_token_file())
        .args(args)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "lockctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Alive and not a zombie (lockctl reaps CMD, so an exited one is gone soon after).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map(|s| {
            !s.lines()
                .any(|l| l.starts_with("State:") && l.contains('Z'))
        })
        .unwrap_or(false)
}

/// Sends `sig` to `child` and waits (up to 10 s) for it to exit.
pub async fn signal_and_wait(child: &mut tokio::process::Child, sig: Signal) -> ExitStatus {
    kill(Pid::from_raw(child.id().expect("running") as i32), sig).unwrap();
    tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("exits within 10 s of the signal")
        .unwrap()
}
