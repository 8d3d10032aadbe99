"""synclane.testing (docs/testing.md): make_job, run_pages as a worker runs a handler, the
pytest plugin's fixtures in a project of their own, and the page's examples as written."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import re
import subprocess
import sys
import threading
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apps import ASYNC_MISBEHAVIOURS, BASE, DAY, MISBEHAVIOURS, as_coroutine, done, window
from workers import job_row

from synclane import Abandon, ConfigError, Job, Page, SchemaError, SyncLane, Throttled
from synclane.testing import (
    MAX_PAGES,
    RunReport,
    make_app,
    make_job,
    run_pages,
    run_pages_async,
    running_worker,
    wait_for,
)

DOCS = Path(__file__).resolve().parent.parent / "docs"


def counting(pages: int, per_page: int = 10) -> Any:
    """A plain handler that returns cursors "1" … until `pages` pages are done."""

    def handler(job: Job) -> Page:
        number = int(job.cursor or 0) + 1
        return Page(str(number) if number < pages else None, per_page)

    return handler


# -- make_job ------------------------------------------------------------------------------------


def test_make_job_defaults_every_field_as_a_first_attempt_would_see_it() -> None:
    job = make_job()

    assert job == Job(
        id=1,
        queue="test",
        owner="acme",
        lane="acme",
        type="test",
        mode="initial",
        window_start=None,
        window_end=None,
        cursor=None,
        attempt_count=1,
        processed_count=0,
    )


def test_make_job_takes_any_field_and_the_lane_follows_the_owner() -> None:
    job = make_job(owner="globex", type="orders", cursor="p7", **window(1))

    assert (job.owner, job.lane, job.type, job.cursor) == ("globex", "globex", "orders", "p7")
    assert (job.window_start, job.window_end) == (BASE - DAY, BASE)
    assert make_job(owner="acme-us", lane="acme").lane == "acme"


def test_make_job_refuses_an_unknown_field_by_name() -> None:
    with pytest.raises(ConfigError, match=r"unknown field\(s\) cursour, windows_start") as raised:
        make_job(cursour="x", windows_start=BASE)
    assert "window_start" in str(raised.value)  # the fields a Job has
    assert isinstance(raised.value, TypeError)  # what Python raises for an unexpected keyword


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("owner", ""),
        ("type", "a\x00b"),
        ("mode", "backfill"),
        ("id", 0),
        ("attempt_count", -1),
        ("processed_count", 1.5),
        ("cursor", 5),
        ("window_start", datetime(2026, 1, 1)),
        ("window_end", BASE - 2 * DAY),
    ],
)
def test_make_job_refuses_what_the_table_would_not_hold(field: str, value: Any) -> None:
    values = {"window_start": BASE - DAY} if field == "window_end" else {}
    with pytest.raises(ConfigError, match=field):
        make_job(**{**values, field: value})


# -- run_pages -----------------------------------------------------------------------------------


def test_run_pages_follows_the_cursors_with_the_records_counted_so_far() -> None:
    seen: list[tuple[str | None, int]] = []

    def handler(job: Job) -> Page:
        seen.append((job.cursor, job.processed_count))
        return counting(3)(job)

    report = run_pages(handler, make_job(processed_count=5))

    assert report == RunReport("completed", 3, 30, None, (None, "1", "2"))
    assert report.completed
    assert seen == [(None, 5), ("1", 15), ("2", 25)]


class AsyncCall:
    """An object handler with `async def __call__`."""

    async def __call__(self, job: Job) -> Page:
        await asyncio.sleep(0)
        return counting(2)(job)


def decorated(handler: Any) -> Any:
    """A plain decorator over an async handler: the call returns an awaitable."""

    @functools.wraps(handler)
    def wrapper(job: Job) -> Any:
        return handler(job)

    return wrapper


async def async_handler(job: Job) -> Page:
    await asyncio.sleep(0)
    return counting(2)(job)


@pytest.mark.parametrize(
    "handler",
    [counting(2), async_handler, decorated(async_handler), AsyncCall()],
    ids=["plain", "async def", "plain decorator over async", "async __call__"],
)
def test_every_shape_of_handler_runs_page_by_page(handler: Any) -> None:
    report = run_pages(handler, make_job())

    assert (report.ended, report.pages, report.records, report.cursors) == (
        "completed",
        2,
        20,
        (None, "1"),
    )


def test_a_plain_handler_runs_in_a_thread_with_the_caller_s_context() -> None:
    where: list[tuple[str, str]] = []
    request = contextvars.ContextVar("request", default="none")
    request.set("test-42")

    def handler(job: Job) -> Page:
        where.append((threading.current_thread().name, request.get()))
        return Page(None)

    run_pages(handler)

    [(thread, value)] = where
    assert thread != threading.current_thread().name and value == "test-42"


def test_a_throttle_ends_the_run_with_its_retry_after_and_the_cursor_to_go_on_from() -> None:
    def handler(job: Job) -> Page:
        if job.cursor == "2":
            raise Throttled(retry_after=90)
        return counting(5)(job)

    report = run_pages(handler)

    assert (report.ended, report.pages, report.cursor) == ("throttled", 2, "2")
    assert report.retry_after == timedelta(seconds=90)
    assert report.error == "Throttled: the API asked to slow down"
    assert report.throttled and not (report.completed or report.abandoned or report.failed)
    assert isinstance(report.exception, Throttled)

    def no_delay_given(job: Job) -> Page:
        raise Throttled()

    assert run_pages(no_delay_given).retry_after is None  # the queue's throttle delays apply


def test_abandon_ends_the_run_with_its_reason() -> None:
    def handler(job: Job) -> Page:
        raise Abandon("access revoked")

    report = run_pages(handler, make_job(cursor="p3"))

    assert (report.ended, report.reason, report.cursor) == ("abandoned", "access revoked", "p3")
    assert report.error == "Abandon: access revoked" and report.pages == 0
    assert report.abandoned and not report.throttled


def test_an_exception_ends_the_run_with_the_error_text_a_worker_stores() -> None:
    def handler(job: Job) -> Page:
        if job.cursor == "1":
            raise KeyError("order 41")
        return counting(3)(job)

    report = run_pages(handler)

    assert (report.ended, report.error, report.cursor) == ("failed", "KeyError: 'order 41'", "1")
    assert isinstance(report.exception, KeyError) and report.failed


def test_a_handler_that_never_finishes_stops_at_max_pages() -> None:
    report = run_pages(counting(10**6, per_page=1), make_job(), 7)

    assert (report.ended, report.pages, report.records, report.cursor) == ("max_pages", 7, 7, "7")
    assert report.error is None and not report.completed
    assert run_pages(counting(10**6)).pages == MAX_PAGES


@pytest.mark.parametrize(("value", "fix"), [(0, ">= 1"), (True, ">= 1"), ("5", ">= 1")])
def test_max_pages_is_checked_by_name(value: Any, fix: str) -> None:
    with pytest.raises(ConfigError, match=f"max_pages.*{fix}"):
        run_pages(counting(1), max_pages=value)


def test_run_pages_refuses_a_job_that_is_not_a_job() -> None:
    with pytest.raises(ConfigError, match="make_job"):
        run_pages(counting(1), {"cursor": None})  # type: ignore[arg-type]


def test_in_a_running_loop_run_pages_takes_a_loop_of_its_own_and_the_twin_uses_this_one() -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    async def handler(job: Job) -> Page:
        loops.append(asyncio.get_running_loop())
        return Page(None, 1)

    async def scenario() -> tuple[RunReport, RunReport]:
        in_a_thread = run_pages(handler)  # what a Jupyter cell or an async test may call
        on_this_loop = await run_pages_async(handler)
        assert loops[1] is asyncio.get_running_loop() is not loops[0]
        return in_a_thread, on_this_loop

    in_a_thread, on_this_loop = asyncio.run(scenario())
    assert in_a_thread == on_this_loop == RunReport("completed", 1, 1, None, (None,))


def test_run_pages_fails_a_handler_exactly_as_a_worker_does(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    """Every misbehaviour of tests/apps.py (results that are not pages, bad pages, BaseExceptions,
    unprintable errors), a throttle and an abandon: run_pages reports the very text the worker
    stores in `error`."""
    queue = app.queue("q", retry_base_delay=3600, retry_max_delay=3600)

    def throttles(job: Job) -> Page:
        raise Throttled(retry_after=3600)

    def abandons(job: Job) -> Page:
        raise Abandon("access revoked")

    handlers: dict[str, Any] = {"throttles": throttles, "abandons": abandons}
    for name, body, _ in MISBEHAVIOURS:
        handlers[name] = body
        if name in ASYNC_MISBEHAVIOURS:
            handlers[f"{name}_async"] = as_coroutine(body)
    stored: dict[str, int] = {}
    for name, handler in handlers.items():
        queue.snapshot(name, every=DAY)(handler)
        stored[name] = app.enqueue("q", "acme", name, lane=name)

    with running_worker(app):
        wait_for(
            lambda: all(job_row(db, schema, j)["error"] for j in stored.values()),
            20,
            "every job to record its error",
        )

    for name, handler in handlers.items():
        report = run_pages(handler, make_job(type=name))
        assert report.error == job_row(db, schema, stored[name])["error"], name
        assert report.ended == {"throttles": "throttled", "abandons": "abandoned"}.get(
            name, "failed"
        )


def test_running_worker_hands_the_job_back_with_its_cursor_when_the_block_ends(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    queue = app.queue("q")
    release = threading.Event()

    @queue.snapshot("catalogue", every=DAY)
    def catalogue(job: Job) -> Page:
        if job.cursor == "2":
            release.wait(30)  # a page that is still running when the test is done
        return Page(str(int(job.cursor or 0) + 1), 1)

    job_id = app.enqueue("q", "acme", "catalogue")
    try:
        with running_worker(app) as worker:
            wait_for(lambda: job_row(db, schema, job_id)["cursor"] == "2", 10, "two pages")
    finally:
        release.set()
    row = job_row(db, schema, job_id)
    assert (row["status"], row["cursor"], row["attempt_count"]) == ("pending", "2", 0)
    assert worker.report["handed_back"] == 1


def test_running_worker_raises_what_the_worker_raised(dsn: str, schema: str) -> None:
    app = make_app(dsn, schema, create_schema=False)  # a schema nobody created
    app.queue("q").snapshot("products", every=DAY)(done)
    try:
        with pytest.raises(SchemaError, match="migrate"), running_worker(app):
            pass
    finally:
        app.close()


# -- the plugin in a project of its own ----------------------------------------------------------


def run_project(
    directory: Path, files: dict[str, str], *args: str, env: dict[str, str | None] | None = None
) -> subprocess.CompletedProcess[str]:
    """Write `files` into `directory` and run pytest there in a fresh interpreter, as a user's
    project would (the plugin comes from the installed entry point). `env` changes the
    environment; None removes a variable."""
    for name, text in files.items():
        (directory / name).write_text(text, encoding="utf-8")
    environment = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=300,
        env={name: value for name, value in environment.items() if value is not None},
    )


def test_a_project_that_uses_no_fixture_starts_no_database_and_imports_no_pandas(
    tmp_path: Path,
) -> None:
    """Without SYNCLANE_TEST_DSN a fixture would start the embedded PostgreSQL: a test that asks
    for none finds the plugin loaded, and neither pgserver nor pandas imported."""
    test = (
        "import sys\n"
        "def test_plain():\n"
        "    loaded = [m for m in sys.modules if m.split('.')[0] in ('pandas', 'pgserver')]\n"
        "    assert not loaded, loaded\n"
        "    assert 'synclane.testing_plugin' in sys.modules\n"
    )
    done = run_project(tmp_path, {"test_plain.py": test}, env={"SYNCLANE_TEST_DSN": None})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_a_project_s_own_fixtures_win_and_the_plugin_s_use_them(tmp_path: Path, dsn: str) -> None:
    """The user's `dsn` (here: the test database under an application_name of its own) is what
    the plugin's `db` and `schema` connect to; the user's `app` gets the plugin's `schema`."""
    conftest = (
        "import pytest\n"
        "from psycopg.conninfo import make_conninfo\n"
        "from synclane.testing import make_app\n"
        "@pytest.fixture(scope='session')\n"
        "def dsn():\n"
        "    import os\n"
        "    return make_conninfo(os.environ['PROJECT_DSN'], application_name='mine')\n"
        "@pytest.fixture\n"
        "def app(dsn, schema):\n"
        "    app = make_app(dsn, schema, worker_name='my-own-app')\n"
        "    yield app\n"
        "    app.close()\n"
    )
    test = (
        "def test_fixtures(app, db, schema):\n"
        "    assert db.execute('SHOW application_name').fetchone() == ('mine',)\n"
        "    assert app.worker_name == 'my-own-app' and app.schema == schema\n"
        "    assert app.dsn.endswith('application_name=mine')\n"
    )
    done = run_project(
        tmp_path,
        {"conftest.py": conftest, "test_fixtures.py": test},
        env={"PROJECT_DSN": dsn, "SYNCLANE_TEST_DSN": "postgresql://nobody@127.0.0.1:1/none"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_the_plugin_can_be_turned_off(tmp_path: Path) -> None:
    test = "def test_fixtures(dsn):\n    pass\n"
    done = run_project(tmp_path, {"test_off.py": test}, "-p", "no:synclane")
    assert done.returncode != 0 and "fixture 'dsn' not found" in done.stdout


# -- docs/testing.md, as written -------------------------------------------------------------

FILE_BLOCK = re.compile(r"```python file=(\S+)\n(.*?)```", re.S)


def test_the_testing_page_s_test_files_pass_in_a_project_of_their_own(
    tmp_path: Path, dsn: str
) -> None:
    """The page's files (a handler's unit tests, the project's queues, its conftest.py and an
    integration test) written into an empty folder: pytest runs and passes every test in it."""
    files = dict(FILE_BLOCK.findall((DOCS / "testing.md").read_text(encoding="utf-8")))
    assert {"test_orders_handler.py", "test_shop_sync.py", "conftest.py"} <= set(files)
    expected = sum(
        len(re.findall(r"^def test_", text, re.M))
        for name, text in files.items()
        if name.startswith("test_")
    )

    done = run_project(tmp_path, files, env={"SYNCLANE_TEST_DSN": dsn})

    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{expected} passed" in done.stdout, done.stdout
