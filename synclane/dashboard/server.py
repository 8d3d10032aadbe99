"""The page's own web server: waitress, serving synclane.dashboard.web.

waitress reads requests and writes answers on one event loop and runs the application on a
few threads, so a slow client holds a socket, never a thread. On top of its limits (headers,
body, connections, idle time) this server bounds a request's whole time: a client that has
not finished sending its request, or reading its answer, `request_timeout` seconds after it
began is cut off, however steadily it trickles bytes. waitress's own error answers (a
malformed request, headers too large) carry the page's security headers too.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from waitress import wasyncore
from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.server import TcpWSGIServer
from waitress.task import ErrorTask

from synclane.app import SyncLane
from synclane.dashboard.guard import SECURITY_HEADERS, check_login_secret, is_loopback
from synclane.dashboard.request import MAX_BODY
from synclane.dashboard.web import Dashboard
from synclane.events import EventLog
from synclane.model import ConfigError

log = logging.getLogger("synclane.dashboard")

MAX_HEAD = 16 * 1024  # the request line and headers together
# A request still arriving after this many seconds is slow: at the connection limit, it may be
# closed to make room.
SLOW_REQUEST = 1.0


class _ErrorAnswer(ErrorTask):
    """waitress's answer to a request it could not read, in the page's form."""

    def execute(self) -> None:
        error: Any = getattr(self.request, "error", None)
        code, reason = getattr(error, "code", 400), str(getattr(error, "reason", "Bad Request"))
        body = json.dumps({"error": reason.lower()}).encode()
        self.status = f"{code} {reason}"
        self.response_headers = [
            *self.response_headers,
            ("Content-Type", "application/json; charset=utf-8"),
            *SECURITY_HEADERS,
        ]
        self.set_close_on_finish()
        self.content_length = len(body)
        self.write(body)


class _Channel(HTTPChannel):
    """A connection that remembers when its current request began."""

    error_task_class = _ErrorAnswer
    began = 0.0

    def received(self, data: bytes) -> bool:
        if self.request is None and data:
            self.began = time.monotonic()
        return bool(super().received(data))


class _Server(TcpWSGIServer):
    channel_class = _Channel
    request_timeout = 10.0
    # The page's connection limit. waitress is given a far higher one: at its own limit it stops
    # accepting, and then a hundred connections left idle kept every new client waiting until
    # they timed out. This server accepts and makes room instead (`_make_room`).
    connection_limit = 100

    def handle_accept(self) -> None:
        super().handle_accept()
        self._make_room()

    def _make_room(self) -> None:
        """Over the connection limit, close the connections that hold a socket and no work:
        idle ones first, longest idle first, then those whose request has been arriving for
        over a second (a client that sends its request in one go needs milliseconds), the
        slowest first. A request being answered is never cut here. (No share per address: behind
        a proxy every viewer comes from one.)"""
        channels: dict[int, Any] = getattr(self, "active_channels", {})
        _close_some(list(channels.values()), len(channels) - self.connection_limit)

    def maintenance(self, now: Any) -> None:
        """waitress closes connections idle for `channel_timeout`; this also closes those
        whose request (reading it, running it, or writing its answer) began too long ago."""
        super().maintenance(now)
        cutoff = time.monotonic() - self.request_timeout
        channels: dict[int, Any] = getattr(self, "active_channels", {})
        for channel in list(channels.values()):
            busy = channel.request is not None or channel.requests or channel.total_outbufs_len
            if busy and channel.began < cutoff:
                channel.will_close = True


def _close_some(channels: list[Any], excess: int) -> None:
    """Close up to `excess` of these connections, those that cost least to lose first: the
    longest idle, then the longest arriving, and the one just accepted last of all (it is idle
    too, but it has had no chance yet)."""
    if excess <= 0:
        return
    newest = max(channels, key=lambda c: c.creation_time)
    others = [c for c in channels if c is not newest]
    idle = [c for c in others if c.request is None and not c.requests and not c.total_outbufs_len]
    slow = time.monotonic() - SLOW_REQUEST
    arriving = [c for c in others if c.request is not None and not c.requests and c.began < slow]
    victims = sorted(idle, key=lambda c: c.last_activity) + sorted(arriving, key=lambda c: c.began)
    if newest.request is None and not newest.requests:
        victims.append(newest)
    for channel in victims[:excess]:
        channel.handle_close()


class DashboardServer:
    """The page's server, bound and listening. `url` is where to open it; `serve_forever()`
    serves until `shutdown()` (from another thread) or Ctrl-C; `server_close()` frees the port
    and the page's database connections."""

    def __init__(
        self,
        dashboard: Dashboard,
        host: str,
        port: int,
        *,
        request_timeout: float,
        connection_limit: int,
        threads: int,
    ) -> None:
        self.dashboard = dashboard
        self.host = host
        self._map: dict[int, Any] = {}
        name = host.strip("[]")
        family = socket.AF_INET6 if ":" in name else socket.AF_INET
        adjustments = Adjustments(
            threads=threads,
            connection_limit=connection_limit * 10,  # a backstop; _Server keeps the limit
            channel_timeout=request_timeout,
            cleanup_interval=min(1.0, request_timeout / 4),
            max_request_header_size=MAX_HEAD,
            max_request_body_size=MAX_BODY,
            ident="synclane-dashboard",
            # The page refuses forwarded requests unless told to trust a proxy: it must see them.
            clear_untrusted_proxy_headers=False,
            asyncore_use_poll=True,
            expose_tracebacks=False,
        )
        server_class = type(
            "_BoundServer",
            (_Server,),
            {"request_timeout": request_timeout, "connection_limit": connection_limit},
        )
        self._server = server_class(
            dashboard,
            map=self._map,
            adj=adjustments,
            sockinfo=(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, (name, port)),
        )
        self.socket = self._server.socket
        self.port = int(self._server.effective_port)
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()

    @property
    def url(self) -> str:
        host = self.host.strip("[]")
        if host in ("", "0.0.0.0", "::"):
            host = "127.0.0.1"
        elif ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}/"

    @property
    def token(self) -> str:
        return self.dashboard.token

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self._stopped.clear()
        try:
            while not self._stop.is_set() and self._map:
                wasyncore.loop(timeout=poll_interval, map=self._map, use_poll=True, count=1)
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop `serve_forever` (running in another thread) and wait until it returned."""
        self._stop.set()
        self._server.pull_trigger()
        self._stopped.wait(10)

    def server_close(self) -> None:
        self._server.task_dispatcher.shutdown(timeout=2)
        wasyncore.close_all(self._map)
        self.dashboard.close()


def make_server(
    app: SyncLane,
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    allow_remote: bool = False,
    trust_proxy: bool = False,
    public_hosts: Sequence[str] = (),
    login_secret: str | None = None,
    events: EventLog | None = None,
    interval: float = 2.0,
    statement_timeout: float = 5.0,
    request_timeout: float = 10.0,
    connection_limit: int = 100,
    threads: int = 4,
    metrics: bool = False,
) -> DashboardServer:
    """A bound server for the page of `app`; call `serve_forever()` on it (port 0 picks a free
    port: see `.port` and `.url`). A host other machines can reach needs `allow_remote=True`
    and a `login_secret`. `metrics=True` also serves the table's gauges at /metrics, for
    Prometheus, without the login."""
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ConfigError(f"port={port!r} must be a whole number from 0 to 65535, e.g. --port 8080")
    if not isinstance(host, str):
        raise ConfigError(f"host must be a str such as '127.0.0.1', got {host!r}")
    for name, value, low in (
        ("request_timeout", request_timeout, 0.5),
        ("connection_limit", connection_limit, 1),
        ("threads", threads, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int | float) or value < low:
            raise ConfigError(f"{name}={value!r} must be a number >= {low}")
    local = is_loopback(host)
    if not local and not allow_remote:
        raise ConfigError(
            f"the dashboard would listen on {host or 'every address'!r}, which other machines "
            "can reach, and it can requeue jobs and pause queues. Keep the default 127.0.0.1, "
            "or pass --allow-remote (allow_remote=True) with a login secret, ideally behind a "
            "proxy that terminates TLS"
        )
    secret = check_login_secret(login_secret)
    if not local and secret is None:
        raise ConfigError(
            f"the dashboard would listen on {host or 'every address'!r}, which other machines "
            "can reach: set a login secret of at least 16 characters in "
            "SYNCLANE_DASHBOARD_SECRET (login_secret=...), e.g. python -c "
            "'import secrets; print(secrets.token_urlsafe(24))'"
        )
    dashboard = Dashboard(
        app,
        public_hosts=public_hosts,
        login_secret=secret,
        trust_proxy=trust_proxy,
        events=events,
        interval=interval,
        statement_timeout=statement_timeout,
        metrics=metrics,
        bound_host=host,
        local_only=not allow_remote,
    )
    try:
        server = DashboardServer(
            dashboard,
            host,
            port,
            request_timeout=float(request_timeout),
            connection_limit=int(connection_limit),
            threads=int(threads),
        )
    except OSError as error:
        dashboard.close()
        reason = error.strerror or str(error)
        raise ConfigError(
            f"the dashboard cannot listen on {host}:{port}: {reason}; choose another --port"
        ) from None
    dashboard.port = str(server.port)
    return server


def serve(
    app: SyncLane,
    host: str = "127.0.0.1",
    port: int = 8080,
    allow_remote: bool = False,
    trust_proxy: bool = False,
    on_ready: Callable[[str], None] | None = None,
    **options: Any,
) -> None:
    """Serve the page of `app` until Ctrl-C (KeyboardInterrupt), then close the server.
    `on_ready` receives the page's URL once it listens; `options` are make_server's."""
    server = make_server(
        app, host, port, allow_remote=allow_remote, trust_proxy=trust_proxy, **options
    )
    log.info("dashboard on %s", server.url)
    try:
        if on_ready is not None:
            on_ready(server.url)
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
