"""Lazy history against a real PostgreSQL (docs/planning.md, "History: initial slices"): a first
plan writes an owner's newest `ahead` history slices and a histories row, and the database plans
each next older slice as one finishes, whoever finishes it (a worker, a hand UPDATE), with the
boundaries and keys the planner computes; a cancelled owner gets nothing new; the database waits
for no one to do it; progress() reads a lazy history as one whose every slice is a row; a
version-5 table that holds every slice keeps working after the upgrade."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.rows import dict_row
from worker_proc import HISTORY, OVERLAPS, build, create_runs
from workers import count, database_now, wait_until_away_from_a_period_edge, worker_processes

from synclane import Owner, SyncLane
from synclane.model import WindowedType
from synclane.planning import Existing, ahead_for, iso, midnight, missing
from synclane.store import render
from synclane.testing import wait_for

DAY = timedelta(days=1)
SLICES = 25  # HISTORY: 730 days in 30-day slices, the oldest 10 days long
OPEN = "status IN ('pending', 'running', 'failed')"
SLICE = "type = 'orders' AND mode = 'initial'"  # a history slice (not the snapshot type's job)
SCHEMA_V5 = Path(__file__).parent / "schema_v5.sql"  # synclane/sql/schema.sql at version 5


def select(db: psycopg.Connection[Any], query: str, schema: str, *params: Any) -> list[dict]:
    """Run a query whose {jobs}, {histories} and {runs} name the schema's tables."""
    statement = sql.SQL(query).format(
        jobs=sql.Identifier(schema, "jobs"),
        histories=sql.Identifier(schema, "histories"),
        runs=sql.Identifier(schema, "runs"),
        lanes=sql.Identifier(schema, "lanes"),
    )
    with db.cursor(row_factory=dict_row) as cur:
        return cur.execute(statement, params).fetchall()


def change(db: psycopg.Connection[Any], query: str, schema: str, *params: Any) -> int:
    statement = sql.SQL(query).format(
        jobs=sql.Identifier(schema, "jobs"), histories=sql.Identifier(schema, "histories")
    )
    return db.execute(statement, params).rowcount


def history(db: psycopg.Connection[Any], schema: str, owner: str) -> list[dict]:
    """An owner's history slices, newest first."""
    return select(
        db,
        "SELECT * FROM {jobs} WHERE owner = %s AND mode = 'initial' AND type = 'orders'"
        " ORDER BY window_start DESC",
        schema,
        owner,
    )


def planner(dsn: str, schema: str, owners: list[Owner], **extra: Any) -> tuple[SyncLane, dict]:
    """The app of the worker processes (tests/worker_proc.py, with the windowed type orders),
    with an owner source, to plan from the test."""
    settings = {"dsn": dsn, "schema": schema, "orders": True, **extra}
    app = build(settings)
    app.queues["q"].owners(lambda queue: owners)
    return app, settings


def check_whole_history(rows: list[dict], first_midnight: datetime) -> None:
    """25 slices edge to edge, newest first, from the first midnight back two years."""
    assert len(rows) == SLICES
    assert rows[0]["window_end"] == first_midnight
    for newer, older in itertools.pairwise(rows):
        assert older["window_end"] == newer["window_start"], "a gap or an overlap"
    assert [r["window_end"] - r["window_start"] for r in rows] == [30 * DAY] * 24 + [10 * DAY]
    assert rows[-1]["window_start"] == first_midnight - HISTORY["horizon"]
    assert [r["dedup_key"] for r in rows] == [f"initial:{iso(r['window_start'])}" for r in rows]


# -- the key --------------------------------------------------------------------------------------


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.datetimes(
            datetime(1970, 1, 2),
            datetime(2200, 1, 1),
            timezones=st.sampled_from(
                [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(-timedelta(hours=8))]
            ),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_the_database_writes_a_slice_s_dedup_key_as_the_planner_does(
    app: SyncLane, db: psycopg.Connection[Any], schema: str, instants: list[datetime]
) -> None:
    """plan_older_slices keys the slices it plans with initial_key; planning.iso writes the
    planner's: they must agree to the character, or the dedup index would let a planner and the
    database add the same slice twice. Microseconds appear only when there are some."""
    db.execute("SET TIME ZONE 'Asia/Tokyo'")  # the session's zone must not matter
    keys = select(
        db,
        "SELECT " + sql.Identifier(schema).as_string(db) + ".initial_key(t) AS key"
        " FROM unnest(%s::timestamptz[]) WITH ORDINALITY AS u (t, n) ORDER BY n",
        schema,
        instants,
    )
    assert [row["key"] for row in keys] == [f"initial:{iso(instant)}" for instant in instants]


# -- the database tops history up -----------------------------------------------------------------


def test_a_first_plan_writes_the_newest_slices_and_the_history_row(
    dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    app, _ = planner(dsn, schema, [Owner("acme")], lane_width=3)
    try:
        before = database_now(db)
        assert app.plan() == {"q": 4 + 1 + 1}  # lane_width + 1 slices, a refresh, a snapshot
    finally:
        app.close()
    today = midnight(before)
    rows = history(db, schema, "acme")
    assert [(r["window_start"], r["window_end"]) for r in rows] == [
        (today - (n + 1) * 30 * DAY, today - n * 30 * DAY) for n in range(4)
    ]
    (row,) = select(db, "SELECT * FROM {histories}", schema)
    assert row == {
        "queue": "q",
        "owner": "acme",
        "type": "orders",
        "history_from": today - HISTORY["horizon"],
        "slice": HISTORY["slice"],
        "ahead": ahead_for(3),
    }


def test_a_hand_update_completing_a_slice_plans_the_next_older_one(
    dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """The row is the truth: a user's own UPDATE tops history up like a worker's completion, in
    the owner's lane (the owners table's), with the slice's priority, waiting for the lane's
    throttle pause; a slice that fails (still open) plans nothing, one that is deferred or
    abandoned (stepped aside) does."""
    app, _ = planner(dsn, schema, [Owner("acme-us", lane="acme")])
    try:
        app.plan()
    finally:
        app.close()
    newest, older = history(db, schema, "acme-us")
    paused = database_now(db) + timedelta(hours=1)
    change(
        db,
        "INSERT INTO {jobs} (queue, owner, lane, type, mode, dedup_key, status)"
        " VALUES ('q', 'x', 'acme', 'sync', 'manual', 'x', 'completed')",
        schema,
    )
    db.execute(
        sql.SQL("INSERT INTO {} (queue, lane, paused_until) VALUES ('q', 'acme', %s)").format(
            sql.Identifier(schema, "lanes")
        ),
        [paused],
    )

    assert change(db, "UPDATE {jobs} SET status = 'failed' WHERE id = %s", schema, newest["id"])
    assert len(history(db, schema, "acme-us")) == 2, "a failed slice is still open"
    change(db, "UPDATE {jobs} SET status = 'completed' WHERE id = %s", schema, newest["id"])

    rows = history(db, schema, "acme-us")
    assert len(rows) == 3
    added = rows[-1]
    assert (added["window_start"], added["window_end"]) == (
        older["window_start"] - 30 * DAY,
        older["window_start"],
    )
    assert added["dedup_key"] == f"initial:{iso(added['window_start'])}"
    assert (added["lane"], added["priority"], added["mode"], added["status"]) == (
        "acme",
        newest["priority"],
        "initial",
        "pending",
    )
    assert added["next_run_at"] == paused, "it waits for the lane's pause like its siblings"

    for status in ("deferred", "abandoned"):
        newest_open = next(r for r in rows if r["status"] == "pending")
        change(db, "UPDATE {jobs} SET status = %s WHERE id = %s", schema, status, newest_open["id"])
        rows = history(db, schema, "acme-us")
        assert len([r for r in rows if r["status"] in ("pending", "running", "failed")]) == 2
    assert len(rows) == 5


def test_a_cancelled_owner_gets_no_new_slice_until_a_backfill_asks_for_one(
    dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    app, _ = planner(dsn, schema, [Owner("acme")])
    try:
        app.plan()
        assert app.cancel("q", "acme", "disconnected") == 4  # 2 slices, a refresh, a snapshot
        # A hand change from cancelled to completed is no slice finishing: nothing is planned.
        change(db, "UPDATE {jobs} SET status = 'completed' WHERE mode = 'initial'", schema)
        assert len(history(db, schema, "acme")) == 2
        change(db, "UPDATE {jobs} SET status = 'cancelled' WHERE mode = 'initial'", schema)
        assert app.plan("q", "acme", type="orders") == {"q": 0}
        assert len(history(db, schema, "acme")) == 2
        # An explicit backfill does plan older slices again (as it did before lazy history).
        assert app.plan("q", "acme", horizon=timedelta(days=800), type="orders") == {"q": 2}
    finally:
        app.close()


def test_the_database_waits_for_no_one_to_top_up_and_the_next_plan_repairs(
    dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """A planner's (or a caller's) open transaction that holds the histories row, or that added
    the very slice and has not committed, makes the completion plan nothing rather than wait;
    progress() and first_load_finished still count the slices not planned, and the next plan
    adds what the completion did not."""
    app, _ = planner(dsn, schema, [Owner("acme")])
    db.execute("SET statement_timeout = '10s'")  # a completion that waits fails, not hangs
    try:
        app.plan()
        newest, older = history(db, schema, "acme")
        with psycopg.connect(dsn) as holder:
            holder.execute(
                sql.SQL("SELECT * FROM {} FOR UPDATE").format(sql.Identifier(schema, "histories"))
            )
            began = time.monotonic()
            change(db, "UPDATE {jobs} SET status = 'completed' WHERE id = %s", schema, newest["id"])
            assert time.monotonic() - began < 1.0
            holder.rollback()
        assert len(history(db, schema, "acme")) == 2, "nothing planned"
        with psycopg.connect(dsn) as holder:
            start = older["window_start"] - 30 * DAY
            holder.execute(
                sql.SQL(
                    "INSERT INTO {} (queue, owner, lane, type, mode, window_start, window_end,"
                    " dedup_key) VALUES ('q', 'acme', 'acme', 'orders', 'initial', %s, %s, %s)"
                ).format(sql.Identifier(schema, "jobs")),
                [start, older["window_start"], f"initial:{iso(start)}"],
            )
            began = time.monotonic()
            change(db, "UPDATE {jobs} SET status = 'completed' WHERE id = %s", schema, older["id"])
            assert time.monotonic() - began < 1.0
            holder.rollback()
        assert [r["status"] for r in history(db, schema, "acme")] == ["completed", "completed"]

        (progress,) = app.progress("q", type="orders").to_dict("records")
        assert (progress["slices_total"], progress["slices_completed"]) == (SLICES, 2)
        assert (progress["slices_open"], progress["state"]) == (SLICES - 2, "loading")
        finished = db.execute(
            app.database.store.query("first_load_finished"),
            {"queue": "q", "owner": "acme", "type": "orders"},
        ).fetchone()
        assert finished == (False,), "every row is completed, and 23 slices are still to plan"
        assert app.plan() == {"q": 2}, "the plan tops up what the completions could not"
    finally:
        app.close()


def test_a_backfill_racing_the_last_top_up_never_overlaps_it(
    dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """A worker's completion plans the history's last slice, cut at the recorded history_from,
    in a transaction that has not committed; a backfill that widens the row reads the history
    without it. The backfill waits for the row, commits the wider row first and plans the older
    slices in a second transaction that sees the cut slice: no two slices cover the same days.
    (Planned in the transaction that widened the row, its full 30-day slice would have covered
    the cut one's 10 days.)"""
    app, _ = planner(dsn, schema, [Owner("acme")])
    try:
        app.plan()
        first_midnight = history(db, schema, "acme")[0]["window_end"]
        newest_open = (
            f"UPDATE {{jobs}} SET status = 'completed' WHERE id = (SELECT id FROM {{jobs}}"
            f" WHERE {SLICE} AND {OPEN} ORDER BY window_start DESC LIMIT 1)"
        )
        while len(history(db, schema, "acme")) < SLICES - 1:
            change(db, newest_open, schema)
        # The 23rd finishes while a transaction holds the row: its top-up is skipped, and the
        # 24th is the only open slice.
        with psycopg.connect(dsn) as holder:
            holder.execute(
                sql.SQL("SELECT * FROM {} FOR UPDATE").format(sql.Identifier(schema, "histories"))
            )
            change(db, newest_open, schema)
        assert [r["status"] for r in history(db, schema, "acme")][-2:] == ["completed", "pending"]
        last = history(db, schema, "acme")[-1]  # the 24th: what is below it is cut to 10 days
        assert last["window_start"] - 30 * DAY < first_midnight - HISTORY["horizon"]

        with psycopg.connect(dsn) as worker:
            worker.execute(
                sql.SQL("UPDATE {} SET status = 'completed' WHERE id = %s").format(
                    sql.Identifier(schema, "jobs")
                ),
                [last["id"]],
            )
            results: list[Any] = []
            backfill = threading.Thread(
                target=lambda: results.append(
                    app.plan("q", "acme", horizon=timedelta(days=800), type="orders")
                )
            )
            backfill.start()
            wait_for(
                lambda: select(
                    db,
                    "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND query LIKE '%%record_histories%%'",
                    schema,
                ),
                timeout=30,
                what="the backfill to wait for the histories row",
            )
            worker.commit()
        backfill.join(timeout=30)
        assert results == [{"q": 1}]
    finally:
        app.close()
    rows = history(db, schema, "acme")
    for newer, older in itertools.pairwise(rows):
        assert older["window_end"] == newer["window_start"], "a gap or an overlap"
    assert rows[-2]["window_end"] - rows[-2]["window_start"] == 10 * DAY
    assert rows[-1]["window_start"] == first_midnight - HISTORY["horizon"] - 30 * DAY


# -- real workers -------------------------------------------------------------------------------


def open_at_once(rows: list[dict]) -> int:
    """The most slices of one owner open at one instant of the database's clock: each is open
    from the statement that added it (created_at) to the one that completed it (and the
    statement that completes a slice adds the next, at the same instant)."""
    edges = sorted(
        [(r["created_at"], 1) for r in rows] + [(r["completed_at"], -1) for r in rows],
        key=lambda edge: (edge[0], edge[1]),
    )
    most = current = 0
    for _, step in edges:
        current += step
        most = max(most, current)
    return most


@pytest.mark.processes
@pytest.mark.parametrize("lane_width", [1, 2])
def test_a_history_loads_completely_newest_first_with_at_most_ahead_slices_open(
    dsn: str, db: psycopg.Connection[Any], schema: str, lane_width: int
) -> None:
    owners = [Owner(f"{lane}-{n}", lane=lane) for lane in ("a", "b") for n in (1, 2)]
    app, settings = planner(
        dsn, schema, owners, concurrency=2, page_sleep=0.01, lane_width=lane_width
    )
    create_runs(db, schema)
    wait_until_away_from_a_period_edge(db, HISTORY["every"])
    try:
        first_midnight = midnight(database_now(db))
        app.plan()
    finally:
        app.close()
    assert count(db, f"SELECT count(*) FROM {{jobs}} WHERE {SLICE}", schema) == 4 * (lane_width + 1)
    with worker_processes(settings, 2):
        wait_for(
            lambda: (
                count(
                    db,
                    f"SELECT count(*) FROM {{jobs}} WHERE {SLICE} AND status = 'completed'",
                    schema,
                )
                == 4 * SLICES
            ),
            timeout=180,
            what="every history slice to load",
            interval=0.2,
        )
    if lane_width == 1:
        assert count(db, OVERLAPS, schema) == 0
    for owner in owners:
        rows = history(db, schema, owner.id)
        check_whole_history(rows, first_midnight)
        assert {r["status"] for r in rows} == {"completed"}
        assert open_at_once(rows) <= ahead_for(lane_width)
        started = select(
            db,
            "SELECT j.window_start FROM {runs} r JOIN {jobs} j ON j.id = r.job_id"
            " WHERE j.owner = %s AND j.type = 'orders' AND j.mode = 'initial'"
            " ORDER BY r.started, r.id",
            schema,
            owner.id,
        )
        if lane_width == 1:
            starts = [r["window_start"] for r in started]
            assert starts == sorted(starts, reverse=True), "newest first"


@pytest.mark.processes
def test_a_worker_killed_mid_history_resumes_with_nothing_skipped(
    dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    app, settings = planner(dsn, schema, [Owner("acme")], pages=3, page_sleep=0.1, lease=2)
    create_runs(db, schema)
    wait_until_away_from_a_period_edge(db, HISTORY["every"])
    try:
        first_midnight = midnight(database_now(db))
        app.plan()
    finally:
        app.close()
    done = f"SELECT count(*) FROM {{jobs}} WHERE {SLICE} AND status = 'completed'"
    with worker_processes(settings, 1) as (first,):
        wait_for(lambda: count(db, done, schema) >= 5, timeout=60, what="five loaded slices")
        # Mid-slice: a page of it saved, the next one in flight.
        wait_for(
            lambda: count(
                db,
                f"SELECT count(*) FROM {{jobs}} WHERE {SLICE} AND status = 'running'"
                " AND cursor IS NOT NULL",
                schema,
            ),
            timeout=30,
            what="a slice with a saved page",
            interval=0.01,
        )
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
    (cut,) = select(db, f"SELECT * FROM {{jobs}} WHERE {SLICE} AND status = 'running'", schema)
    with worker_processes(settings, 1):
        wait_for(lambda: count(db, done, schema) == SLICES, timeout=120, what="the whole history")
    rows = history(db, schema, "acme")
    check_whole_history(rows, first_midnight)
    assert {r["status"] for r in rows} == {"completed"}
    assert {r["processed_count"] for r in rows} == {3}, "every page of every slice, once"
    pages = select(
        db,
        "SELECT cursor_in FROM {runs} WHERE job_id = %s ORDER BY id",
        schema,
        cut["id"],
    )
    resumed = [row["cursor_in"] for row in pages]
    assert resumed[-1] == "2" and resumed.count(None) == 1, "it went on from its saved cursor"


# -- reading it ---------------------------------------------------------------------------------


def insert_every_slice(
    db: psycopg.Connection[Any], schema: str, owner: str, now: datetime, priority: int = 1
) -> None:
    """An owner planned the way version 5 planned: every history slice a row, and the refresh."""
    orders = WindowedType("orders", **HISTORY, priority=priority)  # declared second, as worker_proc
    jobs = missing(orders, Owner(owner), Existing(), now, ahead=1000).jobs
    with db.cursor() as cur:
        cur.executemany(
            sql.SQL(
                "INSERT INTO {} (queue, owner, lane, type, mode, priority, window_start,"
                " window_end, dedup_key) VALUES ('q', %s, %s, %s, %s, %s, %s, %s, %s)"
            ).format(sql.Identifier(schema, "jobs")),
            [
                (
                    j.owner,
                    j.lane,
                    j.type,
                    j.mode,
                    priority,
                    j.window_start,
                    j.window_end,
                    j.dedup_key,
                )
                for j in jobs
            ],
        )


def test_progress_reads_a_lazy_history_as_one_whose_every_slice_is_a_row(
    dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """progress() before lazy history counted the rows; it now counts the slices not planned
    from the histories row: the same totals, percent, coverage and state at every step."""
    app, _ = planner(dsn, schema, [Owner("lazy")])
    try:
        app.plan()
        insert_every_slice(db, schema, "eager", database_now(db))

        def read() -> dict[str, dict]:
            frame = app.progress("q", type="orders").drop(
                columns=["last_completed_at", "eta", "records"]
            )
            return {row.pop("owner"): row for row in frame.to_dict("records")}

        first = read()
        assert first["lazy"] == first["eager"]
        assert (first["lazy"]["slices_total"], first["lazy"]["state"]) == (SLICES, "connecting")
        for _ in range(3):
            for owner in ("lazy", "eager"):
                change(
                    db,
                    "UPDATE {jobs} SET status = 'completed', completed_at = now() WHERE id = ("
                    " SELECT id FROM {jobs} WHERE owner = %s AND type = 'orders'"
                    f" AND mode = 'initial' AND {OPEN} ORDER BY window_start DESC LIMIT 1)",
                    schema,
                    owner,
                )
        loading = read()
        assert loading["lazy"] == loading["eager"]
        assert loading["lazy"]["slices_completed"] == 3
        assert loading["lazy"]["slices_open"] == SLICES - 3
        assert loading["lazy"]["percent"] == 12.0
        assert loading["lazy"]["state"] == "loading"
        assert loading["lazy"]["coverage_end"] == midnight(database_now(db))
        app.cancel("q", "lazy", "gone")
        app.cancel("q", "eager", "gone")
        cancelled = read()
        assert cancelled["lazy"] == cancelled["eager"]
        assert cancelled["lazy"]["state"] == "cancelled"
        assert cancelled["lazy"]["slices_cancelled"] == SLICES - 3
        assert count(db, "SELECT count(*) FROM {jobs} WHERE owner = 'lazy'", schema) < SLICES
    finally:
        app.close()


# -- an upgraded table ----------------------------------------------------------------------------


@pytest.mark.processes
def test_an_upgraded_version_5_table_that_holds_every_slice_keeps_working(
    dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """A table version 5 planned (every slice a row, no histories row) upgrades in place: a plan
    adds nothing, workers load it as before, progress() counts its rows; a later backfill of it
    records a histories row and its older slices are planned lazily."""
    db.execute(render(SCHEMA_V5.read_text(encoding="utf-8"), schema))
    wait_until_away_from_a_period_edge(db, HISTORY["every"])
    now = database_now(db)
    insert_every_slice(db, schema, "acme", now)
    db.execute(
        sql.SQL(
            "INSERT INTO {} (queue, owner, lane, planned) VALUES ('q', 'acme', 'acme', true)"
        ).format(sql.Identifier(schema, "owners"))
    )

    app, settings = planner(dsn, schema, [Owner("acme")], page_sleep=0.001)
    create_runs(db, schema)
    try:
        assert app.plan(type="orders") == {"q": 0}
        assert select(db, "SELECT * FROM {histories}", schema) == []
        (before,) = app.progress("q", type="orders").to_dict("records")
        assert (before["slices_total"], before["state"]) == (SLICES, "connecting")
        done = f"SELECT count(*) FROM {{jobs}} WHERE {SLICE} AND status = 'completed'"
        with worker_processes(settings, 1):
            wait_for(lambda: count(db, done, schema) == SLICES, timeout=120, what="the history")
        check_whole_history(history(db, schema, "acme"), midnight(now))
        (loaded,) = app.progress("q", type="orders").to_dict("records")
        assert (loaded["slices_total"], loaded["state"]) == (SLICES, "loaded")

        assert app.plan(horizon=timedelta(days=800), type="orders") == {"q": 2}
        (row,) = select(db, "SELECT history_from, ahead FROM {histories}", schema)
        assert row == {"history_from": midnight(database_now(db)) - 800 * DAY, "ahead": 2}
        with worker_processes(settings, 1):
            wait_for(lambda: count(db, done, schema) == SLICES + 3, timeout=120, what="backfill")
        rows = history(db, schema, "acme")
        for newer, older in itertools.pairwise(rows):
            assert older["window_end"] == newer["window_start"], "a gap or an overlap"
        assert rows[-1]["window_start"] == row["history_from"]
    finally:
        app.close()
