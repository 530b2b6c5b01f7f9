//! A group whose storage fails stops for good (openraft's `StorageError` is fatal); the node
//! reports it through `Node::fatal` so that its process can exit and be restarted, instead of
//! serving 503 for the group's names forever. A normal shutdown reports nothing.
mod common;

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use common::*;
use lockd_core::SessionId;
use lockd_raft::{MemStorage, Storage};

/// Whether `f` is ready at its first poll (no waiting involved).
fn ready_now<F: Future>(f: F) -> Option<F::Output> {
    match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

/// Before: nothing reported the stopped group (`Node::fatal` did not exist), and the node kept
/// answering `Unavailable` for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_error_stops_the_group_and_is_reported() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let disk = MemStorage::new(1, (Duration::ZERO, Duration::ZERO));
    let d = disk.clone();
    let mut nodes = start_cluster(tmp.path(), 1, move |c| {
        c.storage = Storage::Memory(d.clone());
    })
    .await;
    let n = nodes.pop().unwrap();
    let s = SessionId(3);
    ok(&n.group(), open_op(s, 60_000, "")).await;
    ok(&n.group(), acquire_op(s, "before", 0)).await;
    assert_eq!(ready_now(n.node.fatal()), None, "nothing has failed yet");

    disk.fail();
    assert!(try_propose(&n.group(), acquire_op(s, "after", 0))
        .await
        .is_err());
    let failure = tokio::time::timeout(Duration::from_secs(10), n.node.fatal())
        .await
        .expect("the failed group is reported");
    assert_eq!(failure.group, G);
    assert!(
        failure.error.contains("simulated disk failure"),
        "{failure}"
    );
    // It stays reported: a later caller sees it at once.
    assert_eq!(ready_now(n.node.fatal()), Some(failure));
    n.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_normal_shutdown_is_not_a_failure() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let mut nodes = start_cluster(tmp.path(), 1, |_| {}).await;
    let n = nodes.pop().unwrap();
    ok(&n.group(), open_op(SessionId(3), 60_000, "")).await;
    let node = n.node.clone();
    n.stop().await;
    // Every core has ended (shutdown waits for them); none of them counts as a failure.
    assert_eq!(ready_now(node.fatal()), None);
}
