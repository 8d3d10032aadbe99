"""The Prefect flows: plan, work, backfill, requeue.

Each is a thin wrapper: it loads the app (from a `SyncLaneDatabase` block, or from an app path
with the DSN in $SYNCLANE_DSN), calls plain functions of `synclane.prefect.operations`, and
tells Prefect what happened: log lines, artifacts, Prefect events and the run's final state.
The sync state stays in PostgreSQL: a flow run holds nothing that another run or a plain
`synclane work` process could not take over.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from uuid import UUID

from prefect import flow, get_run_logger
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.client.schemas.objects import State
from prefect.context import FlowRunContext
from prefect.events import emit_event
from prefect.states import Cancelled, Completed, Failed

from synclane.app import SyncLane
from synclane.causes import Causes, Noted
from synclane.hosting import through_outage
from synclane.model import ConfigError
from synclane.prefect.blocks import SyncLaneDatabase
from synclane.prefect.identity import TableIdentity, artifact_key, table_identity
from synclane.prefect.lifecycle import (
    RunWatch,
    after_crash,
    after_run,
    forget,
    wants_successor,
    work_began,
    work_ended,
)
from synclane.prefect.operations import (
    STOP_GRACE_SECONDS,
    WORK_BUDGET_SECONDS,
    History,
    Row,
    check_queues,
    load_app,
    plan_summary,
    progress_rows,
    run_worker_until_stopped,
    watch_history,
    widen_history,
    worth_publishing,
)
from synclane.prefect.reporting import PREFECT_EVENT_KINDS, WorkLog, prefect_event, work_outcome
from synclane.prefect.runs import keep_work_runs, latest_table, served_table

__all__ = ["WORK_BUDGET_SECONDS", "backfill", "plan", "requeue", "work"]

T = TypeVar("T")


def called(result: T | Coroutine[Any, Any, T]) -> T:
    """The result of a Prefect function that answers sync callers synchronously (it is typed
    as possibly a coroutine, for async callers)."""
    if isinstance(result, Coroutine):
        result.close()
        raise TypeError("a Prefect call returned a coroutine in sync code")
    return result


def app_for(database: str | None = None, app_path: str | None = None) -> SyncLane:
    """The app of a flow run: from the `SyncLaneDatabase` block named `database`, else from
    `app_path` (or $SYNCLANE_APP) with the DSN from $SYNCLANE_DSN."""
    _log_synclane_at_info()
    if database:
        block = SyncLaneDatabase.load(database)
        assert isinstance(block, SyncLaneDatabase)
        return block.get_app()
    path = app_path or os.environ.get("SYNCLANE_APP")
    if not path:
        raise ConfigError(
            "the flow needs an app: pass database=<name of a SyncLaneDatabase block>, or "
            "app_path='package.module:app' with the DSN in $SYNCLANE_DSN"
        )
    return load_app(path)


def _log_synclane_at_info() -> None:
    """The `synclane` logger reaches the run's logs through PREFECT_LOGGING_EXTRA_LOGGERS, but
    inherits the root logger's WARNING level; job starts and completions are INFO."""
    logger = logging.getLogger("synclane")
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)


def _this_run() -> tuple[UUID | None, UUID | None]:
    """(this flow run's id, its deployment's id); None outside a run or a deployment."""
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return None, None
    return context.flow_run.id, context.flow_run.deployment_id


def _table_of(app: SyncLane, what: str) -> TableIdentity:
    """The app's table; in a run of a served deployment, the table the deployment serves (its
    tag): two processes that serve one deployment name for two tables would otherwise each
    run the other's runs on their own table."""
    table = through_outage(lambda: table_identity(app), what)
    context = FlowRunContext.get()
    tags = context.flow_run.tags if context is not None and context.flow_run is not None else []
    served = served_table(tags)
    if served is not None and served != table.slug:
        raise ConfigError(
            f"this run's deployment serves the table {served}, but the process that runs it "
            f"has the app of {table.slug}: two `synclane serve` processes serve one deployment "
            "name for two tables; give each table a name of its own (synclane serve --name)"
        )
    return table


RunLogger = logging.Logger | logging.LoggerAdapter[Any]


def _keep_work_runs(
    deployment: str | UUID, logger: RunLogger, exclude: UUID | None = None
) -> list[UUID]:
    topped = keep_work_runs(deployment, exclude=exclude)
    for run in topped.overdue:
        logger.warning(
            "work run %s has been Running since %s, far beyond its budget: its process is "
            "probably gone (a lost machine); it no longer counts. Mark it Crashed in the UI.",
            run.name,
            run.start_time,
        )
    if topped.started:
        logger.info(
            "work deployment %s: %d of %d run(s) working, started %d more",
            topped.deployment,
            topped.active,
            topped.limit,
            len(topped.started),
        )
    return topped.started


@flow(name="synclane-plan")
def plan(
    database: str | None = None,
    app_path: str | None = None,
    queue: str | None = None,
    work_deployment: str | None = None,
    artifacts_every_minutes: float = 10,
    due_only: bool = False,
) -> dict[str, int]:
    """Plan every queue (or one): add the jobs that should exist and do not. With `due_only`
    (what the served deployment's schedule passes), plan what is due as a worker's planning
    round does (`app.plan_due()`): its cost follows what is due, not the fleet. Publishes a
    progress table per queue (one row per owner and type) and a markdown summary when the
    progress changed, at most every `artifacts_every_minutes`. With `work_deployment`
    ('synclane-work/<name>'), then starts runs of that deployment until as many work as its
    concurrency limit says."""
    app = app_for(database, app_path)
    logger = get_run_logger()
    try:
        queues = check_queues(app, None if queue is None else [queue])
        table = _table_of(app, "a plan run")
        planned = app.plan_due if due_only else app.plan
        added = through_outage(lambda: planned(queue), "a plan run")
        for name, count in added.items():
            logger.info("queue %s: %d new job(s)", name, count)
        _publish_progress(app, table, queues, added, timedelta(minutes=artifacts_every_minutes))
    finally:
        # Work goes on even when planning failed (an owner source that is down).
        if work_deployment:
            _keep_work_runs(work_deployment, logger)
    return added


def _publish_progress(
    app: SyncLane,
    table: TableIdentity,
    queues: list[str],
    added: dict[str, int],
    every: timedelta,
) -> None:
    progress: dict[str, list[Row]] = {}
    changed = False
    now = datetime.now(UTC)
    for name in queues:
        rows = progress[name] = through_outage(
            functools.partial(progress_rows, app, name), "a plan run reading progress"
        )
        key = artifact_key(table, "progress", name)
        previous, previous_at = latest_table(key)
        if worth_publishing(rows, previous, previous_at, now, every):
            changed = True
            create_table_artifact(
                rows,
                key=key,
                description=(
                    f"How far the first load of each owner and type of queue `{name}` is "
                    f"({table.label})."
                ),
            )
    if changed:
        create_markdown_artifact(
            plan_summary(added, progress),
            key=artifact_key(table, "plan"),
            description=f"What planning added, and how far history is ({table.label}).",
        )


class PrefectEvents:
    """Sends the events a team alerts on to Prefect (see `synclane.prefect.reporting`), from
    the flow's own thread: a `Causes` listener keeps them on the worker's loop, `send` reads
    their causes (one statement) and emits them. Keeps every event it sent with its cause, for
    the run's outcome."""

    def __init__(self, app: SyncLane, table: TableIdentity) -> None:
        self.table = table
        self.listener = Causes(app, PREFECT_EVENT_KINDS)
        self.sent: list[Noted] = []
        self._said = False

    def send(self, *, final: bool = False) -> None:
        for noted in self.listener.take(final=final):
            self.sent.append(noted)
            try:
                emit_event(**prefect_event(noted.event, self.table, noted))
            except Exception as error:  # an event lost costs no job and ends no run
                if not self._said:
                    self._said = True
                    logging.getLogger("synclane").warning("could not send an event: %s", error)


@flow(
    name="synclane-work",
    on_completion=[after_run],
    on_failure=[after_run],
    on_crashed=[after_crash],
    on_cancellation=[forget],
)
def work(
    database: str | None = None,
    app_path: str | None = None,
    queues: list[str] | None = None,
    budget_seconds: float = WORK_BUDGET_SECONDS,
    until_idle: bool = False,
    idle_grace_seconds: float = 30,
    fail_on_abandoned: bool = True,
    stop_grace_seconds: float = STOP_GRACE_SECONDS,
) -> dict[str, int] | State:
    """Run worker slots for `budget_seconds` (or, with `until_idle`, until nothing runs and
    nothing becomes due within `idle_grace_seconds`), then hand running jobs back with their
    cursors and return what the slots did. A page in flight when the budget ends may end within
    `stop_grace_seconds`; a job whose page was cut off 3 times in a row with nothing saved fails
    an attempt with an error that names the stop grace (a page longer than the budget). Sends
    Prefect events for failed attempts, deferred and abandoned jobs, finished first loads,
    throttled lanes and lost leases; publishes a report artifact.
    The run ends Failed when a job was abandoned in it for a new cause (synclane.causes; unless
    `fail_on_abandoned` is off). A run of a deployment that used its whole budget, or crashed
    after working a while, starts its successor once it has ended. A cancelled run hands its
    jobs back through the same path before it ends, also when its runner no longer passes the
    cancel on (the run watches its own state), and so does a run whose deployment was deleted."""
    run_id, deployment_id = _this_run()
    if run_id is not None:
        work_began(run_id)
    app = app_for(database, app_path)
    logger = get_run_logger()
    names = check_queues(app, queues)
    table = _table_of(app, "a work run")
    through_outage(app.check_schema, "a work run")
    worklog = WorkLog()
    events = PrefectEvents(app, table)
    worker = app.worker(
        names,
        budget_seconds,
        until_idle=until_idle,
        idle_grace=idle_grace_seconds,
        stop_grace=stop_grace_seconds,
        on_event=[worklog, events.listener],
    )
    logger.info(
        "working queues %s of %s for up to %.0f s as %s",
        ", ".join(names),
        table.label,
        budget_seconds,
        app.worker_name,
    )
    watch = None
    if run_id is not None and deployment_id is not None:
        watch = RunWatch(worker, run_id, deployment_id).start()
    began = time.monotonic()
    interruption: BaseException | None = None
    try:
        report = run_worker_until_stopped(worker, between_polls=events.send)
    except BaseException as error:
        interruption = error
        raise
    finally:
        if watch is not None:
            watch.close()
        events.send(final=True)
        seconds = time.monotonic() - began
        stopped = None if watch is None else watch.reason
        ended = _why_it_stopped(interruption, stopped, until_idle, seconds, budget_seconds)
        _publish_work_report(worklog, names, app, table, seconds, ended, dict(worker.report))
    logger.info("worker report: %s", report or "nothing to do")
    if stopped is not None:
        if run_id is not None:
            work_ended(run_id)  # no successor
        return Cancelled(message=f"{ended}; no successor is started")
    if run_id is not None and deployment_id is not None and ended == BUDGET_USED:
        # Started by the run's hook once its final state is recorded (after_run): by
        # then its slot in the deployment's limit is free. The plan runs start it otherwise.
        wants_successor(run_id)
    failure = work_outcome(report, events.sent, fail_on_abandoned)
    if failure is not None:
        return Failed(message=failure)
    return report


BUDGET_USED = "its time budget was used"


def _why_it_stopped(
    interruption: BaseException | None,
    stopped: str | None,
    until_idle: bool,
    seconds: float,
    budget: float,
) -> str:
    if interruption is not None:
        return f"it was interrupted ({type(interruption).__name__}) and handed its jobs back"
    if stopped is not None:
        return f"{stopped}, and it handed its jobs back"
    if until_idle and seconds < budget - 1:
        return "nothing was left to do"
    return BUDGET_USED


def _publish_work_report(
    worklog: WorkLog,
    queues: list[str],
    app: SyncLane,
    table: TableIdentity,
    seconds: float,
    ended: str,
    report: dict[str, int],
) -> None:
    """The run's report as a markdown artifact; a failure to publish it is logged, never
    raised (it must not hide why the run ended)."""
    try:
        create_markdown_artifact(
            worklog.markdown(
                queues=queues,
                worker=app.worker_name,
                table=table,
                seconds=seconds,
                ended=ended,
                report=report,
            ),
            key=artifact_key(table, "work"),
            description=f"What a work run did and what failed ({table.label}).",
        )
    except Exception as error:  # the Prefect API is away, or the run is being torn down
        logging.getLogger("synclane").warning("could not publish the work report: %s", error)


@flow(name="synclane-backfill")
def backfill(
    queue: str,
    type: str,
    horizon_days: float,
    owners: list[str] | None = None,
    database: str | None = None,
    app_path: str | None = None,
    budget_seconds: float = 3600,
    poll_seconds: float = 10,
) -> dict[str, Any] | State:
    """Widen the history of one windowed type back to `horizon_days` for every connected owner
    (or only `owners`), then report in a progress artifact how far it is loaded, until every
    slice is loaded or stopped for good (abandoned, cancelled) or `budget_seconds` have passed
    (0: do not wait). The work deployment's runs do the loading. Ends Failed when some slices
    were stopped for good (they load only once requeued), else Completed: every slice loaded,
    or it did not wait, or the budget ended while slices still load; the message says which."""
    app = app_for(database, app_path)
    logger = get_run_logger()
    check_queues(app, [queue])
    table = _table_of(app, "a backfill run")
    horizon = timedelta(days=horizon_days)
    added = through_outage(
        lambda: widen_history(app, queue, type, horizon, owners), "a backfill run"
    )
    who = "every connected owner" if owners is None else ", ".join(owners)
    logger.info(
        "%s.%s back to %s days for %s: %d new slice(s)", queue, type, horizon_days, who, added
    )
    artifact_id = called(
        create_progress_artifact(
            0.0,
            key=artifact_key(table, "backfill", queue, type),
            description=f"History of {queue}.{type} loaded ({who}; {table.label}).",
        )
    )
    last: list[float] = []

    def report(history: History, rows: list[Row]) -> None:
        if last and last[-1] == history.percent:
            return
        last.append(history.percent)
        update_progress_artifact(artifact_id, history.percent)
        logger.info("%s.%s history: %s", queue, type, history.describe())

    history, rows = watch_history(
        app,
        queue,
        type,
        owners,
        budget_seconds=max(budget_seconds, 0),
        poll_seconds=poll_seconds,
        report=report,
    )
    create_table_artifact(
        rows,
        key=artifact_key(table, "backfill", queue, type, "owners"),
        description=f"History of {queue}.{type} per owner at the end of the backfill.",
    )
    result = {"added": added, **history.as_dict()}
    return _backfill_state(history, result, budget_seconds)


def _backfill_state(history: History, result: dict[str, Any], budget_seconds: float) -> State:
    """Failed only when a slice will not load without a human (abandoned, cancelled); a budget
    that ends while slices still load is how a long backfill ends, not a failure."""
    if budget_seconds <= 0:
        return Completed(message=f"not waited for: {history.describe()}", data=result)
    if history.abandoned or history.cancelled:
        return Failed(
            message=(
                f"{history.describe()}: the stopped slices load only once requeued (the "
                "requeue flow, or app.requeue)"
            )
        )
    if history.settled:
        return Completed(message=history.describe(), data=result)
    return Completed(
        message=(
            f"the budget of {budget_seconds:.0f} s ended: {history.describe()}; the work runs go "
            "on loading them (the progress artifacts and `synclane progress` follow them)"
        ),
        data=result,
    )


@flow(name="synclane-requeue")
def requeue(
    queue: str,
    owner: str | None = None,
    cause: str | None = None,
    type: str | None = None,
    database: str | None = None,
    app_path: str | None = None,
    cause_id: str | None = None,
) -> int:
    """Give the failed, deferred and abandoned jobs of a queue (of one owner, one type, or one
    failure cause as `app.failures()` shows it: its text in `cause`, or its 8 hex digits in
    `cause_id`) fresh attempts; cursors are kept."""
    app = app_for(database, app_path)
    check_queues(app, [queue])
    _table_of(app, "a requeue run")
    count = through_outage(
        lambda: app.requeue(queue, owner=owner, type=type, cause=cause, cause_id=cause_id),
        "a requeue run",
    )
    filters = ", ".join(
        f"{name}={value!r}"
        for name, value in (
            ("owner", owner),
            ("type", type),
            ("cause", cause),
            ("cause_id", cause_id),
        )
        if value is not None
    )
    get_run_logger().info("requeued %d job(s) of queue %s %s", count, queue, filters)
    return count
