"""schemathesis hooks for scripts/test-contract (loaded through SCHEMATHESIS_HOOKS).

One rule of docs/openapi.yaml spans three fields and JSON Schema cannot state it: a namespace's
TTLs, a missing or 0 one taken as the built-in default, must satisfy
1 000 <= min_ttl_ms <= default_ttl_ms <= max_ttl_ms <= 3 600 000 (lockd_core::validate_namespace).
The spec says so in words; this hook says it to the generator, so that a request the rule
refuses is not generated as a valid one. No check is turned off.

One more hook shortens waits. An acquire with wait_ms is a long poll: the node answers when the
grant commits or when the wait ends, so a valid wait on a held lock keeps the request open for up
to 300 s, past schemathesis's 10 s read timeout. A lock stays held while its holder's session
lives (a TTL of up to 60 s here), so whether a generated wait outlives the read timeout depended
on which earlier case still held that name: a run failed with "Read timed out" on a 24.5 s wait.
A valid wait above WAIT_CAP_MS is sent as WAIT_CAP_MS (a wait still, and still answered by the
same rules); a wait outside the schema's bounds is sent as drawn, so the 400s stay tested.
"""

import schemathesis

HARD_MIN, HARD_MAX = 1_000, 3_600_000
DEFAULTS = {"min_ttl_ms": 5_000, "default_ttl_ms": 15_000, "max_ttl_ms": 60_000}


@schemathesis.hook("filter_case")
def namespace_ttls_in_order(ctx, case) -> bool:
    """`filter_case` reaches every phase's cases (the coverage phase's included)."""
    op = case.operation
    if op.path != "/v1/admin/namespaces" or op.method.upper() != "POST":
        return True
    body = case.body
    ns = body.get("namespace") if isinstance(body, dict) else None
    if not isinstance(ns, dict):
        return True
    ttl = {}
    for key, default in DEFAULTS.items():
        v = ns.get(key)
        if v is None or v == 0:
            v = default
        if not isinstance(v, int) or isinstance(v, bool):
            return True  # a wrong type: a negative case, answered 400 whatever the TTLs
        ttl[key] = v
    return HARD_MIN <= ttl["min_ttl_ms"] <= ttl["default_ttl_ms"] <= ttl["max_ttl_ms"] <= HARD_MAX


WAIT_CAP_MS = 3_000
WAIT_MAX_MS = 300_000  # docs/openapi.yaml: wait_ms maximum


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    """Runs on every case of every phase (the stateful phase included), after generation."""
    if case.operation.method.upper() != "POST" or not case.operation.path.endswith(":acquire"):
        return
    body = case.body
    if not isinstance(body, dict):
        return
    wait = body.get("wait_ms")
    if isinstance(wait, int) and not isinstance(wait, bool) and WAIT_CAP_MS < wait <= WAIT_MAX_MS:
        body["wait_ms"] = WAIT_CAP_MS
