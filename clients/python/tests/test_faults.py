"""Faults against a real lockd: a leader SIGKILLed under a held lock, and a worker process
SIGSTOPped past its TTL whose fenced PostgreSQL write is refused while the next holder's is
accepted."""
from __future__ import annotations

import json
import os
import pathlib
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Dict

import pytest

from lockd_client import Client, fencing

from conftest import Cluster, proc_state, wait_until

HERE = pathlib.Path(__file__).resolve().parent


def test_a_retry_after_a_broken_stream_takes_the_wait_it_queued(fresh_cluster: Cluster,
                                                                 name: str) -> None:
    """SIGKILL the node that carries a waiting client's session stream (a follower of the
    name's group, so the group keeps its leader): the wait lives on in the group, the acquire's
    retry on the moved stream is refused ``already_waiting`` by its own first attempt and adopts
    that wait, and the grant pushed later answers it."""
    cl = fresh_cluster
    ttl = 6.0
    with Client(cl.endpoints, ttl=ttl) as holder:
        held = holder.lock(name)
        group = holder.get_session().held[0].group
        leader = {g.id: g.leader for g in holder.status().groups}[group]
        follower = next(n for n in sorted(cl.node_pids) if n != leader)
        ep = cl.endpoint_of(follower)
        with Client([ep, *[e for e in cl.endpoints if e != ep]], ttl=ttl) as w:
            got: Dict[str, Any] = {}

            def wait() -> None:
                try:
                    got["lock"] = w.lock(name, wait=30)
                except Exception as e:  # noqa: BLE001 - reported by the assertion below
                    got["error"] = e

            t = threading.Thread(target=wait, daemon=True)
            t.start()
            wait_until(lambda: len(holder.inspect(name).waiters) == 1, 10, "the wait queued")
            os.kill(cl.node_pids[follower], signal.SIGKILL)
            time.sleep(2)
            assert len(holder.inspect(name).waiters) == 1, "one wait, not two"
            held.release()
            t.join(20)
            assert "lock" in got, f"the retry did not take its wait: {got.get('error')!r}"
            lk = got["lock"]
            assert [h.token for h in holder.inspect(name).holders] == [lk.token]
            assert lk.release() == 0


# scenario: leader-kill
def test_leader_sigkill_keeps_the_lock(fresh_cluster: Cluster, name: str) -> None:
    """SIGKILL the leader of the lock's group while the client's session stream is on that very
    node: the stream moves to another node and re-attaches, keepalives go on, the lock keeps its
    token (the new leader confirms it), and `lost` is never set."""
    cl = fresh_cluster
    ttl = 6.0
    # Which group holds the name, and which node leads it.
    with Client(cl.endpoints, ttl=ttl) as probe:
        with probe.lock(name):
            group = probe.get_session().held[0].group
        leader = {g.id: g.leader for g in probe.status().groups}[group]
    assert leader, "the group has a leader"
    leader_ep = cl.endpoint_of(leader)
    others = [e for e in cl.endpoints if e != leader_ep]
    with Client([leader_ep, *others], ttl=ttl) as c:
        lk = c.lock(name, wait=5)
        assert c.endpoint == leader_ep
        time.sleep(0.5)
        killed_at = time.monotonic()
        os.kill(cl.node_pids[leader], signal.SIGKILL)
        # A keepalive sent after the kill was acknowledged: the deadline moved past what the
        # last pre-kill renewal could give.
        wait_until(lambda: lk.deadline > killed_at + ttl - ttl / 5 + 0.05, ttl,
                   "a renewal acknowledged after the leader's death", every=0.05)
        assert not lk.lost.is_set(), "the lock must survive the failover"
        assert c.endpoint != leader_ep, "the session stream moved to another node"
        st = wait_until(lambda: c.inspect(name), 10, "the new leader to answer")
        assert [h.token for h in st.holders] == [lk.token], "same holder, same token"
        new_leader = {g.id: g.leader for g in c.status().groups}[group]
        assert new_leader not in (0, leader)
        # Keep holding through two more keepalive intervals on the new leader.
        time.sleep(2 * ttl / 3)
        assert not lk.lost.is_set() and c.lease_expired_count == 0
        assert lk.release() == 0  # the service accepts the release with the same token
    with Client(others, ttl=ttl) as after:
        with after.lock(name, wait=5) as lk2:
            assert lk2.token > lk.token


def read_json(p: "subprocess.Popen[str]", timeout: float) -> Dict[str, Any]:
    assert p.stdout is not None
    ready, _, _ = select.select([p.stdout], [], [], timeout)
    if not ready:
        raise AssertionError(f"the worker said nothing in {timeout}s")
    line = p.stdout.readline()
    if not line:
        raise AssertionError(f"the worker exited ({p.wait(5)}) without a line")
    out: Dict[str, Any] = json.loads(line)
    return out


# scenario: pause-fenced
def test_sigstopped_worker_is_fenced_out(cluster: Cluster, pg_conninfo: str, name: str) -> None:
    import psycopg

    ttl = 5.0
    table = f"lockd_py_test_{os.getpid()}"
    key = "payouts/m-1"
    with psycopg.connect(pg_conninfo, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        fencing.create_table(conn, table)
    worker = subprocess.Popen(
        [sys.executable, str(HERE / "worker.py"), ",".join(cluster.endpoints), name, str(ttl),
         pg_conninfo, table, key],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    stopped = False
    try:
        first = read_json(worker, 20)
        assert first["step"] == "acquired"
        os.kill(worker.pid, signal.SIGSTOP)
        stopped = True
        wait_until(lambda: proc_state(worker.pid) == "T", 5, "the worker to be stopped")
        paused_at = time.monotonic()
        with Client(cluster.endpoints, ttl=ttl) as c:
            # The worker's session expires on the service (no keepalives from a stopped
            # process); the lock goes to us, the next waiter.
            lk = c.lock(name, wait=4 * ttl)
            waited = time.monotonic() - paused_at
            assert lk.token > first["token"]
            assert waited >= ttl - 1.5, f"granted {waited:.1f}s into the pause: before the TTL?"
            with psycopg.connect(pg_conninfo, autocommit=True) as conn:
                fencing.write(conn, lk, key, "next-holder", table=table)  # accepted
            assert proc_state(worker.pid) == "T", "the worker stayed stopped throughout"
            os.kill(worker.pid, signal.SIGCONT)
            stopped = False
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
            res = read_json(worker, 20)
            assert res["step"] == "resumed"
            assert res["lost"] is True, "lost is set at the local deadline, before the server expiry"
            assert res["guarded"] == "lost", "the guarded write refuses locally once lost"
            assert res["raw_accepted"] is False, "the store refuses the stale token"
            assert res["lease_expired"] >= 1
            with psycopg.connect(pg_conninfo, autocommit=True) as conn:
                row = conn.execute(f"SELECT value, fence FROM {table} WHERE key = %s", (key,)).fetchone()
            assert row == ("next-holder", lk.token)
            lk.release()
        assert worker.wait(15) == 0
    finally:
        if worker.poll() is None:
            if stopped:
                os.kill(worker.pid, signal.SIGCONT)
            worker.kill()
            worker.wait(5)
        with psycopg.connect(pg_conninfo, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")


# scenario: lost-before-expiry
@pytest.mark.parametrize("mode", ["stream", "unary"])
def test_lost_fires_before_the_server_expires_the_session(cluster: Cluster, name: str, mode: str) -> None:
    """In-process view of the same rule: stop renewals (pause the client's engine thread by
    holding its loop) and `lost` reports at last-ack + TTL - margin, while the service still
    shows the hold."""
    # A wide margin (2.5 s of the 5 s TTL) leaves the check below seconds before the service
    # may expire the session, even on a slow machine.
    ttl = 5.0
    with Client(cluster.endpoints, ttl=ttl, margin=2.5, use_stream=(mode == "stream")) as c:
        lk = c.lock(name)
        deadline = lk.deadline
        # Block the engine's loop so no keepalive is sent (what a GC pause or a stuck thread does).
        c._loop.call_soon_threadsafe(time.sleep, deadline - time.monotonic() + 0.3)
        assert lk.lost.wait(ttl + 2)
        fired = time.monotonic()
        assert fired >= deadline - 0.05 and fired - deadline < 0.5
        # The service has not expired the session yet: the local deadline comes first.
        with Client(cluster.endpoints, ttl=ttl) as other:
            assert [h.token for h in other.inspect(name).holders] == [lk.token]
            assert time.monotonic() < deadline + 2.5, "the check came after the margin"


def test_leaving_a_with_block_after_the_cluster_stopped_takes_at_most_the_lease(
        fresh_cluster: Cluster, name: str) -> None:
    """Every node stops answering (SIGSTOP) while a lock is held: leaving the ``with`` block
    retries the release only until the lock's lease ends (then raises LockLost: the work may
    have overlapped the next holder's), rather than every retry of every attempt."""
    from lockd_client.errors import LockLost

    cl = fresh_cluster
    ttl = 5.0
    c = Client(cl.endpoints, ttl=ttl)
    try:
        started = None
        with pytest.raises(LockLost):
            with c.lock(name):
                for pid in cl.node_pids.values():
                    os.kill(pid, signal.SIGSTOP)
                started = time.monotonic()
        took = time.monotonic() - (started or 0)
        # The lease ends at most ttl - margin after the last keepalive; one request_timeout
        # (2 s) more at most, and slack for a busy machine.
        assert took < ttl + 2.0 + 2.0, f"leaving the block took {took:.1f} s"
    finally:
        for pid in cl.node_pids.values():
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        c.close()
