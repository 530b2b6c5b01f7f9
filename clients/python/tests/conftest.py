"""Fixtures: a real 3-node ``lockd dev`` cluster (LOCKD_BIN) and a real PostgreSQL (LOCKD_CHECK_PG).

Every process a fixture starts is stopped by its PID (the dev supervisor with SIGTERM, then any
node it left behind with SIGKILL); every wait is bounded. With ``CI`` set, a missing
prerequisite fails the run instead of skipping.
"""
from __future__ import annotations

import os
import pathlib
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from typing import Dict, Iterator, List, Optional

import pytest

from lockd_client import Client

REPO = pathlib.Path(__file__).resolve().parents[3]
SECURE_TOKEN = "py-test-namespace-secret"
CONFIG = f"""
[[namespace]]
name = "secure"
prefix = "secure/"
token = "{SECURE_TOKEN}"

[[namespace]]
name = "solo"
prefix = "solo/"
max_sessions = 1
"""


def missing(what: str) -> None:
    """Skips the test locally; fails it under CI (a prerequisite must not vanish in silence)."""
    if os.environ.get("CI"):
        pytest.fail(f"missing prerequisite under CI: {what}")
    pytest.skip(f"missing prerequisite: {what}")


def lockd_bin() -> str:
    p = os.environ.get("LOCKD_BIN") or str(REPO / "target" / "debug" / "lockd")
    if not os.access(p, os.X_OK):
        missing(f"lockd binary {p} (build it: cargo build -p lockd-server --bin lockd, or set LOCKD_BIN)")
    return p


def wait_until(cond, timeout: float, what: str, every: float = 0.05):  # type: ignore[no-untyped-def]
    """Polls ``cond`` until it returns a truthy value, at most ``timeout`` seconds."""
    end = time.monotonic() + timeout
    last_err: Optional[BaseException] = None
    while time.monotonic() < end:
        try:
            v = cond()
            if v:
                return v
        except Exception as e:  # the cluster may still be electing
            last_err = e
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last_err!r})")


def proc_state(pid: int) -> str:
    """The state letter of /proc/PID/stat (R, S, T for stopped, Z...)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


class Cluster:
    """``lockd dev --nodes 3`` on consecutive ports from (http, grpc, peer)."""

    def __init__(self, http: int, grpc: int, peer: int, nodes: int = 3, tls: bool = False) -> None:
        self.ports = (http, grpc, peer)
        self.n = nodes
        self.tls = tls
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="lockd-py-"))
        self.endpoints = [f"127.0.0.1:{grpc + i}" for i in range(nodes)]
        self.node_pids: Dict[int, int] = {}
        self.lines: List[str] = []
        self.proc: Optional[subprocess.Popen[str]] = None

    def start(self) -> "Cluster":
        binary = lockd_bin()
        cfg = self.dir / "ns.toml"
        cfg.write_text(CONFIG)
        http, grpc, peer = self.ports
        self.proc = subprocess.Popen(
            [binary, "dev", "--nodes", str(self.n), "--http", f"127.0.0.1:{http}",
             "--grpc", f"127.0.0.1:{grpc}", "--peer", f"127.0.0.1:{peer}",
             "--data-dir", str(self.dir / "data"), "--config", str(cfg)]
            + (["--tls"] if self.tls else []),
            stdout=subprocess.PIPE, stderr=open(self.dir / "stderr.log", "w"), text=True)
        threading.Thread(target=self._read, daemon=True).start()
        wait_until(lambda: len(self.node_pids) == self.n, 20, "the dev nodes to start")
        self.wait_healthy()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            m = re.match(r"node (\d+) pid (\d+) ", line)
            if m:
                self.node_pids[int(m.group(1))] = int(m.group(2))

    def wait_healthy(self, timeout: float = 40) -> None:
        """Every live node answers and every group has a leader that sits where leader balance
        puts it, so tests start from a settled cluster."""
        live = [i for i in range(self.n) if self.alive(i + 1)]
        c = Client([self.endpoints[i] for i in live], request_timeout=1.0,
                   ca_file=str(self.ca_file()) if self.tls else None)
        try:
            def settled() -> bool:
                for i in live:
                    st = c._run(c._core.status_of(c._core.endpoints.index(self.endpoints[i])))
                    if not st.serving_names:  # its meta replica has not caught up yet
                        return False
                    for g in st.groups:
                        if g.leader == 0:
                            return False
                        if len(live) == self.n and g.preferred_leader and g.leader != g.preferred_leader:
                            return False
                return True
            wait_until(settled, timeout, "every group to have its leader", every=0.2)
        finally:
            c.close()

    def alive(self, node: int) -> bool:
        pid = self.node_pids.get(node)
        if pid is None:
            return False
        try:
            return proc_state(pid) not in ("Z", "X")
        except FileNotFoundError:
            return False

    def endpoint_of(self, node: int) -> str:
        return self.endpoints[node - 1]

    def ca_file(self) -> pathlib.Path:
        """The throwaway CA of ``lockd dev --tls``."""
        return self.dir / "data" / "tls" / "ca.pem"

    def admin_token(self) -> str:
        return (self.dir / "data" / "admin-token").read_text().strip()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        for pid in self.node_pids.values():  # anything the supervisor left behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    c = Cluster(18070, 18170, 18270)
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture()
def fresh_cluster() -> Iterator[Cluster]:
    """A cluster of its own, for a test that kills nodes."""
    c = Cluster(18080, 18180, 18280)
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture()
def client(cluster: Cluster) -> Iterator[Client]:
    c = Client(cluster.endpoints, ttl=6)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="session")
def pg_conninfo() -> str:
    dsn = os.environ.get("LOCKD_CHECK_PG")
    if not dsn:
        missing("PostgreSQL: set LOCKD_CHECK_PG (scripts/ci-postgres.sh prints one)")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        missing("psycopg (pip install 'lockd-client[test]')")
    return dsn  # type: ignore[return-value]


_names = iter(range(10**9))


@pytest.fixture()
def name(request: pytest.FixtureRequest) -> str:
    """A lock name no other test uses."""
    return f"pytest/{request.node.name}/{os.getpid()}-{next(_names)}"
