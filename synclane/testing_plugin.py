"""synclane's pytest plugin: a real PostgreSQL for the test session, a schema of its own for
every test. Installing synclane registers it (entry point `pytest11`, name `synclane`);
`pytest -p no:synclane` turns it off.

Fixtures (docs/testing.md):
- `dsn` (session): $SYNCLANE_TEST_DSN when set, else an embedded PostgreSQL (the pgserver wheel)
  in a temporary directory, started the first time a test asks for it;
- `schema`: a fresh schema name, `test_<12 hex digits>`, dropped with everything in it after
  the test;
- `app`: `synclane.testing.make_app(dsn, schema)`, closed after the test;
- `db`: a plain autocommit connection (time zone UTC) to read and arrange rows directly.

A fixture of yours with one of these names wins over the plugin's, for your tests and for the
plugin's fixtures that use it: pytest looks a name up from the test outwards (class, module,
conftest.py files, then plugins). So your own `app` fixture gets the plugin's `schema`, and your
own `dsn` fixture is the database of the plugin's `schema`, `app` and `db`.

Loading the plugin starts no database and imports no pandas: only a test that uses a fixture
starts one. (It imports `synclane`, and with it psycopg: about 0.2 s once per pytest run.)
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import psycopg

    from synclane.app import SyncLane


@pytest.fixture(scope="session")
def dsn() -> Iterator[str]:
    """The test database: $SYNCLANE_TEST_DSN, else an embedded PostgreSQL for this session."""
    configured = os.environ.get("SYNCLANE_TEST_DSN")
    if configured:
        yield configured
        return
    from synclane.embedded import embedded_dsn

    with tempfile.TemporaryDirectory(prefix="synclane-test-pg-") as directory:
        yield embedded_dsn(Path(directory))


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
