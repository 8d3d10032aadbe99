"""Serve an app's flows as Prefect deployments from one process (`synclane serve`).

For several machines use a work pool instead: see flows/prefect.yaml and docs/prefect.md. The
pool's deployments have names of their own (`demo-pool`), never those served here (named after
the app's path, or `--name`), so the two never take each other over. A served deployment names
the table it serves (a tag and its description), and serving another table under its name is
refused: staging and production on one Prefect server each need a name of their own.
"""

from __future__ import annotations

import os
import re
import signal
import threading
from collections.abc import MutableMapping
from types import FrameType
from typing import TYPE_CHECKING

from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy

from synclane.model import MAX_WORK_BUDGET, MAX_WORK_RUNS, ConfigError, check_whole
from synclane.prefect.flows import WORK_BUDGET_SECONDS, backfill, called, plan, requeue, work
from synclane.prefect.identity import TableIdentity, table_identity
from synclane.prefect.operations import load_app, split_app_path
from synclane.prefect.runs import TABLE_TAG, check_served_names

if TYPE_CHECKING:
    from prefect.deployments.runner import RunnerDeployment

PLAN_CRON = "* * * * *"
# What Prefect accepts in a deployment name and a shell passes as one word.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")


def deployment_name(app_path: str) -> str:
    """A deployment name for an app: 'synclane.demo.app:app' → 'synclane-demo-app'."""
    module_name, attribute = split_app_path(app_path)
    words = [*module_name.split("."), *([] if attribute == "app" else [attribute])]
    return re.sub(r"[^A-Za-z0-9_-]+", "-", "-".join(words)).strip("-")


def one_at_a_time(limit: int = 1) -> ConcurrencyLimitConfig:
    """A deployment concurrency limit that cancels a run which would exceed it, instead of
    queueing it: late runs released together after downtime collapse into one."""
    return ConcurrencyLimitConfig(
        limit=limit, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW
    )


def check_deployment_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(
            f"name={name!r:.100} cannot name a deployment: use letters, digits, '_', '.' and "
            "'-' (at most 100, not starting with '.' or '-'), e.g. --name shops-staging"
        )
    return name


def deployments(
    app_path: str,
    *,
    name: str | None = None,
    table: TableIdentity | None = None,
    work_budget_seconds: float = WORK_BUDGET_SECONDS,
    work_runs: int = 1,
) -> list[RunnerDeployment]:
    """The four deployments of an app, named after its path (`synclane-plan/synclane-demo-app`
    for 'synclane.demo.app:app') or `name`: plan every minute, one run at a time, and keep
    `work_runs` work runs going; work for `work_budget_seconds` per run, at most `work_runs` at
    once; backfill and requeue when asked. With `table` (what `serve` passes) each names the
    table it serves, in a tag (`synclane-table:<table slug>`) and its description. Served
    deployments take no job variables: their runs inherit the environment of the serving
    process instead."""
    budget = work_budget_seconds
    if (
        not isinstance(budget, int | float)
        or isinstance(budget, bool)
        or not 0 < budget <= MAX_WORK_BUDGET
    ):
        raise ConfigError(
            f"work_budget_seconds={budget!r:.100} must be a number of seconds > 0 and at most "
            f"{MAX_WORK_BUDGET:,} (a day; `synclane serve --work-budget` takes the same), e.g. "
            f"{WORK_BUDGET_SECONDS}"
        )
    check_whole("work_runs", work_runs, MAX_WORK_RUNS, "as `synclane serve --work-runs`")
    name = deployment_name(app_path) if name is None else check_deployment_name(name)
    app = {"app_path": app_path}
    tags = ["synclane"] if table is None else ["synclane", f"{TABLE_TAG}{table.slug}"]
    where = "" if table is None else f"; table {table.label}"

    def about(what: str) -> str:
        return f"{what}. App {app_path}{where}."

    built = [
        plan.to_deployment(
            name,
            cron=PLAN_CRON,
            parameters={**app, "work_deployment": f"{work.name}/{name}", "due_only": True},
            concurrency_limit=one_at_a_time(),
            tags=tags,
            description=about(
                "Plans what is due in every queue every minute and keeps the work runs going"
            ),
        ),
        work.to_deployment(
            name,
            parameters={**app, "budget_seconds": work_budget_seconds},
            concurrency_limit=one_at_a_time(work_runs),
            tags=tags,
            description=about(
                f"Works for {work_budget_seconds:.0f} s a run, {work_runs} run(s) at once"
            ),
        ),
        backfill.to_deployment(
            name, parameters=app, tags=tags, description=about("Widens history when asked")
        ),
        requeue.to_deployment(
            name, parameters=app, tags=tags, description=about("Requeues jobs when asked")
        ),
    ]
    return [called(deployment) for deployment in built]


def serve(
    app_path: str,
    *,
    dsn: str | None = None,
    name: str | None = None,
    work_budget_seconds: float = WORK_BUDGET_SECONDS,
    work_runs: int = 1,
) -> None:
    """Serve the app's deployments from this process until it is stopped.

    The app is loaded once first, so that a wrong path or an unreachable database fails here
    rather than in every run; a deployment name that a work pool's deployment already has, or
    that serves another table, is refused (serving would take it over). `dsn` (else
    $SYNCLANE_DSN) reaches the runs through the environment they inherit; it is never a flow
    parameter, which Prefect would show."""
    from prefect import serve as prefect_serve

    if name is not None:
        check_deployment_name(name)
    app = load_app(app_path, dsn)
    try:
        table = table_identity(app)
    finally:
        app.close()
    built = deployments(
        app_path,
        name=name,
        table=table,
        work_budget_seconds=work_budget_seconds,
        work_runs=work_runs,
    )
    check_served_names(built)
    _add_extra_logger(os.environ, "synclane")
    _stop_on_ctrl_c_as_on_sigterm()
    prefect_serve(*built, pause_on_shutdown=False)


def _stop_on_ctrl_c_as_on_sigterm() -> None:
    """Ctrl-C stops serving the way SIGTERM does. On SIGTERM Prefect's runner cancels its runs
    (a work run hands its jobs back within a second and ends Cancelled); on Ctrl-C it kills
    their processes instead, which leaves the jobs to lease expiry and the runs `Running` in
    Prefect for ever. A second Ctrl-C still stops at once."""
    if threading.current_thread() is not threading.main_thread():
        return

    def as_sigterm(number: int, frame: FrameType | None) -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGINT, as_sigterm)


def _add_extra_logger(environ: MutableMapping[str, str], logger: str) -> None:
    """Served runs are processes started from this one: they inherit its environment."""
    current = [n.strip() for n in environ.get("PREFECT_LOGGING_EXTRA_LOGGERS", "").split(",")]
    if logger not in current:
        environ["PREFECT_LOGGING_EXTRA_LOGGERS"] = ",".join([*filter(None, current), logger])
