"""Prometheus metrics: `synclane work --metrics-port` serves them over HTTP from a real worker
process, and every value matches the table; the table is read at most every few seconds; only
a worker that asks for metrics imports prometheus_client."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql
from workers import wait_for

from synclane import Page, SyncLane, cli
from synclane.metrics import Metrics

pytestmark = pytest.mark.processes

HERE = Path(__file__).parent
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("text/plain")
        text = answer.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    found = [
        value for (sample, tags), value in samples.items() if sample == name and wanted <= tags
    ]
    assert found, f"no sample {name} {labels}"
    return sum(found)


def _one(db: psycopg.Connection[Any], query: str, schema: str) -> Any:
    statement = sql.SQL(query).format(
        jobs=sql.Identifier(schema, "jobs"), workers=sql.Identifier(schema, "workers")
    )
    row = db.execute(statement).fetchone()
    assert row is not None
    return row[0]


def _shops(dsn: str, schema: str) -> SyncLane:
    """The queue and type of tests/fleet_app.py, to enqueue from the test."""
    app = SyncLane(dsn, schema=schema)
    app.queue("shops").snapshot("orders", every=timedelta(days=1))(lambda job: Page(None, 0))
    return app


@pytest.fixture
def fleet_env(dsn: str, schema: str) -> dict[str, str]:
    return {
        **os.environ,
        "SYNCLANE_FLEET_SCHEMA": schema,
        "SYNCLANE_DSN": dsn,
        "PYTHONPATH": str(HERE),
        "PYTHONUNBUFFERED": "1",
    }


@pytest.fixture
def metrics_worker(fleet_env: dict[str, str]) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`synclane --app fleet_app:app work --metrics-port 0` in a process of its own; yields the
    process and the URL it printed."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "synclane.cli",
            "--app",
            "fleet_app:app",
            "work",
            *("--metrics-port", "0"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=fleet_env,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("metrics on http://127.0.0.1:"), line + process.stderr.read()
        yield process, line.split()[-1]
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


def test_metrics_scraped_over_http_from_a_worker_process_match_the_table(
    dsn: str,
    schema: str,
    db: psycopg.Connection[Any],
    metrics_worker: tuple[subprocess.Popen[str], str],
) -> None:
    process, url = metrics_worker
    app = _shops(dsn, schema)
    try:
        # One paused queue, as app.pause would leave it.
        db.execute(
            sql.SQL("INSERT INTO {} VALUES ('other', now(), 'ops', 'warehouse down')").format(
                sql.Identifier(schema, "queue_pauses")
            )
        )
        for owner in ("fine-1", "fine-2", "fine-3", "broken-1", "slow-1", "gone-1"):
            app.enqueue("shops", owner, "orders")
        wait_for(
            lambda: (
                _one(db, "SELECT count(*) FROM {jobs} WHERE status <> 'running'", schema) == 6
                and _one(db, "SELECT count(*) FROM {jobs} WHERE status = 'completed'", schema) == 3
            ),
            timeout=60,
            what="every job to finish its attempt",
        )
        # Joins the lane the throttle paused: pending, not due.
        app.enqueue("shops", "fine-late", "orders", lane="slow-1")
        wait_for(
            lambda: _one(db, "SELECT sum(busy) FROM {workers}", schema) == 0,
            timeout=20,
            what="the worker's beat to say it is idle",
        )

        # A beat may write "idle" while the worker still reads the answer of the statement that
        # finished its last job (the beat counted before it was taken): the counters catch up
        # with the table as soon as it has, and only then are compared in full. Every outcome is
        # waited for: the abandoned job's counter once lagged behind the completed ones.
        def caught_up() -> Samples | None:
            scraped = _scrape(url)
            try:
                shown = [
                    _value(
                        scraped,
                        "synclane_jobs_finished_total",
                        queue="shops",
                        type="orders",
                        outcome=outcome,
                    )
                    for outcome in ("completed", "failed", "abandoned")
                ]
            except AssertionError:  # an outcome not counted yet has no sample
                return None
            return scraped if shown == [3, 1, 1] else None

        samples = wait_for(caught_up, timeout=20, what="the worker's counters to reach the table")

        # Counters and histograms: the worker's own events, against what the table recorded.
        records = _one(db, "SELECT sum(processed_count) FROM {jobs}", schema)
        finished = "synclane_jobs_finished_total"
        for outcome, query, expected in (
            ("completed", "SELECT count(*) FROM {jobs} WHERE status = 'completed'", 3),
            ("failed", "SELECT count(*) FROM {jobs} WHERE error LIKE 'RuntimeError%'", 1),
            ("abandoned", "SELECT count(*) FROM {jobs} WHERE status = 'abandoned'", 1),
        ):
            shown = _value(samples, finished, queue="shops", type="orders", outcome=outcome)
            assert shown == _one(db, query, schema) == expected, outcome
        throttles = _one(db, "SELECT sum(throttle_count) FROM {jobs}", schema)
        assert _value(samples, "synclane_throttles_total", queue="shops") == throttles == 1
        assert _value(samples, "synclane_records_total", type="orders") == records == 45
        assert _value(samples, "synclane_pages_total") == records / 5 == 9
        assert _value(samples, "synclane_page_seconds_count") == 9
        assert _value(samples, "synclane_job_seconds_count") == 3
        assert _value(samples, "synclane_take_seconds_count", statement="front") >= 1

        # Gauges: the table itself.
        by_status = dict(
            db.execute(
                sql.SQL("SELECT status, count(*) FROM {} GROUP BY status").format(
                    sql.Identifier(schema, "jobs")
                )
            ).fetchall()
        )
        for status in ("pending", "running", "failed", "deferred", "abandoned"):
            shown = _value(samples, "synclane_open_jobs", queue="shops", status=status)
            assert shown == by_status.get(status, 0), status
        assert (by_status["pending"], by_status["failed"], by_status["abandoned"]) == (1, 2, 1)
        assert _value(samples, "synclane_due_jobs", queue="shops") == 0
        assert _value(samples, "synclane_oldest_due_seconds", queue="shops") == 0
        assert _value(samples, "synclane_paused_lanes", queue="shops") == 1
        left = _value(samples, "synclane_lane_paused_seconds", queue="shops", lane="slow-1")
        assert 3000 < left <= 3600
        assert _value(samples, "synclane_queue_paused", queue="shops") == 0
        assert _value(samples, "synclane_queue_paused", queue="other") == 1
        assert _value(samples, "synclane_workers", state="running") == 1
        assert _value(samples, "synclane_workers", state="lost") == 0
        assert (
            _value(samples, "synclane_slots")
            == _one(db, "SELECT sum(slots) FROM {workers}", schema)
            == 2
        )
        assert _value(samples, "synclane_busy_slots") == 0
        seen = _one(db, "SELECT extract(epoch FROM last_seen_at) FROM {workers}", schema)
        assert abs(_value(samples, "synclane_worker_last_seen_timestamp_seconds") - float(seen)) < 6
        assert _value(samples, "synclane_table_up") == 1

        # Read at most every few seconds: a scrape right after shows the table as it was read.
        app.enqueue("shops", "fine-later", "orders", lane="slow-1")
        again = _scrape(url)
        assert _value(again, "synclane_open_jobs", queue="shops", status="pending") == 1

        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 130, "Ctrl-C: interrupted, after the jobs went back"
        assert _one(db, "SELECT count(*) FROM {workers}", schema) == 0
    finally:
        app.close()


def test_the_table_gauges_alone_for_a_page_that_serves_metrics(app: SyncLane) -> None:
    """What the dashboard mounts: no worker, the table's gauges, Prometheus text."""
    app.queue("shops").snapshot("orders", every=timedelta(days=1))(lambda job: Page(None, 0))
    app.enqueue("shops", "acme", "orders")
    metrics = Metrics(app.database, ["shops", "quiet"])
    try:
        body, content_type = metrics.exposition()
    finally:
        metrics.close()
    assert content_type.startswith("text/plain")
    samples = {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }
    assert _value(samples, "synclane_open_jobs", queue="shops", status="pending") == 1
    assert _value(samples, "synclane_due_jobs", queue="shops") == 1
    assert _value(samples, "synclane_open_jobs", queue="quiet") == 0  # declared, still empty
    assert _value(samples, "synclane_queue_paused", queue="shops") == 0  # no pause table
    assert _value(samples, "synclane_workers") == 0
    assert _value(samples, "synclane_worker_last_seen_timestamp_seconds") == 0


def test_metrics_say_when_they_cannot_read_the_table_instead_of_showing_old_values(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    app.queue("shops").snapshot("orders", every=timedelta(days=1))(lambda job: Page(None, 0))
    metrics = Metrics(app.database, ["shops"], refresh=0)
    try:
        assert "synclane_table_up 1.0" in metrics.exposition()[0].decode()
        db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (f"synclane-metrics {schema}",),
        )
        text = metrics.exposition()[0].decode()
        assert "synclane_table_up 0.0" in text and "synclane_open_jobs" not in text
        text = metrics.exposition()[0].decode()  # a new connection
        assert "synclane_table_up 1.0" in text and "synclane_open_jobs" in text
    finally:
        metrics.close()


def test_a_worker_imports_prometheus_client_only_when_it_serves_metrics(
    dsn: str, schema: str
) -> None:
    code = f"""
import sys
from datetime import timedelta
from synclane import Page, SyncLane
app = SyncLane({dsn!r}, schema={schema!r}, poll_interval=0.05)
app.queue("q").snapshot("t", every=timedelta(days=1))(lambda job: Page(None, 1))
app.enqueue("q", "acme", "t")
assert app.run_worker(until_idle=True, idle_grace=0, stop_after=30) == {{"completed": 1}}
assert "prometheus_client" not in sys.modules, "a worker without metrics loaded it"
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_metrics_port_in_use_is_one_line_naming_the_option(
    dsn: str,
    schema: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("SYNCLANE_FLEET_SCHEMA", schema)
    monkeypatch.syspath_prepend(str(HERE))
    sys.modules.pop("fleet_app", None)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = cli.main(
            ["--dsn", dsn, "--app", "fleet_app:app", "work", "--metrics-port", str(port)]
        )
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(
        f"synclane: error: argument --metrics-port: cannot listen on 127.0.0.1:{port}"
    )
    assert cli.main(["--dsn", dsn, "--app", "fleet_app:app", "work", "--metrics-host", "::"]) == 2
    assert "--metrics-host: only means something with --metrics-port" in capsys.readouterr().err
    assert cli.main(["work", "--metrics-port", "70000"]) == 2
    assert "argument --metrics-port: '70000' is not a whole number" in capsys.readouterr().err
    sys.modules.pop("fleet_app", None)
