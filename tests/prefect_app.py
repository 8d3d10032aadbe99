"""The app the Prefect tests load by path (`prefect_app:app`), as a block or a deployment does.

It is built with SyncLane(None, ...): its DSN comes from $SYNCLANE_DSN (which the block sets),
its schema from $SYNCLANE_PREFECT_TEST_SCHEMA. `build` makes the same app on a given database
for the tests that need no Prefect.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta

from synclane import Abandon, Job, Owner, Page, SyncLane, Throttled

# The `slow` queue's second page waits here, so a test can stop a worker mid-page; in other
# processes (served runs) it waits $SYNCLANE_PREFECT_TEST_PAGE_WAIT seconds (60 unless set).
PAGE_IN_FLIGHT = threading.Event()
RELEASE = threading.Event()
PAGE_WAIT = float(os.environ.get("SYNCLANE_PREFECT_TEST_PAGE_WAIT") or 60)


def build(dsn: str | None, schema: str) -> SyncLane:
    lane = SyncLane(dsn, schema=schema, poll_interval=0.05, plan_interval=3600)
    shops = lane.queue("shops", concurrency=2, retry_base_delay=3600)

    @shops.owners
    def connected(queue: str) -> list[Owner]:
        return [Owner("acme-us", lane="acme"), Owner("acme-eu", lane="acme"), Owner("globex")]

    @shops.windowed(
        "orders", horizon=timedelta(days=60), slice=timedelta(days=30), every=timedelta(minutes=15)
    )
    def orders(job: Job) -> Page:
        if job.owner == "globex" and job.mode == "initial":
            raise LookupError(f"order {job.id} not found")
        if job.cursor is None:
            return Page("2", 5)  # two pages of five records
        return Page(None, 5)

    @shops.snapshot("products", every=timedelta(days=1))
    def products(job: Job) -> Page:
        return Page(None, 3)

    slow = lane.queue("slow", lease_duration=30)

    @slow.owners
    def initech(queue: str) -> list[Owner]:
        return [Owner("initech")]

    @slow.snapshot("catalog", every=timedelta(days=1))
    def catalog(job: Job) -> Page:
        if job.cursor is None:
            return Page("page-2", 10)
        PAGE_IN_FLIGHT.set()
        RELEASE.wait(PAGE_WAIT)
        return Page(None, 1)

    # One owner for each thing a team alerts on: an abandoned job, a deferred one, a throttled
    # lane, a finished first load.
    alerts = lane.queue("alerts", max_attempts=1, retry_base_delay=3600)

    @alerts.owners
    def accounts(queue: str) -> list[Owner]:
        return [Owner("fine"), Owner("stuck"), Owner("flaky"), Owner("busy")]

    @alerts.windowed(
        "orders", horizon=timedelta(days=60), slice=timedelta(days=30), every=timedelta(days=1)
    )
    def alert_orders(job: Job) -> Page:
        if job.owner == "stuck":
            raise Abandon("the account was closed")
        if job.owner == "flaky":
            raise RuntimeError(f"order {job.id} not found")
        if job.owner == "busy":
            raise Throttled(retry_after=3600)
        return Page(None, 1)

    # Work for two machines: eight lanes, each job four pages of half a second.
    spread = lane.queue("spread")

    @spread.owners
    def shops(queue: str) -> list[Owner]:
        return [Owner(f"shop-{n}") for n in range(8)]

    @spread.snapshot("catalog", every=timedelta(days=1))
    def spread_catalog(job: Job) -> Page:
        time.sleep(0.5)
        page = int(job.cursor or 0) + 1
        return Page(None if page >= 4 else str(page), 1)

    return lane


_schema = os.environ.get("SYNCLANE_PREFECT_TEST_SCHEMA")
app = build(None, _schema) if _schema else None
