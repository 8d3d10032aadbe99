"""A worker process for tests/test_lanes_property.py: `python tests/lanes_fleet.py '<json>'`.

Queue `q` has owners from the table <schema>.fleet_owners (so that the test moves them between
lanes), one type `sync` whose job runs `pages` pages of `page_sleep` seconds each (lane `jam`:
`jam_sleep`), raises Throttled(retry_after=1) when its lane is in <schema>.fleet_throttles (once),
and records every page in <schema>.runs (worker_proc.py's table) for the lane-width check.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

from synclane import Job, Owner, Page, SyncLane, Throttled

FLEET_DDL = """
CREATE TABLE IF NOT EXISTS {owners} (owner text PRIMARY KEY, lane text NOT NULL);
CREATE TABLE IF NOT EXISTS {throttles} (lane text PRIMARY KEY);
CREATE TABLE IF NOT EXISTS {runs} (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id bigint NOT NULL, lane text NOT NULL, pid integer NOT NULL,
    started timestamptz NOT NULL, ended timestamptz
);
"""


def tables(schema: str) -> dict[str, sql.Identifier]:
    return {
        "owners": sql.Identifier(schema, "fleet_owners"),
        "throttles": sql.Identifier(schema, "fleet_throttles"),
        "runs": sql.Identifier(schema, "runs"),
    }


def build(settings: dict[str, Any]) -> SyncLane:
    dsn, schema = settings["dsn"], settings["schema"]
    app = SyncLane(
        dsn,
        schema=schema,
        poll_interval=settings["poll"],
        plan_interval=3600,
        worker_name=f"fleet-{os.getpid()}",
    )
    queue = app.queue(
        "q",
        concurrency=settings["concurrency"],
        lane_width=settings["lane_width"],
        lease_duration=30,
        retry_base_delay=0.5,
        retry_max_delay=1,
    )
    names = tables(schema)
    local = threading.local()

    def connection() -> psycopg.Connection[Any]:
        conn = getattr(local, "conn", None)
        if conn is None or conn.closed:
            conn = local.conn = psycopg.connect(dsn, autocommit=True)
        return conn

    @queue.owners
    def owners(name: str) -> list[Owner]:
        rows = connection().execute(sql.SQL("SELECT owner, lane FROM {}").format(names["owners"]))
        return [Owner(owner, lane=lane) for owner, lane in rows]

    @queue.snapshot("sync", every=timedelta(days=1))
    def sync(job: Job) -> Page:
        conn = connection()
        throttled = conn.execute(
            sql.SQL("DELETE FROM {} WHERE lane = %s RETURNING lane").format(names["throttles"]),
            [job.lane],
        ).fetchone()
        if throttled:
            raise Throttled(retry_after=1)
        (run,) = conn.execute(
            sql.SQL(
                "INSERT INTO {} (job_id, lane, pid, started) VALUES (%s, %s, %s, "
                "clock_timestamp()) RETURNING id"
            ).format(names["runs"]),
            [job.id, job.lane, os.getpid()],
        ).fetchone()  # type: ignore[misc]
        time.sleep(settings["jam_sleep"] if job.lane == "jam" else settings["page_sleep"])
        conn.execute(
            sql.SQL("UPDATE {} SET ended = clock_timestamp() WHERE id = %s").format(names["runs"]),
            [run],
        )
        page = int(job.cursor or 0) + 1
        return Page(str(page) if page < settings["pages"] else None, 1)

    return app


def main() -> None:
    settings = json.loads(sys.argv[1])
    app = build(settings)
    print("ready", flush=True)
    app.run_worker(stop_after=settings.get("stop_after", 600))


if __name__ == "__main__":
    main()
