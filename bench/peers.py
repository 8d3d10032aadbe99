"""Jobs per second of two peer job queues, procrastinate and pgqueuer, on synclane's workload.

    python -m bench.peers [--jobs 4000] [--rounds 3]

The workload of bench/throughput.py: N one-step jobs that do nothing, enqueued in bulk before
the clock starts (each library's own batch call, then VACUUM ANALYZE of its job table), then 2
worker processes × 4 jobs at a time, all on the same PostgreSQL. Each library has a database of
its own on that server (synclane_bench_procrastinate, synclane_bench_pgqueuer): before every
round its connections are ended, its public schema is dropped and recreated and the library
installs its tables there. Nothing else on the server is touched.

Workers are spawned processes that import the library, connect and register the no-op task,
then wait on an Event; the parent sets it once all are ready, so spawn, import and connection
time are not counted. Each worker exits by itself once the queue is empty:

- procrastinate: `App(PsycopgConnector)` (psycopg pool of its default size) and
  `run_worker_async(concurrency=4, wait=False)`, which returns when a fetch finds no job; one job
  per fetch; the default asyncio loop, as its CLI.
- pgqueuer: `PgQueuer(AsyncpgDriver(connection))` on one asyncpg connection, as in its README,
  and `qm.run(mode=drain, max_concurrent_tasks=4, batch_size=2)`: 2 is the largest batch it
  accepts under a cap of 4 (it requires max_concurrent_tasks >= 2 × batch_size). Completions are
  buffered and written batch_size at a time (or every 0.1 s). uvloop, as its `pgq run` CLI.

Rate: jobs / (last finish − first start), from each library's own timestamps, like synclane's
(last completed_at − first started_at): procrastinate_events (first 'started' `at`, last
'succeeded' `at`) and pgqueuer_log (first 'picked' `created`, last 'successful' `created`). All
are now() of the transaction that took or finished the job. Each round's line also gives the
wall-clock rate: jobs / (from the start signal until every worker process has exited), which
adds the workers' start-up queries and shutdown.

Not quite like for like: neither has synclane's lanes (one job per lane at a time) nor its
windows and cursors, and with synchronous_commit=on the rate follows WAL flushes per job, about
1.8 for procrastinate (a commit to take each job, one to finish it) and 1.0 for pgqueuer (it
takes and finishes jobs in batches of 2).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import time
from collections.abc import Callable
from importlib.metadata import version
from typing import Any, NamedTuple

import psycopg
from psycopg import sql

from bench.common import bench_dsn

PROCRASTINATE_DB = "synclane_bench_procrastinate"
PGQUEUER_DB = "synclane_bench_pgqueuer"
RUN_TIMEOUT = 600  # seconds from the start signal until every job is done
READY_TIMEOUT = 120  # seconds for the workers to start, import and connect


class Run(NamedTuple):
    rate: float  # jobs / (last finish − first start), from the library's tables
    wall_rate: float  # jobs / (start signal → all worker processes exited)


def _reset_database(dsn: str, name: str) -> str:
    """Create database `name` if missing, empty its public schema; return its DSN."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
        if exists.fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    target = psycopg.conninfo.make_conninfo(**{**info, "dbname": name})
    with psycopg.connect(target, autocommit=True) as conn:
        # Workers of an interrupted run could still hold locks on the old tables.
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        conn.execute("DROP SCHEMA IF EXISTS public CASCADE")
        conn.execute("CREATE SCHEMA public")
    return target


def _scalar(dsn: str, statement: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(statement).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return row[0]


def _run_workers(
    target: Callable[..., None], dsn: str, processes: int, concurrency: int, name: str
) -> float:
    """Start the workers, release them together, wait until all exit; return the wall time."""
    context = multiprocessing.get_context("spawn")
    go = context.Event()
    ready = [context.Event() for _ in range(processes)]
    workers = [
        context.Process(target=target, args=(dsn, concurrency, event, go), daemon=True)
        for event in ready
    ]
    try:
        for worker in workers:
            worker.start()
        deadline = time.monotonic() + READY_TIMEOUT
        for worker, event in zip(workers, ready, strict=True):
            while not event.wait(0.1):
                if worker.exitcode is not None:
                    raise RuntimeError(f"a {name} worker exited with {worker.exitcode} at start")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the {name} workers did not start in {READY_TIMEOUT} s")
        started = time.perf_counter()
        go.set()
        deadline = time.monotonic() + RUN_TIMEOUT
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
            if worker.is_alive():
                raise RuntimeError(f"the {name} run did not finish in 10 minutes")
        wall = time.perf_counter() - started
        failed = [worker.exitcode for worker in workers if worker.exitcode != 0]
        if failed:
            raise RuntimeError(f"{name} workers exited with {failed}")
        return wall
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
        for worker in workers:
            if worker.pid is not None:
                worker.join(timeout=30)
            if worker.is_alive():
                worker.kill()
                worker.join(timeout=10)


# procrastinate


def _procrastinate_app(dsn: str) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop")
    async def noop() -> None:
        return None

    return app


def _procrastinate_worker(dsn: str, concurrency: int, ready: Any, go: Any) -> None:
    app = _procrastinate_app(dsn)

    async def work() -> None:
        async with app.open_async():
            ready.set()
            if await asyncio.to_thread(go.wait, RUN_TIMEOUT + READY_TIMEOUT):
                await app.run_worker_async(concurrency=concurrency, wait=False)

    asyncio.run(work())


async def _procrastinate_fill(dsn: str, jobs: int) -> None:
    app = _procrastinate_app(dsn)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        await app.tasks["noop"].batch_defer_async(*({} for _ in range(jobs)))


def _procrastinate_run(dsn: str, jobs: int, processes: int, concurrency: int) -> Run:
    target = _reset_database(dsn, PROCRASTINATE_DB)
    asyncio.run(_procrastinate_fill(target, jobs))
    with psycopg.connect(target, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE procrastinate_jobs")
    wall = _run_workers(_procrastinate_worker, target, processes, concurrency, "procrastinate")
    done = _scalar(target, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'")
    if done != jobs:
        raise RuntimeError(f"procrastinate finished {done} of {jobs} jobs")
    span = _scalar(
        target,
        "SELECT extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded') "
        "- min(at) FILTER (WHERE type = 'started')) FROM procrastinate_events",
    )
    return Run(jobs / float(span), jobs / wall)


def procrastinate_rate(dsn: str, jobs: int, processes: int = 2, concurrency: int = 4) -> float:
    """procrastinate's jobs/s: jobs / (last 'succeeded' event − first 'started' event).

    `dsn` is the server's: the run uses a database of its own there, PROCRASTINATE_DB.
    """
    return _procrastinate_run(dsn, jobs, processes, concurrency).rate


# pgqueuer


def _asyncpg_connect(dsn: str) -> Any:
    """asyncpg takes URLs, not psycopg's key=value strings: pass the usual keys one by one."""
    import asyncpg

    info = psycopg.conninfo.conninfo_to_dict(dsn)
    keys = {"host": "host", "port": "port", "user": "user", "password": "password"}
    options: dict[str, Any] = {key: info[name] for name, key in keys.items() if name in info}
    if "port" in options:
        options["port"] = int(options["port"])
    return asyncpg.connect(database=info.get("dbname"), **options)


def _pgqueuer_worker(dsn: str, concurrency: int, ready: Any, go: Any) -> None:
    from pgqueuer import AsyncpgDriver, Job, PgQueuer
    from pgqueuer.domain.types import QueueExecutionMode

    async def work() -> None:
        connection = await _asyncpg_connect(dsn)
        try:
            pgq = PgQueuer(AsyncpgDriver(connection))

            @pgq.entrypoint("noop")
            async def noop(job: Job) -> None:
                return None

            ready.set()
            if await asyncio.to_thread(go.wait, RUN_TIMEOUT + READY_TIMEOUT):
                await pgq.qm.run(
                    mode=QueueExecutionMode.drain,
                    batch_size=max(1, concurrency // 2),
                    max_concurrent_tasks=concurrency,
                )
        finally:
            await connection.close()

    try:
        import uvloop
    except ImportError:  # pgqueuer's CLI falls back the same way
        asyncio.run(work())
    else:
        uvloop.run(work())


async def _pgqueuer_fill(dsn: str, jobs: int) -> None:
    from pgqueuer import AsyncpgDriver, Queries

    connection = await _asyncpg_connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(connection))
        await queries.install()
        await queries.enqueue(["noop"] * jobs, [None] * jobs, [0] * jobs)
    finally:
        await connection.close()


def _pgqueuer_run(dsn: str, jobs: int, processes: int, concurrency: int) -> Run:
    target = _reset_database(dsn, PGQUEUER_DB)
    asyncio.run(_pgqueuer_fill(target, jobs))
    with psycopg.connect(target, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE pgqueuer")
    wall = _run_workers(_pgqueuer_worker, target, processes, concurrency, "pgqueuer")
    done = _scalar(target, "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'")
    left = _scalar(target, "SELECT count(*) FROM pgqueuer")
    if done != jobs or left:
        raise RuntimeError(f"pgqueuer finished {done} of {jobs} jobs, {left} left in its queue")
    span = _scalar(
        target,
        "SELECT extract(epoch FROM max(created) FILTER (WHERE status = 'successful') "
        "- min(created) FILTER (WHERE status = 'picked')) FROM pgqueuer_log",
    )
    return Run(jobs / float(span), jobs / wall)


def pgqueuer_rate(dsn: str, jobs: int, processes: int = 2, concurrency: int = 4) -> float:
    """pgqueuer's jobs/s: jobs / (last 'successful' log row − first 'picked' log row).

    `dsn` is the server's: the run uses a database of its own there, PGQUEUER_DB.
    """
    return _pgqueuer_run(dsn, jobs, processes, concurrency).rate


def main(jobs: int = 4000, rounds: int = 3) -> list[str]:
    dsn = bench_dsn()
    runs: dict[str, list[Run]] = {"procrastinate": [], "pgqueuer": []}
    for number in range(rounds):
        runs["procrastinate"].append(_procrastinate_run(dsn, jobs, 2, 4))
        runs["pgqueuer"].append(_pgqueuer_run(dsn, jobs, 2, 4))
        print(
            f"round {number + 1}: "
            + ", ".join(
                f"{name} {done[-1].rate:.0f} jobs/s (wall clock {done[-1].wall_rate:.0f})"
                for name, done in runs.items()
            ),
            flush=True,
        )
    lines = [
        f"{name} {version(name)}, 2 processes × 4 concurrency: "
        f"median {statistics.median(run.rate for run in done):.0f} jobs/s"
        for name, done in runs.items()
    ]
    for line in lines:
        print(line)
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    # The importable module's copy, so procrastinate's App is not made in __main__ (it warns).
    from bench import peers

    peers.main(args.jobs, args.rounds)
