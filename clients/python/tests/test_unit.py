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


def test_tls_mistakes_get_the_hint_the_clients_own_settings_point_to() -> None:
    hint = errors.tls_hint
    # The node refused this client's missing certificate after the handshake: only a client
    # that speaks TLS without a certificate is told to give one.
    closed = "failed to connect to all addresses; last error: Unwrap failed (TSI_DATA_CORRUPTED)"
    assert "cert_file=" in (hint(closed, "127.0.0.1:7170", tls_without_cert=True) or "")
    assert hint(closed, "127.0.0.1:7170") is None
    assert "ca_file=" in (hint("CERTIFICATE_VERIFY_FAILED", "https://n:1") or "")
    assert "https://" in (hint("Socket closed", "127.0.0.1:7170") or "")
    assert hint("Connection refused", "127.0.0.1:7170", tls_without_cert=True) is None


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
# GROUP_LEASE_STATE_UNREACHABLE, by number: the committed stubs may predate it.
UNREACHABLE = 3


def ext(group: int, group_moves: int = 0, ttl_ms: int = 15_000) -> lockd_pb2.GroupLease:
    return lockd_pb2.GroupLease(group=group, state=lockd_pb2.GROUP_LEASE_STATE_EXTENDED,
                                ttl_ms=ttl_ms, group_moves=group_moves)


def not_here(group: int) -> lockd_pb2.GroupLease:
    return lockd_pb2.GroupLease(group=group, state=lockd_pb2.GROUP_LEASE_STATE_NOT_HERE)


def other(group: int, error: str = "group 1: no leader") -> lockd_pb2.GroupLease:
    """UNREACHABLE: the group could not answer (no leader, node down)."""
    gl = lockd_pb2.GroupLease(group=group, state=UNREACHABLE)  # type: ignore[arg-type]
    if "error" in lockd_pb2.GroupLease.DESCRIPTOR.fields_by_name:
        setattr(gl, "error", error)
    return gl


def test_a_lock_follows_its_groups_deadline_while_the_move_count_holds() -> None:
    """(a) Group 1 cannot answer, group 2 keeps extending for longer than the TTL: a lock in
    group 2 stays held and the session goes on; a lock in group 1 is lost at group 1's deadline."""
    from lockd_client._lease import GroupLeases, UNREACHABLE as UNREACHABLE_STATE

    assert UNREACHABLE_STATE == UNREACHABLE
    l = GroupLeases(100.0, TTL, MARGIN)
    assert l.deadline_all == 112.0 == l.session_deadline()
    # A grant renews nothing: a group not heard from yet counts from the acquire's send, but
    # never past the session-wide deadline (the open started the lease there too).
    h = l.granted(101.0, 101.1, group=2, group_moves=5, lease_ttl_ms=15_000)
    assert (h.group, h.group_moves, h.epoch, h.all_epoch) == (2, 5, 0, 0)
    assert l.deadline_of(h) == 112.0
    one = l.granted(101.0, 101.1, group=1, group_moves=0, lease_ttl_ms=15_000)
    assert l.renewed(102.0, 15_000, [ext(1), ext(2, 5)], 102.1) == "extended"
    assert l.deadline_all == 114.0 and l.deadline_of(h) == 114.0 == l.deadline_of(one)
    for sent in (107.0, 112.0, 117.0, 122.0):
        assert l.renewed(sent, 15_000, [other(1), ext(2, 5)], sent + 0.1) == "unchanged"
        assert l.deadline_of(h) == sent + TTL - MARGIN == l.lock_deadline(h)
        assert l.session_deadline() == sent + TTL - MARGIN, "the latest group deadline"
    assert l.deadline_all == 114.0, "only a reply every group answered moves it"
    assert l.groups[1].deadline == 114.0 and l.deadline_of(one) == 114.0 == l.lock_deadline(one)
    assert l.deadline_of(h) > 125.0 > l.deadline_all
    # Past 114 (deadline_all and group 1's): the lock in group 1 is lost, the session (and the
    # lock in group 2) goes on while group 2 extends.
    assert not l.session_expired(130.0) and l.session_deadline() == 134.0
    assert l.lock_deadline(one) <= 114.0 < l.lock_deadline(h)
    assert "lock group 1" in l.why_lost(one) and "could not answer" in l.why_lost(one)
    # A group's own ttl counts (never more than the session's TTL).
    l.renewed(123.0, 9_000, [other(1), ext(2, 5, ttl_ms=9_000)], 123.1)
    assert l.deadline_of(h) == 134.0  # 122 + 12 is later: deadlines only move forward
    l.renewed(124.0, 60_000, [other(1), ext(2, 5, ttl_ms=60_000)], 124.1)
    assert l.deadline_of(h) == 136.0
    # Group 2 stops answering too: the session is lost when its last deadline passes, and a
    # reply after that revives nothing.
    assert not l.session_expired(135.9) and l.session_expired(136.0)
    assert l.renewed(130.0, 15_000, [ext(1), ext(2, 5)], 136.5) == "too_late"
    assert l.deadline_of(h) == 136.0 and l.deadline_all == 114.0


def test_a_group_stays_named_for_one_ttl_after_its_last_use() -> None:
    """The same rule as lockd-client's ``a_group_stays_named_for_one_ttl_after_its_last_use``."""
    from lockd_client._lease import GroupLeases

    l = GroupLeases(100.0, TTL, MARGIN)
    l.homed(1, 100.0, 100.0)
    l.started(3, 101.0, 15_000, 101.0)
    l.granted(101.0, 101.0, group=3, group_moves=0, lease_ttl_ms=15_000)
    # Released before any keepalive saw it: group 3 is named until 101 + 15.
    assert l.keepalive_groups([], [], False, 102.0) == [1, 3]
    assert l.keepalive_groups([], [], False, 115.0) == [1, 3]
    assert l.keepalive_groups([], [], False, 116.0) == [1]
    # A wait a keepalive saw counts as a use too.
    assert l.keepalive_groups([], [4], False, 117.0) == [1, 4]
    assert l.keepalive_groups([], [], False, 131.0) == [1, 4]
    assert l.keepalive_groups([], [], False, 132.0) == [1]


def test_keepalives_name_the_home_and_the_groups_in_use() -> None:
    """A session homed in group 1 names its home and the groups of its holds and waits, and
    asks every group while a hold may have left its group or an outcome is lost (the same
    rule as lockd-client's ``keepalives_name_the_home_and_the_groups_in_use``)."""
    from lockd_client._lease import GroupLeases

    l = GroupLeases(100.0, TTL, MARGIN)
    assert l.keepalive_groups([], [], False, 100.0) == [], "no home: every group"
    l.homed(1, 100.0, 100.0)
    assert l.keepalive_groups([], [], False, 100.0) == [1]
    assert l.groups[1].deadline == 112.0
    # An acquire sent at 102 adopted the session in group 3 (lease_started).
    l.started(3, 102.0, 15_000, 102.0)
    h = l.granted(102.0, 102.0, group=3, group_moves=4, lease_ttl_ms=15_000)
    assert l.deadline_of(h) == 114.0, "counted from its own send"
    assert l.keepalive_groups([h], [5], False, 102.0) == [1, 3, 5]
    assert l.keepalive_groups([h], [], True, 102.0) == [], "unsure"
    # A named reply with no move renews the session-wide deadline too.
    assert l.renewed(105.0, 15_000, [ext(1), ext(3, 4)], 105.0, named=True) == "extended"
    assert l.deadline_of(h) == 117.0 == l.deadline_all
    # Group 3 reports a move: the named reply leaves deadline_all, the lock follows it from
    # the last reply without a move, and the next keepalive asks every group.
    assert l.renewed(109.0, 15_000, [ext(1), ext(3, 5)], 109.0, named=True) == "unchanged"
    assert l.deadline_of(h) == 117.0
    assert l.keepalive_groups([h], [], False, 109.0) == []
    # Every group answers in time: the moved lock goes on.
    l.renewed(113.0, 15_000, [ext(1), ext(2, 7), ext(3, 5)], 113.0)
    assert l.deadline_of(h) == 125.0


def test_a_grant_in_an_unnamed_group_counts_from_the_earliest_acquire_that_may_have_adopted() -> None:
    """As lockd-client's test of the same name: no further than the last keepalive that asked
    every group, nor than an acquire still unanswered or whose answer was lost."""
    from lockd_client._lease import GroupLeases

    l = GroupLeases(100.0, TTL, MARGIN)
    l.homed(1, 100.0, 100.0)
    l.renewed(110.0, 15_000, [ext(1)], 110.0, named=True)
    assert l.deadline_all == 122.0
    stale = l.granted(109.0, 111.0, group=2, group_moves=0, lease_ttl_ms=15_000)
    assert l.deadline_of(stale) == 112.0, "a named keepalive says nothing of group 2"
    l.renewed(113.0, 15_000, [ext(1), not_here(2), ext(3)], 113.0)
    h = l.granted(115.0, 115.0, group=4, group_moves=0, lease_ttl_ms=15_000, others=114.0)
    assert l.deadline_of(h) == 125.0
    h = l.granted(115.0, 115.0, group=5, group_moves=0, lease_ttl_ms=15_000, others=111.0)
    assert l.deadline_of(h) == 123.0
    l.note_unsure(112.0)
    h = l.granted(116.0, 116.0, group=6, group_moves=0, lease_ttl_ms=15_000)
    assert l.deadline_of(h) == 124.0
    l.started(7, 116.0, 15_000, 116.0)
    adopted = l.granted(116.0, 116.0, group=7, group_moves=0, lease_ttl_ms=15_000)
    assert l.deadline_of(adopted) == 128.0


def test_an_adoption_ends_the_lease_the_client_knew_there() -> None:
    from lockd_client._lease import GroupLeases

    l = GroupLeases(100.0, TTL, MARGIN)
    l.homed(1, 100.0, 100.0)
    l.started(2, 101.0, 15_000, 101.0)
    old = l.granted(101.0, 101.0, group=2, group_moves=0, lease_ttl_ms=15_000)
    l.started(2, 105.0, 15_000, 106.0)
    assert l.deadline_of(old) == 106.0, "lost when the adoption said the lease had ended"
    new = l.granted(105.0, 106.0, group=2, group_moves=0, lease_ttl_ms=15_000)
    assert l.deadline_of(new) == 117.0


def test_a_grant_with_a_renewal_counts_from_its_send_and_the_lapsed_leases_locks_stay_lost() -> None:
    """The leader renewed the session's lease as it granted (``renewed``): the grant counts from
    its send even after the lease the client knew there lapsed; without it, it is lost at once.
    The lapsed lease's locks stay lost, and a lost session is not revived."""
    import copy

    from lockd_client._lease import GroupLeases

    plain = GroupLeases(100.0, TTL, MARGIN)
    plain.homed(1, 100.0, 100.0)
    plain.started(2, 101.0, 15_000, 101.0)
    old = plain.granted(101.0, 101.0, group=2, group_moves=0, lease_ttl_ms=15_000)
    assert plain.deadline_of(old) == 113.0
    plain.renewed(110.0, 15_000, [ext(1)], 110.0, named=True)
    renewing = copy.deepcopy(plain)
    lost = plain.granted(112.5, 113.5, group=2, group_moves=0, lease_ttl_ms=15_000)
    assert plain.deadline_of(lost) <= 113.5, "lost at once"
    renewing.renewed_in(2, 112.5, 15_000, 0, 113.5)
    kept = renewing.granted(112.5, 113.5, group=2, group_moves=0, lease_ttl_ms=15_000)
    assert renewing.deadline_of(kept) == 124.5
    assert renewing.deadline_of(old) == 113.0
    assert renewing.deadline_all == 122.0
    gone = GroupLeases(100.0, TTL, MARGIN)
    gone.homed(1, 100.0, 100.0)
    gone.renewed_in(1, 113.0, 15_000, 0, 113.0)
    assert gone.session_deadline() == 112.0


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
    stay lost (they may have stopped); a grant after it follows the lease that answer started.
    (Group 3 keeps the session alive meanwhile.)"""
    from lockd_client._lease import GroupLeases

    l = GroupLeases(100.0, TTL, MARGIN)
    l.renewed(101.0, 15_000, [ext(1), ext(2), ext(3)], 101.1)
    b = l.granted(101.5, 101.6, 2, 0, 15_000)
    c = l.granted(102.0, 102.1, 2, 0, 15_000)
    l.renewed(106.0, 15_000, [other(1), ext(2), ext(3)], 106.1)
    assert l.deadline_of(b) == l.deadline_of(c) == 118.0
    l.renewed(112.0, 15_000, [other(1), other(2), ext(3)], 112.1)
    assert l.session_deadline() == 124.0
    # Sent at 117.5, answered at 118.5: group 2's deadline (118) had passed.
    assert l.renewed(117.5, 15_000, [other(1), ext(2), ext(3)], 118.5) == "unchanged"
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
    # Answered after the deadline: too late, nothing moves (the session is lost: without
    # groups, every deadline is deadline_all).
    assert l.session_deadline() == 128.0
    assert l.renewed(127.0, 15_000, [], 128.5) == "too_late"
    assert l.deadline_all == 128.0 and l.session_expired(128.5)


def test_a_lock_that_followed_deadline_all_stays_lost_once_it_restarts() -> None:
    """(b) A hold whose group's move count rose follows deadline_all, and is lost when it lapses
    (group 1 cannot answer) while the session goes on in group 2. A reply every group answered
    after that restarts deadline_all (a new all_epoch) but does not revive the hold; grants
    after it are fine, in the same group and once they follow deadline_all in turn."""
    from lockd_client._lease import GroupLeases

    l = GroupLeases(100.0, TTL, MARGIN)
    l.renewed(101.0, 15_000, [ext(1), ext(2, 5)], 101.1)
    h = l.granted(101.5, 101.6, 2, 5, 15_000)
    assert l.deadline_of(h) == 113.0
    changes = l.changes
    # A bucket moved in or out of group 2 (count 6): h may live in group 1 now.
    assert l.renewed(106.0, 15_000, [other(1), ext(2, 6)], 106.1) == "unchanged"
    assert l.changes > changes
    assert l.deadline_of(h) == 113.0 == l.deadline_all and l.groups[2].deadline == 118.0
    assert l.renewed(110.0, 15_000, [other(1), ext(2, 6)], 110.1) == "unchanged"
    assert l.lock_deadline(h) == 113.0, "lost when deadline_all lapses"
    assert not l.session_expired(113.0) and l.session_deadline() == 122.0, "the session goes on"
    assert "session-wide deadline" in l.why_lost(h)
    # Every group answers again, after deadline_all (113) had passed: it restarts from this
    # reply, in a new all_epoch; h stays lost (at the deadline it lapsed at).
    changes = l.changes
    assert l.renewed(114.0, 15_000, [ext(1), ext(2, 6)], 114.1) == "restarted"
    assert l.all_epoch == 1 and l.deadline_all == 126.0 and l.changes > changes
    assert l.deadline_of(h) == 113.0 == l.lock_deadline(h)
    assert l.renewed(118.0, 15_000, [ext(1), ext(2, 6)], 118.1) == "extended"
    assert l.deadline_of(h) == 113.0 and l.deadline_all == 130.0, "later renewals revive nothing"
    # Grants after the restart are fine: one at the new count follows group 2's deadline ...
    later = l.granted(118.5, 118.6, 2, 6, 15_000)
    assert later.all_epoch == 1 and l.deadline_of(later) == 130.0
    # ... and once a move makes it follow deadline_all, it follows the live one.
    l.renewed(120.0, 15_000, [other(1), ext(2, 7)], 120.1)
    assert l.deadline_of(later) == 130.0 == l.deadline_all and l.groups[2].deadline == 132.0
    # A reply every group answered that arrives when even its own deadline has passed restarts
    # nothing.
    assert l.renewed(117.0, 15_000, [ext(1), ext(2, 7)], 131.0) == "unchanged"
    assert l.all_epoch == 1 and l.deadline_all == 130.0


def test_a_pushed_session_ended_for_one_group_ends_only_that_groups_lease() -> None:
    """(c) SessionEnded(group=1) as a NOT_HERE answer sent when it arrived: group 1's locks
    granted before it are lost, group 2's are not, the session goes on; a grant in group 1
    after it (the acquire adopted the session there again) follows a new lease."""
    from lockd_client._lease import GroupLeases

    l = GroupLeases(100.0, TTL, MARGIN)
    l.renewed(101.0, 15_000, [ext(1), ext(2)], 101.1)
    a = l.granted(101.5, 101.6, 1, 0, 15_000)
    a2 = l.granted(104.0, 104.1, 1, 0, 15_000)
    b = l.granted(101.5, 101.6, 2, 0, 15_000)
    l.renewed(105.0, 15_000, [other(1), ext(2)], 105.1)
    changes = l.changes
    l.group_ended(1, 106.0)
    assert l.changes > changes
    assert l.lock_deadline(a) == 106.0 == l.lock_deadline(a2), "lost when the push arrived"
    assert "lock group 1" in l.why_lost(a) and "ended" in l.why_lost(a)
    assert l.deadline_of(b) == 117.0 and l.groups[1].deadline is None
    assert not l.session_expired(110.0) and l.session_deadline() == 117.0
    c = l.granted(106.5, 106.6, 1, 0, 15_000)
    assert c.epoch == a.epoch + 1 and l.deadline_of(c) == 113.0  # 106.5 + 12, capped by deadline_all
    l.renewed(107.0, 15_000, [ext(1), ext(2)], 107.1)
    assert l.deadline_of(c) == 119.0 and l.lock_deadline(a) == 106.0, "a stays lost"
    # A push for a group the client never heard of changes nothing.
    l.group_ended(9, 108.0)
    assert l.deadline_of(c) == 119.0 and l.deadline_of(b) == 119.0


def test_every_group_not_here_means_the_session_is_gone() -> None:
    """(d) A reply in which every group answered NOT_HERE (the service answers 404 instead):
    the session has no lease anywhere, and is lost at once; a later reply revives nothing."""
    from lockd_client._lease import GroupLeases

    l = GroupLeases(100.0, TTL, MARGIN)
    l.renewed(101.0, 15_000, [ext(1), ext(2)], 101.1)
    a = l.granted(101.5, 101.6, 1, 0, 15_000)
    assert l.renewed(102.0, 15_000, [not_here(1), ext(2)], 102.1) == "extended"
    assert not l.session_expired(102.2)
    assert l.renewed(103.0, 15_000, [not_here(1), not_here(2)], 103.1) == "gone"
    assert l.session_expired(103.1) and l.session_deadline() == 103.1
    assert l.lock_deadline(a) <= 103.1
    assert l.renewed(104.0, 15_000, [ext(1), ext(2)], 104.1) == "too_late"


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


def _engine(ttl_ms: int = 15_000, sent_ago: float = 0.0):  # type: ignore[no-untyped-def]
    """A Core with a session opened ``sent_ago`` seconds ago by a synthetic answer (no service;
    no keepalive is due for ages). Returns (core, session, reported names, open's send time)."""
    import asyncio

    from lockd_client._core import Core
    from lockd_client._lease import monotonic
    from lockd_client._options import ClientOptions

    core = Core(["127.0.0.1:1"], ClientOptions(ttl=ttl_ms / 1000, use_stream=False))
    reported: list = []

    async def report(names: list) -> None:
        reported.extend(names)
    core._report_expired = report  # type: ignore[method-assign]
    core._wake = asyncio.Event()
    sent = monotonic() - sent_ago
    s = core._opened(lockd_pb2.OpenSessionResponse(session_id="s", ttl_ms=ttl_ms,
                                                   keepalive_every_ms=10**9), sent, None)
    return core, s, reported, sent


async def _stop(core, s) -> None:  # type: ignore[no-untyped-def]
    core._sess = None
    if s.ticker is not None:
        s.ticker.cancel()
    await core.close()


def test_the_engine_ends_one_groups_locks_on_a_pushed_session_ended() -> None:
    """(c) in the engine: SessionEnded(group=1) fires `lost` for group 1's locks (granted before
    it), not group 2's; the session and the stream go on; a grant in group 1 after it holds.
    SessionEnded for group 0 ("closed") still ends the session."""
    import asyncio

    from lockd_client._lease import monotonic
    from lockd_client.types import Mode

    async def main() -> None:
        core, s, reported, sent = _engine()
        try:
            h1 = core._hold(s, "one", 7, "me", Mode.EXCLUSIVE, 1, sent, 1, 0, 15_000)
            h2 = core._hold(s, "two", 8, "me", Mode.EXCLUSIVE, 1, sent, 2, 0, 15_000)
            core.held = {1: h1, 2: h2}
            fired: list = []
            h1.lease.watch(lambda: fired.append("one"))
            h2.lease.watch(lambda: fired.append("two"))
            core._event(lockd_pb2.SessionEvent(
                session_ended=lockd_pb2.SessionEnded(group=1, reason="expired")))
            assert fired == ["one"] and h1.lease.is_lost() and not h2.lease.is_lost()
            assert "lock group 1" in h1.lease.why and h1.lease.deadline <= monotonic()
            assert core._sess is s and not s.lease.is_lost(), "the session goes on"
            await asyncio.sleep(0)
            assert reported == ["one"] and core.lease_expired == 1
            # A later grant in group 1 (the acquire adopted the session there again) holds.
            h3 = core._hold(s, "three", 9, "me", Mode.EXCLUSIVE, 1, monotonic(), 1, 0, 15_000)
            core.held[3] = h3
            assert not h3.lease.is_lost() and h3.lease.deadline > monotonic() + 5
            core._event(lockd_pb2.SessionEvent(
                session_ended=lockd_pb2.SessionEnded(group=0, reason="closed")))
            assert core._sess is None and s.lease.lost
            assert fired == ["one", "two"] and h3.lease.is_lost()
            assert core.lease_expired == 1, "a close is no expiry"
        finally:
            await _stop(core, s)

    asyncio.run(main())


def test_a_keepalive_refused_with_503_loses_nothing_but_404_loses_the_session() -> None:
    """Rule 4 and (d) in the engine: a keepalive answered 503 (no group extended, some could not
    answer) is retried soon and loses nothing; 404 (every group said NOT_HERE) loses the
    session, and so does a reply in which every group said NOT_HERE."""
    import asyncio

    from lockd_client._core import _Pending
    from lockd_client._lease import monotonic
    from lockd_client.types import Mode

    async def main() -> None:
        core, s, _, sent = _engine()
        try:
            h = core._hold(s, "one", 7, "me", Mode.EXCLUSIVE, 1, sent, 1, 0, 15_000)
            core.held = {1: h}
            if s.ticker is not None:
                s.ticker.cancel()  # no real keepalive to 127.0.0.1:1
            core._pending[41] = _Pending("keepalive", sent=monotonic())
            core._event(lockd_pb2.SessionEvent(request_id=41, error=lockd_pb2.Error(
                status=503, code="no_leader", message="group 1: no leader", retry_after_ms=100)))
            assert core._sess is s and not s.lease.is_lost() and not h.lease.is_lost()
            assert s.keepalive_failures == 1 and s.next_keepalive < monotonic() + 5
            core._pending[42] = _Pending("keepalive", sent=monotonic())
            core._event(lockd_pb2.SessionEvent(request_id=42, error=lockd_pb2.Error(
                status=404, code="session_not_found", message="gone")))
            assert core._sess is None and s.lease.lost and h.lease.is_lost()
        finally:
            await _stop(core, s)
        core, s, _, sent = _engine()
        try:
            h = core._hold(s, "one", 7, "me", Mode.EXCLUSIVE, 1, sent, 1, 0, 15_000)
            core.held = {1: h}
            core._renewed(monotonic(), lockd_pb2.KeepAliveResponse(
                ttl_ms=15_000, groups=[not_here(1), not_here(2)]))
            assert core._sess is None and s.lease.lost and h.lease.is_lost()
            assert "no lease" in s.lease.why
        finally:
            await _stop(core, s)

    asyncio.run(main())


def test_the_engine_fires_lost_at_each_locks_own_deadline_while_the_session_goes_on() -> None:
    """Rule 5 with the engine's timer: group 1 cannot answer, group 2 extends. A lock whose
    group-2 move count changed follows deadline_all and fires `lost` when it lapses; a lock in
    group 1 fires at group 1's (later) deadline; the session goes on on group 2's lease. Every
    group answering again restarts deadline_all without reviving either lock; a new grant holds."""
    import asyncio

    from lockd_client._lease import monotonic
    from lockd_client.types import Mode

    async def main() -> None:
        # Opened 11.5 s ago: deadline_all (sent + 15 - 3) is 0.5 s away.
        core, s, reported, sent = _engine(sent_ago=11.5)
        t0 = sent + 11.5
        try:
            leases = s.lease.leases
            core._renewed(sent, lockd_pb2.KeepAliveResponse(ttl_ms=15_000,
                                                            groups=[ext(1), ext(2, 5)]))
            # Group 1 extended a keepalive sent 11 s before t0 (its deadline: t0 + 1) and could
            # not answer the next one, which group 2 extended (at move count 5).
            core._renewed(t0 - 11.0, lockd_pb2.KeepAliveResponse(ttl_ms=15_000,
                                                                 groups=[ext(1), other(2)]))
            core._renewed(monotonic(), lockd_pb2.KeepAliveResponse(ttl_ms=15_000,
                                                                   groups=[other(1), ext(2, 5)]))
            moved = core._hold(s, "moved", 7, "me", Mode.EXCLUSIVE, 1, monotonic(), 2, 5, 15_000)
            one = core._hold(s, "one", 8, "me", Mode.EXCLUSIVE, 1, sent, 1, 0, 15_000)
            core.held = {1: moved, 2: one}
            fired: dict = {}
            moved.lease.watch(lambda: fired.setdefault("moved", monotonic()))
            one.lease.watch(lambda: fired.setdefault("one", monotonic()))
            assert moved.lease.deadline > t0 + 11.0 and abs(one.lease.deadline - (t0 + 1.0)) < 1e-6
            await asyncio.sleep(0.05)  # the engine's timer now sleeps to t0 + 1
            assert not fired
            # Group 2 answers at a higher move count: `moved` follows deadline_all, nearer than
            # the timer's wake-up.
            core._renewed(monotonic(), lockd_pb2.KeepAliveResponse(ttl_ms=15_000,
                                                                   groups=[other(1), ext(2, 6)]))
            assert abs(moved.lease.deadline - (t0 + 0.5)) < 1e-6
            assert moved.lease.deadline == leases.deadline_all
            assert abs(one.lease.deadline - (t0 + 1.0)) < 1e-6
            assert s.lease.deadline > t0 + 11.0, "the session lives on group 2's lease"
            while "one" not in fired and monotonic() < t0 + 3:
                await asyncio.sleep(0.01)
            assert set(fired) == {"moved", "one"}
            # Deadlines are float sums (sent + TTL - margin against t0 + 0.5): within 1 us.
            assert t0 + 0.5 - 1e-6 <= fired["moved"] < t0 + 0.5 + 0.4, fired["moved"] - t0
            assert t0 + 1.0 - 1e-6 <= fired["one"] < t0 + 1.0 + 0.4, fired["one"] - t0
            assert "session-wide" in moved.lease.why and "lock group 1" in one.lease.why
            assert core._sess is s and not s.lease.is_lost()
            await asyncio.sleep(0)
            assert sorted(reported) == ["moved", "one"] and core.lease_expired == 2
            # Every group answers again: deadline_all restarts, neither lock comes back.
            core._renewed(monotonic(), lockd_pb2.KeepAliveResponse(ttl_ms=15_000,
                                                                   groups=[ext(1), ext(2, 6)]))
            assert leases.all_epoch == 1 and leases.deadline_all > monotonic() + 10
            assert moved.lease.is_lost() and one.lease.is_lost()
            assert moved.lease.deadline <= t0 + 0.5 + 1e-6 and one.lease.deadline <= t0 + 1.0 + 1e-6
            new = core._hold(s, "new", 9, "me", Mode.EXCLUSIVE, 1, monotonic(), 2, 6, 15_000)
            assert not new.lease.is_lost() and new.lease.deadline > monotonic() + 10
            assert core.lease_expired == 2
        finally:
            await _stop(core, s)

    asyncio.run(main())


class _StuckCall:
    """A Session call that carries nothing (the test's attach answer comes from the handshake)."""

    def cancel(self) -> bool:
        return True


@pytest.mark.parametrize("stuck", ["handshake", "settle"])
def test_lost_fires_on_time_while_a_reconnect_or_its_settle_is_stuck(stuck: str) -> None:
    """Rule 5 while the stream reconnects: group 1 cannot answer, group 2 keeps the session.
    The attach to the next node hangs (a node that accepts and never answers), or it succeeds
    and the settling after it hangs (its GetSession is never answered): either way a lock in
    group 1 fires `lost` at group 1's deadline, not when the reconnect gives up; the session
    goes on. (The tick used to await the reconnect and the settle inline, and checked no
    deadline meanwhile.)"""
    import asyncio

    from lockd_client._core import Core, _Conn
    from lockd_client._lease import monotonic
    from lockd_client._options import ClientOptions
    from lockd_client.types import Mode

    async def main() -> None:
        core = Core(["127.0.0.1:1"], ClientOptions(ttl=15, use_stream=True, request_timeout=5))
        reported: list = []

        async def report(names: list) -> None:
            reported.extend(names)
        core._report_expired = report  # type: ignore[method-assign]
        core._wake = asyncio.Event()
        never = asyncio.Event()  # what a stuck node's answer waits for
        attaches: list = []

        async def handshake(i: int, first: lockd_pb2.SessionRequest):  # type: ignore[no-untyped-def]
            attaches.append(first.attach)
            sent = monotonic()
            if stuck == "handshake":
                await never.wait()
            conn = _Conn(_StuckCall(), asyncio.Queue(), i)
            return conn, lockd_pb2.SessionEvent(
                request_id=first.request_id, keepalive=lockd_pb2.KeepAliveResponse(
                    ttl_ms=15_000, groups=[other(1), ext(2)])), sent

        async def unary(*args: object, **kwargs: object) -> None:
            await never.wait()
        core._handshake = handshake  # type: ignore[method-assign]
        core.unary = unary  # type: ignore[assignment, method-assign]
        # Opened 11.5 s ago with no stream: the tick reconnects as soon as it runs.
        sent = monotonic() - 11.5
        t0 = sent + 11.5
        s = core._opened(lockd_pb2.OpenSessionResponse(session_id="s", ttl_ms=15_000,
                                                       keepalive_every_ms=10**9), sent, None)
        try:
            core._renewed(sent, lockd_pb2.KeepAliveResponse(ttl_ms=15_000, groups=[ext(1), ext(2)]))
            core._renewed(t0 - 11.0, lockd_pb2.KeepAliveResponse(ttl_ms=15_000,
                                                                 groups=[ext(1), other(2)]))
            core._renewed(monotonic(), lockd_pb2.KeepAliveResponse(ttl_ms=15_000,
                                                                   groups=[other(1), ext(2)]))
            one = core._hold(s, "one", 8, "me", Mode.EXCLUSIVE, 1, sent, 1, 0, 15_000)
            core.held = {1: one}
            # An acquire whose answer the broken stream took: settled after the attach.
            core._unsure = ["maybe"]
            fired: dict = {}
            one.lease.watch(lambda: fired.setdefault("one", monotonic()))
            assert abs(one.lease.deadline - (t0 + 1.0)) < 1e-6
            assert s.lease.deadline > t0 + 11.0, "the session lives on group 2's lease"
            while "one" not in fired and monotonic() < t0 + 4:
                await asyncio.sleep(0.01)
            assert attaches == ["s"], attaches
            assert "one" in fired, "lost did not fire while the reconnect was stuck"
            assert t0 + 1.0 - 1e-6 <= fired["one"] < t0 + 1.0 + 0.4, fired["one"] - t0
            assert "lock group 1" in one.lease.why
            assert core._sess is s and not s.lease.is_lost(), "the session goes on"
            if stuck == "settle":
                assert core._conn is not None and core._settling == 1, "the settle still hangs"
            else:
                assert core._conn is None, "the attach still hangs"
            await asyncio.sleep(0)
            assert reported == ["one"]
        finally:
            await _stop(core, s)

    asyncio.run(main())


# ----- pushes: which waiting acquire a pushed outcome answers (the rules of _pushes.py) -----

from lockd_client._pushes import Answer, Orphan, Pushes, settle  # noqa: E402


def _granted(waiter: int, name: str, token: int) -> lockd_pb2.SessionEvent:
    return lockd_pb2.SessionEvent(granted=lockd_pb2.Granted(
        group=1, waiter=waiter, name=name, fencing_token=token))


def _ended(waiter: int, name: str) -> lockd_pb2.SessionEvent:
    return lockd_pb2.SessionEvent(wait_ended=lockd_pb2.WaitEnded(
        group=1, waiter=waiter, name=name, reason="timed_out"))


def _none(_: str) -> bool:
    return False


def _all(_: str) -> bool:
    return True


def test_a_push_answers_its_queued_wait_once() -> None:
    p: Pushes[str] = Pushes()
    assert p.queued((1, 7), "a") is None
    got = p.pushed(_granted(7, "x", 42), _none)
    assert isinstance(got, Answer) and got.acq == "a"
    # The same outcome pushed again (a relay and the local replica) is no orphan.
    assert p.pushed(_granted(7, "x", 42), _none) is None


def test_a_push_before_its_queued_reply_waits_for_it() -> None:
    p: Pushes[str] = Pushes()
    assert p.pushed(_granted(7, "x", 42), _all) is None
    got = p.queued((1, 7), "a")
    assert got is not None and got.acq == "a" and got.event.granted.fencing_token == 42
    assert p.unclaimed("x", _none) == []


def test_a_grant_nobody_waits_for_is_an_orphan_once() -> None:
    p: Pushes[str] = Pushes()
    assert p.pushed(_granted(9, "x", 50), _none) == Orphan("x", 50)
    assert p.pushed(_granted(9, "x", 50), _none) is None
    assert p.pushed(_ended(10, "x"), _none) is None


def test_a_kept_grant_that_no_reply_claims_is_an_orphan() -> None:
    p: Pushes[str] = Pushes()
    assert p.pushed(_granted(9, "x", 50), _all) is None
    assert p.queued((1, 11), "b") is None
    assert p.unclaimed("x", _all) == []
    assert p.unclaimed("x", _none) == [Orphan("x", 50)]
    got = p.pushed(_granted(11, "x", 51), _none)
    assert isinstance(got, Answer) and got.acq == "b"


def test_a_strays_retry_adopts_its_queued_wait() -> None:
    p: Pushes[str] = Pushes()
    assert p.queued((1, 7), "first") is None
    assert p.broke() == ["first"]
    p.stray("x", "me", 1.0)
    assert p.refused_waiting("x", "other", "o") == (False, None)
    assert p.refused_waiting("x", "me", "retry") == (True, None)
    got = p.pushed(_granted(7, "x", 42), _none)
    assert isinstance(got, Answer) and got.acq == "retry"
    assert p.is_stray("x", "me")
    p.settled("x", "me")
    assert not p.is_stray("x", "me")
    assert p.refused_waiting("x", "me", "again") == (False, None)


def test_a_stray_keeps_its_first_attempts_send_time() -> None:
    p: Pushes[str] = Pushes()
    p.stray("x", "me", 1.0)
    p.stray("x", "me", 2.0)
    assert p.stray_since("x", "me") == 1.0
    assert p.stray_since("x", "other") is None


def test_a_strays_grant_pushed_before_the_refusal_answers_the_retry() -> None:
    p: Pushes[str] = Pushes()
    p.stray("x", "me", 1.0)
    assert p.pushed(_granted(7, "x", 42), _all) is None
    adopted, got = p.refused_waiting("x", "me", "retry")
    assert adopted and got is not None and got.acq == "retry"
    assert got.event.granted.fencing_token == 42


def test_a_kept_grant_goes_to_an_adopter_before_it_is_called_an_orphan() -> None:
    p: Pushes[str] = Pushes()
    p.stray("x", "me", 1.0)
    assert p.refused_waiting("x", "me", "retry") == (True, None)
    assert p.pushed(_granted(7, "x", 42), _all) is None
    out = p.unclaimed("x", _none)
    assert len(out) == 1 and isinstance(out[0], Answer) and out[0].acq == "retry"


def test_adopters_that_waited_too_long_are_handed_back() -> None:
    p: Pushes[str] = Pushes()
    p.stray("x", "me", 1.0)
    p.stray("y", "me", 1.0)
    assert p.refused_waiting("x", "me", "ax") == (True, None)
    assert p.refused_waiting("y", "me", "ay") == (True, None)
    assert p.give_up_adopters(lambda a: a == "ax") == ["ax"]
    assert p.give_up_adopters(lambda a: a == "ax") == []
    got = p.pushed(_granted(7, "y", 42), _none)
    assert isinstance(got, Answer) and got.acq == "ay"


def test_settling_gives_back_only_holds_no_lock_and_no_open_acquire_can_claim() -> None:
    listed = [("x", 10), ("x", 11), ("y", 20), ("z", 30), ("w", 40)]
    # A lock object holds x's 11; an acquire of z is still open (30 may be its grant).
    back, later = settle(["x", "x", "y", "z"], listed, lambda n, t: (n, t) == ("x", 11),
                         lambda n: n == "z")
    assert back == [("x", 10), ("y", 20)]
    assert later == ["z"]


def test_a_queued_wait_or_an_adopter_keeps_its_name_open() -> None:
    p: Pushes[str] = Pushes()
    assert not p.waiting(lambda a: a.startswith("x"))
    assert p.queued((1, 7), "x-wait") is None
    assert p.waiting(lambda a: a.startswith("x"))
    p.stray("y", "me", 1.0)
    assert p.refused_waiting("y", "me", "y-adopter") == (True, None)
    assert p.waiting(lambda a: a.startswith("y"))
    assert not p.waiting(lambda a: a.startswith("z"))


def test_the_end_of_a_session_hands_back_waits_and_adopters() -> None:
    p: Pushes[str] = Pushes()
    assert p.queued((1, 7), "w") is None
    p.stray("x", "me", 1.0)
    assert p.refused_waiting("x", "me", "adopter") == (True, None)
    assert sorted(p.end()) == ["adopter", "w"]
    assert p.refused_waiting("x", "me", "z") == (False, None)


def test_a_client_whose_endpoint_has_nothing_listening_fails_fast_and_quietly() -> None:
    """A wrong endpoint (nothing listens) raises Unavailable within connect_timeout (5 s by
    default), not after every retry of every call, and grpc-core prints nothing."""
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (
        "import lockd_client\n"
        f"c = lockd_client.Client(['127.0.0.1:{port}'])\n"
        "try:\n"
        "    c.lock('x')\n"
        "except lockd_client.errors.Unavailable as e:\n"
        "    print('unavailable', e.exhausted)\n"
    )
    t = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t
    assert out.stdout.strip() == "unavailable True", (out.stdout, out.stderr)
    assert out.stderr == "", out.stderr
    assert took < 5.0 + 2.0, f"took {took:.1f} s (the interpreter's start included)"
