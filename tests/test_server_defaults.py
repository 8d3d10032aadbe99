"""Servers and roles whose defaults differ from PostgreSQL's: what synclane's connections do when
the server turns read-only under them, and when the database's or the role's default isolation
is stricter than the READ COMMITTED its statements were written for. Each is set for one role of
the test's own, so that other tests on the server are untouched.

A server that turns read-only: a failover where the DSN's host name still points at the old
primary, now a standby, or at a replica for a while (managed PostgreSQL's writer endpoints do
this until their DNS follows). Every write then fails with "cannot execute UPDATE in a read-only
transaction" on connections that are otherwise fine. Simulated by giving the worker's role
`default_transaction_read_only = on` and ending its sessions, so that the worker's pool
reconnects to a "standby"; later the setting is reset (the "primary" is back), and only new
sessions can write again, as only new connections reach the new primary after a failover.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pandas as pd
import psycopg
import pytest
from apps import ACCOUNTS, orders_and_products, products_queue
from psycopg import sql
from roles import dsn_as
from workers import job_row

from synclane import ConfigError, Page, ServerReadOnly, SyncLane
from synclane.dashboard.state import Reader
from synclane.metrics import TableGauges
from synclane.testing import make_app, running_worker, wait_for


def _alter_role(db: psycopg.Connection[Any], role: str, change: str) -> None:
    """`ALTER ROLE <role> <change>`, e.g. change="SET DateStyle = 'SQL, DMY'" (test constants)."""
    db.execute(sql.SQL("ALTER ROLE {} " + change).format(sql.Identifier(role)))


def _read_only(db: psycopg.Connection[Any], role: str, on: bool) -> None:
    setting = "default_transaction_read_only"
    _alter_role(db, role, f"SET {setting} = on" if on else f"RESET {setting}")


async def _worker_isolation(app: SyncLane) -> str:
    """The isolation of a statement on a connection of a worker's pool."""
    pool = app.database.worker_pool(1, wait=10)
    await pool.open()
    try:
        async with pool.connection() as conn:
            row = await (await conn.execute("SHOW transaction_isolation")).fetchone()
            return str(row[0])
    finally:
        await pool.close()


def _end_sessions(db: psycopg.Connection[Any], role: str) -> None:
    db.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role])


def test_a_worker_on_a_server_turned_read_only_waits_says_why_and_resumes(
    app: SyncLane,
    dsn: str,
    schema: str,
    db: psycopg.Connection[Any],
    roles: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    role = roles["worker"]
    worker_app = make_app(dsn_as(dsn, role), schema)
    products_queue(worker_app, "shops", concurrency=2)
    products_queue(app, "shops", concurrency=2)
    first = app.enqueue("shops", "acme", "products")
    try:
        with running_worker(worker_app):
            wait_for(lambda: job_row(db, schema, first)["status"] == "completed", 20, "a first job")
            _read_only(db, role, True)
            _end_sessions(db, role)
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="synclane"):
                later = [app.enqueue("shops", f"shop-{n}", "products") for n in range(3)]
                time.sleep(3)
                assert all(job_row(db, schema, j)["status"] == "pending" for j in later)
                _read_only(db, role, False)  # the primary is back; the open sessions stay read-only
                wait_for(
                    lambda: all(job_row(db, schema, j)["status"] == "completed" for j in later),
                    15,
                    "the jobs added while the server was read-only, once it can write",
                )
            said = [r for r in caplog.records if "read-only" in r.getMessage()]
            assert said, [r.getMessage() for r in caplog.records]
            assert not [r for r in caplog.records if r.exc_info], "a traceback for an outage"
    finally:
        _read_only(db, role, False)
        worker_app.close()
    for job_id in later:
        row = job_row(db, schema, job_id)
        assert (row["attempt_count"], row["error"]) == (1, None), row


def test_a_job_whose_server_turns_read_only_between_pages_loses_no_page(
    app: SyncLane, dsn: str, schema: str, db: psycopg.Connection[Any], roles: dict[str, str]
) -> None:
    """The page that ended while the server was read-only is saved once it can write, or run
    again from the cursor saved before it: the job ends with every page counted once."""
    role = roles["worker"]
    worker_app = make_app(dsn_as(dsn, role), schema)
    pages: list[str | None] = []

    def five_pages(job: Any) -> Page:
        pages.append(job.cursor)
        time.sleep(0.5)
        number = int(job.cursor or 0) + 1
        return Page(None if number == 5 else str(number), 1)

    products_queue(worker_app, "shops", handler=five_pages)
    products_queue(app, "shops")
    job_id = app.enqueue("shops", "acme", "products")
    try:
        with running_worker(worker_app):
            wait_for(lambda: len(pages) >= 2, 20, "the job's second page")
            _read_only(db, role, True)
            _end_sessions(db, role)
            time.sleep(2)
            _read_only(db, role, False)
            wait_for(lambda: job_row(db, schema, job_id)["status"] == "completed", 20, "the job")
    finally:
        _read_only(db, role, False)
        worker_app.close()
    row = job_row(db, schema, job_id)
    assert (row["processed_count"], row["error"]) == (5, None), row
    assert set(pages) == {None, "1", "2", "3", "4"}, pages


def test_an_operation_on_a_read_only_server_says_so_and_the_next_reaches_the_primary(
    app: SyncLane, dsn: str, schema: str, db: psycopg.Connection[Any], roles: dict[str, str]
) -> None:
    """The app's shared connection was kept after the refusal: once the primary was back,
    every later call still went to the read-only session."""
    role = roles["worker"]
    caller = make_app(dsn_as(dsn, role), schema)
    products_queue(caller, "shops")
    products_queue(app, "shops")
    try:
        caller.enqueue("shops", "acme", "products")  # the shared connection is open
        _read_only(db, role, True)
        _end_sessions(db, role)
        with pytest.raises(ServerReadOnly, match="the server is read-only"):
            caller.requeue("shops", owner="acme")
        _read_only(db, role, False)
        assert caller.enqueue("shops", "globex", "products") > 0
        assert caller.requeue("shops", owner="acme") == 0
    finally:
        _read_only(db, role, False)
        caller.close()


@pytest.mark.parametrize("level", ["repeatable read", "serializable"])
def test_synclane_s_sessions_run_read_committed_whatever_the_role_s_default(
    app: SyncLane,
    dsn: str,
    schema: str,
    db: psycopg.Connection[Any],
    roles: dict[str, str],
    level: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The take and the writes rely on READ COMMITTED's recheck of a row another worker just
    changed. Under a stricter default (ALTER DATABASE/ROLE … SET default_transaction_isolation)
    each such meeting failed with a serialization error instead: 400 jobs took 8.2 s instead of
    1.5, and the reclaimer logged "cannot reach the database (SerializationFailure …)"."""
    role = roles["worker"]
    _alter_role(db, role, f"SET default_transaction_isolation = '{level}'")
    worker_app = make_app(dsn_as(dsn, role), schema)
    try:
        with worker_app.connection() as conn:
            assert conn.execute("SHOW transaction_isolation").fetchone() == ("read committed",)
        products_queue(worker_app, "shops", concurrency=8)
        products_queue(app, "shops")
        jobs = [app.enqueue("shops", f"o{n}", "products", lane=f"l{n % 5}") for n in range(200)]
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="synclane"):
            report = worker_app.run_worker(until_idle=True, stop_after=60)
        assert report["completed"] == len(jobs)
        said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert not said, said
        assert asyncio.run(_worker_isolation(worker_app)) == "read committed"
    finally:
        worker_app.close()


# Columns measured from now(), which moves between the two reads.
NOW = ["age", "last_seen", "seen_ago", "since"]

STYLES = [
    "DateStyle = 'SQL, DMY'",
    "DateStyle = 'German, DMY'",
    "IntervalStyle = 'sql_standard'",
    "IntervalStyle = 'iso_8601'",
]


@pytest.mark.parametrize("style", [*STYLES, "client_encoding = 'LATIN1'"])
def test_every_read_gives_the_same_frame_whatever_the_role_s_date_and_interval_style(
    app: SyncLane,
    dsn: str,
    schema: str,
    db: psycopg.Connection[Any],
    roles: dict[str, str],
    style: str,
) -> None:
    """psycopg reads times and durations sent as text only in PostgreSQL's default styles: with
    `ALTER ROLE … SET DateStyle = 'SQL, DMY'` jobs() raised "can't parse timestamptz with
    DateStyle 'SQL, DMY'"."""
    role = roles["worker"]
    _alter_role(db, role, f"SET {style}")
    styled = make_app(dsn_as(dsn, role), schema)
    try:
        for each in (app, styled):
            orders_and_products(each, ACCOUNTS[:2])
        app.plan()
        failing = app.enqueue("shops", "broken", "products")
        db.execute(
            sql.SQL(
                "UPDATE {} SET status = 'abandoned', error = 'RuntimeError: no' WHERE id = %s"
            ).format(sql.Identifier(schema, "jobs")),
            [failing],
        )
        with running_worker(styled):
            # no job pending or running: a job that finished between the two reads of a pair
            # would tell them apart
            wait_for(
                lambda: not app.jobs().status.isin(["pending", "running"]).any(),
                30,
                "the jobs to finish",
            )
            reads = {
                "jobs": lambda a: a.jobs(),
                "progress": lambda a: a.progress("shops"),
                "failures": lambda a: a.failures(),
                "depth": lambda a: a.depth(),
                "lanes": lambda a: a.lanes(),
                "coverage": lambda a: a.coverage("shops"),
                "throughput": lambda a: a.throughput(),
                "workers": lambda a: a.workers(),
            }
            for name, read in reads.items():
                expected, got = (read(a).drop(columns=NOW, errors="ignore") for a in (app, styled))
                assert len(expected) > 0 or name in ("depth", "lanes"), name
                pd.testing.assert_frame_equal(got, expected, obj=f"{name}() under {style}")
            # the page's reads and the table's gauges, on connections of their own
            page = Reader(dsn_as(dsn, role), schema, lambda: ["shops"])
            try:
                assert page.state()["summary"], "the page read nothing"
            finally:
                page.close()
            gauges = TableGauges(styled.database, ["shops"], refresh=0)
            try:
                up = [f for f in gauges.collect() if f.name == "synclane_table_up"]
                assert up and up[0].samples[0].value == 1, "the gauges could not read the table"
            finally:
                gauges.close()
    finally:
        styled.close()


@pytest.mark.parametrize("style", STYLES)
def test_through_a_transaction_pooler_a_role_whose_styles_psycopg_cannot_read_is_refused(
    app: SyncLane,
    dsn: str,
    schema: str,
    db: psycopg.Connection[Any],
    roles: dict[str, str],
    style: str,
) -> None:
    """Through a pooler synclane sets nothing per session, so the role's styles stand: it says
    so at the first connection, with the ALTER ROLE that fixes it, instead of a planner that
    fails at every round."""
    role = roles["worker"]
    _alter_role(db, role, f"SET {style}")
    with pytest.raises(ConfigError) as raised:
        SyncLane(dsn_as(dsn, role), schema=schema, pooler="transaction")
    message = str(raised.value)
    setting = style.split(" = ")[0]
    assert f'ALTER ROLE "{role}" SET {setting}' in message, message
    assert "transaction pooler" in message, message
    _alter_role(db, role, f"RESET {setting}")
    SyncLane(dsn_as(dsn, role), schema=schema, pooler="transaction").close()


def test_through_a_transaction_pooler_a_stricter_isolation_is_said_once(
    app: SyncLane, dsn: str, schema: str, db: psycopg.Connection[Any], roles: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    role = roles["worker"]
    _alter_role(db, role, "SET default_transaction_isolation = serializable")
    with caplog.at_level(logging.WARNING, logger="synclane"):
        pooled = SyncLane(dsn_as(dsn, role), schema=schema, pooler="transaction")
        try:
            products_queue(pooled, "shops")
            pooled.enqueue("shops", "acme", "products")
        finally:
            pooled.close()
    said = [r.getMessage() for r in caplog.records if "isolation" in r.getMessage()]
    assert len(said) == 1 and "read committed" in said[0], said


REFUSED = ": the database refused the statement"
AGAIN = "the database takes the statement again"


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]


def _refused(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The statements (parts of the worker) said to be refused, in order."""
    return [line.split(REFUSED)[0] for line in _said(caplog) if REFUSED in line]


@pytest.mark.parametrize("table", ["jobs", "lane_wakes"])
def test_a_statement_the_server_refuses_is_not_logged_as_an_unreachable_database(
    app: SyncLane,
    dsn: str,
    schema: str,
    db: psycopg.Connection[Any],
    roles: dict[str, str],
    caplog: pytest.LogCaptureFixture,
    table: str,
) -> None:
    """A role's `lock_timeout`, and a user's transaction that holds a table (a migration of their
    own, a `LOCK TABLE`): every statement that reads it ends in "canceling statement due to lock
    timeout". The server answered; the worker logged "cannot reach the database
    (LockNotAvailable …)", which sends whoever reads it to the network, and with `lane_wakes`
    held (only the lanes' mend reads it) it would have said at every round of the chores that the
    database was away and back. It says once which statement the database refuses, and once that
    it takes it again; the job runs."""
    role = roles["worker"]
    _alter_role(db, role, "SET lock_timeout = '100ms'")
    worker_app = make_app(dsn_as(dsn, role), schema)
    products_queue(worker_app, "shops")
    products_queue(app, "shops")
    job_id = app.enqueue("shops", "acme", "products")
    try:
        with caplog.at_level(logging.INFO, logger="synclane"), psycopg.connect(dsn) as holder:
            holder.execute(
                sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                    sql.Identifier(schema, table)
                )
            )
            with running_worker(worker_app):
                wait_for(
                    lambda: _refused(caplog),
                    15,
                    "the worker to say that the database refused its statement",
                )
                time.sleep(3.5)  # three rounds of the chores at least (CHORE_SPACING)
                held = [r.getMessage() for r in caplog.records]
                holder.rollback()
                wait_for(
                    lambda: job_row(db, schema, job_id)["status"] == "completed",
                    15,
                    "the job, once the lock is gone",
                )
                wait_for(
                    lambda: all(f"{part}: {AGAIN}" in _said(caplog) for part in _refused(caplog)),
                    15,
                    "each refused statement to be said to go through again",
                )
    finally:
        worker_app.close()
    said = _said(caplog)
    assert not [line for line in said if "cannot reach" in line], said
    refused = [line for line in said if REFUSED in line]
    parts = _refused(caplog)
    assert parts and len(parts) == len(refused), said  # each statement said once
    if table == "lane_wakes":  # only the mend reads it: the takes go on
        assert parts == ["queue shops: mending the lanes' hints"], said
    assert all(
        "(LockNotAvailable: canceling statement due to lock timeout)" in line for line in refused
    )
    assert not [line for line in held if AGAIN in line], held
    assert not [r for r in caplog.records if r.exc_info], "a traceback for a refused statement"


def test_a_take_the_server_refuses_is_not_taken_for_a_lost_answer(
    app: SyncLane,
    dsn: str,
    schema: str,
    db: psycopg.Connection[Any],
    roles: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A take answered with an error (here a lock timeout) rolled back: nothing was taken. The
    taker treated it as an answer lost on the way and asked the table what its tokens had taken,
    through the same lock, for up to 9 s of backoff per slot, before the slot backed off."""
    from synclane.worker import taker

    asked: list[object] = []
    recover = taker.taken_by_tokens

    async def counted(*args: Any, **kwargs: Any) -> Any:
        asked.append(args)
        return await recover(*args, **kwargs)

    monkeypatch.setattr(taker, "taken_by_tokens", counted)
    role = roles["worker"]
    _alter_role(db, role, "SET lock_timeout = '100ms'")
    worker_app = make_app(dsn_as(dsn, role), schema)
    products_queue(worker_app, "shops", concurrency=2)
    products_queue(app, "shops")
    job_id = app.enqueue("shops", "acme", "products")
    try:
        with psycopg.connect(dsn) as holder:
            holder.execute(
                sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                    sql.Identifier(schema, "jobs")
                )
            )
            with running_worker(worker_app):
                time.sleep(2)
                holder.rollback()
                wait_for(
                    lambda: job_row(db, schema, job_id)["status"] == "completed",
                    15,
                    "the job, once the lock is gone",
                )
    finally:
        worker_app.close()
    assert asked == [], f"{len(asked)} recoveries for takes the server refused"


def test_a_planning_round_the_server_refuses_is_said_once_and_not_as_an_error(
    app: SyncLane,
    dsn: str,
    schema: str,
    db: psycopg.Connection[Any],
    roles: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The worker's planner logged `ERROR planning queue shops failed: LockNotAvailable …` at
    every round while a user's lock held the owners table (and "failed" with the connection's
    error at every round of a database outage): it is an outage like the slots', said once."""
    role = roles["worker"]
    _alter_role(db, role, "SET lock_timeout = '100ms'")
    worker_app = make_app(dsn_as(dsn, role), schema, plan_interval=0.5)
    orders_and_products(worker_app, ACCOUNTS[:2])
    orders_and_products(app, ACCOUNTS[:2])
    try:
        with caplog.at_level(logging.INFO, logger="synclane"), psycopg.connect(dsn) as holder:
            holder.execute(
                sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                    sql.Identifier(schema, "owners")
                )
            )
            with running_worker(worker_app):
                time.sleep(3)  # rounds every 0.5 s
                holder.rollback()
                wait_for(lambda: len(app.jobs()) > 0, 15, "a plan, once the lock is gone")
                wait_for(
                    lambda: any(AGAIN in line for line in _said(caplog)),
                    15,
                    "the planner to say that its statement goes through again",
                )
    finally:
        worker_app.close()
    said = _said(caplog)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], said
    assert _refused(caplog) == ["planning queue shops"], said
    assert "planning queue shops: the database takes the statement again" in said, said
