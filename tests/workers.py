"""What the tests share around workers and the table: real worker processes, the table read and
arranged by hand as a user with SQL would, and the statements of docs/operations.md.

A worker in a thread of the test and waiting for a condition are synclane.testing's
`running_worker` and `wait_for` (what users get); they are imported here too for the modules
that import them from here.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from synclane.planning import iso, period_start
from synclane.testing import running_worker, wait_for
from synclane.worker.taker import take_front

__all__ = [
    "HERE",
    "KEY",
    "TIMESTAMPS",
    "arrange",
    "count",
    "database_now",
    "job_row",
    "let_time_pass",
    "operations_sql",
    "running_worker",
    "start_worker_process",
    "wait_for",
    "wait_until_away_from_a_period_edge",
    "worker_processes",
]

HERE = Path(__file__).parent
DOCS = HERE.parent / "docs"

# -- worker processes ---------------------------------------------------------------------------


def start_worker_process(settings: dict[str, Any]) -> subprocess.Popen[str]:
    """A real worker process (tests/worker_proc.py); returns once it is ready to take jobs."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, str(HERE / "worker_proc.py"), json.dumps(settings)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if line.strip() != "ready":
        process.kill()
        _, err = process.communicate(timeout=10)
        raise AssertionError(f"worker process did not start: {line!r} {err[-2000:]}")
    return process


@contextmanager
def worker_processes(settings: dict[str, Any], count: int) -> Iterator[list[subprocess.Popen[str]]]:
    processes = [start_worker_process(settings) for _ in range(count)]
    try:
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.communicate(timeout=30)


# -- the table, read and arranged by hand ------------------------------------------------------


def job_row(db: psycopg.Connection[Any], schema: str, job_id: int) -> dict[str, Any]:
    with db.cursor(row_factory=dict_row) as cur:
        cur.execute(
            sql.SQL("SELECT * FROM {} WHERE id = %s").format(sql.Identifier(schema, "jobs")),
            (job_id,),
        )
        row = cur.fetchone()
    assert row is not None
    return row


def index_definitions(db: psycopg.Connection[Any], schema: str) -> dict[str, str]:
    """The jobs table's indexes, name -> definition. Read from pg_index by the table's oid, so
    that only its own indexes are rendered: pg_indexes renders every index's definition before
    it filters by schema, and one of a table that another test is dropping fails with "could not
    open relation with OID"."""
    rows = db.execute(
        "SELECT i.relname, pg_get_indexdef(x.indexrelid) FROM pg_index x "
        "JOIN pg_class i ON i.oid = x.indexrelid WHERE x.indrelid = %s::regclass",
        [f"{sql.Identifier(schema).as_string(db)}.jobs"],
    ).fetchall()
    return {name: definition for name, definition in rows}


def count(db: psycopg.Connection[Any], query: str, schema: str, *params: Any) -> int:
    """Run a query whose {jobs} and {runs} name the schema's tables; returns its first value."""
    statement = sql.SQL(query).format(
        jobs=sql.Identifier(schema, "jobs"), runs=sql.Identifier(schema, "runs")
    )
    row = db.execute(statement, params).fetchone()
    assert row is not None
    return int(row[0])


def arrange(
    db: psycopg.Connection[Any], schema: str, ids: int | Iterable[int], **values: Any
) -> None:
    """Set columns of jobs directly, as a user fixing the table with UPDATE would."""
    chosen = [ids] if isinstance(ids, int) else list(ids)
    assignments = sql.SQL(", ").join(
        sql.SQL("{} = %s").format(sql.Identifier(column)) for column in values
    )
    db.execute(
        sql.SQL("UPDATE {} SET {} WHERE id = ANY(%s)").format(
            sql.Identifier(schema, "jobs"), assignments
        ),
        [*values.values(), chosen],
    )


def database_now(db: psycopg.Connection[Any]) -> datetime:
    """The database clock at this instant, the clock every decision of synclane reads.
    clock_timestamp(), not now(): now() is the start of the current transaction, which inside
    a transaction (or a statement that runs a while) lags behind the instant the test means."""
    row = db.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    now: datetime = row[0]
    return now


def wait_until_away_from_a_period_edge(db: psycopg.Connection[Any], every: timedelta) -> None:
    """Planners that straddle a period edge plan two different periods; keep a test off the edge."""
    now = database_now(db)
    left = period_start(now, every) + every - now
    if left < timedelta(seconds=10):
        time.sleep(left.total_seconds() + 0.5)


# The instant inside a planner's dedup key, and every timestamp column of a job.
KEY = re.compile(r"^(initial|recurring):(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z)(.*)$")
TIMESTAMPS = (
    "window_start",
    "window_end",
    "next_run_at",
    "lease_expires_at",
    "created_at",
    "started_at",
    "heartbeat_at",
    "completed_at",
)


def let_time_pass(db: psycopg.Connection[Any], schema: str, delta: timedelta) -> None:
    """Simulate `delta` passing: every timestamp of the schema's rows moves back by `delta`, and
    so does the instant in each planner key (delta must be a whole number of periods). Oldest key
    first, so that no key lands on one that has not moved yet."""
    table = sql.Identifier(schema, "jobs")
    moved = sql.SQL(", ").join(
        sql.SQL("{0} = {0} - %(delta)s").format(sql.Identifier(c)) for c in TIMESTAMPS
    )
    db.execute(sql.SQL("UPDATE {} SET {}").format(table, moved), {"delta": delta})
    keys = []
    for job_id, dedup_key in db.execute(sql.SQL("SELECT id, dedup_key FROM {}").format(table)):
        found = KEY.match(dedup_key)
        if found:
            instant = datetime.fromisoformat(found[2].replace("Z", "+00:00")) - delta
            keys.append((instant, job_id, f"{found[1]}:{iso(instant)}{found[3]}"))
    # One transaction, not a commit per key (a history of hundreds of slices paid a commit each).
    with db.transaction(), db.cursor() as cursor:
        cursor.executemany(
            sql.SQL("UPDATE {} SET dedup_key = %s WHERE id = %s").format(table),
            [(key, job_id) for _, job_id, key in sorted(keys)],
        )


# -- the statements of docs/operations.md -------------------------------------------------------

SQL_BLOCK = re.compile(r"<!-- sql:(\w+) -->\n```sql\n(.*?)```", re.S)


def operations_statements() -> list[str]:
    """The names of the statements docs/operations.md gives, in the page's order."""
    return [name for name, _ in SQL_BLOCK.findall((DOCS / "operations.md").read_text())]


def operations_sql(name: str, schema: str, **words: str) -> str:
    """A statement of docs/operations.md for `schema` instead of `synclane`, other words
    replaced as given."""
    blocks = dict(SQL_BLOCK.findall((DOCS / "operations.md").read_text(encoding="utf-8")))
    text = blocks[name]
    for old, new in words.items():
        text = text.replace(old, new)
    quoted = sql.Identifier(schema).as_string(None)
    return re.sub(r"\bsynclane(?=\.|;|\s+TO\b)", quoted, text)


def race_a_rival(
    app: Any,
    dsn: str,
    db: psycopg.Connection[Any],
    schema: str,
    index: str | None,
    lanes: int,
    rivals: int,
) -> int:
    """Jobs in `lanes` lanes; a rival transaction marks `rivals` of them running in slots 0..n
    (of their lane and of the queue) without committing; a worker's take runs meanwhile; the
    rival commits. Returns how many jobs run at the end. `index`: kept (None drops both)."""
    jobs = sql.Identifier(schema, "jobs")
    db.execute(sql.SQL("DELETE FROM {}").format(jobs))
    ids = [app.enqueue("q", f"o{n}", "sync", lane=f"l{n % lanes}") for n in range(rivals + 4)]
    if index is None:
        for name in ("jobs_running_lane", "jobs_leased_queue_slot"):
            db.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(schema, name)))
    rival = psycopg.connect(dsn)
    # the rival holds the newest jobs, so that the take's best job is one it does not lock
    for slot, job_id in enumerate(ids[-rivals:]):
        rival.execute(
            sql.SQL(
                "UPDATE {} SET status = 'running', lease_token = gen_random_uuid(), "
                "lane_slot = %s, queue_slot = %s WHERE id = %s"
            ).format(jobs),
            [slot % app.get_queue("q").settings.lane_width, slot, job_id],
        )
    settings = app.get_queue("q").settings
    outcome: dict[str, Any] = {}

    def take() -> None:
        async def once() -> Any:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                return await take_front(
                    conn,
                    app.store,
                    "q",
                    "rival-2",
                    timedelta(minutes=5),
                    plain=1,
                    lane_width=settings.lane_width,
                    max_running=settings.max_running,
                )

        try:
            outcome["batch"] = asyncio.run(once())
        except psycopg.errors.UniqueViolation as error:
            outcome["error"] = error

    taker = threading.Thread(target=take)
    taker.start()
    taker.join(timeout=2)
    rival.commit()
    rival.close()
    taker.join(timeout=30)
    return count(db, "SELECT count(*) FROM {jobs} WHERE status = 'running'", schema)
