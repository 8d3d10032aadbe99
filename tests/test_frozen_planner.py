"""A frozen planner (issue 27): the process elected to plan a queue is stopped (SIGSTOP, a
frozen VM, a debugger) in the middle of its round. Planning goes on within a bound: the round
holds a lease on the queue's planner row, renewed while it works, and a lease nobody renews
ends; the round's transactions end on the server when their client stops answering
(idle_in_transaction_session_timeout), so they hold no key another planner waits for."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from datetime import timedelta
from typing import Any

import apps
import psycopg
from planner_apps import FROZEN_OWNERS_TIMEOUT, OWNERS, frozen_in_a_transaction, frozen_round
from psycopg import sql

from synclane import Page, SyncLane
from synclane.testing import running_worker, wait_for

# The bound the frozen planner's lease gives: twice its owners_timeout, at least 5 s.
BOUND = max(2 * FROZEN_OWNERS_TIMEOUT, 5.0)


def jobs(db: psycopg.Connection[Any], schema: str) -> int:
    row = db.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "jobs"))
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_planner_stopped_in_its_round_does_not_stop_planning_for_everyone(
    dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    SyncLane(dsn, schema=schema).close()  # the schema, before either planner starts
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    frozen = context.Process(target=frozen_round, args=(dsn, schema, results), daemon=True)
    frozen.start()
    try:
        assert results.get(timeout=60) == ("reading the owner source", frozen.pid)
        assert frozen.pid is not None
        os.kill(frozen.pid, signal.SIGSTOP)
        stopped = time.monotonic()

        # Another worker of the same app, every round it tries: planned within the bound.
        app = SyncLane(dsn, schema=schema, poll_interval=0.2, plan_interval=0.2)
        shops = app.queue("shops")
        shops.owners(lambda queue: list(OWNERS))
        shops.snapshot("products", every=timedelta(days=1))(lambda job: Page(None))
        with running_worker(app):
            wait_for(lambda: jobs(db, schema) == len(OWNERS), BOUND + 10, "the other's plan")
            took = time.monotonic() - stopped
        app.close()
        assert took < BOUND + 3, f"planning waited {took:.1f} s for the stopped planner"

        # The stopped planner wakes up: its round finds its lease gone and ends; nothing is
        # planned twice.
        os.kill(frozen.pid, signal.SIGCONT)
        assert results.get(timeout=60) == ("skipped", frozen.pid)
        assert jobs(db, schema) == len(OWNERS)
    finally:
        if frozen.pid is not None and frozen.is_alive():
            os.kill(frozen.pid, signal.SIGCONT)
            frozen.kill()
        frozen.join(10)


def test_a_planner_stopped_in_its_transaction_holds_the_keys_it_inserted_only_so_long(
    dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    """The planner is stopped after its batch inserted an owner's jobs and before it committed:
    another planner inserting the same keys waits for that transaction, for as long as the
    stopped one lives. The round's transactions end on the server once their client has left
    them idle for the lease (idle_in_transaction_session_timeout, set per transaction)."""
    apps.build(dsn, schema).close()
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    frozen = context.Process(
        target=frozen_in_a_transaction, args=(dsn, schema, 3.0, results), daemon=True
    )
    frozen.start()
    try:
        outcome = results.get(timeout=60)
        assert outcome == ("inserted", apps.JOBS_PER_OWNER), outcome
        assert frozen.pid is not None
        os.kill(frozen.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        app = apps.build(dsn, schema, lambda queue: list(OWNERS[:1]))
        planned: list[dict[str, int]] = []
        threading.Thread(target=lambda: planned.append(app.plan()), daemon=True).start()
        wait_for(lambda: planned, 20, "the other planner's plan")
        took = time.monotonic() - stopped
        app.close()
        assert planned == [{"shops": apps.JOBS_PER_OWNER}]
        assert took < 3.0 + 3, f"the other planner waited {took:.1f} s"
        assert jobs(db, schema) == apps.JOBS_PER_OWNER
    finally:
        if frozen.pid is not None and frozen.is_alive():
            os.kill(frozen.pid, signal.SIGCONT)
            frozen.kill()
        frozen.join(10)
