"""The `synclane` command: daily work on the jobs table from a terminal.

Exit status: 0 done; 2 a mistake on the command line (an option's value, a name the app or the
table does not know, a database that cannot be reached: one line on stderr names it); 3 `work
--until-idle` or `plan --work` stopped with jobs left open or waiting for a human (the last
lines say which and why); 1 an unexpected error (one line; `--traceback` shows where); 130
interrupted. Results go to stdout; log lines and the progress bar to stderr (synclane.terminal).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

import psycopg

from synclane import __version__, cli_args
from synclane.app import DatabaseUnavailable, OwnerSourceError, SyncLane, redact
from synclane.cli_args import UsageError
from synclane.errors import SchemaError
from synclane.model import STATUSES, ConfigError

if TYPE_CHECKING:
    from synclane.terminal import Terminal

USER_ERRORS = (
    ConfigError,
    DatabaseUnavailable,
    OwnerSourceError,
    SchemaError,
    psycopg.OperationalError,
)
EXIT_MISTAKE = 2
EXIT_WORK_LEFT = 3
MAX_LIMIT = 100_000  # rows `jobs` prints; more is a job for SQL or app.jobs()


# -- commands: each returns the exit status -------------------------------------------------


def cmd_migrate(args: argparse.Namespace, term: Terminal) -> int:
    if args.app or os.environ.get("SYNCLANE_APP"):
        app = cli_args.load_app(args)
    else:
        app = SyncLane(args.dsn or None, schema=args.schema or "synclane")
    term.say(f"schema {app.schema!r} is at version {app.migrate()}")
    return 0


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
    from synclane.worker import IDLE_GRACE

    grace = IDLE_GRACE if idle_grace is None else timedelta(seconds=idle_grace)
    listeners: list[Callable[..., object]] = [EventPrinter(app)]
    with contextlib.ExitStack() as serving:
        if metrics_at is not None:
            listeners.append(_serve_metrics(app, queues, *metrics_at, term, serving))
        elapsed = timer()
        with term.progress(lambda: app.open_jobs(queues), "working") as bar:
            worker = app.worker(
                queues, seconds, until_idle=until_idle, idle_grace=grace,
                on_event=[*listeners, bar],
            )  # fmt: skip
            report = worker.run()
    term.say(f"worker stopped after {elapsed():.0f} s: {report_text(report)}")
    left = left_open(app, queues)
    for line in left or ["nothing left open"]:
        term.say(line)
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


def cmd_workers(args: argparse.Namespace, term: Terminal) -> int:
    from synclane.terminal import WORKER_COLUMNS, workers_summary

    if args.app or os.environ.get("SYNCLANE_APP"):
        app = cli_args.load_app(args)
        frame = app.workers(cli_args.queues(app, args.queue)[0] if args.queue else None)
    else:
        app = SyncLane(args.dsn or None, schema=args.schema or "synclane", create_schema=False)
        frame = app.workers()
        if args.queue:  # no app to check the name against: as given
            frame = frame[frame["queues"].map(lambda queues: args.queue in queues)]
    term.table(frame, WORKER_COLUMNS, "no worker: none runs, and none died in the last hour")
    if not frame.empty:
        term.say(workers_summary(frame))
    return 0


def cmd_jobs(args: argparse.Namespace, term: Terminal) -> int:
    from synclane.terminal import JOB_COLUMNS

    app = cli_args.load_app(args)
    queues = cli_args.queues(app, args.queue)
    cli_args.check_type(app, queues, args.type)
    frame = app.jobs(args.queue, args.owner, args.status, args.type, args.limit)
    if frame.empty:
        cli_args.check_owner(app, queues, args.owner)
    term.table(frame, JOB_COLUMNS, "no jobs match" if args.owner or args.status else "no jobs")
    return 0


def cmd_progress(args: argparse.Namespace, term: Terminal) -> int:
    from synclane.terminal import PROGRESS_COLUMNS

    app = cli_args.load_app(args)
    queues = cli_args.queues(app, args.queue)
    cli_args.check_type(app, queues, args.type)
    for queue in queues:
        if len(queues) > 1:
            term.say(f"== {queue}")
        with warnings.catch_warnings(record=True) as cut:
            warnings.simplefilter("always")
            frame = app.progress(queue, args.owner, args.type)
        if frame.empty:
            cli_args.check_owner(app, queues, args.owner)
        term.table(frame, PROGRESS_COLUMNS, "nothing planned yet")
        for warning in cut:  # a long answer was cut: say so in one line, not as a warning
            term.say(str(warning.message).splitlines()[0])
    return 0


def cmd_failures(args: argparse.Namespace, term: Terminal) -> int:
    from synclane.terminal import FAILURE_COLUMNS

    app = cli_args.load_app(args)
    queues = cli_args.queues(app, args.queue)
    cli_args.check_type(app, queues, args.type)
    frame = app.failures(args.queue, args.owner, args.type)
    if frame.empty:
        cli_args.check_owner(app, queues, args.owner)
    term.table(frame, FAILURE_COLUMNS, "no open failures")
    if not frame.empty:
        term.say(
            "`synclane requeue --cause-id ID` gives the jobs of a cause fresh attempts (add "
            "--queue where the app has several); `synclane jobs --status abandoned` lists the "
            "jobs that wait for a human"
        )
    return 0


def cmd_requeue(args: argparse.Namespace, term: Terminal) -> int:
    app = cli_args.load_app(args)
    (queue,) = cli_args.queues(app, args.queue, one=True)
    cli_args.check_type(app, [queue], args.type)
    count = app.requeue(
        queue,
        args.owner,
        args.type,
        ids=args.id or None,
        include_cancelled=args.include_cancelled,
        cause=args.cause,
        cause_id=args.cause_id,
    )
    if count:
        term.say(f"requeued {count} job(s) in queue {queue}")
        return 0
    narrowed = cli_args.filters(owner=args.owner, type=args.type)
    if args.cause_id or args.cause:
        named = f"cause id {args.cause_id}" if args.cause_id else f"cause {args.cause!r}"
        raise UsageError(
            f"no open failure matches {named} in queue {queue}{narrowed}: `synclane failures` "
            "lists the open causes and their ids"
        )
    if args.id:
        found = app.jobs(queue, ids=args.id, limit=len(args.id))
        missing = sorted(set(args.id) - {int(i) for i in found["id"]})
        if missing:
            raise UsageError(f"argument --id: queue {queue} has no job {missing[0]}")
        states = ", ".join(f"job {r.id} is {r.status}" for r in found.itertuples())
        term.say(f"nothing to requeue: {states}")
        return 0
    cli_args.check_owner(app, [queue], args.owner)
    stopped = "failed, deferred, abandoned or cancelled"
    if not args.include_cancelled:
        stopped = "failed, deferred or abandoned"
    term.say(f"nothing to requeue: no {stopped} job in queue {queue}{narrowed}")
    return 0


def cmd_cancel(args: argparse.Namespace, term: Terminal) -> int:
    if args.owner is None:
        raise UsageError("argument --owner is needed: whose unfinished jobs to cancel")
    app = cli_args.load_app(args)
    (queue,) = cli_args.queues(app, args.queue, one=True)
    cli_args.check_type(app, [queue], args.type)
    count = app.cancel(queue, args.owner, args.reason, type=args.type)
    if not count:
        cli_args.check_owner(app, [queue], args.owner)
        term.say(f"nothing to cancel: {args.owner} has no unfinished job in queue {queue}")
    else:
        term.say(f"cancelled {count} job(s) of {args.owner} in queue {queue}")
    return 0


def cmd_pause(args: argparse.Namespace, term: Terminal) -> int:
    app = cli_args.load_app(args)
    (queue,) = cli_args.queues(app, args.queue, one=True)
    pause = app.pause(queue, args.reason)
    since = f"{pause['paused_at']:%Y-%m-%d %H:%M:%S} UTC"
    term.say(
        f"queue {queue} paused since {since} by {pause['paused_by']}: {pause['reason']}; "
        "running jobs stop at their next page"
    )
    return 0


def cmd_resume(args: argparse.Namespace, term: Terminal) -> int:
    app = cli_args.load_app(args)
    (queue,) = cli_args.queues(app, args.queue, one=True)
    if app.resume(queue):
        term.say(f"queue {queue} resumed")
    else:
        term.say(f"queue {queue} was not paused")
    return 0


def cmd_prune(args: argparse.Namespace, term: Terminal) -> int:
    app = cli_args.load_app(args)
    queue = cli_args.queues(app, args.queue, one=True)[0] if args.queue else None
    deleted = app.prune(queue, older_than=timedelta(days=args.older_than_days))
    where = f" in queue {queue}" if queue else ""
    term.say(f"pruned {deleted} finished row(s) older than {args.older_than_days:g} day(s){where}")
    return 0


def cmd_dashboard(args: argparse.Namespace, term: Terminal) -> int:
    from synclane import dashboard

    dashboard.serve(
        cli_args.load_app(args),
        host=args.host,
        port=args.port,
        allow_remote=args.allow_remote,
        trust_proxy=args.trust_proxy,
        on_ready=lambda url: print(f"synclane dashboard on {url} (Ctrl-C stops it)", flush=True),
        **_page_options(args),
    )
    return 0


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


def cmd_demo(args: argparse.Namespace, term: Terminal) -> int:
    from synclane import dashboard
    from synclane.demo import build_demo, data_schema_for
    from synclane.demo.story import Story
    from synclane.demo.story import log as story_log
    from synclane.events import EventLog, Listener
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
    command = "synclane" + (f" --schema {schema}" if schema != "synclane" else "")
    command += " --app synclane.demo.app:app"
    same_dsn = " (with the same --dsn)" if args.dsn else ""
    term.say(f"Ctrl-C stops it; `{command} jobs` shows the table from another terminal{same_dsn}")

    def say(text: str) -> None:
        story_log.info("%s", text)
        events.note(text)

    story = Story(demo, command=command, say=say)
    story.intro(sum(app.plan().values()), kept=args.keep)
    try:
        with term.progress(lambda: app.open_jobs(), "demo") as bar:
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
    return 0


def cmd_serve(args: argparse.Namespace, term: Terminal) -> int:
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
    term.say(f"serving the Prefect deployments of {path} (Ctrl-C stops them)")
    serve(
        path,
        dsn=args.dsn or None,
        work_budget_seconds=args.work_budget,
        work_runs=args.work_runs,
    )
    return 0


# -- the parser -----------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    """argparse, with a mistake printed as one line instead of the usage and the message."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_MISTAKE, f"synclane: error: {message} (`{self.prog} --help` helps)\n")


def parser() -> argparse.ArgumentParser:
    main = Parser(
        prog="synclane",
        description="Sync jobs in a PostgreSQL table: plan, work, inspect, fix.",
        epilog=cli_args.EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cli_args.add_common(main, None)
    main.add_argument("--version", action="version", version=f"synclane {__version__}")
    main.set_defaults(verbose=0, quiet=False, traceback=False, schema=os.environ.get(
        "SYNCLANE_SCHEMA") or None)  # fmt: skip
    common = Parser(add_help=False)
    cli_args.add_common(common, argparse.SUPPRESS, title="options of every command")
    commands = main.add_subparsers(dest="command", required=True, metavar="command")

    def command(
        name: str, run: Callable[[argparse.Namespace, Terminal], int], text: str, *examples: str
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name,
            help=text,
            description=text,
            parents=[common],
            epilog="examples:\n" + "\n".join(f"  {example}" for example in examples),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.set_defaults(run=run)
        return sub

    name = cli_args.name
    demo = command(
        "demo",
        cmd_demo,
        "run the demo shop with workers and its page (docs/demo.md tells its story)",
        "synclane demo                 # the story at its own pace, page on 127.0.0.1:8080",
        "synclane demo --speed 0.2     # five times faster",
        "synclane demo --keep --no-page --for 60",
    )
    demo.add_argument("--host", default="127.0.0.1", help="where the page listens")
    demo.add_argument("--port", type=int, default=8080, help="the page's port (0: any free one)")
    demo.add_argument("--allow-remote", action="store_true", help=REMOTE_HELP)
    demo.add_argument("--trust-proxy", action="store_true", help=PROXY_HELP)
    demo.add_argument("--public-host", action="append", metavar="NAME", help=PUBLIC_HOST_HELP)
    demo.add_argument(
        "--speed",
        type=cli_args.speed,
        default=1.0,
        help="time factor: 1 is a pace to follow (about two minutes), 0.1 ten times faster",
    )
    demo.add_argument(
        "--for", dest="seconds", type=cli_args.seconds, help="stop after this many seconds"
    )
    demo.add_argument("--no-page", action="store_true", help="do not serve the page")
    demo.add_argument(
        "--keep", action="store_true", help="continue the last run's story instead of restarting"
    )

    command(
        "migrate",
        cmd_migrate,
        "create or upgrade the schema",
        "synclane migrate --schema synclane",
        "synclane --app mysync.app:app migrate",
    )

    plan = command(
        "plan",
        cmd_plan,
        "insert the jobs that should exist and do not",
        "synclane --app mysync.app:app plan",
        "synclane --app mysync.app:app plan --queue shops --owner globex",
        "synclane --app mysync.app:app plan --horizon-days 730 --work   # a backfill",
    )
    cli_args.add_filters(plan)
    plan.add_argument(
        "--horizon-days", type=cli_args.days, help="widen history to this many days, this call"
    )
    plan.add_argument("--work", action="store_true", help="then work until idle (a backfill)")
    plan.add_argument(
        "--idle-grace",
        type=cli_args.grace,
        metavar="SECONDS",
        help="with --work: wait this long for retries and throttles due soon (default 30)",
    )

    work = command(
        "work",
        cmd_work,
        "run worker slots until stopped, for a time, or until idle",
        "synclane --app mysync.app:app work              # until Ctrl-C or SIGTERM",
        "synclane --app mysync.app:app work --for 540    # a time budget",
        "synclane --app mysync.app:app work --until-idle --idle-grace 30",
    )
    work.add_argument(
        "--queue", type=name("--queue"), action="append", help="a queue to work (repeatable)"
    )
    work.add_argument(
        "--for", dest="seconds", type=cli_args.seconds, help="stop after this many seconds"
    )
    work.add_argument(
        "--until-idle",
        action="store_true",
        help="stop once nothing runs and nothing is due within the grace; exit 3 if jobs are "
        "left open or waiting for a human",
    )
    work.add_argument(
        "--idle-grace",
        type=cli_args.grace,
        metavar="SECONDS",
        help="with --until-idle: wait this long for retries and throttles due soon (default 30)",
    )

    work.add_argument(
        "--metrics-port",
        type=cli_args.whole(0, 65_535, "9108"),
        metavar="PORT",
        help="serve Prometheus metrics at http://127.0.0.1:PORT/metrics (0: any free port)",
    )
    work.add_argument(
        "--metrics-host",
        metavar="HOST",
        help="where the metrics listen (default 127.0.0.1; 0.0.0.0 for a Prometheus on another "
        "machine: they show queue, type and lane names)",
    )

    workers = command(
        "workers",
        cmd_workers,
        "the worker processes sharing the table: what they work, how busy, last seen, lost ones",
        "synclane --app mysync.app:app workers",
        "synclane --dsn postgresql://... --schema synclane workers",
    )
    workers.add_argument("--queue", type=name("--queue"), help="only the workers of this queue")

    jobs = command(
        "jobs",
        cmd_jobs,
        "list jobs, newest first",
        "synclane --app mysync.app:app jobs --status failed",
        "synclane --app mysync.app:app jobs --owner globex --limit 200",
    )
    cli_args.add_filters(jobs)
    jobs.add_argument("--status", choices=STATUSES, help="only this status")
    jobs.add_argument(
        "--limit",
        type=cli_args.whole(1, MAX_LIMIT, "200"),
        default=50,
        help=f"at most this many (default 50, at most {MAX_LIMIT:,})",
    )

    progress = command(
        "progress",
        cmd_progress,
        "how far each owner's first load is",
        "synclane --app mysync.app:app progress --queue shops",
    )
    cli_args.add_filters(progress)

    failures = command(
        "failures",
        cmd_failures,
        "open failures grouped by cause, each with a short id that `requeue --cause-id` takes",
        "synclane --app mysync.app:app failures --queue shops",
    )
    cli_args.add_filters(failures)

    requeue = command(
        "requeue",
        cmd_requeue,
        "fresh attempts for failed, deferred and abandoned jobs; each continues at its cursor",
        "synclane --app mysync.app:app requeue --cause-id 3f2a9c1b",
        "synclane --app mysync.app:app requeue --queue shops --owner globex",
        "synclane --app mysync.app:app requeue --queue shops --id 12 --id 13",
    )
    cli_args.add_filters(requeue, queue="the queue (needed when the app has several)")
    requeue.add_argument(
        "--id",
        type=cli_args.whole(1, 2**63 - 1, "12"),
        action="append",
        help="a job id (repeatable)",
    )
    requeue.add_argument(
        "--cause-id",
        type=cli_args.cause_id,
        metavar="ID",
        help="only the jobs of this cause: its id in the first column of `synclane failures`",
    )
    requeue.add_argument(
        "--cause",
        type=name("--cause"),
        help="only the jobs of this cause, its full text as app.failures() gives it "
        "(--cause-id is shorter)",
    )
    requeue.add_argument("--include-cancelled", action="store_true", help="cancelled jobs too")

    cancel = command(
        "cancel",
        cmd_cancel,
        "cancel what has not finished for an owner (an account disconnected)",
        "synclane --app mysync.app:app cancel --owner globex --reason 'account closed'",
    )
    cli_args.add_filters(cancel, queue="the queue (needed when the app has several)")
    cancel.add_argument(
        "--reason", type=name("--reason"), required=True, help="kept in the jobs' error"
    )

    pause = command(
        "pause",
        cmd_pause,
        "stop taking from a queue in every process; running jobs stop at their next page",
        "synclane --app mysync.app:app pause --queue shops --reason 'warehouse maintenance'",
    )
    pause.add_argument(
        "--queue", type=name("--queue"), help="the queue (needed when the app has several)"
    )
    pause.add_argument(
        "--reason", type=name("--reason"), required=True, help="why, shown to everyone"
    )
    resume = command(
        "resume",
        cmd_resume,
        "take from a paused queue again",
        "synclane --app mysync.app:app resume --queue shops",
    )
    resume.add_argument(
        "--queue", type=name("--queue"), help="the queue (needed when the app has several)"
    )
    prune = command(
        "prune",
        cmd_prune,
        "delete finished rows older than N days that nothing needs any more (docs/operations.md)",
        "synclane --app mysync.app:app prune --older-than-days 30",
        "synclane --app mysync.app:app prune --queue shops --older-than-days 7",
    )
    prune.add_argument("--queue", type=name("--queue"), help="only this queue")
    prune.add_argument(
        "--older-than-days",
        type=cli_args.days,
        required=True,
        metavar="N",
        help="keep what finished within the last N days",
    )

    page = command(
        "dashboard",
        cmd_dashboard,
        "serve the page for an app",
        "synclane --app mysync.app:app dashboard --port 8080",
    )
    page.add_argument("--host", default="127.0.0.1", help="where the page listens")
    page.add_argument("--port", type=int, default=8080, help="the page's port (0: any free one)")
    page.add_argument("--allow-remote", action="store_true", help=REMOTE_HELP)
    page.add_argument("--trust-proxy", action="store_true", help=PROXY_HELP)
    page.add_argument("--public-host", action="append", metavar="NAME", help=PUBLIC_HOST_HELP)

    serve = command(
        "serve",
        cmd_serve,
        "serve the app's Prefect deployments (synclane[prefect])",
        "synclane --app mysync.app:app serve --work-budget 540",
    )
    serve.add_argument(
        "--work-budget",
        type=cli_args.whole(1, 86_400, "540"),
        default=540,
        help="seconds each `work` run works (default 540)",
    )
    serve.add_argument(
        "--work-runs",
        type=cli_args.whole(1, 1_000, "2"),
        default=1,
        help="how many `work` runs to keep going at once (default 1)",
    )
    return main


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as done:  # --help, or a mistake argparse found (its line is printed)
        return done.code if isinstance(done.code, int) else EXIT_MISTAKE
    from synclane.terminal import Terminal

    term = Terminal(-1 if args.quiet else min(args.verbose, 1))
    term.setup_logging()
    try:
        status: int = args.run(args, term)
    except KeyboardInterrupt:
        return 130
    except Exception as error:
        mistake = isinstance(error, (UsageError, *USER_ERRORS))
        if args.traceback:
            traceback.print_exception(error, file=sys.stderr)
        else:
            text = str(error).strip()
            first = text.splitlines()[0] if text else type(error).__name__
            if not mistake:
                first = f"unexpected {type(error).__name__}: {first}"
            if not mistake or error.__cause__ is not None:  # where it came from may help
                first += " (--traceback shows where)"
            print(f"synclane: error: {first}", file=sys.stderr)
        return EXIT_MISTAKE if mistake else 1
    finally:
        term.close_logging()
    return status


if __name__ == "__main__":
    sys.exit(main())
