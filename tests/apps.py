"""Apps and process targets that tests start in fresh (spawned) processes.

A spawned process imports what it runs by module name, so everything it runs lives here, in an
importable module, not inside a test function.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from synclane import Job, Owner, Page, SyncLane

# Forty shops in seven lanes: owners that share a lane share a rate limit.
OWNERS = [Owner(f"shop-{n:03d}", lane=f"lane-{n % 7}") for n in range(40)]

# What one plan of a fresh schema creates for each owner: 25 history slices (730 days in 30-day
# slices, the oldest 10 days long), one refresh of orders, and the first products snapshot.
JOBS_PER_OWNER = 25 + 1 + 1


def connected_shops(queue: str) -> list[Owner]:
    return list(OWNERS)


def build(dsn: str, schema: str) -> SyncLane:
    """The same app in every process: one queue, a snapshot type and a windowed type."""
    app = SyncLane(dsn, schema=schema)
    shops = app.queue("shops", concurrency=2)
    shops.owners(connected_shops)

    @shops.windowed(
        "orders",
        horizon=timedelta(days=730),
        slice=timedelta(days=30),
        every=timedelta(minutes=15),
        overlap=timedelta(minutes=5),
    )
    def orders(job: Job) -> Page:
        return Page(None, 0)

    @shops.snapshot("products", every=timedelta(days=1))
    def products(job: Job) -> Page:
        return Page(None, 0)

    return app


def start_at_once(dsn: str, schema: str, barrier: Any, results: Any) -> None:
    """Construct SyncLane (which applies the DDL) the moment every process is ready."""
    try:
        barrier.wait(timeout=60)
        app = SyncLane(dsn, schema=schema)
        app.close()
        results.put(("ok", ""))
    except BaseException as error:
        results.put(("error", f"{type(error).__name__}: {error}"))


def plan_at_once(dsn: str, schema: str, barrier: Any, results: Any) -> None:
    """Build the app, then plan every owner the moment every process is ready."""
    try:
        app = build(dsn, schema)
        barrier.wait(timeout=60)
        added = app.plan()
        app.close()
        results.put(("ok", added["shops"]))
    except BaseException as error:
        results.put(("error", f"{type(error).__name__}: {error}"))


def run_together(
    target: Any, count: int, dsn: str, schema: str, before_release: Any = None
) -> list[tuple[str, Any]]:
    """Start `count` spawned processes running `target`, release them at one instant, and
    return what each reported. `before_release` runs in the parent while they all wait."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(count + 1)
    results = context.Queue()
    processes = [
        context.Process(target=target, args=(dsn, schema, barrier, results), daemon=True)
        for _ in range(count)
    ]
    for process in processes:
        process.start()
    try:
        if before_release is not None:
            before_release()
        barrier.wait(timeout=60)
        reports = [results.get(timeout=60) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    return reports
