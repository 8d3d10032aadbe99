"""The plan job's asset: one asset per queue, materialized by planning it, with how far its
history is loaded as metadata, and the `no_abandoned_jobs` check."""

# No `from __future__ import annotations`: Dagster reads the ops' annotations (context, config)
# at definition time.
from collections.abc import Iterator

from dagster import (
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetsDefinition,
    AssetSpec,
    MaterializeResult,
    multi_asset,
)

from synclane.app import OwnerSourceError, SyncLane
from synclane.dagster.names import Names
from synclane.dagster.reports import NO_ABANDONED_JOBS, QueueReport
from synclane.hosting import through_outage

# A run tagged so (the plan schedule's runs) plans what is due, as a worker's planning round
# does; a materialization by hand plans everything that is missing.
PLAN_TAG = "synclane/plan"
DUE_ONLY = "due"

# What the plan asset records per queue: its materialization, or only its check.
Recorded = MaterializeResult[None] | AssetCheckResult


def plan_assets(app: SyncLane, names: Names) -> AssetsDefinition:
    """One asset per queue (`<name>/<queue>`) and its check, materialized by one op that plans
    the selected queues: from the UI, materializing one queue's asset plans that queue."""
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
        synclane = names.app(context, app)
        broken: list[str] = []
        for queue, key in keys.items():
            if key not in context.selected_asset_keys:
                continue
            checked = AssetCheckKey(key, NO_ABANDONED_JOBS) in context.selected_asset_check_keys
            try:
                added = planned(synclane, queue, context.run.tags.get(PLAN_TAG) == DUE_ONLY)
            except OwnerSourceError as error:
                # The queue was not planned: no materialization, but the check still tells.
                context.log.error(str(error))
                broken.append(str(error))
                if checked:
                    yield read(synclane, queue).abandoned_check(key, names.requeue)
                continue
            report = read(synclane, queue)
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
                check_results=[report.abandoned_check(key, names.requeue)] if checked else [],
            )
        if broken:
            raise OwnerSourceError("; ".join(broken))

    return plan


def planned(app: SyncLane, queue: str, due_only: bool = False) -> int:
    """Plan `queue` (with `due_only`, what is due: a planning round), through a short database
    outage; how many jobs it added."""
    plan = app.plan_due if due_only else app.plan
    return through_outage(lambda: plan(queue)[queue], f"planning queue {queue}")


def read(app: SyncLane, queue: str) -> QueueReport:
    return through_outage(lambda: QueueReport.read(app, queue), f"reading queue {queue}")
