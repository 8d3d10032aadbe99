"""The Prefect integration: the block, the flows, the deployments, and what Prefect sees.

The plain functions behind the flows are tested against PostgreSQL without Prefect; the flows
themselves run as real Prefect flow runs against one temporary Prefect server for the session
(`prefect_test_harness`, the fixture `prefect_server` of tests/conftest.py), loading
`tests/prefect_app.py` by its app path. Where Prefect's own behaviour on many machines is the
point (late runs, two process workers, draining one), tests/test_prefect_pool.py deploys
flows/prefect.yaml with `prefect deploy --all` and runs real `prefect worker start` processes.
"""

from __future__ import annotations

import _thread
import importlib
import json
import os
import re
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import psycopg
import pytest
from psycopg import sql

pytest.importorskip("prefect", reason="the prefect extra is not installed")

import prefect_app
import yaml
from prefect.client.schemas.objects import State
from prefect.exceptions import TerminationSignal
from prefect.testing.standard_test_suites import BlockStandardTestSuite
from prefect_kit import FLOWS, ROOT, eventually, flow_runs, prefect_cli, prefect_env

from synclane import ConfigError, SyncLane
from synclane.causes import Causes, Noted
from synclane.demo import data_schema_for
from synclane.events import Event
from synclane.prefect import SyncLaneDatabase, backfill, deployments, plan, requeue, serve, work
from synclane.prefect.flows import _backfill_state, called
from synclane.prefect.identity import TableIdentity, artifact_key, table_identity, where_it_points
from synclane.prefect.operations import (
    History,
    check_queues,
    history_of,
    load_app,
    loaded_percent,
    plan_summary,
    progress_rows,
    run_worker_until_stopped,
    split_app_path,
    watch_history,
    widen_history,
    worth_publishing,
)
from synclane.prefect.reporting import WorkLog, prefect_event, work_outcome
from synclane.prefect.runs import check_served_names, counted_runs

pytestmark = pytest.mark.prefect

BLOCK = "prefect-test-db"


# -- fixtures ------------------------------------------------------------------------------


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
def block(prefect_server: str, dsn: str, loaded: ModuleType) -> str:
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
    with pytest.raises(ConfigError, match="has no 'missing'"):
        load_app("prefect_app:missing")
    with pytest.raises(ConfigError, match="not a SyncLane"):
        load_app("prefect_app:build")
    with pytest.raises(ConfigError, match="cannot import"):
        load_app("no_such_module_here:app")
    other = "postgresql://someone:hunter2@db.invalid:5432/elsewhere"
    with pytest.raises(ConfigError, match="SyncLane\\(None") as raised:
        load_app("prefect_app:app", other)
    assert "hunter2" not in str(raised.value) and dsn not in str(raised.value)


def test_a_misspelt_queue_gets_the_declared_name_it_is_closest_to(lane: SyncLane) -> None:
    assert check_queues(lane, None) == ["shops", "slow", "alerts", "spread"]
    assert check_queues(lane, ["alerts"]) == ["alerts"]
    with pytest.raises(ConfigError, match="unknown queue 'shop': did you mean 'shops'") as raised:
        check_queues(lane, ["slow", "shop"])
    assert "app.queue(" not in str(raised.value)  # not advice to declare the typo
    with pytest.raises(ConfigError, match="unknown queue 'zzz': the app declares 'shops'"):
        check_queues(lane, ["zzz"])


def test_progress_rows_are_json_safe_one_per_owner_and_type(lane: SyncLane) -> None:
    lane.plan("shops")
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


def test_a_progress_table_gets_a_new_version_only_when_it_changed_and_not_too_often() -> None:
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    every = timedelta(minutes=10)
    row = {"owner": "a", "type": "orders", "state": "loading", "slices_total": 4,
           "slices_completed": 1, "slices_failed": 0, "records": 10,
           "coverage_end": "2026-11-30T11:45:00Z"}  # fmt: skip
    assert worth_publishing([row], None, None, now, every)  # the first version
    # records and the coverage end within the day move with every refresh: not a change
    busy = {**row, "records": 99, "coverage_end": "2026-11-30T11:59:00Z"}
    assert not worth_publishing([busy], [row], now - timedelta(hours=5), now, every)
    moved = {**row, "slices_completed": 2}
    assert not worth_publishing([moved], [row], now - timedelta(minutes=3), now, every)
    assert worth_publishing([moved], [row], now - timedelta(minutes=10), now, every)
    next_day = {**row, "coverage_end": "2026-12-01T00:15:00Z"}
    assert worth_publishing([next_day], [row], now - timedelta(minutes=30), now, every)


def test_artifact_keys_name_the_database_and_never_its_password(dsn: str, schema: str) -> None:
    """Two databases with the same schema name get different keys; one database reached by two
    spellings of its DSN gets one; no key or label holds a password."""
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    with_password = psycopg.conninfo.make_conninfo(dsn, password="s3cret-pw")  # trust ignores it
    # Another database of the same server: the embedded server's tests already use "postgres".
    other_name = "template1" if params.get("dbname", "postgres") == "postgres" else "postgres"
    other_database = psycopg.conninfo.make_conninfo(dsn, dbname=other_name)
    identities = {}
    for name, where in (("test", dsn), ("password", with_password), ("other", other_database)):
        app = SyncLane(where, schema=schema, create_schema=False)
        identities[name] = table_identity(app)
        app.close()
    assert identities["test"] == identities["password"]
    assert identities["test"].database == params.get("dbname", "postgres")
    assert identities["other"].database == other_name
    assert identities["other"].digest != identities["test"].digest
    for identity in identities.values():
        key = artifact_key(identity, "progress", "EU shops")
        # a name that is not plain lowercase letters and digits carries a digest of itself
        assert re.fullmatch(r"synclane-[a-z0-9-]+-progress-eu-shops-[0-9a-f]{8}", key)
        assert identity.digest in key and schema.replace("_", "-") in key
        assert "s3cret" not in key + identity.label
    assert where_it_points("postgresql://me:s3cret@db.example:6432/shop") == (
        "db.example:6432",
        "shop",
    )


def test_names_that_differ_only_by_case_or_punctuation_get_keys_of_their_own() -> None:
    """Artifact keys hold lowercase letters, digits and dashes only: `orch_a`, `Orch_A` and
    `orch-a` are three schemas (three tables), and `Shops` and `shops` two queues."""
    tables = [TableIdentity("shop", "3f2a9c1b", name) for name in ("orch_a", "Orch_A", "orch-a")]
    assert len({table.slug for table in tables}) == 3
    assert TableIdentity("shop", "3f2a9c1b", "synclane").slug == "shop-3f2a9c1b-synclane"
    table = tables[0]
    keys = {artifact_key(table, "progress", queue) for queue in ("shops", "Shops", "sh-ops")}
    assert len(keys) == 3 and artifact_key(table, "progress", "shops").endswith("-progress-shops")
    for key in keys:
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", key), key


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


def alert_events(lane: SyncLane) -> tuple[WorkLog, list[Noted]]:
    """Work the `alerts` queue until idle; what its events said, and with their causes."""
    worklog = WorkLog(limit=2)
    causes = Causes(lane)
    lane.plan("alerts")
    lane.run_worker(
        ["alerts"], stop_after=30, until_idle=True, idle_grace=0, on_event=[worklog, causes]
    )
    return worklog, causes.take(final=True)


def test_the_work_report_lists_each_failure_with_its_error(lane: SyncLane) -> None:
    worklog, noted = alert_events(lane)
    assert worklog.counts["abandoned"] == 3 and worklog.counts["deferred"] == 3
    table = TableIdentity("shop", "3f2a9c1b", "synclane")
    report = {"completed": 3, "abandoned": 3, "deferred": 3, "throttled": 1}
    text = worklog.markdown(
        queues=["alerts"], worker="vm:1", table=table, seconds=4.2, ended="its budget was used",
        report=report,
    )  # fmt: skip
    assert "Worker `vm:1` worked queue(s) `alerts` of shop (3f2a9c1b) · schema synclane" in text
    assert "| 3 | 0 | 3 | 3 | 1 | 0 | 0 | 0 |" in text
    abandoned = text.split("## Abandoned")[1].split("##")[0]
    assert abandoned.count("| stuck | orders |") == 2  # two listed (limit=2) ...
    assert "… and 1 more." in abandoned  # ... and the third counted
    assert "Abandon: the account was closed" in abandoned
    deferred = text.split("## Deferred")[1].split("##")[0]
    assert "RuntimeError: order " in deferred and "| flaky |" in deferred
    assert "## Throttled" in text and "| busy |" in text.split("## Throttled")[1]
    assert "## Failed" not in text  # nothing is waiting for a plain retry

    assert work_outcome(report, noted, fail_on_abandoned=False) is None
    assert work_outcome({"deferred": 3}, [n for n in noted if n.event.kind != "abandoned"],
                        fail_on_abandoned=True) is None  # fmt: skip
    failure = work_outcome(report, noted, fail_on_abandoned=True)
    in_order = lane.jobs("alerts", owner="stuck").sort_values("completed_at")  # as abandoned
    stuck = [int(i) for i in in_order["id"]]
    cause_id = str(lane.failures("alerts", status="abandoned")["cause_id"].iloc[0])
    assert failure == (
        "1 new cause(s) of abandoned jobs, waiting for a human: stuck (queue alerts): Abandon: "
        f"the account was closed (cause {cause_id}, job(s) {', '.join(map(str, stuck))}); once "
        f"fixed, `synclane requeue --queue alerts --owner stuck --cause-id {cause_id}` or the "
        f"requeue flow with queue='alerts', owner='stuck', cause_id='{cause_id}'; if the "
        "account is gone, take it out of the owner source and `synclane cancel --queue alerts "
        "--owner stuck --reason 'account gone'`. The run's synclane work artifact lists every "
        "job."
    )

    # The account's next job, abandoned for the same cause, fails no run.
    lane.enqueue("alerts", "stuck", "orders")
    _, again = alert_events(lane)
    (abandoned_again,) = [n for n in again if n.event.kind == "abandoned"]
    assert abandoned_again.repeat and abandoned_again.cause_id == cause_id
    assert work_outcome({"abandoned": 1}, again, fail_on_abandoned=True) is None


def test_a_prefect_event_names_the_job_and_relates_its_queue_owner_type_and_lane() -> None:
    table = TableIdentity("shop", "3f2a9c1b", "sync")
    at = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    event = Event(
        kind="abandoned", queue="shops", job_id=41, owner="acme-us", lane="acme",
        type="orders", mode="initial", worker="vm:7", attempt=5, error="Abandon: gone",
        status="abandoned", window_start=at - timedelta(days=30), window_end=at, at=at,
    )  # fmt: skip
    sent = prefect_event(event, table)
    assert sent["event"] == "synclane.job.abandoned"
    assert sent["occurred"] == at
    assert sent["resource"] == {
        "prefect.resource.id": "synclane.job.shop-3f2a9c1b-sync.41",
        "prefect.resource.name": "job 41",
        "synclane.table": "shop-3f2a9c1b-sync",
        "synclane.queue": "shops",
        "synclane.owner": "acme-us",
        "synclane.lane": "acme",
        "synclane.type": "orders",
        "synclane.mode": "initial",
        "synclane.status": "abandoned",
        "synclane.repeat": "false",  # its cause is not known to wait already: it alerts
    }
    related = {r["prefect.resource.role"]: r["prefect.resource.id"] for r in sent["related"]}
    assert related == {
        "table": "synclane.table.shop-3f2a9c1b-sync",
        "queue": "synclane.queue.shop-3f2a9c1b-sync.shops",
        "owner": "synclane.owner.shop-3f2a9c1b-sync.acme-us",
        "type": "synclane.type.shop-3f2a9c1b-sync.shops.orders",
        "lane": "synclane.lane.shop-3f2a9c1b-sync.shops.acme",
    }
    assert sent["payload"]["error"] == "Abandon: gone" and sent["payload"]["attempt"] == 5
    assert sent["payload"]["window_end"] == at.isoformat()
    json.dumps(sent["payload"])  # JSON-safe
    known = prefect_event(event, table, Noted(event, "Abandon: gone", "1c2d3e4f", repeat=True))
    assert known["resource"]["synclane.cause_id"] == "1c2d3e4f"
    assert known["resource"]["synclane.repeat"] == "true"
    assert (
        known["payload"]["cause"] == "Abandon: gone" and known["payload"]["cause_id"] == "1c2d3e4f"
    )


def test_widening_history_adds_older_slices_for_the_owners_asked(lane: SyncLane) -> None:
    lane.plan("shops")
    before = lane.jobs("shops", type="orders")
    assert widen_history(lane, "shops", "orders", timedelta(days=120), ["globex"]) == 2
    totals = {r["owner"]: r["slices_total"] for r in progress_rows(lane, "shops", type="orders")}
    assert totals == {"acme-eu": 2, "acme-us": 2, "globex": 4}
    # Lazy history: the older slices are planned as the open ones finish (here by hand).
    with lane.connect() as conn:
        conn.execute(
            sql.SQL(
                "UPDATE {} SET status = 'completed' WHERE type = 'orders' AND mode = 'initial'"
            ).format(sql.Identifier(lane.schema, "jobs"))
        )
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


def test_history_settles_when_every_slice_is_loaded_or_stopped_for_good(lane: SyncLane) -> None:
    alert_events(lane)

    def history(owner: str) -> History:
        rows = progress_rows(lane, "alerts", owners=[owner], type="orders")
        return history_of(lane, "alerts", "orders", [owner], rows)

    assert history("fine") == History(total=2, loaded=2, abandoned=0, cancelled=0)
    assert history("fine").settled and history("fine").percent == 100.0
    assert history("stuck") == History(total=2, loaded=0, abandoned=2, cancelled=0)
    assert history("stuck").settled  # nothing left that could load: a backfill stops waiting
    assert history("stuck").describe() == "0 of 2 slice(s) loaded (0.0 %), 2 abandoned"
    assert not history("flaky").settled  # deferred: one more attempt is due
    assert history("flaky").open == 2

    seen: list[float] = []
    found, rows = watch_history(
        lane, "alerts", "orders", ["fine", "stuck"], budget_seconds=60, poll_seconds=30,
        report=lambda history, rows: seen.append(history.percent),
    )  # fmt: skip
    assert seen == [50.0] and found.settled  # settled at once: no wait for abandoned slices
    assert {r["owner"] for r in rows} == {"fine", "stuck"}


def test_watching_history_waits_for_open_slices_until_the_budget_ends(lane: SyncLane) -> None:
    lane.plan("shops")
    seen: list[float] = []
    found, rows = watch_history(
        lane, "shops", "orders", ["acme-us"], budget_seconds=0, poll_seconds=1,
        report=lambda history, rows: seen.append(history.percent),
    )  # fmt: skip
    assert seen == [0.0] and not found.settled and [r["owner"] for r in rows] == ["acme-us"]

    def work_a_little(seconds: float) -> None:
        lane.run_worker(["shops"], stop_after=10, until_idle=True)

    seen.clear()
    watch_history(
        lane, "shops", "orders", ["acme-us", "acme-eu"], budget_seconds=60, poll_seconds=1,
        report=lambda history, rows: seen.append(history.percent), sleep=work_a_little,
    )  # fmt: skip
    assert seen == [0.0, 100.0]


def test_a_backfill_fails_only_for_slices_stopped_for_good() -> None:
    """A budget that ends while slices still load is how a long backfill ends: Completed, with
    what is left said. Failed means a slice will not load without a human."""
    loaded_all = History(total=4, loaded=4, abandoned=0, cancelled=0)
    stopped = History(total=4, loaded=2, abandoned=1, cancelled=1)
    still_open = History(total=4, loaded=3, abandoned=0, cancelled=0)
    open_and_abandoned = History(total=4, loaded=2, abandoned=1, cancelled=0)
    assert _backfill_state(loaded_all, {}, 60).is_completed()
    state = _backfill_state(stopped, {}, 60)
    assert state.is_failed() and state.message is not None
    assert state.message.startswith("2 of 4 slice(s) loaded (50.0 %), 1 abandoned, 1 cancelled")
    assert "requeue" in state.message
    state = _backfill_state(still_open, {}, 60)
    assert state.is_completed() and state.message is not None
    assert state.message.startswith("the budget of 60 s ended: 3 of 4 slice(s) loaded")
    assert "the work runs go on loading" in state.message
    state = _backfill_state(open_and_abandoned, {}, 60)
    assert state.is_failed() and state.message is not None
    assert "1 abandoned" in state.message and "requeue" in state.message
    state = _backfill_state(still_open, {}, 0)  # asked not to wait
    assert state.is_completed() and state.message is not None
    assert state.message.startswith("not waited for")


def test_overdue_work_runs_no_longer_count() -> None:
    from prefect.client.schemas.objects import FlowRun, StateType

    now = datetime.now(UTC)

    def run(state: StateType, started_minutes_ago: float | None) -> FlowRun:
        started = (
            None if started_minutes_ago is None else now - timedelta(minutes=started_minutes_ago)
        )
        return FlowRun(flow_id=uuid.uuid4(), state_type=state, start_time=started)

    working = run(StateType.RUNNING, 5)
    waiting = run(StateType.SCHEDULED, None)
    lost = run(StateType.RUNNING, 25)  # a 9-minute run that started 25 minutes ago
    myself = run(StateType.RUNNING, 9)
    stopping = run(StateType.CANCELLING, 6)  # holds its slot until it has ended
    stuck = run(StateType.CANCELLING, 30)  # its process is gone: it will never end
    runs = [working, waiting, lost, myself, stopping, stuck]
    counted, overdue = counted_runs(runs, 540, now, myself.id)
    assert [r.id for r in counted] == [working.id, waiting.id, stopping.id]
    assert [r.id for r in overdue] == [lost.id, stuck.id]


def test_the_deployments_plan_every_minute_and_keep_work_runs_going() -> None:
    from prefect.client.schemas.objects import ConcurrencyLimitStrategy

    built = {
        d.flow_name: d
        for d in deployments("synclane.demo.app:app", work_budget_seconds=300, work_runs=3)
    }
    assert set(built) == {"synclane-plan", "synclane-work", "synclane-backfill", "synclane-requeue"}
    assert {d.name for d in built.values()} == {"synclane-demo-app"}
    planning = built["synclane-plan"]
    assert planning.schedules[0].schedule.cron == "* * * * *"
    assert planning.parameters == {
        "app_path": "synclane.demo.app:app",
        "work_deployment": "synclane-work/synclane-demo-app",
        "due_only": True,  # the schedule's cost follows what is due, not the fleet
    }
    working = built["synclane-work"]
    assert not working.schedules  # the plan runs keep it going, and each run its successor
    assert working.parameters == {"app_path": "synclane.demo.app:app", "budget_seconds": 300}
    for deployment, limit in ((planning, 1), (working, 3)):
        assert deployment.concurrency_limit == limit
        assert deployment.concurrency_options is not None
        assert deployment.concurrency_options.collision_strategy == (
            ConcurrencyLimitStrategy.CANCEL_NEW
        )
    assert not built["synclane-backfill"].schedules and not built["synclane-requeue"].schedules
    for deployment in built.values():
        assert not deployment.job_variables  # served: the runs inherit serve()'s environment
    with pytest.raises(ConfigError, match="work_budget_seconds=0"):
        deployments("synclane.demo.app:app", work_budget_seconds=0)
    with pytest.raises(ConfigError, match="work_runs=0"):
        deployments("synclane.demo.app:app", work_runs=0)


def test_the_pool_project_never_uses_a_served_deployments_name() -> None:
    project = yaml.safe_load((ROOT / "flows" / "prefect.yaml").read_text())
    pooled = {(d["entrypoint"].rpartition(":")[2], d["name"]) for d in project["deployments"]}
    assert pooled == {(flow, "demo-pool") for flow in FLOWS}
    served = {
        (d.flow_name.removeprefix("synclane-"), d.name)
        for d in deployments("synclane.demo.app:app")
    }
    assert not pooled & served
    assert {d["entrypoint"] for d in project["deployments"]} == {
        f"synclane.prefect.flows:{f}" for f in FLOWS
    }
    for name in FLOWS:
        assert getattr(importlib.import_module("synclane.prefect.flows"), name).name == (
            f"synclane-{name}"
        )
    by_flow = {d["entrypoint"].rpartition(":")[2]: d for d in project["deployments"]}
    assert by_flow["plan"]["parameters"]["work_deployment"] == "synclane-work/demo-pool"
    assert by_flow["plan"]["parameters"]["due_only"] is True  # as the served one
    assert by_flow["plan"]["work_pool"]["work_queue_name"] == "plan"
    assert by_flow["work"]["work_pool"]["work_queue_name"] == "work"
    assert "schedules" not in by_flow["work"]


def test_flows_serve_py_serves_the_demo_under_the_name_synclane_serve_uses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import synclane.prefect

    served: list[tuple[Any, ...]] = []
    monkeypatch.setattr(synclane.prefect, "serve", lambda *a, **kw: served.append((a, kw)))
    runpy.run_path(str(ROOT / "flows" / "serve.py"), run_name="__main__")
    assert served == [(("synclane.demo.app:app",), {"work_budget_seconds": 540, "work_runs": 1})]


def test_flows_serve_py_loads_the_app_first_and_stops_on_an_unreachable_database(
    tmp_path: Path,
) -> None:
    env = {
        **os.environ,
        "SYNCLANE_DSN": "postgresql://nobody@127.0.0.1:1/nothing",
        "PREFECT_API_URL": "http://127.0.0.1:1/api",  # never reached
        "PREFECT_HOME": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "flows" / "serve.py")],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip().startswith("flows/serve.py: cannot connect to postgresql://nobody@")
    assert "Traceback" not in done.stderr


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
    prefect_server: str, dsn: str, loaded: ModuleType
) -> None:
    secret = "postgresql://synclane:s3cret-pw@db.example:5432/sync"
    SyncLaneDatabase(dsn=secret, app_path="prefect_app:app").save("round-trip", overwrite=True)
    # saving again needs overwrite=True (the docs' snippet says so); without it Prefect refuses
    with pytest.raises(ValueError, match="already in use"):
        SyncLaneDatabase(dsn=secret, app_path="prefect_app:app").save("round-trip")
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


def test_a_server_without_auth_returns_the_blocks_secret_to_any_client(
    prefect_server: str,
) -> None:
    """What docs/prefect.md warns about: the DSN is a secret in the UI and in logs, but a
    self-hosted server without authentication hands it to whoever asks for it."""
    import httpx

    secret = "postgresql://synclane:s3cret-pw@db.example:5432/sync"
    SyncLaneDatabase(dsn=secret, app_path="prefect_app:app").save("exposed", overwrite=True)
    document_id = SyncLaneDatabase.load("exposed")._block_document_id
    url = f"{prefect_server}/block_documents/{document_id}"
    assert "s3cret" not in httpx.get(url).text
    assert httpx.get(url, params={"include_secrets": "true"}).json()["data"]["dsn"] == secret


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


def test_prefect_block_register_knows_the_block(prefect_server: str, tmp_path: Path) -> None:
    out = prefect_cli(
        prefect_env(prefect_server, tmp_path), "block", "register", "-m", "synclane.prefect"
    )
    assert "SyncLane Database" in out


def published(key: str) -> tuple[str, Any]:
    """The latest artifact under `key`: its type and its data (JSON text decoded)."""
    from prefect.artifacts import Artifact

    found = called(Artifact.get(key))
    assert found is not None, f"no artifact {key!r}"
    data = found.data
    return str(found.type), json.loads(data) if isinstance(
        data, str
    ) and found.type == "table" else data


def versions(key: str) -> int:
    """How many versions of the artifact `key` the server holds."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        return len(
            client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
        )


def server_events(api_url: str, table: str) -> list[dict[str, Any]]:
    """The synclane events the server stored about jobs of this table."""
    import httpx

    body = {
        "filter": {
            "event": {"prefix": ["synclane."]},
            "resource": {"id_prefix": [f"synclane.job.{table}."]},
            "occurred": {"since": (datetime.now(UTC) - timedelta(hours=1)).isoformat()},
        },
        "limit": 50,  # the most the server answers in one page; the tests need fewer
    }
    answer = httpx.post(f"{api_url}/events/filter", json=body, timeout=30)
    answer.raise_for_status()
    found: list[dict[str, Any]] = answer.json()["events"]
    return found


# -- the flows, as Prefect flow runs --------------------------------------------------------


def test_plan_then_work_completes_jobs_and_publishes_progress(
    block: str, dsn: str, schema: str, loaded: ModuleType
) -> None:
    import logging

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler

    table = table_identity(loaded.app)
    assert plan(database=block, queue="shops") == {"shops": 12}
    progress_key = artifact_key(table, "progress", "shops")
    kind, rows = published(progress_key)
    assert kind == "table"
    assert len(rows) == 6  # three owners × two types, nothing loaded yet
    assert {r["slices_completed"] for r in rows} == {0}
    kind, summary = published(artifact_key(table, "plan"))
    assert kind == "markdown" and "| shops | 12 |" in summary
    assert plan(database=block, queue="shops") == {"shops": 0}
    assert plan(database=block, queue="shops", due_only=True) == {"shops": 0}
    assert versions(progress_key) == 1  # nothing changed: no new version

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

    assert plan(database=block, queue="shops", artifacts_every_minutes=0) == {"shops": 0}
    assert versions(progress_key) == 2  # history loaded: a new version
    _, rows = published(progress_key)
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
    kind, report = published(artifact_key(table, "work"))
    assert kind == "markdown" and "nothing was left to do" in report
    assert "## Failed: retried later" in report and "LookupError: order" in report
    for text in [*lines, summary, json.dumps(rows), report]:
        assert dsn not in str(text)

    # the two failed globex slices, by the id of their failure cause
    cause_id = str(loaded.app.failures("shops")["cause_id"].iloc[0])
    assert requeue(queue="shops", cause_id=cause_id, app_path="prefect_app:app") == 2
    with pytest.raises(ConfigError, match="did you mean 'shops'"):
        requeue(queue="shop", app_path="prefect_app:app")


def test_the_plan_and_work_flows_run_through_a_transaction_pooler(
    prefect_server: str, dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A block whose DSN goes through PgBouncer in transaction mode, with $SYNCLANE_POOLER in
    the flows' environment: the same plan and work as on a direct connection (above)."""
    from pooler import pgbouncer

    with pgbouncer(dsn, server_connections=2) as pooled:
        monkeypatch.setenv("SYNCLANE_PREFECT_TEST_SCHEMA", schema)
        monkeypatch.setenv("SYNCLANE_DSN", pooled)
        monkeypatch.setenv("SYNCLANE_POOLER", "transaction")
        monkeypatch.delitem(sys.modules, "prefect_app", raising=False)
        SyncLaneDatabase(dsn=pooled, app_path="prefect_app:app").save("pooled", overwrite=True)
        try:
            assert plan(database="pooled", queue="shops") == {"shops": 12}
            assert sys.modules["prefect_app"].app.database.pooled
            assert plan(database="pooled", queue="shops") == {"shops": 0}
            state = work(database="pooled", queues=["shops"], budget_seconds=30,
                         until_idle=True, return_state=True)  # fmt: skip
            assert state.is_completed()
            assert state.result() == {"completed": 10, "failed": 2}
        finally:
            module = sys.modules.get("prefect_app")
            if module is not None:
                module.RELEASE.set()
                module.app.close()


def test_a_work_run_that_abandons_jobs_ends_failed_and_prefect_sees_why(
    block: str, prefect_server: str, loaded: ModuleType
) -> None:
    table = table_identity(loaded.app).slug
    plan(database=block, queue="alerts")
    state = work(database=block, queues=["alerts"], budget_seconds=30, until_idle=True,
                 idle_grace_seconds=0, return_state=True)  # fmt: skip
    assert state.is_failed()
    assert state.message is not None
    assert state.message.startswith(
        "1 new cause(s) of abandoned jobs, waiting for a human: stuck (queue alerts): Abandon: "
        "the account was closed (cause "
    )
    cause_id = str(loaded.app.failures("alerts", status="abandoned")["cause_id"].iloc[0])
    assert f"`synclane requeue --queue alerts --owner stuck --cause-id {cause_id}`" in state.message
    assert "`synclane cancel --queue alerts --owner stuck --reason 'account gone'`" in state.message
    _, report = published(artifact_key(table_identity(loaded.app), "work"))
    assert "## Abandoned" in report and "Abandon: the account was closed" in report

    wanted = {"abandoned": 3, "deferred": 3, "throttled": 1, "first_load_finished": 1}

    def arrived() -> list[dict[str, Any]] | None:
        found = server_events(prefect_server, table)
        kinds = [e["event"].removeprefix("synclane.job.") for e in found]
        return found if all(kinds.count(k) == n for k, n in wanted.items()) else None

    found = eventually(arrived, 30, f"the events {wanted} on the server")
    assert {e["event"] for e in found} == {f"synclane.job.{kind}" for kind in wanted}
    abandoned = [e for e in found if e["event"] == "synclane.job.abandoned"]
    assert sorted(e["resource"]["synclane.repeat"] for e in abandoned) == ["false", "true", "true"]
    first = next(e for e in abandoned if e["resource"]["synclane.repeat"] == "false")
    assert first == min(abandoned, key=lambda e: str(e["occurred"]))  # the first abandoned
    assert first["resource"]["synclane.owner"] == "stuck"
    assert first["resource"]["synclane.queue"] == "alerts"
    assert first["resource"]["synclane.cause_id"] == cause_id
    assert first["payload"]["error"] == "Abandon: the account was closed"
    assert first["payload"]["cause"] == "Abandon: the account was closed"
    roles = {r["prefect.resource.role"]: r["prefect.resource.id"] for r in first["related"]}
    assert roles["owner"] == f"synclane.owner.{table}.stuck"
    assert roles["queue"] == f"synclane.queue.{table}.alerts"
    assert roles["type"] == f"synclane.type.{table}.alerts.orders"
    assert roles["flow-run"] == f"prefect.flow-run.{state.state_details.flow_run_id}"
    deferred = next(e for e in found if e["event"] == "synclane.job.deferred")
    assert re.fullmatch(r"RuntimeError: order <n> not found", deferred["payload"]["cause"])
    finished = next(e for e in found if e["event"] == "synclane.job.first_load_finished")
    assert finished["resource"]["synclane.owner"] == "fine"

    # The account stays broken: its next job is abandoned for the same cause. That run does
    # not fail again, and its event says the cause already waited for a human.
    loaded.app.enqueue("alerts", "stuck", "orders")
    again = work(database=block, queues=["alerts"], budget_seconds=30, until_idle=True,
                 idle_grace_seconds=0, return_state=True)  # fmt: skip
    assert again.is_completed(), again.message
    assert again.result().get("abandoned") == 1


def test_an_attempt_that_will_be_retried_reaches_prefect_as_a_failed_event(
    block: str, prefect_server: str, loaded: ModuleType
) -> None:
    """globex's order history fails; each slice is retried in an hour: one
    `synclane.job.failed` per attempt, with its attempt, retry time and masked cause."""
    table = table_identity(loaded.app).slug
    plan(database=block, queue="shops")
    began = datetime.now(UTC)
    work(database=block, queues=["shops"], budget_seconds=30, until_idle=True)
    failures = loaded.app.failures("shops")
    (cause_id,) = failures["cause_id"]
    found = eventually(
        lambda: [e for e in server_events(prefect_server, table)
                 if e["event"] == "synclane.job.failed"] or None,
        30, "failed events on the server",
    )  # fmt: skip
    assert len(found) == 2 and {e["resource"]["synclane.owner"] for e in found} == {"globex"}
    for event in found:
        payload = event["payload"]
        assert payload["attempt"] == 1
        assert payload["cause"] == "LookupError: order <n> not found"
        assert payload["cause_id"] == event["resource"]["synclane.cause_id"] == cause_id
        assert re.fullmatch(r"LookupError: order \d+ not found", payload["error"])
        retry = datetime.fromisoformat(payload["until"])
        assert began + timedelta(minutes=50) < retry < began + timedelta(minutes=70)


def test_a_lost_lease_reaches_prefect_as_an_event(
    block: str, prefect_server: str, loaded: ModuleType
) -> None:
    """The job is cancelled while its page is in flight: the worker's next guarded write
    matches no row, so it stops the job and says so."""
    plan(database=block, queue="slow")

    def cancel_mid_page() -> None:
        if loaded.PAGE_IN_FLIGHT.wait(30):
            loaded.app.cancel("slow", "initech", "the account disconnected")
            loaded.RELEASE.set()

    threading.Thread(target=cancel_mid_page, daemon=True).start()
    report = work(database=block, queues=["slow"], budget_seconds=30, until_idle=True,
                  idle_grace_seconds=0)  # fmt: skip
    assert report == {"lost": 1}
    table = table_identity(loaded.app).slug
    found = eventually(
        lambda: [e for e in server_events(prefect_server, table)
                 if e["event"] == "synclane.job.lease_lost"],
        30, "a lease_lost event on the server",
    )  # fmt: skip
    assert found[0]["resource"]["synclane.owner"] == "initech"


class Webhook(BaseHTTPRequestHandler):
    received: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        Webhook.received.append(json.loads(self.rfile.read(length)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_the_automation_of_flows_alerts_py_notifies_once_per_owner_and_cause(
    block: str, prefect_server: str, loaded: ModuleType, tmp_path: Path
) -> None:
    """Three jobs of one broken account abandoned for one cause: one notification. Its next
    job, abandoned for the same cause: none. Requeued and abandoned again: one more."""
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    server = HTTPServer(("127.0.0.1", 0), Webhook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Webhook.received.clear()
    table = table_identity(loaded.app).slug

    def work_alerts() -> None:
        state = work(database=block, queues=["alerts"], budget_seconds=30, until_idle=True,
                     idle_grace_seconds=0, fail_on_abandoned=False, return_state=True)  # fmt: skip
        assert state.is_completed()  # jobs were abandoned, and the run was told not to fail

    def abandoned_events() -> list[dict[str, Any]]:
        found = server_events(prefect_server, table)
        return [e for e in found if e["event"] == "synclane.job.abandoned"]

    try:
        CustomWebhookNotificationBlock(
            name="synclane-test",
            url=f"http://127.0.0.1:{server.server_port}/hook",
            json_data={"subject": "{{subject}}", "body": "{{body}}"},
            allow_private_urls=True,  # the test's webhook listens on localhost
        ).save("synclane-alerts", overwrite=True)
        # the command docs/prefect.md shows
        done = subprocess.run(
            [sys.executable, str(ROOT / "flows" / "alerts.py"), "custom-webhook/synclane-alerts"],
            capture_output=True, text=True, env=prefect_env(prefect_server, tmp_path),
            timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("automation 'synclane: job abandoned' created: ")

        plan(database=block, queue="alerts")
        work_alerts()
        eventually(lambda: len(Webhook.received) >= 1, 60, "a notification")
        loaded.app.enqueue("alerts", "stuck", "orders")  # the account's next job
        work_alerts()
        events = eventually(
            lambda: (found := abandoned_events()) and len(found) == 4 and found,
            30, "the fourth abandoned event",
        )  # fmt: skip
        # The automation's trigger matches only "false": the fourth reaches no one. A notice
        # for it would come before the requeue's below, and fail the count of two at the end.
        repeats = sorted(e["resource"]["synclane.repeat"] for e in events)
        assert repeats == ["false", "true", "true", "true"]
        assert len(Webhook.received) == 1
        assert loaded.app.requeue("alerts", owner="stuck") == 4
        work_alerts()
        eventually(lambda: len(Webhook.received) >= 2, 60, "a notification after the requeue")
    finally:
        server.shutdown()
    time.sleep(5)
    assert len(Webhook.received) == 2
    subjects = {n["subject"] for n in Webhook.received}
    assert subjects == {"synclane: stuck waits for a human"}
    body = Webhook.received[0]["body"]
    assert "of queue alerts was abandoned" in body and f"table: {table}" in body
    assert "error: Abandon: the account was closed" in body
    cause_id = str(loaded.app.failures("alerts", status="abandoned")["cause_id"].iloc[0])
    assert f"synclane requeue --queue alerts --owner stuck --cause-id {cause_id}" in body
    assert "synclane cancel --queue alerts --owner stuck" in body


def test_the_automation_yaml_in_the_docs_is_the_one_flows_alerts_py_installs() -> None:
    from prefect.events.schemas.automations import AutomationCore

    text = (ROOT / "docs" / "prefect.md").read_text()
    (document,) = [
        yaml.safe_load(block)
        for block in re.findall(r"```yaml\n(.*?)```", text, re.S)
        if "(from YAML)" in block
    ]
    from_docs = AutomationCore.model_validate(document)
    installed = runpy.run_path(str(ROOT / "flows" / "alerts.py"))["abandoned_jobs"](uuid.uuid4())
    assert from_docs.trigger.model_dump(exclude={"id"}) == installed.trigger.model_dump(
        exclude={"id"}
    )
    assert [a.type for a in from_docs.actions] == ["send-notification"]


def test_a_backfill_whose_budget_ends_while_slices_load_ends_completed(
    block: str, loaded: ModuleType
) -> None:
    """The docs' example (`budget_seconds=20`) on a day like any other: the work runs are busy
    elsewhere, the budget ends, the run says how far history is and ends Completed."""
    plan(database=block, queue="shops")
    state = backfill(queue="shops", type="orders", horizon_days=120, database=block,
                     budget_seconds=1, poll_seconds=0.5, return_state=True)  # fmt: skip
    assert state.is_completed(), state.message
    assert state.message is not None
    assert state.message.startswith("the budget of 1 s ended: 0 of 12 slice(s) loaded")
    assert state.result()["open"] == 12


def test_flows_alerts_py_says_in_one_line_what_is_missing(
    block: str, prefect_server: str, tmp_path: Path
) -> None:
    alerts = str(ROOT / "flows" / "alerts.py")
    env = prefect_env(prefect_server, tmp_path)
    cases = [
        (env, "custom-webhook/no-such-block", "no block 'custom-webhook/no-such-block'"),
        (
            {**env, "PREFECT_API_URL": "http://127.0.0.1:1/api", "PREFECT_CLIENT_MAX_RETRIES": "0"},
            "custom-webhook/x",
            "cannot reach the Prefect API at http://127.0.0.1:1/api",
        ),
        (env, f"synclane-database/{BLOCK}", "not a notification block"),
    ]
    for environment, block_name, said in cases:
        done = subprocess.run(
            [sys.executable, alerts, block_name],
            capture_output=True, text=True, env=environment, timeout=180,
        )  # fmt: skip
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith("flows/alerts.py: ") and said in lines[0], lines[0]


def test_three_schemas_that_differ_only_by_case_or_punctuation_publish_apart(
    prefect_server: str, dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One database, three tables whose schemas Prefect's keys would all spell alike: each
    plan run publishes a progress table of its own, none a version of another's."""
    names = [f"{schema}_a", f"{schema.upper()}_A", f"{schema}-a"]
    apps = {f"table{number}": prefect_app.build(dsn, name) for number, name in enumerate(names)}
    module = ModuleType("three_tables")
    vars(module).update(apps)
    monkeypatch.setitem(sys.modules, "three_tables", module)
    try:
        tables = [table_identity(app) for app in apps.values()]
        for attribute in apps:
            assert plan(app_path=f"three_tables:{attribute}", queue="slow") == {"slow": 1}
        keys = {artifact_key(table, "progress", "slow") for table in tables}
        assert len(keys) == 3
        assert all(versions(key) == 1 for key in keys)
        event = Event(kind="abandoned", queue="slow", job_id=1, owner="initech", lane="initech",
                      type="catalog", mode="initial", worker="vm:1")  # fmt: skip
        ids = {prefect_event(event, table)["resource"]["prefect.resource.id"] for table in tables}
        assert len(ids) == 3
    finally:
        for app in apps.values():
            app.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            for name in names:
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name))
                )


def test_a_served_name_that_serves_another_table_is_refused(
    prefect_server: str, dsn: str, schema: str
) -> None:
    """One app path served for two tables on one Prefect server (staging and production): the
    deployments name the table they serve, serving the second table under the first one's
    name is refused, and under a name of its own it is served beside it."""
    from prefect.client.orchestration import get_client

    ours, theirs = prefect_app.build(dsn, schema), prefect_app.build(dsn, f"{schema}_b")
    try:
        mine, other = table_identity(ours), table_identity(theirs)
        name = f"app-{schema}"
        for deployment in deployments("prefect_app:app", name=name, table=mine):
            called(deployment.apply())
        with get_client(sync_client=True) as client:
            served = client.read_deployment_by_name(f"synclane-work/{name}")
        assert f"synclane-table:{mine.slug}" in served.tags
        assert served.description is not None and mine.label in served.description
        assert "password" not in served.description and dsn not in served.description
        check_served_names(deployments("prefect_app:app", name=name, table=mine))  # the same
        with pytest.raises(ConfigError) as refused:
            check_served_names(deployments("prefect_app:app", name=name, table=other))
        message = str(refused.value)
        assert f"deployment 'synclane-plan/{name}' serves the table {mine.slug}" in message
        assert "--name" in message and other.slug in message
        check_served_names(deployments("prefect_app:app", name=f"{name}-b", table=other))
    finally:
        ours.close()
        theirs.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(f"{schema}_b"))
            )


def test_a_run_of_a_deployment_that_serves_another_table_fails_at_its_start(
    prefect_server: str, loaded: ModuleType, schema: str
) -> None:
    """Two processes that serve one name for two tables anyway (older deployments, or two
    `serve` started at once): a run whose deployment names another table than its process's
    app fails at once, naming both, and changes nothing."""
    from prefect.client.orchestration import get_client
    from prefect.flow_engine import run_flow

    other = TableIdentity("elsewhere", "0badc0de", "synclane")
    name = f"mixed-{schema}"
    for deployment in deployments("prefect_app:app", name=name, table=other):
        called(deployment.apply())
    with get_client(sync_client=True) as client:
        found = client.read_deployment_by_name(f"synclane-requeue/{name}")
        flow_run = client.create_flow_run_from_deployment(found.id, parameters={"queue": "shops"})
    state = run_flow(
        requeue,
        flow_run=flow_run,
        parameters={"queue": "shops", "app_path": "prefect_app:app"},
        return_type="state",
    )
    assert isinstance(state, State) and state.is_failed()
    with pytest.raises(ConfigError) as raised:
        state.result()
    mine = table_identity(loaded.app).slug
    assert str(raised.value).startswith(
        "this run's deployment serves the table elsewhere-0badc0de-synclane, but the process "
        f"that runs it has the app of {mine}"
    )


def test_synclane_serve_takes_the_deployments_name(
    prefect_server: str, loaded: ModuleType, dsn: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    import prefect

    from synclane.cli import main

    served: dict[str, Any] = {}
    monkeypatch.setattr(prefect, "serve", lambda *d, **kw: served.update(deployments=d))
    previous = signal.getsignal(signal.SIGINT)
    try:
        assert main(["--dsn", dsn, "--app", "prefect_app:app", "serve", "--name", "staging"]) == 0
        assert main(["--dsn", dsn, "--app", "prefect_app:app", "serve", "--name", "a/b"]) == 2
    finally:
        signal.signal(signal.SIGINT, previous)
    table = table_identity(loaded.app)
    assert {d.name for d in served["deployments"]} == {"staging"}
    assert all(f"synclane-table:{table.slug}" in d.tags for d in served["deployments"])
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "a/b" in line]
    assert "--name" in line or "name=" in line


def test_plan_backfill_and_requeue_ride_out_a_database_restart(
    prefect_server: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """On a PostgreSQL of the test's own (the machine's is shared): a plan run started while
    the database is down, a backfill watching while it restarts, a requeue started while it
    is down; each waits for it as a worker does, says so once, and ends as on any day."""
    from servers import EmbeddedServer

    caplog.set_level("INFO", logger="synclane")
    with tempfile.TemporaryDirectory(prefix="synclane-orch-outage-") as directory:
        server = EmbeddedServer(Path(directory))
        app = prefect_app.build(server.dsn, "outage")
        module = ModuleType("outage_app")
        module.app = app  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "outage_app", module)
        path = "outage_app:app"

        def down_for(seconds: float) -> threading.Thread:
            server.stop()
            coming_back = threading.Timer(seconds, server.start)
            coming_back.start()
            return coming_back

        try:
            app.migrate()
            back = down_for(3)
            assert plan(app_path=path, queue="shops") == {"shops": 12}
            back.join()

            ended: dict[str, Any] = {}
            watching = threading.Thread(
                target=lambda: ended.update(
                    state=backfill(queue="shops", type="orders", horizon_days=120,
                                   owners=["acme-us", "acme-eu"], app_path=path,
                                   budget_seconds=120, poll_seconds=0.5, return_state=True)
                ),
            )  # fmt: skip
            watching.start()

            def acme_slices() -> int:
                rows = progress_rows(app, "shops", owners=["acme-us", "acme-eu"], type="orders")
                return sum(int(row["slices_total"]) for row in rows)

            # Lazy history: the widening is recorded now, its slices are planned as the open
            # ones finish.
            eventually(lambda: acme_slices() == 2 * 4, 60, "the widening")
            time.sleep(1)  # the watch's first looks
            down_for(3).join()
            loader = prefect_app.build(server.dsn, "outage")
            loader.run_worker(["shops"], stop_after=60, until_idle=True)
            loader.close()
            watching.join(120)
            state = ended["state"]
            assert state.is_completed(), state.message
            assert state.message == "8 of 8 slice(s) loaded (100.0 %)"

            back = down_for(3)
            assert requeue(queue="shops", owner="globex", app_path=path) == 2
            back.join()
        finally:
            app.close()
            server.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "synclane"]
    for what in ("a plan run", "the backfill of shops.orders", "a requeue run"):
        assert any(line.startswith(f"{what} cannot reach the database") for line in lines)
    assert "reached the database again" in lines
    assert not [r for r in caplog.records if r.levelname == "ERROR" or r.exc_info]


def test_synclane_serve_serves_the_table_its_schema_option_names(
    prefect_server: str, dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`synclane --schema S --app synclane.demo.app:app serve`: the demo's app takes its schema
    from $SYNCLANE_SCHEMA, set from --schema here and inherited by every served run."""
    import prefect

    from synclane.cli import main
    from synclane.prefect.identity import key_part

    served: dict[str, Any] = {}
    monkeypatch.setattr(prefect, "serve", lambda *d, **kw: served.update(deployments=d))
    monkeypatch.delitem(sys.modules, "synclane.demo.app", raising=False)
    monkeypatch.setenv("SYNCLANE_SCHEMA", "synclane")  # restored afterwards, as is the DSN
    monkeypatch.setenv("SYNCLANE_DSN", dsn)
    previous = signal.getsignal(signal.SIGINT)
    try:
        argv = ["--dsn", dsn, "--schema", schema, "--app", "synclane.demo.app:app", "serve"]
        assert main([*argv, "--name", f"demo-{schema}"]) == 0
    finally:
        signal.signal(signal.SIGINT, previous)
        # loading the demo's app made its shop's schema too; the schema fixture drops only S
        with psycopg.connect(dsn, autocommit=True) as conn:
            shop = sql.Identifier(data_schema_for(schema))
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(shop))
    assert os.environ["SYNCLANE_SCHEMA"] == schema
    tags = {tag for d in served["deployments"] for tag in d.tags if tag.startswith("synclane-")}
    (tag,) = tags
    assert tag.endswith(f"-{key_part(schema)}")


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
    _, report = published(artifact_key(table_identity(loaded.app), "work"))
    assert "it was interrupted (TerminationSignal) and handed its jobs back" in report
    assert "| 0 | 0 | 0 | 0 | 0 | 1 | 0 | 0 |" in report


def test_a_backfill_stops_waiting_for_abandoned_slices_and_ends_failed(
    block: str, dsn: str, schema: str, loaded: ModuleType
) -> None:
    plan(database=block, queue="alerts")
    asked = {"queue": "alerts", "type": "orders", "horizon_days": 120, "owners": ["fine", "stuck"]}
    result = backfill(**asked, database=block, budget_seconds=0)  # widen only
    assert result == {"added": 4, "slices": 8, "loaded": 0, "abandoned": 0, "cancelled": 0,
                      "open": 8, "percent": 0.0}  # fmt: skip
    table = table_identity(loaded.app)
    kind, percent = published(artifact_key(table, "backfill", "alerts", "orders"))
    assert kind == "progress" and float(percent) == 0.0

    worker = prefect_app.build(dsn, schema)  # loads the slices while the backfill watches
    loading = threading.Thread(
        target=worker.run_worker,
        args=(["alerts"],),
        kwargs={"stop_after": 60, "until_idle": True, "idle_grace": 0},
    )
    loading.start()
    try:
        state = backfill(**asked, database=block, budget_seconds=60, poll_seconds=0.5,
                         return_state=True)  # fmt: skip
    finally:
        loading.join(90)
        worker.close()
    assert state.is_failed()
    assert state.message is not None
    assert state.message.startswith("4 of 8 slice(s) loaded (50.0 %), 4 abandoned")
    _, rows = published(artifact_key(table, "backfill", "alerts", "orders", "owners"))
    assert sorted((r["owner"], r["slices_total"], r["slices_completed"]) for r in rows) == [
        ("fine", 4, 4),
        ("stuck", 4, 0),
    ]


def test_serve_checks_the_app_then_serves_without_pausing_on_shutdown(
    prefect_server: str, loaded: ModuleType, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import prefect

    served: dict[str, Any] = {}
    monkeypatch.setattr(prefect, "serve", lambda *d, **kw: served.update(deployments=d, **kw))
    monkeypatch.setenv("PREFECT_LOGGING_EXTRA_LOGGERS", "httpx")
    previous = signal.getsignal(signal.SIGINT)
    try:
        serve("prefect_app:app", dsn=dsn, work_budget_seconds=120)
        assert signal.getsignal(signal.SIGINT) is not previous  # Ctrl-C as SIGTERM
    finally:
        signal.signal(signal.SIGINT, previous)
    assert served["pause_on_shutdown"] is False
    assert len(served["deployments"]) == 4
    assert os.environ["SYNCLANE_DSN"] == dsn  # what the served runs inherit
    assert os.environ["PREFECT_LOGGING_EXTRA_LOGGERS"] == "httpx,synclane"
    with pytest.raises(ConfigError, match="cannot import"):
        serve("no_such_module_here:app")


def test_ctrl_c_on_serve_hands_the_running_work_runs_jobs_back(
    prefect_server: str, lane: SyncLane, dsn: str, schema: str, tmp_path: Path
) -> None:
    """`synclane serve` (here the same function in a process of its own) serves the test app; a
    planning run starts a work run, whose `slow` job waits in its second page; Ctrl-C on the
    serving process cancels the run, which hands the job back with its cursor."""
    from prefect.client.orchestration import get_client

    env = {
        **prefect_env(prefect_server, tmp_path),
        "SYNCLANE_DSN": dsn,
        "SYNCLANE_PREFECT_TEST_SCHEMA": schema,
        "PREFECT_RUNNER_POLL_FREQUENCY": "2",
    }
    log = tmp_path / "serve.log"
    serving = subprocess.Popen(
        [sys.executable, "-c",
         "from synclane.prefect import serve; serve('prefect_app:app', work_budget_seconds=60)"],
        cwd=ROOT / "tests", env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        eventually(lambda: b"being served" in log.read_bytes(), 120, "serve to start")
        with get_client(sync_client=True) as client:
            planning = client.read_deployment_by_name("synclane-plan/prefect_app")
            client.create_flow_run_from_deployment(planning.id)

        def in_second_page() -> bool:
            jobs = lane.jobs("slow")
            return len(jobs) == 1 and str(jobs.iloc[0]["cursor"]) == "page-2"

        eventually(in_second_page, 120, "the work run to reach the slow job's second page")
        serving.send_signal(signal.SIGINT)
        assert serving.wait(60) == 0
    finally:
        serving.kill()
    job = lane.jobs("slow").iloc[0]
    assert (job["status"], job["cursor"], job["attempt_count"]) == ("pending", "page-2", 0)
    (run,) = [r for r in flow_runs("synclane-work/prefect_app") if r.state.is_final()]
    assert run.state.is_cancelled()
