"""`definitions(app)`: the Dagster definitions of a synclane app, ready to load as they are.

- `<name>_plan`: an asset job that plans every queue and materializes one asset per queue
  (`<name>/<queue>`) with progress metadata, plus the asset check `no_abandoned_jobs`; on a
  schedule every `plan_interval`.
- `<name>_work`: a long-running worker run with a time budget; on a schedule that keeps
  `work_runs` of them going. Terminating the run hands its jobs back.
- `<name>_backfill` and `<name>_requeue`: launched by hand with run config.

The sync state stays in the PostgreSQL table: a run holds nothing that another run, on any
machine, or a plain `synclane work` process could not take over.
"""

# No `from __future__ import annotations`: Dagster reads the ops' annotations (context, config)
# at definition time.
import queue as queues_module
import re
from collections.abc import Iterator, Sequence
from datetime import timedelta

from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    AssetSelection,
    AssetSpec,
    Config,
    DagsterRunStatus,
    DefaultScheduleStatus,
    Definitions,
    JobDefinition,
    MaterializeResult,
    OpExecutionContext,
    Output,
    RunRequest,
    RunsFilter,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    define_asset_job,
    in_process_executor,
    job,
    multi_asset,
    op,
    schedule,
)
from pydantic import Field

from synclane.app import OwnerSourceError, SyncLane
from synclane.dagster.reports import NO_ABANDONED_JOBS, QueueReport
from synclane.dagster.resource import SyncLaneResource
from synclane.events import FAILED_FOR_GOOD, Event
from synclane.hosting import run_until_stopped
from synclane.model import ConfigError, WindowedType, to_duration
from synclane.worker import Worker

# What the plan asset records per queue: its materialization, or only its check.
Recorded = MaterializeResult[None] | AssetCheckResult

WORK_EVERY = timedelta(minutes=10)
WORK_BUDGET = timedelta(minutes=9)

# Runs of the work job that still hold (or may soon hold) a worker.
IN_PROGRESS = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]

# Schedules Dagster can keep exactly: periods that divide an hour or a day.
_MINUTES = (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30)
_HOURS = (1, 2, 3, 4, 6, 8, 12)


# -- run config ----------------------------------------------------------------------------


class WorkConfig(Config):
    """How a work run works."""

    queues: list[str] | None = Field(
        default=None, description="The queues to work; empty: every queue of the app."
    )
    budget_seconds: float | None = Field(
        default=None,
        description=(
            "Work this long, then hand running jobs back and end. Empty: the definitions' "
            "work budget (9 minutes unless set)."
        ),
    )
    until_idle: bool = Field(
        default=False,
        description="End early once no job of these queues runs anywhere or is due soon.",
    )


class BackfillConfig(Config):
    """Which history to widen."""

    queue: str = Field(description="The queue, e.g. shops.")
    horizon_days: float = Field(
        description="How far back history should reach, in days, e.g. 730 for two years."
    )
    type: str | None = Field(
        default=None, description="One windowed type, e.g. orders; empty: every windowed type."
    )
    owners: list[str] | None = Field(
        default=None, description="Only these owners; empty: every connected owner."
    )


class RequeueConfig(Config):
    """Which failed, deferred and abandoned jobs get fresh attempts."""

    queue: str = Field(description="The queue, e.g. shops.")
    owner: str | None = Field(default=None, description="Only this owner's jobs.")
    type: str | None = Field(default=None, description="Only jobs of this type.")
    cause: str | None = Field(
        default=None,
        description="Only jobs with this cause, as app.failures() shows it.",
    )
    cause_id: str | None = Field(
        default=None,
        description="Only jobs with this cause, by the 8 hex digits of failures()'s cause_id.",
    )


# -- the definitions -----------------------------------------------------------------------


def definitions(
    app: SyncLane,
    *,
    resource: SyncLaneResource | None = None,
    name: str = "synclane",
    plan_every: timedelta | float | None = None,
    work_every: timedelta | float = WORK_EVERY,
    work_budget: timedelta | float = WORK_BUDGET,
    work_runs: int = 1,
) -> Definitions:
    """The Dagster definitions of `app`: jobs, schedules, one asset and one check per queue,
    and the resource (under the key `name`) through which the runs reach the app.

    `resource` defaults to the app itself, registered in this process (every process that loads
    the code location registers it again); pass `SyncLaneResource(app_path=...,
    dsn=EnvVar("SYNCLANE_DSN"))` to have Dagster show where the app and its database are.
    `plan_every` defaults to the app's `plan_interval`; Dagster's schedules run at most once a
    minute, on periods that divide an hour or a day, so the plan runs at least that often.
    Every `work_every` the work schedule starts work runs until `work_runs` of them are going;
    each works for `work_budget`, which must end before the next tick."""
    if not isinstance(app, SyncLane):
        raise ConfigError(
            f"definitions(app) needs a SyncLane app, got {type(app).__name__}; pass the object "
            "your module builds, e.g. `from mypackage.sync import app`"
        )
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ConfigError(
            f"name={name!r:.100} must be a Dagster name: letters, digits and underscores, not "
            "starting with a digit, e.g. 'synclane' or 'shops_sync'"
        )
    if not app.queues:
        raise ConfigError("the app has no queue: declare one with app.queue(...) first")
    plan_period = app.plan_interval if plan_every is None else to_duration("plan_every", plan_every)
    work_period = to_duration("work_every", work_every)
    budget = to_duration("work_budget", work_budget)
    work_cron, work_period = cron_at_least_every(work_period)
    if budget >= work_period:
        raise ConfigError(
            f"work_budget={budget} must be shorter than work_every={work_period}: a work run "
            "should end before the next tick starts another (e.g. 9 and 10 minutes)"
        )
    if not isinstance(work_runs, int) or isinstance(work_runs, bool) or work_runs < 1:
        raise ConfigError(
            f"work_runs={work_runs!r} must be a whole number >= 1: how many work runs to keep "
            "going at once"
        )
    if resource is None:
        resource = SyncLaneResource.for_app(app)
    elif not isinstance(resource, SyncLaneResource):
        raise ConfigError(
            f"resource must be a SyncLaneResource, got {type(resource).__name__}, e.g. "
            "SyncLaneResource(app_path='mypackage.sync:app', dsn=EnvVar('SYNCLANE_DSN'))"
        )

    names = _Names(name)
    plan_assets = _plan_assets(app, names)
    plan_job = define_asset_job(
        names.plan,
        selection=AssetSelection.assets(plan_assets),
        executor_def=in_process_executor,
        description="Plan every queue; record how far each queue's history is and what fails.",
    )
    work_job = _work_job(app, names, budget)
    plan_cron, _ = cron_at_least_every(plan_period)
    plan_schedule = ScheduleDefinition(
        name=f"{names.plan}_schedule",
        job=plan_job,
        cron_schedule=plan_cron,
        execution_timezone="UTC",
        default_status=DefaultScheduleStatus.RUNNING,
        description=f"Plans every {plan_period} (the app's plan_interval unless set).",
    )
    return Definitions(
        assets=[plan_assets],
        jobs=[plan_job, work_job, _backfill_job(app, names), _requeue_job(app, names)],
        schedules=[
            plan_schedule,
            _work_schedule(work_job, names, work_cron, budget, work_runs),
        ],
        resources={name: resource},
    )


class _Names:
    """The names of one app's definitions: its resource key, jobs, assets and group."""

    def __init__(self, name: str) -> None:
        self.resource = name
        self.plan = f"{name}_plan"
        self.work = f"{name}_work"
        self.backfill = f"{name}_backfill"
        self.requeue = f"{name}_requeue"
        # Ops are named apart from their jobs (Dagster wants distinct names); run config
        # names the op: {"ops": {"synclane_widen_history": {"config": {...}}}}.
        self.plan_op = f"{name}_plan_queues"
        self.work_op = f"{name}_run_worker"
        self.backfill_op = f"{name}_widen_history"
        self.requeue_op = f"{name}_requeue_jobs"

    def asset_key(self, queue: str) -> AssetKey:
        return AssetKey([self.resource, queue])


def cron_at_least_every(period: timedelta) -> tuple[str, timedelta]:
    """A cron schedule that runs at least once every `period`, on a period that divides an hour
    or a day (cron cannot keep others exactly), and that period. At least once a minute."""
    minutes = period.total_seconds() / 60
    if minutes < 60:
        step = max((m for m in _MINUTES if m <= minutes), default=1)
        return ("* * * * *" if step == 1 else f"*/{step} * * * *"), timedelta(minutes=step)
    hours = minutes / 60
    if hours < 24:
        step = max(h for h in _HOURS if h <= hours)
        return ("0 * * * *" if step == 1 else f"0 */{step} * * *"), timedelta(hours=step)
    return "0 0 * * *", timedelta(days=1)


def _app(
    context: OpExecutionContext | AssetExecutionContext, names: _Names, shape: SyncLane
) -> SyncLane:
    """The run's app, from the resource; it must be the app the definitions were built for."""
    resource = getattr(context.resources, names.resource)
    app: SyncLane = resource.get_app()
    if app.schema != shape.schema or set(app.queues) != set(shape.queues):
        raise ConfigError(
            f"the {names.resource!r} resource gives the app of schema {app.schema!r} with queues "
            f"{sorted(app.queues)}, but these definitions were built for schema "
            f"{shape.schema!r} with queues {sorted(shape.queues)}; point the resource at the "
            "same app"
        )
    return app


# -- plan ----------------------------------------------------------------------------------


def _plan_assets(app: SyncLane, names: _Names) -> AssetsDefinition:
    keys = {queue: names.asset_key(queue) for queue in app.queues}
    specs = [
        AssetSpec(
            key,
            group_name=names.resource,
            description=(
                f"The sync jobs of queue {queue!r} in the table {app.schema}.jobs: planned by "
                f"{names.plan}; the metadata shows how far each owner's history is loaded and "
                "who is failing."
            ),
            kinds={"postgres"},
            metadata={"table": f"{app.schema}.jobs", "queue": queue},
        )
        for queue, key in keys.items()
    ]
    checks = [
        AssetCheckSpec(
            NO_ABANDONED_JOBS,
            asset=key,
            description=(
                "Fails (ERROR) while a job of the queue is abandoned: it waits for a fix and a "
                f"requeue ({names.requeue})."
            ),
        )
        for key in keys.values()
    ]

    @multi_asset(
        name=names.plan_op,
        specs=specs,
        check_specs=checks,
        can_subset=True,
        required_resource_keys={names.resource},
    )
    def plan(context: AssetExecutionContext) -> Iterator[Recorded]:
        """Plan each selected queue, then record its progress and check for abandoned jobs."""
        synclane = _app(context, names, app)
        broken: list[str] = []
        for queue, key in keys.items():
            if key not in context.selected_asset_keys:
                continue
            try:
                added = synclane.plan(queue)[queue]
            except OwnerSourceError as error:
                # The queue was not planned: no materialization, but the check still tells.
                context.log.error(str(error))
                broken.append(str(error))
                yield QueueReport.read(synclane, queue).abandoned_check(key, names.requeue)
                continue
            report = QueueReport.read(synclane, queue)
            context.log.info(
                "queue %s: %d new job(s); history %d / %d slices loaded (%.1f %%)",
                queue,
                added,
                report.slices_loaded,
                report.slices_total,
                report.percent,
            )
            yield MaterializeResult(
                asset_key=key,
                metadata=report.metadata(added),
                check_results=[report.abandoned_check(key, names.requeue)],
            )
        if broken:
            raise OwnerSourceError("; ".join(broken))

    return plan


# -- work ----------------------------------------------------------------------------------


def _work_job(app: SyncLane, names: _Names, budget: timedelta) -> JobDefinition:
    @op(
        name=names.work_op,
        required_resource_keys={names.resource},
        description=(
            "Run synclane worker slots for a time budget, then hand running jobs back and end. "
            "Terminating the run hands its jobs back the same way."
        ),
    )
    def work(context: OpExecutionContext, config: WorkConfig) -> Output[None]:
        synclane = _app(context, names, app)
        seconds = budget.total_seconds() if config.budget_seconds is None else config.budget_seconds
        events: queues_module.SimpleQueue[Event] = queues_module.SimpleQueue()
        worker = Worker(
            synclane,
            config.queues,
            stop_after=seconds,
            until_idle=config.until_idle,
            on_event=events.put,
        )
        context.log.info(
            "working queues %s for up to %.0f s as %s",
            ", ".join(q.name for q in worker.queues),
            seconds,
            synclane.worker_name,
        )

        handed_back: list[Event] = []

        def log_events() -> None:
            while not events.empty():
                event = events.get_nowait()
                if event.kind == "handed_back":
                    handed_back.append(event)
                _log_event(context, event, names)

        try:
            report = run_until_stopped(worker, between_polls=log_events)
        except BaseException as stop:
            if not isinstance(stop, Exception):  # a termination, not a failure of the worker
                context.log.warning(
                    "run stopped by %s: the worker handed back %d running job(s) with their "
                    "cursors",
                    type(stop).__name__,
                    len(handed_back),
                )
            raise
        context.log.info("worker report: %s", report or "nothing to do")
        return Output(None, metadata={kind: count for kind, count in sorted(report.items())})

    @job(
        name=names.work,
        executor_def=in_process_executor,
        description=(
            "A long-running synclane worker: works for a time budget, hands its jobs back with "
            "their cursors and ends; a terminated run hands them back too."
        ),
    )
    def work_job() -> None:
        work()

    return work_job


def _log_event(context: OpExecutionContext, event: Event, names: _Names) -> None:
    """Tell the run's log what a team acts on: what failed for good, what was handed back."""
    job = f"job {event.job_id} ({event.queue}/{event.owner} {event.type}, {event.mode})"
    if event.kind == "abandoned":
        context.log.error(
            "%s abandoned after attempt %d: %s; it waits for a fix and a requeue (%s with "
            "queue=%r, owner=%r)",
            job,
            event.attempt,
            event.error,
            names.requeue,
            event.queue,
            event.owner,
        )
    elif event.kind in FAILED_FOR_GOOD:
        context.log.warning(
            "%s deferred: its regular attempts are used up (%s); it gets one more attempt when "
            "its lane is idle",
            job,
            event.error,
        )
    elif event.kind == "handed_back":
        context.log.info("%s handed back at cursor %r", job, event.cursor)
    elif event.kind == "first_load_finished":
        context.log.info("%s: the first load of %s %s is complete", job, event.owner, event.type)


def _work_schedule(
    work_job: JobDefinition, names: _Names, cron: str, budget: timedelta, runs: int
) -> ScheduleDefinition:
    run_config = {"ops": {names.work_op: {"config": {"budget_seconds": budget.total_seconds()}}}}

    @schedule(
        name=f"{names.work}_schedule",
        job=work_job,
        cron_schedule=cron,
        execution_timezone="UTC",
        default_status=DefaultScheduleStatus.RUNNING,
        description=(
            f"Keeps {runs} work run(s) going: each works for {budget}; a tick starts only "
            "what is missing, so a run that overran is never joined by a copy."
        ),
    )
    def work_schedule(context: ScheduleEvaluationContext) -> list[RunRequest] | SkipReason:
        going = context.instance.get_runs_count(
            RunsFilter(job_name=work_job.name, statuses=IN_PROGRESS)
        )
        if going >= runs:
            return SkipReason(f"{going} work run(s) still going (at most {runs} at once)")
        stamp = context.scheduled_execution_time.isoformat()
        return [
            RunRequest(run_key=f"{stamp}#{number}", run_config=run_config)
            for number in range(runs - going)
        ]

    return work_schedule


# -- backfill and requeue ------------------------------------------------------------------


def _backfill_job(app: SyncLane, names: _Names) -> JobDefinition:
    @op(
        name=names.backfill_op,
        required_resource_keys={names.resource},
        description=(
            "Widen the history of a queue's windowed types back to horizon_days: only the "
            "missing older slices are added; work runs load them."
        ),
    )
    def backfill(context: OpExecutionContext, config: BackfillConfig) -> Output[None]:
        synclane = _app(context, names, app)
        added, percent = widen_history(
            synclane, config.queue, config.horizon_days, config.type, config.owners
        )
        who = "every connected owner" if config.owners is None else ", ".join(config.owners)
        context.log.info(
            "%s%s back to %s days for %s: %d new slice(s); %.1f %% of that history is loaded",
            config.queue,
            "" if config.type is None else f".{config.type}",
            config.horizon_days,
            who,
            added,
            percent,
        )
        return Output(None, metadata={"slices_added": added, "percent_loaded": percent})

    @job(
        name=names.backfill,
        executor_def=in_process_executor,
        description="Widen history back to a horizon for some or all owners (run config).",
    )
    def backfill_job() -> None:
        backfill()

    return backfill_job


def widen_history(
    app: SyncLane,
    queue: str,
    horizon_days: float,
    type: str | None = None,
    owners: Sequence[str] | None = None,
) -> tuple[int, float]:
    """Plan the older history slices of `queue`'s windowed types (or only `type`) back to
    `horizon_days`, for every connected owner or only `owners`. Existing slices never move.
    Returns how many slices were added and how much of that history is loaded (percent)."""
    windowed = [t.name for t in app.get_queue(queue).types.values() if isinstance(t, WindowedType)]
    if type is not None:
        app.get_queue(queue).job_type(type)
        if type not in windowed:
            raise ConfigError(
                f"{queue}.{type} is a snapshot type: it has no history to widen; a backfill "
                f"needs a windowed type ({', '.join(windowed) or 'the queue has none'})"
            )
    elif not windowed:
        raise ConfigError(f"queue {queue!r} has no windowed type: it has no history to widen")
    if isinstance(horizon_days, bool) or not horizon_days > 0:
        raise ConfigError(f"horizon_days={horizon_days!r} must be a number of days > 0, e.g. 730")
    horizon = timedelta(days=horizon_days)
    if owners is None:
        added = app.plan(queue, horizon=horizon, type=type)[queue]
    else:
        added = sum(app.plan(queue, owner, horizon=horizon, type=type)[queue] for owner in owners)
    progress = app.progress(queue, type=type)
    progress = progress[progress["type"].isin(windowed)]
    if owners is not None:
        unknown = sorted(set(owners) - set(progress["owner"]))
        if unknown:
            raise ConfigError(
                f"owner(s) {', '.join(map(repr, unknown))} have no jobs in queue {queue!r}: they "
                "are not connected (the planner plans only the owners its owner source returns)"
            )
        progress = progress[progress["owner"].isin(list(owners))]
    total = int(progress["slices_total"].sum()) if len(progress) else 0
    done = int(progress["slices_completed"].sum()) if len(progress) else 0
    return added, 100.0 if total == 0 else round(100.0 * done / total, 1)


def _requeue_job(app: SyncLane, names: _Names) -> JobDefinition:
    @op(
        name=names.requeue_op,
        required_resource_keys={names.resource},
        description=(
            "Give failed, deferred and abandoned jobs fresh attempts; they continue from their "
            "cursors."
        ),
    )
    def requeue(context: OpExecutionContext, config: RequeueConfig) -> Output[None]:
        synclane = _app(context, names, app)
        count = synclane.requeue(
            config.queue,
            owner=config.owner,
            type=config.type,
            cause=config.cause,
            cause_id=config.cause_id,
        )
        filters = ", ".join(
            f"{field}={value!r}"
            for field, value in (
                ("owner", config.owner),
                ("type", config.type),
                ("cause", config.cause),
                ("cause_id", config.cause_id),
            )
            if value is not None
        )
        context.log.info("requeued %d job(s) of queue %s %s", count, config.queue, filters)
        return Output(None, metadata={"requeued": count})

    @job(
        name=names.requeue,
        executor_def=in_process_executor,
        description="Requeue failed, deferred and abandoned jobs (run config: queue, owner, "
        "type, cause or cause_id).",
    )
    def requeue_job() -> None:
        requeue()

    return requeue_job
