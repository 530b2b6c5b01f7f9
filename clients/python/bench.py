#!/usr/bin/env python3
"""Acquire/release latency at concurrency 1 and throughput at concurrency 16, against a running
lockd, with the sync client (one session, one Session stream, like a real worker process).

    python clients/python/bench.py --endpoints 127.0.0.1:7170,127.0.0.1:7171,127.0.0.1:7172

Bounded: at most --ops operations per phase and at most --seconds seconds per phase, whichever
comes first. Each operation is a try-lock acquire of a name of its own plus its release (two
round trips, each committed through Raft). Prints the numbers; asserts nothing about time.
"""
from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from typing import List

from lockd_client import Client


def pct(xs: List[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def phase(client: Client, threads: int, ops: int, seconds: float, prefix: str) -> List[float]:
    lat: List[float] = []
    mu = threading.Lock()
    end = time.monotonic() + seconds
    counter = iter(range(ops))

    def run(t: int) -> None:
        mine: List[float] = []
        while time.monotonic() < end:
            with mu:
                i = next(counter, None)
            if i is None:
                break
            t0 = time.perf_counter()
            lk = client.lock(f"{prefix}/{t}/{i}")
            lk.release()
            mine.append(time.perf_counter() - t0)
        with mu:
            lat.extend(mine)

    ts = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(seconds + 30)
    return lat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--endpoints", default=os.environ.get("LOCKD_ENDPOINTS", "127.0.0.1:7170"))
    ap.add_argument("--ops", type=int, default=2000, help="operations per phase (at most)")
    ap.add_argument("--seconds", type=float, default=20.0, help="seconds per phase (at most)")
    ap.add_argument("--concurrency", type=int, default=16)
    a = ap.parse_args()
    prefix = f"bench/py/{os.getpid()}"
    with Client(a.endpoints.split(","), client_name=f"bench.py/{os.getpid()}") as c:
        phase(c, 1, 50, 5, prefix + "/warm")
        t0 = time.monotonic()
        lat = phase(c, 1, a.ops, a.seconds, prefix + "/c1")
        el = time.monotonic() - t0
        print(f"C=1:  {len(lat)} acquire+release in {el:.1f}s  "
              f"p50 {pct(lat, 50) * 1e3:.2f} ms  p99 {pct(lat, 99) * 1e3:.2f} ms  "
              f"mean {statistics.mean(lat) * 1e3:.2f} ms  ({len(lat) / el:.0f} ops/s)")
        t0 = time.monotonic()
        lat = phase(c, a.concurrency, a.ops * 4, a.seconds, prefix + "/c16")
        el = time.monotonic() - t0
        print(f"C={a.concurrency}: {len(lat)} acquire+release in {el:.1f}s  "
              f"throughput {len(lat) / el:.0f} ops/s  p50 {pct(lat, 50) * 1e3:.2f} ms  "
              f"p99 {pct(lat, 99) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
