"""Serve an app's flows as Prefect deployments from one process (`synclane serve`).

For several machines use a work pool instead: see flows/prefect.yaml and docs/prefect.md.
"""

from __future__ import annotations

import os
import re
from collections.abc import MutableMapping
from typing import TYPE_CHECKING

from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy

from synclane.prefect.flows import WORK_BUDGET_SECONDS, backfill, called, plan, requeue, work
from synclane.prefect.operations import load_app, split_app_path

if TYPE_CHECKING:
    from prefect.deployments.runner import RunnerDeployment

PLAN_CRON = "* * * * *"
WORK_CRON = "*/10 * * * *"


def deployment_name(app_path: str) -> str:
    """A deployment name for an app: 'synclane.demo.app:app' → 'synclane-demo-app'."""
    module_name, attribute = split_app_path(app_path)
    words = [*module_name.split("."), *([] if attribute == "app" else [attribute])]
    return re.sub(r"[^A-Za-z0-9_-]+", "-", "-".join(words)).strip("-")


def deployments(
    app_path: str,
    *,
    name: str | None = None,
    work_budget_seconds: int = WORK_BUDGET_SECONDS,
) -> list[RunnerDeployment]:
    """The four deployments of an app: plan every minute; work every 10 minutes for
    `work_budget_seconds`, one run at a time (a run that would overlap is cancelled, not
    queued); backfill and requeue when asked. Served deployments take no job variables: their
    runs inherit the environment of the serving process instead."""
    if not 0 < work_budget_seconds < 600:
        raise ValueError(
            f"work_budget_seconds={work_budget_seconds} must be between 1 and 599: a work run "
            "starts every 10 minutes and should end before the next one is due"
        )
    name = name or deployment_name(app_path)
    app = {"app_path": app_path}
    built = [
        plan.to_deployment(name, cron=PLAN_CRON, parameters=app, tags=["synclane"]),
        work.to_deployment(
            name,
            cron=WORK_CRON,
            parameters={**app, "budget_seconds": work_budget_seconds},
            concurrency_limit=ConcurrencyLimitConfig(
                limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW
            ),
            tags=["synclane"],
        ),
        backfill.to_deployment(name, parameters=app, tags=["synclane"]),
        requeue.to_deployment(name, parameters=app, tags=["synclane"]),
    ]
    return [called(deployment) for deployment in built]


def serve(
    app_path: str, *, dsn: str | None = None, work_budget_seconds: int = WORK_BUDGET_SECONDS
) -> None:
    """Serve the app's deployments from this process until it is stopped.

    The app is loaded once first, so that a wrong path or an unreachable database fails here
    rather than in every run. `dsn` (else $SYNCLANE_DSN) reaches the runs through the
    environment they inherit; it is never a flow parameter, which Prefect would show."""
    from prefect import serve as prefect_serve

    app = load_app(app_path, dsn)
    app.close()
    _add_extra_logger(os.environ, "synclane")
    prefect_serve(
        *deployments(app_path, work_budget_seconds=work_budget_seconds),
        pause_on_shutdown=False,
    )


def _add_extra_logger(environ: MutableMapping[str, str], logger: str) -> None:
    """Served runs are processes started from this one: they inherit its environment."""
    current = [n.strip() for n in environ.get("PREFECT_LOGGING_EXTRA_LOGGERS", "").split(",")]
    if logger not in current:
        environ["PREFECT_LOGGING_EXTRA_LOGGERS"] = ",".join([*filter(None, current), logger])
