"""The planner at scale, against a real PostgreSQL: a worker's round plans only what is due and
only one process plans a queue at a time; the owner source is reconciled with the owners table
(added, removed and re-laned owners); racing planners never raise a raw driver error; planning
and enqueueing join the caller's transaction (conn=)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import apps
import planner_apps
import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row
from workers import wait_until_away_from_a_period_edge

from synclane import ConfigError, Job, Owner, OwnerSourceError, Page, SyncLane, batches

DAY = timedelta(days=1)
PERIOD = timedelta(seconds=2)  # a refresh period short enough to see two of them in a test


def table(schema: str, name: str) -> sql.Identifier:
    return sql.Identifier(schema, name)


def select(db: psycopg.Connection[Any], query: str, schema: str, *params: Any) -> list[dict]:
    """Run a query whose {jobs}, {owners}, {lanes} name the schema's tables."""
    statement = sql.SQL(query).format(
        jobs=table(schema, "jobs"), owners=table(schema, "owners"), lanes=table(schema, "lanes")
    )
    with db.cursor(row_factory=dict_row) as cur:
        return cur.execute(statement, params).fetchall()


def change(db: psycopg.Connection[Any], query: str, schema: str, *params: Any) -> int:
    statement = sql.SQL(query).format(
        jobs=table(schema, "jobs"), owners=table(schema, "owners"), lanes=table(schema, "lanes")
    )
    return db.execute(statement, params).rowcount


def count(db: psycopg.Connection[Any], schema: str, where: str = "TRUE", *params: Any) -> int:
    return int(
        select(db, f"SELECT count(*) AS n FROM {{jobs}} WHERE {where}", schema, *params)[0]["n"]
    )


def sleep_into_the_next_period(every: timedelta = PERIOD) -> None:
    now = time.time()
    seconds = every.total_seconds()
    time.sleep(seconds - now % seconds + 0.05)


class Source:
    """An owner source whose answer a test changes, counting how often it is asked."""

    def __init__(self, owners: list[Owner]) -> None:
        self.owners = list(owners)
        self.calls = 0
        self.fail_after: int | None = None

    def __call__(self, queue: str) -> Iterator[Owner]:
        self.calls += 1
        for number, owner in enumerate(list(self.owners)):
            if self.fail_after is not None and number == self.fail_after:
                raise RuntimeError("the accounts API went away mid-list")
            yield owner


def declare(app: SyncLane, source: Source, every: timedelta = PERIOD, **settings: Any) -> SyncLane:
    """A queue with a windowed and a snapshot type refreshed `every` (default PERIOD)."""
    shops = app.queue("shops", **{"owners_interval": 3600, **settings})
    shops.owners(source)
    shops.windowed("orders", horizon=60 * DAY, slice=30 * DAY, every=every)(lambda job: Page(None))
    shops.snapshot("products", every=every)(lambda job: Page(None))
    return app


def round_of(app: SyncLane, queue: str = "shops") -> int | None:
    """One planning round as a worker runs it (the worker's plan callable)."""
    plan = app.worker([queue]).plan
    assert plan is not None
    return plan(queue)


# -- planning what is due -----------------------------------------------------------------------


def test_a_round_plans_new_owners_then_nothing_until_a_period_starts(
    app: SyncLane, db: psycopg.Connection[Any], schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = Source([Owner("acme-us", lane="acme"), Owner("globex")])
    declare(app, source)
    sleep_into_the_next_period()
    assert round_of(app) == 2 * (2 + 1 + 1)  # two slices, a refresh, a snapshot each

    # Nothing due: the round reads no owner and asks no source.
    reads: list[list[str]] = []
    original = batches.read_and_insert

    def counting(queue: Any, owners: list[Owner], *args: Any) -> Any:
        reads.append([o.id for o in owners])
        return original(queue, owners, *args)

    monkeypatch.setattr(batches, "read_and_insert", counting)
    assert round_of(app) == 0
    assert reads == [] and source.calls == 1

    # A new period: each type is planned once for every owner (what finished gets its refresh).
    change(db, "UPDATE {jobs} SET status = 'completed'", schema)
    sleep_into_the_next_period()
    assert round_of(app) == 4
    assert sorted(owner for batch in reads for owner in batch) == sorted(["acme-us", "globex"] * 2)
    assert count(db, schema, "mode = 'recurring' AND status = 'pending'") == 4
    assert round_of(app) == 0, "the period had its refresh"


def test_a_wider_declared_horizon_makes_the_round_plan_the_older_slices(
    app: SyncLane, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    declare(app, Source([Owner("acme")]))
    round_of(app)
    # Its 60 days are loaded: nothing is open that could plan the older slices on finishing.
    history = "type = 'orders' AND mode = 'initial'"
    change(db, f"UPDATE {{jobs}} SET status = 'completed' WHERE {history}", schema)
    wider = SyncLane(dsn, schema=schema)
    try:
        shops = wider.queue("shops", owners_interval=3600)
        shops.owners(Source([Owner("acme")]))
        shops.windowed("orders", horizon=730 * DAY, slice=30 * DAY, every=timedelta(days=1))(
            lambda job: Page(None)
        )
        # Lazy history: the round records the wider horizon and plans the next two older slices
        # (a lane one wide keeps two open); the other 21 are planned as those finish.
        assert round_of(wider) == 2
        assert count(db, schema, history) == 4
        assert round_of(wider) == 0
        # The older version, still running during a deploy, starts no pass of its own.
        assert round_of(app) == 0
        opened = f"{history} AND status = 'pending'"
        while change(db, f"UPDATE {{jobs}} SET status = 'completed' WHERE {opened}", schema):
            pass
        assert count(db, schema, history) == 25
    finally:
        wider.close()


# -- knowing the owners -------------------------------------------------------------------------


def test_reconciliation_plans_added_owners_and_nothing_more_for_removed_ones(
    app: SyncLane, db: psycopg.Connection[Any], schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    source = Source([Owner("acme"), Owner("globex")])
    declare(app, source, owners_interval=0.001)
    round_of(app)
    source.owners = [Owner("globex"), Owner("initech")]
    with caplog.at_level(logging.INFO, logger="synclane"):
        assert round_of(app) == 4, "initech's first plan"
    assert "1 owner(s) no longer named by the owner source" in caplog.text
    owners = select(db, "SELECT owner FROM {owners} ORDER BY owner", schema)
    assert [o["owner"] for o in owners] == ["globex", "initech"]
    # acme's jobs stay as they were: cancelling is the user's call.
    assert count(db, schema, "owner = 'acme' AND status = 'pending'") == 4

    change(db, "UPDATE {jobs} SET status = 'completed'", schema)
    sleep_into_the_next_period()
    round_of(app)
    refreshed = select(
        db, "SELECT DISTINCT owner FROM {jobs} WHERE status = 'pending' ORDER BY owner", schema
    )
    assert [r["owner"] for r in refreshed] == ["globex", "initech"]


def test_the_owners_no_longer_named_are_swept_page_by_page(
    app: SyncLane,
    db: psycopg.Connection[Any],
    schema: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sweep walks the owners table a page at a time (a page of two here) and sends only the
    names of each page to delete, never the fleet's: every owner the source dropped goes, on
    every page, and every owner it still names stays."""
    from synclane import rounds

    monkeypatch.setattr(rounds, "BATCH", 2)
    names = [f"o{n}" for n in range(9)]
    source = Source([Owner(name) for name in names])
    declare(app, source, owners_interval=0.001)
    round_of(app)
    kept = ["o1", "o2", "o5", "o8"]
    source.owners = [Owner(name) for name in kept]
    with caplog.at_level(logging.INFO, logger="synclane"):
        round_of(app)
    assert "5 owner(s) no longer named by the owner source" in caplog.text
    assert "o0, o3, o4…" in caplog.text
    owners = select(db, "SELECT owner FROM {owners} ORDER BY owner", schema)
    assert [o["owner"] for o in owners] == kept


def test_an_owner_source_that_fails_midway_removes_nothing(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    source = Source([Owner(f"shop-{n}") for n in range(6)])
    declare(app, source, owners_interval=0.001)
    round_of(app)
    source.owners = [*source.owners[:3], Owner("new"), *source.owners[3:]]
    source.fail_after = 4
    with pytest.raises(OwnerSourceError, match="went away mid-list"):
        round_of(app)
    owners = [o["owner"] for o in select(db, "SELECT owner FROM {owners}", schema)]
    assert sorted(owners) == [f"shop-{n}" for n in range(6)]
    assert count(db, schema, "status = 'pending'") == 6 * 4


def test_an_owner_the_database_cannot_store_is_left_out_of_a_streamed_source(
    app: SyncLane, db: psycopg.Connection[Any], schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    source = Source([Owner("acme"), Owner("bad\x00id"), Owner("globex", lane="x" * 600)])
    declare(app, source)
    with caplog.at_level(logging.ERROR, logger="synclane"):
        assert app.plan("shops") == {"shops": 4}
        assert round_of(app) == 0
    assert [o["owner"] for o in select(db, "SELECT owner FROM {owners}", schema)] == ["acme"]
    refused = [r for r in caplog.records if "cannot be stored" in r.getMessage()]
    assert len(refused) == 2, "one line per reading of the source"
    assert "named 2 owner(s)" in refused[0].getMessage()


# -- owners that change lanes -----------------------------------------------------------------


def test_a_re_laned_owner_takes_its_open_jobs_to_the_new_lane(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    source = Source([Owner("acme"), Owner("globex")])
    declare(app, source)
    app.plan("shops")
    change(db, "UPDATE {jobs} SET status = 'completed' WHERE owner = 'acme' AND mode = 'initial'",
           schema)  # fmt: skip
    # globex's lane is paused by a throttle: a job that joins it waits for the pause too.
    change(
        db,
        "INSERT INTO {lanes} (queue, lane, paused_until) VALUES "
        "('shops', 'globex', now() + interval '1 hour') "
        "ON CONFLICT (queue, lane) DO UPDATE SET paused_until = excluded.paused_until",
        schema,
    )
    source.owners = [Owner("acme", lane="globex"), Owner("globex")]
    app.plan("shops")

    moved = select(db, "SELECT * FROM {jobs} WHERE owner = 'acme' ORDER BY id", schema)
    assert {(r["status"], r["lane"]) for r in moved} == {
        ("completed", "acme"),  # finished jobs keep the lane they ran in
        ("pending", "globex"),
    }
    (paused,) = select(db, "SELECT paused_until FROM {lanes} WHERE lane = 'globex'", schema)
    for row in moved:
        if row["status"] == "pending":
            assert row["next_run_at"] >= paused["paused_until"]
    (known,) = select(db, "SELECT lane FROM {owners} WHERE owner = 'acme'", schema)
    assert known["lane"] == "globex"
    # New jobs of acme are planned into its new lane, and so is a manual one.
    job = app.enqueue("shops", "acme", "products")
    assert select(db, "SELECT lane FROM {jobs} WHERE id = %s", schema, job) == [{"lane": "globex"}]


RUN_FIRST = """
UPDATE {jobs} SET status = 'running', lease_token = gen_random_uuid(),
                  lease_expires_at = now() + interval '1 hour'
WHERE id = (SELECT min(id) FROM {jobs} WHERE owner = %s)
"""
FINISH_RUNNING = """
UPDATE {jobs} SET status = 'completed', lease_token = NULL
WHERE owner = %s AND status = 'running'
"""


def test_a_running_job_moves_with_its_owner_or_nothing_moves(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    """The running-lane index decides: while the new lane runs a job, nothing of the owner moves
    (and nothing new is planned beside its running job); once the lane is free, the running job
    moves with the rest, and the new lane is held by it."""
    source = Source([Owner("acme"), Owner("globex")])
    declare(app, source)
    app.plan("shops")
    for owner in ("acme", "globex"):  # each has a job running
        change(db, RUN_FIRST, schema, owner)

    source.owners = [Owner("acme", lane="globex"), Owner("globex")]
    app.plan("shops")
    lanes = select(db, "SELECT DISTINCT lane FROM {jobs} WHERE owner = 'acme'", schema)
    assert lanes == [{"lane": "acme"}], "globex runs a job: acme stays where its job runs"
    enqueued = app.enqueue("shops", "acme", "products")
    assert select(db, "SELECT lane FROM {jobs} WHERE id = %s", schema, enqueued) == [
        {"lane": "acme"}
    ]

    change(db, FINISH_RUNNING, schema, "globex")
    app.plan("shops")
    opened = select(
        db,
        "SELECT status, lane FROM {jobs} WHERE owner = 'acme' "
        "AND status IN ('pending', 'running') ORDER BY id",
        schema,
    )
    assert {r["lane"] for r in opened} == {"globex"} and opened[0]["status"] == "running"
    # acme's running job now holds globex: no job of globex (or acme) can start beside it.
    with pytest.raises(psycopg.errors.UniqueViolation):
        change(
            db,
            "UPDATE {jobs} SET status = 'running' WHERE id = (SELECT min(id) FROM {jobs} "
            "WHERE owner = 'globex' AND status = 'pending')",
            schema,
        )


def test_the_round_reconciles_lane_changes_too(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    source = Source([Owner("acme"), Owner("globex")])
    declare(app, source, owners_interval=0.001)
    round_of(app)
    source.owners = [Owner("acme", lane="shared"), Owner("globex", lane="shared")]
    round_of(app)
    lanes = select(db, "SELECT DISTINCT lane FROM {jobs} WHERE status = 'pending'", schema)
    assert lanes == [{"lane": "shared"}]


# -- one planner at a time; racing planners ---------------------------------------------------


@pytest.mark.processes
def test_one_process_plans_a_queue_at_a_time_and_the_others_skip_the_round(
    dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    apps.build(dsn, schema).close()
    processes, barrier, release, results = planner_apps.start_rounds(4, dsn, schema)
    try:
        barrier.wait(timeout=60)
        # The planning process holds its round (and the lock) until released: every other
        # process has come and gone by then.
        early = sorted(results.get(timeout=60)[0] for _ in range(4))
        assert early == ["reading the owner source"] + ["skipped"] * 3
        release.set()
        last = results.get(timeout=60)
        assert last == ("ran", apps.JOBS_PER_OWNER * len(apps.OWNERS)), last
    finally:
        release.set()
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    assert count(db, schema) == apps.JOBS_PER_OWNER * len(apps.OWNERS)


@pytest.mark.processes
def test_twenty_planners_with_shuffled_owner_sources_never_raise_and_create_each_job_once(
    dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    apps.build(dsn, schema).close()
    reports = apps.run_together(
        planner_apps.plan_shuffled,
        20,
        dsn,
        schema,
        before_release=lambda: wait_until_away_from_a_period_edge(db, apps.ORDERS_EVERY),
    )
    errors = [detail for status, detail in reports if status != "ok"]
    assert errors == []
    expected = apps.JOBS_PER_OWNER * len(apps.OWNERS)
    assert sum(added for _, added in reports) == expected
    assert count(db, schema) == expected
    owners = select(db, "SELECT owner, lane FROM {owners} ORDER BY owner", schema)
    assert owners == [
        {"owner": o.id, "lane": o.lane} for o in sorted(apps.OWNERS, key=lambda o: o.id)
    ]


# -- the caller's transaction ------------------------------------------------------------------


@pytest.fixture
def shop(app: SyncLane) -> SyncLane:
    return declare(app, Source([Owner("acme")]), every=DAY)


def test_plan_and_enqueue_on_the_callers_connection_commit_and_roll_back_with_it(
    shop: SyncLane, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    with psycopg.connect(dsn) as conn:  # not autocommit: a transaction opens at once
        assert shop.plan("shops", Owner("new", lane="n"), conn=conn) == {"shops": 4}
        job = shop.enqueue("shops", "new", "products", conn=conn)
        assert count(db, schema) == 0, "nothing is visible before the commit"
        conn.rollback()
    assert count(db, schema) == 0
    assert select(db, "SELECT * FROM {owners}", schema) == []

    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.transaction():
            conn.execute("CREATE TEMPORARY TABLE accounts (id text)")
            conn.execute("INSERT INTO accounts VALUES ('new')")
            assert shop.plan("shops", Owner("new", lane="n"), conn=conn) == {"shops": 4}
            job = shop.enqueue("shops", "new", "products", conn=conn)
        assert count(db, schema) == 5
    assert select(db, "SELECT lane FROM {jobs} WHERE id = %s", schema, job) == [{"lane": "n"}]
    # Workers see it, and take it.
    assert shop.run_worker(until_idle=True, stop_after=20, idle_grace=0)["completed"] == 5 + 4


def test_the_async_twins_join_the_callers_async_transaction(
    shop: SyncLane, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    async def scenario(commit: bool) -> int:
        conn = await psycopg.AsyncConnection.connect(dsn)
        try:
            planned = await shop.plan_async("shops", "acme", conn=conn)
            job = await shop.enqueue_async("shops", "acme", "products", conn=conn)
            assert count(db, schema) == 0
            await (conn.commit() if commit else conn.rollback())
            assert planned == {"shops": 4}
            return job
        finally:
            await conn.close()

    asyncio.run(scenario(commit=False))
    assert count(db, schema) == 0
    job = asyncio.run(scenario(commit=True))
    assert count(db, schema) == 5 and count(db, schema, "id = %s", job) == 1
    # Without a connection they run on the app's own.
    assert asyncio.run(shop.plan_async("shops")) == {"shops": 0}
    assert asyncio.run(shop.enqueue_async("shops", "acme", "products")) > job


def test_a_connection_of_the_wrong_kind_is_refused_with_the_fix(shop: SyncLane, dsn: str) -> None:
    with pytest.raises(ConfigError, match=r"conn must be a psycopg.Connection.*plan_async"):
        asyncio.run(_wrong_kind(shop, dsn))
    with pytest.raises(ConfigError, match=r"conn must be a psycopg\.Connection"):
        shop.plan("shops", "acme", conn="postgresql://")  # type: ignore[arg-type]
    closed = psycopg.connect(dsn)
    closed.close()
    with pytest.raises(ConfigError, match="closed"):
        shop.enqueue("shops", "acme", "products", conn=closed)


async def _wrong_kind(shop: SyncLane, dsn: str) -> None:
    conn = await psycopg.AsyncConnection.connect(dsn)
    try:
        shop.plan("shops", "acme", conn=conn)  # type: ignore[arg-type]
    finally:
        await conn.close()


def test_the_worker_plans_new_owners_at_its_next_reconciliation(
    dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    app = SyncLane(dsn, schema=schema, poll_interval=0.05, plan_interval=0.2)
    try:
        source = Source([Owner("acme")])
        shops = app.queue("shops", owners_interval=0.5)
        shops.owners(source)

        @shops.snapshot("products", every=DAY)
        def products(job: Job) -> Page:
            return Page(None, 1)

        from workers import running_worker, wait_for

        with running_worker(app):
            wait_for(lambda: count(db, schema, "status = 'completed'") == 1, 10, "acme")
            source.owners.append(Owner("globex"))
            wait_for(lambda: count(db, schema, "status = 'completed'") == 2, 10, "globex")
    finally:
        app.close()


def test_a_worker_whose_round_was_skipped_plans_before_it_calls_itself_idle(
    app: SyncLane, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """Another process holds the queue's planning lease when the worker starts (for another
    second): the worker's round is skipped, tried again, and the worker works until idle only
    once it has planned."""
    declare(app, Source([Owner("acme"), Owner("globex")]), every=DAY)
    db.execute(
        sql.SQL(
            "INSERT INTO {} (queue, planning_token, planning_until) "
            "VALUES ('shops', gen_random_uuid(), now() + interval '1 second')"
        ).format(sql.Identifier(schema, "planner"))
    )
    report = app.run_worker(until_idle=True, idle_grace=0, stop_after=30)
    assert report.get("completed") == 2 * 4, report
    assert count(db, schema, "status = 'completed'") == 8
