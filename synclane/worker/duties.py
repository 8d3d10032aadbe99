"""A worker's duties beside its slots: the planning rounds, the idle check, and the chores (the
lanes' hints mended, expired leases reclaimed). `Worker` (synclane/worker/__init__.py) takes them
from this base class, which holds the duties and nothing of their state: each reads the
worker's queues, crew and settings.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import psycopg

from synclane.bridge import in_thread
from synclane.connection import Database
from synclane.errors import DatabaseUnavailable, OwnerSourceError, error_text
from synclane.events import Kind
from synclane.queues import Queue
from synclane.wakeup import notify_work_async
from synclane.worker.lease import LeaseLost
from synclane.worker.outage import refused_by_server
from synclane.worker.reclaim import reclaim
from synclane.worker.slot import Crew, describe
from synclane.worker.taker import LeasedJob

log = logging.getLogger("synclane")

# How many lanes' wakes one mend_lanes statement turns into hints (a first plan of many owners
# wakes a lane each: they are folded in statements of this size, one after the other).
FOLD_BATCH = 5000
# The shortest time between two rounds of a worker's chores (the lanes' mend, the reclaim of
# expired leases, the release of expired holds): every poll_interval, but no more often than
# this. Each round is five round trips; at a poll_interval of 0.05 s they were a fifth of a busy
# worker's statements and a tenth of the CPU a job cost (docs/performance.md), for leases
# that last minutes. Instant pickup comes from notifications, not from these rounds.
CHORE_SPACING = 1.0


class Duties:
    """The duties of a Worker, each run as a task of its own beside the slots."""

    database: Database
    queues: list[Queue]
    poll_interval: timedelta
    plan_interval: timedelta
    plan: Callable[[str], int | None] | None
    idle_grace: timedelta
    report: Counter[str]
    _crew: Crew | None

    if TYPE_CHECKING:  # the worker's own, used here

        @property
        def name(self) -> str: ...

        @property
        def stopping(self) -> bool: ...

        def stop(self) -> None: ...

        async def _pause(self, seconds: float) -> None: ...

        def _nudge(self, queue: str | None = None) -> None: ...

        def _emit(self, kind: Kind, job: LeasedJob | SimpleNamespace, **details: Any) -> None: ...

    async def _stop_when_idle(self, planned: asyncio.Event) -> None:
        """Stop once no job of these queues runs anywhere (a job finishing elsewhere could free
        a lane) and none becomes due within `idle_grace` (a retry, the end of a throttle)."""
        assert self._crew is not None
        await planned.wait()
        names = [q.name for q in self.queues]
        while not self.stopping:
            await self._pause(self.poll_interval.total_seconds())
            if self._crew.busy:
                continue
            try:
                async with self._crew.writer.pool.connection() as conn:
                    cur = await conn.execute(
                        self.database.store.query("idle_check"), {"queues": names}
                    )
                    row = await cur.fetchone()
            except psycopg.OperationalError:
                continue
            assert row is not None
            running, next_due_in = row
            if running == 0 and (next_due_in is None or next_due_in > self.idle_grace):
                log.info("worker %s: nothing left to do, stopping", self.name)
                self.stop()

    async def _plan_loop(self, planned: asyncio.Event) -> None:
        """Every plan_interval, a planning round of each queue (one process at a time plans a
        queue: a round another process holds is skipped). `planned` is set once every queue had
        a round that ran, here or, seen by a skipped round, elsewhere: until then a skipped
        round is tried again after poll_interval, so that a worker working until idle does not
        stop before the first jobs exist."""
        plannable = [q for q in self.queues if q.types and q.owner_source is not None]
        if self.plan is None or not plannable:
            planned.set()
            return
        waiting = {q.name for q in plannable}
        while not self.stopping:
            # Side by side: a queue whose owner source hangs (until owners_timeout) does not hold
            # up the others.
            ran = await asyncio.gather(*(self._plan_queue(queue) for queue in plannable))
            waiting -= {queue.name for queue, done in zip(plannable, ran, strict=True) if done}
            if not waiting:
                planned.set()
            pause = self.plan_interval if planned.is_set() else self.poll_interval
            await self._pause(min(pause, self.plan_interval).total_seconds())

    async def _plan_queue(self, queue: Queue) -> bool:
        """One planning round of a queue; False when another process was planning it, or when
        the database could not be reached (both are tried again at the next poll)."""
        assert self.plan is not None and self._crew is not None
        plan = self.plan
        outage = self._crew.writer.outage
        part = f"planning queue {queue.name}"
        try:
            added = await in_thread(lambda: plan(queue.name), f"synclane-plan-{queue.name}")
        except (psycopg.OperationalError, DatabaseUnavailable) as error:
            # an outage, or a statement refused (a lock, a timeout): said once, as the slots'
            outage.lost(part, error)
            # a database out of reach is tried again at the next poll; a refused plan (which may
            # be a statement too slow for a statement_timeout) at the next round
            return refused_by_server(error)
        except OwnerSourceError as error:
            log.error("planning queue %s failed: %s", queue.name, error_text(error))
            added = sum(error.added.values())
        except Exception as error:
            log.error("planning queue %s failed: %s", queue.name, error_text(error))
            return True
        outage.reached(part)
        if added:
            self._nudge()
        return added is not None

    async def _mend_lanes(self, queue: Queue) -> int:
        """The lanes' hints, kept a cache (docs/workers.md, "Where a look reads"): a parked lane
        that has room again gets a wake, whoever freed it, and idle workers hear of it; wakes no
        look has read become hints. Returns how many lanes were woken."""
        assert self._crew is not None
        store = self.database.store
        params = {
            "queue": queue.name,
            "lane_width": queue.settings.lane_width,
            "limit": FOLD_BATCH,
        }
        woken = 0
        async with self._crew.writer.pool.connection() as conn:
            while True:
                cur = await conn.execute(store.query("mend_lanes"), params)
                row = await cur.fetchone()
                assert row is not None
                woken += int(row[0])
                if row[1] < FOLD_BATCH or not row[2]:
                    break
            if woken:
                await notify_work_async(conn, store, [queue.name])
        return woken

    async def _reclaim_loop(self) -> None:
        assert self._crew is not None
        writer = self._crew.writer
        while not self.stopping:
            for queue in self.queues:
                # an outage (or a refused statement) is said once by the writer's Outage; a
                # chore that fails otherwise says so at each round
                mend = f"queue {queue.name}: mending the lanes' hints"
                try:
                    woken = await self._mend_lanes(queue)
                except psycopg.OperationalError as error:
                    writer.outage.lost(mend, error)
                    woken = 0
                except psycopg.Error as error:
                    log.warning("mending the lanes' hints failed: %s", error_text(error))
                    woken = 0
                else:
                    writer.outage.reached(mend)
                try:
                    rows, freed = await reclaim(writer, queue)
                except LeaseLost:
                    continue  # the database stayed away or refused: said by the writer
                except psycopg.Error as error:
                    log.warning("reclaiming expired leases failed: %s", error_text(error))
                    continue
                for row in rows:
                    self.report["reclaimed"] += 1
                    job = SimpleNamespace(queue=queue.name, **row)
                    log.warning("%s: lease expired, reclaimed as %s", describe(job), row["status"])  # type: ignore[arg-type]
                    self._emit("reclaimed", job, status=row["status"], error=row["error"])
                if rows or freed or woken:
                    self._nudge()
            await self._pause(max(self.poll_interval.total_seconds(), CHORE_SPACING))
