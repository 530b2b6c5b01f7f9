"""The engine both APIs share: one session per client over one ``Session`` stream, on asyncio.

The async API runs it on the caller's event loop; the sync API runs it on a private loop in a
background thread. It

* opens the session, sends a keepalive every TTL/3 and keeps the **local lease deadlines**:
  ``send time of the last acknowledged open/attach/keepalive + TTL - margin`` on the monotonic
  clock, one per lock group and one session-wide (``_lease.GroupLeases``). The service expires
  a lease no earlier than TTL after a keepalive it acknowledged, which it received after we
  sent it, so the client gives up first;
* moves the stream to the next endpoint and ``attach``-es the same session when the stream
  breaks or a keepalive goes unanswered for a whole interval, within the local deadline;
* matches pushed grants to waiting acquires (a waiting acquire parks in the lock's FIFO queue
  on the service and is woken by the push, never by polling);
* marks a lock lost when its own deadline passes or its group's lease ended (a keepalive's
  ``not_here`` for the group, or a pushed ``SessionEnded`` for that group alone), and the session
  lost when every deadline it has (the session-wide one and each group's) passed without a
  renewal, or the service says the session is gone (404, every group ``not_here``, or a
  ``SessionEnded`` for group 0); every lock of it reports lost and the next acquire opens a new
  session. A keepalive that fails otherwise (503: no group extended, some could not answer) is
  retried; it loses nothing by itself.

The semantics follow lockd-client (Rust), crates/lockd-client/src/session.rs.
"""
from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass, field
from typing import (Any, AsyncIterator, Awaitable, Callable, Coroutine, Dict, List, Optional,
                    Set, Tuple, TypeVar, Union)

import grpc
import grpc.aio

from . import errors
from ._lease import EXTENDED, NOT_HERE, GroupLeases, Lease, LockLease, monotonic
from ._options import ClientOptions
from ._proto import lockd_pb2 as pb
from ._pushes import Answer, Orphan, Pushed, Pushes, settle
from ._rpc import LockStub
from .errors import (ClientClosed, InvalidArgument, LockdError, NotAcquired, SessionLost,
                     Unavailable)
from .types import Mode

log = logging.getLogger("lockd_client")

#: The longest wait the service accepts for one acquire (``wait_ms`` <= 300 000). A longer wait
#: queues again, round after round, up to the caller's deadline.
MAX_WAIT = 300.0
MAX_NAME_BYTES = 512
MAX_OWNER_BYTES = 256
MAX_SEMAPHORE = 10_000

Req = TypeVar("Req")
Resp = TypeVar("Resp")


@dataclass
class Hold:
    """A grant: what a lock object wraps."""

    name: str
    token: int
    session_id: str
    lease: LockLease
    owner: str
    mode: Mode
    reentry: int
    id: int = 0


@dataclass
class _Acq:
    name: str
    owner: str
    mode: Mode
    fut: "asyncio.Future[Hold]"
    #: When the acquire was sent (a group the client has no lease for counts its lease from it).
    sent: float = 0.0
    #: When its wait ends on the service (send time + wait): an adopted wait whose outcome is
    #: never pushed gives up a little after it (``_keepalive``).
    wait_until: float = 0.0


#: How long past its wait an adopted wait's acquire waits for a push before it gives up.
ADOPTED_SLACK = 2.0


@dataclass
class _Pending:
    kind: str  # "keepalive" | "acquire" | "release"
    sent: float = 0.0
    #: A keepalive that named its groups (``GroupLeases.keepalive_groups``).
    named: bool = False
    acq: Optional[_Acq] = None
    fut: Optional["asyncio.Future[int]"] = None


class _Unsure(Exception):
    """A release on the stream whose answer the broken stream took with it: it may have landed."""


@dataclass
class _Conn:
    call: Any  # grpc.aio.StreamStreamCall[pb.SessionRequest, pb.SessionEvent]
    queue: "asyncio.Queue[Optional[pb.SessionRequest]]"
    endpoint: int
    reader: Optional["asyncio.Task[None]"] = None

    def close(self) -> None:
        self.queue.put_nowait(None)
        self.call.cancel()


@dataclass
class _Sess:
    id: str
    gen: int
    ttl: float
    every: float
    lease: Lease
    next_keepalive: float
    reconnect_at: float = 0.0
    reconnect_attempt: int = 0
    keepalive_failures: int = 0
    ticker: Optional["asyncio.Task[None]"] = None
    #: The reconnect (or unary keepalive) running in its own task: the tick keeps the local
    #: deadlines meanwhile, and the task's end wakes it.
    busy: Optional["asyncio.Task[None]"] = None
    #: When a hold of the session may next be lost (its deadline as last computed), and the
    #: ``GroupLeases.changes`` that computation saw: ``_check_locks`` scans again only then.
    check_due: float = 0.0
    checked_changes: int = -1


async def _drain(q: "asyncio.Queue[Optional[pb.SessionRequest]]") -> AsyncIterator[pb.SessionRequest]:
    while True:
        m = await q.get()
        if m is None:
            return
        yield m


# Characters a lock name may not hold, as the server's rule (lockd_core::limits::is_invisible)
# and docs/openapi.yaml's Name pattern have them: controls, then invisible and bidi-control ones.
_NOT_IN_NAMES = (
    (0x00, 0x1F), (0x7F, 0x9F), (0xAD, 0xAD), (0x34F, 0x34F), (0x600, 0x605), (0x61C, 0x61C),
    (0x6DD, 0x6DD), (0x70F, 0x70F), (0x890, 0x891), (0x8E2, 0x8E2), (0x115F, 0x1160),
    (0x17B4, 0x17B5), (0x180B, 0x180F), (0x200B, 0x200F), (0x2028, 0x202E), (0x2060, 0x206F),
    (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF9, 0xFFFB),
    (0x110BD, 0x110BD), (0x110CD, 0x110CD), (0x13430, 0x1343F), (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF),
)


def check_name(name: str) -> None:
    """The server's name rule, so a bad name fails before any call. Names are compared as
    bytes and never normalised: send NFC so that names which look alike are alike."""
    n = len(name.encode("utf-8", "surrogatepass"))
    if not 1 <= n <= MAX_NAME_BYTES:
        raise InvalidArgument(f"lock name must be 1..={MAX_NAME_BYTES} bytes of UTF-8 "
                              f"(got {n} bytes: {name[:40]!r})")
    for ch in name:
        c = ord(ch)
        if 0xD800 <= c <= 0xDFFF:
            raise InvalidArgument(f"lock name holds an unpaired surrogate U+{c:04X}: {name[:40]!r}")
        if any(lo <= c <= hi for lo, hi in _NOT_IN_NAMES):
            raise InvalidArgument(f"lock name holds U+{c:04X}, a control, invisible or "
                                  f"bidirectional-control character: {name[:40]!r}")


def check_owner(owner: str) -> None:
    n = len(owner.encode())
    if n > MAX_OWNER_BYTES:
        raise InvalidArgument(f"owner must be at most {MAX_OWNER_BYTES} bytes (got {n})")


def mode_and_limit(mode: Union[Mode, str], limit: Optional[int]) -> Tuple[Mode, int]:
    try:
        m = Mode(mode)
    except ValueError:
        raise InvalidArgument(f"mode must be one of exclusive, shared, semaphore (got {mode!r})") from None
    if m is Mode.SEMAPHORE:
        if limit is None or not 1 <= limit <= MAX_SEMAPHORE:
            raise InvalidArgument(f"limit must lie in 1..={MAX_SEMAPHORE} for a semaphore (got {limit})")
        return m, limit
    if limit is not None:
        raise InvalidArgument(f"limit is only for mode=semaphore (got limit={limit} with mode={m.value})")
    return m, 0


def _tls_credentials(opts: ClientOptions) -> grpc.ChannelCredentials:
    """TLS credentials from the option files, read once; a missing file is an error now, not
    at the first call."""
    def read(path: Optional[str], what: str) -> Optional[bytes]:
        if path is None:
            return None
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise InvalidArgument(f"{what} {path!r} cannot be read: {e}") from None
    return grpc.ssl_channel_credentials(
        root_certificates=read(opts.ca_file, "ca_file"),
        private_key=read(opts.key_file, "key_file"),
        certificate_chain=read(opts.cert_file, "cert_file"))


class Core:
    """The engine. Every method runs on one event loop (the one it was created on)."""

    def __init__(self, endpoints: List[str], opts: ClientOptions) -> None:
        eps = [e.strip() for e in endpoints if e.strip()]
        if not eps:
            raise InvalidArgument("endpoints must name at least one node's gRPC address (HOST:PORT)")
        for e in eps:
            target = e.split("://", 1)[-1]
            if ":" not in target:
                raise InvalidArgument(f"endpoint {e!r} must be HOST:PORT")
        self.endpoints = eps
        self.opts = opts
        self._targets = [e.split("://", 1)[-1] for e in eps]
        tls = opts.ca_file is not None or opts.cert_file is not None or any(
            e.startswith("https://") for e in eps)
        self._credentials = _tls_credentials(opts) if tls else None
        self._channels: List[Optional[grpc.aio.Channel]] = [None] * len(eps)
        self._stubs: List[Optional[LockStub]] = [None] * len(eps)
        self.metadata: Optional[Tuple[Tuple[str, str], ...]] = (
            (("authorization", f"Bearer {opts.token}"),) if opts.token else None)
        self._preferred = 0
        self._use_stream = opts.use_stream
        self._sess: Optional[_Sess] = None
        self._conn: Optional[_Conn] = None
        self._gen = 0
        self._rid = 0
        self._pending: Dict[int, _Pending] = {}
        #: Queued waits and the pushes that answer them (``_pushes.py``).
        self._pushes: Pushes[_Acq] = Pushes()
        self._unsure: List[str] = []
        #: Settles running (``_begin_settle``); acquires on the stream wait for them to end.
        self._settling = 0
        self._settled: Optional[asyncio.Event] = None
        self._open_lock: Optional[asyncio.Lock] = None
        self._wake: Optional[asyncio.Event] = None
        self._bg: Set["asyncio.Task[Any]"] = set()
        self._closed = False
        self._next_hold = 1
        #: Holds the application keeps (hold id -> hold), for lease-expired reports and for
        #: settling acquires whose answer a broken stream lost. A grant is registered before
        #: its acquire is answered, so that no give-back takes it for an orphan meanwhile.
        self.held: Dict[int, Hold] = {}
        self.lease_expired = 0
        # New leaders' notices: how many, and the last one's (group, ms left) as that leader said.
        self.lease_extended = 0
        self.lease_extension: Optional[Tuple[int, int]] = None
        self.lease: Optional[Lease] = None

    # ----- plumbing -------------------------------------------------------------------------

    def stub(self, i: int) -> LockStub:
        s = self._stubs[i]
        if s is None:
            options: List[Tuple[str, Any]] = [
                ("grpc.max_reconnect_backoff_ms", 1000),
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.enable_retries", 0),
            ]
            if self._credentials is None:
                ch = grpc.aio.insecure_channel(self._targets[i], options=options)
            else:
                if self.opts.tls_server_name:
                    options.append(("grpc.ssl_target_name_override", self.opts.tls_server_name))
                ch = grpc.aio.secure_channel(self._targets[i], self._credentials, options=options)
            self._channels[i] = ch
            s = self._stubs[i] = LockStub(ch)
        return s

    def rpc_error(self, e: grpc.RpcError, i: int) -> LockdError:
        """A failed call to endpoint ``i`` as a typed error, with a hint for the TLS mistakes
        this client's own settings make likely."""
        return errors.from_rpc_error(
            e, self.endpoints[i],
            tls_without_cert=self._credentials is not None and self.opts.cert_file is None)

    def preferred(self) -> int:
        return self._preferred % len(self.endpoints)

    def rotate(self, failed: int) -> None:
        """Moves on to the next endpoint after ``failed`` did not answer."""
        if self._preferred % len(self.endpoints) == failed:
            self._preferred = (failed + 1) % len(self.endpoints)

    def margin(self, ttl: float) -> float:
        return self.opts.margin if self.opts.margin is not None else ttl / 5

    def _next_rid(self) -> int:
        self._rid += 1
        return self._rid

    def _spawn(self, coro: Awaitable[Any]) -> None:
        t = asyncio.ensure_future(coro)
        self._bg.add(t)
        t.add_done_callback(self._bg.discard)

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def unary(self, pick: Callable[[LockStub], "grpc.aio.UnaryUnaryMultiCallable[Req, Resp]"],
                    req: Req, *, timeout: Optional[float] = None,
                    landed: Optional[List[bool]] = None, attempts: Optional[int] = None) -> Resp:
        """A unary call on the preferred node, retried with backoff on retryable errors (moving
        to the next node when one does not answer). Appends True to ``landed`` when an attempt
        failed in a way that may have reached the service."""
        policy = self.opts.retry
        max_attempts = attempts or policy.max_attempts
        attempt = 0
        t = timeout if timeout is not None else self.opts.request_timeout
        while True:
            if self._closed:
                raise ClientClosed("the client is closed")
            i = self.preferred()
            try:
                return await pick(self.stub(i))(req, timeout=t, metadata=self.metadata)
            except grpc.RpcError as e:
                err = self.rpc_error(e, i)
            if isinstance(err, Unavailable) and err.status is None:
                self.rotate(i)
                if landed is not None:
                    landed.append(True)
            if err.status == 503 and landed is not None:
                # "No leader" is refused before proposing, but "outcome unknown" is also 503.
                landed.append(True)
            attempt += 1
            if not err.retryable or attempt >= max_attempts:
                raise err
            await asyncio.sleep(policy.delay(attempt - 1, err.retry_after))

    # ----- the session ----------------------------------------------------------------------

    async def ensure_session(self) -> _Sess:
        """The live session, opened (with retries) if there is none."""
        if self._closed:
            raise ClientClosed("the client is closed")
        if self._sess is not None:
            return self._sess
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
            self._wake = asyncio.Event()
        async with self._open_lock:
            if self._sess is not None:
                return self._sess
            return await self._open()

    async def _open(self) -> _Sess:
        o = self.opts
        open_req = pb.OpenSessionRequest(client=o.client_name, ttl_ms=int(o.ttl * 1000),
                                         namespace=o.namespace)
        attempt = 0
        give_up = monotonic() + o.connect_timeout
        while True:
            if self._closed:
                raise ClientClosed("the client is closed")
            i = self.preferred()
            conn: Optional[_Conn] = None
            try:
                if self._use_stream:
                    rid = self._next_rid()
                    conn, ev, sent = await self._handshake(i, pb.SessionRequest(request_id=rid, open=open_req))
                    if ev.WhichOneof("kind") != "opened":
                        conn.close()
                        raise Unavailable(f"unexpected answer to open: {ev.WhichOneof('kind')}")
                    r = ev.opened
                else:
                    sent = monotonic()
                    r = await self.stub(i).OpenSession(open_req, timeout=o.request_timeout,
                                                       metadata=self.metadata)
                return self._opened(r, sent, conn)
            except grpc.RpcError as e:
                err = self.rpc_error(e, i)
            except LockdError as e:
                err = e
            if err.code == "unimplemented" and self._use_stream:
                log.warning("lockd: %s does not serve the Session stream; using unary calls",
                            self.endpoints[i])
                self._use_stream = False
                continue
            if isinstance(err, Unavailable):
                self.rotate(i)
            attempt += 1
            pause = o.retry.delay(attempt - 1, err.retry_after)
            if not err.retryable or attempt >= o.retry.max_attempts or monotonic() + pause >= give_up:
                err.exhausted = err.retryable
                raise err
            await asyncio.sleep(pause)

    def _opened(self, r: pb.OpenSessionResponse, sent: float, conn: Optional[_Conn]) -> _Sess:
        self._gen += 1
        ttl = r.ttl_ms / 1000.0
        every = max(r.keepalive_every_ms, 1) / 1000.0
        leases = GroupLeases(sent, ttl, self.margin(ttl))
        leases.homed(r.group, sent, monotonic())
        lease = Lease(self._gen, r.session_id, leases)
        s = _Sess(id=r.session_id, gen=self._gen, ttl=ttl, every=every, lease=lease,
                  next_keepalive=sent + every, reconnect_at=sent)
        self._sess = s
        self._conn = conn
        self.lease = lease
        s.ticker = asyncio.ensure_future(self._tick(s))
        return s

    async def _handshake(self, i: int, first: pb.SessionRequest) -> Tuple[_Conn, pb.SessionEvent, float]:
        """Opens a stream to endpoint ``i`` whose first message is ``first``; returns the stream,
        the first answer and when the request was sent."""
        q: "asyncio.Queue[Optional[pb.SessionRequest]]" = asyncio.Queue()
        q.put_nowait(first)
        sent = monotonic()
        call = self.stub(i).Session(_drain(q), metadata=self.metadata)
        conn = _Conn(call, q, i)

        async def first_answer() -> pb.SessionEvent:
            while True:
                ev = await call.read()
                if ev is grpc.aio.EOF:
                    raise Unavailable(f"{self.endpoints[i]} closed the session stream")
                assert isinstance(ev, pb.SessionEvent)
                if ev.request_id == first.request_id:
                    return ev

        ok = False
        try:
            ev = await asyncio.wait_for(first_answer(), self.opts.request_timeout)
            if ev.WhichOneof("kind") == "error":
                raise errors.from_event(ev.error)
            ok = True
        except asyncio.TimeoutError:
            raise Unavailable(f"{self.endpoints[i]} did not answer in {self.opts.request_timeout}s") from None
        except grpc.RpcError as e:
            raise self.rpc_error(e, i) from None
        finally:
            if not ok:
                conn.close()
        conn.reader = asyncio.ensure_future(self._read(conn))
        return conn, ev, sent

    async def _read(self, conn: _Conn) -> None:
        why = "the node ended the session stream"
        try:
            while True:
                ev = await conn.call.read()
                if ev is grpc.aio.EOF:
                    break
                if self._conn is not conn:
                    return
                self._event(ev)
        except asyncio.CancelledError:
            return
        except grpc.RpcError as e:
            why = f"session stream failed: {errors.from_rpc_error(e)}"
        except Exception as e:  # never let the reader die silently
            why = f"session stream reader failed: {e!r}"
        if self._conn is conn:
            self._disconnected(why)

    async def _tick(self, s: _Sess) -> None:
        """Keepalives, the local deadline and reconnects of session ``s``, until it ends. It
        never awaits the network itself: a reconnect (with the settling after it) or a unary
        keepalive runs in its own task (``_run_aside``), so the deadlines fire on time however
        long a handshake takes."""
        assert self._wake is not None
        while self._sess is s:
            now = monotonic()
            if s.lease.leases.session_expired(now):
                self._lose("every local lease deadline passed without a renewal", True)
                return
            self._check_locks(s, now)
            if s.busy is not None and not s.busy.done():
                wake = math.inf  # its end wakes this loop
            elif not self._use_stream:
                if now >= s.next_keepalive:
                    self._run_aside(s, self._unary_keepalive(s))
                    continue
                wake = s.next_keepalive
            elif self._conn is not None:
                if now >= s.next_keepalive:
                    self._keepalive()
                    continue
                wake = s.next_keepalive
            else:
                if now >= s.reconnect_at:
                    self._run_aside(s, self._reconnect(s))
                    continue
                wake = s.reconnect_at
            wake = min(wake, s.lease.deadline, s.check_due)  # at check_due a hold may be lost
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), max(wake - now, 0.0))
            except asyncio.TimeoutError:
                pass

    def _run_aside(self, s: _Sess, work: Coroutine[Any, Any, None]) -> None:
        """Runs ``work`` (a reconnect or a unary keepalive of ``s``) in its own task, as
        ``s.busy``; its end wakes the tick. Close cancels it with the other background tasks."""

        async def run() -> None:
            try:
                await work
            except asyncio.CancelledError:
                raise
            except Exception as e:  # never let it die silently, nor the tick spin on it
                log.warning("lockd: session upkeep failed: %r", e)
                later = monotonic() + self.opts.retry.delay(4)
                s.reconnect_at = max(s.reconnect_at, later)
                s.next_keepalive = max(s.next_keepalive, later)
            finally:
                self._poke()

        def done(t: "asyncio.Task[None]") -> None:
            self._bg.discard(t)
            work.close()  # a no-op once it ran; else (cancelled before it started) no warning

        t = asyncio.ensure_future(run())
        s.busy = t
        self._bg.add(t)
        t.add_done_callback(done)

    def _renewed(self, sent: float, r: pb.KeepAliveResponse, named: bool = False) -> None:
        """A renewal (keepalive or attach) sent at ``sent`` (``named``: naming its groups) was
        acknowledged with ``r``."""
        s = self._sess
        if s is None:
            return
        now = monotonic()
        leases = s.lease.leases
        outcome = leases.renewed(sent, r.ttl_ms, r.groups, now, named)
        if outcome == "too_late":
            # Too late: the locks may already have stopped. A lost session stays lost.
            self._lose("every local lease deadline passed without a renewal", True)
            return
        if outcome == "gone":
            self._lose("every lock group said the session has no lease there", True)
            return
        for gl in r.groups:
            if gl.state not in (EXTENDED, NOT_HERE):
                log.debug("lockd: lock group %d could not answer a keepalive: %s", gl.group,
                          getattr(gl, "error", "") or f"state {gl.state}")
        if outcome == "restarted":
            log.info("lockd: every lock group answered again after the session-wide deadline "
                     "had passed; the locks that followed it stay lost")
        self._check_locks(s, now)

    def _check_locks(self, s: _Sess, now: float) -> None:
        """Fires ``lost`` for the holds of ``s`` that are lost while the session goes on: their
        own deadline passed, or their group's lease ended (:class:`GroupLeases`)."""
        leases = s.lease.leases
        if now < s.check_due and leases.changes == s.checked_changes:
            return
        s.checked_changes = leases.changes
        # A change may have brought a hold's deadline, or the session's, nearer than the tick's
        # timer: wake it so that it sleeps to the new check_due (harmless from the tick itself).
        self._poke()
        lost: List[Hold] = []
        due = math.inf
        for h in self.held.values():
            if h.lease.session is not s.lease or h.lease.lost:
                continue
            d = h.lease.deadline
            if now >= d:
                lost.append(h)
            else:
                due = min(due, d)
        s.check_due = due
        if not lost:
            return
        for h in lost:
            why = s.lease.leases.why_lost(h.lease.hold)
            log.warning("lockd lock %r of %s lost: %s", h.name, self.opts.client_name, why)
            h.lease.end(why)
        self.lease_expired += len(lost)
        self._spawn(self._report_expired([h.name for h in lost]))

    async def _report_expired(self, names: List[str]) -> None:
        for name in names:
            try:
                await self.unary(lambda st: st.ReportLeaseExpired,
                                 pb.ReportLeaseExpiredRequest(name=name), attempts=2)
            except LockdError as e:
                log.debug("lockd: could not report an expired lease: %s", e)

    def _keepalive(self) -> None:
        s, c = self._sess, self._conn
        if s is None or c is None:
            return
        now = monotonic()
        s.next_keepalive = now + s.every
        # An adopted wait whose outcome no node pushes (it was queued in a group this node does
        # not host, and the node that relayed it is gone): the caller decides again.
        for a in self._pushes.give_up_adopters(lambda a: a.wait_until + ADOPTED_SLACK <= now):
            self._fail(a, Unavailable(f"the wait for {a.name!r} queued before the session stream "
                                      "broke was not answered on the new stream"))
        # The previous keepalive went unanswered for a whole interval: the node is stuck or gone.
        if any(p.kind == "keepalive" and now - p.sent >= s.every for p in self._pending.values()):
            self.rotate(c.endpoint)
            self._disconnected("a keepalive went unanswered for a whole interval")
            return
        groups = self._keepalive_groups(s)
        rid = self._next_rid()
        self._pending[rid] = _Pending("keepalive", sent=now, named=bool(groups))
        self._send(pb.SessionRequest(request_id=rid, keepalive=pb.KeepAliveRequest(
            session_id=s.id, groups=groups)))

    def _keepalive_groups(self, s: _Sess) -> List[int]:
        """The groups the next keepalive renews (empty: every group; ``_lease.py``): the home,
        the groups of this session's holds and queued waits, and those it used within one TTL."""
        holds = [h.lease.hold for h in self.held.values() if h.session_id == s.id]
        unsure = bool(self._unsure) or self._pushes.has_strays()
        return s.lease.leases.keepalive_groups(holds, self._pushes.wait_groups(), unsure,
                                               monotonic())

    async def _unary_keepalive(self, s: _Sess) -> None:
        i = self.preferred()
        sent = monotonic()
        budget = max(min(self.opts.request_timeout, s.lease.deadline - sent), 0.001)
        groups = self._keepalive_groups(s)
        try:
            r = await self.stub(i).KeepAlive(pb.KeepAliveRequest(session_id=s.id, groups=groups),
                                             timeout=budget, metadata=self.metadata)
        except grpc.RpcError as e:
            if self._sess is not s:  # the session ended meanwhile (this runs beside the tick)
                return
            err = self.rpc_error(e, i)
            if err.code == "session_not_found":
                self._lose("the service no longer knows the session", True)
                return
            if isinstance(err, Unavailable):
                self.rotate(i)
            s.keepalive_failures += 1
            s.next_keepalive = monotonic() + min(
                s.every, self.opts.retry.delay(min(s.keepalive_failures, 4), err.retry_after))
            return
        if self._sess is not s:
            return
        s.keepalive_failures = 0
        s.next_keepalive = sent + s.every
        self._renewed(sent, r, bool(groups))

    def _send(self, req: pb.SessionRequest) -> None:
        if self._conn is not None:
            self._conn.queue.put_nowait(req)

    async def _reconnect(self, s: _Sess) -> None:
        """Moves the session to the next node (``attach``), within the local deadline."""
        i = self.preferred()
        rid = self._next_rid()
        left = s.lease.deadline - monotonic()
        try:
            # An attach answered after the local deadline could not save the lease anyway.
            conn, ev, sent = await asyncio.wait_for(
                self._handshake(i, pb.SessionRequest(request_id=rid, attach=s.id)), max(left, 0.0))
        except asyncio.TimeoutError:
            if self._sess is s:
                self._lose("the local lease deadline passed while reconnecting", True)
            return
        except LockdError as e:
            if self._sess is not s:
                return
            if e.code == "session_not_found":
                self._lose("the service no longer knows the session", True)
                return
            log.debug("lockd: attach to %s failed: %s", self.endpoints[i], e)
            self._retry_reconnect(s, i)
            return
        if self._sess is not s:
            conn.close()
            return
        if ev.WhichOneof("kind") != "keepalive":
            conn.close()
            self._retry_reconnect(s, i)
            return
        log.debug("lockd: session stream moved to %s", self.endpoints[i])
        self._conn = conn
        s.reconnect_attempt = 0
        self._renewed(sent, ev.keepalive)
        s.next_keepalive = sent + s.every
        # In the background: settling may take up to the interval, and nothing of the tick
        # waits for it (acquires do: _begin_settle counts it at once).
        self._spawn(self._begin_settle(s))

    def _retry_reconnect(self, s: _Sess, failed: int) -> None:
        self.rotate(failed)
        s.reconnect_at = monotonic() + self.opts.retry.delay(min(s.reconnect_attempt, 4))
        s.reconnect_attempt += 1

    async def _settle_unsure(self, s: _Sess) -> None:
        """Acquires whose answer the broken stream lost may have been granted: a hold of ours
        that no lock object knows is given back, so the caller's retry starts clean
        (``_pushes.settle``). A name with an acquire or a wait still open is settled later."""
        unsure, self._unsure = self._unsure, []
        if not unsure:
            return

        async def give_back() -> None:
            detail = await self.unary(lambda st: st.GetSession,
                                      pb.GetSessionRequest(session_id=s.id), attempts=1)
            back, later = settle(
                unsure, [(h.name, h.fencing_token) for h in detail.held],
                lambda n, t: any(h.name == n and h.token == t for h in self.held.values()),
                lambda n: self._unanswered(n) or self._pushes.waiting(lambda a: a.name == n))
            if later and self._sess is s:
                self._unsure.extend(later)
                self._spawn(self._settle_later(s))
            for name, token in back:
                await self.release(s.id, name, token)

        try:
            await asyncio.wait_for(give_back(), s.every)
        except (asyncio.TimeoutError, LockdError) as e:
            log.debug("lockd: could not settle unanswered acquires: %s", e)

    async def _settle_later(self, s: _Sess) -> None:
        await asyncio.sleep(s.every)
        if self._sess is s:
            await self._begin_settle(s)

    def _begin_settle(self, s: _Sess) -> Awaitable[None]:
        """Starts settling (``_settle_unsure``) now: acquires on the stream wait until it ends,
        so that a retry is never sent while its first attempt's hold is still to be given
        back."""
        self._settling += 1
        if self._settled is None:
            self._settled = asyncio.Event()
        self._settled.clear()
        settled = self._settled

        async def run() -> None:
            try:
                await self._settle_unsure(s)
            finally:
                self._settling -= 1
                if self._settling == 0:
                    settled.set()
        return run()

    # ----- events ---------------------------------------------------------------------------

    def _event(self, ev: pb.SessionEvent) -> None:
        kind = ev.WhichOneof("kind")
        p = self._pending.pop(ev.request_id, None) if ev.request_id else None
        if p is not None and p.kind == "keepalive":
            if kind == "keepalive":
                if self._sess is not None:
                    self._sess.keepalive_failures = 0
                self._renewed(p.sent, ev.keepalive, p.named)
            elif kind == "error" and ev.error.status == 404:
                self._lose("the service no longer knows the session", True)
            elif kind == "error":
                # 503 (no group extended, some could not answer) or another refusal: the session
                # goes on while any of its deadlines holds; try again soon.
                self._keepalive_failed(errors.from_event(ev.error))
        elif p is not None and p.kind == "acquire" and p.acq is not None:
            a = p.acq
            if kind == "error" and ev.error.code == "already_waiting":
                # Refused by its own first attempt, whose answer a broken stream took: the wait
                # is queued for the session, and this retry adopts it (``_pushes.py``).
                # The wait it adopts was queued by the first attempt and may have been granted
                # before this retry was sent: its lease counts from the first send.
                first = self._pushes.stray_since(a.name, a.owner)
                if first is not None:
                    a.sent = min(a.sent, first)
                adopted, answer = self._pushes.refused_waiting(a.name, a.owner, a)
                if answer is not None:
                    self._outcome(answer.acq, answer.event)
                elif not adopted:
                    self._fail(a, errors.from_event(ev.error))
                self._unclaimed(a.name)
                return
            if kind == "error" and ev.error.code == "already_held" and self._first_attempt_held(a):
                # Its own first attempt landed as a hold no lock object knows: give that back,
                # and the caller's retry starts clean.
                self._unsure.append(a.name)
                if self._sess is not None:
                    self._spawn(self._begin_settle(self._sess))
                self._fail(a, Unavailable(f"the first attempt at {a.name!r} landed after its "
                                          "stream broke; that hold is given back before the retry"))
                return
            self._pushes.settled(a.name, a.owner)
            if kind == "acquired":
                r = ev.acquired
                if r.acquired:
                    if r.lease_started and self._sess is not None:
                        # The group adopted the session for this acquire: the lease there
                        # counts from its send.
                        self._sess.lease.leases.started(r.group, a.sent, r.lease_ttl_ms,
                                                        monotonic())
                    self._renewed_in(r.group, r.renewed if r.HasField("renewed") else None,
                                     a.sent)
                    self._answer(a, r.fencing_token, max(r.reentry, 1), r.group, r.group_moves,
                                 r.lease_ttl_ms)
                else:
                    self._fail(a, NotAcquired(
                        f"{a.name!r} is held" + (f" by {r.holder!r}" if r.holder else ""),
                        holder=r.holder or None, queue_position=r.queue_position,
                        lock_delay_until_ms=r.lock_delay_until_ms))
            elif kind == "queued":
                if ev.queued.lease_started and self._sess is not None:
                    # The wait's group adopted the session for it (its grant is pushed later).
                    self._sess.lease.leases.started(ev.queued.group, a.sent, 0, monotonic())
                q = ev.queued
                self._renewed_in(q.group, q.renewed if q.HasField("renewed") else None, a.sent)
                answer = self._pushes.queued((ev.queued.group, ev.queued.waiter), a)
                if answer is not None:
                    self._outcome(answer.acq, answer.event)
            elif kind == "error":
                self._fail(a, errors.from_event(ev.error))
            self._unclaimed(a.name)
        elif p is not None and p.kind == "release" and p.fut is not None:
            if not p.fut.done():
                if kind == "released":
                    p.fut.set_result(ev.released.remaining)
                elif kind == "error":
                    p.fut.set_exception(errors.from_event(ev.error))
        elif kind == "session_ended":
            se = ev.session_ended
            if se.group != 0 and se.reason == "expired":
                self._group_ended(se.group)
            else:
                self._lose(f"the service ended the session ({se.reason})", se.reason != "closed")
        elif kind in ("granted", "wait_ended"):
            self._pushed(self._pushes.pushed(ev, self._unanswered))
        elif kind == "lease_extended":
            le = ev.lease_extended
            self.lease_extended += 1
            self.lease_extension = (le.group, le.remaining_ms)
            log.info("lockd: a new leader of group %d extended the lease (%d ms left); the local "
                     "deadline keeps its own, shorter rule", le.group, le.remaining_ms)
        else:
            log.debug("lockd: unexpected session event %s", kind)

    def _renewed_in(self, group: int, renewed: Optional[pb.GroupLease], sent: float) -> None:
        """An acquire sent at ``sent`` was granted or queued in ``group`` and the group's leader
        renewed the session's lease there as it did (``renewed``, when the service says so):
        counted as that group's answer to a keepalive sent with the acquire."""
        if renewed is None or renewed.state != EXTENDED or self._sess is None:
            return
        self._sess.lease.leases.renewed_in(group, sent, renewed.ttl_ms, renewed.group_moves,
                                           monotonic())

    def _group_ended(self, group: int) -> None:
        """Lock group ``group`` let the session's lease there run out (a pushed ``SessionEnded``
        for that group): the locks it granted before the push are lost; the session and its
        stream go on in the other groups, and a later acquire there adopts the session again."""
        s = self._sess
        if s is None:
            return
        now = monotonic()
        log.warning("lockd: lock group %d ended the lease of the session of %s there; its locks "
                    "there are lost, the session goes on", group, self.opts.client_name)
        s.lease.leases.group_ended(group, now)
        self._check_locks(s, now)

    def _keepalive_failed(self, err: LockdError) -> None:
        s = self._sess
        if s is None:
            return
        log.debug("lockd: keepalive refused: %s", err)
        s.keepalive_failures += 1
        retry = monotonic() + min(
            s.every, self.opts.retry.delay(min(s.keepalive_failures, 4), err.retry_after))
        if retry < s.next_keepalive:
            s.next_keepalive = retry
            self._poke()

    def _first_attempt_held(self, a: _Acq) -> bool:
        """Whether ``already_held`` answering ``a`` is its own first attempt's hold: ``a`` is a
        stray (its outcome went with a broken stream) and no lock of this session holds it."""
        s = self._sess
        if s is None or any(h.name == a.name and h.lease.session is s.lease
                            for h in self.held.values()):
            return False
        return self._pushes.is_stray(a.name, a.owner)

    def _unanswered(self, name: str) -> bool:
        """Whether an acquire of ``name`` is still unanswered on the stream."""
        return any(p.acq is not None and p.acq.name == name for p in self._pending.values())

    def _pushed(self, p: "Pushed[_Acq]") -> None:
        if isinstance(p, Answer):
            self._outcome(p.acq, p.event)
        elif isinstance(p, Orphan):
            self._give_back(p.name, p.token)

    def _unclaimed(self, name: str) -> None:
        """Pushes of ``name`` kept for a reply that did not claim them: an adopter's, or
        orphans."""
        for p in self._pushes.unclaimed(name, self._unanswered):
            self._pushed(p)

    def _give_back(self, name: str, token: int) -> None:
        """A grant nobody waits for (its acquire gave up after the stream broke): give it back,
        unless a lock object holds it (a second push of a grant already answered)."""
        s = self._sess
        if s is None or any(h.name == name and h.token == token for h in self.held.values()):
            return
        log.debug("lockd: giving back a grant of %r nobody waits for", name)
        self._spawn(self._release_quietly(s.id, name, token))

    def _outcome(self, a: _Acq, ev: pb.SessionEvent) -> None:
        """A ``granted`` or ``wait_ended`` push answers the acquire ``a``."""
        kind = ev.WhichOneof("kind")
        if kind == "granted":
            g = ev.granted
            self._answer(a, g.fencing_token, 1, g.group, g.group_moves, g.lease_ttl_ms)
        elif ev.wait_ended.reason == "session_ended":
            self._fail(a, SessionLost("the session ended while waiting"))
        elif ev.wait_ended.reason == "moved":
            # The name's bucket moved to another group: retryable, so the acquire queues again.
            self._fail(a, Unavailable(f"the bucket of {a.name!r} moved to another group"))
        else:
            self._fail(a, NotAcquired(f"the wait for {a.name!r} ended without a grant"))

    def _answer(self, a: _Acq, token: int, reentry: int, group: int, group_moves: int,
                lease_ttl_ms: int) -> None:
        s = self._sess
        if s is None:
            self._fail(a, SessionLost("the session ended"))
            return
        if a.fut.done():
            # Nobody waits for this grant any more (the acquire was cancelled): give it back.
            self._spawn(self._release_quietly(s.id, a.name, token))
            return
        a.fut.set_result(self._hold(s, a.name, token, a.owner, a.mode, reentry, a.sent, group,
                                    group_moves, lease_ttl_ms))

    def _hold(self, s: _Sess, name: str, token: int, owner: str, mode: Mode, reentry: int,
              sent: float, group: int, group_moves: int, lease_ttl_ms: int) -> Hold:
        """A grant of session ``s``, tied to the lease of the group that made it."""
        # Other acquires still unanswered may have brought the session into the group.
        others = min((p.acq.sent for p in self._pending.values() if p.acq is not None),
                     default=None)
        lease = LockLease(s.lease, s.lease.leases.granted(sent, monotonic(), group, group_moves,
                                                         lease_ttl_ms, others))
        if lease.deadline < s.check_due or s.lease.leases.changes != s.checked_changes:
            # The engine's timer fires this lock's `lost` at its deadline; a grant at a higher
            # move count also makes the group's older holds follow deadline_all (a rescan).
            s.check_due = min(s.check_due, lease.deadline)
            self._poke()
        hold = Hold(name, token, s.id, lease, owner, mode, reentry)
        hold.id = self._next_hold
        self._next_hold += 1
        self.held[hold.id] = hold
        return hold

    @staticmethod
    def _fail(a: _Acq, e: LockdError) -> None:
        if not a.fut.done():
            a.fut.set_exception(e)

    def _disconnected(self, why: str) -> None:
        """The stream broke: fail what was in flight (its outcome is unknown), and reconnect."""
        c, self._conn = self._conn, None
        if c is None:
            return
        log.debug("lockd: session stream to %s lost: %s", self.endpoints[c.endpoint], why)
        c.close()
        self.rotate(c.endpoint)
        pending, self._pending = self._pending, {}
        for p in pending.values():
            if p.acq is not None:
                self._fail_unsure(p.acq)
            elif p.fut is not None and not p.fut.done():
                p.fut.set_exception(_Unsure())
        for a in self._pushes.broke():
            self._fail_unsure(a)
        if self._sess is not None:
            self._sess.reconnect_at = monotonic()
            self._sess.reconnect_attempt = 0
        self._poke()

    def _fail_unsure(self, a: _Acq) -> None:
        if self._sess is not None:
            self._sess.lease.leases.note_unsure(a.sent)
        self._unsure.append(a.name)
        self._pushes.stray(a.name, a.owner, a.sent)
        self._fail(a, Unavailable("the session stream broke before the acquire was answered"))

    def _end_locally(self, s: _Sess, why: str, err: Callable[[], LockdError]) -> None:
        c, self._conn = self._conn, None
        if c is not None:
            c.close()
        s.lease.end(why)
        pending, self._pending = self._pending, {}
        for p in pending.values():
            if p.acq is not None:
                self._fail(p.acq, err())
            elif p.fut is not None and not p.fut.done():
                p.fut.set_exception(_Unsure())  # the session is ending, which frees its holds
        for a in self._pushes.end():
            self._fail(a, err())
        self._poke()

    def _lose(self, why: str, report: bool) -> None:
        """The session is over for this client: every lock of it is lost."""
        s, self._sess = self._sess, None
        if s is None:
            return
        # Not the session id: it is the session's capability, and logs travel.
        log.warning("lockd session of %s lost: %s", self.opts.client_name, why)
        # Locks already reported lost on their own (their group's lease) are not counted again.
        held = [h.name for h in self.held.values()
                if h.lease.session is s.lease and not h.lease.lost] if report else []
        self._end_locally(s, why, lambda: SessionLost(f"the session ended: {why}"))
        self._unsure.clear()
        self.lease_expired += len(held)

        async def after() -> None:
            await self._report_expired(held)
            # The locks are lost; free them now rather than at the service's expiry.
            try:
                await self.unary(lambda st: st.CloseSession,
                                 pb.CloseSessionRequest(session_id=s.id), attempts=2)
            except LockdError:
                pass

        self._spawn(after())

    # ----- requests -------------------------------------------------------------------------

    async def acquire(self, name: str, *, wait: Optional[float], mode: Union[Mode, str] = Mode.EXCLUSIVE,
                      limit: Optional[int] = None, owner: Optional[str] = None,
                      reentrant: bool = False) -> Hold:
        """Takes ``name``, waiting in its FIFO queue up to ``wait`` seconds (``None`` or 0 = try
        once, ``math.inf`` = forever). Waits beyond the service's 300 s cap queue again, round
        after round, to the caller's deadline. Retryable errors are retried within the wait (or,
        for a try-lock, up to ``retry.max_attempts``); a session lost mid-wait is replaced."""
        check_name(name)
        m, lim = mode_and_limit(mode, limit)
        own = owner if owner is not None else self.opts.client_name
        check_owner(own)
        if wait is not None and (math.isnan(wait) or wait < 0):
            raise InvalidArgument(f"wait must be >= 0 seconds, or None for a try-lock (got {wait})")
        until = None if wait is None else monotonic() + wait
        policy = self.opts.retry
        attempt = 0
        while True:
            left = None if until is None else max(until - monotonic(), 0.0)
            capped = left is not None and left > MAX_WAIT
            wait_ms = 0 if left is None else int(min(left, MAX_WAIT) * 1000)
            req = pb.AcquireRequest(name=name, owner=own, mode=m.to_pb(), limit=lim,
                                    wait_ms=wait_ms, reentrant=reentrant)
            started = monotonic()
            try:
                return await self._acquire_once(req, m)
            except NotAcquired as e:
                if capped:
                    # One round of a longer wait ran out: queue again at the back (the service
                    # cannot hold a waiter longer than MAX_WAIT, so the FIFO place is not kept).
                    if monotonic() - started < 1.0:
                        await asyncio.sleep(policy.delay(2))  # never spin on a quick refusal
                    continue
                err: LockdError = e
            except LockdError as e:
                # A try-lock does not retry a session open that already retried for
                # connect_timeout; a wait goes on trying until it ends.
                if e.exhausted and until is None:
                    raise
                err = e
            attempt += 1
            retry = err.retryable or isinstance(err, SessionLost)
            time_left = until is not None and monotonic() < until
            if not retry or not (time_left or attempt < policy.max_attempts):
                raise err
            pause = policy.delay(attempt - 1, err.retry_after)
            if until is not None and time_left:
                pause = min(pause, until - monotonic())
            await asyncio.sleep(max(pause, 0.0))

    async def _acquire_once(self, req: pb.AcquireRequest, mode: Mode) -> Hold:
        s = await self.ensure_session()
        if not self._use_stream:
            req.session_id = s.id
            t = req.wait_ms / 1000.0 + self.opts.request_timeout
            sent = monotonic()
            r = await self.unary(lambda st: st.Acquire, req, timeout=t, attempts=1)
            if self._sess is not s:
                raise SessionLost("the session ended while acquiring")
            if not r.acquired:
                raise NotAcquired(f"{req.name!r} is held" + (f" by {r.holder!r}" if r.holder else ""),
                                  holder=r.holder or None, queue_position=r.queue_position,
                                  lock_delay_until_ms=r.lock_delay_until_ms)
            return self._hold(s, req.name, r.fencing_token, req.owner, mode, max(r.reentry, 1), sent,
                              r.group, r.group_moves, r.lease_ttl_ms)
        if self._settling and self._settled is not None:
            await self._settled.wait()
        if self._conn is None:
            raise Unavailable("the session stream is reconnecting")
        fut: "asyncio.Future[Hold]" = asyncio.get_running_loop().create_future()
        rid = self._next_rid()
        sent = monotonic()
        acq = _Acq(req.name, req.owner, mode, fut, sent, sent + req.wait_ms / 1000)
        self._pending[rid] = _Pending("acquire", sent=sent, acq=acq)
        self._send(pb.SessionRequest(request_id=rid, acquire=req))
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                # Granted as the caller was cancelled: nobody will hold it, so give it back.
                hold = fut.result()
                self.forget(hold)
                self._spawn(self._release_quietly(hold.session_id, hold.name, hold.token))
            raise

    async def _release_quietly(self, session_id: str, name: str, token: int) -> None:
        try:
            await self.release(session_id, name, token)
        except LockdError as e:
            log.debug("lockd: background release of %r failed: %s", name, e)

    async def release(self, session_id: str, name: str, token: int) -> int:
        """Gives back one hold; returns the re-entries still held (0 = released).

        On the session stream when it carries the hold's session, else (or when the stream's
        answer does not come in time) by unary calls. A release whose earlier attempt may have
        landed (broken stream, timeout, 503) counts a later ``not_holder``, ``stale_token`` or
        ``session_not_found`` as done: the hold is gone either way."""
        req = pb.ReleaseRequest(session_id=session_id, name=name, fencing_token=token)
        landed: List[bool] = []
        s = self._sess
        if self._use_stream and self._conn is not None and s is not None and s.id == session_id:
            fut: "asyncio.Future[int]" = asyncio.get_running_loop().create_future()
            rid = self._next_rid()
            self._pending[rid] = _Pending("release", fut=fut)
            self._send(pb.SessionRequest(request_id=rid, release=req))
            try:
                return await asyncio.wait_for(asyncio.shield(fut), self.opts.request_timeout)
            except asyncio.TimeoutError:
                self._pending.pop(rid, None)
                # The stream's node did not answer in time; the unary retry starts elsewhere.
                self.rotate(self.preferred())
                landed.append(True)
            except _Unsure:
                landed.append(True)
            except LockdError as e:
                if not e.retryable:
                    raise
                await asyncio.sleep(self.opts.retry.delay(0, e.retry_after))
                if e.status == 503:
                    landed.append(True)
        try:
            r = await self.unary(lambda st: st.Release, req, landed=landed)
            return r.remaining
        except LockdError as e:
            # The hold is gone and an earlier attempt may have ended it: only this session (or
            # an operator's release by token) can end a live hold, and an ended session frees
            # every hold it had.
            if landed and e.status in (404, 409) and e.code in (
                    "not_holder", "stale_token", "session_not_found"):
                return 0
            raise

    async def release_hold(self, hold: Hold) -> int:
        """:meth:`release` of ``hold``, retried at most until its lease's local deadline (at
        least one ``request_timeout``): past it the lock is lost anyway and the service frees it
        with the session, so a cluster that died does not hold the caller any longer."""
        budget = max(hold.lease.deadline - monotonic(), self.opts.request_timeout)
        try:
            return await asyncio.wait_for(self.release(hold.session_id, hold.name, hold.token),
                                          budget)
        except asyncio.TimeoutError:
            raise SessionLost(f"the release of {hold.name!r} was not answered before its lease "
                              "ended; the service frees it when the session expires") from None

    def forget(self, hold: Hold) -> None:
        self.held.pop(hold.id, None)

    async def inspect(self, name: str) -> pb.LockState:
        check_name(name)
        return await self.unary(lambda st: st.Inspect,
                                pb.InspectRequest(name=name))

    async def check_token(self, name: str, token: int) -> pb.CheckTokenResponse:
        check_name(name)
        return await self.unary(lambda st: st.CheckToken,
                                pb.CheckTokenRequest(name=name, fencing_token=token))

    async def report_fencing_rejected(self, name: str) -> None:
        check_name(name)
        try:
            await self.unary(lambda st: st.ReportFencingRejected,
                             pb.ReportFencingRejectedRequest(name=name), attempts=2)
        except LockdError as e:
            log.debug("lockd: could not report a fencing rejection: %s", e)

    async def status(self) -> pb.StatusResponse:
        return await self.unary(lambda st: st.Status, pb.StatusRequest())

    async def status_of(self, i: int) -> pb.StatusResponse:
        """The status of endpoint ``i`` exactly (no failover)."""
        return await self.stub(i).Status(pb.StatusRequest(), timeout=self.opts.request_timeout,
                                         metadata=self.metadata)

    async def get_session(self, session_id: str) -> pb.SessionDetail:
        return await self.unary(lambda st: st.GetSession, pb.GetSessionRequest(session_id=session_id))

    @property
    def session_id(self) -> Optional[str]:
        s = self._sess
        return s.id if s is not None and not s.lease.is_lost() else None

    @property
    def endpoint(self) -> str:
        """The endpoint the client currently prefers (the session stream's node)."""
        c = self._conn
        return self.endpoints[c.endpoint if c is not None else self.preferred()]

    async def close(self) -> None:
        """Closes the session (freeing every lock at once) and the channels."""
        if self._closed:
            return
        s, self._sess = self._sess, None
        err: Optional[LockdError] = None
        if s is not None:
            self._end_locally(s, "the client was closed", lambda: ClientClosed("the client is closed"))
            try:
                await self.unary(lambda st: st.CloseSession, pb.CloseSessionRequest(session_id=s.id),
                                 attempts=3)
            except LockdError as e:
                if e.code != "session_not_found":
                    err = e
            if s.ticker is not None:
                s.ticker.cancel()
        self._closed = True
        for t in list(self._bg):
            t.cancel()
        for ch in self._channels:
            if ch is not None:
                await ch.close()
        if err is not None:
            raise err
