"""A real PostgreSQL for every test, and a schema of its own that is dropped afterwards.

Where the database comes from, first match wins:
1. SYNCLANE_TEST_DSN (CI sets it to the machine's PostgreSQL 15);
2. a testcontainers PostgreSQL, when a Docker engine answers;
3. the embedded PostgreSQL from the pgserver wheel, in a temporary directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from synclane import SyncLane


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        done = subprocess.run(["docker", "info"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@pytest.fixture(scope="session")
def dsn() -> Iterator[str]:
    configured = os.environ.get("SYNCLANE_TEST_DSN")
    if configured:
        yield configured
        return
    if _docker_answers():
        try:
            from testcontainers.postgres import PostgresContainer
        except ImportError:
            pass
        else:
            with PostgresContainer("postgres:15", driver=None) as container:
                yield container.get_connection_url()
            return
    from synclane.embedded import embedded_dsn

    with tempfile.TemporaryDirectory(prefix="synclane-test-pg-") as directory:
        yield embedded_dsn(Path(directory))


@pytest.fixture
def schema(dsn: str) -> Iterator[str]:
    name = f"test_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def app(dsn: str, schema: str) -> Iterator[SyncLane]:
    lane = SyncLane(dsn, schema=schema, poll_interval=0.05, plan_interval=3600)
    yield lane
    lane.close()


@pytest.fixture
def db(dsn: str) -> Iterator[psycopg.Connection]:
    """A plain connection for reading and arranging rows directly."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        yield conn
