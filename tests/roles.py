"""The PostgreSQL roles of docs/operations.md, as tests create and use them (roles belong to
the whole server, so each test gets names of its own). The `roles` fixture (tests/conftest.py)
yields the worker's and the analyst's."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from workers import operations_sql


@contextmanager
def documented_roles(db: psycopg.Connection[Any], schema: str) -> Iterator[dict[str, str]]:
    """The worker and analyst roles of docs/operations.md's grants for `schema`, under names of
    this test's own; dropped afterwards. Yields {"worker": name, "analyst": name}."""
    suffix = uuid.uuid4().hex[:8]
    names = {"worker": f"synclane_worker_{suffix}", "analyst": f"synclane_analyst_{suffix}"}
    grants = operations_sql(
        "grants",
        schema,
        synclane_worker=names["worker"],
        synclane_analyst=names["analyst"],
    )
    db.execute(grants)
    try:
        yield names
    finally:
        for name in names.values():
            drop_role(db, name)


def drop_role(db: psycopg.Connection[Any], role: str) -> None:
    db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
    db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def dsn_as(dsn: str, role: str, password: str = "change me") -> str:
    """`dsn` logging in as `role` (the password is the docs' placeholder: the test database
    trusts any)."""
    params = {k: v for k, v in conninfo_to_dict(dsn).items() if k not in ("user", "password")}
    return make_conninfo("", **params, user=role, password=password)
