"""Commands that read (and those that fix rows that must exist) never create a schema or a
table: against a schema with no synclane table they say so in one line, exit 2, and name
`synclane migrate`. A mistyped `--schema` used to print "no jobs", exit 0 and leave two new
schemas behind (the table's and the demo's)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from synclane import cli

READS = [
    ["jobs"],
    ["progress"],
    ["failures"],
    ["workers"],
    ["dashboard", "--port", "0"],
    ["requeue", "--queue", "shops"],
    ["cancel", "--queue", "shops", "--owner", "globex", "--reason", "gone"],
    ["pause", "--queue", "shops", "--reason", "maintenance"],
    ["resume", "--queue", "shops"],
    ["prune", "--older-than-days", "30"],
]


@pytest.fixture
def missing(
    db: psycopg.Connection[Any], schema: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A schema name nothing created; the demo's data schema beside it is dropped after, should
    a command create it. The demo's app module is imported afresh by each command."""
    for name in ("SYNCLANE_APP", "SYNCLANE_DSN", "SYNCLANE_SCHEMA"):  # set by --dsn, --schema
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    sys.modules.pop("synclane.demo.app", None)
    yield schema
    sys.modules.pop("synclane.demo.app", None)
    db.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(f"{schema}_demo")))


def _schemas(db: psycopg.Connection[Any], name: str) -> list[str]:
    rows = db.execute(
        "SELECT nspname FROM pg_namespace WHERE nspname IN (%s, %s) ORDER BY 1",
        (name, f"{name}_demo"),
    ).fetchall()
    return [row[0] for row in rows]


@pytest.mark.parametrize("words", READS, ids=[words[0] for words in READS])
def test_a_command_that_reads_creates_no_schema_and_names_migrate(
    dsn: str,
    missing: str,
    db: psycopg.Connection[Any],
    words: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli.main(["--dsn", dsn, "--schema", missing, "--app", "synclane.demo.app:app", *words])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert f"schema {missing!r} has no synclane table" in lines[0]
    assert f"`synclane --schema {missing} migrate`" in lines[0]
    assert _schemas(db, missing) == []


def test_workers_without_an_app_creates_nothing_either(
    dsn: str, missing: str, db: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["--dsn", dsn, "--schema", missing, "workers"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"`synclane --schema {missing} migrate`" in err
    assert _schemas(db, missing) == []


def test_migrate_then_a_read_works(
    dsn: str, missing: str, db: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """What the line says to do works: after `migrate`, `jobs` reads an empty table."""
    base = ["--dsn", dsn, "--schema", missing, "--app", "synclane.demo.app:app"]
    assert cli.main([*base, "migrate"]) == 0
    sys.modules.pop("synclane.demo.app", None)
    assert cli.main([*base, "jobs"]) == 0
    assert "no jobs" in capsys.readouterr().out
    assert _schemas(db, missing) == [missing, f"{missing}_demo"]
