"""The blocking API: :class:`Client`, :class:`Lock`, :class:`Election`.

The client runs its engine (session stream, keepalives, the local deadline) on a private asyncio
loop in one daemon thread, so the caller's threads only block in the calls they make. It is
thread-safe: share one ``Client`` per process.

.. code-block:: python

    with Client(["127.0.0.1:7170", "127.0.0.1:7171"]) as client:
        with client.lock("payouts/m-1", wait=10) as lk:
            for batch in work:
                if lk.lost.is_set():
                    break                     # the lease may be gone: stop at once
                write(batch, fence=lk.token)  # every write carries the fencing token
"""
from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import math
import threading
import time
import weakref
from types import TracebackType
from typing import (Any, Callable, Coroutine, Dict, Generic, Iterable, List, Optional, Tuple,
                    Type, TypeVar, Union)

from ._core import Core, Hold
from ._lease import LockLease
from ._options import ClientOptions
from ._watch import LeaderStream, Stream, WatchStream
from .errors import ClientClosed, LockdError, LockLost, NotAcquired, SessionLost
from .types import Leader, LockState, Mode, NodeStatus, SessionDetail, WatchEvent

__all__ = ["Client", "Lock", "LockSet", "LostEvent", "Election", "Leadership", "Watch", "Leaders"]

T = TypeVar("T")


class LostEvent(threading.Event):
    """A :class:`threading.Event` set when the lock is lost: at the lock's local deadline (send
    time of the last keepalive its lease counts from + TTL - margin; see the README's lease
    rule) unless a renewal moved it, when its lock group's lease is known to have ended, or
    when the session ends. ``is_set()`` and ``wait()`` also compare the deadline with the
    clock, so they are right even before the client's thread has run (e.g. just after a resumed
    pause)."""

    def __init__(self, lease: LockLease) -> None:
        super().__init__()
        self._lease = lease
        lease.watch(self.set)

    def is_set(self) -> bool:
        if not super().is_set() and self._lease.is_lost():
            self.set()
        return super().is_set()

    isSet = is_set

    def __bool__(self) -> bool:
        return self.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the lock is lost or ``timeout`` seconds pass; returns :meth:`is_set`."""
        end = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            now = time.monotonic()
            step = self._lease.deadline - now
            if end is not None:
                if now >= end:
                    return False
                step = min(step, end - now)
            super().wait(max(step, 0.0))
        return True

    def _detach(self) -> None:
        self._lease.unwatch(self.set)


class Lock:
    """A held lock. Attach :attr:`token` to every write made under it and stop working when
    :attr:`lost` is set. ``with`` releases it at the block's end; so does :meth:`release`.

    At the end of a ``with`` block that raised nothing, a lock that was lost meanwhile raises
    :class:`LockLost` (the work may have overlapped the next holder's)."""

    def __init__(self, client: "Client", hold: Hold) -> None:
        self._client = client
        self._hold = hold
        self._released = False
        #: Set when the lock is lost (see :class:`LostEvent`).
        self.lost = LostEvent(hold.lease)

    @property
    def name(self) -> str:
        return self._hold.name

    @property
    def token(self) -> int:
        """The fencing token: unique to this grant and larger than every earlier grant's token
        for the name. Storage that checks it (``... WHERE fence <= token``) refuses a stale holder."""
        return self._hold.token

    @property
    def owner(self) -> str:
        return self._hold.owner

    @property
    def mode(self) -> Mode:
        return self._hold.mode

    @property
    def reentry(self) -> int:
        """The hold count after this grant (1 for a first grant, more for a re-entry)."""
        return self._hold.reentry

    @property
    def session_id(self) -> str:
        """The holding session's id: its capability; do not log it."""
        return self._hold.session_id

    @property
    def deadline(self) -> float:
        """The lock's local deadline on ``time.monotonic()``'s clock; moves forward with
        renewals (and back to the session-wide deadline once a bucket moved in or out of the
        lock's group)."""
        return self._hold.lease.deadline

    @property
    def group(self) -> int:
        """The lock group that granted the lock (whose lease the lock follows)."""
        return self._hold.lease.group

    @property
    def released(self) -> bool:
        return self._released

    def is_lost(self) -> bool:
        return self.lost.is_set()

    def release(self) -> int:
        """Gives the lock back (one level of re-entry); returns the re-entries still held.
        A lost lock's release is refused (``session_not_found``, ``not_holder``, ``stale_token``)
        unless an earlier attempt of the same call may have landed."""
        if self._released:
            return 0
        self._released = True
        self.lost._detach()
        core = self._client._core
        h = self._hold

        async def go() -> int:
            core.forget(h)
            return await core.release_hold(h)
        return self._client._run(go())

    def __enter__(self) -> "Lock":
        return self

    def __exit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        was_lost = self.is_lost()
        try:
            self.release()
        except LockdError as e:
            if et is not None:
                return
            if e.code in ("session_not_found", "not_holder", "stale_token", "session_lost") or was_lost:
                raise LockLost(f"the lock {self.name!r} was lost before the block ended ({e.code})") from e
            raise
        if was_lost and et is None:
            raise LockLost(f"the lock {self.name!r} was lost before the block ended")

    def __repr__(self) -> str:
        return f"Lock(name={self.name!r}, token={self.token}, lost={self.is_lost()})"


class LockSet:
    """Locks taken together by :meth:`Client.acquire_all`, in sorted name order."""

    def __init__(self, locks: List[Lock]) -> None:
        self.locks = locks

    @property
    def tokens(self) -> Dict[str, int]:
        return {lk.name: lk.token for lk in self.locks}

    def __getitem__(self, name: str) -> Lock:
        for lk in self.locks:
            if lk.name == name:
                return lk
        raise KeyError(name)

    def is_lost(self) -> bool:
        return any(lk.is_lost() for lk in self.locks)

    def release(self) -> None:
        """Releases every lock, last taken first; raises the first failure after trying all."""
        first: Optional[LockdError] = None
        for lk in reversed(self.locks):
            try:
                lk.release()
            except LockdError as e:
                first = first or e
        if first is not None:
            raise first

    def __enter__(self) -> "LockSet":
        return self

    def __exit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        lost = self.is_lost()
        try:
            self.release()
        except LockdError as e:
            if et is None:
                raise LockLost("a lock of the set was lost before the block ended") from e
            return
        if lost and et is None:
            raise LockLost("a lock of the set was lost before the block ended")


def _close_at_exit(ref: "weakref.ReferenceType[Client]") -> None:
    c = ref()
    if c is not None:
        try:
            c.close(timeout=2.0)
        except Exception:
            pass


class Client:
    """A connection to a lockd cluster carrying **one session** for the process, kept alive in
    the background over one gRPC ``Session`` stream.

    ``endpoints`` are some of the cluster's gRPC addresses (``HOST:PORT``); the client moves to
    the next one when a node stops answering. Options come as ``options=ClientOptions(...)`` or
    as keywords (``ttl=10, token="..."``). The session opens on first use (or with
    :meth:`connect`); :meth:`close` (or ``with``, or interpreter exit) closes it.
    """

    def __init__(self, endpoints: Iterable[str], options: Optional[ClientOptions] = None,
                 **kwargs: Any) -> None:
        if options is not None and kwargs:
            raise TypeError("pass either options=ClientOptions(...) or keyword options, not both")
        opts = options or ClientOptions(**kwargs)
        eps = list(endpoints)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="lockd-client", daemon=True)
        self._thread.start()
        self._closed = False

        async def make() -> Core:
            return Core(eps, opts)
        try:
            self._core: Core = self._run(make())
        except BaseException:
            self._stop_loop()
            raise
        atexit.register(_close_at_exit, weakref.ref(self))

    def _run(self, coro: Coroutine[Any, Any, T], timeout: Optional[float] = None) -> T:
        if self._closed:
            coro.close()
            raise ClientClosed("the client is closed")
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise
        except BaseException:
            # KeyboardInterrupt in the caller: stop the engine's side of the call too.
            fut.cancel()
            raise

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()

    @property
    def options(self) -> ClientOptions:
        return self._core.opts

    @property
    def session_id(self) -> Optional[str]:
        """The current session's id, if one is open and not lost."""
        return self._core.session_id

    @property
    def endpoint(self) -> str:
        """The endpoint the session stream uses now (or the next one tried)."""
        return self._core.endpoint

    @property
    def lease_extended_count(self) -> int:
        """How many times a group's new leader extended this client's lease and said so."""
        return self._core.lease_extended

    @property
    def lease_extension(self) -> Optional[Tuple[int, int]]:
        """The last new leader's notice: (group, milliseconds the lease had left), or None."""
        return self._core.lease_extension

    @property
    def lease_expired_count(self) -> int:
        """How many times a lease ran out while the application still held a lock."""
        return self._core.lease_expired

    def connect(self) -> "Client":
        """Opens the session now (otherwise the first acquire does)."""
        async def go() -> None:
            await self._core.ensure_session()
        self._run(go())
        return self

    def lock(self, name: str, *, wait: Optional[float] = None,
             mode: Union[Mode, str] = Mode.EXCLUSIVE, limit: Optional[int] = None,
             owner: Optional[str] = None, reentrant: bool = False) -> Lock:
        """Takes ``name`` and returns the held :class:`Lock` (use it in ``with``).

        - ``wait``: seconds to wait in the lock's FIFO queue (``None`` or 0: try once;
          ``math.inf``: forever, in rounds of the service's 300 s cap).
        - ``mode``: ``"exclusive"`` (default), ``"shared"`` or ``"semaphore"`` with ``limit``.
        - ``owner``: who within the process holds it (default: the client name).
        - ``reentrant``: the same session and owner may take it again (same token) and must
          release as often.

        Raises :class:`NotAcquired` if the lock was not granted in time.
        """
        async def go() -> Hold:
            return await self._core.acquire(name, wait=wait, mode=mode, limit=limit, owner=owner,
                                            reentrant=reentrant)
        return Lock(self, self._run(go()))

    acquire = lock

    def acquire_all(self, names: Iterable[str], *, wait: Optional[float] = None,
                    mode: Union[Mode, str] = Mode.EXCLUSIVE, limit: Optional[int] = None,
                    owner: Optional[str] = None) -> LockSet:
        """Takes every name in sorted order (duplicates once) within **one** overall deadline of
        ``wait`` seconds (``None`` or 0: try each once). Processes that take overlapping sets
        this way cannot deadlock. On failure the names already taken are released and the
        error raised."""
        ordered = sorted(set(names))
        until = None if wait is None else time.monotonic() + wait
        locks: List[Lock] = []
        try:
            for name in ordered:
                left = None if until is None else max(until - time.monotonic(), 0.0)
                locks.append(self.lock(name, wait=left, mode=mode, limit=limit, owner=owner))
        except BaseException:
            for lk in reversed(locks):
                try:
                    lk.release()
                except LockdError:
                    pass
            raise
        return LockSet(locks)

    def inspect(self, name: str) -> LockState:
        """A linearizable view of ``name``: holders, tokens, queue (no session needed)."""
        return LockState.from_pb(self._run(self._core.inspect(name)))

    def check_token(self, name: str, token: int) -> Tuple[bool, int]:
        """Whether ``token`` is a current holder's fencing token of ``name`` (Chubby's
        CheckSequencer), as a linearizable read: ``(valid, newest)``, ``newest`` being the
        largest token among the current holders (0 when free)."""
        r = self._run(self._core.check_token(name, token))
        return r.valid, r.newest_token

    def report_fencing_rejected(self, name: str) -> None:
        """Tells the service that a fenced resource refused a write under ``name`` because a
        newer holder's token had reached it; counted per namespace as
        ``lockd_fencing_rejections_total``. Best effort: a failure to report is logged.
        :func:`lockd_client.fencing.write` does it for its own refusals when given the client."""
        self._run(self._core.report_fencing_rejected(name))

    def status(self) -> NodeStatus:
        """The status of the node the client talks to: its groups, leaders, terms."""
        return NodeStatus.from_pb(self._run(self._core.status()))

    def get_session(self, session_id: Optional[str] = None) -> SessionDetail:
        """A session's holds and waits in every group (default: this client's session)."""
        sid = session_id or self._core.session_id
        if not sid:
            raise SessionLost("the client has no open session")
        return SessionDetail.from_pb(self._run(self._core.get_session(sid)))

    def watch(self, name: str) -> "Watch":
        """Every change of ``name`` as it happens: ``for ev in client.watch("jobs/a")`` (each
        ``next`` blocks until the next change; :meth:`Watch.next` takes a timeout). Survives a
        node that stops and resumes where it was, with no change missed or repeated; needs no
        session."""
        return Watch(self, self._run(_make_watch(self._core, name, "")))

    def watch_prefix(self, prefix: str) -> "Watch":
        """Every change of every name that starts with ``prefix``, as :meth:`watch`."""
        return Watch(self, self._run(_make_watch(self._core, "", prefix)))

    def election(self, name: str) -> "Election":
        """An election on ``name`` (e.g. ``"leaders/partition-9"``)."""
        return Election(self, name)

    def close(self, timeout: Optional[float] = 10.0) -> None:
        """Closes the session (every lock it holds is released at once and reports lost), then
        the connections and the client's thread. Idempotent."""
        if self._closed:
            return
        try:
            self._run(self._core.close(), timeout)
        finally:
            self._closed = True
            self._stop_loop()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()


class Leadership:
    """Won leadership: lead while it lasts, stop at once when :attr:`lost` is set."""

    def __init__(self, lock: Lock, value: str) -> None:
        self.lock = lock
        self.value = value

    @property
    def token(self) -> int:
        """The term's fencing token: fence every side effect with it."""
        return self.lock.token

    @property
    def lost(self) -> LostEvent:
        return self.lock.lost

    def is_lost(self) -> bool:
        return self.lock.is_lost()

    def resign(self) -> None:
        """Steps down, letting the next candidate in line lead."""
        if self.lock.released:
            return
        try:
            self.lock.release()
        except LockdError:
            if not self.lock.is_lost():
                raise


class Election:
    """Leader election on one lock name: the holder of the exclusive lock leads, its owner
    string is its campaign value and its fencing token numbers its term."""

    def __init__(self, client: Client, name: str) -> None:
        self.client = client
        self.name = name

    def campaign(self, value: str, *, wait: float = math.inf,
                 stop: Optional[threading.Event] = None) -> Leadership:
        """Waits in line (FIFO, woken by the pushed grant) until this process leads, up to
        ``wait`` seconds (default forever), or until ``stop`` is set (then :class:`NotAcquired`)."""
        c = self.client

        async def go() -> Hold:
            return await c._core.acquire(self.name, wait=wait, owner=value)
        if c._closed:
            raise ClientClosed("the client is closed")
        fut = asyncio.run_coroutine_threadsafe(go(), c._loop)
        try:
            while True:
                try:
                    return Leadership(Lock(c, fut.result(timeout=0.1 if stop else None)), value)
                except concurrent.futures.TimeoutError:
                    if stop is not None and stop.is_set():
                        fut.cancel()
                        raise NotAcquired(f"the campaign for {self.name!r} was stopped") from None
        except BaseException:
            fut.cancel()
            raise

    def leader(self) -> Optional[Leader]:
        """The current leader, or ``None`` (a linearizable read)."""
        st = self.client.inspect(self.name)
        if not st.holders:
            return None
        h = st.holders[0]
        return Leader(h.owner, h.token, h.session_id)

    def leaders(self) -> "Leaders":
        """The leader now, then at every change (``None``: nobody leads), pushed by the
        service's watch: ``for leader in election.leaders()`` (each ``next`` blocks until the
        next change; :meth:`Leaders.next` takes a timeout). No polling, and no change missed or
        repeated across a node that stops."""
        c = self.client

        async def make() -> LeaderStream:
            return LeaderStream(c._core, self.name)
        return Leaders(c, c._run(make()))

    def run(self, value: str, work: Callable[[Leadership], None], *,
            stop: Optional[threading.Event] = None, terms: Optional[int] = None,
            requeue: bool = True) -> int:
        """Campaigns, calls ``work(leadership)`` while leading, and campaigns again.

        ``work`` runs in the calling thread and must return soon after ``leadership.lost`` (or
        ``stop``) is set: a thread cannot be interrupted safely. When it returns the candidate
        resigns (if still leading) and, with ``requeue``, queues again. Stops when ``stop`` is
        set, after ``terms`` terms if given, or after one term without ``requeue``; an exception
        from ``work`` resigns and propagates. Returns the number of terms led."""
        led = 0
        while (terms is None or led < terms) and not (stop is not None and stop.is_set()):
            try:
                ship = self.campaign(value, stop=stop)
            except NotAcquired:
                if stop is not None and stop.is_set():
                    break
                continue
            except SessionLost:
                continue
            led += 1
            try:
                work(ship)
            finally:
                ship.resign()
            if not requeue:
                break
        return led


async def _cancel(stream: Stream[Any]) -> None:
    stream.cancel()


async def _make_watch(core: Core, name: str, prefix: str) -> WatchStream:
    return WatchStream(core, name=name, prefix=prefix)


class _Iter(Generic[T]):
    """What :class:`Watch` and :class:`Leaders` share: a stream on the client's loop, read one
    item at a time with an optional timeout, ended by :meth:`close` (or ``with``)."""

    def __init__(self, client: Client, stream: Stream[T]) -> None:
        self._client = client
        self._stream = stream

    def next(self, timeout: Optional[float] = None) -> T:
        """The next item; ``TimeoutError`` after ``timeout`` seconds without one (the stream
        stays open and loses nothing). One consumer at a time."""
        return self._client._run(self._stream.next(timeout))

    def close(self) -> None:
        if not self._client._closed:
            self._client._run(_cancel(self._stream))

    def __iter__(self) -> "_Iter[T]":
        return self

    def __next__(self) -> T:
        if self._stream.closed:
            raise StopIteration
        return self.next()

    def __enter__(self) -> "_Iter[T]":
        return self

    def __exit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()


class Watch(_Iter[WatchEvent]):
    """An open watch (:meth:`Client.watch`): an iterator of :class:`WatchEvent`. It opens at the
    first event asked for, or at :meth:`open`; :meth:`close` (or ``with``) ends it."""

    _stream: WatchStream

    @property
    def positions(self) -> List[Tuple[int, int, int]]:
        """Where the watch is after the last event it delivered, per lock group:
        ``(group, index, events)``."""
        return self._stream.positions

    def open(self) -> "Watch":
        """Opens the stream now: what changes from here on is delivered. Read the current state
        after this, never before, and no change falls between the read and the watch."""
        self._client._run(self._stream.open())
        return self

    def __enter__(self) -> "Watch":
        return self


class Leaders(_Iter[Optional[Leader]]):
    """:meth:`Election.leaders`: an iterator of the leader (``None``: nobody leads), the leader
    now first, then each change."""
