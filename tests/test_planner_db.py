"""Planning against a real PostgreSQL (docs/planning.md): no duplicates, no gaps, no shifts."""

from __future__ import annotations

import itertools
import re
from datetime import timedelta

import apps
import psycopg
import pytest
from planner_kit import comparison_params, executed_plan, owners_read
from psycopg import sql
from psycopg.rows import dict_row
from workers import database_now, let_time_pass, wait_until_away_from_a_period_edge

from synclane import ConfigError, Job, Owner, Page, SyncLane
from synclane.planning import Existing, iso, marks, midnight, period_start, settled
from synclane.store import Store

DAY = timedelta(days=1)
OPENED = "status IN ('pending', 'running', 'failed')"
EVERY = timedelta(minutes=15)
OVERLAP = timedelta(minutes=5)


def jobs_table(schema: str) -> sql.Composed:
    return sql.SQL("{}.jobs").format(sql.Identifier(schema))


def rows(db: psycopg.Connection, schema: str, where: str = "TRUE", *params) -> list[dict]:
    with db.cursor(row_factory=dict_row) as cur:
        query = sql.SQL("SELECT * FROM {} WHERE {} ORDER BY window_start DESC NULLS LAST, id")
        return cur.execute(query.format(jobs_table(schema), sql.SQL(where)), params).fetchall()


def count(db: psycopg.Connection, schema: str) -> int:
    row = db.execute(sql.SQL("SELECT count(*) FROM {}").format(jobs_table(schema))).fetchone()
    assert row is not None
    return int(row[0])


def set_rows(db: psycopg.Connection, schema: str, assignments: str, where: str, *params) -> int:
    query = sql.SQL("UPDATE {} SET {} WHERE {}").format(
        jobs_table(schema), sql.SQL(assignments), sql.SQL(where)
    )
    return db.execute(query, params).rowcount


def history_from(db: psycopg.Connection, schema: str, owner: str) -> object:
    """The history_from the histories row of an owner's orders records (None: no row)."""
    row = db.execute(
        sql.SQL("SELECT history_from FROM {} WHERE owner = %s AND type = 'orders'").format(
            sql.Identifier(schema, "histories")
        ),
        [owner],
    ).fetchone()
    return None if row is None else row[0]


def complete_history(db: psycopg.Connection, schema: str) -> int:
    """Complete the open history slices, one statement at a time, as workers would, until none
    is open (each completion plans the next older slice); returns how many were completed."""
    done = 0
    while completed := set_rows(
        db,
        schema,
        "status = 'completed', completed_at = now()",
        "mode = 'initial' AND status IN ('pending', 'running', 'failed')",
    ):
        done += completed
    return done


def windowed_app(
    app: SyncLane, owners: list[Owner], horizon: timedelta = timedelta(days=60)
) -> SyncLane:
    shops = app.queue("shops")
    shops.owners(lambda queue: owners)

    @shops.windowed("orders", horizon=horizon, slice=30 * DAY, every=EVERY, overlap=OVERLAP)
    def orders(job: Job) -> Page:
        return Page(None)

    return app


# -- no duplicates ------------------------------------------------------------------------


def test_planning_twice_adds_nothing(dsn, db, schema):
    app = apps.build(dsn, schema)
    try:
        first = app.plan()
        ids = [row["id"] for row in rows(db, schema)]
        second = app.plan()
    finally:
        app.close()

    assert first == {"shops": apps.JOBS_PER_OWNER * len(apps.OWNERS)}
    assert second == {"shops": 0}
    assert [row["id"] for row in rows(db, schema)] == ids


@pytest.mark.processes
def test_eight_processes_planning_at_once_create_each_job_once(dsn, db, schema):
    apps.build(dsn, schema).close()  # the schema exists: the race is the planners', not the DDL's

    reports = apps.run_together(
        apps.plan_at_once,
        8,
        dsn,
        schema,
        before_release=lambda: wait_until_away_from_a_period_edge(db, apps.ORDERS_EVERY),
    )

    expected = apps.JOBS_PER_OWNER * len(apps.OWNERS)
    assert [status for status, _ in reports] == ["ok"] * 8, reports
    assert sum(added for _, added in reports) == expected
    assert count(db, schema) == expected
    # One histories row per owner, all recording the same two years back from one midnight.
    recorded = db.execute(
        sql.SQL("SELECT count(*), count(DISTINCT history_from), min(ahead) FROM {}").format(
            sql.Identifier(schema, "histories")
        )
    ).fetchone()
    assert recorded == (len(apps.OWNERS), 1, 2)
    duplicates = db.execute(
        sql.SQL(
            "SELECT owner, type, mode, window_start FROM {} "
            "GROUP BY owner, type, mode, window_start HAVING count(*) > 1"
        ).format(jobs_table(schema))
    ).fetchall()
    assert duplicates == []


# -- no shifts, no gaps in history ----------------------------------------------------------


@pytest.mark.parametrize("how", ["ad hoc", "in code"])
def test_widening_the_horizon_keeps_the_slices_and_adds_only_the_older_ones(app, db, schema, how):
    owner = Owner("acme")
    windowed_app(app, [owner], horizon=timedelta(days=60))
    before = database_now(db)
    app.plan()
    kept = [
        (r["id"], r["window_start"], r["window_end"]) for r in rows(db, schema, "mode = 'initial'")
    ]
    today = midnight(before)
    assert [(start, end) for _, start, end in kept] == [
        (today - 30 * DAY, today),
        (today - 60 * DAY, today - 30 * DAY),
    ]

    if how == "ad hoc":
        added = app.plan("shops", horizon=timedelta(days=730))
    else:
        wider = windowed_app(SyncLane(app.dsn, schema=schema), [owner], horizon=timedelta(days=730))
        try:
            added = wider.plan()
        finally:
            wider.close()

    # Lazy history: the wider horizon is recorded, and its 23 older slices are planned as the
    # open ones finish (by the database, whoever finishes them), not all by this plan.
    assert added == {"shops": 0}
    assert history_from(db, schema, "acme") == today - 730 * DAY
    assert complete_history(db, schema) == 25
    slices = rows(db, schema, "mode = 'initial'")
    assert [(r["id"], r["window_start"], r["window_end"]) for r in slices[:2]] == kept
    assert len(slices) == 25
    for newer, older in itertools.pairwise(slices):
        assert older["window_end"] == newer["window_start"], "a gap or an overlap in history"
    assert [r["window_end"] - r["window_start"] for r in slices[:-1]] == [30 * DAY] * 24
    oldest = slices[-1]
    assert oldest["window_start"] == today - 730 * DAY
    assert oldest["window_end"] - oldest["window_start"] == 10 * DAY
    assert oldest["dedup_key"] == f"initial:{iso(today - 730 * DAY)}"

    # The declared 60 days again: nothing is added, and nothing is taken away.
    assert app.plan() == {"shops": 0}
    assert len(rows(db, schema, "mode = 'initial'")) == 25


# -- refreshes --------------------------------------------------------------------------------


def test_the_first_refresh_starts_at_midnight_minus_the_overlap(app, db, schema):
    windowed_app(app, [Owner("acme")])
    before = database_now(db)
    app.plan()
    after = database_now(db)

    [refresh] = rows(db, schema, "mode = 'recurring'")
    assert refresh["window_start"] == midnight(before) - OVERLAP
    assert before <= refresh["window_end"] <= after
    assert refresh["dedup_key"] == f"recurring:{iso(period_start(refresh['window_end'], EVERY))}"


def test_a_recurring_job_starts_where_coverage_ends_minus_the_overlap(app, db, schema):
    windowed_app(app, [Owner("acme")])
    app.plan()
    set_rows(db, schema, "status = 'completed', completed_at = now()", "TRUE")
    let_time_pass(db, schema, timedelta(hours=1))
    # Coverage ends at an instant no rule would produce by itself.
    coverage_end = database_now(db) - timedelta(minutes=37, microseconds=123456)
    assert set_rows(db, schema, "window_end = %s", "mode = 'recurring'", coverage_end) == 1

    before = database_now(db)
    assert app.plan() == {"shops": 1}
    after = database_now(db)

    newest = rows(db, schema, "mode = 'recurring' AND status = 'pending'")
    assert len(newest) == 1
    assert newest[0]["window_start"] == coverage_end - OVERLAP
    assert before <= newest[0]["window_end"] <= after
    assert (
        newest[0]["dedup_key"] == f"recurring:{iso(period_start(newest[0]['window_end'], EVERY))}"
    )
    assert newest[0]["lane"] == "acme"


def test_a_long_outage_is_refreshed_in_slices_without_a_gap(app, db, schema):
    windowed_app(app, [Owner("acme")])
    app.plan()
    set_rows(db, schema, "status = 'completed'", "TRUE")
    [first_refresh] = rows(db, schema, "mode = 'recurring'")
    let_time_pass(db, schema, timedelta(days=70))
    coverage_end = first_refresh["window_end"] - timedelta(days=70)

    before = database_now(db)
    assert app.plan() == {"shops": 3}

    pieces = sorted(
        rows(db, schema, "mode = 'recurring' AND status = 'pending'"),
        key=lambda r: r["window_start"],
    )
    assert pieces[0]["window_start"] == coverage_end - OVERLAP
    for earlier, later in itertools.pairwise(pieces):
        assert later["window_start"] == earlier["window_end"]
    assert [p["window_end"] - p["window_start"] for p in pieces[:2]] == [30 * DAY] * 2
    assert pieces[-1]["window_end"] >= before
    assert len({p["dedup_key"] for p in pieces}) == 3


@pytest.mark.parametrize("status", ["pending", "running", "failed"])
def test_no_second_recurring_job_while_one_is_open(app, db, schema, status):
    windowed_app(app, [Owner("acme")])
    app.plan()
    set_rows(db, schema, "status = 'completed'", "mode = 'initial'")
    set_rows(db, schema, "status = %s", "mode = 'recurring'", status)
    let_time_pass(db, schema, timedelta(hours=1))

    assert app.plan() == {"shops": 0}
    assert len(rows(db, schema, "mode = 'recurring'")) == 1

    # Once it is done, the next period gets its refresh.
    set_rows(db, schema, "status = 'completed'", "mode = 'recurring'")
    assert app.plan() == {"shops": 1}
    assert len(rows(db, schema, "mode = 'recurring'")) == 2


def test_a_snapshot_is_refreshed_once_per_period_after_its_first_load(app, db, schema):
    wait_until_away_from_a_period_edge(db, timedelta(hours=1))
    shops = app.queue("shops")
    shops.owners(lambda queue: [Owner("acme")])
    shops.snapshot("products", every=timedelta(hours=1))(lambda job: Page(None))

    assert app.plan() == {"shops": 1}
    set_rows(db, schema, "status = 'completed'", "TRUE")
    assert app.plan() == {"shops": 0}, "the first load covers its own period"

    let_time_pass(db, schema, timedelta(hours=1))
    assert app.plan() == {"shops": 1}
    assert app.plan() == {"shops": 0}, "a refresh is open"
    assert [r["mode"] for r in rows(db, schema)] == ["initial", "recurring"]


# -- the row is the truth: app.plan() reads the owners whose rows miss something ------------


HOUR = timedelta(hours=1)


def facts(db: psycopg.Connection, schema: str, owners: list[str]) -> dict[tuple[str, str], tuple]:
    """What the planner's read says per owner and type, and the database clock."""
    store = Store(schema)
    params = {
        "queue": "shops",
        "owners": owners,
        "types": ["orders", "products"],
        "windowed": [True, False],
    }
    with db.cursor(row_factory=dict_row) as cur:
        found = cur.execute(store.query("plan_read"), params).fetchall()
    fields = Existing.__dataclass_fields__
    return {
        (r["owner"], r["type"]): (Existing(**{k: r[k] for k in fields}), r["now"]) for r in found
    }


def test_a_plan_reads_exactly_the_owners_whose_history_misses_something(
    app, db, schema, monkeypatch
):
    """Lazy history: the comparison in SQL (unsettled_owners) names exactly the owners for
    which planning.settled fails on what plan_read reads: a history with fewer than `ahead`
    slices open, a histories row lost, or one that says another slice, another `ahead` or less
    history than the type; not one loading as it should, loaded, or cancelled."""
    wait_until_away_from_a_period_edge(db, EVERY)
    names = ["loading", "one-open", "row-deleted", "row-slice", "row-ahead", "row-shorter"]
    names += ["cancelled", "loaded"]
    shops = windowed_app(app, [Owner(n) for n in names], horizon=730 * DAY).catalog.get("shops")
    reads = owners_read(monkeypatch)
    assert app.plan() == {"shops": 3 * len(names)}
    histories = sql.Identifier(schema, "histories")
    changes = [
        ("DELETE FROM {jobs} WHERE owner = 'one-open' AND id = (SELECT min(id) FROM {jobs}"
         " WHERE owner = 'one-open' AND mode = 'initial')"),
        "DELETE FROM {histories} WHERE owner = 'row-deleted'",
        "UPDATE {histories} SET slice = interval '1 day' WHERE owner = 'row-slice'",
        "UPDATE {histories} SET ahead = 5 WHERE owner = 'row-ahead'",
        "UPDATE {histories} SET history_from = history_from + interval '1 day'"
        " WHERE owner = 'row-shorter'",
    ]  # fmt: skip
    for statement in changes:
        db.execute(sql.SQL(statement).format(jobs=jobs_table(schema), histories=histories))
    app.cancel("shops", "cancelled", "gone")
    while set_rows(
        db, schema, "status = 'completed'", f"owner = 'loaded' AND mode = 'initial' AND {OPENED}"
    ):
        pass
    found = facts(db, schema, names)
    unsettled = {
        owner
        for (owner, name), (existing, now) in found.items()
        if name == "orders"
        and not settled(shops.job_type(name), existing, marks(shops.job_type(name), now))
    }
    assert unsettled == {"one-open", "row-deleted", "row-slice", "row-ahead", "row-shorter"}

    reads.clear()
    assert app.plan() == {"shops": 1}  # the slice one-open lacks; the rows are written again
    assert set().union(*reads) == unsettled
    rewritten = db.execute(
        sql.SQL("SELECT count(DISTINCT (history_from, slice, ahead)), count(*) FROM {}").format(
            histories
        )
    ).fetchone()
    assert rewritten == (1, len(names))
    reads.clear()
    assert app.plan() == {"shops": 0}
    assert reads == []


def test_jobs_a_user_deleted_are_planned_again_by_the_next_plan(app, db, schema):
    wait_until_away_from_a_period_edge(db, EVERY)
    windowed_app(app, [Owner("acme")])
    app.plan()
    before = {(r["dedup_key"], r["window_start"]) for r in rows(db, schema)}
    oldest, refresh = "initial:" + iso(midnight(database_now(db)) - 60 * DAY), "recurring:%"
    db.execute(
        sql.SQL("DELETE FROM {} WHERE dedup_key = %s OR dedup_key LIKE %s").format(
            jobs_table(schema)
        ),
        [oldest, refresh],
    )

    assert app.plan() == {"shops": 2}
    assert {(r["dedup_key"], r["window_start"]) for r in rows(db, schema)} == before
    assert app.plan() == {"shops": 0}


def test_a_plan_reads_only_the_owners_whose_rows_miss_something_and_plans_them(
    app, db, schema, monkeypatch
):
    """Each owner below has its rows changed by hand the way a user fixes jobs with SQL; the
    next plan reads exactly the owners whose rows fail planning.settled, and plans for them what
    a full comparison plans."""
    wait_until_away_from_a_period_edge(db, EVERY)
    names = ["untouched", "refresh-deleted", "oldest-deleted", "refresh-moved-back"]
    names += ["blocked", "snapshot-deleted", "snapshot-old", "snapshot-open"]
    shops = windowed_app(app, [Owner(n) for n in names]).catalog.get("shops")
    shops.snapshot("products", every=HOUR)(lambda job: Page(None))
    reads = owners_read(monkeypatch)
    assert app.plan() == {"shops": 4 * len(names)}
    set_rows(db, schema, "status = 'completed'", "TRUE")
    assert app.plan() == {"shops": 0}

    today = midnight(database_now(db))
    # A refresh of the period before: it ended before this period began.
    back = database_now(db) - 20 * timedelta(minutes=1)
    earlier = f"recurring:{iso(period_start(back, EVERY))}"
    two_hours_ago = database_now(db) - 2 * HOUR
    changes = [
        ("DELETE FROM {} WHERE owner = 'refresh-deleted' AND mode = 'recurring'", []),
        ("DELETE FROM {} WHERE owner = 'oldest-deleted' AND window_start = %s", [today - 60 * DAY]),
        (
            "UPDATE {} SET window_start = %s, window_end = %s, dedup_key = %s "
            "WHERE owner = 'refresh-moved-back' AND mode = 'recurring'",
            [back - HOUR, back, earlier],
        ),
        (
            "UPDATE {} SET window_start = %s, window_end = %s, dedup_key = %s, "
            "status = 'pending' WHERE owner = 'blocked' AND mode = 'recurring'",
            [back - HOUR, back, earlier],
        ),
        ("DELETE FROM {} WHERE owner = 'snapshot-deleted' AND type = 'products'", []),
        (
            "UPDATE {} SET created_at = %s WHERE owner = 'snapshot-old' AND type = 'products'",
            [two_hours_ago],
        ),
        (
            "UPDATE {} SET created_at = %s, status = 'failed' "
            "WHERE owner = 'snapshot-open' AND type = 'products'",
            [two_hours_ago],
        ),
    ]
    for statement, params in changes:
        db.execute(sql.SQL(statement).format(jobs_table(schema)), params)
    found = facts(db, schema, names)
    unsettled = {
        owner
        for (owner, name), (existing, now) in found.items()
        if not settled(shops.job_type(name), existing, marks(shops.job_type(name), now))
    }
    assert unsettled == {
        "refresh-deleted",
        "oldest-deleted",
        "refresh-moved-back",
        "snapshot-deleted",
        "snapshot-old",
    }

    reads.clear()
    assert app.plan() == {"shops": 5}  # nothing for "blocked": its refresh is open
    assert set().union(*reads) == unsettled
    [moved_on] = rows(db, schema, "owner = 'refresh-moved-back' AND status = 'pending'")
    assert moved_on["window_start"] == max(back, today) - OVERLAP

    # Once the open refresh closes, the next plan adds the one it held back.
    set_rows(db, schema, "status = 'completed'", "owner = 'blocked'")
    reads.clear()
    assert app.plan() == {"shops": 1}
    assert set().union(*reads) == {"blocked"}
    reads.clear()
    assert app.plan() == {"shops": 0}
    assert reads == [], "with nothing new no owner is read"


def test_owners_deleted_from_the_owners_table_are_registered_again_with_nothing_added(
    app, db, schema
):
    windowed_app(app, [Owner("acme-us", lane="acme"), Owner("globex")])
    app.plan()
    owners = sql.Identifier(schema, "owners")
    db.execute(sql.SQL("DELETE FROM {}").format(owners))

    assert app.plan() == {"shops": 0}
    known = db.execute(sql.SQL("SELECT owner, lane, planned FROM {} ORDER BY owner").format(owners))
    assert known.fetchall() == [("acme-us", "acme", True), ("globex", "globex", True)]


# -- which owners -------------------------------------------------------------------------------


def test_plan_with_an_owner_object_plans_that_owner_now(app, db, schema):
    windowed_app(app, [Owner("acme-us", lane="acme"), Owner("globex")])

    assert app.plan("shops", Owner("new", lane="shared")) == {"shops": 3}

    planned = rows(db, schema)
    assert {(r["owner"], r["lane"]) for r in planned} == {("new", "shared")}


def test_plan_with_a_connected_owner_id_plans_only_that_owner(app, db, schema):
    windowed_app(app, [Owner("acme-us", lane="acme"), Owner("globex")])

    assert app.plan("shops", "acme-us") == {"shops": 3}

    assert {(r["owner"], r["lane"]) for r in rows(db, schema)} == {("acme-us", "acme")}


def test_planning_an_owner_the_source_does_not_return_creates_nothing(app, db, schema):
    windowed_app(app, [Owner("acme-us", lane="acme"), Owner("globex")])

    assert app.plan("shops", "gone") == {"shops": 0}
    assert count(db, schema) == 0


# -- configuration --------------------------------------------------------------------------------


def test_planning_a_queue_without_an_owner_source_names_the_decorator(app, db, schema):
    apps.products_queue(app)

    with pytest.raises(ConfigError, match=re.escape("@shops.owners")):
        app.plan("shops")
    with pytest.raises(ConfigError, match=re.escape("@shops.owners")):
        app.plan()
    assert count(db, schema) == 0


def test_planning_an_unknown_queue_or_type_is_a_config_error(app, db, schema):
    windowed_app(app, [Owner("acme")])

    with pytest.raises(ConfigError, match="'nope'"):
        app.plan("nope")
    with pytest.raises(ConfigError, match="'nope'"):
        app.plan("shops", type="nope")
    assert count(db, schema) == 0


def test_the_comparison_reads_each_owner_by_key_not_every_owner_of_the_queue(app, db, schema):
    """app.plan() compares a batch with the owners table by primary key, one lookup an owner:
    a plan that read the queue's whole owners table for every batch of 5,000 cost a read of the
    fleet per batch (at a million owners, 200 reads of a million rows)."""
    shops = windowed_app(app, [Owner("o1")], horizon=90 * DAY).catalog.get("shops")
    owners = sql.Identifier(schema, "owners")
    db.execute(
        sql.SQL(
            "INSERT INTO {} (queue, owner, lane, planned)"
            " SELECT 'shops', 'owner-' || n, 'owner-' || n, true FROM generate_series(1, 50000) n"
        ).format(owners)
    )
    db.execute(sql.SQL("ANALYZE {}").format(owners))
    batch = [f"owner-{n}" for n in range(1, 5001)]
    params = comparison_params(shops.job_type("orders"), database_now(db), batch)
    _, nodes = executed_plan(db, schema, "unsettled_owners", params)
    owner_reads = [n for n in nodes if n.get("Relation Name") == "owners"]
    assert owner_reads, "the comparison must look the batch up in the owners table"
    for read in owner_reads:
        assert read["Node Type"] in ("Index Scan", "Index Only Scan"), read
        # one row a lookup, not the fleet filtered
        assert read["Actual Rows"] <= 1, read


@pytest.mark.parametrize("statement", ["plan_read", "admit_owners", "mark_planned"])
def test_the_first_plan_reads_each_owner_of_a_batch_by_key_not_every_owner(
    app, db, schema, statement
):
    """The first plan's statements look a batch of 5,000 owners up in the owners, histories,
    jobs and lanes tables one key at a time. Joined to the batch as tables, PostgreSQL hashed
    the queue's whole owners table (and histories, and every open job) for every batch: a
    million owners' first plan grew from 0.2 s to 0.9 s a batch (plan_read) and 0.2 s to 0.5 s
    (admit_owners) as the tables filled."""
    owners = sql.Identifier(schema, "owners")
    histories = sql.Identifier(schema, "histories")
    db.execute(
        sql.SQL(
            "INSERT INTO {} (queue, owner, lane, planned)"
            " SELECT 'shops', 'owner-' || n, 'owner-' || n, n > 5000"
            " FROM generate_series(1, 50000) n"
        ).format(owners)
    )
    db.execute(
        sql.SQL(
            "INSERT INTO {} (queue, owner, type, history_from, slice, ahead)"
            " SELECT 'shops', 'owner-' || n, 'orders', now() - interval '2 years', '30 days', 2"
            " FROM generate_series(1, 50000) n"
        ).format(histories)
    )
    jobs = sql.Identifier(schema, "jobs")
    db.execute(
        sql.SQL(
            "INSERT INTO {} (queue, owner, lane, type, mode, dedup_key)"
            " SELECT 'shops', 'owner-' || n, 'owner-' || n, 'orders', 'recurring', 'k'"
            " FROM generate_series(1, 50000) n"
        ).format(jobs)
    )
    for name in (owners, histories, jobs):
        db.execute(sql.SQL("ANALYZE {}").format(name))
    batch = [f"owner-{n}" for n in range(1, 5001)]
    params = {
        "queue": "shops",
        "owners": batch,
        # the owners stay in their lanes (the first plan's case: nothing moves); admit_owners
        # looks their open jobs up all the same
        "lanes": batch,
        "types": ["orders"],
        "windowed": [True],
    }
    _, nodes = executed_plan(db, schema, statement, params)
    reads = [
        n
        for n in nodes
        if n.get("Relation Name") in ("owners", "histories", "jobs", "lanes")
        and n["Node Type"] != "ModifyTable"
        and n["Actual Loops"] > 0  # what did not run (the move of re-laned owners' jobs)
    ]
    assert reads, f"{statement} must look the batch up"
    for read in reads:
        assert read["Node Type"] in (
            "Index Scan",
            "Index Only Scan",
            "Bitmap Heap Scan",
            "Tid Scan",
        ), {key: read.get(key) for key in ("Relation Name", "Actual Rows", "Actual Loops")}
        # one row a lookup (a ScalarArrayOp's scan returns the batch), never the table filtered
        assert read["Actual Rows"] <= len(batch), read
        # a lookup may pass over an owner's own rows, never over the fleet's
        assert read.get("Rows Removed by Filter", 0) <= read["Actual Loops"], read
