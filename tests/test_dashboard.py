"""The dashboard (DESIGN §10): what /api/state shows, requeue through the page's POST, and the
security model: loopback only, no proxies unless trusted, the Host must name the server, a
requeue needs the page's token, a JSON body and a same-origin request, nothing is rendered from
data on the server, and the DSN never leaves it."""

from __future__ import annotations

import http.client
import json
import re
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from synclane import ConfigError, Job, Owner, Page, SyncLane
from synclane.dashboard import DashboardServer, is_loopback, make_server, serve

DAY = timedelta(days=1)
OWNERS = [
    Owner("acme-us", lane="acme"),
    Owner("acme-eu", lane="acme"),
    Owner("globex"),
    Owner("initech"),
]
SCRIPT_ERROR = "RuntimeError: page 3 broken <script>alert(1)</script>"
LONG_ERROR = "RuntimeError: order 97 not found\n" + "\n".join(
    f'  File "shop.py", line {n}, in fetch' for n in range(1, 30)
)


def done(job: Job) -> Page:
    return Page(None)


# -- arranging a shop with jobs in every state -----------------------------------------------


def arrange_shop(app: SyncLane, db: psycopg.Connection) -> dict[str, int]:
    """Queue 'shops' with four accounts (acme-us and acme-eu share the lane acme), each planned
    two orders slices, a recurring refresh and a products snapshot; then, as a user with UPDATE
    would: acme-us's newest slice failed with markup in its error, acme-eu's running, globex's
    two slices abandoned and deferred with one cause, initech all completed. Returns their ids."""
    queue = app.queue("shops")
    queue.owners(lambda name: OWNERS)
    queue.windowed("orders", horizon=60 * DAY, slice=30 * DAY, every=timedelta(minutes=15))(done)
    queue.snapshot("products", every=DAY)(done)
    app.plan()
    acme_us = slices(db, app.schema, "acme-us")
    acme_eu = slices(db, app.schema, "acme-eu")
    globex = slices(db, app.schema, "globex")
    ids = {
        "failed": acme_us[0],
        "running": acme_eu[0],
        "abandoned": globex[0],
        "deferred": globex[1],
    }
    arrange(db, app.schema, ids["failed"], status="failed", error=SCRIPT_ERROR, attempt_count=2)
    db.execute(
        sql.SQL(
            "UPDATE {} SET status = 'running', leased_by = 'worker-1', cursor = '50', "
            "lease_token = gen_random_uuid(), started_at = now(), "
            "lease_expires_at = now() + interval '5 minutes' WHERE id = %s"
        ).format(table(app.schema)),
        [ids["running"]],
    )
    arrange(
        db,
        app.schema,
        ids["abandoned"],
        status="abandoned",
        cursor="50",
        attempt_count=6,
        error="RuntimeError: order 41 not found",
    )
    arrange(db, app.schema, ids["deferred"], status="deferred", attempt_count=5, error=LONG_ERROR)
    db.execute(
        sql.SQL(
            "UPDATE {} SET status = 'completed', processed_count = 200, completed_at = now() "
            "WHERE owner = 'initech'"
        ).format(table(app.schema))
    )
    return ids


def table(schema: str) -> sql.Composed:
    return sql.SQL("{}.jobs").format(sql.Identifier(schema))


def slices(db: psycopg.Connection, schema: str, owner: str) -> list[int]:
    """The owner's initial orders slices, newest first."""
    query = sql.SQL(
        "SELECT id FROM {} WHERE owner = %s AND type = 'orders' AND mode = 'initial' "
        "ORDER BY window_start DESC"
    ).format(table(schema))
    return [row[0] for row in db.execute(query, [owner]).fetchall()]


def arrange(db: psycopg.Connection, schema: str, job_id: int, **values: object) -> None:
    assignments = sql.SQL(", ").join(
        sql.SQL("{} = %s").format(sql.Identifier(column)) for column in values
    )
    db.execute(
        sql.SQL("UPDATE {} SET {} WHERE id = %s").format(table(schema), assignments),
        [*values.values(), job_id],
    )


def row(db: psycopg.Connection, schema: str, job_id: int) -> dict[str, Any]:
    with db.cursor(row_factory=dict_row) as cur:
        found = cur.execute(
            sql.SQL("SELECT * FROM {} WHERE id = %s").format(table(schema)), [job_id]
        ).fetchone()
    assert found is not None
    return found


def statuses(db: psycopg.Connection, schema: str) -> dict[int, str]:
    query = sql.SQL("SELECT id, status FROM {}").format(table(schema))
    return dict(db.execute(query).fetchall())


# -- a running server and a client that sends exactly the headers given -----------------------


def start(app: SyncLane, **options: Any) -> DashboardServer:
    server = make_server(app, port=0, **options)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server


def stop(server: DashboardServer) -> None:
    server.shutdown()
    server.server_close()


@pytest.fixture
def shop(app: SyncLane, db: psycopg.Connection) -> dict[str, int]:
    return arrange_shop(app, db)


@pytest.fixture
def server(app: SyncLane, shop: dict[str, int]) -> Iterator[DashboardServer]:
    running = start(app)
    yield running
    stop(running)


class Answer:
    def __init__(self, response: http.client.HTTPResponse) -> None:
        self.status = response.status
        self.headers = response.headers
        self.text = response.read().decode()

    def json(self) -> Any:
        return json.loads(self.text)


def call(
    server: DashboardServer,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    host: str | None = "default",
) -> Answer:
    """One request; Host is the server's own address unless given (None: no Host at all)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        if host == "default":
            host = f"127.0.0.1:{server.port}"
        if host is not None:
            conn.putheader("Host", host)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        return Answer(conn.getresponse())
    finally:
        conn.close()


def token_of(server: DashboardServer) -> str:
    page = call(server, "GET", "/")
    found = re.search(r'<meta name="synclane-token" content="([^"]+)">', page.text)
    assert found is not None
    return found.group(1)


def post_requeue(
    server: DashboardServer,
    body: dict[str, Any],
    *,
    token: str | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    """A requeue as the page sends it, with changes given in `headers` (a None value drops one)."""
    sent = {
        "Content-Type": "application/json",
        "X-Synclane-Token": token if token is not None else token_of(server),
        "Origin": f"http://127.0.0.1:{server.port}",
        "Sec-Fetch-Site": "same-origin",
    }
    for name, value in (headers or {}).items():
        if value is None:
            sent.pop(name, None)
        else:
            sent[name] = value
    return call(server, "POST", "/api/requeue", json.dumps(body).encode(), sent)


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

    lanes = {lane["lane"]: lane for lane in state["lanes"]}
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

    progress = {(p["owner"], p["type"]): p for p in state["progress"]}
    assert {owner for owner, _ in progress} == {"acme-us", "acme-eu", "globex", "initech"}
    initech = progress[("initech", "orders")]
    assert (initech["queue"], initech["slices_total"], initech["slices_completed"]) == (
        "shops",
        2,
        2,
    )
    assert initech["percent"] == 100.0 and initech["coverage_start"] is not None
    assert progress[("globex", "orders")]["slices_failed"] == 2
    assert progress[("globex", "orders")]["coverage_start"] is None

    [cause] = [f for f in state["failures"] if f["cause"] == "RuntimeError: order <n> not found"]
    assert (cause["jobs"], cause["owners"]) == (2, ["globex"])
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
    for path in ("/", "/app.js", "/app.css"):
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
    assert re.findall(r"<script[^>]*>", page.text) == ['<script src="/app.js" defer>']
    script = call(server, "GET", "/app.js")
    assert script.headers["Content-Type"] == "text/javascript; charset=utf-8"
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script.text


@pytest.mark.parametrize("path", ["/", "/app.js", "/app.css", "/api/state", "/nowhere"])
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


# -- requeue ----------------------------------------------------------------------------------


def test_a_requeue_with_the_token_gives_the_job_a_fresh_attempt(
    app: SyncLane, db: psycopg.Connection, server: DashboardServer, shop: dict[str, int]
) -> None:
    before = statuses(db, app.schema)
    answer = post_requeue(server, {"queue": "shops", "job": shop["failed"]})
    assert answer.status == 200 and answer.json() == {"requeued": 1}
    job = row(db, app.schema, shop["failed"])
    assert (job["status"], job["attempt_count"], job["error"]) == ("pending", 0, None)
    after = statuses(db, app.schema)
    assert {k for k in after if after[k] != before[k]} == {shop["failed"]}
    # A job that is not stopped is left alone.
    answer = post_requeue(server, {"queue": "shops", "job": shop["running"]})
    assert answer.json() == {"requeued": 0}
    assert row(db, app.schema, shop["running"])["status"] == "running"


def test_a_requeue_by_cause_takes_the_group_and_keeps_cursors(
    app: SyncLane, db: psycopg.Connection, server: DashboardServer, shop: dict[str, int]
) -> None:
    body = {"queue": "shops", "type": "orders", "cause": "RuntimeError: order <n> not found"}
    assert post_requeue(server, body).json() == {"requeued": 2}
    abandoned = row(db, app.schema, shop["abandoned"])
    assert (abandoned["status"], abandoned["cursor"]) == ("pending", "50")
    assert row(db, app.schema, shop["deferred"])["status"] == "pending"
    assert row(db, app.schema, shop["failed"])["status"] == "failed"


def test_a_requeue_by_owner_and_of_all_stopped_jobs(
    app: SyncLane, db: psycopg.Connection, server: DashboardServer, shop: dict[str, int]
) -> None:
    token = token_of(server)
    answer = post_requeue(server, {"queue": "shops", "owner": "globex"}, token=token)
    assert answer.json() == {"requeued": 2}
    assert row(db, app.schema, shop["failed"])["status"] == "failed"
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
    trusting = start(app, trust_proxy=True)
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
    server = start(app, trust_proxy=True)
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


def test_allow_remote_lifts_the_host_check(app: SyncLane, shop: dict[str, int]) -> None:
    server = start(app, allow_remote=True)
    try:
        assert call(server, "GET", "/api/state", host="dash.example.com").status == 200
        # ... but a requeue must still come from the origin the browser shows.
        headers = {"Origin": "http://evil.example"}
        refused = post_requeue(server, {"queue": "shops", "all": True}, headers=headers)
        assert refused.status == 403
    finally:
        stop(server)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "192.0.2.10", "8.8.8.8"])
def test_listening_beyond_loopback_needs_allow_remote(app: SyncLane, host: str) -> None:
    with pytest.raises(ConfigError, match="--allow-remote"):
        make_server(app, host=host, port=0)
    with pytest.raises(ConfigError, match="--allow-remote"):
        serve(app, host=host, port=0)


def test_allow_remote_binds_every_address(app: SyncLane) -> None:
    server = make_server(app, host="0.0.0.0", port=0, allow_remote=True)
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
