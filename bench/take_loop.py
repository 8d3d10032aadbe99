"""The in-step take on one connection, and nothing else: what a job costs the server.

    PYTHONPATH=<checkout> python bench/take_loop.py DSN JOBS

Four slots in step: each `take_front` completes the four jobs the last one took and takes four
more, one-page no-op jobs in 50 lanes, until JOBS are taken; the worker's session settings and
parameters as its pool sets them; no chores, no notifications, nothing that runs by the clock.
It prints the server process that ran the takes (its pid) and the seconds. Run it with the
synclane of any checkout on PYTHONPATH (it speaks the take of 2de033d, schema 2, too), so that
two codes can be counted in the same way.

The figure that does not move with the machine's load is the server's instructions a job:
start a PostgreSQL of its own under `valgrind --tool=callgrind --trace-children=yes
--callgrind-out-file=DIR/cg.%p` (autovacuum off), run this twice (e.g. 400 and 2,400 jobs), and
divide the difference of the `summary:` lines of the two pids' files by the difference of the jobs
(docs/performance.md has the figures). valgrind is not a dependency, so it is not run here.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

from synclane import SyncLane
from synclane.store import WORKER_SESSION

LANES = 50
SLOTS = 4
LEASE = timedelta(minutes=5)


async def _takes(dsn: str, schema: str, jobs: int) -> tuple[int, int]:
    """Takes in step until `jobs` are taken; (the server's pid, jobs taken)."""
    app = SyncLane(dsn, schema=schema)
    try:
        from synclane.params import WORKER_ADAPTERS
        from synclane.worker.taker import Finished, take_front

        options: dict[str, Any] = {"context": WORKER_ADAPTERS}
    except ImportError:  # 2de033d: the take is a method of its store
        options = {}
    store = app.store if hasattr(app, "store") else app.database.store
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True, **options)
    try:
        for setting in WORKER_SESSION:
            await conn.execute(setting)
        last: list[Any] = []
        taken = 0
        while taken < jobs:
            if options:
                finished = [Finished(job.id, job.lease_token, 1) for job in last]
                batch = await take_front(
                    conn, store, "bench", "w", LEASE, finished, SLOTS - len(finished)
                )
                last = batch.jobs
            else:
                done = [{"id": job.id, "token": job.lease_token, "count": 1} for job in last]
                taken_now = await store.a_take(conn, "bench", "w", LEASE, done, SLOTS - len(done))
                last = taken_now.jobs
            if not last:
                break
            taken += len(last)
        return conn.info.backend_pid, taken
    finally:
        await conn.close()
        app.close()


def main(dsn: str, jobs: int) -> list[str]:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    SyncLane(dsn, schema=schema).close()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            table = sql.Identifier(schema, "jobs")
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (queue, owner, lane, type, mode, dedup_key) "
                    "SELECT 'bench', 'owner-' || (n %% %s), 'lane-' || (n %% %s), 'noop', "
                    "'manual', 'manual:' || n FROM generate_series(1, %s) n"
                ).format(table),
                (LANES, LANES, jobs + SLOTS),
            )
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(table))
        started = time.perf_counter()
        pid, taken = asyncio.run(_takes(dsn, schema, jobs))
        seconds = time.perf_counter() - started
        return [f"server pid {pid}: {taken} jobs taken in step in {seconds:.2f} s"]
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


if __name__ == "__main__":
    print(*main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2000), sep="\n")
