"""The Dagster integration: the resource, the definitions, their runs, schedules and checks.

Runs go through Dagster's own test API (`execute_in_process`, `build_schedule_context`, asset
check evaluations) against the test database, with `tests/dagster_app.py` imported the way a
code location is. One test terminates a real run: launched through a gRPC code server in other
processes, terminated through the Dagster instance, as the UI's Terminate button does.
"""

from __future__ import annotations

import _thread
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

pytest.importorskip("dagster", reason="the dagster extra is not installed")

from dagster import (
    AssetCheckSeverity,
    AssetKey,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DefaultScheduleStatus,
    Definitions,
    EnvVar,
    ExecuteInProcessResult,
    build_schedule_context,
    instance_for_test,
)

from synclane import ConfigError, Owner, SyncLane
from synclane.dagster import SyncLaneResource, definitions
from synclane.dagster.definitions import cron_at_least_every
from synclane.dagster.plan import DUE_ONLY, PLAN_TAG

pytestmark = pytest.mark.dagster

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
PLAN, WORK, BACKFILL, REQUEUE = (
    "synclane_plan",
    "synclane_work",
    "synclane_backfill",
    "synclane_requeue",
)


# -- fixtures and helpers ------------------------------------------------------------------


@pytest.fixture
def loaded(dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """`dagster_app` freshly imported on this test's schema, as a code location imports it."""
    monkeypatch.setenv("SYNCLANE_DAGSTER_TEST_SCHEMA", schema)
    monkeypatch.setenv("SYNCLANE_DSN", dsn)
    monkeypatch.delitem(sys.modules, "dagster_app", raising=False)
    module = importlib.import_module("dagster_app")
    yield module
    module.RELEASE.set()
    module.app.close()


@pytest.fixture
def defs(loaded: ModuleType) -> Definitions:
    found: Definitions = loaded.defs
    return found


@pytest.fixture
def instance() -> DagsterInstance:
    """An in-memory Dagster instance: runs and their logs, for this test only."""
    return DagsterInstance.ephemeral()


@pytest.fixture
def persistent() -> Iterator[DagsterInstance]:
    """A Dagster instance in a temporary folder: schedules refuse an in-memory one."""
    with instance_for_test() as created:
        yield created


def run(
    defs: Definitions,
    job: str,
    instance: DagsterInstance,
    config: dict[str, Any] | None = None,
    raise_on_error: bool = True,
) -> ExecuteInProcessResult:
    """Execute a job of `defs` in this process; `config` is its one op's config."""
    run_config: dict[str, Any] = {}
    if config is not None:
        (node,) = defs.resolve_job_def(job).graph.node_dict
        run_config = {"ops": {node: {"config": config}}}
    return defs.resolve_job_def(job).execute_in_process(
        instance=instance, run_config=run_config, raise_on_error=raise_on_error
    )


def materialized(result: ExecuteInProcessResult) -> dict[str, dict[str, Any]]:
    """Each materialized queue asset's metadata, as plain values, by queue."""
    found = {}
    for event in result.get_asset_materialization_events():
        materialization = event.materialization
        found[materialization.asset_key.path[-1]] = {
            key: value.value for key, value in materialization.metadata.items()
        }
    return found


def checks(result: ExecuteInProcessResult) -> dict[str, Any]:
    """Each queue's `no_abandoned_jobs` evaluation, by queue."""
    evaluations = result.get_asset_check_evaluations()
    assert {e.check_name for e in evaluations} == {"no_abandoned_jobs"}
    return {e.asset_key.path[-1]: e for e in evaluations}


def output_metadata(result: ExecuteInProcessResult) -> dict[str, Any]:
    (output,) = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
    return {key: value.value for key, value in output.step_output_data.metadata.items()}


def logs(instance: DagsterInstance, run_id: str) -> list[tuple[str, str]]:
    """What the ops logged with context.log in a run: (level name, message)."""
    import logging

    return [
        (logging.getLevelName(entry.level), entry.user_message)
        for entry in instance.all_logs(run_id)
        if entry.dagster_event is None
    ]


def work_until_idle(defs: Definitions, instance: DagsterInstance, *queues: str) -> Any:
    """A work run until nothing is left; it may fail (a job abandoned for a new cause)."""
    config = {"queues": list(queues), "budget_seconds": 60, "until_idle": True}
    return run(defs, WORK, instance, config, raise_on_error=False)


def failure(result: ExecuteInProcessResult) -> tuple[str, dict[str, Any]]:
    """The failed step's description and metadata (a dagster.Failure raised by the op)."""
    (event,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    data = event.step_failure_data
    assert data.user_failure_data is not None, data.error
    metadata = {key: value.value for key, value in data.user_failure_data.metadata.items()}
    return str(data.user_failure_data.description), metadata


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


# -- the extra stays optional --------------------------------------------------------------


def test_importing_synclane_imports_neither_dagster_nor_prefect() -> None:
    code = (
        "import sys, synclane, synclane.app, synclane.worker, synclane.hosting\n"
        "found = sorted(m for m in sys.modules\n"
        "               if m.split('.')[0] in ('dagster', 'dagster_shared', 'prefect'))\n"
        "assert not found, found\n"
        "assert 'synclane.dagster' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# -- what the definitions hold -------------------------------------------------------------


def test_the_definitions_hold_four_jobs_two_running_schedules_and_a_check_per_queue(
    defs: Definitions,
) -> None:
    jobs = {job.name for job in defs.resolve_all_job_defs()} - {"__ASSET_JOB"}
    assert jobs == {PLAN, WORK, BACKFILL, REQUEUE}
    plan_schedule = defs.resolve_schedule_def(f"{PLAN}_schedule")
    work_schedule = defs.resolve_schedule_def(f"{WORK}_schedule")
    assert plan_schedule.job_name == PLAN and work_schedule.job_name == WORK
    assert plan_schedule.cron_schedule == "*/5 * * * *"  # the app's plan_interval: 300 s
    assert work_schedule.cron_schedule == "*/10 * * * *"
    for schedule in (plan_schedule, work_schedule):
        assert schedule.default_status == DefaultScheduleStatus.RUNNING
        assert schedule.execution_timezone == "UTC"
    queues = ["fragile", "shops", "slow"]
    assert sorted(defs.resolve_all_asset_keys()) == [AssetKey(["synclane", q]) for q in queues]
    graph = defs.resolve_asset_graph()
    assert sorted(key.asset_key.path[-1] for key in graph.asset_check_keys) == queues
    assert {key.name for key in graph.asset_check_keys} == {"no_abandoned_jobs"}
    assert {graph.get(AssetKey(["synclane", q])).group_name for q in queues} == {"synclane"}


@pytest.mark.parametrize(
    ("period", "cron", "kept"),
    [
        (timedelta(seconds=5), "* * * * *", timedelta(minutes=1)),
        (timedelta(minutes=1), "* * * * *", timedelta(minutes=1)),
        (timedelta(minutes=7), "*/6 * * * *", timedelta(minutes=6)),
        (timedelta(minutes=15), "*/15 * * * *", timedelta(minutes=15)),
        (timedelta(minutes=90), "0 * * * *", timedelta(hours=1)),
        (timedelta(hours=5), "0 */4 * * *", timedelta(hours=4)),
        (timedelta(days=3), "0 0 * * *", timedelta(days=1)),
    ],
)
def test_a_schedule_runs_at_least_as_often_as_asked_on_a_period_cron_keeps(
    period: timedelta, cron: str, kept: timedelta
) -> None:
    assert cron_at_least_every(period) == (cron, kept)


def test_bad_settings_of_the_definitions_fail_with_the_setting_named(loaded: ModuleType) -> None:
    app = loaded.app
    with pytest.raises(ConfigError, match="needs a SyncLane app"):
        definitions("dagster_app:app")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="name='shops-sync'"):
        definitions(app, name="shops-sync")
    with pytest.raises(ConfigError, match="work_budget=0:10:00 must be shorter than work_every"):
        definitions(app, work_budget=600)
    with pytest.raises(ConfigError, match="work_runs=0"):
        definitions(app, work_runs=0)
    with pytest.raises(ConfigError, match="resource must be a SyncLaneResource"):
        definitions(app, resource="dagster_app:app")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="no queue"):
        definitions(SyncLane(app.dsn, schema=app.schema))


# -- schedules -----------------------------------------------------------------------------


def test_the_plan_schedule_requests_a_plan_run(
    defs: Definitions, persistent: DagsterInstance
) -> None:
    schedule = defs.resolve_schedule_def(f"{PLAN}_schedule")
    ticked = schedule.evaluate_tick(build_schedule_context(instance=persistent))
    (request,) = ticked.run_requests or []
    assert request.tags["dagster/schedule_name"] == f"{PLAN}_schedule"
    assert request.tags[PLAN_TAG] == DUE_ONLY  # its runs plan what is due (app.plan_due)


def test_the_work_schedule_starts_only_the_work_runs_that_are_missing(
    loaded: ModuleType, defs: Definitions, persistent: DagsterInstance
) -> None:
    tick = datetime(2026, 1, 5, 10, 20, tzinfo=UTC)
    schedule = defs.resolve_schedule_def(f"{WORK}_schedule")
    context = build_schedule_context(instance=persistent, scheduled_execution_time=tick)
    (request,) = schedule.evaluate_tick(context).run_requests or []
    assert request.run_config == {
        "ops": {"synclane_run_worker": {"config": {"budget_seconds": 540.0}}}
    }
    assert request.run_key == f"{tick.isoformat()}#0"

    persistent.add_run(
        DagsterRun(job_name=WORK, run_id=str(uuid.uuid4()), status=DagsterRunStatus.STARTED)
    )
    skipped = schedule.evaluate_tick(
        build_schedule_context(instance=persistent, scheduled_execution_time=tick)
    )
    assert not skipped.run_requests
    assert skipped.skip_message == "1 work run(s) still going (at most 1 at once)"

    two = definitions(loaded.app, work_runs=2, work_budget=120, work_every=timedelta(minutes=5))
    wider = two.resolve_schedule_def(f"{WORK}_schedule")
    assert wider.cron_schedule == "*/5 * * * *"
    requests = wider.evaluate_tick(
        build_schedule_context(instance=persistent, scheduled_execution_time=tick)
    ).run_requests
    assert [r.run_config["ops"]["synclane_run_worker"]["config"] for r in requests or []] == [
        {"budget_seconds": 120.0}
    ]


# -- plan: materializations and the check --------------------------------------------------


def test_planning_materializes_each_queue_with_how_far_its_history_is(
    defs: Definitions, instance: DagsterInstance
) -> None:
    first = materialized(run(defs, PLAN, instance))
    assert set(first) == {"shops", "fragile", "slow"}
    shops = first["shops"]
    assert shops["jobs_added"] == 9 + 3  # 2 order slices and a product load per owner, 3 refreshes
    assert (shops["slices_loaded"], shops["slices_total"], shops["percent_loaded"]) == (0, 9, 0.0)
    assert shops["owners"] == 3 and shops["failing_owners"] == []

    work_until_idle(defs, instance, "shops")
    again = materialized(run(defs, PLAN, instance))["shops"]
    assert again["jobs_added"] == 0
    assert (again["slices_loaded"], again["slices_total"], again["percent_loaded"]) == (6, 9, 66.7)
    assert again["records"] == 4 * 10 + 2 * 3  # acme's order slices (two pages of 5), products
    assert again["failing_owners"] == ["globex"]
    assert (again["failed_jobs"], again["deferred_jobs"], again["abandoned_jobs"]) == (2, 0, 1)
    assert "| globex | orders | failing | 0.0 % | 0 / 2 | 2 |" in again["progress"]
    assert re.search(
        r"\| acme-us \| orders \| loaded \| 100\.0 % \| 2 / 2 \| 0 \| 20 "
        r"\| \d{4}-\d\d-\d\d 00:00 UTC \| 0:00:00 \|",
        again["progress"],
    )


def test_planning_and_working_run_through_a_transaction_pooler(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch, instance: DagsterInstance
) -> None:
    """The plan and work jobs with the app's DSN through PgBouncer in transaction mode
    ($SYNCLANE_POOLER): the same materialization as on a direct connection (the test above)."""
    from pooler import pgbouncer

    with pgbouncer(dsn, server_connections=2) as pooled:
        monkeypatch.setenv("SYNCLANE_DAGSTER_TEST_SCHEMA", schema)
        monkeypatch.setenv("SYNCLANE_DSN", pooled)
        monkeypatch.setenv("SYNCLANE_POOLER", "transaction")
        monkeypatch.delitem(sys.modules, "dagster_app", raising=False)
        module = importlib.import_module("dagster_app")
        try:
            assert module.app.database.pooled
            first = materialized(run(module.defs, PLAN, instance))["shops"]
            assert first["jobs_added"] == 9 + 3
            work_until_idle(module.defs, instance, "shops")
            again = materialized(run(module.defs, PLAN, instance))["shops"]
            assert again["jobs_added"] == 0
            assert (again["slices_loaded"], again["slices_total"]) == (6, 9)
            assert again["failing_owners"] == ["globex"]
        finally:
            module.RELEASE.set()
            module.app.close()


def test_the_abandoned_jobs_check_fails_until_the_jobs_are_requeued(
    loaded: ModuleType, defs: Definitions, instance: DagsterInstance
) -> None:
    before = checks(run(defs, PLAN, instance))
    assert all(evaluation.passed for evaluation in before.values())

    work_until_idle(defs, instance, "shops", "fragile")
    after = checks(run(defs, PLAN, instance))
    assert not after["shops"].passed and not after["fragile"].passed and after["slow"].passed
    shops = after["shops"]
    assert shops.severity == AssetCheckSeverity.ERROR
    cause_id = loaded.app.failures("shops", status="abandoned")["cause_id"].iloc[0]
    causes = shops.metadata["causes"].value
    assert "Abandon: the shop closed this account" in causes and cause_id in causes
    assert shops.metadata["abandoned_jobs"].value == 1
    assert shops.metadata["owners"].value == ["globex"]
    assert "synclane_requeue" in shops.metadata["to_retry"].value

    requeued = run(defs, REQUEUE, instance, {"queue": "shops", "cause_id": cause_id})
    assert output_metadata(requeued) == {"requeued": 1}
    assert ("INFO", f"requeued 1 job(s) of queue shops cause_id='{cause_id}'") in logs(
        instance, requeued.run_id
    )
    healed = checks(run(defs, PLAN, instance))
    assert healed["shops"].passed and not healed["fragile"].passed


def test_materializing_one_queue_asset_plans_only_that_queue(
    loaded: ModuleType, defs: Definitions, instance: DagsterInstance
) -> None:
    slow = AssetKey(["synclane", "slow"])
    result = defs.resolve_job_def(PLAN).execute_in_process(
        instance=instance, asset_selection=[slow]
    )
    assert set(materialized(result)) == {"slow"} and set(checks(result)) == {"slow"}
    assert set(loaded.app.jobs()["queue"]) == {"slow"}


def test_a_queue_whose_owner_source_fails_is_not_materialized_and_fails_the_run(
    loaded: ModuleType,
    defs: Definitions,
    instance: DagsterInstance,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(queue: str) -> list[Any]:
        raise ConnectionError("the accounts service refused the connection")

    monkeypatch.setattr(loaded.app.get_queue("slow"), "owner_source", broken)
    result = run(defs, PLAN, instance, raise_on_error=False)
    assert not result.success
    assert set(materialized(result)) == {"shops", "fragile"}
    assert set(checks(result)) == {"shops", "fragile", "slow"}  # the check still tells
    assert any(
        level == "ERROR" and "the accounts service refused the connection" in message
        for level, message in logs(instance, result.run_id)
    )


# -- work ----------------------------------------------------------------------------------


def test_a_work_run_that_abandons_jobs_for_new_causes_fails_and_logs_each_job_once(
    loaded: ModuleType, defs: Definitions, instance: DagsterInstance
) -> None:
    """The same signal as under Prefect: the run fails for the causes that started waiting for
    a human in it, and says how to stop each; every job that failed for good is logged once."""
    run(defs, PLAN, instance)
    result = work_until_idle(defs, instance, "shops", "fragile")
    assert not result.success
    description, metadata = failure(result)
    assert metadata == {"abandoned": 2, "completed": 9, "deferred": 1, "failed": 2}
    assert description.startswith("2 new cause(s) of abandoned jobs, waiting for a human: ")
    globex = loaded.app.failures("shops", status="abandoned")["cause_id"].iloc[0]
    assert f"`synclane requeue --queue shops --owner globex --cause-id {globex}`" in description
    assert f"synclane_requeue with queue='shops', owner='globex', cause_id='{globex}'" in (
        description
    )
    assert "`synclane cancel --queue fragile --owner hooli --reason 'account gone'`" in description
    lines = logs(instance, result.run_id)
    warnings = [message for level, message in lines if level == "WARNING"]
    errors = [message for level, message in lines if level == "ERROR"]
    assert len(warnings) == 1 and "(fragile/hooli invoices, initial) deferred" in warnings[0]
    assert "RuntimeError: invoice service down" in warnings[0]
    assert len(errors) == 2
    assert any("(shops/globex products, initial) abandoned after attempt 1" in e for e in errors)
    assert any("(fragile/hooli invoices, initial) abandoned after attempt 2" in e for e in errors)
    assert all("synclane_requeue" in e for e in errors)
    assert lines[0][1].startswith("working queues shops, fragile for up to 60 s as ")
    assert lines[-1][1].startswith("worker report: ")

    # globex's next job is abandoned for the same cause: it waits already; the run does not fail
    loaded.app.enqueue("shops", "globex", "products")
    again = work_until_idle(defs, instance, "shops")
    assert again.success
    assert output_metadata(again)["abandoned"] == 1
    (said,) = [m for _, m in logs(instance, again.run_id) if m.startswith("job ")]
    assert "abandoned again for cause" in said and "no new alert" in said

    # requeued, its cause waits for no one: abandoned again, it fails a run again
    assert loaded.app.requeue("shops", owner="globex", type="products") == 2
    assert not work_until_idle(defs, instance, "shops").success


def test_a_work_run_logs_each_job_once_when_dagster_also_captures_synclane_s_logger(
    loaded: ModuleType, defs: Definitions
) -> None:
    """docs/dagster.md suggests `managed_python_loggers: [synclane]`: then the library's own
    lines tell of each job, and the work op does not say it again."""
    settings = {"managed_python_loggers": ["synclane"], "python_log_level": "INFO"}
    with instance_for_test(overrides={"python_logs": settings}) as instance:
        run(defs, PLAN, instance)
        result = work_until_idle(defs, instance, "shops", "fragile")
        lines = [message for _, message in logs(instance, result.run_id)]
    job_ids = {
        kind: [int(i) for i in loaded.app.jobs(status=kind)["id"]]
        for kind in ("abandoned", "deferred")
    }
    for job_id in job_ids["abandoned"]:
        told = [line for line in lines if re.match(rf"job {job_id}\b.*abandoned", line)]
        assert len(told) == 1, told
    deferred = [line for line in lines if re.match(r"job \d+\b.*deferred", line)]
    assert len(deferred) == 1, deferred
    assert not [line for line in lines if re.match(r"job \d+ \(", line)]  # none of the op's own


def test_plan_backfill_and_requeue_runs_ride_out_a_database_restart(
    instance: DagsterInstance, caplog: pytest.LogCaptureFixture
) -> None:
    """On a PostgreSQL of the test's own: each job started while the database is down waits
    for it, as a worker does, and ends as on any day."""
    import dagster_app
    from servers import EmbeddedServer

    with tempfile.TemporaryDirectory(prefix="synclane-orch-dagster-") as directory:
        server = EmbeddedServer(Path(directory))
        app = dagster_app.build(server.dsn, "outage")
        outage_defs = definitions(app)

        def down_for(seconds: float) -> threading.Timer:
            server.stop()
            back = threading.Timer(seconds, server.start)
            back.start()
            return back

        try:
            app.migrate()
            back = down_for(3)
            planned = run(outage_defs, PLAN, instance)
            back.join()
            assert planned.success and materialized(planned)["shops"]["jobs_added"] == 12
            back = down_for(3)
            widened = run(outage_defs, BACKFILL, instance, {"queue": "shops", "horizon_days": 120})
            back.join()
            assert output_metadata(widened)["slices_added"] == 6
            app.run_worker(["shops"], stop_after=30, until_idle=True)
            back = down_for(3)
            requeued = run(outage_defs, REQUEUE, instance, {"queue": "shops", "owner": "globex"})
            back.join()
            # globex's two open history slices (they fail, so its two older slices are not
            # planned yet: lazy history) and its abandoned products
            assert output_metadata(requeued)["requeued"] == 3
        finally:
            app.close()
            server.close()
    said = [r.getMessage() for r in caplog.records if "cannot reach the database" in r.getMessage()]
    assert len(said) >= 3


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"budget_seconds": 0}, "budget_seconds=0.0 must be a number of seconds > 0"),
        ({"queues": ["nope"]}, "unknown queue 'nope'"),
    ],
)
def test_a_wrong_work_run_fails_with_the_setting_named(
    defs: Definitions, instance: DagsterInstance, config: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        run(defs, WORK, instance, config)


def test_an_interrupted_work_run_hands_its_job_back_with_its_cursor(
    loaded: ModuleType, defs: Definitions, instance: DagsterInstance, db: psycopg.Connection
) -> None:
    """Dagster turns SIGINT and SIGTERM into DagsterExecutionInterruptedError in the op's
    thread; here the signal is simulated in this process while a page is in flight."""
    run(defs, PLAN, instance)

    def interrupt_mid_page() -> None:
        if loaded.PAGE_IN_FLIGHT.wait(30):
            _thread.interrupt_main()

    threading.Thread(target=interrupt_mid_page, daemon=True).start()
    result = run(defs, WORK, instance, {"queues": ["slow"], "budget_seconds": 60}, False)
    assert not result.success
    assert slow_job(db, loaded.app.schema) == ("pending", "page-2", 10, 0, None)
    assert (
        "WARNING",
        "run stopped by DagsterExecutionInterruptedError: the worker handed back 1 running "
        "job(s) with their cursors",
    ) in logs(instance, result.run_id)


def slow_job(db: psycopg.Connection, schema: str) -> tuple[Any, ...]:
    """(status, cursor, processed_count, attempt_count, leased_by) of the `slow` queue's job."""
    row = db.execute(
        sql.SQL(
            "SELECT status, cursor, processed_count, attempt_count, leased_by FROM {} "
            "WHERE queue = 'slow'"
        ).format(sql.Identifier(schema, "jobs"))
    ).fetchone()
    assert row is not None
    return tuple(row)


@pytest.mark.processes
def test_a_terminated_work_run_hands_its_job_back_with_its_cursor(
    loaded: ModuleType, dsn: str, schema: str, db: psycopg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A real termination: the run is launched through a gRPC code server (the way `dagster
    dev` and the UI launch runs) in a process of its own; the test terminates it through the
    Dagster instance, which asks the code server to interrupt the run's process."""
    home = Path(tempfile.mkdtemp(prefix="dg-"))  # short: a Unix socket path has a limit
    # The default run coordinator queues runs for the daemon; this one launches them at once.
    (home / "dagster.yaml").write_text(
        "run_coordinator:\n"
        "  module: dagster._core.run_coordinator\n"
        "  class: DefaultRunCoordinator\n"
        "telemetry:\n"
        "  enabled: false\n"
    )
    socket = home / "grpc.sock"
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "SYNCLANE_DSN": dsn,
        "SYNCLANE_DAGSTER_TEST_SCHEMA": schema,
        "SYNCLANE_DAGSTER_TEST_RELEASE": str(home / "release"),
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    loaded.app.plan("slow")
    dagster = [sys.executable, "-m", "dagster"]
    # The server's output, and that of the run processes it starts, goes to a file: a pipe
    # nobody reads would fill up and stall them.
    output = (home / "server.log").open("wb")
    server = subprocess.Popen(
        [*dagster, "api", "grpc", "-m", "dagster_app", "--socket", str(socket)],
        env=env, cwd=home, stdout=output, stderr=subprocess.STDOUT,
    )  # fmt: skip
    run_id = str(uuid.uuid4())
    instance = DagsterInstance.get()
    try:
        wait_for(lambda: socket.exists() or server.poll() is not None, 60, "the code server")
        assert server.poll() is None, (home / "server.log").read_text()[-3000:]
        config = {
            "ops": {"synclane_run_worker": {"config": {"queues": ["slow"], "budget_seconds": 90}}}
        }
        launched = subprocess.run(
            [*dagster, "job", "launch", "--grpc-socket", str(socket), "-j", WORK,
             "--run-id", run_id, "--config-json", json.dumps(config)],
            env=env, cwd=home, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert launched.returncode == 0, launched.stderr[-3000:]
        # The second page is in flight once the first page's cursor is saved.
        wait_for(lambda: slow_job(db, schema)[:2] == ("running", "page-2"), 60, "page 2")

        # While the run works, the work schedule starts nothing more.
        schedule = loaded.defs.resolve_schedule_def(f"{WORK}_schedule")
        context = build_schedule_context(
            instance=instance, scheduled_execution_time=datetime.now(UTC)
        )
        ticked = schedule.evaluate_tick(context)
        assert not ticked.run_requests and "1 work run(s) still going" in (
            ticked.skip_message or ""
        )

        assert instance.run_launcher.terminate(run_id)
        finished = wait_for(
            lambda: (r := instance.get_run_by_id(run_id)) is not None and r.is_finished and r,
            60,
            "the run to end",
        )
        assert finished.status == DagsterRunStatus.CANCELED
        # Back to pending with the cursor of its last saved page; the attempt is given back.
        assert slow_job(db, schema) == ("pending", "page-2", 10, 0, None)
        messages = [message for _, message in logs(instance, run_id)]
        assert any("handed back at cursor 'page-2'" in m for m in messages)
        assert any(
            m.startswith("run stopped by DagsterExecutionInterruptedError") for m in messages
        )
    finally:
        (home / "release").touch()
        run_ended = instance.get_run_by_id(run_id)
        if run_ended is not None and not run_ended.is_finished:
            instance.run_launcher.terminate(run_id)
        server.terminate()
        server.wait(30)
        output.close()
        instance.dispose()
        shutil.rmtree(home, ignore_errors=True)


# -- backfill ------------------------------------------------------------------------------


def test_a_backfill_adds_only_the_older_slices_of_the_owners_asked(
    loaded: ModuleType, defs: Definitions, instance: DagsterInstance
) -> None:
    run(defs, PLAN, instance)
    before = loaded.app.jobs("shops", type="orders")
    one = run(
        defs,
        BACKFILL,
        instance,
        {"queue": "shops", "type": "orders", "horizon_days": 120, "owners": ["globex"]},
    )
    assert output_metadata(one) == {"slices_added": 2, "percent_loaded": 0.0}
    # Lazy history: the older slices are planned as the open ones finish (here by hand).
    with loaded.app.connect() as conn:
        conn.execute(
            sql.SQL(
                "UPDATE {} SET status = 'completed' WHERE type = 'orders' AND mode = 'initial'"
            ).format(sql.Identifier(loaded.app.schema, "jobs"))
        )
    after = loaded.app.jobs("shops", type="orders")
    added = after[~after["id"].isin(before["id"])]
    assert set(added["owner"]) == {"globex"}
    assert added["window_end"].max() <= before["window_start"].min()  # only older slices
    every = run(defs, BACKFILL, instance, {"queue": "shops", "horizon_days": 120})
    assert output_metadata(every)["slices_added"] == 4  # the acme owners' older slices
    assert (
        output_metadata(run(defs, BACKFILL, instance, {"queue": "shops", "horizon_days": 120}))[
            "slices_added"
        ]
        == 0
    )


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"queue": "shops", "type": "products", "horizon_days": 120}, "snapshot type"),
        ({"queue": "slow", "horizon_days": 120}, "no windowed type"),
        ({"queue": "shops", "horizon_days": 0}, "horizon_days=0.0 must be a number of days > 0"),
        ({"queue": "shops", "horizon_days": 120, "owners": ["hooli"]}, "'hooli' have no jobs"),
        ({"queue": "nope", "horizon_days": 120}, "unknown queue 'nope'"),
    ],
)
def test_a_wrong_backfill_fails_its_run_with_the_setting_named(
    defs: Definitions, instance: DagsterInstance, config: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        run(defs, BACKFILL, instance, config)


# -- the resource --------------------------------------------------------------------------


def test_the_resource_can_name_the_app_by_path_and_the_dsn_by_env_var(
    loaded: ModuleType, dsn: str, schema: str, instance: DagsterInstance
) -> None:
    resource = SyncLaneResource(
        app_path="dagster_app:app", dsn=EnvVar("SYNCLANE_DSN"), schema_name=schema
    )
    named = definitions(loaded.app, resource=resource)
    result = run(named, PLAN, instance)
    assert result.success and set(materialized(result)) == {"shops", "fragile", "slow"}
    stored = instance.get_run_by_id(result.run_id)
    assert stored is not None
    assert dsn not in json.dumps(stored.run_config) and dsn not in repr(named)
    assert all(dsn not in message for _, message in logs(instance, result.run_id))


def test_the_resource_refuses_an_app_it_cannot_find_or_that_does_not_match(
    loaded: ModuleType, schema: str, instance: DagsterInstance
) -> None:
    assert SyncLaneResource(schema_name=schema).get_app() is loaded.app  # registered by defs
    with pytest.raises(ConfigError, match="no app for schema 'elsewhere' in this process"):
        SyncLaneResource(schema_name="elsewhere").get_app()
    with pytest.raises(ConfigError, match="needs app_path"):
        SyncLaneResource().get_app()
    with pytest.raises(ConfigError, match="schema_name='elsewhere' but the app"):
        SyncLaneResource(app_path="dagster_app:app", schema_name="elsewhere").get_app()
    with pytest.raises(ValueError, match=r"package\.module:attribute"):
        SyncLaneResource(app_path="dagster_app")
    with pytest.raises(ConfigError, match="another database"):
        SyncLaneResource(schema_name=schema, dsn="postgresql://u:pw@db.invalid/x").get_app()
    other = SyncLane(loaded.app.dsn, schema=f"{schema}_other")
    other.queue("elsewhere")
    try:
        mismatched = definitions(loaded.app, resource=SyncLaneResource.for_app(other))
        with pytest.raises(ConfigError, match="these definitions were built for schema"):
            run(mismatched, REQUEUE, instance, {"queue": "shops"})
    finally:
        with other.connection() as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(other.schema)))
        other.close()


# -- the demo code location ----------------------------------------------------------------


@pytest.mark.processes
def test_the_demo_code_location_loads_in_dagster(
    dsn: str, db: psycopg.Connection, tmp_path: Path
) -> None:
    """`dagster definitions validate -f flows/dagster_defs.py`, in a database of its own (the
    demo app builds its tables in the fixed schemas `synclane` and `demo`)."""
    database = f"dagster_demo_{uuid.uuid4().hex[:8]}"
    db.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    try:
        (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
        env = {
            **os.environ,
            "SYNCLANE_DSN": make_conninfo(dsn, dbname=database),
            "DAGSTER_HOME": str(tmp_path),
        }
        done = subprocess.run(
            [sys.executable, "-m", "dagster", "definitions", "validate",
             "-f", str(ROOT / "flows" / "dagster_defs.py")],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert (
            "Validation successful for code location dagster_defs.py" in done.stderr + done.stdout
        )
    finally:
        db.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(database)))


def test_a_scheduled_plan_run_plans_what_is_due_and_one_by_hand_plans_everything(
    loaded: ModuleType,
    defs: Definitions,
    instance: DagsterInstance,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The plan schedule's runs carry the due-only tag: they plan as a worker's round does
    (the owner source read every owners_interval), so their cost follows what is due. A run
    without it (a materialization by hand) plans everything that is missing."""
    shops = AssetKey(["synclane", "shops"])
    job = defs.resolve_job_def(PLAN)

    def planned(tags: dict[str, str]) -> int:
        result = job.execute_in_process(instance=instance, asset_selection=[shops], tags=tags)
        return int(materialized(result)["shops"]["jobs_added"])

    assert planned({PLAN_TAG: DUE_ONLY}) == 12  # a new table: the round reads the owners
    queue = loaded.app.get_queue("shops")
    named = queue.owner_source
    assert named is not None
    monkeypatch.setattr(queue, "owner_source", lambda q: [*named(q), Owner("initech")])
    assert planned({PLAN_TAG: DUE_ONLY}) == 0  # within owners_interval: nothing is due
    assert planned({}) == 4  # by hand: initech's two slices, its refresh and its products
