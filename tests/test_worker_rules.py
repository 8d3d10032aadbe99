"""How a worker finishes jobs: retries, throttles, deferral, order, cancellation."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from apps import BASE, window
from workers import job_row

from synclane import Abandon, Owner, Page, SyncLane, Throttled
from synclane.model import Job
from synclane.testing import running_worker, wait_for
from synclane.worker import error_text, retry_delay

DAY = timedelta(days=1)


def test_a_throttle_pauses_its_lane_and_keeps_the_attempt(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    queue = app.queue("q", concurrency=2)
    starts: list[tuple[str, float]] = []
    throttled_at: list[float] = []
    lock = threading.Lock()

    @queue.windowed("orders", horizon=30 * DAY, slice=DAY, every=timedelta(hours=1))
    def orders(job: Job) -> Page:
        with lock:
            starts.append((job.lane, time.monotonic()))
            first_time = job.lane == "slow" and not throttled_at
            if first_time:
                throttled_at.append(time.monotonic())
        if first_time:
            raise Throttled(retry_after=1.5)
        time.sleep(0.05)
        return Page(None, 1)

    slow = [app.enqueue("q", "s", "orders", lane="slow", **window(d)) for d in range(1, 5)]
    fast = [app.enqueue("q", "f", "orders", lane="fast", **window(d)) for d in range(1, 30)]
    with running_worker(app):
        wait_for(
            lambda: all(job_row(db, schema, j)["status"] == "completed" for j in slow + fast),
            timeout=30,
            what="every job to complete",
        )
    pause_start = throttled_at[0]
    during = [(lane, t) for lane, t in starts if pause_start < t < pause_start + 1.4]
    assert not [lane for lane, _ in during if lane == "slow"], "the throttled lane ran too soon"
    assert [lane for lane, _ in during if lane == "fast"], "other lanes must keep running"
    first = job_row(db, schema, slow[0])
    assert first["throttle_count"] == 1
    assert first["attempt_count"] == 1, "a throttle must not use up an attempt"


def test_a_failing_job_is_retried_deferred_then_abandoned_and_a_requeue_heals_it(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    queue = app.queue("q", max_attempts=3, retry_base_delay=0.3, retry_max_delay=5)
    healed = threading.Event()
    bad_calls: list[tuple[str | None, float]] = []
    finished: dict[int, float] = {}

    @queue.windowed("orders", horizon=30 * DAY, slice=DAY, every=timedelta(hours=1))
    def orders(job: Job) -> Page:
        if job.owner == "bad":
            bad_calls.append((job.cursor, time.monotonic()))
            if job.cursor is None:
                return Page("50", 50)
            if not healed.is_set():
                raise ValueError(f"page at cursor {job.cursor} is broken")
            return Page(None, 25)
        time.sleep(0.3)
        finished[job.id] = time.monotonic()
        return Page(None, 1)

    bad = app.enqueue("q", "bad", "orders", lane="shop", **window(1))
    with running_worker(app):
        wait_for(lambda: job_row(db, schema, bad)["status"] == "deferred", 30, "deferral")
        # Work that arrives in the lane while the job is deferred goes first.
        good = [app.enqueue("q", "good", "orders", lane="shop", **window(d)) for d in (2, 3)]
        wait_for(lambda: job_row(db, schema, bad)["status"] == "abandoned", 30, "abandonment")
    row = job_row(db, schema, bad)
    assert row["cursor"] == "50"
    assert row["processed_count"] == 50
    assert row["attempt_count"] == 4  # three regular attempts and the deferred one
    assert row["error"] == "ValueError: page at cursor 50 is broken"
    broken = [at for cursor, at in bad_calls if cursor == "50"]
    assert len(broken) == 4  # attempt 1 saved cursor 50 then failed; 2-4 resumed from it
    assert bad_calls[0][0] is None and len(bad_calls) == 5, "no attempt started over"
    first_wait, second_wait = broken[1] - broken[0], broken[2] - broken[1]
    assert first_wait >= 0.3 * 0.9
    assert second_wait > first_wait * 1.3, "the retry delay must grow"
    assert broken[-1] > max(finished[g] for g in good), "the deferred attempt waits for the lane"

    healed.set()
    calls_before = len(bad_calls)
    assert app.requeue("q", owner="bad") == 1
    with running_worker(app):
        wait_for(lambda: job_row(db, schema, bad)["status"] == "completed", 30, "healing")
    assert [cursor for cursor, _ in bad_calls[calls_before:]] == ["50"]
    assert job_row(db, schema, bad)["processed_count"] == 75


def test_newest_window_first_within_a_type_and_types_in_declared_order(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    queue = app.queue("q")
    order: list[tuple[str, datetime | None]] = []

    @queue.windowed("orders", horizon=30 * DAY, slice=DAY, every=timedelta(hours=1))
    def orders(job: Job) -> Page:
        order.append((job.type, job.window_start))
        return Page(None, 0)

    @queue.windowed("refunds", horizon=30 * DAY, slice=DAY, every=timedelta(hours=1))
    def refunds(job: Job) -> Page:
        order.append((job.type, job.window_start))
        return Page(None, 0)

    for days_ago in (5, 1, 3):
        app.enqueue("q", "acme", "refunds", **window(days_ago))
    for days_ago in (4, 9, 2):
        app.enqueue("q", "acme", "orders", **window(days_ago))
    with running_worker(app):
        wait_for(lambda: len(order) == 6, 30, "six jobs")
    assert order == [
        ("orders", BASE - 2 * DAY),
        ("orders", BASE - 4 * DAY),
        ("orders", BASE - 9 * DAY),
        ("refunds", BASE - 1 * DAY),
        ("refunds", BASE - 3 * DAY),
        ("refunds", BASE - 5 * DAY),
    ]


def test_a_cancelled_running_job_stops_at_its_next_save_and_frees_its_lane(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    queue = app.queue("q", lease_duration=30)
    pages: list[str | None] = []

    @queue.snapshot("products", every=DAY)
    def products(job: Job) -> Page:
        pages.append(job.cursor)
        time.sleep(0.2)
        return Page(str(int(job.cursor or 0) + 1), 1)  # never ends on its own

    job_id = app.enqueue("q", "acme", "products")
    with running_worker(app) as worker:
        wait_for(lambda: len(pages) >= 2, 10, "two pages")
        assert app.cancel("q", "acme", "account disconnected") == 1
        wait_for(lambda: job_row(db, schema, job_id)["lease_token"] is None, 10, "the release")
        handled = len(pages)
        time.sleep(0.5)
        assert len(pages) == handled, "the worker kept paging a cancelled job"
    row = job_row(db, schema, job_id)
    assert row["status"] == "cancelled"
    assert row["error"] == "Cancelled: account disconnected"
    assert worker.report["lost"] == 1


def test_abandon_ends_the_job_at_once(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    queue = app.queue("q")

    @queue.snapshot("products", every=DAY)
    def products(job: Job) -> Page:
        raise Abandon("access revoked")

    job_id = app.enqueue("q", "acme", "products")
    with running_worker(app):
        wait_for(lambda: job_row(db, schema, job_id)["status"] == "abandoned", 10, "abandon")
    row = job_row(db, schema, job_id)
    assert row["error"] == "Abandon: access revoked"
    assert row["attempt_count"] == 1


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ({"cursor": "1"}, "TypeError: the products handler returned dict"),
        (None, "TypeError: the products handler returned NoneType"),
    ],
)
def test_a_handler_that_returns_no_page_fails_the_job_clearly(
    app: SyncLane, db: psycopg.Connection[Any], schema: str, result: Any, message: str
) -> None:
    queue = app.queue("q", retry_base_delay=60)

    @queue.snapshot("products", every=DAY)
    async def products(job: Job) -> Any:
        return result

    job_id = app.enqueue("q", "acme", "products")
    with running_worker(app):
        wait_for(lambda: job_row(db, schema, job_id)["status"] == "failed", 10, "the failure")
    assert job_row(db, schema, job_id)["error"].startswith(message)


def test_the_worker_plans_before_it_works(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    queue = app.queue("q", concurrency=2)
    queue.owners(lambda name: [Owner("acme-us", lane="acme"), Owner("globex")])

    @queue.snapshot("products", every=DAY)
    def products(job: Job) -> Page:
        return Page(None, 3)

    with running_worker(app):
        wait_for(lambda: len(app.jobs(status="completed")) == 2, 10, "both owners' products")
    done = app.jobs(status="completed")
    assert sorted(done["owner"]) == ["acme-us", "globex"]
    assert sorted(done["lane"]) == ["acme", "globex"]
    assert list(done["processed_count"]) == [3, 3]


def test_error_text_names_the_type_and_is_bounded() -> None:
    assert error_text(KeyError("x")) == "KeyError: 'x'"
    assert error_text(RuntimeError()) == "RuntimeError"
    long = error_text(RuntimeError("x" * 10_000))
    assert len(long) == 2000 and long.endswith("…")
    assert "\x00" not in error_text(RuntimeError("a\x00b"))


def test_retry_delay_doubles_and_is_capped() -> None:
    base, cap = timedelta(seconds=10), timedelta(seconds=100)
    delays = [retry_delay(n, base, cap).total_seconds() for n in range(1, 8)]
    for attempt, delay in enumerate(delays, start=1):
        expected = min(10 * 2 ** (attempt - 1), 100)
        assert expected * 0.9 <= delay <= expected * 1.1
    assert retry_delay(500, base, cap) <= cap * 1.1


def test_cancelling_the_worker_task_hands_the_job_back_with_its_cursor(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    """An orchestrator that cancels run_worker_async (a task group, Prefect tearing down the
    loop) goes through the same hand-back as a signal."""
    import asyncio

    queue = app.queue("q")
    pages: list[str | None] = []

    @queue.snapshot("products", every=DAY)
    async def products(job: Job) -> Page:
        pages.append(job.cursor)
        if job.cursor == "2":
            await asyncio.sleep(60)
        return Page(str(int(job.cursor or 0) + 1), 1)

    job_id = app.enqueue("q", "acme", "products")

    async def scenario() -> None:
        task = asyncio.create_task(app.run_worker_async())
        while "2" not in pages:
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    row = job_row(db, schema, job_id)
    assert (row["status"], row["cursor"], row["attempt_count"]) == ("pending", "2", 0)


def test_until_idle_waits_for_a_retry_due_within_the_grace_period(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    queue = app.queue("q", retry_base_delay=1, retry_max_delay=2)
    calls: list[int] = []

    @queue.snapshot("products", every=DAY)
    def products(job: Job) -> Page:
        calls.append(job.attempt_count)
        if len(calls) == 1:
            raise RuntimeError("the API answered 503")
        return Page(None, 1)

    job = app.enqueue("q", "acme", "products")
    began = time.monotonic()
    report = app.run_worker(until_idle=True, idle_grace=10, stop_after=30)
    assert report == {"failed": 1, "completed": 1}
    assert job_row(db, schema, job)["status"] == "completed"
    assert time.monotonic() - began < 20


def test_until_idle_stops_when_the_next_due_job_is_beyond_the_grace_period(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    queue = app.queue("q", retry_base_delay=60, retry_max_delay=120)

    @queue.snapshot("products", every=DAY)
    def products(job: Job) -> Page:
        raise RuntimeError("the API answered 503")

    job = app.enqueue("q", "acme", "products")
    began = time.monotonic()
    assert app.run_worker(until_idle=True, idle_grace=5, stop_after=30) == {"failed": 1}
    assert time.monotonic() - began < 10
    assert job_row(db, schema, job)["status"] == "failed"
