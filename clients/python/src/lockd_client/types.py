"""Plain data the client returns: lock modes, lock state, node status, session views."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import List, Tuple

from ._proto import lockd_pb2 as pb

__all__ = ["Mode", "Holder", "Waiter", "LockState", "GroupStatus", "NodeStatus", "HeldLock",
           "SessionDetail", "Leader", "WatchEvent"]


class Mode(str, enum.Enum):
    """How a lock may be shared. Every user of a name must use the same mode (and limit)."""

    #: One holder.
    EXCLUSIVE = "exclusive"
    #: Any number of shared holders, never beside an exclusive one; a reader behind a waiting
    #: writer waits.
    SHARED = "shared"
    #: Up to ``limit`` holders (1..=10 000), each with its own token.
    SEMAPHORE = "semaphore"

    def to_pb(self) -> "pb.Mode":
        return {Mode.EXCLUSIVE: pb.MODE_EXCLUSIVE, Mode.SHARED: pb.MODE_SHARED,
                Mode.SEMAPHORE: pb.MODE_SEMAPHORE}[self]

    @staticmethod
    def from_pb(m: "pb.Mode") -> "Mode":
        return {pb.MODE_SHARED: Mode.SHARED, pb.MODE_SEMAPHORE: Mode.SEMAPHORE}.get(m, Mode.EXCLUSIVE)


@dataclass(frozen=True)
class Holder:
    """One holder of a lock. ``session_id`` is empty unless the client presents the admin token."""

    owner: str
    token: int
    mode: Mode
    held_for_ms: int
    reentry: int
    session_id: str


@dataclass(frozen=True)
class Waiter:
    """One waiter in a lock's FIFO queue (position 1 = head)."""

    owner: str
    mode: Mode
    position: int
    waited_ms: int
    session_id: str


@dataclass(frozen=True)
class LockState:
    """A linearizable view of one name."""

    name: str
    namespace: str
    holders: Tuple[Holder, ...]
    waiters: Tuple[Waiter, ...]
    lock_delay_until_ms: int

    @staticmethod
    def from_pb(s: pb.LockState) -> "LockState":
        return LockState(
            name=s.name, namespace=s.namespace,
            holders=tuple(Holder(h.owner, h.fencing_token, Mode.from_pb(h.mode), h.held_for_ms,
                                 h.reentry, h.session_id) for h in s.holders),
            waiters=tuple(Waiter(w.owner, Mode.from_pb(w.mode), w.position, w.waited_ms,
                                 w.session_id) for w in s.waiters),
            lock_delay_until_ms=s.lock_delay_until_ms)


@dataclass(frozen=True)
class GroupStatus:
    """One Raft group as a node sees it (group 0 is the meta group)."""

    id: int
    leader: int
    term: int
    members: Tuple[int, ...]
    applied_index: int
    revision: int


@dataclass(frozen=True)
class NodeStatus:
    """A node and the groups it hosts."""

    node_id: int
    pid: int
    groups: Tuple[GroupStatus, ...]

    @staticmethod
    def from_pb(s: pb.StatusResponse) -> "NodeStatus":
        return NodeStatus(s.node_id, s.pid, tuple(
            GroupStatus(g.id, g.leader, g.term, tuple(g.members), g.applied_index, g.revision)
            for g in s.groups))


@dataclass(frozen=True)
class HeldLock:
    """A lock a session holds, and the group it lives in."""

    name: str
    token: int
    group: int


@dataclass(frozen=True)
class SessionDetail:
    """One session's holds and waits in every group."""

    session_id: str
    client: str
    ttl_ms: int
    held: Tuple[HeldLock, ...]
    waits: Tuple[Tuple[str, int, int], ...]  # (name, queue position, group)
    # Lock groups that could not answer (no quorum): holds and waits there are not listed.
    unavailable_groups: Tuple[int, ...] = ()

    @staticmethod
    def from_pb(s: pb.SessionDetail) -> "SessionDetail":
        held: List[HeldLock] = [HeldLock(h.name, h.fencing_token, h.group) for h in s.held]
        return SessionDetail(s.session_id, s.client, s.ttl_ms, tuple(held),
                             tuple((w.name, w.queue_position, w.group) for w in s.waits),
                             tuple(s.unavailable_groups))


@dataclass(frozen=True)
class Leader:
    """Who leads an election: its campaign value (owner string) and its fencing token (a larger
    token is a later term). ``session_id`` is empty unless the client presents the admin token."""

    value: str
    token: int
    session_id: str


@dataclass(frozen=True)
class WatchEvent:
    """One change of a watched name, at log ``index`` of lock group ``group``, at group time
    ``time_ms`` (docs/API.md, *Watch*).

    ``kind``: ``hold_started``, ``hold_ended``, ``hold_moved_out``, ``hold_moved_in``,
    ``wait_started`` or ``wait_ended``. ``cause``: for ``hold_ended`` ``release``, ``close``,
    ``expire`` or ``dropped``; for ``wait_ended`` ``timed_out``, ``session_ended`` or ``moved``.
    ``session_id`` is empty unless the client presents the admin token. Fields that do not apply
    to a kind are 0 or empty. ``unix_ms`` is the sending node's wall clock when it applied the
    entry, for display; group times order events and measure spans."""

    group: int
    index: int
    time_ms: int
    kind: str
    name: str
    session_id: str
    owner: str
    token: int
    mode: Mode
    limit: int
    cause: str
    waiter: int
    position: int
    deadline_ms: int
    waited_ms: int
    held_ms: int
    lock_delay_until_ms: int
    lease_ttl_ms: int
    unix_ms: int = 0

    @staticmethod
    def from_pb(e: pb.WatchEvent) -> "WatchEvent":
        return WatchEvent(
            group=e.group, index=e.index, time_ms=e.time_ms, kind=e.kind, name=e.name,
            session_id=e.session_id, owner=e.owner, token=e.fencing_token,
            mode=Mode.from_pb(e.mode), limit=e.limit, cause=e.cause, waiter=e.waiter,
            position=e.position, deadline_ms=e.deadline_ms, waited_ms=e.waited_ms,
            held_ms=e.held_ms, lock_delay_until_ms=e.lock_delay_until_ms,
            lease_ttl_ms=e.lease_ttl_ms, unix_ms=e.unix_ms)
