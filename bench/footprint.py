"""What a worker process costs: `import synclane` time, and resident memory with 8 slots.

    python -m bench.footprint

The import is timed in fresh interpreters (median of several), next to `import psycopg` alone
as the reference; the worker runs 8 slots on an empty queue for a few seconds and reports its
peak resident memory, and whether pandas or Prefect were imported (they must not be).
"""

from __future__ import annotations

import statistics
import subprocess
import sys

from bench.common import bench_dsn, fresh_schema

IMPORT = "import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
WORKER = """
import resource, sys
from synclane import SyncLane, Page
app = SyncLane({dsn!r}, schema={schema!r}, poll_interval=0.2, plan_interval=3600)
queue = app.queue("q", concurrency=8)

@queue.snapshot("noop", every=86400)
def noop(job):
    return Page(None, 0)

app.run_worker(stop_after=3)
# VmHWM is this process's own peak; ru_maxrss would keep the peak of the parent it forked from.
try:
    with open("/proc/self/status") as status:
        peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
except OSError:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(peak // 1024)
print(int("pandas" in sys.modules), int("prefect" in sys.modules))
"""


def import_seconds(module: str, rounds: int = 7) -> float:
    times = []
    for _ in range(rounds):
        done = subprocess.run(
            [sys.executable, "-c", IMPORT.format(module=module)],
            capture_output=True,
            text=True,
            check=True,
        )
        times.append(float(done.stdout.strip()))
    return statistics.median(times)


def main() -> list[str]:
    dsn = bench_dsn()
    synclane_import = import_seconds("synclane")
    psycopg_import = import_seconds("psycopg")
    with fresh_schema(dsn) as schema:
        done = subprocess.run(
            [sys.executable, "-c", WORKER.format(dsn=dsn, schema=schema)],
            capture_output=True,
            text=True,
            check=True,
        )
    rss, heavy = done.stdout.split("\n")[-3:-1]
    pandas_loaded, prefect_loaded = heavy.split()
    lines = [
        f"import synclane: median {synclane_import * 1000:.0f} ms "
        f"(import psycopg alone: {psycopg_import * 1000:.0f} ms; goal < 300 ms)",
        f"worker with 8 slots: peak RSS {rss} MiB; pandas imported: "
        f"{'yes' if pandas_loaded == '1' else 'no'}, Prefect imported: "
        f"{'yes' if prefect_loaded == '1' else 'no'}",
    ]
    for line in lines:
        print(line, flush=True)
    return lines


if __name__ == "__main__":
    main()
