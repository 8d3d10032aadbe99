"""A Prefect server of the test's own under a served app, restarted and edited while work runs
run: what a team sees when its Prefect server goes away for a moment, and when a served
deployment is deleted while its run works.

`prefect server start` runs in a process of its own (SQLite in a temporary PREFECT_HOME, a free
port); `synclane serve` serves tests/prefect_app.py against it, as docs/prefect.md does.

Two things are sped up, by a `sitecustomize` module in the processes started here. Prefect's
engine renews a run's deployment concurrency lease every 225 s (three quarters of a hard-coded
300 s); here every 3 s (`prefect.concurrency._leases._RENEWAL_FRACTION`), so that the renewal
that finds the lease gone after a restart comes within seconds, not minutes. And a work run that
crashes gets a successor once it ran 10 s, not a minute
(`synclane.prefect.lifecycle.CRASH_SUCCESSOR_AFTER`), so that the restart test need not let its
run work a whole minute first. Nothing else differs from a day in production.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prefect", reason="the prefect extra is not installed")

import prefect_app
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
from prefect.client.schemas.objects import FlowRun
from prefect.states import Cancelling
from prefect_kit import eventually

from synclane import ConfigError, SyncLane
from synclane.prefect.runs import keep_work_runs

pytestmark = [pytest.mark.prefect, pytest.mark.processes]

TESTS = Path(__file__).resolve().parent

# How long a work run must have run for a crash to start its successor, in these processes.
CRASH_SUCCESSOR_AFTER = 10.0
SPED_UP = f"""\
# Written by tests/test_prefect_server.py: renew deployment concurrency leases every 3 s, and
# give a crashed work run a successor once it ran {CRASH_SUCCESSOR_AFTER:.0f} s.
try:
    import prefect.concurrency._leases as _leases

    _leases._RENEWAL_FRACTION = 0.01
except ImportError:
    pass
try:
    import synclane.prefect.lifecycle as _lifecycle

    _lifecycle.CRASH_SUCCESSOR_AFTER = {CRASH_SUCCESSOR_AFTER}
except ImportError:
    pass
"""


class PrefectServer:
    """`prefect server start` on a free port, which the test may stop and start again."""

    def __init__(self, home: Path) -> None:
        self.home = home
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/api"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        import httpx

        self.starts += 1
        log = (self.home / f"server-{self.starts}.log").open("wb")
        env = {
            **os.environ,
            "PREFECT_HOME": str(self.home),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_UI_ENABLED": "false",
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
             "--port", str(self.port)],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip

        def healthy() -> bool:
            assert self.process is not None and self.process.poll() is None, "the server died"
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
            return False

        eventually(healthy, 180, "the Prefect server to answer")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    started = PrefectServer(tmp_path_factory.mktemp("prefect-server"))
    started.start()
    try:
        with temporary_settings({PREFECT_API_URL: started.url}):
            yield started
    finally:
        started.stop()


@contextlib.contextmanager
def serving(
    server: PrefectServer, dsn: str, schema: str, name: str, home: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """`synclane --app prefect_app:app serve --name NAME` on the test's schema, with work runs
    of 300 s; the plan deployment is paused, so that every work run here is started by the
    test or by a run that asks for its successor. Stopped with Ctrl-C, as a person would."""
    fast = home / "sped-up"
    fast.mkdir(exist_ok=True)
    (fast / "sitecustomize.py").write_text(SPED_UP)
    env = {
        **os.environ,
        "PREFECT_API_URL": server.url,
        "PREFECT_HOME": str(home / "client"),
        "PREFECT_RUNNER_POLL_FREQUENCY": "2",
        "SYNCLANE_DSN": dsn,
        "SYNCLANE_PREFECT_TEST_SCHEMA": schema,
        "SYNCLANE_PREFECT_TEST_PAGE_WAIT": "240",  # the slow job's second page outlasts a restart
        "PYTHONPATH": os.pathsep.join([str(fast), str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    log = home / f"serve-{name}.log"
    synclane = str(Path(sys.executable).with_name("synclane"))
    process = subprocess.Popen(
        [synclane, "--app", "prefect_app:app", "serve", "--name", name, "--work-budget", "300"],
        cwd=TESTS, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        eventually(lambda: b"being served" in log.read_bytes(), 180, "serve to start")
        with get_client(sync_client=True) as client:
            client.pause_deployment(client.read_deployment_by_name(f"synclane-plan/{name}").id)
        yield process
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(90)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)


def work_runs(name: str) -> list[FlowRun]:
    with get_client(sync_client=True) as client:
        found = client.read_deployment_by_name(f"synclane-work/{name}")
        return client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[found.id]))
        )


def run_of(run_id: uuid.UUID) -> FlowRun:
    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id)


def start_work_run(name: str) -> uuid.UUID:
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(f"synclane-work/{name}")
        return client.create_flow_run_from_deployment(deployment.id).id


def slow_job(lane: SyncLane) -> dict[str, Any]:
    """The `slow` queue's one job: status, cursor, and the worker that holds it (None: none)."""
    import pandas as pd

    row = lane.jobs("slow").iloc[0]
    fields = ("status", "cursor", "leased_by")
    return {name: None if pd.isna(row[name]) else str(row[name]) for name in fields}


def in_second_page(lane: SyncLane) -> Callable[[], bool]:
    def probe() -> bool:
        job = slow_job(lane)
        return bool(job["cursor"] == "page-2" and job["status"] == "running")

    return probe


def test_work_resumes_by_itself_after_the_prefect_server_restarts(
    server: PrefectServer, dsn: str, schema: str, tmp_path: Path
) -> None:
    """The server restarts while a work run holds a job mid-page. Its deployment concurrency
    lease is gone with the server's memory: the engine ends the run Crashed at its next
    renewal. The run hands its job back first, and its successor starts at once (nothing else
    would start one: planning is paused). After the restart the runner no longer passes
    cancels on; the successor notices its own cancel and hands the job back."""
    lane = prefect_app.build(dsn, schema)
    name = f"restart-{uuid.uuid4().hex[:8]}"
    try:
        lane.plan("slow")
        with serving(server, dsn, schema, name, tmp_path):
            first = start_work_run(name)
            started = time.monotonic()
            eventually(in_second_page(lane), 120, "the work run to hold the slow job mid-page")
            holder = slow_job(lane)["leased_by"]
            # A run that crashes within a minute of its start (10 s here) starts no successor
            # (a run that crashes at every start would loop); after a real restart the crash
            # comes at the next renewal, up to 225 s later. Here renewals come every 3 s: let
            # the run work its 10 s first.
            time.sleep(max(0.0, CRASH_SUCCESSOR_AFTER + 2 - (time.monotonic() - started)))
            server.stop()
            time.sleep(2)
            server.start()
            crashed = eventually(
                lambda: (run := run_of(first)).state and run.state.is_final() and run,
                120, "the first work run to end",
            )  # fmt: skip
            assert crashed.state is not None and crashed.state.is_crashed(), crashed.state
            ended_at = datetime.now(UTC)

            def successor() -> FlowRun | None:
                later = [r for r in work_runs(name) if r.id != first]
                return next((r for r in later if r.state and r.state.is_running()), None)

            second = eventually(successor, 60, "a successor work run to start")
            assert second.start_time is not None
            assert (second.start_time - ended_at).total_seconds() < 45
            eventually(
                lambda: slow_job(lane)["status"] == "running"
                and slow_job(lane)["leased_by"] != holder,
                60, "the successor to take the slow job",
            )  # fmt: skip
            assert slow_job(lane)["cursor"] == "page-2"  # it continues where the first stopped

            with get_client(sync_client=True) as client:  # what `prefect flow-run cancel` does
                client.set_flow_run_state(second.id, Cancelling())
            eventually(
                lambda: (state := run_of(second.id).state) and state.is_cancelled(),
                60, "the cancelled successor to end Cancelled",
            )  # fmt: skip
            assert slow_job(lane)["status"] == "pending" and slow_job(lane)["cursor"] == "page-2"
    finally:
        lane.close()


def test_deleting_a_served_deployment_stops_its_work_run_cleanly(
    server: PrefectServer, dsn: str, schema: str, tmp_path: Path
) -> None:
    """Prefect cannot record the final state of a run whose deployment (and its concurrency
    limit) was deleted under it: left alone, the run stays Running, or Cancelling, for ever.
    The work run notices the deletion within seconds, gives its slot back, hands its job back
    and ends Cancelled; nothing starts a successor, and the hint for the missing deployment
    does not assume a misspelt name."""
    lane = prefect_app.build(dsn, schema)
    name = f"delete-{uuid.uuid4().hex[:8]}"
    try:
        lane.plan("slow")
        with serving(server, dsn, schema, name, tmp_path):
            run_id = start_work_run(name)
            eventually(in_second_page(lane), 120, "the work run to hold the slow job mid-page")
            with get_client(sync_client=True) as client:
                work_id = client.read_deployment_by_name(f"synclane-work/{name}").id
                client.delete_deployment(work_id)
            state = eventually(
                lambda: (state := run_of(run_id).state) and state.is_final() and state,
                60, "the work run to end",
            )  # fmt: skip
            assert state.is_cancelled(), state
            assert state.message is not None and "its deployment was deleted" in state.message
            assert slow_job(lane)["status"] == "pending" and slow_job(lane)["cursor"] == "page-2"
            with pytest.raises(ConfigError, match="it was deleted, or the name is misspelt"):
                keep_work_runs(f"synclane-work/{name}")
            with pytest.raises(ConfigError, match="no longer exists \\(it was deleted\\)"):
                keep_work_runs(work_id)
    finally:
        lane.close()
