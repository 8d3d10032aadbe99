"""What a work run alerts a team to, under either orchestrator (synclane.causes): per owner and
per cause, not per job. Real worker runs against PostgreSQL; no orchestrator."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import pytest

from synclane import Abandon, Job, Owner, Page, SyncLane
from synclane.causes import Causes, Noted, alert, new_causes, repeats
from synclane.testing import make_app

DAY = timedelta(days=1)


@dataclass
class Broken:
    app: SyncLane
    reason: str = "account 41 closed"  # why the accounts `gone` and `other` are abandoned


@pytest.fixture
def made(dsn: str, schema: str) -> Iterator[Broken]:
    """Queue `q`: accounts `gone` and `other` are abandoned for `reason`, `ok` completes."""
    app = make_app(dsn, schema)
    made = Broken(app)
    q = app.queue("q", max_attempts=1, retry_base_delay=3600)

    @q.owners
    def owners(queue: str) -> list[Owner]:
        return [Owner("gone"), Owner("other"), Owner("ok")]

    @q.snapshot("orders", every=DAY)
    def orders(job: Job) -> Page:
        if job.owner in ("gone", "other"):
            raise Abandon(made.reason)
        return Page(None, 1)

    yield made
    app.close()


def work(app: SyncLane) -> list[Noted]:
    causes = Causes(app, ["abandoned", "deferred", "failed"])
    app.run_worker(["q"], stop_after=20, until_idle=True, idle_grace=0, on_event=causes)
    return causes.take(final=True)


def abandoned(noted: list[Noted]) -> dict[str, list[bool]]:
    found: dict[str, list[bool]] = {}
    for item in noted:
        if item.event.kind == "abandoned":
            found.setdefault(item.event.owner, []).append(item.repeat)
    return found


def test_a_cause_already_waiting_for_a_human_alerts_only_once(made: Broken) -> None:
    broken = made.app
    broken.plan("q")
    first = work(broken)
    # each owner's first abandonment for the cause is new: the cause is per owner
    assert abandoned(first) == {"gone": [False], "other": [False]}
    (gone,) = [n for n in first if n.event.owner == "gone"]
    assert gone.cause == "Abandon: account <n> closed"
    assert gone.cause_id == broken.failures("q", owner="gone")["cause_id"].iloc[0]
    assert [c.owner for c in new_causes(first)] == ["gone", "other"]

    # the account's next jobs: the same cause (another number, masked the same) waits already
    made.reason = "account 97 closed"
    broken.enqueue("q", "gone", "orders")
    broken.enqueue("q", "gone", "orders")
    again = work(broken)
    assert abandoned(again) == {"gone": [True, True]}
    assert new_causes(again) == [] and repeats(again, []) == 2

    # a cause that changes alerts again
    made.reason = "token revoked"
    broken.enqueue("q", "gone", "orders")
    changed = work(broken)
    assert abandoned(changed) == {"gone": [False]}
    (cause,) = new_causes(changed)
    assert (cause.owner, cause.cause) == ("gone", "Abandon: token revoked")

    # requeued, the jobs wait for no one: abandoned again, their cause alerts again
    assert broken.requeue("q", owner="gone") == 4
    requeued = work(broken)
    assert abandoned(requeued)["gone"].count(False) == 1  # one new cause, the rest repeat it
    (cause,) = new_causes(requeued)
    assert len(cause.jobs) == 4
    text = alert([cause], 0, lambda c: "the requeue job")
    assert text.startswith("1 new cause(s) of abandoned jobs, waiting for a human: gone (queue q)")
    assert "`synclane cancel --queue q --owner gone --reason 'account gone'`" in text


def test_events_wait_for_their_causes_while_the_database_is_away(made: Broken) -> None:
    """A look-up that cannot reach the database keeps the events for the next call; the last
    call of a run hands them out without causes, an abandoned job counted as new."""
    broken = made.app
    broken.plan("q")
    causes = Causes(broken, ["abandoned"])
    broken.run_worker(["q"], stop_after=20, until_idle=True, idle_grace=0, on_event=causes)
    broken.close()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(broken.database, "dsn", "postgresql://nobody@127.0.0.1:1/none")
        assert causes.take() == []
        final = causes.take(final=True)
    assert sorted(n.event.owner for n in final) == ["gone", "other"]
    assert all(n.cause is None and n.new_abandonment for n in final)
