"""The SQL of docs/operations.md does what the page says: retention deletes only rows nothing
reads, the watch queries find what they are for, and each fix changes the job it names and
nothing once the job moved on. (Its roles and grants: tests/test_security.py.)"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest
from apps import orders_and_products
from psycopg import sql
from psycopg.rows import dict_row
from workers import database_now, job_row, operations_sql, operations_statements

from synclane import Job, Owner, Page, SyncLane, Throttled

DAY = timedelta(days=1)


def run(db: psycopg.Connection[Any], name: str, schema: str, **words: str) -> list[dict[str, Any]]:
    """One statement of the page on this test's schema; its rows, or [{'rowcount': n}]."""
    with db.cursor(row_factory=dict_row) as cur:
        cur.execute(operations_sql(name, schema, **words))  # type: ignore[arg-type]
        if cur.description is None:
            return [{"rowcount": cur.rowcount}]
        return cur.fetchall()


def update(db: psycopg.Connection[Any], schema: str, job_id: int, **values: Any) -> None:
    assignments = sql.SQL(", ").join(
        sql.SQL("{} = {}").format(sql.Identifier(column), sql.Literal(value))
        if not isinstance(value, sql.Composable)
        else sql.SQL("{} = {}").format(sql.Identifier(column), value)
        for column, value in values.items()
    )
    db.execute(
        sql.SQL("UPDATE {} SET {} WHERE id = %s").format(
            sql.Identifier(schema, "jobs"), assignments
        ),
        [job_id],
    )


def ids(db: psycopg.Connection[Any], schema: str, where: str = "true") -> set[int]:
    query = sql.SQL("SELECT id FROM {} WHERE " + where).format(sql.Identifier(schema, "jobs"))
    return {row[0] for row in db.execute(query).fetchall()}


def ago(days: int) -> sql.Composable:
    return sql.SQL("now() - {}::interval").format(sql.Literal(f"{days} days"))


@pytest.fixture
def shop(app: SyncLane) -> SyncLane:
    orders_and_products(app, [Owner("acme")], horizon=60 * DAY, every=DAY)
    return app


def _insert_old(
    db: psycopg.Connection[Any], schema: str, **row: Any
) -> int:  # a finished job of long ago, as the table would hold it
    columns = {
        "queue": "shops",
        "owner": "acme",
        "lane": "acme",
        "status": "completed",
        **row,
    }
    found = db.execute(
        sql.SQL("INSERT INTO {} ({}) VALUES ({}) RETURNING id").format(
            sql.Identifier(schema, "jobs"),
            sql.SQL(", ").join(map(sql.Identifier, columns)),
            sql.SQL(", ").join(
                v if isinstance(v, sql.Composable) else sql.Literal(v) for v in columns.values()
            ),
        )
    ).fetchone()
    assert found is not None
    return int(found[0])


def test_retention_deletes_old_refreshes_and_keeps_what_planning_reads(
    shop: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    shop.plan()  # two history slices and a refresh of orders, the first load of products
    planned = ids(db, schema)
    # Everything finished long ago; the account was away (its newest refresh is old too).
    db.execute(
        sql.SQL(
            "UPDATE {} SET status = 'completed', completed_at = now() - interval '200 days'"
        ).format(sql.Identifier(schema, "jobs"))
    )
    old: list[int] = []
    for number in range(1, 4):  # older refreshes of both types, and a manual job
        start = sql.SQL("now() - {}::interval").format(sql.Literal(f"{300 - number} days"))
        old.append(
            _insert_old(
                db,
                schema,
                type="orders",
                mode="recurring",
                dedup_key=f"recurring:old-{number}",
                window_start=start,
                window_end=sql.SQL("now() - {}::interval").format(
                    sql.Literal(f"{299 - number} days")
                ),
                completed_at=ago(250),
                created_at=ago(250),
            )
        )
        old.append(
            _insert_old(
                db,
                schema,
                type="products",
                mode="recurring" if number < 3 else "manual",
                dedup_key=f"recurring:old-{number}",
                completed_at=ago(250 + number),
                created_at=ago(250 + number),
            )
        )
    keep = {
        "recent": _insert_old(
            db,
            schema,
            type="products",
            mode="recurring",
            dedup_key="recurring:recent",
            completed_at=ago(10),
            created_at=ago(300),
        ),
        "failed": _insert_old(
            db,
            schema,
            type="products",
            mode="recurring",
            dedup_key="recurring:failed",
            status="failed",
            created_at=ago(400),
        ),
        "abandoned": _insert_old(
            db,
            schema,
            type="products",
            mode="recurring",
            dedup_key="recurring:abandoned",
            status="abandoned",
            completed_at=ago(400),
            created_at=ago(400),
        ),
    }
    assert shop.plan() == {"shops": 0}  # refreshes are blocked by the failed one: no new rows

    assert run(db, "retention", schema) == [{"rowcount": len(old)}]
    assert run(db, "retention", schema) == [{"rowcount": 0}]  # run until it deletes none
    assert ids(db, schema) == planned | set(keep.values())
    # Planning reads the same: nothing new to plan, no history to load again.
    db.execute(
        sql.SQL("DELETE FROM {} WHERE id = %s").format(sql.Identifier(schema, "jobs")),
        [keep["failed"]],
    )
    added = shop.plan()["shops"]
    new = ids(db, schema) - planned - set(keep.values())
    assert added == len(new)
    modes = {
        job_row(db, schema, job_id)["mode"] + ":" + job_row(db, schema, job_id)["type"]
        for job_id in new
    }
    assert "initial:orders" not in modes and "initial:products" not in modes


def test_retention_without_the_guard_would_reload_coverage(
    shop: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    """The control: a plain age-based delete removes the newest refresh of an account that was
    away, and the planner starts the next refresh from further back."""
    shop.plan()
    db.execute(
        sql.SQL(
            "UPDATE {} SET status = 'completed', completed_at = now() - interval '200 days'"
        ).format(sql.Identifier(schema, "jobs"))
    )
    guarded_keeps = ids(db, schema)
    assert run(db, "retention", schema) == [{"rowcount": 0}]
    assert ids(db, schema) == guarded_keeps
    db.execute(
        sql.SQL(
            "DELETE FROM {} WHERE mode = 'recurring' AND completed_at < now() - interval '90 days'"
        ).format(sql.Identifier(schema, "jobs"))
    )
    assert shop.plan() == {"shops": 1}, "the naive delete made the planner add a refresh again"


def test_forgetting_an_account_keeps_its_open_jobs(
    shop: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    shop.plan()
    running = min(ids(db, schema))
    update(db, schema, running, status="running", lease_token=sql.SQL("gen_random_uuid()"))
    shop.cancel("shops", "acme", "left")
    assert run(db, "forget_owner", schema, **{"acme-us": "acme"}) == [{"rowcount": 3}]
    assert ids(db, schema) == {running}, "a job whose worker has not noticed the cancel stays"


def test_the_watch_queries_find_what_they_are_for(
    shop: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    shop.plan()
    orders = sorted(ids(db, schema, "type = 'orders'"))
    products = ids(db, schema, "type = 'products'").pop()
    update(
        db,
        schema,
        orders[0],
        status="running",
        leased_by="dead",
        lease_token=sql.SQL("gen_random_uuid()"),
        started_at=ago(1),
        lease_expires_at=sql.SQL("now() - interval '5 minutes'"),
    )
    update(db, schema, orders[1], status="abandoned", error="RuntimeError: gone")
    update(
        db,
        schema,
        products,
        status="failed",
        error="Throttled: slow down",
        next_run_at=sql.SQL("now() + interval '1 hour'"),
    )

    expired = run(db, "watch_expired", schema)
    assert [(r["queue"], r["jobs"]) for r in expired] == [("shops", 1)]
    long = run(db, "watch_long", schema)
    assert [(r["id"], r["leased_by"]) for r in long] == [(orders[0], "dead")]
    stopped = run(db, "watch_stopped", schema)
    assert {(r["status"], r["jobs"]) for r in stopped} == {("abandoned", 1), ("failed", 1)}
    depth = {r["lane"]: r for r in run(db, "watch_depth", schema)}
    assert depth["acme"]["open"] == 3 and depth["acme"]["due"] == 1  # the refresh
    assert depth["acme"]["throttled_until"] is not None


def test_the_histories_queries_find_a_stalled_history_and_restore_a_deleted_row(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    orders_and_products(app, [Owner("acme-us"), Owner("globex")], horizon=730 * DAY, every=DAY)
    app.plan()
    histories = sql.Identifier(schema, "histories")
    (recorded,) = db.execute(
        sql.SQL("SELECT * FROM {} WHERE owner = 'acme-us'").format(histories)
    ).fetchall()
    # globex's two open slices finish while a transaction holds its row: nothing is topped up.
    with psycopg.connect(app.dsn) as holder:
        holder.execute(
            sql.SQL("SELECT * FROM {} WHERE owner = 'globex' FOR UPDATE").format(histories)
        )
        db.execute(
            sql.SQL(
                "UPDATE {} SET status = 'completed' WHERE owner = 'globex' AND mode = 'initial'"
            ).format(sql.Identifier(schema, "jobs"))
        )
    loading = {r["owner"]: r for r in run(db, "watch_histories", schema)}
    assert (loading["acme-us"]["open"], loading["acme-us"]["to_plan"]) == (2, 23)
    assert (loading["globex"]["open"], loading["globex"]["to_plan"]) == (0, 23)
    assert list(loading) == ["globex", "acme-us"], "the stalled one first"

    db.execute(sql.SQL("DELETE FROM {} WHERE owner = 'acme-us'").format(histories))
    assert run(db, "restore_history", schema) == [{"rowcount": 1}]
    restored = db.execute(
        sql.SQL("SELECT * FROM {} WHERE owner = 'acme-us'").format(histories)
    ).fetchall()
    assert restored == [recorded]
    assert app.plan() == {"shops": 2}, "the stalled history is topped up by the next plan"


@pytest.mark.parametrize(
    ("fix", "before", "after", "words"),
    [
        (
            "fix_expire",
            {"status": "running", "leased_by": "host-7:1234"},
            {"status": "running"},
            {},
        ),
        (
            "fix_requeue",
            {"status": "abandoned", "error": "RuntimeError: x", "attempt_count": 6},
            {"status": "pending", "error": None, "attempt_count": 0},
            {},
        ),
        (
            "fix_skip_page",
            {"status": "deferred", "cursor": "page-7", "attempt_count": 5},
            {"status": "pending", "cursor": "page-8", "attempt_count": 0},
            {},
        ),
        (
            "fix_complete",
            {"status": "failed", "error": "RuntimeError: x"},
            {"status": "completed", "error": None},
            {},
        ),
    ],
)
def test_a_fix_changes_the_job_it_names_and_nothing_once_it_moved_on(
    shop: SyncLane,
    db: psycopg.Connection[Any],
    schema: str,
    fix: str,
    before: dict[str, Any],
    after: dict[str, Any],
    words: dict[str, str],
) -> None:
    shop.plan()
    job_id, other = sorted(ids(db, schema, "type = 'orders'"))[:2]
    extra = {"lease_token": sql.SQL("gen_random_uuid()")} if "leased_by" in before else {}
    update(db, schema, job_id, **before, **extra)
    update(db, schema, other, lane="elsewhere", **before, **extra)  # the same state, not named
    untouched = job_row(db, schema, other)
    assert run(db, fix, schema, **{"id = 42": f"id = {job_id}"}) == [{"rowcount": 1}]
    row = job_row(db, schema, job_id)
    for column, value in after.items():
        assert row[column] == value
    assert job_row(db, schema, other) == untouched
    if fix == "fix_expire":
        assert row["lease_expires_at"] <= database_now(db)
        update(db, schema, job_id, status="failed", leased_by=None)  # reclaimed meanwhile
    # The job moved on (a worker took it): the same statement changes nothing.
    update(db, schema, job_id, status="running", cursor="page-9", leased_by="host-8:1")
    assert run(db, fix, schema, **{"id = 42": f"id = {job_id}"}) == [{"rowcount": 0}]


def test_unthrottling_a_lane_makes_its_jobs_due_now(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    queue = app.queue("shops", throttle_base_delay=3600, throttle_max_delay=3600)
    told: list[int] = []

    @queue.snapshot("products", every=DAY)
    def products(job: Job) -> Page:
        if not told:
            told.append(job.id)
            raise Throttled()  # the lane pauses for an hour
        return Page(None)

    first = app.enqueue("shops", "acme-us", "products", lane="acme")
    second = app.enqueue("shops", "acme-eu", "products", lane="acme")
    assert app.run_worker(until_idle=True, stop_after=10) == {"throttled": 1}
    assert run(db, "fix_unthrottle", schema) == [{"rowcount": 2}]
    # The lane's own pause ends too: a job that joins it afterwards is due at once.
    third = app.enqueue("shops", "acme-ca", "products", lane="acme")
    assert app.run_worker(until_idle=True, stop_after=10) == {"completed": 3}
    assert {job_row(db, schema, j)["status"] for j in (first, second, third)} == {"completed"}


def test_every_statement_of_the_page_is_one_of_those_tested_here_or_in_test_security() -> None:
    names = operations_statements()
    tested = {
        "grants": "test_security",
        "retention": "retention",
        "forget_owner": "forgetting",
        "watch_expired": "watch",
        "watch_long": "watch",
        "watch_stopped": "watch",
        "watch_depth": "watch",
        "watch_workers": "test_workers_list: the killed worker",
        "fix_expire": "a_fix",
        "fix_requeue": "a_fix",
        "fix_skip_page": "a_fix",
        "fix_complete": "a_fix",
        "fix_unthrottle": "unthrottling",
        "upgrade_4": "test_table: the documented index drop before a migration",
        "hidden_jobs": "test_lane_hints: a hidden job is listed until a worker mends its lane",
        "watch_histories": "histories",
        "restore_history": "histories",
    }
    assert sorted(names) == sorted(tested)
