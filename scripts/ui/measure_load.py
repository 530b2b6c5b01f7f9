#!/usr/bin/env python3
"""The dashboard's page weight and load times against a running lockd, e.g. one holding 1M
locks (`lockd-bench scale --hold-for-s 120` prints its dashboard's URLs).

    target/ui-venv/bin/python scripts/ui/measure_load.py http://127.0.0.1:PORT [--runs 3]

Prints: the bytes of GET /ui; per run, navigation start to the overview's first render with
data, and to the hot-names page's first lists; and GET /v1/contention's own time (the first
call scans every record; calls within 2 s reuse the scan). Needs Debian's chromium and
chromedriver, and selenium (scripts/test-ui makes target/ui-venv). Asserts nothing about time.
"""

import argparse
import os
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_ui import browser  # noqa: E402  (the same headless Chromium as the test)


def until(f, limit=60.0):
    end = time.time() + limit
    while time.time() < end:
        v = f()
        if v:
            return v
        time.sleep(0.02)
    raise SystemExit("timed out")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    body = urllib.request.urlopen(args.base + "/ui", timeout=10).read()
    print(f"page weight: {len(body)} bytes for GET /ui (the whole dashboard: nothing else is fetched but the API)")
    for i in range(args.runs):
        time.sleep(2.5)  # past the reuse window: the first call scans
        t = time.time()
        urllib.request.urlopen(args.base + "/v1/contention?top=10", timeout=60).read()
        cold = time.time() - t
        t = time.time()
        urllib.request.urlopen(args.base + "/v1/contention?top=10", timeout=60).read()
        warm = time.time() - t
        print(f"GET /v1/contention?top=10: {cold * 1000:.0f} ms with a scan, {warm * 1000:.0f} ms reusing it")
    d = browser()
    try:
        for i in range(args.runs):
            time.sleep(2.5)
            d.get("about:blank")
            d.get(args.base + "/ui#/")
            until(lambda: d.execute_script("return window.lockdFirstRenderMs || null"))
            overview = d.execute_script("return window.lockdFirstRenderMs")
            d.get("about:blank")
            t = time.time()
            d.get(args.base + "/ui#/hot")
            until(lambda: "refreshed" in (d.execute_script(
                "const e = document.querySelector('[data-testid=\"hot-updated\"]'); return e ? e.textContent : ''") or ""))
            hot = (time.time() - t) * 1000
            print(f"run {i + 1}: overview rendered with data {overview:.0f} ms after navigation start; "
                  f"hot names listed {hot:.0f} ms after navigation")
    finally:
        d.quit()


if __name__ == "__main__":
    main()
