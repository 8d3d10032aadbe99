"""Helpers for worker tests: start real worker processes, run an in-process worker until a
condition holds, wait for rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from synclane import SyncLane
from synclane.worker import Worker

HERE = Path(__file__).parent


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


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


@contextmanager
def running_worker(
    app: SyncLane, queues: list[str] | None = None, **options: Any
) -> Iterator[Worker]:
    """A worker in a thread of this process, stopped (jobs handed back) when the block ends."""
    worker = app.worker(queues, **options)
    errors: list[BaseException] = []

    def target() -> None:
        try:
            worker.run()
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(timeout=30)
        assert not thread.is_alive(), "the worker did not stop within 30 s"
        if errors:
            raise errors[0]


def job_row(db: psycopg.Connection[Any], schema: str, job_id: int) -> dict[str, Any]:
    from psycopg.rows import dict_row

    with db.cursor(row_factory=dict_row) as cur:
        cur.execute(
            sql.SQL("SELECT * FROM {} WHERE id = %s").format(sql.Identifier(schema, "jobs")),
            (job_id,),
        )
        row = cur.fetchone()
    assert row is not None
    return row


def count(db: psycopg.Connection[Any], query: str, schema: str, *params: Any) -> int:
    """Run a query whose {jobs} and {runs} name the schema's tables; returns its first value."""
    statement = sql.SQL(query).format(
        jobs=sql.Identifier(schema, "jobs"), runs=sql.Identifier(schema, "runs")
    )
    row = db.execute(statement, params).fetchone()
    assert row is not None
    return int(row[0])
