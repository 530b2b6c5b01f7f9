//! The client's one error type.

use std::time::Duration;

/// Everything a lockd call can fail with.
///
/// [`Error::code`] is a stable string (the service's own code for [`Error::Api`]); match on it or
/// on the variant. [`Error::is_retryable`] says whether the same request may succeed later; the
/// client already retried those with backoff before handing them back.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The service refused the request.
    #[error("{code} ({status}): {message}")]
    Api {
        /// The HTTP status the error maps to (400, 401, 403, 404, 409, 413, 429, 503).
        status: u16,
        /// The service's stable error code, e.g. `stale_token`, `not_holder`, `queue_full`.
        code: String,
        /// A human-readable explanation from the service.
        message: String,
        /// When the service asked the caller to come back (429 and 503).
        retry_after: Option<Duration>,
    },
    /// No node could be reached, or the connection broke before an answer came.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The lock is held by someone else (try-lock), or the wait ended without a grant.
    #[error(
        "not acquired{}{}",
        holder.as_deref().map(|h| format!(": held by '{h}'")).unwrap_or_default(),
        wait_estimate_ms.map(|ms| format!(" (a wait at position {queue_position} would take about {ms} ms)")).unwrap_or_default()
    )]
    NotAcquired {
        /// The owner string of the current holder, when the service said.
        holder: Option<String>,
        /// The queue position the caller had or would have had (0 if unknown).
        queue_position: u32,
        /// What a wait at that position would take, from the name's observed hand-offs
        /// (`None`: no history on the node that answered, or unknown).
        wait_estimate_ms: Option<u64>,
    },
    /// The session ended (expired, closed, or its local deadline passed) while the request was
    /// in flight.
    #[error("the session ended")]
    SessionLost,
    /// The [`Client`](crate::Client) was closed.
    #[error("the client is closed")]
    Closed,
    /// The caller passed something the client rejects before sending it.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl Error {
    /// A stable code: the service's code for [`Error::Api`], otherwise `unavailable`,
    /// `not_acquired`, `session_lost`, `client_closed` or `invalid_argument`.
    pub fn code(&self) -> &str {
        match self {
            Error::Api { code, .. } => code,
            Error::Unavailable(_) => "unavailable",
            Error::NotAcquired { .. } => "not_acquired",
            Error::SessionLost => "session_lost",
            Error::Closed => "client_closed",
            Error::InvalidArgument(_) => "invalid_argument",
        }
    }

    /// Whether sending the same request again soon may succeed, so that the client retries it
    /// with backoff: no leader yet, a node or the network is down, or the service is shedding
    /// load (429/503). Not a cluster or namespace at its session cap (`too_many_sessions`,
    /// 429): a place frees only when another process closes its session, which seconds of
    /// backoff cannot count on, so the caller gets the answer at once and decides.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Api { status, code, .. } => {
                matches!(status, 429 | 503) && code != "too_many_sessions"
            }
            Error::Unavailable(_) => true,
            _ => false,
        }
    }

    /// How long the service asked the caller to wait before retrying, if it said.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Api { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The error carried by a `SessionEvent.error` of the session stream.
    pub(crate) fn from_event(e: lockd_proto::v1::Error) -> Error {
        Error::Api {
            status: e.status as u16,
            code: e.code,
            message: e.message,
            retry_after: (e.retry_after_ms > 0).then(|| Duration::from_millis(e.retry_after_ms)),
        }
    }
}

impl From<tonic::Status> for Error {
    /// A service error carries its code in the `lockd-error-code` metadata; a status without it
    /// came from the transport (connection refused, reset, timed out).
    fn from(s: tonic::Status) -> Error {
        let meta = |k: &str| s.metadata().get(k).and_then(|v| v.to_str().ok());
        let Some(code) = meta("lockd-error-code").map(str::to_string) else {
            return match s.code() {
                tonic::Code::InvalidArgument => Error::InvalidArgument(s.message().to_string()),
                _ => Error::Unavailable(transport_detail(&s)),
            };
        };
        use tonic::Code;
        let status = match s.code() {
            Code::InvalidArgument => 400,
            Code::Unauthenticated => 401,
            Code::PermissionDenied => 403,
            Code::NotFound => 404,
            Code::FailedPrecondition => 409,
            Code::OutOfRange => 410,
            Code::ResourceExhausted if code == "payload_too_large" => 413,
            Code::ResourceExhausted => 429,
            Code::Unavailable => 503,
            _ => 500,
        };
        let retry_after = meta("lockd-retry-after-ms")
            .and_then(|v| v.parse().ok())
            .map(Duration::from_millis);
        Error::Api {
            status,
            code,
            message: s.message().to_string(),
            retry_after,
        }
    }
}

/// A transport failure as a person can act on it: the status, the causes under it ("transport
/// error" alone says nothing), and a hint when they look like a TLS mismatch.
fn transport_detail(s: &tonic::Status) -> String {
    let mut text = format!("{:?}: {}", s.code(), s.message());
    let mut cause = std::error::Error::source(s);
    while let Some(e) = cause {
        let t = e.to_string();
        if !text.contains(&t) {
            text.push_str(": ");
            text.push_str(&t);
        }
        cause = e.source();
    }
    if let Some(hint) = tls_hint(&text) {
        text.push_str(" (");
        text.push_str(hint);
        text.push(')');
    }
    text
}

/// What to do about a transport error that looks like a TLS mismatch.
fn tls_hint(text: &str) -> Option<&'static str> {
    let has = |needles: &[&str]| needles.iter().any(|n| text.contains(n));
    if has(&["UnknownIssuer", "invalid peer certificate"]) {
        Some(
            "the node's certificate is not signed by a CA this client trusts: give its CA \
             (lockctl --ca-file, ClientOptions::tls)",
        )
    } else if has(&[
        "CertificateRequired",
        "certificate required",
        "HandshakeFailure",
    ]) {
        Some(
            "the node asks for a client certificate: give one of its client CA \
             (lockctl --cert-file and --key-file)",
        )
    } else if has(&[
        "frame with invalid size",
        "h2 protocol error",
        "http2 error",
        "invalid HTTP",
        "corrupt message",
        "connection reset",
    ]) && !text.contains("https://")
    {
        Some(
            "if the node serves TLS, use an https:// endpoint and its CA (lockctl --ca-file); \
             a plain-text node refuses https://",
        )
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_errors_that_look_like_a_tls_mismatch_say_what_to_do() {
        let hint = |t: &str| tls_hint(t).unwrap_or("");
        assert!(hint("Unavailable: invalid peer certificate: UnknownIssuer").contains("--ca-file"));
        assert!(
            hint("Unknown: transport error: received fatal alert: CertificateRequired")
                .contains("--cert-file")
        );
        assert!(
            hint("Unknown: transport error: http2 error: frame with invalid size")
                .contains("https://")
        );
        assert_eq!(
            tls_hint("Unavailable: tcp connect error: Connection refused"),
            None
        );
    }

    #[test]
    fn status_metadata_becomes_a_typed_error() {
        let mut s = tonic::Status::unavailable("the lock group has no leader yet");
        s.metadata_mut()
            .insert("lockd-error-code", "no_leader".parse().unwrap());
        s.metadata_mut()
            .insert("lockd-retry-after-ms", "250".parse().unwrap());
        let e = Error::from(s);
        assert_eq!(e.code(), "no_leader");
        assert!(e.is_retryable());
        assert_eq!(e.retry_after(), Some(Duration::from_millis(250)));

        let mut s = tonic::Status::failed_precondition("stale");
        s.metadata_mut()
            .insert("lockd-error-code", "stale_token".parse().unwrap());
        let e = Error::from(s);
        assert_eq!((e.code(), e.is_retryable()), ("stale_token", false));

        let e = Error::from(tonic::Status::unavailable("connection refused"));
        assert_eq!((e.code(), e.is_retryable()), ("unavailable", true));

        // Both are 429; only the load shedding is worth retrying at once.
        let limited = |code: &str| Error::Api {
            status: 429,
            code: code.into(),
            message: String::new(),
            retry_after: Some(Duration::from_secs(1)),
        };
        assert!(limited("rate_limited").is_retryable());
        assert!(!limited("too_many_sessions").is_retryable());
    }
}
