"""The work job: a synclane worker for a time budget, stopped cleanly when Dagster terminates
the run, and the schedule that keeps `work_runs` of them going. A run fails when a job was
abandoned in it for a new cause (synclane.causes), as a Prefect work run does."""

# No `from __future__ import annotations`: Dagster reads the ops' annotations (context, config)
# at definition time.
from collections.abc import Callable
from datetime import timedelta

from dagster import (
    Config,
    DagsterRunStatus,
    DefaultScheduleStatus,
    Failure,
    JobDefinition,
    OpExecutionContext,
    Output,
    RunRequest,
    RunsFilter,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    in_process_executor,
    job,
    op,
    schedule,
)
from pydantic import Field

from synclane.app import SyncLane
from synclane.causes import Causes, NewCause, Noted, alert, new_causes, repeats
from synclane.dagster.names import Names
from synclane.events import Kind
from synclane.hosting import run_until_stopped, through_outage
from synclane.model import ConfigError

# Runs of the work job that still hold (or may soon hold) a worker.
IN_PROGRESS = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]


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
    fail_on_abandoned: bool = Field(
        default=True,
        description=(
            "Fail the run when a job was abandoned in it for a new cause (one that did not "
            "already wait for a human for that owner)."
        ),
    )


def work_job(app: SyncLane, names: Names, budget: timedelta) -> JobDefinition:
    """The work job: one op that runs a worker for `budget` (or the run config's budget)."""

    @op(
        name=names.work_op,
        required_resource_keys={names.resource},
        description=(
            "Run synclane worker slots for a time budget, then hand running jobs back and end. "
            "Terminating the run hands its jobs back the same way."
        ),
    )
    def work(context: OpExecutionContext, config: WorkConfig) -> Output[None]:
        synclane = names.app(context, app)
        seconds = budget.total_seconds() if config.budget_seconds is None else config.budget_seconds
        if not seconds > 0:
            raise ConfigError(
                f"budget_seconds={seconds!r} must be a number of seconds > 0, e.g. 540: how long "
                "the run works before it hands its jobs back"
            )
        through_outage(synclane.check_schema, "a work run")
        causes = Causes(synclane, LOGGED)
        worker = synclane.worker(
            config.queues,
            stop_after=seconds,
            until_idle=config.until_idle,
            on_event=causes,
        )
        context.log.info(
            "working queues %s for up to %.0f s as %s",
            ", ".join(q.name for q in worker.queues),
            seconds,
            synclane.worker_name,
        )
        # With the `synclane` logger captured by Dagster, the worker's own lines tell of each
        # job; the op then does not tell it again.
        per_job = not synclane_logger_managed(context)
        told: list[Noted] = []

        def log_events(final: bool = False) -> None:
            for noted in causes.take(final=final):
                told.append(noted)
                if per_job:
                    log_event(context, noted, names)

        try:
            report = run_until_stopped(worker, between_polls=log_events)
        except BaseException as stop:
            log_events(final=True)
            if not isinstance(stop, Exception):  # a termination, not a failure of the worker
                handed_back = sum(n.event.kind == "handed_back" for n in told)
                context.log.warning(
                    "run stopped by %s: the worker handed back %d running job(s) with their "
                    "cursors",
                    type(stop).__name__,
                    handed_back,
                )
            raise
        log_events(final=True)
        context.log.info("worker report: %s", report or "nothing to do")
        metadata = {kind: count for kind, count in sorted(report.items())}
        new = new_causes(told)
        if config.fail_on_abandoned and new:
            raise Failure(
                description=alert(new, repeats(told, new), _requeue_job(names)),
                metadata=metadata,
                allow_retries=False,
            )
        return Output(None, metadata=metadata)

    @job(
        name=names.work,
        executor_def=in_process_executor,
        description=(
            "A long-running synclane worker: works for a time budget, hands its jobs back with "
            "their cursors and ends; a terminated run hands them back too."
        ),
    )
    def bounded_work() -> None:
        work()

    return bounded_work


# What the work op tells the run's log of: what a team acts on.
LOGGED: tuple[Kind, ...] = ("abandoned", "deferred", "handed_back", "first_load_finished")


def synclane_logger_managed(context: OpExecutionContext) -> bool:
    """Whether the instance captures the `synclane` logger (`python_logs:
    managed_python_loggers` in dagster.yaml): its lines then reach the run's log already."""
    settings = context.instance.get_settings("python_logs") or {}
    managed = settings.get("managed_python_loggers") or []
    return "synclane" in managed or "root" in managed


def _requeue_job(names: Names) -> Callable[[NewCause], str]:
    def launch(cause: NewCause) -> str:
        which = f", cause_id={cause.cause_id!r}" if cause.cause_id else ""
        return f"{names.requeue} with queue={cause.queue!r}, owner={cause.owner!r}{which}"

    return launch


def log_event(context: OpExecutionContext, noted: Noted, names: Names) -> None:
    """Tell the run's log what a team acts on: what failed for good, what was handed back."""
    event = noted.event
    job = f"job {event.job_id} ({event.queue}/{event.owner} {event.type}, {event.mode})"
    if event.kind == "abandoned" and noted.repeat:
        context.log.warning(
            "%s abandoned again for cause %s, which already waits for a human (no new alert): %s",
            job,
            noted.cause_id,
            event.error,
        )
    elif event.kind == "abandoned":
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
    elif event.kind == "deferred":
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


def work_schedule(
    work: JobDefinition, names: Names, cron: str, budget: timedelta, runs: int
) -> ScheduleDefinition:
    """Every tick, start work runs until `runs` of them are going."""
    run_config = {"ops": {names.work_op: {"config": {"budget_seconds": budget.total_seconds()}}}}

    @schedule(
        name=f"{names.work}_schedule",
        job=work,
        cron_schedule=cron,
        execution_timezone="UTC",
        default_status=DefaultScheduleStatus.RUNNING,
        description=(
            f"Keeps {runs} work run(s) going: each works for {budget}; a tick starts only "
            "what is missing, so a run that overran is never joined by a copy."
        ),
    )
    def keep_work_going(context: ScheduleEvaluationContext) -> list[RunRequest] | SkipReason:
        going = context.instance.get_runs_count(
            RunsFilter(job_name=work.name, statuses=IN_PROGRESS)
        )
        if going >= runs:
            return SkipReason(f"{going} work run(s) still going (at most {runs} at once)")
        stamp = context.scheduled_execution_time.isoformat()
        return [
            RunRequest(run_key=f"{stamp}#{number}", run_config=run_config)
            for number in range(runs - going)
        ]

    return keep_work_going
