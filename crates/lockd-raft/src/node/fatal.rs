//! A group whose Raft core stops by itself stops the node.
//!
//! openraft stops a group's core for good when its storage fails (a `StorageError` from the
//! log or the state machine: a failed write or fsync) or when the core panics. The group then
//! answers nothing, and a node that keeps running serves 503 for its names forever while
//! looking alive to a supervisor. So every group has a watcher (one of the node's duties; it
//! wakes on role changes and at the core's end, never per entry) that records the first such
//! stop, and [`Node::fatal`] resolves with it: the embedding process (`lockd serve`) exits
//! non-zero, and its supervisor restarts it, which replays the log or refuses a damaged one
//! (`raft::log_store`). A normal [`Node::shutdown`] reports nothing.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use tracing::error;

use crate::group::Group;
use crate::watch;
use crate::{GroupId, Node};

/// A group that stopped by itself: which one, and openraft's reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupFailure {
    pub group: GroupId,
    pub error: String,
    /// Reported by [`Node::refuse_to_serve`]: the node must not serve as it is configured
    /// (a restart with the same flags and data dir is refused again), rather than a failure.
    pub refused: bool,
}

impl fmt::Display for GroupFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "group {} stopped: {}", self.group, self.error)
    }
}

impl std::error::Error for GroupFailure {}

/// Waits for `group`'s core to stop; records a stop that was not a shutdown in `failed` (the
/// first one wins).
pub(crate) async fn watch_group(group: Arc<Group>, failed: watch::Sender<Option<GroupFailure>>) {
    let Some(error) = group.raft().stopped().await else {
        return;
    };
    let f = GroupFailure {
        group: group.id(),
        error,
        refused: false,
    };
    error!(group = f.group, error = %f.error, "group stopped by itself; the node must stop");
    failed.send_if_modified(|cur| {
        let first = cur.is_none();
        if first {
            *cur = Some(f);
        }
        first
    });
}

impl Node {
    /// Reports that this node must not serve: a reason found above Raft, such as a
    /// configuration the cluster refuses. [`Node::fatal`] resolves with it as it does with a
    /// group that stopped (the first report wins).
    pub fn refuse_to_serve(&self, group: GroupId, error: String) {
        error!(group, error = %error, "this node must stop");
        self.failed.send_if_modified(|cur| {
            let first = cur.is_none();
            if first {
                *cur = Some(GroupFailure {
                    group,
                    error,
                    refused: true,
                });
            }
            first
        });
    }

    /// Resolves with the first group whose Raft core stopped by itself (a storage error, a
    /// panic; not [`Node::shutdown`]). The node cannot serve that group any more: stop the
    /// process with a non-zero exit so that a supervisor restarts it.
    pub fn fatal(&self) -> impl Future<Output = GroupFailure> + Send + 'static {
        let mut rx = self.failed.subscribe();
        async move {
            loop {
                if let Some(f) = rx.borrow_and_update().clone() {
                    return f;
                }
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{MemStorage, NoEffects, Node, NodeConfig, Storage};

    async fn one_node(disk: &std::sync::Arc<MemStorage>) -> std::sync::Arc<Node> {
        let mut cfg = NodeConfig::single("/nonexistent", "127.0.0.1:1");
        cfg.storage = Storage::Memory(disk.clone());
        Node::start(cfg, std::sync::Arc::new(NoEffects))
            .await
            .unwrap()
    }

    /// openraft's own stop (`Fatal::Stopped`) is not a failure, whoever waits for it.
    #[tokio::test]
    async fn a_core_that_was_shut_down_did_not_fail() {
        let node = one_node(&MemStorage::new(1, (Duration::ZERO, Duration::ZERO))).await;
        let g = node.group(1).unwrap();
        let stopped = tokio::spawn({
            let g = g.clone();
            async move { g.raft().stopped().await }
        });
        g.raft().shutdown().await;
        assert_eq!(stopped.await.unwrap(), None);
        node.shutdown().await;
    }

    #[tokio::test]
    async fn a_core_stopped_by_a_storage_error_failed() {
        let disk = MemStorage::new(1, (Duration::ZERO, Duration::ZERO));
        let node = one_node(&disk).await;
        let g = node.group(1).unwrap();
        let stopped = tokio::spawn({
            let g = g.clone();
            async move { g.raft().stopped().await }
        });
        let open = lockd_core::Op::OpenSession {
            session: lockd_core::SessionId(1),
            client: "test".into(),
            ttl_ms: 60_000,
            namespace: String::new(),
        };
        // Committed: the group has a leader, and the next proposal is appended.
        assert!(matches!(g.propose(open.clone()).await, Ok(Ok(_))));
        disk.fail();
        assert!(g.propose(open).await.is_err());
        let why = stopped
            .await
            .unwrap()
            .expect("a storage error is a failure");
        assert!(why.contains("simulated disk failure"), "{why}");
        node.shutdown().await;
    }
}
