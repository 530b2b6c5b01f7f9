#!/usr/bin/env python3
"""The web dashboard (GET /ui, crates/lockd-server/ui/index.html) in headless Chromium, against a
live `lockd dev --nodes 3` that scripts/test-ui starts.

    test_ui.py ports                  three runs of 3 free loopback ports (http grpc peer bases)
    test_ui.py run --base URL --admin-token-file F --screenshots DIR

`run` drives the cluster through its HTTP API (urllib) and checks what the page shows:
  1. /ui is one self-contained page (no external resource), its weight printed;
  2. the overview shows 3 nodes and a leader for every group; the load time (navigation start
     to the first render with data, from the page's performance mark) is printed;
  3. an admin-only page shows the API's error message without a token, and the token typed in
     the header (kept in sessionStorage) then opens it: the namespaces' limits;
  4. the hot-names page lists the contended name (GET /v1/contention must answer);
  5. the name page, opened from its search box, shows the holder's fencing token as the
     acquire returned it and the queued second session at position 1; a bad name shows the
     API's error;
  6. with the events page watching the prefix (and the name page watching the name, in a second
     window), a release through the API shows the hold's end (cause release) and the waiter's
     grant (its token) live in both within seconds.
Every page is screenshot into DIR. Every wait is bounded. Selenium uses /usr/bin/chromedriver
and never downloads a driver (SE_OFFLINE).
"""

import argparse
import json
import os
import random
import re
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

NAME = "ui-test/hot-1"
PREFIX = "ui-test/"
WAIT_MS = 20_000
passed = 0
failed = 0


def log(msg: str) -> None:
    print(f"test_ui: {msg}", flush=True)


def ok(msg: str) -> None:
    global passed
    passed += 1
    print(f"  ok: {msg}", flush=True)


class Failure(Exception):
    pass


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise Failure(msg)


# ---------- free ports ----------
def ports() -> None:
    def free_run(n: int) -> int:
        for _ in range(500):
            base = random.randint(20000, 60000 - n)
            socks = []
            try:
                for p in range(base, base + n):
                    s = socket.socket()
                    s.bind(("127.0.0.1", p))
                    socks.append(s)
                return base
            except OSError:
                continue
            finally:
                for s in socks:
                    s.close()
        sys.exit("test_ui: no run of free loopback ports")

    bases: list[int] = []
    while len(bases) < 3:
        b = free_run(3)
        if all(abs(b - x) >= 3 for x in bases):
            bases.append(b)
    print(*bases)


# ---------- the HTTP API ----------
class Api:
    def __init__(self, base: str, admin_token: str):
        self.base = base.rstrip("/")
        self.admin = admin_token

    def call(self, method: str, path: str, body=None, admin=False, timeout=10.0):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if admin:
            req.add_header("Authorization", f"Bearer {self.admin}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def json(self, method: str, path: str, body=None, admin=False, timeout=10.0):
        status, raw = self.call(method, path, body, admin, timeout)
        if status != 200:
            raise Failure(f"{method} {path}: HTTP {status}: {raw[:300]!r}")
        return json.loads(raw)

    def session(self, client: str) -> str:
        return self.json("POST", "/v1/sessions", {"client": client, "ttl_s": 60})["session_id"]

    @staticmethod
    def lock_path(name: str) -> str:
        return "/v1/locks/" + urllib.parse.quote(name, safe="")


def wait_for(what: str, fn, timeout: float, every: float = 0.1):
    """fn() until it returns something truthy, at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            v = fn()
            if v:
                return v
        except Exception as e:  # noqa: BLE001 - the element may be re-rendered meanwhile
            last = e
        time.sleep(every)
    raise Failure(f"timed out after {timeout:.0f} s waiting for {what}" + (f" ({last})" if last else ""))


# ---------- the browser ----------
def browser():
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must not download anything
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1400,1000", "--no-first-run", "--disable-extensions",
              "--disable-background-networking", "--disable-component-update"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
    d = webdriver.Chrome(service=service, options=opts)
    d.set_page_load_timeout(20)
    d.set_script_timeout(10)
    return d


def css_testid(testid: str) -> str:
    return f'[data-testid="{testid}"]'


def texts(d, css: str) -> list[str]:
    """The rendered text of every element matching `css` (read in the page: never stale)."""
    return d.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => e.innerText.trim())", css)


def attrs(d, css: str, name: str) -> list:
    return d.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => e.getAttribute(arguments[1]))", css, name)


def text_of(d, testid: str) -> str:
    t = texts(d, css_testid(testid))
    return t[0] if t else ""


def shown(d, testid: str) -> bool:
    return bool(d.execute_script(
        "const e = document.querySelector(arguments[0]); return !!e && e.getClientRects().length > 0",
        css_testid(testid)))


def shot(d, folder: str, name: str) -> None:
    path = os.path.join(folder, f"{name}.png")
    # The whole page, not just the window: size the window to the document first.
    height = d.execute_script("return Math.max(document.body.scrollHeight, 900)")
    d.set_window_size(1400, min(int(height) + 40, 4000))
    d.save_screenshot(path)
    d.set_window_size(1400, 1000)
    log(f"screenshot {path}")


def js_errors(d) -> list[str]:
    """Uncaught script errors in the console (failed requests the page handles are expected)."""
    out = []
    for e in d.get_log("browser"):
        if e.get("level") != "SEVERE":
            continue
        msg = e.get("message", "")
        # Refused calls the page reports itself (401 without a token, a refused watch).
        if "Failed to load resource" in msg:
            continue
        out.append(msg)
    return out


def run(args) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    admin = open(args.admin_token_file).read().strip()
    api = Api(args.base, admin)
    os.makedirs(args.screenshots, exist_ok=True)
    ui = api.base + "/ui"

    # 1. the page itself
    req = urllib.request.Request(api.base + "/ui")
    with urllib.request.urlopen(req, timeout=10) as r:
        status, html, ctype = r.status, r.read(), r.headers.get("Content-Type", "")
    check(status == 200, f"GET /ui: HTTP {status}")
    check(ctype.startswith("text/html"), f"GET /ui: Content-Type {ctype!r}")
    status2, _ = api.call("GET", "/ui/")
    check(status2 == 200, f"GET /ui/: HTTP {status2}")
    text = html.decode()
    external = re.findall(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//|@import|url\(\s*["']?(?:https?:)?//""", text)
    check(not external, f"/ui loads external resources: {external}")
    weight = len(html)
    log(f"page weight: {weight} bytes ({weight / 1024:.1f} KiB) for GET /ui")
    check(weight < 40 * 1024, f"/ui is {weight} bytes, over the 40 KiB budget")
    ok(f"/ui and /ui/ answer one self-contained page of {weight} bytes")

    # The cluster's state to look at: a held name with one queued waiter.
    wait_for("every group to have a leader",
             lambda: all(g["leader"] for g in api.json("GET", "/v1/status")["groups"]), 30, 0.2)
    holder = api.session("ui-test-holder")
    waiter = api.session("ui-test-waiter")
    got = api.json("POST", api.lock_path(NAME) + ":acquire", {"session_id": holder, "owner": "holder-1"})
    check(got.get("acquired") is True, f"the first acquire did not get {NAME}: {got}")
    token_a = got["token"]
    waited: dict = {}

    def queued_acquire():
        try:
            waited["reply"] = api.json("POST", api.lock_path(NAME) + ":acquire",
                                       {"session_id": waiter, "owner": "waiter-2", "wait_ms": WAIT_MS},
                                       timeout=WAIT_MS / 1000 + 10)
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            waited["error"] = e

    t = threading.Thread(target=queued_acquire, daemon=True)
    t.start()
    wait_for("the second session to queue",
             lambda: [q for q in api.json("GET", api.lock_path(NAME))["queue"] if q["position"] == 1], 10)
    log(f"{NAME} held with token {token_a}; a second session waits at position 1 (wait_ms {WAIT_MS})")

    d = browser()
    try:
        def until(what, fn, timeout=10):
            return wait_for(what, fn, timeout)

        def find(css):
            return d.find_element(By.CSS_SELECTOR, css)

        # 2. the overview, without a token
        d.get(ui + "#/")
        until("the overview's first render with data",
              lambda: d.execute_script("return window.lockdFirstRenderMs || null"), 15)
        nav = d.execute_script(
            "const n = performance.getEntriesByType('navigation')[0];"
            "return {render: window.lockdFirstRenderMs, dcl: n.domContentLoadedEventEnd, load: n.loadEventEnd,"
            " resources: performance.getEntriesByType('resource').map(r => r.name)}")
        log(f"load time: {nav['render']:.0f} ms from navigation start to the overview's first render with data "
            f"(DOMContentLoaded {nav['dcl']:.0f} ms, load {nav['load']:.0f} ms)")
        foreign = [r for r in nav["resources"] if not r.startswith(api.base + "/")]
        check(not foreign, f"the page fetched from another origin: {foreign}")
        until("3 nodes", lambda: text_of(d, "node-count") == "3")
        check(len(texts(d, css_testid("node-row"))) == 3, "the nodes table has not 3 rows")
        status_groups = api.json("GET", "/v1/status")["groups"]
        leaders = attrs(d, css_testid("group-row"), "data-leader")
        check(len(leaders) == len(status_groups), f"{len(leaders)} group rows for {len(status_groups)} groups")
        check(all(x in ("1", "2", "3") for x in leaders), f"a group without a leader: {leaders}")
        cells = texts(d, css_testid("group-leader"))
        check(cells == [f"node {x}" for x in leaders], f"the leader cells: {cells}")
        n = len(leaders)
        check(text_of(d, "leader-count") == f"{n} / {n}", "the leader count card")
        check(text_of(d, "overview-ready") == "ready", f"the health card: {text_of(d, 'overview-ready')!r}")
        note = text_of(d, "overview-admin-note")
        check("admin bearer token" in note, f"without a token the overview should say why lag is missing: {note!r}")
        ok(f"overview: 3 nodes, a leader for each of {n} groups, ready; lag needs the admin token")

        # 3. an admin page: the API's message without a token, the data with it
        d.get(ui + "#/namespaces")
        until("the namespaces' error", lambda: "admin bearer token" in text_of(d, "ns-error"))
        ok(f"namespaces without a token shows the API's message: {text_of(d, 'ns-error')!r}")
        box = find(css_testid("token-input"))
        box.send_keys(admin)
        box.send_keys(Keys.ENTER)
        check(d.execute_script("return sessionStorage.getItem('lockd.token')") == admin,
              "the token is not in sessionStorage")
        row = '[data-testid="ns-row"][data-ns="default"]'
        until("the default namespace's row", lambda: texts(d, row))
        check(texts(d, row + ' [data-testid="ns-max-waiters"]') == ["500"], "default max_waiters_per_name")
        check(not shown(d, "ns-error"), "the error stays after the token")
        check(text_of(d, "token-state") == "token set", "the token state")
        load = '[data-testid="ns-load-row"][data-ns="default"]'
        until("the load rates after two samples", lambda: texts(d, load) and "…" not in texts(d, load)[0], 10)
        shot(d, args.screenshots, "namespaces")
        ok("the token field opens the admin calls; namespaces show their limits and load")

        d.get(ui + "#/")
        until("the lag with the token",
              lambda: (lambda lags: lags and all(re.search(r"n\d: \d", x) for x in lags))(texts(d, css_testid("group-lag"))))
        check(not shown(d, "overview-admin-note"), "the admin note stays")
        addrs = texts(d, css_testid("node-row") + " td:nth-child(2)")
        check(len(addrs) == 3 and all(re.fullmatch(r"127\.0\.0\.1:\d+", x) for x in addrs), f"peer addresses: {addrs}")
        shot(d, args.screenshots, "overview")
        ok("overview with the token: peer addresses and per-follower lag")

        # 4. hot names
        status, raw = api.call("GET", "/v1/contention?top=10", admin=True)
        d.get(ui + "#/hot")
        check(status == 200, f"GET /v1/contention: HTTP {status}: {raw[:200]!r}")
        most = f'[data-testid="hot-most_waiters"] [data-testid="hot-row"][data-name="{NAME}"]'
        until(f"{NAME} among the most waiters", lambda: texts(d, most))
        check(texts(d, most + ' [data-testid="hot-waiters"]') == ["1"], "its waiter count")
        held = f'[data-testid="hot-longest_held"] [data-testid="hot-row"][data-name="{NAME}"]'
        until(f"{NAME} among the longest held", lambda: texts(d, held))
        check(not shown(d, "contention-unavailable") and not shown(d, "hot-error"), "a note or error shown")
        box = find(css_testid("hot-namespace"))
        box.send_keys("default")
        box.send_keys(Keys.ENTER)
        until("the namespace filter's route", lambda: d.execute_script("return location.hash") == "#/hot?ns=default&top=10")
        until(f"{NAME} among the most waiters of namespace default",
              lambda: texts(d, most) and "top 10 in default" in text_of(d, "hot-updated"))
        shot(d, args.screenshots, "hot")
        find(most + ' [data-testid="name-link"]').click()
        until("the name page from the link", lambda: text_of(d, "name-title") == NAME)
        ok(f"hot names list {NAME} (1 waiter, held) and link to its page")

        # 5. the name page, from its search box; then a bad name's error
        d.get(ui + "#/name/")
        find(css_testid("name-input")).send_keys(NAME)
        find(css_testid("name-open")).click()
        until("the name page", lambda: text_of(d, "name-title") == NAME)
        check(d.execute_script("return location.hash") == "#/name/ui-test/hot-1", "the hash route")
        until("the holder's token", lambda: texts(d, css_testid("holder-token")) == [str(token_a)])
        until("the waiter at position 1", lambda: attrs(d, css_testid("waiter-row"), "data-position") == ["1"])
        check(text_of(d, "name-state") == "held", "the state card")
        until("the name watch live", lambda: text_of(d, "name-watch-state") == "live")
        shot(d, args.screenshots, "name")
        ok(f"name page: holder token {token_a} as the acquire returned it, the waiter at position 1")

        d.get(ui + "#/name/bad%07name")
        until("a bad name's error", lambda: "invalid_argument" in text_of(d, "name-error"))
        ok(f"a bad name shows the API's error: {text_of(d, 'name-error')!r}")

        # 6. live: the name page in one window, the events page in another; release via the API
        d.get(ui + f"#/name/{NAME}")
        until("the name watch live again", lambda: text_of(d, "name-watch-state") == "live")
        name_window = d.current_window_handle
        d.switch_to.new_window("window")
        d.set_window_size(1400, 1000)
        d.get(ui + "#/events")
        box = find(css_testid("events-prefix"))
        box.clear()
        box.send_keys(PREFIX)
        find(css_testid("events-start")).click()
        until("the events watch live", lambda: text_of(d, "events-state") == "live")
        check(d.execute_script("return location.hash") == "#/events?prefix=ui-test%2F", "the events route")

        released = time.monotonic()
        rel = api.json("POST", api.lock_path(NAME) + ":release", {"session_id": holder, "token": token_a})
        check(rel.get("released") is True, f"release: {rel}")
        ended = (f'[data-testid="event-row"][data-kind="hold_ended"][data-name="{NAME}"]'
                 f'[data-token="{token_a}"][data-cause="release"]')
        until("the release on the events page", lambda: texts(d, ended), 5)
        t.join(timeout=10)
        check(not t.is_alive(), "the queued acquire did not return within 10 s of the release")
        check("error" not in waited, f"the queued acquire failed: {waited.get('error')}")
        reply = waited["reply"]
        check(reply.get("acquired") is True, f"the waiter was not granted: {reply}")
        token_b = reply["token"]
        check(token_b > token_a, f"the grant's token {token_b} is not above {token_a}")
        started = f'[data-testid="event-row"][data-kind="hold_started"][data-name="{NAME}"][data-token="{token_b}"]'
        until("the grant on the events page", lambda: texts(d, started), 5)
        seen = time.monotonic() - released
        kinds = attrs(d, css_testid("event-row"), "data-kind")
        check(kinds.index("hold_started") < kinds.index("hold_ended"), f"not newest first: {kinds}")
        check("waiter" in texts(d, started)[0], "the grant names its waiter")
        shot(d, args.screenshots, "events")
        ok(f"events page: the hold's end (token {token_a}, release) and the grant (token {token_b}) "
           f"live within {seen:.1f} s of the release, newest first")

        events_window = d.current_window_handle
        d.switch_to.window(name_window)
        inside = '[data-testid="name-events"] '
        until("the release and the grant on the name page",
              lambda: texts(d, inside + ended) and texts(d, inside + started), 5)
        until("the new holder's token", lambda: texts(d, css_testid("holder-token")) == [str(token_b)], 5)
        until("an empty queue", lambda: not texts(d, css_testid("waiter-row")), 5)
        shot(d, args.screenshots, "name-after-release")
        ok(f"name page: the events arrived live; the holder is now token {token_b} and nobody waits")

        d.get(ui + "#/hot")
        moved = f'[data-testid="hot-most_handoffs"] [data-testid="hot-row"][data-name="{NAME}"]'
        until(f"{NAME} among the most hand-offs", lambda: texts(d, moved), 10)
        rate = texts(d, moved + " td:nth-child(8)")[0]
        check(float(rate) > 0, f"its hand-off rate: {rate!r}")
        shot(d, args.screenshots, "hot-after-release")
        ok(f"hot names: after the grant {NAME} is among the most hand-offs ({rate}/s)")

        # 7. a watch that needs a credential: once a namespace with a token exists, an empty
        # prefix spans namespaces and needs the admin token. The page reads the stream with
        # fetch() and sends the token as a header (never in the URL): live with the admin token,
        # refused with the API's message without it.
        put = api.json("POST", "/v1/admin/namespaces", {
            "expected_version": api.json("GET", "/v1/admin/namespaces", admin=True)["version"],
            "namespace": {"name": "ui-secure", "prefix": "ui-secure/"},
            "bearer_token": "ui-secure-token-0123456789"}, admin=True)
        check("version" in put, f"adding a namespace: {put}")
        d.get(ui + "#/events?prefix=")
        state = until("the all-names watch to go live or fail",
                      lambda: (lambda st: st if st in ("live", "failed") else None)(text_of(d, "events-state")))
        check(state == "live", f"the all-names watch with the admin token: {state} "
              f"{text_of(d, 'events-error')!r}")
        ok("an all-names watch with the admin token (sent as a header) is live")
        find(css_testid("token-clear")).click()
        d.get(ui + "#/events?prefix=")
        state = until("the all-names watch without a token to fail",
                      lambda: (lambda st: st if st in ("live", "failed") else None)(text_of(d, "events-state")))
        msg = text_of(d, "events-error")
        check(state == "failed" and "admin bearer token" in msg, f"the refused watch: {state} {msg!r}")
        shot(d, args.screenshots, "events-refused")
        ok(f"without the token the same watch shows the API's refusal: {msg!r}")

        errors = js_errors(d)
        d.switch_to.window(events_window)
        errors += js_errors(d)
        check(not errors, f"script errors in the console: {errors}")
        ok("no script error in the console")
    except Failure:
        try:
            shot(d, args.screenshots, "failure")
            log("the page at the failure (" + d.current_url + "):\n" + d.execute_script("return document.body.innerText")[:3000])
            for e in d.get_log("browser"):
                log(f"console: {e.get('level')} {e.get('message')}")
        except Exception as e:  # noqa: BLE001 - the failure itself is what matters
            log(f"(could not record the page: {e})")
        raise
    finally:
        d.quit()
        for s in (holder, waiter):
            api.call("DELETE", f"/v1/sessions/{s}")


def main() -> int:
    global failed
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("ports")
    r = sub.add_parser("run")
    r.add_argument("--base", required=True)
    r.add_argument("--admin-token-file", required=True)
    r.add_argument("--screenshots", required=True)
    args = p.parse_args()
    if args.cmd == "ports":
        ports()
        return 0
    try:
        run(args)
    except Failure as e:
        failed += 1
        log(f"FAIL: {e}")
    print(f"ui: {passed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
