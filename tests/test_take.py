"""The take statement: completing a slot's last job and taking the next in one commit."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any
from uuid import uuid4

import psycopg
import pytest
from psycopg import errors, sql
from workers import job_row

from synclane import Page, SyncLane
from synclane.store import WORKER_SESSION, Store, Take

LEASE = timedelta(minutes=5)


def _insert(db: psycopg.Connection[Any], schema: str, lanes: list[str]) -> list[int]:
    """One pending job per entry, in taking order (ids ascending)."""
    rows = db.execute(
        sql.SQL(
            "INSERT INTO {} (queue, owner, lane, type, mode, dedup_key) "
            "SELECT 'shops', lane, lane, 'orders', 'manual', 'manual:' || n "
            "FROM unnest(%s::text[]) WITH ORDINALITY AS t(lane, n) ORDER BY n RETURNING id"
        ).format(sql.Identifier(schema, "jobs")),
        [lanes],
    ).fetchall()
    return [row[0] for row in rows]


async def _take(dsn: str, schema: str, done: dict[str, Any] | None = None) -> Take:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for setting in WORKER_SESSION:
            await conn.execute(setting)
        return await Store(schema).a_take(conn, "shops", "worker-1", LEASE, done)


def _done(took: Take) -> dict[str, Any]:
    assert took.job is not None
    return {"id": took.job.id, "token": took.job.lease_token, "count": 3}


def test_completing_takes_the_next_job_of_the_same_lane_in_the_same_commit(app, dsn, db, schema):
    first, second = _insert(db, schema, ["acme", "acme"])
    took = asyncio.run(_take(dsn, schema))
    assert took.job is not None and took.job.id == first and not took.completed

    following = asyncio.run(_take(dsn, schema, _done(took)))

    assert following.completed
    assert following.job is not None and following.job.id == second
    done, running = job_row(db, schema, first), job_row(db, schema, second)
    assert (done["status"], done["processed_count"], done["lease_token"]) == ("completed", 3, None)
    assert running["status"] == "running"
    # One statement: both rows carry the same transaction time.
    assert done["completed_at"] == running["started_at"]


def test_a_refused_completion_takes_nothing_and_writes_nothing(app, dsn, db, schema):
    first, second = _insert(db, schema, ["acme", "globex"])
    took = asyncio.run(_take(dsn, schema))
    assert took.job is not None and took.job.id == first
    stolen = {"id": first, "token": uuid4(), "count": 1}  # a lease this worker no longer holds

    following = asyncio.run(_take(dsn, schema, stolen))

    assert following == Take(False, None)
    assert job_row(db, schema, first)["status"] == "running"
    assert job_row(db, schema, second)["status"] == "pending"


def test_a_lost_race_for_a_lane_rolls_the_completion_back(app, dsn, db, schema):
    # The slot finishes its acme job; another slot takes globex's first job at the same time.
    mine, theirs, next_of_theirs = _insert(db, schema, ["acme", "globex", "globex"])
    took = asyncio.run(_take(dsn, schema))
    assert took.job is not None and took.job.id == mine
    rival = psycopg.connect(dsn)  # a transaction that holds globex's lane, not yet committed
    rival.execute(
        sql.SQL(
            "UPDATE {} SET status = 'running', lease_token = gen_random_uuid() WHERE id = %s"
        ).format(sql.Identifier(schema, "jobs")),
        [theirs],
    )
    outcome: dict[str, Any] = {}

    def finish() -> None:
        try:
            outcome["take"] = asyncio.run(_take(dsn, schema, _done(took)))
        except errors.UniqueViolation as error:
            outcome["error"] = error

    # The statement skips the locked row, picks globex's next job, and waits on the rival's
    # entry in the running-lane index until the rival commits.
    finishing = threading.Thread(target=finish)
    finishing.start()
    finishing.join(timeout=1)
    assert finishing.is_alive(), "the take should wait for the rival's lane entry"
    rival.commit()
    rival.close()
    finishing.join(timeout=30)

    assert isinstance(outcome.get("error"), errors.UniqueViolation)
    # Nothing was written: the job is still this slot's, and can be completed again.
    row = job_row(db, schema, mine)
    assert (row["status"], row["lease_token"]) == ("running", took.job.lease_token)
    assert job_row(db, schema, next_of_theirs)["status"] == "pending"
    again = asyncio.run(_take(dsn, schema, _done(took)))
    assert again.completed and job_row(db, schema, mine)["status"] == "completed"


@pytest.mark.parametrize("lanes", [1, 3])
def test_a_worker_takes_each_next_job_in_the_statement_that_completes_the_last(
    dsn: str, db: psycopg.Connection[Any], schema: str, lanes: int
) -> None:
    app = SyncLane(dsn, schema=schema, poll_interval=0.05, plan_interval=3600)
    queue = app.queue("shops", concurrency=1)

    @queue.snapshot("orders", every=3600)
    async def orders(job: Any) -> Page:
        return Page(None, 1)

    _insert(db, schema, [f"lane-{n % lanes}" for n in range(12)])
    try:
        assert app.run_worker(until_idle=True) == {"completed": 12}
    finally:
        app.close()
    rows = db.execute(
        sql.SQL("SELECT started_at, completed_at FROM {} ORDER BY started_at").format(
            sql.Identifier(schema, "jobs")
        )
    ).fetchall()
    # Each job started in the transaction that completed the one before it.
    assert all(rows[n][1] == rows[n + 1][0] for n in range(len(rows) - 1))
