//! One error type for every API, with the status, the stable code, the message and a retry hint.
//!
//! The codes are defined once, as the `ErrorCode` enum of proto/lockd/v1/lockd.proto; HTTP sends
//! their names in lower case, gRPC the same name in a `google.rpc.ErrorInfo`. Each code has one
//! HTTP status ([`Code::status`]), and the mapping from core rejections and group errors lives
//! here and only here, so HTTP and gRPC agree. Nothing a client sends maps to a 500: those are
//! reserved for bugs.

use std::collections::HashMap;
use std::sync::OnceLock;

use lockd_core::Rejection;
pub use lockd_proto::v1::ErrorCode;
use lockd_raft::GroupError;

/// What each [`ErrorCode`] means on the wire.
pub trait Code {
    /// The HTTP status (the gRPC code follows it).
    fn status(self) -> u16;
    /// The name as HTTP and the `lockd-error-code` metadata send it: `"wait_too_long"`.
    fn name(self) -> &'static str;
    /// The name as a `google.rpc.ErrorInfo` reason: `"WAIT_TOO_LONG"`.
    fn reason(self) -> &'static str;
}

impl Code for ErrorCode {
    fn status(self) -> u16 {
        match self {
            ErrorCode::Unspecified => 500,
            ErrorCode::InvalidArgument
            | ErrorCode::TtlOutOfRange
            | ErrorCode::WaitTooLong
            | ErrorCode::InvalidSemaphoreLimit
            | ErrorCode::InvalidNamespace
            | ErrorCode::InvalidShardMap
            | ErrorCode::InvalidClusterTiming
            | ErrorCode::InvalidGroup => 400,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::PermissionDenied | ErrorCode::WrongNamespace | ErrorCode::AdminDisabled => {
                403
            }
            ErrorCode::NotFound
            | ErrorCode::SessionNotFound
            | ErrorCode::NamespaceNotFound
            | ErrorCode::MoveNotFound
            | ErrorCode::GroupNotFound => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::WatchCompacted => 410,
            ErrorCode::RequestTimeout => 408,
            ErrorCode::ModeConflict
            | ErrorCode::SessionExists
            | ErrorCode::NotHolder
            | ErrorCode::StaleToken
            | ErrorCode::AlreadyHeld
            | ErrorCode::AlreadyWaiting
            | ErrorCode::TooManyReentries
            | ErrorCode::CounterLimit
            | ErrorCode::MoveConflict
            | ErrorCode::ClusterTimingMismatch
            | ErrorCode::NodeRetired
            | ErrorCode::GroupExists
            | ErrorCode::GroupCreationInProgress
            | ErrorCode::MemberChangeRefused
            | ErrorCode::NamespaceVersionConflict
            | ErrorCode::NamespaceNameTaken
            | ErrorCode::GroupNotEmpty
            | ErrorCode::GroupRemoved => 409,
            ErrorCode::BodyTooLarge => 413,
            ErrorCode::UriTooLong => 414,
            ErrorCode::UnsupportedMediaType => 415,
            ErrorCode::QueueFull
            | ErrorCode::TooManyLocks
            | ErrorCode::TooManySessions
            | ErrorCode::RateLimited
            | ErrorCode::WatchTooSlow => 429,
            ErrorCode::Internal => 500,
            ErrorCode::Unavailable
            | ErrorCode::NoLeader
            | ErrorCode::WrongGroup
            | ErrorCode::BucketMoving
            | ErrorCode::SessionNotHere
            | ErrorCode::WaitOutcomeUnknown
            | ErrorCode::TooManyConnections => 503,
        }
    }

    fn name(self) -> &'static str {
        static NAMES: OnceLock<HashMap<i32, &'static str>> = OnceLock::new();
        let names = NAMES.get_or_init(|| {
            (0..=i32::from(u8::MAX))
                .filter_map(|i| ErrorCode::try_from(i).ok())
                .map(|c| {
                    let lower: &'static str = c.reason().to_ascii_lowercase().leak();
                    (c as i32, lower)
                })
                .collect()
        });
        names.get(&(self as i32)).copied().unwrap_or("unspecified")
    }

    fn reason(self) -> &'static str {
        let full = self.as_str_name();
        full.strip_prefix("ERROR_CODE_").unwrap_or(full)
    }
}

/// An API error. `status` is the HTTP status of `code`; gRPC derives its code from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub code: ErrorCode,
    pub message: String,
    /// Sent as `Retry-After` (rounded up to seconds) and in the gRPC details and metadata.
    pub retry_after_ms: Option<u64>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status: code.status(),
            code,
            message: message.into(),
            retry_after_ms: None,
        }
    }

    /// A reply or answer of another kind than the call asked for (`what`): a bug somewhere,
    /// reported as unavailable. The one place its wording lives.
    pub(crate) fn unexpected(what: &str, got: Option<&dyn std::fmt::Debug>) -> ApiError {
        let message = match got {
            Some(got) => format!("unexpected reply to {what}: {got:?}"),
            None => format!("unexpected reply to {what}"),
        };
        ApiError::new(ErrorCode::Unavailable, message)
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorCode::InvalidArgument, message)
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
        write!(f, "{} {}: {}", self.status, self.code.name(), self.message)
    }
}

impl From<Rejection> for ApiError {
    fn from(r: Rejection) -> ApiError {
        // The core names each rejection by its code (`Rejection::code`); those names are the
        // proto enum's, so the lookup is the whole mapping (a test covers every variant kind).
        let code =
            ErrorCode::from_str_name(&format!("ERROR_CODE_{}", r.code().to_ascii_uppercase()))
                .unwrap_or(ErrorCode::Internal);
        let retry = match &r {
            Rejection::QueueFull { retry_after_ms, .. } => Some(*retry_after_ms),
            Rejection::TooManyLocks { .. }
            | Rejection::TooManySessions { .. }
            | Rejection::NamespaceSessionsFull { .. }
            | Rejection::OpenSessionsFull { .. } => Some(1_000),
            Rejection::WrongGroup { .. } | Rejection::BucketMoving { .. } => Some(100),
            Rejection::SessionNotHere { .. } => Some(100),
            _ => None,
        };
        ApiError {
            retry_after_ms: retry,
            ..ApiError::new(code, r.to_string())
        }
    }
}

impl From<GroupError> for ApiError {
    fn from(e: GroupError) -> ApiError {
        match e {
            GroupError::SessionNotFound => ApiError::new(
                ErrorCode::SessionNotFound,
                "the session does not exist or has expired",
            ),
            GroupError::NoLeader { retry_after_ms } => {
                ApiError::new(ErrorCode::NoLeader, "the lock group has no leader yet")
                    .retry_after(retry_after_ms)
            }
            other => ApiError::new(ErrorCode::Unavailable, other.to_string()).retry_after(1_000),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_a_name_a_reason_and_a_status() {
        let all: Vec<ErrorCode> = (1..=i32::from(u8::MAX))
            .filter_map(|i| ErrorCode::try_from(i).ok())
            .collect();
        assert!(all.len() >= 45, "{}", all.len());
        let mut names = std::collections::HashSet::new();
        for c in all {
            assert!(names.insert(c.name()), "{c:?} twice");
            assert_eq!(c.name().to_ascii_uppercase(), c.reason());
            assert!((400..600).contains(&c.status()), "{c:?}");
        }
        assert_eq!(ErrorCode::WaitTooLong.name(), "wait_too_long");
        assert_eq!(ErrorCode::WaitTooLong.reason(), "WAIT_TOO_LONG");
        assert_eq!(ErrorCode::Unavailable.status(), 503);
    }

    /// Every code `Rejection::code` can return (read from its source) is a proto code.
    #[test]
    fn every_core_code_is_a_proto_code() {
        let src = include_str!("../../lockd-core/src/types.rs");
        let start = src.find("pub fn code(&self)").expect("Rejection::code");
        let body = &src[start..start + src[start..].find("\n    }\n").expect("its end")];
        let codes: Vec<&str> = body
            .lines()
            .filter_map(|l| l.split("=> \"").nth(1))
            .filter_map(|rest| rest.split('"').next())
            .collect();
        assert!(codes.len() >= 30, "{codes:?}");
        for c in codes {
            let name = format!("ERROR_CODE_{}", c.to_ascii_uppercase());
            assert!(
                ErrorCode::from_str_name(&name).is_some(),
                "{c} is not in the proto"
            );
        }
    }

    #[test]
    fn a_rejection_keeps_the_core_code() {
        let samples = [
            Rejection::WaitTooLong {
                wait_ms: 1,
                max_ms: 0,
            },
            Rejection::InvalidSemaphoreLimit { limit: 0, max: 1 },
            Rejection::QueueFull {
                limit: 1,
                retry_after_ms: 5,
            },
            Rejection::GroupBeingCreated { group: 3 },
            Rejection::UnknownMove { move_id: 1 },
        ];
        for r in samples {
            let e = ApiError::from(r.clone());
            assert_eq!(e.code.name(), r.code(), "{r:?}");
        }
    }
}
