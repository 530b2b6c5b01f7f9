"""Client options and the retry policy."""
from __future__ import annotations

import os
import random
import socket
from dataclasses import dataclass, field
from typing import Optional

from .errors import InvalidArgument

__all__ = ["ClientOptions", "RetryPolicy", "host_pid"]


def host_pid() -> str:
    """``HOST/PID`` of this process: the default client name and lock owner."""
    host = socket.gethostname().strip() or os.environ.get("HOSTNAME", "").strip() or "localhost"
    return f"{host}/{os.getpid()}"


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter: retry ``n`` (from 0) sleeps a uniformly random time
    in ``[0, min(cap, base * 2**n)]``, but at least the service's ``retry_after``; at most
    ``max_attempts`` attempts in all (the first included). The default (8 attempts, 50 ms doubling
    to 2 s: about 6 s of retrying) rides out a leader election."""

    max_attempts: int = 8
    base: float = 0.05
    cap: float = 2.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise InvalidArgument(f"retry.max_attempts must be at least 1 (got {self.max_attempts})")
        if not (0 <= self.base <= self.cap):
            raise InvalidArgument(f"retry.base must lie in 0..=cap (got base={self.base}, cap={self.cap})")

    def delay(self, attempt: int, retry_after: Optional[float] = None) -> float:
        """Seconds to sleep before retry number ``attempt`` (0 = the first retry)."""
        ceiling = min(self.cap, self.base * (2 ** min(attempt, 20)))
        return max(random.uniform(0.0, ceiling), retry_after or 0.0)


@dataclass(frozen=True)
class ClientOptions:
    """How a client behaves; the defaults suit most workers. Times are in seconds.

    - ``client_name``: names this process in the service's views and is the default owner of
      its locks (at most 256 bytes). Default ``HOST/PID``.
    - ``ttl``: the session TTL to ask for (the namespace's bounds apply; default 5..=60 s).
    - ``margin``: how long before the lease's end a lock reports lost. Default ``ttl / 5``.
    - ``namespace``: the namespace whose TTL bounds and token the session uses ("" = default).
    - ``token``: the namespace's bearer token (or the admin token), sent as
      ``authorization: Bearer <token>`` metadata on every call and on the session stream.
    - ``request_timeout``: how long one request may take before its node counts as unreachable.
    - ``connect_timeout``: how long opening a session may take in all, every endpoint and
      retry included, before the call that needed it fails (default 5 s): a wrong endpoint or
      a cluster that is down fails fast rather than after every retry of every call.
    - ``retry``: backoff for retryable errors.
    - ``ca_file``: speak TLS to the nodes, trusting this CA (PEM); ``lockd dev --tls`` prints
      its path. An ``https://`` endpoint without it trusts the system's roots. With TLS an
      endpoint's host must be a name or address the node's certificate carries, or give
      ``tls_server_name``.
    - ``cert_file``/``key_file``: a client certificate (PEM), for clusters that require one
      (``lockd serve --tls-client-ca-file``).
    - ``use_stream``: keep the session over the ``Session`` stream (default). ``False`` uses unary
      ``KeepAlive``/``Acquire``/``Release`` calls; the client also falls back to them by itself
      when a node answers the stream with ``UNIMPLEMENTED`` (e.g. a proxy without bidi streams).
    """

    client_name: str = field(default_factory=host_pid)
    ttl: float = 15.0
    margin: Optional[float] = None
    namespace: str = ""
    token: Optional[str] = None
    request_timeout: float = 2.0
    connect_timeout: float = 5.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    use_stream: bool = True
    ca_file: Optional[str] = None
    cert_file: Optional[str] = None
    key_file: Optional[str] = None
    tls_server_name: Optional[str] = None

    def __post_init__(self) -> None:
        if not (0 < self.ttl <= 3600):
            raise InvalidArgument(f"ttl must lie in (0, 3600] seconds (got {self.ttl})")
        if self.margin is not None and not (0 <= self.margin < self.ttl):
            raise InvalidArgument(f"margin must lie in [0, ttl={self.ttl}) seconds (got {self.margin})")
        if self.request_timeout <= 0:
            raise InvalidArgument(f"request_timeout must be positive (got {self.request_timeout})")
        if self.connect_timeout <= 0:
            raise InvalidArgument(f"connect_timeout must be positive (got {self.connect_timeout})")
        if len(self.client_name.encode()) > 256:
            raise InvalidArgument(
                f"client_name must be at most 256 bytes (got {len(self.client_name.encode())})")
        if (self.cert_file is None) != (self.key_file is None):
            raise InvalidArgument("cert_file and key_file go together (a client certificate and its key)")
        if self.token is not None and not (
            self.token and all(33 <= ord(c) <= 126 for c in self.token)
        ):
            raise InvalidArgument("token must be non-empty printable ASCII without spaces "
                                  "(it is sent as an authorization header)")
