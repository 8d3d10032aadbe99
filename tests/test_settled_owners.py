"""Settled owners (schema 7, docs/planning.md "Settled owners"): an explicit app.plan() marks the
owners whose rows lack nothing and skips their rows until the mark ends; the rows stay the truth.
A job deleted or moved by hand (or by a prune), a histories row deleted, other settings or
another lane, and a mark's end make the next plan read the owner again."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from planner_kit import comparison_params, executed_plan, owners_read
from psycopg import sql
from workers import database_now, wait_until_away_from_a_period_edge

from synclane import Job, Owner, Page, SyncLane
from synclane.store import SCHEMA_VERSION, render

DAY = timedelta(days=1)
EVERY = timedelta(minutes=15)
OVERLAP = timedelta(minutes=5)
SCHEMA_V6 = Path(__file__).parent / "schema_v6.sql"  # synclane/sql/schema.sql at version 6


def shops(app: SyncLane, owners: list[Owner], horizon: timedelta = 60 * DAY) -> SyncLane:
    queue = app.queue("shops")
    queue.owners(lambda name: owners)

    @queue.windowed("orders", horizon=horizon, slice=30 * DAY, every=EVERY, overlap=OVERLAP)
    def orders(job: Job) -> Page:
        return Page(None)

    return app


def one(db: psycopg.Connection[Any], query: str, schema: str, *params: Any) -> Any:
    names = {n: sql.Identifier(schema, n) for n in ("jobs", "owners", "histories", "plan_epoch")}
    row = db.execute(sql.SQL(query).format(**names), params).fetchone()
    return None if row is None else row[0]


def marked(db: psycopg.Connection[Any], schema: str) -> set[str]:
    """The owners whose mark counts now (until not come, the current epoch)."""
    found = db.execute(
        sql.SQL(
            "SELECT o.owner FROM {} o, {} e WHERE o.settled_until > now()"
            " AND o.settled_epoch = e.epoch"
        ).format(sql.Identifier(schema, "owners"), sql.Identifier(schema, "plan_epoch"))
    ).fetchall()
    return {r[0] for r in found}


@pytest.fixture
def compared(monkeypatch: pytest.MonkeyPatch) -> list[set[str]]:
    """The owners each planning transaction reads (`plan_read`), one set per batch."""
    return owners_read(monkeypatch)


def test_a_plan_with_nothing_new_reads_no_row_of_a_marked_owner(app, db, schema):
    """The goal of issue 30: with nothing new, the comparison is one lookup an owner (its row
    of the owners table), whatever the owner's jobs and histories hold."""
    wait_until_away_from_a_period_edge(db, EVERY)
    names = [f"owner-{n}" for n in range(50)]
    fleet = [Owner(n) for n in names]
    queue = shops(app, fleet, horizon=730 * DAY).catalog.get("shops")
    assert app.plan() == {"shops": 3 * len(names)}
    assert marked(db, schema) == set()
    assert app.plan() == {"shops": 0}  # compares every owner's rows, and marks them
    assert marked(db, schema) == set(names)

    params = comparison_params(queue.job_type("orders"), database_now(db), names, mark=True)
    top, nodes = executed_plan(db, schema, "unsettled_owners", params)
    read = {}
    for node in nodes:
        if "Relation Name" in node:
            read[node["Relation Name"]] = read.get(node["Relation Name"], 0) + node["Actual Loops"]
    assert read["owners"] == len(names), read
    assert read.get("jobs", 0) == 0 and read.get("histories", 0) == 0, read
    assert top["Actual Rows"] == 0, "nothing to plan, nothing to mark"

    # A newcomer's first plan (a histories row written for the first time) ends no mark.
    fleet.append(Owner("newcomer"))
    assert app.plan() == {"shops": 3}
    assert marked(db, schema) == set(names)


def test_a_job_deleted_after_its_owner_was_marked_is_planned_again_by_the_next_plan(
    app, db, schema, compared
):
    """The row is the truth: a DELETE ends every mark (the plan epoch moves on)."""
    wait_until_away_from_a_period_edge(db, EVERY)
    shops(app, [Owner("acme"), Owner("globex")])
    app.plan()
    app.plan()
    assert marked(db, schema) == {"acme", "globex"}
    epoch = one(db, "SELECT epoch FROM {plan_epoch}", schema)
    before = one(db, "SELECT array_agg(dedup_key ORDER BY dedup_key) FROM {jobs}", schema)

    deleted = db.execute(
        sql.SQL("DELETE FROM {} WHERE owner = 'acme' AND mode = 'recurring'").format(
            sql.Identifier(schema, "jobs")
        )
    ).rowcount
    assert deleted == 1
    assert one(db, "SELECT epoch FROM {plan_epoch}", schema) != epoch
    assert marked(db, schema) == set()

    compared.clear()
    assert app.plan() == {"shops": 1}
    assert set().union(*compared) == {"acme"}, "only the owner that lacks a row is read"
    assert one(db, "SELECT array_agg(dedup_key ORDER BY dedup_key) FROM {jobs}", schema) == before
    app.plan()
    assert marked(db, schema) == {"acme", "globex"}


def test_a_delete_committed_after_the_comparison_read_ends_the_marks_it_wrote(app, db, dsn, schema):
    """A race: the comparison reads (and marks) while a DELETE of the same owner's job is not
    committed yet. The marks it writes carry the epoch its snapshot saw, which the DELETE's
    commit replaces, so the next plan reads the owner and plans the job again."""
    wait_until_away_from_a_period_edge(db, EVERY)
    shops(app, [Owner("acme")])
    app.plan()
    with psycopg.connect(dsn) as user:
        deleted = user.execute(
            sql.SQL("DELETE FROM {} WHERE mode = 'recurring'").format(
                sql.Identifier(schema, "jobs")
            )
        ).rowcount
        assert deleted == 1
        # The plan does not see the delete: it finds acme settled and marks it.
        finished = threading.Event()
        threading.Thread(target=lambda: (app.plan(), finished.set()), daemon=True).start()
        assert finished.wait(30), "the plan waited for the user's open transaction"
        assert one(db, "SELECT settled_until IS NOT NULL FROM {owners}", schema)
        user.commit()
    assert marked(db, schema) == set()
    assert app.plan() == {"shops": 1}
    assert one(db, "SELECT count(*) FROM {jobs} WHERE mode = 'recurring'", schema) == 1


def test_a_window_moved_by_hand_ends_the_marks(app, db, schema):
    """An UPDATE that sets a column the comparison reads (here a refresh moved to the period
    before) ends every mark; the next plan adds the refresh this period lacks."""
    wait_until_away_from_a_period_edge(db, EVERY)
    shops(app, [Owner("acme")])
    app.plan()
    app.plan()
    assert marked(db, schema) == {"acme"}
    db.execute(
        sql.SQL(
            "UPDATE {} SET window_start = window_start - interval '1 hour',"
            " window_end = window_end - interval '1 hour', dedup_key = 'recurring:moved'"
            " WHERE mode = 'recurring'"
        ).format(sql.Identifier(schema, "jobs"))
    )
    assert marked(db, schema) == set()
    assert app.plan() == {"shops": 0}  # the moved refresh is open: the new one waits for it
    db.execute(
        sql.SQL("UPDATE {} SET status = 'completed' WHERE mode = 'recurring'").format(
            sql.Identifier(schema, "jobs")
        )
    )
    assert app.plan() == {"shops": 1}


def test_a_histories_row_changed_by_hand_ends_the_marks_and_is_written_again(app, db, schema):
    wait_until_away_from_a_period_edge(db, EVERY)
    shops(app, [Owner("acme")], horizon=730 * DAY)
    app.plan()
    app.plan()
    assert marked(db, schema) == {"acme"}
    history = one(db, "SELECT history_from FROM {histories}", schema)
    db.execute(
        sql.SQL("UPDATE {} SET history_from = history_from + interval '1 day'").format(
            sql.Identifier(schema, "histories")
        )
    )
    assert marked(db, schema) == set()
    app.plan()
    assert one(db, "SELECT history_from FROM {histories}", schema) == history
    app.plan()
    assert marked(db, schema) == {"acme"}  # marked again by the plan after the repair


def test_a_deleted_histories_row_ends_the_marks_and_is_written_again(app, db, schema):
    wait_until_away_from_a_period_edge(db, EVERY)
    shops(app, [Owner("acme")], horizon=730 * DAY)
    app.plan()
    app.plan()
    assert marked(db, schema) == {"acme"}
    history = one(db, "SELECT history_from FROM {histories}", schema)
    db.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(schema, "histories")))
    assert marked(db, schema) == set()
    app.plan()
    assert one(db, "SELECT history_from FROM {histories}", schema) == history


def test_another_lane_or_other_settings_are_compared_again(dsn, db, schema, compared):
    """A mark does not hide a lane change (the owners table's lane is compared first), and
    counts only for the settings it was checked with: a wider horizon in the code is recorded by
    the next plan."""
    wait_until_away_from_a_period_edge(db, EVERY)
    first = shops(SyncLane(dsn, schema=schema), [Owner("acme"), Owner("globex")])
    try:
        first.plan()
        first.plan()
    finally:
        first.close()
    assert marked(db, schema) == {"acme", "globex"}
    history = one(db, "SELECT history_from FROM {histories} WHERE owner = 'acme'", schema)

    moved = shops(SyncLane(dsn, schema=schema), [Owner("acme"), Owner("globex", lane="shared")])
    try:
        compared.clear()
        assert moved.plan() == {"shops": 0}
        assert set().union(*compared) == {"globex"}
    finally:
        moved.close()
    lanes = "SELECT array_agg(DISTINCT lane) FROM {jobs} WHERE owner = 'globex' AND status <> 'x'"
    assert one(db, lanes, schema) == ["shared"]

    wider = shops(
        SyncLane(dsn, schema=schema),
        [Owner("acme"), Owner("globex", lane="shared")],
        horizon=90 * DAY,
    )
    try:
        compared.clear()
        assert wider.plan() == {"shops": 0}  # both slices are still open: the row is recorded
        assert set().union(*compared) == {"acme", "globex"}
    finally:
        wider.close()
    recorded = one(db, "SELECT history_from FROM {histories} WHERE owner = 'acme'", schema)
    assert recorded == history - 30 * DAY


def test_a_prune_ends_the_marks_and_the_next_plan_adds_nothing(app, db, schema):
    """Retention deletes finished rows that planning no longer reads: the epoch moves on, the
    next plan reads every owner again, finds nothing missing, and marks them again."""
    wait_until_away_from_a_period_edge(db, EVERY)
    shops(app, [Owner("acme"), Owner("globex")])
    app.plan()
    jobs = sql.Identifier(schema, "jobs")
    # Two old finished refreshes behind each owner's current one, as earlier days left them.
    db.execute(
        sql.SQL(
            "INSERT INTO {} (queue, owner, lane, type, mode, status, window_start, window_end,"
            " dedup_key, created_at, completed_at)"
            " SELECT 'shops', o, o, 'orders', 'recurring', 'completed',"
            " now() - (n + 1) * interval '1 day', now() - n * interval '1 day',"
            " 'recurring:old:' || n, now() - n * interval '1 day', now() - n * interval '1 day'"
            " FROM unnest(ARRAY['acme', 'globex']) o, generate_series(1, 2) n"
        ).format(jobs)
    )
    db.execute(sql.SQL("UPDATE {} SET status = 'completed'").format(jobs))
    assert app.plan() == {"shops": 0}
    assert marked(db, schema) == {"acme", "globex"}
    keys = "SELECT array_agg((dedup_key, window_start) ORDER BY owner, dedup_key)::text FROM {jobs}"

    assert app.prune(older_than=12 * timedelta(hours=1)) > 0
    assert marked(db, schema) == set()
    pruned = one(db, keys, schema)
    assert app.plan() == {"shops": 0}
    assert marked(db, schema) == {"acme", "globex"}
    assert one(db, keys, schema) == pruned


def test_an_owner_held_back_by_an_open_refresh_is_marked_while_it_stays_open(
    app, db, schema, compared
):
    """A refresh of an earlier period still open settles its owner while it stays open (no new
    refresh is planned beside it): the mark says so (settled_open), and a plan checks that one
    fact, one lookup. Once the refresh finished the mark no longer counts, and the plan after
    it plans the refresh it was held back from, as without marks."""
    wait_until_away_from_a_period_edge(db, EVERY)
    shops(app, [Owner("acme")])
    app.plan()
    jobs = sql.Identifier(schema, "jobs")
    db.execute(
        sql.SQL(
            "UPDATE {} SET window_start = window_start - interval '1 hour',"
            " window_end = now() - interval '20 minutes', dedup_key = 'recurring:earlier'"
            " WHERE mode = 'recurring'"
        ).format(jobs)
    )
    assert app.plan() == {"shops": 0}
    assert marked(db, schema) == {"acme"}
    assert one(db, "SELECT settled_open FROM {owners}", schema) is True
    compared.clear()
    assert app.plan() == {"shops": 0}
    assert compared == []
    db.execute(sql.SQL("UPDATE {} SET status = 'completed' WHERE mode = 'recurring'").format(jobs))
    compared.clear()
    assert app.plan() == {"shops": 1}
    assert set().union(*compared) == {"acme"}


@pytest.mark.parametrize("racers", [4])
def test_planners_racing_with_marks_insert_each_job_once(dsn, db, schema, racers):
    """Planners that mark, delete and plan at once: every job is inserted once, and after the
    race one more plan finds nothing missing."""
    wait_until_away_from_a_period_edge(db, EVERY)
    owners = [Owner(f"owner-{n}") for n in range(40)]
    shops(SyncLane(dsn, schema=schema), owners).close()
    errors: list[BaseException] = []
    added: list[int] = []

    def plan_a_few() -> None:
        app = shops(SyncLane(dsn, schema=schema), owners)
        try:
            for _ in range(3):
                added.append(app.plan()["shops"])
        except BaseException as error:  # reported below
            errors.append(error)
        finally:
            app.close()

    threads = [threading.Thread(target=plan_a_few) for _ in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    assert sum(added) == 3 * len(owners)
    db.execute(
        sql.SQL("DELETE FROM {} WHERE owner = 'owner-7' AND mode = 'recurring'").format(
            sql.Identifier(schema, "jobs")
        )
    )
    again = shops(SyncLane(dsn, schema=schema), owners)
    try:
        assert again.plan() == {"shops": 1}
        assert again.plan() == {"shops": 0}
    finally:
        again.close()
    duplicates = one(
        db,
        "SELECT count(*) FROM (SELECT FROM {jobs} GROUP BY owner, type, window_start"
        " HAVING count(*) > 1) AS d",
        schema,
    )
    assert duplicates == 0


def test_a_version_6_table_upgrades_and_its_owners_are_marked(dsn, db, schema):
    """Schema 7 adds the marks and the plan epoch to a version-6 table in place: what version 6
    planned stays, the next plans mark the owners, and a DELETE still ends the marks."""
    db.execute(render(SCHEMA_V6.read_text(encoding="utf-8"), schema))
    wait_until_away_from_a_period_edge(db, EVERY)
    jobs = sql.Identifier(schema, "jobs")
    db.execute(
        sql.SQL(
            "INSERT INTO {} (queue, owner, lane, planned) VALUES ('shops', 'acme', 'acme', true)"
        ).format(sql.Identifier(schema, "owners"))
    )
    app = shops(SyncLane(dsn, schema=schema), [Owner("acme")])
    try:
        assert app.plan() == {"shops": 3}  # a version-6 owners row, no job yet
        versions = db.execute(
            sql.SQL("SELECT array_agg(version ORDER BY version) FROM {}").format(
                sql.Identifier(schema, "schema_version")
            )
        ).fetchone()[0]
        assert versions == [6, SCHEMA_VERSION]
        assert app.plan() == {"shops": 0}
        assert marked(db, schema) == {"acme"}
        db.execute(sql.SQL("DELETE FROM {} WHERE mode = 'recurring'").format(jobs))
        assert app.plan() == {"shops": 1}
    finally:
        app.close()
