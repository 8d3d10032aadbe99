"""Process targets for the planner's multi-process tests (tests/test_planner_rounds.py).

A spawned process imports what it runs by module name, so the targets live here, in an
importable module, not inside a test function.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import traceback
from typing import Any

import apps

from synclane import Owner, SyncLane

# Forty shops in seven lanes, as in tests/apps.py.
OWNERS = apps.OWNERS


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
