"""The demo's four deployments, served from this one process.

    pip install "synclane[prefect]"
    prefect server start                                    # in another terminal
    export PREFECT_API_URL=http://127.0.0.1:4200/api
    export SYNCLANE_DSN=postgresql://user:password@host:5432/db    # else the embedded PostgreSQL
    python flows/serve.py

Runs are processes started by this one and inherit its environment: $SYNCLANE_DSN reaches the
demo app (built with SyncLane(None)), PREFECT_LOGGING_EXTRA_LOGGERS=synclane puts the library's
log lines in each run's logs. For several machines, use prefect.yaml beside this file.
`synclane --app synclane.demo.app:app serve` serves the same flows on the same schedules.
"""

from __future__ import annotations

import os

from prefect import serve
from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
from prefect.deployments.runner import RunnerDeployment

from synclane.prefect import backfill, plan, requeue, work
from synclane.prefect.flows import called

APP = {"app_path": "synclane.demo.app:app"}


def demo_deployments() -> list[RunnerDeployment]:
    one_at_a_time = ConcurrencyLimitConfig(
        limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW
    )
    built = [
        # Plan every minute: cheap and idempotent, so a missed or doubled run does no harm.
        plan.to_deployment("demo", cron="* * * * *", parameters=APP),
        # Work for 9 minutes, every 10 minutes; a run that would overlap the last is cancelled.
        work.to_deployment(
            "demo",
            cron="*/10 * * * *",
            parameters={**APP, "budget_seconds": 540},
            concurrency_limit=one_at_a_time,
        ),
        # Ad hoc, from the UI or `prefect deployment run`.
        backfill.to_deployment("demo", parameters=APP),
        requeue.to_deployment("demo", parameters=APP),
    ]
    return [called(deployment) for deployment in built]


if __name__ == "__main__":
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "synclane")
    serve(*demo_deployments(), pause_on_shutdown=False)
