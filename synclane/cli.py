"""The `synclane` command: daily work on the jobs table from a terminal.

Exit status: 0 done; 2 a mistake on the command line (an option's value, a name the app or the
table does not know, a database that cannot be reached: one line on stderr names it); 3 `work
--until-idle` or `plan --work` stopped with jobs left open or waiting for a human (the last
lines say which and why); 1 an unexpected error (one line; `--traceback` shows where); 130
interrupted by Ctrl-C (the commands that run a while hand their jobs back first). SIGTERM and
SIGHUP end `work`, `demo` and `dashboard` with their usual status and any other command with
128 + the signal's number, after the same clean-up (the embedded PostgreSQL is stopped if
nothing else uses it). Results go to stdout; log lines and the progress bar to stderr
(synclane.terminal).

Here: the parser and `main`. The commands are in `cli_work` (those that run a while) and
`cli_table` (one-shot reads and fixes of the table); option values and shared help in `cli_args`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn

import psycopg

from synclane import cli_args, cli_table, cli_work
from synclane.app import DatabaseUnavailable, OwnerSourceError
from synclane.cli_args import (
    MAX_LIMIT,
    PROXY_HELP,
    PUBLIC_HOST_HELP,
    REMOTE_HELP,
    Stopped,
    UsageError,
    stopping_on_signals,
)
from synclane.connection import reading_only
from synclane.errors import SchemaError, first_line
from synclane.model import (
    MAX_REASON_LENGTH,
    MAX_WORK_BUDGET,
    MAX_WORK_RUNS,
    STATUSES,
    ConfigError,
)
from synclane.version import __version__

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
        sub.set_defaults(run=run, command_parser=sub)
        return sub

    name = cli_args.name
    demo = command(
        "demo",
        cli_work.cmd_demo,
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
        help="time factor: 1 is a pace to follow (the shop fixes its broken page about a minute "
        "in), 0.1 ten times faster",
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
        cli_table.cmd_migrate,
        "create or upgrade the schema",
        "synclane migrate --schema synclane",
        "synclane --app mysync.app:app migrate",
    )

    plan = command(
        "plan",
        cli_work.cmd_plan,
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
        cli_work.cmd_work,
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
        cli_table.cmd_workers,
        "the worker processes sharing the table: what they work, how busy, last seen, lost ones",
        "synclane --app mysync.app:app workers",
        "synclane --dsn postgresql://... --schema synclane workers",
    )
    workers.add_argument("--queue", type=name("--queue"), help="only the workers of this queue")

    jobs = command(
        "jobs",
        cli_table.cmd_jobs,
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
        cli_table.cmd_progress,
        "how far each owner's first load is",
        "synclane --app mysync.app:app progress --queue shops",
    )
    cli_args.add_filters(progress)

    failures = command(
        "failures",
        cli_table.cmd_failures,
        "open failures grouped by cause, each with a short id that `requeue --cause-id` takes",
        "synclane --app mysync.app:app failures --queue shops",
    )
    cli_args.add_filters(failures)

    requeue = command(
        "requeue",
        cli_table.cmd_requeue,
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
        help="only the jobs of this cause, its full text: the cause column of `synclane "
        "failures`, without its e.g. line (--cause-id is shorter)",
    )
    requeue.add_argument("--include-cancelled", action="store_true", help="cancelled jobs too")

    cancel = command(
        "cancel",
        cli_table.cmd_cancel,
        "cancel what has not finished for an owner (an account disconnected)",
        "synclane --app mysync.app:app cancel --owner globex --reason 'account closed'",
    )
    cli_args.add_filters(cancel, queue="the queue (needed when the app has several)")
    cancel.add_argument(
        "--reason",
        type=cli_args.reason("cancel"),
        required=True,
        help=f"kept in the jobs' error (at most {MAX_REASON_LENGTH:,} characters)",
    )

    pause = command(
        "pause",
        cli_table.cmd_pause,
        "stop taking from a queue in every process; running jobs stop at their next page",
        "synclane --app mysync.app:app pause --queue shops --reason 'warehouse maintenance'",
    )
    pause.add_argument(
        "--queue", type=name("--queue"), help="the queue (needed when the app has several)"
    )
    pause.add_argument(
        "--reason",
        type=cli_args.reason("pause"),
        required=True,
        help=f"why, shown to everyone (at most {MAX_REASON_LENGTH:,} characters)",
    )
    resume = command(
        "resume",
        cli_table.cmd_resume,
        "take from a paused queue again",
        "synclane --app mysync.app:app resume --queue shops",
    )
    resume.add_argument(
        "--queue", type=name("--queue"), help="the queue (needed when the app has several)"
    )
    prune = command(
        "prune",
        cli_table.cmd_prune,
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
        cli_work.cmd_dashboard,
        "serve the page for an app",
        "synclane --app mysync.app:app dashboard --port 8080",
    )
    page.add_argument("--host", default="127.0.0.1", help="where the page listens")
    page.add_argument("--port", type=int, default=8080, help="the page's port (0: any free one)")
    page.add_argument("--allow-remote", action="store_true", help=REMOTE_HELP)
    page.add_argument("--trust-proxy", action="store_true", help=PROXY_HELP)
    page.add_argument("--public-host", action="append", metavar="NAME", help=PUBLIC_HOST_HELP)
    page.add_argument(
        "--metrics",
        action="store_true",
        help="also serve Prometheus metrics of the table at /metrics (no login: names and counts)",
    )

    serve = command(
        "serve",
        cli_work.cmd_serve,
        "serve the app's Prefect deployments (synclane[prefect])",
        "synclane --app mysync.app:app serve --work-budget 540",
        "synclane --app mysync.app:app serve --name shops-staging",
    )
    serve.add_argument(
        "--work-budget",
        type=cli_args.whole(1, MAX_WORK_BUDGET, "540"),
        default=540,
        help="seconds each `work` run works (default 540)",
    )
    serve.add_argument(
        "--work-runs",
        type=cli_args.whole(1, MAX_WORK_RUNS, "2"),
        default=1,
        help="how many `work` runs to keep going at once (default 1)",
    )
    serve.add_argument(
        "--name",
        help="the deployments' name (default: from the app path); one per table on one server",
    )
    return main


def main(argv: Sequence[str] | None = None) -> int:
    main_parser = parser()
    try:
        args, extras = main_parser.parse_known_args(argv)
        if extras:  # told by the command's own parser, so that its --help is the one named
            command: argparse.ArgumentParser = getattr(args, "command_parser", main_parser)
            command.error(f"unrecognized arguments: {' '.join(extras)}")
    except SystemExit as done:  # --help, or a mistake argparse found (its line is printed)
        return done.code if isinstance(done.code, int) else EXIT_MISTAKE
    from synclane.terminal import Terminal

    term = Terminal(-1 if args.quiet else min(args.verbose, 1))
    term.setup_logging()
    try:
        cli_args.connection_environment(args)
        with stopping_on_signals(), _schema_rights(args.command):
            status: int = args.run(args, term)
    except Stopped as stop:
        return 128 + stop.signum
    except KeyboardInterrupt:
        return cli_work.EXIT_INTERRUPTED
    except Exception as error:
        mistake = isinstance(error, (UsageError, *USER_ERRORS))
        if args.traceback:
            traceback.print_exception(error, file=sys.stderr)
        else:
            first = _embedded_crash() or first_line(error)
            if not mistake:
                first = f"unexpected {type(error).__name__}: {first}"
            if not mistake or error.__cause__ is not None:  # where it came from may help
                first += " (--traceback shows where)"
            print(f"synclane: error: {first}", file=sys.stderr)
        return EXIT_MISTAKE if mistake else 1
    finally:
        term.close_logging()
    return status


# The commands that may create the schema (and the demo's tables) when it is missing; every
# other one reads or fixes rows that must exist, and says so when they do not.
CREATING = frozenset({"migrate", "plan", "work", "demo", "serve"})


def _schema_rights(command: str) -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext() if command in CREATING else reading_only()


def _embedded_crash() -> str | None:
    """What the embedded PostgreSQL's log says, when it crashed under this command."""
    embedded = sys.modules.get("synclane.embedded")
    if embedded is None:
        return None
    notes: list[str] = embedded.crash_notes()
    return notes[0] if notes else None


if __name__ == "__main__":
    sys.exit(main())
