"""Instant pickup, the sending side: the channel a schema's workers listen on, and the statement
that tells them work of a queue is due.

Whatever makes a job due now (enqueue, requeue, the planner's insert, a stopping worker's hand-
backs) sends one notification in the transaction that made it: PostgreSQL delivers it when that
transaction commits, and nothing when it rolls back. A notification carries the queue's name;
each worker wakes the idle slots of that queue (synclane.worker.presence), and every slot still
looks again every `poll_interval`, so a notification that never arrives costs time, not work.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import psycopg

from synclane.store import Store

# PostgreSQL refuses channel names of 64 bytes or more.
_CHANNEL_BYTES = 63


def channel(schema: str) -> str:
    """The channel of a schema: 'synclane.<schema>', or 'synclane.<md5 of it>' when that
    would be too long for PostgreSQL. `LISTEN "synclane.synclane"` in psql shows them."""
    name = f"synclane.{schema}"
    if len(name.encode("utf-8")) <= _CHANNEL_BYTES:
        return name
    return f"synclane.{hashlib.md5(schema.encode('utf-8')).hexdigest()}"


def notify_params(store: Store, queues: Sequence[str]) -> dict[str, Any]:
    return {"channel": channel(store.schema), "queues": list(queues)}


def notify_work(conn: psycopg.Connection[Any], store: Store, queue: str) -> None:
    """Tell the workers of `queue` that jobs are due, in `conn`'s transaction: they hear it when
    it commits (at once on an autocommit connection). Call it after inserting due jobs, e.g.
    after the planner's insert; calling it twice in one transaction sends one notification."""
    conn.execute(store.query("notify_work"), notify_params(store, [queue]))


async def notify_work_async(
    conn: psycopg.AsyncConnection[Any], store: Store, queues: Sequence[str]
) -> None:
    """notify_work for an async connection, and for several queues at once."""
    await conn.execute(store.query("notify_work"), notify_params(store, queues))
