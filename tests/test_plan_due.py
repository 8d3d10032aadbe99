"""app.plan_due(): what an orchestrator's schedule runs (issue 30). A planning round of each
queue, as a running worker makes every plan_interval: the owner source is read when the queue's
owners_interval has passed, and otherwise only the types whose period began are planned, so a
schedule's cost follows what is due, not the fleet. app.plan() stays the exact difference."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
from history import jobs

from synclane import Owner, Page
from synclane.testing import make_app

DAY = timedelta(days=1)


def test_planning_what_is_due_reads_the_owner_source_only_when_its_interval_has_passed(
    dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    """The first plan_due of a new table reads the owners and plans what app.plan would; the
    next one, within owners_interval, reads no owner source and adds nothing. An owner that
    the source starts naming meanwhile waits for the next reconciliation, or for app.plan."""
    app = make_app(dsn, schema)
    shops = app.queue("shops", owners_interval=3600)
    named = ["acme", "globex"]
    reads: list[int] = []

    @shops.owners
    def connected(queue: str) -> list[Owner]:
        reads.append(1)
        return [Owner(name) for name in named]

    shops.windowed("orders", horizon=60 * DAY, slice=30 * DAY, every=timedelta(minutes=15))(
        lambda job: Page(None)
    )
    shops.snapshot("products", every=DAY)(lambda job: Page(None))

    assert app.plan_due() == {"shops": 8}  # two slices, a refresh and a snapshot per owner
    assert len(reads) == 1
    assert app.plan_due("shops") == {"shops": 0}
    assert len(reads) == 1  # nothing was due: the source was not asked
    named.append("initech")
    assert app.plan_due() == {"shops": 0}
    assert {row["owner"] for row in jobs(db, schema)} == {"acme", "globex"}
    assert app.plan("shops") == {"shops": 4}  # the exact difference, owner source read
    assert {row["owner"] for row in jobs(db, schema)} == {"acme", "globex", "initech"}
    app.close()


def test_planning_what_is_due_skips_a_queue_that_another_process_is_planning(
    dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    """Two schedules (or a schedule and a worker) never plan one queue at once: the one that
    finds the queue's planning lease taken adds nothing and says 0."""
    app = make_app(dsn, schema)
    shops = app.queue("shops")
    shops.owners(lambda queue: [Owner("acme")])
    shops.snapshot("products", every=DAY)(lambda job: Page(None))
    app.migrate()
    other = make_app(dsn, schema)
    other.queue("shops").owners(lambda queue: [Owner("acme")])
    held: list[dict[str, int]] = []

    def source_that_plans_meanwhile(queue: str) -> list[Owner]:
        held.append(app.plan_due("shops"))  # while `other` holds the lease
        return [Owner("acme")]

    other_queue = other.get_queue("shops")
    other_queue.owner_source = source_that_plans_meanwhile
    other_queue.snapshot("products", every=DAY)(lambda job: Page(None))
    assert other.plan_due("shops") == {"shops": 1}
    assert held == [{"shops": 0}]
    assert len(jobs(db, schema)) == 1
    other.close()
    app.close()
