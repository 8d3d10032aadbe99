"""The take's throughput next to an older commit's, in one run on one server.

    python -m bench.side_by_side [--against 2de033d] [--rounds 4] [--jobs 4000]

A change that may slow the take is measured against the code before it, not against a figure of
another day: this machine's pgbench varies fourfold over a day (docs/performance.md). The older
commit is checked out into a git worktree of its own (under the system's temporary folder, kept
for the next run) and its own `bench.throughput.synclane_rate` runs in a process whose imports
come from there. Each round runs, one after the other: the older commit, this code, the same two
out of step (pages of 0–2 ms at random), and `pgbench -N -c 4 -T 8`, so that a disturbance of the
machine hits one round of all, not one of them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import bench_dsn
from bench.throughput import UNEVEN_PAGE, pgbench_tps, synclane_rate

ROOT = Path(__file__).resolve().parent.parent
# 2de033d: the last commit before the lanes table (schema 2), the reference issue 25 names
REFERENCE = "2de033d"


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
    for number in range(rounds):
        runs[f"{against} in step"].append(rate_at(place, dsn, jobs, 0.0)[0])
        runs["this code in step"].append(synclane_rate(dsn, jobs)[0])
        runs[f"{against} out of step"].append(rate_at(place, dsn, jobs, UNEVEN_PAGE)[0])
        runs["this code out of step"].append(synclane_rate(dsn, jobs, page_sleep=UNEVEN_PAGE)[0])
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
    lines = [
        f"in step, this code ÷ {against} round by round: "
        + ", ".join(f"{r:.2f}" for r in ratios)
        + f" (median {statistics.median(ratios):.2f}; goal >= 1.0)",
        "out of step ÷ in step, this code: "
        + ", ".join(f"{r:.2f}" for r in out_of_step)
        + f" (median {statistics.median(out_of_step):.2f}; goal >= 0.8)",
        *(f"{name}: median {statistics.median(values):.0f}" for name, values in runs.items()),
    ]
    print(*lines, sep="\n")
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default=REFERENCE)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=4000)
    args = parser.parse_args()
    main(args.against, args.rounds, args.jobs)
