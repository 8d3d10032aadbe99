"""The `synclane` commands that read or fix the table once and return: migrate, workers, jobs,
progress, failures, requeue, cancel, pause, resume, prune.

Part of `synclane.cli`; each command takes the parsed arguments and the terminal and returns
the exit status.
"""

from __future__ import annotations

import argparse
import os
import warnings
from datetime import timedelta
from typing import TYPE_CHECKING

from synclane import cli_args
from synclane.app import SyncLane
from synclane.cli_args import UsageError

if TYPE_CHECKING:
    from synclane.terminal import Terminal


def cmd_migrate(args: argparse.Namespace, term: Terminal) -> int:
    if args.app or os.environ.get("SYNCLANE_APP"):
        app = cli_args.load_app(args)
    else:
        app = SyncLane(args.dsn or None, schema=args.schema or "synclane")
    term.say(f"schema {app.schema!r} is at version {app.migrate()}")
    return 0


def cmd_workers(args: argparse.Namespace, term: Terminal) -> int:
    from synclane.terminal import WORKER_COLUMNS, workers_summary

    if args.app or os.environ.get("SYNCLANE_APP"):
        app = cli_args.load_app(args)
        frame = app.workers(cli_args.queues(app, args.queue)[0] if args.queue else None)
    else:
        app = SyncLane(args.dsn or None, schema=args.schema or "synclane", create_schema=False)
        cli_args.check_table(app)
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
    with term.telling_the_change():
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
    with term.telling_the_change():
        resumed = app.resume(queue)
    if resumed:
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
