#!/usr/bin/env python3
"""Structure checks that verify runs (`scripts/verify`), as TigerBeetle's tidy does for its tree.

1. Layers. In a crate with a layer table below (lockd-core, lockd-raft, lockd-server), a file may name (through `crate::`, `super::`
   or a child module) files of its own layer and of the layers listed before it, never of a
   later one. Names that lib.rs re-exports count as the file that defines them, so an import
   cannot climb a layer by going through the crate root.
2. Circles. No import circle among the files of lockd-core, lockd-raft and lockd-server (a
   file's links to its own folder's mod.rs are family, not circles), except the circles listed
   in scripts/tidy-allow.txt; a listed circle that has shrunk or gone must be taken off the list.
3. Function length. No function over 70 lines in those crates' non-test code, except the
   functions listed in scripts/tidy-allow.txt at no more than their listed length; a listed
   function that got shorter must be listed at its new length (or taken off at 70 or less).

The allow-list may only shrink. Run from anywhere: python3 scripts/tidy.py
"""

import collections
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
CRATES = ["crates/lockd-core/src", "crates/lockd-raft/src", "crates/lockd-server/src"]
MAX_FN_LINES = 70
ALLOW = os.path.join(ROOT, "scripts", "tidy-allow.txt")

# Layers, bottom first. An entry ending in "/" is a folder (every file under it); any other
# entry is one top-level file (without ".rs"). lib.rs and main.rs sit above every layer.
LAYERS = {
    "crates/lockd-core/src": [
        # The records: the protocol's vocabulary (commands, replies, rejections, limits) and
        # the state's parts (locks and sessions, buckets and moves, groups, the cluster).
        ["bucket", "cluster", "entity/", "limits", "ownership", "topology", "types"],
        # Compact storage of the lock records.
        ["lock_map"],
        # The lock table and the command dispatch.
        ["machine"],
        # Over the table: the move and topology commands, reads, the snapshot image, the
        # invariant checks.
        ["invariants", "ownership_commands", "query", "snapshot", "topology_commands"],
    ],
    "crates/lockd-raft/src": [
        # Leaves: plain data and helpers that know no group, peer or Raft.
        ["audit", "clock", "error", "identity", "placement", "private", "watch", "wire"],
        # The transport: admits peer calls and hands them to an `Inbound`; no group, no openraft.
        ["peer/"],
        # The openraft glue and the applied state (the only folder naming openraft); the node
        # configuration it is built from.
        ["raft/", "config"],
        # One group: routed propose, keepalive and read; leader duties; remote groups.
        ["group/"],
        # The node: hosting, membership, balance, the inbound side of the peer port.
        ["node/"],
    ],
    "crates/lockd-server/src": [
        # Parts that know no service: errors, configuration, credentials, TLS, connection caps,
        # backup documents, the audit log, contention reports.
        ["audit", "authfail", "backup", "config", "conns", "contention", "error", "inspect", "opens",
         "tls"],
        # What the node shows: watches and metrics.
        ["watches", "metrics"],
        # The node's effect sink: parked waits, session streams, the janitor's orphans.
        ["waits"],
        # What one node asks another about a group (plain data and pure reads).
        ["ask"],
        # The service: credentials, budgets, sessions, locks, the restore gate.
        ["service/"],
        # Operations over the service: routing to any group, membership, namespaces, moves,
        # topology. The service never calls them.
        ["admin", "moves", "namespaces", "route", "status", "topology"],
        # The edge: HTTP, gRPC, the command line; the ports and the background duties that
        # start() runs.
        ["cli", "grpc", "http"],
        ["duties", "servers", "systemd"],
    ],
}


def blank(src):
    """The source with comments, strings and char literals blanked (newlines kept)."""
    out, i, n = [], 0, len(src)
    while i < n:
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
            continue
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
            continue
        m = re.match(r'r(#*)"', src[i : i + 10])
        if m and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            end = '"' + m.group(1)
            j = src.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
            continue
        if src[i] == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            j += 1
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
            continue
        if src[i] == "'":
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\x[0-9a-fA-F]{2}|\\.|[^\\'])'", src[i : i + 12])
            if m:
                out.append(" " * len(m.group(0)))
                i += len(m.group(0))
                continue
        out.append(src[i])
        i += 1
    return "".join(out)


def closing(s, k):
    """Index of the brace closing the one at or after `k`."""
    depth = 0
    for j in range(k, len(s)):
        if s[j] == "{":
            depth += 1
        elif s[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(s) - 1


def test_spans(s):
    spans = [
        (m.start(), closing(s, m.end() - 1))
        for m in re.finditer(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", s)
    ]
    for m in re.finditer(r"#\[(tokio::)?test[^\]]*\]", s):
        spans.append((m.start(), closing(s, s.find("{", s.find("fn ", m.end())))))
    return spans


def without_tests(s):
    kept, last = [], 0
    for a, b in sorted(test_spans(s)):
        if a >= last:
            kept.append(s[last:a])
            kept.append(re.sub(r"[^\n]", " ", s[a : b + 1]))
            last = b + 1
    return "".join(kept) + s[last:]


def modules(src_dir):
    """Module path (tuple) -> (file path, blanked non-test source)."""
    mods = {}
    for dp, _, names in os.walk(os.path.join(ROOT, src_dir)):
        for f in names:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dp, f)
            rel = os.path.relpath(path, os.path.join(ROOT, src_dir))
            parts = rel[:-3].split("/")
            if rel in ("lib.rs", "main.rs"):
                parts = []
            elif parts[-1] == "mod":
                parts = parts[:-1]
            mods[tuple(parts)] = (path, without_tests(blank(open(path).read())))
    return mods


def edges(mods, through_reexports):
    """Module -> the modules it names (family links to its own folder's mod.rs left out)."""
    reexports = {}
    if () in mods and through_reexports:
        for m in re.finditer(r"pub use ([\w:]+)::(\{[^}]*\}|\w+)", mods[()][1]):
            target = tuple(m.group(1).split("::"))
            for item, alias in re.findall(r"\b([A-Za-z_]\w*)(?:\s+as\s+(\w+))?", m.group(2).strip("{}")):
                reexports[alias or item] = target

    def resolve(path):
        for k in range(len(path), 0, -1):
            if path[:k] in mods:
                return path[:k]
        return reexports.get(path[0])

    out = collections.defaultdict(set)
    for mod, (path, s) in mods.items():
        here = list(mod) if path.endswith(("mod.rs", "lib.rs", "main.rs")) else list(mod[:-1])
        refs = [tuple(m.group(1).split("::")) for m in re.finditer(r"\bcrate::((?:\w+::)*\w+)", s)]
        for m in re.finditer(r"\bcrate::\{([^;]*?)\}", s, re.S):
            refs += [tuple(x.split("::")) for x in re.findall(r"\w+(?:::\w+)*", m.group(1))]
        for m in re.finditer(r"\b((?:super::)+)(\{[^;]*?\}|(?:\w+::)*\w+)", s, re.S):
            base = tuple(mod[: len(mod) - m.group(1).count("super::")])
            refs += [base + tuple(x.split("::")) for x in re.findall(r"\w+(?:::\w+)*", m.group(2))]
        for k in re.findall(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", s, re.M):
            if re.search(r"\b" + k + r"::", s):
                refs.append(tuple(here) + (k,))
        for r in refs:
            t = resolve(r)
            if t is None or t == mod or t == ():
                continue
            if t == mod[:-1]:
                continue  # a file naming its own folder's mod.rs
            out[mod].add(t)
    return out


def circles(mods, links):
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(links[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(comp)

    for v in sorted(mods):
        if v not in index:
            visit(v)
    return found


def file_of(mods, mod, src_dir):
    return os.path.relpath(mods[mod][0], os.path.join(ROOT, src_dir))


def layer_of(layers, rel):
    for i, layer in enumerate(layers):
        for entry in layer:
            if entry.endswith("/") and rel.startswith(entry):
                return i
            if rel == entry + ".rs":
                return i
    return None


def long_functions(src_dir):
    found = []
    for dp, _, names in os.walk(os.path.join(ROOT, src_dir)):
        for f in names:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dp, f)
            s = blank(open(path).read())
            spans = test_spans(s)
            for m in re.finditer(r"\bfn\s+(\w+)\s*(<[^{;]*?>)?\s*\(", s):
                if any(a <= m.start() <= b for a, b in spans):
                    continue
                j, depth = m.end(), 1
                while j < len(s) and depth:
                    depth += {"(": 1, ")": -1}.get(s[j], 0)
                    j += 1
                while j < len(s) and s[j] not in "{;":
                    j += 1
                if j >= len(s) or s[j] == ";":
                    continue
                a = s.count("\n", 0, m.start()) + 1
                b = s.count("\n", 0, closing(s, j)) + 1
                rel = os.path.relpath(path, ROOT)
                found.append((rel, m.group(1), b - a + 1))
    return found


def read_allow():
    allowed_fns, allowed_circles = {}, []
    for n, line in enumerate(open(ALLOW), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        kind, _, rest = line.partition(" ")
        if kind == "fn":
            key, lines = rest.rsplit(" ", 1)
            allowed_fns[key.strip()] = int(lines)
        elif kind == "circle":
            allowed_circles.append(set(rest.split()))
        else:
            sys.exit(f"tidy: {ALLOW}:{n}: a line starts with 'fn' or 'circle', not '{kind}'")
    return allowed_fns, allowed_circles


def main():
    problems = []
    allowed_fns, allowed_circles = read_allow()
    used_circles = set()

    for src_dir, layers in LAYERS.items():
        mods = modules(src_dir)
        for mod, targets in sorted(edges(mods, through_reexports=True).items()):
            rel = file_of(mods, mod, src_dir)
            mine = layer_of(layers, rel)
            if mine is None:
                if rel not in ("lib.rs", "main.rs"):
                    problems.append(f"{src_dir}/{rel}: in no layer of scripts/tidy.py's LAYERS")
                continue
            for t in sorted(targets):
                trel = file_of(mods, t, src_dir)
                theirs = layer_of(layers, trel)
                if theirs is not None and theirs > mine:
                    problems.append(
                        f"{src_dir}/{rel} imports {trel}, a layer above it "
                        f"({'/'.join(layers[theirs])} over {'/'.join(layers[mine])}): "
                        "move the item down or pass it in (a trait, a callback)"
                    )

    for src_dir in CRATES:
        mods = modules(src_dir)
        for comp in circles(mods, edges(mods, through_reexports=False)):
            files = {os.path.join(src_dir, file_of(mods, m, src_dir)) for m in comp}
            hit = [i for i, a in enumerate(allowed_circles) if files <= a]
            if not hit:
                problems.append(f"import circle of {len(files)} files: {' '.join(sorted(files))}")
            for i in hit:
                used_circles.add(i)
                if files != allowed_circles[i]:
                    problems.append(
                        "a listed circle shrank: list it in scripts/tidy-allow.txt as "
                        f"`circle {' '.join(sorted(files))}`"
                    )
    for i, a in enumerate(allowed_circles):
        if i not in used_circles:
            problems.append(f"a listed circle is gone: take `circle {' '.join(sorted(a))}` off scripts/tidy-allow.txt")

    seen, longest = set(), {}
    for src_dir in CRATES:
        for rel, name, lines in long_functions(src_dir):
            # Several functions of one name in a file (trait impls) are held to the longest.
            key = f"{rel}::{name}"
            longest[key] = max(lines, longest.get(key, 0))
    for key, lines in sorted(longest.items()):
        if key in allowed_fns:
            seen.add(key)
            if lines > allowed_fns[key]:
                problems.append(f"{key} is {lines} lines, over its listed {allowed_fns[key]}: split it")
            elif lines < allowed_fns[key]:
                fix = f"list it at {lines}" if lines > MAX_FN_LINES else "take it off the list"
                problems.append(f"{key} shrank to {lines} lines: {fix} in scripts/tidy-allow.txt")
        elif lines > MAX_FN_LINES:
            problems.append(f"{key} is {lines} lines (at most {MAX_FN_LINES}): split it")
    for key in sorted(set(allowed_fns) - seen):
        problems.append(f"{key} is listed in scripts/tidy-allow.txt but no longer exists: take it off")

    for p in problems:
        print(f"tidy: {p}", file=sys.stderr)
    over = sum(1 for k, v in allowed_fns.items() if v > MAX_FN_LINES)
    print(
        f"tidy: {len(problems)} problem(s); {len(allowed_circles)} listed circle(s) and "
        f"{over} listed function(s) over {MAX_FN_LINES} lines left to untie"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
