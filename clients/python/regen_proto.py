#!/usr/bin/env python3
"""Regenerates the committed protobuf stubs of the Python client from proto/lockd/v1/lockd.proto.

    python clients/python/regen_proto.py           # rewrite src/lockd_client/_proto/lockd_pb2.py{,i}
    python clients/python/regen_proto.py --check   # exit 1 if the committed stubs are out of date

The stubs are committed rather than generated at install time so that `pip install
./clients/python` needs neither grpcio-tools nor the repository's proto/ directory (a wheel or
sdist built from clients/python cannot reach ../../proto). They are generated with a pinned
grpcio-tools (GRPCIO_TOOLS below) whose protobuf gencode (6.31.1) loads on every protobuf
runtime from 6.31.1 on, including 7.x, so the package can require `protobuf>=6.31.1,<8` and still
install on Python 3.9. Only the message modules are generated: the gRPC method stubs are
written by hand in `_rpc.py` (typed, and free of the generated grpc module's version check).

Needs `pip install grpcio-tools==GRPCIO_TOOLS` in the interpreter that runs it.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

GRPCIO_TOOLS = "1.75.1"
HERE = pathlib.Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
PROTO = "lockd/v1/lockd.proto"
OUT = HERE / "src" / "lockd_client" / "_proto"
FILES = ("lockd_pb2.py", "lockd_pb2.pyi")


def generate(into: pathlib.Path) -> None:
    from grpc_tools import protoc  # type: ignore[import-untyped]
    import grpc_tools

    version = getattr(grpc_tools, "__version__", None)
    if version is None:
        from importlib.metadata import version as dist_version

        version = dist_version("grpcio-tools")
    if version != GRPCIO_TOOLS:
        sys.exit(f"regen_proto: grpcio-tools must be {GRPCIO_TOOLS} (found {version}); "
                 f"pip install grpcio-tools=={GRPCIO_TOOLS}")
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    rc = protoc.main([
        "protoc", f"-I{PROTO_ROOT}", f"-I{include}",
        f"--python_out={into}", f"--pyi_out={into}", str(PROTO_ROOT / PROTO),
    ])
    if rc != 0:
        sys.exit(f"regen_proto: protoc failed with {rc}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="fail if the committed stubs differ")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        generate(pathlib.Path(tmp))
        stale = []
        for name in FILES:
            new = (pathlib.Path(tmp) / "lockd" / "v1" / name).read_bytes()
            old_path = OUT / name
            if args.check:
                if not old_path.exists() or old_path.read_bytes() != new:
                    stale.append(name)
            else:
                old_path.write_bytes(new)
        if stale:
            print(f"regen_proto: stale stubs {stale}; run python clients/python/regen_proto.py",
                  file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
