"""Watches and an election's leaders against a real 3-node lockd: every change pushed once, in
order, across a timeout of the caller and a node killed under the stream."""
from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import List, Optional

import pytest

from lockd_client import AsyncClient, Client, InvalidArgument, Leader, WatchEvent

from conftest import Cluster


# scenario: watch
def test_a_watch_sees_each_change_of_its_name_once_and_a_prefix_its_names(
        cluster: Cluster, client: Client, name: str) -> None:
    with client.watch(name).open() as w, client.watch_prefix(name + "/").open() as pw:
        with Client(cluster.endpoints, ttl=6) as other:
            lk = other.lock(name)
            lk.release()
            started, ended = w.next(timeout=10), w.next(timeout=10)
            assert (started.kind, started.name, started.token, started.owner) == (
                "hold_started", name, lk.token, lk.owner)
            assert started.lease_ttl_ms == 6000
            assert (ended.kind, ended.cause, ended.token) == ("hold_ended", "release", lk.token)
            assert ended.index > started.index and ended.group == started.group == lk.group
            assert w.positions and w.positions[0][0] == lk.group
            # A name under the prefix: the prefix watch sees it, the name's watch does not, and
            # a caller that stops waiting loses nothing.
            child = other.lock(name + "/a")
            ev = pw.next(timeout=10)
            assert (ev.kind, ev.name, ev.token) == ("hold_started", name + "/a", child.token)
            with pytest.raises(TimeoutError):
                w.next(timeout=0.5)
            again = other.lock(name)
            ev = w.next(timeout=10)
            assert (ev.kind, ev.token) == ("hold_started", again.token)
            assert again.token > lk.token
            again.release()
            child.release()
            assert w.next(timeout=10).kind == "hold_ended"
            assert pw.next(timeout=10).kind == "hold_ended"


def test_a_timed_out_or_cancelled_wait_loses_no_event_and_a_closed_watch_ends(
        cluster: Cluster, name: str) -> None:
    async def main() -> None:
        async with AsyncClient(cluster.endpoints, ttl=6) as c:
            w = await c.watch(name).open()
            with pytest.raises(TimeoutError):
                await w.next(timeout=0.3)
            waiting = asyncio.ensure_future(w.next())
            await asyncio.sleep(0.2)
            waiting.cancel()
            lk = await c.acquire(name)
            ev = await w.next(timeout=10)
            assert (ev.kind, ev.token) == ("hold_started", lk.token)
            assert w.positions and w.positions[0][0] == lk.group
            await lk.release()
            assert (await w.next(timeout=10)).kind == "hold_ended"
            w.close()
            assert [e async for e in w] == []
    asyncio.run(main())


def test_a_watch_names_one_of_a_name_or_a_prefix(client: Client) -> None:
    with pytest.raises(InvalidArgument):
        client.watch("")


# scenario: election
def test_leaders_follow_an_election_as_it_changes(cluster: Cluster, client: Client,
                                                  name: str) -> None:
    with client.election(name).leaders() as leaders, \
            Client(cluster.endpoints, ttl=6) as a, Client(cluster.endpoints, ttl=6) as b:
        assert leaders.next(timeout=10) is None, "nobody leads yet"
        first = a.election(name).campaign("node-a", wait=5)
        got = leaders.next(timeout=10)
        assert got == Leader("node-a", first.token, "")
        # b queues behind a; when a resigns, b leads: the observer sees b, not a gap it polled.
        second_later: List[Optional[Leader]] = []
        import threading
        t = threading.Thread(target=lambda: second_later.append(
            Leader("node-b", b.election(name).campaign("node-b", wait=10).token, "")))
        t.start()
        time.sleep(0.5)
        first.resign()
        t.join(15)
        seen = leaders.next(timeout=10)
        if seen is None:  # the hand-off's end and start are two changes
            seen = leaders.next(timeout=10)
        assert seen == second_later[0] and seen is not None and seen.token > first.token


def test_async_watch_and_leaders(cluster: Cluster, name: str) -> None:
    async def main() -> None:
        async with AsyncClient(cluster.endpoints, ttl=6) as c:
            w = await c.watch(name).open()
            leaders = c.election(name).leaders()
            assert await asyncio.wait_for(leaders.next(), 10) is None
            ship = await c.election(name).campaign("async-leader", wait=5)
            events: List[WatchEvent] = []
            async for ev in w:
                events.append(ev)
                break
            assert (events[0].kind, events[0].token) == ("hold_started", ship.token)
            got = await asyncio.wait_for(leaders.next(), 10)
            assert got is not None and (got.value, got.token) == ("async-leader", ship.token)
            await ship.resign()
            assert await asyncio.wait_for(leaders.next(), 10) is None
            w.close()
            leaders.close()
    asyncio.run(main())


def test_a_watch_resumes_on_another_node_with_no_change_missed_or_repeated(
        fresh_cluster: Cluster, name: str) -> None:
    cl = fresh_cluster
    victim = 1
    first = cl.endpoint_of(victim)
    with Client([first, *[e for e in cl.endpoints if e != first]], ttl=6) as watcher, \
            Client([e for e in cl.endpoints if e != first], ttl=6) as writer:
        with watcher.watch(name).open() as w:
            tokens = []
            lk = writer.lock(name, wait=10)
            tokens.append(lk.token)
            lk.release()
            assert [w.next(timeout=10).kind for _ in range(2)] == ["hold_started", "hold_ended"]
            # The node under the watch's stream dies; the changes made meanwhile arrive once.
            os.kill(cl.node_pids[victim], signal.SIGKILL)
            for _ in range(3):
                lk = writer.lock(name, wait=20)
                tokens.append(lk.token)
                lk.release()
            seen = [w.next(timeout=30) for _ in range(6)]
            assert [e.kind for e in seen] == ["hold_started", "hold_ended"] * 3
            assert [e.token for e in seen[::2]] == tokens[1:]
            with pytest.raises(TimeoutError):
                w.next(timeout=1)
        assert list(w) == [], "a closed watch ends"
