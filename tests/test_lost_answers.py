"""Lost answers, third round (issue 27): a statement commits and its answer never arrives
(tests/netfault.py). The table was already right; what the worker reports, logs and emits, and
what app.prune returns, must match what the table did too."""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from history import declare, jobs, two_days_of_refreshes
from netfault import answer_dropper
from psycopg import sql
from workers import arrange, database_now, job_row

from synclane import Job, Page
from synclane.events import Event
from synclane.testing import make_app, running_worker, wait_for

DAY = timedelta(days=1)


def test_a_lost_answer_to_a_hand_back_still_reports_it(
    dsn: str, schema: str, db: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A job's queue is paused while its page runs; the hand-back at the page boundary commits
    and its answer is lost. Sent again, it matched nothing (the job was no longer running under
    the lease) and the slot said nothing: no report, no log line, no event."""
    events: list[Event] = []
    with answer_dropper(dsn) as proxy:
        app = make_app(proxy.dsn, schema)
        queue = app.queue("q", lease_duration=120)
        paging = threading.Event()

        @queue.snapshot("products", every=DAY)
        def products(job: Job) -> Page:
            paging.set()
            if job.cursor is None:
                app.pause("q", "the warehouse is down")
                proxy.drop_answer_to("stalls = stalls + CASE")  # the hand-back after this page
            return Page(str(int(job.cursor or 0) + 1), 1)

        job_id = app.enqueue("q", "acme", "products")
        with (
            caplog.at_level(logging.INFO, logger="synclane"),
            running_worker(app, on_event=events.append) as worker,
        ):
            wait_for(lambda: not proxy.armed and proxy.dropped == 1, 10, "the lost answer")
            wait_for(lambda: worker.report["handed_back"] >= 1, 10, "the hand-back reported")
        app.close()
    row = job_row(db, schema, job_id)
    assert (row["status"], row["cursor"], row["attempt_count"]) == ("pending", "1", 0)
    assert [e.kind for e in events if e.job_id == job_id and e.kind == "handed_back"] == [
        "handed_back"
    ]
    assert "handed back at cursor '1' (its queue is paused)" in caplog.text
    assert worker.report["lost"] == 0


def test_a_lost_answer_to_a_wait_for_the_lanes_rate_still_reports_it(
    dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    events: list[Event] = []
    with answer_dropper(dsn) as proxy:
        app = make_app(proxy.dsn, schema)
        queue = app.queue("q", lease_duration=120, lane_rate=(1, 3600))

        @queue.snapshot("products", every=DAY)
        def products(job: Job) -> Page:
            proxy.drop_answer_to("o.next_run_at < b.next_run_at")  # the wait for the rate
            return Page(str(int(job.cursor or 0) + 1), 1)

        job_id = app.enqueue("q", "acme", "products")
        with running_worker(app, on_event=events.append) as worker:
            wait_for(lambda: proxy.dropped == 1, 10, "the lost answer")
            wait_for(lambda: worker.report["rate_limited"] >= 1, 10, "the wait reported")
        app.close()
    row = job_row(db, schema, job_id)
    assert (row["status"], row["cursor"], row["attempt_count"]) == ("pending", "1", 0)
    (waited,) = [e for e in events if e.kind == "handed_back"]
    assert waited.until is not None and waited.until == row["next_run_at"]
    assert worker.report["rate_limited"] == 1 and worker.report["lost"] == 0


@pytest.mark.parametrize("lost", ["the statement's answer", "the commit's answer"])
def test_a_lost_answer_to_a_reclaim_still_reports_the_reclaimed_job(
    dsn: str, schema: str, db: psycopg.Connection[Any], lost: str
) -> None:
    """The reclaim of an expired lease commits and its answer is lost: the job was back in line
    (and soon taken and completed), and the worker never reported or announced the reclaim."""
    events: list[Event] = []
    with answer_dropper(dsn) as proxy:
        app = make_app(proxy.dsn, schema)
        queue = app.queue("q")
        queue.snapshot("products", every=DAY)(lambda job: Page(None))
        job_id = app.enqueue("q", "acme", "products")
        with running_worker(app, on_event=events.append) as worker:
            wait_for(lambda: worker.report["completed"] == 1, 10, "the first run")
            marker = "stopped renewing its lease" if "statement" in lost else "COMMIT"
            proxy.drop_answer_to(marker)
            # A worker that died holding the job: its lease ran out a second ago.
            arrange(
                db, schema, job_id, status="running", leased_by="dead:1", attempt_count=1,
                lease_token="00000000-0000-0000-0000-000000000001",
                lease_expires_at=database_now(db) - timedelta(seconds=1),
            )  # fmt: skip
            wait_for(lambda: proxy.dropped == 1, 10, "the lost answer")
            wait_for(lambda: worker.report["completed"] == 2, 10, "the job run again")
            time.sleep(0.5)
        app.close()
    assert [e.job_id for e in events if e.kind == "reclaimed"] == [job_id]
    assert worker.report["reclaimed"] == 1
    row = job_row(db, schema, job_id)
    assert (row["status"], row["attempt_count"]) == ("completed", 2)


@pytest.mark.parametrize("lost", ["the statement's answer", "the commit's answer"])
def test_a_lost_answer_to_a_prune_still_counts_what_it_deleted(
    dsn: str, schema: str, db: psycopg.Connection[Any], lost: str
) -> None:
    """A batch of a prune deletes rows and its answer is lost: app.prune raised, and the rows
    that batch (and every batch before it) deleted were not counted."""
    with answer_dropper(dsn) as proxy:
        app = make_app(proxy.dsn, schema)
        declare(app)
        two_days_of_refreshes(app, db, schema)
        before = len(jobs(db, schema))
        proxy.drop_answer_to("merged_away" if lost == "the statement's answer" else "COMMIT")
        deleted = app.prune(older_than=5 * timedelta(hours=1))
        app.close()
    assert proxy.dropped == 1
    assert deleted > 60 and deleted == before - len(jobs(db, schema))
    count = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "jobs"))
    assert db.execute(count).fetchone() == (before - deleted,)


@pytest.mark.parametrize("dedup_key", [None, "manual:reload-1"])
def test_a_lost_answer_to_an_enqueue_adds_one_job_and_returns_it(
    dsn: str, schema: str, db: psycopg.Connection[Any], dedup_key: str | None
) -> None:
    """The insert of app.enqueue commits and its answer is lost. The call raised
    OperationalError although the job was there, and a caller who sent it again (what else can
    one do) got a second job when it gave no dedup_key."""
    with answer_dropper(dsn) as proxy:
        app = make_app(proxy.dsn, schema)
        queue = app.queue("q")
        queue.snapshot("products", every=DAY)(lambda job: Page(None))
        app.migrate()
        proxy.drop_answer_to("synclane: enqueue_job")
        job_id = app.enqueue("q", "acme", "products", dedup_key=dedup_key)
        app.close()
    assert proxy.dropped == 1
    rows = jobs(db, schema)
    assert [row["id"] for row in rows] == [job_id]
    assert (rows[0]["owner"], rows[0]["type"], rows[0]["status"]) == ("acme", "products", "pending")


def _abandoned_jobs(app: Any, db: psycopg.Connection[Any], schema: str, count: int) -> list[int]:
    ids = [app.enqueue("q", "acme", "products", lane=f"lane-{n}") for n in range(count)]
    jobs_table = sql.Identifier(schema, "jobs")
    db.execute(
        sql.SQL("UPDATE {} SET status = 'abandoned', error = 'RuntimeError: gone'").format(
            jobs_table
        )
    )
    return ids


@pytest.mark.parametrize("lost", ["the statement's answer", "the commit's answer"])
def test_a_lost_answer_to_a_requeue_or_a_cancel_still_counts_what_it_changed(
    dsn: str, schema: str, db: psycopg.Connection[Any], lost: str
) -> None:
    """app.requeue and app.cancel change rows and their answer is lost: the call raised
    OperationalError, whether or not the change had committed, and a second call counted
    nothing of what the first had done."""
    with answer_dropper(dsn) as proxy:
        app = make_app(proxy.dsn, schema)
        queue = app.queue("q")
        queue.snapshot("products", every=DAY)(lambda job: Page(None))
        app.migrate()
        _abandoned_jobs(app, db, schema, 3)
        proxy.drop_answer_to("synclane: requeue_jobs" if "statement" in lost else "COMMIT")
        requeued = app.requeue("q")
        assert proxy.dropped == 1
        assert requeued == 3
        assert {row["status"] for row in jobs(db, schema)} == {"pending"}
        proxy.drop_answer_to("synclane: cancel_jobs" if "statement" in lost else "COMMIT")
        cancelled = app.cancel("q", "acme", "disconnected")
        assert proxy.dropped == 2
        app.close()
    assert cancelled == 3
    assert {row["status"] for row in jobs(db, schema)} == {"cancelled"}


@pytest.mark.parametrize("lost", ["the statement's answer", "the commit's answer"])
def test_a_lost_answer_to_a_pause_or_a_resume_still_says_what_it_did(
    dsn: str, schema: str, db: psycopg.Connection[Any], lost: str
) -> None:
    """app.resume's answer is lost after it committed: the call raised, and sent again it said
    the queue had not been paused. app.pause's raised the same way."""
    with answer_dropper(dsn) as proxy:
        app = make_app(proxy.dsn, schema)
        app.queue("q").snapshot("products", every=DAY)(lambda job: Page(None))
        app.migrate()
        proxy.drop_answer_to("synclane: pause_queue" if "statement" in lost else "COMMIT")
        paused = app.pause("q", "warehouse maintenance", by="ops")
        assert proxy.dropped == 1
        proxy.drop_answer_to("synclane: resume_queue" if "statement" in lost else "COMMIT")
        resumed = app.resume("q")
        assert proxy.dropped == 2
        app.close()
    assert (paused["queue"], paused["paused_by"], paused["reason"]) == (
        "q",
        "ops",
        "warehouse maintenance",
    )
    assert resumed is True
    pauses = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "queue_pauses"))
    assert db.execute(pauses).fetchone() == (0,)
