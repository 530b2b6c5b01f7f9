"""The session stream, driven by stubs generated from proto/lockd/v1/lockd.proto alone.

A client written in another language sees only the .proto file. This script generates Python
stubs from it with grpcio-tools into a temporary directory (not the Python client's committed
stubs) and runs the stream scenario docs/API.md describes, asserting every event:

  A opens a session and acquires; B opens a session and queues behind A; A releases; B is
  pushed `granted` with a larger fencing token; both close, each stream answering `closed`,
  then one `session_ended` (reason "closed"), then ending.

Usage: stream_scenario.py PROTO_ROOT GRPC_ADDR
"""

import queue
import sys
import tempfile
import threading
from pathlib import Path

import grpc
from grpc_tools import protoc

TIMEOUT_S = 10.0


def generate(proto_root: Path, out: Path) -> None:
    include = Path(protoc.__file__).parent / "_proto"
    rc = protoc.main([
        "grpc_tools.protoc",
        f"-I{proto_root}",
        f"-I{include}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        "lockd/v1/lockd.proto",
    ])
    if rc != 0:
        sys.exit(f"stream_scenario: protoc failed ({rc})")


class Stream:
    """One Session stream: requests go in through a queue, events come out through another."""

    def __init__(self, pb, stub, name: str) -> None:
        self.pb, self.name, self.next_id = pb, name, 0
        self.up: "queue.Queue" = queue.Queue()
        self.down: "queue.Queue" = queue.Queue()
        self.call = stub.Session(iter(self.up.get, None))
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for ev in self.call:
                self.down.put(ev)
        except grpc.RpcError as e:
            self.down.put(e)
        self.down.put(None)  # the stream ended

    def send(self, **kind) -> int:
        self.next_id += 1
        self.up.put(self.pb.SessionRequest(request_id=self.next_id, **kind))
        return self.next_id

    def event(self, what: str):
        ev = self.down.get(timeout=TIMEOUT_S)
        if ev is None or isinstance(ev, grpc.RpcError):
            sys.exit(f"stream_scenario: {self.name}: the stream ended ({ev}) waiting for {what}")
        got = ev.WhichOneof("kind")
        if got != what:
            sys.exit(f"stream_scenario: {self.name}: expected `{what}`, got `{got}`: {ev}")
        return ev

    def ended(self) -> None:
        ev = self.down.get(timeout=TIMEOUT_S)
        if ev is not None:
            sys.exit(f"stream_scenario: {self.name}: expected the stream to end, got {ev}")
        self.up.put(None)


def check(cond: bool, what: str) -> None:
    if not cond:
        sys.exit(f"stream_scenario: {what}")


def main() -> None:
    proto_root, addr = Path(sys.argv[1]), sys.argv[2]
    with tempfile.TemporaryDirectory() as out:
        generate(proto_root, Path(out))
        sys.path.insert(0, out)
        from lockd.v1 import lockd_pb2 as pb  # noqa: E402 (generated just now)
        from lockd.v1 import lockd_pb2_grpc as pb_grpc  # noqa: E402

        channel = grpc.insecure_channel(addr)
        stub = pb_grpc.LockStub(channel)
        name = f"contract/stream-{threading.get_ident()}"
        a, b = Stream(pb, stub, "A"), Stream(pb, stub, "B")

        rid = a.send(open=pb.OpenSessionRequest(client="contract-a", ttl_ms=10_000))
        opened = a.event("opened")
        check(opened.request_id == rid and opened.opened.session_id.startswith("s_"), f"{opened}")
        rid = a.send(acquire=pb.AcquireRequest(name=name, owner="a", mode=pb.MODE_EXCLUSIVE))
        got = a.event("acquired")
        check(got.request_id == rid and got.acquired.acquired, f"A's acquire: {got}")
        token_a = got.acquired.fencing_token
        check(token_a > 0, f"A's token: {got}")

        b.send(open=pb.OpenSessionRequest(client="contract-b", ttl_ms=10_000))
        b.event("opened")
        rid = b.send(acquire=pb.AcquireRequest(
            name=name, owner="b", mode=pb.MODE_EXCLUSIVE, wait_ms=8_000))
        q = b.event("queued")
        check(q.request_id == rid and q.queued.name == name and q.queued.position == 1, f"{q}")

        # A session id on the stream other than the stream's own is refused, never acted on.
        rid = a.send(release=pb.ReleaseRequest(
            session_id="s_00000000000000ff", name=name, fencing_token=token_a))
        err = a.event("error")
        check(err.request_id == rid and err.error.code == "invalid_argument", f"{err}")

        rid = a.send(release=pb.ReleaseRequest(name=name, fencing_token=token_a))
        rel = a.event("released")
        check(rel.request_id == rid and rel.released.remaining == 0, f"{rel}")

        granted = b.event("granted")
        check(granted.request_id == 0 and granted.granted.waiter == q.queued.waiter, f"{granted}")
        check(granted.granted.fencing_token > token_a,
              f"B's token {granted.granted.fencing_token} is not above A's {token_a}")

        for s in (a, b):
            rid = s.send(close=pb.CloseSessionRequest())
            closed = s.event("closed")
            check(closed.request_id == rid, f"{closed}")
            ended = s.event("session_ended")
            check(ended.session_ended.reason == "closed" and ended.session_ended.group == 0,
                  f"{ended}")
            s.ended()
        channel.close()
        print(f"stream_scenario: ok (tokens {token_a} then {granted.granted.fencing_token})")


if __name__ == "__main__":
    main()
