"""The `synclane` commands that run a while: plan (and work), work, demo, dashboard, serve.

Part of `synclane.cli`; each command takes the parsed arguments and the terminal and returns
the exit status.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from synclane import cli_args
from synclane.app import SyncLane, redact
from synclane.cli_args import UsageError
from synclane.model import IDLE_GRACE

if TYPE_CHECKING:
    from synclane.terminal import Terminal

# `work --until-idle` and `plan --work` stopped with jobs left open or waiting for a human
EXIT_WORK_LEFT = 3
# Ctrl-C (SIGINT), as shells report a command it stopped; SIGTERM (a deploy, a supervisor)
# stops a worker as asked, with its usual status
EXIT_INTERRUPTED = 130


def cmd_plan(args: argparse.Namespace, term: Terminal) -> int:
    app = cli_args.load_app(args)
    queues = cli_args.queues(app, args.queue, one=args.owner is not None)
    cli_args.check_type(app, queues, args.type)
    horizon = None if args.horizon_days is None else timedelta(days=args.horizon_days)
    queue = args.queue or (queues[0] if args.owner else None)
    if queue is not None and args.owner is not None:
        cli_args.check_connected(app, queue, args.owner)
    added = app.plan(queue, args.owner, horizon=horizon, type=args.type)
    for name, count in added.items():
        term.say(f"{name}: {count} new job(s)")
    if args.work:
        return _work(app, queues, None, True, args.idle_grace, term)
    return 0


def cmd_work(args: argparse.Namespace, term: Terminal) -> int:
    if args.idle_grace is not None and not args.until_idle:
        raise UsageError("argument --idle-grace: only means something with --until-idle")
    if args.metrics_host is not None and args.metrics_port is None:
        raise UsageError("argument --metrics-host: only means something with --metrics-port")
    app = cli_args.load_app(args)
    queues = sorted({q for name in args.queue or [None] for q in cli_args.queues(app, name)})
    metrics = None
    if args.metrics_port is not None:
        metrics = (args.metrics_host or "127.0.0.1", args.metrics_port)
    return _work(app, queues, args.seconds, args.until_idle, args.idle_grace, term, metrics)


def _work(
    app: SyncLane,
    queues: Sequence[str],
    seconds: float | None,
    until_idle: bool,
    idle_grace: float | None,
    term: Terminal,
    metrics_at: tuple[str, int] | None = None,
) -> int:
    from synclane.terminal import EventPrinter, left_open, report_text, timer

    grace = IDLE_GRACE if idle_grace is None else timedelta(seconds=idle_grace)
    listeners: list[Callable[..., object]] = [EventPrinter(app)]
    with contextlib.ExitStack() as serving:
        if metrics_at is not None:
            listeners.append(_serve_metrics(app, queues, *metrics_at, term, serving))
        elapsed = timer()
        with term.progress(
            lambda: app.unfinished_jobs(queues), "working", lambda: app.history_to_plan(queues)
        ) as bar:
            worker = app.worker(
                queues, seconds, until_idle=until_idle, idle_grace=grace,
                on_event=[*listeners, bar],
            )  # fmt: skip
            report = worker.run()
    term.say(f"worker stopped after {elapsed():.0f} s: {report_text(report)}")
    left = left_open(app, queues)
    for line in left or ["nothing left open"]:
        term.say(line)
    if worker.interrupted_by == signal.SIGINT:
        return EXIT_INTERRUPTED
    return EXIT_WORK_LEFT if until_idle and left else 0


def _serve_metrics(
    app: SyncLane,
    queues: Sequence[str],
    host: str,
    port: int,
    term: Terminal,
    serving: contextlib.ExitStack,
) -> Callable[..., object]:
    """Serve the worker's Prometheus metrics until `serving` closes; returns their listener."""
    from synclane.metrics import Metrics

    metrics = Metrics(app.database, queues)
    serving.callback(metrics.close)
    try:
        server = metrics.serve(port, host)
    except OSError as error:
        raise UsageError(
            f"argument --metrics-port: cannot listen on {host}:{port} "
            f"({error.strerror or error}); choose another port, or 0 for any free one"
        ) from None
    serving.callback(server.close)
    term.say(f"metrics on {server.url}")
    return metrics


def cmd_dashboard(args: argparse.Namespace, term: Terminal) -> int:
    from synclane import dashboard

    app = cli_args.load_app(args)

    def ready(url: str) -> None:
        print(f"synclane dashboard on {url} (Ctrl-C stops it)", flush=True)

    try:
        dashboard.serve(
            app,
            host=args.host,
            port=args.port,
            allow_remote=args.allow_remote,
            trust_proxy=args.trust_proxy,
            on_ready=ready,
            metrics=args.metrics,
            **_page_options(args),
        )
    except cli_args.Stopped:  # SIGTERM or SIGHUP: a stop asked for, as `work` takes it
        app.close()
        return 0
    app.close()
    return EXIT_INTERRUPTED  # serve() returns once Ctrl-C stopped it


def _page_options(args: argparse.Namespace) -> dict[str, Any]:
    """The page's options from `dashboard` and `demo`; the login secret from the environment
    (never a flag: the command line shows in `ps`)."""
    from synclane.dashboard import LOGIN_SECRET_ENV

    return {
        "public_hosts": args.public_host or (),
        "login_secret": os.environ.get(LOGIN_SECRET_ENV) or None,
    }


def cmd_demo(args: argparse.Namespace, term: Terminal) -> int:
    from synclane import dashboard
    from synclane.demo import build_demo, data_schema_for
    from synclane.demo.story import Story
    from synclane.demo.story import log as story_log
    from synclane.events import WHOLE_LINE, EventLog, Listener
    from synclane.terminal import EventPrinter, left_open, report_text

    schema = args.schema or "synclane"
    demo = build_demo(args.dsn or None, schema, args.speed, data_schema=data_schema_for(schema))
    if not args.keep:
        demo.reset()  # each run tells the story from the start
    app = demo.app
    where = "the embedded PostgreSQL" if app.embedded else redact(app.dsn)
    server = None
    events = EventLog()  # what the page's events panel shows: the worker's and the story's
    if not args.no_page:
        server = dashboard.make_server(
            app,
            host=args.host,
            port=args.port,
            allow_remote=args.allow_remote,
            trust_proxy=args.trust_proxy,
            events=events,
            **_page_options(args),
        )
        threading.Thread(target=server.serve_forever, daemon=True).start()
        term.say(f"synclane demo on {where}: open {server.url}")
    else:
        term.say(f"synclane demo on {where}")
    # Commands for another terminal, as they run there: on lines of their own, never wrapped.
    command, needs = cli_args.rerun(app, "synclane.demo.app:app", dsn_option=bool(args.dsn))
    term.say(f"Ctrl-C stops it; the jobs table from another terminal{needs}:")
    term.say(f"  {command} jobs")

    def say(text: str) -> None:
        story_log.info("%s", text)
        events.note(text)

    def say_command(text: str) -> None:
        story_log.info("%s", text, extra={WHOLE_LINE: True})
        events.note(text)

    story = Story(demo, command=command, say=say, say_command=say_command, page=server is not None)
    story.intro(sum(app.plan().values()), kept=args.keep)
    try:
        with term.progress(
            lambda: app.unfinished_jobs(), "demo", lambda: app.history_to_plan()
        ) as bar:
            listeners: list[Listener] = [EventPrinter(app), story, bar, events]
            worker = app.worker(None, args.seconds, on_event=listeners)
            report = worker.run()
    finally:
        story.close()
        if server is not None:
            server.shutdown()
            server.server_close()
    term.say(f"demo stopped: {report_text(report)}")
    for line in left_open(app, list(app.queues)) or ["nothing left open"]:
        term.say(line)
    demo.close()
    return EXIT_INTERRUPTED if worker.interrupted_by == signal.SIGINT else 0


def cmd_serve(args: argparse.Namespace, term: Terminal) -> int:
    path: str | None = args.app or os.environ.get("SYNCLANE_APP")
    if not path:
        raise UsageError("no app: pass --app package.module:app or set SYNCLANE_APP")
    try:
        from synclane.prefect.serve import check_deployment_name, serve
    except ImportError:
        raise UsageError(
            "`synclane serve` runs Prefect deployments: install the extra with "
            "pip install 'synclane[prefect]'"
        ) from None
    # --schema reaches the app as $SYNCLANE_SCHEMA (and through it every served run, which
    # inherits this process's environment); an app with another schema is refused here.
    if args.name is not None:
        check_deployment_name(args.name)
    cli_args.load_app(args).close()
    term.say(f"serving the Prefect deployments of {path} (Ctrl-C stops them)")
    serve(
        path,
        dsn=args.dsn or None,
        name=args.name,
        work_budget_seconds=args.work_budget,
        work_runs=args.work_runs,
    )
    return 0
