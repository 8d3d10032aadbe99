"""synclane through a transaction pooler (issue 26): PgBouncer 1.18 in transaction mode with
fewer server connections than clients (tests/pooler.py), and `pooler="transaction"`.

Through such a pooler one client's consecutive transactions run on different server connections:
a statement prepared on one is unknown on the next (or, worse, another statement of the same name
is), a session setting reaches whoever gets the connection next, a LISTEN hears nothing and a
session lock is held by nobody in particular. With `pooler="transaction"` synclane prepares
nothing, sets nothing per session and listens only on `listen_dsn`."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from pooler import pgbouncer
from psycopg import sql
from worker_proc import OVERLAPS, create_runs
from workers import count, running_worker, wait_for, worker_processes

from synclane import ConfigError, Job, Owner, Page, SyncLane

pytestmark = pytest.mark.processes


@pytest.fixture
def pooled(dsn: str) -> Iterator[str]:
    """A DSN through PgBouncer in transaction mode with two server connections."""
    with pgbouncer(dsn, server_connections=2) as through:
        yield through


def test_a_fleet_through_a_transaction_pooler_ends_as_it_does_on_a_direct_connection(
    dsn: str, schema: str, db: psycopg.Connection[Any], pooled: str
) -> None:
    """The issue's run: 24 owners × 4 jobs of 3 pages, two worker processes of 4 slots, through
    PgBouncer with fewer server connections than the workers' connections. Before: 21 jobs
    failed, 5 stayed running, slots crashed and restarted over a hundred times on prepared
    statements that did not exist or were another statement's."""
    settings = {
        "dsn": pooled,
        "runs_dsn": dsn,  # the test's own record of each page, beside the pooler
        "schema": schema,
        "pooler": "transaction",
        "concurrency": 4,
        "pages": 3,
        "page_sleep": 0.02,
        "poll": 0.2,
        "lease": 10,
    }
    SyncLane(pooled, schema=schema, pooler="transaction").close()  # migrated through the pooler
    create_runs(db, schema)
    app = SyncLane(pooled, schema=schema, pooler="transaction")
    app.queue("q").snapshot("sync", every=timedelta(days=1))(lambda job: Page(None))
    for owner in range(24):
        for _ in range(4):
            app.enqueue("q", f"owner-{owner}", "sync", lane=f"lane-{owner % 12}")
    app.close()
    with worker_processes(settings, 2):
        wait_for(
            lambda: (
                count(db, "SELECT count(*) FROM {jobs} WHERE status = 'completed'", schema) == 96
            ),
            120,
            "every job completed through the pooler",
        )
    statuses = db.execute(
        sql.SQL("SELECT status, count(*), sum(processed_count) FROM {} GROUP BY status").format(
            sql.Identifier(schema, "jobs")
        )
    ).fetchall()
    assert statuses == [("completed", 96, 288)]
    assert count(db, "SELECT count(*) FROM {jobs} WHERE attempt_count <> 1", schema) == 0
    assert count(db, OVERLAPS, schema) == 0, "two pages of one lane ran at once"


def test_planning_operations_and_reads_work_through_a_transaction_pooler(
    schema: str, pooled: str
) -> None:
    owners = [Owner("acme-us", lane="acme"), Owner("acme-eu", lane="acme"), Owner("globex")]
    app = SyncLane(pooled, schema=schema, pooler="transaction", poll_interval=0.2)
    try:
        queue = app.queue("shops", concurrency=2)
        queue.owners(lambda name: owners)
        calls: list[str] = []

        @queue.snapshot("products", every=timedelta(days=1))
        def products(job: Job) -> Page:
            calls.append(job.owner)
            if calls.count("globex") == 1 and job.owner == "globex":
                raise RuntimeError("the shop answered 500")
            return Page(None, 2)

        assert app.plan() == {"shops": 3}
        assert app.plan() == {"shops": 0}
        manual = app.enqueue("shops", "acme-us", "products", dedup_key="by-hand")
        app.pause("shops", "maintenance")
        assert app.run_worker(until_idle=True, idle_grace=0, stop_after=10) == {}
        app.resume("shops")
        report = app.run_worker(until_idle=True, idle_grace=0, stop_after=20)
        assert report.get("completed") == 3 and report.get("failed") == 1
        assert len(app.failures("shops")) == 1
        assert app.requeue("shops", owner="globex") == 1
        app.run_worker(until_idle=True, idle_grace=0, stop_after=20)
        jobs = app.jobs("shops")
        assert set(jobs["status"]) == {"completed"} and manual in set(jobs["id"])
        assert set(app.progress("shops")["owner"]) == {"acme-us", "acme-eu", "globex"}
        assert app.cancel("shops", "acme-eu", "disconnected") == 0
        assert "lane" in app.lanes("shops").columns
        assert set(app.depth()["queue"]) <= {"shops"}
        assert app.workers().empty  # the workers left the list
    finally:
        app.close()


def test_a_pooled_worker_with_a_listen_dsn_starts_a_job_at_once(
    dsn: str, schema: str, pooled: str
) -> None:
    """Notifications need a session: `listen_dsn`, a direct connection, carries them while the
    work goes through the pooler. poll_interval=30: only a notification can be this quick."""
    app = SyncLane(pooled, schema=schema, pooler="transaction", listen_dsn=dsn, poll_interval=30)
    try:
        app.queue("q").snapshot("sync", every=timedelta(days=1))(lambda job: Page(None))
        with running_worker(app):
            wait_for(lambda: not app.workers().empty, 10, "the worker listed")
            time.sleep(0.5)
            started = time.monotonic()
            job_id = app.enqueue("q", "acme", "sync")
            wait_for(
                lambda: app.jobs(ids=[job_id])["status"].iloc[0] == "completed",
                5,
                "the job",
            )
            assert time.monotonic() - started < 2
    finally:
        app.close()


def test_a_pooled_worker_without_a_listen_dsn_says_it_polls_and_polls(
    schema: str, pooled: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = SyncLane(pooled, schema=schema, pooler="transaction", poll_interval=0.5)
    try:
        app.queue("q").snapshot("sync", every=timedelta(days=1))(lambda job: Page(None))
        with caplog.at_level(logging.WARNING, logger="synclane"), running_worker(app):
            wait_for(lambda: not app.workers().empty, 10, "the worker listed")
            job_id = app.enqueue("q", "acme", "sync")
            wait_for(
                lambda: app.jobs(ids=[job_id])["status"].iloc[0] == "completed",
                3,
                "the job, at the next poll",
            )
            state = app.workers()["state"].iloc[0]
        said = [r.getMessage() for r in caplog.records if "no listen_dsn" in r.getMessage()]
        assert len(said) == 1 and "every poll_interval (0.5 s)" in said[0]
        assert state == "running"  # no session recorded: alive while it beats
    finally:
        app.close()


def test_the_command_line_works_through_a_transaction_pooler(run: Any, pooled: str) -> None:
    for words in (
        ("plan",),
        ("jobs",),
        ("progress",),
        ("failures",),
        ("pause", "--queue", "shops", "--reason", "maintenance"),
        ("resume", "--queue", "shops"),
        ("workers",),
    ):
        code, out, err = run("--pooler", "transaction", *words, dsn=pooled)
        assert code == 0, (words, out, err)
        assert "prepared statement" not in err


def test_a_pooler_synclane_does_not_know_is_refused_by_name(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match=r"pooler='session' is not a pooler .* 'transaction'"):
        SyncLane(dsn, schema=schema, pooler="session")
    monkeypatch.setenv("SYNCLANE_POOLER", "pgbouncer")
    with pytest.raises(ConfigError, match=r"SYNCLANE_POOLER='pgbouncer' is not a pooler"):
        SyncLane(dsn, schema=schema)
    monkeypatch.setenv("SYNCLANE_POOLER", "transaction")
    app = SyncLane(dsn, schema=schema)
    try:
        assert app.pooler == "transaction"
    finally:
        app.close()


def test_a_pooled_planning_round_removes_the_owners_its_source_no_longer_names(
    schema: str, pooled: str, db: psycopg.Connection[Any]
) -> None:
    """A worker's round reads the owner source across many transactions; through a pooler each
    may run on another server connection, so what it remembers between them cannot live in a
    session (a temporary table was created on one connection and written on the next)."""
    named = [Owner(f"shop-{n}") for n in range(7)]
    app = SyncLane(pooled, schema=schema, pooler="transaction")
    try:
        queue = app.queue("shops", owners_interval=0.001)
        queue.owners(lambda name: list(named))
        queue.snapshot("products", every=timedelta(days=1))(lambda job: Page(None))
        plan = app.worker(["shops"]).plan
        assert plan is not None
        assert plan("shops") == 7
        del named[2:5]
        time.sleep(0.01)
        assert plan("shops") == 0
        owners = db.execute(
            sql.SQL("SELECT owner FROM {} ORDER BY owner").format(sql.Identifier(schema, "owners"))
        ).fetchall()
        assert [o for (o,) in owners] == ["shop-0", "shop-1", "shop-5", "shop-6"]
    finally:
        app.close()


def test_the_page_reads_through_a_transaction_pooler_what_it_reads_directly(
    dsn: str, schema: str, pooled: str
) -> None:
    """The page's reads (the dashboard's Reader) through PgBouncer answer as a direct connection
    does: each read carries its own settings, since no session is the page's."""
    from synclane.dashboard.state import Reader

    app = SyncLane(dsn, schema=schema)
    try:
        queue = app.queue("shops")
        queue.owners(lambda name: [Owner("acme", lane="a"), Owner("globex", lane="b")])

        @queue.snapshot("products", every=timedelta(days=1))
        def products(job: Job) -> Page:
            if job.owner == "globex":
                raise RuntimeError("the shop answered 500")
            return Page(None, 3)

        app.plan()
        app.run_worker(until_idle=True, idle_grace=0, stop_after=20)
    finally:
        app.close()
    readers = [
        Reader(dsn, schema, lambda: ["shops"]),
        Reader(pooled, schema, lambda: ["shops"], pooled=True),
    ]
    try:
        answers = [
            (r.accounts(), r.lanes(), r.failures(), r.jobs(), r.summary()["queues"])
            for r in readers
        ]
    finally:
        for reader in readers:
            reader.close()
    direct, through = answers
    assert through == direct
    assert {row["owner"] for row in direct[3]["rows"]} == {"acme", "globex"}
