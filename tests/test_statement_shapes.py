"""No statement synclane sends has the shape that crashes PostgreSQL (docs/reliability.md, "A
PostgreSQL crash that synclane's statements reached").

When a row an UPDATE, DELETE or SELECT … FOR UPDATE wants was changed by a transaction that
committed meanwhile, READ COMMITTED rechecks the newer row (EvalPlanQual). The recheck runs the
part of the plan under the ModifyTable or LockRows node again; an InitPlan nested in a SubPlan
there, which the statement itself never needed before the recheck, is handed to the second
recheck as a NULL pointer, and the server process dies with signal 11 (PostgreSQL 15.20 and 18.6,
with the reproducer in docs/reliability.md). These tests read the generic plan of every statement,
as a worker's connection runs it, and refuse that shape anywhere a recheck can reach."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from synclane import SyncLane
from synclane.store import QUERIES, WORKER_SESSION, Store

# Parameters PostgreSQL cannot type from their context alone (the driver sends them typed).
INTERVALS = {"lease", "delay", "older_than", "horizon", "every", "recent", "forget_after"}


def _fill(db: psycopg.Connection[Any], schema: str) -> None:
    """Enough rows over enough lanes that the planner picks the plans a real table gets."""
    jobs = sql.Identifier(schema, "jobs")
    db.execute(
        sql.SQL(
            "INSERT INTO {} (queue, owner, lane, type, mode, dedup_key, window_start, window_end)"
            " SELECT 'q', 'o' || n % 2000, 'l' || n % 2000, 't', 'initial', 'k' || n,"
            " timestamptz '2026-01-01' - n * interval '1 day',"
            " timestamptz '2026-01-02' - n * interval '1 day'"
            " FROM generate_series(1, 4000) n"
        ).format(jobs)
    )
    db.execute(Store(schema).query("mend_lanes"), {"queue": "q", "lane_width": 1, "limit": 5000})
    for table in ("jobs", "lanes", "lane_wakes"):
        db.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(schema, table)))


def _plan(conn: psycopg.Connection[Any], store: Store, name: str) -> dict[str, Any]:
    """The generic plan of statement `name`, prepared as a worker prepares it."""
    query, names = store.positional(name)
    # the bytes sent, or (a statement with an ellipsis in its text) the composed statement
    body = sql.SQL(query.decode()) if isinstance(query, bytes) else query
    arguments = ", ".join("NULL" for _ in names)
    for typed in (set(), INTERVALS):
        types = ", ".join("interval" if n in typed else "unknown" for n in names)
        conn.execute("DEALLOCATE ALL")
        try:
            with conn.transaction():
                conn.execute(
                    sql.SQL("PREPARE probe" + (f" ({types})" if names else "") + " AS ") + body
                )
        except psycopg.errors.DatabaseError:
            if typed:
                raise
            continue
        execute = f"EXECUTE probe({arguments})" if names else "EXECUTE probe"
        (plan,) = conn.execute(f"EXPLAIN (FORMAT JSON) {execute}").fetchone()  # type: ignore[misc]
        return plan[0]["Plan"]  # type: ignore[no-any-return]
    raise AssertionError("unreachable")


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def rechecked_initplans(plan: dict[str, Any]) -> list[str]:
    """The InitPlans nested in a SubPlan under a ModifyTable or LockRows node: what a recheck
    runs again. A CTE's own plan is not run again by a recheck (it is read from its result), so
    a CTE is looked at only for its own ModifyTable or LockRows nodes."""
    found = []

    def walk(node: dict[str, Any], in_subplan: bool) -> None:
        for child in node.get("Plans", []):
            if child.get("Subplan Name", "").startswith("CTE "):
                continue
            relation = child.get("Parent Relationship")
            if relation == "InitPlan" and in_subplan:
                found.append(child.get("Subplan Name", "?"))
            walk(child, in_subplan or relation == "SubPlan")

    for node in _nodes(plan):
        if node["Node Type"] in ("ModifyTable", "LockRows"):
            walk(node, False)
    return found


@pytest.fixture(scope="module")
def plans(dsn: str) -> Iterator[dict[str, dict[str, Any]]]:
    # a schema of this module's own in each test process (several may run the module at once)
    schema = "shapes_" + uuid.uuid4().hex[:12]
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        SyncLane(dsn, schema=schema).close()
        try:
            _fill(db, schema)
            store = Store(schema)
            with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
                for setting in WORKER_SESSION:
                    conn.execute(setting)
                yield {name: _plan(conn, store, name) for name in sorted(QUERIES)}
        finally:
            db.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def test_the_shape_is_found_in_the_statement_that_crashed_the_server(dsn: str) -> None:
    """The check itself: version 4's completion un-parked its lanes with an UPDATE whose SET
    held such an InitPlan (ARRAY(SELECT id FROM taken) inside the CASE's subquery)."""
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
        conn.execute("CREATE TEMP TABLE items (id int PRIMARY KEY, grp text, v int)")
        conn.execute("CREATE TEMP TABLE groups (grp text PRIMARY KEY, hint int)")
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(
            "PREPARE crash AS UPDATE groups g SET hint = CASE WHEN g.hint IS NULL THEN"
            " (SELECT min(i.v) FROM items i WHERE i.grp = g.grp"
            "  AND i.id <> ALL (ARRAY(SELECT 1))) ELSE g.hint END"
        )
        (plan,) = conn.execute("EXPLAIN (FORMAT JSON) EXECUTE crash").fetchone()  # type: ignore[misc]
    assert rechecked_initplans(plan[0]["Plan"])


def test_no_statement_nests_an_initplan_in_a_subplan_that_a_recheck_runs(
    plans: dict[str, dict[str, Any]],
) -> None:
    shaped = {name: found for name, plan in plans.items() if (found := rechecked_initplans(plan))}
    assert shaped == {}


def test_every_statement_is_checked(plans: dict[str, dict[str, Any]]) -> None:
    assert set(plans) == set(QUERIES)
