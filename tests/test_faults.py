"""Faults (issue 8): the promises hold when things go wrong, not only on a good day.

Real worker processes against a real PostgreSQL: a chaos run that kills workers with SIGKILL
and cuts their connections, a database restart (on an embedded PostgreSQL of the test's own),
owner sources that raise or hang, and handlers that misbehave in every way we could think of.
Every test is bounded in time; the large chaos run is marked `slow`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
from apps import ASYNC_MISBEHAVIOURS, MISBEHAVIOURS, as_coroutine, done
from psycopg import sql
from servers import EmbeddedServer
from worker_proc import OVERLAPS, build, create_runs
from workers import HERE, count, database_now, job_row

from synclane import Job, Owner, Page, SyncLane
from synclane.app import OwnerSourceError
from synclane.testing import make_app, running_worker, wait_for

DAY = timedelta(days=1)

# -- the chaos run ------------------------------------------------------------------------------

# Every change of a job's cursor and every completion, stamped with the database clock, so that
# the test can tell which pages were handed to a handler after their result was saved.
SAVES_DDL = """
CREATE TABLE {saves} (job_id bigint NOT NULL, cursor text, status text NOT NULL,
                      at timestamptz NOT NULL);
CREATE FUNCTION {record}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {saves} VALUES (NEW.id, NEW.cursor, NEW.status, clock_timestamp());
    RETURN NULL;
END $$;
CREATE TRIGGER record_saves AFTER UPDATE ON {jobs} FOR EACH ROW
    WHEN (NEW.cursor IS DISTINCT FROM OLD.cursor
          OR (NEW.status = 'completed' AND OLD.status <> 'completed'))
    EXECUTE FUNCTION {record}();
"""

# A page handed to a handler after the cursor it leads to was saved, or after its job completed.
PAGES_AFTER_THEIR_SAVE = """
SELECT count(*) FROM {runs} r JOIN {saves} s ON s.job_id = r.job_id
WHERE s.at < r.started
  AND (s.cursor = (coalesce(r.cursor_in, '0')::int + 1)::text OR s.status = 'completed')
"""


@dataclass
class Fleet:
    """Worker processes of tests/worker_proc.py whose logs go to files (a pipe nobody reads
    would fill up and stall them), killed and restarted at will."""

    settings: dict[str, Any]
    logs: Path
    processes: list[subprocess.Popen[str]] = field(default_factory=list)
    started: int = 0

    def start(self) -> subprocess.Popen[str]:
        self.started += 1
        log = (self.logs / f"worker-{self.started}.log").open("w")
        process = subprocess.Popen(
            [sys.executable, str(HERE / "worker_proc.py"), json.dumps(self.settings)],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        log.close()
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.strip() == "ready", f"worker did not start: {self.log_text()[-2000:]}"
        self.processes.append(process)
        return process

    def alive(self) -> list[subprocess.Popen[str]]:
        return [p for p in self.processes if p.poll() is None]

    def stop_all(self) -> None:
        for process in self.alive():
            process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
            if process.stdout is not None:
                process.stdout.close()

    def log_text(self) -> str:
        return "".join(path.read_text() for path in sorted(self.logs.glob("worker-*.log")))


@contextmanager
def fleet(settings: dict[str, Any], count: int, logs: Path) -> Iterator[Fleet]:
    workers = Fleet(settings, logs)
    try:
        for _ in range(count):
            workers.start()
        yield workers
    finally:
        workers.stop_all()


def _kill(db: psycopg.Connection[Any], schema: str, process: subprocess.Popen[str]) -> None:
    """SIGKILL, and close the dead process's open runs at the moment of the kill: its handler
    stopped then (the overlap check needs an end)."""
    process.kill()
    process.wait(timeout=10)
    db.execute(
        sql.SQL("UPDATE {} SET ended = %s WHERE pid = %s AND ended IS NULL").format(
            sql.Identifier(schema, "runs")
        ),
        (database_now(db), process.pid),
    )


def _terminate_worker_connections(db: psycopg.Connection[Any], workers: Fleet) -> int:
    """pg_terminate_backend on every connection of the worker pools ('synclane-worker') of these
    processes. Other sessions on a shared server use that name too: they are left alone by
    matching the client's TCP port. (Over a Unix socket, which carries no port, the server is
    the test session's own embedded one.)"""
    unix_socket = db.info.host.startswith("/")
    ports: list[int] = []
    for process in workers.alive():
        try:
            found = psutil.Process(process.pid).net_connections(kind="tcp")
        except psutil.Error:
            continue
        ports += [c.laddr.port for c in found if c.raddr]
    row = db.execute(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE application_name = 'synclane-worker' AND datname = current_database() "
        "AND (client_port = ANY (%s) OR (%s AND client_port = -1))",
        (ports, unix_socket),
    ).fetchone()
    assert row is not None
    return int(row[0])


def chaos(
    dsn: str,
    schema: str,
    db: psycopg.Connection[Any],
    tmp_path: Path,
    *,
    jobs: int,
    pages: int,
    lanes: int = 20,
    page_sleep: float,
    budget: float,
) -> dict[str, int]:
    settings = {
        "dsn": dsn,
        "schema": schema,
        "concurrency": 4,
        "lease": 2,
        "pages": pages,
        "page_sleep": page_sleep,
        "max_attempts": 100,
        "stop_after": budget + 60,
    }
    app = build(settings)  # creates the table
    create_runs(db, schema)
    db.execute(
        sql.SQL(SAVES_DDL).format(
            saves=sql.Identifier(schema, "saves"),
            record=sql.Identifier(schema, "record_save"),
            jobs=sql.Identifier(schema, "jobs"),
        )
    )
    for number in range(jobs):
        app.enqueue("q", f"owner-{number % (lanes * 2)}", "sync", lane=f"lane-{number % lanes}")
    app.close()

    def completed() -> int:
        return count(db, "SELECT count(*) FROM {jobs} WHERE status = 'completed'", schema)

    rng = random.Random(8)
    kills = terminated = 0
    deadline = time.monotonic() + budget
    with fleet(settings, 3, tmp_path) as workers:
        next_blow = time.monotonic() + rng.uniform(0.5, 1)
        while completed() < jobs:
            assert time.monotonic() < deadline, (
                f"only {completed()} of {jobs} jobs completed within {budget} s "
                f"({kills} kills):\n{workers.log_text()[-3000:]}"
            )
            if time.monotonic() >= next_blow:
                if kills == 1 and not terminated:
                    terminated = _terminate_worker_connections(db, workers)
                    assert terminated > 0, "no worker connection to terminate"
                else:
                    victim = rng.choice(workers.alive())
                    _kill(db, schema, victim)
                    workers.processes.remove(victim)
                    workers.start()
                    kills += 1
                next_blow = time.monotonic() + rng.uniform(1.5, 3)
            time.sleep(0.1)
        logs = workers.log_text()
    assert kills >= 2 and terminated > 0

    # Every job completed, each page counted once, and every page handled at least once.
    assert count(db, "SELECT count(*) FROM {jobs} WHERE processed_count <> %s", schema, pages) == 0
    handled = count(
        db, "SELECT count(*) FROM (SELECT DISTINCT job_id, cursor_in FROM {runs}) p", schema
    )
    assert handled == jobs * pages
    # One running job per lane, at every instant.
    assert count(db, OVERLAPS, schema) == 0
    # The at-least-once window is the page in flight: no page ran again after its save.
    again = sql.SQL(PAGES_AFTER_THEIR_SAVE).format(
        runs=sql.Identifier(schema, "runs"), saves=sql.Identifier(schema, "saves")
    )
    row = db.execute(again).fetchone()
    assert row == (0,)
    repeated = count(
        db, "SELECT count(*) - count(DISTINCT (job_id, cursor_in)) FROM {runs}", schema
    )
    return {
        "kills": kills,
        "terminated": terminated,
        "pages_repeated": repeated,
        "reclaimed": logs.count("reclaimed as"),
    }


@pytest.mark.processes
def test_chaos_kill_9_and_cut_connections_lose_nothing_and_never_share_a_lane(
    dsn: str, schema: str, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """300 jobs of 4 pages over 20 lanes, 3 worker processes with a 2 s lease: every 1.5-3 s a
    random worker is killed with SIGKILL and restarted, and once every worker connection is
    terminated by the server."""
    result = chaos(dsn, schema, db, tmp_path, jobs=300, pages=5, page_sleep=0.05, budget=60)
    print("chaos:", result)


@pytest.mark.slow
@pytest.mark.processes
def test_chaos_at_scale(dsn: str, schema: str, db: psycopg.Connection[Any], tmp_path: Path) -> None:
    """The issue's size: 1,000 jobs of 5 pages over 20 lanes."""
    result = chaos(dsn, schema, db, tmp_path, jobs=1000, pages=5, page_sleep=0.05, budget=300)
    print("chaos at scale:", result)


# -- a database restart ---------------------------------------------------------------------------


@pytest.mark.processes
def test_a_database_restart_mid_run_is_ridden_out(tmp_path: Path) -> None:
    """Workers log the outage, wait with backoff, reconnect and finish; no job is left running
    with a dead lease."""
    with tempfile.TemporaryDirectory(prefix="synclane-restart-") as directory:
        server = EmbeddedServer(Path(directory))
        try:
            _restart_mid_run(server, tmp_path)
        finally:
            server.close()


def _restart_mid_run(server: EmbeddedServer, logs: Path) -> None:
    schema = "restart"
    jobs, pages = 60, 6
    settings = {
        "dsn": server.dsn,
        "schema": schema,
        "concurrency": 3,
        "lease": 4,
        "pages": pages,
        "page_sleep": 0.05,
        "max_attempts": 100,
        "stop_after": 120,
    }
    app = build(settings)
    for number in range(jobs):
        app.enqueue("q", f"owner-{number % 12}", "sync", lane=f"lane-{number % 6}")
    app.close()
    with psycopg.connect(server.dsn, autocommit=True) as db:
        create_runs(db, schema)

    def completed() -> int:
        with psycopg.connect(server.dsn, autocommit=True) as db:
            return count(db, "SELECT count(*) FROM {jobs} WHERE status = 'completed'", schema)

    with fleet(settings, 2, logs) as workers:
        wait_for(lambda: completed() >= 8, 60, "the first jobs to complete", interval=0.1)
        server.stop()
        time.sleep(4)  # the outage: longer than a slot waits for a connection
        server.start()
        outage_over = time.monotonic()
        wait_for(lambda: completed() == jobs, 90, f"{jobs} completed jobs", interval=0.2)
        recovery = time.monotonic() - outage_over
        assert all(process.poll() is None for process in workers.processes), "a worker died"
        log_text = workers.log_text()
    print(f"all jobs done {recovery:.1f} s after the database came back")

    assert "cannot reach the database" in log_text
    assert "reached the database again" in log_text
    assert "Traceback" not in log_text, log_text[-3000:]
    with psycopg.connect(server.dsn, autocommit=True) as db:
        assert count(db, OVERLAPS, schema) == 0
        stale = "SELECT count(*) FROM {jobs} WHERE status = 'running' OR lease_token IS NOT NULL"
        assert count(db, stale, schema) == 0
        assert (
            count(db, "SELECT count(*) FROM {jobs} WHERE processed_count <> %s", schema, pages) == 0
        )


# -- owner sources that fail --------------------------------------------------------------------


@pytest.fixture
def quick_owners(dsn: str, schema: str) -> Iterator[SyncLane]:
    """An app whose owner sources must answer within half a second."""
    app = make_app(dsn, schema, plan_interval=0.3, owners_timeout=0.5)
    yield app
    app.close()


def declare_failing_sources(app: SyncLane) -> threading.Event:
    """Queues 'raises', 'hangs' (a function), 'hangs_async' (a coroutine) and 'none' (returns
    None) next to a healthy 'shops'. Returns the event that releases the hanging function."""
    release = threading.Event()

    def raises(queue: str) -> list[Owner]:
        raise RuntimeError("the accounts API answered 500")

    def hangs(queue: str) -> list[Owner]:
        release.wait(60)
        return [Owner("late")]

    async def hangs_async(queue: str) -> list[Owner]:
        await asyncio.sleep(60)
        return [Owner("late")]

    for name, source in [
        ("raises", raises),
        ("hangs", hangs),
        ("hangs_async", hangs_async),
        ("none", lambda queue: None),
    ]:
        queue = app.queue(name)
        queue.owners(source)
        queue.snapshot("products", every=DAY)(done)
    shops = app.queue("shops", concurrency=2)
    # One account id PostgreSQL cannot store: left out, the others are planned.
    shops.owners(lambda queue: ["acme", "globex", "bad\x00id"])
    shops.snapshot("products", every=DAY)(done)
    return release


def test_a_failing_owner_source_skips_its_queue_and_plans_the_others(
    quick_owners: SyncLane, caplog: pytest.LogCaptureFixture
) -> None:
    app = quick_owners
    release = declare_failing_sources(app)
    try:
        started = time.monotonic()
        with (
            caplog.at_level(logging.ERROR, logger="synclane"),
            pytest.raises(OwnerSourceError) as raised,
        ):
            app.plan()
        took = time.monotonic() - started
    finally:
        release.set()
    assert took < 3, "a hanging owner source must time out after owners_timeout"
    message = str(raised.value)
    assert "queue 'raises'" in message and "RuntimeError: the accounts API answered 500" in message
    assert "queue 'hangs'" in message and "owners_timeout=0:00:00.500000" in message
    assert "queue 'hangs_async'" in message
    assert "queue 'none'" in message and "<lambda> returned NoneType None" in message
    assert raised.value.added == {"shops": 2}
    assert sorted(app.jobs("shops")["owner"]) == ["acme", "globex"]
    assert len(app.jobs("raises")) == 0
    logged = caplog.text
    assert "the owner source" in logged and "cannot be stored" in logged and "NUL" in logged
    # Asked for one queue, the error is that queue's alone.
    with pytest.raises(OwnerSourceError, match="queue 'raises'"):
        app.plan("raises")
    assert app.plan("shops") == {"shops": 0}


def test_workers_keep_working_while_owner_sources_fail(
    quick_owners: SyncLane, caplog: pytest.LogCaptureFixture
) -> None:
    app = quick_owners
    release = declare_failing_sources(app)
    # Jobs of the broken queues that exist already (enqueued by hand, lane given) still run.
    manual = [app.enqueue(name, "acme", "products", lane="acme") for name in ("raises", "hangs")]
    try:
        with caplog.at_level(logging.INFO, logger="synclane"), running_worker(app) as worker:
            wait_for(
                lambda: len(app.jobs(status="completed")) == 4, 15, "planned and manual jobs done"
            )
            wait_for(
                lambda: all(
                    f"planning queue {name} failed" in caplog.text
                    for name in ("hangs", "hangs_async")
                ),
                5,
                "both hanging sources to time out",
            )
            stopping = time.monotonic()
            worker.stop()
        stop_took = time.monotonic() - stopping
    finally:
        release.set()
    done_jobs = app.jobs(status="completed")
    assert set(manual) <= set(done_jobs["id"])
    assert sorted(done_jobs[done_jobs["queue"] == "shops"]["owner"]) == ["acme", "globex"]
    assert stop_took < 5, "a hanging owner source held up the worker's stop"
    logged = caplog.text
    for name in ("raises", "hangs", "hangs_async", "none"):
        assert f"planning queue {name} failed: OwnerSourceError" in logged


# -- handlers that misbehave --------------------------------------------------------------------


def test_misbehaving_handlers_fail_their_job_clearly_and_the_slot_carries_on(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    """One slot, so that a misbehaviour that killed it (or the worker) would leave the healthy
    job declared last undone. Each bad job fails with a clear error and waits for its retry."""
    queue = app.queue("q", retry_base_delay=3600, retry_max_delay=3600)
    expected: dict[int, str] = {}
    for name, body, error in MISBEHAVIOURS:
        queue.snapshot(name, every=DAY)(body)
        expected[app.enqueue("q", "acme", name, lane=name)] = error
        if name in ASYNC_MISBEHAVIOURS:
            queue.snapshot(f"{name}_async", every=DAY)(as_coroutine(body))
            expected[app.enqueue("q", "acme", f"{name}_async", lane=f"{name}_async")] = (
                error.replace(f"the {name} handler", f"the {name}_async handler")
            )
    queue.snapshot("healthy", every=DAY)(done)
    healthy = app.enqueue("q", "acme", "healthy")

    with running_worker(app):
        wait_for(lambda: job_row(db, schema, healthy)["status"] == "completed", 20, "healthy job")
    for job_id, error in expected.items():
        row = job_row(db, schema, job_id)
        assert (row["type"], row["status"]) == (row["type"], "failed")
        assert row["error"].startswith(error), (row["type"], row["error"])
        assert row["lease_token"] is None and row["attempt_count"] == 1


def test_a_plain_handler_slower_than_the_lease_keeps_its_job_by_heartbeat(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    """A slow page is not a dead worker: its thread blocks, the heartbeat renews the lease, and
    the page is handled once."""
    queue = app.queue("q", lease_duration=1)
    calls: list[str | None] = []

    @queue.snapshot("slow", every=DAY)
    def slow(job: Job) -> Page:
        calls.append(job.cursor)
        time.sleep(3)  # three leases
        return Page(None, 1)

    job_id = app.enqueue("q", "acme", "slow")
    with running_worker(app) as worker:
        wait_for(lambda: job_row(db, schema, job_id)["status"] == "completed", 15, "the slow page")
    assert calls == [None]
    assert worker.report == {"completed": 1}
    assert job_row(db, schema, job_id)["attempt_count"] == 1


def test_a_coroutine_that_blocks_the_loop_past_its_lease_is_taken_over(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    """A coroutine that blocks the event loop (time.sleep instead of await) stops its worker's
    heartbeat: another worker reclaims the job after the lease and runs it; the blocked worker's
    late result is refused by the lease token."""
    queue = app.queue("q", lease_duration=1, concurrency=1)
    blocked = threading.Event()

    @queue.snapshot("blocks", every=DAY)
    async def blocks(job: Job) -> Page:
        if job.attempt_count == 1:
            blocked.set()
            time.sleep(4)  # the whole loop stands still
            return Page(None, 100)  # too late: must not count
        return Page(None, 1)

    job_id = app.enqueue("q", "acme", "blocks")
    with running_worker(app) as first:
        blocked.wait(10)
        with running_worker(app) as second:
            wait_for(
                lambda: job_row(db, schema, job_id)["status"] == "completed", 15, "the takeover"
            )
            # Let the blocked worker wake up and try its late write.
            wait_for(lambda: first.report.get("lost") == 1, 10, "the first worker to give up")
    row = job_row(db, schema, job_id)
    assert (row["processed_count"], row["attempt_count"]) == (1, 2)
    assert second.report["completed"] == 1 and second.report["reclaimed"] == 1


def test_a_page_thread_left_behind_writes_nothing_and_holds_no_slot(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    """A plain handler whose page never returns is left behind in its thread when its job is
    cancelled (the heartbeat learns it) and when the worker stops: the slot takes the next job
    at once, and the thread's late result writes nothing."""
    queue = app.queue("q", lease_duration=1.5, concurrency=1)
    release = threading.Event()
    finished: list[str] = []

    @queue.snapshot("stuck", every=DAY)
    def stuck(job: Job) -> Page:
        release.wait(30)
        finished.append(str(job.id))
        return Page(None, 7)

    queue.snapshot("next", every=DAY)(done)
    cancelled = app.enqueue("q", "acme", "stuck")
    with running_worker(app) as worker:
        wait_for(lambda: job_row(db, schema, cancelled)["status"] == "running", 5, "the stuck page")
        app.cancel("q", "acme", "account disconnected")
        after = app.enqueue("q", "globex", "next")
        wait_for(lambda: job_row(db, schema, after)["status"] == "completed", 10, "the next job")
        assert worker.report["lost"] == 1
        held = app.enqueue("q", "initech", "stuck")
        wait_for(lambda: job_row(db, schema, held)["status"] == "running", 5, "a second stuck page")
        stopping = time.monotonic()
    assert time.monotonic() - stopping < 5, "the stop waited for a page that never returns"
    assert not finished
    release.set()
    wait_for(lambda: len(finished) == 2, 5, "the threads left behind to finish")
    time.sleep(0.2)
    stopped = job_row(db, schema, cancelled)
    assert (stopped["status"], stopped["processed_count"]) == ("cancelled", 0)
    assert stopped["lease_token"] is None, "the lane stays held by a cancelled job's lease"
    handed_back = job_row(db, schema, held)
    assert (handed_back["status"], handed_back["processed_count"]) == ("pending", 0)
    assert handed_back["attempt_count"] == 0
