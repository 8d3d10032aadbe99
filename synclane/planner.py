"""The planner against the database: read what exists, let synclane.planning say what is
missing, insert it.

For each batch of owners one SERIALIZABLE transaction holds one read (`plan_read`) and one
insert (`insert_jobs`, ON CONFLICT DO NOTHING). Planners that run at the same instant are kept
apart by the dedup index; planners whose read and insert straddle a period edge or midnight
(so that their keys differ) by serializable isolation, which makes one of them read again.
Rows are inserted in one stable order, so that two planners never lock keys in opposite
orders; a deadlock or a serialization failure PostgreSQL reports anyway is retried.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

from synclane import planning
from synclane.connection import Database
from synclane.errors import OwnerSourceError
from synclane.model import ConfigError, JobType, Owner, WindowedType, check_name, check_slices
from synclane.owners import connected_owners, owner_batches
from synclane.queues import Catalog, Queue

log = logging.getLogger("synclane")

# How often a plan of one batch is tried when PostgreSQL asks to try again.
ATTEMPTS = 10
RETRY = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected)


class Planner:
    """Plans the queues of one catalog in one database."""

    def __init__(self, database: Database, catalog: Catalog, owners_timeout: timedelta) -> None:
        self.database = database
        self.catalog = catalog
        self.owners_timeout = owners_timeout

    def plan(
        self,
        queue: str | None = None,
        owner: Owner | str | None = None,
        horizon: timedelta | None = None,
        type: str | None = None,
    ) -> dict[str, int]:
        """Insert the jobs that should exist and do not; returns how many per queue."""
        if owner is not None and queue is None:
            raise ConfigError(
                "planning one owner needs its queue too, e.g. app.plan('shops', owner)"
            )
        queues = self.catalog.pick(queue)
        if horizon is not None:
            for q in queues:
                for job_type in q.types.values():
                    if isinstance(job_type, WindowedType) and type in (None, job_type.name):
                        check_slices(f"{q.name}.{job_type.name}", horizon, job_type.slice)
        added: dict[str, int] = {}
        failed: list[OwnerSourceError] = []
        for q in queues:
            try:
                added[q.name] = self.plan_queue(q, owner, horizon, type)
            except OwnerSourceError as error:
                if queue is not None:
                    raise
                # One queue's broken owner source must not keep the others from being planned.
                log.error("%s", error)
                failed.append(error)
        if failed:
            raise OwnerSourceError(
                "; ".join(str(error) for error in failed) + f" (planned: {added})", added
            )
        return added

    def plan_queue(
        self, queue: Queue, owner: Owner | str | None, horizon: timedelta | None, type: str | None
    ) -> int:
        types = [queue.job_type(type)] if type is not None else list(queue.types.values())
        if not types:
            return 0
        timeout = self.owners_timeout.total_seconds()
        if isinstance(owner, Owner):
            batches: Any = [[owner.check()]]
        elif owner is not None:
            check_name("owner", owner)
            # An owner that is not connected (any more) gets nothing planned.
            batches = [[o for o in connected_owners(queue, timeout) if o.id == owner]]
        else:
            batches = owner_batches(queue, timeout)
        added = planned = 0
        for batch in batches:
            if batch:
                added += self._plan_batch(queue, batch, types, horizon)
                planned += len(batch)
        if added:
            log.info(
                "planned %d new job(s) in queue %s for %d owner(s)", added, queue.name, planned
            )
        return added

    def _plan_batch(
        self, queue: Queue, owners: list[Owner], types: list[JobType], horizon: timedelta | None
    ) -> int:
        for attempt in range(1, ATTEMPTS + 1):
            try:
                with self.database.connection() as conn:
                    return plan_owners(conn, self.database, queue, owners, types, horizon)
            except RETRY:
                # Another planner wrote what we read in the same instant; read again.
                if attempt == ATTEMPTS:
                    raise
        raise AssertionError("unreachable")


def plan_owners(
    conn: psycopg.Connection[Any],
    database: Database,
    queue: Queue,
    owners: Sequence[Owner],
    types: Sequence[JobType],
    horizon: timedelta | None,
) -> int:
    """One read and one insert for these owners, in a serializable transaction of its own."""
    store = database.store
    by_id = {o.id: o for o in owners}
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        with conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(
                store.query("plan_read"),
                {
                    "queue": queue.name,
                    "owners": list(by_id),
                    "types": [t.name for t in types],
                    "windowed": [isinstance(t, WindowedType) for t in types],
                },
            ).fetchall()
        missing: list[planning.NewJob] = []
        for row in rows:
            existing = planning.Existing(
                oldest_initial_start=row["oldest_initial_start"],
                coverage_end=row["coverage_end"],
                coverage_mode=row["coverage_mode"],
                initial_created_at=row["initial_created_at"],
                last_created_at=row["last_created_at"],
                open_recurring=row["open_recurring"],
                open_any=row["open_any"],
            )
            job_type = queue.types[row["type"]]
            missing += planning.missing_jobs(
                job_type, by_id[row["owner"]], existing, row["now"], horizon
            )
        return insert_jobs(conn, database, queue.name, missing)


def insert_jobs(
    conn: psycopg.Connection[Any], database: Database, queue: str, jobs: list[planning.NewJob]
) -> int:
    """One insert; returns how many rows were new. Rows go in in one order (owner, type, key),
    so that concurrent planners take the dedup index's locks in the same order."""
    if not jobs:
        return 0
    jobs = sorted(jobs, key=lambda j: (j.owner, j.type, j.dedup_key))
    cur = conn.execute(
        database.store.query("insert_jobs"),
        {
            "queue": queue,
            "owners": [j.owner for j in jobs],
            "lanes": [j.lane for j in jobs],
            "types": [j.type for j in jobs],
            "modes": [j.mode for j in jobs],
            "priorities": [j.priority for j in jobs],
            "starts": [j.window_start for j in jobs],
            "ends": [j.window_end for j in jobs],
            "keys": [j.dedup_key for j in jobs],
        },
    )
    return cur.rowcount
