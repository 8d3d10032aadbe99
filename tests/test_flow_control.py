"""Flow control across the fleet (issues 16 and 21), with real worker processes: a paused queue,
lanes wider than one, a cap for the whole queue, and rate limits per lane. Each limit is carried
by the database (a unique index, a row every process reads), and each test that the index
carries it has a control that drops the index and finds the limit exceeded."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any
from uuid import uuid4

import psycopg
import pytest
from psycopg import sql
from worker_proc import build, create_runs
from workers import count, index_definitions, job_row, race_a_rival, wait_for, worker_processes

from synclane import ConfigError, Page, SyncLane
from synclane.model import Rate

pytestmark = pytest.mark.processes

# The most runs of one lane (or of the queue, with the lane test left out) in flight at once:
# for each run, how many runs had started and not ended at its start (itself included).
MOST_AT_ONCE = """
SELECT coalesce(max(c), 0) FROM (
    SELECT a.id, count(*) AS c FROM {runs} a JOIN {runs} b
      ON ({same_lane}) AND b.started <= a.started AND (b.ended IS NULL OR b.ended > a.started)
    GROUP BY a.id
) t
"""


def most_at_once(db: psycopg.Connection[Any], schema: str, per_lane: bool) -> int:
    statement = sql.SQL(MOST_AT_ONCE).format(
        runs=sql.Identifier(schema, "runs"),
        same_lane=sql.SQL("a.lane = b.lane" if per_lane else "true"),
    )
    row = db.execute(statement).fetchone()
    assert row is not None
    return int(row[0])


def prepare(dsn: str, schema: str, db: psycopg.Connection[Any], **settings: Any) -> dict[str, Any]:
    settings = {"dsn": dsn, "schema": schema, **settings}
    build(settings).close()  # creates the schema
    create_runs(db, schema)
    return settings


def run_jobs(
    db: psycopg.Connection[Any],
    settings: dict[str, Any],
    jobs: int,
    lanes: int,
    processes: int,
    spread: float = 0.0,
) -> None:
    schema = settings["schema"]
    app = build(settings)
    for number in range(jobs):
        app.enqueue("q", f"owner-{number % (lanes * 2)}", "sync", lane=f"lane-{number % lanes}")
    app.close()
    if spread:
        db.execute(
            sql.SQL("UPDATE {} SET next_run_at = now() + random() * %s").format(
                sql.Identifier(schema, "jobs")
            ),
            [timedelta(seconds=spread)],
        )
    with worker_processes(settings, processes):
        wait_for(
            lambda: (
                count(db, "SELECT count(*) FROM {jobs} WHERE status = 'completed'", schema) == jobs
            ),
            timeout=180,
            what=f"{jobs} completed jobs",
            interval=0.2,
        )


def drop_index(db: psycopg.Connection[Any], schema: str, name: str) -> None:
    db.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(schema, name)))


# -- lanes wider than one ------------------------------------------------------------------


@pytest.mark.parametrize("jobs", [200, pytest.param(600, marks=pytest.mark.slow)])
def test_a_lane_two_wide_runs_two_jobs_at_once_and_never_three(
    dsn: str, schema: str, db: psycopg.Connection[Any], jobs: int
) -> None:
    """Three lanes two wide, three processes; 200 jobs in the default run, the 600 of the first
    version under `pytest -m slow`."""
    settings = prepare(dsn, schema, db, concurrency=8, lane_width=2, page_sleep=0.02)
    run_jobs(db, settings, jobs=jobs, lanes=3, processes=3, spread=4)
    assert most_at_once(db, schema, per_lane=True) == 2


def test_without_the_lane_index_a_lane_two_wide_runs_more(
    app: SyncLane, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """The control: the width is the index's doing. A rival transaction has marked two jobs of
    the lane running in slots 0 and 1 and not committed yet, so a take sees the lane free. With
    the index its slot collides and it waits for the rival, then loses; without it, a third job
    of the lane runs."""
    app.queue("q", lane_width=2).snapshot("sync", every=timedelta(days=1))(lambda job: None)
    assert race_a_rival(app, dsn, db, schema, "jobs_running_lane", lanes=1, rivals=2) == 2
    assert race_a_rival(app, dsn, db, schema, None, lanes=1, rivals=2) == 3


def test_a_throttle_stops_the_running_sibling_of_a_wide_lane_at_its_next_page(
    dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    """A lane two wide, its two jobs running in two processes, 12 pages each; job x is told to
    slow down (`Throttled(retry_after=6)`) at its fourth page. The account was told, not the job:
    job y, running beside it, ends the page it has in flight and starts no other until the pause
    ends, its cursor kept and its attempt not used."""
    settings = prepare(
        dsn, schema, db, lane_width=2, pages=12, page_sleep=0.25,
        throttle={"owner": "x", "cursor": 3, "retry_after": 6},
    )  # fmt: skip
    app = build(settings)
    x = app.enqueue("q", "x", "sync", lane="L")
    y = app.enqueue("q", "y", "sync", lane="L")
    app.close()
    with worker_processes(settings, 2):
        done = "SELECT count(*) FROM {jobs} WHERE status = 'completed'"
        wait_for(lambda: count(db, done, schema) == 2, 60, "both jobs completed", interval=0.2)
    (paused_until,) = db.execute(
        sql.SQL("SELECT paused_until FROM {} WHERE queue = 'q' AND lane = 'L'").format(
            sql.Identifier(schema, "lanes")
        )
    ).fetchone() or (None,)
    assert paused_until is not None, "the throttle paused no lane"
    # The pause began when the throttle committed, 6 s before it ends; a page of y that began
    # before that instant may end, none may begin during the pause.
    began = paused_until - timedelta(seconds=6) + timedelta(milliseconds=100)
    during = db.execute(
        sql.SQL(
            "SELECT cursor_in, started FROM {} WHERE job_id = %s AND started > %s "
            "AND started < %s ORDER BY started"
        ).format(sql.Identifier(schema, "runs")),
        [y, began, paused_until],
    ).fetchall()
    assert during == [], f"y started {len(during)} pages during its lane's pause"
    for job_id in (x, y):
        row = job_row(db, schema, job_id)
        assert (row["attempt_count"], row["processed_count"]) == (1, 12)
    # y went back in line at a page boundary: each of its pages ran once.
    assert count(db, "SELECT count(*) FROM {runs} WHERE job_id = %s", schema, y) == 12


# -- a cap for the whole queue -------------------------------------------------------------


def test_a_capped_queue_reaches_its_cap_and_never_passes_it(
    dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    settings = prepare(dsn, schema, db, concurrency=8, max_running=5, page_sleep=0.05)
    run_jobs(db, settings, jobs=300, lanes=60, processes=3)
    assert most_at_once(db, schema, per_lane=False) == 5


def test_without_the_queue_slot_index_the_cap_is_passed(
    app: SyncLane, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """The control: the cap is the index's doing, not the take statement's count of the
    running. A rival has taken the queue's 3 slots and not committed: with the index the take
    waits and loses; without it, a fourth job runs."""
    app.queue("q", max_running=3).snapshot("sync", every=timedelta(days=1))(lambda job: None)
    assert race_a_rival(app, dsn, db, schema, "jobs_leased_queue_slot", lanes=8, rivals=3) == 3
    assert race_a_rival(app, dsn, db, schema, None, lanes=8, rivals=3) == 4


# -- rate limits per lane ------------------------------------------------------------------

MOST_STARTS_IN_A_PERIOD = """
SELECT coalesce(max(c), 0) FROM (
    SELECT a.id, count(*) AS c FROM {grants} a JOIN {grants} b
      ON a.lane = b.lane AND a.lane = %(lane)s
     AND b.granted >= a.granted AND b.granted < a.granted + %(period)s
    GROUP BY a.id
) t
"""

# Every start the lanes table records (lane_page_start appends the instants it grants to
# lanes.starts, each later than the ones before), logged as the server granted it: a handler's
# own clock reads it later, by as much as a loaded machine makes it wait.
GRANTS = """
CREATE TABLE {grants} (id bigserial PRIMARY KEY, lane text NOT NULL, granted timestamptz NOT NULL);
CREATE FUNCTION {log}() RETURNS trigger LANGUAGE plpgsql AS $log$
BEGIN
    INSERT INTO {grants} (lane, granted)
    SELECT NEW.lane, s FROM unnest(NEW.starts) AS s
    WHERE s > coalesce((SELECT max(o) FROM unnest(OLD.starts) AS o), '-infinity');
    RETURN NULL;
END
$log$;
CREATE TRIGGER log_grants AFTER UPDATE OF starts ON {lanes} FOR EACH ROW EXECUTE FUNCTION {log}();
"""


def test_no_period_sees_more_page_starts_in_a_lane_than_its_rate_while_other_lanes_run(
    dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    """Two processes share each lane's quota (4 pages a second): no second of the instants the
    server granted holds more than 4 starts of a lane."""
    settings = prepare(
        dsn, schema, db, concurrency=4, lane_rate=[4, 1.0], pages=2, page_sleep=0.005
    )
    names = {
        "grants": sql.Identifier(schema, "grants"),
        "log": sql.Identifier(schema, "log_grants"),
        "lanes": sql.Identifier(schema, "lanes"),
    }
    db.execute(sql.SQL(GRANTS).format(**names))
    run_jobs(db, settings, jobs=24, lanes=2, processes=2)  # 48 pages, 24 per lane
    for lane in ("lane-0", "lane-1"):
        granted = db.execute(
            sql.SQL("SELECT count(*) FROM {grants} WHERE lane = %s").format(**names), [lane]
        ).fetchone()
        assert granted == (24,), "every page start of the lane was granted and logged once"
        most = db.execute(
            sql.SQL(MOST_STARTS_IN_A_PERIOD).format(**names),
            {"lane": lane, "period": timedelta(seconds=1)},
        ).fetchone()
        assert most is not None and most[0] <= 4, f"{lane}: {most[0]} starts within a second"
    # The lanes shared the time, neither waited for the other: each ran its 24 pages at its own
    # rate, side by side.
    spans = db.execute(
        sql.SQL("SELECT lane, min(started), max(started) FROM {} GROUP BY lane").format(
            sql.Identifier(schema, "runs")
        )
    ).fetchall()
    (_, first_a, last_a), (_, first_b, last_b) = sorted(spans)
    assert first_b < last_a and first_a < last_b
    assert (last_a - first_a).total_seconds() >= 4.5  # 24 starts at 4 a second take 5 s


def test_a_page_start_that_waited_for_its_lane_is_counted_when_it_was_granted(
    app: SyncLane, dsn: str, db: psycopg.Connection[Any]
) -> None:
    """Two workers starting pages of one lane take turns on its row. The one that waited must
    count its start when it got the row, not when its statement began: counted a second early,
    its start left the rate's window a second early, and a fifth page of a lane with room for
    four a second started 0.95 s after the first (the lane-rate test above, on a loaded
    machine)."""
    app.queue("q", lane_rate=(4, 1.0))
    SyncLane(dsn, schema=app.schema).close()
    params = {
        "queues": ["q"],
        "lanes": ["acme"],
        "counts": [4],
        "periods": [timedelta(seconds=1)],
        "units": [1],
        "forces": [False],
        "keys": [uuid4()],
    }
    lanes = sql.Identifier(app.schema, "lanes")
    db.execute(sql.SQL("INSERT INTO {} (queue, lane) VALUES ('q', 'acme')").format(lanes))
    holder = psycopg.connect(dsn)
    holder.execute(sql.SQL("SELECT FROM {} WHERE lane = 'acme' FOR UPDATE").format(lanes))
    waited: list[Any] = []

    def start() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            waited.append(conn.execute(app.store.query("lane_page_starts"), params).fetchall())

    thread = threading.Thread(target=start)
    thread.start()
    time.sleep(1.0)
    (released,) = holder.execute("SELECT clock_timestamp()").fetchone()  # type: ignore[misc]
    holder.rollback()
    holder.close()
    thread.join(10)
    assert waited == [[(0.0,)]]
    (counted,) = db.execute(
        sql.SQL("SELECT starts[1] FROM {} WHERE lane = 'acme'").format(lanes)
    ).fetchone()  # type: ignore[misc]
    assert counted >= released, "the start was counted before its lane's row was granted"


def test_page_starts_asked_together_are_counted_in_one_statement_lane_by_lane(
    app: SyncLane, db: psycopg.Connection[Any]
) -> None:
    """Slots whose pages start at once share one statement: each start is counted against its
    own lane, a second start in a lane of rate 1 waits, and the answers keep the order asked
    (the statement counts lanes in their order, so that two workers never deadlock)."""
    second = timedelta(seconds=1)
    params = {
        "queues": ["q", "q", "q", "q"],
        "lanes": ["zeta", "acme", "zeta", "globex"],
        "counts": [1, 1, 1, 2],
        "periods": [second, second, second, second],
        "units": [1, 1, 1, 2],
        "forces": [False, False, False, False],
        "keys": [uuid4() for _ in range(4)],
    }
    counted = sql.SQL("SELECT lane, cardinality(starts) FROM {} ORDER BY lane").format(
        sql.Identifier(app.store.schema, "lanes")
    )
    rows = db.execute(app.store.query("lane_page_starts"), params).fetchall()

    waits = [row[0] for row in rows]
    assert waits[0] == 0 and waits[1] == 0 and waits[3] == 0
    assert 0 < waits[2] <= 1, "the second start in zeta (rate 1 a second) must wait"
    assert db.execute(counted).fetchall() == [("acme", 1), ("globex", 2), ("zeta", 1)]

    # Sent again, as after a lost answer: the starts recorded find their keys and count
    # nothing twice; the one that had to wait still waits.
    again = [row[0] for row in db.execute(app.store.query("lane_page_starts"), params)]
    assert again[0] == 0 and again[1] == 0 and again[3] == 0 and 0 < again[2] <= 1
    assert db.execute(counted).fetchall() == [("acme", 1), ("globex", 2), ("zeta", 1)]


def test_a_page_start_under_a_lane_rate_waits_for_the_lanes_pause(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    """A lane paused by a throttle has no room for a page start until the pause ends, however
    much of its rate is left; calls a page already made (force) are still recorded."""
    lanes = sql.Identifier(schema, "lanes")
    db.execute(
        sql.SQL("INSERT INTO {} (queue, lane, paused_until) "
                "VALUES ('q', 'acme', now() + interval '1 hour')").format(lanes)
    )  # fmt: skip

    def start(force: bool) -> float:
        params = {
            "queues": ["q"], "lanes": ["acme"], "counts": [100], "periods": [timedelta(hours=2)],
            "units": [1], "forces": [force], "keys": [uuid4()],
        }  # fmt: skip
        (wait,) = db.execute(app.store.query("lane_page_starts"), params).fetchone() or (None,)
        assert wait is not None
        return float(wait)

    def recorded() -> int:
        statement = sql.SQL("SELECT cardinality(starts) FROM {} WHERE lane = 'acme'")
        return count(db, statement.format(lanes).as_string(db), schema)

    assert 3590 < start(force=False) <= 3600, "a start during the pause must wait for its end"
    assert recorded() == 0
    assert start(force=True) == 0 and recorded() == 1


def test_a_lane_rate_is_changed_without_a_deploy(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    queue = app.queue("q", lane_rate=(2, timedelta(seconds=30)))
    queue.snapshot("sync", every=timedelta(days=1))(lambda job: Page(None))
    for owner in ("a1", "a2", "a3", "b1", "b2", "b3", "c1", "c2", "c3"):
        app.enqueue("q", owner, "sync", lane=owner[0])
    app.set_lane_rate("q", (1, 30))  # the whole queue, no deploy
    app.set_lane_rate("q", (3, 30), lane="b")  # an account on a bigger plan
    app.set_lane_rate("q", (3, 30), lane="c")
    app.set_lane_rate("q", None, lane="c")  # back to the queue's
    app.run_worker(until_idle=True, idle_grace=0, stop_after=10)
    done = app.jobs(status="completed")
    assert sorted(done["lane"]) == ["a", "b", "b", "b", "c"]
    quotas = app.lanes("q").set_index("lane")
    assert (quotas.loc["a", "rate_count"], quotas.loc["a", "rate_left"]) == (1, 0)
    assert quotas.loc["a", "rate_period"] == timedelta(seconds=30)
    with pytest.raises(ConfigError, match="rate"):
        app.set_lane_rate("q", (0, 10))
    other = app.queue("other")
    other.snapshot("sync", every=timedelta(days=1))(lambda job: Page(None))
    with pytest.raises(ConfigError, match="lane_rate"):
        app.set_lane_rate("other", (5, 10))
    assert Rate.of("lane_rate", (2, 1)) == Rate(2, timedelta(seconds=1))


# -- pause and resume ----------------------------------------------------------------------


def test_a_paused_queue_is_seen_by_every_process_and_its_running_job_goes_back_at_a_page(
    dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    settings = prepare(dsn, schema, db, concurrency=2, pages=100, page_sleep=0.1)
    app = build(settings)
    running = app.enqueue("q", "acme", "sync")
    with worker_processes(settings, 1):
        wait_for(lambda: job_row(db, schema, running)["cursor"] is not None, 20, "a page")
        pause = app.pause("q", "the warehouse is down for maintenance", by="ops@example")
        wait_for(lambda: job_row(db, schema, running)["status"] == "pending", 10, "a hand-back")
        row = job_row(db, schema, running)
        assert row["attempt_count"] == 0 and int(row["cursor"]) > 0
        waiting = app.enqueue("q", "globex", "sync")
        time.sleep(1.0)
        assert job_row(db, schema, waiting)["status"] == "pending"
        assert job_row(db, schema, running)["status"] == "pending"
        depth = app.depth("q")
        assert set(depth["paused_by"]) == {"ops@example"}
        assert set(depth["pause_reason"]) == {"the warehouse is down for maintenance"}
        assert (depth["paused_at"] == pause["paused_at"]).all()
        assert app.resume("q") is True
        wait_for(lambda: job_row(db, schema, waiting)["cursor"] is not None, 10, "taking again")
    assert app.resume("q") is False
    assert app.depth("q")["paused_at"].isna().all()
    app.close()


def test_a_run_until_idle_ends_when_only_a_paused_queue_has_work(
    app: SyncLane, db: psycopg.Connection[Any], schema: str
) -> None:
    """A paused queue's jobs are not due: a scheduled run until idle (Prefect, Dagster, `synclane
    work --until-idle`) ends instead of waiting for the resume until its time limit."""
    queue = app.queue("q")
    other = app.queue("other")

    @queue.snapshot("sync", every=3600)
    @other.snapshot("sync", every=3600)
    def sync(job: Any) -> Page:
        return Page(None, 1)

    held = app.enqueue("q", "acme", "sync")
    app.pause("q", "the warehouse is down for maintenance")
    done = app.enqueue("other", "globex", "sync")
    started = time.monotonic()

    report = app.run_worker(until_idle=True, idle_grace=0, stop_after=30)

    assert time.monotonic() - started < 15, "the run waited for a resume"
    assert report == {"completed": 1}
    assert job_row(db, schema, done)["status"] == "completed"
    assert job_row(db, schema, held)["status"] == "pending", "a paused queue started a job"
    app.resume("q")
    assert app.run_worker(until_idle=True, idle_grace=0, stop_after=30) == {"completed": 1}


def test_a_version_2_running_lane_index_is_replaced_by_the_slotted_one(
    app: SyncLane, db: psycopg.Connection[Any], dsn: str, schema: str
) -> None:
    jobs = sql.Identifier(schema, "jobs")
    drop_index(db, schema, "jobs_running_lane")
    db.execute(
        sql.SQL("CREATE UNIQUE INDEX jobs_running_lane ON {} (queue, lane) "
                "WHERE status = 'running'").format(jobs)
    )  # fmt: skip
    db.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(schema, "schema_version")))
    db.execute(
        sql.SQL("INSERT INTO {} (version) VALUES (2)").format(
            sql.Identifier(schema, "schema_version")
        )
    )
    upgraded = SyncLane(dsn, schema=schema)
    upgraded.close()
    assert "(queue, lane, lane_slot)" in index_definitions(db, schema)["jobs_running_lane"]
