"""A Prefect Automation that notifies a team when a synclane job is abandoned for a new cause
(it waits for a human), through a notification block you already saved (Slack, Teams, e-mail, a
webhook ...).

    export PREFECT_API_URL=http://127.0.0.1:4200/api
    python flows/alerts.py slack-webhook/synclane-alerts      # <block type slug>/<block name>

Run it again to replace the automation (after editing it here). Work runs send the event
`synclane.job.abandoned` with the job as resource (`synclane.job.<table>.<job id>`) and its
queue, owner, lane, type and cause id as labels. The label `synclane.repeat` is "true" when an
older abandoned job of that queue and owner has the same cause: that cause already waits for a
human and was notified before, so a broken account's next refresh, abandoned in turn, notifies
no one again until the cause changes or the jobs are requeued. See docs/prefect.md for every
event and resource id.
"""

from __future__ import annotations

import contextlib
import sys
from datetime import timedelta
from uuid import UUID

import httpx
from prefect.automations import Automation, EventTrigger, Posture, SendNotification
from prefect.client.orchestration import get_client
from prefect.exceptions import ObjectNotFound
from prefect.settings import PREFECT_API_URL

NAME = "synclane: job abandoned"

SUBJECT = "synclane: {{ event.resource['synclane.owner'] }} waits for a human"
BODY = """\
Job {{ event.payload.job_id }} of queue {{ event.resource['synclane.queue'] }} was abandoned \
and waits for a human, for a cause no other job of this owner waited for.
owner: {{ event.resource['synclane.owner'] }}, lane: {{ event.resource['synclane.lane'] }}, \
type: {{ event.resource['synclane.type'] }}, attempt {{ event.payload.attempt }}
error: {{ event.payload.error }}
cause {{ event.payload.cause_id }}: {{ event.payload.cause }}
table: {{ event.resource['synclane.table'] }}
Later jobs abandoned for this cause notify no one. Once the cause is fixed: synclane requeue \
--queue {{ event.resource['synclane.queue'] }} --owner {{ event.resource['synclane.owner'] }} \
--cause-id {{ event.payload.cause_id }} (or the synclane-requeue deployment). If the account is \
gone for good: take it out of the owner source, then synclane cancel --queue \
{{ event.resource['synclane.queue'] }} --owner {{ event.resource['synclane.owner'] }} \
--reason 'account gone'."""


def abandoned_jobs(block_document_id: UUID) -> Automation:
    """Notify through the block once per owner and cause: for each abandoned job whose cause
    did not already wait for a human (`synclane.repeat` is "false"), at once."""
    return Automation(
        name=NAME,
        description=(
            "A synclane job was abandoned for a new cause: it will not run again until requeued."
        ),
        trigger=EventTrigger(
            expect={"synclane.job.abandoned"},
            match={"prefect.resource.id": "synclane.job.*", "synclane.repeat": "false"},
            posture=Posture.Reactive,
            threshold=1,
            within=timedelta(0),
        ),
        actions=[SendNotification(block_document_id=block_document_id, subject=SUBJECT, body=BODY)],
    )


class Mistake(Exception):
    """What stops the installation, in one line."""


def install(block: str) -> Automation:
    """Create the automation for the notification block `block` ('<type slug>/<name>'),
    replacing one of the same name."""
    slug, _, name = block.partition("/")
    with get_client(sync_client=True) as client:
        try:
            document = client.read_block_document_by_name(name=name, block_type_slug=slug)
        except ObjectNotFound:
            raise Mistake(
                f"no block {block!r} on the Prefect server: save a notification block first "
                "(see docs/prefect.md), and name it as '<block type slug>/<block name>' "
                "(`prefect block ls` lists them)"
            ) from None
    capabilities = document.block_schema.capabilities if document.block_schema else []
    if "notify" not in capabilities:
        raise Mistake(
            f"block {block!r} is not a notification block (Slack, Teams, e-mail, a webhook ...): "
            "an Automation can only notify through one of those"
        )
    with contextlib.suppress(ValueError):  # ValueError: there is none yet
        Automation.read(name=NAME).delete()
    return abandoned_jobs(document.id).create()


def main(argv: list[str]) -> int:
    if len(argv) != 1 or "/" not in argv[0]:
        sys.exit("usage: python flows/alerts.py <block type slug>/<block name>")
    try:
        created = install(argv[0])
    except Mistake as mistake:
        sys.exit(f"flows/alerts.py: {mistake}")
    except (httpx.HTTPError, OSError) as error:
        url = PREFECT_API_URL.value() or "(none: PREFECT_API_URL is not set)"
        sys.exit(
            f"flows/alerts.py: cannot reach the Prefect API at {url} ({type(error).__name__}: "
            f"{error}); start the server or set PREFECT_API_URL"
        )
    print(f"automation {created.name!r} created: {created.id}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
