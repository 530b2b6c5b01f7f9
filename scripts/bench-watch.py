#!/usr/bin/env python3
"""The cost of watching (#22): a busy prefix watched by 0, 10 and 1,000 SSE watchers.

Starts `lockd dev --nodes 3` (the release build, fsync on, default groups) on free loopback
ports. Each round runs lockd-client's bench_client at concurrency C (acquire + release on names
under `bench/`, two Raft commits per operation) for SECONDS, once per watcher count, in turn, so
each figure has a neighbour minutes apart at most. The watchers are raw HTTP/1.1 connections to
`GET /v1/watch?prefix=bench/`, spread over the three nodes, that count the events they read.
A last phase opens watchers that never read (slow watchers): the node must cut each off
(`watch_too_slow`) rather than hold their backlog; it reports the nodes' RSS before and after.

Prints one table; asserts nothing about speed. Stops what it starts by pid.

    cargo build --release --bin lockd && cargo build --release -p lockd-client --example bench_client
    scripts/bench-watch.py [--rounds 2] [--seconds 10] [--concurrency 16] [--watchers 0,10,1000]
"""

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_base(n: int = 3) -> int:
    """A port p with p..p+n-1 free on 127.0.0.1."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p + n >= 65535:
            continue
        ok = True
        for q in range(p, p + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", q))
                except OSError:
                    ok = False
                    break
        if ok:
            return p
    raise SystemExit("no free ports")


def rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


async def watcher(port: int, stop: asyncio.Event, counts: list, i: int, read: bool, ended: list) -> None:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(b"GET /v1/watch?prefix=bench%2F HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Accept: text/event-stream\r\n\r\n")
    await w.drain()
    if not read:
        # Never read: the kernel's buffers fill, then the node's bounded lag cuts it off.
        await stop.wait()
        w.close()
        return
    try:
        while not stop.is_set():
            try:
                line = await asyncio.wait_for(r.readline(), 0.5)
            except asyncio.TimeoutError:
                continue
            if not line:
                ended[i] = "closed"
                break
            if line.startswith(b"event: "):
                if line.startswith(b"event: error"):
                    ended[i] = "error"
                else:
                    counts[i] += 1
    finally:
        w.close()


async def with_watchers(n: int, ports: list, read: bool, run) -> tuple:
    stop = asyncio.Event()
    counts = [0] * n
    ended = [None] * n
    tasks = [asyncio.create_task(watcher(ports[i % len(ports)], stop, counts, i, read, ended))
             for i in range(n)]
    await asyncio.sleep(0.5 + n / 1000)  # let them connect
    out = await run()
    stop.set()
    if tasks:
        await asyncio.wait(tasks, timeout=10)
    for t in tasks:
        t.cancel()
    return out, sum(counts), ended


async def bench(client: str, endpoints: str, seconds: int, c: int) -> dict:
    proc = await asyncio.create_subprocess_exec(
        client, endpoints, "--phase", "cn", "--concurrency", str(c), "--seconds", str(seconds),
        "--ops", "1000000", "--json", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), seconds + 60)
    except asyncio.TimeoutError:
        proc.kill()
        raise SystemExit("bench_client did not finish")
    rows = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not rows:
        raise SystemExit(f"bench_client failed: {err.decode()[-2000:]}")
    return rows[-1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--watchers", default="0,10,1000")
    ap.add_argument("--slow", type=int, default=100, help="slow watchers in the last phase")
    ap.add_argument("--slow-seconds", type=int, default=30,
                    help="load under the slow watchers (long enough to fill their sockets' buffers)")
    args = ap.parse_args()
    counts = [int(x) for x in args.watchers.split(",")]
    lockd = os.path.join(REPO, "target/release/lockd")
    client = os.path.join(REPO, "target/release/examples/bench_client")
    for b in (lockd, client):
        if not os.access(b, os.X_OK):
            raise SystemExit(f"missing {b}: build it first (see the docstring)")
    work = tempfile.mkdtemp(prefix="lockd-bench-watch.")
    http, grpc, peer = free_base(), free_base(), free_base()
    log = open(os.path.join(work, "dev.log"), "w")
    dev = subprocess.Popen([lockd, "dev", "--nodes", "3", "--data-dir", os.path.join(work, "data"),
                            "--http", f"127.0.0.1:{http}", "--grpc", f"127.0.0.1:{grpc}",
                            "--peer", f"127.0.0.1:{peer}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while True:
            try:
                if all(urllib.request.urlopen(f"http://127.0.0.1:{http + i}/readyz", timeout=2).status == 200
                       for i in range(3)):
                    break
            except Exception:  # noqa: BLE001 - not up yet
                pass
            if time.time() > deadline or dev.poll() is not None:
                raise SystemExit("lockd dev did not become ready:\n" + open(log.name).read()[-3000:])
            time.sleep(0.3)
        pids = [int(p) for p in re.findall(r"^node \d+ pid (\d+)", open(log.name).read(), re.M)]
        endpoints = ",".join(f"127.0.0.1:{grpc + i}" for i in range(3))
        ports = [http + i for i in range(3)]
        results = {n: [] for n in counts}
        for rnd in range(args.rounds):
            for n in counts:
                row, events, ended = asyncio.run(with_watchers(
                    n, ports, True, lambda: bench(client, endpoints, args.seconds, args.concurrency)))
                cut = sum(1 for e in ended if e)
                results[n].append((row["ops_per_s"], row["p50_ms"], row["p99_ms"], events, cut,
                                   sum(rss_mib(p) for p in pids)))
                print(f"round {rnd + 1}, {n} watchers: {row['ops_per_s']:.0f} ops/s, p50 {row['p50_ms']:.2f} ms, "
                      f"p99 {row['p99_ms']:.2f} ms; watchers read {events} events, {cut} ended early",
                      flush=True)
        base = [r[0] for r in results[counts[0]]]
        print(f"\n| watchers of bench/ | ops/s (each round) | vs {counts[0]} watchers | p50 ms | p99 ms | "
              f"events read | cut off | nodes' RSS MiB |")
        print("|---:|---|---|---|---|---:|---:|---:|")
        for n in counts if args.rounds else []:
            rs = results[n]
            ratios = " / ".join(f"{r[0] / b:.2f}" for r, b in zip(rs, base))
            print(f"| {n} | {' / '.join(f'{r[0]:.0f}' for r in rs)} | {ratios} | "
                  f"{' / '.join(f'{r[1]:.2f}' for r in rs)} | {' / '.join(f'{r[2]:.2f}' for r in rs)} | "
                  f"{sum(r[3] for r in rs)} | {sum(r[4] for r in rs)} | {rs[-1][5]:.0f} |")
        # Slow watchers: connections that never read, under the same load.
        before = sum(rss_mib(p) for p in pids)
        async def load_then_wait():
            r = await bench(client, endpoints, args.slow_seconds, args.concurrency)
            await asyncio.sleep(12)  # past the 10 s a full queue may stay unread
            return r
        row, _, _ = asyncio.run(with_watchers(args.slow, ports, False, load_then_wait))
        after = sum(rss_mib(p) for p in pids)
        text = "".join(urllib.request.urlopen(f"http://127.0.0.1:{p}/metrics", timeout=5).read().decode()
                       for p in ports)
        cut = sum(float(m) for m in re.findall(r'^lockd_watches_too_slow_total (\S+)', text, re.M))
        print(f"\n{args.slow} watchers that never read, under {args.slow_seconds} s of the same load: {row['ops_per_s']:.0f} ops/s; "
              f"nodes' RSS {before:.0f} -> {after:.0f} MiB; watches cut off as too slow (metrics): {cut:.0f}")
    finally:
        dev.send_signal(signal.SIGTERM)
        try:
            dev.wait(60)
        except subprocess.TimeoutExpired:
            dev.kill()
        for p in re.findall(r"^node \d+ pid (\d+)", open(log.name).read(), re.M):
            try:
                os.kill(int(p), signal.SIGKILL)
            except OSError:
                pass


if __name__ == "__main__":
    sys.exit(main())
