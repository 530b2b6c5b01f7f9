"""The checks of scripts/test-observability on deploy/prometheus and deploy/grafana.

Each subcommand prints one line per thing it checked and exits 1 on the first failure.

    checks.py ports                         four port bases, each with 3 consecutive free
                                            loopback ports (`lockd dev --nodes 3`, Prometheus)
    checks.py exercise HTTP_BASE TOKEN OUT  drive a live 3-node `lockd dev` through its HTTP
                                            API (sessions, locks, a wait, a lease-expired report,
                                            a drain that moves leaders) and write each node's
                                            /metrics to OUT/node-N.prom
    checks.py tls-exercise HTTP DATA OUT    drive a one-node `lockd dev --tls --snapshot-every 8`
                                            (data dir DATA) until it has made a snapshot, check
                                            its certificate and storage series, and write its
                                            /metrics to OUT/node-tls.prom
    checks.py names PROTO RULES DASHBOARD SCRAPE...
                                            every PromQL expression of the rules and the
                                            dashboard parses, and names only metrics, labels
                                            and label values the scrapes show (results: the
                                            proto's error codes, ok, busy)
    checks.py prometheus PORT RULES DASHBOARD NODES
                                            a real Prometheus on PORT scraping the NODES nodes:
                                            every target up, counters' help kept (OpenMetrics),
                                            every rule evaluated without error, every dashboard
                                            query answered without error
    checks.py dashboard DASHBOARD           the dashboard's structure (variables, data sources,
                                            ids, layout)
    checks.py lint SCRAPE PROMTOOL_OUTPUT   classify `promtool check metrics` findings
"""

from __future__ import annotations

import json
import random
import re
import socket
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Iterator, NoReturn

# Labels Prometheus adds to every scraped series (target labels), and `up`, the one series it
# makes itself for each target.
TARGET_LABELS = {"job", "instance"}
SYNTHETIC = {"up": {"job", "instance"}}
# Grafana's variables, as they are replaced before a query is sent.
GRAFANA_VARS = {"__rate_interval": "5m", "__interval": "1m", "__range": "6h", "instance": ".*", "job": "lockd"}


def fail(msg: str) -> NoReturn:
    print(f"  FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def ok(msg: str) -> None:
    print(f"  ok: {msg}")


# --- the live cluster ---------------------------------------------------------------------


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
        fail("no run of free loopback ports")

    bases: list[int] = []
    while len(bases) < 4:
        b = free_run(3)
        if all(abs(b - x) >= 3 for x in bases):
            bases.append(b)
    print(*bases)


class Http:
    def __init__(self, port: int, token: str | None = None, ca: str | None = None):
        # With a CA file: HTTPS, trusting that CA only (`lockd dev --tls`).
        self.ctx = None if ca is None else ssl.create_default_context(cafile=ca)
        self.base = f"{'http' if ca is None else 'https'}://127.0.0.1:{port}"
        self.token = token

    def call(self, method: str, path: str, body: Any = None, admin: bool = False) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if admin and self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=25, context=self.ctx) as r:
                text = r.read().decode()
                status = r.status
        except urllib.error.HTTPError as e:
            text = e.read().decode()
            status = e.code
        try:
            return status, json.loads(text)
        except json.JSONDecodeError:
            return status, text

    def expect(self, method: str, path: str, body: Any, status: int, admin: bool = False) -> Any:
        got, reply = self.call(method, path, body, admin)
        if got != status:
            fail(f"{method} {path}: {got} {reply}, expected {status}")
        return reply

    def metrics(self) -> str:
        # Open while no namespace has a token; with one, the admin's (docs/API.md).
        req = urllib.request.Request(self.base + "/metrics")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(req, timeout=10, context=self.ctx) as r:
            ctype = r.headers.get("Content-Type", "")
            if not ctype.startswith(("application/openmetrics-text", "text/plain")):
                fail(f"/metrics answered Content-Type {ctype!r}")
            return str(r.read().decode())


def exercise(http_base: str, token_file: str, out: str) -> None:
    deadline = time.monotonic() + 45
    token = Path(token_file).read_text().strip()
    nodes = [Http(int(http_base) + i, token) for i in range(3)]
    for n in nodes:
        while True:
            status, reply = n.call("GET", "/readyz")
            if status == 200:
                break
            if time.monotonic() > deadline:
                fail(f"{n.base}/readyz not ready in time: {reply}")
            time.sleep(0.1)
    ok("3 nodes ready")
    # A first scrape records each group's leader, so that the drain below counts as a change.
    for n in nodes:
        n.metrics()

    a = nodes[0]
    s1 = a.expect("POST", "/v1/sessions", {"client": "test-observability", "ttl_s": 15}, 200)["session_id"]
    s2 = a.expect("POST", "/v1/sessions", {"client": "test-observability-2"}, 200)["session_id"]
    got = a.expect("POST", "/v1/locks/obs-a:acquire", {"session_id": s1, "owner": "w1"}, 200)
    if not got.get("acquired"):
        fail(f"the first acquire did not get obs-a: {got}")
    tok = got["token"]
    a.expect("POST", "/v1/locks/obs-a:acquire", {"session_id": s1, "owner": "w1"}, 409)  # already_held
    busy = a.expect("POST", "/v1/locks/obs-a:acquire", {"session_id": s2, "wait_ms": 0}, 200)
    waited = a.expect("POST", "/v1/locks/obs-a:acquire", {"session_id": s2, "wait_ms": 300}, 200)
    if busy.get("acquired") or waited.get("acquired"):
        fail("a second session got a held lock")
    a.expect("POST", "/v1/locks/obs-a:extend", {"session_id": s1, "token": tok}, 200)
    a.expect("POST", "/v1/locks/obs-a:check", {"token": tok}, 200)
    a.expect("GET", "/v1/locks/obs-a", None, 200)
    a.expect("POST", f"/v1/sessions/{s1}:keepalive", None, 200)
    a.expect("POST", "/v1/locks/obs-a:release", {"session_id": s1, "token": tok}, 200)
    nodes[1].expect("POST", "/v1/locks/obs-b:acquire", {"session_id": s2}, 200)  # forwarded
    a.expect("POST", "/v1/reports/lease-expired", {"name": "obs-a"}, 200)
    a.expect("POST", "/v1/reports/fencing-rejected", {"name": "obs-a"}, 200)
    a.expect("DELETE", f"/v1/sessions/{s2}", None, 200)
    a.expect("DELETE", f"/v1/sessions/{s1}", None, 200)
    ok("sessions, acquires (ok, already_held, busy, a timed-out wait), extend, check, inspect, "
       "keepalive, release, a lease-expired and a fencing-rejected report, close")

    # Leader changes are counted per group once a node sees a new leader at a scrape: move node
    # 1's groups away (drain), and back (undrain) if that moved nothing.
    def changes_seen() -> bool:
        return any("lockd_leader_changes_total{" in n.metrics() for n in nodes)

    for verb in ("drain", "undrain"):
        a.expect("POST", f"/v1/admin/members/1:{verb}", None, 200, admin=True)
        until = min(deadline, time.monotonic() + 10)
        while time.monotonic() < until:
            if changes_seen():
                break
            time.sleep(0.2)
        else:
            continue
        ok(f"leaders moved ({verb} node 1): lockd_leader_changes_total exported")
        break
    else:
        fail("no node exported lockd_leader_changes_total after a drain and an undrain of node 1")

    dest = Path(out)
    dest.mkdir(parents=True, exist_ok=True)
    for i, n in enumerate(nodes, start=1):
        (dest / f"node-{i}.prom").write_text(n.metrics())
    ok(f"scraped /metrics of the 3 nodes into {dest}")


def tls_exercise(http: str, data: str, out: str) -> None:
    """Series only a node with TLS files and a snapshot behind it exports."""
    deadline = time.monotonic() + 45
    token = Path(data, "admin-token").read_text().strip()
    n = Http(int(http), token, ca=str(Path(data, "tls", "ca.pem")))
    while n.call("GET", "/readyz")[0] != 200:
        if time.monotonic() > deadline:
            fail(f"{n.base}/readyz not ready in time")
        time.sleep(0.1)
    s = n.expect("POST", "/v1/sessions", {"client": "test-observability-tls"}, 200)["session_id"]
    for i in range(12):
        got = n.expect("POST", f"/v1/locks/obs-tls-{i}:acquire", {"session_id": s}, 200)
        n.expect("POST", f"/v1/locks/obs-tls-{i}:release", {"session_id": s, "token": got["token"]}, 200)
    ok("a one-node lockd dev --tls over HTTPS: a session, 12 acquires and releases")
    while True:
        text = n.metrics()
        series = parse_scrape(text)
        if "lockd_snapshot_seconds_count" in series:
            break
        if time.monotonic() > deadline:
            fail("no snapshot timed (lockd_snapshot_seconds) in 45 s")
        time.sleep(0.2)
    certs = series.get("lockd_tls_cert_not_after_timestamp_seconds", {}).get("cert", set())
    if not {"client", "peer", "peer_ca"} <= certs:
        fail(f"certificate expiry series for {sorted(certs)}, not client, peer and peer_ca")
    expiry = re.search(r'^lockd_tls_cert_not_after_timestamp_seconds\{cert="client"\} (\S+)$', text, re.M)
    if expiry is None or float(expiry.group(1)) < time.time() + 86400:
        fail(f"the client certificate's expiry is not a day ahead: {expiry and expiry.group(0)}")
    kinds = series.get("lockd_storage_bytes", {}).get("kind", set())
    if kinds != {"log", "snapshot"}:
        fail(f"lockd_storage_bytes kinds {sorted(kinds)}")
    Path(out).mkdir(parents=True, exist_ok=True)
    Path(out, "node-tls.prom").write_text(text)
    ok("its /metrics has the certificates' expiry, the replicas' bytes on disk and a snapshot's time")


# --- the expressions -----------------------------------------------------------------------


def parse_scrape(text: str) -> dict[str, dict[str, set[str]]]:
    """Sample name -> label name -> values seen."""
    series: dict[str, dict[str, set[str]]] = {}
    sample = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+\S+')
    label = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = sample.match(line)
        if not m:
            fail(f"cannot read the scraped line {line!r}")
        labels = series.setdefault(m.group(1), {})
        for k, v in label.findall(m.group(3) or ""):
            labels.setdefault(k, set()).add(v)
    return series


def proto_results(proto: str) -> set[str]:
    codes = {c.lower() for c in re.findall(r"^\s*ERROR_CODE_([A-Z_]+)\s*=\s*\d+;", Path(proto).read_text(), re.M)}
    codes.discard("unspecified")
    if len(codes) < 10:
        fail(f"read only {len(codes)} error codes from {proto}")
    return codes | {"ok", "busy"}


def substitute(expr: str, where: str) -> str:
    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in GRAFANA_VARS:
            fail(f"{where}: unknown dashboard variable ${name} in {expr!r}")
        return GRAFANA_VARS[name]

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", sub, expr)


def dashboard_exprs(dash: dict[str, Any]) -> Iterator[tuple[str, str, str | None]]:
    """(where, expression, label that label_values() reads or None)."""

    def panels(ps: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for p in ps:
            yield p
            yield from panels(p.get("panels", []))

    for p in panels(dash.get("panels", [])):
        for t in p.get("targets", []):
            if "expr" in t:
                yield f"panel {p.get('title')!r} {t.get('refId')}", t["expr"], None
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = re.fullmatch(r"\s*label_values\(\s*(.+?)\s*,\s*(\w+)\s*\)\s*", q or "")
        if not m:
            fail(f"variable {v.get('name')}: not a label_values(metric, label) query: {q!r}")
        yield f"variable ${v['name']}", m.group(1), m.group(2)


def names(proto: str, rules_file: str, dashboard_file: str, scrapes: list[str]) -> None:
    import promql_parser as pql
    import yaml

    exported: dict[str, dict[str, set[str]]] = {}
    for f in scrapes:
        for name, labels in parse_scrape(Path(f).read_text()).items():
            into = exported.setdefault(name, {})
            for k, vs in labels.items():
                into.setdefault(k, set()).update(vs)
    lockd_names = {n for n in exported if n.startswith("lockd_")}
    if len(lockd_names) < 10:
        fail(f"the scrapes hold only {len(lockd_names)} lockd series names")
    results = proto_results(proto)

    exprs: list[tuple[str, str, str | None]] = []
    rules = yaml.safe_load(Path(rules_file).read_text())
    for g in rules["groups"]:
        for r in g["rules"]:
            exprs.append((f"rule {r.get('alert') or r.get('record')}", r["expr"], None))
    dash = json.loads(Path(dashboard_file).read_text())
    exprs.extend((w, substitute(e, w), lbl) for w, e, lbl in dashboard_exprs(dash))

    used: dict[str, set[str]] = {"rules": set(), "dashboard": set()}
    for where, expr, extra_label in exprs:
        try:
            tree = pql.parse(expr)
        except Exception as e:  # the parser raises ValueError with the position
            fail(f"{where}: PromQL does not parse: {e}\n    {expr}")
        selectors: list[Any] = []
        label_refs: set[str] = set() if extra_label is None else {extra_label}

        def visit(node: Any, *_: Any) -> bool:
            kind = type(node).__name__
            if kind == "VectorSelector":
                selectors.append(node)
            elif kind == "AggregateExpr" and node.modifier is not None:
                label_refs.update(node.modifier.labels)
            elif kind == "BinaryExpr" and node.modifier is not None:
                if node.modifier.matching is not None:
                    label_refs.update(node.modifier.matching.labels)
                label_refs.update(node.modifier.group_labels or [])
            return True

        pql.walk(tree, visit)
        metric_labels: set[str] = set()
        for sel in selectors:
            name = sel.name
            if not name:
                fail(f"{where}: a selector without a metric name: {expr}")
            have: dict[str, set[str]]
            if name in SYNTHETIC:
                have = {k: set() for k in SYNTHETIC[name]}
            elif name in exported:
                have = exported[name]
            else:
                fail(f"{where}: {name} is not exported by a live lockd node (nor made by Prometheus)")
            used["rules" if where.startswith("rule") else "dashboard"].add(name)
            metric_labels |= set(have)
            for m in sel.matchers.matchers:
                if m.name in TARGET_LABELS:
                    continue
                if m.name not in have:
                    fail(f"{where}: {name} has no label {m.name!r} (it has {sorted(have)})")
                alternatives = re.fullmatch(r"[A-Za-z0-9_.+-]+(\|[A-Za-z0-9_.+-]+)*", m.value)
                if alternatives is None:
                    continue  # a real pattern: nothing to compare value by value
                values = m.value.split("|") if "Re" in str(m.op) else [m.value]
                known = results if m.name == "result" else have[m.name]
                for v in values:
                    if v not in known:
                        what = "an error code of the proto, ok or busy" if m.name == "result" else f"seen ({sorted(known)})"
                        fail(f"{where}: {name}{{{m.name}}} value {v!r} is not {what}")
        unknown = label_refs - metric_labels - TARGET_LABELS
        if unknown:
            fail(f"{where}: label(s) {sorted(unknown)} are on none of its metrics {sorted(metric_labels)}")
    ok(f"{len(exprs)} PromQL expressions parse (promql-parser) and name only series, labels and "
       f"label values a live node exports: {len(used['rules'])} series in the rules, "
       f"{len(used['dashboard'])} in the dashboard")
    families = {re.sub(r"_(bucket|sum|count|total)$", "", n) for n in lockd_names}
    shown = {re.sub(r"_(bucket|sum|count|total)$", "", n) for n in used["dashboard"]}
    missing = sorted(families - shown)
    if missing:
        print(f"  note: exported but on no dashboard panel: {', '.join(missing)}")
    else:
        ok(f"every one of the {len(families)} lockd metric families is on the dashboard")


# --- a real Prometheus -----------------------------------------------------------------------


def prometheus(port: str, rules_file: str, dashboard_file: str, nodes: str) -> None:
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 40

    def api(path: str, **params: str) -> Any:
        url = base + path + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.loads(r.read().decode())
        except urllib.error.HTTPError as e:
            text = e.read().decode()
            try:
                body = json.loads(text)
            except json.JSONDecodeError:
                # Still starting ("503 Service Unavailable" in plain text): `until` retries.
                raise ConnectionError(f"Prometheus {path}: {e.code} {text.strip()[:80]}") from e
        if body.get("status") != "success":
            fail(f"Prometheus {path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body

    def until(what: str, cond: Any) -> Any:
        while True:
            try:
                got = cond()
            except (urllib.error.URLError, ConnectionError):
                got = None
            if got:
                return got
            if time.monotonic() > deadline:
                fail(f"Prometheus: {what} did not happen in time")
            time.sleep(0.25)

    def scalar(q: str) -> float:
        res = api("/api/v1/query", query=q)["data"]["result"]
        return float(res[0]["value"][1]) if res else 0.0

    # Four scrapes of every node: enough samples for rate() and increase().
    until("4 scrapes of every lockd node", lambda: scalar(
        'count(count_over_time(up{job="lockd"}[1m]) >= 4 and on (instance) up{job="lockd"} == 1)') == int(nodes))
    targets = api("/api/v1/targets")["data"]["activeTargets"]
    bad = [t for t in targets if t["health"] != "up" or t.get("lastError")]
    if bad:
        fail(f"targets not up: {[(t['scrapeUrl'], t['lastError']) for t in bad]}")
    ok(f"Prometheus scrapes the {nodes} nodes (OpenMetrics): every target up, no scrape error")

    meta = api("/api/v1/metadata")["data"]
    counters = {n: m for n, m in meta.items() if n.startswith("lockd_") and any(x["type"] == "counter" for x in m)}
    helpless = sorted(n for n, m in counters.items() if not any(x.get("help") for x in m))
    if len(counters) < 5 or helpless:
        fail(f"Prometheus's metadata: lockd counters {sorted(counters)}, without help: {helpless}")
    ok(f"Prometheus keeps type counter and help for all {len(counters)} lockd counter families "
       "(so promtool's 'no help text' below is its text-format lint, not what Prometheus stores)")

    # Rules: wait for one evaluation of every rule after the scrapes above, then none may err.
    def evaluated() -> Any:
        groups = api("/api/v1/rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        if rules and all(not r["lastEvaluation"].startswith("0001-") and r["health"] != "unknown" for r in rules):
            return rules
        return None

    time.sleep(1.5)
    rules = until("an evaluation of every rule", evaluated)
    import yaml

    want = sum(len(g["rules"]) for g in yaml.safe_load(Path(rules_file).read_text())["groups"])
    if len(rules) != want:
        fail(f"Prometheus loaded {len(rules)} rules, {rules_file} has {want}")
    errs = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    if errs:
        fail(f"rules that Prometheus could not evaluate: {errs}")
    firing = sorted({r["name"] for r in rules for a in r.get("alerts", [])})
    ok(f"Prometheus evaluated all {len(rules)} rules against the live nodes without an error"
       + (f"; active on this fresh cluster: {', '.join(firing)}" if firing else "; none active"))

    dash = json.loads(Path(dashboard_file).read_text())
    empty = []
    count = 0
    for where, expr, label in dashboard_exprs(dash):
        q = substitute(expr, where)
        if label is not None:
            res = api("/api/v1/series", **{"match[]": q})["data"]
            if not any(label in s for s in res):
                empty.append(where)
        else:
            # Grafana's $__range: the 6 h default would reach before the cluster; 1 m does not.
            q = q.replace("[6h]", "[1m]")
            body = api("/api/v1/query", query=q)
            if body.get("warnings"):
                fail(f"{where}: Prometheus warns: {body['warnings']}")
            if not body["data"]["result"]:
                empty.append(where)
        count += 1
    ok(f"Prometheus answered all {count} dashboard queries without an error"
       + (f"; empty on this fresh cluster: {', '.join(empty)}" if empty else "; each returned data"))


# --- the dashboard's structure -------------------------------------------------------------


def dashboard(path: str) -> None:
    try:
        dash = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        fail(f"{path} is not JSON: {e}")
    ok(f"{path} parses as JSON")
    sv = dash.get("schemaVersion")
    if not isinstance(sv, int) or not 36 <= sv <= 41:
        fail(f"schemaVersion {sv!r}: expected one of Grafana 9.x-11.x's (36..41)")
    for key in ("title", "uid", "panels", "templating", "time"):
        if key not in dash:
            fail(f"the dashboard has no {key!r}")
    if dash.get("id") is not None:
        fail("the dashboard has an id: leave it null so that an import makes a new one")
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        fail("no `datasource` variable of type datasource, query prometheus")
    inst = variables.get("instance")
    if not inst or inst.get("type") != "query" or not inst.get("multi") or not inst.get("includeAll"):
        fail("no multi-value `instance` query variable with All")
    job = variables.get("job")
    if not job or job.get("type") != "query" or job.get("multi") or job.get("includeAll"):
        fail("no single-value `job` query variable (one cluster per job)")
    ok(f"schemaVersion {sv}; variables ${{datasource}} (Prometheus), $job (single) and $instance (multi, All)")
    want = {"type": "prometheus", "uid": "${datasource}"}
    for v in (inst, job):
        if v.get("datasource") != want:
            fail(f"${v['name']} queries {v.get('datasource')}, not {want}")

    def panels_of(ps: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for p in ps:
            yield p
            yield from panels_of(p.get("panels", []))

    for p in panels_of(dash["panels"]):
        for t in p.get("targets", []):
            if "$job" not in t.get("expr", ""):
                fail(f"panel {p.get('title')!r} {t.get('refId')}: no $job in {t.get('expr')!r}")
    ok("every query is of the $job picked")

    ids: set[int] = set()
    cells: dict[tuple[int, int], Any] = {}
    count = 0

    def walk(ps: list[dict[str, Any]]) -> None:
        nonlocal count
        for p in ps:
            pid, title = p.get("id"), p.get("title")
            if not isinstance(pid, int) or pid in ids:
                fail(f"panel {title!r}: id {pid!r} missing or repeated")
            ids.add(pid)
            g = p.get("gridPos") or {}
            pos = [g.get(k) for k in ("x", "y", "w", "h")]
            if not all(isinstance(v, int) for v in pos):
                fail(f"panel {title!r}: gridPos {g} lacks x, y, w or h")
            x, y, w, h = (int(v or 0) for v in pos)
            if x < 0 or w < 1 or h < 1 or x + w > 24:
                fail(f"panel {title!r}: gridPos {g} is not within the 24 columns")
            for cx in range(x, x + w):
                for cy in range(y, y + h):
                    if (cx, cy) in cells:
                        fail(f"panel {title!r} overlaps panel {cells[(cx, cy)]!r} at ({cx}, {cy})")
                    cells[(cx, cy)] = title
            if p.get("type") == "row":
                walk(p.get("panels", []))
                continue
            count += 1
            if p.get("datasource") != want:
                fail(f"panel {title!r}: data source {p.get('datasource')}, not {want}")
            targets = p.get("targets") or []
            if not targets:
                fail(f"panel {title!r} has no query")
            refs = [t.get("refId") for t in targets]
            if len(set(refs)) != len(refs):
                fail(f"panel {title!r}: repeated refIds {refs}")
            for t in targets:
                if t.get("datasource") != want or not t.get("expr"):
                    fail(f"panel {title!r} {t.get('refId')}: no expr, or not on {want}")
            if not (p.get("fieldConfig", {}).get("defaults", {}).get("unit")):
                fail(f"panel {title!r} has no unit")

    walk(dash["panels"])
    ok(f"{count} panels: unique ids, every query on ${{datasource}}, each with a unit, laid out "
       "without overlaps in 24 columns")


# --- promtool check metrics ----------------------------------------------------------------


def lint(scrape: str, promtool_output: str) -> None:
    """promtool (as of 2.42) lints the Prometheus text format. lockd serves OpenMetrics
    (Content-Type application/openmetrics-text), where a counter's family `lockd_ops` has HELP
    and TYPE and its samples are `lockd_ops_total`; Prometheus scrapes it with its OpenMetrics
    parser and keeps the help. promtool's text-format lint reads `lockd_ops_total` as a metric
    without help. That one finding is explained when the scrape has the family's HELP and TYPE
    counter lines; any other finding fails."""
    text = Path(scrape).read_text()
    helps = set(re.findall(r"^# HELP (\S+) ", text, re.M))
    counters = set(re.findall(r"^# TYPE (\S+) counter$", text, re.M))
    explained, other = [], []
    for line in Path(promtool_output).read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        m = re.fullmatch(r"(\S+)_total no help text", line)
        if m and m.group(1) in helps and m.group(1) in counters:
            explained.append(m.group(1) + "_total")
        else:
            other.append(line)
    if explained:
        print(f"  note: {Path(scrape).name}: promtool says 'no help text' for {len(explained)} "
              f"counters ({', '.join(sorted(explained))}): in OpenMetrics their HELP is on the "
              "family name, which promtool's text-format lint does not read (Prometheus does)")
    if other:
        fail("promtool check metrics found:\n    " + "\n    ".join(other))
    ok(f"promtool check metrics on {Path(scrape).name}: no other finding")


def main(argv: list[str]) -> None:
    if not argv:
        fail(__doc__ or "")
    cmd, args = argv[0], argv[1:]
    if cmd == "ports" and not args:
        ports()
    elif cmd == "exercise" and len(args) == 3:
        exercise(*args)
    elif cmd == "tls-exercise" and len(args) == 3:
        tls_exercise(*args)
    elif cmd == "names" and len(args) >= 4:
        names(args[0], args[1], args[2], args[3:])
    elif cmd == "prometheus" and len(args) == 4:
        prometheus(*args)
    elif cmd == "dashboard" and len(args) == 1:
        dashboard(args[0])
    elif cmd == "lint" and len(args) == 2:
        lint(*args)
    else:
        fail(f"usage: {__doc__}")


if __name__ == "__main__":
    main(sys.argv[1:])
