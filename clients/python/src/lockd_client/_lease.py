"""The client's side of a session's leases: when it must stop believing it holds its locks.

Each lock group keeps its own lease for a session (docs/API.md, "Leases per group"). A keepalive
reply says what each group answered; every grant says which group made it and the group's move
count then. :class:`GroupLeases` is the rule, pure (time is an input) so that it is tested
without a service; :class:`Lease` (a session) and :class:`LockLease` (one hold) are what the
lock objects watch. The rule is lockd-client's (crates/lockd-client/src/lease.rs,
``GroupLeases``).
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence

from ._proto import lockd_pb2 as pb

log = logging.getLogger("lockd_client")


def monotonic() -> float:
    return time.monotonic()


#: A group's answer to a keepalive (``GroupLease.state``). Any state but these two (UNREACHABLE,
#: or one a later service may add) extends nothing there and keeps the reply from counting as
#: every group's.
EXTENDED = pb.GROUP_LEASE_STATE_EXTENDED
NOT_HERE = pb.GROUP_LEASE_STATE_NOT_HERE
#: The group could not answer (no leader, node down; ``GroupLease.error`` says why). By number:
#: stubs generated before the state existed do not name it.
UNREACHABLE: int = int(getattr(pb, "GROUP_LEASE_STATE_UNREACHABLE", 3))


@dataclass(frozen=True)
class HoldLease:
    """Which lease a hold follows, as of its grant (:meth:`GroupLeases.granted`)."""

    #: The lock group that granted it.
    group: int
    #: The group's move count at the grant.
    group_moves: int
    #: The group's lease epoch at the grant (bumped when the client learns that lease ended).
    epoch: int
    #: ``GroupLeases.all_epoch`` at the grant (bumped when ``deadline_all`` restarts after it
    #: had passed): a hold that follows ``deadline_all`` is lost once it differs.
    all_epoch: int


@dataclass
class _GroupState:
    #: Send time of the last keepalive this group extended + its ttl - margin; ``None`` while
    #: the session has no lease there that the client knows of (after ``not_here``).
    deadline: Optional[float]
    #: The highest move count the group reported (in a keepalive answer or a grant).
    moves: int
    epoch: int = 0
    #: When the first grant of this epoch arrived (``None``: none yet).
    first_grant: Optional[float] = None
    #: Ended epochs: when each counts as having ended (at or before the client learnt it).
    ended_at: Dict[int, float] = field(default_factory=dict)
    #: Why the group last could not answer (``GroupLease.error``); cleared when it extends.
    error: str = ""


class GroupLeases:
    """A session's leases, one per lock group, and the session-wide one (docs/API.md, "Leases
    per group"); the same rule as lockd-client's ``GroupLeases`` (crates/lockd-client/src/lease.rs).

    Pure: every time is an input (``time.monotonic()`` values), so the rule is tested without
    a service. Each deadline is ``send time of a renewal + TTL - margin``, and moves only forward.

    * ``deadline_all`` (the session-wide deadline) moves only with a keepalive reply in which
      every listed group answered ``extended`` or ``not_here`` (a reply without ``groups``
      counts as every group extended with the reply's ``ttl_ms``). A group that could not
      answer (``UNREACHABLE``) extends nothing and keeps the reply from counting. When such a
      reply arrives after ``deadline_all`` had passed, ``deadline_all`` restarts from it and
      ``all_epoch`` is bumped: the holds that followed it are lost for good.
    * Per group ``g``: ``deadline`` (last reply that said ``extended`` for ``g``), ``moves``
      (highest move count seen, never lowered) and ``epoch``, bumped when the client learns the
      lease there ended: ``g`` answered ``not_here`` although a grant of the epoch arrived
      before the keepalive was sent, or an ``extended`` arrived after ``g``'s deadline had
      passed. A lost lease stays lost for the holds of its epoch; later grants start afresh.
    * A group's lease also ends when the service pushes ``SessionEnded`` for that group
      (:meth:`group_ended`): as a ``not_here`` answer to a keepalive sent when the push arrived.
    * A hold follows its group's deadline while the group's move count is still the grant's
      (a hold leaves its group only by a bucket move, which raises the count in both groups);
      once the count differs it follows ``deadline_all``, and is lost if ``all_epoch`` moved
      since its grant; once its group's epoch ended it is lost.
    * The session itself is lost when :meth:`session_deadline` passes: the latest of
      ``deadline_all`` and every group's deadline (the session lives while the lease of any of
      its groups may be alive), or at once when every group answered ``not_here`` (the service
      answers 404 then).
    """

    def __init__(self, sent: float, ttl: float, margin: float) -> None:
        self.ttl = ttl
        self.margin = margin
        self.deadline_all = sent + ttl - margin
        #: Bumped when ``deadline_all`` restarts after it had passed (a hold records it).
        self.all_epoch = 0
        #: Ended ``all_epoch`` values: the ``deadline_all`` each ended at.
        self.all_ended_at: Dict[int, float] = {}
        self.groups: Dict[int, _GroupState] = {}
        #: When every group answered ``not_here`` (the session is gone); ``None`` until then.
        self.gone_at: Optional[float] = None
        #: Counts the changes that can make a hold (or the session) lost before its deadline as
        #: last computed (an epoch ended, a move count rose, a group's lease forgotten,
        #: ``deadline_all`` restarted).
        self.changes = 0
        #: The lock group that opened the session (``None``: a service that opens sessions in
        #: every group; then every keepalive asks every group).
        self.home: Optional[int] = None
        #: When the session last used each group (a grant there, or a hold or wait a keepalive
        #: saw there): keepalives go on naming a group for one TTL after, since the group keeps
        #: the session that long and a grant there counts from the lease the client knows.
        self.used: Dict[int, float] = {}
        #: The send time of the earliest acquire whose answer a broken stream took: it may have
        #: brought the session into a group the client will not name (see :meth:`granted`).
        self.unsure_since: Optional[float] = None
        #: Send time + ttl - margin of the last keepalive that asked every group (or of the
        #: open): every lease the session has anywhere lasts at least until then. A grant in a
        #: group the client knows no lease of never counts past it.
        self.every_deadline = sent + ttl - margin

    def homed(self, home: int, sent: float, now: float) -> None:
        """The open sent at ``sent`` was answered by lock group ``home`` (0: a service that
        opens sessions in every group). Its lease there started after ``sent``; from now on
        keepalives name only the groups the session uses (:meth:`keepalive_groups`)."""
        if home == 0:
            return
        self.home = home
        self.started(home, sent, 0, now)

    def keepalive_groups(self, holds: Iterable[HoldLease], waits: Iterable[int],
                         unsure: bool, now: float) -> List[int]:
        """The groups a keepalive sent at ``now`` should renew: the home, every group a hold or
        a queued wait lives in, and every group the session used within the last TTL (the group
        keeps the session that long after its last hold there ends; renewing it keeps the lease
        the client knows there fresh for the next grant, which renews nothing by itself).
        Empty means every lock group, which is what it asks while a hold may have left its
        group (its group's move count rose since the grant), while ``unsure`` (an acquire whose
        outcome a broken stream took may be queued or held in a group it cannot name), and for
        a service that opens sessions in every group."""
        if self.home is None:
            return []
        named = {self.home}
        moved = False
        for h in holds:
            st = self.groups.get(h.group)
            moved = moved or st is None or st.moves != h.group_moves
            named.add(h.group)
        named.update(waits)
        for g in named:
            self.used[g] = now
        self.used = {g: t for g, t in self.used.items() if t + self.ttl > now}
        if unsure or moved:
            return []
        named.update(self.used)
        return sorted(named)

    def note_unsure(self, sent: float) -> None:
        """An acquire sent at ``sent`` lost its answer with a broken stream: grants in a group
        the client knows no lease of count from no later than that send (:meth:`granted`)."""
        self.unsure_since = sent if self.unsure_since is None else min(self.unsure_since, sent)

    def started(self, group: int, sent: float, ttl_ms: int, now: float) -> None:
        """A request sent at ``sent`` started the session's lease in ``group`` (the service
        said ``lease_started``: the group adopted the session for it). A lease the client knew
        there before has ended (the group had none when it adopted), unless a grant of it
        arrived after ``sent`` (the order is then unknown, and its deadline stays as it was,
        which is never later than the truth)."""
        self.used[group] = now
        d = self._deadline(sent, ttl_ms)
        st = self.groups.get(group)
        if st is None:
            self.groups[group] = _GroupState(d, 0)
            return
        if st.deadline is None:
            st.deadline = d
        elif st.first_grant is None or st.first_grant <= sent:
            self._end_epoch(st, min(st.deadline, now))
            st.deadline = d

    # The session rule, in one place: when the whole session counts as lost (every lock of it
    # lost, the next acquire opens a new session).
    def session_deadline(self) -> float:
        """The latest of ``deadline_all`` and every group's deadline the client knows of: the
        session lives while any group's lease may still be alive. Every hold's own deadline
        comes no later (:meth:`deadline_of`). Once every group answered ``not_here``, when that
        answer arrived."""
        d = self.deadline_all
        for st in self.groups.values():
            if st.deadline is not None and st.deadline > d:
                d = st.deadline
        if self.gone_at is not None:
            d = min(d, self.gone_at)
        return d

    def session_expired(self, now: float) -> bool:
        return now >= self.session_deadline()

    def _deadline(self, sent: float, ttl_ms: int) -> float:
        """``sent + ttl - margin`` for a renewal granting ``ttl_ms`` (never more than the TTL of
        the open; 0, an answer that does not say, counts as that TTL)."""
        ttl = self.ttl if ttl_ms <= 0 else min(self.ttl, ttl_ms / 1000.0)
        return sent + ttl - self.margin

    def renewed(self, sent: float, ttl_ms: int, groups: Sequence[pb.GroupLease], now: float,
                named: bool = False) -> str:
        """A keepalive (or attach) sent at ``sent`` was answered at ``now``: ``ttl_ms`` the least
        lease over the groups that extended it, ``groups`` what each group said (empty: a
        service that does not say, so every group counts as extended with ``ttl_ms``).
        ``named``: the keepalive named the groups it renews rather than asking every group; such
        a reply renews ``deadline_all`` only if no group reported a move count above the one
        the client knew (every hold was then still in its named group, so a hold that moves
        later lands in a group whose lease restarts after this reply).

        Returns

        * ``"too_late"``: the session was already lost at ``now`` (:meth:`session_deadline`
          passed); nothing is applied, a lost session stays lost;
        * ``"gone"``: every listed group answered ``not_here``: the session has no lease
          anywhere, so it is lost (the service answers 404 instead of such a reply);
        * else what became of ``deadline_all``: ``"extended"``, ``"unchanged"`` (an older
          renewal, or not every group answered) or ``"restarted"`` (every group answered, but
          after ``deadline_all`` had passed: it restarts from this reply, and the holds that
          followed it stay lost, see :meth:`deadline_of`)."""
        if self.session_expired(now):
            return "too_late"  # a lost session stays lost
        every = not (named and any(
            gl.state == EXTENDED and gl.group in self.groups
            and gl.group_moves > self.groups[gl.group].moves for gl in groups))
        if not groups:
            for known in self.groups.values():
                self._extended(known, sent, ttl_ms, known.moves, now)
        for gl in groups:
            if gl.state == EXTENDED:
                st = self.groups.get(gl.group)
                if st is None:
                    self.groups[gl.group] = _GroupState(self._deadline(sent, gl.ttl_ms), gl.group_moves)
                else:
                    self._extended(st, sent, gl.ttl_ms, gl.group_moves, now)
            elif gl.state == NOT_HERE:
                self._not_here(gl.group, sent, now)
            else:
                every = False
                st = self.groups.get(gl.group)
                if st is not None:
                    st.error = getattr(gl, "error", "") or "unreachable"
        if groups and all(gl.state == NOT_HERE for gl in groups):
            self.gone_at = now
            self.changes += 1
            return "gone"
        if not every:
            return "unchanged"
        d = self._deadline(sent, ttl_ms)
        if not named:
            self.every_deadline = max(self.every_deadline, d)
        if now >= self.deadline_all:
            # Too late for the holds that followed deadline_all (they may have stopped, and a
            # lease of theirs may have ended): they stay lost. The session goes on, and so does
            # deadline_all, from this reply, for the holds granted from now on.
            if d <= now:
                return "unchanged"  # nothing left of this renewal either
            self.all_ended_at[self.all_epoch] = self.deadline_all
            self.all_epoch += 1
            self.deadline_all = d
            self.changes += 1
            return "restarted"
        if d > self.deadline_all:
            self.deadline_all = d
            return "extended"
        return "unchanged"

    def _raise_moves(self, st: _GroupState, moves: int) -> None:
        if moves > st.moves:
            st.moves = moves
            self.changes += 1

    def _extended(self, st: _GroupState, sent: float, ttl_ms: int, moves: int, now: float) -> None:
        self._raise_moves(st, moves)
        st.error = ""
        d = self._deadline(sent, ttl_ms)
        if st.deadline is not None and now >= st.deadline:
            # Too late for the holds of this epoch (they may have stopped already); the
            # group's lease goes on for later grants.
            self._end_epoch(st, st.deadline)
            st.deadline = d
        elif st.deadline is None or d > st.deadline:
            st.deadline = d

    def renewed_in(self, group: int, sent: float, ttl_ms: int, group_moves: int,
                   now: float) -> None:
        """An acquire sent at ``sent`` was granted or queued in ``group``, and the group's leader
        said it renewed the session's lease there as it did (``renewed``: ``ttl_ms`` left, the
        group's move count ``group_moves``). Counted as a keepalive sent at ``sent`` that only
        ``group`` answered, extended; ``deadline_all`` is untouched. A lost session stays
        lost."""
        if self.session_expired(now):
            return
        self.used[group] = now
        st = self.groups.get(group)
        if st is None:
            self.groups[group] = _GroupState(self._deadline(sent, ttl_ms), group_moves)
        else:
            self._extended(st, sent, ttl_ms, group_moves, now)

    def group_ended(self, group: int, at: float) -> None:
        """The service pushed ``SessionEnded`` for ``group`` (its leader let the session's lease
        there run out), which arrived at ``at``: the group's lease ended, as a ``not_here``
        answer to a keepalive sent at ``at`` ends it. Every hold of the current epoch there (its
        grant arrived before the push) is lost; grants arriving later start a new lease (the
        acquire adopts the session there again). The session goes on in its other groups."""
        self._not_here(group, at, at)

    def _not_here(self, group: int, sent: float, now: float) -> None:
        st = self.groups.get(group)
        if st is None:
            return
        if st.first_grant is not None and st.first_grant > sent:
            # Every grant of this epoch arrived after the keepalive was sent: the group may have
            # answered before the acquire adopted the session there. Nothing is known to end.
            return
        if st.first_grant is not None:
            self._end_epoch(st, now if st.deadline is None else min(st.deadline, now))
        st.deadline = None
        self.changes += 1

    def _end_epoch(self, st: _GroupState, at: float) -> None:
        st.ended_at[st.epoch] = at
        st.epoch += 1
        st.first_grant = None
        self.changes += 1

    def granted(self, sent: float, now: float, group: int, group_moves: int,
                lease_ttl_ms: int, others: Optional[float] = None) -> HoldLease:
        """A hold granted by ``group`` at its move count ``group_moves``, for an acquire sent at
        ``sent`` and answered (or pushed) at ``now``, with the session's lease ``lease_ttl_ms``.

        A group without a lease the client knows of starts one: ``sent + lease_ttl - margin``,
        but never past ``every_deadline``, the last keepalive that asked every group (a grant
        renews nothing, and the lease there may be older than the acquire: an import brought
        the session, or another request adopted it). Nor, once keepalives name their groups,
        past ``others + ttl - margin`` for the earliest send of another acquire still unanswered
        (``others``) or whose answer was lost. A grant whose request started the lease itself
        goes through :meth:`started` first, and then counts from its own send."""
        st = self.groups.get(group)
        if st is None:
            st = self.groups[group] = _GroupState(None, group_moves)
        if st.deadline is None:
            start = min(self._deadline(sent, lease_ttl_ms), self.every_deadline)
            if self.home is not None:
                unknown = [t for t in (others, self.unsure_since) if t is not None]
                if unknown:
                    start = min(start, self._deadline(min(unknown), 0))
            st.deadline = start
        self._raise_moves(st, group_moves)
        if st.first_grant is None:
            st.first_grant = now
        self.used[group] = now
        return HoldLease(group, group_moves, st.epoch, self.all_epoch)

    def deadline_of(self, hold: HoldLease) -> float:
        """The per-lock rule: when ``hold`` counts as lost, apart from the session's own end. Its
        group's deadline while the group's move count is the grant's, else ``deadline_all``;
        once its group's lease epoch ended, when that epoch ended, and once it follows
        ``deadline_all`` but ``all_epoch`` moved since its grant, when its ``all_epoch`` ended
        (both already past)."""
        st = self.groups.get(hold.group)
        if st is not None:
            if st.epoch != hold.epoch:
                return st.ended_at.get(hold.epoch, -math.inf)
            if st.moves == hold.group_moves and st.deadline is not None:
                return st.deadline
        if hold.all_epoch != self.all_epoch:
            return self.all_ended_at.get(hold.all_epoch, -math.inf)
        return self.deadline_all

    def lock_deadline(self, hold: HoldLease) -> float:
        """When ``hold`` counts as lost, the session's end included."""
        return min(self.deadline_of(hold), self.session_deadline())

    def why_lost(self, hold: HoldLease) -> str:
        st = self.groups.get(hold.group)
        if st is not None and st.epoch != hold.epoch:
            return f"the session's lease in lock group {hold.group} ended"
        if st is not None and st.moves == hold.group_moves and st.deadline is not None:
            why = f"the local lease deadline of lock group {hold.group} passed without a renewal"
            return why + (f" (the group could not answer: {st.error})" if st.error else "")
        return (f"a bucket moved in or out of lock group {hold.group} and the session-wide "
                "deadline passed before every lock group renewed the lease")


class _Watched:
    """Callbacks called once, on the engine's loop, when the lease they watch is lost."""

    def __init__(self) -> None:
        self.lost = False
        self.why = ""
        self._watchers: List[Callable[[], None]] = []
        self._mu = threading.Lock()

    def _fire(self, why: str) -> bool:
        with self._mu:
            if self.lost:
                return False
            self.lost = True
            self.why = why
            watchers, self._watchers = self._watchers, []
        for cb in watchers:
            try:
                cb()
            except Exception:  # a watcher must not stop the others
                log.exception("lockd lease watcher failed")
        return True


class Lease(_Watched):
    """One session as its locks see it: its per-group leases (:class:`GroupLeases`) and whether
    it is lost, which is final.

    Read from any thread; written on the engine's loop. Watchers (callbacks) are called once,
    on the loop, when the session is lost."""

    def __init__(self, gen: int, session_id: str, leases: GroupLeases) -> None:
        super().__init__()
        self.gen = gen
        self.session_id = session_id
        self.leases = leases

    @property
    def deadline(self) -> float:
        """The session's local deadline (:meth:`GroupLeases.session_deadline`)."""
        return self.leases.session_deadline()

    def is_lost(self) -> bool:
        """Lost, or past the local deadline (checked against the clock, not just the flag, so a
        process resumed after a pause sees it before the engine's timer has run)."""
        return self.lost or self.leases.session_expired(monotonic())

    def watch(self, cb: Callable[[], None]) -> None:
        with self._mu:
            if not self.lost:
                self._watchers.append(cb)
                return
        cb()

    def unwatch(self, cb: Callable[[], None]) -> None:
        with self._mu:
            try:
                self._watchers.remove(cb)
            except ValueError:
                pass

    def end(self, why: str) -> None:
        self._fire(why)


class LockLease(_Watched):
    """One hold's lease: lost when its session is, or at its own deadline
    (:meth:`GroupLeases.lock_deadline`), or when its group's lease epoch ended.

    Read from any thread; written on the engine's loop. Watchers are called once, on the loop,
    when the lock is lost."""

    def __init__(self, session: Lease, hold: HoldLease) -> None:
        super().__init__()
        self.session = session
        self.hold = hold

    @property
    def deadline(self) -> float:
        """The lock's local deadline on ``time.monotonic()``'s clock."""
        return self.session.leases.lock_deadline(self.hold)

    @property
    def group(self) -> int:
        return self.hold.group

    def expired(self, now: float) -> bool:
        return now >= self.deadline

    def is_lost(self) -> bool:
        """Lost, its session lost, or past its deadline (against the clock, as :class:`Lease`)."""
        return self.lost or self.session.lost or self.expired(monotonic())

    def watch(self, cb: Callable[[], None]) -> None:
        with self._mu:
            lost = self.lost
            first = not lost and not self._watchers
            if not lost:
                self._watchers.append(cb)
        if lost:
            cb()
        elif first:
            # The session's end is this lock's end (called at once if it already ended).
            self.session.watch(self._session_ended)

    def unwatch(self, cb: Callable[[], None]) -> None:
        with self._mu:
            try:
                self._watchers.remove(cb)
            except ValueError:
                return
            last = not self._watchers
        if last:
            self.session.unwatch(self._session_ended)

    def _session_ended(self) -> None:
        self._fire(self.session.why)

    def end(self, why: str) -> None:
        if self._fire(why):
            self.session.unwatch(self._session_ended)
