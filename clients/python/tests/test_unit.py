"""Checks that need no cluster: the committed stubs match proto/, and gRPC statuses map to
typed errors with the right `retryable`."""
from __future__ import annotations

import pathlib
import tempfile
from typing import Optional, Sequence, Tuple

import grpc
import pytest

from lockd_client import errors
from lockd_client._options import RetryPolicy
from lockd_client._proto import lockd_pb2

from conftest import REPO, missing


def test_committed_stubs_match_the_proto() -> None:
    """The descriptor compiled into lockd_pb2.py equals what protoc makes of proto/ today
    (regenerate with clients/python/regen_proto.py when this fails)."""
    try:
        from grpc_tools import protoc  # type: ignore[import-untyped]
    except ImportError:
        missing("grpcio-tools (pip install 'lockd-client[test]')")
    from google.protobuf import descriptor_pb2

    proto_root = REPO / "proto"
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "set.binpb"
        rc = protoc.main(["protoc", f"-I{proto_root}", f"-I{include}", f"--descriptor_set_out={out}",
                          str(proto_root / "lockd/v1/lockd.proto")])
        assert rc == 0
        fresh = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    committed = descriptor_pb2.FileDescriptorProto.FromString(lockd_pb2.DESCRIPTOR.serialized_pb)
    # protoc fills in json_name in a descriptor set but not in the one it embeds in gencode.
    for fd in (fresh, committed):
        for m in fd.message_type:
            for f in m.field:
                f.ClearField("json_name")
    assert committed == fresh, "stubs are stale: run python clients/python/regen_proto.py"


class FakeRpcError(grpc.RpcError):
    """A gRPC error as grpc.aio raises it (status, details, metadata); not a stand-in for lockd."""

    def __init__(self, code: grpc.StatusCode, details: str,
                 trailing: Sequence[Tuple[str, str]] = ()) -> None:
        self._code, self._details, self._trailing = code, details, tuple(trailing)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> Optional[str]:
        return self._details

    def initial_metadata(self) -> Tuple[Tuple[str, str], ...]:
        return ()

    def trailing_metadata(self) -> Tuple[Tuple[str, str], ...]:
        return self._trailing


@pytest.mark.parametrize("gcode,code,cls,status,retryable", [
    (grpc.StatusCode.UNAVAILABLE, "no_leader", errors.Unavailable, 503, True),
    (grpc.StatusCode.FAILED_PRECONDITION, "stale_token", errors.Conflict, 409, False),
    (grpc.StatusCode.NOT_FOUND, "session_not_found", errors.SessionNotFound, 404, False),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "queue_full", errors.ResourceExhausted, 429, True),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "too_many_sessions", errors.ResourceExhausted, 429, False),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "payload_too_large", errors.ResourceExhausted, 413, False),
    (grpc.StatusCode.PERMISSION_DENIED, "wrong_namespace", errors.PermissionDenied, 403, False),
    (grpc.StatusCode.UNAUTHENTICATED, "unauthenticated", errors.Unauthenticated, 401, False),
    (grpc.StatusCode.INVALID_ARGUMENT, "ttl_out_of_range", errors.InvalidArgument, 400, False),
])
def test_service_errors_are_typed(gcode: grpc.StatusCode, code: str, cls: type, status: int,
                                  retryable: bool) -> None:
    e = errors.from_rpc_error(FakeRpcError(gcode, "why", [("lockd-error-code", code),
                                                           ("lockd-retry-after-ms", "250")]))
    assert isinstance(e, cls) and e.code == code and e.status == status
    assert e.retryable is retryable and e.retry_after == 0.25


def test_transport_errors_are_retryable_unavailable() -> None:
    e = errors.from_rpc_error(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "connection refused"), "n1:1")
    assert isinstance(e, errors.Unavailable) and e.retryable and e.status is None
    assert "n1:1" in str(e)
    e = errors.from_rpc_error(FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline"))
    assert isinstance(e, errors.Unavailable) and e.retryable
    e = errors.from_rpc_error(FakeRpcError(grpc.StatusCode.UNIMPLEMENTED, "no such method"))
    assert e.code == "unimplemented" and not e.retryable


def test_backoff_stays_under_its_ceiling_and_honours_retry_after() -> None:
    p = RetryPolicy()
    for attempt in range(30):
        assert p.delay(attempt) <= min(p.cap, p.base * 2 ** min(attempt, 20))
    assert p.delay(0, 0.7) >= 0.7


def test_check_name_is_the_specs_name_pattern() -> None:
    """The client refuses exactly the names docs/openapi.yaml's Name pattern (the server's rule)
    refuses: every code point near an edge of an excluded range, and a stride of the rest."""
    import re

    from lockd_client._core import _NOT_IN_NAMES, check_name

    text = (REPO / "docs" / "openapi.yaml").read_text()
    schema = text.split("\n    Name:\n      type: string\n", 1)[1].split("description:", 1)[0]
    # `pattern` (the Basic Multilingual Plane's exclusions), then `not: {pattern}` (the astral
    # ones), as YAML double-quoted strings.
    allowed, refused = (
        re.compile(re.sub(r"\\U([0-9A-Fa-f]{8})", lambda m: chr(int(m.group(1), 16)),
                          ln.strip()[len('pattern: "'):-1].replace("\\\\", "\\")))
        for ln in schema.splitlines() if ln.strip().startswith('pattern: "')
    )
    near = {c + d for lo, hi in _NOT_IN_NAMES for c in (lo, hi) for d in (-1, 0, 1)}
    points = sorted(near | set(range(0, 0x110000, 7)))
    differ = []
    for c in points:
        if not 0 <= c <= 0x10FFFF or 0xD800 <= c <= 0xDFFF:
            continue
        spec = allowed.match(chr(c)) is not None and refused.search(chr(c)) is None
        try:
            check_name(chr(c))
            client = True
        except errors.InvalidArgument:
            client = False
        if spec != client:
            differ.append(f"U+{c:04X} spec={spec} client={client}")
    assert not differ, differ[:20]
    for bad in ("pay\u202eexe.sh", "shard\u200b17", "a\udc00"):
        with pytest.raises(errors.InvalidArgument, match="U\\+"):
            check_name(bad)
    check_name("caf\u00e9/\u65e5\u672c \U0001f512")


# ----- leases per group (docs/API.md, "Leases per group"): the rule on synthetic replies -----

TTL, MARGIN = 15.0, 3.0  # the default margin is TTL/5
UNREACHABLE = 3  # a state this client does not know (a later service's): extends nothing


def ext(group: int, group_moves: int = 0, ttl_ms: int = 15_000) -> lockd_pb2.GroupLease:
    return lockd_pb2.GroupLease(group=group, state=lockd_pb2.GROUP_LEASE_STATE_EXTENDED,
                                ttl_ms=ttl_ms, group_moves=group_moves)


def not_here(group: int) -> lockd_pb2.GroupLease:
    return lockd_pb2.GroupLease(group=group, state=lockd_pb2.GROUP_LEASE_STATE_NOT_HERE)


def other(group: int) -> lockd_pb2.GroupLease:
    return lockd_pb2.GroupLease(group=group, state=UNREACHABLE)  # type: ignore[arg-type]


def test_a_lock_follows_its_groups_deadline_while_the_move_count_holds() -> None:
    """(a) A lock in group 2 stays held while group 2 keeps extending, even once the
    session-wide deadline lapses (group 1's answers are of a state the client does not know)."""
    from lockd_client._lease import GroupLeases

    l = GroupLeases(100.0, TTL, MARGIN)
    assert l.deadline_all == 112.0
    # A grant renews nothing: a group not heard from yet counts from the acquire's send, but
    # never past the session-wide deadline (the open started the lease there too).
    h = l.granted(101.0, 101.1, group=2, group_moves=5, lease_ttl_ms=15_000)
    assert (h.group, h.group_moves, h.epoch) == (2, 5, 0)
    assert l.deadline_of(h) == 112.0
    assert l.renewed(102.0, 15_000, [ext(1), ext(2, 5)], 102.1) == "extended"
    assert l.deadline_all == 114.0 and l.deadline_of(h) == 114.0
    for sent in (107.0, 112.0, 117.0, 122.0):
        assert l.renewed(sent, 15_000, [other(1), ext(2, 5)], sent + 0.1) == "unchanged"
        assert l.deadline_of(h) == sent + TTL - MARGIN
    assert l.deadline_all == 114.0, "only a reply every group answered moves it"
    assert l.deadline_of(h) > 125.0 > l.deadline_all
    # Today the session (and with it every lock) is lost when the session-wide deadline passes.
    assert l.session_expired(114.0) and l.lock_deadline(h) == 114.0
    # A group's own ttl counts (never more than the session's TTL).
    l.renewed(123.0, 9_000, [other(1), ext(2, 5, ttl_ms=9_000)], 123.1)
    assert l.deadline_of(h) == 134.0  # 122 + 12 is later: deadlines only move forward
    l.renewed(124.0, 60_000, [other(1), ext(2, 5, ttl_ms=60_000)], 124.1)
    assert l.deadline_of(h) == 136.0


def test_a_lock_follows_the_session_wide_deadline_once_its_groups_move_count_rose() -> None:
    """(b) A bucket moved in or out of the lock's group: the hold may live in another group now,
    so it follows the deadline every group must renew."""
    from lockd_client._lease import GroupLeases

    l = GroupLeases(100.0, TTL, MARGIN)
    l.renewed(101.0, 15_000, [ext(1), ext(2, 5)], 101.1)
    h = l.granted(101.5, 101.6, 2, 5, 15_000)
    l.renewed(106.0, 15_000, [other(1), ext(2, 5)], 106.1)
    assert (l.deadline_of(h), l.deadline_all) == (118.0, 113.0)
    # Group 2 extends at a higher move count: the lock falls back to deadline_all.
    l.renewed(107.0, 15_000, [other(1), ext(2, 6)], 107.1)
    assert l.deadline_of(h) == 113.0 == l.deadline_all
    # A late answer with the old count does not lower the count (the max is kept).
    l.renewed(106.5, 15_000, [other(1), ext(2, 5)], 107.2)
    assert l.groups[2].moves == 6 and l.deadline_of(h) == 113.0
    # Only a reply every group answered moves it on.
    l.renewed(108.0, 15_000, [ext(1), ext(2, 6)], 108.1)
    assert l.deadline_of(h) == 120.0 == l.deadline_all
    # A grant after the move follows group 2 again; a grant at a higher count raises moves_g.
    later = l.granted(108.5, 108.6, 2, 6, 15_000)
    assert l.deadline_of(later) == 120.0
    l.renewed(110.0, 15_000, [other(1), ext(2, 6)], 110.1)
    assert (l.deadline_of(later), l.deadline_of(h)) == (122.0, 120.0)
    newer = l.granted(110.5, 110.6, 2, 7, 15_000)
    assert l.groups[2].moves == 7
    assert (l.deadline_of(newer), l.deadline_of(later)) == (122.0, 120.0)


def test_not_here_for_its_group_makes_a_lock_lost() -> None:
    """(c) The group says the session has no lease there: its locks are lost for good; another
    group's are not, and the reply still counts as every group's."""
    from lockd_client._lease import GroupLeases

    l = GroupLeases(100.0, TTL, MARGIN)
    a = l.granted(101.0, 101.1, 1, 0, 15_000)
    b = l.granted(101.0, 101.1, 2, 0, 15_000)
    assert l.renewed(102.0, 15_000, [not_here(1), ext(2)], 102.1) == "extended"
    assert l.deadline_of(a) <= 102.1, "lost when the client learnt it"
    assert l.deadline_of(b) == 114.0 == l.deadline_all
    epoch = l.groups[1].epoch
    l.renewed(105.0, 15_000, [ext(1), ext(2)], 105.1)
    assert l.deadline_of(a) <= 102.1, "a lost lease stays lost"
    # A later grant there (the acquire adopted the session in group 1) is a new epoch.
    c = l.granted(106.0, 106.1, 1, 0, 15_000)
    assert c.epoch == epoch and l.deadline_of(c) == 117.0
    # A not_here from a keepalive sent before that grant arrived may predate the adoption:
    # it ends nothing.
    l.renewed(106.05, 15_000, [not_here(1), ext(2)], 106.2)
    assert l.deadline_of(c) == 117.0 and l.groups[1].epoch == epoch
    # Without a lock there, not_here forgets the group's lease; the next grant starts one.
    l2 = GroupLeases(100.0, TTL, MARGIN)
    l2.renewed(101.0, 15_000, [ext(1), ext(2)], 101.1)
    l2.renewed(102.0, 15_000, [not_here(1), ext(2)], 102.1)
    assert l2.groups[1].epoch == 0 and l2.groups[1].deadline is None
    d = l2.granted(103.0, 103.1, 1, 0, 15_000)
    assert l2.deadline_of(d) == 114.0  # 103 + 12, capped at deadline_all


def test_a_late_extension_does_not_revive_a_lock_but_a_later_grant_holds() -> None:
    """(d) An `extended` that arrives after the group's deadline passed: the locks of that lease
    stay lost (they may have stopped); a grant after it follows the lease that answer started."""
    from lockd_client._lease import GroupLeases

    l = GroupLeases(100.0, TTL, MARGIN)
    l.renewed(101.0, 15_000, [ext(1), ext(2)], 101.1)
    b = l.granted(101.5, 101.6, 2, 0, 15_000)
    c = l.granted(102.0, 102.1, 2, 0, 15_000)
    l.renewed(106.0, 15_000, [other(1), ext(2)], 106.1)
    assert l.deadline_of(b) == l.deadline_of(c) == 118.0
    # Sent at 117.5, answered at 118.5: group 2's deadline (118) had passed.
    l.renewed(117.5, 15_000, [other(1), ext(2)], 118.5)
    assert l.deadline_of(b) == 118.0 <= 118.5, "acknowledged after its deadline: still lost"
    assert l.deadline_of(c) == 118.0, "the same lease as b"
    assert l.groups[2].epoch == 1 and l.groups[2].deadline == 129.5
    l.renewed(122.0, 15_000, [other(1), ext(2)], 122.1)
    assert l.deadline_of(b) == 118.0, "later renewals do not revive it either"
    d = l.granted(122.5, 122.6, 2, 0, 15_000)
    assert d.epoch == 1 and l.deadline_of(d) == 134.0 > 122.6


def test_a_reply_without_groups_falls_back_to_the_session_wide_deadline() -> None:
    """(e) A service that does not list groups: the reply counts as every group extended with
    its ttl_ms, so every lock follows deadline_all."""
    from lockd_client._lease import GroupLeases

    l = GroupLeases(100.0, TTL, MARGIN)
    assert l.renewed(105.0, 15_000, [], 105.1) == "extended"
    assert l.deadline_all == 117.0
    h = l.granted(106.0, 106.1, 0, 0, 15_000)  # an older service says group 0, moves 0
    assert l.deadline_of(h) == 117.0
    for sent in (110.0, 115.0):
        l.renewed(sent, 15_000, [], sent + 0.1)
        assert l.deadline_of(h) == l.deadline_all == sent + TTL - MARGIN
    # A shorter ttl_ms in the answer counts as is; an older renewal changes nothing.
    assert l.renewed(121.0, 10_000, [], 121.1) == "extended"
    assert l.deadline_of(h) == l.deadline_all == 128.0
    assert l.renewed(115.5, 15_000, [], 121.2) == "unchanged"
    # Answered after the deadline: too late, nothing moves (the session is lost).
    assert l.renewed(127.0, 15_000, [], 128.5) == "too_late"
    assert l.deadline_all == 128.0 and l.session_expired(128.5)


def test_lock_lease_watchers_fire_once_for_the_lock_or_its_session() -> None:
    from lockd_client._lease import GroupLeases, Lease, LockLease, monotonic

    t = monotonic()  # an hour's lease: only `end` loses these
    session = Lease(1, "s", GroupLeases(t, 3600.0, 1.0))
    a = LockLease(session, session.leases.granted(t, t, 1, 0, 3_600_000))
    b = LockLease(session, session.leases.granted(t, t, 2, 0, 3_600_000))
    fired: list = []
    a.watch(lambda: fired.append("a"))
    b.watch(lambda: fired.append("b"))
    b.watch(lambda: fired.append("b2"))
    a.end("group 1 ended it")
    a.end("again")
    assert fired == ["a"] and a.is_lost() and a.why == "group 1 ended it" and not b.is_lost()
    session.end("closed")
    assert fired == ["a", "b", "b2"] and b.why == "closed"
    late: list = []
    b.watch(lambda: late.append(1))
    assert late == [1], "watching a lost lock calls back at once"
    # An unwatched lock leaves nothing registered with its session.
    s2 = Lease(2, "s2", GroupLeases(t, 3600.0, 1.0))
    c = LockLease(s2, s2.leases.granted(t, t, 1, 0, 3_600_000))
    cb = lambda: None  # noqa: E731
    c.watch(cb)
    assert len(s2._watchers) == 1
    c.unwatch(cb)
    assert s2._watchers == []


def test_the_engine_fires_lost_when_a_reply_ends_a_locks_group_lease() -> None:
    """The engine applies a keepalive reply per group: a `not_here` for one lock's group fires
    that lock's `lost` at once (and reports it), a move in another's makes it follow the
    session-wide deadline; the session goes on. No service: the replies are synthetic."""
    import asyncio

    from lockd_client._core import Core
    from lockd_client._lease import monotonic
    from lockd_client._options import ClientOptions
    from lockd_client.types import Mode

    async def main() -> None:
        core = Core(["127.0.0.1:1"], ClientOptions(ttl=15, use_stream=False))
        reported: list = []

        async def report(names: list) -> None:
            reported.extend(names)
        core._report_expired = report  # type: ignore[method-assign]
        core._wake = asyncio.Event()
        sent = monotonic()
        s = core._opened(lockd_pb2.OpenSessionResponse(session_id="s", ttl_ms=15_000,
                                                       keepalive_every_ms=10**9), sent, None)
        try:
            h1 = core._hold(s, "one", 7, "me", Mode.EXCLUSIVE, 1, sent, 2, 4, 15_000)
            h2 = core._hold(s, "two", 8, "me", Mode.EXCLUSIVE, 1, sent, 3, 0, 15_000)
            core.held = {1: h1, 2: h2}
            fired: list = []
            h1.lease.watch(lambda: fired.append("one"))
            h2.lease.watch(lambda: fired.append("two"))
            assert (h1.lease.group, h2.lease.group) == (2, 3)
            ka = monotonic()
            core._renewed(ka, lockd_pb2.KeepAliveResponse(ttl_ms=15_000,
                                                          groups=[not_here(2), ext(3, 0)]))
            assert fired == ["one"] and h1.lease.is_lost() and not h2.lease.is_lost()
            assert "lock group 2" in h1.lease.why
            assert core._sess is s and not s.lease.lost, "the session goes on"
            await asyncio.sleep(0)
            assert reported == ["one"] and core.lease_expired == 1
            # A move in group 3: lock two now follows the session-wide deadline.
            before = h2.lease.deadline
            core._renewed(monotonic(), lockd_pb2.KeepAliveResponse(
                ttl_ms=15_000, groups=[ext(2, 0), ext(3, 1)]))
            assert h2.lease.deadline == s.lease.deadline >= before and not h2.lease.is_lost()
            # The session's end fires the rest, and counts only what was not reported yet.
            core._lose("test", True)
            assert fired == ["one", "two"] and core.lease_expired == 2
            await asyncio.sleep(0)
            assert reported == ["one", "two"]
        finally:
            core._sess = None
            if s.ticker is not None:
                s.ticker.cancel()
            await core.close()

    asyncio.run(main())
