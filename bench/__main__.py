"""Run every benchmark: `python -m bench [--smoke] [--write]`.

--smoke runs each on tiny sizes to prove it still works (CI); --write puts the figures between
the markers in docs/performance.md.
"""

from __future__ import annotations

import argparse
import platform
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from bench import (
    footprint,
    page,
    pages,
    plan,
    scale,
    sdk,
    take,
    take_loop,
    throughput,
    upgrade,
    wakeup,
)
from bench.common import bench_dsn

DOC = Path(__file__).resolve().parent.parent / "docs" / "performance.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"


def machine() -> list[str]:
    with psycopg.connect(bench_dsn()) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        settings = {
            name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
            for name in ("shared_buffers", "synchronous_commit", "fsync", "max_connections")
        }
    cpus = subprocess.run(["nproc"], capture_output=True, text=True, check=False).stdout.strip()
    return [
        f"- measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.machine()}, "
        f"{cpus} cores, Python {platform.python_version()}",
        f"- PostgreSQL {version}; "
        + ", ".join(f"{name}={value}" for name, value in settings.items()),
    ]


def _page_smoke() -> list[str]:
    """bench/page.py prints its own figures; the smoke run checks that it runs."""
    page.main(["--smoke"])
    return ["bench.page --smoke ran; its figures are printed above"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: check that they run")
    parser.add_argument("--write", action="store_true", help="update docs/performance.md")
    args = parser.parse_args()
    lines = ["### Machine", "", *machine(), ""]
    if args.smoke:
        sections = [
            ("Planning", plan.main(owners=50, history=2_000)),
            ("Taking a job", take.main(5, (0, 2_000), backlog_lanes=50, backlog_per_lane=10)),
            ("The take alone, in step", take_loop.main(bench_dsn(), 40)),
            ("Throughput", throughput.main(jobs=200, rounds=1, pgbench_seconds=2)),
            ("Instant pickup", wakeup.main(jobs=20, processes=(1,))),
            ("Pages that wait on an API", pages.smoke()),
            ("The page", _page_smoke()),
            ("Worker footprint", footprint.main()),
            ("Notebook SDK", sdk.main(20_000, 2)),
            ("Planning and retention at scale", scale.smoke()),
            ("The upgrade to schema 8", upgrade.main(20_000)),
        ]
    else:
        sections = [
            ("Planning (`python -m bench.plan`)", plan.main()),
            ("Taking a job (`python -m bench.take`)", take.main()),
            (
                "Throughput, against pgbench and peers (`python -m bench.throughput`)",
                throughput.main(),
            ),
            ("Instant pickup (`python -m bench.wakeup`)", wakeup.main()),
            ("Pages that wait on an API (`python -m bench.pages`)", pages.main()),
            ("Worker footprint (`python -m bench.footprint`)", footprint.main()),
            ("Notebook SDK (`python -m bench.sdk`)", sdk.main()),
        ]
    for title, figures in sections:
        lines += [f"### {title}", "", "```", *figures, "```", ""]
    text = "\n".join(lines)
    print(text)
    if args.write and not args.smoke:
        document = DOC.read_text(encoding="utf-8")
        block = f"{START}\n{text}\n{END}"
        DOC.write_text(re.sub(f"{START}.*?{END}", lambda _: block, document, flags=re.S))
        print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
