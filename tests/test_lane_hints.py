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
from synclane.worker.taker import Finished, take_by_lane, take_front

DAY = timedelta(days=1)


def hint(db: psycopg.Connection[Any], schema: str, lane: str) -> Any:
    row = db.execute(
        sql.SQL("SELECT due_at FROM {} WHERE queue = 'q' AND lane = %s").format(
            sql.Identifier(schema, "lanes")
        ),
        [lane],
    ).fetchone()
    return None if row is None else row[0]


def look(app: SyncLane, dsn: str, lane_width: int = 1) -> Any:
    """One look lane by lane, as a second worker would make it."""

    async def once() -> Any:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return await take_by_lane(
                conn, app.store, "q", "looker", timedelta(minutes=5), lane_width=lane_width
            )

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


# -- a look racing the statements that change a lane ----------------------------------------------
#
# A look reads its lanes in one snapshot and then parks or moves them. A job of a lane that stops
# running, or arrives, between that snapshot and the look's write must not be hidden by it. To
# hold the look between the two, a third transaction locks the row of lane "a-busy", which the
# look parks before it reaches "b-lane" (lanes are written in their order).


def _run_as(db: psycopg.Connection[Any], schema: str, job_id: int, lane_slot: int = 0) -> Any:
    """Marks a job running under a lease of a worker that is not there; returns its token."""
    token = uuid4()
    db.execute(
        sql.SQL(
            "UPDATE {} SET status = 'running', leased_by = 'elsewhere', lease_token = %s,"
            " lease_expires_at = now() + interval '5 minutes', lane_slot = %s,"
            " started_at = now(), attempt_count = attempt_count + 1 WHERE id = %s"
        ).format(sql.Identifier(schema, "jobs")),
        [token, lane_slot, job_id],
    )
    return token


def _not_due_for_an_hour(db: psycopg.Connection[Any], schema: str, job_id: int) -> None:
    db.execute(
        sql.SQL("UPDATE {} SET next_run_at = now() + interval '1 hour' WHERE id = %s").format(
            sql.Identifier(schema, "jobs")
        ),
        [job_id],
    )


def _look_held_at_a_busy(app: SyncLane, dsn: str, db: psycopg.Connection[Any], schema: str) -> Any:
    """Starts a look that waits on lane a-busy's row, held by a transaction of its own; returns
    (let_go, the thread, its result list). let_go() ends the holding transaction."""
    holder = psycopg.connect(dsn)
    holder.execute(
        sql.SQL("SELECT FROM {} WHERE queue = 'q' AND lane = 'a-busy' FOR UPDATE").format(
            sql.Identifier(schema, "lanes")
        )
    )
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(look(app, dsn)))
    thread.start()
    wait_for(
        lambda: (
            db.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE '%%synclane: take_by_lane%%'"
            ).fetchone()[0]  # type: ignore[index]
            == 1
        ),
        10,
        "the look to wait on lane a-busy",
    )

    def let_go() -> None:
        holder.rollback()
        holder.close()
        thread.join(20)

    return let_go, result


def _complete_in_a_take(app: SyncLane, dsn: str, job_id: int, token: Any) -> None:
    """Completes the job in the statement that takes the next one, as a worker's slot does;
    under a queue cap of one, which the job of lane a-busy fills, it takes nothing."""

    async def once() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            batch = await take_front(
                conn,
                app.store,
                "q",
                "worker",
                timedelta(minutes=5),
                [Finished(job_id, token, 1)],
                plain=0,
                max_running=1,
            )
        assert batch.completed == {job_id} and batch.jobs == []

    asyncio.run(once())


@pytest.mark.parametrize("stop", ["complete", "fail", "take_front"])
def test_a_job_that_stops_while_a_look_reads_its_lane_as_busy_leaves_the_lane_found(
    app: SyncLane, dsn: str, db: psycopg.Connection[Any], schema: str, stop: str
) -> None:
    """The look read b-lane busy; its running job stopped before the look parked it: parking
    it then would hide its next job from every look (no stop is left to bring the hint back)."""
    app.queue("q").snapshot("sync", every=DAY)(lambda job: Page(None))
    _run_as(db, schema, app.enqueue("q", "k", "sync", lane="a-busy"))
    running = app.enqueue("q", "r", "sync", lane="b-lane")
    token = _run_as(db, schema, running)
    following = app.enqueue("q", "p", "sync", lane="b-lane")
    let_go, result = _look_held_at_a_busy(app, dsn, db, schema)
    try:
        if stop == "take_front":
            _complete_in_a_take(app, dsn, running, token)
        else:
            if stop == "complete":
                params: dict[str, Any] = {"count": 1}
            else:
                params = {"max_attempts": 5, "error": "RuntimeError: 500", "delay": timedelta(0)}
            params.update(id=running, token=token, lease=timedelta(minutes=5))
            db.execute(app.store.query(f"{stop}_job"), params)
    finally:
        let_go()
    assert result == [(None, False)]  # both lanes were busy in the look's snapshot
    assert hint(db, schema, "b-lane") is not None, "b-lane was parked after its job stopped"
    job, _ = look(app, dsn)
    assert job is not None and job.id in (following, running)


@pytest.mark.parametrize("arrival", ["enqueue", "requeue", "new lane"])
def test_a_job_that_becomes_due_while_a_look_moves_its_lane_keeps_the_lane_found(
    app: SyncLane, dsn: str, db: psycopg.Connection[Any], schema: str, arrival: str
) -> None:
    """The look read b-lane free with nothing due and moves its hint to its job due in an hour;
    a job due now that arrived before the look wrote must keep the lane where looks find it."""
    lanes = {"moving": "elsewhere"}
    queue = app.queue("q", max_attempts=1)
    queue.owners(lambda name: [Owner(owner, lane=lane) for owner, lane in lanes.items()])
    queue.snapshot("sync", every=DAY)(lambda job: Page(None))
    app.plan("q")
    moving = int(app.jobs(owner="moving")["id"].iloc[0])
    _run_as(db, schema, app.enqueue("q", "k", "sync", lane="a-busy"))
    _not_due_for_an_hour(db, schema, app.enqueue("q", "later", "sync", lane="b-lane"))
    failed = app.enqueue("q", "failed", "sync", lane="c-other")
    db.execute(
        sql.SQL("UPDATE {} SET status = 'abandoned', completed_at = now() WHERE id = %s").format(
            sql.Identifier(schema, "jobs")
        ),
        [failed],
    )
    db.execute(
        sql.SQL("UPDATE {} SET lane = 'b-lane' WHERE id = %s").format(
            sql.Identifier(schema, "jobs")
        ),
        [failed],
    )
    # b-lane's hint says "may be due": the look reads it, finds nothing due, and moves it; the
    # look does not read the owner's first lane (no hint: as if parked)
    db.execute(
        sql.SQL(
            "UPDATE {} SET due_at = CASE lane WHEN 'b-lane' THEN now() - interval '1 second' END"
            " WHERE lane IN ('b-lane', 'elsewhere')"
        ).format(sql.Identifier(schema, "lanes"))
    )
    let_go, result = _look_held_at_a_busy(app, dsn, db, schema)
    try:
        if arrival == "enqueue":
            arrived = app.enqueue("q", "p", "sync", lane="b-lane")
        elif arrival == "requeue":
            assert app.requeue("q", ids=[failed]) == 1
            arrived = failed
        else:
            lanes["moving"] = "b-lane"
            app.plan("q")
            arrived = moving
    finally:
        let_go()
    assert result == [(None, False)]
    due = hint(db, schema, "b-lane")
    assert due is not None and due <= job_row(db, schema, arrived)["next_run_at"], (
        "b-lane's hint moved past a job due now"
    )
    job, _ = look(app, dsn)
    assert job is not None and job.id == arrived


def test_a_retry_earlier_than_its_lanes_hint_moves_the_hint_back(
    app: SyncLane, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """A lane two jobs wide is not busy with one running: a look moves its hint to its next job
    due in an hour. The running job then fails and is retried in a minute: the hint must say so,
    or no look would find the retry before the hour."""
    app.queue("q", lane_width=2).snapshot("sync", every=DAY)(lambda job: Page(None))
    running = app.enqueue("q", "r", "sync", lane="wide")
    token = _run_as(db, schema, running)
    _not_due_for_an_hour(db, schema, app.enqueue("q", "later", "sync", lane="wide"))
    assert look(app, dsn, lane_width=2) == (None, False)
    assert hint(db, schema, "wide") > job_row(db, schema, running)["started_at"] + timedelta(
        minutes=59
    )
    db.execute(
        app.store.query("fail_job"),
        {
            "id": running,
            "token": token,
            "max_attempts": 5,
            "error": "RuntimeError: 500",
            "delay": timedelta(minutes=1),
            "lease": timedelta(minutes=5),
        },
    )
    assert hint(db, schema, "wide") == job_row(db, schema, running)["next_run_at"]
