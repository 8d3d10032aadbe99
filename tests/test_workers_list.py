"""The workers list (<schema>.workers, app.workers(), `synclane workers`): a worker registers and
beats; one that stops cleanly disappears, one that died is shown lost at once and forgotten an
hour later by any live worker; a running job's leased_by names exactly one live worker."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pandas as pd
import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row
from roles import dsn_as
from worker_proc import build, create_runs
from workers import job_row, operations_sql, running_worker, wait_for, worker_processes

import synclane
from synclane import Job, Page, SyncLane, cli
from synclane.worker import presence

pytestmark = pytest.mark.processes


@pytest.fixture
def quick_beat(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers of this process beat ten times a second instead of every five seconds."""
    monkeypatch.setattr(presence, "BEAT", 0.1)


def _rows(db: psycopg.Connection[Any], schema: str) -> list[dict[str, Any]]:
    with db.cursor(row_factory=dict_row) as cur:
        cur.execute(
            sql.SQL("SELECT * FROM {} ORDER BY name").format(sql.Identifier(schema, "workers"))
        )
        return cur.fetchall()


def _listed(app: SyncLane, count: int = 1, state: str = "running") -> pd.DataFrame:
    """The workers list once it holds `count` workers, all in `state`."""
    found: list[pd.DataFrame] = []

    def listed() -> bool:
        found[:] = [app.workers()]
        return found[0]["state"].tolist() == [state] * count

    wait_for(listed, timeout=15, what=f"{count} worker(s) {state} in the list")
    return found[0]


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """Pages of `_waiting_app` wait for this to be set (set at the end in any case)."""
    event = threading.Event()
    yield event
    event.set()


def _waiting_app(dsn: str, schema: str, gate: threading.Event, **settings: Any) -> SyncLane:
    app = SyncLane(dsn, schema=schema, poll_interval=0.05, plan_interval=3600, **settings)
    queue = app.queue("q", concurrency=3)

    @queue.snapshot("sync", every=timedelta(days=1))
    def sync(job: Job) -> Page:
        gate.wait(30)
        return Page(None, 1)

    return app


def test_a_running_worker_is_listed_with_what_it_works(
    dsn: str, schema: str, gate: threading.Event
) -> None:
    app = _waiting_app(dsn, schema, gate)
    try:
        with running_worker(app):
            frame = _listed(app)
        row = frame.iloc[0]
        assert row["name"] == app.worker_name == f"{socket.gethostname()}:{os.getpid()}"
        assert (row["host"], row["pid"], row["version"]) == (
            socket.gethostname(),
            os.getpid(),
            synclane.__version__,
        )
        assert list(row["queues"]) == ["q"] and row["slots"] == 3 and row["busy"] == 0
        assert row["state"] == "running"
        assert row["started_at"] <= row["last_seen_at"]
        assert str(frame["last_seen_at"].dtype) == "datetime64[us, UTC]"
        assert list(frame["state"].cat.categories) == ["running", "stopping", "lost"]
        assert str(frame["slots"].dtype) == "Int64" and str(frame["name"].dtype) == "string"
    finally:
        app.close()


def test_a_worker_that_stops_cleanly_disappears(
    dsn: str, schema: str, db: psycopg.Connection[Any], gate: threading.Event
) -> None:
    app = _waiting_app(dsn, schema, gate)
    try:
        with running_worker(app):
            _listed(app)
        assert _rows(db, schema) == [] and app.workers().empty
    finally:
        app.close()


def test_busy_counts_the_slots_that_run_a_job(
    dsn: str, schema: str, gate: threading.Event, quick_beat: None
) -> None:
    app = _waiting_app(dsn, schema, gate)
    try:
        app.enqueue("q", "acme", "sync")
        app.enqueue("q", "globex", "sync")
        with running_worker(app):
            wait_for(
                lambda: list(app.workers()["busy"]) == [2],
                timeout=15,
                what="two busy slots of three",
            )
            gate.set()
            wait_for(lambda: list(app.workers()["busy"]) == [0], timeout=15, what="idle again")
    finally:
        app.close()


def test_a_worker_killed_with_minus_9_is_shown_lost_and_its_job_names_it(
    dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    settings = {"dsn": dsn, "schema": schema, "pages": 100, "page_sleep": 0.2, "lease": 60}
    app = build(settings)
    create_runs(db, schema)
    job_id = app.enqueue("q", "acme", "sync")
    try:
        with worker_processes(settings, 1) as (process,):
            name = f"worker-{process.pid}"
            wait_for(
                lambda: job_row(db, schema, job_id)["leased_by"] == name,
                timeout=30,
                what="the job running in the worker process",
            )
            frame = _listed(app)
            assert (frame["name"].tolist(), frame["state"].tolist()) == ([name], ["running"])
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=10)
            # Its session to PostgreSQL closed with it: lost now, not when its beat is overdue.
            lost = _listed(app, 1, "lost")
        assert lost["pid"].tolist() == [process.pid]
        # The job it ran still names it until its lease expires and another worker reclaims it.
        row = job_row(db, schema, job_id)
        assert row["status"] == "running" and row["leased_by"] == name
        assert lost.set_index("name").loc[row["leased_by"], "state"] == "lost"
        # The same in SQL, as docs/operations.md watches it.
        with db.cursor(row_factory=dict_row) as cur:
            cur.execute(operations_sql("watch_workers", schema))  # type: ignore[arg-type]
            (watched,) = cur.fetchall()
        assert (watched["name"], watched["lost"], watched["running_jobs"]) == (name, True, 1)
    finally:
        app.close()


def test_a_lost_worker_is_forgotten_an_hour_later_by_any_live_worker(
    app: SyncLane, db: psycopg.Connection[Any], schema: str, quick_beat: None
) -> None:
    app.queue("q").snapshot("sync", every=timedelta(days=1))(lambda job: Page(None, 0))
    arrange = sql.SQL(
        "INSERT INTO {} (name, instance, host, pid, version, queues, slots, expires_at) "
        "VALUES (%s, gen_random_uuid(), 'gone-host', 1, '0.1', '{{q}}', 1, now() - %s)"
    ).format(sql.Identifier(schema, "workers"))
    db.execute(arrange, ("died-long-ago", timedelta(hours=2)))
    db.execute(arrange, ("died-a-minute-ago", timedelta(minutes=1)))
    with running_worker(app):
        wait_for(
            lambda: "died-long-ago" not in [row["name"] for row in _rows(db, schema)],
            timeout=15,
            what="the row lost for two hours to be deleted",
        )
        frame = app.workers().set_index("name")
    assert frame.loc["died-a-minute-ago", "state"] == "lost"
    assert frame.loc[app.worker_name, "state"] == "running"


def test_two_live_workers_never_share_a_name(
    dsn: str, schema: str, gate: threading.Event, caplog: pytest.LogCaptureFixture
) -> None:
    first = _waiting_app(dsn, schema, gate, worker_name="etl")
    second = _waiting_app(dsn, schema, gate, worker_name="etl")
    for owner in ("acme", "globex", "initech", "umbrella"):
        first.enqueue("q", owner, "sync")
    try:
        with running_worker(first) as one, running_worker(second) as two:
            frame = _listed(first, 2)
            names = sorted(frame["name"])
            assert names == ["etl", "etl#2"] and sorted([one.name, two.name]) == names
            wait_for(lambda: len(first.jobs(status="running")) == 4, timeout=15, what="4 running")
            held = set(first.jobs(status="running")["leased_by"])
            assert held == {"etl", "etl#2"}, "each running job names the one worker that runs it"
            gate.set()
        assert "worker name 'etl' is held by a live worker" in caplog.text
        assert "this worker runs as 'etl#2'" in caplog.text
    finally:
        first.close()
        second.close()


def test_a_renamed_worker_says_its_new_name_as_soon_as_it_is_listed_under_it(
    dsn: str, schema: str, gate: threading.Event
) -> None:
    """`Worker.name` is the name of its registration, not a copy made once the start-up is over:
    the moment the second 'etl' is listed as 'etl#2' (here: when it warns about the name, which
    comes after that registration has committed), its `name` says so. (CI read 'etl' from it
    while the list already showed 'etl#2'.)"""
    first = _waiting_app(dsn, schema, gate, worker_name="etl")
    second = _waiting_app(dsn, schema, gate, worker_name="etl")
    one, two = first.worker(), second.worker()
    seen: list[str] = []

    class AtTheWarning(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "is held by a live worker" in record.getMessage():
                seen.append(two.name)

    handler = AtTheWarning()
    logging.getLogger("synclane").addHandler(handler)
    threads = [threading.Thread(target=worker.run, daemon=True) for worker in (one, two)]
    try:
        threads[0].start()
        _listed(first, 1)
        threads[1].start()
        wait_for(lambda: seen, timeout=15, what="the second worker to warn about its name")
        assert seen == ["etl#2"]
    finally:
        logging.getLogger("synclane").removeHandler(handler)
        gate.set()
        for worker, thread in zip((one, two), threads, strict=True):
            worker.stop()
            if thread.ident is not None:  # started
                thread.join(timeout=30)
        first.close()
        second.close()


def test_the_name_of_a_worker_that_died_is_taken_over_at_once(
    dsn: str, schema: str, db: psycopg.Connection[Any], gate: threading.Event
) -> None:
    """A worker restarted under the same name right after a crash (a container restart): its
    predecessor's row still looks fresh, but its session is gone, so the name is free."""
    app = _waiting_app(dsn, schema, gate, worker_name="etl")
    with psycopg.connect(dsn) as gone:
        dead_session = gone.info.backend_pid
    # a closed session's server process ends a moment later (longer on a loaded machine)
    wait_for(
        lambda: db.execute(
            "SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = %s)", [dead_session]
        ).fetchone()[0],  # type: ignore[index]
        timeout=10,
        what="the closed session's server process to end",
    )
    db.execute(
        sql.SQL(
            "INSERT INTO {} (name, instance, host, pid, version, queues, slots, session_pid, "
            "started_at, expires_at) VALUES ('etl', gen_random_uuid(), 'h', 1, '0.1', '{{q}}', "
            "1, %s, now() - interval '1 day', now() + interval '1 hour')"
        ).format(sql.Identifier(schema, "workers")),
        (dead_session,),
    )
    assert app.workers()["state"].tolist() == ["lost"]
    try:
        with running_worker(app) as worker:
            frame = _listed(app)
            assert worker.name == "etl" and frame["name"].tolist() == ["etl"]
            assert frame["pid"].tolist() == [os.getpid()]
            assert (pd.Timestamp.now("UTC") - frame["started_at"].iloc[0]) < pd.Timedelta("1min")
    finally:
        app.close()


def test_a_worker_without_the_table_runs_its_jobs_and_says_why_it_is_not_listed(
    app: SyncLane, db: psycopg.Connection[Any], schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    app.queue("q").snapshot("sync", every=timedelta(days=1))(lambda job: Page(None, 1))
    db.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(schema, "workers")))
    job_id = app.enqueue("q", "acme", "sync")
    with caplog.at_level(logging.WARNING, logger="synclane"), running_worker(app):
        wait_for(
            lambda: job_row(db, schema, job_id)["status"] == "completed",
            timeout=15,
            what="the job to complete",
        )
    assert "is not shown in the workers list" in caplog.text
    assert "app.migrate()" in caplog.text


def _name_in_child(app: SyncLane, answers: Any) -> None:
    answers.put((os.getpid(), app.worker_name))


def test_processes_forked_from_one_app_do_not_share_the_default_name(dsn: str, schema: str) -> None:
    app = SyncLane(dsn, schema=schema)
    try:
        context = multiprocessing.get_context("fork")
        answers = context.Queue()
        children = [context.Process(target=_name_in_child, args=(app, answers)) for _ in range(2)]
        for child in children:
            child.start()
        found = [answers.get(timeout=30) for _ in children]
        for child in children:
            child.join(timeout=30)
        host = socket.gethostname()
        assert sorted(name for _, name in found) == sorted(f"{host}:{pid}" for pid, _ in found)
        assert app.worker_name == f"{host}:{os.getpid()}"
    finally:
        app.close()


def test_the_workers_command_lists_them_with_or_without_an_app(
    dsn: str,
    schema: str,
    gate: threading.Event,
    capsys: pytest.CaptureFixture[str],
) -> None:
    app = _waiting_app(dsn, schema, gate)
    try:
        assert cli.main(["--dsn", dsn, "--schema", schema, "workers"]) == 0
        assert "no worker: none runs" in capsys.readouterr().out
        with running_worker(app):
            _listed(app)
            assert cli.main(["--dsn", dsn, "--schema", schema, "workers"]) == 0
            out = capsys.readouterr().out
            assert app.worker_name in out and "running" in out
            assert out.strip().splitlines()[-1] == "1 running; 0 of 3 slots busy"
            assert cli.main(["--dsn", dsn, "--schema", schema, "workers", "--queue", "other"]) == 0
            assert "no worker" in capsys.readouterr().out
    finally:
        app.close()


def test_the_documented_roles_keep_and_read_the_list(
    dsn: str,
    schema: str,
    roles: dict[str, str],
    gate: threading.Event,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With the grants of docs/operations.md the worker role registers, beats and leaves, and
    the analyst role reads the list."""
    worker = _waiting_app(dsn_as(dsn, roles["worker"]), schema, gate)
    analyst = SyncLane(dsn_as(dsn, roles["analyst"]), schema=schema)
    try:
        with caplog.at_level(logging.WARNING, logger="synclane"), running_worker(worker):
            assert _listed(analyst)["name"].tolist() == [worker.worker_name]
        assert analyst.workers().empty
        assert "not shown in the workers list" not in caplog.text
    finally:
        worker.close()
        analyst.close()
