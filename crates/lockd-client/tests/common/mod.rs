//! The shared test kit (`lockd-testkit`), as every test file here imports it.
#![allow(unused_imports)]

pub use lockd_testkit::client::*;
pub use lockd_testkit::{free_port, free_ports, lockd_bin, target_dir, Cluster, Proc, ADMIN_TOKEN};
