"""The Prefect integration on many machines: flows/prefect.yaml deployed to a process work
pool beside a served app, two `prefect worker start` processes sharing the work runs, late plan
runs collapsing into one, and a drained machine, all against the temporary Prefect server of
this test process (the fixture `prefect_server`, tests/conftest.py). Apart from
tests/test_prefect.py so that `--dist loadfile` runs the two on two workers.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

pytest.importorskip("prefect", reason="the prefect extra is not installed")

import prefect_app
import yaml
from prefect_kit import FLOWS, ROOT, eventually, flow_runs, prefect_cli, prefect_env

from synclane import ConfigError
from synclane.prefect import SyncLaneDatabase, deployments
from synclane.prefect.flows import called
from synclane.prefect.runs import check_served_names

pytestmark = [pytest.mark.prefect, pytest.mark.processes]


# -- many machines: a process work pool, real workers ---------------------------------------


@dataclass
class Pool:
    """flows/prefect.yaml deployed on the test server for prefect_app, and its workers."""

    api_url: str
    env: dict[str, str]
    schema: str
    served: dict[str, tuple[str, str | None, str | None]]  # name: (id, entrypoint, pool)
    late_plan_runs: list[uuid.UUID]
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)
    orphans: list[int] = field(default_factory=list)

    def submitted(self, worker: str, *, aborted_too: bool = False) -> list[str]:
        """The flow runs this worker started, in order (with `aborted_too`, also those the
        server refused to start, e.g. cancelled by a deployment's concurrency limit)."""
        text = self.logs[worker].read_text(errors="replace")
        picked = re.findall(r"Worker '[^']+' submitting flow run '([0-9a-f-]+)'", text)
        aborted = set(re.findall(r"Aborted submission of flow run '([0-9a-f-]+)'", text))
        return picked if aborted_too else [run for run in picked if run not in aborted]


WORK_BUDGET = 5


@pytest.fixture(scope="module")
def pool(prefect_server: str, dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """What docs/prefect.md does to go from one machine to several, on the test server: a
    served app first; then a process work pool and two work workers (machines A and B); the
    pool project (flows/prefect.yaml for prefect_app: its block, its folder and schema, the
    `spread` queue, short runs) deployed with `prefect deploy --all`; N raised to 2 with
    `prefect gcl update`; four plan runs missed during "downtime"; then the plan worker, which
    finds all four late."""
    import psutil
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.states import Scheduled
    from prefect.workers.process import ProcessWorker

    home = tmp_path_factory.mktemp("prefect-home")
    env = prefect_env(prefect_server, home)
    schema = f"test_pool_{uuid.uuid4().hex[:10]}"
    app = prefect_app.build(dsn, schema)
    SyncLaneDatabase(dsn=dsn, app_path="prefect_app:app").save("pool-db", overwrite=True)
    served = {}
    with get_client(sync_client=True) as client:
        for deployment in deployments("prefect_app:app"):
            called(deployment.apply())
            name = f"{deployment.flow_name}/{deployment.name}"
            found = client.read_deployment_by_name(name)
            served[name] = (str(found.id), found.entrypoint, found.work_pool_name)
        # what `prefect work-pool create synclane --type process` does
        client.create_work_pool(
            WorkPoolCreate(
                name="synclane",
                type="process",
                base_job_template=ProcessWorker.get_default_base_job_template(),
            )
        )
    made = Pool(prefect_server, env, schema, served, [])

    def start_worker(name: str, queue: str) -> None:
        log = made.logs[name] = home / f"worker-{name}.log"
        limit = ["--limit", "1"] if queue == "work" else []
        made.workers[name] = subprocess.Popen(
            [sys.executable, "-m", "prefect", "worker", "start", "--pool", "synclane",
             "--work-queue", queue, "--name", f"machine-{name}", *limit],
            env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        )  # fmt: skip

    # The machines' workers start first (their start-up is the slow part); the plan worker
    # starts after the "downtime", when four plan runs are late.
    start_worker("A", "work")
    start_worker("B", "work")
    try:
        project = yaml.safe_load((ROOT / "flows" / "prefect.yaml").read_text())
        pull = project["pull"][0]["prefect.deployments.steps.set_working_directory"]
        pull["directory"] = str(ROOT / "tests")
        for deployment in project["deployments"]:
            deployment["parameters"]["database"] = "pool-db"
            variables = deployment["work_pool"]["job_variables"]
            variables["env"]["SYNCLANE_PREFECT_TEST_SCHEMA"] = schema
            if deployment["entrypoint"].endswith(":work"):
                deployment["parameters"].update(queues=["spread"], budget_seconds=WORK_BUDGET)
                deployment["concurrency_limit"]["limit"] = 1
        folder = tmp_path_factory.mktemp("project")
        (folder / "prefect.yaml").write_text(yaml.safe_dump(project, sort_keys=False))
        prefect_cli(env, "deploy", "--all", cwd=folder)
        with get_client(sync_client=True) as client:
            work_id = client.read_deployment_by_name("synclane-work/demo-pool").id
            plan_id = client.read_deployment_by_name("synclane-plan/demo-pool").id
            # N = 2, the way docs/prefect.md raises it
            prefect_cli(env, "gcl", "update", f"deployment:{work_id}", "--limit", "2")
            now = datetime.now(UTC)
            made.late_plan_runs = [
                client.create_flow_run_from_deployment(
                    plan_id, state=Scheduled(scheduled_time=now - timedelta(minutes=minutes))
                ).id
                for minutes in (10, 9, 8, 7)
            ]
        start_worker("P", "plan")
        yield made
    finally:
        children: list[psutil.Process] = []
        for process in made.workers.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                children += psutil.Process(process.pid).children(recursive=True)
            process.kill()
            process.wait(30)
        for pid in [*(child.pid for child in children), *made.orphans]:
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).terminate()
        psutil.wait_procs(children, timeout=30)
        app.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def run_state(run_id: str | uuid.UUID) -> Any:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(uuid.UUID(str(run_id))).state


def test_deploying_the_pool_project_leaves_served_deployments_alone(pool: Pool) -> None:
    from prefect.client.orchestration import get_client

    assert set(pool.served) == {f"synclane-{flow_name}/prefect_app" for flow_name in FLOWS}
    with get_client(sync_client=True) as client:
        for name, (served_id, entrypoint, work_pool) in pool.served.items():
            served = client.read_deployment_by_name(name)
            assert (str(served.id), served.entrypoint, served.work_pool_name) == (
                served_id,
                entrypoint,
                None,
            )
            assert work_pool is None
            pooled = client.read_deployment_by_name(name.replace("/prefect_app", "/demo-pool"))
            assert pooled.work_pool_name == "synclane" and str(pooled.id) != served_id
            flow_name = name.split("/")[0].removeprefix("synclane-")
            assert pooled.work_queue_name == ("work" if flow_name == "work" else "plan")
    # serving under a name the pool uses is refused before anything is served
    with pytest.raises(ConfigError, match="already belongs to work pool 'synclane'"):
        check_served_names(deployments("prefect_app:app", name="demo-pool"))


def test_late_plan_runs_after_downtime_collapse_into_one(pool: Pool) -> None:
    def settled() -> list[Any] | None:
        states = [run_state(run) for run in pool.late_plan_runs]
        return states if all(s is not None and s.is_final() for s in states) else None

    states = eventually(settled, 120, "the four late plan runs to end")
    assert sorted(s.type.value for s in states) == [
        "CANCELLED",
        "CANCELLED",
        "CANCELLED",
        "COMPLETED",
    ]
    picked = pool.submitted("P", aborted_too=True)
    assert {str(run) for run in pool.late_plan_runs} <= set(picked)  # all four were picked up


def test_two_process_workers_share_the_work_one_run_each(pool: Pool) -> None:
    def first_run(machine: str) -> str | None:
        for run_id in pool.submitted(machine):
            state = run_state(run_id)
            if state is not None and (state.is_running() or state.is_completed()):
                return run_id
        return None

    def two_machines() -> tuple[str, str] | None:
        a, b = first_run("A"), first_run("B")
        return (a, b) if a and b else None

    first_a, first_b = eventually(two_machines, 120, "a work run on each machine")
    assert first_a != first_b
    work_runs = {str(run.id) for run in flow_runs("synclane-work/demo-pool")}
    assert {first_a, first_b} <= work_runs

    def report_of(run_id: str) -> str | None:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

        with get_client(sync_client=True) as client:
            found = client.read_artifacts(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[uuid.UUID(run_id)]))
            )
        return found[0].data if found else None

    for run_id in (first_a, first_b):
        report = eventually(lambda run_id=run_id: report_of(run_id), 90, f"run {run_id} ends")
        completed = re.search(r"\n\| (\d+) \| \d+ \| \d+ \|", report)
        assert completed and int(completed[1]) > 0, report  # each machine loaded something
        eventually(lambda run_id=run_id: run_state(run_id).is_final(), 30, f"{run_id} final")
        assert run_state(run_id).is_completed()


def test_a_drained_machine_finishes_its_run_and_starts_no_other(pool: Pool) -> None:
    """docs/prefect.md drains machine A with `kill -KILL <worker pid>`: the worker stops taking
    runs at once; its run in flight goes on in its own process, hands its jobs back at the end
    of its budget and ends Completed; machine B takes every run after that."""
    import psutil

    def running_on_a() -> tuple[str, list[psutil.Process]] | None:
        runs = pool.submitted("A")
        children = psutil.Process(pool.workers["A"].pid).children(recursive=True)
        if runs and children and run_state(runs[-1]).is_running():
            return runs[-1], children
        return None

    in_flight, children = eventually(running_on_a, 120, "a work run running on machine A")
    pool.orphans += [child.pid for child in children]
    pool.workers["A"].kill()
    pool.workers["A"].wait(30)
    drained_at = datetime.now(UTC)
    eventually(lambda: run_state(in_flight).is_final(), 90, "A's last run to end")
    assert run_state(in_flight).is_completed()

    def started_after_drain() -> list[Any] | None:
        later = [
            run for run in flow_runs("synclane-work/demo-pool")
            if run.start_time is not None and run.start_time > drained_at
        ]  # fmt: skip
        return later if any(run.state.is_completed() for run in later) else None

    later = eventually(started_after_drain, 120, "a work run that started after the drain")
    assert {str(run.id) for run in later} <= set(pool.submitted("B"))
