"""Pages per second when pages wait on an API, next to PostgreSQL's ceiling (issue 19).

    python -m bench.pages [--jobs 2000] [--rounds 2] [--smoke]

Real sync work waits on the other side for tens of milliseconds a page, and synclane saves the
cursor after every page. Workloads, each with async handlers that sleep per page, 400 lanes,
jobs of 5 pages:

- 2 processes × 16 slots, 50 ms pages: utilisation, the ideal time (pages × 50 ms ÷ 32 slots)
  over the measured span; 1.0 means the database never made a slot wait;
- 4 processes × 32 slots, 20 ms pages: pages per second, next to `pgbench -N -c 4` run in the
  same round;
- the same with the worker sessions at synchronous_commit = off (the option this benchmark
  weighs: docs/performance.md says why synclane does not offer it).

Each line also says how many pages one commit carried: the commits the database counted during
the run (pg_stat_database) over the pages saved. The out-of-step take (one-page no-op jobs whose
pages last 0–2 ms at random) is measured by bench/throughput.py.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time
from typing import Any

import psycopg
from psycopg import sql

from bench.common import bench_dsn, fresh_schema
from bench.throughput import pgbench_tps

PAGES = 5
LANES = 400


def _worker(
    dsn: str, schema: str, ready: Any, slots: int, page_seconds: float, options: str
) -> None:
    import asyncio

    if options:
        os.environ["PGOPTIONS"] = options
    from synclane import Page, SyncLane

    app = SyncLane(dsn, schema=schema, poll_interval=0.05, plan_interval=3600)
    queue = app.queue("bench", concurrency=slots)

    @queue.snapshot("pages", every=86400)
    async def pages(job: Any) -> Page:
        await asyncio.sleep(page_seconds)
        done = int(job.cursor or 0) + 1
        return Page(None if done >= PAGES else str(done), 1)

    ready.set()
    app.run_worker(stop_after=900)


def _commits(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0])


def run(
    dsn: str,
    jobs: int,
    processes: int,
    slots: int,
    page_seconds: float,
    options: str = "",
) -> dict[str, float]:
    """Pages per second, utilisation and pages per commit of one workload."""
    with fresh_schema(dsn) as schema:
        from synclane import SyncLane

        SyncLane(dsn, schema=schema).close()
        table = sql.Identifier(schema, "jobs")
        context = multiprocessing.get_context("spawn")
        events = [context.Event() for _ in range(processes)]
        workers = [
            context.Process(target=_worker, args=(dsn, schema, event, slots, page_seconds, options))
            for event in events
        ]
        for worker in workers:
            worker.start()
        try:
            # Every process is ready before the jobs exist, so that the span measures work,
            # not how long processes take to start.
            for event in events:
                if not event.wait(120):
                    raise RuntimeError("a worker process did not start in 2 minutes")
            with psycopg.connect(dsn, autocommit=True) as conn:
                commits_before = _commits(conn)
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {} (queue, owner, lane, type, mode, dedup_key) "
                        "SELECT 'bench', 'owner-' || n, 'lane-' || (n %% %s), 'pages', "
                        "'manual', 'manual:' || n FROM generate_series(1, %s) n"
                    ).format(table),
                    (LANES, jobs),
                )
                done = sql.SQL("SELECT count(*) FROM {} WHERE status = 'completed'").format(table)
                deadline = time.monotonic() + 900
                while conn.execute(done).fetchone()[0] < jobs:  # type: ignore[index]
                    if time.monotonic() > deadline:
                        raise RuntimeError("the pages run did not finish in 15 minutes")
                    time.sleep(0.2)
                commits = _commits(conn) - commits_before
                row = conn.execute(
                    sql.SQL(
                        "SELECT extract(epoch FROM max(completed_at) - min(started_at)) FROM {}"
                    ).format(table)
                ).fetchone()
                assert row is not None
                span = float(row[0])
        finally:
            for worker in workers:
                if worker.pid is not None:
                    worker.terminate()
            for worker in workers:
                worker.join(timeout=30)
    pages = jobs * PAGES
    ideal = pages * page_seconds / (processes * slots)
    return {
        "pages_per_second": pages / span,
        "utilisation": ideal / span,
        "pages_per_commit": pages / max(commits, 1),
    }


def main(jobs: int = 2000, rounds: int = 2, pgbench_seconds: int = 10) -> list[str]:
    dsn = bench_dsn()
    found: dict[str, list[dict[str, float]]] = {"50 ms": [], "20 ms": [], "20 ms async": []}
    tps: list[float] = []
    for number in range(rounds):
        found["50 ms"].append(run(dsn, jobs, 2, 16, 0.050))
        found["20 ms"].append(run(dsn, jobs, 4, 32, 0.020))
        found["20 ms async"].append(
            run(dsn, jobs, 4, 32, 0.020, options="-c synchronous_commit=off")
        )
        tps.append(pgbench_tps(dsn, pgbench_seconds))
        print(
            f"round {number + 1}: "
            + ", ".join(f"{k} {v[-1]['pages_per_second']:.0f} pages/s" for k, v in found.items())
            + f", pgbench {tps[-1]:.0f} TPS",
            flush=True,
        )

    def median(workload: str, key: str) -> float:
        return statistics.median(result[key] for result in found[workload])

    pgbench = statistics.median(tps)
    lines = [
        f"2 processes × 16 slots, 50 ms pages: {median('50 ms', 'pages_per_second'):.0f} "
        f"pages/s, utilisation {median('50 ms', 'utilisation'):.2f} (goal >= 0.97), "
        f"{median('50 ms', 'pages_per_commit'):.1f} pages a commit",
        f"4 processes × 32 slots, 20 ms pages: {median('20 ms', 'pages_per_second'):.0f} "
        f"pages/s = {median('20 ms', 'pages_per_second') / pgbench:.2f} × pgbench -N -c 4 "
        f"({pgbench:.0f} TPS; goal >= 1.2), utilisation {median('20 ms', 'utilisation'):.2f}, "
        f"{median('20 ms', 'pages_per_commit'):.1f} pages a commit",
        f"the same, synchronous_commit = off: {median('20 ms async', 'pages_per_second'):.0f} "
        f"pages/s, utilisation {median('20 ms async', 'utilisation'):.2f}",
    ]
    for line in lines:
        print(line)
    return lines


def smoke() -> list[str]:
    """Seconds, not minutes: that it runs."""
    dsn = bench_dsn()
    result = run(dsn, 40, 1, 4, 0.005)
    line = (
        f"smoke: {result['pages_per_second']:.0f} pages/s, "
        f"{result['pages_per_commit']:.1f} pages a commit"
    )
    print(line)
    return [line]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pgbench-seconds", type=int, default=10)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        smoke()
    else:
        main(args.jobs, args.rounds, args.pgbench_seconds)
