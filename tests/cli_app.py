"""The app the CLI tests load with --app cli_app:app; its schema comes from the environment.

globex's history fails every time ("order <id> not found"); the other owners' jobs complete.
$SYNCLANE_CLI_TEST_RETRY sets the retry delay in seconds (default 30: a retry is never due
within a test unless a test asks for it)."""

from __future__ import annotations

import os
from datetime import timedelta

from synclane import Job, Owner, Page, SyncLane

app = SyncLane(schema=os.environ["SYNCLANE_CLI_TEST_SCHEMA"], poll_interval=0.05)
retry = float(os.environ.get("SYNCLANE_CLI_TEST_RETRY", "30"))
shops = app.queue(
    "shops", concurrency=2, max_attempts=2, retry_base_delay=retry, retry_max_delay=retry
)


@shops.owners
def connected(queue: str) -> list[Owner]:
    return [Owner("acme-us", lane="acme"), Owner("acme-eu", lane="acme"), Owner("globex")]


@shops.windowed(
    "orders", horizon=timedelta(days=60), slice=timedelta(days=30), every=timedelta(minutes=15)
)
def orders(job: Job) -> Page:
    if job.owner == "globex" and job.mode == "initial":
        raise LookupError(f"order {job.id} not found")
    return Page(None, 5)
