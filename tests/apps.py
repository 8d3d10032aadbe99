"""The apps and handlers tests declare, and the targets tests start in fresh (spawned)
processes.

A spawned process imports what it runs by module name, so everything it runs lives here, in an
importable module, not inside a test function.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from synclane import Job, Owner, Page, Queue, SyncLane

DAY = timedelta(days=1)
# The day windows of hand-enqueued jobs count back from.
BASE = datetime(2026, 1, 1, tzinfo=UTC)


def window(days_ago: int) -> dict[str, datetime]:
    """The window of the day that ended `days_ago - 1` days before BASE, as enqueue takes it."""
    return {"window_start": BASE - days_ago * DAY, "window_end": BASE - (days_ago - 1) * DAY}


def done(job: Job) -> Page:
    """A handler whose one page completes its job, no records."""
    return Page(None)


def products_queue(
    app: SyncLane,
    name: str = "shops",
    *,
    owners: Iterable[Owner] | None = None,
    handler: Callable[[Job], Any] = done,
    **settings: Any,
) -> Queue:
    """Queue `name` (declared with `settings`) with one type, a daily snapshot `products` run by
    `handler`; its owner source answers `owners` when given."""
    queue = app.queue(name, **settings)
    if owners is not None:
        connected = list(owners)
        queue.owners(lambda queue_name: connected)
    queue.snapshot("products", every=DAY)(handler)
    return queue


# Three accounts; acme-us and acme-eu share the lane acme, and with it a rate limit.
ACCOUNTS = [Owner("acme-us", lane="acme"), Owner("acme-eu", lane="acme"), Owner("globex")]


def orders_and_products(
    app: SyncLane,
    owners: Iterable[Owner] = ACCOUNTS,
    *,
    horizon: timedelta = 120 * DAY,
    every: timedelta = timedelta(minutes=15),
    overlap: timedelta = timedelta(0),
    name: str = "shops",
    **settings: Any,
) -> Queue:
    """Queue `name` (declared with `settings`) with the two types most tests sync, each page
    `done`: `orders`, windowed in 30-day slices back to `horizon` and refreshed `every` (each
    refresh reaching `overlap` back), then a daily snapshot `products`. Its owner source answers
    `owners`."""
    queue = app.queue(name, **settings)
    connected = list(owners)
    queue.owners(lambda queue_name: connected)
    queue.windowed("orders", horizon=horizon, slice=30 * DAY, every=every, overlap=overlap)(done)
    queue.snapshot("products", every=DAY)(done)
    return queue


# Forty shops in seven lanes: owners that share a lane share a rate limit.
OWNERS = [Owner(f"shop-{n:03d}", lane=f"lane-{n % 7}") for n in range(40)]

# What one plan of a fresh schema creates for each owner: the newest 2 of its 25 history slices
# (730 days in 30-day slices; a lane one wide keeps 2 open, planning.ahead_for: the others are
# planned as these finish), one refresh of orders, and the first products snapshot.
HISTORY_SLICES = 25
JOBS_PER_OWNER = 2 + 1 + 1


def connected_shops(queue: str) -> list[Owner]:
    return list(OWNERS)


# How often the app of build() refreshes orders: a planner that straddles the edge of such a
# period plans two periods (workers.wait_until_away_from_a_period_edge).
ORDERS_EVERY = timedelta(minutes=15)


def build(dsn: str, schema: str, source: Callable[[str], Any] = connected_shops) -> SyncLane:
    """The same app in every process: one queue, a snapshot type and a windowed type; its
    owners come from `source` (default: the forty shops)."""
    app = SyncLane(dsn, schema=schema)
    shops = app.queue("shops", concurrency=2)
    shops.owners(source)

    @shops.windowed(
        "orders",
        horizon=timedelta(days=730),
        slice=timedelta(days=30),
        every=ORDERS_EVERY,
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


# -- handlers that misbehave --------------------------------------------------------------------


class Custom(BaseException):
    """Neither Exception nor one of Python's own: what a library's 'abort' might raise."""


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


def _raise(error: BaseException) -> Any:
    raise error


# (type name, handler body, how the error the job ends with begins): each a plain function and,
# where it matters (ASYNC_MISBEHAVIOURS), a coroutine too.
MISBEHAVIOURS: list[tuple[str, Callable[[Job], Any], str]] = [
    (
        "returns_a_tuple",
        lambda job: ("1", 2),
        "TypeError: the returns_a_tuple handler returned tuple",
    ),
    ("returns_none", lambda job: None, "TypeError: the returns_none handler returned NoneType"),
    ("cursor_is_an_int", lambda job: Page(5, 1), "TypeError: Page.next_cursor must be a str"),  # type: ignore[arg-type]
    ("count_is_negative", lambda job: Page(None, -1), "ValueError: Page.count must be an int >= 0"),
    ("count_is_huge", lambda job: Page(None, 2**64), "ValueError: Page.count must be an int >= 0"),
    ("count_is_a_float", lambda job: Page(None, 1.5), "ValueError: Page.count must be an int >= 0"),  # type: ignore[arg-type]
    ("cursor_has_nul", lambda job: Page("a\x00b"), "ValueError: Page.next_cursor contains a NUL"),
    (
        "cursor_surrogate",
        lambda job: Page("\udc80"),
        "ValueError: Page.next_cursor contains a lone",
    ),
    ("sys_exit", lambda job: _raise(SystemExit(3)), "SystemExit: 3"),
    ("ctrl_c", lambda job: _raise(KeyboardInterrupt()), "KeyboardInterrupt"),
    ("custom_base", lambda job: _raise(Custom("abort!")), "Custom: abort!"),
    (
        "unprintable",
        lambda job: _raise(Unprintable()),
        "Unprintable: <unprintable Unprintable object>",
    ),
    (
        "surrogate_error",
        lambda job: _raise(RuntimeError("bad \udc80 byte")),
        "RuntimeError: bad \\udc80 byte",
    ),
]
ASYNC_MISBEHAVIOURS = ["returns_none", "sys_exit", "ctrl_c", "custom_base", "unprintable"]


def as_coroutine(body: Callable[[Job], Any]) -> Callable[[Job], Any]:
    """An async handler that returns what `body` returns (or raises what it raises)."""

    async def handler(job: Job) -> Any:
        return body(job)

    return handler
