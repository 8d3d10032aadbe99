"""Retention (app.prune, a queue's `retention`, `synclane prune`) against a real PostgreSQL: it
deletes old finished refreshes and manual jobs, and nothing that planning, coverage(), progress()
or a human still needs; it never waits for a lock."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import psycopg
import pytest
from command_line import Run
from history import declare, jobs, set_rows, two_days_of_refreshes
from psycopg import sql
from roles import drop_role, dsn_as
from workers import database_now, let_time_pass

from synclane import ConfigError, SyncLane

DAY = timedelta(days=1)
HOUR = timedelta(hours=1)
OPEN_OR_WAITING = ("pending", "running", "failed", "deferred", "abandoned")


def spans(app: SyncLane) -> pd.DataFrame:
    """coverage() without the number of jobs behind each span (pruning merges jobs)."""
    frame = app.coverage("shops")
    return frame.drop(columns=["jobs"]).reset_index(drop=True)


def test_a_prune_keeps_every_row_planning_coverage_and_progress_read(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    declare(app)
    two_days_of_refreshes(app, db, schema)
    before = jobs(db, schema)
    coverage, progress = spans(app), app.progress("shops")
    failures = app.failures("shops")

    deleted = app.prune(older_than=5 * HOUR)

    after = jobs(db, schema)
    assert deleted > 60 and len(after) == len(before) - deleted
    kept = {row["id"] for row in after}
    young = {r["id"] for r in before if r["created_at"] > before[-1]["created_at"] - 5 * HOUR}
    must_stay = {
        r["id"] for r in before if r["status"] in OPEN_OR_WAITING or r["mode"] == "initial"
    }
    assert must_stay <= kept, "an open job, one waiting for a human, or history was deleted"
    assert young <= kept, "a row newer than the limit was deleted"
    gone = [r for r in before if r["id"] not in kept]
    assert {r["mode"] for r in gone} <= {"recurring", "manual"}
    assert {r["status"] for r in gone} <= {"completed", "cancelled"}

    assert app.plan() == {"shops": 0}, "a re-plan after a prune inserts nothing"
    pd.testing.assert_frame_equal(spans(app), coverage)
    pd.testing.assert_frame_equal(app.progress("shops"), progress)
    pd.testing.assert_frame_equal(app.failures("shops"), failures)
    assert app.prune(older_than=5 * HOUR) == 0, "a second prune finds nothing more"

    # Time goes on: the next refreshes start where coverage ends, as without the prune.
    set_rows(db, schema, "status = 'completed'", "mode = 'recurring' AND status = 'pending'")
    let_time_pass(db, schema, HOUR)
    assert app.plan() == {"shops": 3}  # acme's orders and products, globex's orders
    (newest, *older) = reversed(jobs(db, schema, "owner = 'acme' AND type = 'orders'"))
    assert newest["status"] == "pending"
    assert newest["window_start"] == max(r["window_end"] for r in older) - timedelta(minutes=5)


@pytest.mark.parametrize("older_than", [timedelta(0), 5 * HOUR])
def test_a_prune_keeps_the_spans_coverage_shows_over_any_range(
    app: SyncLane, db: psycopg.Connection[Any], schema: str, older_than: timedelta
) -> None:
    """A prune merges a run of old refreshes into its newest row, widened to the run's span.
    coverage() over a range that cuts the run (the last two hours, say) showed that row whole
    after the prune: a span reaching back two days. Spans are clipped to the range, so they are
    the same whichever rows hold them; records are those of the jobs behind a span, each counted
    whole (a merged row carries its whole run's)."""
    declare(app)
    two_days_of_refreshes(app, db, schema)
    end = max(r["window_end"] for r in jobs(db, schema, "mode = 'recurring' AND type = 'orders'"))
    ranges: list[dict[str, Any]] = [
        {},
        {"since": end - 2 * HOUR},
        {"since": end - timedelta(minutes=90)},  # inside a window
        {"since": end - 30 * HOUR, "until": end - 20 * HOUR - timedelta(minutes=20)},
        {"until": end - 40 * HOUR},
    ]

    def read(asked: dict[str, Any]) -> pd.DataFrame:
        return app.coverage("shops", **asked).reset_index(drop=True)

    before = [read(asked) for asked in ranges]
    assert app.prune(older_than=older_than) > 60
    for asked, was in zip(ranges, before, strict=True):
        now = read(asked)
        columns = ["owner", "type", "status", "window_start", "window_end", "duration"]
        pd.testing.assert_frame_equal(now[columns], was[columns], obj=f"coverage({asked})")
        low, high = asked.get("since"), asked.get("until")
        assert (low is None or (now["window_start"] >= low).all()) and (
            high is None or (now["window_end"] <= high).all()
        ), f"coverage({asked}) reaches outside its range"
        # Records: those of every job whose window overlaps the span, counted whole.
        for span in now.itertuples():
            behind = jobs(
                db,
                schema,
                f"owner = '{span.owner}' AND type = '{span.type}' AND status = '{span.status}' "
                f"AND window_start < '{span.window_end.isoformat()}' "
                f"AND window_end > '{span.window_start.isoformat()}'",
            )
            assert span.records == sum(r["processed_count"] for r in behind)
    pd.testing.assert_frame_equal(read({}), before[0].assign(jobs=read({})["jobs"]))
    # A range relative to the database's now is clipped the same way.
    recent = read({"since": timedelta(hours=3)})
    assert (recent["window_start"] >= database_now(db) - timedelta(hours=3, seconds=5)).all()


def test_a_prune_waits_for_no_lock_and_leaves_locked_rows(
    app: SyncLane, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    declare(app)
    two_days_of_refreshes(app, db, schema)
    finished = "mode = 'recurring' AND status = 'completed' AND owner = 'acme' AND type = 'orders'"
    locked = jobs(db, schema, finished)[3]  # in the middle of a run of finished refreshes
    coverage = spans(app)
    with psycopg.connect(dsn) as holder:
        holder.execute(
            sql.SQL("SELECT id FROM {} WHERE id = %s FOR UPDATE").format(
                sql.Identifier(schema, "jobs")
            ),
            [locked["id"]],
        )
        started = time.monotonic()
        deleted = app.prune(older_than=5 * HOUR)
        assert time.monotonic() - started < 10
        holder.rollback()
    assert deleted > 0
    assert jobs(db, schema, f"id = {locked['id']}") == [locked], "a row someone holds stays"
    assert app.plan() == {"shops": 0}
    pd.testing.assert_frame_equal(spans(app), coverage)


def test_a_prune_the_server_refuses_is_raised_at_once_not_sent_again(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    """An error the server answered with (here a statement timeout, raised by a trigger the
    test puts on the table) rolled the batch back: it is raised at once, as enqueue and requeue
    raise it. Only a lost connection sends a batch again (tests/test_lost_answers.py)."""
    declare(app)
    app.plan()  # rows to look at; whether any is old enough does not matter to the trigger
    db.execute(
        sql.SQL(
            "CREATE FUNCTION {schema}.refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "RAISE EXCEPTION 'canceling statement due to statement timeout' "
            "USING ERRCODE = 'query_canceled'; END $$; "
            "CREATE TRIGGER refuse BEFORE DELETE ON {schema}.jobs "
            "FOR EACH STATEMENT EXECUTE FUNCTION {schema}.refuse()"
        ).format(schema=sql.Identifier(schema))
    )
    before = len(jobs(db, schema, "true"))
    started = time.monotonic()
    with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
        app.prune(older_than=5 * HOUR)
    assert time.monotonic() - started < 3, "sent again after the server had answered"
    assert len(jobs(db, schema, "true")) == before


def test_the_elected_planner_applies_a_queues_retention(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    declare(app, retention=5 * HOUR)
    two_days_of_refreshes(app, db, schema)
    before = len(jobs(db, schema))
    plan = app.worker(["shops"]).plan
    assert plan is not None
    plan("shops")
    pruned = len(jobs(db, schema))
    assert pruned < before - 60
    plan("shops")
    assert len(jobs(db, schema)) == pruned, "pruned once per PRUNE_EVERY, not every round"


def test_prune_arguments_are_checked(app: SyncLane) -> None:
    declare(app)
    with pytest.raises(ConfigError, match="older_than"):
        app.prune(older_than=-DAY)
    with pytest.raises(ConfigError, match="'nope'"):
        app.prune("nope")
    with pytest.raises(ConfigError, match="retention"):
        app.queue("other", retention=0)
    assert app.prune() == 0


def test_synclane_prune_deletes_and_says_how_many(run: Run) -> None:
    assert run("plan")[0] == 0
    code, out, _ = run("prune", "--older-than-days", "30")
    assert (code, out.strip()) == (0, "pruned 0 finished row(s) older than 30 day(s)")
    code, out, _ = run("prune", "--queue", "shops", "--older-than-days", "0.5")
    assert (code, out.strip()) == (
        0,
        "pruned 0 finished row(s) older than 0.5 day(s) in queue shops",
    )
    code, _, err = run("prune", "--older-than-days", "-1")
    assert code == 2 and "--older-than-days" in err


def test_a_prune_while_workers_work_deletes_only_finished_rows(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    """Prunes over and over while a worker takes, runs and completes jobs: the worker never
    waits for the prune and every job it finished or runs is still there or merged."""
    declare(app)
    two_days_of_refreshes(app, db, schema)
    set_rows(db, schema, "status = 'pending', next_run_at = now()", "status IN ('failed')")
    open_before = {r["id"] for r in jobs(db, schema, "status = 'pending'")}
    waiting = len(open_before)
    stop = threading.Event()
    counts: list[int] = []

    def prune_again_and_again() -> None:
        while not stop.is_set():
            counts.append(app.prune(older_than=5 * HOUR))

    pruner = threading.Thread(target=prune_again_and_again, daemon=True)
    pruner.start()
    try:
        report = app.run_worker(until_idle=True, idle_grace=0, stop_after=30)
    finally:
        stop.set()
        pruner.join(timeout=30)
    assert report.get("completed", 0) >= waiting
    assert jobs(db, schema, "status IN ('pending', 'running', 'failed')") == []
    assert sum(counts) > 0
    assert not [
        r for r in jobs(db, schema) if r["id"] in open_before and r["status"] == "cancelled"
    ]
    assert {r["id"] for r in jobs(db, schema)} >= open_before, "a job the worker ran is gone"


def test_the_pruner_role_of_the_docs_may_prune(
    app: SyncLane, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """The grants docs/operations.md gives a role that runs `synclane prune` are enough."""
    import re
    import uuid

    text = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text(
        encoding="utf-8"
    )
    (grants,) = re.findall(r"```sql\n(CREATE ROLE synclane_pruner.*?)```", text, re.S)
    role = f"synclane_pruner_{uuid.uuid4().hex[:8]}"
    grants = grants.replace("synclane_pruner", role)
    grants = re.sub(r"\bsynclane(?=\.|;|\s+TO\b)", sql.Identifier(schema).as_string(None), grants)
    declare(app)
    two_days_of_refreshes(app, db, schema)
    db.execute(grants)
    try:
        pruner = SyncLane(dsn_as(dsn, role, "change me as well"), schema=schema)
        try:
            declare(pruner)
            assert pruner.prune(older_than=5 * HOUR) > 60
        finally:
            pruner.close()
    finally:
        drop_role(db, role)
    assert app.plan() == {"shops": 0}
