"""The Prefect integration: the block, the flows, the deployments.

The plain functions behind the flows are tested against PostgreSQL without Prefect; the flows
themselves run as real Prefect flow runs against one temporary Prefect server for the session
(`prefect_test_harness`), loading `tests/prefect_app.py` by its app path.
"""

from __future__ import annotations

import _thread
import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("prefect", reason="the prefect extra is not installed")

import prefect_app
import yaml
from prefect.exceptions import TerminationSignal
from prefect.testing.standard_test_suites import BlockStandardTestSuite

from synclane import ConfigError, SyncLane
from synclane.prefect import SyncLaneDatabase, backfill, deployments, plan, requeue, serve, work
from synclane.prefect.operations import (
    artifact_key,
    load_app,
    loaded_percent,
    plan_summary,
    progress_rows,
    run_worker_until_stopped,
    split_app_path,
    watch_history,
    widen_history,
)

pytestmark = pytest.mark.prefect

BLOCK = "prefect-test-db"
FLOWS = ("plan", "work", "backfill", "requeue")
ROOT = Path(__file__).resolve().parent.parent


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[None]:
    """One temporary Prefect server (SQLite) for every test that runs a flow."""
    from prefect.settings import (
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        temporary_settings,
    )
    from prefect.testing.utilities import prefect_test_harness

    with (
        temporary_settings({PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: 120}),
        prefect_test_harness(server_startup_timeout=120),
    ):
        yield


@pytest.fixture
def loaded(dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """`prefect_app` freshly imported on this test's schema, as `prefect_app:app` loads it."""
    monkeypatch.setenv("SYNCLANE_PREFECT_TEST_SCHEMA", schema)
    monkeypatch.setenv("SYNCLANE_DSN", dsn)  # restored afterwards; the block sets it too
    monkeypatch.delitem(sys.modules, "prefect_app", raising=False)
    module = importlib.import_module("prefect_app")
    yield module
    module.RELEASE.set()
    module.app.close()


@pytest.fixture
def block(prefect_server: None, dsn: str, loaded: ModuleType) -> str:
    SyncLaneDatabase(dsn=dsn, app_path="prefect_app:app").save(BLOCK, overwrite=True)
    return BLOCK


@pytest.fixture
def lane(dsn: str, schema: str) -> Iterator[SyncLane]:
    """The test app built directly on this test's schema, for tests without Prefect."""
    app = prefect_app.build(dsn, schema)
    yield app
    app.close()


# -- without Prefect: the plain functions behind the flows ----------------------------------


def test_importing_synclane_does_not_import_prefect() -> None:
    code = (
        "import sys, synclane, synclane.app, synclane.worker\n"
        "found = sorted(m for m in sys.modules if m == 'prefect' or m.startswith('prefect.'))\n"
        "assert not found, found\n"
        "assert 'synclane.prefect' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_an_app_path_names_a_module_and_an_attribute() -> None:
    assert split_app_path("synclane.demo.app:app") == ("synclane.demo.app", "app")
    for wrong in ("synclane.demo.app", ":app", "pkg.mod:", "pkg.mod:not an attribute"):
        with pytest.raises(ConfigError, match=r"package\.module:attribute"):
            split_app_path(wrong)


def test_loading_an_app_by_path_binds_it_to_the_given_dsn(
    loaded: ModuleType, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load_app("prefect_app:app", dsn) is loaded.app
    with pytest.raises(ConfigError, match="names nothing"):
        load_app("prefect_app:missing")
    with pytest.raises(ConfigError, match="not a SyncLane"):
        load_app("prefect_app:build")
    with pytest.raises(ConfigError, match="cannot import"):
        load_app("no_such_module_here:app")
    other = "postgresql://someone:hunter2@db.invalid:5432/elsewhere"
    with pytest.raises(ConfigError, match="SyncLane\\(None") as raised:
        load_app("prefect_app:app", other)
    assert "hunter2" not in str(raised.value) and dsn not in str(raised.value)


def test_progress_rows_are_json_safe_one_per_owner_and_type(lane: SyncLane) -> None:
    lane.plan()
    lane.run_worker(["shops"], stop_after=20, until_idle=True)
    rows = progress_rows(lane, "shops")
    assert json.loads(json.dumps(rows)) == rows
    assert {(r["owner"], r["type"]) for r in rows} == {
        (owner, type)
        for owner in ("acme-eu", "acme-us", "globex")
        for type in ("orders", "products")
    }
    orders = {r["owner"]: r for r in rows if r["type"] == "orders"}
    assert orders["acme-us"]["queue"] == "shops"
    assert orders["acme-us"]["slices_completed"] == 2 and orders["acme-us"]["percent"] == 100.0
    assert orders["globex"]["slices_failed"] == 2 and orders["globex"]["percent"] == 0.0
    assert isinstance(orders["acme-us"]["coverage_end"], str)  # ISO 8601, not a Timestamp
    assert orders["acme-us"]["coverage_end"].startswith(str(time.gmtime().tm_year))
    assert progress_rows(lane, "shops", owners=["globex"], type="orders") == [orders["globex"]]
    assert loaded_percent(progress_rows(lane, "shops", type="orders")) == pytest.approx(66.7)
    assert loaded_percent([]) == 100.0


def test_the_plan_summary_shows_what_was_added_and_what_fails() -> None:
    rows = [
        {"queue": "shops", "owner": "a", "type": "orders", "slices_total": 4,
         "slices_completed": 3, "slices_failed": 1},
        {"queue": "shops", "owner": "b", "type": "orders", "slices_total": 4,
         "slices_completed": 4, "slices_failed": 0},
    ]  # fmt: skip
    text = plan_summary({"shops": 2, "empty": 0}, {"shops": rows, "empty": []})
    assert "| shops | 2 | 2 | 7 / 8 | 87.5 % |" in text
    assert "| empty | 0 | 0 | 0 / 0 | 100.0 % |" in text
    assert "- shops · a · orders: 1" in text and "· b ·" not in text


def test_artifact_keys_hold_only_lowercase_letters_digits_and_dashes() -> None:
    assert artifact_key("synclane", "progress", "shops") == "synclane-progress-shops"
    assert artifact_key("Test_Schema", "backfill", "EU shops", "orders") == (
        "test-schema-backfill-eu-shops-orders"
    )


def test_an_interrupted_wait_hands_the_job_back_with_its_cursor(lane: SyncLane) -> None:
    """The stop path of the work flow without Prefect: an exception raised in the waiting
    thread (here KeyboardInterrupt, sent to the main thread like a signal) stops the worker,
    whose job goes back to pending with the cursor of its last saved page."""
    prefect_app.PAGE_IN_FLIGHT.clear()
    prefect_app.RELEASE.clear()
    lane.plan("slow")

    def interrupt_mid_page() -> None:
        if prefect_app.PAGE_IN_FLIGHT.wait(30):
            _thread.interrupt_main()

    threading.Thread(target=interrupt_mid_page, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_worker_until_stopped(lane.worker(["slow"], 60))
    finally:
        prefect_app.RELEASE.set()
    job = lane.jobs("slow").iloc[0]
    assert (job["status"], job["cursor"], job["processed_count"]) == ("pending", "page-2", 10)
    assert job["attempt_count"] == 0  # a stop is not a failed attempt
    assert job["leased_by"] is None or str(job["leased_by"]) in ("", "<NA>")


def test_a_worker_that_ends_by_itself_returns_its_report(lane: SyncLane) -> None:
    lane.plan("shops")
    report = run_worker_until_stopped(lane.worker(["shops"], 20, until_idle=True))
    assert report == {"completed": 10, "failed": 2}


def test_widening_history_adds_older_slices_for_the_owners_asked(lane: SyncLane) -> None:
    lane.plan("shops")
    before = lane.jobs("shops", type="orders")
    assert widen_history(lane, "shops", "orders", timedelta(days=120), ["globex"]) == 2
    after = lane.jobs("shops", type="orders")
    added = after[~after["id"].isin(before["id"])]
    assert set(added["owner"]) == {"globex"}
    assert added["window_end"].max() <= before["window_start"].min()  # only older slices
    assert widen_history(lane, "shops", "orders", timedelta(days=120)) == 4  # the other two
    assert widen_history(lane, "shops", "orders", timedelta(days=120)) == 0
    with pytest.raises(ConfigError, match="snapshot"):
        widen_history(lane, "shops", "products", timedelta(days=120))
    with pytest.raises(ConfigError, match="'hooli' are not connected"):
        widen_history(lane, "shops", "orders", timedelta(days=120), ["hooli"])


def test_watching_history_stops_when_it_is_loaded_or_the_budget_ends(lane: SyncLane) -> None:
    lane.plan("shops")
    seen: list[float] = []
    rows = watch_history(
        lane, "shops", "orders", ["acme-us"], budget_seconds=0, poll_seconds=1,
        report=lambda percent, rows: seen.append(percent),
    )  # fmt: skip
    assert seen == [0.0] and [r["owner"] for r in rows] == ["acme-us"]

    def work_a_little(seconds: float) -> None:
        lane.run_worker(["shops"], stop_after=10, until_idle=True)

    seen.clear()
    watch_history(
        lane, "shops", "orders", ["acme-us", "acme-eu"], budget_seconds=60, poll_seconds=1,
        report=lambda percent, rows: seen.append(percent), sleep=work_a_little,
    )  # fmt: skip
    assert seen == [0.0, 100.0]


def test_the_deployments_plan_every_minute_and_work_one_run_at_a_time() -> None:
    from prefect.client.schemas.objects import ConcurrencyLimitStrategy

    built = {d.flow_name: d for d in deployments("synclane.demo.app:app", work_budget_seconds=300)}
    assert set(built) == {"synclane-plan", "synclane-work", "synclane-backfill", "synclane-requeue"}
    assert {d.name for d in built.values()} == {"synclane-demo-app"}
    assert built["synclane-plan"].schedules[0].schedule.cron == "* * * * *"
    work_deployment = built["synclane-work"]
    assert work_deployment.schedules[0].schedule.cron == "*/10 * * * *"
    assert work_deployment.concurrency_limit == 1
    assert work_deployment.concurrency_options is not None
    assert work_deployment.concurrency_options.collision_strategy == (
        ConcurrencyLimitStrategy.CANCEL_NEW
    )
    assert work_deployment.parameters == {
        "app_path": "synclane.demo.app:app",
        "budget_seconds": 300,
    }
    assert not built["synclane-backfill"].schedules and not built["synclane-requeue"].schedules
    for deployment in built.values():
        assert not deployment.job_variables  # served: the runs inherit serve()'s environment
    with pytest.raises(ValueError, match="work_budget_seconds"):
        deployments("synclane.demo.app:app", work_budget_seconds=600)


def test_serve_checks_the_app_then_serves_without_pausing_on_shutdown(
    loaded: ModuleType, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import prefect

    served: dict[str, Any] = {}
    monkeypatch.setattr(prefect, "serve", lambda *d, **kw: served.update(deployments=d, **kw))
    monkeypatch.setenv("PREFECT_LOGGING_EXTRA_LOGGERS", "httpx")
    serve("prefect_app:app", dsn=dsn, work_budget_seconds=120)
    assert served["pause_on_shutdown"] is False
    assert len(served["deployments"]) == 4
    assert os.environ["SYNCLANE_DSN"] == dsn  # what the served runs inherit
    assert os.environ["PREFECT_LOGGING_EXTRA_LOGGERS"] == "httpx,synclane"
    with pytest.raises(ConfigError, match="cannot import"):
        serve("no_such_module_here:app")


def test_the_demo_project_serves_the_same_deployments_as_serve() -> None:
    """flows/serve.py spells the deployments out for people to copy; it must not drift from
    what `synclane serve` builds."""
    spec = importlib.util.spec_from_file_location("flows_serve", ROOT / "flows" / "serve.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def shape(built: list[Any]) -> list[tuple[Any, ...]]:
        return sorted(
            (d.flow_name, d.name, [s.schedule for s in d.schedules], d.concurrency_limit,
             d.concurrency_options, d.parameters)
            for d in built
        )  # fmt: skip

    assert shape(module.demo_deployments()) == shape(
        deployments("synclane.demo.app:app", name="demo")
    )
    project = yaml.safe_load((ROOT / "flows" / "prefect.yaml").read_text())
    entrypoints = {d["entrypoint"] for d in project["deployments"]}
    assert entrypoints == {f"synclane.prefect.flows:{f}" for f in FLOWS}
    for name in FLOWS:
        assert getattr(importlib.import_module("synclane.prefect.flows"), name).name == (
            f"synclane-{name}"
        )


# -- the block -----------------------------------------------------------------------------


class TestSyncLaneDatabaseStandards(BlockStandardTestSuite):
    @pytest.fixture
    def block(self) -> type[SyncLaneDatabase]:
        return SyncLaneDatabase

    def test_has_a_valid_image(self, block: type[SyncLaneDatabase]) -> None:
        # The standard version downloads the logo, which needs a network this suite does not
        # have; what can be checked here is that there is an https logo URL.
        assert str(block._logo_url).startswith("https://")


def test_the_block_round_trips_without_showing_its_secret(
    prefect_server: None, dsn: str, loaded: ModuleType
) -> None:
    secret = "postgresql://synclane:s3cret-pw@db.example:5432/sync"
    SyncLaneDatabase(dsn=secret, app_path="prefect_app:app").save("round-trip", overwrite=True)
    found = SyncLaneDatabase.load("round-trip")
    assert isinstance(found, SyncLaneDatabase)
    assert found.dsn.get_secret_value() == secret
    assert found.app_path == "prefect_app:app"
    for text in (repr(found), str(found), found.model_dump_json()):
        assert "s3cret" not in text
    with pytest.raises(ValueError, match=r"package\.module:attribute"):
        SyncLaneDatabase(dsn=secret, app_path="prefect_app")
    SyncLaneDatabase(dsn=dsn, app_path="prefect_app:app").save("ours", overwrite=True)
    assert SyncLaneDatabase.load("ours").get_app() is loaded.app


def test_the_block_is_registered_through_the_prefect_collections_entry_point() -> None:
    from importlib.metadata import entry_points

    from prefect.blocks.core import Block
    from prefect.plugins import load_prefect_collections

    (point,) = [p for p in entry_points(group="prefect.collections") if p.name == "synclane"]
    assert point.value == "synclane.prefect"
    assert not isinstance(load_prefect_collections()["synclane"], Exception)
    # what `prefect block register -m synclane.prefect` registers
    module = importlib.import_module(point.value)
    blocks = [v for v in vars(module).values() if Block.is_block_class(v)]
    assert blocks == [SyncLaneDatabase]
    assert Block.get_block_class_from_key("synclane-database") is SyncLaneDatabase


def test_prefect_block_register_knows_the_block(prefect_server: None) -> None:
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    done = subprocess.run(
        [sys.executable, "-m", "prefect", "block", "register", "-m", "synclane.prefect"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SyncLane Database" in done.stdout


def published(key: str) -> tuple[str, Any]:
    """The latest artifact under `key`: its type and its data (JSON text decoded)."""
    from prefect.artifacts import Artifact

    from synclane.prefect.flows import called

    found = called(Artifact.get(key))
    assert found is not None, f"no artifact {key!r}"
    data = found.data
    return str(found.type), json.loads(data) if isinstance(
        data, str
    ) and found.type == "table" else data


# -- the flows, as Prefect flow runs --------------------------------------------------------


def test_plan_then_work_completes_jobs_and_publishes_progress(
    block: str, dsn: str, schema: str, loaded: ModuleType
) -> None:
    import logging

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler

    assert plan(database=block) == {"shops": 12, "slow": 1}
    kind, rows = published(artifact_key(schema, "progress", "shops"))
    assert kind == "table"
    assert len(rows) == 6  # three owners × two types, nothing loaded yet
    assert {r["slices_completed"] for r in rows} == {0}
    kind, summary = published(artifact_key(schema, "plan"))
    assert kind == "markdown" and "| shops | 12 |" in summary

    # What PREFECT_LOGGING_EXTRA_LOGGERS=synclane does in a deployment's run process.
    handler = APILogHandler()
    logging.getLogger("synclane").addHandler(handler)
    try:
        state = work(database=block, queues=["shops"], budget_seconds=30, until_idle=True,
                     return_state=True)  # fmt: skip
        handler.flush()
    finally:
        logging.getLogger("synclane").removeHandler(handler)
    assert state.is_completed()
    assert state.result() == {"completed": 10, "failed": 2}
    assert set(loaded.app.jobs("shops")["status"]) == {"completed", "failed"}

    assert plan(database=block, queue="shops") == {"shops": 0}
    _, rows = published(artifact_key(schema, "progress", "shops"))
    loaded_orders = {r["owner"]: r["slices_completed"] for r in rows if r["type"] == "orders"}
    assert loaded_orders == {"acme-us": 2, "acme-eu": 2, "globex": 0}

    run_id = state.state_details.flow_run_id
    deadline = time.monotonic() + 10
    with get_client(sync_client=True) as client:
        while True:
            logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
            lines = [f"{log.name}: {log.message}" for log in logs]
            if any(line.startswith("synclane: job") for line in lines):
                break
            assert time.monotonic() < deadline, lines
            time.sleep(0.2)
    assert any("completed" in line for line in lines if line.startswith("synclane: "))
    for text in [*lines, summary, json.dumps(rows)]:
        assert dsn not in str(text)

    # the two failed globex slices, by their failure cause
    cause = str(loaded.app.failures("shops")["cause"].iloc[0])
    assert requeue(queue="shops", cause=cause, app_path="prefect_app:app") == 2


def test_a_cancelled_work_run_hands_its_job_back_with_its_cursor(
    block: str, loaded: ModuleType
) -> None:
    """Cancelling a served or worker-started run sends SIGTERM to its process; the flow engine's
    SIGTERM bridge turns it into TerminationSignal in the flow's thread. Here the same signal
    reaches a flow run of this process while a page is in flight."""
    plan(database=block, queue="slow")
    # The engine re-sends the signal to the handler it replaced once the run has ended; make
    # that one harmless instead of Python's default, which would end the test process.
    previous = signal.signal(signal.SIGTERM, lambda number, frame: None)

    def cancel_mid_page() -> None:
        if loaded.PAGE_IN_FLIGHT.wait(30):
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=cancel_mid_page, daemon=True).start()
    try:
        with pytest.raises(TerminationSignal):
            work(database=block, queues=["slow"], budget_seconds=60)
    finally:
        signal.signal(signal.SIGTERM, previous)
        loaded.RELEASE.set()
    job = loaded.app.jobs("slow").iloc[0]
    assert (job["status"], job["cursor"], job["processed_count"]) == ("pending", "page-2", 10)
    assert job["attempt_count"] == 0


def test_backfill_widens_history_and_reports_progress(
    block: str, schema: str, loaded: ModuleType
) -> None:
    plan(database=block, queue="shops")
    result = backfill(
        queue="shops", type="orders", horizon_days=120, owners=["acme-us"], database=block,
        budget_seconds=0,
    )  # fmt: skip
    assert result == {"added": 2, "percent": 0.0}
    kind, percent = published(artifact_key(schema, "backfill", "shops", "orders"))
    assert kind == "progress" and float(percent) == 0.0
    _, rows = published(artifact_key(schema, "backfill", "shops", "orders", "owners"))
    assert [(r["owner"], r["slices_total"]) for r in rows] == [("acme-us", 4)]
