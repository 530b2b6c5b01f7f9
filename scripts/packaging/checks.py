"""The checks of scripts/test-packaging on deploy/ (systemd, Kubernetes, Docker).

Each subcommand prints one line per thing it checked and exits 1 on the first failure; the
live ones start real `lockd serve` processes on loopback only and stop them by pid.

    checks.py flags LOCKD                       every flag and variable the artifacts name exists
    checks.py systemd-static UNIT ENV           the unit's and the env file's settings
    checks.py systemd-cluster UNIT ENV LOCKD DIR [--strace]
                                                3 nodes from the unit's ExecStart, on loopback
    checks.py k8s-static YAML DOCKERFILE        the objects' wiring
    checks.py k8s-pod YAML LOCKD DIR            the StatefulSet's entrypoint, with a stand-in and
                                                with the real binary
    checks.py k8s-cluster YAML LOCKD DIR --outer-net NS --outer-mnt NS
                                                its pods as a cluster, in a private network and
                                                mount namespace (unshare --net --mount)
    checks.py docker-static DOCKERFILE IGNORE ROOT DIR
                                                what the Dockerfile copies, builds and runs
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, NoReturn

ROOT = Path(__file__).resolve().parents[2]

# The variables the unit's ExecStart reads; every other LOCKD_* one in the env file is read by
# lockd itself and must be one `lockd serve --help` names.
UNIT_VARS = {"LOCKD_NODE_ID", "LOCKD_PEERS", "LOCKD_HTTP", "LOCKD_GRPC", "LOCKD_OPTS"}
# The variables the Kubernetes entrypoint reads (POD_NAME from the downward API).
ENTRYPOINT_VARS = {
    "POD_NAME", "LOCKD_FOUNDERS", "LOCKD_PEER_SERVICE", "LOCKD_LISTEN_HOST", "LOCKD_HTTP_PORT",
    "LOCKD_GRPC_PORT", "LOCKD_PEER_PORT", "LOCKD_PROBES_PORT", "LOCKD_DATA_DIR", "LOCKD_ETC", "LOCKD_BIN",
}
# docs/OPERATIONS.md: a stop hands groups over (at most two election timeouts, the maximum
# being 1.5 x --election-timeout-ms), then waits at most 5 s for the node's tasks.
DRAIN_TASKS_S = 5.0


def ok(what: str) -> None:
    print(f"  ok: {what}", flush=True)


def fail(what: str) -> NoReturn:
    print(f"  FAIL: {what}", file=sys.stderr, flush=True)
    sys.exit(1)


def check(cond: object, what: str) -> None:
    if not cond:
        fail(what)
    ok(what)


# --- lockd's own interface ---------------------------------------------------------------------


def lockd_help(lockd: str, *sub: str) -> tuple[set[str], set[str]]:
    """The long flags and the environment variables `lockd [SUB] --help` names."""
    out = subprocess.run([lockd, *sub, "--help"], capture_output=True, text=True, check=True).stdout
    flags = set(re.findall(r"^\s+(?:-\w, )?(--[a-z][a-z0-9-]*)", out, re.M))
    # Clap's [env: X=], and a variable the help names in backticks (the log filter, LOCKD_LOG).
    envs = set(re.findall(r"\[env: ([A-Z0-9_]+)=", out)) | set(re.findall(r"`(LOCKD_[A-Z0-9_]+)`", out))
    return flags, envs


def flags_in(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", text))


# --- systemd -----------------------------------------------------------------------------------


def unit_entries(path: Path) -> list[tuple[str, str, str]]:
    """(section, key, value) in file order, continuation lines joined as systemd does."""
    entries = []
    section = ""
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line[0] in "#;"):
            continue
        if pending and line[:1] in ("#", ";"):
            continue  # systemd drops comment lines inside a continued line
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, _, value = line.partition("=")
        entries.append((section, key.strip(), value.strip()))
    return entries


def unit_get(entries: list[tuple[str, str, str]], key: str) -> list[str]:
    return [v for _, k, v in entries if k == key]


def env_file(path: Path) -> dict[str, str]:
    """systemd's EnvironmentFile= syntax: KEY=VALUE lines, # and ; comments, optional quotes."""
    env = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            fail(f"{path}: '{line}' is not KEY=VALUE")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key.strip()] = value
    return env


def seconds(value: str) -> float:
    """A systemd time span: '30s', '1min 30s', '90'."""
    units = {"ms": 0.001, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600}
    total = 0.0
    for num, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(num) * units[unit or "s"]
    return total


def exec_start_argv(entries: list[tuple[str, str, str]], env: dict[str, str]) -> list[str]:
    """ExecStart= as systemd runs it: words split like a shell, ${VAR} substituted inside a
    word, a word that is only $VAR replaced by the value split at whitespace (none if empty)."""
    line = unit_get(entries, "ExecStart")[-1].lstrip("-@:+!")
    argv: list[str] = []
    for word in shlex.split(line):
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if m:
            argv.extend(env.get(m.group(1), "").split())
            continue
        argv.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda v: env.get(v.group(1), ""), word))
    return argv


def exec_start_vars(entries: list[tuple[str, str, str]]) -> set[str]:
    line = unit_get(entries, "ExecStart")[-1]
    return set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", line))


def cmd_systemd_static(a: argparse.Namespace) -> None:
    unit, envp = Path(a.unit), Path(a.env)
    e = unit_entries(unit)
    env = env_file(envp)

    def one(key: str) -> str:
        return (unit_get(e, key) or [""])[-1]

    check(one("User") == "lockd" and one("Group") == "lockd", "runs as User=lockd Group=lockd")
    check(one("Type") == "notify" and one("NotifyAccess") == "main",
          f"Type={one('Type')} NotifyAccess={one('NotifyAccess')} (lockd sends READY=1 once it serves)")
    check(one("Restart") == "on-failure", "Restart=on-failure (a node whose disk failed exits 1)")
    check(one("RestartPreventExitStatus") == "2", "RestartPreventExitStatus=2 (a refused start exits 2)")
    check(one("KillSignal") == "SIGTERM", "KillSignal=SIGTERM (the graceful leave)")
    check(seconds(one("TimeoutStopSec")) >= 30, f"TimeoutStopSec={one('TimeoutStopSec')} >= 30 s")
    check(one("NoNewPrivileges") == "yes" and one("ProtectSystem") == "strict",
          "NoNewPrivileges=yes, ProtectSystem=strict")
    nofile = int(one("LimitNOFILE") or 0)
    check(nofile >= 2 * 4096 + 512,
          f"LimitNOFILE={nofile} >= twice --max-client-connections' default (4096) plus a few hundred")
    check(one("StateDirectory") == "lockd", "StateDirectory=lockd")
    argv = exec_start_argv(e, env)
    check(argv[0] == "/usr/local/bin/lockd" and argv[1] == "serve",
          "ExecStart runs /usr/local/bin/lockd serve (where the install steps put it)")
    data_dir = argv[argv.index("--data-dir") + 1]
    check(data_dir == "/var/lib/lockd", "ExecStart's --data-dir is the StateDirectory, /var/lib/lockd")
    check(data_dir in one("ReadWritePaths").split(), "ReadWritePaths= holds the data dir")
    check(one("EnvironmentFile") == "/etc/default/lockd", "EnvironmentFile=/etc/default/lockd")
    used = exec_start_vars(e)
    check(used <= set(env), f"every variable ExecStart reads ({', '.join(sorted(used))}) is set in {envp.name}")
    check(used - {"LOCKD_OPTS"} <= UNIT_VARS, "ExecStart reads only the unit's own variables")
    empty = [k for k, v in env.items() if v == "" and k not in UNIT_VARS]
    check(not empty, f"no variable lockd reads is set empty in {envp.name} (clap refuses an empty value)")


def cmd_flags(a: argparse.Namespace) -> None:
    """Every flag and LOCKD_* variable the artifacts name is one this lockd knows."""
    serve_flags, serve_envs = lockd_help(a.lockd, "serve")
    dev_flags, _ = lockd_help(a.lockd, "dev")
    env_text = (ROOT / "deploy/systemd/lockd.env").read_text()
    docker = (ROOT / "deploy/docker/Dockerfile").read_text()
    exec_line = " ".join(unit_get(unit_entries(ROOT / "deploy/systemd/lockd.service"), "ExecStart"))
    named = flags_in(exec_line) | flags_in(env_text)
    unknown = named - serve_flags
    check(not unknown, f"the unit and lockd.env name only `lockd serve` flags ({len(named)} named)"
          + (f"; unknown: {sorted(unknown)}" if unknown else ""))
    script = entrypoint_script(load_yaml(ROOT / "deploy/kubernetes/lockd.yaml"))
    named = {f for f in flags_in(script)}
    unknown = named - serve_flags
    check(not unknown, f"the Kubernetes entrypoint names only `lockd serve` flags ({len(named)} named)"
          + (f"; unknown: {sorted(unknown)}" if unknown else ""))
    cmd = re.search(r"^CMD (\[.*\])", docker, re.M)
    dev_args = json.loads(cmd.group(1)) if cmd else []
    unknown = {f for f in dev_args if f.startswith("--")} - dev_flags
    check(cmd and dev_args[0] == "dev" and not unknown, f"the image's CMD is `lockd {' '.join(dev_args)}` with known flags")
    env_vars = {k for k in env_file(ROOT / "deploy/systemd/lockd.env")}
    commented = set(re.findall(r"^#\s*(LOCKD_[A-Z0-9_]+)=", env_text, re.M))
    unknown = (env_vars | commented) - UNIT_VARS - serve_envs
    check(not unknown, f"lockd.env's other variables are ones `lockd serve` reads ({', '.join(sorted((env_vars | commented) - UNIT_VARS))})"
          + (f"; unknown: {sorted(unknown)}" if unknown else ""))
    k8s_env = {v["name"] for v in lockd_container(load_yaml(ROOT / "deploy/kubernetes/lockd.yaml"))["env"]}
    unknown = {v for v in k8s_env if v.startswith("LOCKD_")} - ENTRYPOINT_VARS - serve_envs
    check(not unknown, "the StatefulSet's LOCKD_* variables are the entrypoint's or ones lockd reads"
          + (f"; unknown: {sorted(unknown)}" if unknown else ""))


# --- live nodes --------------------------------------------------------------------------------


def die_with_parent() -> None:
    """In a child before exec: SIGKILL when this checker dies, so that no node outlives a
    killed run (prctl PR_SET_PDEATHSIG; kept across exec)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, str(e)


def wait_for(what: str, cond: Callable[[], bool], timeout: float, procs: list[subprocess.Popen[bytes]],
             logs: list[Path]) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if cond():
            return time.monotonic() - start
        for p, log in zip(procs, logs):
            if p.poll() is not None:
                sys.stderr.write(log.read_text()[-4000:])
                fail(f"{what}: a node exited early ({p.returncode}; log above)")
        time.sleep(0.1)
    for log in logs:
        sys.stderr.write(f"--- {log}\n{log.read_text()[-3000:]}")
    fail(f"{what}: not within {timeout:.0f} s")


def stop(p: subprocess.Popen[bytes], pid: int, budget: float) -> tuple[int, float]:
    """SIGTERM `pid` (the node); its exit code and how long it took. SIGKILL past `budget`."""
    t0 = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    try:
        rc = p.wait(timeout=budget)
    except subprocess.TimeoutExpired:
        os.kill(pid, signal.SIGKILL)
        p.wait()
        return -9, time.monotonic() - t0
    return rc, time.monotonic() - t0


def traced_pid(p: subprocess.Popen[bytes], program: str) -> int:
    """The pid of `program` as `strace` started it: the child of strace that has exec'd it
    (strace first forks a short-lived probe of its own)."""
    for _ in range(200):
        try:
            kids = Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()
        except OSError:
            kids = []
        for kid in kids:
            try:
                argv0 = Path(f"/proc/{kid}/cmdline").read_bytes().split(b"\0")[0].decode()
            except OSError:
                continue
            if argv0 == program:
                return int(kid)
        time.sleep(0.05)
    fail(f"strace started no {program}")


def syscall_set(group: str, memo: dict[str, set[str]]) -> set[str]:
    """A systemd syscall group, expanded (systemd-analyze syscall-filter)."""
    if group not in memo:
        out = subprocess.run(["systemd-analyze", "syscall-filter", group], capture_output=True,
                             text=True, check=True).stdout
        names: set[str] = set()
        for line in out.splitlines()[1:]:
            s = line.strip()
            if not s or s.startswith("#"):
                continue
            names |= syscall_set(s, memo) if s.startswith("@") else {s}
        memo[group] = names
    return memo[group]


def allowed_syscalls(entries: list[tuple[str, str, str]]) -> set[str]:
    """SystemCallFilter= lines, in order: the first allow list, then '~' lines taking away."""
    memo: dict[str, set[str]] = {}
    allowed: set[str] | None = None
    for value in unit_get(entries, "SystemCallFilter"):
        deny = value.startswith("~")
        names: set[str] = set()
        for item in value.lstrip("~").split():
            names |= syscall_set(item, memo) if item.startswith("@") else {item.split(":")[0]}
        if deny:
            allowed = (allowed or set()) - names
        else:
            allowed = (allowed or set()) | names
    if allowed is None:
        fail("the unit has no SystemCallFilter=")
    return allowed


def check_trace(entries: list[tuple[str, str, str]], traces: list[Path]) -> None:
    text = "".join(t.read_text() for t in traces)
    used = set(re.findall(r"^\d+\s+([a-z_0-9]+)\(", text, re.M))
    check(len(used) > 20, f"strace recorded node 1's system calls ({len(used)} distinct)")
    denied = used - allowed_syscalls(entries)
    check(not denied, "every system call node 1 made is allowed by the unit's SystemCallFilter="
          + (f"; denied: {sorted(denied)}" if denied else ""))
    families = set(re.findall(r"\bsocket(?:pair)?\((AF_[A-Z0-9]+)", text))
    allowed_af = set(" ".join(unit_get(entries, "RestrictAddressFamilies")).split())
    check(families <= allowed_af, f"its sockets' families ({', '.join(sorted(families))}) are in RestrictAddressFamilies=")
    wx = re.findall(r"(?:mmap|mprotect)\([^\n]*PROT_WRITE\|PROT_EXEC[^\n]*", text)
    check(not wx, "it maps no memory writable and executable (MemoryDenyWriteExecute=yes)")


def cmd_systemd_cluster(a: argparse.Namespace) -> None:
    e = unit_entries(Path(a.unit))
    base = env_file(Path(a.env))
    work = Path(a.dir)
    token = work / "admin-token"
    token.write_text("packaging-check-admin-token-0123456789\n")
    token.chmod(0o600)
    secret = work / "peer-secret"
    secret.write_text("packaging-check-peer-secret-0123456789abcdef\n")
    secret.chmod(0o600)
    ports = [(free_port(), free_port(), free_port()) for _ in range(3)]
    peers = ",".join(f"{i + 1}=127.0.0.1:{p[2]}" for i, p in enumerate(ports))
    stop_budget = seconds((unit_get(e, "TimeoutStopSec") or ["90s"])[-1])
    procs: list[subprocess.Popen[bytes]] = []
    pids: list[int] = []
    logs: list[Path] = []
    traces: list[Path] = []
    try:
        for i, (http, grpc, _peer) in enumerate(ports):
            env = dict(base, LOCKD_NODE_ID=str(i + 1), LOCKD_PEERS=peers,
                       LOCKD_HTTP=f"127.0.0.1:{http}", LOCKD_GRPC=f"127.0.0.1:{grpc}",
                       LOCKD_ADMIN_TOKEN_FILE=str(token), LOCKD_PEER_SECRET_FILE=str(secret))
            argv = exec_start_argv(e, env)
            argv[0] = a.lockd
            argv[argv.index("--data-dir") + 1] = str(work / f"node-{i + 1}")
            if i == 0:
                print(f"  node 1: {shlex.join(argv)}", flush=True)
            log = work / f"node-{i + 1}.log"
            logs.append(log)
            # The unit's whole environment is the env file's (systemd passes it on).
            penv = dict(env, PATH=os.environ.get("PATH", "/usr/bin:/bin"))
            if a.strace and i == 0:
                trace = work / "node-1.strace"
                traces.append(trace)
                argv = ["strace", "-f", "-qq", "-o", str(trace), *argv]
            p = subprocess.Popen(argv, env=penv, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                                 preexec_fn=die_with_parent)
            procs.append(p)
            pids.append(traced_pid(p, a.lockd) if a.strace and i == 0 else p.pid)
        urls = [f"http://127.0.0.1:{p[0]}" for p in ports]
        took = wait_for("every node's /readyz answers 200",
                        lambda: all(http_get(u + "/readyz")[0] == 200 for u in urls), 60, procs, logs)
        ok(f"3 nodes started from ExecStart and lockd.env; every /readyz answered 200 after {took:.1f} s")
        check(all(http_get(u + "/livez")[0] == 200 for u in urls), "every /livez answers 200")
        code, s = http_json(urls[0] + "/v1/sessions", {"client": "packaging-check", "ttl_s": 15})
        check(code == 200, f"a session opened through node 1 ({code})")
        code, g = http_json(urls[1] + "/v1/locks/packaging%2Fcheck:acquire",
                            {"session_id": s["session_id"], "owner": "packaging-check", "wait_ms": 0})
        check(code == 200 and g.get("acquired") is True and g.get("token", 0) >= 1,
              f"a lock taken through node 2 (token {g.get('token') if code == 200 else g})")
        status = json.loads(http_get(urls[2] + "/v1/status")[1])
        leaders = {grp["leader"] for grp in status["groups"]}
        check(leaders, f"groups have leaders ({sorted(leaders)})")
        # Stop the nodes one by one, each with SIGTERM as systemd does; a node leading groups
        # hands them over first.
        for i in range(3):
            rc, took = stop(procs[i], pids[i], stop_budget)
            check(rc == 0 and took < stop_budget,
                  f"node {i + 1}: SIGTERM -> exit {rc} in {took:.2f} s (TimeoutStopSec {stop_budget:.0f} s)")
    finally:
        for p, pid in zip(procs, pids):
            if p.poll() is None:
                for victim in (pid, p.pid):
                    try:
                        os.kill(victim, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                p.wait()
    if a.strace:
        check_trace(e, traces)


# --- Kubernetes --------------------------------------------------------------------------------


def load_yaml(path: Path) -> list[dict[str, Any]]:
    import yaml

    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def objects(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def statefulset(docs: list[dict[str, Any]]) -> dict[str, Any]:
    sets = objects(docs, "StatefulSet")
    if len(sets) != 1:
        fail("one StatefulSet")
    return sets[0]


def lockd_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = statefulset(docs)["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "lockd")


def entrypoint_script(docs: list[dict[str, Any]]) -> str:
    c = lockd_container(docs)
    cmd = c.get("command", []) + c.get("args", [])
    if cmd[:2] != ["/bin/sh", "-c"] or len(cmd) != 3:
        fail("the container runs /bin/sh -c SCRIPT")
    return str(cmd[2])


def k8s_expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of command and args: a defined variable is replaced, $$ is
    one $, anything else stays as written."""
    out = []
    i = 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2:end]
                    out.append(env[name] if name in env else text[i:end + 1])
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


def container_env(c: dict[str, Any], pod: str) -> dict[str, str]:
    env = {}
    for v in c.get("env", []):
        if "value" in v:
            env[v["name"]] = str(v["value"])
        elif v.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[v["name"]] = pod
        else:
            fail(f"env {v['name']}: only values and metadata.name are understood here")
    return env


def labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def cmd_k8s_static(a: argparse.Namespace) -> None:
    docs = load_yaml(Path(a.yaml))
    sts = statefulset(docs)
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    c = lockd_container(docs)
    env = container_env(c, "lockd-0")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    check(set(ports) == {"http", "grpc", "peer", "probes"}, "the container names its ports http, grpc, peer and probes")
    check(all(int(env[f"LOCKD_{n.upper()}_PORT"]) == ports[n] for n in ports),
          "LOCKD_HTTP_PORT, LOCKD_GRPC_PORT, LOCKD_PEER_PORT and LOCKD_PROBES_PORT are the container ports")
    check(labels_match(spec["selector"]["matchLabels"], labels), "the StatefulSet's selector matches its pods")
    check(spec["replicas"] == 3 and env["LOCKD_FOUNDERS"] == "3", "3 replicas, all founders")
    check(spec.get("podManagementPolicy") == "Parallel",
          "podManagementPolicy: Parallel (no pod is ready before a quorum of them runs)")

    def port_of(svc: dict[str, Any], p: dict[str, Any]) -> int:
        t = p.get("targetPort", p["port"])
        return ports[t] if isinstance(t, str) else int(t)

    services = objects(docs, "Service")
    headless = [s for s in services if s["spec"].get("clusterIP") == "None"]
    clients = [s for s in services if s["spec"].get("clusterIP") != "None"]
    check(len(headless) == 1 and headless[0]["metadata"]["name"] == spec["serviceName"],
          f"the StatefulSet's serviceName is the headless Service ({spec['serviceName']})")
    h = headless[0]
    check(env["LOCKD_PEER_SERVICE"] == h["metadata"]["name"],
          "the entrypoint's peer names (POD.LOCKD_PEER_SERVICE) are the headless Service's")
    check(h["spec"].get("publishNotReadyAddresses") is True,
          "the headless Service publishes pods before they are ready (peers find each other first)")
    check(labels_match(h["spec"]["selector"], labels) and [port_of(h, p) for p in h["spec"]["ports"]] == [ports["peer"]],
          "the headless Service selects the pods and names the peer port only")
    check(len(clients) == 1, "one client Service")
    cs = clients[0]
    cports = sorted(port_of(cs, p) for p in cs["spec"]["ports"])
    check(labels_match(cs["spec"]["selector"], labels), f"the client Service ({cs['metadata']['name']}) selects the pods")
    check(cports == sorted([ports["http"], ports["grpc"]]) and ports["peer"] not in cports
          and all(p["port"] != ports["peer"] for p in cs["spec"]["ports"]),
          f"the client Service exposes the client ports {cports} and never the peer port {ports['peer']}")
    for probe, path in (("livenessProbe", "/livez"), ("readinessProbe", "/readyz"), ("startupProbe", "/livez")):
        g = c[probe]["httpGet"]
        check(g["path"] == path and ports.get(g["port"], g["port"]) == ports["probes"],
              f"{probe}: GET {path} on the probes port (outside the client cap and client TLS)")
    res = c.get("resources", {})
    check(res.get("requests", {}).get("cpu") and res.get("requests", {}).get("memory")
          and res.get("limits", {}).get("memory"), "resources: CPU and memory requests, a memory limit")
    anti = pod.get("affinity", {}).get("podAntiAffinity", {})
    terms = anti.get("requiredDuringSchedulingIgnoredDuringExecution", []) + [
        t["podAffinityTerm"] for t in anti.get("preferredDuringSchedulingIgnoredDuringExecution", [])]
    check(any(t["topologyKey"] == "kubernetes.io/hostname" and labels_match(t["labelSelector"]["matchLabels"], labels)
              for t in terms), "podAntiAffinity keeps the pods on different machines")
    grace = pod.get("terminationGracePeriodSeconds", 30)
    drain = 2 * 1.5 * 0.4 + DRAIN_TASKS_S
    check(grace >= 2 * drain,
          f"terminationGracePeriodSeconds {grace} is at least twice the SIGTERM drain's bound ({drain:.1f} s"
          " at the default election timeout: hand-over, then the node's tasks; the flush besides)")
    check(pod.get("enableServiceLinks") is False, "enableServiceLinks: false (no service variables beside lockd's LOCKD_*)")
    claims = {t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    data = [n for n in claims if n in mounts and (env["LOCKD_DATA_DIR"] + "/").startswith(mounts[n].rstrip("/") + "/")]
    check(data, f"LOCKD_DATA_DIR ({env['LOCKD_DATA_DIR']}) is on a volumeClaimTemplate, one PVC per pod")
    pdbs = objects(docs, "PodDisruptionBudget")
    check(len(pdbs) == 1 and pdbs[0]["spec"].get("maxUnavailable") == 1
          and labels_match(pdbs[0]["spec"]["selector"]["matchLabels"], labels),
          "a PodDisruptionBudget with maxUnavailable: 1 over the pods")
    for np in objects(docs, "NetworkPolicy"):
        check(labels_match(np["spec"]["podSelector"]["matchLabels"], labels), "the NetworkPolicy selects the pods")
        for rule in np["spec"]["ingress"]:
            names = {p["port"] for p in rule.get("ports", [])}
            if "peer" in names or ports["peer"] in names:
                froms = rule.get("from", [])
                check(froms and all(labels_match(f.get("podSelector", {}).get("matchLabels", {}), labels) for f in froms),
                      "the NetworkPolicy admits the peer port from lockd pods only")
    # The image: the uid the Dockerfile makes, the binary its ENTRYPOINT names.
    docker = Path(a.dockerfile).read_text()
    uid = re.search(r"--uid (\d+)", docker)
    psc = pod.get("securityContext", {})
    check(uid and psc.get("runAsUser") == int(uid.group(1)) == psc.get("fsGroup") and psc.get("runAsNonRoot"),
          f"runs as the image's non-root uid {uid.group(1) if uid else '?'}, which owns the PVC (fsGroup)")
    csc = c.get("securityContext", {})
    check(csc.get("allowPrivilegeEscalation") is False and csc.get("readOnlyRootFilesystem") is True
          and csc.get("capabilities", {}).get("drop") == ["ALL"],
          "no privilege escalation, a read-only root file system, no capabilities")
    entry = re.search(r'^ENTRYPOINT \["([^"]+)"', docker, re.M)
    check(entry and f"${{LOCKD_BIN:-{entry.group(1)}}}" in entrypoint_script(docs),
          "the entrypoint runs the binary the image's ENTRYPOINT names")
    exposed = set(re.search(r"^EXPOSE (.*)$", docker, re.M).group(1).split())  # type: ignore[union-attr]
    check(exposed == {str(ports["http"]), str(ports["grpc"])}, f"the image EXPOSEs the client ports only ({sorted(exposed)})")


def entrypoint_run(script: str, env: dict[str, str], work: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The entrypoint run with a stand-in binary that writes its argv down."""
    shim = work / "lockd-argv"
    out = work / "argv.json"
    shim.write_text(f"#!/usr/bin/env python3\nimport json, sys\njson.dump(sys.argv[1:], open({str(out)!r}, 'w'))\n")
    shim.chmod(0o755)
    if out.exists():
        out.unlink()
    run_env = dict(env, LOCKD_BIN=str(shim), PATH=os.environ.get("PATH", "/usr/bin:/bin"))
    r = subprocess.run(["/bin/sh", "-c", k8s_expand(script, env)], env=run_env, capture_output=True, text=True)
    return r, out


def entrypoint_argv(script: str, env: dict[str, str], work: Path) -> list[str]:
    r, out = entrypoint_run(script, env, work)
    if r.returncode != 0:
        fail(f"the entrypoint failed for {env.get('POD_NAME')}: {r.stderr.strip()}")
    return list(json.loads(out.read_text()))


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def cmd_k8s_pod(a: argparse.Namespace) -> None:
    docs = load_yaml(Path(a.yaml))
    c = lockd_container(docs)
    script = entrypoint_script(docs)
    work = Path(a.dir)
    r = subprocess.run(["/bin/sh", "-n", "-c", script], capture_output=True, text=True)
    check(r.returncode == 0, "the entrypoint parses with /bin/sh -n" + (f": {r.stderr}" if r.stderr else ""))
    name = statefulset(docs)["metadata"]["name"]
    svc = container_env(c, "x")["LOCKD_PEER_SERVICE"]
    founders = ",".join(f"{i + 1}={name}-{i}.{svc}:7270" for i in range(3))
    etc = work / "etc-empty"
    etc.mkdir(exist_ok=True)
    for ordinal in range(3):
        pod = f"{name}-{ordinal}"
        argv = entrypoint_argv(script, dict(container_env(c, pod), LOCKD_ETC=str(etc)), work)
        check(argv[0] == "serve" and flag(argv, "--node-id") == str(ordinal + 1)
              and flag(argv, "--peers") == founders and flag(argv, "--initial-cluster-state") == "new"
              and flag(argv, "--peer") == "0.0.0.0:7270" and flag(argv, "--http") == "0.0.0.0:7070"
              and flag(argv, "--grpc") == "0.0.0.0:7170" and "--admin-token-file" not in argv,
              f"{pod}: node {ordinal + 1}, founder, --peers {founders}")
    argv = entrypoint_argv(script, dict(container_env(c, f"{name}-3"), LOCKD_ETC=str(etc)), work)
    check(flag(argv, "--node-id") == "4" and flag(argv, "--initial-cluster-state") == "existing"
          and flag(argv, "--peers") == f"{founders},4={name}-3.{svc}:7270",
          f"{name}-3 (scaled past the founders): node 4 joins (--initial-cluster-state existing), its own entry added")
    # With the optional secrets and config mounted.
    etc = work / "etc-full"
    for f in ("admin/admin-token", "config/namespaces.toml", "tls/tls.crt", "tls/tls.key",
              "peer-tls/node-2.pem", "peer-tls/node-2-key.pem", "peer-tls/ca.pem",
              "peer-secret/peer-secret"):
        (etc / f).parent.mkdir(parents=True, exist_ok=True)
        (etc / f).write_text("x")
    argv = entrypoint_argv(script, dict(container_env(c, f"{name}-1"), LOCKD_ETC=str(etc)), work)
    check(flag(argv, "--admin-token-file") == f"{etc}/admin/admin-token"
          and flag(argv, "--config") == f"{etc}/config/namespaces.toml"
          and flag(argv, "--tls-cert-file") == f"{etc}/tls/tls.crt"
          and flag(argv, "--peer-cert-file") == f"{etc}/peer-tls/node-2.pem"
          and flag(argv, "--peer-ca-file") == f"{etc}/peer-tls/ca.pem"
          and flag(argv, "--peer-secret-file") == f"{etc}/peer-secret/peer-secret",
          "with the optional secrets mounted: admin token, namespaces, client TLS, node 2's peer "
          "certificate, the peer secret")
    # The lockd-nodes ConfigMap: `founded` guards the founders' data dirs; POD=ID gives a pod
    # whose disk was lost a new node id.
    nodes = work / "etc-nodes"
    (nodes / "nodes").mkdir(parents=True, exist_ok=True)
    (nodes / "nodes" / "founded").write_text("yes")
    data = work / "pvc-1" / "data"
    env = dict(container_env(c, f"{name}-1"), LOCKD_ETC=str(nodes), LOCKD_DATA_DIR=str(data))
    r, _ = entrypoint_run(script, env, work)
    check(r.returncode == 1 and "refusing to start node 2 again" in r.stderr,
          f"founded, {name}-1 on an empty data dir (a lost PVC) refuses to start as node 2 again")
    data.mkdir(parents=True)
    (data / "identity").write_text("x")
    argv = entrypoint_argv(script, env, work)
    check(flag(argv, "--node-id") == "2" and flag(argv, "--initial-cluster-state") == "new",
          f"founded, {name}-1 with its data starts as node 2")
    (nodes / "nodes" / f"{name}-1").write_text("5")
    shutil.rmtree(data)
    argv = entrypoint_argv(script, env, work)
    check(flag(argv, "--node-id") == "5" and flag(argv, "--initial-cluster-state") == "existing"
          and flag(argv, "--peers") == f"1={name}-0.{svc}:7270,3={name}-2.{svc}:7270,5={name}-1.{svc}:7270",
          f"{name}-1 given id 5 (lockd-nodes): node 5 joins on its empty data dir, node 2 left out of --peers")
    (nodes / "nodes" / f"{name}-1").write_text("five")
    r, _ = entrypoint_run(script, env, work)
    check(r.returncode == 1 and "holds no node id" in r.stderr, "an id that is not a number is refused")
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    check({"/etc/lockd/admin", "/etc/lockd/config", "/etc/lockd/tls", "/etc/lockd/peer-tls", "/etc/lockd/nodes",
           "/etc/lockd/peer-secret"} <= mounts,
          "those six directories are the container's volume mounts")
    r = subprocess.run(["/bin/sh", "-c", k8s_expand(script, container_env(c, "web"))],
                       env=dict(container_env(c, "web"), PATH=os.environ.get("PATH", "")), capture_output=True, text=True)
    check(r.returncode != 0 and "ordinal" in r.stderr, "a pod name without an ordinal is refused")

    # The real binary: pod lockd-0 on loopback (its peers' names do not resolve here, so it
    # never gets a quorum: live, not ready), then SIGTERM as the kubelet sends it.
    http, grpc, peer = free_port(), free_port(), free_port()
    env = dict(container_env(c, f"{name}-0"), LOCKD_LISTEN_HOST="127.0.0.1", LOCKD_HTTP_PORT=str(http),
               LOCKD_GRPC_PORT=str(grpc), LOCKD_PEER_PORT=str(peer), LOCKD_DATA_DIR=str(work / "pod-0" / "data"),
               LOCKD_ETC=str(work / "etc-pod"), LOCKD_BIN=a.lockd, PATH=os.environ.get("PATH", "/usr/bin:/bin"))
    (work / "etc-pod" / "admin").mkdir(parents=True, exist_ok=True)
    (work / "etc-pod" / "admin" / "admin-token").write_text("packaging-check-admin-token-0123456789\n")
    log = work / "pod-0.log"
    p = subprocess.Popen(["/bin/sh", "-c", k8s_expand(script, env)], env=env, stdout=log.open("wb"),
                         stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
    try:
        url = f"http://127.0.0.1:{http}"
        took = wait_for("/livez answers 200", lambda: http_get(url + "/livez")[0] == 200, 30, [p], [log])
        ok(f"{name}-0 from the entrypoint with the real lockd: /livez 200 after {took:.1f} s")
        code, body = http_get(url + "/readyz")
        check(code == 503, f"/readyz answers 503 without a quorum ({body.strip()[:100]})")
        # The start-up banner ("lockd node 1 (pid N): HTTP ...") follows the ports' opening.
        wait_for("the start-up banner in the log", lambda: '"lockd node 1 (pid' in log.read_text(), 10, [p], [log])
        # Complete lines only: the node may be writing the next one.
        lines = [ln for ln in log.read_text().split("\n")[:-1] if ln.strip()]
        for ln in lines:
            try:
                json.loads(ln)
            except ValueError:
                fail(f"a log line is not JSON (LOCKD_LOG_FORMAT=json): {ln[:200]}")
        ok(f"stderr is JSON lines (LOCKD_LOG_FORMAT=json), {len(lines)} so far, the banner naming node 1 among them")
        grace = statefulset(docs)["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
        rc, took = stop(p, p.pid, grace)  # the shell exec'd lockd: same pid
        check(rc == 0, f"SIGTERM -> exit {rc} in {took:.2f} s (terminationGracePeriodSeconds {grace})")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def http_json(url: str, body: dict[str, Any] | None = None, token: str | None = None,
              timeout: float = 30, method: str | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    method = method or ("POST" if body is not None else "GET")
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def members_add(url: str, node_id: int, peer_addr: str, token: str) -> tuple[int, Any, int]:
    """POST /v1/admin/members; a 409 member_change_refused (the node acknowledged nothing for
    5 s, e.g. on a loaded machine) is repeated as docs/API.md says, up to 4 calls in all."""
    for attempt in range(1, 5):
        code, body = http_json(url + "/v1/admin/members", {"node_id": node_id, "peer_addr": peer_addr},
                               token=token, timeout=60)
        if code != 409 or "member_change_refused" not in str(body):
            return code, body, attempt
    return code, body, attempt


def loopback_up() -> None:
    """Brings up `lo` in this (new, empty) network namespace: SIOCGIFFLAGS, then SIOCSIFFLAGS
    with IFF_UP."""
    import fcntl
    import struct

    with socket.socket() as s:
        ifr = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(s, 0x8913, ifr))[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sH14s", b"lo", flags | 1, b""))


def cmd_k8s_cluster(a: argparse.Namespace) -> None:
    """The StatefulSet's pods as Kubernetes would run them, in a network and mount namespace of
    this run's own (`unshare --net --mount`): pod lockd-N at 127.0.0.(N+1) on the manifest's
    ports, its DNS name lockd-N.lockd in a private /etc/hosts, its PVC a directory."""
    # The caller's namespaces (readlink /proc/self/ns/net, .../mnt), from outside the unshare:
    # /etc/hosts is bind-mounted over below, which must never happen in the machine's own.
    for ns, outer in (("net", a.outer_net), ("mnt", a.outer_mnt)):
        if os.readlink(f"/proc/self/ns/{ns}") == outer:
            fail(f"k8s-cluster runs only in a {ns} namespace of its own (unshare --net --mount)")
    docs = load_yaml(Path(a.yaml))
    sts = statefulset(docs)
    name = sts["metadata"]["name"]
    c = lockd_container(docs)
    script = entrypoint_script(docs)
    grace = sts["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
    replicas = int(sts["spec"]["replicas"])
    work = Path(a.dir)
    svc = container_env(c, "x")["LOCKD_PEER_SERVICE"]
    loopback_up()
    hosts = work / "hosts"
    hosts.write_text("127.0.0.1 localhost\n" + "".join(
        f"127.0.0.{i + 1} {name}-{i}.{svc}\n" for i in range(replicas + 1)))
    subprocess.run(["mount", "--bind", str(hosts), "/etc/hosts"], check=True)
    etc = work / "etc"
    (etc / "admin").mkdir(parents=True, exist_ok=True)
    token = "packaging-check-admin-token-0123456789"
    (etc / "admin" / "admin-token").write_text(token + "\n")
    # The manifest's header asks for the peer secret before the first start.
    (etc / "peer-secret").mkdir(parents=True, exist_ok=True)
    (etc / "peer-secret" / "peer-secret").write_text("packaging-check-peer-secret-0123456789abcdef\n")
    port = {n: int(container_env(c, "x")[f"LOCKD_{n.upper()}_PORT"]) for n in ("http", "grpc", "peer")}
    procs: dict[int, subprocess.Popen[bytes]] = {}
    logs: dict[int, Path] = {}

    def start(ordinal: int) -> None:
        pod = f"{name}-{ordinal}"
        env = dict(container_env(c, pod), LOCKD_LISTEN_HOST=f"127.0.0.{ordinal + 1}",
                   LOCKD_DATA_DIR=str(work / f"data-{pod}" / "data"), LOCKD_ETC=str(etc),
                   LOCKD_BIN=a.lockd, PATH=os.environ.get("PATH", "/usr/bin:/bin"))
        logs[ordinal] = work / f"{pod}.log"
        procs[ordinal] = subprocess.Popen(["/bin/sh", "-c", k8s_expand(script, env)], env=env,
                                          stdout=logs[ordinal].open("ab"), stderr=subprocess.STDOUT,
                                          preexec_fn=die_with_parent)

    def url(ordinal: int) -> str:
        return f"http://127.0.0.{ordinal + 1}:{port['http']}"

    def ready(ordinals: list[int], what: str, timeout: float = 60) -> float:
        return wait_for(what, lambda: all(http_get(url(o) + "/readyz")[0] == 200 for o in ordinals),
                        timeout, [procs[o] for o in ordinals], [logs[o] for o in ordinals])

    try:
        founders = list(range(replicas))
        for o in founders:
            start(o)
        took = ready(founders, "the founders' /readyz")
        ok(f"{replicas} pods started together (Parallel) from the entrypoint, ports {port['http']}/{port['grpc']}/"
           f"{port['peer']}, peers by DNS name: every /readyz 200 after {took:.1f} s")
        lock = "packaging%2Fk8s"
        code, sess = http_json(url(0) + "/v1/sessions", {"client": "packaging-check", "ttl_s": 60})
        check(code == 200, f"a session through {name}-0 ({code})")
        code, g = http_json(url(1) + f"/v1/locks/{lock}:acquire",
                            {"session_id": sess["session_id"], "owner": "packaging-check", "wait_ms": 0})
        check(code == 200 and g.get("acquired") is True, f"a lock through {name}-1 (token {g.get('token') if code == 200 else g})")
        # A rolling update: the controller stops the highest ordinal, starts it again on its
        # PVC, and waits until it is ready before the next.
        last = founders[-1]
        rc, took = stop(procs[last], procs[last].pid, grace)
        check(rc == 0, f"{name}-{last}: SIGTERM -> exit {rc} in {took:.2f} s (terminationGracePeriodSeconds {grace})")
        start(last)
        took = ready([last], f"{name}-{last} ready again")
        ok(f"{name}-{last} restarted on its PVC (--initial-cluster-state new on a used data dir): ready after {took:.1f} s")
        def holds(o: int) -> bool:
            code, held = http_json(url(o) + f"/v1/locks/{lock}", token=token)
            return code == 200 and held.get("token") == g["token"] \
                and (held.get("holder") or {}).get("owner") == "packaging-check"

        wait_for(f"the lock as {name}-{last} reads it", lambda: holds(last), 10, [procs[last]], [logs[last]])
        ok(f"read through {name}-{last}, the lock is still held by its owner with token {g['token']}")
        # kubectl scale --replicas 4: the new pod is a joiner, ready once it has been added.
        new = replicas
        start(new)
        wait_for(f"{name}-{new} /livez", lambda: http_get(url(new) + "/livez")[0] == 200, 30, [procs[new]], [logs[new]])
        code, body = http_get(url(new) + "/readyz")
        check(code == 503, f"{name}-{new} (node {new + 1}, joiner) is live and not ready before it is added")
        peer_addr = f"{name}-{new}.{svc}:{port['peer']}"
        code, members, calls = members_add(url(0), new + 1, peer_addr, token)
        check(code == 200, f"members add {new + 1} {peer_addr} through {name}-0 ({code} after {calls} call(s)"
              f"{'' if code == 200 else ': ' + str(members)[:300]})")
        took = ready([new], f"{name}-{new} ready after members add")
        code, listing = http_json(url(new) + "/v1/admin/members", token=token)
        rows = [m for grp in listing["groups"] for m in grp["members"] if m["node_id"] == new + 1]
        check(rows and all(m["peer_addr"] == peer_addr for m in rows),
              f"{name}-{new} is ready after {took:.1f} s, a member of {len(rows)} groups at {peer_addr}")
        # A lost disk, as the manifest's header says to handle it: with `founded` set, the pod
        # refuses to come back as its old id; the id is removed, the pod given a new one.
        (etc / "nodes").mkdir(exist_ok=True)
        (etc / "nodes" / "founded").write_text("yes")
        lost = 1
        rc, took = stop(procs[lost], procs[lost].pid, grace)
        check(rc == 0, f"{name}-{lost}: SIGTERM -> exit {rc} in {took:.2f} s")
        shutil.rmtree(work / f"data-{name}-{lost}")
        start(lost)
        try:
            rc = procs[lost].wait(timeout=10)
        except subprocess.TimeoutExpired:
            fail(f"{name}-{lost} started on an empty data dir as node {lost + 1}")
        check(rc == 1 and "refusing to start node" in logs[lost].read_text(),
              f"{name}-{lost} with a lost PVC refuses to start as node {lost + 1} again (exit {rc})")
        code, body = http_json(url(0) + f"/v1/admin/members/{lost + 1}", token=token, method="DELETE", timeout=60)
        check(code == 200, f"members remove {lost + 1} ({code}{'' if code == 200 else ': ' + str(body)[:300]})")
        new_id = replicas + 2
        (etc / "nodes" / f"{name}-{lost}").write_text(str(new_id))
        start(lost)
        wait_for(f"{name}-{lost} /livez", lambda: http_get(url(lost) + "/livez")[0] == 200, 30, [procs[lost]], [logs[lost]])
        peer_addr = f"{name}-{lost}.{svc}:{port['peer']}"
        code, body, calls = members_add(url(0), new_id, peer_addr, token)
        check(code == 200, f"members add {new_id} {peer_addr} ({code} after {calls} call(s)"
              f"{'' if code == 200 else ': ' + str(body)[:300]})")
        took = ready([lost], f"{name}-{lost} ready as node {new_id}")
        wait_for(f"the lock as {name}-{lost} reads it", lambda: holds(lost), 10, [procs[lost]], [logs[lost]])
        ok(f"{name}-{lost} is back as node {new_id}, ready after {took:.1f} s; through it the lock is still held"
           f" with token {g['token']}")
        for o in sorted(procs, reverse=True):
            rc, took = stop(procs[o], procs[o].pid, grace)
            check(rc == 0, f"{name}-{o}: SIGTERM -> exit {rc} in {took:.2f} s")
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


# --- Docker ------------------------------------------------------------------------------------


def ignore_rules(path: Path) -> list[tuple[bool, re.Pattern[str]]]:
    """.dockerignore patterns (Go filepath.Match plus **), in order; True for an exclusion."""
    rules = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        neg = line.startswith("!")
        pat = os.path.normpath(line.lstrip("!").strip().lstrip("/"))
        rx = ""
        i = 0
        while i < len(pat):
            if pat.startswith("**/", i):
                rx += "(?:.*/)?"
                i += 3
            elif pat.startswith("**", i):
                rx += ".*"
                i += 2
            elif pat[i] == "*":
                rx += "[^/]*"
                i += 1
            elif pat[i] == "?":
                rx += "[^/]"
                i += 1
            else:
                rx += re.escape(pat[i])
                i += 1
        rules.append((not neg, re.compile(rx + r"\Z")))
    return rules


def ignored(rules: list[tuple[bool, re.Pattern[str]]], rel: str) -> bool:
    """Whether `rel` is left out of the context: the last pattern matching it or a parent wins."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    out = False
    for exclude, rx in rules:
        if any(rx.match(p) for p in prefixes):
            out = exclude
    return out


def cmd_docker_static(a: argparse.Namespace) -> None:
    import dockerfile

    root = Path(a.root)
    work = Path(a.dir)
    cmds = dockerfile.parse_file(a.dockerfile)
    froms = [c for c in cmds if c.cmd == "FROM"]
    check(len(froms) == 2 and froms[0].value[0] == "rust:1-bookworm" and froms[1].value == ("debian:bookworm-slim",),
          "two stages: rust:1-bookworm builds, debian:bookworm-slim runs")
    stage_of = []
    stage = -1
    for c in cmds:
        if c.cmd == "FROM":
            stage += 1
        stage_of.append(stage)
    runs = " ".join(" ".join(c.value) for c, s in zip(cmds, stage_of) if c.cmd == "RUN" and s == 0)
    build = re.search(r"cargo build ([^&;]*)", runs)
    args = build.group(1).split() if build else []
    pkgs = [args[i + 1] for i, x in enumerate(args) if x == "-p"]
    check("--release" in args and "--locked" in args and sorted(pkgs) == ["lockctl", "lockd-server"],
          "the builder runs cargo build --release --locked -p lockd-server -p lockctl")
    final = [c for c, s in zip(cmds, stage_of) if s == 1]
    user = [c.value[0] for c in final if c.cmd == "USER"]
    check(user and user[-1].split(":")[0] not in ("0", "root"), f"the image runs as a non-root user ({user[-1] if user else '-'})")
    check(any(c.cmd == "VOLUME" and "/var/lib/lockd" in c.value for c in final), "VOLUME /var/lib/lockd")
    entry = [c.value for c in final if c.cmd == "ENTRYPOINT"]
    check(entry and entry[-1][0].endswith("/lockd") and len(entry[-1]) == 1, f"ENTRYPOINT {entry[-1] if entry else '-'}")
    copied = [c for c in final if c.cmd == "COPY" and any(f.startswith("--from=") for f in c.flags)]
    bins = {Path(v).name for c in copied for v in c.value[:-1]}
    check({"lockd", "lockctl"} <= bins, "the runtime stage copies lockd and lockctl from the builder")
    # The build context: .dockerignore applied to what the builder copies from it.
    rules = ignore_rules(Path(a.ignore))
    check(ignored(rules, "target") and ignored(rules, "target/release/lockd") and ignored(rules, ".git"),
          ".dockerignore leaves out target/ and .git")
    ctx = work / "context"
    if ctx.exists():
        shutil.rmtree(ctx)
    ctx.mkdir(parents=True)
    sources = [v for c, s in zip(cmds, stage_of) if c.cmd in ("COPY", "ADD") and s == 0 and not c.flags
               for v in c.value[:-1]]
    nfiles = 0
    for src in sources:
        path = root / src
        check(path.exists() and not ignored(rules, src), f"COPY {src}: exists and is in the build context")
        files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
        for f in files:
            rel = f.relative_to(root).as_posix()
            if ignored(rules, rel):
                continue
            (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, ctx / rel)
            nfiles += 1
    # What cargo metadata does not read: files build scripts (relative to their crate) and
    # include_str!/include_bytes! (relative to the source file) take from outside their crate.
    refs = 0
    for rs in ctx.rglob("*.rs"):
        text = rs.read_text(errors="replace")
        found = [(rs.parent, m) for m in re.findall(r'include_(?:str|bytes)!\(\s*"([^"]+)"', text)]
        if rs.name == "build.rs":
            found += [(rs.parent, m) for m in re.findall(r'"((?:\.\./)+[^"]*)"', text)]
        for base, ref in found:
            target = (base / ref).resolve()
            if not str(target).startswith(str(ctx.resolve()) + "/") or not target.exists():
                fail(f"{rs.relative_to(ctx)} reads {ref}, which is not in the build context")
            refs += 1
    ok(f"the {refs} files that build scripts and include_str!/include_bytes! name are in the context")
    host = re.search(r"^host: (\S+)", subprocess.run(["rustc", "-vV"], capture_output=True, text=True,
                                                      check=True).stdout, re.M)
    r = subprocess.run(["cargo", "metadata", "--locked", "--format-version", "1",
                        "--filter-platform", host.group(1) if host else "x86_64-unknown-linux-gnu"],
                       cwd=ctx, capture_output=True, text=True, env=dict(os.environ, CARGO_TARGET_DIR=str(work / "ctx-target")))
    if r.returncode != 0:
        fail(f"cargo metadata --locked in the build context: {r.stderr.strip()[-800:]}")
    meta = json.loads(r.stdout)
    members = {p["name"] for p in meta["packages"] if p["id"] in meta["workspace_members"]}
    check({"lockd-server", "lockctl"} <= members,
          f"the context ({nfiles} files) is a whole workspace: cargo metadata --locked resolves it, lockd-server and lockctl among its members")
    bins = {t["name"] for p in meta["packages"] if p["name"] in ("lockd-server", "lockctl")
            for t in p["targets"] if "bin" in t["kind"]}
    check({"lockd", "lockctl"} <= bins, "those packages build the binaries lockd and lockctl the runtime stage copies")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("flags")
    p.add_argument("lockd")
    p.set_defaults(fn=cmd_flags)
    p = sub.add_parser("systemd-static")
    p.add_argument("unit")
    p.add_argument("env")
    p.set_defaults(fn=cmd_systemd_static)
    p = sub.add_parser("systemd-cluster")
    p.add_argument("unit")
    p.add_argument("env")
    p.add_argument("lockd")
    p.add_argument("dir")
    p.add_argument("--strace", action="store_true")
    p.set_defaults(fn=cmd_systemd_cluster)
    p = sub.add_parser("k8s-static")
    p.add_argument("yaml")
    p.add_argument("dockerfile")
    p.set_defaults(fn=cmd_k8s_static)
    p = sub.add_parser("k8s-pod")
    p.add_argument("yaml")
    p.add_argument("lockd")
    p.add_argument("dir")
    p.set_defaults(fn=cmd_k8s_pod)
    p = sub.add_parser("k8s-cluster")
    p.add_argument("yaml")
    p.add_argument("lockd")
    p.add_argument("dir")
    p.add_argument("--outer-net", required=True)
    p.add_argument("--outer-mnt", required=True)
    p.set_defaults(fn=cmd_k8s_cluster)
    p = sub.add_parser("docker-static")
    p.add_argument("dockerfile")
    p.add_argument("ignore")
    p.add_argument("root")
    p.add_argument("dir")
    p.set_defaults(fn=cmd_docker_static)
    a = ap.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
