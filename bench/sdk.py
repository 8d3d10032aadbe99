"""How long the notebook SDK's calls take over a table of 1,000,000 jobs.

    python -m bench.sdk [--rows 1000000] [--rounds 20] [--shape steady|backfill|both] [--smoke]

Each call is timed end to end (the statement and the DataFrame), as `app.progress("shops")`
etc. are called from a notebook. Two tables of `--rows` jobs:

- steady: 1,000 owners (500 lanes), each with 24 history slices of orders in every state (some
  loaded, some loading, some failing or abandoned), a products snapshot refreshed daily, and the
  rest months of finished 15-minute refreshes, about 2 % of them stopped with one of four
  errors whose numbers and ids differ row by row;
- backfill: 10,000 owners each loading 100 history slices (every row is history): the worst
  case for `progress()`, which reads history slices only.

`progress()` reads the history slices only, `failures()` the stopped jobs only, `depth()` and
`lanes()` the open jobs only; none of them needs an index of its own (the table's indexes are
the ones docs/schema.sql ships). `--smoke` (20,000 rows, two rounds) checks that it runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

from bench.common import bench_dsn, fresh_schema, summary_ms, timed
from synclane import Page, SyncLane

# {jobs} is the table; %(name)s are parameters. Windows end at `anchor`, midnight some days ago,
# and the refreshes run from there to now, as the planner would have left them.
HISTORY = """
INSERT INTO {jobs} (queue, owner, lane, type, mode, status, priority, window_start, window_end,
                    dedup_key, processed_count, attempt_count, error, next_run_at, created_at,
                    started_at, heartbeat_at, completed_at)
SELECT 'shops', 'owner-' || o, 'lane-' || (o %% %(lanes)s), 'orders', 'initial', st.status, 0,
       a.anchor - s * interval '30 days', a.anchor - (s - 1) * interval '30 days',
       'initial:' || s, CASE WHEN st.status = 'completed' THEN 500 ELSE 50 END,
       CASE WHEN st.status = 'pending' THEN 0 ELSE 1 END,
       CASE st.status WHEN 'failed' THEN 'RuntimeError: order ' || (o * 31 + s) || ' not found'
                      WHEN 'abandoned' THEN 'Abandon: account ' || o || ' revoked access' END,
       now() + CASE WHEN st.status = 'failed' THEN interval '5 minutes' ELSE interval '0' END,
       a.anchor, st.done - interval '2 minutes', st.done, st.done
FROM (SELECT date_trunc('day', now()) - %(refresh_days)s * interval '1 day' AS anchor) a,
     generate_series(1, %(owners)s) o,
     generate_series(1, %(slices)s) s,
     LATERAL (
         SELECT CASE
             WHEN o %% 50 = 7 AND s = 3 THEN 'abandoned'
             WHEN o %% 10 = 3 AND s = (o %% %(slices)s) + 1 THEN 'failed'
             WHEN s <= (o * 7) %% (%(slices)s + 10) THEN 'completed'
             WHEN s = (o * 7) %% (%(slices)s + 10) + 1 AND o <= %(lanes)s THEN 'running'
             ELSE 'pending' END AS status,
         CASE WHEN s <= (o * 7) %% (%(slices)s + 10)
              THEN now() - ((o + s) %% 180) * interval '1 minute' END AS done
     ) st
"""
REFRESHES = """
INSERT INTO {jobs} (queue, owner, lane, type, mode, status, priority, window_start, window_end,
                    dedup_key, processed_count, attempt_count, error, next_run_at, created_at,
                    started_at, heartbeat_at, completed_at)
SELECT 'shops', 'owner-' || o, 'lane-' || (o %% %(lanes)s), 'orders', 'recurring', st.status, 0,
       w.window_end - interval '20 minutes', w.window_end, 'recurring:' || k,
       (k %% 40), 1, st.error, w.window_end, w.window_end, w.window_end, w.window_end,
       CASE WHEN st.status IN ('completed', 'abandoned') THEN w.window_end END
FROM generate_series(1, %(owners)s) o,
     generate_series(1, %(per_owner)s) k,
     LATERAL (SELECT now() - (%(per_owner)s - k) * interval '15 minutes'
                     - (o %% 15) * interval '1 minute' AS window_end) w,
     LATERAL (
         SELECT CASE WHEN (k + o) %% 97 = 0 THEN 'failed'
                     WHEN (k + o) %% 89 = 0 THEN 'abandoned'
                     WHEN (k + o) %% 83 = 0 THEN 'deferred'
                     WHEN k = %(per_owner)s AND o %% 3 = 0 THEN 'pending'
                     ELSE 'completed' END AS status,
                CASE WHEN (k + o) %% 97 = 0 THEN 'RuntimeError: order ' || (k * 7) || ' not found'
                     WHEN (k + o) %% 89 = 0
                     THEN 'HTTPError: 401 Unauthorized for key ' || md5(k::text)
                     WHEN (k + o) %% 83 = 0
                     THEN 'ShopUnavailable: 503 Service Unavailable (request '
                          || gen_random_uuid() || ')'
                END AS error
     ) st
"""
PRODUCTS = """
INSERT INTO {jobs} (queue, owner, lane, type, mode, status, priority, dedup_key,
                    processed_count, attempt_count, next_run_at, created_at, started_at,
                    heartbeat_at, completed_at)
SELECT 'shops', 'owner-' || o, 'lane-' || (o %% %(lanes)s), 'products',
       CASE WHEN d = 0 THEN 'initial' ELSE 'recurring' END, 'completed', 1,
       CASE WHEN d = 0 THEN 'initial' ELSE 'recurring:' || d END, 40, 1,
       now() - d * interval '1 day', now() - d * interval '1 day',
       now() - d * interval '1 day', now() - d * interval '1 day', now() - d * interval '1 day'
FROM generate_series(1, %(owners)s) o, generate_series(0, %(days)s - 1) d
"""


def steady(conn: psycopg.Connection[Any], schema: str, rows: int) -> str:
    owners, slices, days = 1_000, 24, 30
    per_owner = max(1, (rows - owners * (slices + days)) // owners)
    params = {
        "owners": owners,
        "lanes": owners // 2,
        "slices": slices,
        "days": days,
        "per_owner": per_owner,
        # the refreshes reach back this far from now; history ends where they begin
        "refresh_days": per_owner // 96 + 1,
    }
    for statement in (HISTORY, REFRESHES, PRODUCTS):
        conn.execute(sql.SQL(statement).format(jobs=sql.Identifier(schema, "jobs")), params)
    return f"steady: {owners:,} owners, {owners * slices:,} history slices"


def backfill(conn: psycopg.Connection[Any], schema: str, rows: int) -> str:
    slices = 100
    owners = max(1, rows // slices)
    params = {"owners": owners, "lanes": owners, "slices": slices, "refresh_days": 0}
    conn.execute(sql.SQL(HISTORY).format(jobs=sql.Identifier(schema, "jobs")), params)
    return f"backfill: {owners:,} owners, {owners * slices:,} history slices"


def _done(job: Any) -> Page:
    return Page(None)


def app_for(dsn: str, schema: str) -> SyncLane:
    app = SyncLane(dsn, schema=schema)
    shops = app.queue("shops")
    shops.windowed(
        "orders",
        horizon=timedelta(days=3000),
        slice=timedelta(days=30),
        every=timedelta(minutes=15),
    )(_done)
    shops.snapshot("products", every=timedelta(days=1))(_done)
    return app


def calls(app: SyncLane) -> list[tuple[str, Callable[[], Any]]]:
    return [
        ('progress("shops")', lambda: app.progress("shops")),
        ('failures("shops")', lambda: app.failures("shops")),
        ("failures()", lambda: app.failures()),
        ("depth()", lambda: app.depth()),
        ("lanes()", lambda: app.lanes()),
        ("jobs()", lambda: app.jobs()),
        ('jobs(status="failed")', lambda: app.jobs(status="failed")),
        ('coverage("shops", owner)', lambda: app.coverage("shops", "owner-7")),
        ("throughput(last hour)", lambda: app.throughput("shops")),
        ('progress("shops", owner)', lambda: app.progress("shops", "owner-7")),
    ]


def measure(dsn: str, shape: str, rows: int, rounds: int) -> list[str]:
    fill = {"steady": steady, "backfill": backfill}[shape]
    with fresh_schema(dsn, "bench_sdk") as schema:
        app = app_for(dsn, schema)
        with psycopg.connect(dsn, autocommit=True) as conn:
            elapsed, label = timed(lambda: fill(conn, schema, rows))
            table = sql.Identifier(schema, "jobs")
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(table))
            row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()
            total = 0 if row is None else row[0]
        lines = [f"{label}; {total:,} jobs (filled in {elapsed:.0f} s)"]
        print(lines[0], flush=True)
        for name, call in calls(app):
            for _ in range(3):  # warm up: caches, the first DataFrame
                call()
            times = []
            for _ in range(rounds):
                seconds, frame = timed(call)
                times.append(seconds)
            line = f"  {name:<26} {summary_ms(times)}  ({len(frame):,} rows)"
            print(line, flush=True)
            lines.append(line)
        app.close()
    return lines


def main(
    rows: int = 1_000_000, rounds: int = 20, shapes: tuple[str, ...] = ("steady", "backfill")
) -> list[str]:
    dsn = bench_dsn()
    lines: list[str] = []
    for shape in shapes:
        lines += measure(dsn, shape, rows, rounds)
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--shape", choices=["steady", "backfill", "both"], default="both")
    parser.add_argument("--smoke", action="store_true", help="20,000 rows, two rounds")
    args = parser.parse_args()
    shapes = ("steady", "backfill") if args.shape == "both" else (args.shape,)
    if args.smoke:
        main(20_000, 2, shapes)
    else:
        main(args.rows, args.rounds, shapes)
