//! One kit for every harness that runs real lockd nodes: the client and CLI tests, the
//! benchmark, the fault checker.
//!
//! Why one kit: each harness used to spell `lockd serve`'s flags by hand, pick ports its own
//! way and kill processes its own way, so a renamed flag broke them one at a time and a port
//! race fixed in one stayed in the others. Here a node is a [`ServeArgs`] (the server's own
//! argument type, rendered by [`ServeArgs::to_args`]), ports come from [`free_ports`], a
//! process is a [`Proc`] signalled by pid, and a [`Cluster`] waits until every group is led
//! by its preferred leader and a session opens. [`inproc`] runs nodes inside the test's own
//! process instead, for tests that look inside a node.

pub mod client;
mod cluster;
pub mod inproc;
mod ports;
mod proc;

pub use cluster::{Cluster, ADMIN_TOKEN};
pub use lockd_server::cli::ServeArgs;
pub use ports::{free_port, free_ports, low_listener, low_tokio_listener, rebind};
pub use proc::Proc;

use std::path::PathBuf;

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
