"""What the planner's tests share: the owners each planning transaction reads, the parameters of
the comparison (`unsettled_owners`) for one windowed type, and a statement's executed plan."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

import synclane.batches
from synclane.model import JobType
from synclane.planning import marks, midnight
from synclane.store import Store

DAY = timedelta(days=1)


def owners_read(monkeypatch: pytest.MonkeyPatch) -> list[set[str]]:
    """The owners each planning transaction reads (`plan_read`), one set per batch."""
    reads: list[set[str]] = []
    read_and_insert = synclane.batches.read_and_insert

    def spy(queue, owners, types, horizon):  # type: ignore[no-untyped-def]
        reads.append({o.id for o in owners})
        return read_and_insert(queue, owners, types, horizon)

    monkeypatch.setattr(synclane.batches, "read_and_insert", spy)
    return reads


def comparison_params(
    job_type: JobType, now: datetime, names: list[str], *, mark: bool = False, ahead: int = 2
) -> dict[str, Any]:
    """`unsettled_owners`' parameters for `names` (each in a lane of its own name) and one
    windowed type; with `mark`, the settled marks are written as app.plan() writes them."""
    bounds = marks(job_type, now, None, ahead)
    return {
        "queue": "shops",
        "owners": names,
        "lanes": names,
        "types": [job_type.name],
        "windowed": [True],
        "history_from": [bounds.history_from],
        "period_from": [bounds.period_from],
        "period_to": [bounds.period_to],
        "covered_to": [bounds.covered_to],
        "slices": [bounds.slice],
        "aheads": [bounds.ahead],
        "settled_by": synclane.batches.settled_by([job_type], ahead) if mark else None,
        "mark": mark,
        "midnight": midnight(now) + DAY,
    }


def executed_plan(
    db: psycopg.Connection[Any], schema: str, statement: str, params: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run synclane's `statement` under EXPLAIN ANALYZE: its plan's top node, and every node."""
    explain = sql.SQL("EXPLAIN (ANALYZE, COSTS OFF, FORMAT JSON) " + Store(schema).text(statement))
    row = db.execute(explain, params).fetchone()
    assert row is not None
    top: dict[str, Any] = row[0][0]["Plan"]

    def nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
        return [node] + [n for child in node.get("Plans", []) for n in nodes(child)]

    return top, nodes(top)
