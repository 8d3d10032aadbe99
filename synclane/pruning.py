"""Retention: deleting finished rows that nothing reads any more (`app.prune`, a queue's
`retention`). The statements are in sql/pruning.sql; docs/operations.md says what is kept and why.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import psycopg

from synclane import planning
from synclane.batches import retrying
from synclane.connection import Database
from synclane.queues import Queue

# Owners and types per prune statement: each statement reads their rows and holds its locks for
# well under a second.
PRUNE_GROUPS = 50
# How often the elected planner prunes a queue that has a `retention` (or every `retention`,
# when that is shorter).
PRUNE_EVERY = timedelta(hours=1)


def prune_queue(
    database: Database,
    conn: psycopg.Connection[Any],
    queue: Queue,
    older_than: timedelta,
    between: Callable[[], None] | None = None,
) -> int:
    """Prune one queue on an autocommit connection, a few owners and types per statement, each
    statement its own short transaction. Returns how many rows were deleted."""
    store = database.store
    after = ("", "")
    deleted = 0
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
        statement = store.query("prune_owners")
        result = retrying(partial(_fetch_one, conn, statement, params))
        assert result is not None
        deleted += int(result[0])
        after = (groups[-1][0], groups[-1][1])
        if between is not None:
            between()


def _fetch_one(conn: psycopg.Connection[Any], statement: Any, params: dict[str, Any]) -> Any:
    return conn.execute(statement, params).fetchone()


def current_periods(queue: Queue, now: datetime) -> dict[str, str]:
    """Per type: the prefix of the dedup keys the planner gives refreshes of the current period
    (a prune keeps them, or a second planner in the period would add one again)."""
    return {
        t.name: f"recurring:{planning.iso(planning.period_start(now, t.every))}"
        for t in queue.types.values()
    }
