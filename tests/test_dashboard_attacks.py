"""The page safe to put on a network (issue 20): `synclane dashboard` started as a process of its
own on a free port, attacked over loopback with raw HTTP. Each test names the item it pins."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.cookies import SimpleCookie

import psycopg
import pytest
from dashboard_kit import (
    HERE,
    PageProcess,
    arrange_shop,
    call,
    page_process,
    post_requeue,
    statuses,
    table,
    token_of,
)
from psycopg import sql

from synclane import SyncLane

SECRET = "correct-horse-battery-staple-42"


@pytest.fixture
def shop(app: SyncLane, db: psycopg.Connection) -> dict[str, int]:
    return arrange_shop(app, db)


@pytest.fixture
def page(dsn: str, schema: str, shop: dict[str, int]) -> Iterator[PageProcess]:
    with page_process(dsn, schema) as running:
        yield running


def raw(port: int, request: bytes, timeout: float = 10) -> bytes:
    """Sends `request` as it is and returns everything the server answers: until it closes the
    connection, or (where it keeps it open after an answer with a length) until that answer
    is complete, rather than waiting out the timeout."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(request)
        chunks = []
        while True:
            try:
                chunk = conn.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            chunks.append(chunk)
            if _complete(b"".join(chunks)):
                break
    return b"".join(chunks)


def _complete(answer: bytes) -> bool:
    """Whether `answer` holds a whole response: its head and the body its Content-Length says."""
    head, found, body = answer.partition(b"\r\n\r\n")
    if not found:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return len(body) >= int(value.strip())
    return False


def head_of(answer: bytes) -> tuple[int, dict[str, str]]:
    head = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    status = int(head[0].split()[1])
    headers = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


def assert_secured(headers: dict[str, str]) -> None:
    assert "script-src 'self'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["x-frame-options"] == "DENY"
    assert headers["cache-control"] == "no-store"


# -- item 1: the Host check stays on --------------------------------------------------------


def test_item1_allow_remote_keeps_refusing_a_rebound_host(
    dsn: str, schema: str, db: psycopg.Connection, shop: dict[str, int]
) -> None:
    with page_process(dsn, schema, "--allow-remote") as page:
        evil = f"evil.example:{page.port}"
        answer = call(page, "GET", "/", host=evil)
        assert answer.status == 403 and "synclane-token" not in answer.text
        assert call(page, "GET", "/api/state", host=evil).status == 403
        before = statuses(db, schema)
        token = token_of(page)
        headers = {"Origin": f"http://{evil}"}
        sent = {"Host": evil, **headers}
        body = json.dumps({"queue": "shops", "all": True}).encode()
        request = (
            f"POST /api/requeue HTTP/1.1\r\nHost: {sent['Host']}\r\nOrigin: {sent['Origin']}\r\n"
            f"Content-Type: application/json\r\nX-Synclane-Token: {token}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode() + body
        status, _ = head_of(raw(page.port, request))
        assert status == 403
        assert statuses(db, schema) == before
    with page_process(dsn, schema, "--allow-remote", "--public-host", "dash.example.com") as page:
        assert call(page, "GET", "/api/state", host="dash.example.com").status == 200
        assert call(page, "GET", "/api/state", host=f"evil.example:{page.port}").status == 403


# -- item 2: a credential beyond loopback ---------------------------------------------------


def test_item2_listening_beyond_loopback_without_a_secret_fails_at_start(
    dsn: str, schema: str, shop: dict[str, int]
) -> None:
    done = subprocess.run(
        [
            *(sys.executable, "-m", "synclane.cli", "--dsn", dsn, "dashboard"),
            *("--app", "cli_app:app", "--host", "0.0.0.0", "--allow-remote", "--port", "0"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "SYNCLANE_CLI_TEST_SCHEMA": schema,
            "PYTHONPATH": str(HERE),
            "PATH": "/usr/bin:/bin",
        },
    )
    assert done.returncode == 2
    assert "SYNCLANE_DASHBOARD_SECRET" in done.stderr and len(done.stderr.splitlines()) == 1


def login(page: PageProcess, secret: str) -> tuple[int, str]:
    answer = call(
        page,
        "POST",
        "/api/login",
        json.dumps({"secret": secret}).encode(),
        {"Content-Type": "application/json", "Origin": f"http://127.0.0.1:{page.port}"},
    )
    return answer.status, answer.headers.get("Set-Cookie") or ""


def test_item2_beyond_loopback_everything_needs_the_login(
    dsn: str, schema: str, db: psycopg.Connection, shop: dict[str, int]
) -> None:
    env = {"SYNCLANE_DASHBOARD_SECRET": SECRET}
    args = ("--host", "0.0.0.0", "--allow-remote")
    with page_process(dsn, schema, *args, env=env) as page:
        first = call(page, "GET", "/")
        assert first.status == 303 and first.headers["Location"] == "login"
        assert "synclane-token" not in first.text
        for path in ("/api/state", "/api/jobs", "/api/events", "/app.js"):
            assert call(page, "GET", path).status == 401, path
        assert call(page, "GET", "/login").status == 200
        before = statuses(db, schema)
        refused = post_requeue(page, {"queue": "shops", "all": True}, token="x" * 64)
        assert refused.status == 401

        status, cookie_header = login(page, SECRET)
        assert status == 200
        cookie = SimpleCookie(cookie_header)["synclane_session"]
        assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/"
        session = {"Cookie": f"synclane_session={cookie.value}"}
        assert call(page, "GET", "/api/state", headers=session).status == 200
        token = token_of(page, headers=session)
        # the token alone, without the session, acts on nothing
        assert post_requeue(page, {"queue": "shops", "all": True}, token=token).status == 401
        assert statuses(db, schema) == before
        answer = post_requeue(page, {"queue": "shops", "all": True}, token=token, headers=session)
        assert answer.status == 200 and answer.json()["requeued"] == 3

        # a forged session cookie, and guessing the secret, get nowhere
        forged = {"Cookie": "synclane_session=99999999999.deadbeef"}
        assert call(page, "GET", "/api/state", headers=forged).status == 401
        answers = [login(page, f"guess-number-{n}-is-long")[0] for n in range(7)]
        assert answers[:5] == [403] * 5 and answers[5:] == [429, 429]
        assert login(page, SECRET)[0] == 429  # for a few seconds, even the right one


# -- item 3: bounded, shared, timed out ------------------------------------------------------


def add_accounts(db: psycopg.Connection, schema: str, owners: int, failing: int) -> None:
    """`owners` more accounts with two history slices each (one completed, one pending) and a
    refresh; the first `failing` of them have their pending slice failed for a while."""
    db.execute(
        sql.SQL(
            """
            INSERT INTO {} (queue, owner, lane, type, mode, status, window_start, window_end,
                            dedup_key, processed_count, error, next_run_at)
            SELECT 'shops', 'account-' || n, 'account-' || n, 'orders', s.mode,
                   CASE WHEN s.k = 0 THEN 'completed'
                        WHEN s.k = 1 AND n <= %(failing)s THEN 'failed' ELSE 'pending' END,
                   now() - (s.k + 1) * interval '30 days', now() - s.k * interval '30 days',
                   s.mode || ':' || s.k, 10,
                   CASE WHEN s.k = 1 AND n <= %(failing)s
                        THEN 'RuntimeError: account ' || n || ' said 500' END,
                   now() + interval '1 hour'
            FROM generate_series(1, %(owners)s) AS n,
                 (VALUES (0, 'initial'), (1, 'initial'), (2, 'recurring')) AS s(k, mode)
            """
        ).format(table(schema)),
        {"owners": owners, "failing": failing},
    )
    db.execute(sql.SQL("ANALYZE {}").format(table(schema)))


def test_item3_twenty_thousand_accounts_make_a_small_answer_computed_once_per_interval(
    dsn: str, schema: str, db: psycopg.Connection, shop: dict[str, int]
) -> None:
    add_accounts(db, schema, owners=20_000, failing=5_000)
    with page_process(dsn, schema) as page:
        started = time.monotonic()
        answer = call(page, "GET", "/api/state")
        took = time.monotonic() - started
        assert answer.status == 200
        state = answer.json()
        assert len(answer.text) < 200_000, len(answer.text)
        assert len(state["accounts"]["rows"]) == 50 and state["accounts"]["total"] >= 5_000
        assert len(state["failures"]["rows"]) <= 50 and len(state["lanes"]["rows"]) == 50
        assert len(state["jobs"]) <= 100 and state["stopped_before"] is not None
        assert took < 10, took

        # 200 viewers at once: every one answered, from a few computations
        def ask(_: int) -> tuple[int, str]:
            got = call(page, "GET", "/api/state")
            return got.status, got.json()["now"]

        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=50) as pool:
            answers = list(pool.map(ask, range(200)))
        took = time.monotonic() - started
        assert [status for status, _ in answers] == [200] * 200
        computed = {now for _, now in answers}
        assert len(computed) <= 2 + took / 2, (len(computed), took)


def test_item3_a_statement_that_waits_is_cut_by_the_statement_timeout(
    dsn: str, schema: str, shop: dict[str, int]
) -> None:
    with page_process(dsn, schema) as page, psycopg.connect(dsn) as locker:
        locker.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(table(schema)))
        started = time.monotonic()
        answer = call(page, "GET", "/api/state", timeout=30)
        took = time.monotonic() - started
        assert answer.status == 503 and "too long" in answer.json()["error"]
        assert 4 < took < 15, took
        locker.rollback()
        time.sleep(2.5)  # the failed answer is kept for an interval
        assert call(page, "GET", "/api/state").status == 200


# -- item 4: slow clients ------------------------------------------------------------------


def trickle(port: int, cut: dict[int, float], number: int) -> None:
    """Sends a request head one byte every 2 s; records when the server closed it."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        for byte in b"X-Slow: " + b"a" * 100:
            try:
                conn.sendall(bytes([byte]))
                conn.settimeout(2)
                if conn.recv(1) == b"":
                    break
            except TimeoutError:
                continue
            except OSError:
                break
            if time.monotonic() - started > 40:
                return
    cut[number] = time.monotonic() - started


def test_item4_a_client_trickling_its_request_is_cut_off_and_holds_no_thread(
    page: PageProcess,
) -> None:
    cut: dict[int, float] = {}
    slow = [threading.Thread(target=trickle, args=(page.port, cut, n)) for n in range(20)]
    for thread in slow:
        thread.start()
    time.sleep(3)
    started = time.monotonic()
    assert call(page, "GET", "/api/state").status == 200  # 20 slow clients hold no thread
    assert time.monotonic() - started < 5
    for thread in slow:
        thread.join(60)
    assert len(cut) == 20, "every slow client was cut off"
    assert max(cut.values()) < 25, cut


def dribble(port: int, stop: threading.Event) -> None:
    """Sends a request one byte at a time, a byte every 0.2 s, until told to stop or cut off."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        for byte in b"GET /api/state HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Slow: " + b"a" * 500:
            if stop.wait(0.2):
                return
            try:
                conn.sendall(bytes([byte]))
            except OSError:
                return


def test_the_page_answers_others_while_clients_dribble_and_idle(page: PageProcess) -> None:
    """Issue 27: five clients sending a request one byte at a time and a hundred connections
    opened and left idle filled the page's connection limit; waitress then stopped accepting,
    and GET /api/state waited 9.6 s for the idle ones to time out. At the limit, the page closes
    the longest idle connection (then the slowest request still arriving) instead: never the
    one just accepted, so thirty dribbling clients cannot shut a newcomer out either."""
    stop = threading.Event()
    dribblers = [threading.Thread(target=dribble, args=(page.port, stop)) for _ in range(30)]
    for thread in dribblers:
        thread.start()
    idle = [socket.create_connection(("127.0.0.1", page.port), timeout=5) for _ in range(100)]
    try:
        time.sleep(1.0)
        for _ in range(3):
            started = time.monotonic()
            assert call(page, "GET", "/api/state", timeout=15).status == 200
            took = time.monotonic() - started
            assert took < 2, f"GET /api/state took {took:.1f} s beside slow clients"
    finally:
        stop.set()
        for conn in idle:
            conn.close()
        for thread in dribblers:
            thread.join(10)


# -- item 5: every answer is guarded -------------------------------------------------------


@pytest.mark.parametrize("method", ["OPTIONS", "HEAD", "PUT", "DELETE", "PATCH", "TRACE"])
def test_item5_every_method_gets_the_headers_and_the_host_check(
    page: PageProcess, method: str
) -> None:
    for path in ("/", "/api/state", "/api/requeue", "/nowhere"):
        mine = head_of(
            raw(
                page.port,
                f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{page.port}"
                "\r\nConnection: close\r\n\r\n".encode(),
            )
        )
        assert_secured(mine[1])
        assert "access-control-allow-origin" not in mine[1]
        if method == "HEAD" and path in ("/", "/api/state"):
            assert mine[0] == 200
        else:
            assert mine[0] in (404, 405), (method, path, mine[0])
        evil = head_of(
            raw(
                page.port,
                f"{method} {path} HTTP/1.1\r\nHost: evil.example\r\n"
                "Connection: close\r\n\r\n".encode(),
            )
        )
        assert evil[0] == 403
        assert_secured(evil[1])


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"GET /?" + b"x=1&" * 1000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        + b"".join(b"X-H%d: v\r\n" % n for n in range(100))
        + b"\r\n",
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"b" * 20_000 + b"\r\n\r\n",
        b"NONSENSE\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: gzip\r\n\r\n",
    ],
    ids=["long path", "long query", "100 headers", "huge header", "garbage", "bad encoding"],
)
def test_item5_oversized_and_malformed_requests_get_the_same_headers(
    page: PageProcess, request_bytes: bytes
) -> None:
    request = request_bytes.replace(b"127.0.0.1\r\n", b"127.0.0.1:%d\r\n" % page.port, 1)
    status, headers = head_of(raw(page.port, request))
    assert 400 <= status < 500 or status == 501, status  # 501: an encoding it does not speak
    assert_secured(headers)
    assert headers["server"] == "synclane-dashboard"


# -- item 6: deep JSON, reads from another origin --------------------------------------------


def test_item6_json_nested_thirty_thousand_deep_gets_a_clear_400(
    page: PageProcess, db: psycopg.Connection, schema: str
) -> None:
    before = statuses(db, schema)
    token = token_of(page)
    body = b"[" * 30_000 + b"]" * 30_000
    headers = {"Content-Type": "application/json", "X-Synclane-Token": token}
    answer = call(page, "POST", "/api/requeue", body, headers)
    assert answer.status == 400 and "nests too deeply" in answer.json()["error"]
    assert statuses(db, schema) == before


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
    ],
)
@pytest.mark.parametrize("path", ["/api/state", "/api/jobs", "/api/accounts", "/api/events"])
def test_item6_reads_from_another_origin_are_refused(
    page: PageProcess, headers: dict[str, str], path: str
) -> None:
    answer = call(page, "GET", path, headers=headers)
    assert answer.status == 403 and "error" in answer.json()


def test_a_page_process_stops_cleanly_on_ctrl_c(page: PageProcess) -> None:
    assert call(page, "GET", "/api/state").status == 200
    assert page.stop() == 130, "interrupted, as the README's exit statuses say"
    assert "Traceback" not in page.stderr


def test_synclane_dashboard_serves_metrics_only_with_its_flag(
    dsn: str, schema: str, shop: dict[str, int]
) -> None:
    with page_process(dsn, schema) as plain:
        status, _ = head_of(raw(plain.port, get_request("/metrics", plain.port)))
        assert status == 404
    with page_process(dsn, schema, "--metrics") as scraped:
        answer = raw(scraped.port, get_request("/metrics", scraped.port))
        status, headers = head_of(answer)
        assert status == 200 and headers["content-type"].startswith("text/plain")
        assert b'synclane_open_jobs{queue="shops",status="pending"}' in answer


def get_request(path: str, port: int) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode()
