"""How long taking a job takes, as the table grows and as lanes get busy.

    python -m bench.take [--rounds 200]

Each measurement runs the real take statement inside a transaction that is rolled back, so the
table stays as arranged. Scenarios:

- empty: 1,000 pending jobs over 50 lanes and no history;
- 100k / 1M finished: the same, plus that many completed rows;
- blocked backlog: 100,000 pending jobs in 1,000 lanes, 999 lanes running a job, one free
  (its jobs interleaved with the others' in taking order, as in a backfill of many accounts);
- blocked, worst order: the same, but the free lane's jobs are the oldest, so all 99,900 jobs
  ahead of them wait behind busy lanes.
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any
from uuid import uuid4

import psycopg
from psycopg import sql

from bench.common import bench_dsn, fresh_schema, summary_ms, timed
from synclane.store import WORKER_SESSION, Store
from synclane.worker.taker import LANES_A_LOOK, LOOKS


def _fill(conn: psycopg.Connection[Any], schema: str, statement: str) -> None:
    conn.execute(sql.SQL(statement).format(jobs=sql.Identifier(schema, "jobs")))


PENDING = """
INSERT INTO {jobs} (queue, owner, lane, type, mode, status, window_start, window_end, dedup_key)
SELECT 'q', 'owner-' || l, 'lane-' || l, 'orders', 'initial', 'pending',
       timestamptz '2026-01-01' - d * interval '1 day',
       timestamptz '2026-01-01' - (d - 1) * interval '1 day', 'initial:' || d
FROM generate_series(1, %(lanes)s) l, generate_series(1, %(per_lane)s) d
"""
FINISHED = """
INSERT INTO {jobs} (queue, owner, lane, type, mode, status, window_start, window_end, dedup_key,
                    completed_at)
SELECT 'q', 'old-' || (n %% 5000), 'old-' || (n %% 5000), 'orders', 'initial', 'completed',
       timestamptz '2020-01-01' + n * interval '1 minute',
       timestamptz '2020-01-01' + (n + 1) * interval '1 minute', 'initial:' || n, now()
FROM generate_series(1, %(rows)s) n
"""


def settle(
    conn: psycopg.Connection[Any], store: Store, params: dict[str, Any], schema: str, free: str
) -> None:
    """The steady state of a running fleet: each look lane by lane parks the busy lanes it reads
    (and commits that with its take), so a busy lane is read once per busy period. Here the free
    lane steps aside while looks park every busy lane, then comes back, due at once."""
    jobs, lanes = sql.Identifier(schema, "jobs"), sql.Identifier(schema, "lanes")
    hide = "UPDATE {} SET next_run_at = now() + interval '1 hour' WHERE lane = %s"
    conn.execute(sql.SQL(hide).format(jobs), [free])
    conn.commit()
    while True:
        row = conn.execute(store.query("take_by_lane"), params).fetchone()
        conn.commit()
        if row is None or row[0] < LANES_A_LOOK:
            break
    conn.execute(sql.SQL("UPDATE {} SET next_run_at = now() WHERE lane = %s").format(jobs), [free])
    conn.execute(sql.SQL("UPDATE {} SET due_at = now() WHERE lane = %s").format(lanes), [free])
    conn.commit()


PREPARED_AFTER = 10


def undo(conn: psycopg.Connection[Any]) -> None:
    """Rolls the take back below psycopg, which forgets every prepared statement of the
    connection at a rollback (conn.rollback(), or a ROLLBACK it sees go by): each take would be
    parsed and planned anew, which is not what a worker's autocommit connection does. Until
    2026-12-01 this benchmark measured that, planning included (docs/performance.md)."""
    result = conn.pgconn.exec_(b"ROLLBACK")
    if result.status != psycopg.pq.ExecStatus.COMMAND_OK:
        raise RuntimeError(f"ROLLBACK failed: {result.error_message.decode(errors='replace')}")


def measure(dsn: str, schema: str, rounds: int, free: str | None = None) -> list[float]:
    store = Store(schema)
    times = []
    with psycopg.connect(dsn) as conn:
        for setting in WORKER_SESSION:  # the session a worker's connections have
            conn.execute(setting)
        conn.commit()
        params = {
            "queue": "q",
            "worker": "bench",
            "lease": timedelta(minutes=5),
            "front": 64,
            "plain": 1,  # one slot asking, with no finished job to complete in the statement
            "done_ids": [],
            "done_tokens": [],
            "done_counts": [],
            "tokens": [uuid4()],  # the worker's own lease token for what it takes
            "token": uuid4(),
            "lane_width": 1,  # no lane wider than one and no queue cap: the default queue
            "max_running": None,
            "visit": LANES_A_LOOK,
        }

        def take() -> Any:
            # What a worker's Taker does: the front of the line, then lane by lane.
            row = conn.execute(store.query("take_front"), params).fetchone()
            if row is not None and row[1] is not None:  # (completed, id, …)
                return row
            for _ in range(LOOKS):
                row = conn.execute(store.query("take_by_lane"), params).fetchone()
                # (looked, written, id, …)
                if row is None or row[2] is not None or row[0] < LANES_A_LOOK:
                    return row if row is not None and row[2] is not None else None
                conn.commit()  # a look that parked a batch of busy lanes: keep what it learnt
            return None

        if free is not None:
            settle(conn, store, params, schema, free)

        # psycopg prepares a statement at its fifth execution on a connection: the first ones
        # are parsed and planned each time, as in a worker's first seconds, and are not timed
        for number in range(PREPARED_AFTER + rounds):
            elapsed, row = timed(take)
            assert row is not None, "the scenario must leave a job to take"
            undo(conn)
            if number >= PREPARED_AFTER:
                times.append(elapsed)
    return times


def scenario(
    dsn: str,
    name: str,
    rounds: int,
    arrange: list[tuple[str, dict[str, Any]]],
    free: str | None = None,
) -> str:
    from synclane import SyncLane

    with fresh_schema(dsn) as schema:
        SyncLane(dsn, schema=schema).close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement, params in arrange:
                conn.execute(sql.SQL(statement).format(jobs=sql.Identifier(schema, "jobs")), params)
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(schema, "jobs")))
        measure(dsn, schema, 20, free)  # warm up
        times = measure(dsn, schema, rounds)
    line = f"{name:<28} {summary_ms(times)}"
    print(line, flush=True)
    return line


BUSY = """
UPDATE {jobs} SET status = 'running', lease_token = gen_random_uuid(),
       lease_expires_at = now() + interval '1 hour'
WHERE id IN (SELECT DISTINCT ON (lane) id FROM {jobs}
             WHERE status = 'pending' AND lane <> %(free)s ORDER BY lane, id)
"""
OLDEST = """
UPDATE {jobs} SET window_start = window_start - interval '1000 days',
       window_end = window_end - interval '1000 days'
WHERE lane = %(free)s
"""


def main(
    rounds: int = 200,
    sizes: tuple[int, ...] = (0, 100_000, 1_000_000),
    backlog_lanes: int = 1000,
    backlog_per_lane: int = 100,
) -> list[str]:
    dsn = bench_dsn()
    lines = []
    small = (PENDING, {"lanes": 50, "per_lane": 20})
    for rows in sizes:
        arrange = [small] + ([(FINISHED, {"rows": rows})] if rows else [])
        label = "empty" if not rows else f"{rows:,} finished"
        lines.append(scenario(dsn, label, rounds, arrange))
    backlog = (PENDING, {"lanes": backlog_lanes, "per_lane": backlog_per_lane})
    free = f"lane-{backlog_lanes // 2}"
    busy = (BUSY, {"free": free})
    lines.append(scenario(dsn, "blocked backlog", rounds, [backlog, busy], free))
    oldest = (OLDEST, {"free": free})
    lines.append(scenario(dsn, "blocked, worst order", rounds, [backlog, oldest, busy], free))
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    main(args.rounds)
