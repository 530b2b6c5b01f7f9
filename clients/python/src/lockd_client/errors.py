"""The client's typed errors.

Every error is a :class:`LockdError` with

* ``code``: a stable string: the service's own error code (``stale_token``, ``queue_full``, ...;
  see docs/API.md "Limits and errors") when the service refused the request, otherwise one of
  ``unavailable``, ``not_acquired``, ``session_lost``, ``client_closed``, ``invalid_argument``,
  ``lock_lost``, ``fence_rejected``;
* ``status``: the HTTP status the service mapped the error to (400, 401, 403, 404, 409, 413, 429,
  503), or ``None`` when the service did not answer;
* ``retryable``: whether the same request may succeed soon (no leader yet, a node or the network
  is down, load shedding: 429 and 503). The client has already retried those with backoff before
  raising them. A cluster or namespace at its session cap (``too_many_sessions``, 429) is not
  retryable: a place frees only when another process closes its session, so the client raises it
  at once;
* ``retry_after``: the service's hint in seconds (429 and 503), or ``None``.

The class says what kind of failure it is; match on the class or on ``code``.
"""
from __future__ import annotations

from typing import Dict, Optional, Type

import grpc

from ._proto import lockd_pb2 as pb

__all__ = [
    "LockdError",
    "InvalidArgument",
    "Unauthenticated",
    "PermissionDenied",
    "SessionNotFound",
    "Conflict",
    "ResourceExhausted",
    "Unavailable",
    "NotAcquired",
    "SessionLost",
    "ClientClosed",
    "LockLost",
    "FenceRejected",
]


class LockdError(Exception):
    """Base class of every error this package raises."""

    default_code = "lockd_error"
    #: The client already retried this as far as its options allow (opening a session within
    #: ``connect_timeout``): a caller's own retry loop passes it on rather than retry again.
    exhausted: bool = False

    def __init__(
        self,
        message: str,
        *,
        code: Optional[str] = None,
        status: Optional[int] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code: str = code or self.default_code
        self.status: Optional[int] = status
        self.retry_after: Optional[float] = retry_after

    @property
    def retryable(self) -> bool:
        """Whether sending the same request again soon may succeed (429, 503, no answer), so
        that the client retries it; not ``too_many_sessions`` (see the module's doc)."""
        return self.status in (429, 503) and self.code != "too_many_sessions"

    def __str__(self) -> str:
        where = f" ({self.status})" if self.status is not None else ""
        return f"{self.code}{where}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, status={self.status!r}, message={self.message!r})"


class InvalidArgument(LockdError):
    """The request was malformed or out of bounds (400); the message names the field and limit."""

    default_code = "invalid_argument"


class Unauthenticated(LockdError):
    """The namespace needs a bearer token and none was sent (401)."""

    default_code = "unauthenticated"


class PermissionDenied(LockdError):
    """Wrong bearer token, or a name outside the session's namespace (403 ``wrong_namespace``)."""

    default_code = "permission_denied"


class SessionNotFound(LockdError):
    """The session is unknown or has expired on the service (404 ``session_not_found``)."""

    default_code = "session_not_found"


class Conflict(LockdError):
    """The lock's state refuses the request (409): ``not_holder``, ``stale_token``,
    ``already_held``, ``mode_conflict``, ``too_many_reentries``, ``counter_limit``."""

    default_code = "conflict"


class ResourceExhausted(LockdError):
    """A limit was hit: ``queue_full``, ``too_many_locks``, ``rate_limited``
    (429, retryable), ``too_many_sessions`` (429, not retryable: a full namespace or cluster)
    or ``payload_too_large`` (413, not retryable)."""

    default_code = "resource_exhausted"


class Unavailable(LockdError):
    """No node answered, the connection broke, or the service has no leader or quorum (503).
    Always retryable."""

    default_code = "unavailable"

    @property
    def retryable(self) -> bool:
        return True


class NotAcquired(LockdError):
    """The lock is held by someone else (try-lock), or the wait ended without a grant."""

    default_code = "not_acquired"

    def __init__(
        self,
        message: str,
        *,
        holder: Optional[str] = None,
        queue_position: int = 0,
        lock_delay_until_ms: int = 0,
    ) -> None:
        super().__init__(message)
        #: The owner string of the current holder, when the service said.
        self.holder = holder
        #: The queue position the caller had or would have had (0 if unknown).
        self.queue_position = queue_position
        #: Group time a lock-delay after a failed holder ends (0 = none).
        self.lock_delay_until_ms = lock_delay_until_ms


class SessionLost(LockdError):
    """The session ended (expired, closed by the service, or its local deadline passed) while
    the request was in flight. An acquire that sees it retries on a new session."""

    default_code = "session_lost"


class ClientClosed(LockdError):
    """The client was closed."""

    default_code = "client_closed"


class LockLost(LockdError):
    """The lock is lost (its local deadline passed or its session ended): work under it must
    stop, and a fenced write was not attempted."""

    default_code = "lock_lost"


class FenceRejected(LockdError):
    """The store refused a fenced write: it has seen a newer fencing token, so another holder
    has taken over. Stop working under this lock."""

    default_code = "fence_rejected"


_BY_STATUS: Dict[int, Type[LockdError]] = {
    400: InvalidArgument,
    401: Unauthenticated,
    403: PermissionDenied,
    404: SessionNotFound,
    409: Conflict,
    413: ResourceExhausted,
    429: ResourceExhausted,
    503: Unavailable,
}

_STATUS_BY_GRPC: Dict[grpc.StatusCode, int] = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
}


def from_status(status: int, code: str, message: str, retry_after_ms: int = 0) -> LockdError:
    """The error for a service refusal with HTTP ``status`` and stable ``code``."""
    cls = _BY_STATUS.get(status, LockdError)
    retry_after = retry_after_ms / 1000.0 if retry_after_ms > 0 else None
    return cls(message, code=code, status=status, retry_after=retry_after)


def from_event(e: pb.Error) -> LockdError:
    """The error carried by a ``SessionEvent.error`` on the session stream."""
    return from_status(e.status, e.code, e.message, e.retry_after_ms)


def tls_hint(details: str, endpoint: str, tls_without_cert: bool = False) -> Optional[str]:
    """What to do about a transport error that looks like a TLS mismatch, if it does.
    ``tls_without_cert``: the client speaks TLS and has no certificate of its own."""
    if "CERTIFICATE_VERIFY_FAILED" in details or "unable to get local issuer" in details:
        return ("the node's certificate is not signed by a CA this client trusts: give its CA "
                "(ca_file=)")
    if any(s in details for s in ("CERTIFICATE_REQUIRED", "certificate required",
                                  "PEER_DID_NOT_RETURN_A_CERTIFICATE")):
        return "the node asks for a client certificate: give cert_file= and key_file="
    # A node that requires client certificates refuses one without after a TLS 1.3 handshake
    # the client thinks complete: all the client sees is a connection that broke.
    if tls_without_cert and any(s in details for s in ("TSI_DATA_CORRUPTED", "Socket closed",
                                                       "Connection reset", "Broken pipe")):
        return ("the node closed the TLS connection: if it requires client certificates, give "
                "cert_file= and key_file=")
    if "Socket closed" in details and not endpoint.startswith("https://"):
        return ("if the node serves TLS, use an https:// endpoint and its CA (ca_file=); a "
                "plain-text node refuses https://")
    return None


def from_rpc_error(e: grpc.RpcError, endpoint: str = "", tls_without_cert: bool = False) -> LockdError:
    """Maps a failed gRPC call to a typed error.

    A refusal by the service carries its stable code in the ``lockd-error-code`` metadata and a
    retry hint in ``lockd-retry-after-ms``; a status without that code came from the transport
    (refused, reset, timed out) and is :class:`Unavailable`, except ``INVALID_ARGUMENT`` and
    ``UNIMPLEMENTED``, which no retry can fix.
    """
    code_fn = getattr(e, "code", None)
    gcode: grpc.StatusCode = code_fn() if callable(code_fn) else grpc.StatusCode.UNKNOWN
    details_fn = getattr(e, "details", None)
    details = (details_fn() if callable(details_fn) else None) or str(e)
    meta: Dict[str, str] = {}
    for attr in ("initial_metadata", "trailing_metadata"):
        fn = getattr(e, attr, None)
        md = fn() if callable(fn) else None
        for k, v in md or ():
            meta[str(k)] = v.decode("ascii", "replace") if isinstance(v, bytes) else str(v)
    code = meta.get("lockd-error-code")
    where = f"{endpoint}: " if endpoint else ""
    if code is None:
        if gcode == grpc.StatusCode.INVALID_ARGUMENT:
            return InvalidArgument(where + details)
        if gcode == grpc.StatusCode.UNIMPLEMENTED:
            return LockdError(where + details, code="unimplemented")
        if gcode == grpc.StatusCode.DEADLINE_EXCEEDED:
            return Unavailable(f"{where}no answer in time ({details})")
        hint = tls_hint(details, endpoint, tls_without_cert)
        return Unavailable(f"{where}{gcode.name}: {details}" + (f" ({hint})" if hint else ""))
    status = _STATUS_BY_GRPC.get(gcode, 500)
    if gcode == grpc.StatusCode.RESOURCE_EXHAUSTED and code in ("payload_too_large", "body_too_large"):
        status = 413
    try:
        retry_after_ms = int(meta.get("lockd-retry-after-ms", "0"))
    except ValueError:
        retry_after_ms = 0
    return from_status(status, code, details, retry_after_ms)
