"""The app and the Dagster definitions the Dagster tests load, in this process and in others.

A gRPC code server and its run processes import this module as a code location
(`dagster api grpc -m dagster_app`): the app is built with SyncLane(None, ...), so its DSN comes
from $SYNCLANE_DSN, and its schema from $SYNCLANE_DAGSTER_TEST_SCHEMA. `build` makes the same
app on a given database for the tests that run in-process.

Queue `shops`: orders (two 30-day history slices per owner; globex's history fails and waits an
hour for its retry) and products (globex's account is closed: abandoned at once). Queue
`fragile`: one invoices job that always fails, with one regular attempt retried at once, so it
is deferred and then abandoned within a work run. Queue `slow`:
one catalog job whose second page waits until it is released, so a test can stop a worker with
a page in flight and a saved cursor.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from pathlib import Path

from synclane import Abandon, Job, Owner, Page, SyncLane

# In-process tests release the slow page with this event; other processes with the file named
# by $SYNCLANE_DAGSTER_TEST_RELEASE.
RELEASE = threading.Event()
PAGE_IN_FLIGHT = threading.Event()


def _released() -> bool:
    path = os.environ.get("SYNCLANE_DAGSTER_TEST_RELEASE")
    return RELEASE.is_set() or (path is not None and Path(path).exists())


def build(dsn: str | None, schema: str) -> SyncLane:
    lane = SyncLane(dsn, schema=schema, poll_interval=0.05, plan_interval=300)
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
        if job.owner == "globex":
            raise Abandon("the shop closed this account")
        return Page(None, 3)

    # One regular attempt, retried at once: the job is deferred, then abandoned, in seconds.
    fragile = lane.queue("fragile", max_attempts=1, retry_base_delay=0.1)

    @fragile.owners
    def hooli(queue: str) -> list[Owner]:
        return [Owner("hooli")]

    @fragile.snapshot("invoices", every=timedelta(days=1))
    def invoices(job: Job) -> Page:
        raise RuntimeError(f"invoice service down (request {job.id})")

    slow = lane.queue("slow", lease_duration=30)

    @slow.owners
    def initech(queue: str) -> list[Owner]:
        return [Owner("initech")]

    @slow.snapshot("catalog", every=timedelta(days=1))
    def catalog(job: Job) -> Page:
        if job.cursor is None:
            return Page("page-2", 10)
        PAGE_IN_FLIGHT.set()
        deadline = time.monotonic() + 120
        while not _released() and time.monotonic() < deadline:
            time.sleep(0.05)
        return Page(None, 1)

    return lane


_schema = os.environ.get("SYNCLANE_DAGSTER_TEST_SCHEMA")
app = build(None, _schema) if _schema else None

if app is not None:
    from synclane.dagster import definitions

    defs = definitions(app)
