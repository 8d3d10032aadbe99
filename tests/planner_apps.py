"""Process targets for the planner's multi-process tests (tests/test_planner_rounds.py).

A spawned process imports what it runs by module name, so the targets live here, in an
importable module, not inside a test function.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import time
import traceback
from datetime import timedelta
from typing import Any

import apps

from synclane import Owner, Page, SyncLane

# Forty shops in seven lanes, as in tests/apps.py.
OWNERS = apps.OWNERS
# The owners_timeout of a frozen planner's app, in seconds: its planning round is elected for
# at most twice that (at least 5 s) without a renewal.
FROZEN_OWNERS_TIMEOUT = 1.0


def shops_app(dsn: str, schema: str, source: Any) -> SyncLane:
    """The app of tests/apps.py with an owner source of the test's choosing."""
    return apps.build(dsn, schema, source)


def plan_shuffled(dsn: str, schema: str, barrier: Any, results: Any) -> None:
    """app.plan() the moment every process is ready, with an owner source that names the owners
    in an order of its own (a set, a SELECT without ORDER BY)."""
    try:
        order = random.Random(os.getpid()).sample(OWNERS, len(OWNERS))
        app = shops_app(dsn, schema, lambda queue: iter(order))
        barrier.wait(timeout=60)
        added = app.plan()
        app.close()
        results.put(("ok", added["shops"]))
    except BaseException as error:
        results.put(("error", f"{type(error).__name__}: {error}\n{traceback.format_exc()}"))


def one_round(dsn: str, schema: str, barrier: Any, release: Any, results: Any) -> None:
    """A worker's planning round the moment every process is ready. The owner source of the
    process that gets to plan waits for `release`, so the round holds its lock until the test
    has heard from every other process."""

    def source(queue: str) -> list[Owner]:
        results.put(("reading the owner source", os.getpid()))
        release.wait(60)
        return list(OWNERS)

    try:
        app = shops_app(dsn, schema, source)
        worker = app.worker(["shops"])
        assert worker.plan is not None
        barrier.wait(timeout=60)
        added = worker.plan("shops")
        app.close()
        results.put(("skipped", os.getpid()) if added is None else ("ran", added))
    except BaseException as error:
        results.put(("error", f"{type(error).__name__}: {error}\n{traceback.format_exc()}"))


def start_rounds(count: int, dsn: str, schema: str) -> tuple[list[Any], Any, Any, Any]:
    """Spawn `count` processes running `one_round`; returns them, the barrier that releases
    them, the event that releases the planning one, and the queue they report on."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(count + 1)
    release = context.Event()
    results = context.Queue()
    processes = [
        context.Process(
            target=one_round, args=(dsn, schema, barrier, release, results), daemon=True
        )
        for _ in range(count)
    ]
    for process in processes:
        process.start()
    return processes, barrier, release, results


def frozen_round(dsn: str, schema: str, results: Any) -> None:
    """A worker's planning round whose owner source says it is being read and then takes its
    time: the test stops this process (SIGSTOP) while its round is elected for the queue."""

    def source(queue: str) -> list[Owner]:
        results.put(("reading the owner source", os.getpid()))
        time.sleep(30)
        return list(OWNERS)

    try:
        app = SyncLane(dsn, schema=schema, owners_timeout=FROZEN_OWNERS_TIMEOUT)
        shops = app.queue("shops")
        shops.owners(source)
        shops.snapshot("products", every=timedelta(days=1))(lambda job: Page(None))
        worker = app.worker(["shops"])
        assert worker.plan is not None
        added = worker.plan("shops")
        app.close()
        results.put(("skipped", os.getpid()) if added is None else ("ran", added))
    except BaseException as error:
        results.put(("error", f"{type(error).__name__}: {error}\n{traceback.format_exc()}"))


def frozen_in_a_transaction(dsn: str, schema: str, idle: float, results: Any) -> None:
    """A planning round's transaction (its idle timeout `idle` seconds, as a round sets it) that
    has inserted the jobs of one owner and not committed: the test stops this process there."""
    from synclane.batches import read_and_insert
    from synclane.steps import Atomic, Blocking, run

    try:
        app = apps.build(dsn, schema, lambda queue: list(OWNERS[:1]))
        queue = app.queues["shops"]
        types = list(queue.types.values())

        def inserting() -> Any:
            added = (yield from read_and_insert(queue, OWNERS[:1], types, None)).added
            yield Blocking(lambda: results.put(("inserted", added)) or time.sleep(60))
            return added

        def transaction() -> Any:
            return (yield Atomic(inserting, serializable=True))

        conn = app.database.connect()
        run(conn, app.database.store, transaction(), idle_timeout=timedelta(seconds=idle))
        results.put(("committed", os.getpid()))
    except BaseException as error:
        results.put(("error", f"{type(error).__name__}: {error}"))
