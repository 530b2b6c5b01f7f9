//! What `lockd serve` tells its supervisor: how it exited, and (under systemd's `Type=notify`)
//! when it is ready and when it stops.
//!
//! **Exit codes.** 0: stopped cleanly (SIGTERM, Ctrl-C). 1: a failure a restart may cure (a
//! group's storage failed while serving, a port in use). 2: refused, and a restart with the
//! same command line and data dir is refused again (bad flags or config, a data dir of another
//! node or cluster, a wiped disk under an old id, Raft timing the cluster does not share); the
//! unit's `RestartPreventExitStatus=2` stops systemd from looping on it. clap's usage errors
//! are 2 already.
//!
//! **Readiness.** With `NOTIFY_SOCKET` set (systemd's `Type=notify`), the node sends
//! `READY=1` once it would answer `/readyz` 200 (serving names, every group it votes in with a
//! leader and caught up), so `systemctl restart` of one node returns only when it serves again
//! and a rolling restart node by node is what OPERATIONS.md describes; `STOPPING=1` as a
//! graceful stop begins. The protocol is a datagram to a Unix socket (sd_notify(3)); no library.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The exit code of a refusal (module doc).
pub const EXIT_REFUSED: u8 = 2;
/// The exit code of a failure a restart may cure.
pub const EXIT_FAILED: u8 = 1;

/// An error that refuses the start (exit [`EXIT_REFUSED`]), wherever it sits in an
/// `anyhow` chain.
#[derive(Debug)]
pub struct Refused(pub String);

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// `e` as a refusal.
pub fn refused(e: impl fmt::Display) -> anyhow::Error {
    anyhow::Error::new(Refused(e.to_string()))
}

/// A node's start error: a refusal if the same flags and data dir would be refused again.
pub fn start_error(e: lockd_raft::StartError) -> anyhow::Error {
    use lockd_raft::StartError;
    match e {
        StartError::Config(_) | StartError::Identity(_) => refused(e),
        // StartError's message already carries its cause; as an anyhow chain, `{:#}` repeats it.
        e => anyhow::anyhow!("{e}"),
    }
}

/// The exit code for `e`: [`EXIT_REFUSED`] if a [`Refused`] is in its chain, else
/// [`EXIT_FAILED`].
pub fn exit_code(e: &anyhow::Error) -> u8 {
    if e.chain().any(|c| c.is::<Refused>()) {
        EXIT_REFUSED
    } else {
        EXIT_FAILED
    }
}

/// Sends `state` (`READY=1`, `STOPPING=1`, `STATUS=...` lines) to systemd if it asked for
/// notifications (`NOTIFY_SOCKET`); `Ok(false)` if it did not.
pub fn notify(state: &str) -> std::io::Result<bool> {
    use std::os::unix::net::UnixDatagram;
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let socket = UnixDatagram::unbound()?;
    let bytes = path.as_encoded_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        socket.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        socket.send_to(state.as_bytes(), &path)?;
    }
    Ok(true)
}

/// Sends `READY=1` once `service` is ready (checked every 100 ms), if systemd asked for it.
pub async fn ready_when_serving(service: Arc<crate::service::Service>) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    loop {
        if service.not_ready().is_empty() {
            let status = format!("READY=1\nSTATUS=serving (node {})", service.node.node_id());
            if let Err(e) = notify(&status) {
                tracing::warn!(error = %e, "could not tell systemd the node is ready");
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_anywhere_in_the_chain_exits_2_anything_else_1() {
        let e = refused("a data dir of another node").context("starting node 1");
        assert_eq!(exit_code(&e), EXIT_REFUSED);
        assert_eq!(exit_code(&anyhow::anyhow!("disk full")), EXIT_FAILED);
    }
}
