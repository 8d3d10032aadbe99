"""Stopping a worker with a page in flight (issue 17, item 4): the page may end within the stop
grace; a page longer than every worker's budget does not loop forever."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import psycopg
from workers import job_row

from synclane import Job, Page, SyncLane

DAY = timedelta(days=1)


def test_a_page_in_flight_ends_within_the_stop_grace_and_its_cursor_is_saved(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    queue = app.queue("q")

    @queue.snapshot("products", every=DAY)
    async def products(job: Job) -> Page:
        await asyncio.sleep(1.0)
        return Page(str(int(job.cursor or 0) + 1), 10)

    job_id = app.enqueue("q", "acme", "products")
    report = app.run_worker(stop_after=0.3, stop_grace=5)
    row = job_row(db, schema, job_id)
    assert report == {"handed_back": 1}
    assert (row["status"], row["cursor"], row["processed_count"]) == ("pending", "1", 10)
    assert (row["attempt_count"], row["stalls"]) == (0, 0)


def test_a_page_longer_than_the_budget_fails_an_attempt_after_three_stops_without_progress(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    queue = app.queue("q", retry_base_delay=3600, retry_max_delay=3600)

    @queue.snapshot("products", every=DAY)
    async def products(job: Job) -> Page:
        await asyncio.sleep(30)  # longer than any budget below
        return Page(None, 1)

    job_id = app.enqueue("q", "acme", "products")
    for stalls in (1, 2):
        assert app.run_worker(stop_after=0.3, stop_grace=0.2) == {"handed_back": 1}
        row = job_row(db, schema, job_id)
        assert (row["status"], row["stalls"], row["attempt_count"]) == ("pending", stalls, 0)
    assert app.run_worker(stop_after=0.3, stop_grace=0.2) == {"failed": 1}
    row = job_row(db, schema, job_id)
    assert row["status"] == "failed" and row["attempt_count"] == 1
    assert row["error"].startswith("StopGraceExceeded: the page in flight did not end")
    assert "stop grace (0.2 s)" in row["error"]


def test_a_saved_page_resets_the_count_of_stops_without_progress(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    queue = app.queue("q")
    calls: list[str | None] = []

    @queue.snapshot("products", every=DAY)
    async def products(job: Job) -> Page:
        calls.append(job.cursor)
        if len(calls) == 2:
            return Page("saved", 1)  # progress in the second run
        await asyncio.sleep(30)
        return Page(None, 1)

    job_id = app.enqueue("q", "acme", "products")
    app.run_worker(stop_after=0.3, stop_grace=0.2)
    assert job_row(db, schema, job_id)["stalls"] == 1
    app.run_worker(stop_after=0.5, stop_grace=0.2)
    row = job_row(db, schema, job_id)
    assert (row["cursor"], row["stalls"], row["status"]) == ("saved", 0, "pending")
