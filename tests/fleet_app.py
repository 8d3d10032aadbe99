"""The app the fleet tests run with `synclane --app fleet_app:app work`: schema and poll interval
come from the environment ($SYNCLANE_FLEET_SCHEMA, $SYNCLANE_FLEET_POLL, default 30 s, so that
only a notification starts a job quickly).

What a job does depends on its owner's name: `fine-*` three pages of five records each;
`broken-*` fails (its retry is an hour away); `slow-*` is throttled for an hour (its lane
pauses); `gone-*` is abandoned."""

from __future__ import annotations

import os
from datetime import timedelta

from synclane import Abandon, Job, Page, SyncLane, Throttled

PAGES = 3
RECORDS = 5

app = SyncLane(
    schema=os.environ["SYNCLANE_FLEET_SCHEMA"],
    poll_interval=float(os.environ.get("SYNCLANE_FLEET_POLL", "30")),
    plan_interval=3600,
)
shops = app.queue("shops", concurrency=2, retry_base_delay=3600, retry_max_delay=3600)


@shops.snapshot("orders", every=timedelta(days=1))
def orders(job: Job) -> Page:
    if job.owner.startswith("broken-"):
        raise RuntimeError(f"order {job.id} not found")
    if job.owner.startswith("slow-"):
        raise Throttled(retry_after=3600)
    if job.owner.startswith("gone-"):
        raise Abandon("access revoked")
    page = int(job.cursor or 0) + 1
    return Page(str(page) if page < PAGES else None, RECORDS)
