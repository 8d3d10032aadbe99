"""Planning with `app.plan()`: the first plan, then re-plans with nothing new.

    python -m bench.plan [--owners 10000] [--history 1000000] [--against COMMIT]

`app.plan()` compares every owner the source names (a worker's own planning round reads only
what is due: bench/scale.py measures that). The type is windowed with a 730-day horizon and
30-day slices (25 slices an owner) and a 15-minute refresh. With nothing new the re-plan reads the
owner source, compares it with the owners table and the owners' rows in one statement per batch,
and reads no owner's rows into Python (issue 30): its cost on top of reading the source must stay
under a second at 100,000 owners, grow no faster than the owners, and not grow with finished
history. It is measured on the fresh plan (since schema 6 each history's newest two slices are
open and the rest still to plan: lazy history), then again once every history is loaded (every
slice a completed row, as workers would have left it) and `--history` more completed rows
(months of past refreshes) were added.

`--against COMMIT` runs the same measurement of that commit (its files from `git archive`, its own
bench/plan.py) and of this code, one after the other in one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

from bench.common import bench_dsn, fresh_schema, timed
from synclane import Owner, Page, SyncLane
from synclane.batches import BATCH
from synclane.owners import owner_batches

HISTORY = """
INSERT INTO {jobs} (queue, owner, lane, type, mode, status, window_start, window_end, dedup_key,
                    completed_at)
SELECT 'shops', 'owner-' || (n %% %(owners)s), 'owner-' || (n %% %(owners)s), 'orders',
       'recurring', 'completed',
       timestamptz '2026-06-01' + n * interval '1 second',
       timestamptz '2026-06-01' + (n + 1) * interval '1 second',
       'recurring:old:' || n, now()
FROM generate_series(1, %(rows)s) n
"""


# The slices of each history not planned yet, as completed rows: what the database's top-ups
# would have added as the workers loaded it (schema 6; nothing to add for an older schema)
LOADED = """
INSERT INTO {schema}.jobs (queue, owner, lane, type, mode, status, window_start, window_end,
                           dedup_key, completed_at)
SELECT h.queue, h.owner, h.owner, h.type, 'initial', 'completed', s.start,
       o.window_start - (n - 1) * h.slice, {schema}.initial_key(s.start),
       now()
FROM {schema}.histories h
CROSS JOIN LATERAL (
    SELECT j.window_start FROM {schema}.jobs j
    WHERE j.queue = h.queue AND j.owner = h.owner AND j.type = h.type AND j.mode = 'initial'
      AND j.window_end IS NOT NULL
    ORDER BY j.window_end LIMIT 1
) AS o
CROSS JOIN LATERAL generate_series(
    1, {schema}.slices_to_plan(h.queue, h.owner, h.type, o.window_start)::int) AS n
CROSS JOIN LATERAL (
    SELECT greatest(o.window_start - n * h.slice, h.history_from) AS start
) AS s
"""


def build(dsn: str, schema: str, owners: int) -> SyncLane:
    app = SyncLane(dsn, schema=schema)
    shops = app.queue("shops")
    shops.owners(lambda queue: [Owner(f"owner-{n}") for n in range(owners)])

    @shops.windowed(
        "orders",
        horizon=timedelta(days=730),
        slice=timedelta(days=30),
        every=timedelta(minutes=15),
        overlap=timedelta(minutes=5),
    )
    def orders(job: Any) -> Page:
        return Page(None, 0)

    return app


GOAL = "goal < 1 s at 100,000 owners"


def source_read(app: SyncLane, rounds: int = 5) -> float:
    """Median seconds of reading the queue's owner source alone, as the planner reads it."""
    queue = app.catalog.get("shops")
    times = []
    for _ in range(rounds):
        elapsed, _ = timed(lambda: sum(len(b) for b in owner_batches(queue, 60.0, BATCH)))
        times.append(elapsed)
    return statistics.median(times)


def replan(app: SyncLane, rounds: int = 5) -> tuple[float, int]:
    """Median seconds of `rounds` re-plans after one untimed plan (which adds the refreshes of a
    period that began since the last plan, if one did), and the rows the timed ones added."""
    app.plan()
    times, added = [], 0
    for _ in range(rounds):
        elapsed, result = timed(app.plan)
        times.append(elapsed)
        added += result["shops"]
    return statistics.median(times), added


def nothing_new(label: str, again: float, source: float, added: int) -> str:
    return (
        f"{label}: median {again * 1000:.0f} ms, {again * 1000 - source * 1000:.0f} ms on top of "
        f"reading the source ({GOAL}), {added} rows"
    )


def main(owners: int = 10_000, history: int = 1_000_000) -> list[str]:
    dsn = bench_dsn()
    lines = []
    with fresh_schema(dsn) as schema:
        app = build(dsn, schema, owners)
        first, result = timed(app.plan)
        lines.append(f"first plan, {owners:,} owners: {first:.2f} s, {result['shops']:,} rows")
        source = source_read(app)
        lines.append(f"reading the owner source alone: median {source * 1000:.0f} ms")
        again, added = replan(app)
        lines.append(nothing_new(f"re-plan, nothing new, {owners:,} owners", again, source, added))
        jobs = sql.Identifier(schema, "jobs")
        with psycopg.connect(dsn, autocommit=True) as conn:
            # Every history loaded, as workers would have left it (their top-ups are arranged
            # here in one statement: no trigger runs)
            conn.execute("SET session_replication_role = replica")
            conn.execute(sql.SQL("UPDATE {} SET status = 'completed'").format(jobs))
            conn.execute(sql.SQL(LOADED).format(schema=sql.Identifier(schema)))
            conn.execute("SET session_replication_role = DEFAULT")
            conn.execute(sql.SQL(HISTORY).format(jobs=jobs), {"owners": owners, "rows": history})
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(jobs))
        later, added = replan(app)
        label = f"re-plan after {history:,} more finished rows"
        lines.append(nothing_new(label, later, source, added))
        app.close()
    for line in lines:
        print(line, flush=True)
    return lines


def against(commit: str, owners: int, history: int) -> None:
    """The same measurement by `commit`'s own bench/plan.py, then by this code's."""
    from bench.scale import archived

    older = archived(commit)
    print(f"-- {commit}", flush=True)
    subprocess.run(
        [sys.executable, "-m", "bench.plan", "--owners", str(owners), "--history", str(history)],
        cwd=older,
        env={**os.environ, "PYTHONPATH": str(older)},
        check=True,
    )
    print("-- this code", flush=True)
    main(owners, history)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--owners", type=int, default=10_000)
    parser.add_argument("--history", type=int, default=1_000_000)
    parser.add_argument("--against", metavar="COMMIT")
    args = parser.parse_args()
    if args.against:
        against(args.against, args.owners, args.history)
    else:
        main(args.owners, args.history)
