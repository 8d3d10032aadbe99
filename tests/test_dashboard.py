"""The dashboard (docs/dashboard.md): what /api/state shows, requeue through the page's POST,
and the security model: loopback only, no proxies unless trusted, the Host must name the server,
a requeue needs the page's token, a JSON body and a same-origin request, nothing is rendered from
data on the server, and the DSN never leaves it. The page is served from a thread here;
tests/test_dashboard_attacks.py attacks it as a process of its own."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import psycopg
import pytest
from apps import products_queue
from dashboard_kit import (
    LONG_ERROR,
    SCRIPT_ERROR,
    arrange_shop,
    call,
    post_change,
    post_requeue,
    start,
    statuses,
    stop,
    token_of,
)
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql
from roles import dsn_as
from workers import arrange, job_row, running_worker, wait_for

from synclane import ConfigError, Job, Owner, Page, SyncLane, Throttled
from synclane.dashboard import DashboardServer, is_loopback, make_server, serve
from synclane.testing import make_app
from synclane.worker import presence

SECRET = "a-login-secret-for-tests-only"


@pytest.fixture
def shop(app: SyncLane, db: psycopg.Connection) -> dict[str, int]:
    return arrange_shop(app, db)


@pytest.fixture
def server(app: SyncLane, shop: dict[str, int]) -> Iterator[DashboardServer]:
    running = start(app)
    yield running
    stop(running)


# -- what the page shows ----------------------------------------------------------------------


def test_the_state_shows_lanes_jobs_progress_and_failures(
    server: DashboardServer, shop: dict[str, int]
) -> None:
    answer = call(server, "GET", "/api/state")
    assert answer.status == 200
    assert answer.headers["Content-Type"] == "application/json; charset=utf-8"
    state = answer.json()
    assert state["queues"] == ["shops"]
    assert state["requeue_statuses"] == ["failed", "deferred", "abandoned"]

    lanes = {lane["lane"]: lane for lane in state["lanes"]["rows"]}
    assert set(lanes) == {"acme", "globex"}  # initech has nothing open
    acme = lanes["acme"]
    assert (acme["job_id"], acme["owner"], acme["type"]) == (shop["running"], "acme-eu", "orders")
    assert (acme["cursor"], acme["leased_by"]) == ("50", "worker-1")
    assert datetime.fromisoformat(acme["since"]) < datetime.fromisoformat(acme["lease_expires_at"])
    assert lanes["globex"]["job_id"] is None and lanes["globex"]["since"] is None

    jobs = {job["id"]: job for job in state["jobs"]}
    assert len(jobs) == 16
    assert [job["id"] for job in state["jobs"]] == sorted(jobs, reverse=True)
    failed = jobs[shop["failed"]]
    assert (failed["status"], failed["owner"], failed["lane"]) == ("failed", "acme-us", "acme")
    assert (failed["attempt_count"], failed["error"]) == (2, SCRIPT_ERROR)
    assert datetime.fromisoformat(failed["window_end"]) > datetime.fromisoformat(
        failed["window_start"]
    )
    assert jobs[shop["abandoned"]]["cursor"] == "50"
    assert jobs[shop["deferred"]]["error"] == LONG_ERROR
    assert "lease_token" not in failed

    # The accounts that need a look, worst first: globex's slices stopped, acme-us's failed;
    # then the first loads still waiting. initech loaded everything: it needs no look.
    accounts = state["accounts"]
    assert accounts["total"] == len(accounts["rows"]) == 6
    worst = [(a["owner"], a["type"], a["state"]) for a in accounts["rows"][:2]]
    assert worst == [("globex", "orders", "abandoned"), ("acme-us", "orders", "failing")]
    globex = accounts["rows"][0]
    assert (globex["queue"], globex["slices_total"], globex["slices_failed"]) == ("shops", 2, 2)
    assert globex["loaded_from"] is None and globex["abandoned"] == 1
    assert "initech" not in {a["owner"] for a in accounts["rows"]}
    # ... and any account is found by its name, loaded ones included.
    found = call(server, "GET", "/api/accounts?search=initech").json()["rows"]
    initech = {a["type"]: a for a in found}
    assert set(initech) == {"orders", "products"}
    orders = initech["orders"]
    assert (orders["state"], orders["slices_total"], orders["slices_completed"]) == ("loaded", 2, 2)
    assert orders["percent"] == 100.0 and orders["loaded_from"] is not None
    assert orders["records"] == 400

    failures = state["failures"]["rows"]
    [cause] = [f for f in failures if f["cause"] == "RuntimeError: order <n> not found"]
    assert (cause["jobs"], cause["owners"]) == (2, ["globex"])
    assert re.fullmatch(r"[0-9a-f]{8}", cause["cause_id"])
    assert cause["example"] in ("RuntimeError: order 41 not found", LONG_ERROR)
    assert cause["statuses"] == ["abandoned", "deferred"]
    assert sorted(cause["job_ids"]) == sorted([shop["abandoned"], shop["deferred"]])
    assert datetime.fromisoformat(cause["first_seen"]).tzinfo is not None


def test_the_state_never_contains_the_dsn(
    app: SyncLane, db: psycopg.Connection, server: DashboardServer, shop: dict[str, int]
) -> None:
    # A handler's error may quote the connection string; the page shows it hidden.
    leaky = f"OperationalError: connection to {app.dsn} failed"
    arrange(db, app.schema, shop["failed"], error=leaky)
    text = call(server, "GET", "/api/state").text
    assert app.dsn not in text and repr(app) not in text
    errors = [job["error"] for job in json.loads(text)["jobs"] if job["id"] == shop["failed"]]
    assert errors == ["OperationalError: connection to *** failed"]
    for path in ("/", "/app.js", "/style.css"):
        assert app.dsn not in call(server, "GET", path).text


def test_an_error_with_markup_is_data_and_the_page_renders_nothing_from_data(
    server: DashboardServer, shop: dict[str, int]
) -> None:
    state = call(server, "GET", "/api/state").json()
    assert SCRIPT_ERROR in [job["error"] for job in state["jobs"]]
    page = call(server, "GET", "/")
    assert page.headers["Content-Type"] == "text/html; charset=utf-8"
    assert "alert" not in page.text and "acme" not in page.text
    # Only the page's own script, no inline one (the CSP forbids it anyway).
    assert re.findall(r"<script[^>]*>", page.text) == ['<script src="app.js" defer>']
    script = call(server, "GET", "/app.js")
    assert script.headers["Content-Type"] == "text/javascript; charset=utf-8"
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script.text


@pytest.mark.parametrize("path", ["/", "/app.js", "/style.css", "/api/state", "/nowhere"])
def test_every_answer_carries_the_security_headers(server: DashboardServer, path: str) -> None:
    answer = call(server, "GET", path)
    policy = answer.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    assert answer.headers["X-Content-Type-Options"] == "nosniff"
    assert answer.headers["X-Frame-Options"] == "DENY"
    assert answer.headers["Referrer-Policy"] == "no-referrer"
    assert answer.headers["Server"] == "synclane-dashboard"  # no Python version


def test_unknown_paths_and_methods_are_answered_in_json(server: DashboardServer) -> None:
    assert call(server, "GET", "/nowhere").status == 404
    assert call(server, "GET", "/api/requeue").status == 405
    assert call(server, "POST", "/api/state", b"{}").status == 405


def test_an_unreachable_database_answers_503_without_the_password(dsn: str, schema: str) -> None:
    secret_dsn = "postgresql://postgres:hunter2-secret@127.0.0.1:1/test"
    app = SyncLane(secret_dsn, schema=schema, create_schema=False)
    app.queue("shops")
    server = start(app)
    try:
        answer = call(server, "GET", "/api/state")
        assert answer.status == 503
        assert answer.json() == {"error": "the database is not answering; the page keeps trying"}
        assert call(server, "GET", "/").status == 200  # the page loads and keeps asking
        failed = post_requeue(server, {"queue": "shops", "all": True})
        assert failed.status == 503
        for text in (answer.text, failed.text):
            assert "hunter2" not in text and "Traceback" not in text and "127.0.0.1:1" not in text
    finally:
        stop(server)


# -- lanes: throttles and rates ---------------------------------------------------------------


def test_a_throttled_lane_stays_paused_on_the_page_after_its_job_is_requeued(
    app: SyncLane,
) -> None:
    """The pause belongs to the lane (lanes.paused_until): a requeue clears the job's Throttled
    error, not the lane's pause, and the page reads the pause as lanes() does."""

    def slow_down(job: Job) -> Page:
        raise Throttled(retry_after=3600)

    products_queue(app, owners=[Owner("acme-us", lane="acme")], handler=slow_down)
    app.plan()
    app.run_worker(until_idle=True, idle_grace=0, stop_after=30)
    until = app.lanes("shops")["paused_until"].iloc[0].to_pydatetime()
    server = start(app)
    try:
        assert post_requeue(server, {"queue": "shops", "owner": "acme-us"}).json() == {
            "requeued": 1
        }
        [lane] = call(server, "GET", "/api/state").json()["lanes"]["rows"]
        [job] = call(server, "GET", "/api/jobs?lane=acme").json()["rows"]
    finally:
        stop(server)
    assert (job["status"], job["error"]) == ("pending", None)
    assert datetime.fromisoformat(lane["paused_until"]) == until
    assert app.lanes("shops")["paused_until"].iloc[0].to_pydatetime() == until


def test_each_lane_shows_its_rate_and_the_page_starts_it_has_left(app: SyncLane) -> None:
    """What lanes() shows (docs/flow-control.md): the lane's own rate, else the queue's, else the
    declared lane_rate, and the starts its current window still allows; no rate where the queue
    declares none."""
    shops = [Owner("acme-us", lane="acme"), Owner("acme-eu", lane="acme"), Owner("globex")]
    products_queue(app, owners=shops, lane_rate=(5, 3600))
    products_queue(app, "plain")
    app.plan("shops")
    app.run_worker(until_idle=True, idle_grace=0, stop_after=30)  # one page start per owner
    app.set_lane_rate("shops", (10, 60), lane="globex")
    for owner in ("acme-us", "globex", "initech"):  # initech's lane never started a page
        app.enqueue("shops", owner, "products")
    app.enqueue("plain", "acme-us", "products")
    server = start(app)
    try:
        rows = call(server, "GET", "/api/state").json()["lanes"]["rows"]
    finally:
        stop(server)
    shown = {
        (r["queue"], r["lane"]): (r["rate_count"], r["rate_period"], r["rate_left"]) for r in rows
    }
    assert shown == {
        ("shops", "acme"): (5, 3600.0, 3),
        ("shops", "globex"): (10, 60.0, 9),
        ("shops", "initech"): (5, 3600.0, 5),
        ("plain", "acme-us"): (None, None, None),
    }
    frame = app.lanes("shops").set_index("lane")
    for (queue, lane), (count, period, left) in shown.items():
        if queue == "shops":
            assert (frame.loc[lane, "rate_count"], frame.loc[lane, "rate_left"]) == (count, left)
            assert frame.loc[lane, "rate_period"].total_seconds() == period


# -- workers ----------------------------------------------------------------------------------


def test_the_workers_section_lists_the_workers_as_app_workers_does(
    app: SyncLane, db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Running workers first, then the lost ones (a dead worker's row, its session gone), each
    with what app.workers() shows: what it works, how busy it is, when it was last seen."""
    monkeypatch.setattr(presence, "BEAT", 0.1)
    gate = threading.Event()

    def waits(job: Job) -> Page:
        gate.wait(30)
        return Page(None, 1)

    products_queue(app, handler=waits, concurrency=2)
    app.enqueue("shops", "acme", "products")
    db.execute(
        sql.SQL(
            "INSERT INTO {} (name, instance, host, pid, version, queues, slots, expires_at) "
            "VALUES ('a-dead-worker', gen_random_uuid(), 'gone.example', 4242, '0.1', "
            "'{{shops}}', 3, now() + interval '1 minute')"
        ).format(sql.Identifier(app.schema, "workers"))
    )
    try:
        with running_worker(app):
            listed: list[Any] = []

            def one_busy() -> bool:
                listed[:] = [app.workers()]
                return bool(listed[0]["busy"].sum() == 1)

            wait_for(one_busy, timeout=15, what="the worker busy with the job")
            busy = listed[0]
            server = start(app)
            try:
                shown = call(server, "GET", "/api/state").json()["workers"]
                second = call(server, "GET", "/api/workers?page=1").json()
            finally:
                stop(server)
    finally:
        gate.set()
    live = busy[busy["state"] == "running"].iloc[0]
    assert [(w["name"], w["state"]) for w in shown["rows"]] == [
        (live["name"], "running"),
        ("a-dead-worker", "lost"),
    ]
    assert (shown["total"], second["rows"]) == (2, [])  # 50 a page
    running, lost = shown["rows"]
    assert (running["host"], running["pid"], running["version"]) == (
        live["host"],
        live["pid"],
        live["version"],
    )
    assert (running["queues"], running["slots"], running["busy"]) == (["shops"], 2, 1)
    assert datetime.fromisoformat(running["started_at"]) == live["started_at"]
    seen = datetime.fromisoformat(running["last_seen_at"]) - live["last_seen_at"]
    assert abs(seen.total_seconds()) < 5  # it beats ten times a second
    assert (lost["host"], lost["pid"], lost["queues"], lost["slots"], lost["busy"]) == (
        "gone.example",
        4242,
        ["shops"],
        3,
        0,
    )


# -- requeue ----------------------------------------------------------------------------------


def test_a_requeue_with_the_token_gives_the_job_a_fresh_attempt(
    app: SyncLane, db: psycopg.Connection, server: DashboardServer, shop: dict[str, int]
) -> None:
    before = statuses(db, app.schema)
    answer = post_requeue(server, {"queue": "shops", "job": shop["failed"]})
    assert answer.status == 200 and answer.json() == {"requeued": 1}
    job = job_row(db, app.schema, shop["failed"])
    assert (job["status"], job["attempt_count"], job["error"]) == ("pending", 0, None)
    after = statuses(db, app.schema)
    assert {k for k in after if after[k] != before[k]} == {shop["failed"]}
    # A job that is not stopped is left alone.
    answer = post_requeue(server, {"queue": "shops", "job": shop["running"]})
    assert answer.json() == {"requeued": 0}
    assert job_row(db, app.schema, shop["running"])["status"] == "running"


def test_a_requeue_by_cause_takes_the_group_and_keeps_cursors(
    app: SyncLane, db: psycopg.Connection, server: DashboardServer, shop: dict[str, int]
) -> None:
    body = {"queue": "shops", "type": "orders", "cause": "RuntimeError: order <n> not found"}
    assert post_requeue(server, body).json() == {"requeued": 2}
    abandoned = job_row(db, app.schema, shop["abandoned"])
    assert (abandoned["status"], abandoned["cursor"]) == ("pending", "50")
    assert job_row(db, app.schema, shop["deferred"])["status"] == "pending"
    assert job_row(db, app.schema, shop["failed"])["status"] == "failed"


def test_a_requeue_by_owner_and_of_all_stopped_jobs(
    app: SyncLane, db: psycopg.Connection, server: DashboardServer, shop: dict[str, int]
) -> None:
    token = token_of(server)
    answer = post_requeue(server, {"queue": "shops", "owner": "globex"}, token=token)
    assert answer.json() == {"requeued": 2}
    assert job_row(db, app.schema, shop["failed"])["status"] == "failed"
    assert post_requeue(server, {"queue": "shops", "all": True}, token=token).json() == {
        "requeued": 1
    }
    assert set(statuses(db, app.schema).values()) == {"pending", "running", "completed"}


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"X-Synclane-Token": None}, 403),
        ({"X-Synclane-Token": "not-the-token"}, 403),
        ({"Origin": "http://evil.example"}, 403),
        ({"Origin": "http://localhost:1"}, 403),
        ({"Origin": "null"}, 403),
        ({"Sec-Fetch-Site": "cross-site"}, 403),
        ({"Sec-Fetch-Site": "same-site"}, 403),  # another port of localhost is same-site
        ({"Content-Type": "text/plain"}, 415),
        ({"Content-Type": "application/x-www-form-urlencoded"}, 415),
        ({"Content-Type": None}, 415),
    ],
)
def test_a_cross_site_or_tokenless_requeue_is_refused(
    app: SyncLane,
    db: psycopg.Connection,
    server: DashboardServer,
    shop: dict[str, int],
    headers: dict[str, str],
    status: int,
) -> None:
    before = statuses(db, app.schema)
    answer = post_requeue(server, {"queue": "shops", "all": True}, headers=headers)
    assert answer.status == status
    assert "error" in answer.json()
    assert statuses(db, app.schema) == before


def test_a_requeue_without_origin_headers_but_with_the_token_works(
    server: DashboardServer, shop: dict[str, int]
) -> None:
    # What a script (curl) sends: no Origin, no Sec-Fetch-Site; the token is what counts.
    headers: dict[str, str] = {"Origin": None, "Sec-Fetch-Site": None}  # type: ignore[dict-item]
    answer = post_requeue(server, {"queue": "shops", "job": shop["failed"]}, headers=headers)
    assert answer.json() == {"requeued": 1}


def test_each_server_has_its_own_token(app: SyncLane, server: DashboardServer) -> None:
    other = start(app)
    try:
        assert token_of(other) != token_of(server)
        refused = post_requeue(other, {"queue": "shops", "all": True}, token=token_of(server))
        assert refused.status == 403
    finally:
        stop(other)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"queue": "shops"}, "exactly one of job, owner, cause or all"),
        ({"queue": "shops", "job": 1, "owner": "globex"}, "exactly one of"),
        ({"queue": "shops", "job": "1"}, "job must be a job id"),
        ({"queue": "shops", "job": True}, "job must be a job id"),
        ({"queue": "shops", "all": 1}, "all must be true"),
        ({"queue": "shops", "owner": ""}, "owner must be a non-empty string"),
        ({"queue": "shops", "job": 1, "type": "orders"}, "type must be a type name"),
        ({"queue": "shops", "all": True, "status": "x"}, "unknown field(s) status"),
        ({"all": True}, "name the queue"),
        ({"queue": "nope", "all": True}, "unknown queue 'nope'"),
        ({"queue": "shops", "all": True, "type": "nope"}, "has no type 'nope'"),
        ([1, 2], "send a JSON object"),
    ],
)
def test_a_malformed_requeue_is_answered_400_with_the_fix(
    server: DashboardServer, body: Any, message: str
) -> None:
    answer = post_requeue(server, body)
    assert answer.status == 400
    assert message in answer.json()["error"]


def test_a_body_that_is_not_json_or_too_large_is_refused(server: DashboardServer) -> None:
    headers = {"Content-Type": "application/json", "X-Synclane-Token": token_of(server)}
    assert call(server, "POST", "/api/requeue", b"{nope", headers).status == 400
    big = b'{"queue": "' + b"x" * 70_000 + b'", "all": true}'
    assert call(server, "POST", "/api/requeue", big, headers).status == 413
    assert call(server, "POST", "/api/requeue", None, headers).status == 411


# -- pause and resume -------------------------------------------------------------------------


def pauses(db: psycopg.Connection, schema: str) -> list[tuple[Any, ...]]:
    query = sql.SQL("SELECT queue, paused_at, paused_by, reason FROM {} ORDER BY queue")
    return db.execute(query.format(sql.Identifier(schema, "queue_pauses"))).fetchall()


def test_a_pause_from_the_page_is_app_pause_and_the_page_shows_who_why_and_since_when(
    app: SyncLane, db: psycopg.Connection, server: DashboardServer
) -> None:
    token = token_of(server)
    why = {"queue": "shops", "reason": "warehouse maintenance until 14:00"}
    answer = post_change(server, "/api/pause", why, token=token)
    assert answer.status == 200
    paused = answer.json()["paused"]
    [(queue, since, by, reason)] = pauses(db, app.schema)
    assert (queue, reason) == ("shops", "warehouse maintenance until 14:00")
    assert by.endswith(" via the dashboard")  # user@host of the page's server
    assert (paused["queue"], paused["paused_by"], paused["reason"]) == ("shops", by, reason)
    assert datetime.fromisoformat(paused["paused_at"]) == since
    # what the workers and the SDK read, and what the page shows to every viewer
    assert set(app.depth("shops")["paused_by"]) == {by}
    [shown] = call(server, "GET", "/api/state").json()["summary"]["queues"]
    assert (shown["pause"]["paused_by"], shown["pause"]["reason"]) == (by, reason)
    assert datetime.fromisoformat(shown["pause"]["paused_at"]) == since

    # pausing a paused queue keeps when and by whom, and takes the new reason (app.pause)
    again = {"queue": "shops", "reason": "still down", "by": "alice"}
    assert post_change(server, "/api/pause", again, token=token).status == 200
    assert pauses(db, app.schema) == [("shops", since, by, "still down")]

    resume = {"queue": "shops"}
    assert post_change(server, "/api/resume", resume, token=token).json() == {"resumed": True}
    assert pauses(db, app.schema) == []
    [shown] = call(server, "GET", "/api/state").json()["summary"]["queues"]
    assert shown["pause"] is None
    assert post_change(server, "/api/resume", resume, token=token).json() == {"resumed": False}
    mine = {"queue": "shops", "reason": "my turn", "by": "alice"}
    assert post_change(server, "/api/pause", mine, token=token).json()["paused"]["paused_by"] == (
        "alice"
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"queue": "shops"}, "say why you pause the queue"),
        ({"queue": "shops", "reason": ""}, "say why you pause the queue"),
        ({"queue": "shops", "reason": "   "}, "say why you pause the queue"),
        ({"queue": "shops", "reason": 5}, "say why you pause the queue"),
        ({"queue": "shops", "reason": "x", "by": ""}, "by must be a non-empty string"),
        ({"queue": "shops", "reason": "x", "until": "14:00"}, "unknown field(s) until"),
        ({"reason": "x"}, "name the queue"),
        ({"queue": "nope", "reason": "x"}, "unknown queue 'nope'"),
        (["shops"], "send a JSON object"),
    ],
)
def test_a_pause_without_a_reason_or_of_an_unknown_queue_is_a_400_and_pauses_nothing(
    app: SyncLane, db: psycopg.Connection, server: DashboardServer, body: Any, message: str
) -> None:
    answer = post_change(server, "/api/pause", body)
    assert answer.status == 400
    assert message in answer.json()["error"]
    assert pauses(db, app.schema) == []


@pytest.mark.parametrize("path", ["/api/pause", "/api/resume"])
@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"X-Synclane-Token": None}, 403),
        ({"X-Synclane-Token": "not-the-token"}, 403),
        ({"Origin": "http://evil.example"}, 403),
        ({"Sec-Fetch-Site": "same-site"}, 403),
        ({"X-Forwarded-For": "203.0.113.9"}, 403),
        ({"Content-Type": "text/plain"}, 415),
    ],
)
def test_a_cross_site_or_tokenless_pause_or_resume_is_refused(
    app: SyncLane,
    db: psycopg.Connection,
    server: DashboardServer,
    path: str,
    headers: dict[str, str],
    status: int,
) -> None:
    if path == "/api/resume":
        app.pause("shops", "set by the test")
    before = pauses(db, app.schema)
    body = {"queue": "shops", "reason": "forged"} if path == "/api/pause" else {"queue": "shops"}
    answer = post_change(server, path, body, headers=headers)
    assert answer.status == status
    assert "error" in answer.json()
    assert pauses(db, app.schema) == before


def test_beyond_loopback_pause_and_resume_need_the_login(
    app: SyncLane, db: psycopg.Connection, shop: dict[str, int]
) -> None:
    server = start(app, host="0.0.0.0", allow_remote=True, login_secret=SECRET)
    try:
        body = {"queue": "shops", "reason": "deploy"}
        assert post_change(server, "/api/pause", body, token="x" * 64).status == 401
        login = call(
            server,
            "POST",
            "/api/login",
            json.dumps({"secret": SECRET}).encode(),
            {"Content-Type": "application/json"},
        )
        session = {"Cookie": login.headers["Set-Cookie"].split(";")[0]}
        token = token_of(server, headers=session)
        assert post_change(server, "/api/pause", body, token=token).status == 401  # no session
        assert pauses(db, app.schema) == []
        paused = post_change(server, "/api/pause", body, token=token, headers=session)
        assert paused.status == 200 and len(pauses(db, app.schema)) == 1
        assert post_change(server, "/api/resume", {"queue": "shops"}, token=token).status == 401
        resumed = post_change(
            server, "/api/resume", {"queue": "shops"}, token=token, headers=session
        )
        assert resumed.json() == {"resumed": True} and pauses(db, app.schema) == []
    finally:
        stop(server)


def test_on_the_analyst_role_the_page_reads_and_its_changes_are_a_403_naming_the_grants(
    dsn: str,
    schema: str,
    db: psycopg.Connection,
    roles: dict[str, str],
) -> None:
    """docs/operations.md: the dashboard runs as synclane_worker; on the read-only role the page
    still shows everything, and a change says which grants it lacks instead of "the database is
    not answering"."""
    for role, pause_status in (("analyst", 403), ("worker", 200)):
        app = make_app(dsn_as(dsn, roles[role]), schema)
        products_queue(app)
        server = start(app)
        try:
            assert call(server, "GET", "/api/state").status == 200
            answer = post_change(server, "/api/pause", {"queue": "shops", "reason": "r"})
            assert answer.status == pause_status, role
            if role == "analyst":
                assert "synclane_worker grants" in answer.json()["error"]
                assert pauses(db, schema) == []
                requeue = post_requeue(server, {"queue": "shops", "all": True})
                assert requeue.status == 403 and "may not requeue" in requeue.json()["error"]
        finally:
            stop(server)
            app.close()
    [(_, _, by, _)] = pauses(db, schema)
    assert by.endswith(" via the dashboard")


# -- /metrics ---------------------------------------------------------------------------------

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
OPEN = ("pending", "running", "failed", "deferred", "abandoned")


def scrape(server: DashboardServer, **options: Any) -> Samples:
    """GET /metrics as Prometheus sends it: no Origin, no cookie, no token."""
    answer = call(server, "GET", "/metrics", **options)
    assert answer.status == 200, answer.text
    assert answer.headers["Content-Type"].startswith("text/plain; version=")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def gauge(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def test_the_page_serves_metrics_only_when_asked_for(server: DashboardServer) -> None:
    answer = call(server, "GET", "/metrics")
    assert answer.status == 404 and "metrics=True" in answer.json()["error"]


def test_metrics_scraped_over_http_match_the_table_read_at_most_once_per_interval(
    app: SyncLane, db: psycopg.Connection, shop: dict[str, int]
) -> None:
    server = start(app, metrics=True)
    try:
        samples = scrape(server)
        app.pause("shops", "read by the next scrape but one")
        assert gauge(scrape(server), "synclane_queue_paused", queue="shops") == 0  # kept
        jobs = sql.Identifier(app.schema, "jobs")
        counts = dict(
            db.execute(
                sql.SQL("SELECT status, count(*) FROM {} GROUP BY status").format(jobs)
            ).fetchall()
        )
        [(due,)] = db.execute(
            sql.SQL(
                "SELECT count(*) FROM {} WHERE status IN ('pending', 'failed') "
                "AND next_run_at <= now()"
            ).format(jobs)
        ).fetchall()
        assert gauge(samples, "synclane_table_up") == 1
        for status in OPEN:
            shown = gauge(samples, "synclane_open_jobs", queue="shops", status=status)
            assert shown == counts.get(status, 0), status
        assert counts["pending"] > 0 and counts["running"] == 1 and counts["abandoned"] == 1
        assert gauge(samples, "synclane_due_jobs", queue="shops") == due
        assert gauge(samples, "synclane_workers", state="running") == 0
        # once the interval has passed, a scrape reads the table again
        wait_for(
            lambda: gauge(scrape(server), "synclane_queue_paused", queue="shops") == 1,
            timeout=10,
            what="the pause in the scraped metrics",
        )
    finally:
        stop(server)


def test_beyond_loopback_metrics_need_no_login_and_keep_the_host_and_proxy_checks(
    app: SyncLane, shop: dict[str, int]
) -> None:
    """A scraper cannot log in: /metrics, which holds names and counts and no secret, is open
    when asked for; the page and its API still need the login, and the Host, proxy and
    cross-site checks hold for /metrics too."""
    server = start(app, host="0.0.0.0", allow_remote=True, login_secret=SECRET, metrics=True)
    try:
        assert gauge(scrape(server), "synclane_table_up") == 1
        text = call(server, "GET", "/metrics")
        assert app.dsn not in text.text and "password" not in text.text
        assert text.headers["X-Content-Type-Options"] == "nosniff"
        assert call(server, "GET", "/api/state").status == 401
        assert call(server, "GET", "/").status == 303
        assert call(server, "GET", "/metrics", host="evil.example").status == 403
        proxied = {"X-Forwarded-For": "203.0.113.9"}
        assert call(server, "GET", "/metrics", headers=proxied).status == 403
        other_site = {"Sec-Fetch-Site": "cross-site"}
        assert call(server, "GET", "/metrics", headers=other_site).status == 403
    finally:
        stop(server)


# -- who may ask ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    [
        {"X-Forwarded-For": "203.0.113.9"},
        {"Forwarded": "for=203.0.113.9"},
        {"X-Real-IP": "203.0.113.9"},
        {"X-Forwarded-Host": "dash.example.com"},
    ],
)
@pytest.mark.parametrize("path", ["/", "/api/state"])
def test_a_request_through_a_proxy_is_refused_unless_the_proxy_is_trusted(
    app: SyncLane, server: DashboardServer, header: dict[str, str], path: str
) -> None:
    answer = call(server, "GET", path, headers=header)
    assert answer.status == 403
    assert "--trust-proxy" in answer.json()["error"]
    trusting = start(app, trust_proxy=True, public_hosts=["dash.example.com"])
    try:
        assert call(trusting, "GET", path, headers=header).status == 200
    finally:
        stop(trusting)


def test_a_proxied_requeue_is_refused_before_anything_changes(
    app: SyncLane, db: psycopg.Connection, server: DashboardServer, shop: dict[str, int]
) -> None:
    before = statuses(db, app.schema)
    headers = {"X-Forwarded-For": "203.0.113.9"}
    assert post_requeue(server, {"queue": "shops", "all": True}, headers=headers).status == 403
    assert statuses(db, app.schema) == before


def test_a_trusted_proxy_may_requeue_for_its_public_origin(
    app: SyncLane, db: psycopg.Connection, shop: dict[str, int]
) -> None:
    server = start(app, trust_proxy=True, public_hosts=["dash.example.com"])
    try:
        headers = {
            "X-Forwarded-For": "203.0.113.9",
            "X-Forwarded-Host": "dash.example.com",
            "Origin": "https://dash.example.com",
        }
        answer = post_requeue(server, {"queue": "shops", "job": shop["failed"]}, headers=headers)
        assert answer.json() == {"requeued": 1}
    finally:
        stop(server)


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:{port}",
        "127.0.0.1:1",
        "localhost.evil.example:{port}",
        "",
        None,
    ],
)
def test_a_host_header_naming_another_server_is_refused(
    server: DashboardServer, host: str | None
) -> None:
    # DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1.
    sent = None if host is None else host.format(port=server.port)
    for path in ("/", "/api/state"):
        answer = call(server, "GET", path, host=sent)
        assert answer.status == 403
        assert "Host" in answer.json()["error"]


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "localhost", "[::1]"])
def test_the_loopback_names_of_the_server_are_accepted(server: DashboardServer, host: str) -> None:
    assert call(server, "GET", "/api/state", host=host.format(port=server.port)).status == 200


def test_allow_remote_keeps_the_host_check_and_public_hosts_name_the_server(
    app: SyncLane, shop: dict[str, int]
) -> None:
    """Issue 20 item 1: the Host check stays on with --allow-remote (DNS rebinding); the names
    the page is reached by are listed with --public-host."""
    server = start(app, allow_remote=True)
    try:
        assert call(server, "GET", "/api/state", host="dash.example.com").status == 403
    finally:
        stop(server)
    server = start(app, allow_remote=True, public_hosts=["dash.example.com"])
    try:
        assert call(server, "GET", "/api/state", host="dash.example.com").status == 200
        assert call(server, "GET", "/api/state", host="evil.example").status == 403
        # ... and a requeue must still come from the origin the browser shows.
        headers = {"Origin": "http://evil.example"}
        refused = post_requeue(server, {"queue": "shops", "all": True}, headers=headers)
        assert refused.status == 403
    finally:
        stop(server)


def test_a_trusted_proxy_forwarding_an_unknown_host_is_refused(
    app: SyncLane, shop: dict[str, int]
) -> None:
    server = start(app, trust_proxy=True, public_hosts=["dash.example.com"])
    try:
        headers = {"X-Forwarded-For": "203.0.113.9", "X-Forwarded-Host": "evil.example"}
        answer = call(server, "GET", "/api/state", headers=headers)
        assert answer.status == 403 and "Host" in answer.json()["error"]
    finally:
        stop(server)


@pytest.mark.parametrize("hosts", [["http://dash.example.com"], ["dash.example.com:x"], [""], [7]])
def test_a_malformed_public_host_is_a_config_error(app: SyncLane, hosts: list[Any]) -> None:
    with pytest.raises(ConfigError, match="--public-host"):
        make_server(app, port=0, public_hosts=hosts)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "192.0.2.10", "8.8.8.8"])
def test_listening_beyond_loopback_needs_allow_remote(app: SyncLane, host: str) -> None:
    with pytest.raises(ConfigError, match="--allow-remote"):
        make_server(app, host=host, port=0)
    with pytest.raises(ConfigError, match="--allow-remote"):
        serve(app, host=host, port=0)


@pytest.mark.parametrize("secret", [None, "short", "   "])
def test_listening_beyond_loopback_needs_a_login_secret(app: SyncLane, secret: str | None) -> None:
    """Issue 20 item 2: a page other machines can reach asks for a credential."""
    with pytest.raises(ConfigError, match="SYNCLANE_DASHBOARD_SECRET"):
        make_server(app, host="0.0.0.0", port=0, allow_remote=True, login_secret=secret)


def test_allow_remote_binds_every_address(app: SyncLane) -> None:
    server = make_server(app, host="0.0.0.0", port=0, allow_remote=True, login_secret=SECRET)
    try:
        assert server.port != 0 and server.url == f"http://127.0.0.1:{server.port}/"
    finally:
        server.server_close()


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.0.0.1", False),
    ],
)
def test_loopback_means_only_this_machine(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_busy_port_or_a_bad_port_is_a_config_error(app: SyncLane) -> None:
    server = make_server(app, port=0)
    try:
        with pytest.raises(ConfigError, match="--port"):
            make_server(app, port=server.port)
    finally:
        server.server_close()
    for port in (-1, 65536, "8080", True):
        with pytest.raises(ConfigError, match="port"):
            make_server(app, port=port)  # type: ignore[arg-type]


def test_serve_runs_until_ctrl_c_then_closes(
    app: SyncLane, monkeypatch: pytest.MonkeyPatch
) -> None:
    servers: list[DashboardServer] = []

    def interrupted(self: DashboardServer, poll_interval: float = 0.5) -> None:
        servers.append(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(DashboardServer, "serve_forever", interrupted)
    assert serve(app, port=0) is None  # type: ignore[func-returns-value]
    [server] = servers
    assert server.socket.fileno() == -1  # closed


def test_the_page_works_with_port_zero(server: DashboardServer) -> None:
    assert server.port != 0
    assert server.url == f"http://127.0.0.1:{server.port}/"
    assert call(server, "GET", "/").status == 200


def test_the_page_hides_short_passwords_sslpasswords_and_any_written_password(
    dsn: str, schema: str, db: psycopg.Connection
) -> None:
    """Issue 20 item 6, the page's own masking: a password of 3 characters where it stands
    alone (not inside other words), the sslpassword, and any password a text writes out."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = {k: v for k, v in conninfo_to_dict(dsn).items() if k != "password"}
    secret_dsn = make_conninfo("", **params, password="abc", sslpassword="ssl-secret-99")
    app = SyncLane(secret_dsn, schema=schema)
    products_queue(app)
    job_id = app.enqueue("shops", "acme", "products")
    error = (
        "RuntimeError: login abc refused (abcdef kept); key ssl-secret-99; "
        "dsn host=h password='p w' port=5; url postgresql://u:hunter2@h/db"
    )
    arrange(db, schema, job_id, status="failed", error=error)
    server = start(app)
    try:
        text = call(server, "GET", "/api/state").text
    finally:
        stop(server)
        app.close()
    [shown] = [job["error"] for job in json.loads(text)["jobs"]]
    assert shown == (
        "RuntimeError: login *** refused (abcdef kept); key ***; "
        "dsn host=h password=*** port=5; url postgresql://u:***@h/db"
    )
    assert "ssl-secret-99" not in text and "hunter2" not in text
