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
