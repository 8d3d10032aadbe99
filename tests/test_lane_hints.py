"""The lanes' hints (lanes.due_at): where a take looks when the front of the line waits behind
busy lanes (issue 14). A look parks the busy lanes it reads; every way a job stops running
brings its lane's hint back, so no open job is ever left where no look finds it."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any
from uuid import uuid4

import psycopg
import pytest
from psycopg import sql
from workers import job_row, running_worker, wait_for

from synclane import Abandon, Job, Owner, Page, SyncLane, Throttled
from synclane.worker.taker import take_by_lane

DAY = timedelta(days=1)


def hint(db: psycopg.Connection[Any], schema: str, lane: str) -> Any:
    row = db.execute(
        sql.SQL("SELECT due_at FROM {} WHERE queue = 'q' AND lane = %s").format(
            sql.Identifier(schema, "lanes")
        ),
        [lane],
    ).fetchone()
    return None if row is None else row[0]


def look(app: SyncLane, dsn: str) -> Any:
    """One look lane by lane, as a second worker would make it."""

    async def once() -> Any:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return await take_by_lane(conn, app.store, "q", "looker", timedelta(minutes=5))

    return asyncio.run(once())


@pytest.mark.parametrize("outcome", ["complete", "fail", "throttle", "abandon", "stop"])
def test_a_job_that_stops_running_brings_back_the_hint_of_its_parked_lane(
    app: SyncLane, dsn: str, db: psycopg.Connection[Any], schema: str, outcome: str
) -> None:
    queue = app.queue("q", retry_base_delay=60, retry_max_delay=60)
    go = threading.Event()

    @queue.snapshot("sync", every=DAY)
    def sync(job: Job) -> Page:
        if job.owner != "first":
            return Page(None, 1)
        go.wait(20)
        if outcome == "fail":
            raise RuntimeError("the shop answered 500")
        if outcome == "throttle":
            raise Throttled(retry_after=60)
        if outcome == "abandon":
            raise Abandon("access revoked")
        return Page(None, 1)

    first = app.enqueue("q", "first", "sync", lane="acme")
    later = app.enqueue("q", "later", "sync", lane="acme")  # open, due in an hour
    db.execute(
        sql.SQL("UPDATE {} SET next_run_at = now() + interval '1 hour' WHERE id = %s").format(
            sql.Identifier(schema, "jobs")
        ),
        [later],
    )
    with running_worker(app) as worker:
        wait_for(lambda: job_row(db, schema, first)["status"] == "running", 10, "the page")
        assert look(app, dsn) == (None, False)  # acme is busy: the look parks it
        assert hint(db, schema, "acme") is None
        if outcome == "stop":
            worker.stop()
            wait_for(lambda: job_row(db, schema, first)["status"] == "pending", 10, "hand-back")
        go.set()
        wait_for(lambda: job_row(db, schema, first)["status"] != "running", 10, "the end")
    due = hint(db, schema, "acme")
    assert due is not None, "the lane's open jobs must be found again"
    stopped = job_row(db, schema, first)
    open_due = [job_row(db, schema, later)["next_run_at"]]
    if stopped["status"] in ("pending", "failed"):
        open_due.append(stopped["next_run_at"])
    assert due == min(open_due)


def test_a_look_moves_the_hint_of_a_lane_whose_jobs_are_not_due_yet(
    app: SyncLane, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    queue = app.queue("q")
    queue.snapshot("sync", every=DAY)(lambda job: Page(None))
    job_id = app.enqueue("q", "acme", "sync", lane="acme")
    db.execute(
        sql.SQL("UPDATE {} SET next_run_at = now() + interval '1 hour' WHERE id = %s").format(
            sql.Identifier(schema, "jobs")
        ),
        [job_id],
    )
    assert look(app, dsn) == (None, False)
    due = hint(db, schema, "acme")
    assert due is not None and due == job_row(db, schema, job_id)["next_run_at"]


def test_jobs_that_move_to_a_new_lane_are_found_there_by_a_look(
    app: SyncLane, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """An owner whose lane changes takes its open jobs along (an UPDATE, which the insert
    trigger does not see): the lane they join must say they are due, or a look lane by lane
    would never find them."""
    lanes = {"acme": "acme"}
    queue = app.queue("q")
    queue.owners(lambda name: [Owner(owner, lane=lane) for owner, lane in lanes.items()])
    queue.snapshot("sync", every=DAY)(lambda job: Page(None, 1))
    app.plan("q")
    assert hint(db, schema, "acme") is not None
    lanes["acme"] = "shared"
    app.plan("q")
    assert hint(db, schema, "shared") is not None, "the lane the job joined has no hint"
    job, _ = look(app, dsn)
    assert job is not None and (job.lane, job.owner) == ("shared", "acme")


def test_a_held_lease_whose_worker_died_lets_go_of_its_lane_and_brings_its_hint_back(
    app: SyncLane, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """A cancelled job requeued while its page was in flight keeps its lane held by the old
    lease, and a look parks that lane. When the worker holding it dies, the lease expires and
    no stop of a running job comes to un-park the lane: the lease reclaim lets go of it."""
    queue = app.queue("q")

    @queue.snapshot("sync", every=DAY)
    def sync(job: Job) -> Page:
        return Page(None, 1)

    jobs = sql.Identifier(schema, "jobs")
    requeued = app.enqueue("q", "first", "sync", lane="acme")
    db.execute(
        sql.SQL(
            "UPDATE {} SET lease_token = %s, leased_by = 'dead', "
            "lease_expires_at = now() + interval '1 hour' WHERE id = %s"
        ).format(jobs),
        [uuid4(), requeued],
    )
    assert look(app, dsn) == (None, False)  # the live lease holds acme: the look parks it
    assert hint(db, schema, "acme") is None
    db.execute(
        sql.SQL(
            "UPDATE {} SET lease_expires_at = now() - interval '1 second' WHERE id = %s"
        ).format(jobs),
        [requeued],
    )
    assert look(app, dsn) == (None, False), "parked: no look reads the lane any more"

    released = db.execute(app.store.query("release_expired_holds"), {"queue": "q"}).fetchall()

    assert released == [(requeued,)]
    assert job_row(db, schema, requeued)["lease_token"] is None
    assert hint(db, schema, "acme") is not None
    job, _ = look(app, dsn)
    assert job is not None and job.id == requeued, "a look finds the lane again and takes it"


def test_a_worker_lets_go_of_expired_held_leases_as_it_reclaims(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    queue = app.queue("q")

    @queue.snapshot("sync", every=DAY)
    def sync(job: Job) -> Page:
        return Page(None, 1)

    jobs, lanes = sql.Identifier(schema, "jobs"), sql.Identifier(schema, "lanes")
    later = app.enqueue("q", "first", "sync", lane="acme")
    db.execute(
        sql.SQL(
            "UPDATE {} SET lease_token = %s, leased_by = 'dead', next_run_at = now() + "
            "interval '1 hour', lease_expires_at = now() - interval '1 second' WHERE id = %s"
        ).format(jobs),
        [uuid4(), later],
    )
    db.execute(sql.SQL("UPDATE {} SET due_at = NULL").format(lanes))  # parked by a look

    app.run_worker(until_idle=True, idle_grace=0, stop_after=20)

    row = job_row(db, schema, later)
    assert row["lease_token"] is None and row["status"] == "pending"
    assert hint(db, schema, "acme") == row["next_run_at"]
