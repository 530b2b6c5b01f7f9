"""Locks against a real 3-node lockd: FIFO hand-off, modes, re-entry, acquire_all, tokens,
bearer tokens, waits in rounds, unary fallback, the asyncio API."""
from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import List, Tuple

import pytest

import lockd_client
from lockd_client import (AsyncClient, Client, Conflict, InvalidArgument, LockLost, Mode,
                          NotAcquired, PermissionDenied, ResourceExhausted, Unauthenticated)
from lockd_client import _core

from conftest import SECURE_TOKEN, Cluster, wait_until


# scenario: try-lock
def test_try_lock_names_the_holder_and_tokens_grow(cluster: Cluster, client: Client, name: str) -> None:
    with client.lock(name, owner="first") as lk:
        assert lk.token > 0 and not lk.lost.is_set() and lk.reentry == 1
        with Client(cluster.endpoints, ttl=6) as other:
            with pytest.raises(NotAcquired) as e:
                other.lock(name)
            assert e.value.holder == "first" and not e.value.retryable
            st = other.inspect(name)
            assert [(h.owner, h.token) for h in st.holders] == [("first", lk.token)]
        first = lk.token
    with client.lock(name) as lk2:
        assert lk2.token > first
        # CheckToken: the holder's token is valid, the previous holder's is not.
        assert client.check_token(name, lk2.token) == (True, lk2.token)
        assert client.check_token(name, first) == (False, lk2.token)
    assert client.check_token(name, lk2.token) == (False, 0)


# scenario: fifo-wait
def test_fifo_hand_off_between_waiters(cluster: Cluster, client: Client, name: str) -> None:
    """Three waiters queue one after another; each release hands the lock to the next in
    arrival order, with a larger token each time."""
    holder = client.lock(name, owner="holder")
    waiters = [Client(cluster.endpoints, ttl=6) for _ in range(3)]
    grants: List[Tuple[str, int]] = []
    held: List[lockd_client.Lock] = []
    mu = threading.Lock()
    ready = [threading.Event() for _ in waiters]

    def wait_for_it(i: int) -> None:
        lk = waiters[i].lock(name, wait=30, owner=f"w{i}")
        with mu:
            grants.append((lk.owner, lk.token))
            held.append(lk)
        ready[i].set()

    threads = []
    try:
        for i in range(3):
            t = threading.Thread(target=wait_for_it, args=(i,), daemon=True)
            t.start()
            threads.append(t)
            # Start the next waiter only once this one is in the queue: the order is defined.
            wait_until(lambda: len(client.inspect(name).waiters) == i + 1, 10, f"w{i} to queue")
        assert [w.owner for w in client.inspect(name).waiters] == ["w0", "w1", "w2"]
        holder.release()
        for i in range(3):
            assert ready[i].wait(10), f"w{i} was not granted"
            assert not any(r.is_set() for r in ready[i + 1:]), "a later waiter overtook"
            with mu:
                lk = held[-1]
            assert lk.owner == f"w{i}"
            time.sleep(0.2)  # let a wrong grant show itself before handing on
            assert not any(r.is_set() for r in ready[i + 1:])
            lk.release()
        assert [g[0] for g in grants] == ["w0", "w1", "w2"]
        tokens = [holder.token] + [g[1] for g in grants]
        assert tokens == sorted(tokens) and len(set(tokens)) == 4
    finally:
        for t in threads:
            t.join(10)
        for w in waiters:
            w.close()


# scenario: modes
def test_shared_and_semaphore_modes(cluster: Cluster, client: Client, name: str) -> None:
    with Client(cluster.endpoints, ttl=6) as other:
        a = client.lock(name, mode="shared")
        b = other.lock(name, mode=Mode.SHARED)
        assert a.mode is Mode.SHARED and b.token != 0
        with pytest.raises(NotAcquired):
            other.lock(name, owner="writer", mode="exclusive")
        a.release()
        b.release()

        sem = name + "/sem"
        s1 = client.lock(sem, mode="semaphore", limit=2)
        s2 = other.lock(sem, mode="semaphore", limit=2)
        assert s1.token != s2.token
        with Client(cluster.endpoints, ttl=6) as third:
            with pytest.raises(NotAcquired):
                third.lock(sem, mode="semaphore", limit=2)
            with pytest.raises(Conflict) as e:  # every user of a name must use the same limit
                third.lock(sem, mode="semaphore", limit=3)
            assert e.value.code == "mode_conflict" and e.value.status == 409
        s1.release()
        s2.release()
    with pytest.raises(InvalidArgument, match="limit must lie in 1..=10000"):
        client.lock(sem, mode="semaphore")
    with pytest.raises(InvalidArgument, match="limit is only for mode=semaphore"):
        client.lock(sem, limit=2)


# scenario: reentrant
def test_reentrant_holds_share_a_token(client: Client, name: str) -> None:
    a = client.lock(name, reentrant=True)
    b = client.lock(name, reentrant=True)
    assert (a.token, b.reentry) == (b.token, 2)
    with pytest.raises(Conflict) as e:
        client.lock(name)  # same session and owner without reentrant
    assert e.value.code == "already_held" and not e.value.retryable
    assert b.release() == 1
    assert client.inspect(name).holders[0].reentry == 1
    assert a.release() == 0
    assert client.inspect(name).holders == ()


# scenario: acquire-all
def test_acquire_all_sorted_with_one_deadline(cluster: Cluster, client: Client, name: str) -> None:
    names = [name + "/c", name + "/a", name + "/b", name + "/a"]
    with client.acquire_all(names, wait=5) as ls:
        assert [lk.name for lk in ls.locks] == sorted(set(names))
        assert set(ls.tokens) == set(names)
    with Client(cluster.endpoints, ttl=6) as other:
        blocker = other.lock(name + "/b")
        t0 = time.monotonic()
        with pytest.raises(NotAcquired):
            client.acquire_all(names, wait=1.5)
        took = time.monotonic() - t0
        assert 1.0 <= took < 4.0, f"one overall deadline of 1.5 s, took {took:.2f}s"
        assert other.inspect(name + "/a").holders == (), "a name taken before the failure was released"
        blocker.release()


# scenario: bearer-token
def test_bearer_token_is_sent_on_every_call(cluster: Cluster, name: str) -> None:
    secure = "secure/" + name
    # A default-namespace session may not take another namespace's names, whatever the token.
    with Client(cluster.endpoints, ttl=6, token=SECURE_TOKEN) as c:
        with pytest.raises(PermissionDenied) as e:
            c.lock(secure)
        assert e.value.code == "wrong_namespace" and e.value.status == 403
    with Client(cluster.endpoints, ttl=6, namespace="secure") as c:
        with pytest.raises(Unauthenticated) as e2:
            c.lock(secure)
        assert e2.value.status == 401 and not e2.value.retryable
    with Client(cluster.endpoints, ttl=6, namespace="secure", token="not-the-token") as c:
        with pytest.raises(Unauthenticated, match="not valid for namespace 'secure'"):
            c.lock(secure)
    with Client(cluster.endpoints, ttl=6, namespace="secure", token=SECURE_TOKEN) as c:
        with c.lock(secure, wait=2) as lk:
            assert c.inspect(secure).holders[0].token == lk.token
            assert c.get_session().held[0].name == secure  # GetSession needs the token too
            time.sleep(2.5)  # keepalives (stream, with the authorization metadata) keep it
            assert not lk.lost.is_set()
        assert c.inspect(secure).holders == ()
    with Client(cluster.endpoints, ttl=6) as c:  # inspect of a guarded name needs the token
        with pytest.raises(Unauthenticated):
            c.inspect(secure)
    with pytest.raises(InvalidArgument, match="printable ASCII"):
        Client(cluster.endpoints, token="has space")


# scenario: input-errors
def test_input_errors_name_field_and_limit(client: Client) -> None:
    with pytest.raises(InvalidArgument, match=r"1..=512 bytes"):
        client.lock("x" * 513)
    with pytest.raises(InvalidArgument, match=r"owner must be at most 256 bytes \(got 300\)"):
        client.lock("ok", owner="o" * 300)
    with pytest.raises(InvalidArgument, match="wait must be >= 0"):
        client.lock("ok", wait=-1)
    with pytest.raises(InvalidArgument, match="ttl must lie in"):
        lockd_client.ClientOptions(ttl=0)


# scenario: stale-release
def test_stale_release_is_refused_with_a_typed_error(client: Client, name: str) -> None:
    lk = client.lock(name)
    with pytest.raises(Conflict) as e:
        client._run(client._core.release(lk.session_id, name, lk.token + 1000))
    assert e.value.code in ("stale_token", "not_holder") and not e.value.retryable
    lk.release()


def test_waits_past_the_servers_cap_run_in_rounds(cluster: Cluster, client: Client, name: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The service holds a waiter at most 300 s; a longer wait queues again round after round.
    Lowering the client's cap to 1 s shows the rounds in a few seconds."""
    monkeypatch.setattr(_core, "MAX_WAIT", 1.0)
    with Client(cluster.endpoints, ttl=6) as other:
        blocker = other.lock(name)
        threading.Timer(2.5, blocker.release).start()
        t0 = time.monotonic()
        with client.lock(name, wait=6) as lk:  # three rounds of 1 s before the grant
            took = time.monotonic() - t0
            assert 2.3 < took < 5.0 and lk.token > blocker.token
        blocker2 = other.lock(name)
        t0 = time.monotonic()
        with pytest.raises(NotAcquired):
            client.lock(name, wait=2.2)
        assert 2.0 < time.monotonic() - t0 < 4.0, "the caller's deadline ends the rounds"
        blocker2.release()


def test_unary_keepalive_keeps_the_lock(cluster: Cluster, name: str) -> None:
    """Without the stream the session is kept alive by KeepAlive calls past several TTLs."""
    with Client(cluster.endpoints, ttl=5, use_stream=False) as c:
        with c.lock(name, wait=2) as lk:
            first = lk.deadline
            time.sleep(7)
            assert not lk.lost.is_set() and lk.deadline > first + 5
            assert c.inspect(name).holders[0].token == lk.token


@pytest.mark.parametrize("use_stream", [True, False])
def test_a_lock_records_its_group_and_follows_its_lease(cluster: Cluster, name: str,
                                                        use_stream: bool) -> None:
    """Every grant names the lock group that made it (the service's GetSession agrees) and that
    group's move count; keepalive replies list every lock group, and the lock follows its
    group's lease (docs/API.md, "Leases per group")."""
    with Client(cluster.endpoints, ttl=6, use_stream=use_stream) as c:
        with c.lock(name, wait=2) as lk, c.lock(name + "/2", wait=2) as lk2:
            held = {h.name: h.group for h in c.get_session().held}
            assert held == {name: lk.group, name + "/2": lk2.group}
            groups = {g.id for g in c.status().groups} - {0}  # 0 is the meta group
            assert lk.group in groups and lk2.group in groups, (lk.group, groups)
            core = c._core
            s = core._sess
            assert s is not None
            hold = lk._hold.lease.hold
            first = lk.deadline
            # The next keepalive reply (every TTL/3) says what each lock group answered.
            wait_until(lambda: lk.deadline > first, 6, "a keepalive reply")
            leases = s.lease.leases

            async def check() -> None:  # on the engine's loop: no reply lands in between
                assert groups <= set(leases.groups), (groups, set(leases.groups))
                assert leases.groups[lk.group].moves == hold.group_moves, "no bucket moved"
                assert leases.deadline_of(hold) == leases.groups[lk.group].deadline
                # The lock follows its group's deadline; the session lives to the latest.
                assert lk.deadline == leases.deadline_of(hold) >= leases.deadline_all
                assert s.lease.deadline == leases.session_deadline() >= lk.deadline
            c._run(check())
            assert not lk.lost.is_set() and not lk2.lost.is_set()

    async def from_asyncio() -> None:
        async with AsyncClient(cluster.endpoints, ttl=6, use_stream=use_stream) as ac:
            async with ac.lock(name, wait=2) as alk:
                sid = ac.session_id
                assert sid is not None
                detail = await ac._core.get_session(sid)
                assert [(h.name, h.group) for h in detail.held] == [(name, alk.group)]
    asyncio.run(from_asyncio())


# scenario: lost-on-close
def test_lost_fires_when_the_session_is_closed(cluster: Cluster, name: str) -> None:
    c = Client(cluster.endpoints, ttl=6)
    lk = c.lock(name)
    c.close()
    assert lk.lost.wait(2)
    with pytest.raises(LockLost):
        with lk:  # the block ends after the loss: LockLost
            pass


# scenario: lost-on-close
def test_lost_fires_when_the_session_is_closed_from_outside(cluster: Cluster, name: str) -> None:
    import grpc

    from lockd_client._proto import lockd_pb2 as pb

    with Client(cluster.endpoints, ttl=6) as c:
        lk = c.lock(name)
        first_session = lk.session_id
        # Another connection ends the session by its id (what an operator's `lockctl session
        # close` does): the service pushes the end, and the client's lock is lost at once.
        with grpc.insecure_channel(cluster.endpoints[-1]) as ch:
            close = ch.unary_unary("/lockd.v1.Lock/CloseSession",
                                   request_serializer=pb.CloseSessionRequest.SerializeToString,
                                   response_deserializer=pb.CloseSessionResponse.FromString)
            close(pb.CloseSessionRequest(session_id=first_session), timeout=5)
        assert lk.lost.wait(5), "the pushed end of the session did not reach the lock"
        # The next acquire opens a new session.
        with c.lock(name, wait=5) as again:
            assert again.session_id != first_session
            assert again.token > lk.token


def test_async_api(cluster: Cluster, name: str) -> None:
    async def main() -> None:
        async with AsyncClient(cluster.endpoints, ttl=6) as c:
            async with c.lock(name, wait=2) as lk:
                assert not lk.lost.is_set()
                assert await lk.run(asyncio.sleep(0.1, result=7)) == 7
                async with AsyncClient(cluster.endpoints, ttl=6) as other:
                    waiter = asyncio.ensure_future(other.acquire(name, wait=10))
                    await asyncio.sleep(0.5)
                    assert not waiter.done()
                    await lk.release()
                    lk2 = await asyncio.wait_for(waiter, 5)
                    assert lk2.token > lk.token
                    ls = await other.acquire_all([name + "/y", name + "/x"], wait=2)
                    assert [x.name for x in ls.locks] == [name + "/x", name + "/y"]
                    await ls.release()
                    await lk2.release()
            lk3 = await c.acquire(name)
            await c.close()
            assert await asyncio.wait_for(lk3.lost.wait(), 2)
    asyncio.run(main())


def test_forever_wait_is_accepted(client: Client, name: str) -> None:
    with client.lock(name, wait=math.inf) as lk:
        assert lk.token > 0


def _fencing_rejections(cluster: Cluster) -> int:
    """lockd_fencing_rejections_total summed over the nodes and namespaces."""
    import urllib.request
    total = 0
    http = cluster.ports[0]
    for i in range(len(cluster.endpoints)):
        try:
            # The test namespaces have tokens, so the client port's /metrics is the admin's.
            req = urllib.request.Request(
                f"http://127.0.0.1:{http + i}/metrics",
                headers={"Authorization": f"Bearer {cluster.admin_token()}"},
            )
            with urllib.request.urlopen(req, timeout=5) as r:
                text = r.read().decode()
        except OSError:
            continue  # a node another test stopped
        for line in text.splitlines():
            if line.startswith("lockd_fencing_rejections_total{"):
                total += int(float(line.rsplit(" ", 1)[1]))
    return total


def test_a_fencing_rejection_is_reported_and_counted(cluster: Cluster, client: Client,
                                                     name: str) -> None:
    before = _fencing_rejections(cluster)
    client.report_fencing_rejected(name)

    async def from_asyncio() -> None:
        async with AsyncClient(cluster.endpoints, ttl=6) as ac:
            await ac.report_fencing_rejected(name)
    asyncio.run(from_asyncio())
    wait_until(lambda: _fencing_rejections(cluster) == before + 2, 5, "both reports counted")
    with pytest.raises(InvalidArgument):
        client.report_fencing_rejected("")


# scenario: full-namespace
def test_a_full_namespace_refuses_a_session_at_once(cluster: Cluster, name: str) -> None:
    # Namespace "solo" holds at most one live session (conftest's config).
    with Client(cluster.endpoints, ttl=6, namespace="solo") as first:
        with first.lock("solo/" + name):
            started = time.monotonic()
            with Client(cluster.endpoints, ttl=6, namespace="solo") as second:
                with pytest.raises(ResourceExhausted) as e:
                    second.lock("solo/" + name + "-b")
            took = time.monotonic() - started
            assert e.value.code == "too_many_sessions" and e.value.status == 429
            assert "holds 1 live session, its max_sessions" in str(e.value)
            # The service's answer at once, not after seconds of backoff (Retry-After is 1 s).
            assert took < 0.9, took
    # The first client closed its session: the namespace takes a new one.
    with Client(cluster.endpoints, ttl=6, namespace="solo") as third:
        with third.lock("solo/" + name + "-c") as lk:
            assert lk.token > 0
