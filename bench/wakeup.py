"""Instant pickup: how long an idle worker takes to start a job that was just enqueued.

    python -m bench.wakeup [--jobs 200] [--processes 1 3] [--smoke]

Worker processes with 4 slots each and poll_interval=30 s wait, idle. The bench enqueues one job
at a time (app.enqueue, then a pause of 20–80 ms at random, so the workers are idle again) and
times from just before enqueue() is called until the job's handler starts, on this machine's
clock (time.time() in both processes). A poll would take up to 30 s: every figure far below
that is a notification (synclane.wakeup). The goal: p95 < 100 ms.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from bench.common import bench_dsn, fresh_schema, percentile

POLL = 30.0  # seconds: only a notification starts a job quickly
SLOTS = 4
GOAL_MS = 100.0


def _worker(dsn: str, schema: str, starts: Any) -> None:
    from synclane import Job, Page, SyncLane

    app = SyncLane(dsn, schema=schema, poll_interval=POLL, plan_interval=3600)
    queue = app.queue("bench", concurrency=SLOTS)

    @queue.snapshot("noop", every=86400)
    async def noop(job: Job) -> Page:
        starts.put((job.id, time.time()))
        return Page(None, 1)

    app.run_worker(stop_after=3600)


def wake_latencies(dsn: str, jobs: int, processes: int) -> list[float]:
    """Seconds from enqueue to the first page, one per job."""
    from synclane import Page, SyncLane

    with fresh_schema(dsn, "bench_wakeup") as schema:
        app = SyncLane(dsn, schema=schema, poll_interval=POLL)
        app.queue("bench").snapshot("noop", every=86400)(lambda job: Page(None, 1))
        context = multiprocessing.get_context("spawn")
        starts = context.Queue()
        workers = [
            context.Process(target=_worker, args=(dsn, schema, starts)) for _ in range(processes)
        ]
        for worker in workers:
            worker.start()
        try:
            _wait_until_listed(dsn, schema, processes)
            latencies = []
            for number in range(jobs):
                asked = time.time()
                job_id = app.enqueue("bench", f"owner-{number}", "noop")
                started_id, started = starts.get(timeout=POLL * 2)
                assert started_id == job_id, "one job at a time"
                latencies.append(started - asked)
                time.sleep(random.uniform(0.02, 0.08))
            return latencies
        finally:
            for worker in workers:
                worker.terminate()
            for worker in workers:
                worker.join(timeout=30)
            app.close()


def _wait_until_listed(dsn: str, schema: str, processes: int) -> None:
    """Workers listen before their first take: once listed (and that take done), they wait."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        query = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "workers"))
        deadline = time.monotonic() + 60
        while conn.execute(query).fetchone()[0] < processes:  # type: ignore[index]
            if time.monotonic() > deadline:
                raise RuntimeError("the worker processes did not start within a minute")
            time.sleep(0.1)
    time.sleep(0.5)


def main(jobs: int = 200, processes: Sequence[int] = (1, 3)) -> list[str]:
    dsn = bench_dsn()
    lines = []
    for count in processes:
        latencies = [seconds * 1000 for seconds in wake_latencies(dsn, jobs, count)]
        p95 = percentile(latencies, 0.95)
        lines.append(
            f"enqueue → first page, idle workers ({count} process{'es' if count > 1 else ''} × "
            f"{SLOTS} slots, poll_interval={POLL:.0f} s), {jobs} jobs: median "
            f"{statistics.median(latencies):.1f} ms, p95 {p95:.1f} ms, max {max(latencies):.1f} "
            f"ms (goal: p95 < {GOAL_MS:.0f} ms{'' if p95 < GOAL_MS else ': MISSED'})"
        )
        print(lines[-1], flush=True)
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--smoke", action="store_true", help="20 jobs, one process: that it runs")
    args = parser.parse_args()
    if args.smoke:
        main(jobs=20, processes=(1,))
    else:
        main(args.jobs, args.processes)
