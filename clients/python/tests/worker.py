"""A worker process for test_faults.py: takes a lock, reports its token, waits for "go" on
stdin (the test SIGSTOPs it past its TTL meanwhile), then reports whether its lock is lost and
tries its fenced writes. One JSON line per step on stdout.

    python worker.py ENDPOINTS NAME TTL PG_CONNINFO TABLE KEY
"""
from __future__ import annotations

import json
import sys
import time

import psycopg

from lockd_client import Client, FenceRejected, LockLost, fencing


def say(**kv: object) -> None:
    print(json.dumps(kv), flush=True)


def main() -> None:
    endpoints, name, ttl, dsn, table, key = sys.argv[1:7]
    with Client(endpoints.split(","), ttl=float(ttl), client_name="py-worker") as c:
        lk = c.lock(name, wait=10)
        with psycopg.connect(dsn, autocommit=True) as conn:
            fencing.write(conn, lk, key, "worker-before-pause", table=table)
            say(step="acquired", token=lk.token)
            if sys.stdin.readline().strip() != "go":
                return
            lost = lk.lost.is_set()
            try:
                fencing.write(conn, lk, key, "worker-after-pause", table=table)
                guarded = "written"
            except LockLost:
                guarded = "lost"
            except FenceRejected:
                guarded = "rejected"
            # What a worker that ignored `lost` would do: the store itself must refuse it.
            raw = fencing.fenced_write(conn, key, "worker-stale", lk.token, table=table)
            # The engine thread counts the expired lease once it runs after the pause (bounded).
            end = time.monotonic() + 3
            while c.lease_expired_count == 0 and time.monotonic() < end:
                time.sleep(0.02)
            say(step="resumed", lost=lost, guarded=guarded, raw_accepted=raw,
                lease_expired=c.lease_expired_count)


if __name__ == "__main__":
    main()
