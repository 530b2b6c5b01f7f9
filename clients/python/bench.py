#!/usr/bin/env python3
"""Acquire/release latency at concurrency 1 and throughput at concurrency 16, against a running
lockd, with the sync client (one session, one Session stream, like a real worker process).

    python clients/python/bench.py --endpoints 127.0.0.1:7170,127.0.0.1:7171,127.0.0.1:7172

Bounded: at most --ops operations per phase (4 x --ops at concurrency 16) and at most --seconds
seconds per phase, whichever comes first, after 50 warm-up operations. Each operation is a
try-lock acquire of a name of its own plus its release (two round trips, each committed through
Raft). Prints the numbers; asserts nothing about time. --phase runs one phase only; --json
prints one JSON line per phase (ops, errors, ops/s, p50/p99/mean ms, and this process's CPU per
operation), the format of lockd-client's `bench_client` example, which does the same work in
Rust: scripts/bench-clients runs the two side by side.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from typing import List, Optional, Tuple

from lockd_client import Client, LockdError


def pct(xs: List[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def cpu_seconds() -> float:
    """This process's user + system CPU (every thread: the callers, the client's asyncio loop
    thread, grpcio's own threads)."""
    t = os.times()
    return t.user + t.system


def phase(client: Client, threads: int, ops: int, seconds: float, prefix: str) -> Tuple[List[float], int]:
    lat: List[float] = []
    errors = [0]
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
            try:
                lk = client.lock(f"{prefix}/{t}/{i}")
                lk.release()
            except LockdError as e:
                with mu:
                    errors[0] += 1
                    if errors[0] <= 3:
                        print(f"bench.py: {e!r}", flush=True)
                continue
            mine.append(time.perf_counter() - t0)
        with mu:
            lat.extend(mine)

    ts = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(seconds + 30)
    return lat, errors[0]


def report(name: str, c: int, lat: List[float], errors: int, el: float, cpu: float,
           as_json: bool) -> None:
    n = len(lat)
    p50: Optional[float] = pct(lat, 50) * 1e3 if lat else None
    p99: Optional[float] = pct(lat, 99) * 1e3 if lat else None
    mean: Optional[float] = statistics.mean(lat) * 1e3 if lat else None
    if as_json:
        def r(x: Optional[float]) -> Optional[float]:
            return None if x is None else round(x, 3)
        print(json.dumps({"client": "python", "phase": name, "concurrency": c, "ops": n,
                          "errors": errors, "seconds": round(el, 3),
                          "ops_per_s": round(n / el, 1), "p50_ms": r(p50), "p99_ms": r(p99),
                          "mean_ms": r(mean),
                          "cpu_ms_per_op": round(cpu * 1e3 / n, 4) if n else None}), flush=True)
    elif c == 1:
        print(f"C=1:  {n} acquire+release in {el:.1f}s  "
              f"p50 {p50 or 0:.2f} ms  p99 {p99 or 0:.2f} ms  "
              f"mean {mean or 0:.2f} ms  ({n / el:.0f} ops/s)")
    else:
        print(f"C={c}: {n} acquire+release in {el:.1f}s  "
              f"throughput {n / el:.0f} ops/s  p50 {p50 or 0:.2f} ms  "
              f"p99 {p99 or 0:.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--endpoints", default=os.environ.get("LOCKD_ENDPOINTS", "127.0.0.1:7170"))
    ap.add_argument("--ops", type=int, default=2000, help="operations per phase (at most)")
    ap.add_argument("--seconds", type=float, default=20.0, help="seconds per phase (at most)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--phase", choices=["both", "c1", "cn"], default="both",
                    help="c1: concurrency 1 only; cn: --concurrency only")
    ap.add_argument("--json", action="store_true", help="one JSON line per phase")
    a = ap.parse_args()
    prefix = f"bench/py/{os.getpid()}"
    with Client(a.endpoints.split(","), client_name=f"bench.py/{os.getpid()}") as c:
        phase(c, 1, 50, 5, prefix + "/warm")
        if a.phase != "cn":
            cpu0, t0 = cpu_seconds(), time.monotonic()
            lat, errors = phase(c, 1, a.ops, a.seconds, prefix + "/c1")
            el, cpu = time.monotonic() - t0, cpu_seconds() - cpu0
            report("c1", 1, lat, errors, el, cpu, a.json)
        if a.phase != "c1":
            name = f"c{a.concurrency}"
            cpu0, t0 = cpu_seconds(), time.monotonic()
            lat, errors = phase(c, a.concurrency, a.ops * 4, a.seconds, f"{prefix}/{name}")
            el, cpu = time.monotonic() - t0, cpu_seconds() - cpu0
            report(name, a.concurrency, lat, errors, el, cpu, a.json)


if __name__ == "__main__":
    main()
