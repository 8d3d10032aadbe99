"""What a worker tells its listeners (synclane.events): one event per thing that happened."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from apps import window
from workers import job_row

from synclane import Abandon, Job, Page, SyncLane, Throttled
from synclane.events import Event, EventLog
from synclane.testing import running_worker, wait_for

DAY = timedelta(days=1)


def test_listeners_hear_pages_completions_failures_throttles_and_abandons(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    queue = app.queue("q", concurrency=2, max_attempts=1, retry_base_delay=30, retry_max_delay=60)
    throttled: set[str] = set()

    @queue.windowed("orders", horizon=30 * DAY, slice=DAY, every=timedelta(hours=1))
    def orders(job: Job) -> Page:
        if job.owner == "fine":
            return Page("2", 2) if job.cursor is None else Page(None, 3)
        if job.owner == "slow" and job.owner not in throttled:
            throttled.add(job.owner)
            raise Throttled(retry_after=30)
        if job.owner == "gone":
            raise Abandon("access revoked")
        raise ValueError("order 41 not found")

    ids = {
        owner: app.enqueue("q", owner, "orders", **window(1)) for owner in ("fine", "slow", "gone")
    }
    ids["bad"] = app.enqueue("q", "bad", "orders", **window(1))
    heard: list[Event] = []
    log = EventLog(kinds=("completed", "deferred"))
    with running_worker(app, on_event=[heard.append, log]):
        wait_for(
            lambda: (
                {job_row(db, schema, i)["status"] for i in ids.values()}
                >= {"completed", "abandoned", "deferred"}
                and job_row(db, schema, ids["slow"])["throttle_count"] == 1
            ),
            timeout=30,
            what="every job to reach its end",
        )
    kinds = {(event.owner, event.kind) for event in heard}
    assert {("fine", "started"), ("fine", "page"), ("fine", "completed")} <= kinds
    assert ("slow", "throttled") in kinds
    assert ("gone", "abandoned") in kinds
    assert ("bad", "deferred") in kinds
    completed = next(e for e in heard if e.kind == "completed")
    assert completed.records == 5 and completed.job_id == ids["fine"] and completed.queue == "q"
    throttle = next(e for e in heard if e.kind == "throttled")
    assert throttle.until is not None and throttle.until > datetime.now(UTC) + timedelta(seconds=20)
    assert throttle.error is not None and throttle.error.startswith("Throttled")
    deferred = next(e for e in heard if e.kind == "deferred")
    assert deferred.error == "ValueError: order 41 not found"
    logged = log.since(0)
    assert sorted(event.kind for _, event in logged) == ["completed", "deferred"]
    assert log.since(logged[-1][0]) == []


def test_a_listener_that_raises_costs_no_job(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    queue = app.queue("q")

    @queue.snapshot("products", every=DAY)
    def products(job: Job) -> Page:
        return Page(None, 1)

    def broken(event: Event) -> None:
        raise RuntimeError("listener bug")

    job = app.enqueue("q", "acme", "products")
    with running_worker(app, on_event=broken):
        wait_for(
            lambda: job_row(db, schema, job)["status"] == "completed", 10, "the job to complete"
        )


def test_the_last_history_slice_tells_that_the_first_load_finished(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    from synclane import Owner

    queue = app.queue("q", concurrency=2)
    queue.owners(lambda name: [Owner("acme")])

    @queue.windowed("orders", horizon=3 * DAY, slice=DAY, every=timedelta(hours=1))
    def orders(job: Job) -> Page:
        return Page(None, 1)

    app.plan()
    heard: list[Event] = []
    with running_worker(app, on_event=heard.append):
        wait_for(lambda: any(e.kind == "first_load_finished" for e in heard), 20, "the first load")
    finished = [e for e in heard if e.kind == "first_load_finished"]
    assert len(finished) == 1 and finished[0].owner == "acme" and finished[0].type == "orders"
    initial_done = [e for e in heard if e.kind == "completed" and e.mode == "initial"]
    assert len(initial_done) == 3
