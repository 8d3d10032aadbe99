"""Numbers at the edge of what the table holds (issue 27): a count or a duration either works up
to what its column or parameter holds, or is refused by name when it is declared, never
accepted and then broken in the worker (`max_attempts=2**31` left every failure unrecorded and
the reclaimer failing on each poll; `max_running=2**31` failed every take)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest
from command_line import Run
from psycopg import sql
from workers import arrange, database_now, job_row

from synclane import ConfigError, Job, Page, SyncLane, Throttled
from synclane.dagster import definitions
from synclane.model import MAX_DURATION, MAX_REASON_LENGTH
from synclane.prefect.serve import deployments
from synclane.testing import make_app, make_job
from synclane.worker.slot import retry_delay

DAY = timedelta(days=1)
INTEGER = 2**31 - 1  # the largest value of PostgreSQL's integer
SMALLINT = 2**15 - 1


def test_counts_as_large_as_their_columns_hold_work(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    """The largest max_attempts and max_running the table holds, in a lane as wide as its slot
    column allows: a failure is recorded, an expired lease is reclaimed, a job is taken and
    completes."""
    queue = app.queue(
        "q",
        concurrency=2,
        max_attempts=INTEGER,
        max_running=INTEGER,
        lane_width=SMALLINT,
        retry_base_delay=3600,
        retry_max_delay=3600,
    )

    @queue.snapshot("products", every=DAY)
    def products(job: Job) -> Page:
        if job.owner == "broken":
            raise RuntimeError("the shop answered 500")
        return Page(None, 1)

    broken = app.enqueue("q", "broken", "products", lane="acme")
    fine = app.enqueue("q", "fine", "products", lane="acme")
    expired = app.enqueue("q", "gone", "products", lane="globex")
    # A worker that died holding this job: its lease ran out a second ago.
    arrange(
        db, schema, expired, status="running", leased_by="dead:1", attempt_count=1,
        lease_token="00000000-0000-0000-0000-000000000001",
        lease_expires_at=database_now(db) - timedelta(seconds=1),
    )  # fmt: skip

    report = app.run_worker(until_idle=True, idle_grace=0, stop_after=20)

    assert report.get("completed", 0) >= 1 and report.get("failed") == 1, report
    assert job_row(db, schema, fine)["status"] == "completed"
    row = job_row(db, schema, broken)
    assert (row["status"], row["error"]) == ("failed", "RuntimeError: the shop answered 500")
    row = job_row(db, schema, expired)
    assert row["status"] in ("failed", "completed") and row["lease_token"] != (
        "00000000-0000-0000-0000-000000000001"
    ), "the expired lease was never reclaimed"


def test_a_backoff_that_doubles_past_what_a_timedelta_holds_stops_at_its_cap(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    """A lane throttled for the 31st time with a base delay of a day: 2^30 days is more than a
    timedelta holds, and the slot raised OverflowError instead of waiting for the cap."""
    queue = app.queue("q", throttle_base_delay=DAY, throttle_max_delay=MAX_DURATION)

    @queue.snapshot("products", every=DAY)
    def products(job: Job) -> Page:
        raise Throttled()

    job_id = app.enqueue("q", "acme", "products")
    arrange(db, schema, job_id, throttle_count=30)
    assert app.run_worker(until_idle=True, idle_grace=0, stop_after=20) == {"throttled": 1}
    row = job_row(db, schema, job_id)
    assert row["throttle_count"] == 31
    assert row["next_run_at"] - database_now(db) > MAX_DURATION * 0.85
    for attempt in (1, 30, 39, 40, 10**6):
        assert retry_delay(attempt, MAX_DURATION, MAX_DURATION) <= MAX_DURATION * 1.1


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (lambda: deployments("synclane.demo.app:app", work_runs=1001), "work_runs"),
        (lambda: deployments("synclane.demo.app:app", work_runs=2**70), "work_runs"),
        (lambda: deployments("synclane.demo.app:app", work_budget_seconds=1e300), "work_budget"),
        (
            lambda: deployments("synclane.demo.app:app", work_budget_seconds=float("inf")),
            "work_budget",
        ),
        (lambda: make_job(attempt_count=2**31), "attempt_count"),
        (lambda: make_job(id=2**63), "id"),
        (lambda: make_job(processed_count=2**63), "processed_count"),
    ],
)
def test_numbers_beyond_what_their_runs_and_rows_hold_are_refused_by_name(
    call: Any, named: str
) -> None:
    """The Prefect deployments keep the command line's bounds (`serve --work-runs` is 1 to 1,000,
    `--work-budget` 1 to 86,400 seconds): a million work runs were started one by one, an
    infinite budget failed in every run. A test job holds what a row holds."""
    with pytest.raises(ConfigError, match=named):
        call()


def test_the_dagster_work_runs_keep_the_bound_of_the_prefect_ones(app: SyncLane) -> None:
    app.queue("q").snapshot("products", every=DAY)(lambda job: Page(None))
    with pytest.raises(ConfigError, match="work_runs"):
        definitions(app, work_runs=1001)
    assert definitions(app, work_runs=1000) is not None


# -- reasons -------------------------------------------------------------------------------

LONGEST = "🛒" * MAX_REASON_LENGTH  # four bytes each in UTF-8


@pytest.mark.parametrize("command", ["pause", "cancel"])
def test_a_reason_has_one_limit_in_python_and_on_the_command_line(
    run: Run, db: psycopg.Connection[Any], schema: str, command: str
) -> None:
    """`synclane pause --reason` refused more than 512 bytes, while app.pause(reason=...) kept
    2,000 characters and cut the rest: now both keep a reason of up to 1,000 characters whole
    and refuse a longer one by name (and `cancel` the same)."""
    code, _, err = run("plan")
    assert code == 0, err
    words = ["--owner", "acme-us"] if command == "cancel" else []
    code, _, err = run(command, "--queue", "shops", *words, "--reason", LONGEST)
    assert code == 0, err
    code, _, err = run(command, "--queue", "shops", *words, "--reason", LONGEST + "!")
    assert code == 2 and "--reason" in err and f"{MAX_REASON_LENGTH:,}" in err, err
    assert len(err.strip().splitlines()) == 1, err
    if command == "pause":
        query = sql.SQL("SELECT reason FROM {}").format(sql.Identifier(schema, "queue_pauses"))
        assert db.execute(query).fetchall() == [(LONGEST,)]
    else:
        query = sql.SQL("SELECT DISTINCT error FROM {} WHERE status = 'cancelled'").format(
            sql.Identifier(schema, "jobs")
        )
        assert db.execute(query).fetchall() == [(f"Cancelled: {LONGEST}",)]

    app = make_app(db.info.dsn, schema)
    shops = app.queue("shops")
    shops.snapshot("products", every=DAY)(lambda job: Page(None))
    call = app.pause if command == "pause" else lambda q, r: app.cancel(q, "acme-us", r)
    with pytest.raises(ConfigError, match=rf"reason .*{MAX_REASON_LENGTH:,}"):
        call("shops", LONGEST + "!")
    call("shops", LONGEST)  # whole, as on the command line
    app.close()
