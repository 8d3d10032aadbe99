"""What tests/test_prefect.py and tests/test_prefect_pool.py share: waiting for a condition, and
the environment and command line of the Prefect processes a test starts. The temporary Prefect
server they run against is the fixture `prefect_server` (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

FLOWS = ("plan", "work", "backfill", "requeue")
ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def eventually(probe: Callable[[], T | None], timeout: float, what: str) -> T:
    """Ask `probe` until it answers something truthy, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        answer = probe()
        if answer:
            return answer
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.5)


def prefect_env(api_url: str, home: Path) -> dict[str, str]:
    """The environment of a Prefect command or worker started by a test."""
    return {
        **os.environ,
        "PREFECT_API_URL": api_url,
        "PREFECT_HOME": str(home),
        "PREFECT_CLI_PROMPT": "false",
        "PREFECT_WORKER_QUERY_SECONDS": "2",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }


def prefect_cli(env: dict[str, str], *args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "prefect", *args],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, f"prefect {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def flow_runs(deployment: str) -> list[Any]:
    """The flow runs of the deployment named `deployment` ("flow/deployment")."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with get_client(sync_client=True) as client:
        found = client.read_deployment_by_name(deployment)
        return client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[found.id]))
        )
