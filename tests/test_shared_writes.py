"""Slots whose pages end at the same instant share one page-save statement (issue 19): each row
keeps its own guard, a slot whose guard fails learns it alone, and a crash still re-runs at most
one page of each job."""

from __future__ import annotations

import asyncio
import signal
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from worker_proc import build, create_runs
from workers import count, job_row, running_worker, wait_for, worker_processes

from synclane import Job, Page, SyncLane
from synclane.worker.shared import Shared

DAY = timedelta(days=1)


def test_pages_that_end_together_are_saved_in_one_statement_and_a_lost_guard_stays_alone(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    queue = app.queue("q", concurrency=3)
    release = asyncio.Event()
    started: set[int] = set()
    loop: list[asyncio.AbstractEventLoop] = []

    @queue.snapshot("sync", every=DAY)
    async def sync(job: Job) -> Page:
        loop[:] = [asyncio.get_running_loop()]
        if job.cursor is None:
            started.add(job.id)
            await release.wait()  # the three first pages end at one instant
            return Page("1", 5)
        await asyncio.sleep(60)
        return Page(None)

    jobs = [app.enqueue("q", owner, "sync") for owner in ("acme", "globex", "initech")]
    with running_worker(app) as worker:
        wait_for(lambda: len(started) == 3, 10, "three pages in flight")
        assert app.cancel("q", "globex", "disconnected") == 1  # its save's guard will fail
        loop[0].call_soon_threadsafe(release.set)
        wait_for(lambda: worker.report["lost"] == 1, 10, "globex's lease lost")
        wait_for(
            lambda: (
                job_row(db, schema, jobs[0])["cursor"] == "1"
                and job_row(db, schema, jobs[2])["cursor"] == "1"
            ),
            10,
            "the other two saved",
        )
        saves = worker._crew.pages["q"].saves if worker._crew else None
        assert saves is not None and (saves.statements, saves.requests) == (1, 3)
    acme, globex, initech = (job_row(db, schema, j) for j in jobs)
    assert (acme["processed_count"], initech["processed_count"]) == (5, 5)
    assert (globex["status"], globex["cursor"], globex["processed_count"]) == ("cancelled", None, 0)


@pytest.mark.processes
def test_a_crash_during_shared_saves_reruns_at_most_one_page_of_each_job(
    dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    settings = {
        "dsn": dsn,
        "schema": schema,
        "concurrency": 6,
        "pages": 12,
        "page_sleep": 0.05,
        "lease": 2,
    }
    app = build(settings)
    create_runs(db, schema)
    jobs = [app.enqueue("q", f"owner-{n}", "sync", lane=f"lane-{n}") for n in range(6)]
    app.close()
    with worker_processes(settings, 1) as (first,):
        wait_for(
            lambda: count(db, "SELECT count(*) FROM {runs}", schema) >= 20, 30, "pages running"
        )
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    time.sleep(2.5)  # the dead worker's leases expire
    with worker_processes(settings, 1):
        wait_for(
            lambda: (
                count(db, "SELECT count(*) FROM {jobs} WHERE status = 'completed'", schema) == 6
            ),
            60,
            "every job completed",
        )
    for job_id in jobs:
        runs = count(db, "SELECT count(*) FROM {runs} WHERE job_id = %s", schema, job_id)
        assert 12 <= runs <= 13, f"job {job_id} ran {runs} pages for 12"
        assert job_row(db, schema, job_id)["processed_count"] == 12


def test_a_shared_statement_cancelled_in_flight_leaves_no_slot_waiting() -> None:
    """The slots of a statement in flight, and those waiting for the next, each get an answer
    (a cancellation, which the slot logs and restarts after) when the serving task ends by
    something other than an Exception, here a cancellation of its own: a slot left waiting
    forever would hold its job and its lane, silently."""

    async def main() -> list[bool]:
        async def statement(requests: list[int]) -> list[int]:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(0.01)
            return requests

        shared: Shared[int, int] = Shared(statement)
        in_flight = asyncio.ensure_future(shared.ask(1))
        await asyncio.sleep(0)  # the statement is sent
        await asyncio.sleep(0)
        later = asyncio.ensure_future(shared.ask(2))
        done, _ = await asyncio.wait([in_flight, later], timeout=2)
        return [asker in done for asker in (in_flight, later)]

    assert asyncio.run(main()) == [True, True]
