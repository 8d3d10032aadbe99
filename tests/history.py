"""Tables arranged as a planner and a fleet of workers would have left them after days of work,
for the retention tests (tests/test_prune.py) and the lost-answer tests that prune."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from workers import let_time_pass

from synclane import Owner, Page, SyncLane

DAY = timedelta(days=1)
HOUR = timedelta(hours=1)


def jobs(db: psycopg.Connection[Any], schema: str, where: str = "TRUE") -> list[dict[str, Any]]:
    query = sql.SQL("SELECT * FROM {} WHERE {} ORDER BY id").format(
        sql.Identifier(schema, "jobs"), sql.SQL(where)
    )
    with db.cursor(row_factory=dict_row) as cur:
        return cur.execute(query).fetchall()


def set_rows(db: psycopg.Connection[Any], schema: str, assignments: str, where: str) -> int:
    """UPDATE the schema's jobs; {jobs} in `where` names the table too."""
    table = sql.Identifier(schema, "jobs")
    query = sql.SQL("UPDATE {} SET {} WHERE {}").format(
        table, sql.SQL(assignments), sql.SQL(where).format(jobs=table)
    )
    return db.execute(query).rowcount


def away_from_the_hour(db: psycopg.Connection[Any]) -> None:
    """Start when a minute or more is left in the hour: a planner that crossed into the next
    hour would rightly add that hour's refreshes, and the checks below would count them."""
    row = db.execute("SELECT 3600 - extract(epoch FROM now())::numeric % 3600").fetchone()
    assert row is not None
    if row[0] < 60:
        time.sleep(float(row[0]) + 1)


def declare(app: SyncLane, **settings: Any) -> SyncLane:
    shops = app.queue("shops", owners_interval=3600, **settings)
    shops.owners(lambda queue: [Owner("acme"), Owner("globex", lane="g")])
    shops.windowed(
        "orders", horizon=60 * DAY, slice=30 * DAY, every=HOUR, overlap=timedelta(minutes=5)
    )(lambda job: Page(None))
    shops.snapshot("products", every=HOUR)(lambda job: Page(None))
    return app


def two_days_of_refreshes(app: SyncLane, db: psycopg.Connection[Any], schema: str) -> None:
    """48 hours of hourly refreshes, as the planner made them: most completed, one cancelled, a
    manual reload of an hour, a failure waiting for its retry, one abandoned, history open."""
    app.plan()
    away_from_the_hour(db)
    done = "status = 'completed', completed_at = now()"
    set_rows(db, schema, done, "mode = 'initial' AND owner = 'acme'")
    for hour in range(48):
        finished = "cancelled" if hour == 10 else "completed"
        set_rows(
            db,
            schema,
            f"status = '{finished}', completed_at = now(), processed_count = {hour + 1}",
            "mode = 'recurring' AND status = 'pending'",
        )
        if hour == 20:
            end = jobs(db, schema, "mode = 'recurring'")[-1]["window_end"]
            manual = app.enqueue("shops", "acme", "orders", window_start=end - HOUR, window_end=end)
            set_rows(db, schema, done, f"id = {manual}")
        let_time_pass(db, schema, HOUR)
        app.plan()
    first_refresh = (
        "id = (SELECT min(id) FROM {jobs} WHERE mode = 'recurring' AND owner = 'globex')"
    )
    set_rows(db, schema, "status = 'abandoned', error = 'Abandon: gone'", first_refresh)
    snapshot = "id = (SELECT max(id) FROM {jobs} WHERE owner = 'globex' AND type = 'products')"
    set_rows(db, schema, "status = 'failed', error = 'RuntimeError: 503'", snapshot)
