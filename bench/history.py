"""How long a fleet's history takes to plan and load, and what a history slice costs a worker.

    python -m bench.history [--owners 2000] [--against COMMIT] [--rounds 2]

Owners with a two-year history in 30-day slices (25 slices each, one-page no-op handlers, one lane
each), loaded by 2 worker processes × 4 slots until nothing is due: the first plan's time and
rows, then the history's jobs per second (slices completed ÷ the span from the first start to the
last completion, read from the table). Since schema 6 a first plan writes each owner's newest two
slices and the statement that completes a slice also plans the next one (lazy history), so some
of what the planner did moves into the workers' statements: this measures both sides.

`--against COMMIT` runs the same with that commit's synclane (its files from `git archive`, on
PYTHONPATH), the two codes taking turns at going first, each after a CHECKPOINT.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()


def declare(dsn: str, schema: str, owners: int) -> Any:
    from synclane import Owner, Page, SyncLane

    app = SyncLane(dsn, schema=schema, poll_interval=0.05, plan_interval=3600)
    queue = app.queue("bench", concurrency=4)
    queue.owners(lambda name: [Owner(f"owner-{n}") for n in range(owners)])

    @queue.windowed(
        "orders", horizon=timedelta(days=730), slice=timedelta(days=30), every=timedelta(days=1)
    )
    async def orders(job: Any) -> Page:
        return Page(None, 1)

    return app


def worker(dsn: str, schema: str, owners: int) -> None:
    """One worker process: works until nothing is due for a second."""
    app = declare(dsn, schema, owners)
    print("ready", flush=True)
    app.run_worker(until_idle=True, idle_grace=1.0, stop_after=900)
    app.close()


def child(owners: int) -> None:
    """The whole measurement with the synclane on the path; prints JSON."""
    import psycopg
    from psycopg import sql

    from bench.common import bench_dsn, fresh_schema, timed

    dsn = bench_dsn()
    with fresh_schema(dsn, "bench_history") as schema:
        app = declare(dsn, schema, owners)
        planned, added = timed(app.plan)
        app.close()
        processes = [
            subprocess.Popen(
                [sys.executable, str(HERE), "--worker", dsn, schema, str(owners)],
                stdout=subprocess.PIPE,
                text=True,
                env=os.environ,
            )
            for _ in range(2)
        ]
        for process in processes:
            assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        for process in processes:
            process.wait(timeout=1800)
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                sql.SQL(
                    "SELECT count(*), extract(epoch FROM max(completed_at) - min(started_at))"
                    " FROM {} WHERE mode = 'initial' AND status = 'completed'"
                ).format(sql.Identifier(schema, "jobs"))
            ).fetchone()
    assert row is not None
    print(
        json.dumps(
            {
                "plan_s": planned,
                "planned": added["bench"],
                "slices": row[0],
                "load_s": float(row[1]),
            }
        )
    )


def measure(owners: int, code: Path | None) -> str:
    env = {**os.environ, "PYTHONPATH": str(code or HERE.parent.parent)}
    done = subprocess.run(
        [sys.executable, str(HERE), "--child", str(owners)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return (
        f"{owners:,} owners: first plan {found['plan_s']:.1f} s ({found['planned']:,} rows), "
        f"history loaded in {found['load_s']:.1f} s ({found['slices']:,} slices, "
        f"{found['slices'] / found['load_s']:,.0f} slices/s), plan + load "
        f"{found['plan_s'] + found['load_s']:.1f} s"
    )


def main(owners: int, against: str | None, rounds: int) -> list[str]:
    import psycopg

    from bench.common import bench_dsn
    from bench.scale import archived

    codes: list[tuple[str, Path | None]] = [("this code", None)]
    if against:
        codes.insert(0, (against, archived(against)))
    lines = []
    for number in range(rounds):
        for label, code in codes if number % 2 == 0 else codes[::-1]:
            with psycopg.connect(bench_dsn(), autocommit=True) as conn:
                conn.execute("CHECKPOINT")
            lines.append(f"round {number + 1}, {label}: {measure(owners, code)}")
            print(lines[-1], flush=True)
    return lines


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(int(sys.argv[2]))
    else:
        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        parser.add_argument("--owners", type=int, default=2_000)
        parser.add_argument("--against", metavar="COMMIT")
        parser.add_argument("--rounds", type=int, default=2)
        args = parser.parse_args()
        main(args.owners, args.against, args.rounds)
