"""Random sequences of whatever changes jobs, with real workers running (issue 25).

Two worker processes of two slots each run queue q, whose front of the line is blocked by a lane
`jam` with many jobs and slow pages, so that most jobs are found by looks lane by lane and their
hints. Hypothesis applies enqueues, plans, owner moves, requeues, cancels, throttles, pauses and
plain SQL UPDATEs of status, next_run_at and lane, in any order; a watcher reads the table every
tenth of a second and asserts that a due job of a lane with room is never left waiting, with a
slot free, for longer than poll_interval plus a second (and a second for a loaded machine), and
that no lane ever runs more than its width.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test
from lanes_fleet import FLEET_DDL, build, tables
from psycopg import sql

from synclane import SyncLane

pytestmark = pytest.mark.processes

HERE = Path(__file__).parent
POLL = 0.5
BOUND = POLL + 1 + 1
PROCESSES, SLOTS = 2, 2
LANES = ["a", "b", "c", "d", "e", "f"]
OWNERS = ["o1", "o2", "o3", "o4", "o5", "o6", "o7", "o8"]

# Due jobs of lanes with room, with a slot free in the fleet: what must not wait longer than BOUND.
WAITING = """
SELECT j.id FROM {jobs} j
WHERE j.queue = 'q' AND j.status IN ('pending', 'failed') AND j.next_run_at <= now()
  AND NOT EXISTS (SELECT FROM {pauses} WHERE queue = 'q')
  AND (SELECT count(*) FROM {jobs} r WHERE r.queue = 'q' AND r.lane = j.lane
       AND r.status = 'running') < %(width)s
  AND NOT EXISTS (SELECT FROM {jobs} h WHERE h.queue = 'q' AND h.lane = j.lane
                  AND h.status <> 'running' AND h.lease_token IS NOT NULL
                  AND h.lease_expires_at > now())
  AND coalesce((SELECT p.paused_until FROM {lanes} p WHERE p.queue = 'q' AND p.lane = j.lane),
               '-infinity') <= now()
  AND (SELECT count(*) FROM {jobs} s WHERE s.lease_token IS NOT NULL) < %(slots)s
"""
# Two pages of one lane that overlap in time, more than the width allows.
CROWDED = """
SELECT a.lane, count(*) FROM {runs} a JOIN {runs} b
  ON a.lane = b.lane AND a.id <> b.id AND b.started < coalesce(a.ended, 'infinity')
     AND a.started < coalesce(b.ended, 'infinity') AND b.started <= a.started
GROUP BY a.id, a.lane HAVING count(*) >= %(width)s
"""


class Watcher:
    """Reads the table every 0.1 s; remembers each job that waits in a lane with room, and
    complains about one that waited longer than BOUND."""

    def __init__(self, dsn: str, schema: str, width: int) -> None:
        self.dsn, self.width = dsn, width
        self.names = {
            "jobs": sql.Identifier(schema, "jobs"),
            "pauses": sql.Identifier(schema, "queue_pauses"),
            "lanes": sql.Identifier(schema, "lanes"),
        }
        self.since: dict[int, float] = {}
        self.problems: list[str] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            query = sql.SQL(WAITING).format(**self.names)
            while not self.stopped.wait(0.1):
                now = time.monotonic()
                waiting = {
                    row[0]
                    for row in conn.execute(
                        query, {"width": self.width, "slots": PROCESSES * SLOTS}
                    )
                }
                self.since = {job: self.since.get(job, now) for job in waiting}
                for job, since in self.since.items():
                    if now - since > BOUND:
                        self.problems.append(f"job {job} waited {now - since:.1f} s with room")
                        self.since[job] = now  # said once per bound

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(10)


@pytest.fixture
def fleet(dsn: str, schema: str, request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    width = request.param
    names = tables(schema)
    SyncLane(dsn, schema=schema).close()  # the schema and its table
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute(sql.SQL(FLEET_DDL).format(**names))
        db.execute(
            sql.SQL("INSERT INTO {} (owner, lane) SELECT unnest(%s::text[]), 'a'").format(
                names["owners"]
            ),
            [OWNERS],
        )
        # the front of the line: 80 jobs of lane jam with the newest windows, slow pages
        db.execute(
            sql.SQL(
                "INSERT INTO {} (queue, owner, lane, type, mode, dedup_key, window_start,"
                " window_end) SELECT 'q', 'jam', 'jam', 'sync', 'manual', 'jam:' || n,"
                " now() - (n + 1) * interval '1 hour', now() - n * interval '1 hour'"
                " FROM generate_series(1, 80) n"
            ).format(sql.Identifier(schema, "jobs"))
        )
        options = {
            "dsn": dsn,
            "schema": schema,
            "poll": POLL,
            "concurrency": SLOTS,
            "lane_width": width,
            "page_sleep": 0.15,
            "jam_sleep": 2.0,
            "pages": 2,
        }
        app = build(options)  # the test's own: the same queue, type and owner source
        processes = [
            subprocess.Popen(
                [sys.executable, str(HERE / "lanes_fleet.py"), json.dumps(options)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(PROCESSES)
        ]
        try:
            for process in processes:
                assert process.stdout is not None and process.stdout.readline().strip() == "ready"
            yield {"app": app, "db": db, "schema": schema, "width": width, "names": names}
        finally:
            for process in processes:
                process.kill()
                process.wait(30)
            app.close()


@pytest.mark.parametrize("fleet", [1, 2], indirect=True, ids=["one wide", "two wide"])
def test_no_due_job_of_a_lane_with_room_waits_whatever_writes_the_table(
    fleet: dict[str, Any], dsn: str
) -> None:
    app: SyncLane = fleet["app"]
    db: psycopg.Connection[Any] = fleet["db"]
    schema: str = fleet["schema"]
    jobs = sql.Identifier(schema, "jobs")
    watcher = Watcher(dsn, schema, fleet["width"])

    def some_job(pick: int, running: bool) -> int | None:
        rows = db.execute(
            sql.SQL(
                "SELECT id FROM {} WHERE lane <> 'jam' AND (%s OR status <> 'running') ORDER BY id"
            ).format(jobs),
            [running],
        ).fetchall()
        return rows[pick % len(rows)][0] if rows else None

    def plain(statement: str, pick: int, value: Any, running: bool = True) -> None:
        """A user's UPDATE of one job (a running one too, unless `running` is False: moving a
        running job to another lane is what docs/operations.md says never to do)."""
        job = some_job(pick, running)
        if job is None:
            return
        # a running job moved into a lane whose slot is taken: the index refuses it
        with contextlib.suppress(psycopg.errors.UniqueViolation):
            db.execute(sql.SQL(statement).format(jobs), [value, job])

    class Writers(RuleBasedStateMachine):
        @rule(lane=st.sampled_from(LANES), count=st.integers(1, 3))
        def enqueue(self, lane: str, count: int) -> None:
            for _ in range(count):
                app.enqueue("q", f"m-{lane}", "sync", lane=lane)

        @rule()
        def plan(self) -> None:
            app.plan("q")

        @rule(owner=st.sampled_from(OWNERS), lane=st.sampled_from(LANES))
        def move_owner(self, owner: str, lane: str) -> None:
            db.execute(
                sql.SQL("UPDATE {} SET lane = %s WHERE owner = %s").format(
                    fleet["names"]["owners"]
                ),
                [lane, owner],
            )
            try:
                app.plan("q")
            except Exception as error:  # a move into a lane running a job waits for the next plan
                assert "running" in str(error) or "unique" in str(error).lower(), error

        @rule()
        def requeue(self) -> None:
            app.requeue("q")

        @rule(owner=st.sampled_from([*OWNERS, "m-a", "m-b", "m-c"]))
        def cancel(self, owner: str) -> None:
            app.cancel("q", owner, "disconnected")

        @rule(lane=st.sampled_from(LANES))
        def throttle(self, lane: str) -> None:
            db.execute(
                sql.SQL("INSERT INTO {} VALUES (%s) ON CONFLICT DO NOTHING").format(
                    fleet["names"]["throttles"]
                ),
                [lane],
            )

        @rule()
        def pause_briefly(self) -> None:
            app.pause("q", "a short pause")
            time.sleep(0.3)
            app.resume("q")

        @rule(
            pick=st.integers(0, 999),
            status=st.sampled_from(
                ["pending", "failed", "completed", "cancelled", "abandoned", "deferred"]
            ),
        )
        def set_status(self, pick: int, status: str) -> None:
            plain("UPDATE {} SET status = %s WHERE id = %s", pick, status)

        @rule(pick=st.integers(0, 999), seconds=st.integers(-5, 5))
        def set_next_run_at(self, pick: int, seconds: int) -> None:
            plain(
                "UPDATE {} SET next_run_at = now() + %s * interval '1 second' WHERE id = %s",
                pick,
                seconds,
            )

        @rule(pick=st.integers(0, 999), lane=st.sampled_from(LANES))
        def set_lane(self, pick: int, lane: str) -> None:
            plain("UPDATE {} SET lane = %s WHERE id = %s", pick, lane, running=False)

        @rule(seconds=st.sampled_from([0.2, 0.5, 1.0]))
        def wait(self, seconds: float) -> None:
            time.sleep(seconds)

        def teardown(self) -> None:
            time.sleep(BOUND)  # the last step's effects have had their bound

    try:
        run_state_machine_as_test(
            Writers,
            settings=settings(
                max_examples=3,
                stateful_step_count=25,
                deadline=None,
                suppress_health_check=list(HealthCheck),
            ),
        )
    finally:
        watcher.stop()
    assert watcher.problems == []
    crowded = db.execute(
        sql.SQL(CROWDED).format(runs=sql.Identifier(schema, "runs")), {"width": fleet["width"]}
    ).fetchall()
    assert crowded == [], "a lane ran more pages at once than its width"
