"""The page as a WSGI application: routes, the checks of synclane.dashboard.guard on every
request, and the same security headers on every answer, errors included."""

from __future__ import annotations

import hmac
import json
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from http import HTTPStatus
from importlib import resources
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

import synclane.dashboard.guard as guard
from synclane.app import DatabaseUnavailable, SyncLane
from synclane.dashboard.feed import events_after
from synclane.dashboard.guard import Refused
from synclane.dashboard.request import (
    Request,
    name_param,
    number_param,
    pause_request,
    read_json,
    request_headers,
    requeue_request,
    resume_request,
    search_text,
)
from synclane.dashboard.state import (
    DATABASE_DOWN,
    JOB_STATUSES,
    Reader,
    Unavailable,
    Views,
    records,
)
from synclane.errors import SchemaError
from synclane.events import EventLog
from synclane.model import ConfigError
from synclane.operations import default_author

if TYPE_CHECKING:
    from synclane.metrics import Metrics

log = logging.getLogger("synclane.dashboard")

StartResponse = Callable[..., Any]
MAX_URL = 2048
MAX_HEADERS = 64
MAX_PAGE = 10_000
STATIC_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}


def _static(name: str) -> str:
    folder = resources.files("synclane.dashboard").joinpath("static")
    return folder.joinpath(name).read_text(encoding="utf-8")


class Answer:
    def __init__(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json; charset=utf-8",
        headers: Iterable[tuple[str, str]] = (),
    ) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = list(headers)


def json_answer(status: int, body: Any, headers: Iterable[tuple[str, str]] = ()) -> Answer:
    data = json.dumps(body, allow_nan=False, separators=(",", ":")).encode()
    return Answer(status, data, headers=headers)


Route = Callable[["Dashboard", Request], Answer]
T = TypeVar("T")


class Dashboard:
    """The page of one app as a WSGI application (see `wsgi_app`)."""

    def __init__(
        self,
        app: SyncLane,
        *,
        public_hosts: Iterable[str] = (),
        login_secret: str | None = None,
        trust_proxy: bool = False,
        events: EventLog | None = None,
        interval: float = 2.0,
        statement_timeout: float = 5.0,
        pool_size: int = 4,
        metrics: bool = False,
        bound_host: str | None = None,
        port: int | None = None,
        local_only: bool = False,
    ) -> None:
        if not isinstance(app, SyncLane):
            raise ConfigError(f"the dashboard needs a SyncLane app, got {type(app).__name__}")
        if events is not None and not isinstance(events, EventLog):
            raise ConfigError(
                f"events must be a synclane.events.EventLog, got {type(events).__name__}"
            )
        for name, value, low in (
            ("interval", interval, 0.1),
            ("statement_timeout", statement_timeout, 0.1),
            ("pool_size", pool_size, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < low:
                raise ConfigError(f"{name}={value!r} must be a number >= {low}")
        self.app = app
        self.trust_proxy = bool(trust_proxy)
        self.local_only = local_only
        self.port = None if port is None else str(port)
        self.hosts = guard.HostCheck(bound_host, public_hosts)
        secret = guard.check_login_secret(login_secret)
        self.login = None if secret is None else guard.Login(secret)
        # A fresh random token per page server: only a page it rendered can act. With a
        # login it comes from the secret, so every process given the secret agrees on it.
        self.token = guard.random_token() if self.login is None else self.login.token()
        self.events = events
        self.reader = Reader(
            app.dsn,
            app.schema,
            lambda: list(app.queues),
            rates=lambda: {
                q.name: q.settings.lane_rate for q in app.queues.values() if q.settings.lane_rate
            },
            statement_timeout=statement_timeout,
            pool_size=int(pool_size),
            pooled=app.database.pooled,
        )
        self.views = Views(float(interval))
        self.interval = float(interval)
        self.open_routes = OPEN_ROUTES
        self.metrics: Metrics | None = None
        if metrics:
            # Only now: a page without /metrics never imports prometheus_client.
            from synclane.metrics import Metrics

            # The table's gauges, read at most once per interval however often it is scraped.
            self.metrics = Metrics(
                app.database,
                list(app.queues),
                refresh=self.interval,
                statement_timeout=statement_timeout,
            )
            # A scraper cannot log in; the text holds names and counts, no secret.
            self.open_routes = OPEN_ROUTES | {"/metrics"}
        self.pages = {
            name: _static(name)
            for name in ("index.html", "login.html", "app.js", "login.js", "style.css")
        }

    def close(self) -> None:
        """Close the page's database connections."""
        self.reader.close()
        if self.metrics is not None:
            self.metrics.close()

    # -- WSGI --------------------------------------------------------------------------------

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        request = Request(environ)
        try:
            answer = self.answer(request)
        except Refused as refused:
            answer = json_answer(refused.status, {"error": refused.message}, refused.headers)
        except Exception:
            log.exception("dashboard: %s %s failed", request.method, request.path[:200])
            answer = json_answer(500, {"error": "internal error; the server's log has the details"})
        status = HTTPStatus(answer.status)
        headers = [
            ("Content-Type", answer.content_type),
            ("Content-Length", str(len(answer.body))),
            *guard.SECURITY_HEADERS,
            *answer.headers,
        ]
        start_response(f"{status.value} {status.phrase}", headers)
        return [] if request.method == "HEAD" else [answer.body]

    def answer(self, request: Request) -> Answer:
        self.refuse_strangers(request)
        if request.path == "" and request.root:
            # mounted at /prefix and asked without the slash: the page's links are relative
            return Answer(308, b"", "text/plain", [("Location", request.root + "/")])
        routes = GET_ROUTES if request.method in ("GET", "HEAD") else POST_ROUTES
        route = routes.get(request.path) if request.method in ("GET", "HEAD", "POST") else None
        if route is None:
            known = request.path in GET_ROUTES or request.path in POST_ROUTES
            if not known:
                raise Refused(404, "no page here")
            allowed = "GET, HEAD" if request.path in GET_ROUTES else "POST"
            raise Refused(405, "method not allowed", [("Allow", allowed)])
        if request.path.startswith("/api/") or request.path == "/metrics":
            guard.refuse_cross_site(request_headers(request), self.origin_hosts(request))
        if (
            self.login is not None
            and request.path not in self.open_routes
            and not self.login.valid(request.cookie(guard.SESSION_COOKIE))
        ):
            if request.path == "/":
                return Answer(303, b"", "text/plain", [("Location", "login")])
            raise Refused(401, "log in first: open the page and enter the login secret")
        return route(self, request)

    # -- checks ------------------------------------------------------------------------------

    def refuse_strangers(self, request: Request) -> None:
        """Refuse what is malformed or oversized, what came through an untrusted proxy, what
        came from another machine to a page that serves this one only, and what names a host
        that is not this server."""
        uri = request.environ.get("REQUEST_URI") or request.path + "?" + request.query_string
        if len(str(uri)) > MAX_URL:
            raise Refused(414, f"the URL may be at most {MAX_URL} characters")
        if request.header_count() > MAX_HEADERS:
            raise Refused(431, f"a request may carry at most {MAX_HEADERS} headers")
        if not self.trust_proxy:
            for header in guard.FORWARDING_HEADERS:
                if request.header(header) is not None:
                    raise Refused(
                        403,
                        f"refused: the request carries {header}, so it came through a proxy. "
                        "Behind a proxy start the dashboard with --trust-proxy, and let the "
                        "proxy (or --login) authenticate",
                    )
        if self.local_only and not guard.is_loopback(str(request.environ.get("REMOTE_ADDR", ""))):
            raise Refused(403, "refused: the dashboard serves this machine only")
        port = self.port or str(request.environ.get("SERVER_PORT") or "") or None
        for host in self.request_hosts(request):
            if not self.hosts.allows(host, port):
                raise Refused(
                    403,
                    "refused: the Host header does not name this server; open it by the "
                    "address it listens on, or start it with --public-host NAME",
                )

    def request_hosts(self, request: Request) -> list[str | None]:
        hosts = [request.header("Host")]
        forwarded = request.header("X-Forwarded-Host") if self.trust_proxy else None
        if forwarded is not None:
            hosts.append(forwarded.split(",")[0].strip())
        return hosts

    def origin_hosts(self, request: Request) -> list[str | None]:
        return self.request_hosts(request)

    def secure(self, request: Request) -> bool:
        if request.environ.get("wsgi.url_scheme") == "https":
            return True
        proto = request.header("X-Forwarded-Proto") if self.trust_proxy else None
        return proto is not None and proto.split(",")[0].strip().lower() == "https"

    def refuse_forged_change(self, request: Request) -> None:
        """A change needs JSON, the page's token, and (from a browser) the page's origin."""
        kind = (request.header("Content-Type") or "").split(";")[0].strip().lower()
        if kind != "application/json":
            raise Refused(415, "send the request as Content-Type: application/json")
        sent = request.header(guard.TOKEN_HEADER) or ""
        if not hmac.compare_digest(sent.encode(), self.token.encode()):
            raise Refused(
                403, f"refused: {guard.TOKEN_HEADER} is missing or wrong; reload the page"
            )

    # -- pages -------------------------------------------------------------------------------

    def page(self, request: Request) -> Answer:
        html = self.pages["index.html"].replace("{{token}}", self.token)
        return Answer(200, html.encode(), STATIC_TYPES[".html"])

    def login_page(self, request: Request) -> Answer:
        if self.login is None:
            raise Refused(404, "this page has no login")
        return Answer(200, self.pages["login.html"].encode(), STATIC_TYPES[".html"])

    def static(self, request: Request) -> Answer:
        name = request.path.lstrip("/")
        suffix = name[name.rindex(".") :]
        return Answer(200, self.pages[name].encode(), STATIC_TYPES[suffix])

    def icon(self, request: Request) -> Answer:
        return Answer(204, b"", "image/x-icon")

    # -- reads -------------------------------------------------------------------------------

    def _view(self, key: Any, compute: Callable[[], Any]) -> Answer:
        try:
            data = self.views.get(key, lambda: _encode(compute()))
        except Unavailable as error:
            raise Refused(503, str(error)) from None
        return Answer(200, data)

    def api_state(self, request: Request) -> Answer:
        return self._view(
            "state",
            lambda: {
                **self.reader.state(),
                "interval": self.interval,
                "login": self.login is not None,
            },
        )

    def api_accounts(self, request: Request) -> Answer:
        search, page = search_text(request), number_param(request, "page", MAX_PAGE) or 0
        return self._view(("accounts", search, page), lambda: self.reader.accounts(search, page))

    def api_lanes(self, request: Request) -> Answer:
        search, page = search_text(request), number_param(request, "page", MAX_PAGE) or 0
        return self._view(("lanes", search, page), lambda: self.reader.lanes(search, page))

    def api_workers(self, request: Request) -> Answer:
        page = number_param(request, "page", MAX_PAGE) or 0
        return self._view(("workers", page), lambda: self.reader.workers(page))

    def api_failures(self, request: Request) -> Answer:
        search = search_text(request)
        return self._view(("failures", search), lambda: self.reader.failures(search))

    def api_jobs(self, request: Request) -> Answer:
        filters: dict[str, Any] = {
            "before": number_param(request, "before", 2**63 - 1),
            "queue": name_param(request, "queue"),
            "owner": name_param(request, "owner"),
            "lane": name_param(request, "lane"),
            "cause_id": request.query("cause_id"),
        }
        status = request.query("status")
        if status is not None:
            statuses = status.split(",")
            unknown = [s for s in statuses if s not in JOB_STATUSES]
            if unknown:
                raise Refused(400, f"status must be among {', '.join(JOB_STATUSES)}")
            filters["statuses"] = statuses
        cause_id = filters["cause_id"]
        if cause_id is not None and not re.fullmatch(r"[0-9a-f]{8}", cause_id):
            raise Refused(400, "cause_id must be the 8 hex digits a cause shows, e.g. 3f2a9c1b")
        key = ("jobs", tuple(sorted((k, str(v)) for k, v in filters.items())))
        return self._view(key, lambda: self.reader.jobs(**filters))

    def prometheus(self, request: Request) -> Answer:
        if self.metrics is None:
            raise Refused(404, "no page here: serve the page with metrics=True for /metrics")
        body, content_type = self.metrics.exposition()
        return Answer(200, body, content_type)

    def api_events(self, request: Request) -> Answer:
        after = number_param(request, "after", 2**63 - 1) or 0
        return json_answer(200, events_after(self.events, after, self.reader.mask))

    # -- changes -----------------------------------------------------------------------------

    def _change(self, what: str, operation: Callable[[], T]) -> T:
        """An operation of the app on behalf of the page: its ConfigError is a 400 with the
        app's own message, a database that does not answer a 503; the next look shows what
        changed."""
        try:
            done = operation()
        except ConfigError as error:
            raise Refused(400, self.reader.mask(str(error))) from None
        except psycopg.errors.InsufficientPrivilege:
            raise Refused(
                403,
                f"the page's database role may not {what}: give it the synclane_worker grants "
                "(docs/operations.md, Roles and grants)",
            ) from None
        except (DatabaseUnavailable, SchemaError, psycopg.Error, OSError) as error:
            log.warning("dashboard: %s failed: %s", what, type(error).__name__)
            raise Refused(503, DATABASE_DOWN) from None
        self.views.forget()
        return done

    def api_requeue(self, request: Request) -> Answer:
        self.refuse_forged_change(request)
        queue, selection = requeue_request(read_json(request))
        count = self._change("requeue", lambda: self.app.requeue(queue, **selection))
        log.info("dashboard: requeued %d job(s) in %s (%s)", count, queue, selection)
        return json_answer(200, {"requeued": count})

    def api_pause(self, request: Request) -> Answer:
        self.refuse_forged_change(request)
        queue, reason, by = pause_request(read_json(request))
        who = by or f"{default_author()} via the dashboard"
        pause = self._change("pause", lambda: self.app.pause(queue, reason, by=who))
        return json_answer(200, {"paused": records([pause], self.reader.mask)[0]})

    def api_resume(self, request: Request) -> Answer:
        self.refuse_forged_change(request)
        queue = resume_request(read_json(request))
        return json_answer(200, {"resumed": self._change("resume", lambda: self.app.resume(queue))})

    def api_login(self, request: Request) -> Answer:
        if self.login is None:
            raise Refused(404, "this page has no login")
        kind = (request.header("Content-Type") or "").split(";")[0].strip().lower()
        if kind != "application/json":
            raise Refused(415, "send the request as Content-Type: application/json")
        sent = read_json(request)
        if not isinstance(sent, dict) or set(sent) != {"secret"}:
            raise Refused(400, 'send {"secret": "..."}')
        if not self.login.check(sent["secret"]):
            raise Refused(403, "that is not the login secret")
        path, secure = request.root + "/", self.secure(request)
        cookie = guard.session_cookie(self.login.session(), path, secure)
        return json_answer(200, {"logged_in": True}, [("Set-Cookie", cookie)])

    def api_logout(self, request: Request) -> Answer:
        self.refuse_forged_change(request)
        cookie = guard.session_cookie("", request.root + "/", self.secure(request), max_age=0)
        return json_answer(200, {"logged_in": False}, [("Set-Cookie", cookie)])


def _encode(body: Any) -> bytes:
    return json.dumps(body, allow_nan=False, separators=(",", ":")).encode()


GET_ROUTES: dict[str, Route] = {
    "/": Dashboard.page,
    "/login": Dashboard.login_page,
    "/app.js": Dashboard.static,
    "/login.js": Dashboard.static,
    "/style.css": Dashboard.static,
    "/favicon.ico": Dashboard.icon,
    "/api/state": Dashboard.api_state,
    "/api/accounts": Dashboard.api_accounts,
    "/api/lanes": Dashboard.api_lanes,
    "/api/workers": Dashboard.api_workers,
    "/api/failures": Dashboard.api_failures,
    "/api/jobs": Dashboard.api_jobs,
    "/api/events": Dashboard.api_events,
    "/metrics": Dashboard.prometheus,
}
POST_ROUTES: dict[str, Route] = {
    "/api/requeue": Dashboard.api_requeue,
    "/api/pause": Dashboard.api_pause,
    "/api/resume": Dashboard.api_resume,
    "/api/login": Dashboard.api_login,
    "/api/logout": Dashboard.api_logout,
}
# What a visitor who has not logged in may load: the login page and what it needs.
OPEN_ROUTES = frozenset({"/login", "/login.js", "/style.css", "/favicon.ico", "/api/login"})


def wsgi_app(
    app: SyncLane,
    *,
    public_hosts: Sequence[str] = (),
    login_secret: str | None = None,
    trust_proxy: bool = False,
    events: EventLog | None = None,
    interval: float = 2.0,
    statement_timeout: float = 5.0,
    pool_size: int = 4,
    metrics: bool = False,
) -> Dashboard:
    """The page of `app` as a WSGI callable, to mount inside a web app you already run (under
    any path prefix). The Host check is on: the names your site is reached by go in
    `public_hosts`. Authentication is yours (wrap it with your own, see docs/dashboard.md), or
    pass `login_secret`. `events` feeds the events panel; `metrics=True` serves the table's
    gauges as Prometheus text at /metrics, without the login. Call `.close()` when done."""
    return Dashboard(
        app,
        public_hosts=public_hosts,
        login_secret=login_secret,
        trust_proxy=trust_proxy,
        events=events,
        interval=interval,
        statement_timeout=statement_timeout,
        pool_size=pool_size,
        metrics=metrics,
    )
