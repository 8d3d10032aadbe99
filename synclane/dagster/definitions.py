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

from __future__ import annotations

import re
from datetime import timedelta

from dagster import (
    AssetSelection,
    DefaultScheduleStatus,
    Definitions,
    ScheduleDefinition,
    define_asset_job,
    in_process_executor,
)

from synclane.app import SyncLane
from synclane.dagster.adhoc import backfill_job, requeue_job
from synclane.dagster.names import Names
from synclane.dagster.plan import DUE_ONLY, PLAN_TAG, plan_assets
from synclane.dagster.resource import SyncLaneResource
from synclane.dagster.work import work_job, work_schedule
from synclane.model import MAX_WORK_RUNS, ConfigError, check_whole, to_duration

WORK_EVERY = timedelta(minutes=10)
WORK_BUDGET = timedelta(minutes=9)

# Schedules Dagster can keep exactly: periods that divide an hour or a day.
_MINUTES = (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30)
_HOURS = (1, 2, 3, 4, 6, 8, 12)


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
    check_whole("work_runs", work_runs, MAX_WORK_RUNS, "how many work runs to keep going at once")
    if resource is None:
        resource = SyncLaneResource.for_app(app)
    elif not isinstance(resource, SyncLaneResource):
        raise ConfigError(
            f"resource must be a SyncLaneResource, got {type(resource).__name__}, e.g. "
            "SyncLaneResource(app_path='mypackage.sync:app', dsn=EnvVar('SYNCLANE_DSN'))"
        )

    names = Names(name)
    assets = plan_assets(app, names)
    plan_job = define_asset_job(
        names.plan,
        selection=AssetSelection.assets(assets),
        executor_def=in_process_executor,
        description="Plan every queue; record how far each queue's history is and what fails.",
    )
    work = work_job(app, names, budget)
    plan_cron, _ = cron_at_least_every(plan_period)
    plan_schedule = ScheduleDefinition(
        name=f"{names.plan}_schedule",
        job=plan_job,
        cron_schedule=plan_cron,
        execution_timezone="UTC",
        default_status=DefaultScheduleStatus.RUNNING,
        tags={PLAN_TAG: DUE_ONLY},
        description=(
            f"Plans what is due every {plan_period} (the app's plan_interval unless set), as a "
            "worker's planning round does."
        ),
    )
    return Definitions(
        assets=[assets],
        jobs=[plan_job, work, backfill_job(app, names), requeue_job(app, names)],
        schedules=[
            plan_schedule,
            work_schedule(work, names, work_cron, budget, work_runs),
        ],
        resources={name: resource},
    )


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
