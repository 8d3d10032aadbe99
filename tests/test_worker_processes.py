"""Promises that only several real processes can show: lanes, crashes, pauses, signals."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from worker_proc import OVERLAPS, build, create_runs
from workers import count, database_now, job_row, race_a_rival, worker_processes

from synclane import Page, SyncLane
from synclane.testing import wait_for

pytestmark = pytest.mark.processes


def _prepare(dsn: str, schema: str, db: psycopg.Connection[Any], **settings: Any) -> dict[str, Any]:
    settings = {"dsn": dsn, "schema": schema, **settings}
    app = build(settings)  # creates the schema
    app.close()
    create_runs(db, schema)
    return settings


def _run_three_lanes(dsn: str, schema: str, db: psycopg.Connection[Any], jobs: int) -> int:
    settings = {"dsn": dsn, "schema": schema, "concurrency": 8, "page_sleep": 0.005}
    app = build(settings)
    for number in range(jobs):
        app.enqueue("q", f"owner-{number % 6}", "sync", lane=f"lane-{number % 3}")
    app.close()
    # Jobs fall due one after another over a few seconds, so the best due job of a lane changes
    # while workers take: two takers whose snapshots are a moment apart can then choose two
    # different jobs of one free lane, a race only the running-lane index settles.
    db.execute(
        sql.SQL("UPDATE {} SET next_run_at = now() + random() * interval '4 seconds'").format(
            sql.Identifier(schema, "jobs")
        )
    )
    # Every job of the table, not `jobs` of them: a second round would add its jobs to those the
    # first one completed.
    with worker_processes(settings, 3):
        wait_for(
            lambda: (
                count(db, "SELECT count(*) FROM {jobs} WHERE status <> 'completed'", schema) == 0
            ),
            timeout=180,
            what="every job to complete",
            interval=0.2,
        )
    return count(db, OVERLAPS, schema)


# 200 jobs in the default run; the 600 of the first version under `pytest -m slow`.
SIZES = [200, pytest.param(600, marks=pytest.mark.slow)]


@pytest.mark.parametrize("jobs", SIZES)
def test_a_lane_never_runs_two_jobs(
    dsn: str, schema: str, db: psycopg.Connection[Any], jobs: int
) -> None:
    _prepare(dsn, schema, db)
    assert _run_three_lanes(dsn, schema, db, jobs) == 0
    assert count(db, "SELECT count(DISTINCT job_id) FROM {runs}", schema) == jobs


def test_without_the_lane_index_two_jobs_of_a_lane_overlap(
    app: SyncLane, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """The control: it is the index, not luck or a lock elsewhere, that keeps lanes exclusive.
    A rival transaction has marked a job of the lane running and not committed yet, so a take
    sees the lane free. With the index the take waits for the rival, then loses; with it
    dropped, a second job of the lane runs beside the first."""
    app.queue("q").snapshot("sync", every=timedelta(days=1))(lambda job: Page(None))
    assert race_a_rival(app, dsn, db, schema, "jobs_running_lane", lanes=1, rivals=1) == 1
    assert race_a_rival(app, dsn, db, schema, None, lanes=1, rivals=1) == 2


def test_a_killed_worker_s_job_continues_from_its_saved_cursor(
    dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    settings = _prepare(dsn, schema, db, pages=10, page_sleep=0.3, lease=2)
    app = build(settings)
    job_id = app.enqueue("q", "acme", "sync")
    app.close()
    with worker_processes(settings, 1) as (first,):
        wait_for(
            lambda: int(job_row(db, schema, job_id)["cursor"] or 0) >= 3,
            timeout=30,
            what="three saved pages",
        )
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
    saved = int(job_row(db, schema, job_id)["cursor"])
    assert job_row(db, schema, job_id)["status"] == "running"  # the dead worker's lease
    with worker_processes(settings, 1) as (second,):
        wait_for(
            lambda: job_row(db, schema, job_id)["status"] == "completed",
            timeout=60,
            what="the job to complete on the second worker",
        )
    handled = db.execute(
        sql.SQL("SELECT cursor_in FROM {} WHERE pid = %s ORDER BY id").format(
            sql.Identifier(schema, "runs")
        ),
        (second.pid,),
    ).fetchall()
    assert [int(row[0]) for row in handled] == list(range(saved, 10))
    row = job_row(db, schema, job_id)
    assert row["processed_count"] == 10
    assert row["cursor"] == "9"


def test_a_paused_worker_cannot_overwrite_the_new_owner_s_work(
    dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    settings = _prepare(dsn, schema, db, pages=12, page_sleep=0.4, lease=2)
    app = build(settings)
    job_id = app.enqueue("q", "acme", "sync")
    app.close()
    with worker_processes(settings, 2) as processes:
        pids = {process.pid: process for process in processes}
        holder = wait_for(
            lambda: (
                (row := job_row(db, schema, job_id))["leased_by"]
                and int(row["cursor"] or 0) >= 2
                and row["leased_by"]
            ),
            timeout=30,
            what="the job running with two saved pages",
        )
        paused = pids[int(holder.split("-")[1])]
        other = next(p for p in processes if p is not paused)
        paused.send_signal(signal.SIGSTOP)
        try:
            stopped_at = int(job_row(db, schema, job_id)["cursor"])
            wait_for(
                lambda: (
                    job_row(db, schema, job_id)["leased_by"] == f"worker-{other.pid}"
                    and int(job_row(db, schema, job_id)["cursor"]) >= stopped_at + 2
                ),
                timeout=30,
                what="the other worker to take over and save two pages",
            )
        finally:
            resumed_at = database_now(db)
            paused.send_signal(signal.SIGCONT)
        wait_for(
            lambda: job_row(db, schema, job_id)["status"] == "completed",
            timeout=60,
            what="the job to complete",
        )
        time.sleep(1.0)  # give the resumed worker time to try its late writes
    row = job_row(db, schema, job_id)
    assert row["processed_count"] == 12, "a late write from the paused worker was counted"
    assert row["cursor"] == "11"
    # The page in flight when the worker was stopped may record its start only after SIGCONT
    # (its thread was stopped before its first statement); it is the one page at-least-once
    # allows, and it starts at the cursor saved before the pause. Anything else is a new page.
    late = db.execute(
        sql.SQL("SELECT cursor_in FROM {} WHERE pid = %s AND started > %s").format(
            sql.Identifier(schema, "runs")
        ),
        (paused.pid, resumed_at),
    ).fetchall()
    assert [int(cursor) for (cursor,) in late] in ([], [stopped_at]), (
        f"the paused worker started another page after it lost its lease: {late}"
    )
    _, paused_log = paused.communicate(timeout=10)
    assert "lease lost" in paused_log


def test_sigterm_during_a_slow_page_hands_the_job_back_with_its_cursor(
    dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    settings = _prepare(dsn, schema, db, pages=3, slow_cursor=1, slow_sleep=60)
    app = build(settings)
    job_id = app.enqueue("q", "acme", "sync")
    app.close()
    with worker_processes(settings, 1) as (process,):
        wait_for(
            lambda: count(db, "SELECT count(*) FROM {runs} WHERE cursor_in = '1'", schema),
            timeout=30,
            what="the slow page to start",
        )
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=15)
        assert time.monotonic() - started < 10
        assert process.returncode == 0
    row = job_row(db, schema, job_id)
    assert row["status"] == "pending"
    assert row["cursor"] == "1"
    assert row["attempt_count"] == 0, "a stop must not use up an attempt"
    assert row["lease_token"] is None and row["leased_by"] is None
