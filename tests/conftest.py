"""The fixtures dsn, schema, app and db come from synclane's own pytest plugin
(synclane/testing_plugin.py), the one users get: a real PostgreSQL ($SYNCLANE_TEST_DSN, which CI
sets to the machine's PostgreSQL 15, else the embedded one) and a schema per test.

Installing synclane (`pip install -e '.[dev]'`) registers the plugin; where plugins are not
loaded automatically (PYTEST_DISABLE_PLUGIN_AUTOLOAD) it is loaded here.

The fixtures of this repository's own tests: `run` (the command line), `roles` (the roles of
docs/operations.md), `every_slice_planned` (a plan writes a whole history at once) and
`prefect_server` (a temporary Prefect server).
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from command_line import Run, run_in_process
from roles import documented_roles
from servers import remove_unless_running

from synclane import SyncLane, planning

# Where PYTHONDONTWRITEBYTECODE is set (this machine sets it), pytest rewrote and compiled every
# test module again in each xdist worker, about 3 s of CPU each: the test modules' bytecode is
# written to tests/__pycache__ (as a plain `pytest` does), and each worker after the first reads it.
sys.dont_write_bytecode = False

# The test files that take longest, longest first (seconds on the two-core machine, measured with
# `--durations=0 --junitxml`, 2026-12-03). `--dist loadfile` hands files to workers in the order
# collected; with the long ones first no worker starts a long file when the others are done.
LONGEST: dict[str, float] = {
    "test_prefect.py": 160,
    "test_prefect_server.py": 85,
    "test_prefect_pool.py": 70,
    "test_dagster.py": 65,
    "test_dashboard_browser.py": 55,
    "test_faults.py": 55,
    "test_embedded.py": 50,
    "test_flow_control.py": 45,
    "test_dashboard_attacks.py": 45,
    "test_lane_hints.py": 45,
    "test_lanes_property.py": 40,
    "test_promises.py": 40,
    "test_docs.py": 35,
    "test_bad_input.py": 30,
    "test_dashboard.py": 30,
    "test_pooler.py": 30,
    "test_cli.py": 25,
    "test_worker_processes.py": 25,
    "test_wakeup.py": 20,
}


def pytest_configure(config: pytest.Config) -> None:
    plugins = config.pluginmanager
    if not (plugins.has_plugin("synclane") or plugins.has_plugin("synclane.testing_plugin")):
        plugins.import_plugin("synclane.testing_plugin")
    # xdist would order files by their number of tests instead (its --loadscope-reorder)
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest test files first (LONGEST), each file's tests in their own order."""
    items.sort(key=lambda item: -LONGEST.get(item.path.name, 0))


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[str]:
    """One temporary Prefect server (SQLite) for every test of this process that runs a flow
    (tests/test_prefect.py and test_prefect_pool.py: with `--dist loadfile` on two workers, one
    each); its API URL."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        temporary_settings,
    )
    from prefect.testing.utilities import prefect_test_harness

    with (
        temporary_settings({PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: 120}),
        prefect_test_harness(server_startup_timeout=120),
    ):
        yield str(PREFECT_API_URL.value())


@pytest.fixture(scope="module", autouse=True)
def prefect_events_stopped() -> Iterator[None]:
    """After a module that sent Prefect events in this process: its events client stopped.
    Prefect keeps one per process, with a websocket to the session's server that pings every
    20 s from a thread of its own (and tries again and again once a server is gone); each ping
    draws from the `random` module, and Hypothesis, drawing in a later module of the same
    process, warned "Do not use the random module inside strategies" when one fell inside a
    draw. The next module to send events gets a new client."""
    yield
    worker = sys.modules.get("prefect.events.worker")
    if worker is not None:
        worker.EventsWorker.drain_all(timeout=10)


@pytest.fixture
def server_dir() -> Iterator[Path]:
    """A directory for an embedded PostgreSQL's data, outside pytest's temporary directories.
    Run as root, the wheel runs PostgreSQL as a user of its own and opens the folders above
    the data to it; every pytest session that starts (an xdist worker, a test's own inner run)
    closes /tmp/pytest-of-root again (mode 0700), and an initdb there then failed with
    "Permission denied"."""
    directory = Path(tempfile.mkdtemp(prefix="synclane-test-server-"))
    yield directory
    remove_unless_running(directory)


@pytest.fixture
def run(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Iterator[Run]:
    """`run("plan")`: the `synclane` command on the test database and cli_app:app, in this
    process (tests/command_line.py)."""
    yield from run_in_process(dsn, schema, monkeypatch, capsys)


@pytest.fixture
def roles(db: psycopg.Connection[Any], schema: str, app: SyncLane) -> Iterator[dict[str, str]]:
    """The worker and analyst roles of docs/operations.md on the test's schema (made by `app`),
    under names of this test's own (tests/roles.py). Yields their names."""
    with documented_roles(db, schema) as names:
        yield names


@pytest.fixture
def every_slice_planned(monkeypatch: pytest.MonkeyPatch) -> None:
    """In this process, a plan writes every history slice of an owner at once, as plans did
    before lazy history (schema 6): each owner keeps that many slices open
    (planning.ahead_for). For tests whose promise is about reading or arranging the slices of a
    history (progress(), coverage, failures, the charts), not about when they are planned."""
    monkeypatch.setattr(planning, "ahead_for", lambda lane_width: 100_000)
