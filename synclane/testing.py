"""Testing a synclane app: a handler without a database, an app with one.

- `make_job(**overrides)`: the `Job` a handler receives, every field defaulted.
- `run_pages(handler, job)`: calls the handler page by page as a worker would, following its
  cursors, and reports how the run ended (`run_pages_async` awaits it on the caller's loop).
- `make_app(dsn, schema)` and `running_worker(app)`: an app for tests on a real PostgreSQL and a
  worker in a thread of the test. The pytest plugin (synclane.testing_plugin) gives the fixtures
  `dsn`, `schema`, `app` and `db` on top of them.

docs/testing.md shows each in a test. Importing this module starts nothing and imports no
pandas (the app's `jobs()` and the other frames do, when called).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from synclane.bridge import PageRun
from synclane.errors import HandlerEscaped, error_text
from synclane.model import (
    MAX_COUNT,
    MAX_INTEGER,
    MODES,
    Abandon,
    ConfigError,
    Job,
    Throttled,
    check_aware,
    check_name,
    page_of,
    unstorable,
)

if TYPE_CHECKING:
    from synclane.app import SyncLane
    from synclane.worker import Worker

__all__ = [
    "RunReport",
    "UnknownField",
    "make_app",
    "make_job",
    "run_pages",
    "run_pages_async",
    "running_worker",
    "wait_for",
]

# How many pages run_pages calls before it stops a handler that keeps returning cursors.
MAX_PAGES = 100

Ending = Literal["completed", "throttled", "abandoned", "failed", "max_pages"]

_FIELDS = tuple(field.name for field in dataclasses.fields(Job))


# -- a job ---------------------------------------------------------------------------------------


def make_job(**overrides: Any) -> Job:
    """The Job a handler receives, with a default for every field: id 1, queue "test", owner
    "acme" in its own lane, type "test", mode "initial" (a first load), no window, no cursor,
    the first attempt (a worker counts an attempt when it takes a job), nothing processed yet.

    Override any field by name (`make_job(type="orders", window_start=..., window_end=...)`);
    `lane` follows `owner` unless given. Values are checked as the table would check them; an
    unknown field is a ConfigError naming it."""
    unknown = sorted(set(overrides) - set(_FIELDS))
    if unknown:
        raise UnknownField(
            f"make_job() got unknown field(s) {', '.join(unknown)}; a Job has {', '.join(_FIELDS)}"
        )
    owner = overrides.get("owner", "acme")
    values: dict[str, Any] = {
        "id": 1,
        "queue": "test",
        "owner": owner,
        "lane": owner,
        "type": "test",
        "mode": "initial",
        "window_start": None,
        "window_end": None,
        "cursor": None,
        "attempt_count": 1,
        "processed_count": 0,
        **overrides,
    }
    for name in ("queue", "owner", "lane", "type"):
        check_name(name, values[name])
    if values["mode"] not in MODES:
        raise ConfigError(f"mode={values['mode']!r} must be one of {', '.join(MODES)}")
    _check_count("id", values["id"], least=1)
    _check_count("attempt_count", values["attempt_count"], least=0, most=MAX_INTEGER)
    _check_count("processed_count", values["processed_count"], least=0)
    cursor = values["cursor"]
    if cursor is not None and (not isinstance(cursor, str) or unstorable(cursor)):
        raise ConfigError(f"cursor must be None or a str the table can hold, got {cursor!r:.100}")
    start = check_aware("window_start", values["window_start"])
    end = check_aware("window_end", values["window_end"])
    if start is not None and end is not None and start >= end:
        raise ConfigError(
            f"window_start={start.isoformat()} must be before window_end={end.isoformat()}"
        )
    values["window_start"], values["window_end"] = start, end
    return Job(**values)


class UnknownField(ConfigError, TypeError):
    """make_job() was given a field a Job does not have: a ConfigError, and the TypeError Python
    raises for an unexpected keyword argument."""


def _check_count(name: str, value: object, least: int, most: int = MAX_COUNT) -> None:
    """A count the table's column holds (bigint, or integer for attempt_count)."""
    if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= most:
        raise ConfigError(f"{name}={value!r:.100} must be a whole number from {least} to {most:,}")


# -- running a handler page by page ------------------------------------------------------------


@dataclass(frozen=True)
class RunReport:
    """How `run_pages` went.

    `ended` says why it stopped: "completed" (a page without a next cursor), "throttled"
    (`Throttled`: see `retry_after`), "abandoned" (`Abandon`: see `reason`), "failed" (any other
    exception, or a result that is not a Page), or "max_pages" (still returning cursors).
    `error` is the text a worker would store in the job's `error` column (None on completion and
    at max_pages); `exception` is what the handler raised."""

    ended: Ending
    pages: int  # handler calls that returned a Page
    records: int  # the sum of their counts
    cursor: str | None  # where the job stands: None once completed, else where it would go on
    cursors: tuple[str | None, ...]  # the cursor each call received, in order
    error: str | None = None
    exception: BaseException | None = None
    retry_after: timedelta | None = None  # Throttled(retry_after=...), as a timedelta
    reason: str | None = None  # Abandon(reason)

    @property
    def completed(self) -> bool:
        return self.ended == "completed"

    @property
    def throttled(self) -> bool:
        return self.ended == "throttled"

    @property
    def abandoned(self) -> bool:
        return self.ended == "abandoned"

    @property
    def failed(self) -> bool:
        return self.ended == "failed"


def run_pages(
    handler: Callable[[Job], Any], job: Job | None = None, max_pages: int = MAX_PAGES
) -> RunReport:
    """Call `handler` page by page as a worker would, without a database: the first call gets
    `job` (default `make_job()`), each next one the same job with the cursor the last page
    returned and the records counted so far, until a page returns no cursor, the handler raises,
    or `max_pages` calls returned a cursor. Plain functions run in a thread and async ones on an
    event loop, decided by what the call returns, exactly as in a worker.

    Called where an event loop already runs (Jupyter, an async test), the run gets a loop of its
    own in another thread; to run an async handler on the caller's loop, await
    `run_pages_async` instead."""
    run = run_pages_async(handler, job, max_pages=max_pages)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run)
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="synclane-run-pages")
    try:
        context = contextvars.copy_context()
        return pool.submit(context.run, asyncio.run, run).result()
    finally:
        pool.shutdown(wait=False)


async def run_pages_async(
    handler: Callable[[Job], Any], job: Job | None = None, max_pages: int = MAX_PAGES
) -> RunReport:
    """`run_pages` on the running event loop: `await run_pages_async(handler, job)`."""
    if not isinstance(max_pages, int) or isinstance(max_pages, bool) or max_pages < 1:
        raise ConfigError(f"max_pages={max_pages!r:.100} must be a whole number >= 1")
    if not callable(handler):
        raise ConfigError(f"handler must be callable, got {type(handler).__name__}")
    current = make_job() if job is None else job
    if not isinstance(current, Job):
        raise ConfigError(f"job must be a synclane Job (make_job()), got {type(current).__name__}")
    pages = records = 0
    cursors: list[str | None] = []

    def ended(how: Ending, **details: Any) -> RunReport:
        return RunReport(how, pages, records, current.cursor, tuple(cursors), **details)

    while pages < max_pages:
        cursors.append(current.cursor)
        try:
            page = page_of(current.type, await PageRun(handler, current).outcome())
        except Throttled as throttle:
            return ended(
                "throttled",
                error=error_text(throttle),
                exception=throttle,
                retry_after=throttle.retry_after,
            )
        except Abandon as abandon:
            return ended(
                "abandoned", error=error_text(abandon), exception=abandon, reason=abandon.reason
            )
        except Exception as error:
            raised = error.original if isinstance(error, HandlerEscaped) else error
            return ended("failed", error=error_text(error), exception=raised)
        pages += 1
        records += page.count
        if page.next_cursor is None:
            return RunReport("completed", pages, records, None, tuple(cursors))
        current = dataclasses.replace(
            current,
            cursor=page.next_cursor,
            processed_count=current.processed_count + page.count,
        )
    return ended("max_pages")


# -- an app on a real database -----------------------------------------------------------------


def make_app(dsn: str, schema: str, **settings: Any) -> SyncLane:
    """A SyncLane for tests: idle slots look for work every 0.05 s (not 5 s), and a running
    worker plans only when it starts (plan_interval one hour), so a test decides when planning
    happens. `settings` are SyncLane's own and win over these. Close it when done."""
    from synclane.app import SyncLane

    chosen: dict[str, Any] = {"poll_interval": 0.05, "plan_interval": 3600, **settings}
    return SyncLane(dsn, schema=schema, **chosen)


@contextmanager
def running_worker(
    app: SyncLane, queues: str | list[str] | None = None, **options: Any
) -> Iterator[Worker]:
    """A worker of `app` (options as `app.worker` takes them) running in a thread of this
    process while the block runs. When the block ends the worker stops, running jobs are handed
    back with their cursors, and an exception the worker raised is raised here."""
    worker = app.worker(queues, **options)
    errors: list[BaseException] = []

    def target() -> None:
        try:
            worker.run()
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=target, name="synclane-test-worker", daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(timeout=30)
        if thread.is_alive():
            raise AssertionError("the worker did not stop within 30 s")
        if errors:
            raise errors[0]


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05
) -> Any:
    """Call `predicate` every `interval` seconds until it returns something true, and return
    that; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
