"""Planning and retention at the scale of issue 14, each figure next to its goal.

    python -m bench.scale [--owners 10000,100000,1000000] [--first 100000]
                          [--prune-owners 1000] [--days 30] [--keep 7] [--costs 500]
                          [--lanes 100000] [--sdk-rows 10000000] [--sdk-owners 100000] [--smoke]
    python -m bench.scale --index-costs 20000
    python -m bench.scale --explicit 100000

- **Re-plan with nothing due** at each size: a worker's planning round when every owner was
  planned for the current period (the owners table and the jobs table hold every owner; the
  round reads neither). Goal: < 1 s at 1,000,000 owners, within 2× of 10,000.
- **Planning a due period** at the largest size, on the same table: the round after a new
  period began, which plans one refresh for every owner.
- **An explicit `app.plan()` with nothing new** at `--first` owners (two years of 30-day slices
  each, a refresh every 15 minutes; bench.plan's table): after the first plan and one plan that
  compares every owner and marks them settled (schema 7), the median of 5 plans, on top of
  reading the owner source. Goal (issue 30): < 1 s at 100,000 owners, growing no faster than
  the owners. `python -m bench.scale --explicit 100000` measures only that.
- **First plan** of `--first` owners, each with a two-year history of 25 slices and a refresh, in
  a process of its own (the round a worker runs on an empty table): time, peak RSS and rows per
  owner (since schema 6 the newest slices only: lazy history). Goals: < 30 s and < 300 MiB at
  100,000 owners, < 5 minutes at 1,000,000, a few rows per owner.
  `python -m bench.scale --first-only 100000 --against 9ed2726` measures only that, side by side
  with an older commit (its files from `git archive`, its own `--first-plan-child`), the two
  codes taking turns at going first, `--rounds` times.
- **The insert's floor**: the first plan's insert for a twentieth of `--first` owners into a
  jobs table taken apart (primary key only; then the wake trigger, the dedup index, ON
  CONFLICT, the other indexes added back): what each piece costs, and the rate a first plan can
  reach at best on this server. Then **each index on its own**: the same insert with the primary
  key, the dedup index and the trigger, plus one index at a time (`--index-costs OWNERS` runs
  only that).
- **Retention**: `--days` simulated days of refreshes every 15 minutes for `--prune-owners`
  owners, pruned each day with a retention of `--keep` days: rows and bytes per day (flat after
  day `--keep`). Then one prune of a table that holds all `--days` days at once.
- **Blocked take** at `--lanes` lanes (bench.take's worst order: every lane but one runs a job,
  and the free lane's jobs are the oldest). Goal: p95 < 5 ms at 100,000 lanes (issue 25).
- **The SDK's reads** at `--sdk-rows` rows and `--sdk-owners` owners (bench.sdk's accounts
  table; `--sdk-rows 0` leaves it out, it takes minutes to build). Goal: each < 1 s.
- **Costs per job** (docs/scaling.md): WAL records and bytes of each statement of a job's life,
  measured with EXPLAIN (ANALYZE, WAL) so that other sessions on the server do not count;
  bytes per row of the table and its indexes; commits per job of a worker run, counted in
  pg_stat_database of a database of the bench's own.

To keep the big tables cheap to build, the nothing-due and due-period tables give each owner one
history slice (horizon = slice = 30 days): the round's cost per owner does not depend on how
many slices an owner has (each fact it reads is one index descent).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench import sdk, take
from bench.common import bench_dsn, fresh_schema, timed
from synclane import Owner, Page, SyncLane
from synclane.planning import iso, midnight, period_start

EVERY = timedelta(minutes=15)
OVERLAP = timedelta(minutes=5)
MIB = 1024 * 1024
SCALE_DB = "synclane_bench_scale"


def shops(
    dsn: str, schema: str, owners: int, *, horizon: timedelta = timedelta(days=30), **queue: Any
) -> SyncLane:
    """One queue whose owner source streams `owners` owners and whose type refreshes every 15
    minutes."""
    app = SyncLane(dsn, schema=schema)
    queue.setdefault("owners_interval", timedelta(days=1))
    q = app.queue("shops", **queue)
    q.owners(lambda name: (Owner(f"owner-{n}") for n in range(1, owners + 1)))
    q.windowed("orders", horizon=horizon, slice=timedelta(days=30), every=EVERY, overlap=OVERLAP)(
        lambda job: Page(None)
    )
    return app


def execute(conn: psycopg.Connection[Any], schema: str, statement: str, **params: Any) -> Any:
    """Run a statement whose {jobs}, {owners}, {planned_types}, {planner} name the schema's."""
    names = {name: sql.Identifier(schema, name) for name in TABLES}
    return conn.execute(sql.SQL(statement).format(**names), params)


TABLES = ("jobs", "owners", "planned_types", "planner")


def database_now(conn: psycopg.Connection[Any]) -> datetime:
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


def away_from_a_period_edge(conn: psycopg.Connection[Any], needed: timedelta) -> None:
    """Wait until at least `needed` is left in the current 15-minute period, so that a
    measurement of 'nothing due' is not a new period's planning."""
    now = database_now(conn)
    left = period_start(now, EVERY) + EVERY - now
    if left < needed:
        time.sleep(left.total_seconds() + 1)


# -- re-plan with nothing due; a due period --------------------------------------------------------

PLANNED = """
INSERT INTO {owners} (queue, owner, lane, planned)
SELECT 'shops', 'owner-' || n, 'owner-' || n, true FROM generate_series(1, %(owners)s) n;
"""
HISTORY = """
INSERT INTO {jobs} (queue, owner, lane, type, mode, status, window_start, window_end, dedup_key,
                    created_at, completed_at)
SELECT 'shops', 'owner-' || n, 'owner-' || n, 'orders', 'initial', 'completed',
       %(start)s, %(end)s, %(key)s, %(end)s, %(end)s
FROM generate_series(1, %(owners)s) n
"""
REFRESHED = """
INSERT INTO {jobs} (queue, owner, lane, type, mode, status, window_start, window_end, dedup_key,
                    created_at, completed_at)
SELECT 'shops', 'owner-' || n, 'owner-' || n, 'orders', 'recurring', 'completed',
       %(start)s, %(end)s, %(key)s, %(end)s, %(end)s
FROM generate_series(1, %(owners)s) n
"""
PLANNED_FOR = """
INSERT INTO {planned_types} (queue, type, period, horizon)
VALUES ('shops', 'orders', %(period)s, interval '30 days')
ON CONFLICT (queue, type) DO UPDATE SET period = excluded.period
"""
RECONCILED = """
INSERT INTO {planner} (queue, owners_reconciled_at) VALUES ('shops', now())
ON CONFLICT (queue) DO UPDATE SET owners_reconciled_at = now()
"""


def planned_table(dsn: str, schema: str, owners: int) -> SyncLane:
    """`owners` owners planned up to the previous period: a history slice and a completed
    refresh each, as the planner would have left them."""
    app = shops(dsn, schema, owners)
    with psycopg.connect(dsn, autocommit=True) as conn:
        now = database_now(conn)
        today = midnight(now)
        last = period_start(now, EVERY) - timedelta(minutes=1)
        execute(conn, schema, PLANNED, owners=owners)
        history = {"start": today - timedelta(days=30), "end": today}
        history["key"] = f"initial:{iso(history['start'])}"
        execute(conn, schema, HISTORY, owners=owners, **history)
        refresh = {"start": today - OVERLAP, "end": last}
        refresh["key"] = f"recurring:{iso(period_start(last, EVERY))}"
        execute(conn, schema, REFRESHED, owners=owners, **refresh)
        for table in TABLES:
            execute(conn, schema, f"VACUUM ANALYZE {{{table}}}")
    return app


def mark_planned(dsn: str, schema: str, period: datetime) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        execute(conn, schema, PLANNED_FOR, period=period)
        execute(conn, schema, RECONCILED)


def nothing_due(dsn: str, owners: int, then_due: bool = False) -> tuple[float, list[str]]:
    """Median time of a round with nothing due, and the lines to print; with `then_due`, also
    the round after a new period began, on the same table: one refresh for every owner."""
    with fresh_schema(dsn, "bench_scale") as schema:
        app = planned_table(dsn, schema, owners)
        with psycopg.connect(dsn, autocommit=True) as conn:
            away_from_a_period_edge(conn, timedelta(minutes=1))
            period = period_start(database_now(conn), EVERY)
        mark_planned(dsn, schema, period)
        plan = app.worker(["shops"]).plan
        assert plan is not None
        times, added = [], 0
        for _ in range(5):
            elapsed, result = timed(lambda: plan("shops"))
            times.append(elapsed)
            added += result or 0
        median = statistics.median(times)
        lines = [
            f"re-plan, nothing due, {owners:,} owners: median {median * 1000:.1f} ms, "
            f"{added} rows (goal < 1 s)"
        ]
        if then_due:
            mark_planned(dsn, schema, period - EVERY)  # as if a new period had begun
            elapsed, refreshed = timed(lambda: plan("shops"))
            again, more = timed(lambda: plan("shops"))
            lines.append(
                f"planning a due period, {owners:,} owners: {elapsed:.1f} s, {refreshed or 0:,} "
                f"refreshes ({(refreshed or 0) / elapsed:,.0f} owners/s); the round after it: "
                f"{again * 1000:.0f} ms, {more} rows"
            )
        app.close()
    return median, lines


# -- an explicit app.plan() with nothing new ------------------------------------------------------


def explicit_plan(owners: int) -> list[str]:
    """bench.plan's table of `owners` (two-year histories, lazy), its first plan, then the plan
    that compares and marks every owner, then the median of 5 plans with nothing new."""
    from bench import plan

    dsn = bench_dsn()
    with fresh_schema(dsn, "bench_explicit") as schema:
        app = plan.build(dsn, schema, owners)
        first, result = timed(app.plan)
        source = plan.source_read(app)
        marking, _ = timed(app.plan)
        again, added = plan.replan(app)
        app.close()
    return [
        f"explicit app.plan(), {owners:,} owners: first plan {first:.1f} s "
        f"({result['shops']:,} rows); the plan that compares and marks every owner "
        f"{marking * 1000:,.0f} ms; " + plan.nothing_new("nothing new", again, source, added)
    ]


# -- first plan --------------------------------------------------------------------------------


def first_plan_child(owners: int) -> None:
    """In a process of its own: the first round of an empty table; prints JSON."""
    dsn = bench_dsn()
    with fresh_schema(dsn, "bench_first") as schema:
        app = shops(dsn, schema, owners, horizon=timedelta(days=730))
        plan = app.worker(["shops"]).plan
        assert plan is not None
        elapsed, added = timed(lambda: plan("shops"))
        with open("/proc/self/status", encoding="ascii") as status:
            peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))
        with psycopg.connect(dsn, autocommit=True) as conn:
            sizes = relation_sizes(conn, schema)
        app.close()
    print(json.dumps({"seconds": elapsed, "rows": added, "rss_kib": peak, "sizes": sizes}))


def first_plan(owners: int, code: Path | None = None) -> tuple[list[str], dict[str, Any]]:
    """The first plan in a process of its own, of this code or of the files in `code`."""
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = str(code)
    done = subprocess.run(
        [sys.executable, "-m", "bench.scale", "--first-plan-child", str(owners)],
        capture_output=True,
        text=True,
        check=True,
        cwd=code,
        env=env,
    )
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    rss = figures["rss_kib"] / 1024
    goal = "< 5 minutes" if owners >= 1_000_000 else "< 30 s"
    return [
        f"first plan, {owners:,} owners (two years of 30-day slices each): "
        f"{figures['seconds']:.1f} s, {figures['rows']:,} rows, {figures['rows'] / owners:.1f} "
        f"per owner ({figures['rows'] / figures['seconds']:,.0f} rows/s), peak RSS {rss:.0f} "
        f"MiB (goals {goal}, < 300 MiB, a few rows per owner)"
    ], figures


def archived(commit: str) -> Path:
    """The files of `commit` (git archive) in a folder of their own, made once."""
    root = Path(__file__).resolve().parent.parent
    sha = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--short=12", commit],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    place = Path(tempfile.gettempdir()) / f"synclane-files-{sha}"
    if not (place / "synclane").is_dir():
        place.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(root), "archive", sha], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(place)], input=archive, check=True)
    return place


def first_plan_side_by_side(owners: int, against: str, rounds: int) -> list[str]:
    """The first plan of `owners` by an older commit and by this code, taking turns at going
    first, each after a CHECKPOINT (a run leaves dirty pages and WAL for the next one)."""
    older = archived(against)
    lines = []
    for number in range(rounds):
        order = [(against, older), ("this code", None)]
        for label, code in order if number % 2 == 0 else order[::-1]:
            with psycopg.connect(bench_dsn(), autocommit=True) as conn:
                conn.execute("CHECKPOINT")
            found, _ = first_plan(owners, code)
            lines += [f"round {number + 1}, {label}: {line}" for line in found]
            print(lines[-1], flush=True)
    return lines


def first_plan_lines(owners: int) -> list[str]:
    lines, figures = first_plan(owners)
    rows = figures["sizes"]["rows"]
    heap = figures["sizes"]["bytes"]["jobs"]
    indexes = sum(v for k, v in figures["sizes"]["bytes"].items() if k != "jobs")
    return [
        *lines,
        f"bytes per planned (pending) row ({rows:,} rows): table {heap / rows:.0f}, indexes "
        f"{indexes / rows:.0f}; {(heap + indexes) / rows * 1e6 / MIB:,.0f} MiB per million",
    ]


def relation_sizes(conn: psycopg.Connection[Any], schema: str) -> dict[str, Any]:
    """Rows, and bytes of the jobs table and of each of its indexes."""
    table = sql.Identifier(schema, "jobs")
    rows = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()
    found = conn.execute(
        "SELECT c.relname, pg_relation_size(c.oid) FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND (c.relname = 'jobs' OR c.oid IN ("
        "  SELECT indexrelid FROM pg_index WHERE indrelid = %s::regclass))",
        [schema, sql.Identifier(schema, "jobs").as_string(conn)],
    ).fetchall()
    return {"rows": rows[0] if rows else 0, "bytes": dict(found)}


# What one planned row costs to insert, piece by piece: the floor under the first plan. The same
# rows as a first plan (25 history slices and a refresh an owner), inserted by one statement into
# a fresh jobs table from which the pieces are taken away: the trigger that keeps lane hints, the
# dedup index (the promise that a planned job is created once) and ON CONFLICT DO NOTHING (the
# speculative insertion that lets racing planners meet on it), then the other 14 indexes.
FIRST_ROWS = """
INSERT INTO {jobs} (queue, owner, lane, type, mode, priority, window_start, window_end,
                    dedup_key, next_run_at)
SELECT 'shops', 'owner-' || o, 'owner-' || o, 'orders', 'initial', 0,
       timestamptz '2026-01-01' - d * interval '1 day',
       timestamptz '2026-01-01' - (d - 1) * interval '1 day', 'initial:' || d, now()
FROM generate_series(1, %(owners)s) o, generate_series(1, 26) d
"""
QUERY_INDEXES = (
    "jobs_running_lane",
    "jobs_leased_queue_slot",
    "jobs_claim_order",
    "jobs_claim_lane",
    "jobs_open_owner",
    "jobs_owner_window",
    "jobs_owner_created",
    "jobs_held_lease",
    "jobs_unfinished",
    "jobs_history",
    "jobs_history_unloaded",
    "jobs_waiting",
    "jobs_abandoned",
)


def insert_floor(dsn: str, owners: int) -> list[str]:
    """Rows per second of the first plan's insert as the table's pieces are added back."""
    steps = [
        ("the table and its primary key", False, False, False, False),
        ("+ the trigger that wakes new lanes", True, False, False, False),
        ("+ the dedup index", True, True, False, False),
        ("+ ON CONFLICT DO NOTHING", True, True, True, False),
        (
            f"+ the {len(QUERY_INDEXES)} other indexes (the table as shipped)",
            True,
            True,
            True,
            True,
        ),
    ]
    rows = owners * 26
    lines = []
    for label, trigger, dedup, conflict, indexes in steps:
        with fresh_schema(dsn, "bench_floor") as schema:
            SyncLane(dsn, schema=schema).close()
            with psycopg.connect(dsn, autocommit=True) as conn:
                drop = [] if indexes else list(QUERY_INDEXES)
                drop += [] if dedup else ["jobs_dedup_key"]
                for index in drop:
                    conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(schema, index)))
                if not trigger:
                    conn.execute(
                        sql.SQL("DROP TRIGGER jobs_wake_new_lanes ON {}").format(
                            sql.Identifier(schema, "jobs")
                        )
                    )
                statement = sql.SQL(
                    FIRST_ROWS + (" ON CONFLICT DO NOTHING" if conflict else "")
                ).format(jobs=sql.Identifier(schema, "jobs"))
                started = time.perf_counter()
                conn.execute(statement, {"owners": owners})
                elapsed = time.perf_counter() - started
        lines.append(
            f"insert of {rows:,} planned rows, {label}: {elapsed:.2f} s "
            f"({rows / elapsed:,.0f} rows/s)"
        )
    lines.append("(the first-plan goal, 2,600,000 rows in < 30 s, is 86,667 rows/s)")
    return lines


def index_costs(dsn: str, owners: int) -> list[str]:
    """What each index adds to the first plan's insert on its own: the table with its primary
    key, the dedup index and the wake trigger, then with one more index at a time."""

    def insert(keep: str | None) -> tuple[float, int]:
        with fresh_schema(dsn, "bench_index") as schema:
            SyncLane(dsn, schema=schema).close()
            with psycopg.connect(dsn, autocommit=True) as conn:
                for index in QUERY_INDEXES:
                    if index != keep:
                        conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(schema, index)))
                statement = sql.SQL(FIRST_ROWS + " ON CONFLICT DO NOTHING").format(
                    jobs=sql.Identifier(schema, "jobs")
                )
                started = time.perf_counter()
                conn.execute(statement, {"owners": owners})
                elapsed = time.perf_counter() - started
                size = 0
                if keep is not None:
                    found = conn.execute(
                        "SELECT pg_relation_size(%s::regclass)",
                        [sql.Identifier(schema, keep).as_string(conn)],
                    ).fetchone()
                    size = int(found[0]) if found else 0
        return elapsed, size

    base, _ = insert(None)
    lines = [
        f"insert of {owners * 26:,} planned rows with the primary key, the dedup index and the "
        f"wake trigger: {base:.2f} s"
    ]
    for index in QUERY_INDEXES:
        elapsed, size = insert(index)
        lines.append(f"  + {index}: {elapsed - base:+.2f} s, {size / MIB:,.0f} MiB")
    return lines


# -- retention ---------------------------------------------------------------------------------

A_DAY = """
INSERT INTO {jobs} (queue, owner, lane, type, mode, status, window_start, window_end, dedup_key,
                    created_at, started_at, completed_at, processed_count)
SELECT 'shops', 'owner-' || o, 'owner-' || o, 'orders', 'recurring', 'completed',
       t - %(slice)s, t,
       'recurring:' || to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
       t, t, t + interval '1 minute', 10
FROM generate_series(1, %(owners)s) o,
     generate_series(%(start)s::timestamptz + %(every)s, %(start)s::timestamptz + %(days)s,
                     %(every)s) t
"""


def refresh_days(
    conn: psycopg.Connection[Any], schema: str, owners: int, start: datetime, days: int
) -> None:
    """`days` days of completed refreshes every 15 minutes from `start`, each reaching back by
    the overlap over the one before, as the planner makes them."""
    execute(
        conn,
        schema,
        A_DAY,
        owners=owners,
        start=start,
        days=timedelta(days=days),
        every=EVERY,
        slice=EVERY + OVERLAP,
    )


def history_of(conn: psycopg.Connection[Any], schema: str, owners: int, end: datetime) -> None:
    start = end - timedelta(days=30)
    execute(
        conn,
        schema,
        HISTORY,
        owners=owners,
        start=start,
        end=end,
        key=f"initial:{iso(start)}",
    )


def retention(dsn: str, owners: int, days: int, keep: int) -> list[str]:
    """Simulated days, each pruned with a retention of `keep` days, as the elected planner
    would (the prune's limit is the simulated day's, expressed against the database clock)."""
    with fresh_schema(dsn, "bench_keep") as schema:
        app = shops(dsn, schema, owners)
        rows, sizes, took = [], [], []
        with psycopg.connect(dsn, autocommit=True) as conn:
            now = period_start(database_now(conn), EVERY)
            first = now - timedelta(days=days)
            history_of(conn, schema, owners, first)
            for day in range(1, days + 1):
                refresh_days(conn, schema, owners, first + timedelta(days=day - 1), 1)
                older = now - (first + timedelta(days=day)) + timedelta(days=keep)
                elapsed, _ = timed(lambda older=older: app.prune("shops", older_than=older))
                took.append(elapsed)
                # Autovacuum may be off (it is on the machine of docs/performance.md): vacuum
                # here, so that bytes show what a vacuumed table keeps.
                execute(conn, schema, "VACUUM {jobs}")
                found = relation_sizes(conn, schema)
                rows.append(found["rows"])
                sizes.append(sum(found["bytes"].values()))
        app.close()
    later = rows[keep:]
    flat = bool(later) and max(later) - min(later) <= 0.01 * max(later)
    per_day = owners * 24 * 60 // 15
    return [
        f"retention {keep} days, {owners:,} owners refreshed every 15 min ({per_day:,} rows a "
        f"day), {days} simulated days:",
        "  rows after each day:  " + " ".join(f"{r / 1000:.0f}k" for r in rows),
        "  MiB after each day:   " + " ".join(f"{s / MIB:.0f}" for s in sizes),
        f"  flat after day {keep}: {'yes' if flat else 'NO'} "
        f"(days {keep + 1}–{days}: {min(later, default=0):,}–{max(later, default=0):,} rows); "
        f"daily prune median {statistics.median(took):.2f} s",
    ]


def prune_month(dsn: str, owners: int, days: int, keep: int) -> list[str]:
    """One prune of a table that holds `days` days of refreshes."""
    with fresh_schema(dsn, "bench_prune") as schema:
        app = shops(dsn, schema, owners)
        with psycopg.connect(dsn, autocommit=True) as conn:
            now = period_start(database_now(conn), EVERY)
            history_of(conn, schema, owners, now - timedelta(days=days))
            refresh_days(conn, schema, owners, now - timedelta(days=days), days)
            execute(conn, schema, "VACUUM ANALYZE {jobs}")
            before = relation_sizes(conn, schema)["rows"]
        elapsed, deleted = timed(lambda: app.prune("shops", older_than=timedelta(days=keep)))
        app.close()
    return [
        f"prune of a {days}-day table ({before:,} rows, {owners:,} owners), keeping {keep} "
        f"days: {elapsed:.1f} s, {deleted:,} rows deleted ({deleted / elapsed:,.0f} rows/s)"
    ]


# -- costs per job -----------------------------------------------------------------------------


# The row changes of a job's life, as the worker's statements make them (take_front,
# save_page, complete_job in synclane/sql/taking.sql): one UPDATE each, so that EXPLAIN's WAL
# figures are the statement's whole WAL.
TAKE = """
UPDATE {jobs} SET status = 'running', leased_by = 'bench', lease_token = %(token)s,
       lease_expires_at = now() + interval '5 minutes', attempt_count = attempt_count + 1,
       started_at = now(), heartbeat_at = now()
WHERE id = %(id)s
"""
SAVE = """
UPDATE {jobs} SET cursor = %(cursor)s, processed_count = processed_count + 10, stalls = 0,
       heartbeat_at = now(), lease_expires_at = now() + interval '5 minutes'
WHERE id = %(id)s AND lease_token = %(token)s AND status = 'running'
"""
COMPLETE = """
UPDATE {jobs} SET status = 'completed', processed_count = processed_count + 10, error = NULL,
       completed_at = now(), heartbeat_at = now(), leased_by = NULL, lease_token = NULL,
       lease_expires_at = NULL
WHERE id = %(id)s AND lease_token = %(token)s AND status = 'running'
"""


def wal_of(
    conn: psycopg.Connection[Any], statement: Any, params: dict[str, Any]
) -> tuple[int, int]:
    """WAL records and bytes of one INSERT or UPDATE, from EXPLAIN (ANALYZE, WAL): this
    session's own WAL, whatever else the server does."""
    if isinstance(statement, bytes):  # synclane's own, as Store sends it
        statement = sql.SQL(statement.decode())
    explain = sql.SQL("EXPLAIN (ANALYZE, WAL, FORMAT JSON) ") + statement
    row = conn.execute(explain, params).fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    return int(plan.get("WAL Records", 0)), int(plan.get("WAL Bytes", 0))


def costs(dsn: str, jobs: int) -> list[str]:
    """Per job: WAL of planning it, taking it, saving a page, completing it; bytes per row;
    commits per job of a worker run."""
    import uuid

    from synclane.store import Store

    lines = []
    with fresh_schema(dsn, "bench_costs") as schema:
        shops(dsn, schema, jobs).close()
        store = Store(schema)
        table = sql.Identifier(schema, "jobs")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SET TIME ZONE 'UTC'")
            owners = [f"owner-{n}" for n in range(jobs)]
            now = database_now(conn)
            params = {
                "queue": "shops",
                "owners": owners,
                "lanes": owners,
                "owner_shapes": [0] * jobs,
                "shapes": [0],
                "types": ["orders"],
                "modes": ["recurring"],
                "priorities": [0],
                "starts": [now - timedelta(hours=1)],
                "ends": [now],
                "keys": ["recurring:bench"],
            }
            records, size = wal_of(conn, store.query("insert_jobs"), params)
            per: dict[str, list[tuple[float, float]]] = {"plan": [(records / jobs, size / jobs)]}
            ids = [r[0] for r in conn.execute(sql.SQL("SELECT id FROM {}").format(table))]
            for job_id in ids:
                job = {"id": job_id, "token": uuid.uuid4()}
                per.setdefault("take", []).append(
                    wal_of(conn, sql.SQL(TAKE).format(jobs=table), job)
                )
                for page in range(3):
                    per.setdefault("save a page", []).append(
                        wal_of(conn, sql.SQL(SAVE).format(jobs=table), {**job, "cursor": str(page)})
                    )
                per.setdefault("complete", []).append(
                    wal_of(conn, sql.SQL(COMPLETE).format(jobs=table), job)
                )
            for name, values in per.items():
                records = statistics.median(v[0] for v in values)
                size = statistics.median(v[1] for v in values)
                lines.append(f"WAL, {name}: {records:.0f} records, {size:,.0f} bytes (median)")
            execute(conn, schema, "VACUUM {jobs}")
            sizes = relation_sizes(conn, schema)
    rows = sizes["rows"]
    heap = sizes["bytes"]["jobs"]
    indexes = sum(v for k, v in sizes["bytes"].items() if k != "jobs")
    lines.append(
        f"bytes per finished row ({rows:,} rows): table {heap / rows:.0f}, indexes "
        f"{indexes / rows:.0f}"
    )
    lines += commits_per_job(dsn, jobs)
    return lines


def commits_per_job(dsn: str, jobs: int) -> list[str]:
    """A worker run of `jobs` one-page jobs in a database of the bench's own, so that the
    commits pg_stat_database counts are the worker's alone."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [SCALE_DB]).fetchone():
            conn.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(SCALE_DB)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(SCALE_DB)))
    own = psycopg.conninfo.make_conninfo(**{**info, "dbname": SCALE_DB})
    try:
        app = SyncLane(own, schema="synclane", poll_interval=0.05)
        q = app.queue("jobs", concurrency=4)
        q.snapshot("noop", every=timedelta(days=1))(lambda job: Page(None, 1))
        with psycopg.connect(own, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO synclane.jobs (queue, owner, lane, type, mode, dedup_key) "
                "SELECT 'jobs', 'o' || n, 'l' || (n %% 50), 'noop', 'manual', 'manual:' || n "
                "FROM generate_series(1, %s) n",
                [jobs],
            )
            before = committed(conn)
            app.run_worker(until_idle=True, idle_grace=0, stop_after=300)
            app.close()
            time.sleep(1.5)  # backends report their counts when idle or gone
            after = committed(conn)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(SCALE_DB))
            )
    return [
        f"commits per job, a worker with 4 slots on {jobs:,} one-page jobs in 50 lanes: "
        f"{(after - before) / jobs:.2f} (every statement of the run, reads included)"
    ]


def committed(conn: psycopg.Connection[Any]) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0])


# -- all of it ---------------------------------------------------------------------------------


def main(
    sizes: tuple[int, ...] = (10_000, 100_000, 1_000_000),
    first: int = 100_000,
    prune_owners: int = 1_000,
    days: int = 30,
    keep: int = 7,
    cost_jobs: int = 500,
    lanes: int = 100_000,
    sdk_rows: int = 10_000_000,
    sdk_owners: int = 100_000,
) -> list[str]:
    dsn = bench_dsn()
    lines: list[str] = []
    medians = {}
    for owners in sizes:
        medians[owners], found = nothing_due(dsn, owners, then_due=owners == max(sizes))
        lines += found
        print(*found, sep="\n", flush=True)
    if len(sizes) > 1:
        ratio = medians[max(sizes)] / medians[min(sizes)]
        lines.append(
            f"re-plan, nothing due: {max(sizes):,} owners ÷ {min(sizes):,} owners = {ratio:.2f}"
            " (goal ≤ 2)"
        )
    for measure in (
        lambda: explicit_plan(first),
        lambda: first_plan_lines(first),
        lambda: insert_floor(dsn, max(first // 20, 10)),
        lambda: index_costs(dsn, max(first // 20, 10)),
        lambda: retention(dsn, prune_owners, days, keep),
        lambda: prune_month(dsn, prune_owners, days, keep),
        lambda: costs(dsn, cost_jobs),
        lambda: blocked_take(lanes),
        lambda: sdk_reads(dsn, sdk_rows, sdk_owners),
    ):
        found = measure()
        lines += found
        print(*found, sep="\n", flush=True)
    return lines


def blocked_take(lanes: int) -> list[str]:
    """bench.take's blocked backlog at this many lanes: each busy lane runs one job and has
    one more waiting, so the front of the taking order is all busy lanes."""
    found = take.main(rounds=100, sizes=(), backlog_lanes=lanes, backlog_per_lane=2)
    return [f"{lanes:,} lanes, {line}" for line in found] + [
        "(goal at 100,000 lanes: blocked take, worst order, p95 < 5 ms, issue 25)"
    ]


def sdk_reads(dsn: str, rows: int, owners: int) -> list[str]:
    """bench.sdk's reads on its accounts table (progress, failures, lanes, depth)."""
    if not rows:
        return []
    return sdk.measure(dsn, "accounts", rows, 3, owners)


def smoke() -> list[str]:
    return main(
        sizes=(200, 2_000),
        first=300,
        prune_owners=5,
        days=4,
        keep=2,
        cost_jobs=40,
        lanes=200,
        sdk_rows=0,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--owners", default="10000,100000,1000000")
    parser.add_argument("--first", type=int, default=100_000)
    parser.add_argument("--prune-owners", type=int, default=1_000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--keep", type=int, default=7)
    parser.add_argument("--costs", type=int, default=500)
    parser.add_argument("--lanes", type=int, default=100_000)
    parser.add_argument("--sdk-rows", type=int, default=10_000_000)
    parser.add_argument("--sdk-owners", type=int, default=100_000)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: check that it runs")
    parser.add_argument("--first-plan-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--first-only", type=int, metavar="OWNERS", help="only: the first plan")
    parser.add_argument("--against", metavar="COMMIT", help="with --first-only: side by side")
    parser.add_argument("--rounds", type=int, default=1, help="with --against")
    parser.add_argument(
        "--index-costs", type=int, metavar="OWNERS", help="only: what each index adds to an insert"
    )
    parser.add_argument(
        "--explicit", type=int, metavar="OWNERS", help="only: app.plan() with nothing new"
    )
    args = parser.parse_args()
    if args.first_plan_child:
        first_plan_child(args.first_plan_child)
    elif args.first_only and args.against:
        first_plan_side_by_side(args.first_only, args.against, args.rounds)
    elif args.first_only:
        print(*first_plan_lines(args.first_only), sep="\n")
    elif args.explicit:
        print(*explicit_plan(args.explicit), sep="\n")
    elif args.index_costs:
        print(*index_costs(bench_dsn(), args.index_costs), sep="\n")
    elif args.smoke:
        smoke()
    else:
        main(
            tuple(int(n) for n in args.owners.split(",")),
            args.first,
            args.prune_owners,
            args.days,
            args.keep,
            args.costs,
            args.lanes,
            args.sdk_rows,
            args.sdk_owners,
        )
