"""The changes of a name or a prefix as they happen (``Watch``), and an election's leaders.

A watch survives a node that stops answering and a cut-off for falling behind: it reconnects
(to the next node if need be) and resumes after the last event it delivered, so no event is
missed or repeated. It ends with an error the caller must act on: ``watch_compacted`` (re-read
the names, then watch again), a credential refused, or a bad request.

The semantics follow lockd-client (Rust), crates/lockd-client/src/watch.rs and election.rs.
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Coroutine, List, Optional, Protocol, Tuple, TypeVar

import grpc
import grpc.aio

from ._proto import lockd_pb2 as pb
from .errors import ClientClosed, InvalidArgument, LockdError, Unavailable
from .types import Leader, WatchEvent

if TYPE_CHECKING:
    from ._core import Core

#: Reconnects in a row that found no node before the error goes to the caller.
MAX_FAILURES = 20

T_co = TypeVar("T_co", covariant=True)


class Stream(Protocol[T_co]):
    """A stream of items on the engine's loop, as the sync and asyncio wrappers read it:
    :class:`WatchStream` (events) and :class:`LeaderStream` (leaders)."""

    @property
    def closed(self) -> bool: ...

    def next(self, timeout: Optional[float] = None) -> Coroutine[Any, Any, T_co]: ...

    def cancel(self) -> None: ...


#: Where a watch is, per lock group: ``(group, index, events)``.
Positions = Tuple[Tuple[int, int, int], ...]


def _resumable(e: LockdError) -> bool:
    """Whether a watch ended by ``e`` picks up where it was by itself."""
    return isinstance(e, Unavailable) or e.code in ("watch_too_slow", "unavailable", "no_leader")


class WatchStream:
    """One watch on the engine's loop. ``next()`` gives the next change. One consumer at a
    time: two callers of ``next`` at once would share the read in progress."""

    def __init__(self, core: "Core", name: str = "", prefix: str = "") -> None:
        if bool(name) == bool(prefix):
            raise InvalidArgument("watch exactly one of a name or a prefix")
        self._core = core
        self._req = pb.WatchRequest(name=name, prefix=prefix)
        self._call: Optional[Any] = None
        self._index = 0
        self._failures = 0
        self._compacted = 0
        self.closed = False
        #: The read in progress, with the positions after its event: a caller that stops
        #: waiting (a timeout, a cancel) leaves it running, and the next call takes its event,
        #: so none is lost.
        self._pending: Optional["asyncio.Future[Tuple[WatchEvent, Positions]]"] = None
        #: Where the watch is after the last event delivered to the caller.
        self._delivered: Positions = ()

    @property
    def positions(self) -> List[Tuple[int, int, int]]:
        """Where the watch is after the last event it delivered, per lock group:
        ``(group, index, events)``."""
        return list(self._delivered)

    async def _connect(self) -> None:
        core = self._core
        if core._closed:
            raise ClientClosed("the client is closed")
        self._index = core.preferred()
        call = core.stub(self._index).Watch(self._req, metadata=core.metadata)
        # The service answers with headers at once: a refusal (a bad request, a credential)
        # shows here, before any event; a node that never answers is given up on.
        wait = core.opts.request_timeout
        try:
            await asyncio.wait_for(call.initial_metadata(), wait)
        except asyncio.TimeoutError:
            call.cancel()
            raise Unavailable(f"{core.endpoints[self._index]}: the watch did not open in "
                              f"{wait} s") from None
        except grpc.RpcError as e:
            raise core.rpc_error(e, self._index) from None
        self._call = call

    async def open(self) -> None:
        """Opens the stream now (it opens lazily, at the first ``next``): what changes from here
        on is delivered. Read the current state after this, never before, and no change falls
        between the read and the watch."""
        while self._call is None:
            if self.closed:
                raise ClientClosed("the watch is closed")
            try:
                await self._connect()
            except LockdError as e:
                await self._backoff(e)

    async def next(self, timeout: Optional[float] = None) -> WatchEvent:
        """The next change; ``TimeoutError`` after ``timeout`` seconds without one. Neither a
        timeout nor a cancelled wait loses an event: the next call gets it."""
        if self.closed:
            raise ClientClosed("the watch is closed")
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._read())
        pending = self._pending
        # Waiting never cancels the read; taking its result below has no await before it, so
        # an event is either delivered here or left for the next call.
        done, _ = await asyncio.wait({pending}, timeout=timeout)
        if self.closed:
            raise ClientClosed("the watch is closed")
        if not done:
            raise TimeoutError(f"no change in {timeout} s")
        self._pending = None
        ev, self._delivered = pending.result()
        return ev

    async def _read(self) -> Tuple[WatchEvent, Positions]:
        while True:
            await self.open()
            assert self._call is not None
            try:
                ev = await self._call.read()
            except grpc.RpcError as e:
                self._call = None
                err = self._core.rpc_error(e, self._index)
                if err.code == "watch_compacted" or not _resumable(err):
                    await self._backoff(err)  # raises, or moves on to the next node
                else:
                    # A stream that broke after it opened resumes on the next node at once
                    # (only opens that fail count and back off, as lockd-client's watch does).
                    self._core.rotate(self._index)
                continue
            if ev is grpc.aio.EOF:
                # The node is stopping: resume on the next one.
                self._call = None
                self._core.rotate(self._index)
                continue
            self._failures = 0
            self._compacted = 0
            del self._req.after[:]
            self._req.after.extend(ev.resume)
            return WatchEvent.from_pb(ev), tuple((p.group, p.index, p.events) for p in ev.resume)

    async def _backoff(self, e: LockdError) -> None:
        """After a failed open (or a stream ended by ``e``): try another node, back off and
        retry, or raise to the caller."""
        core = self._core
        if e.code == "watch_compacted" and self._compacted + 1 < len(core.endpoints):
            # This node no longer keeps the position (a restarted node whose snapshot covers
            # it): another may still.
            self._compacted += 1
            core.rotate(self._index)
            return
        if not _resumable(e) or self._failures >= MAX_FAILURES:
            raise e
        self._failures += 1
        core.rotate(self._index)
        await asyncio.sleep(core.opts.retry.delay(self._failures - 1, e.retry_after))

    def cancel(self) -> None:
        """Ends the stream; ``next`` then raises ``ClientClosed``."""
        self.closed = True
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        if self._call is not None:
            self._call.cancel()
            self._call = None


class LeaderStream:
    """An election's leader now, then at every change (``None``: nobody leads)."""

    def __init__(self, core: "Core", name: str) -> None:
        self._core = core
        self._name = name
        self._watch = WatchStream(core, name=name)
        self._current: Optional[Leader] = None
        self._started = False

    @property
    def closed(self) -> bool:
        return self._watch.closed

    async def next(self, timeout: Optional[float] = None) -> Optional[Leader]:
        """The leader now (the first call), then the next change; ``TimeoutError`` after
        ``timeout`` seconds without one (nothing is lost)."""
        if not self._started:
            # Watch first, then read: a change in between shows in the watch, and the token
            # comparison below drops what the read already saw.
            try:
                st = await asyncio.wait_for(self._first(), timeout)
            except asyncio.TimeoutError:
                raise TimeoutError(f"no answer in {timeout} s") from None
            self._current = (Leader(st.holders[0].owner, st.holders[0].fencing_token,
                                    st.holders[0].session_id) if st.holders else None)
            self._started = True
            return self._current
        end = None if timeout is None else asyncio.get_running_loop().time() + timeout
        while True:
            left = None if end is None else max(0.0, end - asyncio.get_running_loop().time())
            e = await self._watch.next(left)
            now = None if self._current is None else self._current.token
            if e.kind == "hold_started" and (now is None or e.token > now):
                self._current = Leader(e.owner, e.token, e.session_id)
                return self._current
            if e.kind == "hold_ended" and now == e.token:
                self._current = None
                return None

    async def _first(self) -> pb.LockState:
        await self._watch.open()
        return await self._core.inspect(self._name)

    def cancel(self) -> None:
        self._watch.cancel()
