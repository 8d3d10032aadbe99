"""The take statement: completing slots' last jobs and taking their next ones in one commit."""

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
from synclane.params import WORKER_ADAPTERS, Bigints, Uuids
from synclane.store import WORKER_SESSION, Store
from synclane.worker.taker import Batch as Taken
from synclane.worker.taker import Finished, take_front

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


async def _take(
    dsn: str, schema: str, done: list[dict[str, Any]] | None = None, plain: int | None = None
) -> Taken:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for setting in WORKER_SESSION:
            await conn.execute(setting)
        done = done or []
        wanted = (0 if done else 1) if plain is None else plain
        finished = [Finished(job["id"], job["token"], job["count"]) for job in done]
        return await take_front(conn, Store(schema), "shops", "worker-1", LEASE, finished, wanted)


def _done(took: Taken) -> list[dict[str, Any]]:
    return [{"id": job.id, "token": job.lease_token, "count": 3} for job in took.jobs]


def test_completing_takes_the_next_job_of_the_same_lane_in_the_same_commit(app, dsn, db, schema):
    first, second = _insert(db, schema, ["acme", "acme"])
    took = asyncio.run(_take(dsn, schema))
    assert [job.id for job in took.jobs] == [first] and not took.completed

    following = asyncio.run(_take(dsn, schema, _done(took)))

    assert following.completed == {first}
    assert [job.id for job in following.jobs] == [second]
    done, running = job_row(db, schema, first), job_row(db, schema, second)
    assert (done["status"], done["processed_count"], done["lease_token"]) == ("completed", 3, None)
    assert running["status"] == "running"
    # One statement: both rows carry the same transaction time.
    assert done["completed_at"] == running["started_at"]


def test_a_refused_completion_takes_nothing_and_writes_nothing(app, dsn, db, schema):
    first, second = _insert(db, schema, ["acme", "globex"])
    took = asyncio.run(_take(dsn, schema))
    assert [job.id for job in took.jobs] == [first]
    stolen = {"id": first, "token": uuid4(), "count": 1}  # a lease this worker no longer holds

    following = asyncio.run(_take(dsn, schema, [stolen]))

    assert following == Taken(frozenset(), [])
    assert job_row(db, schema, first)["status"] == "running"
    assert job_row(db, schema, second)["status"] == "pending"


def test_a_lost_race_for_a_lane_rolls_the_completion_back(app, dsn, db, schema):
    # The slot finishes its acme job while another worker takes a globex job: not the one this
    # statement sees at the head of globex (that one would be skipped as locked), but another of
    # that lane, as a look lane by lane may.
    mine, head_of_globex, other_of_globex = _insert(db, schema, ["acme", "globex", "globex"])
    took = asyncio.run(_take(dsn, schema))
    assert [job.id for job in took.jobs] == [mine]
    rival = psycopg.connect(dsn)  # a transaction that holds globex's lane, not yet committed
    rival.execute(
        sql.SQL(
            "UPDATE {} SET status = 'running', lease_token = gen_random_uuid() WHERE id = %s"
        ).format(sql.Identifier(schema, "jobs")),
        [other_of_globex],
    )
    outcome: dict[str, Any] = {}

    def finish() -> None:
        try:
            outcome["take"] = asyncio.run(_take(dsn, schema, _done(took)))
        except errors.UniqueViolation as error:
            outcome["error"] = error

    # The statement takes globex's head and waits on the rival's entry in the running-lane
    # index until the rival commits.
    finishing = threading.Thread(target=finish)
    finishing.start()
    finishing.join(timeout=1)
    waited = finishing.is_alive()
    rival.commit()
    rival.close()
    finishing.join(timeout=30)
    assert waited, f"the take should have waited for the rival's lane entry: {outcome}"

    assert isinstance(outcome.get("error"), errors.UniqueViolation)
    # Nothing was written: the job is still this slot's, and can be completed again.
    row = job_row(db, schema, mine)
    assert (row["status"], row["lease_token"]) == ("running", took.jobs[0].lease_token)
    assert job_row(db, schema, head_of_globex)["status"] == "pending"
    again = asyncio.run(_take(dsn, schema, _done(took)))
    assert again.completed == {mine} and job_row(db, schema, mine)["status"] == "completed"


def test_one_statement_serves_several_slots_in_distinct_lanes_best_first(app, dsn, db, schema):
    # Taking order is by id here: acme, acme, globex, initech, umbrella, initech.
    ids = _insert(db, schema, ["acme", "acme", "globex", "initech", "umbrella", "initech"])
    first = asyncio.run(_take(dsn, schema, plain=2))
    assert [job.id for job in first.jobs] == [ids[0], ids[2]]  # acme's second waits for acme

    # Two slots finish, one more asks with nothing to finish: three jobs, one commit.
    second = asyncio.run(_take(dsn, schema, _done(first), plain=1))

    assert second.completed == {ids[0], ids[2]}
    assert [job.id for job in second.jobs] == [ids[1], ids[3], ids[4]]
    assert len({job.lane for job in second.jobs}) == 3
    started = {job_row(db, schema, job.id)["started_at"] for job in second.jobs}
    assert started == {job_row(db, schema, ids[0])["completed_at"]}
    # each lease its own token, as the table says: the statement's jobs share none
    tokens = [job_row(db, schema, job.id)["lease_token"] for job in second.jobs]
    assert tokens == [job.lease_token for job in second.jobs] and len(set(tokens)) == 3


def test_a_statement_takes_no_more_than_the_slots_that_asked(app, dsn, db, schema):
    ids = _insert(db, schema, ["acme", "globex", "initech"])
    took = asyncio.run(_take(dsn, schema, plain=2))
    refused = [{"id": took.jobs[0].id, "token": uuid4(), "count": 1}]

    # One refused completion and one slot with nothing to finish: one job, not two.
    following = asyncio.run(_take(dsn, schema, refused, plain=1))

    assert following.completed == frozenset()
    assert [job.id for job in following.jobs] == [ids[2]]


@pytest.mark.parametrize("lanes", [1, 3])
def test_a_slot_takes_each_next_job_in_the_statement_that_completes_the_last(
    app: SyncLane, db: psycopg.Connection[Any], schema: str, lanes: int
) -> None:
    queue = app.queue("shops", concurrency=1)

    @queue.snapshot("orders", every=3600)
    async def orders(job: Any) -> Page:
        return Page(None, 1)

    _insert(db, schema, [f"lane-{n % lanes}" for n in range(12)])
    assert app.run_worker(until_idle=True) == {"completed": 12}
    rows = db.execute(
        sql.SQL("SELECT started_at, completed_at FROM {} ORDER BY started_at").format(
            sql.Identifier(schema, "jobs")
        )
    ).fetchall()
    # Each job started in the transaction that completed the one before it.
    assert all(rows[n][1] == rows[n + 1][0] for n in range(len(rows) - 1))


def test_slots_that_finish_together_share_one_statement(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    queue = app.queue("shops", concurrency=4)
    running: set[str] = set()
    overlaps: list[str] = []

    @queue.snapshot("orders", every=3600)
    async def orders(job: Any) -> Page:
        if job.lane in running:
            overlaps.append(job.lane)
        running.add(job.lane)
        await asyncio.sleep(0.01)
        running.discard(job.lane)
        return Page(None, 1)

    _insert(db, schema, [f"lane-{n % 6}" for n in range(48)])
    assert app.run_worker(until_idle=True) == {"completed": 48}
    assert overlaps == []
    rows = db.execute(
        sql.SQL("SELECT started_at, count(*) FROM {} GROUP BY started_at").format(
            sql.Identifier(schema, "jobs")
        )
    ).fetchall()
    # Four slots started together and finish together: their jobs share transactions.
    assert max(count for _, count in rows) > 1
    assert len(rows) < 48


def _scans(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan, its subplans included."""
    return [plan, *(node for child in plan.get("Plans", []) for node in _scans(child))]


def _generic_plan(dsn: str, schema: str, statement: str, params: dict[str, Any]) -> Any:
    """The plan a worker's connection runs `statement` with: prepared, generic."""
    query, names = Store(schema).positional(statement)
    assert isinstance(query, bytes)  # the bytes sent (a test's schema name is ASCII)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for setting in WORKER_SESSION:
            conn.execute(setting)
        conn.execute(sql.SQL("PREPARE probe AS ") + sql.SQL(query.decode()))
        arguments = sql.SQL(", ").join(sql.Literal(params[name]) for name in names)
        explain = sql.SQL("EXPLAIN (FORMAT JSON) EXECUTE probe({})").format(arguments)
        (plan,) = conn.execute(explain).fetchone()  # type: ignore[misc]
    return plan[0]["Plan"]


def _many_lanes(db: psycopg.Connection[Any], schema: str) -> None:
    _insert(db, schema, [f"lane-{n % 2000}" for n in range(4000)])
    # what a worker does every poll_interval: the new lanes' wakes become their rows in lanes
    db.execute(
        Store(schema).query("mend_lanes"), {"queue": "shops", "lane_width": 1, "limit": 5000}
    )
    db.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(schema, "jobs")))
    db.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(schema, "lanes")))


def _by_lane(plan: dict[str, Any], aliases: set[str]) -> None:
    checks = [node for node in _scans(plan) if node.get("Alias") in aliases]
    assert {node["Alias"] for node in checks} == aliases, "the plan makes every check"
    for node in checks:
        assert "lane" in node.get("Index Cond", ""), (
            f"{node['Node Type']} on {node.get('Alias')} reads every lane of the queue: {node}"
        )


def test_the_generic_plan_of_the_take_looks_up_each_lane_by_key(app, dsn, db, schema):
    """A worker runs take_front on a generic plan. Its checks of a lane's pause and of leases
    still held in the lane once were anti-joins over every lane of the queue (30 ms a take at
    100,000 lanes): each must be a lookup of the one lane, whatever the table holds."""
    _many_lanes(db, schema)
    params = {
        "queue": "shops",
        "worker": "worker-1",
        "lease": LEASE,
        "front": 64,
        "plain": 4,
        "done_ids": [],
        "done_tokens": [],
        "done_counts": [],
        "token": uuid4(),
        "lane_width": 1,
        "max_running": None,
    }
    _by_lane(_generic_plan(dsn, schema, "take_front", params), {"p", "h"})


def test_the_generic_plan_of_a_look_lane_by_lane_reads_each_lane_by_key(app, dsn, db, schema):
    """The same for take_by_lane: each lane it visits is looked up (its running jobs, held
    leases, best due job, deferred job, other open jobs), never a read of the queue's jobs."""
    _many_lanes(db, schema)
    params = {
        "queue": "shops",
        "worker": "worker-1",
        "lease": LEASE,
        "token": uuid4(),
        "lane_width": 1,
        "max_running": None,
        "visit": 256,
    }
    _by_lane(_generic_plan(dsn, schema, "take_by_lane", params), {"h", "j", "d", "o"})


def test_worker_arrays_keep_one_type_whatever_they_hold(dsn):
    # The take statement is prepared once per combination of parameter types: ids, tokens and
    # counts go as bigint[] and uuid[] whether they are empty, small or large, and arrive whole.
    tokens = [uuid4(), uuid4()]
    query = "SELECT $1::bigint[], $2::uuid[], cardinality($1)"
    sent = [
        (Bigints([]), Uuids([])),
        (Bigints([1, 2]), Uuids(tokens)),
        (Bigints([40_000, 2**40, -(2**63)]), Uuids(tokens[:1])),
    ]
    with psycopg.connect(dsn, autocommit=True, context=WORKER_ADAPTERS) as conn:
        cur = psycopg.RawCursor(conn)
        rows = [cur.execute(query, values, prepare=True).fetchone() for values in sent]
        prepared = cur.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
    assert rows == [
        ([], [], 0),
        ([1, 2], tokens, 2),
        ([40_000, 2**40, -(2**63)], tokens[:1], 3),
    ]
    assert prepared == (1,)  # psycopg's own lists made three: smallint[], bigint[], unknown
