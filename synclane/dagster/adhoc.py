"""The jobs launched by hand, with run config: backfill (widen history) and requeue."""

# No `from __future__ import annotations`: Dagster reads the ops' annotations (context, config)
# at definition time.
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from dagster import Config, JobDefinition, OpExecutionContext, Output, in_process_executor, job, op
from pydantic import Field

from synclane.app import SyncLane
from synclane.dagster.names import Names
from synclane.hosting import through_outage
from synclane.model import ConfigError, WindowedType

if TYPE_CHECKING:
    import pandas as pd


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


def backfill_job(app: SyncLane, names: Names) -> JobDefinition:
    @op(
        name=names.backfill_op,
        required_resource_keys={names.resource},
        description=(
            "Widen the history of a queue's windowed types back to horizon_days: only the "
            "missing older slices are added; work runs load them."
        ),
    )
    def backfill(context: OpExecutionContext, config: BackfillConfig) -> Output[None]:
        synclane = names.app(context, app)
        added, percent = through_outage(
            lambda: widen_history(
                synclane, config.queue, config.horizon_days, config.type, config.owners
            ),
            "a backfill run",
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
    Returns how many slices the wider horizon added to their histories (a history keeps only its
    newest open slices as rows: most are planned as those finish, docs/planning.md) and how much
    of that history is loaded (percent)."""
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

    def histories() -> "pd.DataFrame":
        progress = app.progress(queue, type=type, limit=None)
        progress = progress[progress["type"].isin(windowed)]
        return progress if owners is None else progress[progress["owner"].isin(list(owners))]

    before = histories()
    if owners is None:
        app.plan(queue, horizon=horizon, type=type)
    else:
        for owner in owners:
            app.plan(queue, owner, horizon=horizon, type=type)
    progress = histories()
    if owners is not None:
        unknown = sorted(set(owners) - set(progress["owner"]))
        if unknown:
            raise ConfigError(
                f"owner(s) {', '.join(map(repr, unknown))} have no jobs in queue {queue!r}: they "
                "are not connected (the planner plans only the owners its owner source returns)"
            )
    total = int(progress["slices_total"].sum()) if len(progress) else 0
    done = int(progress["slices_completed"].sum()) if len(progress) else 0
    added = total - (int(before["slices_total"].sum()) if len(before) else 0)
    return added, 100.0 if total == 0 else round(100.0 * done / total, 1)


def requeue_job(app: SyncLane, names: Names) -> JobDefinition:
    @op(
        name=names.requeue_op,
        required_resource_keys={names.resource},
        description=(
            "Give failed, deferred and abandoned jobs fresh attempts; they continue from their "
            "cursors."
        ),
    )
    def requeue(context: OpExecutionContext, config: RequeueConfig) -> Output[None]:
        synclane = names.app(context, app)
        count = through_outage(
            lambda: synclane.requeue(
                config.queue,
                owner=config.owner,
                type=config.type,
                cause=config.cause,
                cause_id=config.cause_id,
            ),
            "a requeue run",
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
