"""The lease reclaimer's statements: jobs whose worker stopped renewing its lease go back in
line (`reclaim_expired`), and leases held on stopped jobs whose worker died let go
(`release_expired_holds`), in one transaction on the worker's pool, through short outages like
every write.

When the commit goes unanswered, the reclaim's key on the jobs it returned says whether it
committed, so that the worker reports and announces every job the table reclaimed, once.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

import psycopg

from synclane.queues import Queue
from synclane.wakeup import notify_work_async
from synclane.worker.lease import Writer

Rows = list[dict[str, Any]]


async def reclaim(writer: Writer, queue: Queue) -> tuple[Rows, int]:
    """(the jobs reclaimed, as rows; how many held leases were let go). Raises LeaseLost when
    the database stayed away (or refused the statement) for half a lease: the outage is said once
    by the writer, and the next round tries again."""
    store = writer.store
    key = uuid4()
    params = {"queue": queue.name, "max_attempts": queue.settings.max_attempts, "key": key}
    answered: list[Rows] = []  # what a send whose commit went unanswered returned

    async def statement(conn: psycopg.AsyncConnection[Any]) -> tuple[Rows, int]:
        if answered:
            ids = [row["id"] for row in answered[0]]
            cur = await conn.execute(store.query("reclaimed_under_key"), {"ids": ids, "key": key})
            found = await cur.fetchone()
            if found is not None and found[0]:
                return answered[0], 0
            answered.clear()
        async with conn.transaction():
            cur = await conn.execute(store.query("reclaim_expired"), params)
            names = [d.name for d in cur.description or []]
            rows = [dict(zip(names, values, strict=True)) for values in await cur.fetchall()]
            released = await conn.execute(
                store.query("release_expired_holds"), {"queue": queue.name}
            )
            freed = len(await released.fetchall())
            if rows or freed:  # due again: idle workers elsewhere may take them
                await notify_work_async(conn, store, [queue.name])
            if rows:
                answered.append(rows)
        return rows, freed

    patience = queue.settings.lease_duration.total_seconds() / 2
    return await writer.run("reclaim_expired", statement, patience, chore=True)
