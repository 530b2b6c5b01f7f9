#!/usr/bin/env python3
"""Every client runs every scenario of clients/scenarios.md.

The table's first column names each scenario (`id`); a test that covers one carries the comment
`scenario: <id>`. This fails when a client's tests lack an id of the table or name one the table
does not have, so the clients cannot drift apart in silence.
"""
from __future__ import annotations

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
TABLE = ROOT / "clients" / "scenarios.md"
# Where each client's tests live, and which files count.
CLIENTS = {
    "python": (ROOT / "clients/python/tests", "*.py"),
    "go": (ROOT / "clients/go", "*_test.go"),
    "java": (ROOT / "clients/java/src/test", "*.java"),
}
MARK = re.compile(r"scenario: ([a-z0-9-]+)")


def table_ids() -> list[str]:
    ids = re.findall(r"^\| `([a-z0-9-]+)` \|", TABLE.read_text(), flags=re.M)
    if not ids:
        sys.exit(f"check-scenarios: no scenario ids found in {TABLE}")
    return ids


def main() -> int:
    ids = table_ids()
    failed = False
    for client, (root, pattern) in CLIENTS.items():
        if not root.is_dir():
            print(f"check-scenarios: {client}: {root} is missing")
            failed = True
            continue
        seen: dict[str, list[str]] = {}
        for f in sorted(root.rglob(pattern)):
            for m in MARK.finditer(f.read_text()):
                seen.setdefault(m.group(1), []).append(str(f.relative_to(ROOT)))
        missing = [i for i in ids if i not in seen]
        unknown = sorted(set(seen) - set(ids))
        if missing:
            print(f"check-scenarios: {client} has no test marked for: {', '.join(missing)}")
        for u in unknown:
            print(f"check-scenarios: {client} marks `{u}`, which {TABLE.name} does not have "
                  f"({', '.join(seen[u])})")
        failed |= bool(missing or unknown)
        if not missing and not unknown:
            print(f"check-scenarios: {client}: all {len(ids)} scenarios marked")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
