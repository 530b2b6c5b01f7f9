"""Fenced writes to PostgreSQL with psycopg 3 (``pip install lockd-client[postgres]``).

A lease can run out under a paused process, so a lock alone cannot stop a stale holder from
writing. The store must refuse writes that carry a token older than one it has accepted:

.. code-block:: sql

    UPDATE t SET value = %s, fence = %s WHERE key = %s AND fence <= %s
    -- 0 rows: a newer holder exists; stop.

The helpers here do exactly that, in the caller's transaction (they never commit: commit
yourself, or use an autocommit connection). The row's lock taken by the ``UPDATE`` is held to
the commit, so a newer holder's write waits for it and then passes its own check.

* :func:`create_table` / :data:`SCHEMA`: a key-value table with a fence (``key, value, fence``).
* :func:`add_fence_column`: the same fence on a table of your own.
* :func:`fenced_update`: ``UPDATE table SET col = ..., fence = token WHERE key_col = key AND
  fence <= token`` on any table; returns whether the write was accepted.
* :func:`fenced_write`: an upsert into the key-value table under the same rule.
* :func:`write`: :func:`fenced_write` guarded by a lock: refuses locally once the lock is lost
  (:class:`~lockd_client.LockLost`) and raises :class:`~lockd_client.FenceRejected` on 0 rows.

``a_*`` functions are the same for ``psycopg.AsyncConnection``.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Protocol, Tuple

try:
    import psycopg
    from psycopg import sql
except ImportError as e:  # pragma: no cover
    raise ImportError("lockd_client.fencing needs psycopg 3: pip install 'lockd-client[postgres]'") from e

from .errors import FenceRejected, InvalidArgument, LockLost

__all__ = ["SCHEMA", "DEFAULT_TABLE", "create_table", "add_fence_column", "fenced_update",
           "fenced_write", "write", "a_create_table", "a_fenced_update", "a_fenced_write", "a_write"]

#: Fencing tokens are stored in a BIGINT; the service never mints one above this.
MAX_TOKEN = 2**63 - 1
DEFAULT_TABLE = "lockd_fenced"

#: The key-value table :func:`fenced_write` uses (``{table}`` is the table's name).
SCHEMA = """CREATE TABLE IF NOT EXISTS {table} (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    fence BIGINT NOT NULL DEFAULT 0 CHECK (fence >= 0)
)"""


class _Fenced(Protocol):
    """What :func:`write` needs of a lock (a ``Lock`` or ``AsyncLock``)."""

    @property
    def name(self) -> str: ...
    @property
    def token(self) -> int: ...
    def is_lost(self) -> bool: ...


class _Reports(Protocol):
    """A client that reports refusals (a ``Client``)."""

    def report_fencing_rejected(self, name: str) -> None: ...


class _AsyncReports(Protocol):
    """An asyncio client that reports refusals (an ``AsyncClient``)."""

    async def report_fencing_rejected(self, name: str) -> None: ...


def _ident(name: str) -> sql.Composable:
    """``schema.table`` or ``table`` as quoted identifiers."""
    parts = name.split(".")
    if not 1 <= len(parts) <= 2 or not all(parts):
        raise InvalidArgument(f"table must be 'name' or 'schema.name' (got {name!r})")
    return sql.Identifier(*parts)


def _check_token(token: int) -> None:
    if not 0 < token <= MAX_TOKEN:
        raise InvalidArgument(f"token must lie in 1..={MAX_TOKEN} to fit a BIGINT fence (got {token})")


def _create(table: str) -> sql.Composed:
    return sql.SQL(SCHEMA).format(table=_ident(table))


def _add_fence(table: str, column: str) -> sql.Composed:
    return sql.SQL("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS {c} BIGINT NOT NULL DEFAULT 0").format(
        t=_ident(table), c=sql.Identifier(column))


def _update(table: str, values: Mapping[str, Any], key: Mapping[str, Any], token: int,
            fence_column: str) -> Tuple[sql.Composed, Tuple[Any, ...]]:
    _check_token(token)
    if not values:
        raise InvalidArgument("values must name at least one column to set")
    if not key:
        raise InvalidArgument("key must name at least one column to match")
    if fence_column in values or fence_column in key:
        raise InvalidArgument(f"the fence column {fence_column!r} is set from the token; leave it "
                              "out of values and key")
    sets = sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in values)
    where = sql.SQL(" AND ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in key)
    f = sql.Identifier(fence_column)
    q = sql.SQL("UPDATE {t} SET {sets}, {f} = %s WHERE {where} AND {f} <= %s").format(
        t=_ident(table), sets=sets, f=f, where=where)
    return q, (*values.values(), token, *key.values(), token)


def _upsert(table: str, key: str, value: str, token: int) -> Tuple[sql.Composed, Tuple[Any, ...]]:
    _check_token(token)
    t = _ident(table)
    q = sql.SQL(
        "INSERT INTO {t} AS cur (key, value, fence) VALUES (%s, %s, %s) "
        "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, fence = EXCLUDED.fence "
        "WHERE cur.fence <= EXCLUDED.fence").format(t=t)
    return q, (key, value, token)


def create_table(conn: "psycopg.Connection[Any]", table: str = DEFAULT_TABLE) -> None:
    """Creates the fenced key-value table (idempotent)."""
    conn.execute(_create(table))


def add_fence_column(conn: "psycopg.Connection[Any]", table: str, column: str = "fence") -> None:
    """Adds a ``fence BIGINT NOT NULL DEFAULT 0`` column to an existing table (idempotent)."""
    conn.execute(_add_fence(table, column))


def fenced_update(conn: "psycopg.Connection[Any]", table: str, values: Mapping[str, Any],
                  key: Mapping[str, Any], token: int, *, fence_column: str = "fence") -> bool:
    """``UPDATE table SET <values>, fence = token WHERE <key> AND fence <= token``.

    Returns True if the row was written, False if it was refused (a newer token is stored) or
    does not exist. Example: ``fenced_update(conn, "payout_batches", {"status": "sent"},
    {"batch_id": 2210}, lk.token)``."""
    q, params = _update(table, values, key, token, fence_column)
    return conn.execute(q, params).rowcount == 1


def fenced_write(conn: "psycopg.Connection[Any]", key: str, value: str, token: int, *,
                 table: str = DEFAULT_TABLE) -> bool:
    """Sets ``key`` to ``value`` in the fenced key-value table if ``token`` is at least the
    key's fence (inserting the key if new); returns whether the write was accepted."""
    q, params = _upsert(table, key, value, token)
    return conn.execute(q, params).rowcount == 1


def write(conn: "psycopg.Connection[Any]", lock: _Fenced, key: str, value: str, *,
          table: str = DEFAULT_TABLE, client: Optional[_Reports] = None) -> None:
    """:func:`fenced_write` under ``lock``: raises :class:`LockLost` without writing once the
    lock is lost, and :class:`FenceRejected` when the store has seen a newer token (reported
    to the service through ``client``, if given, so that lockd counts it)."""
    if lock.is_lost():
        raise LockLost(f"the lock {lock.name!r} is lost; not writing {key!r}")
    if not fenced_write(conn, key, value, lock.token, table=table):
        if client is not None:
            client.report_fencing_rejected(lock.name)
        raise FenceRejected(f"the store refused token {lock.token} for {key!r}: a newer holder "
                            f"of {lock.name!r} has written")


async def a_create_table(conn: "psycopg.AsyncConnection[Any]", table: str = DEFAULT_TABLE) -> None:
    """:func:`create_table` for an async connection."""
    await conn.execute(_create(table))


async def a_fenced_update(conn: "psycopg.AsyncConnection[Any]", table: str,
                          values: Mapping[str, Any], key: Mapping[str, Any], token: int, *,
                          fence_column: str = "fence") -> bool:
    """:func:`fenced_update` for an async connection."""
    q, params = _update(table, values, key, token, fence_column)
    return (await conn.execute(q, params)).rowcount == 1


async def a_fenced_write(conn: "psycopg.AsyncConnection[Any]", key: str, value: str, token: int,
                         *, table: str = DEFAULT_TABLE) -> bool:
    """:func:`fenced_write` for an async connection."""
    q, params = _upsert(table, key, value, token)
    return (await conn.execute(q, params)).rowcount == 1


async def a_write(conn: "psycopg.AsyncConnection[Any]", lock: _Fenced, key: str, value: str, *,
                  table: str = DEFAULT_TABLE, client: Optional[_AsyncReports] = None) -> None:
    """:func:`write` for an async connection."""
    if lock.is_lost():
        raise LockLost(f"the lock {lock.name!r} is lost; not writing {key!r}")
    if not await a_fenced_write(conn, key, value, lock.token, table=table):
        if client is not None:
            await client.report_fencing_rejected(lock.name)
        raise FenceRejected(f"the store refused token {lock.token} for {key!r}: a newer holder "
                            f"of {lock.name!r} has written")
