"""Instant pickup: what makes a job due wakes idle slots through LISTEN/NOTIFY, so a worker that
polls every 30 s still starts it at once; notifications are few under load; the listening
connection comes back after it breaks, and the slots poll meanwhile.

Every worker here is a real process (tests/worker_proc.py) polling every 30 s unless a test says
otherwise: a job that starts within a second was woken, not found by a poll. The bound is
generous for a loaded machine; bench/wakeup.py measures the figure (p95 well under 100 ms)."""

from __future__ import annotations

import signal
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from worker_proc import build, create_runs
from workers import database_now, job_row, running_worker, wait_for, worker_processes

from synclane import Page, SyncLane
from synclane.store import Store
from synclane.wakeup import channel, notify_work
from synclane.worker import presence

pytestmark = pytest.mark.processes

WOKEN_WITHIN = 1.0  # seconds; a poll would take up to 30


def _prepare(
    dsn: str, schema: str, db: psycopg.Connection[Any], **settings: Any
) -> tuple[dict[str, Any], SyncLane]:
    settings = {"dsn": dsn, "schema": schema, "poll": 30, **settings}
    app = build(settings)  # creates the schema
    create_runs(db, schema)
    return settings, app


def _ready(db: psycopg.Connection[Any], schema: str, count: int = 1) -> list[int]:
    """Wait until `count` workers are listed (they listen before their first take); returns
    their pids."""
    table = sql.Identifier(schema, "workers")
    query = sql.SQL("SELECT pid FROM {} ORDER BY pid").format(table)
    wait_for(
        lambda: len(db.execute(query).fetchall()) == count,
        timeout=30,
        what=f"{count} worker(s) listening",
    )
    time.sleep(0.3)  # their first take, at start, has found nothing: now they are idle
    return [row[0] for row in db.execute(query).fetchall()]


def _first_start(db: psycopg.Connection[Any], schema: str, job_id: int) -> Any:
    """When the job's first page started in a worker (the database's clock), or None."""
    row = db.execute(
        sql.SQL("SELECT min(started) FROM {} WHERE job_id = %s").format(
            sql.Identifier(schema, "runs")
        ),
        (job_id,),
    ).fetchone()
    return None if row is None else row[0]


def _seconds_to_start(db: psycopg.Connection[Any], schema: str, job_id: int, since: Any) -> float:
    started = wait_for(
        lambda: _first_start(db, schema, job_id), timeout=40, what=f"job {job_id} to start"
    )
    return float((started - since).total_seconds())


def _insert_due_job(db: psycopg.Connection[Any], schema: str, owner: str, **columns: Any) -> int:
    """A job written with plain SQL: no notification tells anyone about it."""
    values = {
        "queue": "q",
        "owner": owner,
        "lane": owner,
        "type": "sync",
        "mode": "manual",
        "dedup_key": f"manual:{owner}",
        **columns,
    }
    statement = sql.SQL("INSERT INTO {} ({}) VALUES ({}) RETURNING id").format(
        sql.Identifier(schema, "jobs"),
        sql.SQL(", ").join(map(sql.Identifier, values)),
        sql.SQL(", ").join(sql.Placeholder() * len(values)),
    )
    row = db.execute(statement, list(values.values())).fetchone()
    assert row is not None
    return int(row[0])


def test_an_idle_worker_polling_every_30_s_starts_an_enqueued_job_within_a_second(
    dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    settings, app = _prepare(dsn, schema, db, concurrency=2)
    try:
        with worker_processes(settings, 1):
            _ready(db, schema)
            for number in range(5):
                job_id = app.enqueue("q", f"acme-{number}", "sync")
                created = job_row(db, schema, job_id)["created_at"]
                assert _seconds_to_start(db, schema, job_id, created) < WOKEN_WITHIN
                time.sleep(0.1)
    finally:
        app.close()


def test_a_requeued_job_wakes_an_idle_worker(
    dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    settings, app = _prepare(dsn, schema, db)
    job_id = _insert_due_job(
        db, schema, "acme", status="failed", error="RuntimeError: boom", attempt_count=1
    )
    db.execute(
        sql.SQL("UPDATE {} SET next_run_at = now() + interval '1 hour' WHERE id = %s").format(
            sql.Identifier(schema, "jobs")
        ),
        (job_id,),
    )
    try:
        with worker_processes(settings, 1):
            _ready(db, schema)
            asked = database_now(db)
            assert app.requeue("q", ids=[job_id]) == 1
            assert _seconds_to_start(db, schema, job_id, asked) < WOKEN_WITHIN
    finally:
        app.close()


def test_resuming_a_queue_wakes_an_idle_worker_for_the_jobs_that_piled_up(
    dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    settings, app = _prepare(dsn, schema, db)
    try:
        with worker_processes(settings, 1):
            _ready(db, schema)
            app.pause("q", "the warehouse is down")
            job_id = app.enqueue("q", "acme", "sync")
            time.sleep(0.5)
            assert _first_start(db, schema, job_id) is None, "a paused queue started a job"
            asked = database_now(db)
            assert app.resume("q") is True
            assert _seconds_to_start(db, schema, job_id, asked) < WOKEN_WITHIN
    finally:
        app.close()


def test_notify_work_wakes_workers_when_the_transaction_commits(
    dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    """What the planner calls after its insert, in its transaction: nothing is heard before the
    commit, or after a rollback; the commit wakes an idle worker at once."""
    settings, app = _prepare(dsn, schema, db)
    store = Store(schema)
    try:
        with worker_processes(settings, 1), psycopg.connect(dsn) as conn:
            _ready(db, schema)
            _insert_due_job(conn, schema, "rolled-back")
            notify_work(conn, store, "q")
            conn.rollback()
            job_id = _insert_due_job(conn, schema, "acme")
            notify_work(conn, store, "q")
            notify_work(conn, store, "q")  # folded into one by PostgreSQL
            time.sleep(0.5)
            conn.commit()
            committed = database_now(db)
            assert _seconds_to_start(db, schema, job_id, committed) < WOKEN_WITHIN
        assert app.jobs(owner="rolled-back").empty
    finally:
        app.close()


def test_a_lane_freed_by_a_finished_job_wakes_an_idle_worker(
    dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    """Worker A finishes a job of lane L and takes a better job of lane M instead of L's next
    one; worker B, idle because L was busy, is woken for L's next job at once.

    The two later jobs are written with plain SQL before L's first one is enqueued, due a second
    later: nobody is told when they become due. Written while L's first one runs instead, they
    could meet B still answering the enqueue's wake-up on a loaded machine (it then took M's job
    at once, and the premise, an idle B, did not hold)."""
    settings, app = _prepare(dsn, schema, db, page_sleep=2.0)
    try:
        with worker_processes(settings, 2):
            _ready(db, schema, 2)
            due = database_now(db) + timedelta(seconds=1)
            following = _insert_due_job(db, schema, "acme-2", lane="L", next_run_at=due)
            better = _insert_due_job(
                db,
                schema,
                "globex",
                lane="M",
                next_run_at=due,
                window_start=due - timedelta(hours=2),
                window_end=due - timedelta(hours=1),
            )
            first = app.enqueue("q", "acme-1", "sync", lane="L")
            holder = wait_for(
                lambda: job_row(db, schema, first)["leased_by"],
                timeout=10,
                what="L's first job running",
            )
            wait_for(
                lambda: job_row(db, schema, first)["status"] == "completed",
                timeout=20,
                what="L's first job to complete",
            )
            finished = job_row(db, schema, first)["completed_at"]
            assert finished > due, "L's first job ended before the others were due"
            assert _seconds_to_start(db, schema, following, finished) < WOKEN_WITHIN
            assert job_row(db, schema, better)["leased_by"] == holder
            assert job_row(db, schema, following)["leased_by"] != holder
    finally:
        app.close()


def test_a_lane_freed_while_no_slot_waits_is_not_announced(
    dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    """The same lanes, with one worker of one slot: nobody waits, so nothing is sent. (Its
    pages are long enough for the worker to have said that its slot no longer waits.)"""
    settings, app = _prepare(dsn, schema, db, page_sleep=2.0)
    listener = _listen(dsn, schema)
    try:
        with worker_processes(settings, 1):
            _ready(db, schema)
            first = app.enqueue("q", "acme-1", "sync", lane="L")
            assert _heard(listener) == ["q"]  # the enqueue
            _insert_due_job(db, schema, "acme-2", lane="L")
            better = _insert_due_job(
                db,
                schema,
                "globex",
                lane="M",
                window_start=database_now(db) - timedelta(hours=2),
                window_end=database_now(db) - timedelta(hours=1),
            )
            wait_for(
                lambda: job_row(db, schema, better)["status"] == "running",
                timeout=20,
                what="M's job taken when L's first completed",
            )
            assert job_row(db, schema, first)["status"] == "completed"
            assert _heard(listener, 0.5) == [], "L was freed with work due, but nobody waited"
    finally:
        listener.close()
        app.close()


def test_a_stopping_worker_wakes_the_others_for_the_jobs_it_hands_back(
    dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    settings, app = _prepare(dsn, schema, db, pages=20, page_sleep=0.3)
    try:
        with worker_processes(settings, 2) as processes:
            _ready(db, schema, 2)
            job_id = app.enqueue("q", "acme", "sync")
            holder = wait_for(
                lambda: job_row(db, schema, job_id)["leased_by"], timeout=10, what="a holder"
            )
            stopping = next(p for p in processes if holder == f"worker-{p.pid}")
            stopping.send_signal(signal.SIGTERM)
            stopping.wait(timeout=15)
            stopped = database_now(db)
            other = next(p for p in processes if p is not stopping)
            taken = wait_for(
                lambda: job_row(db, schema, job_id)["leased_by"] == f"worker-{other.pid}",
                timeout=40,
                what="the other worker to take the job",
            )
            assert taken
            started = job_row(db, schema, job_id)["started_at"]
            assert (started - stopped).total_seconds() < WOKEN_WITHIN
    finally:
        app.close()


def test_the_listener_comes_back_after_its_connection_is_terminated(
    dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    settings, app = _prepare(dsn, schema, db)
    workers = sql.Identifier(schema, "workers")
    session = sql.SQL("SELECT session_pid FROM {}").format(workers)
    try:
        with worker_processes(settings, 1) as (process,):
            _ready(db, schema)
            (before,) = db.execute(session).fetchone()  # type: ignore[misc]
            db.execute("SELECT pg_terminate_backend(%s)", (before,))
            wait_for(
                lambda: (row := db.execute(session).fetchone()) and row[0] != before,
                timeout=20,
                what="the worker to listen again on a new session",
            )
            assert app.workers()["state"].tolist() == ["running"]
            time.sleep(0.2)
            job_id = app.enqueue("q", "acme", "sync")
            created = job_row(db, schema, job_id)["created_at"]
            assert _seconds_to_start(db, schema, job_id, created) < WOKEN_WITHIN
            process.send_signal(signal.SIGTERM)
            _, log = process.communicate(timeout=15)
        assert "lost its listening connection" in log
        assert "listens for due work again" in log
    finally:
        app.close()


def test_slots_keep_polling_while_the_listener_cannot_connect(
    dsn: str, schema: str, db: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listener that cannot connect (refused here at every try) costs the wake-ups, not the
    work: the slots find due jobs at their next poll, and the listener keeps trying."""
    tries: list[float] = []

    async def refused(self: presence.Presence) -> Any:
        tries.append(time.monotonic())
        raise psycopg.OperationalError("connection refused (the test's listener is down)")

    monkeypatch.setattr(presence.Presence, "_connect", refused)
    app = SyncLane(dsn, schema=schema, poll_interval=0.5, plan_interval=3600)
    queue = app.queue("q")
    queue.snapshot("sync", every=timedelta(days=1))(lambda job: Page(None, 1))
    try:
        with running_worker(app):
            # Past its first take (at start) and its first retry: idle, and deaf.
            wait_for(lambda: len(tries) >= 2, timeout=10, what="the listener trying again")
            first = app.enqueue("q", "acme", "sync")  # its notification finds no listener
            second = _insert_due_job(db, schema, "globex")
            for job_id in (first, second):
                wait_for(
                    lambda job_id=job_id: job_row(db, schema, job_id)["status"] == "completed",
                    timeout=10,
                    what=f"job {job_id} found by a poll",
                )
            wait_for(lambda: len(tries) >= 3, timeout=10, what="the listener trying again")
    finally:
        app.close()


def _listen(dsn: str, schema: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(schema))))
    return conn


def _heard(conn: psycopg.Connection[Any], wait: float = 0.5) -> list[str]:
    return [note.payload for note in conn.notifies(timeout=wait)]


def test_only_due_work_is_announced_and_a_requeue_of_many_once(
    app: SyncLane, dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    app.queue("q").snapshot("sync", every=timedelta(days=1))(lambda job: Page(None, 1))
    listener = _listen(dsn, schema)
    try:
        app.enqueue("q", "acme", "sync")
        assert _heard(listener) == ["q"]
        db.execute(
            sql.SQL(
                "INSERT INTO {} (queue, lane, paused_until) VALUES ('q', 'throttled', "
                "now() + interval '1 hour')"
            ).format(sql.Identifier(schema, "lanes"))
        )
        app.enqueue("q", "globex", "sync", lane="throttled")  # waits for its lane: not due
        assert _heard(listener) == []
        for number in range(50):
            _insert_due_job(
                db, schema, f"owner-{number}", status="abandoned", error="Abandon: gone"
            )
        assert app.requeue("q") == 50
        assert _heard(listener) == ["q"], "fifty requeued jobs, one notification"
    finally:
        listener.close()


def test_finishing_many_jobs_sends_a_few_notifications_not_one_per_job(
    dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    """400 one-page jobs in 40 lanes, written with plain SQL, run by two processes: lanes free
    up all the time, but each worker tells of them at most ten times a second."""
    settings, app = _prepare(dsn, schema, db, concurrency=4, page_sleep=0.0, poll=0.05)
    db.execute(
        sql.SQL(
            "INSERT INTO {} (queue, owner, lane, type, mode, dedup_key) "
            "SELECT 'q', 'owner-' || n, 'lane-' || (n % 40), 'sync', 'manual', 'manual:' || n "
            "FROM generate_series(1, 400) n"
        ).format(sql.Identifier(schema, "jobs"))
    )
    listener = _listen(dsn, schema)
    heard: list[str] = []
    try:
        began = time.monotonic()
        with worker_processes(settings, 2):
            done = sql.SQL("SELECT count(*) FROM {} WHERE status = 'completed'").format(
                sql.Identifier(schema, "jobs")
            )
            while db.execute(done).fetchone()[0] < 400:  # type: ignore[index]
                heard += _heard(listener, 0.1)
                assert time.monotonic() - began < 120, "400 jobs did not finish in 2 minutes"
            elapsed = time.monotonic() - began
            heard += _heard(listener, 0.2)
        per_worker_limit = elapsed / presence.FREED_SPACING + 1
        assert len(heard) <= 2 * per_worker_limit, (len(heard), elapsed)
        assert len(heard) < 400 / 4
    finally:
        listener.close()
        app.close()


def test_the_channel_fits_postgresql_for_every_schema_name(dsn: str) -> None:
    assert channel("synclane") == "synclane.synclane"
    for schema in ("s" * 54, "s" * 55, "é" * 31, "s" * 63):
        name = channel(schema)
        assert len(name.encode()) <= 63
        with psycopg.connect(dsn, autocommit=True) as conn:  # PostgreSQL takes it
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(name)))
            conn.execute("SELECT pg_notify(%s, 'q')", (name,))
            assert [n.channel for n in conn.notifies(timeout=1, stop_after=1)] == [name]
    assert channel("s" * 62) != channel("s" * 63)
