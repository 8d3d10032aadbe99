"""A worker process for the tests: `python tests/worker_proc.py '<json settings>'`.

Its one type, `sync` in queue `q`, records every page it is handed in <schema>.runs with the
database's clock_timestamp() at the start and at the end, so that tests can check lanes and
cursors from outside the process. Page n returns cursor n+1 until `pages` pages are done.
With `"orders": true` in its settings it also serves the windowed type of
tests/test_lazy_history.py (HISTORY: two years in 30-day slices), with the same handler.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

from synclane import Page, SyncLane, Throttled
from synclane.model import Job

RUNS_DDL = """
CREATE TABLE IF NOT EXISTS {runs} (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id bigint NOT NULL,
    lane text NOT NULL,
    cursor_in text,
    pid integer NOT NULL,
    started timestamptz NOT NULL,
    ended timestamptz
)
"""

# Two runs of one lane that overlap in time (a run of a killed process ends at its kill): what
# `count(db, OVERLAPS, schema)` (tests/workers.py) finds must be 0.
OVERLAPS = """
SELECT count(*) FROM {runs} a JOIN {runs} b
  ON a.lane = b.lane AND a.id < b.id AND a.started < b.ended AND b.started < a.ended
"""


def runs_table(schema: str) -> sql.Identifier:
    return sql.Identifier(schema, "runs")


def create_runs(conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute(sql.SQL(RUNS_DDL).format(runs=runs_table(schema)))


def build(settings: dict[str, Any]) -> SyncLane:
    app = SyncLane(
        settings["dsn"],
        schema=settings["schema"],
        poll_interval=settings.get("poll", 0.05),
        plan_interval=3600,
        worker_name=f"worker-{os.getpid()}",
        pooler=settings.get("pooler"),
        listen_dsn=settings.get("listen_dsn"),
    )
    queue = app.queue(
        "q",
        concurrency=settings.get("concurrency", 1),
        lease_duration=settings.get("lease", 30),
        max_attempts=settings.get("max_attempts", 5),
        retry_base_delay=0.1,
        retry_max_delay=0.5,
        lane_width=settings.get("lane_width", 1),
        max_running=settings.get("max_running"),
        lane_rate=tuple(settings["lane_rate"]) if settings.get("lane_rate") else None,
    )
    local = threading.local()
    runs = runs_table(settings["schema"])
    pages = settings.get("pages", 1)
    page_sleep = settings.get("page_sleep", 0.01)
    slow_cursor = settings.get("slow_cursor")
    slow_sleep = settings.get("slow_sleep", 60)
    # {"owner": o, "cursor": n, "retry_after": s}: the first run of that owner's page n raises
    # Throttled(retry_after=s) (the other side said "slow down")
    throttle = settings.get("throttle")

    def connection() -> psycopg.Connection[Any]:
        conn = getattr(local, "conn", None)
        if conn is None or conn.closed:
            # the test's record of each page: beside a pooler (runs_dsn), never through it
            records = settings.get("runs_dsn", settings["dsn"])
            conn = local.conn = psycopg.connect(records, autocommit=True)
        return conn

    @queue.snapshot("sync", every=timedelta(days=1))
    def handle(job: Job) -> Page:
        conn = connection()
        row = conn.execute(
            sql.SQL(
                "INSERT INTO {} (job_id, lane, cursor_in, pid, started) "
                "VALUES (%s, %s, %s, %s, clock_timestamp()) RETURNING id"
            ).format(runs),
            (job.id, job.lane, job.cursor, os.getpid()),
        ).fetchone()
        assert row is not None
        page = int(job.cursor or 0)
        time.sleep(slow_sleep if slow_cursor is not None and page == slow_cursor else page_sleep)
        conn.execute(
            sql.SQL("UPDATE {} SET ended = clock_timestamp() WHERE id = %s").format(runs),
            (row[0],),
        )
        if throttle is not None and (job.owner, page) == (throttle["owner"], throttle["cursor"]):
            first = conn.execute(
                sql.SQL("SELECT min(id) FROM {} WHERE job_id = %s AND cursor_in = %s").format(runs),
                (job.id, job.cursor),
            ).fetchone()
            if first is not None and first[0] == row[0]:
                raise Throttled(retry_after=throttle["retry_after"])
        return Page(str(page + 1) if page + 1 < pages else None, 1)

    if settings.get("orders"):
        queue.windowed("orders", **HISTORY)(handle)
    return app


# The windowed type of tests/test_lazy_history.py: 25 history slices an owner, the oldest 10 days.
HISTORY: dict[str, Any] = {
    "horizon": timedelta(days=730),
    "slice": timedelta(days=30),
    "every": timedelta(days=1),
}


def main() -> None:
    settings = json.loads(sys.argv[1])
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s [{os.getpid()}] %(message)s", stream=sys.stderr
    )
    app = build(settings)
    print("ready", flush=True)
    app.run_worker(stop_after=settings.get("stop_after", 120))


if __name__ == "__main__":
    main()
