"""The take's throughput next to an older commit's, in one run on one server.

    python -m bench.side_by_side [--against 2de033d] [--rounds 4] [--jobs 4000]
    python -m bench.side_by_side --pairs 12 --jobs 8000    # in step only, pair by pair

A change that may slow the take is measured against the code before it, not against a figure of
another day: this machine's pgbench varies fourfold over a day (docs/performance.md). The older
commit is checked out into a git worktree of its own (under the system's temporary folder, kept
for the next run) and its own `bench.throughput.synclane_rate` runs in a process whose imports
come from there. Each round runs, one after the other: the older commit, this code, the same two
out of step (pages of 0–2 ms at random), and `pgbench -N -c 4 -T 8`, so that a disturbance of the
machine hits one round of all, not one of them.

Order matters on one server: a run leaves a checkpoint, autovacuum and a dropped schema behind
for the run after it, and the first checkpoint after a run makes the next one write whole pages
to the WAL. So every run starts after a `CHECKPOINT` (where the role may ask for one), and the
two codes take turns at going first (round 1 the older commit, round 2 this code, ...).

Out of step, a slot's next job comes from the statement that completes its last one, so a slot
spends each job's time in that statement and in its page: with 8 slots, jobs/s is at most
8 ÷ (statement + page). In step the page takes nothing, so out of step ÷ in step cannot exceed
statement ÷ (statement + page). The run prints that ceiling from the in-step rate and the mean
time an `asyncio.sleep` of 0–2 ms takes here (the event loop wakes in whole milliseconds).

Jobs per second move with whatever else the machine runs; the CPU each job costs moves much less.
So every in-step run is also counted in CPU milliseconds a job: the workers' (each run is a
process of its own, its worker processes included) and the server's (where PostgreSQL runs on
this machine: the postmaster's processes, those it has reaped included, read from /proc; every
other database of that server counts too, so a server of its own gives the clean figure), and
the commits and WAL bytes a job.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

from bench.common import bench_dsn
from bench.throughput import UNEVEN_PAGE, pgbench_tps, synclane_rate

ROOT = Path(__file__).resolve().parent.parent
# 2de033d: the last commit before the lanes table (schema 2), the reference issue 25 names
REFERENCE = "2de033d"
SLOTS = 8  # synclane_rate's 2 processes × 4 slots


def worktree(commit: str) -> Path:
    """A checkout of `commit` beside this repository's history, made once."""
    sha = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short=12", commit],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    place = Path(tempfile.gettempdir()) / f"synclane-at-{sha}"
    if not (place / "synclane").is_dir():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=True)
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(place), sha],
            check=True,
            capture_output=True,
        )
    return place


def postmaster(dsn: str) -> int | None:
    """The process id of the server's postmaster where it runs on this machine, else None."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        backend = conn.info.backend_pid
        try:
            stat = Path(f"/proc/{backend}/stat").read_text()
        except OSError:
            return None
    parent = int(stat.rsplit(")", 1)[1].split()[1])
    return parent if Path(f"/proc/{parent}").is_dir() else None


def server_cpu(pid: int | None) -> float:
    """CPU seconds of the postmaster, its reaped backends and its live children (0.0 when the
    server is not on this machine)."""
    if pid is None:
        return 0.0
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile: its parent has reaped it, counted there
        own, parent = int(entry.name), int(fields[1])
        if own == pid:
            total += sum(int(x) for x in fields[11:15]) / tick
        elif parent == pid:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def database_totals(dsn: str) -> tuple[int, int]:
    """(commits of the bench's database, the server's WAL position in bytes)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit, pg_current_wal_lsn() - '0/0'::pg_lsn "
            "FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def costs_of(dsn: str, jobs: int, run: Callable[[], float]) -> tuple[float, dict[str, float]]:
    """`run`'s jobs/s, and what each job cost: the workers' and the server's CPU milliseconds,
    commits and WAL bytes."""
    pid = postmaster(dsn)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    server, (commits, wal) = server_cpu(pid), database_totals(dsn)
    rate = run()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_after, (commits_after, wal_after) = server_cpu(pid), database_totals(dsn)
    workers = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    return rate, {
        "workers ms": workers * 1000 / jobs,
        "server ms": (server_after - server) * 1000 / jobs if pid else float("nan"),
        "commits": (commits_after - commits) / jobs,
        "WAL bytes": (wal_after - wal) / jobs,
    }


def rate_at(place: Path, dsn: str, jobs: int, page_sleep: float) -> tuple[float, float]:
    """synclane_rate of the code checked out at `place`, in a process of its own."""
    program = (
        "import json, sys\n"
        "from bench.throughput import synclane_rate\n"
        f"print(json.dumps(synclane_rate({dsn!r}, {jobs}, page_sleep={page_sleep})))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(place)}
    done = subprocess.run(
        [sys.executable, "-c", program],
        cwd=place,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    rate, per_take = json.loads(done.stdout.strip().splitlines()[-1])
    return float(rate), float(per_take)


def checkpoint(dsn: str) -> None:
    """A CHECKPOINT, so that the run after it does not pay for the one before; skipped where
    the role may not ask for one."""
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
    except psycopg.errors.InsufficientPrivilege:
        pass


def page_time(page_sleep: float = UNEVEN_PAGE, pages: int = 1000) -> float:
    """Mean seconds that the out-of-step run's page (`asyncio.sleep` of 0 to page_sleep, at
    random) takes on this machine."""
    import random

    async def pages_run() -> float:
        started = time.perf_counter()
        for _ in range(pages):
            await asyncio.sleep(random.uniform(0, page_sleep))
        return (time.perf_counter() - started) / pages

    return asyncio.run(pages_run())


def main(against: str = REFERENCE, rounds: int = 4, jobs: int = 4000) -> list[str]:
    dsn = bench_dsn()
    place = worktree(against)
    runs: dict[str, list[float]] = {
        f"{against} in step": [],
        "this code in step": [],
        f"{against} out of step": [],
        "this code out of step": [],
        "pgbench": [],
    }
    # in step, each code runs in a process of its own, so that the CPU it costs is counted alike
    costs: dict[str, list[dict[str, float]]] = {f"{against} in step": [], "this code in step": []}

    def counted(name: str, at: Path) -> Callable[[], float]:
        def run() -> float:
            rate, cost = costs_of(dsn, jobs, lambda: rate_at(at, dsn, jobs, 0.0)[0])
            costs[name].append(cost)
            return rate

        return run

    measures: dict[str, Callable[[], float]] = {
        f"{against} in step": counted(f"{against} in step", place),
        "this code in step": counted("this code in step", ROOT),
        f"{against} out of step": lambda: rate_at(place, dsn, jobs, UNEVEN_PAGE)[0],
        "this code out of step": lambda: synclane_rate(dsn, jobs, page_sleep=UNEVEN_PAGE)[0],
    }
    names = list(measures)
    for number in range(rounds):
        # the older commit first in odd rounds, this code first in even ones
        order = names if number % 2 == 0 else [names[1], names[0], names[3], names[2]]
        for name in order:
            checkpoint(dsn)
            runs[name].append(measures[name]())
        checkpoint(dsn)
        runs["pgbench"].append(pgbench_tps(dsn, 8))
        print(
            f"round {number + 1}: "
            + ", ".join(f"{name} {values[-1]:.0f}" for name, values in runs.items())
            + f"; in step this ÷ {against}: "
            + f"{runs['this code in step'][-1] / runs[f'{against} in step'][-1]:.2f}",
            flush=True,
        )
    ratios = [
        ours / theirs
        for ours, theirs in zip(runs["this code in step"], runs[f"{against} in step"], strict=True)
    ]
    out_of_step = [
        uneven / even
        for uneven, even in zip(
            runs["this code out of step"], runs["this code in step"], strict=True
        )
    ]
    page = page_time()
    statement = SLOTS / statistics.median(runs["this code in step"])
    lines = [
        f"in step, this code ÷ {against} round by round: "
        + ", ".join(f"{r:.2f}" for r in ratios)
        + f" (median {statistics.median(ratios):.2f}; goal >= 1.0)",
        "out of step ÷ in step, this code: "
        + ", ".join(f"{r:.2f}" for r in out_of_step)
        + f" (median {statistics.median(out_of_step):.2f}; goal >= 0.8)",
        f"ceiling of out of step ÷ in step for {SLOTS} slots with one job each: "
        f"{statement * 1000:.2f} ms a statement (in step) ÷ ({statement * 1000:.2f} + "
        f"{page * 1000:.2f} ms a page) = {statement / (statement + page):.2f}",
        *(f"{name}: median {statistics.median(values):.0f}" for name, values in runs.items()),
        *(
            f"{name}, a job (median): "
            + ", ".join(
                f"{key} {statistics.median(cost[key] for cost in values):.3g}" for key in values[0]
            )
            for name, values in costs.items()
        ),
    ]
    print(*lines, sep="\n")
    return lines


def in_step_pairs(against: str = REFERENCE, pairs: int = 10, jobs: int = 8000) -> list[str]:
    """Only the in-step runs, `pairs` times each, the two codes one right after the other (the
    older commit first in odd pairs, this code first in even ones): on a machine whose speed
    drifts over minutes, a pair sees the same machine, and the median of many pairs' ratios is
    the figure to read, with its middle half (quartiles) as the spread."""
    dsn = bench_dsn()
    place = worktree(against)
    ratios: list[float] = []
    lines: list[str] = []
    for number in range(pairs):
        codes = [(against, place), ("this code", ROOT)]
        if number % 2:
            codes.reverse()
        rates: dict[str, float] = {}
        for name, at in codes:
            checkpoint(dsn)
            rates[name] = rate_at(at, dsn, jobs, 0.0)[0]
        ratios.append(rates["this code"] / rates[against])
        line = (
            f"pair {number + 1}: {against} {rates[against]:.0f}, this code "
            f"{rates['this code']:.0f} jobs/s in step; this ÷ {against}: {ratios[-1]:.2f}"
        )
        print(line, flush=True)
        lines.append(line)
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    summary = (
        f"in step, this code ÷ {against}, {pairs} pairs of {jobs} jobs: median "
        f"{statistics.median(ratios):.2f}, middle half {quartiles[0]:.2f} to {quartiles[2]:.2f}, "
        f"{sum(r >= 1.0 for r in ratios)} of {pairs} at 1.0 or more (goal: median >= 1.0)"
    )
    print(summary)
    return [*lines, summary]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default=REFERENCE)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument(
        "--pairs", type=int, default=0, help="only in-step runs: this many pairs, see in_step_pairs"
    )
    args = parser.parse_args()
    if args.pairs:
        in_step_pairs(args.against, args.pairs, args.jobs)
    else:
        main(args.against, args.rounds, args.jobs)
