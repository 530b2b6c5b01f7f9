"""Which waiting acquire a pushed ``granted`` or ``wait_ended`` answers: pure bookkeeping.

The same rules as the Rust client's ``pushes.rs``. A wait is queued by a request on the session
stream and answered later by a push that names it by ``(group, waiter)``:

- **The push comes first**: a push for an unknown waiter is kept while an acquire of the same
  name is still unanswered on the stream (its ``queued`` reply may be on the way).
- **The same outcome is pushed twice**: waiters answered lately are remembered, and a second
  push for one is dropped, never taken for an orphan and released under a live lock.
- **The stream breaks while a wait is queued**: the wait lives on in the group, so the caller's
  retry is refused ``already_waiting`` by its own first attempt. Such ``(name, owner)`` pairs
  are *strays*; a stray's retry refused that way adopts the queued wait.
- **Nobody is left to take a grant**: a grant with no waiter, no unanswered acquire of its name
  and no adopter is an *orphan*, which the engine gives back.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Callable, Deque, Dict, Generic, List, Optional, Tuple, TypeVar, Union

from ._proto import lockd_pb2 as pb

A = TypeVar("A")
Key = Tuple[int, int]

#: How many of each remembered kind (early pushes, answered waiters, strays) are kept.
CAPACITY = 4096


@dataclass
class Answer(Generic[A]):
    """The push answers this acquire."""
    acq: A
    event: pb.SessionEvent


@dataclass
class Orphan:
    """A grant nobody will take: give it back."""
    name: str
    token: int


#: ``None``: kept for a ``queued`` reply on its way, or dropped.
Pushed = Union[Answer[A], Orphan, None]


def _key(ev: pb.SessionEvent) -> Tuple[Key, str]:
    if ev.WhichOneof("kind") == "granted":
        return (ev.granted.group, ev.granted.waiter), ev.granted.name
    return (ev.wait_ended.group, ev.wait_ended.waiter), ev.wait_ended.name


class Pushes(Generic[A]):
    """The waits of one session stream and what is known about their pushes."""

    def __init__(self) -> None:
        self._waits: Dict[Key, A] = {}
        self._early: "collections.OrderedDict[Key, pb.SessionEvent]" = collections.OrderedDict()
        self._answered: "collections.OrderedDict[Key, None]" = collections.OrderedDict()
        #: Each stray's first attempt's send time (monotonic): an adopted wait may have been
        #: granted before the retry was sent, so its lease counts from the first attempt.
        self._strays: Dict[Tuple[str, str], float] = {}
        self._adopters: Dict[str, Deque[A]] = {}

    def queued(self, key: Key, acq: A) -> Optional[Answer[A]]:
        """An acquire was answered ``queued`` as ``key``: a push that came first answers it."""
        ev = self._early.pop(key, None)
        if ev is None:
            self._waits[key] = acq
            return None
        self._mark(key)
        return Answer(acq, ev)

    def pushed(self, ev: pb.SessionEvent, unanswered: Callable[[str], bool]) -> Pushed[A]:
        """A push arrived; ``unanswered(name)``: an acquire of that name is still unanswered."""
        key, name = _key(ev)
        acq = self._waits.pop(key, None)
        if acq is not None:
            self._mark(key)
            return Answer(acq, ev)
        if key in self._answered:
            return None
        if unanswered(name):
            self._early[key] = ev
            while len(self._early) > CAPACITY:
                self._early.popitem(last=False)
            return None
        return self._unclaimed_push(key, name, ev)

    def _unclaimed_push(self, key: Key, name: str, ev: pb.SessionEvent) -> Pushed[A]:
        self._mark(key)
        q = self._adopters.get(name)
        if q:
            acq = q.popleft()
            if not q:
                del self._adopters[name]
            return Answer(acq, ev)
        if ev.WhichOneof("kind") == "granted":
            return Orphan(ev.granted.name, ev.granted.fencing_token)
        return None

    def refused_waiting(self, name: str, owner: str, acq: A) -> Tuple[bool, Optional[Answer[A]]]:
        """The acquire was refused ``already_waiting``: ``(True, answer-or-None)`` when a stray's
        retry adopts its queued wait, ``(False, None)`` when the refusal is the caller's."""
        if (name, owner) not in self._strays:
            return False, None
        for key, ev in self._early.items():
            if _key(ev)[1] == name:
                del self._early[key]
                self._mark(key)
                return True, Answer(acq, ev)
        self._adopters.setdefault(name, collections.deque()).append(acq)
        return True, None

    def is_stray(self, name: str, owner: str) -> bool:
        """Whether ``(name, owner)``'s last acquire lost its outcome with a broken stream."""
        return (name, owner) in self._strays

    def settled(self, name: str, owner: str) -> None:
        """The acquire got another answer than ``already_waiting``: no longer a stray."""
        self._strays.pop((name, owner), None)

    def unclaimed(self, name: str, unanswered: Callable[[str], bool]) -> List[Union[Answer[A], Orphan]]:
        """Kept pushes of ``name`` that no acquire can claim any more: each goes to an adopter,
        or is an orphan if a grant."""
        if not self._early or unanswered(name):
            return []
        keys = [k for k, ev in self._early.items() if _key(ev)[1] == name]
        out: List[Union[Answer[A], Orphan]] = []
        for key in keys:
            p = self._unclaimed_push(key, name, self._early.pop(key))
            if p is not None:
                out.append(p)
        return out

    def waiting(self, match: Callable[[A], bool]) -> bool:
        """Whether a queued wait or an adopter matches (its grant may come at any time)."""
        return (any(match(a) for a in self._waits.values())
                or any(match(a) for q in self._adopters.values() for a in q))

    def give_up_adopters(self, expired: Callable[[A], bool]) -> List[A]:
        """Hands back the adopters ``expired`` says have waited long enough for a push."""
        out: List[A] = []
        for name in list(self._adopters):
            q = self._adopters[name]
            out.extend(a for a in q if expired(a))
            kept = collections.deque(a for a in q if not expired(a))
            if kept:
                self._adopters[name] = kept
            else:
                del self._adopters[name]
        return out

    def broke(self) -> List[A]:
        """The stream broke: its early pushes are gone; every wait and adopter is handed back."""
        self._early.clear()
        out = list(self._waits.values())
        self._waits.clear()
        for q in self._adopters.values():
            out.extend(q)
        self._adopters.clear()
        return out

    def wait_groups(self) -> List[int]:
        """The groups the queued waits live in (each once)."""
        return sorted({key[0] for key in self._waits})

    def has_strays(self) -> bool:
        """Whether an acquire whose outcome a broken stream took is still unsettled (its wait or
        hold may live in a group nobody can name yet)."""
        return bool(self._strays) or any(self._adopters.values())

    def stray(self, name: str, owner: str, sent: float) -> None:
        """``(name, owner)``'s acquire, sent at ``sent``, lost its outcome with the stream; a
        stray already known keeps its earlier send time."""
        key = (name, owner)
        if key in self._strays:
            self._strays[key] = min(self._strays[key], sent)
        elif len(self._strays) < CAPACITY:
            self._strays[key] = sent

    def stray_since(self, name: str, owner: str) -> Optional[float]:
        """When the first attempt of stray ``(name, owner)`` was sent."""
        return self._strays.get((name, owner))

    def end(self) -> List[A]:
        """The session ended: everything is forgotten; waits and adopters are handed back."""
        out = self.broke()
        self._answered.clear()
        self._strays.clear()
        return out

    def _mark(self, key: Key) -> None:
        self._answered[key] = None
        while len(self._answered) > CAPACITY:
            self._answered.popitem(last=False)


def settle(unsure: List[str], listed: List[Tuple[str, int]], known: Callable[[str, int], bool],
           open_: Callable[[str], bool]) -> Tuple[List[Tuple[str, int]], List[str]]:
    """What to do with the holds the service lists for the session after an acquire's outcome
    was lost (``unsure``): each listed hold of an unsure name that no lock object knows is given
    back, so the caller's retry starts clean. A name with an acquire or a wait still open is left
    for later: the listed hold may be that acquire's grant, whose answer has not come yet, and
    giving it back would leave its lock object holding nothing. Returns the holds to give back
    and the names to settle later."""
    give_back: List[Tuple[str, int]] = []
    later: List[str] = []
    for name in dict.fromkeys(unsure):
        if open_(name):
            later.append(name)
            continue
        give_back.extend((name, t) for n, t in listed if n == name and not known(n, t))
    return give_back, later
