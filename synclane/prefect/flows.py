"""The Prefect flows: plan, work, backfill, requeue.

Each is a thin wrapper: it loads the app (from a `SyncLaneDatabase` block, or from an app path
with the DSN in $SYNCLANE_DSN), calls a plain function of `synclane.prefect.operations`, and
publishes the outcome as log lines and artifacts. The sync state stays in PostgreSQL: a flow
run holds nothing that another run or a plain `synclane work` process could not take over.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Coroutine
from datetime import timedelta
from typing import Any, TypeVar

from prefect import flow, get_run_logger
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from synclane.app import SyncLane
from synclane.model import ConfigError
from synclane.prefect.blocks import SyncLaneDatabase
from synclane.prefect.operations import (
    Row,
    artifact_key,
    load_app,
    loaded_percent,
    plan_summary,
    progress_rows,
    run_worker_until_stopped,
    watch_history,
    widen_history,
)

WORK_BUDGET_SECONDS = 540

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


@flow(name="synclane-plan")
def plan(
    database: str | None = None, app_path: str | None = None, queue: str | None = None
) -> dict[str, int]:
    """Plan every queue (or one): add the jobs that should exist and do not. Publishes a
    progress table per queue (one row per owner and type) and a markdown summary."""
    app = app_for(database, app_path)
    logger = get_run_logger()
    added = app.plan(queue)
    for name, count in added.items():
        logger.info("queue %s: %d new job(s)", name, count)
    progress: dict[str, list[Row]] = {}
    for name in added:
        rows = progress[name] = progress_rows(app, name)
        create_table_artifact(
            rows,
            key=artifact_key(app.schema, "progress", name),
            description=f"How far the first load of each owner and type of queue `{name}` is.",
        )
    create_markdown_artifact(
        plan_summary(added, progress),
        key=artifact_key(app.schema, "plan"),
        description="What the last planning run added.",
    )
    return added


@flow(name="synclane-work")
def work(
    database: str | None = None,
    app_path: str | None = None,
    queues: list[str] | None = None,
    budget_seconds: float = WORK_BUDGET_SECONDS,
    until_idle: bool = False,
) -> dict[str, int]:
    """Run worker slots for `budget_seconds` (or until nothing is left with `until_idle`), then
    hand running jobs back with their cursors and return what the slots did. A cancelled run
    hands its jobs back through the same path before it ends."""
    app = app_for(database, app_path)
    logger = get_run_logger()
    worker = app.worker(queues, budget_seconds, until_idle=until_idle)
    logger.info(
        "working queues %s for up to %.0f s as %s",
        ", ".join(q.name for q in worker.queues),
        budget_seconds,
        app.worker_name,
    )
    report = run_worker_until_stopped(worker)
    logger.info("worker report: %s", report or "nothing to do")
    return report


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
) -> dict[str, Any]:
    """Widen the history of one windowed type back to `horizon_days` for every connected owner
    (or only `owners`), then report in a progress artifact how far it is loaded, until it is
    or `budget_seconds` have passed. The work deployment's runs do the loading."""
    app = app_for(database, app_path)
    logger = get_run_logger()
    horizon = timedelta(days=horizon_days)
    added = widen_history(app, queue, type, horizon, owners)
    who = "every connected owner" if owners is None else ", ".join(owners)
    logger.info(
        "%s.%s back to %s days for %s: %d new slice(s)", queue, type, horizon_days, who, added
    )
    key = artifact_key(app.schema, "backfill", queue, type)
    artifact_id = called(
        create_progress_artifact(
            0.0, key=key, description=f"History of {queue}.{type} loaded ({who})."
        )
    )
    last: list[float] = []

    def report(percent: float, rows: list[Row]) -> None:
        if last and last[-1] == percent:
            return
        last.append(percent)
        update_progress_artifact(artifact_id, percent)
        logger.info("%s.%s history: %.1f %% loaded", queue, type, percent)

    rows = watch_history(
        app,
        queue,
        type,
        owners,
        budget_seconds=budget_seconds,
        poll_seconds=poll_seconds,
        report=report,
    )
    create_table_artifact(
        rows,
        key=artifact_key(app.schema, "backfill", queue, type, "owners"),
        description=f"History of {queue}.{type} per owner at the end of the backfill.",
    )
    return {"added": added, "percent": loaded_percent(rows)}


@flow(name="synclane-requeue")
def requeue(
    queue: str,
    owner: str | None = None,
    cause: str | None = None,
    type: str | None = None,
    database: str | None = None,
    app_path: str | None = None,
) -> int:
    """Give the failed, deferred and abandoned jobs of a queue (of one owner, one type, or one
    failure cause as shown by `app.failures()`) fresh attempts; cursors are kept."""
    app = app_for(database, app_path)
    count = app.requeue(queue, owner=owner, type=type, cause=cause)
    filters = ", ".join(
        f"{name}={value!r}"
        for name, value in (("owner", owner), ("type", type), ("cause", cause))
        if value is not None
    )
    get_run_logger().info("requeued %d job(s) of queue %s %s", count, queue, filters)
    return count
