"""Where the test suite's CPU goes, test file by test file: `python -m bench.suite_cpu [pytest
arguments]` runs the README's test command (`pytest -n 4 --dist loadfile`, the arguments given
added) with this module as a pytest plugin, then prints for each test file its wall time and the
CPU seconds of three kinds:

- own: the xdist worker process that ran the file's tests (the tests, an in-process worker, pandas);
- children: the processes those tests started and waited for (worker processes, the command line,
  Prefect and Dagster processes, notebooks);
- server: the embedded PostgreSQL of that xdist worker (its server processes), which only this
  run's tests use. Zero with SYNCLANE_TEST_DSN, whose server other work may share.

The suite is bound by CPU on a two-core machine (issue 29): the sum of the three over the files
is what the two cores have to get through. Not run by `python -m bench`: it runs the whole suite.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

OUT = "SYNCLANE_SUITE_CPU_OUT"  # the folder each xdist worker writes its lines to


def _server_cpu(config: pytest.Config) -> float:
    """CPU seconds of the session's embedded server so far: the postmaster, its processes that
    ended (reaped by it) and those still running."""
    import psutil

    from synclane.testing_plugin import _WATCH

    watch = config.stash.get(_WATCH, None)
    if watch is None or watch.data is None:
        return 0.0
    try:
        postmaster = psutil.Process(int((watch.data / "postmaster.pid").read_text().split()[0]))
        own = postmaster.cpu_times()
        children = postmaster.children()
    except (OSError, ValueError, IndexError, psutil.Error):
        return 0.0  # no server (yet, or any more)
    total = own.user + own.system + own.children_user + own.children_system
    for child in children:
        try:
            with_times = child.cpu_times()
        except psutil.Error:
            continue  # it ended meanwhile: the postmaster's children_* count it from now on
        total += with_times.user + with_times.system
    return total


def _now(config: pytest.Config) -> tuple[float, float, float, float]:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (
        time.monotonic(),
        time.process_time(),
        children.ru_utime + children.ru_stime,
        _server_cpu(config),
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, Any, Any]:
    folder = os.environ.get(OUT)
    before = _now(item.config)
    try:
        return (yield)
    finally:
        if folder:
            after = _now(item.config)
            wall, own, children, server = (b - a for a, b in zip(before, after, strict=True))
            if before[3] > 0 and after[3] == 0:
                # The session's server stopped during this test (the last test's teardown ends
                # the session): the embedded server is this process's child, so its whole life's
                # CPU, counted under "server" test by test, just came in as a child's.
                children = max(children - before[3], 0.0)
            line = {
                "file": item.nodeid.split("::")[0],
                "wall": wall,
                "own": own,
                "children": children,
                "server": max(server, 0.0),  # a test that restarted the server starts it over
            }
            with open(Path(folder) / f"{os.getpid()}.jsonl", "a", encoding="utf-8") as out:
                out.write(json.dumps(line) + "\n")


def summary(folder: Path) -> list[str]:
    files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0, 0.0])
    for path in folder.glob("*.jsonl"):
        for text in path.read_text(encoding="utf-8").splitlines():
            line = json.loads(text)
            sums = files[line["file"]]
            for number, key in enumerate(("wall", "own", "children", "server")):
                sums[number] += line[key]
            sums[4] += 1
    rows = sorted(files.items(), key=lambda kv: -(kv[1][1] + kv[1][2] + kv[1][3]))
    total = [sum(sums[n] for sums in files.values()) for n in range(5)]
    head = (
        f"{'file':44} {'tests':>5} {'wall':>7} {'own':>7} {'children':>8} {'server':>7} {'cpu':>7}"
    )
    lines = [head]
    for name, (wall, own, children, server, count) in [*rows, ("all", total)]:
        cpu = own + children + server
        figures = f"{wall:7.1f} {own:7.1f} {children:8.1f} {server:7.1f} {cpu:7.1f}"
        lines.append(f"{name:44} {count:5.0f} {figures}")
    return lines


def main(arguments: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="synclane-suite-cpu-") as folder:
        command = [
            sys.executable, "-m", "pytest", "-n", "4", "--dist", "loadfile", "-q",
            "-p", "bench.suite_cpu", *arguments,
        ]  # fmt: skip
        started = time.monotonic()
        done = subprocess.run(command, env={**os.environ, OUT: folder}, check=False)
        took = time.monotonic() - started
        print(f"\n{' '.join(command[1:])}: exit {done.returncode} in {took:.0f} s")
        print("\n".join(summary(Path(folder))))
        return done.returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
