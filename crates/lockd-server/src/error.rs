//! One error type for every API, with the status, the stable code, the message and a retry hint.
//!
//! The mapping from core rejections and group errors lives here and only here, so HTTP and gRPC
//! agree. Nothing a client sends maps to a 500: those are reserved for bugs.

use lockd_core::Rejection;
use lockd_raft::GroupError;

/// An API error. `status` is the HTTP status; gRPC derives its code from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
    /// Sent as `Retry-After` (rounded up to seconds) and in the gRPC metadata.
    pub retry_after_ms: Option<u64>,
}

impl ApiError {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after_ms: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "invalid_argument", message)
    }

    pub fn retry_after(mut self, ms: u64) -> ApiError {
        self.retry_after_ms = Some(ms.max(1));
        self
    }

    /// Whether a client may retry the same request (after `retry_after_ms`).
    pub fn retryable(&self) -> bool {
        matches!(self.status, 429 | 503)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status, self.code, self.message)
    }
}

impl From<Rejection> for ApiError {
    fn from(r: Rejection) -> ApiError {
        let status = match &r {
            Rejection::InvalidString { .. }
            | Rejection::TtlOutOfRange { .. }
            | Rejection::WaitTooLong { .. }
            | Rejection::InvalidSemaphoreLimit { .. }
            | Rejection::UnknownNamespace { .. }
            | Rejection::InvalidNamespace { .. }
            | Rejection::InvalidShardMap { .. } => 400,
            Rejection::UnknownSession { .. } => 404,
            Rejection::WrongNamespace { .. } => 403,
            Rejection::ModeConflict { .. }
            | Rejection::SessionExists { .. }
            | Rejection::NotHolder { .. }
            | Rejection::StaleToken { .. }
            | Rejection::AlreadyHeld { .. }
            | Rejection::AlreadyWaiting { .. }
            | Rejection::TooManyReentries { .. } => 409,
            Rejection::CounterLimit { .. } => 409,
            Rejection::QueueFull { .. } | Rejection::TooManyLocks { .. } => 429,
            // The router retries these itself; they reach a caller only if the retries ran out.
            Rejection::WrongGroup { .. } | Rejection::BucketMoving { .. } => 503,
            Rejection::MoveConflict { .. } => 409,
            Rejection::UnknownMove { .. } => 404,
            Rejection::ClusterTimingMismatch { .. } | Rejection::NodeRetired { .. } => 409,
            Rejection::InvalidClusterTiming { .. } => 400,
            // The service adopts the session and repeats the call; a caller sees this only if
            // the name moved again meanwhile.
            Rejection::SessionNotHere { .. } => 503,
            Rejection::GroupExists { .. } | Rejection::GroupBeingCreated { .. } => 409,
            Rejection::UnknownGroup { .. } => 404,
            Rejection::InvalidGroup { .. } => 400,
        };
        let retry = match &r {
            Rejection::QueueFull { retry_after_ms, .. } => Some(*retry_after_ms),
            Rejection::TooManyLocks { .. } => Some(1_000),
            Rejection::WrongGroup { .. } | Rejection::BucketMoving { .. } => Some(100),
            Rejection::SessionNotHere { .. } => Some(100),
            _ => None,
        };
        ApiError {
            status,
            code: r.code(),
            message: r.to_string(),
            retry_after_ms: retry,
        }
    }
}

impl From<GroupError> for ApiError {
    fn from(e: GroupError) -> ApiError {
        match e {
            GroupError::SessionNotFound => ApiError::new(
                404,
                "session_not_found",
                "the session does not exist or has expired",
            ),
            GroupError::NoLeader { retry_after_ms } => {
                ApiError::new(503, "no_leader", "the lock group has no leader yet")
                    .retry_after(retry_after_ms)
            }
            other => ApiError::new(503, "unavailable", other.to_string()).retry_after(1_000),
        }
    }
}
