"""Planning 10,000 owners with `app.plan()`: the first plan, then a re-plan with nothing missing.

    python -m bench.plan [--owners 10000] [--history 1000000]

`app.plan()` compares every owner the source names (a worker's own planning round reads only
what is due: bench/scale.py measures that). The type is windowed with a 730-day horizon and
30-day slices (25 slices an owner, about 250,000 rows) and a 15-minute refresh. The re-plan must
be one read per batch of owners and no insert, and its time must not grow with finished history:
it is measured on the fresh plan, then again after every job is completed and `--history` more
completed rows (months of past refreshes) were added.
"""

from __future__ import annotations

import argparse
import statistics
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

from bench.common import bench_dsn, fresh_schema, timed
from synclane import Owner, Page, SyncLane

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


def replan(app: SyncLane, rounds: int = 5) -> tuple[float, int]:
    times, added = [], 0
    for _ in range(rounds):
        elapsed, result = timed(app.plan)
        times.append(elapsed)
        added += result["shops"]
    return statistics.median(times), added


def main(owners: int = 10_000, history: int = 1_000_000) -> list[str]:
    dsn = bench_dsn()
    lines = []
    with fresh_schema(dsn) as schema:
        app = build(dsn, schema, owners)
        first, result = timed(app.plan)
        lines.append(f"first plan, {owners:,} owners: {first:.2f} s, {result['shops']:,} rows")
        again, added = replan(app)
        lines.append(f"re-plan, nothing missing: median {again * 1000:.0f} ms, {added} rows")
        jobs = sql.Identifier(schema, "jobs")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("UPDATE {} SET status = 'completed'").format(jobs))
            conn.execute(sql.SQL(HISTORY).format(jobs=jobs), {"owners": owners, "rows": history})
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(jobs))
        later, added = replan(app)
        lines.append(
            f"re-plan after {history:,} more finished rows: median {later * 1000:.0f} ms, "
            f"{added} rows"
        )
        app.close()
    for line in lines:
        print(line, flush=True)
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--owners", type=int, default=10_000)
    parser.add_argument("--history", type=int, default=1_000_000)
    args = parser.parse_args()
    main(args.owners, args.history)
