"""The `synclane` command: daily work on the jobs table from a terminal.

A user mistake (bad DSN, unknown queue, unreachable database, bad app path) prints one line on
stderr and exits with status 2; it never shows a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import psycopg

from synclane import loading
from synclane.app import DatabaseUnavailable, OwnerSourceError, SyncLane, redact
from synclane.model import STATUSES, ConfigError
from synclane.store import SchemaError

if TYPE_CHECKING:
    import pandas as pd

USER_ERRORS = (
    ConfigError,
    DatabaseUnavailable,
    OwnerSourceError,
    SchemaError,
    psycopg.OperationalError,
)


class UsageError(Exception):
    """A mistake on the command line; printed as one line."""


def load_app(path: str | None, dsn: str | None) -> SyncLane:
    """The app named by --app (or $SYNCLANE_APP); --dsn reaches apps built with SyncLane(None)
    through $SYNCLANE_DSN."""
    if not path:
        raise UsageError(
            "no app: pass --app package.module:app or set SYNCLANE_APP "
            "(the demo's is synclane.demo.app:app)"
        )
    return loading.load_app(path, dsn or None)


def _bare_app(dsn: str | None, schema: str) -> SyncLane:
    return SyncLane(dsn or None, schema=schema)


def _print_frame(frame: pd.DataFrame, columns: Sequence[str], empty: str) -> None:
    import pandas as pd

    if frame.empty:
        print(empty)
        return
    shown = frame[[c for c in columns if c in frame.columns]].copy()
    for name in shown.columns:
        if isinstance(shown[name].dtype, pd.DatetimeTZDtype):
            shown[name] = shown[name].dt.strftime("%Y-%m-%d %H:%M:%S").fillna("")
        elif shown[name].dtype == "string" or shown[name].dtype == object:
            shown[name] = shown[name].map(_short)
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(shown.to_string(index=False, na_rep=""))


def _short(value: Any, limit: int = 60) -> str:
    if value is None or value is pd_na():
        return ""
    if isinstance(value, list):
        value = ", ".join(str(v) for v in value)
    text = str(value).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def pd_na() -> Any:
    import pandas as pd

    return pd.NA


class ProgressBar:
    """A one-line bar on stderr while long work runs (only on a terminal)."""

    def __init__(self, read: Callable[[], int], label: str) -> None:
        self.read = read
        self.total = 0
        self.label = label
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.enabled = sys.stderr.isatty()

    def __enter__(self) -> ProgressBar:
        if self.enabled:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.enabled:
            self.thread.join(timeout=5)
            self._draw()
            sys.stderr.write("\n")

    def _run(self) -> None:
        while not self.stop.wait(1.0):
            self._draw()

    def _draw(self) -> None:
        try:
            remaining = self.read()
        except Exception:  # a progress bar must never break the work it shows
            return
        total = self.total = max(self.total, remaining)
        done = total - remaining
        width = 30
        filled = width if total == 0 else round(width * done / total)
        bar = "#" * filled + "." * (width - filled)
        sys.stderr.write(f"\r{self.label} [{bar}] {done}/{total} jobs done")
        sys.stderr.flush()


def _open_jobs(app: SyncLane, queues: Sequence[str]) -> int:
    return app.open_jobs(queues)


# -- commands -------------------------------------------------------------------------------


def cmd_migrate(args: argparse.Namespace) -> None:
    app = _app_or_bare(args)
    print(f"schema {app.schema!r} is at version {app.migrate()}")


def _app_or_bare(args: argparse.Namespace) -> SyncLane:
    if args.app or os.environ.get("SYNCLANE_APP"):
        return load_app(args.app or os.environ.get("SYNCLANE_APP"), args.dsn)
    return _bare_app(args.dsn, args.schema)


def _app(args: argparse.Namespace) -> SyncLane:
    return load_app(args.app or os.environ.get("SYNCLANE_APP"), args.dsn)


def cmd_plan(args: argparse.Namespace) -> None:
    app = _app(args)
    horizon = None if args.horizon_days is None else timedelta(days=args.horizon_days)
    added = app.plan(args.queue, args.owner, horizon=horizon, type=args.type)
    for queue, count in added.items():
        print(f"{queue}: {count} new job(s)")
    if args.work:
        _work(app, [args.queue] if args.queue else None, None, until_idle=True)


def cmd_work(args: argparse.Namespace) -> None:
    app = _app(args)
    _work(app, args.queue or None, args.seconds, args.until_idle)


def _work(
    app: SyncLane, queues: Sequence[str] | None, seconds: float | None, until_idle: bool
) -> None:
    from synclane.worker import Worker

    worker = Worker(app, queues, seconds, until_idle=until_idle)
    names = [q.name for q in worker.queues]
    with ProgressBar(lambda: _open_jobs(app, names), "working"):
        report = worker.run()
    done = ", ".join(f"{name} {count}" for name, count in sorted(report.items())) or "nothing"
    print(f"worker stopped: {done}")


def cmd_jobs(args: argparse.Namespace) -> None:
    app = _app(args)
    frame = app.jobs(args.queue, args.owner, args.status, args.type, args.limit)
    columns = [
        "id",
        "owner",
        "lane",
        "type",
        "mode",
        "status",
        "window_start",
        "window_end",
        "cursor",
        "processed_count",
        "attempt_count",
        "next_run_at",
        "error",
    ]
    _print_frame(frame, columns, "no jobs")


def cmd_progress(args: argparse.Namespace) -> None:
    app = _app(args)
    queues = [args.queue] if args.queue else list(app.queues)
    for queue in queues:
        if len(queues) > 1:
            print(f"== {queue}")
        frame = app.progress(queue, args.owner)
        columns = [
            "owner",
            "type",
            "slices_total",
            "slices_completed",
            "slices_failed",
            "records",
            "coverage_start",
            "coverage_end",
            "percent",
            "state",
            "eta",
        ]
        _print_frame(frame, columns, "nothing planned yet")


def cmd_failures(args: argparse.Namespace) -> None:
    app = _app(args)
    frame = app.failures(args.queue, args.owner, args.type)
    columns = ["queue", "type", "jobs", "owners", "statuses", "last_seen", "cause"]
    _print_frame(frame, columns, "no open failures")


def cmd_requeue(args: argparse.Namespace) -> None:
    app = _app(args)
    count = app.requeue(
        args.queue,
        args.owner,
        args.type,
        ids=args.id or None,
        include_cancelled=args.include_cancelled,
        cause=args.cause,
    )
    print(f"requeued {count} job(s)")


def cmd_cancel(args: argparse.Namespace) -> None:
    app = _app(args)
    count = app.cancel(args.queue, args.owner, args.reason, type=args.type)
    print(f"cancelled {count} job(s)")


def cmd_dashboard(args: argparse.Namespace) -> None:
    from synclane import dashboard

    dashboard.serve(
        _app(args),
        host=args.host,
        port=args.port,
        allow_remote=args.allow_remote,
        trust_proxy=args.trust_proxy,
        on_ready=lambda url: print(f"synclane dashboard on {url} (Ctrl-C stops it)", flush=True),
        **_page_options(args),
    )


def _page_options(args: argparse.Namespace) -> dict[str, Any]:
    """The page's options from `dashboard` and `demo`; the login secret from the environment
    (never a flag: the command line shows in `ps`)."""
    from synclane.dashboard import LOGIN_SECRET_ENV

    return {
        "public_hosts": args.public_host or (),
        "login_secret": os.environ.get(LOGIN_SECRET_ENV) or None,
    }


PUBLIC_HOST_HELP = (
    "another name the page is reached by (a proxy's public name, this machine's address); "
    "repeat for several. The page answers only to its own address and these names"
)
REMOTE_HELP = (
    "listen on a host other machines can reach; needs a login secret of 16+ characters in "
    "$SYNCLANE_DASHBOARD_SECRET"
)
PROXY_HELP = "accept requests forwarded by a proxy (X-Forwarded-*); the proxy or the login guards"


def cmd_demo(args: argparse.Namespace) -> None:
    from synclane import dashboard
    from synclane.demo import build_demo
    from synclane.worker import Worker

    # The demo's rows go to schema "demo" beside "synclane", or "<schema>_demo" beside another.
    data_schema = "demo" if args.schema == "synclane" else f"{args.schema}_demo"
    demo = build_demo(args.dsn or None, args.schema, args.speed, data_schema=data_schema)
    if not args.keep:
        demo.reset()  # each run tells the story from the start
    app = demo.app
    where = "the embedded PostgreSQL" if app.embedded else redact(app.dsn)
    server = None
    if not args.no_page:
        server = dashboard.make_server(
            app,
            host=args.host,
            port=args.port,
            allow_remote=args.allow_remote,
            trust_proxy=args.trust_proxy,
            **_page_options(args),
        )
        threading.Thread(target=server.serve_forever, daemon=True).start()
        print(f"synclane demo on {where}: open {server.url}", flush=True)
    else:
        print(f"synclane demo on {where}", flush=True)
    print("Ctrl-C stops it; `synclane --app synclane.demo.app:app jobs` shows the table.")
    added = app.plan()
    print(f"planned {sum(added.values())} job(s) for 4 accounts", flush=True)
    worker = Worker(app, None, args.seconds)
    try:
        report = worker.run()
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        demo.close()
    print(f"demo stopped: {report}")


def cmd_serve(args: argparse.Namespace) -> None:
    path: str | None = args.app or os.environ.get("SYNCLANE_APP")
    if not path:
        raise UsageError("no app: pass --app package.module:app or set SYNCLANE_APP")
    try:
        from synclane.prefect.serve import serve
    except ImportError:
        raise UsageError(
            "`synclane serve` runs Prefect deployments: install the extra with "
            "pip install 'synclane[prefect]'"
        ) from None
    print(f"serving the Prefect deployments of {path} (Ctrl-C stops them)", flush=True)
    serve(path, dsn=args.dsn or None, work_budget_seconds=args.work_budget)


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(
        prog="synclane",
        description="Sync jobs in a PostgreSQL table: plan, work, inspect, fix.",
    )
    main.add_argument("--dsn", help="PostgreSQL DSN (default: $SYNCLANE_DSN, else embedded)")
    main.add_argument("--app", help="the app, package.module:attribute (default: $SYNCLANE_APP)")
    main.add_argument(
        "--schema",
        default="synclane",
        help="the table's schema for `demo` and for `migrate` without --app",
    )
    main.add_argument("-v", "--verbose", action="store_true", help="log every job change")
    commands = main.add_subparsers(dest="command", required=True, metavar="command")
    # --dsn and --app may also follow the command (`synclane dashboard --app x:app`).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dsn", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    common.add_argument("--app", default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    def command(name: str, run: Callable[[argparse.Namespace], None], text: str) -> Any:
        sub = commands.add_parser(name, help=text, description=text, parents=[common])
        sub.set_defaults(run=run)
        return sub

    demo = command("demo", cmd_demo, "run the demo shop with workers and its page")
    demo.add_argument("--host", default="127.0.0.1", help="where the page listens")
    demo.add_argument("--port", type=int, default=8080)
    demo.add_argument("--allow-remote", action="store_true", help=REMOTE_HELP)
    demo.add_argument("--trust-proxy", action="store_true", help=PROXY_HELP)
    demo.add_argument("--public-host", action="append", metavar="NAME", help=PUBLIC_HOST_HELP)
    demo.add_argument("--speed", type=float, default=1.0, help="time factor; 0.1 is 10x faster")
    demo.add_argument("--for", dest="seconds", type=float, help="stop after this many seconds")
    demo.add_argument("--no-page", action="store_true", help="do not serve the page")
    demo.add_argument("--keep", action="store_true", help="continue the last run's story")

    command("migrate", cmd_migrate, "create or upgrade the schema")

    plan = command("plan", cmd_plan, "insert the jobs that should exist")
    plan.add_argument("--queue")
    plan.add_argument("--owner")
    plan.add_argument("--type")
    plan.add_argument("--horizon-days", type=float, help="widen history for this call")
    plan.add_argument("--work", action="store_true", help="then work until idle (a backfill)")

    work = command("work", cmd_work, "run worker slots")
    work.add_argument("--queue", action="append", help="a queue to work (repeatable)")
    work.add_argument("--for", dest="seconds", type=float, help="stop after this many seconds")
    work.add_argument("--until-idle", action="store_true", help="stop when nothing is left")

    jobs = command("jobs", cmd_jobs, "list jobs, newest first")
    jobs.add_argument("--queue")
    jobs.add_argument("--owner")
    jobs.add_argument("--status", choices=STATUSES)
    jobs.add_argument("--type")
    jobs.add_argument("--limit", type=int, default=50)

    progress = command("progress", cmd_progress, "how far each owner's first load is")
    progress.add_argument("--queue")
    progress.add_argument("--owner")

    failures = command("failures", cmd_failures, "open failures grouped by cause")
    failures.add_argument("--queue")
    failures.add_argument("--owner")
    failures.add_argument("--type")

    requeue = command("requeue", cmd_requeue, "fresh attempts for stopped jobs")
    requeue.add_argument("--queue", required=True)
    requeue.add_argument("--owner")
    requeue.add_argument("--type")
    requeue.add_argument("--id", type=int, action="append", help="a job id (repeatable)")
    requeue.add_argument("--cause", help="a cause as `synclane failures` shows it")
    requeue.add_argument("--include-cancelled", action="store_true")

    cancel = command("cancel", cmd_cancel, "cancel what has not finished for an owner")
    cancel.add_argument("--queue", required=True)
    cancel.add_argument("--owner", required=True)
    cancel.add_argument("--reason", required=True)
    cancel.add_argument("--type")

    page = command("dashboard", cmd_dashboard, "serve the page for an app")
    page.add_argument("--host", default="127.0.0.1")
    page.add_argument("--port", type=int, default=8080)
    page.add_argument("--allow-remote", action="store_true", help=REMOTE_HELP)
    page.add_argument("--trust-proxy", action="store_true", help=PROXY_HELP)
    page.add_argument("--public-host", action="append", metavar="NAME", help=PUBLIC_HOST_HELP)

    serve = command("serve", cmd_serve, "serve the app's Prefect deployments (synclane[prefect])")
    serve.add_argument(
        "--work-budget", type=int, default=540, help="seconds each `work` run works (default 540)"
    )
    return main


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        args.run(args)
    except (UsageError, *USER_ERRORS) as error:
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"synclane: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
