"""What the upgrade to schema 8 costs a writer beside it.

    python -m bench.upgrade [--rows 1000000]

Makes a table of `rows` finished jobs in a schema of its own, gives it version 7's checks, and
migrates it (a `SyncLane` starting on it) while one connection updates a row of it in a loop.
Prints how long the migration took and the longest wait of that writer meanwhile. Version 8
adds its checks NOT VALID (the table's lock for an instant, no row read) and validates them in a
transaction of its own that lets writers go on (docs/operations.md, "Upgrading"); a plain
`ADD CONSTRAINT` would hold the writer for the whole read of the table.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable

import psycopg
from psycopg import sql

from bench.common import bench_dsn, fresh_schema
from synclane import SyncLane

# Version 7's checks, as its CREATE TABLE wrote them.
VERSION_7_CHECKS = (
    "ALTER TABLE {} DROP CONSTRAINT jobs_mode_check, DROP CONSTRAINT jobs_status_check,"
    " DROP CONSTRAINT jobs_check,"
    " ADD CONSTRAINT jobs_mode_check CHECK (mode IN ('initial', 'recurring', 'manual')),"
    " ADD CONSTRAINT jobs_status_check CHECK (status IN ('pending', 'running', 'completed',"
    " 'failed', 'deferred', 'abandoned', 'cancelled')),"
    " ADD CONSTRAINT jobs_check"
    " CHECK (window_start IS NULL OR window_end IS NULL OR window_start < window_end)"
)


def main(rows: int = 1_000_000) -> list[str]:
    dsn = bench_dsn()
    with fresh_schema(dsn, "bench_upgrade") as schema:
        SyncLane(dsn, schema=schema).close()
        jobs = sql.Identifier(schema, "jobs")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (queue, owner, lane, type, mode, status, dedup_key)"
                    " SELECT 'q', 'owner-' || (n %% 1000), 'lane', 'orders', 'manual',"
                    " 'completed', 'manual:' || n FROM generate_series(1, %s) n"
                ).format(jobs),
                [rows],
            )
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(jobs))
            conn.execute(sql.SQL(VERSION_7_CHECKS).format(jobs))
            versions = sql.Identifier(schema, "schema_version")
            conn.execute(sql.SQL("DELETE FROM {}").format(versions))
            conn.execute(sql.SQL("INSERT INTO {} (version) VALUES (7)").format(versions))
        migrated = _beside_a_writer(dsn, jobs, lambda: SyncLane(dsn, schema=schema).close())
        # the reference, in the same run: the same change made by a plain ALTER TABLE, which
        # checks every row under the table's lock (here, back to version 7's checks)
        with psycopg.connect(dsn, autocommit=True) as conn:
            plain = _beside_a_writer(
                dsn, jobs, lambda: conn.execute(sql.SQL(VERSION_7_CHECKS).format(jobs))
            )
    return [
        f"upgrade 7 -> 8 of {rows:,} rows: {migrated[0]:.2f} s; a writer beside it waited at "
        f"most {migrated[1] * 1000:.0f} ms",
        f"the same checks by a plain ALTER TABLE: {plain[0]:.2f} s; the writer waited at most "
        f"{plain[1] * 1000:.0f} ms",
    ]


def _beside_a_writer(
    dsn: str, jobs: sql.Identifier, change: Callable[[], object]
) -> tuple[float, float]:
    """(seconds `change` took, the longest update of a row of `jobs` meanwhile, in seconds)."""
    waits: list[float] = []
    done = threading.Event()

    def writer() -> None:
        update = sql.SQL("UPDATE {} SET processed_count = processed_count + 1 WHERE id = 1")
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not done.is_set():
                started = time.perf_counter()
                conn.execute(update.format(jobs))
                waits.append(time.perf_counter() - started)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        time.sleep(0.3)
        started = time.perf_counter()
        change()
        took = time.perf_counter() - started
        time.sleep(0.2)
    finally:
        done.set()
        thread.join()
    return took, max(waits)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    print(*main(parser.parse_args().rows), sep="\n")
