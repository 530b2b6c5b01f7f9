//! Typed errors. Each variant says whether the caller should retry, and where.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why a group operation did not produce an answer from the state machine.
///
/// A `Rejection` from lockd-core is *not* an error here: it is a committed (or validated)
/// answer and travels inside `Ok`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GroupError {
    /// No leader is known or the leader's lease is not (yet) valid. Nothing was proposed.
    /// Retry after `retry_after_ms`, on this node or another.
    NoLeader { retry_after_ms: u64 },
    /// The group has no lease for the session (never brought here, or closed or expired here).
    /// Leases are per group: the session may live on in another group.
    SessionNotFound,
    /// The operation could not be completed. The message says whether the outcome is unknown
    /// (the command may or may not have been committed: inspect state before retrying).
    Unavailable(String),
    /// No answer within the deadline; the outcome of a proposal is unknown.
    Timeout,
    /// This node is shutting down. Retry on another node.
    ShuttingDown,
}

impl GroupError {
    /// Whether retrying the same call (after `retry_after_ms()`) is safe and useful.
    pub fn is_retryable(&self) -> bool {
        matches!(self, GroupError::NoLeader { .. } | GroupError::ShuttingDown)
    }

    /// A hint for when to retry, if retrying makes sense.
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            GroupError::NoLeader { retry_after_ms } => Some(*retry_after_ms),
            GroupError::ShuttingDown => Some(0),
            _ => None,
        }
    }
}

impl fmt::Display for GroupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GroupError::NoLeader { retry_after_ms } => {
                write!(
                    f,
                    "no leader with a valid lease for this group; retry in {retry_after_ms} ms"
                )
            }
            GroupError::SessionNotFound => f.write_str(
                "the session has no lease in this group (closed, expired, or never here)",
            ),
            GroupError::Unavailable(why) => write!(f, "group unavailable: {why}"),
            GroupError::Timeout => {
                f.write_str("timed out waiting for the group; the outcome is unknown")
            }
            GroupError::ShuttingDown => {
                f.write_str("this node is shutting down; retry on another node")
            }
        }
    }
}

impl std::error::Error for GroupError {}

/// Why [`crate::Node::start`] failed. Not retryable without operator action.
#[derive(Debug)]
pub enum StartError {
    /// The configuration is inconsistent (e.g. `node_id` not among `peers`).
    Config(String),
    /// The data dir belongs to another node, cluster or group count ([`crate::Identity`]).
    Identity(String),
    /// Opening or recovering a group's data failed.
    Storage {
        group: crate::GroupId,
        source: std::io::Error,
    },
    /// openraft refused to start a group.
    Raft {
        group: crate::GroupId,
        message: String,
    },
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Config(why) => write!(f, "invalid node config: {why}"),
            StartError::Identity(why) => write!(f, "refusing to start: {why}"),
            StartError::Storage { group, source } => {
                write!(f, "group {group}: cannot open its data: {source}")
            }
            StartError::Raft { group, message } => {
                write!(f, "group {group}: raft failed to start: {message}")
            }
        }
    }
}

impl std::error::Error for StartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StartError::Storage { source, .. } => Some(source),
            _ => None,
        }
    }
}
