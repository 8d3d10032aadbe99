"""Jobs per second for one-page no-op jobs, next to PostgreSQL's ceiling and two peer queues.

    python -m bench.throughput [--jobs 4000] [--rounds 3]

synclane: 50 lanes, 2 worker processes × 4 slots, each job one page that does nothing; the rate
is jobs / (last completed_at − first started_at), read from the table. References, each run once
per round on the same server: `pgbench -N -c 4 -T 10` (simple updates, 4 clients) TPS, and the
same workload on procrastinate and pgqueuer (bench/peers.py). The issue's goal, a ratio of 0.5
to pgbench, is what two commits a job would reach; synclane's slots share commits (one statement
completes the jobs they finished and takes their next ones), so it can do better.

Flow control (docs/flow-control.md): each round also runs the in-step workload with a queue cap
(`max_running=8`, as many as the slots, so that it never holds a slot back and the figure is its
cost alone: a free slot number is drawn and carried by a unique index) and with a lane rate
(`lane_rate=(1000, 1 s)`, far above what a lane reaches here, so that each page start is counted
and checked in the lane's row without ever waiting).
"""

from __future__ import annotations

import argparse
import multiprocessing
import re
import shutil
import statistics
import subprocess
import time
from importlib.metadata import version
from typing import Any

import psycopg
from psycopg import sql

from bench.common import bench_dsn, fresh_schema

PGBENCH_DB = "synclane_pgbench"
PEERS = ("procrastinate", "pgqueuer")
UNEVEN_PAGE = 0.002  # seconds: the longest page of the out-of-step run


# Queue settings of the flow-control runs, by name.
FLOW_CONTROL: dict[str, dict[str, Any]] = {
    "max_running=8": {"max_running": 8},
    "lane_rate=1000/s": {"lane_rate": (1000, 1.0)},
}


def _worker(dsn: str, schema: str, ready: Any, page_sleep: float, settings: dict[str, Any]) -> None:
    import asyncio
    import random

    from synclane import Page, SyncLane

    app = SyncLane(dsn, schema=schema, poll_interval=0.05, plan_interval=3600)
    queue = app.queue("bench", concurrency=4, **settings)

    @queue.snapshot("noop", every=86400)
    async def noop(job: Any) -> Page:
        if page_sleep:
            await asyncio.sleep(random.uniform(0, page_sleep))
        return Page(None, 1)

    ready.set()
    app.run_worker(stop_after=600)


def synclane_rate(
    dsn: str,
    jobs: int,
    lanes: int = 50,
    processes: int = 2,
    page_sleep: float = 0.0,
    settings: dict[str, Any] | None = None,
) -> tuple[float, float]:
    """Jobs per second, and jobs per take statement. With page_sleep, each page waits a random
    time up to that many seconds, so that slots finish out of step; `settings` are the queue's
    (flow control)."""
    with fresh_schema(dsn) as schema:
        from synclane import SyncLane

        SyncLane(dsn, schema=schema).close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (queue, owner, lane, type, mode, dedup_key) "
                    "SELECT 'bench', 'owner-' || (n %% %s), 'lane-' || (n %% %s), 'noop', "
                    "'manual', 'manual:' || n FROM generate_series(1, %s) n"
                ).format(sql.Identifier(schema, "jobs")),
                (lanes, lanes, jobs),
            )
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(schema, "jobs")))
        context = multiprocessing.get_context("spawn")
        events = [context.Event() for _ in range(processes)]
        workers = [
            context.Process(target=_worker, args=(dsn, schema, event, page_sleep, settings or {}))
            for event in events
        ]
        for worker in workers:
            worker.start()
        with psycopg.connect(dsn, autocommit=True) as conn:
            table = sql.Identifier(schema, "jobs")
            done = sql.SQL("SELECT count(*) FROM {} WHERE status = 'completed'").format(table)
            deadline = time.monotonic() + 600
            while conn.execute(done).fetchone()[0] < jobs:  # type: ignore[index]
                if time.monotonic() > deadline:
                    raise RuntimeError("the throughput run did not finish in 10 minutes")
                time.sleep(0.2)
            # Jobs taken in one statement share its transaction time, so distinct start times
            # count the statements (and commits) that took jobs.
            span, takes = conn.execute(
                sql.SQL(
                    "SELECT extract(epoch FROM max(completed_at) - min(started_at)), "
                    "count(DISTINCT started_at) FROM {}"
                ).format(table)
            ).fetchone()  # type: ignore[misc]
        for worker in workers:
            if worker.pid is not None:
                worker.terminate()
        for worker in workers:
            worker.join(timeout=30)
        return jobs / float(span), jobs / takes


def pgbench_tps(dsn: str, seconds: int = 10, clients: int = 4) -> float:
    """TPS of `pgbench -N` on a database of its own on the same server."""
    if shutil.which("pgbench") is None:
        raise RuntimeError("pgbench is not installed (Debian: postgresql-client)")
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (PGBENCH_DB,))
        if exists.fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(PGBENCH_DB)))
    target = psycopg.conninfo.make_conninfo(**{**info, "dbname": PGBENCH_DB})
    subprocess.run(["pgbench", "-i", "-q", target], check=True, capture_output=True)
    done = subprocess.run(
        ["pgbench", "-N", "-c", str(clients), "-j", "2", "-T", str(seconds), target],
        check=True,
        capture_output=True,
        text=True,
    )
    match = re.search(r"tps = ([0-9.]+)", done.stdout)
    if match is None:
        raise RuntimeError(f"no TPS in pgbench's output: {done.stdout[-500:]}")
    return float(match.group(1))


def main(jobs: int = 4000, rounds: int = 3, pgbench_seconds: int = 10) -> list[str]:
    """Each round runs synclane, pgbench, procrastinate and pgqueuer one after the other, so
    that a disturbance of the machine hits one round of all four, not one of them."""
    from bench import peers

    dsn = bench_dsn()
    rates: dict[str, list[float]] = {"synclane": [], "pgbench": [], **{p: [] for p in PEERS}}
    takes: dict[str, list[float]] = {"in step": [], "out of step": []}
    uneven: list[float] = []
    controlled: dict[str, list[float]] = {name: [] for name in FLOW_CONTROL}
    for number in range(rounds):
        rate, per_take = synclane_rate(dsn, jobs)
        rates["synclane"].append(rate)
        takes["in step"].append(per_take)
        for name, settings in FLOW_CONTROL.items():
            controlled[name].append(synclane_rate(dsn, jobs, settings=settings)[0])
        rate, per_take = synclane_rate(dsn, jobs, page_sleep=UNEVEN_PAGE)
        uneven.append(rate)
        takes["out of step"].append(per_take)
        rates["pgbench"].append(pgbench_tps(dsn, pgbench_seconds))
        rates["procrastinate"].append(peers.procrastinate_rate(dsn, jobs))
        rates["pgqueuer"].append(peers.pgqueuer_rate(dsn, jobs))
        print(
            f"round {number + 1}: "
            + ", ".join(f"{name} {values[-1]:.0f}" for name, values in rates.items()),
            flush=True,
        )
    median = {name: statistics.median(values) for name, values in rates.items()}
    fastest = max(PEERS, key=lambda name: median[name])
    lines = [
        f"synclane, 50 lanes, 2 processes × 4 slots: median {median['synclane']:.0f} jobs/s",
        f"pgbench -N -c 4: median {median['pgbench']:.0f} TPS",
        f"ratio: {median['synclane'] / median['pgbench']:.2f} (goal >= 0.8, issues 14, 16, 21)",
        f"synclane jobs per take statement (and commit): median "
        f"{statistics.median(takes['in step']):.1f}",
        f"synclane, pages of 0–{UNEVEN_PAGE * 1000:.0f} ms at random (slots out of step): median "
        f"{statistics.median(uneven):.0f} jobs/s, "
        f"{statistics.median(takes['out of step']):.1f} jobs per take statement "
        f"(÷ pgbench: {statistics.median(uneven) / median['pgbench']:.2f})",
        *(
            f"synclane with {name}: median {statistics.median(values):.0f} jobs/s "
            f"(÷ pgbench: {statistics.median(values) / median['pgbench']:.2f}, "
            f"÷ without: {statistics.median(values) / median['synclane']:.2f})"
            for name, values in controlled.items()
        ),
        *(
            f"{name} {version(name)}, 2 processes × 4: median {median[name]:.0f} jobs/s"
            for name in PEERS
        ),
        f"synclane / fastest peer ({fastest}): {median['synclane'] / median[fastest]:.2f} "
        "(goal >= 1)",
    ]
    for line in lines:
        print(line)
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pgbench-seconds", type=int, default=10)
    args = parser.parse_args()
    main(args.jobs, args.rounds, args.pgbench_seconds)
