"""Retention: deleting finished rows that nothing reads any more (`app.prune`, a queue's
`retention`). The statements are in sql/pruning.sql; docs/operations.md says what is kept and why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import psycopg

from synclane import planning
from synclane.batches import retrying
from synclane.connection import RECONNECT_DELAYS, Database, lost_connection
from synclane.queues import Queue
from synclane.steps import limit_idle_transaction

# Owners and types per prune statement: each statement reads their rows and holds its locks for
# well under a second.
PRUNE_GROUPS = 50
# How often the elected planner prunes a queue that has a `retention` (or every `retention`,
# when that is shorter).
PRUNE_EVERY = timedelta(hours=1)
# How long the server keeps a batch's transaction whose client stopped answering.
IDLE_TIMEOUT = timedelta(minutes=1)


def prune_queue(
    database: Database,
    queue: Queue,
    older_than: timedelta,
    between: Callable[[], None] | None = None,
) -> int:
    """Prune one queue, a few owners and types per statement, each statement its own short
    transaction, on a connection of its own. Returns how many rows were deleted, also those of a
    batch whose answer was lost (`_settle`)."""
    store = database.store
    after = ("", "")
    deleted = 0
    conn = database.connect()
    try:
        while True:
            groups = conn.execute(
                store.query("prune_groups"),
                {"queue": queue.name, "owner": after[0], "type": after[1], "limit": PRUNE_GROUPS},
            ).fetchall()
            if not groups:
                return deleted
            row = conn.execute(store.query("database_now")).fetchone()
            assert row is not None
            guard = current_periods(queue, row[0])
            params = {
                "queue": queue.name,
                "owners": [g[0] for g in groups],
                "types": [g[1] for g in groups],
                "guard_types": list(guard),
                "guard_prefixes": list(guard.values()),
                "older_than": older_than,
            }
            count, conn = _batch(database, conn, params)
            deleted += count
            after = (groups[-1][0], groups[-1][1])
            if between is not None:
                between()
    finally:
        conn.close()


def _batch(
    database: Database, conn: psycopg.Connection[Any], params: dict[str, Any]
) -> tuple[int, psycopg.Connection[Any]]:
    """One prune statement in a transaction of its own: (how many rows it deleted, the
    connection to go on with). A lost answer costs no count: one to the statement means the
    transaction rolled back with the connection, and the batch runs again on a new one; one to
    its commit is settled by whether the rows the statement deleted are still there."""
    for delay in (*RECONNECT_DELAYS, None):
        answered: list[list[int]] = []
        try:
            retrying(
                partial(_transaction, conn, database.store.query("prune_owners"), params, answered)
            )
            return len(answered[0]), conn
        except psycopg.OperationalError as error:
            if delay is None or not lost_connection(error):
                raise  # the server answered (a statement timeout, say): the batch rolled back
            conn.close()
            time.sleep(delay)
            conn = database.connect()
            if answered and _settle(database, conn, answered[0]):
                return len(answered[0]), conn
    raise AssertionError("unreachable")


def _transaction(
    conn: psycopg.Connection[Any], statement: Any, params: dict[str, Any], answered: list[Any]
) -> None:
    """The statement and its commit; the ids it deleted go to `answered` before the commit."""
    answered.clear()
    with conn.transaction():
        # a prune stopped in the middle of its batch holds its rows' locks no longer than this
        limit_idle_transaction(conn, IDLE_TIMEOUT)
        row = conn.execute(statement, params).fetchone()
        assert row is not None
        answered.append(list(row[0]))


def _settle(database: Database, conn: psycopg.Connection[Any], ids: list[int]) -> bool:
    """Whether the transaction whose commit went unanswered committed: the rows it deleted are
    gone (no other statement deletes a row a prune held locked, or brings one back)."""
    row = conn.execute(database.store.query("rows_left"), {"ids": ids}).fetchone()
    return row is not None and row[0] == 0


def current_periods(queue: Queue, now: datetime) -> dict[str, str]:
    """Per type: the prefix of the dedup keys the planner gives refreshes of the current period
    (a prune keeps them, or a second planner in the period would add one again)."""
    return {
        t.name: f"recurring:{planning.iso(planning.period_start(now, t.every))}"
        for t in queue.types.values()
    }
