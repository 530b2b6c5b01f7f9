//! lockctl tells "the cluster could not be reached" (69, naming the endpoints it tried) from "the
//! command failed" (1), so a script can tell an outage from a refusal.

mod common;
mod support;

use common::*;

/// An address where nothing listens: a port taken and let go.
fn dead_endpoint() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_cluster_exits_69_and_names_the_endpoints() {
    let dead = dead_endpoint();
    for args in [
        vec!["inspect", "fast/x"],
        vec!["status"],
        vec!["run", "fast/x", "--", "true"],
    ] {
        let out = support::lockctl_at(&dead)
            .args(&args)
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(69), "lockctl {args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let said = format!("{err}{}", String::from_utf8_lossy(&out.stdout));
        assert!(
            said.contains(&dead),
            "lockctl {args:?} did not name {dead}: {said}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_command_exits_1_not_69() {
    let c = Cluster::start(1, 1).await;
    // A release of a hold that does not exist: the service answers and refuses.
    let out = support::lockctl(&c)
        .args([
            "release",
            "fast/none",
            "--session",
            "s_0000000000000001",
            "--token",
            "1",
        ])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}
