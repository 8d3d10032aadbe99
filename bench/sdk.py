"""How long the notebook SDK's calls take over a large table.

    python -m bench.sdk [--rows 1000000] [--rounds 20] [--shape steady|backfill|both] [--smoke]
    python -m bench.sdk --shape accounts [--rows 10000000] [--owners 100000] [--keep SCHEMA]

Each call is timed end to end (the statement and the DataFrame), as `app.progress("shops")`
etc. are called from a notebook. Three tables of `--rows` jobs:

- steady: 1,000 owners (500 lanes), each with 24 history slices of orders in every state (some
  loaded, some loading, some failing or abandoned), a products snapshot refreshed daily, and the
  rest months of finished 15-minute refreshes, about 2 % of them stopped with one of four
  errors whose numbers and ids differ row by row;
- backfill: 10,000 owners each loading 100 history slices (every row is history): the worst
  case for `progress()`, which reads history slices only;
- accounts (issue 14's size: 10,000,000 rows, 100,000 owners in 20,000 lanes): per owner 25
  history slices of orders, a products snapshot with nine daily refreshes, and the rest finished
  15-minute refreshes of orders, a few in a thousand of them stopped; 10 % of the owners still
  loading history (a thousand jobs running), 1 % failing, 0.2 % abandoned, 0.5 % throttled (their
  lanes paused in the lanes table), 0.1 % disconnected, and an open refresh for 30 %. Each of
  `progress()`, `failures()`, `lanes()` and `depth()` is printed next to its goal, under a
  second. The table is filled with SQL (about three minutes here); `--keep SCHEMA` builds it
  there once and reuses it on the next run.

`progress()` reads the history slices only, `failures()` the stopped jobs only, `depth()` and
`lanes()` the open jobs only; docs/sdk.md says which index each one reads. `--smoke` (20,000
rows, two rounds, every shape) checks that it runs.
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

from bench.common import bench_dsn, fresh_schema, summary_ms, timed
from synclane import Page, SyncLane
from synclane.store import schema_ddl

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


# The accounts shape. Owner o is in lane o % lanes; its history is 25 slices of 30 days ending at
# `anchor` (midnight ten days ago), newest first; the refreshes chain back from now. Throttles and
# retries wait a day, so that a kept table (--keep) shows the same states for a day.
ACCOUNT_HISTORY = """
INSERT INTO {jobs} (queue, owner, lane, type, mode, status, priority, window_start, window_end,
                    dedup_key, processed_count, attempt_count, throttle_count, error, next_run_at,
                    created_at, started_at, heartbeat_at, completed_at, leased_by, lease_token,
                    lease_expires_at)
SELECT 'shops', 'owner-' || lpad(o::text, 6, '0'),
       'lane-' || lpad((o %% %(lanes)s)::text, 6, '0'), 'orders', 'initial', st.status, 0,
       a.anchor - s * interval '30 days', a.anchor - (s - 1) * interval '30 days',
       'initial:' || s,
       CASE st.status WHEN 'completed' THEN 400 + (o * s) %% 200 WHEN 'running' THEN 50
                      ELSE 0 END,
       CASE st.status WHEN 'pending' THEN 0 WHEN 'deferred' THEN 5 WHEN 'abandoned' THEN 6
                      ELSE 1 END,
       CASE WHEN st.throttled AND st.status = 'failed' THEN 1 ELSE 0 END,
       CASE WHEN st.throttled AND st.status = 'failed'
            THEN 'Throttled: 429 Too Many Requests (retry after 1200 s)'
            WHEN st.status IN ('failed', 'deferred')
            THEN 'RuntimeError: order ' || (o * 31 + s) || ' not found'
            WHEN st.status = 'abandoned' THEN 'Abandon: account ' || o || ' revoked access' END,
       CASE WHEN st.throttled AND st.status IN ('pending', 'failed')
            THEN now() + interval '1 day'
            WHEN st.status IN ('failed', 'deferred') THEN now() + interval '1 day'
            ELSE a.anchor END,
       a.anchor,
       CASE WHEN st.done IS NOT NULL THEN st.done - interval '3 minutes'
            WHEN st.status = 'running' THEN now() - interval '2 minutes'
            WHEN st.status IN ('failed', 'deferred', 'abandoned')
            THEN now() - interval '1 hour' END,
       CASE WHEN st.done IS NOT NULL THEN st.done
            WHEN st.status = 'running' THEN now() - interval '10 seconds'
            WHEN st.status IN ('failed', 'deferred', 'abandoned')
            THEN now() - interval '59 minutes' END,
       CASE WHEN st.done IS NOT NULL THEN st.done
            WHEN st.status IN ('abandoned', 'cancelled') THEN now() - interval '59 minutes' END,
       CASE WHEN st.status = 'running' THEN 'bench:1' END,
       CASE WHEN st.status = 'running' THEN gen_random_uuid() END,
       CASE WHEN st.status = 'running' THEN now() + interval '5 minutes' END
FROM (SELECT date_trunc('day', now()) - interval '10 days' AS anchor) a,
     generate_series(1, %(owners)s) o,
     generate_series(1, %(slices)s) s,
     LATERAL (SELECT (o / 10) %% (%(slices)s + 1) AS loaded) l,
     LATERAL (
         SELECT CASE
             -- loading history (one in ten owners), some not started yet
             WHEN o %% 10 = 1 AND s <= l.loaded THEN 'completed'
             WHEN o %% 10 = 1 AND s = l.loaded + 1 AND o <= %(running)s THEN 'running'
             WHEN o %% 10 = 1 THEN 'pending'
             WHEN o %% 500 = 7 AND s = 3 THEN 'abandoned'
             WHEN o %% 1000 = 3 AND s = 2 THEN 'deferred'
             WHEN o %% 100 = 3 AND s = 2 THEN 'failed'
             -- throttled: a slice failed with a throttle, the older ones wait behind it
             WHEN o %% 200 = 19 AND s = 2 THEN 'failed'
             WHEN o %% 200 = 19 AND s > 2 THEN 'pending'
             -- disconnected: the older slices were cancelled
             WHEN o %% 1000 = 13 AND s > 10 THEN 'cancelled'
             ELSE 'completed' END AS status,
         o %% 200 = 19 AS throttled
     ) raw,
     LATERAL (
         SELECT raw.status, raw.throttled,
                CASE WHEN raw.status <> 'completed' THEN NULL
                     WHEN o %% 10 = 1 THEN now() - (l.loaded - s + 1) * interval '2 minutes'
                     ELSE a.anchor + (o %% 1440 + s) * interval '1 minute' END AS done
     ) st
"""
ACCOUNT_REFRESHES = """
INSERT INTO {jobs} (queue, owner, lane, type, mode, status, priority, window_start, window_end,
                    dedup_key, processed_count, attempt_count, error, next_run_at, created_at,
                    started_at, heartbeat_at, completed_at, leased_by, lease_token,
                    lease_expires_at)
SELECT 'shops', 'owner-' || lpad(o::text, 6, '0'),
       'lane-' || lpad((o %% %(lanes)s)::text, 6, '0'), 'orders', 'recurring', st.status, 0,
       w.window_end - interval '20 minutes', w.window_end, 'recurring:' || k,
       CASE WHEN st.status = 'completed' THEN (o + k) %% 40 ELSE 0 END,
       CASE st.status WHEN 'pending' THEN 0 WHEN 'deferred' THEN 5 WHEN 'abandoned' THEN 6
                      ELSE 1 END,
       CASE st.status
           WHEN 'failed' THEN 'RuntimeError: order ' || (k * o) || ' not found'
           WHEN 'abandoned' THEN 'HTTPError: 401 Unauthorized for key ' || md5((k * o)::text)
           WHEN 'deferred'
           THEN 'ShopUnavailable: 503 Service Unavailable (request ' || gen_random_uuid() || ')'
       END,
       CASE WHEN st.status IN ('failed', 'deferred') THEN now() + interval '1 day'
            WHEN st.status = 'pending' AND o %% 200 = 19 THEN now() + interval '1 day'
            ELSE w.window_end END,
       w.window_end,
       CASE WHEN st.status = 'running' THEN now() - interval '1 minute'
            WHEN st.status <> 'pending' THEN w.window_end + interval '1 minute' END,
       CASE WHEN st.status = 'running' THEN now() - interval '5 seconds'
            WHEN st.status <> 'pending' THEN w.window_end + interval '2 minutes' END,
       CASE WHEN st.status IN ('completed', 'abandoned')
            THEN w.window_end + interval '2 minutes' END,
       CASE WHEN st.status = 'running' THEN 'bench:1' END,
       CASE WHEN st.status = 'running' THEN gen_random_uuid() END,
       CASE WHEN st.status = 'running' THEN now() + interval '5 minutes' END
FROM generate_series(1, %(owners)s) o,
     generate_series(1, %(refreshes)s) k,
     LATERAL (SELECT now() - (%(refreshes)s - k) * interval '15 minutes'
                     - (o %% 15) * interval '1 minute' AS window_end) w,
     LATERAL (
         SELECT CASE
             WHEN k = %(refreshes)s AND o %% 10 = 5 AND o <= %(running)s THEN 'running'
             WHEN k = %(refreshes)s AND (o %% 10 IN (0, 2, 4) OR o %% 200 = 19) THEN 'pending'
             WHEN k < %(refreshes)s AND (o * 7919 + k * 104729) %% 1000 = 0 THEN 'failed'
             WHEN k < %(refreshes)s AND (o * 7919 + k * 104729) %% 1000 = 1 THEN 'abandoned'
             WHEN k < %(refreshes)s AND (o * 7919 + k * 104729) %% 1000 = 2 THEN 'deferred'
             ELSE 'completed' END AS status
     ) st
"""
ACCOUNT_PRODUCTS = """
INSERT INTO {jobs} (queue, owner, lane, type, mode, status, priority, dedup_key,
                    processed_count, attempt_count, next_run_at, created_at, started_at,
                    heartbeat_at, completed_at)
SELECT 'shops', 'owner-' || lpad(o::text, 6, '0'),
       'lane-' || lpad((o %% %(lanes)s)::text, 6, '0'), 'products',
       CASE WHEN d = 0 THEN 'initial' ELSE 'recurring' END,
       CASE WHEN c.connecting THEN 'pending' ELSE 'completed' END, 1,
       CASE WHEN d = 0 THEN 'initial' ELSE 'recurring:' || d END,
       CASE WHEN c.connecting THEN 0 ELSE 40 END, CASE WHEN c.connecting THEN 0 ELSE 1 END,
       t.at, t.at, CASE WHEN NOT c.connecting THEN t.at END,
       CASE WHEN NOT c.connecting THEN t.at + interval '1 minute' END,
       CASE WHEN NOT c.connecting THEN t.at + interval '1 minute' END
FROM generate_series(1, %(owners)s) o,
     generate_series(0, %(days)s) d,
     LATERAL (SELECT o %% 10 = 1 AND (o / 10) %% (%(slices)s + 1) = 0 AS connecting) c,
     LATERAL (SELECT date_trunc('day', now()) - (10 - d) * interval '1 day'
                     + (o %% 1440) * interval '1 minute' AS at) t
WHERE d = 0 OR NOT c.connecting
"""
# The lanes of throttled owners are paused; one lane in fifty keeps a pause that has ended.
ACCOUNT_LANES = """
INSERT INTO {lanes} (queue, lane, paused_until)
SELECT 'shops', 'lane-' || lpad((o %% %(lanes)s)::text, 6, '0'),
       max(CASE WHEN o %% 200 = 19 THEN now() + interval '1 day'
                ELSE now() - interval '1 day' END)
FROM generate_series(1, %(owners)s) o
WHERE o %% 200 = 19 OR o %% 50 = 0
GROUP BY 2
"""
SLICES = 25
PRODUCT_DAYS = 9  # daily refreshes of products after the first load
GOAL = 1.0  # seconds: issue 14's goal for each read at 100,000 owners and 10,000,000 rows


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


def accounts(conn: psycopg.Connection[Any], schema: str, rows: int, owners: int) -> str:
    """Issue 14's table, filled without the indexes (several times faster), then indexed."""
    owners = max(10, min(owners, rows // (SLICES + PRODUCT_DAYS + 2)))
    params = {
        "owners": owners,
        "lanes": max(1, owners // 5),
        "slices": SLICES,
        "days": PRODUCT_DAYS,
        "refreshes": max(1, rows // owners - SLICES - PRODUCT_DAYS - 1),
        "running": owners // 20,
    }
    names = conn.execute(
        "SELECT indexname FROM pg_indexes WHERE schemaname = %s AND tablename = 'jobs' "
        "AND indexname <> 'jobs_pkey'",
        [schema],
    ).fetchall()
    for (name,) in names:
        conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(schema, name)))
    tables = {"jobs": sql.Identifier(schema, "jobs"), "lanes": sql.Identifier(schema, "lanes")}
    for statement in (ACCOUNT_HISTORY, ACCOUNT_REFRESHES, ACCOUNT_PRODUCTS, ACCOUNT_LANES):
        conn.execute(sql.SQL(statement).format(**tables), params)
    conn.execute("SET maintenance_work_mem = '256MB'")
    conn.execute(schema_ddl(schema))  # the indexes again, as the schema declares them
    return f"accounts: {owners:,} owners in {params['lanes']:,} lanes, {SLICES} history slices each"


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


Calls = list[tuple[str, Callable[[], Any]]]


def calls(app: SyncLane) -> Calls:
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


def account_calls(app: SyncLane, owners: int) -> Calls:
    """The four reads of issue 14, each as a notebook calls it first, then narrowed to an owner
    still loading history, a failing one, and the lane of the first."""
    middle = owners // 200 * 100
    loading, failing = f"owner-{middle + 1:06d}", f"owner-{middle + 3:06d}"
    lane = f"lane-{(middle + 1) % max(1, owners // 5):06d}"
    return [
        ('progress("shops")', lambda: app.progress("shops")),
        ('progress("shops", state="failing")', lambda: app.progress("shops", state="failing")),
        ('progress("shops", state="loading")', lambda: app.progress("shops", state="loading")),
        ('progress("shops", owner)', lambda: app.progress("shops", loading)),
        ("failures()", lambda: app.failures()),
        ('failures("shops", owner)', lambda: app.failures("shops", failing)),
        ("lanes()", lambda: app.lanes()),
        ('lanes("shops", lane)', lambda: app.lanes("shops", lane=lane)),
        ("depth()", lambda: app.depth()),
        ('depth("shops", owner)', lambda: app.depth("shops", loading)),
    ]


def timings(calls: Calls, rounds: int, goal: float | None, warmups: int = 3) -> list[str]:
    """Each call's median and p95 after `warmups` calls (caches, the first DataFrame), next to
    the goal when there is one."""
    # progress() warns when its answer is cut at `limit`: the rows column says so here
    warnings.filterwarnings("ignore", r"progress\(.*\) returned the first", UserWarning)
    lines = []
    for name, call in calls:
        for _ in range(warmups):
            call()
        times = []
        for _ in range(rounds):
            seconds, frame = timed(call)
            times.append(seconds)
        line = f"  {name:<36} {summary_ms(times)}  ({len(frame):,} rows)"
        if goal is not None:
            met = "met" if max(times) < goal else "OVER"
            line += f"  goal < {goal:g} s: {met}"
        print(line, flush=True)
        lines.append(line)
    return lines


def fill(dsn: str, schema: str, shape: str, rows: int, owners: int) -> str:
    """The table of `shape` in `schema` (made there if it has no jobs yet), vacuumed. A kept
    table gets the indexes the schema declares now, in case they changed since it was made."""
    table = sql.Identifier(schema, "jobs")
    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.execute(sql.SQL("SELECT EXISTS (SELECT FROM {})").format(table)).fetchone() == (
            True,
        ):
            label = f"{shape}: kept in schema {schema}"
            elapsed = 0.0
            conn.execute("SET maintenance_work_mem = '256MB'")
            conn.execute(schema_ddl(schema))
        else:
            if shape == "accounts":
                elapsed, label = timed(lambda: accounts(conn, schema, rows, owners))
            else:
                maker = {"steady": steady, "backfill": backfill}[shape]
                elapsed, label = timed(lambda: maker(conn, schema, rows))
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(table))
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()
    total = 0 if row is None else row[0]
    made = f" (filled in {elapsed:.0f} s)" if elapsed else ""
    return f"{label}; {total:,} jobs{made}"


def churn(dsn: str, schema: str) -> str:
    """Write every unfinished row again (a heartbeat would), as if all of them had changed since
    the last vacuum: their pages are no longer all-visible, so an index-only scan must visit
    them. Workers keep writing open rows; this is the worst case of that."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(
            sql.SQL(
                "UPDATE {} SET heartbeat_at = heartbeat_at "
                "WHERE status IN ('pending', 'running', 'failed', 'deferred', 'abandoned')"
            ).format(sql.Identifier(schema, "jobs"))
        )
    return f"every unfinished row ({cur.rowcount:,}) written again since the last vacuum:"


def measure(
    dsn: str, shape: str, rows: int, rounds: int, owners: int = 100_000, keep: str | None = None
) -> list[str]:
    def run(schema: str) -> list[str]:
        app = app_for(dsn, schema)  # creates the schema, or adds what a newer schema declares
        try:
            lines = [fill(dsn, schema, shape, rows, owners)]
            print(lines[0], flush=True)
            if shape != "accounts":
                return lines + timings(calls(app), rounds, None)
            lines += ["just vacuumed:"]
            print(lines[-1], flush=True)
            lines += timings(account_calls(app, owners), rounds, GOAL, warmups=1)
            # every owner and type in one frame: what the default limit spares a notebook
            every = [('progress("shops", limit=None)', lambda: app.progress("shops", limit=None))]
            lines += timings(every, min(rounds, 3), None, warmups=1)
            lines += [churn(dsn, schema)]
            print(lines[-1], flush=True)
            return lines + timings(account_calls(app, owners), rounds, GOAL, warmups=1)
        finally:
            app.close()

    if keep:
        return run(keep)
    with fresh_schema(dsn, f"bench_sdk_{shape}") as schema:
        return run(schema)


def main(
    rows: int = 1_000_000,
    rounds: int = 20,
    shapes: tuple[str, ...] = ("steady", "backfill"),
    owners: int = 100_000,
    keep: str | None = None,
) -> list[str]:
    dsn = bench_dsn()
    lines: list[str] = []
    for shape in shapes:
        lines += measure(dsn, shape, rows, rounds, owners, keep)
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, help="1,000,000; 10,000,000 for accounts")
    parser.add_argument("--rounds", type=int, help="20; 5 for accounts")
    parser.add_argument("--owners", type=int, default=100_000, help="for accounts")
    parser.add_argument(
        "--shape", choices=["steady", "backfill", "both", "accounts"], default="both"
    )
    parser.add_argument("--keep", help="build the table in this schema once, and reuse it")
    parser.add_argument("--smoke", action="store_true", help="20,000 rows, two rounds")
    args = parser.parse_args()
    shapes = ("steady", "backfill") if args.shape == "both" else (args.shape,)
    large = args.shape == "accounts"
    if args.smoke:
        main(20_000, 2, shapes, owners=400, keep=args.keep)
    else:
        main(
            args.rows or (10_000_000 if large else 1_000_000),
            args.rounds or (5 if large else 20),
            shapes,
            args.owners,
            args.keep,
        )
