"""The work job: a synclane worker for a time budget, stopped cleanly when Dagster terminates
the run, and the schedule that keeps `work_runs` of them going."""

# No `from __future__ import annotations`: Dagster reads the ops' annotations (context, config)
# at definition time.
import queue as queues_module
from datetime import timedelta

from dagster import (
    Config,
    DagsterRunStatus,
    DefaultScheduleStatus,
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
from synclane.dagster.names import Names
from synclane.events import Event
from synclane.hosting import run_until_stopped
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
        events: queues_module.SimpleQueue[Event] = queues_module.SimpleQueue()
        worker = synclane.worker(
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
                log_event(context, event, names)

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
    def bounded_work() -> None:
        work()

    return bounded_work


def log_event(context: OpExecutionContext, event: Event, names: Names) -> None:
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
