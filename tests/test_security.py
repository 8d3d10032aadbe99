"""Security (issue 8): a DSN's password never shows (logs, errors, reprs, the command line,
Prefect's reports, the dashboard), and the roles of docs/operations.md give each kind of user
the least it needs.

The dashboard's own model (loopback, proxies, Host, the requeue token, escaping) is pinned by
tests/test_dashboard.py; here only what a password in the DSN adds to it.
"""

from __future__ import annotations

import logging
import traceback
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from apps import products_queue
from command_line import Run
from dashboard_kit import call, start, stop
from psycopg import errors, sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from roles import dsn_as
from workers import job_row

from synclane import (
    ConfigError,
    DatabaseUnavailable,
    Job,
    Owner,
    Page,
    SchemaError,
    SyncLane,
    Throttled,
)
from synclane.testing import make_app

HERE = Path(__file__).parent
DAY = timedelta(days=1)
SECRET = f"s3cret-{uuid.uuid4().hex[:8]}"  # trust authentication accepts any password


def with_password(dsn: str, form: str, password: str = SECRET) -> str:
    """The test database's DSN with a password, written the way a user might write it."""
    params = {k: v for k, v in conninfo_to_dict(dsn).items() if k != "password"}
    if form == "url":
        user, db = params.pop("user", "postgres"), params.pop("dbname", "postgres")
        query = "&".join(f"{k}={quote(str(v), safe='/')}" for k, v in params.items())
        return f"postgresql://{user}:{quote(password, safe='')}@/{db}?{query}"
    if form == "url query":
        return f"{with_password(dsn, 'url', 'x').replace(':x@', '@')}&password={password}"
    if form == "key=value":
        return make_conninfo("", **params, password=password)
    # spaces around '=' and a quoted value with a space: what libpq also reads
    return make_conninfo("", **params) + f" password = '{password} with a space'"


FORMS = ["url", "url query", "key=value", "spaced"]


def leaked(text: str) -> bool:
    return SECRET in text


@pytest.fixture(params=FORMS)
def secret_dsn(request: pytest.FixtureRequest, dsn: str) -> str:
    return with_password(dsn, request.param)


@pytest.fixture
def secret_app(secret_dsn: str, schema: str) -> Iterator[SyncLane]:
    app = make_app(secret_dsn, schema)
    yield app
    app.close()


def test_the_password_dsns_connect(secret_app: SyncLane) -> None:
    """The forms above are real DSNs: each reaches the database (so the tests below see every
    path that a connected app takes)."""
    with secret_app.connection() as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert SECRET in secret_app.dsn


def test_no_log_line_repr_or_report_shows_the_password(
    secret_app: SyncLane,
    db: psycopg.Connection[Any],
    schema: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A run that plans, works, fails, throttles, abandons, loses a lease to a reclaim and stops,
    with every logger (synclane's, psycopg's pool, the root) captured at DEBUG."""
    app = secret_app
    caplog.set_level(logging.DEBUG)
    queue = app.queue("shops", concurrency=3, lease_duration=1, retry_base_delay=3600)
    queue.owners(lambda name: [Owner("acme-us", lane="acme"), Owner("globex"), Owner("initech")])

    @queue.snapshot("products", every=DAY)
    def products(job: Job) -> Page:
        if job.owner == "globex":
            raise Throttled(retry_after=3600)
        if job.owner == "initech":
            raise RuntimeError("order 7 not found")
        return Page(None, 1)

    app.plan()
    # A job whose worker died: the reclaimer takes its expired lease back.
    dead = app.enqueue("shops", "acme-eu", "products", lane="acme-eu")
    db.execute(
        sql.SQL(
            "UPDATE {} SET status = 'running', leased_by = 'dead', lease_token = gen_random_uuid(),"
            " lease_expires_at = now() - interval '1 minute' WHERE id = %s"
        ).format(sql.Identifier(schema, "jobs")),
        [dead],
    )
    report = app.run_worker(until_idle=True, stop_after=20)
    assert report["completed"] >= 1 and report["throttled"] == 1 and report["failed"] == 1
    assert job_row(db, schema, dead)["status"] == "completed"

    texts = [repr(app), str(app), repr(queue), repr(app.queues), str(report)]
    # What the Prefect flows publish as artifacts (importing them imports Prefect).
    pytest.importorskip("prefect")
    from synclane.prefect.operations import plan_summary, progress_rows

    texts += [plan_summary({"shops": 3}, {"shops": progress_rows(app, "shops")})]
    texts += [str(progress_rows(app, "shops")), app.jobs().to_string(), app.failures().to_string()]
    for record in caplog.records:
        texts.append(record.getMessage())
        if record.exc_info:
            texts.append("".join(traceback.format_exception(*record.exc_info)))
    assert len(caplog.records) > 10
    assert not [text for text in texts if leaked(text)]


def _all_text(error: BaseException) -> str:
    """What an error can show: str, repr, and the whole printed traceback with its causes."""
    return "\n".join(
        [str(error), repr(error), "".join(traceback.format_exception(error)), str(error.args)]
    )


@pytest.mark.parametrize("form", FORMS)
def test_errors_never_show_the_password(dsn: str, schema: str, form: str) -> None:
    # An unreachable server (port 1), in every form of DSN.
    unreachable = with_password(dsn, form).replace(
        f"port={conninfo_to_dict(dsn).get('port', 5432)}", "port=1"
    )
    if "port=1" not in unreachable:
        unreachable += " port=1" if "://" not in unreachable else "&port=1"
    with pytest.raises(DatabaseUnavailable) as raised:
        SyncLane(unreachable, schema=schema)
    assert "***" in str(raised.value)
    assert not leaked(_all_text(raised.value))


@pytest.mark.parametrize(
    "broken",
    [
        f"postgresql://someone:{SECRET}@[::1/db",
        f"host=h password={SECRET} port",
        f"host=h password='{SECRET}",
        f"postgresql://someone:{SECRET}@h:notaport/db",
    ],
    # ids without the secret, which differs in every process (pytest-xdist's workers must
    # collect the same names)
    ids=["url-bracket", "key-without-value", "open-quote", "bad-port"],
)
def test_a_broken_dsn_is_refused_without_quoting_it(broken: str) -> None:
    """libpq's own parse errors quote the string they choke on; synclane's do not."""
    with pytest.raises((ConfigError, DatabaseUnavailable)) as raised:
        SyncLane(broken, schema="never_created")
    assert not leaked(_all_text(raised.value))


def test_schema_and_worker_errors_never_show_the_password(
    secret_app: SyncLane, db: psycopg.Connection[Any], schema: str, secret_dsn: str
) -> None:
    db.execute(
        sql.SQL("INSERT INTO {} (version) VALUES (99)").format(
            sql.Identifier(schema, "schema_version")
        )
    )
    for attempt in (
        lambda: SyncLane(secret_dsn, schema=schema),
        lambda: SyncLane(secret_dsn, schema=schema, create_schema=False).run_worker(stop_after=1),
        lambda: secret_app.get_queue("nope"),
    ):
        with pytest.raises((SchemaError, ConfigError)) as raised:
            attempt()
        assert not leaked(_all_text(raised.value))


@pytest.mark.parametrize("form", FORMS)
def test_the_command_line_never_shows_the_password(dsn: str, run: Run, form: str) -> None:
    secret_dsn = with_password(dsn, form)
    outputs = []
    for words in (
        ["migrate"],
        ["plan", "--work", "--idle-grace", "0"],
        ["jobs", "--limit", "50"],
        ["progress"],
        ["failures"],
        ["requeue", "--queue", "shops", "--owner", "globex"],
        ["cancel", "--queue", "shops", "--owner", "globex", "--reason", "gone"],
        ["jobs", "--queue", "nope"],  # a user mistake: one line, exit 2
    ):
        code, out, err = run(*words, dsn=secret_dsn)
        output = out + err
        outputs.append(output)
        # a mistake exits 2; work left failed for a retry exits 3 (docs: the command line)
        assert code == (2 if "nope" in words else 3 if "--work" in words else 0), output
    assert "globex" in "".join(outputs)
    assert not [output for output in outputs if leaked(output)]


@pytest.mark.parametrize("form", ["url", "spaced"])
def test_the_dashboard_hides_a_password_quoted_alone(
    dsn: str, schema: str, db: psycopg.Connection[Any], form: str
) -> None:
    """An error text that quotes the password without the rest of the DSN (a driver message,
    a config dump) is shown with *** in its place; the state carries the DSN nowhere."""
    secret_dsn = with_password(dsn, form)
    password = conninfo_to_dict(secret_dsn)["password"]
    app = SyncLane(secret_dsn, schema=schema)
    products_queue(app)
    job_id = app.enqueue("shops", "acme", "products")
    db.execute(
        sql.SQL("UPDATE {} SET status = 'failed', error = %s WHERE id = %s").format(
            sql.Identifier(schema, "jobs")
        ),
        [f"RuntimeError: login with password {password} refused", job_id],
    )
    server = start(app)
    try:
        answer = call(server, "GET", "/api/state")
        page = call(server, "GET", "/")
    finally:
        stop(server)
        app.close()
    assert answer.status == 200
    assert not leaked(answer.text) and not leaked(page.text)
    errors_shown = [job["error"] for job in answer.json()["jobs"]]
    assert errors_shown == ["RuntimeError: login with password *** refused"]


# -- roles and grants (docs/operations.md) ------------------------------------------------------


def _shop(app: SyncLane) -> None:
    queue = app.queue("shops")
    queue.owners(lambda name: [Owner("acme")])
    queue.windowed("orders", horizon=60 * DAY, slice=30 * DAY, every=timedelta(minutes=15))(
        lambda job: Page(None, 2)
    )


def test_the_worker_role_runs_everything_a_worker_does_and_nothing_more(
    dsn: str, schema: str, db: psycopg.Connection[Any], roles: dict[str, str]
) -> None:
    worker = make_app(dsn_as(dsn, roles["worker"]), schema)
    try:
        _shop(worker)
        added = worker.plan()["shops"]
        manual = worker.enqueue("shops", "acme", "orders")
        assert worker.run_worker(until_idle=True, stop_after=20)["completed"] == added + 1
        assert worker.requeue("shops", ids=[manual]) == 0
        assert worker.cancel("shops", "acme", "gone") == 0
        assert len(worker.failures()) == 0 and len(worker.jobs()) == added + 1
        with worker.connection() as conn:
            for statement in (
                sql.SQL("DELETE FROM {}").format(sql.Identifier(schema, "jobs")),
                sql.SQL("DROP TABLE {}").format(sql.Identifier(schema, "jobs")),
                sql.SQL("CREATE TABLE {} (x int)").format(sql.Identifier(schema, "mine")),
            ):
                with pytest.raises(errors.InsufficientPrivilege):
                    conn.execute(statement)
    finally:
        worker.close()
    # On a schema it may not create, the worker stops at once with what to do.
    with pytest.raises(SchemaError, match=r"(?s)cannot be created.*migrate"):
        SyncLane(dsn_as(dsn, roles["worker"]), schema=f"{schema}_new")


def test_the_analyst_role_reads_and_cannot_write(
    app: SyncLane, dsn: str, schema: str, roles: dict[str, str]
) -> None:
    _shop(app)
    app.plan()
    analyst = SyncLane(dsn_as(dsn, roles["analyst"]), schema=schema)
    try:
        _shop(analyst)
        assert len(analyst.jobs()) == 3
        assert list(analyst.progress("shops")["slices_total"]) == [2]
        assert len(analyst.failures()) == 0 and len(analyst.lanes()) == 1
        assert analyst.plan() == {"shops": 0}  # nothing missing: planning only read
        for write in (
            lambda: analyst.plan("shops", horizon=90 * DAY),
            lambda: analyst.enqueue("shops", "acme", "orders"),
            lambda: analyst.requeue("shops"),
            lambda: analyst.cancel("shops", "acme", "gone"),
        ):
            with pytest.raises(errors.InsufficientPrivilege):
                write()
    finally:
        analyst.close()
