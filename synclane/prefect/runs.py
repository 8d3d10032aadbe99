"""What the flows ask of the Prefect API: keeping the work deployment at its number of runs,
checking that served deployments do not take over a work pool's, reading the latest version of
an artifact.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID

from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterKey,
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.client.schemas.sorting import ArtifactSort
from prefect.exceptions import ObjectNotFound

from synclane.model import ConfigError
from synclane.prefect.operations import WORK_BUDGET_SECONDS, Row

if TYPE_CHECKING:
    from prefect.client.schemas.responses import DeploymentResponse
    from prefect.deployments.runner import RunnerDeployment

log = logging.getLogger("synclane")

# A run counts as working while it is scheduled, about to start, running, or being cancelled
# (it holds its slot in the deployment's limit until it has ended: a run started beside it
# would only be cancelled by the limit).
ACTIVE = [StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING, StateType.CANCELLING]
# What a run that has lost its process stays in.
_STUCK = (StateType.RUNNING, StateType.CANCELLING)
# The tag by which a served deployment (and each of its runs) names its table:
# 'synclane-table:<TableIdentity.slug>'.
TABLE_TAG = "synclane-table:"
# A work run that is still `Running` this long after its budget ended has lost its process (a
# machine that went away, a worker killed with its run): it no longer counts. A live run ends
# within about a minute of its budget (the hand-back waits up to 60 s).
OVERDUE = timedelta(minutes=3)


@dataclass(frozen=True)
class TopUp:
    """What keeping a work deployment at its number of runs did."""

    deployment: str  # its name
    limit: int
    active: int
    started: list[UUID]
    overdue: list[FlowRun]


def keep_work_runs(deployment: str | UUID, *, exclude: UUID | None = None) -> TopUp:
    """Start runs of the work deployment until as many are scheduled, pending or running as
    its concurrency limit says (one when it has none). `exclude` is a run that is about to end
    (a work run asking for its successor).

    The limit is the one number that scales the work: raise it and add a machine. Runs that
    cannot start wait `Scheduled` and count, so nothing piles up when every worker is busy;
    the deployment's `CANCEL_NEW` limit refuses any run that two callers started at once."""
    with get_client(sync_client=True) as client:
        found = _read_deployment(client, deployment)
        limit = found.global_concurrency_limit.limit if found.global_concurrency_limit else 1
        runs = client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[found.id])),
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=ACTIVE))
            ),
        )
        budget = float(found.parameters.get("budget_seconds") or WORK_BUDGET_SECONDS)
        counted, overdue = counted_runs(runs, budget, datetime.now(UTC), exclude)
        started = [
            client.create_flow_run_from_deployment(found.id).id
            for _ in range(max(limit - len(counted), 0))
        ]
    return TopUp(found.name, limit, len(counted), started, overdue)


def counted_runs(
    runs: Sequence[FlowRun], budget_seconds: float, now: datetime, exclude: UUID | None
) -> tuple[list[FlowRun], list[FlowRun]]:
    """(the runs that count as working, the running or cancelling ones overdue by more than
    OVERDUE)."""
    counted: list[FlowRun] = []
    overdue: list[FlowRun] = []
    for run in runs:
        if run.id == exclude:
            continue
        started = run.start_time
        if (
            run.state_type in _STUCK
            and started is not None
            and now - started > timedelta(seconds=budget_seconds) + OVERDUE
        ):
            overdue.append(run)
            continue
        counted.append(run)
    return counted, overdue


def _read_deployment(client: SyncPrefectClient, deployment: str | UUID) -> DeploymentResponse:
    try:
        if isinstance(deployment, UUID):
            return client.read_deployment(deployment)
        return client.read_deployment_by_name(deployment)
    except ObjectNotFound:
        if isinstance(deployment, UUID):
            raise ConfigError(
                f"the work deployment {deployment} no longer exists (it was deleted): no run of "
                "it is started"
            ) from None
        raise ConfigError(
            f"no deployment {deployment!r}: it was deleted, or the name is misspelt; name the "
            "work deployment as 'synclane-work/<deployment name>' (see `prefect deployment ls`)"
        ) from None


def served_table(tags: Sequence[str]) -> str | None:
    """The slug of the table a deployment (or its run) serves, from its tags; None when it does
    not say (a pool's deployment, or one served by an older synclane)."""
    found = [tag.removeprefix(TABLE_TAG) for tag in tags if tag.startswith(TABLE_TAG)]
    return found[0] if found else None


def check_served_names(deployments: Sequence[RunnerDeployment]) -> None:
    """Refuse to serve a deployment whose name a work pool's deployment already has, or one
    that serves another table: serving would silently take it over (same flow and name, same
    deployment id). A pool's deployment would stay in the pool and every run a pool worker
    picked up would crash on the served entrypoint; another table's runs would run on
    whichever table's process picked them up, under one concurrency limit for both."""
    with get_client(sync_client=True) as client:
        for deployment in deployments:
            name = f"{deployment.flow_name}/{deployment.name}"
            try:
                existing = client.read_deployment_by_name(name)
            except ObjectNotFound:
                continue
            if existing.work_pool_name:
                raise ConfigError(
                    f"deployment {name!r} already belongs to work pool "
                    f"{existing.work_pool_name!r}; serving it would take it over. Serve under "
                    "another name (synclane serve --name NAME, serve(..., name=...)), or delete "
                    f"the pool's deployment with `prefect deployment delete {name}` if you mean "
                    "to move it"
                )
            theirs, ours = served_table(existing.tags), served_table(deployment.tags)
            if theirs is None and ours is not None:
                log.warning(
                    "deployment %r does not say which table it serves (an older synclane served "
                    "it); serving it now names the table %s",
                    name,
                    ours,
                )
            if theirs is not None and ours is not None and theirs != ours:
                raise ConfigError(
                    f"deployment {name!r} serves the table {theirs}, not this app's {ours}; "
                    "serving it would take it over. Serve this table under a name of its own "
                    f"(synclane serve --name NAME, e.g. --name {deployment.name}-staging; "
                    "serve(..., name=...) in Python); if the table moved to another database, "
                    f"delete the old deployments first (`prefect deployment delete {name}`)"
                )


def latest_table(key: str) -> tuple[list[Row] | None, datetime | None]:
    """The rows and creation time of the latest table artifact under `key` (None, None when
    there is none)."""
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
            sort=ArtifactSort.CREATED_DESC,
            limit=1,
        )
    if not found:
        return None, None
    data: Any = found[0].data
    rows = json.loads(data) if isinstance(data, str) else data
    return (rows if isinstance(rows, list) else None), found[0].created
