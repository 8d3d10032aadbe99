"""The dashboard: one page showing lanes, jobs, progress and failures, with Requeue buttons.

Standard library only (`http.server`). It listens on loopback by default and trusts nobody else:
requests that came through a proxy are refused unless `trust_proxy`, the Host header must name
this server (DNS rebinding), and a requeue needs the page's per-server token in a header, a JSON
body and a same-origin request. The page builds the DOM with `textContent`, so every value shows
as text, and nothing it receives contains the DSN.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import math
import numbers
import secrets
import socket
import socketserver
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import psycopg

from synclane.app import REQUEUE_STATUSES, DatabaseUnavailable, SyncLane
from synclane.errors import SchemaError
from synclane.model import ConfigError

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger("synclane.dashboard")

# The page lists the newest jobs, plus every running or stopped one however old.
JOBS_SHOWN = 300
OPEN_SHOWN = ("running", *REQUEUE_STATUSES)
MAX_BODY = 64 * 1024
TOKEN_HEADER = "X-Synclane-Token"
# A proxy on loopback makes every client look local: requests that name one are refused unless
# the proxy is trusted (and then the proxy must authenticate).
FORWARDING_HEADERS = ("X-Forwarded-For", "Forwarded", "X-Real-IP", "X-Forwarded-Host")
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-store",
}
DATABASE_ERRORS = (DatabaseUnavailable, SchemaError, psycopg.Error, OSError)
DATABASE_DOWN = "the database is not answering; the page keeps trying"


class Refused(Exception):
    """A request the dashboard will not serve: the status and a message for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# -- the state the page shows ---------------------------------------------------------------


def state(app: SyncLane, hide: Iterable[str] = ()) -> dict[str, Any]:
    """Everything the page shows, as JSON-ready values: ISO timestamps, null for missing values,
    and every text in `hide` (the DSN, its password) replaced by `***`."""
    hidden = [text for text in hide if text]
    queues = list(app.queues)
    # The page shortens long errors itself and shows the full text on demand.
    recent = _records(app.jobs(limit=JOBS_SHOWN, full_errors=True), hidden)
    still_open = _records(
        app.jobs(status=list(OPEN_SHOWN), limit=JOBS_SHOWN, full_errors=True), hidden
    )
    by_id = {job["id"]: job for job in [*recent, *still_open]}
    progress = [
        {"queue": name, **row} for name in queues for row in _records(app.progress(name), hidden)
    ]
    return {
        "now": datetime.now(UTC).isoformat(),
        "schema": app.schema,
        "queues": queues,
        "requeue_statuses": list(REQUEUE_STATUSES),
        "jobs_shown": JOBS_SHOWN,
        "lanes": _records(app.lanes(), hidden),
        "jobs": [by_id[key] for key in sorted(by_id, reverse=True)],
        "progress": progress,
        "failures": _records(app.failures(), hidden),
    }


# Columns the page has no use for; the lease token is a write guard, not for display.
_SKIPPED = ("lease_token", "dedup_key", "priority")


def _records(frame: pd.DataFrame, hidden: list[str]) -> list[dict[str, Any]]:
    return [
        {str(key): _plain(value, hidden) for key, value in row.items() if key not in _SKIPPED}
        for row in frame.to_dict(orient="records")
    ]


def _plain(value: Any, hidden: list[str]) -> Any:
    """One DataFrame cell as a JSON value."""
    import pandas as pd

    if value is None:
        return None
    if isinstance(value, str):
        for text in hidden:
            value = value.replace(text, "***")
        return value
    if isinstance(value, list | tuple):
        return [_plain(item, hidden) for item in value]
    if pd.isna(value):
        return None
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else None
    return _plain(str(value), hidden)


def _secrets_of(dsn: str) -> list[str]:
    """The texts that must never reach the page: the DSN, and its password when it has one
    long enough that hiding it cannot garble ordinary words."""
    found = [dsn]
    try:
        password = psycopg.conninfo.conninfo_to_dict(dsn).get("password")
    except psycopg.Error:
        password = None
    if isinstance(password, str) and len(password) >= 4:
        found.append(password)
    return found


# -- the server ------------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    """Whether `host` names only this machine: localhost, 127.0.0.0/8 or ::1."""
    name = host.strip().strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(name, None)
    except OSError:
        return False
    addresses = {str(info[4][0]).split("%")[0] for info in infos}
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


class DashboardServer(ThreadingHTTPServer):
    """The page's HTTP server. `url` is where to open it."""

    daemon_threads = True

    def __init__(
        self, app: SyncLane, host: str, port: int, *, allow_remote: bool, trust_proxy: bool
    ) -> None:
        self.app = app
        self.allow_remote = allow_remote
        self.trust_proxy = trust_proxy
        # A fresh random token per server: only a page this server rendered can requeue.
        self.token = secrets.token_urlsafe(32)
        self.hidden = _secrets_of(app.dsn)
        self.host = host
        if ":" in host.strip("[]"):
            self.address_family = socket.AF_INET6
        super().__init__((host.strip("[]"), port), DashboardHandler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks the host name up with getfqdn, which can hang without DNS.
        socketserver.TCPServer.server_bind(self)
        self.server_name = self.host
        self.server_port = self.port

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        host = self.host.strip("[]")
        if host in ("", "0.0.0.0", "::"):
            host = "127.0.0.1"
        elif ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}/"

    def host_allowed(self, header: str | None) -> bool:
        """Whether a Host header names this server, so that a page of another site whose name
        was made to resolve to 127.0.0.1 (DNS rebinding) cannot read or act."""
        if not header:
            return False
        value = header.strip().lower()
        if value.startswith("["):  # an IPv6 literal, e.g. [::1]:8080
            name, bracket, rest = value.partition("]")
            name += bracket
            if rest and not rest.startswith(":"):
                return False
            port = rest[1:]
        else:
            name, _, port = value.partition(":")
        if port and port != str(self.port):
            return False
        bound = self.host.strip("[]").lower()
        names = {*LOOPBACK_NAMES, f"[{bound}]" if ":" in bound else bound}
        return name in names


def make_server(
    app: SyncLane,
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    allow_remote: bool = False,
    trust_proxy: bool = False,
) -> DashboardServer:
    """A bound server for the page of `app`; call `serve_forever()` on it (port 0 picks a free
    port: see `.port` and `.url`). A host other machines can reach needs `allow_remote=True`."""
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ConfigError(f"port={port!r} must be a whole number from 0 to 65535, e.g. --port 8080")
    if not isinstance(host, str):
        raise ConfigError(f"host must be a str such as '127.0.0.1', got {host!r}")
    if not allow_remote and not is_loopback(host):
        raise ConfigError(
            f"the dashboard would listen on {host or 'every address'!r}, which other machines "
            "can reach; it has no login and can requeue jobs. Keep the default 127.0.0.1, or "
            "pass --allow-remote (allow_remote=True) and put a proxy that authenticates in front "
            "of it"
        )
    try:
        return DashboardServer(app, host, port, allow_remote=allow_remote, trust_proxy=trust_proxy)
    except OSError as error:
        reason = error.strerror or str(error)
        raise ConfigError(
            f"the dashboard cannot listen on {host}:{port}: {reason}; choose another --port"
        ) from None


def serve(
    app: SyncLane,
    host: str = "127.0.0.1",
    port: int = 8080,
    allow_remote: bool = False,
    trust_proxy: bool = False,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve the page of `app` until Ctrl-C (KeyboardInterrupt), then close the server.
    `on_ready` receives the page's URL once it listens."""
    server = make_server(app, host, port, allow_remote=allow_remote, trust_proxy=trust_proxy)
    log.info("dashboard on %s", server.url)
    if on_ready is not None:
        on_ready(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


class DashboardHandler(BaseHTTPRequestHandler):
    server: DashboardServer
    server_version = "synclane-dashboard"
    # An idle connection holds a thread; let it go after this many seconds.
    timeout = 15

    def do_GET(self) -> None:
        self._dispatch(GET_ROUTES)

    def do_POST(self) -> None:
        self._dispatch(POST_ROUTES)

    def version_string(self) -> str:
        return self.server_version  # no Python version for strangers

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _dispatch(self, routes: dict[str, Callable[[DashboardHandler], None]]) -> None:
        path = urlsplit(self.path).path
        try:
            self._refuse_strangers()
            route = routes.get(path)
            if route is None:
                known = path in GET_ROUTES or path in POST_ROUTES
                raise Refused(405 if known else 404, "method not allowed" if known else "no page")
            route(self)
        except Refused as refused:
            self._send_json(refused.status, {"error": refused.message})
        except ConnectionError:
            pass  # the client went away
        except Exception:
            log.exception("dashboard: %s %s failed", self.command, path)
            self._send_json(500, {"error": "internal error; the server's log has the details"})

    # -- checks ----------------------------------------------------------------------------

    def _refuse_strangers(self) -> None:
        """Refuse what came through an untrusted proxy, and what names another host."""
        server = self.server
        if not server.trust_proxy:
            for header in FORWARDING_HEADERS:
                if header in self.headers:
                    raise Refused(
                        403,
                        f"refused: the request carries {header}, so it came through a proxy. "
                        "Behind a proxy start the dashboard with --trust-proxy, and let the "
                        "proxy authenticate",
                    )
        if not server.allow_remote:
            if not is_loopback(str(self.client_address[0])):
                raise Refused(403, "refused: the dashboard serves this machine only")
            if not server.host_allowed(self.headers.get("Host")):
                raise Refused(
                    403,
                    f"refused: the Host header does not name this server; open {server.url}",
                )

    def _refuse_cross_site(self) -> None:
        """A browser says where a request comes from: only this page's own origin may act."""
        site = self.headers.get("Sec-Fetch-Site")
        if site is not None and site not in ("same-origin", "none"):
            raise Refused(403, f"refused: a {site} request")
        origin = self.headers.get("Origin")
        if origin is not None and not self._same_origin(origin):
            raise Refused(403, "refused: the request comes from another origin")

    def _same_origin(self, origin: str) -> bool:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return False
        hosts = [self.headers.get("Host")]
        if self.server.trust_proxy:
            hosts.append(self.headers.get("X-Forwarded-Host"))
        return any(
            host is not None and parts.netloc.lower() == host.split(",")[0].strip().lower()
            for host in hosts
        )

    # -- routes ----------------------------------------------------------------------------

    def page(self) -> None:
        html = PAGE.replace("{{token}}", self.server.token)
        self._send(200, "text/html; charset=utf-8", html.encode())

    def script(self) -> None:
        self._send(200, "text/javascript; charset=utf-8", SCRIPT.encode())

    def stylesheet(self) -> None:
        self._send(200, "text/css; charset=utf-8", STYLE.encode())

    def icon(self) -> None:
        self._send(204, "image/x-icon", b"")

    def api_state(self) -> None:
        site = self.headers.get("Sec-Fetch-Site")
        if site is not None and site not in ("same-origin", "none"):
            raise Refused(403, f"refused: a {site} request")
        try:
            body = state(self.server.app, self.server.hidden)
        except SchemaError as error:
            log.warning("dashboard: %s", error)
            raise Refused(503, str(error)) from None
        except DATABASE_ERRORS as error:
            log.warning("dashboard: cannot read the jobs: %s", type(error).__name__)
            raise Refused(503, DATABASE_DOWN) from None
        self._send_json(200, body)

    def api_requeue(self) -> None:
        self._refuse_cross_site()
        kind = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if kind != "application/json":
            raise Refused(415, "send the request as Content-Type: application/json")
        sent = self.headers.get(TOKEN_HEADER) or ""
        if not hmac.compare_digest(sent.encode(), self.server.token.encode()):
            raise Refused(403, f"refused: {TOKEN_HEADER} is missing or wrong; reload the page")
        request = self._read_json()
        queue, selection = _requeue_request(request)
        try:
            count = self.server.app.requeue(queue, **selection)
        except ConfigError as error:
            raise Refused(400, str(error)) from None
        except DATABASE_ERRORS as error:
            log.warning("dashboard: requeue failed: %s", type(error).__name__)
            raise Refused(503, DATABASE_DOWN) from None
        log.info("dashboard: requeued %d job(s) in %s (%s)", count, queue, selection)
        self._send_json(200, {"requeued": count})

    # -- bodies ----------------------------------------------------------------------------

    def _read_json(self) -> Any:
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            raise Refused(411, "send a Content-Length")
        try:
            length = int(length_header)
        except ValueError:
            raise Refused(400, "Content-Length is not a number") from None
        if not 0 <= length <= MAX_BODY:
            raise Refused(413, f"the body may hold at most {MAX_BODY} bytes")
        try:
            return json.loads(self.rfile.read(length))
        except (ValueError, UnicodeDecodeError):
            raise Refused(400, "the body is not JSON") from None

    def _send_json(self, status: int, body: Any) -> None:
        data = json.dumps(body, allow_nan=False, separators=(",", ":")).encode()
        self._send(status, "application/json; charset=utf-8", data)

    def _send(self, status: int, content_type: str, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in SECURITY_HEADERS.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


def _requeue_request(request: Any) -> tuple[str, dict[str, Any]]:
    """`{"queue": q}` with exactly one of `job` (an id), `owner`, `cause` or `all: true`; `type`
    may narrow `owner`, `cause` and `all`. Returns the queue and requeue()'s other arguments."""
    if not isinstance(request, dict):
        raise Refused(400, 'send a JSON object such as {"queue": "shops", "job": 12}')
    known = {"queue", "job", "owner", "cause", "all", "type"}
    unknown = sorted(set(request) - known)
    if unknown:
        raise Refused(400, f"unknown field(s) {', '.join(unknown)}; use {', '.join(sorted(known))}")
    queue = request.get("queue")
    if not isinstance(queue, str) or not queue:
        raise Refused(400, 'name the queue: {"queue": "shops", ...}')
    chosen = [key for key in ("job", "owner", "cause", "all") if key in request]
    if len(chosen) != 1:
        raise Refused(400, "say what to requeue with exactly one of job, owner, cause or all")
    selection: dict[str, Any] = {}
    kind = request.get("type")
    if kind is not None:
        if not isinstance(kind, str) or chosen[0] == "job":
            raise Refused(400, "type must be a type name, and goes with owner, cause or all")
        selection["type"] = kind
    value = request[chosen[0]]
    if chosen[0] == "job":
        if not isinstance(value, int) or isinstance(value, bool):
            raise Refused(400, "job must be a job id (a whole number)")
        selection["ids"] = [value]
    elif chosen[0] == "all":
        if value is not True:
            raise Refused(400, "all must be true")
    else:
        if not isinstance(value, str) or not value:
            raise Refused(400, f"{chosen[0]} must be a non-empty string")
        selection[chosen[0]] = value
    return queue, selection


GET_ROUTES: dict[str, Callable[[DashboardHandler], None]] = {
    "/": DashboardHandler.page,
    "/app.js": DashboardHandler.script,
    "/app.css": DashboardHandler.stylesheet,
    "/favicon.ico": DashboardHandler.icon,
    "/api/state": DashboardHandler.api_state,
}
POST_ROUTES: dict[str, Callable[[DashboardHandler], None]] = {
    "/api/requeue": DashboardHandler.api_requeue,
}


# -- the page ---------------------------------------------------------------------------------
# Static: the only value the server puts into it is its own token. Everything else arrives as
# JSON and is shown with textContent by app.js.

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="synclane-token" content="{{token}}">
<title>synclane</title>
<link rel="stylesheet" href="/app.css">
<script src="/app.js" defer></script>
</head>
<body>
<header>
  <h1>synclane</h1>
  <span id="meta">loading…</span>
  <span id="health" class="health">connecting</span>
</header>
<div id="notice" role="status" hidden></div>
<main>
  <section id="lanes">
    <h2>Lanes</h2>
    <p class="hint">One job at a time per lane: what each lane runs now, and what waits.</p>
    <table>
      <thead><tr><th>queue</th><th>lane</th><th>running</th><th>window</th><th>cursor</th>
        <th>records</th><th>held by</th><th>since</th><th>lease ends</th><th>waiting</th>
        <th>next due</th></tr></thead>
      <tbody></tbody>
    </table>
    <p class="empty" hidden>No lane has open jobs.</p>
  </section>
  <section id="progress">
    <h2>Progress per account</h2>
    <p class="hint">The first load of each account's history, in slices.</p>
    <table>
      <thead><tr><th>account</th><th>queue</th><th>type</th><th>slices</th><th></th>
        <th>failed</th><th>records</th><th>coverage</th><th></th></tr></thead>
      <tbody></tbody>
    </table>
    <p class="empty" hidden>No account has jobs yet.</p>
  </section>
  <section id="failures">
    <h2>Failures by cause</h2>
    <p class="hint">Failed, deferred and abandoned jobs, grouped by their error with numbers
      masked. Requeue once the cause is fixed: each job continues from its saved cursor.</p>
    <p><button type="button" id="requeue-all" class="requeue">Requeue all stopped jobs</button></p>
    <table>
      <thead><tr><th>cause</th><th>queue</th><th>type</th><th>jobs</th><th>accounts</th>
        <th>statuses</th><th>first seen</th><th>last seen</th><th>example</th><th></th></tr></thead>
      <tbody></tbody>
    </table>
    <p class="empty" hidden>Nothing is failing.</p>
  </section>
  <section id="jobs">
    <h2>Jobs</h2>
    <p class="filters">
      <label>status <select id="status-filter"><option value="">all</option></select></label>
      <label>account <select id="owner-filter"><option value="">all</option></select></label>
      <span id="jobs-count"></span>
    </p>
    <table>
      <thead><tr><th>id</th><th>status</th><th>account</th><th>lane</th><th>type</th>
        <th>window</th><th>cursor</th><th>records</th><th>attempts</th><th>next run</th>
        <th>error</th><th></th></tr></thead>
      <tbody></tbody>
    </table>
  </section>
</main>
</body>
</html>
"""

STYLE = """
:root { --fg: #1d2330; --muted: #667085; --line: #e4e7ec; --bg: #f7f8fa; --accent: #2f5bd3;
  --ok: #1a7f37; --warn: #9a6700; --bad: #b42318; font: 14px/1.4 system-ui, sans-serif; }
body { margin: 0; color: var(--fg); background: var(--bg); }
header { display: flex; gap: 1rem; align-items: baseline; padding: .75rem 1.25rem;
  background: #fff; border-bottom: 1px solid var(--line); position: sticky; top: 0; z-index: 1; }
h1 { font-size: 1.2rem; margin: 0; }
h2 { font-size: 1.05rem; margin: 0 0 .25rem; }
#meta { color: var(--muted); }
.health { margin-left: auto; font-weight: 600; color: var(--ok); }
.health.down { color: var(--bad); }
main { padding: 0 1.25rem 2rem; }
section { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: .75rem 1rem;
  margin-top: 1rem; overflow-x: auto; }
.hint, .empty, #jobs-count { color: var(--muted); margin: 0 0 .5rem; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .3rem .5rem; border-bottom: 1px solid var(--line);
  vertical-align: top; white-space: nowrap; }
th { font-weight: 600; color: var(--muted); font-size: .85rem; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.text { white-space: normal; max-width: 32rem; overflow-wrap: anywhere; }
tr.first td { border-top: 2px solid var(--line); }
.badge { display: inline-block; padding: 0 .45rem; border-radius: 999px; font-size: .8rem;
  background: #eef1f6; }
.s-running { background: #dbe7ff; color: var(--accent); }
.s-completed { background: #dcf5e3; color: var(--ok); }
.s-failed, .s-deferred { background: #fff1cc; color: var(--warn); }
.s-abandoned { background: #fde2e0; color: var(--bad); }
.s-cancelled { background: #eceff3; color: var(--muted); }
.idle { color: var(--muted); }
details summary { cursor: pointer; }
details pre { white-space: pre-wrap; margin: .25rem 0 0; font-size: .8rem; }
button.requeue { font: inherit; font-size: .85rem; padding: .1rem .6rem; border-radius: 4px;
  border: 1px solid var(--accent); color: var(--accent); background: #fff; cursor: pointer; }
button.requeue:disabled { opacity: .5; cursor: default; }
#notice { margin: 1rem 1.25rem 0; padding: .5rem .75rem; border-radius: 4px; background: #dcf5e3; }
#notice.bad { background: #fde2e0; }
progress { width: 8rem; }
.filters label { margin-right: 1rem; }
"""

SCRIPT = r"""
"use strict";
// The dashboard. Every value reaches the page through textContent or a DOM property, never
// through HTML parsing, so an error message with markup in it shows as text.
(() => {
  const REFRESH_MS = 2000;
  const SHORT = 90;
  const token = document.querySelector('meta[name="synclane-token"]').getAttribute("content");
  const expanded = new Set();
  let state = null;
  let timer = null;
  let noticeTimer = null;

  function h(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "data") for (const [k, v] of Object.entries(value)) node.dataset[k] = v;
      else if (key === "onclick") node.addEventListener("click", value);
      else node[key] = value;
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  const dash = "—";
  const utc = (iso) => (iso ? iso.slice(0, 19).replace("T", " ") + " UTC" : "");

  function relative(iso) {
    let seconds = Math.round((Date.parse(iso) - Date.parse(state.now)) / 1000);
    const future = seconds > 0;
    seconds = Math.abs(seconds);
    let text;
    if (seconds < 60) text = seconds + "s";
    else if (seconds < 3600) text = Math.floor(seconds / 60) + "m";
    else if (seconds < 86400)
      text = Math.floor(seconds / 3600) + "h " + Math.floor((seconds % 3600) / 60) + "m";
    else text = Math.floor(seconds / 86400) + "d";
    return future ? "in " + text : text + " ago";
  }

  // A time shown relative to the server's clock; refreshed in place on every poll. A due time
  // that has passed reads "due".
  const timeText = (span) =>
    span.dataset.due && Date.parse(span.dataset.iso) <= Date.parse(state.now)
      ? "due"
      : relative(span.dataset.iso);

  function when(iso, due) {
    if (!iso) return dash;
    const span = h("span", { class: "when", title: utc(iso), data: { iso } });
    if (due) span.dataset.due = "1";
    span.textContent = timeText(span);
    return span;
  }

  function day(iso) {
    if (!iso) return "…";
    return iso.slice(11, 19) === "00:00:00" ? iso.slice(0, 10) : iso.slice(0, 16).replace("T", " ");
  }
  const windowText = (start, end) => (start || end ? day(start) + " → " + day(end) : dash);

  // Long text: the start in the table, everything on hover and when expanded.
  function longText(key, text) {
    if (!text) return "";
    const firstLine = text.split("\n")[0];
    if (text.length <= SHORT && firstLine === text) return h("span", { title: text }, text);
    const details = h(
      "details",
      { class: "long", title: text },
      h("summary", null, firstLine.slice(0, SHORT) + "…"),
      h("pre", null, text),
    );
    details.open = expanded.has(key);
    details.addEventListener("toggle", () => {
      if (details.open) expanded.add(key);
      else expanded.delete(key);
    });
    return details;
  }

  const cell = (content, cls) => h("td", { class: cls }, content === "" ? "" : content ?? dash);
  const badge = (status) => h("span", { class: "badge s-" + status }, status);
  const declared = (queue) => state.queues.includes(queue);

  function requeueButton(label, body, data) {
    const button = h("button", { type: "button", class: "requeue", data }, label);
    button.addEventListener("click", () => requeue([body], button));
    return button;
  }

  // Rows are kept when their data did not change, so a button under the pointer stays put.
  function sync(section, items, key, build) {
    const tbody = document.querySelector("#" + section + " tbody");
    const empty = document.querySelector("#" + section + " .empty");
    if (empty) empty.hidden = items.length > 0;
    const old = new Map();
    for (const row of tbody.children) old.set(row.dataset.key, row);
    const rows = items.map((item) => {
      const k = key(item);
      const signature = JSON.stringify(item);
      const previous = old.get(k);
      if (previous && previous.signature === signature) return previous;
      const row = build(item);
      row.dataset.key = k;
      row.signature = signature;
      return row;
    });
    const same =
      rows.length === tbody.children.length && rows.every((row, i) => row === tbody.children[i]);
    if (!same) tbody.replaceChildren(...rows);
  }

  function renderLanes() {
    sync("lanes", state.lanes, (l) => l.queue + "\u0000" + l.lane, (l) =>
      h(
        "tr",
        { data: { lane: l.lane, queue: l.queue } },
        cell(l.queue),
        cell(l.lane),
        l.job_id === null
          ? cell(h("span", { class: "idle" }, "idle"))
          : cell("#" + l.job_id + " " + l.type + " for " + l.owner),
        cell(l.job_id === null ? "" : windowText(l.window_start, l.window_end)),
        cell(l.cursor),
        cell(l.processed_count, "num"),
        cell(l.leased_by),
        cell(when(l.since)),
        cell(when(l.lease_expires_at)),
        cell(l.waiting, "num"),
        cell(when(l.next_due, true)),
      ),
    );
  }

  function renderProgress() {
    const rows = [...state.progress].sort(
      (a, b) => a.owner.localeCompare(b.owner) || a.queue.localeCompare(b.queue),
    );
    const items = rows.map((p, i) => ({ ...p, first: i === 0 || rows[i - 1].owner !== p.owner }));
    sync("progress", items, (p) => [p.queue, p.owner, p.type].join("\u0000"), (p) => {
      const bar = h("progress", { max: Math.max(p.slices_total, 1), value: p.slices_completed });
      const failed = p.slices_failed > 0;
      return h(
        "tr",
        { class: p.first ? "first" : "", data: { owner: p.owner } },
        cell(p.first ? h("strong", null, p.owner) : ""),
        cell(p.queue),
        cell(p.type),
        cell(p.slices_completed + " / " + p.slices_total),
        cell(h("span", null, bar, p.percent === null ? "" : " " + p.percent + "%")),
        cell(p.slices_failed, "num"),
        cell(p.records, "num"),
        cell(windowText(p.coverage_start, p.coverage_end)),
        cell(
          failed && declared(p.queue)
            ? requeueButton("Requeue", { queue: p.queue, owner: p.owner, type: p.type }, {
                owner: p.owner,
              })
            : "",
        ),
      );
    });
  }

  function renderFailures() {
    const stopped = state.failures.filter((f) => declared(f.queue));
    document.getElementById("requeue-all").disabled = stopped.length === 0;
    sync("failures", state.failures, (f) => [f.queue, f.type, f.cause].join("\u0000"), (f) => {
      const key = "cause\u0000" + f.queue + "\u0000" + f.type + "\u0000" + f.cause;
      return h(
        "tr",
        { data: { cause: f.cause } },
        cell(longText(key, f.cause), "text"),
        cell(f.queue),
        cell(f.type),
        cell(f.jobs, "num"),
        cell(f.owners.join(", "), "text"),
        cell(h("span", null, ...f.statuses.map(badge))),
        cell(when(f.first_seen)),
        cell(when(f.last_seen)),
        cell(longText(key + "\u0000example", f.example), "text"),
        cell(
          declared(f.queue)
            ? requeueButton("Requeue", { queue: f.queue, type: f.type, cause: f.cause }, {
                cause: f.cause,
              })
            : "",
        ),
      );
    });
  }

  function fillSelect(id, values) {
    const select = document.getElementById(id);
    const chosen = select.value;
    const wanted = ["", ...values];
    const have = [...select.options].map((o) => o.value);
    if (JSON.stringify(have) !== JSON.stringify(wanted)) {
      select.replaceChildren(...wanted.map((v) => h("option", { value: v }, v || "all")));
    }
    select.value = wanted.includes(chosen) ? chosen : "";
    return select.value;
  }

  function renderJobs() {
    const owners = [...new Set([...state.jobs, ...state.progress].map((j) => j.owner))].sort();
    const statuses = [...new Set(state.jobs.map((j) => j.status))].sort();
    const status = fillSelect("status-filter", statuses);
    const owner = fillSelect("owner-filter", owners);
    const jobs = state.jobs.filter(
      (j) => (!status || j.status === status) && (!owner || j.owner === owner),
    );
    document.getElementById("jobs-count").textContent =
      jobs.length + " shown: the newest " + state.jobs_shown + ", and every running or stopped job";
    sync("jobs", jobs, (j) => String(j.id), (j) =>
      h(
        "tr",
        { data: { jobId: j.id, status: j.status } },
        cell("#" + j.id),
        h("td", { class: "status" }, badge(j.status)),
        cell(j.owner),
        cell(j.lane),
        cell(j.type + (j.mode === "initial" ? "" : " (" + j.mode + ")")),
        cell(windowText(j.window_start, j.window_end)),
        cell(j.cursor),
        cell(j.processed_count, "num"),
        cell(j.attempt_count + (j.throttle_count ? " +" + j.throttle_count + " throttled" : "")),
        cell(j.status === "pending" || j.status === "failed" ? when(j.next_run_at, true) : ""),
        h("td", { class: "error text" }, longText("job\u0000" + j.id, j.error)),
        cell(
          state.requeue_statuses.includes(j.status) && declared(j.queue)
            ? requeueButton("Requeue", { queue: j.queue, job: j.id }, { jobId: j.id })
            : "",
        ),
      ),
    );
  }

  function render() {
    const queues = state.queues.length ? state.queues.join(", ") : "none declared";
    document.getElementById("meta").textContent =
      "schema " + state.schema + " · queues: " + queues + " · updated " + utc(state.now);
    renderLanes();
    renderProgress();
    renderFailures();
    renderJobs();
    for (const span of document.querySelectorAll("span.when")) {
      span.textContent = timeText(span);
    }
  }

  function health(ok, message) {
    const node = document.getElementById("health");
    node.textContent = ok ? "live" : message;
    node.classList.toggle("down", !ok);
  }

  function notice(message, bad) {
    const node = document.getElementById("notice");
    node.textContent = message;
    node.classList.toggle("bad", !!bad);
    node.hidden = false;
    clearTimeout(noticeTimer);
    noticeTimer = setTimeout(() => (node.hidden = true), 6000);
  }

  async function refresh() {
    clearTimeout(timer);
    try {
      const response = await fetch("/api/state", { cache: "no-store", credentials: "same-origin" });
      const body = await response.json().catch(() => ({}));
      if (!response.ok) throw new Error(body.error || "HTTP " + response.status);
      state = body;
      render();
      health(true);
    } catch (error) {
      health(false, "not answering: " + error.message);
    } finally {
      timer = setTimeout(refresh, REFRESH_MS);
    }
  }

  async function requeue(bodies, button) {
    button.disabled = true;
    try {
      let count = 0;
      for (const body of bodies) {
        const response = await fetch("/api/requeue", {
          method: "POST",
          headers: { "Content-Type": "application/json", "X-Synclane-Token": token },
          body: JSON.stringify(body),
          credentials: "same-origin",
          cache: "no-store",
        });
        const answer = await response.json().catch(() => ({}));
        if (!response.ok) throw new Error(answer.error || "HTTP " + response.status);
        count += answer.requeued;
      }
      notice("requeued " + count + " job(s)");
    } catch (error) {
      notice("requeue failed: " + error.message, true);
    } finally {
      button.disabled = false;
      await refresh();
    }
  }

  document.getElementById("requeue-all").addEventListener("click", (event) => {
    const queues = [...new Set(state.failures.map((f) => f.queue))].filter(declared);
    requeue(queues.map((queue) => ({ queue, all: true })), event.currentTarget);
  });
  for (const id of ["status-filter", "owner-filter"]) {
    document.getElementById(id).addEventListener("change", () => state && renderJobs());
  }
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) refresh();
  });
  refresh();
})();
"""
