"""Instant pickup, the sending side: the statement that tells a queue's workers work is due.

Whatever makes a job due now (enqueue, requeue, the planner's insert, a stopping worker's hand-
backs) sends one notification on the schema's channel (synclane.store.channel) in the
transaction that made it: PostgreSQL delivers it when that transaction commits, and nothing when
it rolls back. A notification carries the queue's name; each worker wakes the idle slots of that
queue (synclane.worker.presence), and every slot still looks again every `poll_interval`, so a
notification that never arrives costs time, not work.

Planning and `enqueue` run as steps (synclane.steps) on the app's connection or on the caller's
(`conn=`); `work_added(queue)` is the step they take right after inserting due jobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from synclane.steps import Fetch, Steps
from synclane.store import Store, channel

__all__ = ["channel", "notify_work", "notify_work_async", "work_added"]


def work_added(queue: str) -> Steps[None]:
    """Steps run after due jobs of `queue` were inserted, in the same transaction."""
    yield Fetch("notify_work", {"queues": [queue]})


def notify_work(conn: psycopg.Connection[Any], store: Store, queue: str) -> None:
    """Tell the workers of `queue` that jobs are due, in `conn`'s transaction: they hear it when
    it commits (at once on an autocommit connection). Call it after inserting due jobs with your
    own SQL; calling it twice in one transaction sends one notification."""
    conn.execute(store.query("notify_work"), {"queues": [queue]})


async def notify_work_async(
    conn: psycopg.AsyncConnection[Any], store: Store, queues: Sequence[str]
) -> None:
    """notify_work for an async connection, and for several queues at once."""
    await conn.execute(store.query("notify_work"), {"queues": list(queues)})
