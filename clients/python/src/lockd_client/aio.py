"""The asyncio API: :class:`AsyncClient`, :class:`AsyncLock`, :class:`AsyncElection`.

.. code-block:: python

    async with AsyncClient(["127.0.0.1:7170", "127.0.0.1:7171"]) as client:
        async with client.lock("payouts/m-1", wait=10) as lk:
            await pay(lk.token)            # every write carries the fencing token
            if lk.lost.is_set(): ...       # or: await lk.run(pay(lk.token))
"""
from __future__ import annotations

import asyncio
import math
import time
from types import TracebackType
from typing import (Any, Awaitable, Callable, Coroutine, Dict, Generator, Generic, Iterable, List, Optional,
                    Tuple, Type, TypeVar, Union)

from ._core import MAX_WAIT, Core, Hold
from ._lease import LockLease
from ._options import ClientOptions
from ._watch import LeaderStream, Stream, WatchStream
from .errors import LockdError, LockLost, NotAcquired, SessionLost
from .types import Leader, LockState, Mode, NodeStatus, SessionDetail, WatchEvent

__all__ = ["AsyncClient", "AsyncLock", "AsyncLockSet", "AsyncLostEvent", "AsyncElection",
           "AsyncLeadership", "AsyncWatch", "AsyncLeaders"]

T = TypeVar("T")


class AsyncLostEvent:
    """Set when the lock is lost: at the lock's local deadline (send time of the last keepalive
    its lease counts from + TTL - margin; see the README's lease rule) unless a renewal moved
    it, when its lock group's lease is known to have ended, or when the session ends.

    ``is_set()`` also compares the deadline with the clock, so it is right even before the
    engine's timer has run (e.g. just after the process was resumed from a pause)."""

    def __init__(self, lease: LockLease) -> None:
        self._lease = lease
        self._ev = asyncio.Event()
        lease.watch(self._ev.set)

    def is_set(self) -> bool:
        if not self._ev.is_set() and self._lease.is_lost():
            self._ev.set()
        return self._ev.is_set()

    def __bool__(self) -> bool:
        return self.is_set()

    async def wait(self) -> bool:
        """Returns (True) once the lock is lost."""
        while not self.is_set():
            left = self._lease.deadline - time.monotonic()
            try:
                await asyncio.wait_for(self._ev.wait(), max(left, 0.0))
            except asyncio.TimeoutError:
                pass
        return True

    def _detach(self) -> None:
        self._lease.unwatch(self._ev.set)


class AsyncLock:
    """A held lock. Attach :attr:`token` to every write made under it and stop working when
    :attr:`lost` is set. ``async with`` releases it; so does :meth:`release`."""

    def __init__(self, client: "AsyncClient", hold: Hold) -> None:
        self._client = client
        self._hold = hold
        self._released = False
        #: Set when the lock is lost (see :class:`AsyncLostEvent`).
        self.lost = AsyncLostEvent(hold.lease)

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

    def is_lost(self) -> bool:
        return self.lost.is_set()

    @property
    def released(self) -> bool:
        return self._released

    async def release(self) -> int:
        """Gives the lock back (one level of re-entry); returns the re-entries still held.
        A lost lock's release is refused (``session_not_found``, ``not_holder``, ``stale_token``)
        unless an earlier attempt of the same call may have landed."""
        if self._released:
            return 0
        self._released = True
        self._client._core.forget(self._hold)
        self.lost._detach()
        return await self._client._core.release_hold(self._hold)

    async def run(self, work: Awaitable[T]) -> T:
        """Runs ``work`` while the lock lasts: if the lock is lost first, ``work`` is cancelled
        and :class:`LockLost` raised."""
        task = asyncio.ensure_future(work)
        lost = asyncio.ensure_future(self.lost.wait())
        try:
            await asyncio.wait({task, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
        if not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            raise LockLost(f"the lock {self.name!r} was lost while the work ran: {self._hold.lease.why or 'deadline passed'}")
        return task.result()

    async def __aenter__(self) -> "AsyncLock":
        return self

    async def __aexit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException],
                        tb: Optional[TracebackType]) -> None:
        await _exit_release(self, self.release, et is not None)

    def __repr__(self) -> str:
        return f"AsyncLock(name={self.name!r}, token={self.token}, lost={self.is_lost()})"


async def _exit_release(lk: Union[AsyncLock, Any], release: Callable[[], Awaitable[int]],
                        failing: bool) -> None:
    """Releases at the end of a ``with`` block. If the block raised, a failed release never
    masks its error. Otherwise a lock that was lost before the block ended raises
    :class:`LockLost`: the work may have overlapped the next holder's."""
    was_lost = lk.is_lost()
    try:
        await release()
    except LockdError as e:
        if failing:
            return
        if e.code in ("session_not_found", "not_holder", "stale_token", "session_lost") or was_lost:
            raise LockLost(f"the lock {lk.name!r} was lost before the block ended ({e.code})") from e
        raise
    if was_lost and not failing:
        raise LockLost(f"the lock {lk.name!r} was lost before the block ended")


class _AcquireCtx:
    """What :meth:`AsyncClient.lock` returns: await it for an :class:`AsyncLock`, or use it as
    ``async with client.lock(...) as lk:``."""

    def __init__(self, coro: Callable[[], Coroutine[Any, Any, AsyncLock]]) -> None:
        self._coro = coro
        self._lock: Optional[AsyncLock] = None

    def __await__(self) -> Generator[Any, None, AsyncLock]:
        return self._coro().__await__()

    async def __aenter__(self) -> AsyncLock:
        self._lock = await self._coro()
        return self._lock

    async def __aexit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException],
                        tb: Optional[TracebackType]) -> None:
        if self._lock is not None:
            await self._lock.__aexit__(et, ev, tb)


class AsyncLockSet:
    """Locks taken together by :meth:`AsyncClient.acquire_all`, in sorted name order."""

    def __init__(self, locks: List[AsyncLock]) -> None:
        self.locks = locks

    @property
    def tokens(self) -> Dict[str, int]:
        return {lk.name: lk.token for lk in self.locks}

    def __getitem__(self, name: str) -> AsyncLock:
        for lk in self.locks:
            if lk.name == name:
                return lk
        raise KeyError(name)

    def is_lost(self) -> bool:
        return any(lk.is_lost() for lk in self.locks)

    async def release(self) -> None:
        """Releases every lock, last taken first; raises the first failure after trying all."""
        first: Optional[LockdError] = None
        for lk in reversed(self.locks):
            try:
                await lk.release()
            except LockdError as e:
                first = first or e
        if first is not None:
            raise first

    async def __aenter__(self) -> "AsyncLockSet":
        return self

    async def __aexit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException],
                        tb: Optional[TracebackType]) -> None:
        lost = self.is_lost()
        try:
            await self.release()
        except LockdError as e:
            if et is None:
                raise LockLost("a lock of the set was lost before the block ended") from e
            return
        if lost and et is None:
            raise LockLost("a lock of the set was lost before the block ended")


class AsyncClient:
    """A connection to a lockd cluster carrying **one session** for the process, kept alive over
    one gRPC ``Session`` stream. Create it inside the event loop that will use it.

    ``endpoints`` are some of the cluster's gRPC addresses (``HOST:PORT``); the client moves to
    the next one when a node stops answering. The session opens on first use (or with
    :meth:`connect`) and is closed by :meth:`close` / ``async with``.
    """

    def __init__(self, endpoints: Iterable[str], options: Optional[ClientOptions] = None,
                 **kwargs: Any) -> None:
        if options is not None and kwargs:
            raise TypeError("pass either options=ClientOptions(...) or keyword options, not both")
        opts = options or ClientOptions(**kwargs)
        self._core = Core(list(endpoints), opts)

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
        """How many times a lease ran out while the application still held a lock (each is also
        reported to the service's ``lockd_lease_expired_while_holding_total`` metric)."""
        return self._core.lease_expired

    async def connect(self) -> "AsyncClient":
        """Opens the session now (otherwise the first acquire does)."""
        await self._core.ensure_session()
        return self

    def lock(self, name: str, *, wait: Optional[float] = None,
             mode: Union[Mode, str] = Mode.EXCLUSIVE, limit: Optional[int] = None,
             owner: Optional[str] = None, reentrant: bool = False) -> _AcquireCtx:
        """Takes ``name``: ``await client.lock(...)`` or ``async with client.lock(...) as lk``.

        - ``wait``: seconds to wait in the lock's FIFO queue (``None`` or 0: try once;
          ``math.inf``: forever, in rounds of the service's 300 s cap).
        - ``mode``: ``"exclusive"`` (default), ``"shared"`` or ``"semaphore"`` with ``limit``.
        - ``owner``: who within the process holds it (default: the client name).
        - ``reentrant``: the same session and owner may take it again (same token) and must
          release as often.

        Raises :class:`NotAcquired` if the lock was not granted in time.
        """
        async def go() -> AsyncLock:
            hold = await self._core.acquire(name, wait=wait, mode=mode, limit=limit, owner=owner,
                                            reentrant=reentrant)
            return AsyncLock(self, hold)
        return _AcquireCtx(go)

    async def acquire(self, name: str, *, wait: Optional[float] = None,
                      mode: Union[Mode, str] = Mode.EXCLUSIVE, limit: Optional[int] = None,
                      owner: Optional[str] = None, reentrant: bool = False) -> AsyncLock:
        """Like :meth:`lock`, as a plain coroutine."""
        return await self.lock(name, wait=wait, mode=mode, limit=limit, owner=owner, reentrant=reentrant)

    async def acquire_all(self, names: Iterable[str], *, wait: Optional[float] = None,
                          mode: Union[Mode, str] = Mode.EXCLUSIVE, limit: Optional[int] = None,
                          owner: Optional[str] = None) -> AsyncLockSet:
        """Takes every name in sorted order (duplicates once) within **one** overall deadline of
        ``wait`` seconds (``None`` or 0: try each once). Processes that take overlapping sets
        this way cannot deadlock. On failure the names already taken are released and the
        error raised."""
        ordered = sorted(set(names))
        until = None if wait is None else time.monotonic() + wait
        locks: List[AsyncLock] = []
        try:
            for name in ordered:
                left = None if until is None else max(until - time.monotonic(), 0.0)
                locks.append(await self.acquire(name, wait=left, mode=mode, limit=limit, owner=owner))
        except BaseException:
            for lk in reversed(locks):
                try:
                    await lk.release()
                except LockdError:
                    pass
            raise
        return AsyncLockSet(locks)

    async def inspect(self, name: str) -> LockState:
        """A linearizable view of ``name``: holders, tokens, queue (no session needed)."""
        return LockState.from_pb(await self._core.inspect(name))

    async def check_token(self, name: str, token: int) -> Tuple[bool, int]:
        """Whether ``token`` is a current holder's fencing token of ``name`` (Chubby's
        CheckSequencer), as a linearizable read: ``(valid, newest)``, ``newest`` being the
        largest token among the current holders (0 when free). For a resource that asks lockd
        before it acts; one that can keep the largest token it has seen should fence instead."""
        r = await self._core.check_token(name, token)
        return r.valid, r.newest_token

    async def report_fencing_rejected(self, name: str) -> None:
        """Tells the service that a fenced resource refused a write under ``name`` because a
        newer holder's token had reached it; counted per namespace as
        ``lockd_fencing_rejections_total``. Best effort: a failure to report is logged."""
        await self._core.report_fencing_rejected(name)

    async def status(self) -> NodeStatus:
        """The status of the node the client talks to: its groups, leaders, terms."""
        return NodeStatus.from_pb(await self._core.status())

    async def get_session(self, session_id: Optional[str] = None) -> SessionDetail:
        """A session's holds and waits in every group (default: this client's session)."""
        sid = session_id or self._core.session_id
        if not sid:
            raise SessionLost("the client has no open session")
        return SessionDetail.from_pb(await self._core.get_session(sid))

    def election(self, name: str) -> "AsyncElection":
        """An election on ``name`` (e.g. ``"leaders/partition-9"``)."""
        return AsyncElection(self, name)

    def watch(self, name: str) -> "AsyncWatch":
        """Every change of ``name`` as it happens: ``async for ev in client.watch("jobs/a")``.
        Survives a node that stops and resumes where it was, with no change missed or
        repeated; needs no session."""
        return AsyncWatch(WatchStream(self._core, name=name))

    def watch_prefix(self, prefix: str) -> "AsyncWatch":
        """Every change of every name that starts with ``prefix``, as :meth:`watch`."""
        return AsyncWatch(WatchStream(self._core, prefix=prefix))

    async def close(self) -> None:
        """Closes the session: every lock it holds is released at once and reports lost."""
        await self._core.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException],
                        tb: Optional[TracebackType]) -> None:
        await self.close()


class AsyncLeadership:
    """Won leadership: lead while it lasts, stop at once when :attr:`lost` is set."""

    def __init__(self, lock: AsyncLock, value: str) -> None:
        self.lock = lock
        self.value = value

    @property
    def token(self) -> int:
        """The term's fencing token: fence every side effect with it."""
        return self.lock.token

    @property
    def lost(self) -> AsyncLostEvent:
        return self.lock.lost

    def is_lost(self) -> bool:
        return self.lock.is_lost()

    async def resign(self) -> None:
        """Steps down, letting the next candidate in line lead."""
        if self.lock.released:
            return
        try:
            await self.lock.release()
        except LockdError:
            if not self.lock.is_lost():
                raise


class AsyncElection:
    """Leader election on one lock name: the holder of the exclusive lock leads, its owner
    string is its campaign value and its fencing token numbers its term."""

    def __init__(self, client: AsyncClient, name: str) -> None:
        self.client = client
        self.name = name

    async def campaign(self, value: str, *, wait: float = math.inf) -> AsyncLeadership:
        """Waits in line (FIFO, woken by the pushed grant) until this process leads, up to
        ``wait`` seconds (default forever). Cancel the coroutine to leave the line."""
        lk = await self.client.acquire(self.name, wait=wait, owner=value)
        return AsyncLeadership(lk, value)

    async def leader(self) -> Optional[Leader]:
        """The current leader, or ``None`` (a linearizable read)."""
        st = await self.client.inspect(self.name)
        if not st.holders:
            return None
        h = st.holders[0]
        return Leader(h.owner, h.token, h.session_id)

    def leaders(self) -> "AsyncLeaders":
        """The leader now, then at every change (``None``: nobody leads), pushed by the
        service's watch: ``async for leader in election.leaders()``. No polling, and no change
        missed or repeated across a node that stops."""
        return AsyncLeaders(LeaderStream(self.client._core, self.name))

    async def run(self, value: str, work: Callable[[AsyncLeadership], Awaitable[None]], *,
                  terms: Optional[int] = None, requeue: bool = True) -> int:
        """Campaigns, runs ``work(leadership)`` while leading, and campaigns again: when the
        leadership is lost, ``work`` is cancelled and the candidate queues again; when ``work``
        returns, it resigns and (with ``requeue``) queues again. Stops after ``terms`` terms if
        given (or after one without ``requeue``); an exception from ``work`` resigns and
        propagates. Returns the number of terms led. Cancel it to stop."""
        led = 0
        while terms is None or led < terms:
            try:
                ship = await self.campaign(value)
            except (SessionLost, NotAcquired):
                continue  # a new session queues again
            led += 1
            task = asyncio.ensure_future(work(ship))
            lost = asyncio.ensure_future(ship.lost.wait())
            try:
                await asyncio.wait({task, lost}, return_when=asyncio.FIRST_COMPLETED)
            except BaseException:
                task.cancel()
                await ship.resign()
                raise
            finally:
                lost.cancel()
            if not task.done():
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                continue
            try:
                task.result()
            finally:
                await ship.resign()
            if not requeue:
                break
        return led


class _AsyncIter(Generic[T]):
    """What :class:`AsyncWatch` and :class:`AsyncLeaders` share: a stream read one item at a
    time with an optional timeout, ended by :meth:`close`."""

    def __init__(self, stream: Stream[T]) -> None:
        self._stream = stream

    async def next(self, timeout: Optional[float] = None) -> T:
        """The next item; ``TimeoutError`` after ``timeout`` seconds without one. Neither a
        timeout nor a cancelled wait loses one. One consumer at a time."""
        return await self._stream.next(timeout)

    def close(self) -> None:
        self._stream.cancel()

    def __aiter__(self) -> "_AsyncIter[T]":
        return self

    async def __anext__(self) -> T:
        if self._stream.closed:
            raise StopAsyncIteration
        return await self._stream.next()


class AsyncWatch(_AsyncIter[WatchEvent]):
    """An open watch (:meth:`AsyncClient.watch`): an async iterator of :class:`WatchEvent`.
    It opens at the first event asked for, or at :meth:`open`; :meth:`close` ends it."""

    _stream: WatchStream

    @property
    def positions(self) -> List[Tuple[int, int, int]]:
        """Where the watch is after the last event it delivered, per lock group:
        ``(group, index, events)``."""
        return self._stream.positions

    async def open(self) -> "AsyncWatch":
        """Opens the stream now: what changes from here on is delivered. Read the current state
        after this, never before, and no change falls between the read and the watch."""
        await self._stream.open()
        return self


class AsyncLeaders(_AsyncIter[Optional[Leader]]):
    """:meth:`AsyncElection.leaders`: an async iterator of the leader (``None``: nobody), the
    leader now first, then each change."""
