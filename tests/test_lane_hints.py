"""The lanes' hints and wakes (docs/workers.md, "Where a look reads"): where a take looks when the
front of the line waits behind busy lanes. The hints are a cache that no writer has to keep:
whatever changes a job (a worker, the SQL of docs/operations.md, a user's own INSERT, UPDATE or
DELETE, an owner moved to another lane), a due job of a lane with room is taken within
poll_interval plus a second, at once where a wake or a notification says so.

Each test blocks the front of the line first: a lane "jam" holds the first 70 jobs in taking
order and runs a job under a lease of a worker that is not there, so the worker's take_front finds
nothing and every job below is found, or not, by a look lane by lane."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest
from psycopg import sql
from workers import job_row, operations_sql, running_worker, wait_for

from synclane import Job, Owner, Page, SyncLane
from synclane.worker.taker import take_by_lane

DAY = timedelta(days=1)
POLL = 1.0
# the promise: within poll_interval plus a second; one more second for a machine under load
BOUND = POLL + 1 + 1


def table(schema: str, name: str = "jobs") -> sql.Identifier:
    return sql.Identifier(schema, name)


def hint(db: psycopg.Connection[Any], schema: str, lane: str) -> str | None:
    """The lane's hint as PostgreSQL prints it ('infinity' for a parked lane)."""
    row = db.execute(
        sql.SQL("SELECT due_at::text FROM {} WHERE queue = 'q' AND lane = %s").format(
            table(schema, "lanes")
        ),
        [lane],
    ).fetchone()
    return None if row is None else row[0]


def look(app: SyncLane, dsn: str, lane_width: int = 1) -> Any:
    """One look lane by lane, as a worker's slot makes it."""

    async def once() -> Any:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return await take_by_lane(
                conn, app.store, "q", "looker", timedelta(minutes=5), lane_width=lane_width
            )

    return asyncio.run(once())


def run_as(db: psycopg.Connection[Any], schema: str, job_id: int) -> UUID:
    """Marks a job running under the lease of a worker that is not there; returns its token."""
    token = uuid4()
    db.execute(
        sql.SQL(
            "UPDATE {} SET status = 'running', leased_by = 'elsewhere', lease_token = %s,"
            " lease_expires_at = now() + interval '1 hour', lane_slot = 0, started_at = now(),"
            " attempt_count = attempt_count + 1 WHERE id = %s"
        ).format(table(schema)),
        [token, job_id],
    )
    return token


def block_the_front(db: psycopg.Connection[Any], schema: str) -> None:
    """70 jobs of lane jam, newest windows first in taking order, one of them running."""
    rows = db.execute(
        sql.SQL(
            "INSERT INTO {} (queue, owner, lane, type, mode, dedup_key, window_start, window_end)"
            " SELECT 'q', 'jam', 'jam', 'sync', 'manual', 'jam:' || n,"
            "  now() - (n + 1) * interval '1 hour', now() - n * interval '1 hour'"
            " FROM generate_series(1, 70) n ORDER BY n RETURNING id"
        ).format(table(schema))
    ).fetchall()
    run_as(db, schema, rows[0][0])


def status(db: psycopg.Connection[Any], schema: str, job_id: int) -> str:
    return str(job_row(db, schema, job_id)["status"])


def taken_within(db: psycopg.Connection[Any], schema: str, job_id: int, what: str) -> None:
    started = time.monotonic()
    wait_for(lambda: status(db, schema, job_id) in ("running", "completed"), BOUND, f"{what} taken")
    assert time.monotonic() - started <= BOUND


@pytest.fixture
def quick(dsn: str, schema: str) -> Iterator[SyncLane]:
    """An app whose idle slots look again every second; queue q runs plain one-page jobs, and
    a job of owner `slow` waits for `slow_go` (set at the end of each test)."""
    app = SyncLane(dsn, schema=schema, poll_interval=POLL)
    queue = app.queue("q", concurrency=2, retry_base_delay=60, retry_max_delay=60)
    slow_go = threading.Event()
    app.slow_go = slow_go  # type: ignore[attr-defined]

    @queue.snapshot("sync", every=DAY)
    def sync(job: Job) -> Page:
        if job.owner.startswith("slow"):
            slow_go.wait(30)
        return Page(None, 1)

    try:
        yield app
    finally:
        slow_go.set()
        app.close()


# -- a parked lane is found again, however its job stops -------------------------------------


STOPS = ["complete", "fail", "abandon", "cancel", "sql_cancel", "sql_delete", "sql_moved"]


@pytest.mark.parametrize("stop", STOPS)
def test_a_lane_parked_as_busy_is_found_again_however_its_job_stops(
    quick: SyncLane, dsn: str, db: psycopg.Connection[Any], schema: str, stop: str
) -> None:
    """A look parks acme while its first job runs; the first job then stops, through synclane's
    own statements or a user's SQL, and acme's next job is taken within the bound."""
    block_the_front(db, schema)
    first = quick.enqueue("q", "first", "sync", lane="acme")
    later = quick.enqueue("q", "later", "sync", lane="acme")
    token = run_as(db, schema, first)
    assert look(quick, dsn)[0] is None
    assert look(quick, dsn)[0] is None
    assert hint(db, schema, "acme") == "infinity", "the look parks the busy lane"
    guard = {"id": first, "token": token, "lease": timedelta(minutes=5)}
    jobs = table(schema)
    with running_worker(quick):
        time.sleep(POLL)  # the worker's slots are idle: the front waits behind jam, acme parked
        assert status(db, schema, later) == "pending"
        if stop == "complete":
            db.execute(quick.store.query("complete_job"), {**guard, "count": 1})
        elif stop == "fail":
            db.execute(
                quick.store.query("fail_job"),
                {**guard, "error": "E", "delay": timedelta(minutes=1), "max_attempts": 5},
            )
        elif stop == "abandon":
            db.execute(quick.store.query("abandon_job"), {**guard, "error": "Abandon: x"})
        elif stop == "cancel":
            quick.cancel("q", "first", "disconnected")
            db.execute(quick.store.query("release_cancelled"), guard)
        elif stop == "sql_cancel":
            db.execute(
                sql.SQL(
                    "UPDATE {} SET status = 'cancelled', lease_token = NULL, leased_by = NULL,"
                    " lease_expires_at = NULL WHERE id = %s"
                ).format(jobs),
                [first],
            )
        elif stop == "sql_delete":
            db.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(jobs), [first])
        else:  # the running job moved to another lane by hand
            db.execute(
                sql.SQL("UPDATE {} SET lane = 'elsewhere' WHERE id = %s").format(jobs), [first]
            )
        taken_within(db, schema, later, f"acme's next job after a {stop}")


# -- the fixes docs/operations.md prints --------------------------------------------------------


def test_a_job_fixed_with_the_documented_requeue_is_taken_at_once(
    quick: SyncLane, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """Issue 25, case 1: fix_requeue changes the job and nothing else; with the front of the
    line busy its lane's hint said "nothing open", and the job stayed pending beside idle slots."""
    block_the_front(db, schema)
    job_id = quick.enqueue("q", "acme", "sync", lane="acme")
    db.execute(
        sql.SQL(
            "UPDATE {} SET status = 'abandoned', error = 'RuntimeError: broken',"
            " completed_at = now() WHERE id = %s"
        ).format(table(schema)),
        [job_id],
    )
    with running_worker(quick):
        time.sleep(2 * POLL)  # looks read acme: nothing open there
        db.execute(operations_sql("fix_requeue", schema, **{"id = 42": f"id = {job_id}"}))
        taken_within(db, schema, job_id, "the requeued job")


def test_a_lane_unthrottled_with_the_documented_sql_is_taken_at_once(
    quick: SyncLane, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """Issue 25, case 1: after fix_unthrottle the hint still pointed at the old pause's end."""
    block_the_front(db, schema)
    job_id = quick.enqueue("q", "acme-us", "sync", lane="acme")
    db.execute(
        sql.SQL(
            "INSERT INTO {} (queue, lane, paused_until) VALUES ('q', 'acme', now() + interval"
            " '120 seconds') ON CONFLICT (queue, lane) DO UPDATE SET paused_until ="
            " excluded.paused_until"
        ).format(table(schema, "lanes"))
    )
    db.execute(
        sql.SQL("UPDATE {} SET next_run_at = now() + interval '120 seconds' WHERE id = %s").format(
            table(schema)
        ),
        [job_id],
    )
    with running_worker(quick):
        time.sleep(2 * POLL)
        assert status(db, schema, job_id) == "pending"
        db.execute(operations_sql("fix_unthrottle", schema, **{"'shops'": "'q'"}))
        taken_within(db, schema, job_id, "the unthrottled lane's job")


# -- plain SQL, as a user writes it -------------------------------------------------------------

WRITES = {
    "insert": "INSERT INTO {jobs} (queue, owner, lane, type, mode, dedup_key)"
    " VALUES ('q', 'mine', 'new-lane', 'sync', 'manual', 'by-hand') RETURNING id",
    "completed_back_to_pending": "UPDATE {jobs} SET status = 'pending', completed_at = NULL"
    " WHERE id = %(job)s RETURNING id",
    "moved_to_a_new_lane": "UPDATE {jobs} SET lane = 'new-lane' WHERE id = %(job)s RETURNING id",
    "due_sooner": "UPDATE {jobs} SET next_run_at = now() WHERE id = %(job)s RETURNING id",
}


@pytest.mark.parametrize("write", WRITES)
def test_a_job_written_with_plain_sql_is_taken_within_the_bound(
    quick: SyncLane, dsn: str, db: psycopg.Connection[Any], schema: str, write: str
) -> None:
    block_the_front(db, schema)
    job_id = quick.enqueue("q", "acme", "sync", lane="acme")
    arranged = {
        "completed_back_to_pending": "UPDATE {jobs} SET status = 'completed', completed_at ="
        " now() WHERE id = %(job)s",
        "moved_to_a_new_lane": "UPDATE {jobs} SET next_run_at = now() + interval '1 hour'"
        " WHERE id = %(job)s",
        "due_sooner": "UPDATE {jobs} SET next_run_at = now() + interval '1 hour'"
        " WHERE id = %(job)s",
    }
    if write in arranged:
        db.execute(sql.SQL(arranged[write]).format(jobs=table(schema)), {"job": job_id})
    with running_worker(quick):
        time.sleep(2 * POLL)  # looks read acme: nothing due there
        if write == "moved_to_a_new_lane":
            db.execute(
                sql.SQL("UPDATE {} SET next_run_at = now() WHERE id = %s").format(table(schema)),
                [job_id],
            )
        (written,) = db.execute(
            sql.SQL(WRITES[write]).format(jobs=table(schema)), {"job": job_id}
        ).fetchone()  # type: ignore[misc]
        taken_within(db, schema, written, f"a job after {write}")


# -- an owner moved while its job runs -----------------------------------------------------------


def test_an_owner_moved_while_its_job_runs_leaves_its_old_lane_found(
    quick: SyncLane, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """Issue 25, case 2: owners slow-a and b share lane L. While slow-a's job runs in L, the
    owner source moves slow-a to lane M and a plan runs: the move took the running job to M, so
    L has room, and b's job there must be taken."""
    lanes = {"slow-a": "L", "b": "L"}
    queue = quick.get_queue("q")
    queue.owners(lambda name: [Owner(owner, lane=lane) for owner, lane in lanes.items()])
    block_the_front(db, schema)
    quick.plan("q")
    jobs = {
        row[1]: row[0]
        for row in db.execute(
            sql.SQL("SELECT id, owner FROM {} WHERE owner IN ('slow-a', 'b')").format(table(schema))
        )
    }
    db.execute(
        sql.SQL("UPDATE {} SET next_run_at = now() + interval '1 hour' WHERE id = %s").format(
            table(schema)
        ),
        [jobs["b"]],
    )
    with running_worker(quick):
        wait_for(lambda: status(db, schema, jobs["slow-a"]) == "running", BOUND, "slow-a runs")
        db.execute(
            sql.SQL("UPDATE {} SET next_run_at = now() WHERE id = %s").format(table(schema)),
            [jobs["b"]],
        )
        time.sleep(2 * POLL)  # looks read L: busy, parked
        assert status(db, schema, jobs["b"]) == "pending"
        lanes["slow-a"] = "M"
        quick.plan("q")
        assert job_row(db, schema, jobs["slow-a"])["lane"] == "M"
        taken_within(db, schema, jobs["b"], "b's job in the lane slow-a left")


# -- a look that read before a change ----------------------------------------------------------


def test_a_job_that_arrives_after_a_look_read_its_lane_is_not_hidden_by_that_look(
    quick: SyncLane, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """A look decides from one snapshot and writes after it. A job that arrives in between is
    not in what it read: the look writes acme's hint as "nothing open", and the job's wake, which
    the look could not see, stays for the next look. (The look runs here in a transaction whose
    snapshot is older than the job, which is what a look that read before it sees.)"""
    block_the_front(db, schema)
    done = quick.enqueue("q", "acme", "sync", lane="acme")
    db.execute(
        sql.SQL("UPDATE {} SET status = 'completed', completed_at = now() WHERE id = %s").format(
            table(schema)
        ),
        [done],
    )
    old = psycopg.connect(dsn)
    try:
        old.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        old.execute("SELECT 1")  # the snapshot
        arrived = quick.enqueue("q", "acme-eu", "sync", lane="acme")
        params = {
            "queue": "q",
            "worker": "old-look",
            "lease": timedelta(minutes=5),
            "token": uuid4(),
            "lane_width": 1,
            "max_running": None,
            "visit": 256,
        }
        row = old.execute(quick.store.query("take_by_lane"), params).fetchone()
        assert row is not None and row[2] is None, "the old snapshot has nothing to take"
        old.commit()
    finally:
        old.close()
    job, _ = look(quick, dsn)
    assert job is not None and job.id == arrived


# -- held leases ---------------------------------------------------------------------------------


def test_a_held_lease_whose_worker_died_lets_go_of_its_lane_and_the_lane_is_found_again(
    quick: SyncLane, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """A cancelled job requeued while its page was in flight keeps its lane held by the old
    lease, and a look parks that lane. When the worker holding it dies, the lease expires and
    the reclaim lets go of it: the lane's job is taken."""
    block_the_front(db, schema)
    jobs = table(schema)
    requeued = quick.enqueue("q", "first", "sync", lane="acme")
    db.execute(
        sql.SQL(
            "UPDATE {} SET lease_token = %s, leased_by = 'dead', "
            "lease_expires_at = now() + interval '1 hour' WHERE id = %s"
        ).format(jobs),
        [uuid4(), requeued],
    )
    assert look(quick, dsn)[0] is None
    assert hint(db, schema, "acme") == "infinity"
    with running_worker(quick):
        time.sleep(POLL)
        assert status(db, schema, requeued) == "pending"
        db.execute(
            sql.SQL(
                "UPDATE {} SET lease_expires_at = now() - interval '1 second' WHERE id = %s"
            ).format(jobs),
            [requeued],
        )
        taken_within(db, schema, requeued, "the job whose held lease expired")
    assert job_row(db, schema, requeued)["leased_by"] != "dead"


# -- a caller's open transaction -----------------------------------------------------------------


@pytest.mark.parametrize("call", ["enqueue", "plan"])
def test_a_callers_open_transaction_never_makes_a_worker_wait(
    dsn: str, db: psycopg.Connection[Any], schema: str, call: str
) -> None:
    """Issue 25, case 3: a web request enqueues (or plans) on its own connection and commits 6 s
    later. The workers, with a 2 s lease, keep taking and completing jobs of that lane and of
    others meanwhile; no lease is handed out expired, no job is reclaimed from a live worker,
    and no page runs twice."""
    app = SyncLane(dsn, schema=schema, poll_interval=POLL)
    queue = app.queue("q", concurrency=4, lease_duration=2)
    pages: dict[int, int] = {}
    lock = threading.Lock()

    @queue.owners
    def owners(name: str) -> list[Owner]:
        return [Owner("web", lane="L")]

    @queue.snapshot("sync", every=DAY)
    def sync(job: Job) -> Page:
        with lock:
            pages[job.id] = pages.get(job.id, 0) + 1
        time.sleep(0.05)
        return Page(None, 1)

    try:
        for n in range(40):
            app.enqueue("q", f"o{n}", "sync", lane="L" if n % 4 == 0 else f"l{n % 10}")
        with psycopg.connect(dsn) as caller:
            if call == "enqueue":
                app.enqueue("q", "web", "sync", lane="L", conn=caller)
            else:
                app.plan("q", owner="web", conn=caller)
            worker = running_worker(app)
            worker.__enter__()
            try:  # stopped whatever happens: a worker left running would log into later tests
                started = time.monotonic()
                time.sleep(6)
                done_meanwhile = db.execute(
                    sql.SQL("SELECT count(*) FROM {} WHERE status = 'completed'").format(
                        table(schema)
                    )
                ).fetchone()[0]  # type: ignore[index]
                caller.commit()
                # The premise: the workers ran 6 s beside the open transaction, and the caller's
                # own statements never hung (on a loaded machine this count and the commit took
                # up to a second; anything that made them wait on the workers would show here).
                assert 6 <= time.monotonic() - started < 10
                wait_for(
                    lambda: (
                        db.execute(
                            sql.SQL("SELECT count(*) FROM {} WHERE status <> 'completed'").format(
                                table(schema)
                            )
                        ).fetchone()[0]  # type: ignore[index]
                        == 0
                    ),
                    20,
                    "every job completed",
                )
            finally:
                worker.__exit__(None, None, None)
        assert done_meanwhile >= 40, "the workers went on while the caller's transaction was open"
        reclaimed = db.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE attempt_count > 1").format(table(schema))
        ).fetchone()[0]  # type: ignore[index]
        assert reclaimed == 0
        assert [n for n in pages.values() if n > 1] == [], "no page ran twice"
    finally:
        app.close()


# -- wakes do not pile up --------------------------------------------------------------------------


def test_a_worker_turns_wakes_into_hints_when_no_look_reads_them(
    quick: SyncLane, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """With a free front of the line no look runs, and the enqueues' wakes would stay: every
    poll_interval a worker folds them into the lanes' hints."""
    for n in range(30):
        quick.enqueue("q", f"o{n}", "sync", lane=f"l{n}", dedup_key=f"k{n}")
    wakes = sql.SQL("SELECT count(*) FROM {}").format(table(schema, "lane_wakes"))
    assert db.execute(wakes).fetchone() == (30,)
    with running_worker(quick):
        wait_for(lambda: db.execute(wakes).fetchone() == (0,), 5 * POLL, "the wakes folded")
    listed = db.execute(
        sql.SQL("SELECT count(*) FROM {} WHERE lane LIKE 'l%%'").format(table(schema, "lanes"))
    ).fetchone()
    assert listed == (30,)


def test_a_lane_freed_by_a_completion_is_read_again_at_once_though_a_look_parked_it(
    dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """Completions (take_front) write no wake themselves: the worker that completed tells, for
    the lanes it freed that a look had parked. With poll_interval=30 no poll and no mending of
    parked lanes comes within the test: acme's next job must be taken at once."""
    app = SyncLane(dsn, schema=schema, poll_interval=30)
    queue = app.queue("q", concurrency=1)
    go = threading.Event()

    @queue.snapshot("sync", every=DAY)
    def sync(job: Job) -> Page:
        if job.owner == "slow-first":
            go.wait(30)
        return Page(None, 1)

    try:
        block_the_front(db, schema)
        first = app.enqueue("q", "slow-first", "sync", lane="acme")
        later = app.enqueue("q", "later", "sync", lane="acme")
        with running_worker(app):
            wait_for(lambda: status(db, schema, first) == "running", 10, "acme's first job")
            with running_worker(app):
                wait_for(lambda: hint(db, schema, "acme") == "infinity", 10, "a look parking acme")
                time.sleep(0.5)
                assert status(db, schema, later) == "pending"
                go.set()
                started = time.monotonic()
                wait_for(
                    lambda: status(db, schema, later) in ("running", "completed"),
                    5,
                    "acme's next job",
                )
                assert time.monotonic() - started < 1.5
    finally:
        go.set()
        app.close()


def test_the_documented_query_lists_a_hidden_job_and_nothing_else(
    quick: SyncLane, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """operations.md's hidden_jobs: with the front of the line blocked and a worker running,
    nothing is hidden; a lane whose hint is made wrong by hand (what no statement of synclane
    leaves) shows its due job."""
    block_the_front(db, schema)
    job_id = quick.enqueue("q", "acme", "sync", lane="acme")
    hidden = operations_sql("hidden_jobs", schema, **{"'shops'": "'q'"})
    assert db.execute(hidden).fetchall() == []  # its wake says it is due
    with running_worker(quick):
        taken_within(db, schema, job_id, "the enqueued job")
        time.sleep(2 * POLL)
        assert db.execute(hidden).fetchall() == []
    later = quick.enqueue("q", "acme", "sync", lane="acme")
    db.execute(sql.SQL("DELETE FROM {}").format(table(schema, "lane_wakes")))
    db.execute(
        sql.SQL(
            "INSERT INTO {} (queue, lane, due_at) VALUES ('q', 'acme', now() + interval '1 hour')"
            " ON CONFLICT (queue, lane) DO UPDATE SET due_at = excluded.due_at"
        ).format(table(schema, "lanes"))
    )
    assert [row[0] for row in db.execute(hidden)] == [later]


def test_a_short_poll_interval_runs_the_chores_at_most_once_a_second(
    dsn: str, db: psycopg.Connection[Any], schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mend and the reclaim are five round trips a round: a poll_interval of 0.05 s makes
    the slots ask twenty times a second, not the chores (CHORE_SPACING). They still run, and
    the wakes of new jobs are still folded into hints."""
    from synclane.worker import Worker

    rounds: list[float] = []
    mend = Worker._mend_lanes

    async def counted(self: Worker, queue: Any) -> int:
        rounds.append(time.monotonic())
        return await mend(self, queue)

    monkeypatch.setattr(Worker, "_mend_lanes", counted)
    app = SyncLane(dsn, schema=schema, poll_interval=0.05)
    app.queue("q", concurrency=1).snapshot("sync", every=DAY)(lambda job: Page(None, 1))
    for n in range(5):
        app.enqueue("q", f"o{n}", "sync", lane=f"l{n}", dedup_key=f"k{n}")
    with running_worker(app):
        time.sleep(3.2)
    spans = [later - earlier for earlier, later in itertools.pairwise(rounds)]
    assert 3 <= len(rounds) <= 5, rounds
    assert min(spans) >= 0.95, spans
    wakes = sql.SQL("SELECT count(*) FROM {}").format(table(schema, "lane_wakes"))
    assert db.execute(wakes).fetchone() == (0,)
