"""A Prefect Automation that notifies a team when a synclane job is abandoned (it waits for a
human), through a notification block you already saved (Slack, Teams, e-mail, a webhook ...).

    export PREFECT_API_URL=http://127.0.0.1:4200/api
    python flows/alerts.py slack-webhook/synclane-alerts      # <block type slug>/<block name>

Run it again to replace the automation (after editing it here). Work runs send the event
`synclane.job.abandoned` with the job as resource (`synclane.job.<table>.<job id>`) and its
queue, owner, lane and type as labels; see docs/prefect.md for every event and resource id.
"""

from __future__ import annotations

import contextlib
import sys
from datetime import timedelta
from uuid import UUID

from prefect.automations import Automation, EventTrigger, Posture, SendNotification
from prefect.blocks.core import Block

NAME = "synclane: job abandoned"

SUBJECT = "synclane: job {{ event.resource['synclane.owner'] }} abandoned"
BODY = """\
Job {{ event.payload.job_id }} of queue {{ event.resource['synclane.queue'] }} was abandoned and \
waits for a human.
owner: {{ event.resource['synclane.owner'] }}, lane: {{ event.resource['synclane.lane'] }}, \
type: {{ event.resource['synclane.type'] }}, attempt {{ event.payload.attempt }}
error: {{ event.payload.error }}
table: {{ event.resource['synclane.table'] }}
Fix the cause, then run the synclane-requeue deployment (or app.requeue) for it."""


def abandoned_jobs(block_document_id: UUID) -> Automation:
    """Notify through the block for every abandoned job, at once (one event is enough)."""
    return Automation(
        name=NAME,
        description="A synclane job was abandoned: it will not run again until requeued.",
        trigger=EventTrigger(
            expect={"synclane.job.abandoned"},
            match={"prefect.resource.id": "synclane.job.*"},
            posture=Posture.Reactive,
            threshold=1,
            within=timedelta(0),
        ),
        actions=[SendNotification(block_document_id=block_document_id, subject=SUBJECT, body=BODY)],
    )


def install(block: str) -> Automation:
    """Create the automation for the notification block `block` ('<type slug>/<name>'),
    replacing one of the same name."""
    found = Block.load(block)
    assert found._block_document_id is not None
    with contextlib.suppress(ValueError):  # ValueError: there is none yet
        Automation.read(name=NAME).delete()
    return abandoned_jobs(found._block_document_id).create()


if __name__ == "__main__":
    if len(sys.argv) != 2 or "/" not in sys.argv[1]:
        sys.exit("usage: python flows/alerts.py <block type slug>/<block name>")
    created = install(sys.argv[1])
    print(f"automation {created.name!r} created: {created.id}")
