"""What the dashboard's tests share: a shop arranged with jobs in every state, a page server
on a free port (in a thread, or as a `synclane dashboard` process), and an HTTP client that
sends exactly the headers it is given."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import psycopg
from apps import done
from psycopg import sql
from workers import arrange

from synclane import Owner, SyncLane
from synclane.dashboard import DashboardServer, make_server

HERE = Path(__file__).parent
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
    # failed, its retry an hour off: it waits for a human as much as a deferred job
    arrange(db, app.schema, ids["failed"], status="failed", error=SCRIPT_ERROR, attempt_count=2)
    db.execute(
        sql.SQL("UPDATE {} SET next_run_at = now() + interval '1 hour' WHERE id = %s").format(
            table(app.schema)
        ),
        [ids["failed"]],
    )
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


def statuses(db: psycopg.Connection, schema: str) -> dict[int, str]:
    query = sql.SQL("SELECT id, status FROM {}").format(table(schema))
    return dict(db.execute(query).fetchall())


# -- a running server and a client that sends exactly the headers given -----------------------


def start(app: SyncLane, **options: Any) -> DashboardServer:
    """The page of `app` served from a thread of this process, on a free port."""
    server = make_server(app, port=0, **options)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server


def stop(server: DashboardServer) -> None:
    server.shutdown()
    server.server_close()


class Served(Protocol):
    """A page listening on loopback: a server of this process, or a PageProcess."""

    @property
    def port(self) -> int: ...


class PageProcess:
    """`synclane dashboard` for tests/cli_app.py as a process of its own, on a free port: what a
    user runs, attacked from outside."""

    def __init__(self, dsn: str, schema: str, *args: str, env: dict[str, str] | None = None):
        environment = {
            **os.environ,
            "SYNCLANE_CLI_TEST_SCHEMA": schema,
            "PYTHONPATH": str(HERE),
            **(env or {}),
        }
        command = [sys.executable, "-m", "synclane.cli", "--dsn", dsn, "dashboard"]
        self.process = subprocess.Popen(
            [*command, "--app", "cli_app:app", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environment,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("synclane dashboard on "):
            self.stop()
            raise AssertionError(f"the page did not start: {line}{self.stderr}")
        self.url = line.split()[3]
        self.port = int(self.url.rstrip("/").rsplit(":", 1)[1])
        self.stderr = ""

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
        _, self.stderr = self.process.communicate(timeout=10)
        return self.process.returncode


@contextmanager
def page_process(dsn: str, schema: str, *args: str, **options: Any) -> Iterator[PageProcess]:
    page = PageProcess(dsn, schema, *args, **options)
    try:
        yield page
    finally:
        page.stop()


class Answer:
    def __init__(self, response: http.client.HTTPResponse) -> None:
        self.status = response.status
        self.headers = response.headers
        self.text = response.read().decode()

    def json(self) -> Any:
        return json.loads(self.text)


def call(
    server: Served,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    host: str | None = "default",
    timeout: float = 10,
) -> Answer:
    """One request; Host is the server's own address unless given (None: no Host at all)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
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


def token_of(server: Served, headers: dict[str, str] | None = None) -> str:
    page = call(server, "GET", "/", headers=headers)
    found = re.search(r'<meta name="synclane-token" content="([^"]+)">', page.text)
    assert found is not None
    return found.group(1)


def post_requeue(
    server: Served,
    body: dict[str, Any],
    *,
    token: str | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    """A requeue as the page sends it, with changes given in `headers` (a None value drops one)."""
    return post_change(server, "/api/requeue", body, token=token, headers=headers)


def post_change(
    server: Served,
    path: str,
    body: Any,
    *,
    token: str | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    """A change (requeue, pause, resume) as the page sends it, with changes given in `headers`
    (a None value drops one)."""
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
    return call(server, "POST", path, json.dumps(body).encode(), sent)
